//! Idle forwarded tunnels, on the routing kas: `KasInternal.ForwardTunnel` streams to another
//! kas whose exchange ended cleanly both ways, kept for the next request to the same agent
//! connection (`kas_proto::metadata::HOP_REUSABLE`). A request through a second kas then costs
//! no new HTTP/2 stream, no peer token minted and verified, and no tunnel lookup before the
//! response headers: the gateway kas finds a local tunnel when the next `RequestInfo` arrives.
//!
//! A pooled stream is checked when it is taken (it ended or failed while idle: dropped, the
//! next one is tried) and dropped after [`IDLE_FORWARD_TIMEOUT`]; the gateway ends streams it
//! has not been sent anything on for longer than that (`server::internal`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use foldhash::HashMap;
use futures::FutureExt as _;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use kas_proto::tunnel::pb::ConnectRequest;
use kas_proto::{AgentId, ConnectionId};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::{ToPeer, TunnelIo, read_to_end};

/// An idle stream is dropped after this (well inside the gateway's own wait, so the routing kas
/// ends it, not the gateway).
pub const IDLE_FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle streams kept per agent connection: enough for the concurrency one caller fleet puts on
/// one agent through one peer; more are closed as their exchanges end.
const MAX_IDLE_PER_CONNECTION: usize = 64;
/// Idle streams kept towards one peer kas: well under the streams its internal listener
/// allows per connection (1,024 by default), so pooled streams never block new ones.
const MAX_IDLE_PER_PEER: usize = 256;

/// Which agent connection, through which peer kas.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ForwardKey {
    /// `ip:port`, shared: the key is cloned for every stream taken and put back.
    pub peer: Arc<str>,
    pub agent_id: AgentId,
    pub connection_id: ConnectionId,
}

struct IdleForward {
    to_peer: ToPeer,
    from_peer: BoxStream<'static, Result<ConnectRequest, Status>>,
    response_credit: bool,
    since: Instant,
}

impl IdleForward {
    /// Closes the stream: our side ends, the gateway's end is read rather than reset.
    fn close(self) {
        drop(self.to_peer);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(read_to_end(self.from_peer));
        }
    }
}

/// The idle streams by agent connection, and how many there are towards each peer (kept next to
/// the map so that putting a stream back does not walk the whole pool).
#[derive(Default)]
struct Entries {
    by_key: HashMap<ForwardKey, Vec<IdleForward>>,
    per_peer: HashMap<Arc<str>, usize>,
}

impl Entries {
    fn pop(&mut self, key: &ForwardKey) -> Option<IdleForward> {
        let list = self.by_key.get_mut(key)?;
        let idle = list.pop();
        if list.is_empty() {
            self.by_key.remove(key);
        }
        if idle.is_some() {
            self.forget(&key.peer, 1);
        }
        idle
    }

    fn forget(&mut self, peer: &str, n: usize) {
        if let Some(count) = self.per_peer.get_mut(peer) {
            *count = count.saturating_sub(n);
            if *count == 0 {
                self.per_peer.remove(peer);
            }
        }
    }
}

/// The pool. Locked only for map operations, never across an await.
#[derive(Default)]
pub struct IdleForwards {
    entries: Mutex<Entries>,
    /// Started with the first stream put back; ends the sweeper when the pool is dropped.
    sweeper: Mutex<Option<CancellationToken>>,
}

impl Drop for IdleForwards {
    fn drop(&mut self) {
        if let Some(stop) = self.sweeper.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            stop.cancel();
        }
    }
}

impl IdleForwards {
    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle stream of `key` that is still open, as a tunnel that goes back into the pool
    /// when its exchange ends cleanly.
    pub fn take(self: &Arc<Self>, key: &ForwardKey) -> Option<TunnelIo> {
        loop {
            let idle = self.entries().pop(key)?;
            let IdleForward { to_peer, mut from_peer, response_credit, since } = idle;
            let fresh = since.elapsed() < IDLE_FORWARD_TIMEOUT && !to_peer.is_closed();
            // Anything from the gateway while idle (its end, an error) means the stream is over;
            // an open stream has nothing to say, so this poll leaves it as it was.
            if fresh && from_peer.next().now_or_never().is_none() {
                crate::metrics::forward_reused();
                return Some(TunnelIo::remote(
                    to_peer,
                    from_peer,
                    response_credit,
                    Some((self.clone(), key.clone())),
                    true,
                ));
            }
            IdleForward { to_peer, from_peer, response_credit, since }.close();
        }
    }

    /// Puts a stream back after an exchange that ended cleanly both ways.
    pub(super) fn put(
        self: &Arc<Self>,
        key: ForwardKey,
        to_peer: ToPeer,
        from_peer: BoxStream<'static, Result<ConnectRequest, Status>>,
        response_credit: bool,
    ) {
        let idle = IdleForward { to_peer, from_peer, response_credit, since: Instant::now() };
        let refused = {
            let mut entries = self.entries();
            let towards_peer = entries.per_peer.get(&key.peer).copied().unwrap_or(0);
            let peer = key.peer.clone();
            let list = entries.by_key.entry(key).or_default();
            if list.len() >= MAX_IDLE_PER_CONNECTION || towards_peer >= MAX_IDLE_PER_PEER {
                Some(idle)
            } else {
                list.push(idle);
                *entries.per_peer.entry(peer).or_default() += 1;
                None
            }
        };
        if let Some(idle) = refused {
            idle.close();
        }
        self.start_sweeper();
    }

    /// Idle streams, for tests and metrics.
    pub fn len(&self) -> usize {
        self.entries().by_key.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every stream idle for [`IDLE_FORWARD_TIMEOUT`].
    fn sweep(&self) {
        let expired: Vec<IdleForward> = {
            let mut entries = self.entries();
            let mut expired = Vec::new();
            let mut gone: Vec<(Arc<str>, usize)> = Vec::new();
            entries.by_key.retain(|key, list| {
                let (old, young): (Vec<_>, Vec<_>) =
                    std::mem::take(list).into_iter().partition(|i| i.since.elapsed() >= IDLE_FORWARD_TIMEOUT);
                if !old.is_empty() {
                    gone.push((key.peer.clone(), old.len()));
                }
                expired.extend(old);
                *list = young;
                !list.is_empty()
            });
            for (peer, n) in gone {
                entries.forget(&peer, n);
            }
            expired
        };
        expired.into_iter().for_each(IdleForward::close);
    }

    fn start_sweeper(self: &Arc<Self>) {
        let mut sweeper = self.sweeper.lock().unwrap_or_else(PoisonError::into_inner);
        if sweeper.is_some() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let stop = CancellationToken::new();
        *sweeper = Some(stop.clone());
        // Weak: the sweeper must not keep the pool (and its streams) alive.
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(IDLE_FORWARD_TIMEOUT / 2);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(pool) = pool.upgrade() else { return };
                pool.sweep();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use kas_proto::tunnel::pb::ConnectResponse;
    use tokio::sync::mpsc;

    use super::*;

    fn key(connection: i64) -> ForwardKey {
        ForwardKey { peer: "10.0.0.1:8155".into(), agent_id: AgentId(7), connection_id: ConnectionId(connection) }
    }

    /// A stream as the routing kas holds it (its sender, what it sent) and the gateway's ends
    /// (its sender, what the routing kas reads).
    type Stream = (
        ToPeer,
        mpsc::Receiver<ConnectResponse>,
        mpsc::Sender<Result<ConnectRequest, Status>>,
        BoxStream<'static, Result<ConnectRequest, Status>>,
    );

    fn stream() -> Stream {
        let (to_peer, sent) = mpsc::channel(4);
        let (gateway, from_peer) = mpsc::channel(4);
        (to_peer, sent, gateway, tokio_stream::wrappers::ReceiverStream::new(from_peer).boxed())
    }

    #[tokio::test]
    async fn an_open_stream_is_taken_for_its_own_connection_only() {
        let pool = Arc::new(IdleForwards::default());
        let (to_peer, _sent, _gateway, from_peer) = stream();
        pool.put(key(1), to_peer, from_peer, true);
        assert_eq!(pool.len(), 1);
        assert!(pool.take(&key(2)).is_none(), "another connection's stream was taken");
        let io = pool.take(&key(1)).expect("the idle stream");
        assert!(!io.is_closed());
        assert!(pool.is_empty());
    }

    /// A stream the gateway ended (or that failed) while idle is never handed out.
    #[tokio::test]
    async fn a_stream_that_ended_while_idle_is_dropped_when_taken() {
        let pool = Arc::new(IdleForwards::default());
        let (to_peer, _sent, gateway, from_peer) = stream();
        pool.put(key(1), to_peer, from_peer, true);
        drop(gateway);
        let (to_peer, _sent2, gateway2, from_peer) = stream();
        pool.put(key(1), to_peer, from_peer, true);
        gateway2.send(Err(Status::unavailable("gone"))).await.unwrap();
        assert!(pool.take(&key(1)).is_none());
        assert!(pool.is_empty());
    }

    /// At most MAX_IDLE_PER_PEER towards one peer across its connections; the count follows
    /// streams taken, so room comes back.
    #[tokio::test]
    async fn streams_towards_one_peer_are_bounded_across_connections() {
        let pool = Arc::new(IdleForwards::default());
        let mut kept = Vec::new();
        for i in 0..MAX_IDLE_PER_PEER + 5 {
            let (to_peer, sent, gateway, from_peer) = stream();
            kept.push((sent, gateway));
            pool.put(key(i as i64 % 8), to_peer, from_peer, false);
        }
        assert_eq!(pool.len(), MAX_IDLE_PER_PEER);
        let other = ForwardKey { peer: "10.0.0.2:8155".into(), ..key(1) };
        let (to_peer, _sent, _gateway, from_peer) = stream();
        pool.put(other.clone(), to_peer, from_peer, false);
        assert_eq!(pool.len(), MAX_IDLE_PER_PEER + 1, "another peer has its own bound");
        assert!(pool.take(&key(3)).is_some());
        let (to_peer, _sent, _gateway, from_peer) = stream();
        pool.put(key(3), to_peer, from_peer, false);
        assert_eq!(pool.len(), MAX_IDLE_PER_PEER + 1, "the stream taken made room for one");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_streams_expire_and_the_pool_is_bounded() {
        let pool = Arc::new(IdleForwards::default());
        let mut kept = Vec::new();
        for _ in 0..MAX_IDLE_PER_CONNECTION + 3 {
            let (to_peer, sent, gateway, from_peer) = stream();
            kept.push((sent, gateway));
            pool.put(key(1), to_peer, from_peer, false);
        }
        assert_eq!(pool.len(), MAX_IDLE_PER_CONNECTION);
        // The refused ones were closed: their gateway sees the stream end.
        assert!(kept.last_mut().unwrap().0.recv().await.is_none());
        tokio::time::advance(IDLE_FORWARD_TIMEOUT + Duration::from_secs(1)).await;
        assert!(pool.take(&key(1)).is_none(), "an expired stream was taken");
        let (to_peer, _sent, _gateway, from_peer) = stream();
        pool.put(key(3), to_peer, from_peer, false);
        tokio::time::advance(IDLE_FORWARD_TIMEOUT * 2).await;
        tokio::task::yield_now().await;
        assert!(pool.is_empty(), "the sweeper left {} streams", pool.len());
        assert!(pool.entries().per_peer.is_empty(), "the per-peer count kept swept streams");
    }
}
