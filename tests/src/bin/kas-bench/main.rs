//! Benchmarks: ratios measured side by side in one run (shared, noisy machines), written as
//! Markdown. Run with `cargo run --release -p kas-e2e --bin kas-bench -- [--trials N] [--out FILE]`.
//!
//! - routing: GetPods latency through a local tunnel vs through a second kas (interleaved).
//! - wake-up: a request waiting on kas A is served when the agent connects to kas B.
//! - refresh: Redis round trips (and time) per registry refresh with 1, 100, 10,000 connections.
//! - proxy: the Kubernetes API proxy vs direct access, nginx, rathole and bore, in interleaved
//!   rounds, and `kubectl get pods -A` (needs `cargo build --release --bins` for the kas and
//!   agentk processes). `--upstream` runs this program as that section's upstream server.
//! - git, gitops: agent configuration polls, push to applied and the poll cost of GitOps.
//! - cluster_state: a pod change to an SSE subscriber on another kas, cached reads against the
//!   Kubernetes API proxy, bytes per change against a raw watch, agentk's memory with 10,000
//!   pods cached (needs the release `agentk` binary next to this one).

mod cluster_state;
mod git;
mod gitops;
mod proxy;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use kas::registry::redis::{RedisConfig, RedisRegistry};
use kas::registry::{AgentRegistry, RegistryTiming};
use kas_e2e::registry_conformance as conformance;
use kas_e2e::{Cluster, RedisServer, eventually};
use kas_proto::kas::{ConnectedAgentsByIdRequest, GetPodsRequest};

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

struct Args {
    trials: usize,
    requests: usize,
    rounds: usize,
    upstream: bool,
    out: Option<std::path::PathBuf>,
    sections: Vec<String>,
}

/// The report's sections, in the order they run.
const SECTIONS: [&str; 5] = ["routing", "proxy", "git", "gitops", "cluster_state"];

const USAGE: &str = "usage: kas-bench [--trials N] [--requests N] [--rounds N] \
                     [--sections routing,proxy,git,gitops,cluster_state] [--out FILE]";

/// Why the command line does not run the benchmark.
enum NotRun {
    /// `--help`: the usage is printed, and that is success.
    Help,
    /// What is wrong with it, and the usage.
    Bad(String),
}

/// The command line.
fn args() -> Result<Args, NotRun> {
    let mut a = Args {
        trials: 100,
        requests: 2000,
        rounds: 3,
        upstream: false,
        out: None,
        sections: SECTIONS.iter().map(|s| (*s).to_owned()).collect(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| NotRun::Bad(format!("{flag} needs a value")));
        let number =
            |v: String| v.parse::<usize>().map_err(|_| NotRun::Bad(format!("{flag} wants a number, not {v:?}")));
        match flag.as_str() {
            "--trials" => a.trials = number(value()?)?,
            "--requests" => a.requests = number(value()?)?,
            "--rounds" => a.rounds = number(value()?)?,
            "--upstream" => a.upstream = true,
            "--out" => a.out = Some(value()?.into()),
            "--sections" => {
                a.sections = value()?.split(',').map(str::to_owned).collect();
                if let Some(unknown) = a.sections.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                    return Err(NotRun::Bad(format!("unknown section {unknown:?}")));
                }
            }
            "--help" | "-h" => return Err(NotRun::Help),
            other => return Err(NotRun::Bad(format!("unknown flag {other}"))),
        }
    }
    Ok(a)
}

async fn routing(requests: usize, report: &mut String) {
    let c = Cluster::builder().redis().kas(2).start().await;
    for i in 0..20 {
        c.kube.add_pod("default", &format!("pod-{i}"));
    }
    let _a = c.start_agentk(1, 0, "bench").await;
    let mut local = c.api(0);
    let mut peer = c.api(1);
    let req = GetPodsRequest { agent_id: 1, connection_id: 0 };
    // Warm up both paths (connections, peer channel).
    for _ in 0..50 {
        local.get_pods(req).await.expect("local");
        peer.get_pods(req).await.expect("peer");
    }
    let (mut l, mut p) = (Vec::with_capacity(requests), Vec::with_capacity(requests));
    for _ in 0..requests {
        let t = Instant::now();
        local.get_pods(req).await.expect("local");
        l.push(t.elapsed());
        let t = Instant::now();
        peer.get_pods(req).await.expect("peer");
        p.push(t.elapsed());
    }
    l.sort();
    p.sort();
    let (l50, l99, p50, p99) = (percentile(&l, 0.5), percentile(&l, 0.99), percentile(&p, 0.5), percentile(&p, 0.99));
    let _ = writeln!(report, "### GetPods latency: local tunnel vs through a second kas\n");
    let _ = writeln!(
        report,
        "{requests} sequential calls per path, interleaved; agentk lists 20 pods from the fake API server; \
         two kas in-process on one Redis.\n"
    );
    let _ = writeln!(report, "| path | p50 (ms) | p99 (ms) |\n| --- | --- | --- |");
    let _ = writeln!(report, "| GitLab → kas A → agentk (local tunnel) | {} | {} |", ms(l50), ms(l99));
    let _ = writeln!(report, "| GitLab → kas B → kas A → agentk (peer) | {} | {} |", ms(p50), ms(p99));
    let _ = writeln!(
        report,
        "| ratio peer / local | {:.2} | {:.2} |\n",
        p50.as_secs_f64() / l50.as_secs_f64(),
        p99.as_secs_f64() / l99.as_secs_f64()
    );
}

async fn wake_up(trials: usize, report: &mut String) {
    // Every trial is a new agent connection: lift the connection rate limit for the benchmark.
    let c = Cluster::builder()
        .redis()
        .kas(2)
        .configure(|config, _| config.limits.agent_connections_per_minute = u64::MAX)
        .start()
        .await;
    c.kube.add_pod("default", "p");
    let (mut from_start, mut from_presence) = (Vec::new(), Vec::new());
    for _ in 0..trials {
        let mut api = c.api(0);
        let call = tokio::spawn(async move { api.get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await });
        let handle = c.kas[0].handle.clone();
        eventually!(handle.tunnel_stats().await.is_some_and(|s| s.waiting_requests == 1), "parked");
        let started = Instant::now();
        let agent = c.start_agentk_with(c.agentk_config(1, 1, "bench")).await;
        let mut connected = agent.status.connected.clone();
        let presence = async {
            connected.wait_for(Option::is_some).await.expect("status");
            Instant::now()
        };
        let (presence_at, served) = tokio::join!(presence, call);
        served.expect("join").expect("served");
        let done = Instant::now();
        from_start.push(done - started);
        from_presence.push(done.saturating_duration_since(presence_at));
        agent.stop().await;
        let mut api = c.api(0);
        eventually!(
            api.connected_agents_by_id(ConnectedAgentsByIdRequest { agent_id: 1 })
                .await
                .is_ok_and(|r| r.get_ref().agents.is_empty()),
            "agent gone before the next trial"
        );
    }
    from_start.sort();
    from_presence.sort();
    let _ = writeln!(report, "### Waiting request on kas A served when the agent connects to kas B\n");
    let _ = writeln!(
        report,
        "{trials} trials. Each: a GetPods call parks on kas A; agentk starts against kas B; the call \
         returns through kas B. \"presence\" is when agentk's GetConfiguration stream was accepted \
         (kas B registered the connection and published the event).\n"
    );
    let _ = writeln!(report, "| measured from | p50 (ms) | p99 (ms) | max (ms) |\n| --- | --- | --- | --- |");
    for (name, v) in [("agentk start", &from_start), ("agentk presence accepted", &from_presence)] {
        let _ = writeln!(
            report,
            "| {name} | {} | {} | {} |",
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99)),
            ms(*v.last().unwrap_or(&Duration::ZERO))
        );
    }
    let _ = writeln!(report);
}

async fn refresh(report: &mut String) {
    let server = RedisServer::start().await;
    let timing = RegistryTiming { ttl: Duration::from_secs(300), heartbeat_ttl: Duration::from_secs(60) };
    let _ = writeln!(report, "### Redis round trips per registry refresh\n");
    let _ = writeln!(
        report,
        "| connections held by the kas | round trips per refresh | refresh time (ms) |\n| --- | --- | --- |"
    );
    for n in [1_i64, 100, 10_000] {
        let mut config = RedisConfig::new(server.url());
        config.key_prefix = format!("bench-{n}");
        let r = RedisRegistry::new(&config, conformance::instance_info(), timing).expect("registry");
        for i in 0..n {
            r.register(conformance::record(1 + i % 1000, 1 + i % 50, 1 + i)).await.expect("register");
        }
        let before = r.round_trips();
        let t = Instant::now();
        r.refresh().await.expect("refresh");
        let took = t.elapsed();
        let _ = writeln!(report, "| {n} | {} | {} |", r.round_trips() - before, ms(took));
    }
    let _ = writeln!(report);
}

/// A run stopped by a signal (Ctrl-C, `kill`) stops the processes it started first: kas, agentk,
/// Redis, the peers and the upstream are its children and, left running, would take CPU from
/// the next run's figures (issue 14's twenty-third part measured beside 60 of them).
async fn stop_processes_on_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return;
    };
    // Exit as the signal's default action would report it: 128 + its number.
    let code = tokio::select! {
        _ = terminate.recv() => 128 + 15,
        _ = interrupt.recv() => 128 + 2,
    };
    let descendants = proxy::descendants(std::process::id());
    if !descendants.is_empty() {
        let _ = std::process::Command::new("kill").arg("-TERM").args(descendants.iter().map(u32::to_string)).status();
    }
    std::process::exit(code);
}

#[tokio::main]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(NotRun::Help) => {
            println!("{USAGE}");
            return;
        }
        Err(NotRun::Bad(e)) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if a.upstream {
        if let Err(e) = proxy::serve_upstream().await {
            eprintln!("kas-bench --upstream: {e}");
            std::process::exit(1);
        }
        return;
    }
    tokio::spawn(stop_processes_on_signal());
    // The workspace this program was built from, wherever it runs from; "-dirty" when the
    // work tree had changes (the figures are then not of that commit).
    let commit = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=7"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mut report = String::new();
    let redis_version = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().nth(2).unwrap_or_default().to_owned())
        .unwrap_or_default();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let _ = writeln!(
        report,
        "Run: `cargo build --release --bins && ./target/release/kas-bench` · {date} · commit `{commit}` · {cpus} \
         CPUs (shared machine) · loopback · redis-server {redis_version} on a unix socket\n"
    );
    if a.sections.iter().any(|s| s == "routing") {
        let _ = writeln!(report, "## Routing across kas (issue 3)\n");
        Box::pin(routing(a.requests, &mut report)).await;
        wake_up(a.trials, &mut report).await;
        refresh(&mut report).await;
    }
    if a.sections.iter().any(|s| s == "proxy") {
        proxy::run(a.rounds, &mut report).await;
    }
    if a.sections.iter().any(|s| s == "git") {
        git::run(a.trials, &mut report).await;
    }
    if a.sections.iter().any(|s| s == "gitops") {
        gitops::run(a.trials, &mut report).await;
    }
    if a.sections.iter().any(|s| s == "cluster_state") {
        Box::pin(cluster_state::run(a.trials, &mut report)).await;
    }
    print!("{report}");
    if let Some(out) = a.out {
        std::fs::write(&out, &report).expect("write report");
        eprintln!("written to {}", out.display());
    }
}
