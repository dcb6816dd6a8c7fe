//! Agent configuration from a Git repository: `.gitlab/agents/<name>/config.yaml` on the default
//! branch of a local bare repository, polled; changes reach agentk, invalid files end the
//! presence stream with FAILED_PRECONDITION while agentk keeps its last good configuration.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kas::auth::agent_token::StaticAgentsFile;
use kas_e2e::{Cluster, eventually};
use kas_proto::tunnel::pb::agent_tunnel_client::AgentTunnelClient;
use kas_proto::tunnel::pb::{ConfigurationRequest, ConfigurationResponse};
use tonic::Code;

const CONFIG: &str = ".gitlab/agents/agent-1/config.yaml";

/// A bare repository (default branch `main`) and a work tree pushing to it, via the git CLI.
struct Repo {
    bare: PathBuf,
    work: PathBuf,
    _dir: tempfile::TempDir,
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=kas-test", "-c", "user.email=kas@test.invalid"])
        .args(args)
        .output()
        .expect("git must be installed");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

impl Repo {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        git(dir.path(), &["init", "-q", "--bare", "--initial-branch=main", "config.git"]);
        git(dir.path(), &["init", "-q", "--initial-branch=main", "work"]);
        Self { bare: dir.path().join("config.git"), work: dir.path().join("work"), _dir: dir }
    }

    fn commit(&self, content: &str) -> String {
        let file = self.work.join(CONFIG);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, content).unwrap();
        git(&self.work, &["add", "-A"]);
        git(&self.work, &["commit", "-q", "-m", "change"]);
        git(&self.work, &["push", "-q", self.bare.to_str().unwrap(), "main"]);
        git(&self.work, &["rev-parse", "HEAD"])
    }
}

fn level(r: &ConfigurationResponse) -> String {
    r.configuration.clone().unwrap().observability.unwrap().logging.unwrap().level
}

async fn presence(c: &Cluster, commit_id: &str) -> Result<tonic::Streaming<ConfigurationResponse>, tonic::Status> {
    let mut client = AgentTunnelClient::new(kas_e2e::cluster::channel(c.kas[0].addresses.agent));
    let connection_id = i64::from(rand::random::<u32>()) + 1;
    let mut r =
        tonic::Request::new(ConfigurationRequest { connection_id, commit_id: commit_id.into(), ..Default::default() });
    r.metadata_mut().insert("authorization", format!("Bearer {}", c.agent(1).token).parse().unwrap());
    client.get_configuration(r).await.map(tonic::Response::into_inner)
}

#[tokio::test]
async fn configuration_follows_the_default_branch_and_invalid_files_fail_precondition() {
    let repo = Repo::new();
    let first = repo.commit("observability:\n  logging:\n    level: debug\n");
    let bare = repo.bare.clone();
    let c = Cluster::builder()
        .configure(move |config, _| {
            config.agents.configuration_poll_period = Duration::from_millis(100);
            let path = config.agents.static_file.clone().unwrap();
            let mut file = StaticAgentsFile::load(&path).unwrap();
            file.agents[0].configuration_repository = Some(bare);
            file.save(&path).unwrap();
        })
        .start()
        .await;
    let a = c.start_agentk(1, 0, "agentk-0").await;
    let got = a.status.configuration.borrow().clone().unwrap();
    assert_eq!((got.commit_id.as_str(), level(&got).as_str()), (first.as_str(), "debug"));

    // A new commit reaches the connected agentk.
    let second = repo.commit("observability:\n  logging:\n    level: warn\n");
    eventually!(a.status.configuration.borrow().as_ref().is_some_and(|r| r.commit_id == second), "new commit sent");
    assert_eq!(level(a.status.configuration.borrow().as_ref().unwrap()), "warn");

    // An agent that has the current commit is sent nothing, poll after poll.
    let mut current = presence(&c, &second).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), current.message()).await.is_err(),
        "unchanged commit resent"
    );

    // An invalid file ends open streams with FAILED_PRECONDITION naming the problem.
    let third = repo.commit("observability:\n  loging: {}\n");
    let e = tokio::time::timeout(kas_e2e::EVENTUALLY_TIMEOUT, current.message()).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(CONFIG) && e.message().contains(&third), "{e:?}");
    assert!(e.message().contains("unknown field `loging`"), "{e:?}");
    let e = presence(&c, "").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    // agentk keeps its last good configuration while it cannot reconnect.
    let mut attempts = a.status.failed_attempts.clone();
    attempts.wait_for(|n| *n >= 1).await.unwrap();
    assert_eq!(a.status.configuration.borrow().as_ref().unwrap().commit_id, second);

    // Fixing the file lets it reconnect and receive the fix.
    let fourth = repo.commit("observability:\n  logging:\n    level: info\n");
    eventually!(a.status.configuration.borrow().as_ref().is_some_and(|r| r.commit_id == fourth), "fix sent");
    a.ready().await;
}
