//! The router: the one path every agent-bound call takes.
//!
//! For an external call it finds a tunnel for (agent, connection, method):
//! 1. an idle tunnel on this kas, at once;
//! 2. else a connection held by another live kas (from the registry), forwarded over
//!    `KasInternal.ForwardTunnel` — trying the next connection when a peer answers "not here"
//!    or is gone;
//! 3. else it waits: subscribed to registry events *before* scanning again (so no wake-up is lost),
//!    parked in the local tunnel registry, until the agent connects here or anywhere, the caller
//!    gives up, or the deadline passes; then it says plainly whether the agent is not connected
//!    or just busy.
//!
//! The gateway kas (serving `KasInternal`) only uses [`Router::route_local`]: no discovery, so
//! requests cannot loop between kas instances. Only the routing kas retries.

pub mod config;
pub mod peers;

use std::sync::Arc;
use std::time::Duration;

use kas_proto::kas::ConnectedAgentInfo;
use kas_proto::{AgentId, ConnectionId};
use rand::seq::SliceRandom;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::error::KasError;
use crate::metrics::RouteOutcome;
use crate::registry::{AgentRegistry, RegistryEvent};
use crate::tunnel::{TunnelIo, TunnelQuery, TunnelRegistry};
use peers::{Kept, PeerError, Peers};

/// How long a request waits for an agent when the caller sets no shorter deadline: long enough
/// to ride out an agentk restart, short enough that a caller is not left hanging.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(20);
/// Enough for busy installations; a bound so that a flood cannot exhaust kas.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 10_000;
/// agentk opens at most 500 tunnels by default; more requests than that only wait.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS_PER_AGENT: usize = 500;
/// How much earlier than the caller's deadline the wait ends (at most 10% of the deadline): the
/// answer must still reach the caller before its own timer fires. 50 ms was too little on a
/// loaded 2-core CI machine (the caller's tonic timer won, and it saw a bare CANCELLED).
const DEADLINE_MARGIN: Duration = Duration::from_millis(250);
/// Waiting requests are woken by pub-sub events (and by the registry's `Resynced` after Redis
/// comes back); this slow re-scan only covers an event lost otherwise.
const RESCAN_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Router {
    tunnels: TunnelRegistry,
    registry: Arc<dyn AgentRegistry>,
    peers: Arc<Peers>,
    max_wait: Duration,
    limits: Arc<Limits>,
    locations: Arc<PeerLocations>,
}

/// How long the first routing attempt trusts what the registry said about where an agent's
/// connections are.
const PEER_LOCATIONS_TTL: Duration = Duration::from_secs(1);
/// More agents than this in the cache: it starts over (a bound, not a tuning knob).
const PEER_LOCATIONS_MAX: usize = 100_000;

/// Where other kas hold an agent's connections, as the registry said less than
/// [`PEER_LOCATIONS_TTL`] ago: a request's first routing attempt reads this instead of asking
/// the registry (a Redis round trip per request through a second kas). A stale entry costs at
/// most a `NotHere` answer: any failed forward drops the agent's entry and the registry is asked
/// again; waiting requests always ask the registry; an agent with no connections is not cached.
/// Locked only for a lookup or an update, never across an await.
#[derive(Default)]
struct PeerLocations {
    entries: std::sync::Mutex<foldhash::HashMap<AgentId, Located>>,
}

/// When the registry was asked, and what it said.
type Located = (Instant, Arc<[ConnectedAgentInfo]>);

impl PeerLocations {
    fn get(&self, agent_id: AgentId) -> Option<Arc<[ConnectedAgentInfo]>> {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.get(&agent_id).filter(|(at, _)| at.elapsed() < PEER_LOCATIONS_TTL).map(|(_, c)| c.clone())
    }

    fn put(&self, agent_id: AgentId, connections: Arc<[ConnectedAgentInfo]>) {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= PEER_LOCATIONS_MAX {
            entries.clear();
        }
        entries.insert(agent_id, (Instant::now(), connections));
    }

    fn forget(&self, agent_id: AgentId) {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&agent_id);
    }
}

/// Concurrency limits: per kas and per agent. Permits are taken before routing (waiting
/// requests count) and held by the tunnel until the exchange ends.
struct Limits {
    kas: Arc<tokio::sync::Semaphore>,
    kas_max: usize,
    per_agent: usize,
    /// Agent -> its semaphore. Locked only for a lookup, never across an await; entries of
    /// agents with nothing in flight are pruned when the map grows.
    agents: std::sync::Mutex<foldhash::HashMap<AgentId, Arc<tokio::sync::Semaphore>>>,
}

/// Pruning of idle per-agent entries starts above this many agents.
const AGENT_LIMITS_PRUNE_AT: usize = 10_000;

impl Limits {
    fn new(kas_max: usize, per_agent: usize) -> Self {
        Self {
            kas: Arc::new(tokio::sync::Semaphore::new(kas_max)),
            kas_max,
            per_agent,
            agents: std::sync::Mutex::default(),
        }
    }

    fn acquire(&self, agent_id: AgentId) -> Result<Vec<tokio::sync::OwnedSemaphorePermit>, KasError> {
        let agent = {
            let mut agents = self.agents.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if agents.len() > AGENT_LIMITS_PRUNE_AT {
                let per_agent = self.per_agent;
                agents.retain(|_, s| s.available_permits() < per_agent);
            }
            agents.entry(agent_id).or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(self.per_agent))).clone()
        };
        let kas = self.kas.clone().try_acquire_owned().map_err(|_| {
            KasError::ResourceExhausted(format!(
                "kas is at its limit of {} concurrent requests (routing.max_concurrent_requests)",
                self.kas_max
            ))
        })?;
        let agent = agent.try_acquire_owned().map_err(|_| {
            KasError::ResourceExhausted(format!(
                "agent {agent_id} is at its limit of {} concurrent requests on this kas \
                 (routing.max_concurrent_requests_per_agent)",
                self.per_agent
            ))
        })?;
        Ok(vec![kas, agent])
    }
}

/// Routes a request again after its kept forwarded stream failed before the response (see
/// `tunnel::Reroute`): as the first time, within the request's deadline, on fresh streams only.
struct RouteAgain {
    router: Router,
    target: Target,
    deadline: Instant,
    /// The peer whose kept stream failed.
    peer: Arc<str>,
}

#[async_trait::async_trait]
impl crate::tunnel::Reroute for RouteAgain {
    async fn reroute(&self, failed: &tonic::Status) -> Result<TunnelIo, KasError> {
        self.router.peers.stream_failed(&self.peer, failed);
        self.router.locations.forget(self.target.agent_id);
        let started = Instant::now();
        let wait = self.deadline.saturating_duration_since(started);
        self.router.route_inner(&self.target, Some(wait), started, Kept::Refused).await.map(|(io, _)| io)
    }
}

/// Where the routing kas looks for an agent's connections on other kas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    /// What the registry said a moment ago, if anything.
    Cached,
    /// The registry itself.
    Fresh,
}

/// Where a call must go.
#[derive(Debug, Clone)]
pub struct Target {
    pub agent_id: AgentId,
    pub connection_id: ConnectionId,
    pub method: String,
    /// Wait for the agent only if some kas saw it within the registry TTL (it is probably
    /// reconnecting); otherwise fail at once with [`KasError::AgentNotSeen`].
    pub wait_only_if_seen: bool,
}

impl Target {
    pub fn new(agent_id: AgentId, connection_id: ConnectionId, method: &str) -> Self {
        Self { agent_id, connection_id, method: method.to_owned(), wait_only_if_seen: false }
    }

    /// See [`Target::wait_only_if_seen`].
    #[must_use]
    pub fn waiting_only_if_seen(mut self) -> Self {
        self.wait_only_if_seen = true;
        self
    }

    pub fn validate(&self) -> Result<(), KasError> {
        // Callers validate at their boundary; this keeps a target built from unchecked values
        // (GetPods messages carry raw ids) to the same rules.
        AgentId::from_wire("agent_id", self.agent_id.0)?;
        ConnectionId::from_wire_or_any("connection_id", self.connection_id.0)?;
        Ok(())
    }

    fn query(&self) -> TunnelQuery {
        TunnelQuery { agent_id: self.agent_id, connection_id: self.connection_id, method: self.method.clone() }
    }
}

impl Router {
    pub fn new(
        tunnels: TunnelRegistry,
        registry: Arc<dyn AgentRegistry>,
        peers: Arc<Peers>,
        max_wait: Duration,
    ) -> Self {
        let limits = Arc::new(Limits::new(DEFAULT_MAX_CONCURRENT_REQUESTS, DEFAULT_MAX_CONCURRENT_REQUESTS_PER_AGENT));
        Self { tunnels, registry, peers, max_wait, limits, locations: Arc::default() }
    }

    /// Sets the concurrency limits (per kas, per agent).
    pub fn with_limits(mut self, max_concurrent: usize, max_concurrent_per_agent: usize) -> Self {
        self.limits = Arc::new(Limits::new(max_concurrent.max(1), max_concurrent_per_agent.max(1)));
        self
    }

    /// How long to wait, and whether the caller's deadline (not ours) is the limit.
    fn wait_for(&self, caller_deadline: Option<Duration>) -> (Duration, bool) {
        match caller_deadline {
            // End a little early: tonic's server and the caller's tonic channel enforce
            // grpc-timeout too, and when either fires first the caller gets a bare CANCELLED
            // instead of this router's explanation.
            Some(d) if d < self.max_wait => (d.saturating_sub(DEADLINE_MARGIN.min(d / 10)), true),
            _ => (self.max_wait, false),
        }
    }

    /// Finds a tunnel for an external call (GitLab, REST): local, via a peer, or after waiting.
    pub async fn route(&self, target: &Target, caller_deadline: Option<Duration>) -> Result<TunnelIo, KasError> {
        let started = Instant::now();
        let result = match self.limits.acquire(target.agent_id) {
            Ok(permits) => {
                self.route_inner(target, caller_deadline, started, Kept::Allowed).await.map(|(io, outcome)| {
                    io.hold(permits);
                    (io, outcome)
                })
            }
            Err(e) => Err(e),
        };
        let outcome = match &result {
            Ok((_, kind)) => *kind,
            Err(
                KasError::AgentNotConnected { .. }
                | KasError::AgentNotSeen { .. }
                | KasError::ConnectionNotConnected { .. }
                | KasError::AgentBusy { .. }
                | KasError::DeadlineExceeded { .. },
            ) => RouteOutcome::TimedOut,
            Err(_) => RouteOutcome::Failed,
        };
        crate::metrics::routed(&target.method, outcome, started.elapsed());
        result.map(|(io, _)| io)
    }

    async fn route_inner(
        &self,
        target: &Target,
        caller_deadline: Option<Duration>,
        started: Instant,
        kept: Kept,
    ) -> Result<(TunnelIo, RouteOutcome), KasError> {
        target.validate()?;
        // The common case first, before subscribing to anything (subscribing was ~5 % of kas's
        // CPU per proxied request): an idle tunnel here. One that registers after this look is
        // found by the wait below, which looks again.
        if let Some(t) = self.tunnels.find_now(target.query()).await.map_err(|_| KasError::ShuttingDown)? {
            return Ok(self.routed(target, t.io, RouteOutcome::Local, started));
        }
        let (wait, caller_bound) = self.wait_for(caller_deadline);
        let deadline = started + wait;
        // Then a peer, as the registry said a moment ago: the common case through a second kas,
        // again before subscribing to anything.
        if let Some(io) = self.try_peers(target, deadline, Lookup::Cached, kept).await? {
            return Ok(self.routed(target, io, RouteOutcome::Peer, started));
        }
        // Nothing took it: the request waits. Subscribe, then scan the registry again: a
        // connection that appeared after the scan above, or appears after this one, is not missed.
        let mut events = self.registry.subscribe();
        // A peer coming back up may hold the agent's only other connection.
        let mut peer_up = self.peers.watch_up();
        if let Some(io) = self.try_peers(target, deadline, Lookup::Fresh, kept).await? {
            return Ok(self.routed(target, io, RouteOutcome::Peer, started));
        }
        if target.wait_only_if_seen && !self.seen_recently(target.agent_id).await {
            return Err(KasError::AgentNotSeen { agent_id: target.agent_id });
        }
        let local = self.tunnels.find(target.query());
        tokio::pin!(local);
        let mut rescan_at = Instant::now() + RESCAN_INTERVAL;
        loop {
            let rescan = tokio::select! {
                biased;
                t = &mut local => {
                    let t = t.map_err(|_| KasError::ShuttingDown)?;
                    return Ok(self.routed(target, t.io, RouteOutcome::Waited, started));
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(self.explain_timeout(target, started.elapsed(), caller_bound).await);
                }
                ev = events.recv() => match ev {
                    Ok(RegistryEvent::Connected { agent_id, .. }) => agent_id == target.agent_id,
                    Ok(RegistryEvent::Disconnected { .. }) => false,
                    // The registry came back (e.g. Redis restarted): records may be back too.
                    Ok(RegistryEvent::Resynced) => true,
                    // Missed events: look again rather than miss the one that mattered.
                    Err(RecvError::Lagged(_)) => true,
                    Err(RecvError::Closed) => false,
                },
                Ok(()) = peer_up.changed() => true,
                () = tokio::time::sleep_until(rescan_at) => {
                    rescan_at = Instant::now() + RESCAN_INTERVAL;
                    true
                }
            };
            if rescan && let Some(io) = self.try_peers(target, deadline, Lookup::Fresh, kept).await? {
                return Ok(self.routed(target, io, RouteOutcome::Waited, started));
            }
        }
    }

    fn routed(
        &self,
        target: &Target,
        io: TunnelIo,
        outcome: RouteOutcome,
        started: Instant,
    ) -> (TunnelIo, RouteOutcome) {
        tracing::debug!(agent_id = %target.agent_id, method = %target.method, ?outcome, waited = ?started.elapsed(), "routed");
        (io, outcome)
    }

    /// Whether the registry says the agent was seen recently; when it cannot say (Redis down),
    /// the agent gets the benefit of the doubt and the caller waits as usual.
    async fn seen_recently(&self, agent_id: AgentId) -> bool {
        self.registry.seen_recently(agent_id).await.unwrap_or_else(|e| {
            tracing::debug!(agent_id = %agent_id, error = %e, "registry lookup failed; waiting for the agent");
            true
        })
    }

    /// Where the registry says the agent's connections are (every kas's, this one's included),
    /// and whether that came from [`PeerLocations`].
    async fn agent_connections(&self, target: &Target, lookup: Lookup) -> (Arc<[ConnectedAgentInfo]>, bool) {
        if lookup == Lookup::Cached
            && let Some(all) = self.locations.get(target.agent_id)
        {
            return (all, true);
        }
        let all = match self.registry.connections_by_agent_id(target.agent_id).await {
            Ok(all) => {
                let all: Arc<[ConnectedAgentInfo]> = all.into();
                if all.is_empty() {
                    self.locations.forget(target.agent_id);
                } else {
                    self.locations.put(target.agent_id, all.clone());
                }
                all
            }
            Err(e) => {
                // Redis down: local routing still works; remote agents are unreachable for now.
                tracing::warn!(agent_id = %target.agent_id, error = %e, "registry lookup failed");
                Arc::from(Vec::new())
            }
        };
        (all, false)
    }

    /// Tries each peer holding a connection of the agent; `None` if none could take it. When the
    /// candidates came from the cache and none took it, the registry is asked once more.
    async fn try_peers(
        &self,
        target: &Target,
        deadline: Instant,
        lookup: Lookup,
        kept: Kept,
    ) -> Result<Option<TunnelIo>, KasError> {
        let (all, from_cache) = self.agent_connections(target, lookup).await;
        if let Some(io) = self.try_candidates(target, deadline, &all, kept).await? {
            return Ok(Some(io));
        }
        if !from_cache {
            return Ok(None);
        }
        self.locations.forget(target.agent_id);
        let (all, _) = self.agent_connections(target, Lookup::Fresh).await;
        self.try_candidates(target, deadline, &all, kept).await
    }

    /// Tries the connections of `all` that other live kas instances hold (and that the target
    /// names), in random order: spreads load across replicas.
    async fn try_candidates(
        &self,
        target: &Target,
        deadline: Instant,
        all: &[ConnectedAgentInfo],
        kept: Kept,
    ) -> Result<Option<TunnelIo>, KasError> {
        let own = &self.registry.instance().instance_id;
        // Borrowed, not cloned: a record is seven strings, and this runs for every request
        // through a second kas.
        let mut candidates: Vec<&ConnectedAgentInfo> = all
            .iter()
            .filter(|c| &c.kas_instance_id != own)
            .filter(|c| target.connection_id.is_any() || c.connection_id == target.connection_id.0)
            .collect();
        candidates.shuffle(&mut rand::rng());
        for candidate in candidates {
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                break;
            }
            let opened = match peers::peer_address(candidate) {
                Some(peer) => self.peers.open(candidate, &peer, &target.method, wait, kept).await.map(|io| (io, peer)),
                None => Err(PeerError::Unavailable("connection record without a kas address".into())),
            };
            match opened {
                Ok((io, peer)) => {
                    if io.is_kept() {
                        io.enable_replay(Box::new(RouteAgain {
                            router: self.clone(),
                            target: target.clone(),
                            deadline,
                            peer,
                        }));
                    }
                    return Ok(Some(io));
                }
                Err(PeerError::NotHere) => {
                    self.locations.forget(target.agent_id);
                    crate::metrics::peer_error("not_here");
                    tracing::debug!(agent_id = %target.agent_id, connection_id = candidate.connection_id, "peer does not hold the connection");
                }
                Err(PeerError::Down) => {
                    self.locations.forget(target.agent_id);
                    // Logged once per state change by `Peers`; the next connection is tried.
                    crate::metrics::peer_error("down");
                    tracing::debug!(agent_id = %target.agent_id, kas = %candidate.kas_instance_id, "peer kas down; skipped");
                }
                Err(PeerError::Unavailable(e)) => {
                    self.locations.forget(target.agent_id);
                    crate::metrics::peer_error("unavailable");
                    tracing::warn!(agent_id = %target.agent_id, kas = %candidate.kas_instance_id, error = %e, "peer kas unavailable");
                }
                Err(PeerError::Failed(e)) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Finds a tunnel of a connection this kas must hold itself (KasInternal: no discovery).
    pub async fn route_local(&self, target: &Target, caller_deadline: Option<Duration>) -> Result<TunnelIo, KasError> {
        target.validate()?;
        if target.connection_id.is_any() {
            return Err(KasError::InvalidArgument("connection_id is required on the internal API".into()));
        }
        let here = self
            .tunnels
            .has_connection(target.agent_id, target.connection_id)
            .await
            .map_err(|_| KasError::ShuttingDown)?;
        if !here {
            return Err(KasError::NotHere { agent_id: target.agent_id, connection_id: target.connection_id });
        }
        // An idle tunnel at once is the common case: no timer for it.
        if let Some(t) = self.tunnels.find_now(target.query()).await.map_err(|_| KasError::ShuttingDown)? {
            return Ok(t.io);
        }
        let started = Instant::now();
        let (wait, caller_bound) = self.wait_for(caller_deadline);
        match tokio::time::timeout(wait, self.tunnels.find(target.query())).await {
            Ok(Ok(t)) => Ok(t.io),
            Ok(Err(_)) => Err(KasError::ShuttingDown),
            Err(_) => Err(self.explain_timeout(target, started.elapsed(), caller_bound).await),
        }
    }

    /// Cancelled when this kas no longer holds the target's connection (see
    /// [`TunnelRegistry::connection_gone`]).
    pub async fn connection_gone(&self, target: &Target) -> Result<tokio_util::sync::CancellationToken, KasError> {
        self.tunnels.connection_gone(target.agent_id, target.connection_id).await.map_err(|_| KasError::ShuttingDown)
    }

    async fn explain_timeout(&self, target: &Target, waited: Duration, caller_bound: bool) -> KasError {
        if caller_bound {
            return KasError::DeadlineExceeded { agent_id: target.agent_id, waited };
        }
        let connected = match self.registry.connections_by_agent_id(target.agent_id).await {
            Ok(conns) => {
                conns.iter().any(|c| target.connection_id.is_any() || c.connection_id == target.connection_id.0)
            }
            Err(e) => {
                tracing::warn!(agent_id = %target.agent_id, error = %e, "registry lookup failed after waiting");
                false
            }
        };
        match (connected, target.connection_id.is_any()) {
            (true, _) => KasError::AgentBusy { agent_id: target.agent_id, waited },
            (false, true) => KasError::AgentNotConnected { agent_id: target.agent_id, waited },
            (false, false) => KasError::ConnectionNotConnected {
                agent_id: target.agent_id,
                connection_id: target.connection_id,
                waited,
            },
        }
    }

    pub fn registry(&self) -> &Arc<dyn AgentRegistry> {
        &self.registry
    }
}
