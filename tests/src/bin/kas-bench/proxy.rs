//! The Kubernetes API proxy against peer tunnels, measured by this program itself: the same
//! upstream (this program re-executed with `--upstream`, so it shares no CPU or runtime with the
//! load generator) reached directly, through nginx, rathole, bore, kas+agentk and kas→kas+agentk.
//! Every path is a set of real processes; a peer that is not installed is a row saying so.
//! Figures are medians over interleaved rounds (round 1 runs every path, then round 2, ...).
//! Then `kubectl get pods -A` with 2,000 pods, directly and through kas.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kas_e2e::certificates::{Certificate, LOCALHOST_AND_IP};
use kas_e2e::{FakeKube, RedisServer};

use crate::{ms, percentile};

const SMALL_PATH: &str = "/api/v1/namespaces/default/pods/web-1";
const BIG_PATH: &str = "/api/v1/namespaces/default/pods/big/log";
const BIG_SIZE: u64 = 200 * 1024 * 1024;
const CONCURRENCY: usize = 16;
/// Small GETs per round at 16 connections, and sequential ones at 1 connection.
const REQUESTS_16: usize = 10_000;
const REQUESTS_1: usize = 2_000;
const KUBECTL_PODS: usize = 2_000;
const KUBECTL_RUNS: usize = 3;
const READY_WITHIN: Duration = Duration::from_secs(20);
/// The minimal relay's path names ([`start_socat`]): one relay process, two chained.
const SOCAT: &str = "socat";
const SOCAT_TWO: &str = "socat → socat";

/// A ~400-byte pod object, as the fake API server serves one.
const POD_JSON: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-1","namespace":"default","resourceVersion":"1","uid":"uid-default-web-1","creationTimestamp":"2026-01-01T00:00:00Z","labels":{"app":"web"}},"spec":{"containers":[{"name":"main","image":"busybox","command":["sleep","infinity"]}],"nodeName":"node-1"},"status":{"phase":"Running","podIP":"10.0.0.1","hostIP":"192.168.0.1"}}"#;

/// `kas-bench --upstream`: serves [`SMALL_PATH`] (the pod object) and [`BIG_PATH`] (200 MiB,
/// streamed from one repeated chunk so serving costs no generation CPU) on an ephemeral
/// loopback port, printed as the first stdout line. Any other path is a 404; auth is ignored.
pub async fn serve_upstream() -> std::io::Result<()> {
    use axum::body::{Body, Bytes};
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    let app = axum::Router::new()
        .route(SMALL_PATH, get(|| async { ([("content-type", "application/json")], POD_JSON) }))
        .route(
            BIG_PATH,
            get(move || {
                let chunk = chunk.clone();
                async move {
                    let n = BIG_SIZE / chunk.len() as u64;
                    let stream =
                        futures::stream::iter((0..n).map(move |_| Ok::<_, std::convert::Infallible>(chunk.clone())));
                    ([("content-type", "text/plain")], Body::from_stream(stream))
                }
            }),
        );
    axum::serve(listener, app).await
}

/// A child process killed on drop, with the role it plays in a path.
struct Proc {
    child: Child,
    role: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What /proc says about a running process.
#[derive(Clone, Copy)]
struct ProcRef {
    pid: u32,
}

impl ProcRef {
    /// Peak resident set (VmHWM) so far, MiB.
    fn peak_rss_mib(self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }

    /// The fields of /proc/<pid>/stat after the command name (which may hold spaces and
    /// parentheses): state is the first, the parent's pid the second, utime the 12th, stime the
    /// 13th. Empty once the process is gone.
    fn stat_fields(self) -> Vec<String> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().map(str::to_owned).collect()).unwrap_or_default()
    }

    /// utime + stime, in clock ticks.
    fn cpu_ticks(self) -> u64 {
        let fields = self.stat_fields();
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
        field(11) + field(12)
    }

    fn parent(self) -> Option<u32> {
        self.stat_fields().get(1)?.parse().ok()
    }

    /// Time its threads spent runnable but not running, waiting for a CPU (the second field of
    /// each thread's schedstat), in nanoseconds.
    fn run_queue_wait_ns(self) -> u64 {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else { return 0 };
        tasks
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
            .filter_map(|stat| stat.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum()
    }
}

/// Every process below `root` (children, their children, ...), from /proc.
pub(crate) fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((pid, ProcRef { pid }.parent()?))
        })
        .collect();
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(parents.iter().filter(|(_, ppid)| *ppid == parent).map(|(pid, _)| *pid));
        next += 1;
    }
    found.remove(0);
    found
}

/// The machine's CPU time so far from /proc/stat, in ticks: (all, idle + iowait). All is the first
/// eight fields (user to steal): guest time is already counted in user time.
fn machine_cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("cpu "))
        .map(|rest| rest.split_whitespace().take(8).filter_map(|f| f.parse().ok()).collect())
        .unwrap_or_default();
    let field = |i: usize| fields.get(i).copied().unwrap_or(0);
    (fields.iter().sum(), field(3) + field(4))
}

/// The share of the machine's CPU time left idle between two [`machine_cpu_ticks`] readings
/// (0 to 1).
fn idle_share(before: (u64, u64), after: (u64, u64)) -> f64 {
    let all = after.0.saturating_sub(before.0);
    if all == 0 { 0.0 } else { after.1.saturating_sub(before.1) as f64 / all as f64 }
}

fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// Why a path has no figures.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Unavailable {
    #[error("not installed ({0})")]
    NotInstalled(&'static str),
    #[error("failed to start: {0}")]
    Failed(String),
}

fn failed(what: impl std::fmt::Display) -> Unavailable {
    Unavailable::Failed(what.to_string())
}

/// `name` on PATH or in ~/.cargo/bin (where `cargo install` puts it).
fn find_program(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.extend(std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo/bin")));
    dirs.extend(["/usr/sbin", "/sbin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// The kas/agentk binaries next to this benchmark (target/release/).
pub(crate) fn sibling_binary(name: &'static str) -> Result<PathBuf, Unavailable> {
    let exe = std::env::current_exe().map_err(failed)?;
    let path = exe.parent().map(|d| d.join(name)).ok_or_else(|| failed("no directory for the benchmark binary"))?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(Unavailable::Failed(format!("{} missing: run `cargo build --release --bins` first", path.display())))
    }
}

fn spawn(role: &str, cmd: &mut Command) -> Result<Proc, Unavailable> {
    let child = cmd.stdin(Stdio::null()).spawn().map_err(|e| Unavailable::Failed(format!("{role}: {e}")))?;
    Ok(Proc { child, role: role.to_owned() })
}

/// A free loopback port (a benchmark program, not a test: bind 0 and release it).
fn free_port() -> Result<u16, Unavailable> {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).map_err(failed)
}

/// Reads `stream` line by line on a thread until `pick` finds what it wants (or 20 s pass);
/// keeps draining afterwards so the child never blocks on a full pipe, and prints the warnings
/// and errors kas and agentk log (JSON lines), which explain failed requests.
fn read_until<R: std::io::Read + Send + 'static>(
    role: &str,
    stream: R,
    pick: impl Fn(&str) -> Option<String> + Send + 'static,
) -> Option<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let role = role.to_owned();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if line.contains("WARN") || line.contains("ERROR") {
                eprintln!("{role}: {line}");
            }
            if !sent && let Some(found) = pick(&line) {
                let _ = tx.send(found);
                sent = true;
            }
        }
    });
    rx.recv_timeout(READY_WITHIN).ok()
}

fn start_upstream() -> Result<(Proc, String), Unavailable> {
    let exe = std::env::current_exe().map_err(failed)?;
    let mut p = spawn("upstream", Command::new(exe).arg("--upstream").stdout(Stdio::piped()))?;
    let stdout = p.child.stdout.take().ok_or_else(|| failed("upstream stdout"))?;
    let addr = read_until("upstream", stdout, |l| Some(l.trim().to_owned()))
        .ok_or_else(|| failed("upstream printed no address"))?;
    Ok((p, addr))
}

/// Starts kas with a config file; returns the process and its rest and agent addresses.
fn start_kas(config: &kas::Config, dir: &Path, role: &str) -> Result<(Proc, String, String), Unavailable> {
    let path = dir.join(format!("{role}.yaml"));
    std::fs::write(&path, serde_norway::to_string(config).map_err(failed)?).map_err(failed)?;
    let mut kas = spawn(
        role,
        Command::new(sibling_binary("kas")?)
            .arg("--config")
            .arg(&path)
            .args(["--log-format", "json", "--log", "warn,kas=info"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )?;
    let stderr = kas.child.stderr.take().ok_or_else(|| failed("kas stderr"))?;
    let found = read_until(role, stderr, |line| {
        let v = serde_json::from_str::<serde_json::Value>(line).ok()?;
        if v["fields"]["message"] != "kas listening" {
            return None;
        }
        Some(format!("{} {}", v["fields"]["rest"].as_str()?, v["fields"]["agent"].as_str()?))
    })
    .ok_or_else(|| failed(format!("{role} did not log \"kas listening\"")))?;
    let (rest, agent) = found.split_once(' ').ok_or_else(|| failed("kas addresses"))?;
    Ok((kas, rest.to_owned(), agent.to_owned()))
}

fn start_agentk(kas_agent: &str, token_file: &Path, kubeconfig: &Path) -> Result<Proc, Unavailable> {
    let mut agentk = spawn(
        "agentk",
        Command::new(sibling_binary("agentk")?)
            .arg(format!("--kas-address=grpc://{kas_agent}"))
            .arg(format!("--token-file={}", token_file.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--observability-address=127.0.0.1:0", "--log=warn"])
            .args(
                std::env::var("BENCH_AGENTK_ARGS")
                    .map(|a| a.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                    .unwrap_or_default(),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )?;
    // Only drained, for its warnings: agentk announces nothing the benchmark waits for.
    let stderr = agentk.child.stderr.take().ok_or_else(|| failed("agentk stderr"))?;
    std::thread::spawn(move || read_until("agentk", stderr, |_| None));
    Ok(agentk)
}

fn kubeconfig(server: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: up\n  cluster:\n    server: {server}\nusers:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: up\n  context:\n    cluster: up\n    user: sa\n    namespace: default\ncurrent-context: up\n"
    )
}

fn start_nginx(dir: &Path, upstream: &str) -> Result<(Vec<Proc>, String), Unavailable> {
    let nginx = find_program("nginx").ok_or(Unavailable::NotInstalled("apt-get install nginx"))?;
    let port = free_port()?;
    let conf = dir.join("nginx.conf");
    // One process (no master) with one worker's work: its CPU and RSS are all in one /proc entry.
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {dir}/nginx.pid;\nerror_log {dir}/nginx-error.log;\n\
             events {{ worker_connections 1024; }}\n\
             http {{ access_log off; client_body_temp_path {dir}; proxy_temp_path {dir};\n\
             upstream up {{ server {upstream}; keepalive 32; }}\n\
             server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://up; proxy_http_version 1.1;\n\
             proxy_set_header Connection \"\"; proxy_buffering off; }} }} }}\n",
            dir = dir.display()
        ),
    )
    .map_err(failed)?;
    let p = spawn("nginx", Command::new(nginx).arg("-c").arg(&conf).stdout(Stdio::null()).stderr(Stdio::null()))?;
    Ok((vec![p], format!("http://127.0.0.1:{port}")))
}

fn start_rathole(dir: &Path, upstream: &str) -> Result<(Vec<Proc>, String), Unavailable> {
    let rathole = find_program("rathole").ok_or(Unavailable::NotInstalled("cargo install rathole"))?;
    let (control, service) = (free_port()?, free_port()?);
    let server = dir.join("rathole-server.toml");
    let client = dir.join("rathole-client.toml");
    std::fs::write(
        &server,
        format!(
            "[server]\nbind_addr = \"127.0.0.1:{control}\"\n\n[server.services.up]\ntoken = \"bench\"\nbind_addr = \"127.0.0.1:{service}\"\n"
        ),
    )
    .map_err(failed)?;
    std::fs::write(
        &client,
        format!(
            "[client]\nremote_addr = \"127.0.0.1:{control}\"\n\n[client.services.up]\ntoken = \"bench\"\nlocal_addr = \"{upstream}\"\n"
        ),
    )
    .map_err(failed)?;
    let quiet = |c: &mut Command| {
        c.env("RUST_LOG", "error").stdout(Stdio::null()).stderr(Stdio::null());
    };
    let mut s = Command::new(&rathole);
    s.arg("--server").arg(&server);
    quiet(&mut s);
    let mut c = Command::new(&rathole);
    c.arg("--client").arg(&client);
    quiet(&mut c);
    Ok((
        vec![spawn("rathole server", &mut s)?, spawn("rathole client", &mut c)?],
        format!("http://127.0.0.1:{service}"),
    ))
}

/// socat as a minimal relay in front of `to` (host:port): one process forked per connection that
/// copies bytes with `poll`, `read` and `write` and does no protocol work. Two of them chained,
/// against one, give what one more process on a path costs on this machine, the scale for kas
/// A's hop in kas → kas. Its forked children, not the listener, carry the load, so the path
/// reports no CPU or RSS. Returns the process and its address (host:port).
fn start_socat(to: &str) -> Result<(Proc, String), Unavailable> {
    let socat = find_program("socat").ok_or(Unavailable::NotInstalled("apt-get install socat"))?;
    let port = free_port()?;
    let p = spawn(
        "socat",
        Command::new(socat)
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,nodelay"))
            .arg(format!("TCP:{to},nodelay"))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    Ok((p, format!("127.0.0.1:{port}")))
}

async fn start_bore(upstream: &str) -> Result<(Vec<Proc>, String), Unavailable> {
    let bore = find_program("bore").ok_or(Unavailable::NotInstalled("cargo install bore-cli"))?;
    let upstream_port = upstream.rsplit_once(':').map(|(_, p)| p).ok_or_else(|| failed("upstream port"))?;
    // bore's control port is fixed (7835); the tunnel ports are drawn from this range.
    let start_server = || {
        spawn(
            "bore server",
            Command::new(&bore)
                .args(["server", "--bind-addr", "127.0.0.1", "--min-port", "20000", "--max-port", "30000"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
    };
    let mut server = start_server()?;
    // The server needs a moment to bind its control port: the client retries until it connects.
    // A server that exited could not bind it (a previous run's server still holding it): it is
    // started again.
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if server.child.try_wait().is_ok_and(|s| s.is_some()) {
            server = start_server()?;
        }
        let mut client = spawn(
            "bore client",
            Command::new(&bore)
                .args(["local", upstream_port, "--local-host", "127.0.0.1", "--to", "127.0.0.1"])
                .env("NO_COLOR", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        )?;
        let stdout = client.child.stdout.take().ok_or_else(|| failed("bore stdout"))?;
        // "listening at 127.0.0.1:<remote port>" (the message text, never colored).
        let port = read_until("bore", stdout, |l| {
            let rest = &l[l.find("listening at ")? + "listening at ".len()..];
            let port: String = rest.rsplit_once(':')?.1.chars().take_while(char::is_ascii_digit).collect();
            (!port.is_empty()).then_some(port)
        });
        let Some(port) = port else {
            // Its output ends as it exits (it could not reach the server yet), a moment before
            // the process can be reaped: waited for, or a client that was exiting would count as
            // one that is stuck.
            let exiting_by = Instant::now() + Duration::from_secs(1);
            while client.child.try_wait().is_ok_and(|s| s.is_none()) && Instant::now() < exiting_by {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if Instant::now() < deadline && client.child.try_wait().is_ok_and(|s| s.is_some()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            return Err(failed("bore local printed no \"listening at\" port"));
        };
        return Ok((vec![server, client], format!("http://127.0.0.1:{port}")));
    }
}

/// One path from the load generator to the upstream.
struct Target {
    name: &'static str,
    base: Result<String, Unavailable>,
    token: String,
    /// The processes whose CPU and peak RSS are the path's (not the upstream's).
    procs: Vec<(String, ProcRef)>,
    client: reqwest::Client,
    rounds: Vec<Round>,
    /// Non-2xx statuses and transport errors, with the first few bodies/messages.
    bad: usize,
    bad_samples: Vec<String>,
}

#[derive(Clone)]
struct Round {
    rps16: f64,
    p99_16: Duration,
    p50_1: Duration,
    p99_1: Duration,
    mbps: f64,
    /// CPU seconds per 10,000 requests of each process, over the 16-connection phase.
    cpu_per_10k: Vec<f64>,
    /// Seconds per 10,000 requests each process's threads waited for a CPU while runnable, over
    /// the 16-connection phase.
    wait_per_10k: Vec<f64>,
    /// Share of the machine's CPU time left idle over the 16-connection phase (0 to 1).
    idle16: f64,
    /// CPU milliseconds per MB (10^6 bytes) of each process of the path over the round's 200 MiB
    /// GETs, then of the processes every path shares ([`Shared`]: the load generator, the upstream).
    big_ms_per_mb: Vec<f64>,
    /// Share of the machine's CPU time left idle over the round's 200 MiB GETs (0 to 1).
    idle_big: f64,
}

/// The processes every path shares, whose CPU per byte is part of what a path's throughput costs
/// the machine: this program (the load generator) and the upstream.
struct Shared {
    load_generator: ProcRef,
    upstream: ProcRef,
}

impl Shared {
    const ROLES: [&'static str; 2] = ["load generator", "upstream"];

    fn procs(&self) -> [ProcRef; 2] {
        [self.load_generator, self.upstream]
    }
}

impl Target {
    fn note_bad(&mut self, what: String) {
        self.bad += 1;
        if self.bad_samples.len() < 5 {
            self.bad_samples.push(what);
        }
    }
}

/// One GET of `url`: Ok(latency) for a 2xx with its whole body read, Err(what went wrong).
async fn get(client: &reqwest::Client, url: &str, token: &str) -> Result<Duration, String> {
    let t0 = Instant::now();
    let r = client.get(url).bearer_auth(token).send().await.map_err(|e| {
        let mut text = format!("error: {e}");
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    })?;
    let status = r.status();
    let body = r.bytes().await.map_err(|e| format!("{status}, body error: {e}"))?;
    if status.is_success() {
        Ok(t0.elapsed())
    } else {
        Err(format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(300)])))
    }
}

/// `total` GETs spread over `concurrency` connections: (latencies of 2xx, failures, elapsed).
async fn small_gets(
    t: &Target,
    base: &str,
    concurrency: usize,
    total: usize,
) -> (Vec<Duration>, Vec<String>, Duration) {
    let url = format!("{base}{SMALL_PATH}");
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, url, token, next) = (t.client.clone(), url.clone(), t.token.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let (mut ok, mut bad) = (Vec::new(), Vec::new());
            while next.fetch_add(1, Ordering::Relaxed) < total {
                match get(&client, &url, &token).await {
                    Ok(d) => ok.push(d),
                    Err(e) => bad.push(e),
                }
            }
            (ok, bad)
        }));
    }
    let (mut ok, mut bad) = (Vec::with_capacity(total), Vec::new());
    for w in workers {
        match w.await {
            Ok((o, b)) => {
                ok.extend(o);
                bad.extend(b);
            }
            Err(e) => bad.push(format!("worker: {e}")),
        }
    }
    let elapsed = started.elapsed();
    ok.sort();
    (ok, bad, elapsed)
}

async fn big_body(t: &Target, base: &str) -> Result<f64, String> {
    let url = format!("{base}{BIG_PATH}");
    let started = Instant::now();
    let mut r = t.client.get(&url).bearer_auth(&t.token).send().await.map_err(|e| format!("error: {e}"))?;
    if !r.status().is_success() {
        return Err(format!("{} on the 200 MiB GET", r.status()));
    }
    let mut total = 0u64;
    while let Some(chunk) = r.chunk().await.map_err(|e| format!("200 MiB body after {total} bytes: {e}"))? {
        total += chunk.len() as u64;
    }
    if total != BIG_SIZE {
        return Err(format!("200 MiB body: {total} bytes"));
    }
    Ok(total as f64 / 1e6 / started.elapsed().as_secs_f64())
}

/// GETs per round on 16 connections: `BENCH_REQUESTS_16`, else [`REQUESTS_16`] (about half a
/// second on this machine).
fn requests_16() -> usize {
    std::env::var("BENCH_REQUESTS_16").ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(REQUESTS_16).max(1)
}

/// BENCH_BIG_GETS=N: a round's 200 MiB figure is the median of N GETs (one by default): one
/// transfer's MB/s varies more between runs than the small requests' rates.
fn big_gets_per_round() -> usize {
    std::env::var("BENCH_BIG_GETS").ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(1).max(1)
}

async fn measure_round(t: &mut Target, shared: &Shared, ticks_per_s: f64) {
    let Ok(base) = t.base.clone() else { return };
    // Warm-up: 16 connections opened (and tunnels, for the peers) before anything is timed.
    let (_, bad, _) = small_gets(t, &base, CONCURRENCY, CONCURRENCY * 20).await;
    bad.into_iter().for_each(|b| t.note_bad(format!("warm-up: {b}")));

    let (one, bad, _) = small_gets(t, &base, 1, REQUESTS_1).await;
    bad.into_iter().for_each(|b| t.note_bad(b));

    // Per process: CPU time (s) and run-queue wait (s) so far.
    let spent = |t: &Target| -> Vec<(f64, f64)> {
        t.procs.iter().map(|(_, p)| (p.cpu_ticks() as f64 / ticks_per_s, p.run_queue_wait_ns() as f64 / 1e9)).collect()
    };
    let before = spent(t);
    let machine_before = machine_cpu_ticks();
    let requests = requests_16();
    let (sixteen, bad, elapsed) = small_gets(t, &base, CONCURRENCY, requests).await;
    let machine_after = machine_cpu_ticks();
    let per_10k = |seconds: f64| seconds.max(0.0) * 10_000.0 / requests as f64;
    let (cpu_per_10k, wait_per_10k): (Vec<f64>, Vec<f64>) = spent(t)
        .into_iter()
        .zip(before)
        .map(|((cpu, wait), (cpu0, wait0))| (per_10k(cpu - cpu0), per_10k(wait - wait0)))
        .unzip();
    let idle16 = idle_share(machine_before, machine_after);
    bad.into_iter().for_each(|b| t.note_bad(b));

    let gets = big_gets_per_round();
    let mut each = Vec::with_capacity(gets);
    // CPU of the path's processes and of the shared ones over all of the round's 200 MiB GETs
    // (one GET is about half a second here, 50 clock ticks of a busy process).
    let big_procs: Vec<ProcRef> = t.procs.iter().map(|(_, p)| *p).chain(shared.procs()).collect();
    let cpu_seconds =
        |procs: &[ProcRef]| -> Vec<f64> { procs.iter().map(|p| p.cpu_ticks() as f64 / ticks_per_s).collect() };
    let (big_before, machine_big_before) = (cpu_seconds(&big_procs), machine_cpu_ticks());
    let mut big_bytes = 0u64;
    for _ in 0..gets {
        match big_body(t, &base).await {
            Ok(m) => {
                each.push(m);
                big_bytes += BIG_SIZE;
            }
            Err(e) => {
                t.note_bad(e);
                each.push(0.0);
            }
        }
    }
    let machine_big_after = machine_cpu_ticks();
    let mb = big_bytes as f64 / 1e6;
    let big_ms_per_mb = cpu_seconds(&big_procs)
        .into_iter()
        .zip(big_before)
        .map(|(after, before)| if mb > 0.0 { (after - before).max(0.0) * 1e3 / mb } else { 0.0 })
        .collect();
    let idle_big = idle_share(machine_big_before, machine_big_after);
    let mbps = median_f(each);
    t.rounds.push(Round {
        rps16: sixteen.len() as f64 / elapsed.as_secs_f64(),
        p99_16: percentile(&sixteen, 0.99),
        p50_1: percentile(&one, 0.5),
        p99_1: percentile(&one, 0.99),
        mbps,
        cpu_per_10k,
        wait_per_10k,
        idle16,
        big_ms_per_mb,
        idle_big,
    });
}

fn median_f(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn median_d(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Medians over the rounds of one path, figure by figure.
fn summarize(rounds: &[Round]) -> Option<Round> {
    if rounds.is_empty() {
        return None;
    }
    let n = rounds[0].cpu_per_10k.len();
    let n_big = rounds[0].big_ms_per_mb.len();
    Some(Round {
        rps16: median_f(rounds.iter().map(|r| r.rps16).collect()),
        p99_16: median_d(rounds.iter().map(|r| r.p99_16).collect()),
        p50_1: median_d(rounds.iter().map(|r| r.p50_1).collect()),
        p99_1: median_d(rounds.iter().map(|r| r.p99_1).collect()),
        mbps: median_f(rounds.iter().map(|r| r.mbps).collect()),
        cpu_per_10k: (0..n).map(|i| median_f(rounds.iter().map(|r| r.cpu_per_10k[i]).collect())).collect(),
        wait_per_10k: (0..n).map(|i| median_f(rounds.iter().map(|r| r.wait_per_10k[i]).collect())).collect(),
        idle16: median_f(rounds.iter().map(|r| r.idle16).collect()),
        big_ms_per_mb: (0..n_big).map(|i| median_f(rounds.iter().map(|r| r.big_ms_per_mb[i]).collect())).collect(),
        idle_big: median_f(rounds.iter().map(|r| r.idle_big).collect()),
    })
}

async fn wait_ready(client: &reqwest::Client, base: &str, token: &str) -> Result<(), Unavailable> {
    let deadline = Instant::now() + READY_WITHIN;
    let mut last = String::new();
    while Instant::now() < deadline {
        match get(client, &format!("{base}{SMALL_PATH}"), token).await {
            Ok(_) => return Ok(()),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(failed(format!("no 2xx from {base} within {READY_WITHIN:?} (last: {last})")))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap_or_default()
}

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 => format!("{:.2}", a / b),
        _ => "—".into(),
    }
}

pub async fn run(rounds: usize, report: &mut String) {
    let _ = writeln!(report, "## Kubernetes API proxy against peer tunnels (issues 4 and 14)\n");
    if let Err(e) = run_paths(rounds, report).await {
        let _ = writeln!(report, "The paths could not be measured: {e}\n");
    }
    match kubectl_get_pods().await {
        Ok(text) => report.push_str(&text),
        Err(e) => {
            let _ = writeln!(report, "`kubectl get pods -A` could not be measured: {e}\n");
        }
    }
}

async fn run_paths(rounds: usize, report: &mut String) -> Result<(), Unavailable> {
    let dir = tempfile::tempdir().map_err(failed)?;
    let dev = kas::standalone::ensure_dev_setup(&dir.path().join("dev")).map_err(failed)?;
    let redis = RedisServer::start().await;
    let (upstream_proc, upstream) = start_upstream()?;
    let upstream_url = format!("http://{upstream}");
    let kubeconfig_path = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig_path, kubeconfig(&upstream_url, "bench")).map_err(failed)?;

    let mut config = dev.config.clone().with_ephemeral_ports();
    config.registry.redis = Some(kas::registry::redis::RedisConfig::new(redis.url()));
    let mut procs: Vec<Proc> = Vec::new();
    let mut kas_paths = || -> Result<(String, String, ProcRef, ProcRef, ProcRef), Unavailable> {
        let (kas_a, rest_a, agent_a) = start_kas(&config, dir.path(), "kas A")?;
        let (kas_b, rest_b, _) = start_kas(&config, dir.path(), "kas B")?;
        let agentk = start_agentk(&agent_a, &dev.agent_token_file, &kubeconfig_path)?;
        let refs =
            (ProcRef { pid: kas_a.child.id() }, ProcRef { pid: kas_b.child.id() }, ProcRef { pid: agentk.child.id() });
        procs.extend([kas_a, kas_b, agentk]);
        let via = |rest: &str| format!("http://{rest}/api/v1/agents/1/kubernetes");
        Ok((via(&rest_a), via(&rest_b), refs.0, refs.1, refs.2))
    };
    let kas = kas_paths();
    let secret = kas::auth::Secret::from_file(&dev.gitlab_secret_file).map_err(failed)?;
    let jwt = kas::auth::mint_jwt(&secret, "gitlab", "gitlab-kas", Duration::from_secs(3600)).map_err(failed)?;

    let mut peer = |started: Result<(Vec<Proc>, String), Unavailable>| match started {
        Ok((ps, base)) => {
            let refs = ps.iter().map(|p| (p.role.clone(), ProcRef { pid: p.child.id() })).collect();
            procs.extend(ps);
            (Ok(base), refs)
        }
        Err(e) => (Err(e), Vec::new()),
    };
    let nginx = peer(start_nginx(dir.path(), &upstream));
    let rathole = peer(start_rathole(dir.path(), &upstream));
    let bore = peer(start_bore(&upstream).await);
    let mut relay = |to: &str| {
        start_socat(to).map(|(p, addr)| {
            procs.push(p);
            addr
        })
    };
    let socat_one = relay(&upstream);
    // The second relay in front of the first; without the first, the first's reason.
    let socat_two = socat_one.clone().and_then(|one| relay(&one));
    let url = |addr: Result<String, Unavailable>| addr.map(|a| format!("http://{a}"));
    let target = |name, (base, procs): (Result<String, Unavailable>, Vec<(String, ProcRef)>), token: &str| Target {
        name,
        base,
        token: token.to_owned(),
        procs,
        client: client(),
        rounds: Vec::new(),
        bad: 0,
        bad_samples: Vec::new(),
    };
    let (kas_one, kas_two) = match kas {
        Ok((a, b, kas_a, kas_b, agentk)) => (
            (Ok(a), vec![("kas".to_owned(), kas_a), ("agentk".to_owned(), agentk)]),
            (Ok(b), vec![("kas B".to_owned(), kas_b), ("kas A".to_owned(), kas_a), ("agentk".to_owned(), agentk)]),
        ),
        Err(e) => ((Err(failed(&e)), Vec::new()), (Err(e), Vec::new())),
    };
    let mut targets = vec![
        target("direct", (Ok(upstream_url.clone()), Vec::new()), "bench"),
        target("nginx reverse proxy", nginx, "bench"),
        target("rathole", rathole, "bench"),
        target("bore", bore, "bench"),
        target(SOCAT, (url(socat_one), Vec::new()), "bench"),
        target(SOCAT_TWO, (url(socat_two), Vec::new()), "bench"),
        target("kas + agentk", kas_one, &jwt),
        target("kas → kas + agentk", kas_two, &jwt),
    ];
    // BENCH_PATHS="kas + agentk,rathole" measures only the paths named (for profiling one path).
    if let Ok(only) = std::env::var("BENCH_PATHS") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        targets.retain(|t| only.contains(&t.name));
    }
    for t in &mut targets {
        if let Ok(base) = &t.base
            && let Err(e) = wait_ready(&t.client, base, &t.token).await
        {
            t.base = Err(e);
        }
    }

    // BENCH_HOLD_SECS=N: before measuring, N seconds of 16-connection load (BENCH_HOLD_CONNS
    // connections if set) on each path, with its processes' pids on stderr (to attach `perf` to
    // one phase, not a mix of them).
    if let Some(hold) = std::env::var("BENCH_HOLD_SECS").ok().and_then(|s| s.parse::<u64>().ok()) {
        let conns = std::env::var("BENCH_HOLD_CONNS").ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(CONCURRENCY);
        // BENCH_HOLD_BIG=1: the held load is 200 MiB GETs, one after the other.
        let big = std::env::var("BENCH_HOLD_BIG").is_ok_and(|v| v == "1");
        for t in &targets {
            let Ok(base) = &t.base else { continue };
            let pids: Vec<String> = t.procs.iter().map(|(role, p)| format!("{role}={}", p.pid)).collect();
            eprintln!("holding load on {}: {}", t.name, pids.join(" "));
            let until = Instant::now() + Duration::from_secs(hold);
            while Instant::now() < until {
                if big {
                    let _ = big_body(t, base).await;
                } else {
                    small_gets(t, base, conns.max(1), requests_16()).await;
                }
            }
        }
        eprintln!("hold done");
    }

    let ticks = clock_ticks_per_second();
    let shared = Shared {
        load_generator: ProcRef { pid: std::process::id() },
        upstream: ProcRef { pid: upstream_proc.child.id() },
    };
    for _ in 0..rounds {
        for t in &mut targets {
            measure_round(t, &shared, ticks).await;
        }
    }

    write_paths_report(&targets, rounds, report);
    // agentk before kas (a Vec drops front to back): agentk would otherwise log the kas it
    // loses at the end as a failure.
    procs.reverse();
    drop((procs, upstream_proc, redis));
    Ok(())
}

fn write_paths_report(targets: &[Target], rounds: usize, report: &mut String) {
    let summaries: Vec<Option<Round>> = targets.iter().map(|t| summarize(&t.rounds)).collect();
    let big_gets = match big_gets_per_round() {
        1 => format!("one {} MiB GET", BIG_SIZE >> 20),
        n => format!("the median of {n} {} MiB GETs (`BENCH_BIG_GETS`)", BIG_SIZE >> 20),
    };
    let find = |name: &str| targets.iter().position(|t| t.name == name).and_then(|i| summaries[i].as_ref());
    let rathole = find("rathole");
    let _ = writeln!(
        report,
        "Every path reaches the same upstream: this program re-executed as `kas-bench --upstream` (its \
         own process: a small axum server answering a ~400-byte pod object and a {} MiB streamed \
         response; it ignores auth). kas (two replicas on one Redis), agentk, nginx, rathole, bore and \
         socat (a relay forked per connection that only copies bytes, one and two chained: what one \
         process hop costs here; its CPU and RSS are its children's and not shown) are real \
         processes on loopback; the load generator is reqwest (HTTP/1.1, keep-alive) in this \
         process. {rounds} interleaved rounds (round 1 measures every path, then round 2, ...); every \
         figure is the median over the rounds. Per round and path: a warm-up of {} requests on 16 \
         connections; {REQUESTS_1} sequential GETs on 1 connection (p50, p99); {} GETs on \
         {CONCURRENCY} connections (req/s, p99, and over this phase: the CPU time of each process of \
         the path, utime+stime from /proc/<pid>/stat; the time its threads were runnable but waited \
         for a CPU, from each thread's schedstat; the share of the machine's CPU time left idle, from \
         /proc/stat); {big_gets} (MB/s, 10^6 bytes). Peak RSS is \
         VmHWM at the end of the run (the process's lifetime peak, which includes the {} MiB bodies; \
         kas A and agentk serve both kas paths). Ratios are against rathole.\n",
        BIG_SIZE >> 20,
        CONCURRENCY * 20,
        requests_16(),
        BIG_SIZE >> 20,
    );
    let _ = writeln!(
        report,
        "| path | req/s at 16 conn | × rathole | p50 at 1 conn (ms) | × rathole | p99 at 1 conn (ms) | \
         p99 at 16 conn (ms) | 200 MiB MB/s | × rathole | CPU s per 10,000 req | run-queue wait s per 10,000 \
         req | idle CPU at 16 conn | peak RSS (MiB) | non-2xx |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (t, s) in targets.iter().zip(&summaries) {
        let s = match (&t.base, s) {
            (Err(e), _) => {
                let _ = writeln!(report, "| {} | {e} | | | | | | | | | | | | |", t.name);
                continue;
            }
            (Ok(_), None) => {
                let _ = writeln!(report, "| {} | no rounds ran | | | | | | | | | | | | |", t.name);
                continue;
            }
            (Ok(_), Some(s)) => s,
        };
        let per_process = |figures: &[f64]| {
            if t.procs.is_empty() {
                "—".to_owned()
            } else {
                t.procs
                    .iter()
                    .zip(figures)
                    .map(|((role, _), c)| format!("{role} {c:.2}"))
                    .collect::<Vec<_>>()
                    .join(" + ")
            }
        };
        let cpu = per_process(&s.cpu_per_10k);
        let wait = per_process(&s.wait_per_10k);
        let rss = if t.procs.is_empty() {
            "—".to_owned()
        } else {
            t.procs.iter().map(|(role, p)| format!("{role} {:.1}", p.peak_rss_mib())).collect::<Vec<_>>().join(", ")
        };
        let _ = writeln!(
            report,
            "| {} | {:.0} | {} | {} | {} | {} | {} | {:.0} | {} | {cpu} | {wait} | {:.0} % | {rss} | {} |",
            t.name,
            s.rps16,
            ratio(s.rps16, rathole.map(|r| r.rps16)),
            ms(s.p50_1),
            ratio(s.p50_1.as_secs_f64(), rathole.map(|r| r.p50_1.as_secs_f64())),
            ms(s.p99_1),
            ms(s.p99_16),
            s.mbps,
            ratio(s.mbps, rathole.map(|r| r.mbps)),
            s.idle16 * 100.0,
            t.bad
        );
    }
    let _ = writeln!(report);
    for t in targets.iter().filter(|t| t.bad > 0) {
        let _ = writeln!(report, "Non-2xx or failed requests through {} ({} in all), first ones:\n", t.name, t.bad);
        for s in &t.bad_samples {
            let _ = writeln!(report, "- `{}`", s.replace('`', "'").replace('\n', " "));
        }
        let _ = writeln!(report);
    }
    write_big_body_cpu(targets, &summaries, report);
    write_goals(targets, &summaries, report);
}

/// What the 200 MiB GETs cost the machine per byte, process by process: a path's MB/s is bounded
/// by the CPUs its whole chain (load generator and upstream included) needs per MB.
fn write_big_body_cpu(targets: &[Target], summaries: &[Option<Round>], report: &mut String) {
    let _ = writeln!(
        report,
        "CPU per MB over each round's {} MiB GETs (utime+stime of each process over all of the round's \
         GETs, per 10^6 bytes; median over the rounds), with the processes every path shares: the load \
         generator (this program) and the upstream. \"CPUs busy\" is their sum times the MB/s: how much \
         of the machine the chain used while it ran (a socat relay's own CPU is its children's and not \
         counted).\n",
        BIG_SIZE >> 20
    );
    let _ = writeln!(
        report,
        "| path | 200 MiB MB/s | CPU ms per MB | load generator + upstream ms per MB | CPUs busy | idle CPU during the GETs |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    for (t, s) in targets.iter().zip(summaries) {
        let (Ok(_), Some(s)) = (&t.base, s) else { continue };
        let (own, shared) = s.big_ms_per_mb.split_at(s.big_ms_per_mb.len().saturating_sub(Shared::ROLES.len()));
        let own_text = if t.procs.is_empty() {
            "—".to_owned()
        } else {
            t.procs.iter().zip(own).map(|((role, _), c)| format!("{role} {c:.2}")).collect::<Vec<_>>().join(" + ")
        };
        let shared_text =
            Shared::ROLES.iter().zip(shared).map(|(role, c)| format!("{role} {c:.2}")).collect::<Vec<_>>().join(" + ");
        let busy = s.big_ms_per_mb.iter().sum::<f64>() * s.mbps / 1e3;
        let _ = writeln!(
            report,
            "| {} | {:.0} | {own_text} | {shared_text} | {busy:.2} | {:.0} % |",
            t.name,
            s.mbps,
            s.idle_big * 100.0
        );
    }
    let _ = writeln!(report);
}

fn write_goals(targets: &[Target], summaries: &[Option<Round>], report: &mut String) {
    let find = |name: &str| targets.iter().position(|t| t.name == name).and_then(|i| summaries[i].as_ref());
    let (Some(rathole), Some(one), Some(two)) = (find("rathole"), find("kas + agentk"), find("kas → kas + agentk"))
    else {
        let _ = writeln!(report, "Goals of issue 14: not evaluated (rathole or a kas path has no figures).\n");
        return;
    };
    let mark = |ok: bool| if ok { "met" } else { "**not met**" };
    let kas_rss = targets
        .iter()
        .filter(|t| t.name.starts_with("kas"))
        .flat_map(|t| t.procs.iter().map(|(_, p)| p.peak_rss_mib()))
        .fold(0.0_f64, f64::max);
    let kas_bad: usize = targets.iter().filter(|t| t.name.starts_with("kas")).map(|t| t.bad).sum();
    let _ = writeln!(report, "Goals of issue 14 (from the medians above):\n");
    let rows = [
        (
            "small GETs at 16 connections through kas+agentk ≥ 0.6× rathole's req/s",
            format!("{:.2}×", one.rps16 / rathole.rps16),
            one.rps16 >= 0.6 * rathole.rps16,
        ),
        (
            "p50 at 1 connection through kas+agentk ≤ 2× rathole's",
            format!("{:.2}×", one.p50_1.as_secs_f64() / rathole.p50_1.as_secs_f64()),
            one.p50_1.as_secs_f64() <= 2.0 * rathole.p50_1.as_secs_f64(),
        ),
        ("kas→kas ≥ 0.8× the req/s of one kas", format!("{:.2}×", two.rps16 / one.rps16), two.rps16 >= 0.8 * one.rps16),
        (
            "kas→kas ≤ 1.25× the p50 (1 connection) of one kas",
            format!("{:.2}×", two.p50_1.as_secs_f64() / one.p50_1.as_secs_f64()),
            two.p50_1.as_secs_f64() <= 1.25 * one.p50_1.as_secs_f64(),
        ),
        (
            "200 MiB through kas+agentk ≥ 1.5× rathole's MB/s",
            format!("{:.2}×", one.mbps / rathole.mbps),
            one.mbps >= 1.5 * rathole.mbps,
        ),
        ("kas and agentk peak RSS under 64 MiB", format!("max {kas_rss:.1} MiB"), kas_rss < 64.0),
        ("zero non-2xx through kas", format!("{kas_bad}"), kas_bad == 0),
    ];
    let _ = writeln!(report, "| goal | measured | |\n| --- | --- | --- |");
    for (goal, measured, ok) in rows {
        let _ = writeln!(report, "| {goal} | {measured} | {} |", mark(ok));
    }
    let _ = writeln!(report);
    write_big_body_need(one, rathole, report);
    write_hop_costs(&find, one, two, report);
}

/// The CPUs the kas + agentk chain would keep busy at the 200 MiB goal's rate, at this run's CPU
/// per MB: above the machine's CPUs, the goal needs less CPU per byte, not better scheduling.
fn write_big_body_need(one: &Round, rathole: &Round, report: &mut String) {
    let goal_mbps = 1.5 * rathole.mbps;
    let ms_per_mb: f64 = one.big_ms_per_mb.iter().sum();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    let _ = writeln!(
        report,
        "At the 200 MiB goal's rate ({goal_mbps:.0} MB/s, 1.5× rathole's), the kas + agentk chain at this \
         run's CPU per MB ({ms_per_mb:.2} ms, load generator and upstream included) would keep {:.2} CPUs \
         busy; this machine has {cpus}.\n",
        ms_per_mb * goal_mbps / 1e3
    );
}

/// What one more process adds to the p50 at one connection: the scale against which the
/// kas → kas p50 goal (kas A's hop within a quarter of the one-kas p50) can be judged.
fn write_hop_costs<'a>(find: &impl Fn(&str) -> Option<&'a Round>, one: &Round, two: &Round, report: &mut String) {
    let (Some(socat_one), Some(socat_two)) = (find(SOCAT), find(SOCAT_TWO)) else {
        let _ = writeln!(report, "Hop costs: not evaluated (a socat path has no figures).\n");
        return;
    };
    let us = |a: Duration, b: Duration| (a.as_secs_f64() - b.as_secs_f64()) * 1e6;
    let _ = writeln!(
        report,
        "What one more process adds to the p50 at 1 connection: a socat relay {:.0} µs ({SOCAT_TWO} \
         over {SOCAT}), kas A {:.0} µs (kas → kas over one kas); the kas → kas p50 goal allows kas A \
         {:.0} µs (a quarter of the one-kas p50).\n",
        us(socat_two.p50_1, socat_one.p50_1),
        us(two.p50_1, one.p50_1),
        one.p50_1.as_secs_f64() * 0.25 * 1e6,
    );
}

/// `kubectl get pods -A` with [`KUBECTL_PODS`] pods: against the fake API server directly and
/// through kas (+agentk), both as processes; the fake runs in this process.
async fn kubectl_get_pods() -> Result<String, Unavailable> {
    let kubectl = find_program("kubectl").ok_or(Unavailable::NotInstalled("kubectl"))?;
    let dir = tempfile::tempdir().map_err(failed)?;
    let dev = kas::standalone::ensure_dev_setup(&dir.path().join("dev")).map_err(failed)?;
    let fake = FakeKube::start().await;
    for i in 0..KUBECTL_PODS {
        fake.add_pod(&format!("ns-{}", i % 20), &format!("pod-{i}"));
    }
    let fake_kubeconfig = dir.path().join("fake-kubeconfig");
    std::fs::write(&fake_kubeconfig, fake.kubeconfig()).map_err(failed)?;
    // kubectl sends its token only over TLS, and the fake serves plain HTTP: the direct runs go
    // through a TLS terminator in this process (so both paths pay a TLS handshake).
    let front_cert = Certificate::self_signed(LOCALHOST_AND_IP);
    let front_files = front_cert.write(dir.path(), "front");
    let front = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(failed)?;
    let front_port = front.local_addr().map_err(failed)?.port();
    let acceptor = front_cert.acceptor(&[]);
    let fake_addr = fake.url().trim_start_matches("http://").to_owned();
    let terminator = tokio::spawn(async move {
        while let Ok((tcp, _)) = front.accept().await {
            let (acceptor, fake_addr) = (acceptor.clone(), fake_addr.clone());
            tokio::spawn(async move {
                let (Ok(mut tls), Ok(mut up)) =
                    (acceptor.accept(tcp).await, tokio::net::TcpStream::connect(&fake_addr).await)
                else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    let direct_kubeconfig = dir.path().join("direct-kubeconfig");
    std::fs::write(
        &direct_kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: https://localhost:{front_port}\n    certificate-authority: {}\nusers:\n- name: sa\n  user:\n    token: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: sa\ncurrent-context: fake\n",
            front_files.certificate_file.display(),
            fake.token()
        ),
    )
    .map_err(failed)?;
    // kubectl sends its bearer token only over TLS: the rest listener serves TLS here.
    let mut config = dev.config.clone().with_ephemeral_ports();
    let rest_cert = Certificate::self_signed(LOCALHOST_AND_IP).write(dir.path(), "rest");
    config.listeners.rest.tls = Some(rest_cert.tls_config());
    let (kas, rest, agent) = start_kas(&config, dir.path(), "kas-kubectl")?;
    let agentk = start_agentk(&agent, &dev.agent_token_file, &fake_kubeconfig)?;
    let secret = kas::auth::Secret::from_file(&dev.gitlab_secret_file).map_err(failed)?;
    let jwt = kas::auth::mint_jwt(&secret, "gitlab", "gitlab-kas", Duration::from_secs(3600)).map_err(failed)?;
    let port = rest.rsplit_once(':').map(|(_, p)| p).ok_or_else(|| failed("rest port"))?;
    let through_kas = dir.path().join("kas-kubeconfig");
    std::fs::write(
        &through_kas,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kas\n  cluster:\n    server: https://localhost:{port}/api/v1/agents/1/kubernetes\n    certificate-authority: {}\nusers:\n- name: gitlab\n  user:\n    token: {jwt}\ncontexts:\n- name: kas\n  context:\n    cluster: kas\n    user: gitlab\ncurrent-context: kas\n",
            rest_cert.certificate_file.display()
        ),
    )
    .map_err(failed)?;

    let run = |kubeconfig: &Path, cache: &str| -> Result<(Duration, usize), Unavailable> {
        let t0 = Instant::now();
        let out = Command::new(&kubectl)
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", dir.path())
            .arg(format!("--cache-dir={}", dir.path().join(cache).display()))
            .args(["get", "pods", "-A", "--request-timeout=60s"])
            .stdin(Stdio::null())
            .output()
            .map_err(failed)?;
        let took = t0.elapsed();
        if !out.status.success() {
            return Err(failed(format!("kubectl: {}", String::from_utf8_lossy(&out.stderr).trim())));
        }
        // Header line + one line per pod.
        Ok((took, String::from_utf8_lossy(&out.stdout).lines().count().saturating_sub(1)))
    };
    // Until agentk is connected, kas answers 5xx: retry the untimed first run (which also fills
    // kubectl's discovery cache, as for the direct runs).
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        match run(&through_kas, "cache-kas") {
            Ok(_) => break,
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    run(&direct_kubeconfig, "cache-direct")?;
    let (mut direct, mut via) = (Vec::new(), Vec::new());
    let mut lines = (0, 0);
    for _ in 0..KUBECTL_RUNS {
        let (d, n) = run(&direct_kubeconfig, "cache-direct")?;
        direct.push(d);
        lines.0 = n;
        let (d, n) = run(&through_kas, "cache-kas")?;
        via.push(d);
        lines.1 = n;
    }
    let (direct, via) = (median_d(direct), median_d(via));
    let mut text = String::new();
    let _ = writeln!(
        text,
        "### `kubectl get pods -A` with {KUBECTL_PODS} pods\n\n\
         The fake API server (in this program's process, discovery and Table responses) with {KUBECTL_PODS} pods \
         in 20 namespaces, reached directly through a TLS terminator in this process (kubectl sends \
         its token only over TLS); kas (its rest listener on TLS, as kubectl sends tokens only over TLS) and \
         agentk as processes. Wall time of the kubectl process, median of {KUBECTL_RUNS} runs each \
         (interleaved, after one untimed run each that fills kubectl's discovery cache).\n"
    );
    let _ = writeln!(text, "| path | time (ms) | pods listed | ratio |\n| --- | --- | --- | --- |");
    let _ = writeln!(text, "| direct | {} | {} | 1.00 |", ms(direct), lines.0);
    let _ = writeln!(
        text,
        "| through kas + agentk | {} | {} | {:.2} |\n",
        ms(via),
        lines.1,
        via.as_secs_f64() / direct.as_secs_f64()
    );
    terminator.abort();
    drop((agentk, kas));
    Ok(text)
}
