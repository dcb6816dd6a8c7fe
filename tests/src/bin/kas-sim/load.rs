//! Requests through the simulated agents: `GET /api/v1/agents/{id}/kubernetes/...` on kas's REST
//! gateway (the Kubernetes API proxy, authenticated with a GitLab JWT as GitLab's own requests
//! are), at a steady rate over random agents and random live kas, each answered by the agent's
//! tunnel (`agent.rs`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::agent::Fleet;

/// A request that takes longer fails (the router waits for a missing agent up to its
/// `routing.max_wait`, 20 s by default).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The REST side of the kas fleet.
pub struct Gateway {
    /// `http://host:port` of each kas's rest listener (same order as [`Fleet`]).
    pub rest_urls: Vec<String>,
    pub fleet: Arc<Fleet>,
    pub jwt: String,
    /// Several clients: each holds one HTTP/2 connection per kas, whose rest listener allows
    /// 1,024 streams at once (`connections.max_concurrent_streams`); requests waiting for a moved
    /// agent hold theirs.
    clients: std::sync::Mutex<Vec<reqwest::Client>>,
}

/// HTTP/2 connections per kas (see [`Gateway::clients`]).
const CLIENTS: usize = 8;

/// One finished request.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub sent: Instant,
    pub took: Duration,
    /// HTTP status, or 0 when no response came (connection error, timeout).
    pub status: u16,
    /// The kas it was sent to.
    pub kas: usize,
}

impl Gateway {
    pub fn new(rest_urls: Vec<String>, fleet: Arc<Fleet>, jwt: String) -> Result<Self, reqwest::Error> {
        // HTTP/2 (kas's rest listener speaks it in plaintext too): the simulator's requests to
        // one kas share a few connections, so thousands of probes at once cost streams, not
        // thousands of new TCP connections in the simulator and in kas.
        let clients = (0..CLIENTS)
            .map(|_| reqwest::Client::builder().timeout(REQUEST_TIMEOUT).http2_prior_knowledge().build())
            .collect::<Result<_, _>>()?;
        Ok(Self { rest_urls, fleet, jwt, clients: std::sync::Mutex::new(clients) })
    }

    /// Closes the connections to kas (requests after this fail at once).
    pub fn close(&self) {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// One request for `agent` through the kas `kas` (a live one at random when `None`).
    pub async fn request(&self, agent: i64, kas: Option<usize>) -> Sample {
        let sent = Instant::now();
        let Some(kas) = kas.or_else(|| self.fleet.pick()) else {
            return Sample { sent, took: Duration::ZERO, status: 0, kas: usize::MAX };
        };
        let url =
            format!("{}/api/v1/agents/{agent}/kubernetes/api/v1/namespaces/default/pods/sim", self.rest_urls[kas]);
        let client = {
            let clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
            if clients.is_empty() {
                return Sample { sent, took: Duration::ZERO, status: 0, kas };
            }
            clients[rand::random_range(0..clients.len())].clone()
        };
        let status = match client.get(&url).bearer_auth(&self.jwt).send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                // Read the body: the exchange is complete only then (and the connection reusable).
                match r.bytes().await {
                    Ok(_) => status,
                    Err(_) => 0,
                }
            }
            Err(_) => 0,
        };
        Sample { sent, took: sent.elapsed(), status, kas }
    }
}

/// Requests sent at a steady rate until `stop`.
#[derive(Default)]
pub struct Load {
    samples: Mutex<Vec<Sample>>,
}

impl Load {
    /// Sends `rate` requests per second over agents `1..=agents` until `stop`, each on its own
    /// task (a slow answer does not slow the rate).
    pub async fn run(self: Arc<Self>, gateway: Arc<Gateway>, rate: f64, agents: usize, stop: CancellationToken) {
        let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let tasks = tokio_util::task::TaskTracker::new();
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = pace.tick() => {}
            }
            let agent = rand::random_range(1..=agents as i64);
            let (gateway, load) = (gateway.clone(), self.clone());
            tasks.spawn(async move {
                let sample = gateway.request(agent, None).await;
                load.samples.lock().unwrap_or_else(PoisonError::into_inner).push(sample);
            });
        }
        tasks.close();
        tasks.wait().await;
    }

    /// Requests sent to kas number `kas` that got no 200.
    pub fn failed_on(&self, kas: usize) -> usize {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.iter().filter(|s| s.kas == kas && s.status != 200).count()
    }

    /// The requests sent within `[from, to)`.
    pub fn between(&self, from: Instant, to: Instant) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.iter().filter(|s| s.sent >= from && s.sent < to).copied().collect()
    }
}

/// Latency percentiles and outcomes of a set of requests.
pub struct Summary {
    pub sent: usize,
    pub ok: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// Failed requests by status (0: no response).
    pub failed: BTreeMap<u16, usize>,
}

pub fn summarize(samples: &[Sample]) -> Summary {
    let mut ok: Vec<Duration> = samples.iter().filter(|s| s.status == 200).map(|s| s.took).collect();
    ok.sort();
    let mut failed = BTreeMap::new();
    for s in samples.iter().filter(|s| s.status != 200) {
        *failed.entry(s.status).or_insert(0) += 1;
    }
    Summary {
        sent: samples.len(),
        ok: ok.len(),
        p50: crate::percentile(&ok, 0.5),
        p99: crate::percentile(&ok, 0.99),
        max: ok.last().copied().unwrap_or_default(),
        failed,
    }
}

impl Summary {
    /// "none", or "12 × 503, 1 × no response".
    pub fn failures(&self) -> String {
        if self.failed.is_empty() {
            return "none".into();
        }
        self.failed
            .iter()
            .map(|(status, n)| if *status == 0 { format!("{n} × no response") } else { format!("{n} × {status}") })
            .collect::<Vec<_>>()
            .join(", ")
    }
}
