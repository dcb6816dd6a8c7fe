//! kas-sim (issue 18): thousands of simulated agents in one process against real kas processes
//! on a real Redis: what holding them idle costs, requests through them, and a kas dying under
//! them.
//!
//! `cargo build --release -p kas --bin kas && cargo run -p kas-e2e --bin kas-sim -- --agents 1000`
//! (flags: `--scenario idle|failover --agents M --kas N --idle-tunnels K --connect-rate R
//! --idle-secs W --rate Q --settle-secs S --victim-agents V --accept-rate A --accept-burst B --drain-secs D
//! --kas-bin PATH --gitlab off|shared|local --gitlab-ttl SECS --out FILE`). It starts a private redis-server and N
//! `kas --config` processes (the release binary by default) with a static agents file of M
//! generated agents (with `--gitlab`, GitLab mode instead: an in-process fake GitLab answers
//! agent_info for the M tokens and counts the requests; `shared` keeps kas's agent_info cache
//! shared between kas, `local` turns it off; `--gitlab-ttl` sets the cache ttl), connects M simulated
//! agents (see `agent.rs`) round-robin over the kas at R per second and waits until the registry
//! lists all of them. Then:
//!
//! - `idle` (default): measures an idle window of W seconds (with Q requests per second through
//!   the agents when `--rate` is given), disconnects every agent, samples kas's RSS again D
//!   seconds after all left (default 30: the memory its allocator gave back) and reports as
//!   Markdown;
//! - `failover` (`failover.rs`): after S seconds, SIGKILLs kas-0 and measures until every agent
//!   it held is registered on another kas and served (with `--victim-agents V`, the first V
//!   agents start on kas-0 and the others round-robin on the rest).

mod agent;
mod failover;
mod load;
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

use crate::agent::{Counters, Fleet, Journal, Shared, SimAgent};
use crate::load::{Gateway, Load};

const KEY_PREFIX: &str = "kas-sim";
/// How long kas gets to log "kas listening".
const KAS_READY_WITHIN: Duration = Duration::from_secs(60);
/// How long all agents get to be registered after the last one started, and to be gone after
/// they disconnect.
const SETTLE_WITHIN: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(100);
const FLAGS: &str = "--scenario idle|failover --agents M --kas N --idle-tunnels K --connect-rate R --idle-secs W \
                     --rate Q --settle-secs S --victim-agents V --accept-rate A --accept-burst B --drain-secs D \
                     --gitlab off|shared|local --gitlab-ttl SECS --kas-bin PATH --out FILE";

#[derive(Debug, thiserror::Error)]
enum SimError {
    #[error("usage: {0} (flags: {FLAGS})")]
    Usage(String),
    #[error("{0}")]
    Setup(String),
    #[error("{0}")]
    Timeout(String),
}

/// The kas of agent number `index` (0-based) at the start.
fn home(args: &Args, index: usize) -> usize {
    match args.victim_agents {
        Some(v) if index < v => 0,
        Some(v) => 1 + (index - v) % (args.kas - 1).max(1),
        None => index % args.kas,
    }
}

fn setup(what: &str, e: impl std::fmt::Display) -> SimError {
    SimError::Setup(format!("{what}: {e}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Idle,
    Failover,
}

/// Who verifies agent tokens: the static agents file, or (GitLab mode) a fake GitLab, with kas's
/// agent_info cache shared between kas through Redis or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitlabMode {
    Off,
    Shared,
    Local,
}

struct Args {
    scenario: Scenario,
    agents: usize,
    kas: usize,
    idle_tunnels: usize,
    connect_rate: f64,
    idle_secs: u64,
    /// Requests per second through the agents (0: none).
    rate: f64,
    /// failover: seconds between every agent being registered and the kill.
    settle_secs: u64,
    /// failover: how many agents start on kas-0, the one killed (the others go round-robin to
    /// the rest); default: round-robin over all kas.
    victim_agents: Option<usize>,
    /// kas's `limits.agent_connection_accept_rate` (its defaults when not given).
    accept_rate: Option<u32>,
    accept_burst: Option<u32>,
    /// idle: seconds after all agents left until kas's RSS is sampled again (memory given back).
    drain_secs: u64,
    gitlab: GitlabMode,
    /// GitLab mode: `gitlab.agent_info_cache.ttl` (kas's default when not given).
    gitlab_ttl: Option<Duration>,
    kas_bin: PathBuf,
    out: Option<PathBuf>,
    /// The command line as given, for the report.
    command: String,
}

fn parse_args() -> Result<Args, SimError> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new("."));
    let mut a = Args {
        scenario: Scenario::Idle,
        agents: 1000,
        kas: 1,
        idle_tunnels: 2,
        connect_rate: 200.0,
        idle_secs: 30,
        rate: 0.0,
        settle_secs: 5,
        victim_agents: None,
        accept_rate: None,
        accept_burst: None,
        drain_secs: 30,
        gitlab: GitlabMode::Off,
        gitlab_ttl: None,
        kas_bin: workspace.join("target/release/kas"),
        out: None,
        command: String::new(),
    };
    let mut it = std::env::args().skip(1);
    let mut shown = Vec::new();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| SimError::Usage(format!("{flag} needs a value")))?;
        // The report names the run without where its output went (the binary is said apart).
        if flag != "--out" && flag != "--kas-bin" {
            shown.extend([flag.clone(), value.clone()]);
        }
        let bad = |e: &dyn std::fmt::Display| SimError::Usage(format!("{flag} {value}: {e}"));
        match flag.as_str() {
            "--scenario" => {
                a.scenario = match value.as_str() {
                    "idle" => Scenario::Idle,
                    "failover" => Scenario::Failover,
                    other => return Err(bad(&format!("unknown scenario {other} (idle or failover)"))),
                }
            }
            "--agents" => a.agents = value.parse().map_err(|e| bad(&e))?,
            "--kas" => a.kas = value.parse().map_err(|e| bad(&e))?,
            "--idle-tunnels" => a.idle_tunnels = value.parse().map_err(|e| bad(&e))?,
            "--connect-rate" => a.connect_rate = value.parse().map_err(|e| bad(&e))?,
            "--idle-secs" => a.idle_secs = value.parse().map_err(|e| bad(&e))?,
            "--rate" => a.rate = value.parse().map_err(|e| bad(&e))?,
            "--settle-secs" => a.settle_secs = value.parse().map_err(|e| bad(&e))?,
            "--victim-agents" => a.victim_agents = Some(value.parse().map_err(|e| bad(&e))?),
            "--accept-rate" => a.accept_rate = Some(value.parse().map_err(|e| bad(&e))?),
            "--accept-burst" => a.accept_burst = Some(value.parse().map_err(|e| bad(&e))?),
            "--drain-secs" => a.drain_secs = value.parse().map_err(|e| bad(&e))?,
            "--gitlab" => {
                a.gitlab = match value.as_str() {
                    "off" => GitlabMode::Off,
                    "shared" => GitlabMode::Shared,
                    "local" => GitlabMode::Local,
                    other => return Err(bad(&format!("unknown GitLab mode {other} (off, shared or local)"))),
                }
            }
            "--gitlab-ttl" => a.gitlab_ttl = Some(Duration::from_secs(value.parse().map_err(|e| bad(&e))?)),
            "--kas-bin" => a.kas_bin = value.into(),
            "--out" => a.out = Some(value.into()),
            other => return Err(SimError::Usage(format!("unknown flag {other}"))),
        }
    }
    a.command = shown.join(" ");
    if a.agents == 0 || a.kas == 0 || a.idle_secs == 0 || a.connect_rate.is_nan() || a.connect_rate <= 0.0 {
        return Err(SimError::Usage("--agents, --kas, --idle-secs and --connect-rate must be > 0".into()));
    }
    if a.rate.is_nan() || a.rate < 0.0 {
        return Err(SimError::Usage("--rate must be >= 0".into()));
    }
    if a.scenario == Scenario::Failover && a.kas < 2 {
        return Err(SimError::Usage("--scenario failover needs --kas 2 or more (one is killed)".into()));
    }
    if a.victim_agents.is_some_and(|n| n > a.agents) {
        return Err(SimError::Usage("--victim-agents must be at most --agents".into()));
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
pub struct KasProc {
    child: Child,
    agent_address: String,
    rest_address: String,
    observability_address: String,
    /// Its registry instance id (what its records and heartbeat key name).
    instance_id: String,
}

impl KasProc {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a crashed node or an OOM kill: no drain, no goodbye to the registry.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
            // Warnings, errors, and what is not a JSON log line (kas refusing its configuration).
            let plain = !line.starts_with('{');
            if echoed < 20 && (plain || line.contains("\"WARN\"") || line.contains("\"ERROR\"")) {
                eprintln!("kas-{index}: {line}");
                echoed += 1;
            }
            if !sent
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && v["fields"]["message"] == "kas listening"
                && let (Some(agent), Some(rest), Some(observability), Some(id)) = (
                    v["fields"]["agent"].as_str(),
                    v["fields"]["rest"].as_str(),
                    v["fields"]["observability"].as_str(),
                    v["fields"]["kas"].as_str(),
                )
            {
                let _ = tx.send((agent.to_owned(), rest.to_owned(), observability.to_owned(), id.to_owned()));
                sent = true;
            }
        }
    });
    match rx.recv_timeout(KAS_READY_WITHIN) {
        Ok((agent_address, rest_address, observability_address, instance_id)) => {
            Ok(KasProc { child, agent_address, rest_address, observability_address, instance_id })
        }
        Err(_) => {
            let _ = child.kill();
            Err(SimError::Timeout(format!("kas-{index} did not log \"kas listening\" within {KAS_READY_WITHIN:?}")))
        }
    }
}

/// Fields of `INFO <sections>` as numbers.
async fn redis_info(
    conn: &mut redis::aio::MultiplexedConnection,
    sections: &[&str],
) -> redis::RedisResult<HashMap<String, f64>> {
    let text: String = redis::cmd("INFO").arg(sections).query_async(conn).await?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(k, v)| v.trim().parse::<f64>().ok().map(|v| (k.to_owned(), v)))
        .collect())
}

#[derive(Clone, Copy)]
pub struct RedisSample {
    at: Instant,
    /// Redis's own clock (`server_time_usec`) when it answered, in seconds: intervals between
    /// samples by the server's clock, whatever delayed the answers on the way.
    server_time: f64,
    used_memory: f64,
    commands: f64,
    cpu_seconds: f64,
}

/// One `INFO server memory stats cpu` (one command: the sampling adds one command per sample).
async fn redis_sample(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<RedisSample> {
    let info = redis_info(conn, &["server", "memory", "stats", "cpu"]).await?;
    let get = |k: &str| info.get(k).copied().unwrap_or(0.0);
    Ok(RedisSample {
        at: Instant::now(),
        server_time: get("server_time_usec") / 1e6,
        used_memory: get("used_memory"),
        commands: get("total_commands_processed"),
        cpu_seconds: get("used_cpu_sys") + get("used_cpu_user"),
    })
}

/// Agents with at least one connection record (`<prefix>:agent:<id>` hashes).
async fn registered_agents(conn: &mut redis::aio::MultiplexedConnection) -> usize {
    let keys: Vec<String> =
        redis::cmd("KEYS").arg(format!("{KEY_PREFIX}:agent:*")).query_async(conn).await.unwrap_or_default();
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

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub fn ms(d: Duration) -> String {
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
    let result = match args.scenario {
        Scenario::Idle => run_idle(&args).await,
        Scenario::Failover => failover::run(&args).await,
    };
    match result {
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

/// Every `Connected` event kas published, per agent: when the simulator received it and the
/// kas instance that registered the connection (kas publishes it in the same transaction that
/// writes the record, so an event received means the registry lists the connection).
pub type Registrations = Arc<Mutex<HashMap<i64, Vec<(Instant, String)>>>>;

/// The running simulation: Redis, the kas processes, and M agents connected and registered.
pub struct Sim {
    /// First, so that kas stops before Redis does (fields drop in order).
    kas: Vec<KasProc>,
    /// GitLab mode: the fake GitLab verifying the agents' tokens (counts agent_info requests).
    gitlab: Option<kas_e2e::FakeGitlab>,
    _dir: tempfile::TempDir,
    redis: RedisServer,
    /// The simulator's own Redis connection (sampling, counting keys).
    conn: redis::aio::MultiplexedConnection,
    fleet: Arc<Fleet>,
    gateway: Arc<Gateway>,
    shared: Shared,
    /// Every `Connected` event as it comes (the failover scenario follows them without polling).
    registered: tokio::sync::mpsc::UnboundedReceiver<(i64, Instant, String)>,
    events: tokio::task::JoinHandle<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Connect-to-registered latencies of the first connections, sorted.
    latencies: Vec<Duration>,
    ramp: Duration,
    all_registered: Duration,
    tunnels_at_start: u64,
    before: Vec<KasSample>,
    redis_before: RedisSample,
    sim_rss_before: u64,
}

/// Starts Redis and the kas processes, connects every agent and waits until all are registered
/// with their idle tunnels open.
async fn start(args: &Args) -> Result<Sim, SimError> {
    // One socket per simulated agent here, one per agent in each kas (kas raises its own).
    let fd_limit = kas::server::listen::raise_fd_limit().unwrap_or(0);
    if fd_limit < args.agents as u64 + 512 {
        return Err(SimError::Setup(format!(
            "the open file limit is {fd_limit}: {} agents need at least {} (raise the hard limit: ulimit -Hn)",
            args.agents,
            args.agents + 512
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
            // GitLab mode: an explicit (empty) configuration wins over the configuration
            // project GitLab names, so kas reads no Git repository.
            configuration: (args.gitlab != GitlabMode::Off).then(kas::agent::AgentConfigDocument::default),
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
    config.connections.max_per_listener = Some(args.agents + 512);
    if let Some(rate) = args.accept_rate {
        config.limits.agent_connection_accept_rate.per_second = rate;
    }
    if let Some(burst) = args.accept_burst {
        config.limits.agent_connection_accept_rate.burst = burst;
    }
    let secret = kas::auth::Secret::from_file(&dev.gitlab_secret_file).map_err(|e| setup("gitlab secret", e))?;
    let gitlab = match args.gitlab {
        GitlabMode::Off => None,
        mode => {
            let fake = kas_e2e::FakeGitlab::start(&secret).await;
            for (i, token) in tokens.iter().enumerate() {
                let id = i as i64 + 1;
                fake.add_agent(
                    token,
                    kas_e2e::fake_gitlab::GitlabAgent { agent_id: id, project_id: id, name: format!("sim-{id}") },
                );
            }
            config.gitlab.address = Some(fake.url());
            // Static users are for static agents; GitLab mode's callers ask GitLab.
            config.auth.users_file = None;
            config.gitlab.agent_info_cache.shared = mode == GitlabMode::Shared;
            if let Some(ttl) = args.gitlab_ttl {
                config.gitlab.agent_info_cache.ttl = ttl;
            }
            Some(fake)
        }
    };
    let mut kas = Vec::with_capacity(args.kas);
    for i in 0..args.kas {
        kas.push(start_kas(&args.kas_bin, &config, dir.path(), i)?);
    }
    let fleet = Arc::new(Fleet::new(kas.iter().map(|k| k.agent_address.clone()).collect()));
    let jwt = kas::auth::mint_jwt(
        &secret,
        kas::auth::jwt::GITLAB_ISSUER,
        kas::auth::jwt::KAS_AUDIENCE,
        Duration::from_secs(3600),
    )
    .map_err(|e| setup("jwt", e))?;
    let gateway = Arc::new(
        Gateway::new(kas.iter().map(|k| format!("http://{}", k.rest_address)).collect(), fleet.clone(), jwt)
            .map_err(|e| setup("http client", e))?,
    );

    let client = redis::Client::open(format!("unix://{}", redis.socket().display())).map_err(|e| setup("redis", e))?;
    let mut conn = client.get_multiplexed_async_connection().await.map_err(|e| setup("redis connection", e))?;
    let mut pubsub = client.get_async_pubsub().await.map_err(|e| setup("redis pubsub", e))?;
    pubsub.subscribe(format!("{KEY_PREFIX}:events")).await.map_err(|e| setup("subscribe", e))?;
    let registrations: Registrations = Arc::default();
    let sink = registrations.clone();
    let (registered_tx, registered) = tokio::sync::mpsc::unbounded_channel();
    let events = tokio::spawn(async move {
        let mut messages = pubsub.into_on_message();
        while let Some(msg) = messages.next().await {
            let now = Instant::now();
            if let Ok(event) = ConnectionEvent::decode(msg.get_payload_bytes())
                && event.kind() == connection_event::Kind::Connected
            {
                let _ = registered_tx.send((event.agent_id, now, event.kas_instance_id.clone()));
                let mut map = sink.lock().unwrap_or_else(PoisonError::into_inner);
                map.entry(event.agent_id).or_default().push((now, event.kas_instance_id));
            }
        }
    });

    // Settle, then the baseline with no agent.
    let before: Vec<KasSample> = kas.iter().map(|k| kas_sample(k.pid())).collect();
    let redis_before = redis_sample(&mut conn).await.map_err(|e| setup("redis INFO", e))?;
    let sim_rss_before = proc_stats::rss_kib(std::process::id()).unwrap_or(0);

    let shared = Shared {
        fleet: fleet.clone(),
        counters: Arc::new(Counters::default()),
        journal: Arc::new(Journal::default()),
        stop: CancellationToken::new(),
    };
    let started_at: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let ramp_start = Instant::now();
    let mut tasks = Vec::with_capacity(args.agents);
    let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / args.connect_rate));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for (i, token) in tokens.into_iter().enumerate() {
        pace.tick().await;
        let id = i as i64 + 1;
        let sim = SimAgent { id, token, home: home(args, i), idle_tunnels: args.idle_tunnels };
        let started = started_at.clone();
        tasks.push(tokio::spawn(agent::run(sim, shared.clone(), move |t| {
            started.lock().unwrap_or_else(PoisonError::into_inner).insert(id, t);
        })));
    }
    let ramp = ramp_start.elapsed();

    // Wait until every agent is registered (events) and the registry holds every agent key.
    let deadline = Instant::now() + SETTLE_WITHIN;
    loop {
        let events_seen = registrations.lock().unwrap_or_else(PoisonError::into_inner).len();
        if events_seen >= args.agents && registered_agents(&mut conn).await >= args.agents {
            break;
        }
        if Instant::now() > deadline {
            shared.stop.cancel();
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
    while shared.counters.tunnels_open.load(Ordering::Relaxed) < want_tunnels {
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let tunnels_at_start = shared.counters.tunnels_open.load(Ordering::Relaxed);

    let mut latencies: Vec<Duration> = {
        let started = started_at.lock().unwrap_or_else(PoisonError::into_inner);
        let registered = registrations.lock().unwrap_or_else(PoisonError::into_inner);
        started
            .iter()
            .filter_map(|(id, s)| {
                registered.get(id).and_then(|r| r.first()).map(|(r, _)| r.saturating_duration_since(*s))
            })
            .collect()
    };
    latencies.sort();
    Ok(Sim {
        kas,
        gitlab,
        _dir: dir,
        redis,
        conn,
        fleet,
        gateway,
        shared,
        registered,
        events,
        tasks,
        latencies,
        ramp,
        all_registered,
        tunnels_at_start,
        before,
        redis_before,
        sim_rss_before,
    })
}

/// The first line of every report: what ran, where, on what.
fn run_line(args: &Args) -> String {
    let commit = command_output(
        "git",
        &["describe", "--always", "--dirty", "--abbrev=7"],
        Path::new(env!("CARGO_MANIFEST_DIR")).parent(),
    );
    let date = command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"], None);
    let redis_version = command_output("redis-server", &["--version"], None);
    let redis_version = redis_version.split_whitespace().nth(2).unwrap_or_default().to_owned();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = command_output("uname", &["-sr"], None);
    format!(
        "Run: `kas-sim {}` · {date} · commit `{commit}` · {cpus} CPUs (shared machine), {kernel} · kas `{}` · \
         redis-server {redis_version} on a unix socket · agents over loopback TCP, plain HTTP/2 (no TLS)\n",
        args.command,
        args.kas_bin.display()
    )
}

/// The request line of a report: how many, latency, failures.
fn requests_line(what: &str, s: &load::Summary, seconds: f64) -> String {
    format!(
        "| {what} | {} ({:.0}/s) | {} | {} | {} | {} | {} |",
        s.sent,
        s.sent as f64 / seconds.max(0.001),
        s.ok,
        ms(s.p50),
        ms(s.p99),
        ms(s.max),
        s.failures()
    )
}

const REQUESTS_HEADER: &str =
    "| requests | sent | 200 | p50 (ms) | p99 (ms) | max (ms) | failed |\n| --- | --- | --- | --- | --- | --- | --- |";

async fn run_idle(args: &Args) -> Result<String, SimError> {
    let mut sim = start(args).await?;
    let load = Arc::new(Load::default());
    let stop_load = CancellationToken::new();
    let load_task = (args.rate > 0.0)
        .then(|| tokio::spawn(load.clone().run(sim.gateway.clone(), args.rate, args.agents, stop_load.clone())));

    // The idle window (with requests, if asked).
    let counters = sim.shared.counters.clone();
    let reopened_before = counters.tunnels_reopened.load(Ordering::Relaxed);
    let failures_before = counters.failures.load(Ordering::Relaxed);
    let idle_start: Vec<KasSample> = sim.kas.iter().map(|k| kas_sample(k.pid())).collect();
    let redis_idle_start = redis_sample(&mut sim.conn).await.map_err(|e| setup("redis INFO", e))?;
    let window_start = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let window_end = Instant::now();
    let window = window_end.duration_since(window_start).as_secs_f64();
    let idle_end: Vec<KasSample> = sim.kas.iter().map(|k| kas_sample(k.pid())).collect();
    let redis_idle_end = redis_sample(&mut sim.conn).await.map_err(|e| setup("redis INFO", e))?;
    let sim_rss_idle = proc_stats::rss_kib(std::process::id()).unwrap_or(0);
    stop_load.cancel();
    if let Some(t) = load_task {
        let _ = t.await;
    }
    let requests = load::summarize(&load.between(window_start, window_end));
    let reopened = counters.tunnels_reopened.load(Ordering::Relaxed) - reopened_before;
    let failures_in_window = counters.failures.load(Ordering::Relaxed) - failures_before;
    let tunnels_at_end = counters.tunnels_open.load(Ordering::Relaxed);
    let presence_at_end = counters.presence_open.load(Ordering::Relaxed);

    // Everyone leaves; wait until the registry is empty and kas closed the sockets.
    sim.gateway.close();
    let leave_start = Instant::now();
    sim.shared.stop.cancel();
    for t in std::mem::take(&mut sim.tasks) {
        let _ = t.await;
    }
    let deadline = Instant::now() + SETTLE_WITHIN;
    let mut left_in_time = true;
    loop {
        let fds_back = sim.kas.iter().zip(&sim.before).all(|(k, b)| kas_sample(k.pid()).fds <= b.fds + 8);
        if fds_back && registered_agents(&mut sim.conn).await == 0 {
            break;
        }
        if Instant::now() > deadline {
            left_in_time = false;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let all_left = leave_start.elapsed();
    let after: Vec<KasSample> = sim.kas.iter().map(|k| kas_sample(k.pid())).collect();
    let redis_after = redis_sample(&mut sim.conn).await.map_err(|e| setup("redis INFO", e))?;
    sim.events.abort();
    // What kas gives back to the system once nothing holds the memory (its allocator's purge).
    tokio::time::sleep(Duration::from_secs(args.drain_secs)).await;
    let drained: Vec<KasSample> = sim.kas.iter().map(|k| kas_sample(k.pid())).collect();

    let (refresh_ms, gc_ms) = refresh_and_gc(&sim.redis, args.agents).await?;
    let ticks_per_second = proc_stats::clock_ticks_per_second();

    // The report.
    let mut r = String::new();
    let _ = writeln!(
        r,
        "### {} agents, {} kas, {} idle tunnels each{}\n\n{}",
        args.agents,
        args.kas,
        args.idle_tunnels,
        if args.rate > 0.0 { format!(", {} requests/s", args.rate) } else { String::new() },
        run_line(args)
    );
    let want_tunnels = args.agents * args.idle_tunnels;
    let _ = writeln!(
        r,
        "Ramp: {} agents started in {:.1} s; all registered {:.1} s after the first started. Idle tunnels open at the window's start: {} of {want_tunnels}, at its end: {tunnels_at_end}; presence streams open at its end: {presence_at_end}. Window {window:.1} s: {reopened} tunnels reopened after kas closed them idle, {failures_in_window} failed connections or streams (all run: {}).\n",
        args.agents,
        sim.ramp.as_secs_f64(),
        sim.all_registered.as_secs_f64(),
        sim.tunnels_at_start,
        counters.failures.load(Ordering::Relaxed),
    );
    let _ = writeln!(
        r,
        "| kas | agents | RSS before (MiB) | RSS idle (MiB) | RSS per idle agent (KiB) | CPU s per minute per 1,000 idle agents | open fds before / idle | RSS after all left (MiB) | RSS {} s later (MiB) | fds after |",
        args.drain_secs
    );
    let _ = writeln!(r, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for i in 0..args.kas {
        let n = (0..args.agents).filter(|&a| home(args, a) == i).count().max(1) as f64;
        let (b, s, e, a, d) = (sim.before[i], idle_start[i], idle_end[i], after[i], drained[i]);
        let per_agent_kib = (e.rss_kib as f64 - b.rss_kib as f64) / n;
        let cpu_s = e.cpu_ticks.saturating_sub(s.cpu_ticks) as f64 / ticks_per_second;
        let cpu_per_min_per_1000 = cpu_s * (60.0 / window) * (1000.0 / n);
        let _ = writeln!(
            r,
            "| kas-{i} | {n} | {:.1} | {:.1} | {per_agent_kib:.1} | {cpu_per_min_per_1000:.2} | {} / {} | {:.1} | {:.1} | {} |",
            b.rss_kib as f64 / 1024.0,
            e.rss_kib as f64 / 1024.0,
            b.fds,
            e.fds,
            a.rss_kib as f64 / 1024.0,
            d.rss_kib as f64 / 1024.0,
            a.fds,
        );
    }
    let m = args.agents as f64;
    let mem_per_agent = (redis_idle_end.used_memory - sim.redis_before.used_memory) / m;
    let cmds_per_s = (redis_idle_end.commands - redis_idle_start.commands) / window;
    let redis_cpu = (redis_idle_end.cpu_seconds - redis_idle_start.cpu_seconds) / window;
    let _ = writeln!(r);
    let _ = writeln!(r, "| Redis | value |\n| --- | --- |");
    let _ = writeln!(
        r,
        "| used_memory before / idle / after all left (MiB) | {:.2} / {:.2} / {:.2} |",
        sim.redis_before.used_memory / 1048576.0,
        redis_idle_end.used_memory / 1048576.0,
        redis_after.used_memory / 1048576.0
    );
    let _ = writeln!(r, "| used_memory per agent (bytes) | {mem_per_agent:.0} |");
    let _ = writeln!(r, "| commands/s during the window (all) | {cmds_per_s:.2} |");
    let _ = writeln!(r, "| commands/s per 1,000 agents | {:.2} |", cmds_per_s * 1000.0 / m);
    let _ = writeln!(r, "| CPU (used_cpu_user + sys) during the window, % of one core | {:.2} |", redis_cpu * 100.0);
    let _ = writeln!(r);
    if args.rate > 0.0 {
        let _ = writeln!(
            r,
            "Requests: `GET /api/v1/agents/<random agent>/kubernetes/api/v1/namespaces/default/pods/sim` on a random kas's rest listener (GitLab JWT), answered by the agent's tunnel with a 200 and a small JSON body (about 70 bytes); {} answered by the simulated agents over the whole run.\n",
            counters.requests_served.load(Ordering::Relaxed)
        );
        let _ = writeln!(r, "{REQUESTS_HEADER}");
        let _ = writeln!(r, "{}\n", requests_line("during the window", &requests, window));
    }
    let latencies = &sim.latencies;
    let _ = writeln!(r, "| latency / timing | value |\n| --- | --- |");
    let _ = writeln!(r, "| connect-to-registered p50 (ms) | {} |", ms(percentile(latencies, 0.5)));
    let _ = writeln!(r, "| connect-to-registered p99 (ms) | {} |", ms(percentile(latencies, 0.99)));
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
        sim.sim_rss_before as f64 / 1024.0,
        sim_rss_idle as f64 / 1024.0
    );
    Ok(r)
}
