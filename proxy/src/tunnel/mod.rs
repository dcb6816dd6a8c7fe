//! The local tunnel registry: agent connections and idle tunnels held by this kas.
//!
//! [`TunnelRegistry`] is a cheap, cloneable handle to one state behind a lock that is held for a
//! map operation only, never across an await (and nothing is dropped under it: tunnels it lets go
//! are dropped after it is released). It was a task owning the maps, but every proxied request
//! asked it twice (take an idle tunnel, put the reused one back), two task wakeups and a reply
//! per request on the data path (issue 14). A request asks for a tunnel of an agent (and
//! optionally one connection) serving a method; it gets an idle one at once or is parked until
//! one registers. A parked request that gives up just drops its receiver; it is skipped. A tunnel
//! idle for longer than the idle timeout is closed here (agentk opens as many again as it still
//! wants): that is how idle tunnels shrink after load, closed by the one side that hands them
//! out.

pub mod forwards;
mod io;
mod tripwire;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use foldhash::HashMap;
use kas_proto::{AgentId, ConnectionId};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

pub use io::{
    ClosedSignal, Reroute, ToAgent, ToAgentItem, ToPeer, TunnelIo, TunnelReceiver, TunnelSender, UnaryResponse,
    agent_error, read_to_end,
};
pub use tripwire::Tripwire;

/// What a request needs from a tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelQuery {
    pub agent_id: AgentId,
    /// `ConnectionId::ANY` for any replica of the agent.
    pub connection_id: ConnectionId,
    pub method: String,
}

/// A tunnel that sent its Descriptor and waits for a request.
#[derive(Debug)]
pub struct IdleTunnel {
    pub agent_id: AgentId,
    pub connection_id: ConnectionId,
    /// Shared with the tunnel's reuse record: re-registering after each exchange copies no
    /// strings.
    pub methods: Arc<[String]>,
    pub io: TunnelIo,
    id: u64,
    /// Registered at (idle since).
    since: tokio::time::Instant,
}

impl IdleTunnel {
    fn serves(&self, q: &TunnelQuery) -> bool {
        self.agent_id == q.agent_id
            && (q.connection_id.is_any() || q.connection_id == self.connection_id)
            && self.methods.iter().any(|m| m == &q.method)
    }
}

/// How a tunnel comes into the idle pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Added {
    /// New, for one request (agentk's Descriptor does not say `reusable`).
    Once,
    /// New, and back after each exchange that ends cleanly.
    Reusable,
}

/// A counted snapshot, for readiness, metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TunnelStats {
    pub connections: usize,
    pub idle_tunnels: usize,
    pub waiting_requests: usize,
}

impl TunnelStats {
    /// Sets the gauges that describe this kas's tunnels (at scrape time).
    pub fn record_gauges(&self) {
        metrics::gauge!(crate::metrics::CONNECTIONS).set(self.connections as f64);
        metrics::gauge!(crate::metrics::IDLE_TUNNELS).set(self.idle_tunnels as f64);
        metrics::gauge!(crate::metrics::WAITING_REQUESTS).set(self.waiting_requests as f64);
    }
}

/// Handle to the tunnel registry.
#[derive(Clone)]
pub struct TunnelRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None` once stopped (kas is shutting down).
    state: Mutex<Option<State>>,
    next_id: AtomicU64,
}

impl Inner {
    /// Runs `f` on the state under the lock; what it let go of is dropped after the lock is
    /// released (a tunnel's drop may reach back into the registry).
    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> Result<R, Stopped> {
        let (result, released) = {
            let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let state = guard.as_mut().ok_or(Stopped)?;
            let result = f(state);
            (result, std::mem::take(&mut state.released))
        };
        drop(released);
        Ok(result)
    }
}

impl std::fmt::Debug for TunnelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TunnelRegistry")
    }
}

/// Returned when the registry has stopped (kas is shutting down).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("tunnel registry stopped")]
pub struct Stopped;

impl TunnelRegistry {
    /// Starts the registry and its sweep task. It stops (dropping every idle tunnel and parked
    /// request) on `shutdown`. Tunnels idle for `idle_timeout` are closed.
    pub fn spawn(shutdown: CancellationToken, idle_timeout: Duration) -> Self {
        let inner = Arc::new(Inner { state: Mutex::new(Some(State::default())), next_id: AtomicU64::new(0) });
        tokio::spawn(sweep(Arc::downgrade(&inner), shutdown, idle_timeout));
        Self { inner }
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> Result<R, Stopped> {
        self.inner.with_state(f)
    }

    /// Records an agent connection. `false` if that connection id is already held here.
    pub async fn connection_up(&self, agent_id: AgentId, connection_id: ConnectionId) -> Result<bool, Stopped> {
        self.with_state(|s| {
            let held = s.connections.entry(agent_id).or_default();
            let new = !held.contains_key(&connection_id);
            if new {
                held.insert(connection_id, CancellationToken::new());
            }
            new
        })
    }

    pub fn connection_down(&self, agent_id: AgentId, connection_id: ConnectionId) {
        let _ = self.with_state(|s| {
            // Its idle tunnels end here, by kas: agentk waits for that instead of closing them
            // itself, so a tunnel is never closed while kas sends a request down it.
            s.release_idle(agent_id, |t| t.connection_id == connection_id);
            if let Some(set) = s.connections.get_mut(&agent_id) {
                if let Some(gone) = set.remove(&connection_id) {
                    gone.cancel();
                }
                if set.is_empty() {
                    s.connections.remove(&agent_id);
                }
            }
        });
    }

    /// Whether this kas holds the connection (any connection of the agent for `ANY`).
    pub async fn has_connection(&self, agent_id: AgentId, connection_id: ConnectionId) -> Result<bool, Stopped> {
        self.with_state(|s| {
            s.connections.get(&agent_id).is_some_and(|set| {
                if connection_id.is_any() { !set.is_empty() } else { set.contains_key(&connection_id) }
            })
        })
    }

    /// Cancelled when the connection goes down here (at once if it is not held here): what
    /// waits on a connection for longer than one request (a forwarded stream between exchanges).
    pub async fn connection_gone(
        &self,
        agent_id: AgentId,
        connection_id: ConnectionId,
    ) -> Result<CancellationToken, Stopped> {
        self.with_state(|s| match s.connections.get(&agent_id).and_then(|set| set.get(&connection_id)) {
            Some(token) => token.clone(),
            None => {
                let gone = CancellationToken::new();
                gone.cancel();
                gone
            }
        })
    }

    /// Adds an idle tunnel; it is removed again when agentk goes away (`closed`). A `reusable`
    /// tunnel (agentk's Descriptor) registers itself again after each exchange that ended cleanly.
    pub fn register(
        &self,
        agent_id: AgentId,
        connection_id: ConnectionId,
        methods: Vec<String>,
        io: TunnelIo,
        closed: ClosedSignal,
        reusable: bool,
    ) {
        let added = if reusable { Added::Reusable } else { Added::Once };
        self.add(agent_id, connection_id, methods.into(), io, closed, added);
    }

    /// A reused tunnel back from an exchange: kept only while its connection is still held here
    /// (after the connection went down, idle tunnels of it are not handed out again). Same id,
    /// and no new watcher: the one started at its first registration watches its stream.
    fn register_again(
        &self,
        agent_id: AgentId,
        connection_id: ConnectionId,
        methods: Arc<[String]>,
        io: TunnelIo,
        to_agent: ToAgent,
        id: u64,
    ) {
        self.enable_reuse(&io, agent_id, connection_id, &methods, to_agent, id);
        let tunnel = IdleTunnel { agent_id, connection_id, methods, io, id, since: tokio::time::Instant::now() };
        let _ = self.with_state(|s| {
            let held = s.connections.get(&tunnel.agent_id).is_some_and(|set| set.contains_key(&tunnel.connection_id));
            if held {
                s.offer(tunnel);
            } else {
                // Its connection went down meanwhile: dropping the tunnel ends it.
                s.released.push(tunnel);
            }
        });
    }

    fn enable_reuse(
        &self,
        io: &TunnelIo,
        agent_id: AgentId,
        connection_id: ConnectionId,
        methods: &Arc<[String]>,
        to_agent: ToAgent,
        id: u64,
    ) {
        io.enable_reuse(io::Reuse {
            registry: self.clone(),
            agent_id,
            connection_id,
            methods: methods.clone(),
            to_agent,
            response_credit: false,
            id,
        });
    }

    /// A new tunnel: registered, and watched until agentk goes away or it is done for good.
    fn add(
        &self,
        agent_id: AgentId,
        connection_id: ConnectionId,
        methods: Arc<[String]>,
        io: TunnelIo,
        closed: ClosedSignal,
        added: Added,
    ) {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        if added == Added::Reusable {
            self.enable_reuse(&io, agent_id, connection_id, &methods, closed.to_agent.clone(), id);
        }
        let tunnel = IdleTunnel { agent_id, connection_id, methods, io, id, since: tokio::time::Instant::now() };
        if self.with_state(|s| s.offer(tunnel)).is_err() {
            return; // shutting down: dropping the tunnel ends it
        }
        let registry = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            closed.closed().await;
            if let Some(inner) = registry.upgrade() {
                let _ = inner.with_state(|s| s.release_idle(agent_id, |t| t.id == id));
            }
        });
    }

    /// Waits for a tunnel matching the query. Cancel by dropping the future.
    pub async fn find(&self, query: TunnelQuery) -> Result<IdleTunnel, Stopped> {
        let parked = self.with_state(|s| match s.take_idle(&query) {
            Some(tunnel) => Ok(tunnel),
            None => {
                let (reply, rx) = oneshot::channel();
                let queue = s.waiters.entry(query.agent_id).or_default();
                queue.retain(|w| !w.reply.is_closed());
                queue.push_back(Waiter { query, reply });
                Err(rx)
            }
        })?;
        match parked {
            Ok(tunnel) => Ok(tunnel),
            Err(rx) => rx.await.map_err(|_| Stopped),
        }
    }

    /// An idle tunnel matching the query if there is one right now; never waits.
    pub async fn find_now(&self, query: TunnelQuery) -> Result<Option<IdleTunnel>, Stopped> {
        self.with_state(|s| s.take_idle(&query))
    }

    pub async fn stats(&self) -> Result<TunnelStats, Stopped> {
        self.with_state(|s| TunnelStats {
            connections: s.connections.values().map(HashMap::len).sum(),
            idle_tunnels: s.idle.values().map(Vec::len).sum(),
            waiting_requests: s.waiters.values().flatten().filter(|w| !w.reply.is_closed()).count(),
        })
    }
}

struct Waiter {
    query: TunnelQuery,
    reply: oneshot::Sender<IdleTunnel>,
}

#[derive(Default)]
struct State {
    /// Each held connection, with the token cancelled when it goes down.
    connections: HashMap<AgentId, HashMap<ConnectionId, CancellationToken>>,
    idle: HashMap<AgentId, Vec<IdleTunnel>>,
    waiters: HashMap<AgentId, VecDeque<Waiter>>,
    /// Tunnels let go under the lock, dropped once it is released (see `with_state`).
    released: Vec<IdleTunnel>,
}

impl State {
    /// Lets go of the agent's idle tunnels that match.
    fn release_idle(&mut self, agent_id: AgentId, matches: impl Fn(&IdleTunnel) -> bool) {
        if let Some(list) = self.idle.get_mut(&agent_id) {
            self.released.extend(list.extract_if(.., |t| matches(t)));
            if list.is_empty() {
                self.idle.remove(&agent_id);
            }
        }
    }

    /// Gives a new tunnel to the oldest matching live waiter, else keeps it idle.
    fn offer(&mut self, tunnel: IdleTunnel) {
        let agent = tunnel.agent_id;
        let mut tunnel = Some(tunnel);
        if let Some(queue) = self.waiters.get_mut(&agent) {
            queue.retain(|w| !w.reply.is_closed());
            while let Some(t) = tunnel.take() {
                let Some(waiter) = queue.iter().position(|w| t.serves(&w.query)).and_then(|pos| queue.remove(pos))
                else {
                    tunnel = Some(t);
                    break;
                };
                // A waiter that gave up between the check and the send hands the tunnel back.
                if let Err(back) = waiter.reply.send(t) {
                    tunnel = Some(back);
                }
            }
            if queue.is_empty() {
                self.waiters.remove(&agent);
            }
        }
        if let Some(t) = tunnel {
            self.idle.entry(agent).or_default().push(t);
        }
    }

    /// Removes and returns an idle tunnel serving the query, if any.
    fn take_idle(&mut self, query: &TunnelQuery) -> Option<IdleTunnel> {
        // Tunnels whose agentk went away are let go here too, not only by their watcher.
        self.release_idle(query.agent_id, |t| t.io.is_closed());
        let list = self.idle.get_mut(&query.agent_id)?;
        // Most recently registered first: older tunnels are likelier to be half-dead.
        let pos = list.iter().rposition(|t| t.serves(query))?;
        let tunnel = list.swap_remove(pos);
        if list.is_empty() {
            self.idle.remove(&query.agent_id);
        }
        Some(tunnel)
    }

    /// Closes the tunnels idle since before `cutoff`. A request never holds one of them: the
    /// registry hands tunnels out under the same lock.
    fn close_idle_before(&mut self, cutoff: tokio::time::Instant) {
        for list in self.idle.values_mut() {
            self.released.extend(list.extract_if(.., |t| t.since <= cutoff));
        }
        self.idle.retain(|_, list| !list.is_empty());
    }
}

/// Closes idle tunnels past the idle timeout; on `shutdown`, drops the whole state (every idle
/// tunnel ends and every parked request fails). Ends with the last handle.
async fn sweep(registry: Weak<Inner>, shutdown: CancellationToken, idle_timeout: Duration) {
    // A tunnel is closed between one and 1.25 idle timeouts after it became idle.
    let mut sweep = tokio::time::interval((idle_timeout / 4).max(Duration::from_millis(1)));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = sweep.tick() => {
                let Some(inner) = registry.upgrade() else { return };
                if let Some(cutoff) = tokio::time::Instant::now().checked_sub(idle_timeout) {
                    let _ = inner.with_state(|s| s.close_idle_before(cutoff));
                }
            }
        }
    }
    if let Some(inner) = registry.upgrade() {
        let state = inner.state.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(state);
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use kas_proto::tunnel::FrameOrder;
    use tokio::sync::mpsc;

    use super::*;

    fn tunnel() -> (TunnelIo, ClosedSignal, mpsc::Receiver<super::io::ToAgentItem>) {
        let (to_agent, from_kas) = mpsc::channel(1);
        let mut order = FrameOrder::new();
        order.response(kas_proto::tunnel::ResponseFrame::Descriptor).unwrap();
        let (io, closed) = TunnelIo::local(to_agent, futures::stream::pending().boxed(), order, true);
        (io, closed, from_kas)
    }

    /// A tunnel back from an exchange is kept only while its connection is held here: after
    /// the connection went down (a rolling restart), it is not handed out again.
    #[tokio::test]
    async fn a_reused_tunnel_of_a_connection_that_went_down_is_dropped() {
        let registry = TunnelRegistry::spawn(CancellationToken::new(), Duration::from_secs(60));
        let (agent, connection) = (AgentId(1), ConnectionId(7));
        assert!(registry.connection_up(agent, connection).await.unwrap());
        let (io, closed, _kept) = tunnel();
        registry.register_again(agent, connection, vec!["m".to_owned()].into(), io, closed.to_agent, 1);
        assert_eq!(registry.stats().await.unwrap().idle_tunnels, 1);
        registry.connection_down(agent, connection);
        assert_eq!(registry.stats().await.unwrap().idle_tunnels, 0, "the connection's idle tunnels end with it");
        let (io, closed, mut dropped) = tunnel();
        registry.register_again(agent, connection, vec!["m".to_owned()].into(), io, closed.to_agent, 2);
        assert_eq!(registry.stats().await.unwrap().idle_tunnels, 0);
        // Dropped, so the stream to agentk ends.
        assert!(dropped.recv().await.is_none());
    }
}
