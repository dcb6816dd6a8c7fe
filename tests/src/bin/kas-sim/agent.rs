//! One simulated agent, held as agentk holds itself at rest: its own HTTP/2 connection (same
//! keepalive and flow-control windows as agentk), the presence stream (GetConfiguration) and
//! `idle_tunnels` Connect streams that sent agentk's Descriptor and wait for a request.
//!
//! kas closes idle tunnels after `agent_connections.idle_tunnel_timeout`; agentk opens them again,
//! so the simulation does too (counted in [`Counters::tunnels_reopened`]). Requests are not
//! served: a request arriving on a tunnel is counted and the tunnel dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kas_proto::ConnectionId;
use kas_proto::tunnel::pb::agent_tunnel_client::AgentTunnelClient;
use kas_proto::tunnel::pb::{self, AgentMeta, ConfigurationRequest, ConnectRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

/// agentk's values (agentk/src/app.rs): what kas sees from a real agent at rest.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before trying again after a failed connection or stream (agentk backs off too).
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// What all simulated agents did, summed.
#[derive(Default)]
pub struct Counters {
    pub presence_open: AtomicU64,
    pub tunnels_open: AtomicU64,
    pub tunnels_reopened: AtomicU64,
    pub failures: AtomicU64,
    pub requests_dropped: AtomicU64,
}

pub struct SimAgent {
    pub id: i64,
    pub token: String,
    /// `host:port` of a kas agent listener.
    pub address: String,
    pub idle_tunnels: usize,
}

fn authorized<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Ok(v) = format!("Bearer {token}").parse() {
        req.metadata_mut().insert(kas_proto::metadata::AUTHORIZATION, v);
    }
    req
}

/// Runs the agent until `stop`; `started` receives the instant its first connection attempt
/// began (connect-to-registered latency is measured from it).
pub async fn run(agent: SimAgent, counters: Arc<Counters>, stop: CancellationToken, started: impl FnOnce(Instant)) {
    let endpoint = match Endpoint::from_shared(format!("http://{}", agent.address)) {
        Ok(e) => e
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .initial_stream_window_size(kas_proto::flow::STREAM_WINDOW)
            .initial_connection_window_size(kas_proto::flow::CONNECTION_WINDOW),
        Err(e) => {
            eprintln!("agent {}: bad address {}: {e}", agent.id, agent.address);
            counters.failures.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    started(Instant::now());
    while !stop.is_cancelled() {
        // One Endpoint::connect per session: its own TCP and HTTP/2 connection, as agentk has.
        let channel = tokio::select! {
            () = stop.cancelled() => return,
            c = endpoint.connect() => c,
        };
        match channel {
            Ok(channel) => session(&agent, channel, &counters, &stop).await,
            Err(e) => {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                eprintln!("agent {}: connecting to {} failed: {e}", agent.id, agent.address);
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RETRY_PAUSE) => {}
        }
    }
}

/// The presence stream and the idle tunnels on one connection, until either ends or `stop`.
async fn session(agent: &SimAgent, channel: Channel, counters: &Arc<Counters>, stop: &CancellationToken) {
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
        () = stop.cancelled() => return,
        r = client.get_configuration(authorized(request, &agent.token)) => r,
    };
    let mut stream = match stream {
        Ok(s) => s.into_inner(),
        Err(status) => {
            counters.failures.fetch_add(1, Ordering::Relaxed);
            eprintln!("agent {}: GetConfiguration: {status}", agent.id);
            return;
        }
    };
    counters.presence_open.fetch_add(1, Ordering::Relaxed);
    let session_stop = stop.child_token();
    for _ in 0..agent.idle_tunnels {
        tokio::spawn(tunnel_loop(
            channel.clone(),
            agent.token.clone(),
            connection_id,
            counters.clone(),
            session_stop.clone(),
        ));
    }
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => break,
            m = stream.message() => m,
        };
        match message {
            // Configuration updates: nothing to apply in a simulation.
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(status) => {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                eprintln!("agent {}: presence stream: {status}", agent.id);
                break;
            }
        }
    }
    session_stop.cancel();
    counters.presence_open.fetch_sub(1, Ordering::Relaxed);
}

/// One idle tunnel slot: opens a Connect stream, sends the Descriptor and waits; opens another
/// when kas closes it (idle timeout), until the session stops.
async fn tunnel_loop(
    channel: Channel,
    token: String,
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
        let (outbound, rx) = mpsc::channel::<ConnectRequest>(1);
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
                    () = tokio::time::sleep(RETRY_PAUSE) => continue,
                }
            }
        };
        counters.tunnels_open.fetch_add(1, Ordering::Relaxed);
        // `outbound` stays alive while waiting: dropping it would half-close the stream.
        // A tunnel at rest sees nothing until kas sends a request or closes it.
        let next = tokio::select! {
            () = stop.cancelled() => None,
            m = inbound.message() => Some(m),
        };
        let ended = match next {
            None => None,
            Some(Ok(Some(_request_frame))) => {
                counters.requests_dropped.fetch_add(1, Ordering::Relaxed);
                Some(true)
            }
            Some(Ok(None)) => Some(false),
            Some(Err(status)) => Some(status.code() != tonic::Code::Cancelled),
        };
        drop(outbound);
        counters.tunnels_open.fetch_sub(1, Ordering::Relaxed);
        match ended {
            None => return,
            Some(true) => {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RETRY_PAUSE) => {}
                }
            }
            Some(false) => {}
        }
    }
}
