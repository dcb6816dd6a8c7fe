//! Agent configuration polls (issue 7): what one poll costs for a local repository, for a
//! remote one over HTTP (kas's gitoxide mirror) and, side by side, git's own `git fetch` into a
//! mirror; and how many fetches N agents of one project cost.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kas::agent::{AgentIdentity, ConfigurationOrigin, GitRepository, RepositoryLocation};
use kas::config::AgentGitConfig;
use kas::modules::configuration::mirror::Mirrors;
use kas::modules::configuration::{AgentConfigurations, ConfigurationSource, git};
use kas_e2e::{GitHttpServer, GitRepo};
use kas_proto::{AgentId, ProjectId};

use crate::{ms, percentile};

const CONFIG: &str = ".gitlab/agents/agent-1/config.yaml";
const MAX: u64 = 128 * 1024;

fn timed(n: usize, mut f: impl FnMut(usize)) -> Vec<Duration> {
    let mut v: Vec<Duration> = (0..n)
        .map(|i| {
            let t = Instant::now();
            f(i);
            t.elapsed()
        })
        .collect();
    v.sort();
    v
}

fn git_cli(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(args)
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

pub async fn run(polls: usize, report: &mut String) {
    let root = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::create_in(root.path(), "group/agents.git");
    // A project with some history and unrelated files, as configuration projects are.
    for i in 0..50 {
        repo.commit(&format!("manifests/app-{i}.yaml"), format!("replicas: {i}\n").as_bytes());
    }
    repo.commit(CONFIG, b"observability:\n  logging:\n    level: info\n");
    let server = GitHttpServer::start(root.path()).await;
    let url = format!("{}/group/agents.git", server.url());

    let _ = writeln!(report, "## Agent configuration polls (issue 7)\n");
    let _ = writeln!(
        report,
        "{polls} sequential polls per row of a project with 52 commits; the remote is git's own `git http-backend` \
         behind a small HTTP server in the benchmark process (plain HTTP, loopback). A poll = resolve the branch \
         (fetching, for remote) + read and parse `config.yaml`.\n"
    );
    let _ = writeln!(report, "| poll | p50 (ms) | p99 (ms) | HTTP requests per poll | ratio p50 to `git fetch` |");
    let _ = writeln!(report, "| --- | --- | --- | --- | --- |");

    let bare = repo.bare.clone();
    let local = {
        let bare = bare.clone();
        tokio::task::spawn_blocking(move || {
            timed(polls, |_| {
                let commit = git::resolve_branch(&bare, Some("main")).expect("resolve");
                git::read_configuration_at(&bare, &commit, "agent-1", MAX).expect("read");
            })
        })
        .await
        .expect("join")
    };

    let mirrors = Arc::new(Mirrors::new(&AgentGitConfig::default()).expect("mirrors"));
    let (gix_unchanged, gix_requests) = {
        let (mirrors, url) = (mirrors.clone(), url.clone());
        let before = server.requests();
        let v = tokio::task::spawn_blocking(move || {
            mirrors.fetch(&url, Some("main")).expect("first fetch");
            let dir = mirrors.path(&url, Some("main"));
            timed(polls, |_| {
                let commit = mirrors.fetch(&url, Some("main")).expect("fetch");
                git::read_configuration_at(&dir, &commit, "agent-1", MAX).expect("read");
            })
        })
        .await
        .expect("join");
        (v, (server.requests() - before) as f64 / (polls + 1) as f64)
    };

    // git's own client: `git fetch` of the one branch into a bare mirror (no change), plus
    // `git show` of the file, the way a shell-script poller would do it.
    let cli_dir = tempfile::tempdir().expect("tempdir");
    let cli = cli_dir.path().to_owned();
    git_cli(&cli, &["init", "-q", "--bare", "."]);
    let refspec = "+refs/heads/main:refs/kas/config";
    git_cli(&cli, &["fetch", "-q", "--no-tags", &url, refspec]);
    let (cli_unchanged, cli_requests) = {
        let (cli, url) = (cli.clone(), url.clone());
        let before = server.requests();
        let v = tokio::task::spawn_blocking(move || {
            timed(polls, |_| {
                git_cli(&cli, &["fetch", "-q", "--no-tags", &url, refspec]);
                git_cli(&cli, &["show", &format!("refs/kas/config:{CONFIG}")]);
            })
        })
        .await
        .expect("join");
        (v, (server.requests() - before) as f64 / polls as f64)
    };

    // A new commit before every poll: ref listing + a pack.
    let changed_polls = polls.min(100);
    let gix_changed = {
        let mut v = Vec::with_capacity(changed_polls);
        for i in 0..changed_polls {
            repo.commit(CONFIG, format!("observability:\n  logging:\n    level: info # {i}\n").as_bytes());
            let (mirrors, url) = (mirrors.clone(), url.clone());
            let t = Instant::now();
            tokio::task::spawn_blocking(move || {
                let commit = mirrors.fetch(&url, Some("main")).expect("fetch");
                git::read_configuration_at(&mirrors.path(&url, Some("main")), &commit, "agent-1", MAX).expect("read");
            })
            .await
            .expect("join");
            v.push(t.elapsed());
        }
        v.sort();
        v
    };

    let reference = percentile(&cli_unchanged, 0.5).as_secs_f64();
    let ratio = |v: &[Duration]| format!("{:.2}", percentile(v, 0.5).as_secs_f64() / reference);
    let row = |name: &str, v: &[Duration], requests: &str| {
        format!("| {name} | {} | {} | {requests} | {} |", ms(percentile(v, 0.5)), ms(percentile(v, 0.99)), ratio(v))
    };
    let _ = writeln!(report, "{}", row("local repository (kas, gitoxide)", &local, "—"));
    let _ = writeln!(
        report,
        "{}",
        row("remote, unchanged (kas, gitoxide mirror)", &gix_unchanged, &format!("{gix_requests:.1}"))
    );
    let _ = writeln!(
        report,
        "{}",
        row("remote, unchanged (`git fetch` + `git show`)", &cli_unchanged, &format!("{cli_requests:.1}"))
    );
    let _ = writeln!(
        report,
        "{}",
        row(&format!("remote, new commit each poll (kas; {changed_polls} polls)"), &gix_changed, "—")
    );
    let _ = writeln!(report);

    // Many agents of one project polling at once: shared fetches.
    let configurations =
        Arc::new(AgentConfigurations::new(&AgentGitConfig::default(), Duration::from_secs(20)).expect("sources"));
    let repository = GitRepository { location: RepositoryLocation::Remote(url.clone()), branch: Some("main".into()) };
    let before = server.requests();
    let t = Instant::now();
    let agents = 100;
    let tasks: Vec<_> = (0..agents)
        .map(|i| {
            let (configurations, repository) = (configurations.clone(), repository.clone());
            tokio::spawn(async move {
                let agent = AgentIdentity {
                    agent_id: AgentId(1 + i),
                    name: "agent-1".into(),
                    project_id: ProjectId(1),
                    configuration: ConfigurationOrigin::Git(repository),
                };
                configurations.configuration(&agent).await.expect("configuration")
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("join");
    }
    let _ = writeln!(
        report,
        "{agents} agents of one project polling at once (kas's `AgentConfigurations`): {} HTTP requests to the Git \
         server in all, {} ms until every agent had its configuration.\n",
        server.requests() - before,
        ms(t.elapsed())
    );
}
