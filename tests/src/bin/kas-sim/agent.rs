//! One simulated agent, held as agentk holds itself: its own HTTP/2 connection (same keepalive
//! and flow-control windows as agentk), the presence stream (GetConfiguration) and
//! `idle_tunnels` Connect streams that sent agentk's Descriptor and serve requests.
//!
//! Requests of the Kubernetes API proxy method are answered as agentk answers them (Header, a
//! Message with the HTTP response head, a Message with the body, Trailer), with a small JSON
//! body, and the tunnel is reused for the next request (the Descriptor says `reusable`, as
//! agentk's does). Unlike agentk, a tunnel serving a request is not replaced by a new idle one
//! meanwhile: at the simulated rates an agent rarely has two requests at once (a second one
//! waits in kas for the tunnel).
//!
//! kas closes idle tunnels after `agent_connections.idle_tunnel_timeout`; agentk opens them
//! again, so the simulation does too (counted in [`Counters::tunnels_reopened`]).
//!
//! Reconnecting is agentk's (`agentk::app`): after a session ends, wait `Backoff` (agentk's base,
//! cap and healthy-after constants, full jitter) or at least kas's retry pushback plus jitter
//! (`Backoff::next_delay_after`); a shed call leaves the HTTP/2 connection up, so the retry goes
//! to the same kas, while a broken connection is replaced by a new one to a kas picked at random
//! among the live ones, as a load balancer in front of kas would.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agentk::backoff::Backoff;
use bytes::Bytes;
use kas_proto::ConnectionId;
use kas_proto::kubernetes_api::{HttpFrame, HttpResponseHead};
use kas_proto::tunnel::pb::agent_tunnel_client::AgentTunnelClient;
use kas_proto::tunnel::pb::{self, AgentMeta, ConfigurationRequest, ConnectRequest, connect_response};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

/// agentk's values (agentk/src/app.rs): what kas sees from a real agent.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before opening a tunnel again after it failed (agentk's pool backs off too).
const TUNNEL_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// The kas processes as agents and callers reach them: a load balancer picking a live one.
pub struct Fleet {
    /// `host:port` of each kas's agent listener.
    pub agent_addresses: Vec<String>,
    pub alive: Vec<AtomicBool>,
}

impl Fleet {
    pub fn new(agent_addresses: Vec<String>) -> Self {
        let alive = agent_addresses.iter().map(|_| AtomicBool::new(true)).collect();
        Self { agent_addresses, alive }
    }

    /// A live kas, at random.
    pub fn pick(&self) -> Option<usize> {
        let live: Vec<usize> = (0..self.alive.len()).filter(|&i| self.alive[i].load(Ordering::Relaxed)).collect();
        (!live.is_empty()).then(|| live[rand::random_range(0..live.len())])
    }
}

/// What all simulated agents did, summed.
#[derive(Default)]
pub struct Counters {
    pub presence_open: AtomicU64,
    pub tunnels_open: AtomicU64,
    pub tunnels_reopened: AtomicU64,
    /// Failed connections, streams and tunnels (sheds and refusals included).
    pub failures: AtomicU64,
    /// No HTTP/2 connection (the first ten are printed).
    pub connect_failures: AtomicU64,
    pub requests_served: AtomicU64,
    /// Frames that were not a request of the Kubernetes API proxy (the tunnel is dropped).
    pub requests_unexpected: AtomicU64,
}

/// How one attempt to open a presence stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Admitted,
    /// UNAVAILABLE with a retry pushback: kas's accept rate.
    Shed,
    /// RESOURCE_EXHAUSTED: a rate limit held against the agent (`limits.agent_connections_per_minute`
    /// or failed authentications).
    ResourceExhausted,
    /// Any other refused call.
    Refused(tonic::Code),
    /// No HTTP/2 connection (connect refused or timed out).
    ConnectFailed,
}

/// One attempt of one agent.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    pub agent: i64,
    pub kas: usize,
    /// When it began: the TCP connect, or the call on a connection kept from a shed.
    pub began: Instant,
    /// When the GetConfiguration call began (after the connection was up).
    pub called: Instant,
    /// When it ended.
    pub at: Instant,
    pub outcome: Outcome,
}

/// Every attempt of every agent, in order, and when each agent saw a connection fail.
#[derive(Default)]
pub struct Journal(Mutex<Vec<Attempt>>, Mutex<Vec<(i64, Instant)>>);

impl Journal {
    fn lost(&self, agent: i64) {
        self.1.lock().unwrap_or_else(PoisonError::into_inner).push((agent, Instant::now()));
    }

    /// When agents saw their presence stream fail (not a shed), in order.
    pub fn losses(&self) -> Vec<(i64, Instant)> {
        self.1.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn record(&self, agent: i64, kas: usize, times: (Instant, Instant), outcome: Outcome) {
        let attempt = Attempt { agent, kas, began: times.0, called: times.1, at: Instant::now(), outcome };
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(attempt);
    }

    pub fn snapshot(&self) -> Vec<Attempt> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

pub struct SimAgent {
    pub id: i64,
    pub token: String,
    /// The kas of its first connection (round-robin); later ones are the load balancer's pick.
    pub home: usize,
    pub idle_tunnels: usize,
}

fn authorized<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Ok(v) = format!("Bearer {token}").parse() {
        req.metadata_mut().insert(kas_proto::metadata::AUTHORIZATION, v);
    }
    req
}

fn endpoint(address: &str) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{address}"))?
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .initial_stream_window_size(kas_proto::flow::STREAM_WINDOW)
        .initial_connection_window_size(kas_proto::flow::CONNECTION_WINDOW))
}

/// What an agent shares with the simulator.
#[derive(Clone)]
pub struct Shared {
    pub fleet: Arc<Fleet>,
    pub counters: Arc<Counters>,
    pub journal: Arc<Journal>,
    pub stop: CancellationToken,
}

/// Runs the agent until `stop`; `started` receives the instant its first connection attempt
/// began (connect-to-registered latency is measured from it).
pub async fn run(agent: SimAgent, shared: Shared, started: impl FnOnce(Instant)) {
    let stop = &shared.stop;
    let mut backoff = Backoff::new(agentk::app::RECONNECT_BASE, agentk::app::RECONNECT_CAP);
    let mut connection: Option<(usize, Channel)> = None;
    let mut first = true;
    started(Instant::now());
    while !stop.is_cancelled() {
        let began = Instant::now();
        let (kas, channel) = match connection.take() {
            Some(c) => c,
            None => {
                let kas = if first { Some(agent.home) } else { shared.fleet.pick() };
                first = false;
                let Some(kas) = kas else { return };
                let connected = match endpoint(&shared.fleet.agent_addresses[kas]) {
                    Ok(e) => tokio::select! {
                        () = stop.cancelled() => return,
                        c = e.connect() => c,
                    },
                    Err(e) => Err(e),
                };
                match connected {
                    Ok(channel) => (kas, channel),
                    Err(e) => {
                        shared.counters.failures.fetch_add(1, Ordering::Relaxed);
                        if shared.counters.connect_failures.fetch_add(1, Ordering::Relaxed) < 10 {
                            eprintln!("agent {}: connecting to kas-{kas} failed: {e:?}", agent.id);
                        }
                        shared.journal.record(agent.id, kas, (began, Instant::now()), Outcome::ConnectFailed);
                        tokio::select! {
                            () = stop.cancelled() => return,
                            () = tokio::time::sleep(backoff.next_delay()) => continue,
                        }
                    }
                }
            }
        };
        let ended = session(&agent, kas, channel.clone(), &shared, began).await;
        let pushback = ended.as_ref().err().and_then(kas_proto::metadata::retry_pushback);
        if ended.is_err() && pushback.is_none() {
            shared.journal.lost(agent.id);
        }
        if pushback.is_some() {
            // Shed by kas: the connection is fine and the retry goes to the same kas, as
            // agentk's channel would.
            connection = Some((kas, channel));
        }
        if began.elapsed() >= agentk::app::HEALTHY_AFTER {
            backoff.reset();
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff.next_delay_after(pushback)) => {}
        }
    }
}

/// The presence stream and the idle tunnels on one connection, until the stream ends (`Ok` when
/// kas ended it or `stop`) or fails.
async fn session(
    agent: &SimAgent,
    kas: usize,
    channel: Channel,
    shared: &Shared,
    began: Instant,
) -> Result<(), tonic::Status> {
    let (counters, stop) = (&shared.counters, &shared.stop);
    let called = Instant::now();
    let connection_id = ConnectionId::random();
    let mut client = AgentTunnelClient::new(channel.clone());
    let request = ConfigurationRequest {
        connection_id: connection_id.0,
        agent_meta: Some(AgentMeta {
            version: "kas-sim".into(),
            commit: String::new(),
            pod_namespace: "kas-sim".into(),
            pod_name: format!("agent-{}", agent.id),
        }),
        commit_id: String::new(),
    };
    let stream = tokio::select! {
        () = stop.cancelled() => return Ok(()),
        r = client.get_configuration(authorized(request, &agent.token)) => r,
    };
    let mut stream = match stream {
        Ok(s) => s.into_inner(),
        Err(status) => {
            counters.failures.fetch_add(1, Ordering::Relaxed);
            let outcome = match status.code() {
                tonic::Code::Unavailable if kas_proto::metadata::retry_pushback(&status).is_some() => Outcome::Shed,
                tonic::Code::ResourceExhausted => Outcome::ResourceExhausted,
                code => Outcome::Refused(code),
            };
            shared.journal.record(agent.id, kas, (began, called), outcome);
            // GitLab mode: kas's own GitLab rate limit refusing is expected in a storm (counted).
            if !matches!(outcome, Outcome::Shed) && !status.message().contains("rate limited") {
                eprintln!("agent {}: GetConfiguration on kas-{kas}: {status}", agent.id);
            }
            return Err(status);
        }
    };
    shared.journal.record(agent.id, kas, (began, called), Outcome::Admitted);
    counters.presence_open.fetch_add(1, Ordering::Relaxed);
    let session_stop = stop.child_token();
    for _ in 0..agent.idle_tunnels {
        tokio::spawn(tunnel_loop(
            channel.clone(),
            agent.token.clone(),
            agent.id,
            connection_id,
            counters.clone(),
            session_stop.clone(),
        ));
    }
    let result = loop {
        let message = tokio::select! {
            () = stop.cancelled() => break Ok(()),
            m = stream.message() => m,
        };
        match message {
            // Configuration updates: nothing to apply in a simulation.
            Ok(Some(_)) => {}
            Ok(None) => break Ok(()),
            Err(status) => {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                break Err(status);
            }
        }
    };
    session_stop.cancel();
    counters.presence_open.fetch_sub(1, Ordering::Relaxed);
    result
}

/// The answer to every proxied request: 200 with a small JSON body naming the agent.
fn response_frames(agent_id: i64) -> [ConnectRequest; 4] {
    let body = Bytes::from(format!(
        "{{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Success\",\"agent\":{agent_id}}}"
    ));
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
    let head = HttpResponseHead { status: 200, headers };
    [
        ConnectRequest::header(pb::Header::default()),
        ConnectRequest::message(HttpFrame::response_head(head).to_bytes()),
        ConnectRequest::message(HttpFrame::body(body).to_bytes()),
        ConnectRequest::trailer(pb::Trailer::default()),
    ]
}

/// How a tunnel stream ended.
enum TunnelEnd {
    /// `stop`: the session is over.
    Stopped,
    /// kas closed it (idle timeout): open another.
    Closed,
    /// Failed (protocol, transport, an unexpected request).
    Failed,
}

/// One tunnel slot: opens a Connect stream, sends the Descriptor, serves requests on it (reused,
/// as agentk's are) and opens another when kas closes it, until the session stops.
async fn tunnel_loop(
    channel: Channel,
    token: String,
    agent_id: i64,
    connection_id: ConnectionId,
    counters: Arc<Counters>,
    stop: CancellationToken,
) {
    let mut client = AgentTunnelClient::new(channel);
    let mut first = true;
    while !stop.is_cancelled() {
        if !first {
            counters.tunnels_reopened.fetch_add(1, Ordering::Relaxed);
        }
        first = false;
        // Room for a whole response (4 frames) so that it goes out in one write, as agentk's.
        let (outbound, rx) = mpsc::channel::<ConnectRequest>(4);
        let descriptor = pb::Descriptor {
            connection_id: connection_id.0,
            methods: vec![kas_proto::kubernetes_api::METHOD.to_owned(), kas_proto::get_pods::METHOD.to_owned()],
            response_credit: true,
            reusable: true,
        };
        if outbound.try_send(ConnectRequest::descriptor(descriptor)).is_err() {
            return;
        }
        let opened = tokio::select! {
            () = stop.cancelled() => return,
            r = client.connect(authorized(ReceiverStream::new(rx), &token)) => r,
        };
        let mut inbound = match opened {
            Ok(r) => r.into_inner(),
            Err(_) => {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(TUNNEL_RETRY_PAUSE) => continue,
                }
            }
        };
        counters.tunnels_open.fetch_add(1, Ordering::Relaxed);
        // `outbound` stays alive while serving: dropping it would half-close the stream.
        let mut method_ok = false;
        let end = loop {
            let next = tokio::select! {
                () = stop.cancelled() => break TunnelEnd::Stopped,
                m = inbound.message() => m,
            };
            let frame = match next {
                Ok(Some(frame)) => frame,
                Ok(None) => break TunnelEnd::Closed,
                Err(status) if status.code() == tonic::Code::Cancelled => break TunnelEnd::Closed,
                Err(_) => break TunnelEnd::Failed,
            };
            match frame.msg {
                Some(connect_response::Msg::RequestInfo(info)) => {
                    method_ok = info.method == kas_proto::kubernetes_api::METHOD;
                }
                // The request head and body: a simulated API server does not need them.
                Some(connect_response::Msg::Message(_) | connect_response::Msg::WindowUpdate(_)) => {}
                // The request is complete: answer it; the tunnel then waits for the next one.
                Some(connect_response::Msg::CloseSend(_)) if method_ok => {
                    let mut sent = true;
                    for f in response_frames(agent_id) {
                        sent &= outbound.send(f).await.is_ok();
                    }
                    if !sent {
                        break TunnelEnd::Failed;
                    }
                    counters.requests_served.fetch_add(1, Ordering::Relaxed);
                    method_ok = false;
                }
                Some(connect_response::Msg::CloseSend(_)) | None => {
                    counters.requests_unexpected.fetch_add(1, Ordering::Relaxed);
                    break TunnelEnd::Failed;
                }
            }
        };
        drop(outbound);
        counters.tunnels_open.fetch_sub(1, Ordering::Relaxed);
        match end {
            TunnelEnd::Stopped => return,
            TunnelEnd::Closed => {}
            TunnelEnd::Failed => {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(TUNNEL_RETRY_PAUSE) => {}
                }
            }
        }
    }
}
