//! Agent configuration from a Git repository: `.gitlab/agents/<name>/config.yaml` on the default
//! branch of a local bare repository, polled; changes reach agentk, invalid files end the
//! presence stream with FAILED_PRECONDITION while agentk keeps its last good configuration.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use kas_e2e::cluster::set_configuration_repository;
use kas_e2e::{Cluster, GitHttpOptions, GitHttpServer, GitRepo, eventually};
use kas_proto::tunnel::pb::ConfigurationResponse;
use tonic::Code;

const CONFIG: &str = ".gitlab/agents/agent-1/config.yaml";

fn logging(level: &str) -> Vec<u8> {
    format!("observability:\n  logging:\n    level: {level}\n").into_bytes()
}

fn level(r: &ConfigurationResponse) -> String {
    r.configuration.clone().unwrap().observability.unwrap().logging.unwrap().level
}

#[tokio::test]
async fn configuration_follows_the_default_branch_and_invalid_files_fail_precondition() {
    let repo = GitRepo::new();
    let first = repo.commit(CONFIG, &logging("debug"));
    let bare = repo.bare.clone();
    let c = Cluster::builder()
        .configure(move |config, _| {
            config.agents.configuration_poll_period = Duration::from_millis(100);
            set_configuration_repository(config.agents.static_file.as_ref().unwrap(), 0, bare.display().to_string());
        })
        .start()
        .await;
    let a = c.start_agentk(1, 0, "agentk-0").await;
    let got = a.status.configuration.borrow().clone().unwrap();
    assert_eq!((got.commit_id.as_str(), level(&got).as_str()), (first.as_str(), "debug"));

    // A new commit reaches the connected agentk.
    let second = repo.commit(CONFIG, &logging("warn"));
    eventually!(a.status.configuration.borrow().as_ref().is_some_and(|r| r.commit_id == second), "new commit sent");
    assert_eq!(level(a.status.configuration.borrow().as_ref().unwrap()), "warn");

    // An agent that has the current commit is sent nothing, poll after poll.
    let mut current = c.open_configuration(1, &second).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), current.message()).await.is_err(),
        "unchanged commit resent"
    );

    // An invalid file ends open streams with FAILED_PRECONDITION naming the problem.
    let third = repo.commit(CONFIG, b"observability:\n  loging: {}\n");
    let e = tokio::time::timeout(kas_e2e::EVENTUALLY_TIMEOUT, current.message()).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(CONFIG) && e.message().contains(&third), "{e:?}");
    assert!(e.message().contains("unknown field `loging`"), "{e:?}");
    let e = c.open_configuration(1, "").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    // agentk keeps its last good configuration while it cannot reconnect.
    let mut attempts = a.status.failed_attempts.clone();
    attempts.wait_for(|n| *n >= 1).await.unwrap();
    assert_eq!(a.status.configuration.borrow().as_ref().unwrap().commit_id, second);

    // Fixing the file lets it reconnect and receive the fix.
    let fourth = repo.commit(CONFIG, &logging("info"));
    eventually!(a.status.configuration.borrow().as_ref().is_some_and(|r| r.commit_id == fourth), "fix sent");
    a.ready().await;
}

/// A remote repository over HTTPS (private CA, basic auth), served by git's own
/// `git http-backend`: fetched by kas with gitoxide into its mirror and followed.
#[tokio::test]
async fn remote_repository_over_https_with_credentials() {
    let root = tempfile::tempdir().unwrap();
    let repo = GitRepo::create_in(root.path(), "group/agents.git");
    let first = repo.commit(CONFIG, &logging("debug"));
    let password = format!("token-{}", rand::random::<u64>());
    let git = GitHttpServer::start_with(
        root.path(),
        GitHttpOptions { tls: true, basic_auth: Some(("kas".into(), password.clone())), ..Default::default() },
    )
    .await;
    let url = format!("{}/group/agents.git", git.url());
    let (ca, good) = (git.ca_file().unwrap(), password.clone());
    let c = Cluster::builder()
        .agents(&[(1, 1), (2, 2)])
        .configure(move |config, dir| {
            config.agents.configuration_poll_period = Duration::from_millis(200);
            let password_file = dir.join("git-password");
            std::fs::write(&password_file, format!("{good}\n")).unwrap();
            config.agents.git.username = Some("kas".into());
            config.agents.git.password_file = Some(password_file);
            config.agents.git.ca_cert_file = Some(ca);
            let agents = config.agents.static_file.as_ref().unwrap();
            set_configuration_repository(agents, 0, url.clone());
            // Agent 2's repository does not exist on the server.
            set_configuration_repository(agents, 1, url.replace("agents.git", "missing.git"));
        })
        .start()
        .await;
    let a = c.start_agentk(1, 0, "agentk-0").await;
    let got = a.status.configuration.borrow().clone().unwrap();
    assert_eq!((got.commit_id.as_str(), level(&got).as_str()), (first.as_str(), "debug"));
    assert!(git.requests_with_credentials() > 0, "kas authenticated");
    assert_eq!(git.rejected_credentials(), 0);

    let second = repo.commit(CONFIG, &logging("warn"));
    eventually!(a.status.configuration.borrow().as_ref().is_some_and(|r| r.commit_id == second), "new commit sent");
    assert_eq!(level(a.status.configuration.borrow().as_ref().unwrap()), "warn");

    // A repository kas cannot fetch: UNAVAILABLE naming it (agentk retries), no secret in it.
    let e = c.open_configuration(2, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("missing.git"), "{e:?}");
    assert!(!e.message().contains(&password), "{e:?}");

    // Polls are measured.
    c.assert_metrics(
        0,
        &[r#"kas_git_poll_duration_seconds_count{repository="remote"}"#, r#"kas_git_polls_total{outcome="error"}"#],
    )
    .await;
}

/// Without credentials, or with a server certificate kas does not trust, fetching fails with
/// UNAVAILABLE and a message that says why; the agent retries.
#[tokio::test]
async fn remote_repository_failures_are_unavailable_and_explained() {
    let root = tempfile::tempdir().unwrap();
    GitRepo::create_in(root.path(), "group/agents.git").commit(CONFIG, &logging("debug"));
    let untrusted = GitHttpServer::start_with(root.path(), GitHttpOptions { tls: true, ..Default::default() }).await;
    let protected = GitHttpServer::start_with(
        root.path(),
        GitHttpOptions { basic_auth: Some(("kas".into(), "right".into())), ..Default::default() },
    )
    .await;
    // A moved server: redirects are not followed (credentials never reach a second host).
    let target = GitHttpServer::start(root.path()).await;
    let moved = GitHttpServer::start_with(
        root.path(),
        GitHttpOptions { redirect_to: Some(target.url()), ..Default::default() },
    )
    .await;
    let (a, b, m) = (untrusted.url(), protected.url(), moved.url());
    let c = Cluster::builder()
        .agents(&[(1, 1), (2, 1), (3, 1)])
        .configure(move |config, _| {
            let agents = config.agents.static_file.as_ref().unwrap();
            set_configuration_repository(agents, 0, format!("{a}/group/agents.git"));
            set_configuration_repository(agents, 1, format!("{b}/group/agents.git"));
            set_configuration_repository(agents, 2, format!("{m}/group/agents.git"));
        })
        .start()
        .await;
    let e = c.open_configuration(1, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("/group/agents.git") && e.message().contains("certificate"), "{e:?}");
    assert_eq!(untrusted.upload_pack_posts(), 0);

    let e = c.open_configuration(2, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("agents.git.password_file"), "{e:?}");
    assert_eq!(protected.upload_pack_posts(), 0);

    let e = c.open_configuration(3, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(moved.requests() > 0);
    assert_eq!(target.requests(), 0, "the redirect was not followed: {e:?}");
    assert!(e.message().contains("a redirect, which kas does not follow"), "{e:?}");
}

/// GitLab mode: the configuration comes from the agent's project repository that GitLab's
/// agent_info names (`gitaly_repository.gl_project_path`, `default_branch`), fetched over HTTP.
#[tokio::test]
async fn gitlab_mode_reads_the_agents_project_repository() {
    // The harness serves each project's repository where the fake GitLab's agent_info says
    // it is (gl_project_path "group/project-<id>", default branch main) over Git's HTTP protocol.
    let c = Cluster::builder()
        .agents(&[(1, 7)])
        .gitlab()
        .configure(|config, _| config.agents.configuration_poll_period = Duration::from_millis(200))
        .start()
        .await;
    let project = &c.projects[&7];
    let first = project.commit(CONFIG, &logging("debug"));
    let a = c.start_agentk(1, 0, "agentk-0").await;
    let got = a.status.configuration.borrow().clone().unwrap();
    assert_eq!((got.commit_id.as_str(), level(&got).as_str()), (first.as_str(), "debug"));

    let second = project.commit(CONFIG, &logging("error"));
    eventually!(a.status.configuration.borrow().as_ref().is_some_and(|r| r.commit_id == second), "new commit sent");

    // An invalid file in the project fails the same way as everywhere.
    project.commit(CONFIG, b"observability: {logging: {level: info, colour: red}}\n");
    eventually!(
        matches!(c.open_configuration(1, "").await, Err(e) if e.code() == Code::FailedPrecondition
            && e.message().contains("unknown field `colour`")),
        "invalid file reported"
    );
    assert_eq!(a.status.configuration.borrow().as_ref().unwrap().commit_id, second, "last good kept");
}

/// Polls of one repository are shared (many agents of a project, or many connections of an
/// agent, cost one fetch), and all polls pass one rate limit.
#[tokio::test]
async fn polls_are_shared_per_repository_and_rate_limited() {
    let root = tempfile::tempdir().unwrap();
    let shared = GitRepo::create_in(root.path(), "group/shared.git");
    shared.commit(".gitlab/agents/agent-1/config.yaml", &logging("debug"));
    shared.commit(".gitlab/agents/agent-2/config.yaml", &logging("warn"));
    let other = GitRepo::create_in(root.path(), "group/other.git");
    other.commit(".gitlab/agents/agent-3/config.yaml", &logging("info"));
    let git = GitHttpServer::start(root.path()).await;
    let base = git.url();
    let c = Cluster::builder()
        .agents(&[(1, 1), (2, 1), (3, 2)])
        .configure(move |config, _| {
            // Long period: nothing polls during the test but the connects themselves.
            config.agents.configuration_poll_period = Duration::from_secs(600);
            config.agents.git.rate_limit.requests_per_second = 1;
            config.agents.git.rate_limit.burst = 1;
            config.agents.git.rate_limit.max_wait = Duration::ZERO;
            // The retry loop below opens many presence streams.
            config.limits.agent_connections_per_minute = 100_000;
            let agents = config.agents.static_file.as_ref().unwrap();
            set_configuration_repository(agents, 0, format!("{base}/group/shared.git"));
            set_configuration_repository(agents, 1, format!("{base}/group/shared.git"));
            set_configuration_repository(agents, 2, format!("{base}/group/other.git"));
        })
        .start()
        .await;
    let first = c.open_configuration(1, "").await.unwrap().message().await.unwrap().unwrap();
    assert_eq!(level(&first), "debug");
    let fetched = git.upload_pack_posts();
    assert!(fetched > 0);
    // That poll took the bucket's one token (1 per second, burst 1): another repository's poll
    // right after is refused without reaching the Git server.
    let e = c.open_configuration(3, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("rate limited"), "{e:?}");
    assert_eq!(git.upload_pack_posts(), fetched);

    // Four more connections of two agents of the shared project, at once: served from the
    // shared poll, no new fetch and no token needed.
    let streams = futures::future::join_all((0..4).map(|i| c.open_configuration(1 + (i % 2), ""))).await;
    let mut levels = Vec::new();
    for s in streams {
        levels.push(level(&s.unwrap().message().await.unwrap().unwrap()));
    }
    levels.sort();
    assert_eq!(levels, ["debug", "debug", "warn", "warn"]);
    assert_eq!(git.upload_pack_posts(), fetched, "one fetch for the shared repository");

    // The refused repository is served once the bucket refills (failures are not reused).
    eventually!(c.open_configuration(3, "").await.is_ok(), "served after the refill");
}

/// A push to an agent's configuration project (`KasApi.GitPushEvent`, naming the repository as
/// the agents file does, or GitLab's project id) makes the open presence stream read it at once:
/// the poll period is an hour, and polls of the repository share one read for a tenth of it, so
/// only the push (and its own read) explains the new commit. A push to another project does not.
#[tokio::test]
async fn a_push_to_the_configuration_project_reaches_the_presence_stream_at_once() {
    use kas_proto::kas::{GitPushEvent, GitPushEventRequest, git_push_event};

    let repo = GitRepo::new();
    let first = repo.commit(CONFIG, &logging("debug"));
    let bare = repo.bare.display().to_string();
    let repository = bare.clone();
    let c = Cluster::builder()
        .configure(move |config, _| {
            config.agents.configuration_poll_period = Duration::from_secs(3600);
            set_configuration_repository(config.agents.static_file.as_ref().unwrap(), 0, repository);
        })
        .start()
        .await;
    let push = |id: i64, full_path: &str| {
        let event = GitPushEvent { project: Some(git_push_event::Project { id, full_path: full_path.into() }) };
        let mut api = c.api(0);
        async move { api.git_push_event(GitPushEventRequest { event: Some(event) }).await.unwrap() }
    };
    let mut stream = c.open_configuration(1, "").await.unwrap();
    let got = tokio::time::timeout(kas_e2e::EVENTUALLY_TIMEOUT, stream.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(got.commit_id, first);

    let second = repo.commit(CONFIG, &logging("warn"));
    push(0, "/somewhere/else.git").await;
    assert!(tokio::time::timeout(Duration::from_millis(500), stream.message()).await.is_err(), "another project");
    push(0, &bare).await;
    let got = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
    assert_eq!((got.commit_id.as_str(), level(&got).as_str()), (second.as_str(), "warn"));

    // By GitLab's project id: the agent's (configuration) project id, 10 in the cluster.
    let third = repo.commit(CONFIG, &logging("error"));
    push(c.agent(1).project_id, "group/agents").await;
    let got = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
    assert_eq!((got.commit_id.as_str(), level(&got).as_str()), (third.as_str(), "error"));
}
