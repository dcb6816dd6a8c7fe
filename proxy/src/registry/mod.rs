//! The agent registry: which agent connections exist, across all kas instances.
//!
//! One trait, two backends ([`MemoryRegistry`] for a single kas, [`RedisRegistry`] for many
//! replicas), one conformance suite (kas-e2e's `registry_conformance`) run against both.
//!
//! Each registry value belongs to one kas instance: it stamps the records it writes with the
//! instance's id and internal address, refreshes them, heartbeats the instance, and on shutdown
//! removes what it wrote. Readers only return records whose kas instance heartbeat is alive, so
//! a crashed kas stops receiving traffic within the heartbeat TTL, not the record TTL.
//!
//! The registry also carries what GitOps shares between kas: agentk's last sync report per
//! manifest project of an agent ([`AgentRegistry::put_gitops_sync`]), and push events
//! ([`AgentRegistry::publish_git_push`]) that every kas receives.

pub mod config;
pub mod memory;
pub mod redis;

use std::time::Duration;

use async_trait::async_trait;
use kas_proto::kas::{ConnectedAgentInfo, GitopsSync, KasInstanceInfo, git_push_event};
use kas_proto::{AgentId, ConnectionId, ProjectId};
use tokio::sync::broadcast;

pub use memory::{MemoryRegistry, MemoryStore};
pub use redis::RedisRegistry;

/// Buffered events per subscriber; a subscriber that lags re-scans (see the router).
pub const EVENT_BUFFER: usize = 1024;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct RegistryError(pub String);

/// Published when a connection is registered or unregistered (by any kas).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryEvent {
    Connected {
        agent_id: AgentId,
        connection_id: ConnectionId,
    },
    Disconnected {
        agent_id: AgentId,
        connection_id: ConnectionId,
    },
    /// Local only: this kas's records were rewritten after the backend came back (e.g. Redis
    /// restarted empty); events may have been lost meanwhile, so waiters look again.
    Resynced,
}

impl RegistryEvent {
    pub fn agent_id(&self) -> Option<AgentId> {
        match self {
            Self::Connected { agent_id, .. } | Self::Disconnected { agent_id, .. } => Some(*agent_id),
            Self::Resynced => None,
        }
    }
}

/// A push to a project, published by some kas ([`AgentRegistry::publish_git_push`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitPush {
    pub project: git_push_event::Project,
    /// When this kas received it: polls that share a Git read compare it with when the read
    /// started, so that a read begun before the push is not taken for its result.
    pub received_at: tokio::time::Instant,
}

/// Waits for a push that `concerns`, and takes the pushes queued with it (a burst makes one
/// wake-up). Returns when the newest of them arrived. A receiver that lagged missed pushes, which
/// may have concerned it: it returns as if pushed to now. Never returns once the registry is gone.
pub async fn next_git_push(
    pushes: &mut broadcast::Receiver<GitPush>,
    concerns: impl Fn(&GitPush) -> bool,
) -> tokio::time::Instant {
    use broadcast::error::{RecvError, TryRecvError};
    let mut newest = loop {
        match pushes.recv().await {
            Ok(push) if concerns(&push) => break push.received_at,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => break tokio::time::Instant::now(),
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    };
    loop {
        match pushes.try_recv() {
            Ok(push) if concerns(&push) => newest = newest.max(push.received_at),
            Ok(_) => {}
            Err(TryRecvError::Lagged(_)) => newest = tokio::time::Instant::now(),
            Err(TryRecvError::Empty | TryRecvError::Closed) => return newest,
        }
    }
}

/// One manifest project of an agent's configuration: its id as written and its ref as kas names
/// it (`""`, `branch:<name>`, `tag:<name>`, `commit:<id>`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ManifestProjectKey {
    pub project_id: String,
    pub git_ref: String,
}

/// What the registry holds of an agent's GitOps syncs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GitopsStatusRecord {
    /// The agent's manifest projects as configured when its last report arrived.
    pub configured: Vec<ManifestProjectKey>,
    /// The last report of each of those projects that reported (in no particular order).
    pub syncs: Vec<GitopsSync>,
}

impl GitopsStatusRecord {
    /// The stored report of one manifest project.
    pub fn sync(&self, key: &ManifestProjectKey) -> Option<&GitopsSync> {
        self.syncs.iter().find(|s| s.report.as_ref().is_some_and(|r| key.matches(r)))
    }
}

impl ManifestProjectKey {
    /// Whether `report` is about this project and ref.
    pub fn matches(&self, report: &kas_proto::gitops::SyncReport) -> bool {
        report.project_id == self.project_id && report.r#ref == self.git_ref
    }

    /// The key a report is stored under.
    pub fn of(report: &kas_proto::gitops::SyncReport) -> Self {
        Self { project_id: report.project_id.clone(), git_ref: report.r#ref.clone() }
    }

    /// The key of a stored sync (its report is required).
    pub fn of_sync(sync: &GitopsSync) -> Result<Self, RegistryError> {
        sync.report.as_ref().map(Self::of).ok_or_else(|| RegistryError("a sync without its report".into()))
    }
}

/// Lifetimes of what a registry writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistryTiming {
    /// Connection records live this long without a refresh.
    pub ttl: Duration,
    /// A kas instance counts as alive this long after its last heartbeat.
    pub heartbeat_ttl: Duration,
}

/// A record as stored: stamped with the kas instance holding the connection.
pub(crate) fn stamped(mut info: ConnectedAgentInfo, instance: &KasInstanceInfo) -> ConnectedAgentInfo {
    info.kas_instance_id.clone_from(&instance.instance_id);
    info.kas_address.clone_from(&instance.address);
    info
}

/// The key of a connection record.
pub fn record_key(info: &ConnectedAgentInfo) -> (AgentId, ProjectId, ConnectionId) {
    (AgentId(info.id), ProjectId(info.project_id), ConnectionId(info.connection_id))
}

#[async_trait]
pub trait AgentRegistry: Send + Sync + 'static {
    /// This kas instance (id, version, commit, internal address).
    fn instance(&self) -> &KasInstanceInfo;
    /// Records a connection held by this kas (agent and project indexes, same expiry). The
    /// record is stamped with this instance's id and internal address. If the write fails the
    /// record is still kept locally and written by the next refresh.
    async fn register(&self, info: ConnectedAgentInfo) -> Result<(), RegistryError>;
    /// Removes a connection this kas registered.
    async fn unregister(
        &self,
        agent_id: AgentId,
        project_id: ProjectId,
        connection_id: ConnectionId,
    ) -> Result<(), RegistryError>;
    /// Rewrites every record this kas owns with a new expiry (called periodically).
    async fn refresh(&self) -> Result<(), RegistryError>;
    /// Marks this kas instance alive for another heartbeat TTL (called periodically).
    async fn heartbeat(&self) -> Result<(), RegistryError>;
    /// Removes expired fields of keys this kas wrote (called periodically).
    async fn gc(&self) -> Result<(), RegistryError>;
    /// Live connections of an agent held by live kas instances.
    async fn connections_by_agent_id(&self, agent_id: AgentId) -> Result<Vec<ConnectedAgentInfo>, RegistryError>;
    /// Whether some kas held a connection of the agent within the record TTL: one is registered
    /// (even by a kas that died since), or one was unregistered less than a TTL ago. An agent
    /// that was never seen, or not for that long, is not merely reconnecting.
    async fn seen_recently(&self, agent_id: AgentId) -> Result<bool, RegistryError>;
    /// Live connections of the agents of a configuration project held by live kas instances.
    async fn connections_by_project_id(&self, project_id: ProjectId) -> Result<Vec<ConnectedAgentInfo>, RegistryError>;
    /// Connection events from every kas. Subscribe before looking up, so no event is missed.
    fn subscribe(&self) -> broadcast::Receiver<RegistryEvent>;
    /// Whether the backend answered its last operation (readiness).
    async fn ping(&self) -> Result<(), RegistryError>;
    /// Removes everything this kas wrote, including its heartbeat (graceful shutdown, last).
    async fn remove_all_owned(&self) -> Result<(), RegistryError>;
    /// Counts a new connection of an agent in the current fixed `window` and returns the counts
    /// of this window (including it) and of the previous one, across every kas sharing the store
    /// (the agent connection rate limit; see [`WindowCounts::sliding_estimate`]).
    async fn count_connection(&self, agent_id: AgentId, window: Duration) -> Result<WindowCounts, RegistryError>;
    /// Stores agentk's report of a GitOps sync (replacing the last one of the same manifest
    /// project and ref) with the agent's manifest projects as configured now; reports of projects
    /// no longer configured are dropped. Readable by every kas sharing the store until `ttl`
    /// after the agent's last report.
    async fn put_gitops_sync(
        &self,
        agent_id: AgentId,
        sync: GitopsSync,
        configured: &[ManifestProjectKey],
        ttl: Duration,
    ) -> Result<(), RegistryError>;
    /// What [`AgentRegistry::put_gitops_sync`] stored for the agent (empty when nothing, or
    /// nothing within its ttl).
    async fn gitops_status(&self, agent_id: AgentId) -> Result<GitopsStatusRecord, RegistryError>;
    /// Tells every kas sharing the store (this one included) that a project was pushed to.
    async fn publish_git_push(&self, project: git_push_event::Project) -> Result<(), RegistryError>;
    /// Push events from every kas. A receiver that lags has missed some: it should act as if
    /// every project had been pushed to.
    fn subscribe_git_pushes(&self) -> broadcast::Receiver<GitPush>;
    /// Says that this kas holds the agent's cluster state (agentk pushes its views here), until
    /// `ttl` unless said again; replaces what another kas said.
    async fn put_cluster_state_holder(&self, agent_id: AgentId, ttl: Duration) -> Result<(), RegistryError>;
    /// The kas that last said it holds the agent's cluster state, within its ttl.
    async fn cluster_state_holder(&self, agent_id: AgentId) -> Result<Option<KasInstanceInfo>, RegistryError>;
}

/// Sorts records the same way in every backend (agent id, then connection id).
pub(crate) fn sorted(mut v: Vec<ConnectedAgentInfo>) -> Vec<ConnectedAgentInfo> {
    v.sort_by_key(|i| (i.id, i.connection_id));
    v
}

/// Where "now" falls in fixed windows of length `window` (wall clock, so every kas agrees): the
/// window's index and how far into it we are (0.0 ..< 1.0).
pub(crate) fn window_position(window: Duration) -> (u64, f64) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let length = window.as_millis().max(1);
    let into = now.as_millis() % length;
    ((now.as_millis() / length) as u64, into as f64 / length as f64)
}

/// Connection counts of one agent: this fixed window (including the one just counted) and the
/// previous one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowCounts {
    pub current: u64,
    pub previous: u64,
    /// How far into the current window the count was taken (0.0 ..< 1.0).
    pub elapsed: f64,
}

impl WindowCounts {
    /// Connections in the sliding window that ends now: the current window's count plus the
    /// previous window's, weighted by how much of it the sliding window still covers (rounded
    /// up). Unlike a fixed window, a burst straddling a window boundary cannot pass twice the
    /// limit, and the outcome does not depend on where the boundary falls.
    pub fn sliding_estimate(&self) -> u64 {
        let carried = (self.previous as f64 * (1.0 - self.elapsed.clamp(0.0, 1.0))).ceil() as u64;
        self.current + carried
    }
}

/// A new random instance id.
pub fn new_instance_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kas_proto::kas::git_push_event::Project;
    use tokio::sync::broadcast;
    use tokio::time::Instant;

    use super::{GitPush, WindowCounts, next_git_push};

    fn push(id: i64, full_path: &str, received_at: Instant) -> GitPush {
        GitPush { project: Project { id, full_path: full_path.into() }, received_at }
    }

    fn manifests(push: &GitPush) -> bool {
        push.project.full_path == "group/manifests" || push.project.id == 7
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_pushes_is_one_wake_up_and_other_projects_wake_nothing() {
        let (tx, mut rx) = broadcast::channel(16);
        let t0 = Instant::now();
        tx.send(push(0, "group/other", t0)).unwrap();
        tx.send(push(0, "group/manifests", t0)).unwrap();
        tx.send(push(7, "group/renamed", t0 + Duration::from_millis(5))).unwrap();
        tx.send(push(0, "group/other", t0)).unwrap();
        // One wake-up for the queued ones, at the newest that concerns us.
        assert_eq!(next_git_push(&mut rx, manifests).await, t0 + Duration::from_millis(5));
        tx.send(push(0, "group/other", t0)).unwrap();
        let waiting = tokio::time::timeout(Duration::from_secs(1), next_git_push(&mut rx, manifests)).await;
        assert!(waiting.is_err(), "a push to another project woke it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_receiver_that_lagged_wakes_up() {
        let (tx, mut rx) = broadcast::channel(2);
        for _ in 0..5 {
            tx.send(push(0, "group/other", Instant::now())).unwrap();
        }
        let woke = tokio::time::timeout(Duration::from_secs(1), next_git_push(&mut rx, manifests)).await;
        assert!(woke.is_ok(), "missed pushes could have been this project's");
    }

    #[test]
    fn the_sliding_estimate_carries_the_previous_window_over_a_boundary() {
        let at = |current, previous, elapsed| WindowCounts { current, previous, elapsed }.sliding_estimate();
        // Just after a boundary, the previous window still counts in full: 2 + 1 is over 2.
        assert_eq!(at(1, 2, 0.0001), 3);
        // Halfway, half of it (rounded up).
        assert_eq!(at(1, 3, 0.5), 3);
        // Without a previous window, only the current one.
        assert_eq!(at(2, 0, 0.9), 2);
        assert_eq!(at(0, 0, 0.0), 0);
    }
}
