//! Cluster state (issue 17): how fast a pod change reaches a subscriber on another kas, what a
//! cached read costs against the same list through the Kubernetes API proxy, the bytes agentk
//! sends per change against a raw watch, and agentk's memory with 10,000 pods cached.
//!
//! One cluster (two kas in-process on one Redis, the fake API server) serves every figure:
//! agent 1 (in-process agentk on kas A) for the latency and the reads, agent 4 (in-process,
//! through a counting relay) for the bytes, agents 2 and 3 (agentk processes) for the memory.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kas::agent::AgentConfigDocument;
use kas::auth::jwt::{GITLAB_ISSUER, KAS_AUDIENCE};
use kas_e2e::Cluster;
use kas_e2e::process::Process;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::{ms, percentile};

const PODS_ONLY: &str = "cluster_state:\n  resources:\n    - {version: v1, resource: pods}\n";
/// Pods in the cluster while the latency and the bytes are measured.
const BASE_PODS: usize = 100;
/// Namespaces the pods are spread over.
const NAMESPACES: usize = 20;
/// Untimed trials before the latency is measured (connections, the peer channel).
const WARM_UP: usize = 5;
/// Pod changes whose bytes are counted.
const CHANGES: usize = 200;
/// At least this long without changes, to count agentk's idle traffic.
const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// Sizes of the read comparison.
const READ_SIZES: [usize; 2] = [1_000, 10_000];
/// Requests per path and size (interleaved).
const READS: usize = 20;
/// Pods cached by the agentk process whose memory is measured.
const MEMORY_PODS: usize = 10_000;
/// How long one expected event, state or process may take before the figure is given up.
const WITHIN: Duration = Duration::from_secs(60);

/// Why a figure could not be measured.
#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error("{0}")]
    Failed(String),
    #[error("timed out waiting for {0}")]
    TimedOut(String),
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

fn failed(what: impl std::fmt::Display) -> BenchError {
    BenchError::Failed(what.to_string())
}

/// Polls `check` every 10 ms until it gives a value, for at most [`WITHIN`].
async fn poll<T, F: Future<Output = Option<T>>>(what: &str, mut check: impl FnMut() -> F) -> Result<T, BenchError> {
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(BenchError::TimedOut(what.to_owned()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn pod_name(i: usize) -> (String, String) {
    (format!("ns-{}", i % NAMESPACES), format!("pod-{i}"))
}

/// The fake API server holds pods `0..n` (adds the missing ones, running and ready; only this
/// program adds pods, in order).
async fn grow_pods(c: &Cluster, n: usize) {
    for i in c.kube.pod_names().len()..n {
        let (ns, name) = pod_name(i);
        c.kube.put_pod(&ns, &name, "Running", true, &[("app", "web")]);
        // The fake's writes are synchronous: let its watchers (agentk's informer) read meanwhile.
        if i.is_multiple_of(100) {
            tokio::task::yield_now().await;
        }
    }
}

/// The REST gateway of one kas, with a JWT valid for an hour (kas's longest; the section takes
/// minutes).
struct Rest {
    http: reqwest::Client,
    base: String,
    jwt: String,
}

impl Rest {
    fn new(c: &Cluster, kas: usize) -> Result<Self, BenchError> {
        let jwt = kas::auth::mint_jwt(&c.gitlab_secret, GITLAB_ISSUER, KAS_AUDIENCE, Duration::from_secs(3600))
            .map_err(failed)?;
        Ok(Self { http: reqwest::Client::new(), base: c.rest_url(kas), jwt })
    }

    /// GET `path`: (status, body bytes).
    async fn get(&self, path: &str, accept: Option<&str>) -> Result<(u16, bytes::Bytes), BenchError> {
        let mut request = self.http.get(format!("{}{path}", self.base)).bearer_auth(&self.jwt);
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        Ok((status, response.bytes().await?))
    }

    /// The pods summary of `agent`'s cluster state: Ok((count, synced and live)), Err((refused,
    /// what kas said)); refused is an answer waiting will not change (401, 403).
    async fn pods_summary(&self, agent: i64) -> Result<(u64, bool), (bool, String)> {
        let (status, body) = self
            .get(&format!("/api/v1/agents/{agent}/cluster_state"), None)
            .await
            .map_err(|e| (false, e.to_string()))?;
        let refused = status == 401 || status == 403;
        let text = || (refused, format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(500)])));
        if status != 200 {
            return Err(text());
        }
        let v: Value = serde_json::from_slice(&body).map_err(|_| text())?;
        let pods = v["resources"].as_array().and_then(|r| r.iter().find(|r| r["name"] == "pods")).ok_or_else(text)?;
        let count = pods["count"].as_u64().ok_or_else(text)?;
        Ok((count, pods["synced"] == true && v["live"] == true))
    }

    /// Waits until kas holds `count` pods of `agent`, listed and live.
    async fn wait_for_pods(&self, agent: i64, count: usize) -> Result<(), BenchError> {
        let want = count as u64;
        let deadline = Instant::now() + WITHIN;
        loop {
            let last = match self.pods_summary(agent).await {
                Ok((n, true)) if n == want => return Ok(()),
                Ok((n, synced)) => format!("{n} pods, listed and live: {synced}"),
                Err((true, said)) => return Err(failed(format!("agent {agent}'s cluster state: {said}"))),
                Err((false, said)) => said,
            };
            if Instant::now() > deadline {
                return Err(failed(format!(
                    "timed out waiting for agent {agent}'s cluster state to hold {count} pods (the last summary: {last})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn subscribe(&self, agent: i64) -> Result<Subscriber, BenchError> {
        let response =
            self.http.get(format!("{}/api/v1/agents/{agent}/events", self.base)).bearer_auth(&self.jwt).send().await?;
        if response.status() != 200 {
            return Err(failed(format!("SSE subscription: {}", response.status())));
        }
        Ok(Subscriber { body: response.bytes_stream().boxed(), buffer: Vec::new() })
    }
}

/// A Server-Sent Events stream read event by event.
struct Subscriber {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: Vec<u8>,
}

impl Subscriber {
    /// The next event: (event name, data).
    async fn next(&mut self) -> Result<(String, Value), BenchError> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&raw);
                let (mut event, mut data) = (String::new(), Value::Null);
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        v.clone_into(&mut event);
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = serde_json::from_str(v).map_err(failed)?;
                    }
                }
                if event.is_empty() {
                    continue; // a keep-alive comment
                }
                return Ok((event, data));
            }
            match tokio::time::timeout(WITHIN, self.body.next()).await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk?),
                Ok(None) => return Err(failed("the event stream ended")),
                Err(_) => return Err(BenchError::TimedOut("an event".into())),
            }
        }
    }

    /// Reads events until the `upsert` of `name` labelled `trial=<trial>`.
    async fn until_upsert(&mut self, name: &str, trial: usize) -> Result<(), BenchError> {
        let trial = trial.to_string();
        loop {
            let (event, data) = self.next().await?;
            if event == "upsert" && data["object"]["name"] == name && data["object"]["labels"]["trial"] == *trial {
                return Ok(());
            }
        }
    }
}

/// One trial's change: pod `trial % pods` gets a new phase and the label `trial=<trial>`.
fn change_pod(c: &Cluster, pods: usize, trial: usize) -> String {
    let (ns, name) = pod_name(trial % pods);
    let running = !trial.is_multiple_of(2);
    let phase = if running { "Running" } else { "Pending" };
    c.kube.put_pod(&ns, &name, phase, running, &[("app", "web"), ("trial", &trial.to_string())]);
    name
}

pub async fn run(trials: usize, report: &mut String) {
    let _ = writeln!(report, "## Cluster state (issue 17)\n");
    let config = || AgentConfigDocument::parse(PODS_ONLY).map_err(failed);
    let (one, two, four) = match (config(), config(), config()) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            let _ = writeln!(report, "Not measured: the agent configuration: {e}\n");
            return;
        }
    };
    // Agents 1, 2 and 4 observe pods; agent 3 has no configuration (the memory baseline).
    let c = Cluster::builder()
        .kas(2)
        .redis()
        .agents(&[(1, 10), (2, 10), (3, 10), (4, 10)])
        .agent_configuration(1, one)
        .agent_configuration(2, two)
        .agent_configuration(4, four)
        .start()
        .await;
    c.kube.add_namespace("agentk");
    grow_pods(&c, BASE_PODS).await;
    let agentk = c.start_agentk_with(c.agentk_config(1, 0, "agentk-1")).await;

    // The latency with few pods, and again once the reads grew the cluster to the most pods.
    let mut latency_rows = vec![Box::pin(latency(&c, trials, BASE_PODS, 0)).await];
    let bytes = Box::pin(bytes_per_change(&c)).await;
    let reads = Box::pin(reads(&c)).await;
    if reads.is_ok() {
        latency_rows.push(Box::pin(latency(&c, trials, READ_SIZES[READ_SIZES.len() - 1], 2_000_000)).await);
    }
    // Its informer would only add CPU noise to the memory figure.
    agentk.stop().await;
    let memory = Box::pin(memory(&c)).await;

    let _ = writeln!(
        report,
        "### Change to an SSE subscriber on another kas\n\n{trials} sequential trials per row (after {WARM_UP} \
         untimed). Two kas on one Redis; agentk (in this process) connected to kas A observes pods; a subscriber \
         (reqwest, `GET /api/v1/agents/1/events`) on kas B. Each trial changes one pod on the fake API server (its \
         phase, readiness and a `trial` label) and waits for the subscriber's `upsert` of that pod carrying the new \
         label: agentk's watch, the push to kas A, kas B's relay of kas A's watch, the SSE encoding.\n"
    );
    let _ = writeln!(
        report,
        "| pods in the cluster | p50 (ms) | p99 (ms) | max (ms) | goal p50 < 50 ms |\n| --- | --- | --- | --- | --- |"
    );
    for row in latency_rows {
        match row {
            Ok(row) => report.push_str(&row),
            Err(e) => {
                let _ = writeln!(report, "| not measured: {e} | | | | |");
            }
        }
    }
    let _ = writeln!(report);
    for (title, figure) in [
        ("Bytes between agentk and kas per change, against a raw watch".to_owned(), bytes),
        ("Cached read against the Kubernetes API proxy".to_owned(), reads),
        (format!("agentk memory with {MEMORY_PODS} pods cached"), memory),
    ] {
        match figure {
            Ok(text) => report.push_str(&text),
            Err(e) => {
                let _ = writeln!(report, "### {title}\n\nNot measured: {e}\n");
            }
        }
    }
}

/// Figure 1: a pod change on the API server until its `upsert` reaches a subscriber on kas B,
/// agentk being connected to kas A, with `pods` in the cluster; a table row. The trials' labels
/// start at `first` (each run its own, so no earlier event matches).
async fn latency(c: &Cluster, trials: usize, pods: usize, first: usize) -> Result<String, BenchError> {
    let rest_b = Rest::new(c, 1)?;
    rest_b.wait_for_pods(1, pods).await?;
    let mut sse = rest_b.subscribe(1).await?;
    let (event, _) = sse.next().await?;
    if event != "snapshot" {
        return Err(failed(format!("the first event was {event}, not snapshot")));
    }
    let mut times = Vec::with_capacity(trials);
    for i in 0..WARM_UP + trials {
        let trial = first + i;
        let started = Instant::now();
        let name = change_pod(c, pods, trial);
        sse.until_upsert(&name, trial).await?;
        if i >= WARM_UP {
            times.push(started.elapsed());
        }
    }
    times.sort();
    let p50 = percentile(&times, 0.5);
    Ok(format!(
        "| {pods} | {} | {} | {} | {} |\n",
        ms(p50),
        ms(percentile(&times, 0.99)),
        ms(times.last().copied().unwrap_or_default()),
        if p50 < Duration::from_millis(50) { "met" } else { "**not met**" }
    ))
}

/// A TCP relay counting the bytes it forwards each way.
struct CountingRelay {
    address: SocketAddr,
    /// Client to target (agentk to kas).
    up: Arc<AtomicU64>,
    /// Target to client.
    down: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for CountingRelay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl CountingRelay {
    async fn start(target: SocketAddr) -> Result<Self, BenchError> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (u, d) = (up.clone(), down.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pump(client_read, server_write, u.clone()));
                tokio::spawn(pump(server_read, client_write, d.clone()));
            }
        });
        Ok(Self { address, up, down, accept })
    }

    fn counts(&self) -> (u64, u64) {
        (self.up.load(Ordering::Relaxed), self.down.load(Ordering::Relaxed))
    }
}

/// Copies until either side ends, counting what was forwarded.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    count: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}

/// Body bytes and lines of a raw `watch=true` of pods against the fake API server so far.
#[derive(Clone, Copy, Default)]
struct WatchCount {
    bytes: u64,
    lines: u64,
}

/// A raw watch of every pod from the fake's current resourceVersion (no bookmarks), counted.
async fn raw_watch(c: &Cluster) -> Result<(watch::Receiver<WatchCount>, tokio::task::JoinHandle<()>), BenchError> {
    let url = format!("{}/api/v1/pods?watch=true&resourceVersion={}", c.kube.url(), c.kube.resource_version());
    let response = reqwest::Client::new().get(url).bearer_auth(c.kube.token()).send().await?;
    if response.status() != 200 {
        return Err(failed(format!("raw watch: {}", response.status())));
    }
    let (tx, rx) = watch::channel(WatchCount::default());
    let task = tokio::spawn(async move {
        let mut body = response.bytes_stream();
        while let Some(Ok(chunk)) = body.next().await {
            let lines = chunk.iter().filter(|b| **b == b'\n').count() as u64;
            tx.send_modify(|c| {
                c.bytes += chunk.len() as u64;
                c.lines += lines;
            });
        }
    });
    Ok((rx, task))
}

/// Figure 3: what agentk sends kas per pod change (counted on the TCP connection), against the
/// same changes on a raw watch of the API server.
async fn bytes_per_change(c: &Cluster) -> Result<String, BenchError> {
    let relay = CountingRelay::start(c.kas[0].addresses.agent).await?;
    let mut config = c.agentk_config(4, 0, "agentk-4");
    config.kas_address = format!("grpc://{}", relay.address);
    let agentk = c.start_agentk_with(config).await;
    let rest_a = Rest::new(c, 0)?;
    rest_a.wait_for_pods(4, BASE_PODS).await?;
    // A subscriber on the same kas paces the changes: one at a time, so none coalesce.
    let mut sse = rest_a.subscribe(4).await?;
    sse.next().await?;
    let (mut watched, watch_task) = raw_watch(c).await?;

    let (up0, down0) = relay.counts();
    let started = Instant::now();
    for i in 0..CHANGES {
        let trial = 1_000_000 + i;
        let name = change_pod(c, BASE_PODS, trial);
        sse.until_upsert(&name, trial).await?;
    }
    let window = started.elapsed();
    let (up1, down1) = relay.counts();
    let want = CHANGES as u64;
    let raw = tokio::time::timeout(WITHIN, watched.wait_for(|c| c.lines >= want))
        .await
        .map_err(|_| BenchError::TimedOut("the raw watch's events".into()))?
        .map_err(|_| failed("the raw watch ended"))?
        .to_owned();
    watch_task.abort();
    // What the connection carries without changes (tunnels, presence, HTTP/2 pings): counted
    // over a longer window, then scaled to the changes' window.
    let idle_window = IDLE_WINDOW.max(window);
    let (idle_up0, idle_down0) = relay.counts();
    tokio::time::sleep(idle_window).await;
    let (idle_up1, idle_down1) = relay.counts();
    agentk.stop().await;

    let scale = window.as_secs_f64() / idle_window.as_secs_f64();
    let (idle_up, idle_down) = (idle_up1 - idle_up0, idle_down1 - idle_down0);
    let per_change = |bytes: u64, idle: u64| (bytes as f64 - idle as f64 * scale).max(0.0) / CHANGES as f64;
    let (up, down) = (up1 - up0, down1 - down0);
    let (push_up, push_down) = (per_change(up, idle_up), per_change(down, idle_down));
    let raw_per = raw.bytes as f64 / raw.lines.max(1) as f64;
    let ratio = |x: f64| x / raw_per.max(1.0);
    let mut text = String::new();
    let _ = writeln!(
        text,
        "### Bytes between agentk and kas per change, against a raw watch\n\n{CHANGES} pod changes (phase, \
         readiness, a label), one at a time: each waits for its `upsert` at a subscriber on kas A, so none \
         coalesce; they took {} ms. A second agentk (in this process, agent 4, observing the same {BASE_PODS} pods) \
         reaches kas A's agent listener through a TCP relay counting the bytes each way: HTTP/2 and gRPC framing \
         included, no TLS, everything agentk's connection carried, less its idle traffic (counted over {} ms \
         without changes, {idle_up} bytes up and {idle_down} down, scaled to the changes' window). The raw watch \
         is `GET /api/v1/pods?watch=true` on the fake API server from its resourceVersion before the changes (no \
         bookmarks): the JSON lines of its {} events (HTTP/1.1 chunk framing not counted).\n",
        window.as_millis(),
        idle_window.as_millis(),
        raw.lines
    );
    let _ = writeln!(
        text,
        "| stream | bytes over the changes | bytes per change | ratio to the raw watch |\n| --- | --- | --- | --- |"
    );
    let _ =
        writeln!(text, "| raw watch of pods (API server → client, JSON lines) | {} | {raw_per:.0} | 1.00 |", raw.bytes);
    let _ = writeln!(text, "| agentk → kas (view pushes) | {up} | {push_up:.1} | {:.3} |", ratio(push_up));
    let _ =
        writeln!(text, "| kas → agentk (HTTP/2 window updates and acknowledgements) | {down} | {push_down:.1} | — |\n");
    Ok(text)
}

/// Figure 2: `GET cluster_state/pods` on kas B against the same list through the Kubernetes API
/// proxy on kas B (to kas A, agentk, the API server), as JSON and as kubectl's Table.
async fn reads(c: &Cluster) -> Result<String, BenchError> {
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let rest_b = Rest::new(c, 1)?;
    let paths: [(&str, &str, Option<&str>); 3] = [
        ("kas B cached read: `GET /api/v1/agents/1/cluster_state/pods`", "/api/v1/agents/1/cluster_state/pods", None),
        (
            "Kubernetes API proxy via kas B → kas A → agentk: `GET …/kubernetes/api/v1/pods` (JSON list)",
            "/api/v1/agents/1/kubernetes/api/v1/pods",
            None,
        ),
        ("the same as kubectl's Table (`kubectl get pods -A`)", "/api/v1/agents/1/kubernetes/api/v1/pods", Some(TABLE)),
    ];
    let mut text = String::new();
    let _ = writeln!(
        text,
        "### Cached read against the Kubernetes API proxy\n\nThe same pods (in {NAMESPACES} namespaces) read on \
         kas B for agent 1, whose agentk is connected to kas A: kas B's cluster state read (asks kas A, the \
         holder, over the internal listener; no request into the cluster), and the list through the Kubernetes \
         API proxy (kas B → kas A → agentk's tunnel → the fake API server in this process), as a JSON list and \
         as the Table `kubectl get pods -A` asks for. Median of {READS} requests per path (interleaved, after one \
         untimed each), the whole body read; response body bytes.\n"
    );
    let _ = writeln!(
        text,
        "| pods | read | median (ms) | body bytes | × cached read time | × cached read bytes |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    for size in READ_SIZES {
        grow_pods(c, size).await;
        rest_b.wait_for_pods(1, size).await?;
        let mut sizes = [0usize; 3];
        for (i, (_, path, accept)) in paths.iter().enumerate() {
            let (status, body) = rest_b.get(path, *accept).await?;
            if status != 200 {
                return Err(failed(format!(
                    "{path}: {status}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                )));
            }
            sizes[i] = body.len();
            check_count(i, &body, size)?;
        }
        let mut times: [Vec<Duration>; 3] = Default::default();
        for _ in 0..READS {
            for (i, (_, path, accept)) in paths.iter().enumerate() {
                let started = Instant::now();
                let (status, body) = rest_b.get(path, *accept).await?;
                times[i].push(started.elapsed());
                if status != 200 || body.len().abs_diff(sizes[i]) > sizes[i] / 10 {
                    return Err(failed(format!("{path}: {status}, {} bytes", body.len())));
                }
            }
        }
        let medians: Vec<Duration> = times
            .iter_mut()
            .map(|t| {
                t.sort();
                percentile(t, 0.5)
            })
            .collect();
        for (i, (name, _, _)) in paths.iter().enumerate() {
            let _ = writeln!(
                text,
                "| {size} | {name} | {} | {} | {:.2} | {:.2} |",
                ms(medians[i]),
                sizes[i],
                medians[i].as_secs_f64() / medians[0].as_secs_f64(),
                sizes[i] as f64 / sizes[0] as f64
            );
        }
    }
    let _ = writeln!(text);
    Ok(text)
}

/// The first answer of each path holds every pod (so the figures compare the same content).
fn check_count(path: usize, body: &[u8], size: usize) -> Result<(), BenchError> {
    let v: Value = serde_json::from_slice(body).map_err(failed)?;
    let items = match path {
        0 => &v["objects"],
        1 => &v["items"],
        _ => &v["rows"],
    };
    let n = items.as_array().map_or(0, Vec::len);
    if n == size { Ok(()) } else { Err(failed(format!("read {path} listed {n} pods, not {size}"))) }
}

/// An agentk process for `agent` connected to kas A.
fn start_agentk_process(c: &Cluster, agent: i64) -> Result<Process, BenchError> {
    let binary = crate::proxy::sibling_binary("agentk").map_err(failed)?;
    let mut cmd = tokio::process::Command::new(binary);
    for var in agentk::ENVIRONMENT_VARIABLES {
        cmd.env_remove(var);
    }
    cmd.arg(format!("--kas-address=grpc://{}", c.kas[0].addresses.agent))
        .arg("--token-file")
        .arg(&c.agent(agent).token_file)
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["--log", "warn", "--observability-address", "127.0.0.1:0"])
        .env("POD_NAME", format!("agentk-{agent}"))
        .env("POD_NAMESPACE", "agentk");
    Ok(Process::spawn(&format!("agentk {agent}"), cmd))
}

/// The resident set (VmRSS) and its peak (VmHWM) of a running agentk, MiB.
fn rss_mib(agentk: &Process) -> Result<(f64, f64), BenchError> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", agentk.pid()))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .ok_or_else(|| failed(format!("no {name} in /proc/{}/status", agentk.pid())))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// `e`, with what the agentk process said (why it did not get there, if it exited).
fn with_stderr(e: BenchError, agentk: &Process) -> BenchError {
    let stderr = agentk.stderr();
    let start = (stderr.len().saturating_sub(2000)..).find(|&i| stderr.is_char_boundary(i)).unwrap_or(stderr.len());
    let tail = &stderr[start..];
    failed(format!("{e}; agentk's stderr ends: {tail}"))
}

/// Figure 4: the resident memory of an agentk process caching [`MEMORY_PODS`] pods, against one
/// without cluster state, with the same API server, at the same age.
async fn memory(c: &Cluster) -> Result<String, BenchError> {
    grow_pods(c, MEMORY_PODS).await;
    let rest_a = Rest::new(c, 0)?;

    // With cluster state: until kas A holds every pod.
    let started = Instant::now();
    let observing = start_agentk_process(c, 2)?;
    rest_a.wait_for_pods(2, MEMORY_PODS).await.map_err(|e| with_stderr(e, &observing))?;
    let synced_in = started.elapsed();
    let (observing_rss, observing_peak) = rss_mib(&observing).map_err(|e| with_stderr(e, &observing))?;
    observing.kill().await;

    // Without cluster state: connected (its presence registered on kas A), and as old as the
    // other was when measured (an agentk's memory grows a little as it settles).
    let started = Instant::now();
    let baseline = start_agentk_process(c, 3)?;
    let api = c.api(0);
    poll("agentk 3 to connect", || {
        let mut api = api.clone();
        async move {
            let request = kas_proto::kas::ConnectedAgentsByIdRequest { agent_id: 3 };
            let r = api.connected_agents_by_id(request).await.ok()?;
            (!r.get_ref().agents.is_empty()).then_some(())
        }
    })
    .await
    .map_err(|e| with_stderr(e, &baseline))?;
    let connected_in = started.elapsed();
    // A measurement window, not a wait for a condition: the same age as the other process.
    tokio::time::sleep(synced_in.saturating_sub(connected_in)).await;
    let baseline_age = started.elapsed();
    let (baseline_rss, baseline_peak) = rss_mib(&baseline).map_err(|e| with_stderr(e, &baseline))?;
    baseline.kill().await;

    let mut text = String::new();
    let _ = writeln!(
        text,
        "### agentk memory with {MEMORY_PODS} pods cached\n\nagentk as a process (the release binary) connected to \
         kas A, the fake API server holding {MEMORY_PODS} pods. Observing: agent 2 (pods in its `cluster_state`), \
         measured when kas A's summary says {MEMORY_PODS} pods, listed and live (agentk listed them, holds their \
         views and pushed the listing in parts of 500); that took {} ms from the process's start. Without cluster \
         state: agent 3 (no configuration), measured once connected and as old as the other was ({} ms; it \
         connected in {} ms). RSS is VmRSS then, peak is VmHWM.\n",
        synced_in.as_millis(),
        baseline_age.as_millis(),
        connected_in.as_millis()
    );
    let _ = writeln!(text, "| agentk | RSS (MiB) | peak RSS (MiB) |\n| --- | --- | --- |");
    let _ = writeln!(text, "| without cluster state | {baseline_rss:.1} | {baseline_peak:.1} |");
    let _ = writeln!(text, "| observing {MEMORY_PODS} pods | {observing_rss:.1} | {observing_peak:.1} |");
    let _ = writeln!(
        text,
        "| difference | {:.1} | {:.1} |\n",
        observing_rss - baseline_rss,
        observing_peak - baseline_peak
    );
    Ok(text)
}
