//! Connections to other kas instances (KasInternal), reused across requests: one lazily
//! connected channel per peer address, never a dial per request.
//!
//! Peer health: a forward that fails at the transport (connection refused or reset, or an
//! HTTP/2 keepalive ping unanswered within `peer_ping_timeout`) marks the peer down. Requests
//! skip a down peer without dialing it; one task per down peer probes it with backoff and marks
//! it up again. Each change of state is logged once (and counted), never once per request.

use std::error::Error as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use foldhash::HashMap;
use futures::StreamExt;
use kas_proto::kas::kas_internal_client::KasInternalClient;
use kas_proto::kas::{ConnectedAgentInfo, KasAddress};
use kas_proto::metadata::{AUTHORIZATION, HOP_AGENT_ID, HOP_CONNECTION_ID, HOP_METHOD, HOP_REUSABLE};
use kas_proto::tunnel::pb::ConnectResponse;
use kas_proto::{AgentId, ConnectionId};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use crate::auth::jwt::{KAS_AUDIENCE, KAS_ISSUER};
use crate::auth::{Secret, mint_jwt};
use crate::error::KasError;
use crate::tunnel::TunnelIo;
use crate::tunnel::forwards::{ForwardKey, IdleForwards};

/// Peer connections ping this long after they last received anything (while a forward is
/// open): a hung kas is noticed in interval + timeout, well inside a request's budget.
pub const DEFAULT_PEER_PING_INTERVAL: Duration = Duration::from_secs(1);
/// An unanswered ping closes the peer connection; its requests move to another connection.
pub const DEFAULT_PEER_PING_TIMEOUT: Duration = Duration::from_secs(2);
/// kas -> kas tokens live this long: enough for clock skew, useless if captured.
const PEER_TOKEN_TTL: Duration = Duration::from_secs(60);
/// A peer that does not accept a connection within this is treated as gone.
const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Frames buffered towards the gateway kas (each at most one body chunk); HTTP/2 flow control
/// does the rest.
const PEER_SEND_BUFFER: usize = kas_proto::flow::HOP_BUFFER;
/// Streams a peer connection remembers after resetting them (h2's default is 10): frames still
/// in flight for them are then ignored as the protocol wants, not treated as errors.
const PEER_RESET_STREAMS_REMEMBERED: usize = 1024;
/// A down peer is probed after this, doubling per failed probe up to the cap (±20 % jitter):
/// a dead kas costs each peer at most a few dials per second, a revived one is used again
/// within the cap.
const PEER_RETRY_BASE: Duration = Duration::from_millis(250);
const PEER_RETRY_CAP: Duration = Duration::from_secs(2);
/// A probe is one round trip through the peer's gRPC stack; a live kas answers in milliseconds.
const PEER_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A peer that is down and that no request wanted for this long is forgotten (its probes stop,
/// its channel is dropped): a kas that went away for good costs nothing after a minute. A peer
/// that is up but that no request used for this long is dropped too (a kas replaced in a
/// rolling restart leaves its records, and so its use, behind); forwards still open on its
/// channel keep it, and the next request dials again.
const PEER_FORGET_AFTER: Duration = Duration::from_secs(60);

/// Whether a request may take a forwarded stream kept from an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    Allowed,
    /// Only a fresh stream (the request is being routed again after a kept one failed).
    Refused,
}

/// `ip:port` of the kas holding `connection`, as peers are keyed.
pub fn peer_address(connection: &ConnectedAgentInfo) -> Option<Arc<str>> {
    connection.kas_address.as_ref().map(|a| Arc::from(socket_address(a)))
}

/// Why a peer could not take a request; the router tries the next connection in every case
/// but `Failed`.
#[derive(Debug)]
pub enum PeerError {
    /// The peer does not hold the connection (any more).
    NotHere,
    /// The peer is down (known before, or this attempt failed at the transport and marked it):
    /// logged once per state change by `Peers`, not per request.
    Down,
    /// The peer answered that it cannot serve the request now.
    Unavailable(String),
    /// The peer answered with an error the caller should see (e.g. its wait ran out).
    Failed(KasError),
}

struct Peer {
    /// Driven by `Shared::runtime` (see there).
    channel: Channel,
    /// `Some` while the peer is down (a probe task is running for it).
    down: Option<Down>,
    /// The last time a request took this peer's channel.
    last_used: Instant,
}

struct Down {
    since: Instant,
    /// The last time a request skipped this peer (it is forgotten when nobody wants it).
    last_wanted: Instant,
}

struct Shared {
    secret: Secret,
    /// TLS towards peers (`kas_internal.tls`), plaintext when absent.
    tls: Option<tonic::transport::ClientTlsConfig>,
    ping_interval: Duration,
    ping_timeout: Duration,
    /// Where peer channels' tasks (their buffer and their connection) run: kas's first data
    /// plane thread, so that a forwarded request served there does not cross threads; without
    /// it, the runtime that first asks for the peer, which could be the multi-threaded one (the
    /// cluster state hub's peer reads), putting every later forward to that peer across threads.
    runtime: Option<tokio::runtime::Handle>,
    /// Address -> peer. A lock held only for map operations (never across an await); channels
    /// are cheap clones sharing one HTTP/2 connection.
    peers: Mutex<HashMap<String, Peer>>,
    /// When unused up peers were last dropped from `peers`.
    last_sweep: Mutex<Instant>,
    /// Bumped each time a peer comes back up: requests waiting for an agent look again.
    up: watch::Sender<u64>,
    /// Ends the probe tasks when `Peers` is dropped.
    stop: CancellationToken,
    /// Forwarded tunnels kept after an exchange, for the next request to the same connection.
    forwards: Arc<IdleForwards>,
}

pub struct Peers {
    shared: Arc<Shared>,
}

impl Drop for Peers {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

impl Peers {
    pub fn new(secret: Secret) -> Self {
        Self {
            shared: Arc::new(Shared {
                secret,
                tls: None,
                ping_interval: DEFAULT_PEER_PING_INTERVAL,
                ping_timeout: DEFAULT_PEER_PING_TIMEOUT,
                runtime: None,
                peers: Mutex::default(),
                last_sweep: Mutex::new(Instant::now()),
                up: watch::channel(0).0,
                stop: CancellationToken::new(),
                forwards: Arc::default(),
            }),
        }
    }

    /// A `Peers` with the same settings but `edit` applied (only while building: no peer state
    /// is carried over).
    fn rebuild(self, edit: impl FnOnce(&mut Shared)) -> Self {
        let old = &self.shared;
        let mut shared = Shared {
            secret: old.secret.clone(),
            tls: old.tls.clone(),
            ping_interval: old.ping_interval,
            ping_timeout: old.ping_timeout,
            runtime: old.runtime.clone(),
            peers: Mutex::default(),
            last_sweep: Mutex::new(Instant::now()),
            up: watch::channel(0).0,
            stop: CancellationToken::new(),
            forwards: Arc::default(),
        };
        edit(&mut shared);
        Self { shared: Arc::new(shared) }
    }

    /// Dials peers with TLS (verifying their certificate, presenting this kas's).
    pub fn with_tls(self, tls: tonic::transport::ClientTlsConfig) -> Self {
        self.rebuild(|s| s.tls = Some(tls))
    }

    /// Peer channels driven by `runtime` (kas's first data plane thread), whoever asks first.
    pub fn with_runtime(self, runtime: Option<tokio::runtime::Handle>) -> Self {
        self.rebuild(|s| s.runtime = runtime)
    }

    /// HTTP/2 keepalive towards peers (`kas_internal.peer_ping_interval` / `_timeout`).
    pub fn with_ping(self, interval: Duration, timeout: Duration) -> Self {
        self.rebuild(|s| {
            s.ping_interval = interval;
            s.ping_timeout = timeout;
        })
    }

    /// Forwarded tunnels idle between requests (for tests and metrics).
    pub fn idle_forwards(&self) -> usize {
        self.shared.forwards.len()
    }

    /// Changes each time a down peer comes back up.
    pub fn watch_up(&self) -> watch::Receiver<u64> {
        self.shared.up.subscribe()
    }

    /// Opens a forwarded tunnel to the kas holding `connection`, at `address` (its
    /// [`peer_address`]). Returns once that kas has found a local tunnel for it (its response
    /// headers arrived), so nothing is sent to a kas that cannot serve the request.
    /// `kept`: a stream kept from an earlier request to the same connection may be used (see
    /// `tunnel::forwards`); then the tunnel [`TunnelIo::is_kept`] and nothing said the peer is
    /// alive before the request goes out.
    pub async fn open(
        &self,
        connection: &ConnectedAgentInfo,
        address: &Arc<str>,
        method: &str,
        wait: Duration,
        kept: Kept,
    ) -> Result<TunnelIo, PeerError> {
        let channel = self.shared.channel_if_up(address)?;
        let key = ForwardKey {
            peer: address.clone(),
            agent_id: AgentId(connection.id),
            connection_id: ConnectionId(connection.connection_id),
        };
        if kept == Kept::Allowed
            && let Some(io) = self.shared.forwards.take(&key)
        {
            return Ok(io);
        }
        let mut client = KasInternalClient::new(channel);
        let (tx, rx) = mpsc::channel(PEER_SEND_BUFFER);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        let token = self.shared.token()?;
        let md = request.metadata_mut();
        let mut insert = |key: &'static str, value: String| {
            if let Ok(v) = value.parse() {
                md.insert(key, v);
            }
        };
        insert(AUTHORIZATION, format!("Bearer {token}"));
        insert(HOP_AGENT_ID, connection.id.to_string());
        insert(HOP_CONNECTION_ID, connection.connection_id.to_string());
        insert(HOP_METHOD, method.to_owned());
        insert(HOP_REUSABLE, "1".to_owned());
        // Bounds the gateway's wait for a free tunnel (it ends at the response headers; the
        // stream itself is not limited, so long watches are not cut). A hung gateway is not
        // waited for until then: the keepalive ping closes its connection first.
        request.set_timeout(wait);
        match client.forward_tunnel(request).await {
            Ok(response) => {
                let response_credit = response.metadata().contains_key(kas_proto::metadata::HOP_RESPONSE_CREDIT);
                let reuse = response.metadata().contains_key(HOP_REUSABLE).then(|| (self.shared.forwards.clone(), key));
                Ok(TunnelIo::remote(tx, response.into_inner().boxed(), response_credit, reuse, false))
            }
            Err(status) if is_transport_failure(&status) => {
                Shared::mark_down(&self.shared, address, &status);
                Err(PeerError::Down)
            }
            Err(status) => Err(match status.code() {
                tonic::Code::NotFound => PeerError::NotHere,
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Internal => {
                    PeerError::Unavailable(format!("kas {address}: {}", status.message()))
                }
                code => PeerError::Failed(KasError::AgentError { code, message: status.message().to_owned() }),
            }),
        }
    }
}

impl Peers {
    /// A kept stream to the peer at `address` failed with `status`: a transport failure marks
    /// the peer down (as a failed open does), so the request's next route skips it.
    pub fn stream_failed(&self, address: &str, status: &tonic::Status) {
        if is_transport_failure(status) {
            Shared::mark_down(&self.shared, address, status);
        }
    }

    /// The channel to the peer at `address` (shared with forwarded tunnels, so its health counts
    /// the same way) and the `authorization` value its internal listener wants: for the features'
    /// own `KasInternal`-side services.
    pub fn internal_channel(&self, address: &KasAddress) -> Result<(Channel, String), PeerError> {
        let channel = self.shared.channel_if_up(&socket_address(address))?;
        Ok((channel, format!("Bearer {}", self.shared.token()?)))
    }
}

/// `ip:port`, with brackets around an IPv6 address.
fn socket_address(a: &KasAddress) -> String {
    if a.ip.contains(':') { format!("[{}]:{}", a.ip, a.port) } else { format!("{}:{}", a.ip, a.port) }
}

/// A status tonic made from a connection failure (refused, reset, keepalive timeout), as
/// opposed to one the peer sent: those carry the underlying error as their source. The
/// client-side deadline of the headers is not the peer's failure.
fn is_transport_failure(status: &tonic::Status) -> bool {
    let mut source = status.source();
    if source.is_none() {
        return false;
    }
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return false;
        }
        source = e.source();
    }
    true
}

impl Shared {
    fn token(&self) -> Result<String, PeerError> {
        mint_jwt(&self.secret, KAS_ISSUER, KAS_AUDIENCE, PEER_TOKEN_TTL)
            .map_err(|e| PeerError::Unavailable(e.to_string()))
    }

    /// The peer's channel, or `Down` without dialing when it is known to be down.
    fn channel_if_up(&self, address: &str) -> Result<Channel, PeerError> {
        let now = Instant::now();
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        self.sweep(&mut peers, now);
        if let Some(p) = peers.get_mut(address) {
            return match &mut p.down {
                Some(down) => {
                    down.last_wanted = now;
                    Err(PeerError::Down)
                }
                None => {
                    p.last_used = now;
                    Ok(p.channel.clone())
                }
            };
        }
        let channel = {
            let _on = self.runtime.as_ref().map(tokio::runtime::Handle::enter);
            self.new_channel(address)?
        };
        peers.insert(address.to_owned(), Peer { channel: channel.clone(), down: None, last_used: now });
        Ok(channel)
    }

    /// Drops up peers no request used for `PEER_FORGET_AFTER` (down peers are their probe's
    /// to forget); at most once per quarter of that, so a request pays for it rarely.
    fn sweep(&self, peers: &mut HashMap<String, Peer>, now: Instant) {
        let mut last = self.last_sweep.lock().unwrap_or_else(PoisonError::into_inner);
        if now.duration_since(*last) < PEER_FORGET_AFTER / 4 {
            return;
        }
        *last = now;
        peers.retain(|_, p| p.down.is_some() || now.duration_since(p.last_used) < PEER_FORGET_AFTER);
    }

    fn new_channel(&self, address: &str) -> Result<Channel, PeerError> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| PeerError::Unavailable(format!("bad peer address {address}: {e}")))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| PeerError::Unavailable(format!("peer TLS configuration: {e}")))?;
        }
        // Pings only while a forward is open (not while idle): the cost is per peer connection
        // in use, independent of the number of agents.
        Ok(endpoint
            .connect_timeout(PEER_CONNECT_TIMEOUT)
            .http2_keep_alive_interval(self.ping_interval)
            .keep_alive_timeout(self.ping_timeout)
            .tcp_nodelay(true)
            // Responses of all forwarded tunnels share this connection: one unread stream must
            // not hold its window (`kas_proto::flow`).
            .initial_stream_window_size(kas_proto::flow::STREAM_WINDOW)
            .initial_connection_window_size(kas_proto::flow::CONNECTION_WINDOW)
            .max_frame_size(kas_proto::flow::MAX_FRAME_SIZE)
            // h2 counts every frame that arrives for a stream it reset and no longer remembers
            // as the peer's error and, at 1,024 over the connection's life, closes it with
            // GOAWAY: under load (kas-bench, 4,000 forwarded requests a second) that took the
            // connection to the gateway down every few seconds, failing the requests on it. The
            // peer is another kas, authenticated by the kas secret, so the limit (a defence
            // against hostile peers) is off on this side and more resets are remembered.
            .http2_max_local_error_reset_streams(None)
            .http2_max_concurrent_reset_streams(PEER_RESET_STREAMS_REMEMBERED)
            .connect_lazy())
    }

    /// Marks the peer down (once: later failures while down change nothing) and starts probing it.
    fn mark_down(shared: &Arc<Self>, address: &str, status: &tonic::Status) {
        {
            let mut peers = shared.peers.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(p) = peers.get_mut(address) else { return };
            if p.down.is_some() {
                return;
            }
            let now = Instant::now();
            p.down = Some(Down { since: now, last_wanted: now });
        }
        tracing::warn!(peer = %address, error = %status.message(), "peer kas down; skipping it and re-dialing with backoff");
        crate::metrics::peer_state_changed("down");
        tokio::spawn(probe_until_up(shared.clone(), address.to_owned()));
    }

    /// One round trip through the peer's gRPC stack: a ForwardTunnel without hop metadata,
    /// which a live kas refuses at once (INVALID_ARGUMENT) after checking the JWT. Any answer
    /// the peer sends means it is up.
    async fn probe(&self, channel: Channel) -> bool {
        let Ok(token) = self.token() else { return false };
        let mut request = tonic::Request::new(futures::stream::empty::<ConnectResponse>());
        if let Ok(v) = format!("Bearer {token}").parse() {
            request.metadata_mut().insert(AUTHORIZATION, v);
        }
        let mut client = KasInternalClient::new(channel);
        match tokio::time::timeout(PEER_PROBE_TIMEOUT, client.forward_tunnel(request)).await {
            Ok(Ok(_)) => true,
            Ok(Err(status)) => !is_transport_failure(&status),
            Err(_) => false,
        }
    }
}

/// Probes a down peer with backoff until it answers (then marks it up), nobody has wanted it
/// for `PEER_FORGET_AFTER` (then forgets it), or kas stops.
async fn probe_until_up(shared: Arc<Shared>, address: String) {
    let mut ceiling = PEER_RETRY_BASE;
    loop {
        let delay = ceiling.mul_f64(0.8 + 0.4 * rand::random::<f64>());
        tokio::select! {
            () = shared.stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        let channel = {
            let mut peers = shared.peers.lock().unwrap_or_else(PoisonError::into_inner);
            match peers.get(&address) {
                Some(Peer { down: Some(down), .. }) if down.last_wanted.elapsed() >= PEER_FORGET_AFTER => {
                    peers.remove(&address);
                    tracing::debug!(peer = %address, "forgetting a peer kas nobody needs");
                    return;
                }
                Some(p) => p.channel.clone(),
                None => return,
            }
        };
        if shared.probe(channel).await {
            let down_for = {
                let mut peers = shared.peers.lock().unwrap_or_else(PoisonError::into_inner);
                peers.get_mut(&address).and_then(|p| p.down.take()).map(|d| d.since.elapsed())
            };
            if let Some(down_for) = down_for {
                tracing::info!(peer = %address, ?down_for, "peer kas up again");
                crate::metrics::peer_state_changed("up");
                shared.up.send_modify(|n| *n = n.wrapping_add(1));
            }
            return;
        }
        ceiling = (ceiling * 2).min(PEER_RETRY_CAP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connection_failures_count_against_a_peer() {
        // What the peer answered (grpc-status): no source.
        assert!(!is_transport_failure(&tonic::Status::unavailable("agent 1 is not connected")));
        // What tonic made of a refused or reset connection: the error is its source.
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(is_transport_failure(&tonic::Status::from_error(Box::new(refused))));
        // Our own deadline for the headers ran out: not the peer's failure.
        let expired = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert!(expired.source().is_some());
        assert!(!is_transport_failure(&expired));
    }

    fn known(peers: &Peers) -> Vec<String> {
        let mut v: Vec<String> = peers.shared.peers.lock().unwrap().keys().cloned().collect();
        v.sort();
        v
    }

    /// A peer replaced in a rolling restart is never asked again: its entry goes after a minute
    /// unused, while a peer in use stays.
    #[tokio::test(start_paused = true)]
    async fn peers_nobody_uses_are_forgotten() {
        let peers = Peers::new(Secret::generate());
        // Lazy channels: nothing is dialed.
        peers.shared.channel_if_up("127.0.0.1:1001").unwrap();
        peers.shared.channel_if_up("127.0.0.1:1002").unwrap();
        tokio::time::advance(PEER_FORGET_AFTER / 2).await;
        peers.shared.channel_if_up("127.0.0.1:1002").unwrap();
        tokio::time::advance(PEER_FORGET_AFTER / 2 + Duration::from_secs(1)).await;
        peers.shared.channel_if_up("127.0.0.1:1003").unwrap();
        assert_eq!(known(&peers), ["127.0.0.1:1002", "127.0.0.1:1003"]);
        tokio::time::advance(PEER_FORGET_AFTER * 2).await;
        peers.shared.channel_if_up("127.0.0.1:1003").unwrap();
        assert_eq!(known(&peers), ["127.0.0.1:1003"]);
    }

    /// The channel to a peer runs on the runtime it was given (kas's first data plane thread),
    /// even when first asked for elsewhere.
    #[tokio::test]
    async fn peer_channels_run_on_the_given_runtime() {
        let thread = kas_proto::runtime_thread::RuntimeThread::start(
            "peers-test".into(),
            kas_proto::runtime_thread::Scheduling::Normal,
        )
        .unwrap();
        let peers = Peers::new(Secret::generate()).with_runtime(Some(thread.handle().clone()));
        assert_eq!(thread.handle().metrics().num_alive_tasks(), 0);
        // Asked for on this test's runtime (as the cluster state hub would).
        peers.shared.channel_if_up("127.0.0.1:1001").unwrap();
        assert_eq!(thread.handle().metrics().num_alive_tasks(), 1, "the channel's buffer task");
        peers.shared.channel_if_up("127.0.0.1:1001").unwrap();
        assert_eq!(thread.handle().metrics().num_alive_tasks(), 1, "one channel per peer");
    }
}
