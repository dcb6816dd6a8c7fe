//! The agent registry: which agent connections exist, across all kas instances.
//!
//! One trait, backends behind it (in-memory now; Redis for many replicas), one conformance suite
//! ([`conformance`]) run against every backend.

pub mod conformance;
pub mod memory;

use async_trait::async_trait;
use kas_proto::kas::ConnectedAgentInfo;
use kas_proto::{AgentId, ConnectionId, ProjectId};
use tokio::sync::broadcast;

pub use memory::MemoryRegistry;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct RegistryError(pub String);

/// Published when a connection is registered or unregistered (by any kas).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryEvent {
    Connected { agent_id: AgentId, connection_id: ConnectionId },
    Disconnected { agent_id: AgentId, connection_id: ConnectionId },
}

impl RegistryEvent {
    pub fn agent_id(&self) -> AgentId {
        match self {
            Self::Connected { agent_id, .. } | Self::Disconnected { agent_id, .. } => *agent_id,
        }
    }
}

/// The key of a connection record.
pub fn record_key(info: &ConnectedAgentInfo) -> (AgentId, ProjectId, ConnectionId) {
    (AgentId(info.id), ProjectId(info.project_id), ConnectionId(info.connection_id))
}

#[async_trait]
pub trait AgentRegistry: Send + Sync + 'static {
    /// Records a connection held by this kas (agent and project indexes, same expiry).
    async fn register(&self, info: ConnectedAgentInfo) -> Result<(), RegistryError>;
    /// Removes a connection this kas registered.
    async fn unregister(
        &self,
        agent_id: AgentId,
        project_id: ProjectId,
        connection_id: ConnectionId,
    ) -> Result<(), RegistryError>;
    /// Extends the expiry of every record this kas wrote (called periodically).
    async fn refresh(&self) -> Result<(), RegistryError>;
    /// Removes stale records this kas owns (called periodically).
    async fn gc(&self) -> Result<(), RegistryError>;
    /// Live connections of an agent, from every kas.
    async fn connections_by_agent_id(&self, agent_id: AgentId) -> Result<Vec<ConnectedAgentInfo>, RegistryError>;
    /// Live connections of every agent of a configuration project, from every kas.
    async fn connections_by_project_id(&self, project_id: ProjectId) -> Result<Vec<ConnectedAgentInfo>, RegistryError>;
    /// Connection events from every kas. Subscribe before looking up, so no event is missed.
    fn subscribe(&self) -> broadcast::Receiver<RegistryEvent>;
    /// Removes everything this kas wrote (graceful shutdown, last step).
    async fn remove_all_owned(&self) -> Result<(), RegistryError>;
}
