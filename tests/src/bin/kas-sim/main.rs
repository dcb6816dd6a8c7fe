//! kas-sim (issue 18, first part): thousands of simulated agents in one process against real
//! kas processes on a real Redis, and what holding them idle costs.
//!
//! `cargo build --release -p kas --bin kas && cargo run -p kas-e2e --bin kas-sim -- --agents 1000`
//! (flags: `--agents M --kas N --idle-tunnels K --connect-rate R --idle-secs W --kas-bin PATH
//! --out FILE`). It starts a private redis-server and N `kas --config` processes (the release
//! binary by default) with a static agents file of M generated agents, connects M simulated
//! agents (see `agent.rs`) round-robin over the kas at R per second, waits until the registry
//! lists all of them, measures an idle window of W seconds, disconnects every agent and reports
//! as Markdown.

mod agent;
mod proc_stats;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kas::auth::agent_token::{StaticAgent, StaticAgentsFile, token_sha256_hex};
use kas::registry::AgentRegistry;
use kas::registry::redis::{RedisConfig, RedisRegistry};
use kas_e2e::RedisServer;
use kas_proto::registry::{ConnectionEvent, connection_event};
use prost::Message;
use tokio_util::sync::CancellationToken;

use crate::agent::{Counters, SimAgent};

const KEY_PREFIX: &str = "kas-sim";
/// How long kas gets to log "kas listening".
const KAS_READY_WITHIN: Duration = Duration::from_secs(60);
/// How long all agents get to be registered after the last one started, and to be gone after
/// they disconnect.
const SETTLE_WITHIN: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
enum SimError {
    #[error(
        "usage: {0} (flags: --agents M --kas N --idle-tunnels K --connect-rate R --idle-secs W --kas-bin PATH --out FILE)"
    )]
    Usage(String),
    #[error("{0}")]
    Setup(String),
    #[error("{0}")]
    Timeout(String),
}

fn setup(what: &str, e: impl std::fmt::Display) -> SimError {
    SimError::Setup(format!("{what}: {e}"))
}

struct Args {
    agents: usize,
    kas: usize,
    idle_tunnels: usize,
    connect_rate: f64,
    idle_secs: u64,
    kas_bin: PathBuf,
    out: Option<PathBuf>,
}

fn parse_args() -> Result<Args, SimError> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new("."));
    let mut a = Args {
        agents: 1000,
        kas: 1,
        idle_tunnels: 2,
        connect_rate: 200.0,
        idle_secs: 30,
        kas_bin: workspace.join("target/release/kas"),
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| SimError::Usage(format!("{flag} needs a value")))?;
        let bad = |e: &dyn std::fmt::Display| SimError::Usage(format!("{flag} {value}: {e}"));
        match flag.as_str() {
            "--agents" => a.agents = value.parse().map_err(|e| bad(&e))?,
            "--kas" => a.kas = value.parse().map_err(|e| bad(&e))?,
            "--idle-tunnels" => a.idle_tunnels = value.parse().map_err(|e| bad(&e))?,
            "--connect-rate" => a.connect_rate = value.parse().map_err(|e| bad(&e))?,
            "--idle-secs" => a.idle_secs = value.parse().map_err(|e| bad(&e))?,
            "--kas-bin" => a.kas_bin = value.into(),
            "--out" => a.out = Some(value.into()),
            other => return Err(SimError::Usage(format!("unknown flag {other}"))),
        }
    }
    if a.agents == 0 || a.kas == 0 || a.idle_secs == 0 || a.connect_rate.is_nan() || a.connect_rate <= 0.0 {
        return Err(SimError::Usage("--agents, --kas, --idle-secs and --connect-rate must be > 0".into()));
    }
    if !a.kas_bin.is_file() {
        return Err(SimError::Usage(format!(
            "kas binary {} missing: run `cargo build --release -p kas --bin kas` or pass --kas-bin",
            a.kas_bin.display()
        )));
    }
    Ok(a)
}

/// A kas child process, killed on drop.
struct KasProc {
    child: Child,
    agent_address: String,
}

impl KasProc {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for KasProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `kas --config`; returns once it logged "kas listening". Its stderr is drained for
/// good on a thread (warnings and errors are echoed, the first 20 of them).
fn start_kas(bin: &Path, config: &kas::Config, dir: &Path, index: usize) -> Result<KasProc, SimError> {
    let path = dir.join(format!("kas-{index}.yaml"));
    let yaml = serde_norway::to_string(config).map_err(|e| setup("kas config as YAML", e))?;
    std::fs::write(&path, yaml).map_err(|e| setup("write kas config", e))?;
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(&path)
        .args(["--log-format", "json", "--log", "warn,kas=info"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| setup(&format!("start {}", bin.display()), e))?;
    let Some(stderr) = child.stderr.take() else {
        let _ = child.kill();
        return Err(SimError::Setup("kas stderr not piped".into()));
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut echoed = 0;
        let mut sent = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if echoed < 20 && (line.contains("\"WARN\"") || line.contains("\"ERROR\"")) {
                eprintln!("kas-{index}: {line}");
                echoed += 1;
            }
            if !sent
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && v["fields"]["message"] == "kas listening"
                && let Some(agent) = v["fields"]["agent"].as_str()
            {
                let _ = tx.send(agent.to_owned());
                sent = true;
            }
        }
    });
    match rx.recv_timeout(KAS_READY_WITHIN) {
        Ok(agent_address) => Ok(KasProc { child, agent_address }),
        Err(_) => {
            let _ = child.kill();
            Err(SimError::Timeout(format!("kas-{index} did not log \"kas listening\" within {KAS_READY_WITHIN:?}")))
        }
    }
}

/// Fields of `INFO <section>` as numbers.
async fn redis_info(redis: &RedisServer, section: &str) -> HashMap<String, f64> {
    let text: String = redis.query(redis::cmd("INFO").arg(section)).await;
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(k, v)| v.trim().parse::<f64>().ok().map(|v| (k.to_owned(), v)))
        .collect()
}

#[derive(Clone, Copy)]
struct RedisSample {
    used_memory: f64,
    commands: f64,
    cpu_seconds: f64,
}

async fn redis_sample(redis: &RedisServer) -> RedisSample {
    let memory = redis_info(redis, "memory").await;
    let stats = redis_info(redis, "stats").await;
    let cpu = redis_info(redis, "cpu").await;
    let get = |m: &HashMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
    RedisSample {
        used_memory: get(&memory, "used_memory"),
        commands: get(&stats, "total_commands_processed"),
        cpu_seconds: get(&cpu, "used_cpu_sys") + get(&cpu, "used_cpu_user"),
    }
}

/// Agents with at least one connection record (`<prefix>:agent:<id>` hashes).
async fn registered_agents(redis: &RedisServer) -> usize {
    let keys: Vec<String> = redis.query(redis::cmd("KEYS").arg(format!("{KEY_PREFIX}:agent:*"))).await;
    keys.len()
}

#[derive(Clone, Copy, Default)]
struct KasSample {
    rss_kib: u64,
    cpu_ticks: u64,
    fds: usize,
}

fn kas_sample(pid: u32) -> KasSample {
    KasSample {
        rss_kib: proc_stats::rss_kib(pid).unwrap_or(0),
        cpu_ticks: proc_stats::cpu_ticks(pid).unwrap_or(0),
        fds: proc_stats::open_fds(pid).unwrap_or(0),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn command_output(program: &str, args: &[&str], dir: Option<&Path>) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args);
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    cmd.output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
}

/// Times kas's own `RedisRegistry::refresh` and `gc` holding `agents` records (as one kas
/// holding every agent does), on the same Redis under another prefix: kas does not report
/// these durations itself. Median of 5 runs each, in ms.
async fn refresh_and_gc(redis: &RedisServer, agents: usize) -> Result<(f64, f64), SimError> {
    let timing =
        kas::registry::RegistryTiming { ttl: Duration::from_secs(300), heartbeat_ttl: Duration::from_secs(15) };
    let mut config = RedisConfig::new(redis.url());
    config.key_prefix = format!("{KEY_PREFIX}-refresh");
    let registry = RedisRegistry::new(&config, kas_e2e::registry_conformance::instance_info(), timing)
        .map_err(|e| setup("registry for the refresh timing", e))?;
    for i in 1..=agents as i64 {
        registry
            .register(kas_e2e::registry_conformance::record(i, i, i))
            .await
            .map_err(|e| setup("register for the refresh timing", e))?;
    }
    let (mut refresh, mut gc) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        registry.refresh().await.map_err(|e| setup("refresh", e))?;
        refresh.push(t.elapsed());
        let t = Instant::now();
        registry.gc().await.map_err(|e| setup("gc", e))?;
        gc.push(t.elapsed());
    }
    refresh.sort();
    gc.sort();
    let med = |v: &[Duration]| percentile(v, 0.5).as_secs_f64() * 1000.0;
    Ok((med(&refresh), med(&gc)))
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kas-sim: {e}");
            std::process::exit(2);
        }
    };
    match run(&args).await {
        Ok(report) => {
            print!("{report}");
            if let Some(out) = &args.out {
                match std::fs::write(out, &report) {
                    Ok(()) => eprintln!("written to {}", out.display()),
                    Err(e) => {
                        eprintln!("kas-sim: cannot write {}: {e}", out.display());
                        std::process::exit(1);
                    }
                }
            }
        }
        Err(e) => {
            eprintln!("kas-sim: {e}");
            std::process::exit(1);
        }
    }
}

async fn run(args: &Args) -> Result<String, SimError> {
    // One socket per simulated agent here, one per agent in each kas (kas raises its own).
    let fd_limit = kas::server::listen::raise_fd_limit().unwrap_or(0);
    if fd_limit < args.agents as u64 + 256 {
        return Err(SimError::Setup(format!(
            "the open file limit is {fd_limit}: {} agents need at least {} (raise the hard limit: ulimit -Hn)",
            args.agents,
            args.agents + 256
        )));
    }
    let dir = tempfile::tempdir().map_err(|e| setup("temporary directory", e))?;
    let dev = kas::standalone::ensure_dev_setup(&dir.path().join("dev")).map_err(|e| setup("kas dev setup", e))?;

    // M agents, one project each, random tokens.
    let mut file = StaticAgentsFile::default();
    let mut tokens = Vec::with_capacity(args.agents);
    for id in 1..=args.agents as i64 {
        let token = format!("sim-{id}-{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
        file.agents.push(StaticAgent {
            id,
            name: format!("sim-{id}"),
            project_id: id,
            token_sha256: token_sha256_hex(&token),
            configuration: None,
            configuration_repository: None,
            configuration_branch: None,
        });
        tokens.push(token);
    }
    let agents_file = dir.path().join("agents.yaml");
    file.save(&agents_file).map_err(|e| setup("agents file", e))?;

    let redis = RedisServer::start().await;
    let mut config = dev.config.clone().with_ephemeral_ports();
    config.agents.static_file = Some(agents_file);
    let mut redis_config = RedisConfig::new(redis.url());
    redis_config.key_prefix = KEY_PREFIX.to_owned();
    config.registry.redis = Some(redis_config);
    // The default cap derives from the fd limit; the simulation wants every agent accepted.
    config.connections.max_per_listener = Some(args.agents + 256);
    let mut kas = Vec::with_capacity(args.kas);
    for i in 0..args.kas {
        kas.push(start_kas(&args.kas_bin, &config, dir.path(), i)?);
    }
    let ticks_per_second = proc_stats::clock_ticks_per_second();

    // Registration times: the Connected events kas publishes in the same transaction that
    // writes the record, so an event received means the registry lists the connection.
    let client = redis::Client::open(format!("unix://{}", redis.socket().display())).map_err(|e| setup("redis", e))?;
    let mut pubsub = client.get_async_pubsub().await.map_err(|e| setup("redis pubsub", e))?;
    pubsub.subscribe(format!("{KEY_PREFIX}:events")).await.map_err(|e| setup("subscribe", e))?;
    let registered_at: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let sink = registered_at.clone();
    let events = tokio::spawn(async move {
        let mut messages = pubsub.into_on_message();
        while let Some(msg) = messages.next().await {
            let now = Instant::now();
            if let Ok(event) = ConnectionEvent::decode(msg.get_payload_bytes())
                && event.kind() == connection_event::Kind::Connected
            {
                sink.lock().unwrap_or_else(PoisonError::into_inner).entry(event.agent_id).or_insert(now);
            }
        }
    });

    // Settle, then the baseline with no agent.
    let before: Vec<KasSample> = kas.iter().map(|k| kas_sample(k.pid())).collect();
    let redis_before = redis_sample(&redis).await;
    let sim_rss_before = proc_stats::rss_kib(std::process::id()).unwrap_or(0);

    let counters = Arc::new(Counters::default());
    let stop = CancellationToken::new();
    let started_at: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let ramp_start = Instant::now();
    let mut tasks = Vec::with_capacity(args.agents);
    let interval = Duration::from_secs_f64(1.0 / args.connect_rate);
    let mut pace = tokio::time::interval(interval);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for (i, token) in tokens.into_iter().enumerate() {
        pace.tick().await;
        let id = i as i64 + 1;
        let sim =
            SimAgent { id, token, address: kas[i % kas.len()].agent_address.clone(), idle_tunnels: args.idle_tunnels };
        let started = started_at.clone();
        tasks.push(tokio::spawn(agent::run(sim, counters.clone(), stop.clone(), move |t| {
            started.lock().unwrap_or_else(PoisonError::into_inner).insert(id, t);
        })));
    }
    let ramp = ramp_start.elapsed();

    // Wait until every agent is registered (events) and the registry holds every agent key.
    let deadline = Instant::now() + SETTLE_WITHIN;
    loop {
        let events_seen = registered_at.lock().unwrap_or_else(PoisonError::into_inner).len();
        if events_seen >= args.agents && registered_agents(&redis).await >= args.agents {
            break;
        }
        if Instant::now() > deadline {
            stop.cancel();
            return Err(SimError::Timeout(format!(
                "{events_seen} of {} agents registered {SETTLE_WITHIN:?} after the last started",
                args.agents
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    let all_registered = ramp_start.elapsed();
    // Idle tunnels are opened right after presence: wait until all of them are open too.
    let want_tunnels = (args.agents * args.idle_tunnels) as u64;
    let deadline = Instant::now() + SETTLE_WITHIN;
    while counters.tunnels_open.load(Ordering::Relaxed) < want_tunnels {
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let tunnels_at_start = counters.tunnels_open.load(Ordering::Relaxed);

    let mut latencies: Vec<Duration> = {
        let started = started_at.lock().unwrap_or_else(PoisonError::into_inner);
        let registered = registered_at.lock().unwrap_or_else(PoisonError::into_inner);
        started.iter().filter_map(|(id, s)| registered.get(id).map(|r| r.saturating_duration_since(*s))).collect()
    };
    latencies.sort();

    // The idle window.
    let reopened_before = counters.tunnels_reopened.load(Ordering::Relaxed);
    let failures_before = counters.failures.load(Ordering::Relaxed);
    let idle_start: Vec<KasSample> = kas.iter().map(|k| kas_sample(k.pid())).collect();
    let redis_idle_start = redis_sample(&redis).await;
    let window_start = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let window = window_start.elapsed().as_secs_f64();
    let idle_end: Vec<KasSample> = kas.iter().map(|k| kas_sample(k.pid())).collect();
    let redis_idle_end = redis_sample(&redis).await;
    let sim_rss_idle = proc_stats::rss_kib(std::process::id()).unwrap_or(0);
    let reopened = counters.tunnels_reopened.load(Ordering::Relaxed) - reopened_before;
    let failures_in_window = counters.failures.load(Ordering::Relaxed) - failures_before;
    let tunnels_at_end = counters.tunnels_open.load(Ordering::Relaxed);
    let presence_at_end = counters.presence_open.load(Ordering::Relaxed);

    // Everyone leaves; wait until the registry is empty and kas closed the sockets.
    let leave_start = Instant::now();
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    let deadline = Instant::now() + SETTLE_WITHIN;
    let mut left_in_time = true;
    loop {
        let fds_back = kas.iter().zip(&before).all(|(k, b)| kas_sample(k.pid()).fds <= b.fds + 8);
        if fds_back && registered_agents(&redis).await == 0 {
            break;
        }
        if Instant::now() > deadline {
            left_in_time = false;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let all_left = leave_start.elapsed();
    let after: Vec<KasSample> = kas.iter().map(|k| kas_sample(k.pid())).collect();
    let redis_after = redis_sample(&redis).await;
    events.abort();

    let (refresh_ms, gc_ms) = refresh_and_gc(&redis, args.agents).await?;
    drop(kas);

    // The report.
    let mut r = String::new();
    let commit = command_output(
        "git",
        &["describe", "--always", "--dirty", "--abbrev=7"],
        Path::new(env!("CARGO_MANIFEST_DIR")).parent(),
    );
    let date = command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"], None);
    let redis_version = command_output("redis-server", &["--version"], None);
    let redis_version = redis_version.split_whitespace().nth(2).unwrap_or_default();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = command_output("uname", &["-sr"], None);
    let _ = writeln!(
        r,
        "### {} agents, {} kas, {} idle tunnels each\n\nRun: `kas-sim --agents {} --kas {} --idle-tunnels {} --connect-rate {} --idle-secs {}` · {date} · commit `{commit}` · {cpus} CPUs (shared machine), {kernel} · kas `{}` · redis-server {redis_version} on a unix socket · agents over loopback TCP, plain HTTP/2 (no TLS)\n",
        args.agents,
        args.kas,
        args.idle_tunnels,
        args.agents,
        args.kas,
        args.idle_tunnels,
        args.connect_rate,
        args.idle_secs,
        args.kas_bin.display()
    );
    let _ = writeln!(
        r,
        "Ramp: {} agents started in {:.1} s; all registered {:.1} s after the first started. Idle tunnels open at the window's start: {tunnels_at_start} of {want_tunnels}, at its end: {tunnels_at_end}; presence streams open at its end: {presence_at_end}. Idle window {window:.1} s: {reopened} tunnels reopened after kas closed them idle, {failures_in_window} failed connections or streams (all run: {}).\n",
        args.agents,
        ramp.as_secs_f64(),
        all_registered.as_secs_f64(),
        counters.failures.load(Ordering::Relaxed),
    );
    let _ = writeln!(
        r,
        "| kas | agents | RSS before (MiB) | RSS idle (MiB) | RSS per idle agent (KiB) | CPU s per minute per 1,000 idle agents | open fds before / idle | RSS after all left (MiB) | fds after |"
    );
    let _ = writeln!(r, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for i in 0..args.kas {
        let n = (args.agents / args.kas + usize::from(i < args.agents % args.kas)) as f64;
        let (b, s, e, a) = (before[i], idle_start[i], idle_end[i], after[i]);
        let per_agent_kib = (e.rss_kib as f64 - b.rss_kib as f64) / n;
        let cpu_s = e.cpu_ticks.saturating_sub(s.cpu_ticks) as f64 / ticks_per_second;
        let cpu_per_min_per_1000 = cpu_s * (60.0 / window) * (1000.0 / n);
        let _ = writeln!(
            r,
            "| kas-{i} | {n} | {:.1} | {:.1} | {per_agent_kib:.1} | {cpu_per_min_per_1000:.2} | {} / {} | {:.1} | {} |",
            b.rss_kib as f64 / 1024.0,
            e.rss_kib as f64 / 1024.0,
            b.fds,
            e.fds,
            a.rss_kib as f64 / 1024.0,
            a.fds,
        );
    }
    let m = args.agents as f64;
    let mem_per_agent = (redis_idle_end.used_memory - redis_before.used_memory) / m;
    let cmds_per_s = (redis_idle_end.commands - redis_idle_start.commands) / window;
    let redis_cpu = (redis_idle_end.cpu_seconds - redis_idle_start.cpu_seconds) / window;
    let _ = writeln!(r);
    let _ = writeln!(r, "| Redis | value |\n| --- | --- |");
    let _ = writeln!(
        r,
        "| used_memory before / idle / after all left (MiB) | {:.2} / {:.2} / {:.2} |",
        redis_before.used_memory / 1048576.0,
        redis_idle_end.used_memory / 1048576.0,
        redis_after.used_memory / 1048576.0
    );
    let _ = writeln!(r, "| used_memory per agent (bytes) | {mem_per_agent:.0} |");
    let _ = writeln!(r, "| commands/s during the idle window (all) | {cmds_per_s:.2} |");
    let _ = writeln!(r, "| commands/s per 1,000 idle agents | {:.2} |", cmds_per_s * 1000.0 / m);
    let _ =
        writeln!(r, "| CPU (used_cpu_user + sys) during the idle window, % of one core | {:.2} |", redis_cpu * 100.0);
    let _ = writeln!(r);
    let _ = writeln!(r, "| latency / timing | value |\n| --- | --- |");
    let _ = writeln!(r, "| connect-to-registered p50 (ms) | {} |", ms(percentile(&latencies, 0.5)));
    let _ = writeln!(r, "| connect-to-registered p99 (ms) | {} |", ms(percentile(&latencies, 0.99)));
    let _ = writeln!(r, "| connect-to-registered max (ms) | {} |", ms(latencies.last().copied().unwrap_or_default()));
    let _ = writeln!(
        r,
        "| registry refresh with {} records (ms, median of 5, kas's RedisRegistry in the simulator) | {refresh_ms:.1} |",
        args.agents
    );
    let _ = writeln!(r, "| registry GC with {} agents' keys (ms, median of 5, same) | {gc_ms:.1} |", args.agents);
    let _ = writeln!(
        r,
        "| all agents disconnected → registry empty and kas fds back (s) | {:.1}{} |",
        all_left.as_secs_f64(),
        if left_in_time { "" } else { " (timed out)" }
    );
    let _ = writeln!(
        r,
        "| simulator RSS before / idle (MiB) | {:.1} / {:.1} |\n",
        sim_rss_before as f64 / 1024.0,
        sim_rss_idle as f64 / 1024.0
    );
    Ok(r)
}
