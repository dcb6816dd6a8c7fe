//! `agents.git.connect_timeout` and `agents.git.fetch_timeout`: a Git server that does not
//! accept connections, or accepts and then never answers, fails the configuration poll within
//! the configured time with UNAVAILABLE naming the repository (agentk retries), instead of
//! holding the agent's GetConfiguration for as long as the server hangs.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kas_e2e::cluster::set_configuration_repository;
use kas_e2e::{Cluster, FaultProxy, GitHttpServer, GitRepo, Unconnectable, eventually};
use tonic::Code;

const CONFIG: &str = ".gitlab/agents/agent-1/config.yaml";
/// The timeout under test, set short.
const TIMEOUT: Duration = Duration::from_secs(1);
/// A poll must fail well before this: far above [`TIMEOUT`] (slack for a loaded 2-core
/// machine), far below the defaults (10 s connect, 30 s fetch) and a hung server (forever).
const BOUND: Duration = Duration::from_secs(8);

/// Times a GetConfiguration that must fail; gives up at 60 s so a hang is a failure, not a stuck test.
async fn failing_presence(c: &Cluster) -> (tonic::Status, Duration) {
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(60), c.open_configuration(1, "")).await;
    let elapsed = started.elapsed();
    let e = r.unwrap_or_else(|_| panic!("no answer after {elapsed:?}")).expect_err("the poll succeeded");
    (e, elapsed)
}

/// The presence stream fails UNAVAILABLE, naming the repository, the cause (one of `causes`) and
/// the setting with its value, after the 1 s timeout and well before BOUND.
async fn failed_by_timeout(c: &Cluster, url: &str, causes: &[&str], setting: &str) {
    let (e, elapsed) = failing_presence(c).await;
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains(url), "{e:?}");
    assert!(causes.iter().any(|cause| e.message().contains(cause)), "{e:?}");
    assert!(e.message().contains(setting), "the message names the setting: {e:?}");
    assert!(elapsed < BOUND, "the poll took {elapsed:?} with {setting}: {e:?}");
    assert!(elapsed >= TIMEOUT / 2, "failed before the server could have answered: {elapsed:?}: {e:?}");
}

#[tokio::test]
async fn a_git_server_that_never_accepts_fails_the_poll_after_connect_timeout() {
    let unconnectable = Unconnectable::bind().await;
    let url = format!("http://{}/group/agents.git", unconnectable.address());
    let shown = url.clone();
    let c = Cluster::builder()
        .configure(move |config, _| {
            config.agents.git.connect_timeout = TIMEOUT;
            // Long, so only the connect timeout can end the poll within BOUND.
            config.agents.git.fetch_timeout = Duration::from_secs(120);
            set_configuration_repository(config.agents.static_file.as_ref().unwrap(), 0, url);
        })
        .start()
        .await;
    // Two timers of the one setting race: hyper-util's connector ("deadline has elapsed") and
    // reqwest's own ("operation timed out"); either is the connect timeout (1 failure in 12 runs
    // insisted on the first).
    let causes = ["deadline has elapsed", "operation timed out"];
    failed_by_timeout(&c, &shown, &causes, "agents.git.connect_timeout = 1s").await;
}

#[tokio::test]
async fn a_git_server_that_never_answers_fails_the_poll_after_fetch_timeout() {
    let root = tempfile::tempdir().unwrap();
    GitRepo::create_in(root.path(), "group/agents.git").commit(CONFIG, b"{}\n");
    let git = GitHttpServer::start(root.path()).await;
    let port: u16 = git.url().rsplit(':').next().unwrap().parse().unwrap();
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], port))).await;
    // Connections are accepted (and reach the server), but nothing is forwarded either way.
    proxy.pause();
    let url = format!("http://{}/group/agents.git", proxy.address());
    let shown = url.clone();
    let c = Cluster::builder()
        .configure(move |config, _| {
            config.agents.git.fetch_timeout = TIMEOUT;
            set_configuration_repository(config.agents.static_file.as_ref().unwrap(), 0, url);
        })
        .start()
        .await;
    failed_by_timeout(&c, &shown, &["timed out"], "agents.git.fetch_timeout = 1s").await;
    assert!(proxy.accepted() > 0, "kas connected");
    assert_eq!(git.upload_pack_posts(), 0);

    // The server answering again: the next poll succeeds (nothing stuck behind the timed-out one).
    proxy.resume();
    eventually!(c.open_configuration(1, "").await.is_ok(), "served once the server answers");
}
