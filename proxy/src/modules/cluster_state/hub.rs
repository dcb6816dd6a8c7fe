//! The feature's shared state ([`ClusterStateHub`]): the agents' states this kas holds, where an
//! agent's state is (here, or the kas the registry names), and the clients of peers' internal
//! `ClusterState` service. Kept apart from `mod.rs` (which registers routes that depend on the REST
//! gateway's state, which holds this hub), so that nothing imports in a circle.

use std::sync::Arc;
use std::time::Duration;

use kas_proto::AgentId;
use kas_proto::cluster_state::cluster_state_client::ClusterStateClient;
use kas_proto::kas::KasInstanceInfo;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::config::ClusterStateConfig;
use super::store::{AgentState, ClusterStates};
use crate::error::KasError;
use crate::registry::AgentRegistry;
use crate::router::peers::Peers;

/// Where a read is answered: the api listener and the REST gateway find the kas holding the
/// state; the internal listener answers from its own (no discovery, no loops).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Routed,
    LocalOnly,
}

/// Where an agent's state is.
pub enum Location {
    Local(Arc<AgentState>),
    Peer(KasInstanceInfo),
}

/// The feature's state, shared by its services and routes.
pub struct ClusterStateHub {
    pub config: ClusterStateConfig,
    pub states: ClusterStates,
    pub registry: Arc<dyn AgentRegistry>,
    pub peers: Arc<Peers>,
    pub shutdown: CancellationToken,
}

/// How often a kas holding live state says so again in the registry (the record outlives a
/// Redis restart by at most this).
pub(super) const HOLDER_REFRESH: Duration = Duration::from_secs(30);

fn not_found(agent_id: AgentId) -> KasError {
    KasError::NotFound(format!(
        "no cluster state for agent {agent_id}: agentk has not pushed any (is it connected, and does its \
         configuration list cluster_state.resources?), or its stream ended more than cluster_state.retention ago"
    ))
}

impl ClusterStateHub {
    pub fn new(
        config: ClusterStateConfig,
        registry: Arc<dyn AgentRegistry>,
        peers: Arc<Peers>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let hub = Arc::new(Self { states: ClusterStates::new(config.retention), config, registry, peers, shutdown });
        tokio::spawn(reclaim_after_resync(Arc::downgrade(&hub)));
        hub
    }

    /// Says in the registry that this kas holds the agent's state (best effort: a failure is
    /// retried at the next refresh, and readers on this kas still find the state).
    pub(super) async fn claim(&self, agent_id: AgentId) {
        if let Err(e) = self.registry.put_cluster_state_holder(agent_id, self.config.retention).await {
            tracing::warn!(agent_id = %agent_id, error = %e, "could not record this kas as the holder of the agent's cluster state");
        }
    }

    pub(super) fn is_self(&self, kas: &KasInstanceInfo) -> bool {
        kas.instance_id == self.registry.instance().instance_id
    }

    /// Where the agent's state is: this kas's own when the registry names it or names nobody (or
    /// cannot be read); else the kas the registry names.
    pub async fn locate(&self, agent_id: AgentId, scope: Scope) -> Result<Location, KasError> {
        let local = self.states.get(agent_id);
        if scope == Scope::LocalOnly {
            return local.map(Location::Local).ok_or_else(|| not_found(agent_id));
        }
        let holder = match self.registry.cluster_state_holder(agent_id).await {
            Ok(holder) => holder,
            Err(e) => {
                tracing::debug!(agent_id = %agent_id, error = %e, "registry lookup of the cluster state holder failed");
                return local.map(Location::Local).ok_or(KasError::Registry(e.0));
            }
        };
        match (holder, local) {
            (Some(kas), _) if !self.is_self(&kas) => Ok(Location::Peer(kas)),
            (_, Some(state)) => Ok(Location::Local(state)),
            (_, None) => Err(not_found(agent_id)),
        }
    }

    /// A client of the holder's internal `ClusterState` service.
    pub(super) fn peer_client(&self, kas: &KasInstanceInfo) -> Result<(ClusterStateClient<Channel>, String), KasError> {
        let address = kas.address.as_ref().ok_or_else(|| {
            KasError::Internal(format!("kas {} has no internal address in the registry", kas.instance_id))
        })?;
        let (channel, bearer) = self.peers.internal_channel(address).map_err(|e| {
            KasError::PeerUnavailable(format!(
                "kas {} holding the cluster state is unreachable: {e:?}",
                kas.instance_id
            ))
        })?;
        Ok((
            ClusterStateClient::new(channel)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
            bearer,
        ))
    }

    /// A request to a peer's internal service.
    pub(super) fn peer_request<T>(message: T, bearer: &str) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Ok(v) = bearer.parse() {
            request.metadata_mut().insert(kas_proto::metadata::AUTHORIZATION, v);
        }
        request
    }
}

/// Redis came back (possibly empty: restarted without persistence, failed over): the registry
/// rewrote its connection records; this says again which live states this kas holds, so that
/// other kas find them at once rather than at the next refresh (up to 30 s of 404s).
async fn reclaim_after_resync(hub: std::sync::Weak<ClusterStateHub>) {
    let (mut events, shutdown) = match hub.upgrade() {
        Some(h) => (h.registry.subscribe(), h.shutdown.clone()),
        None => return,
    };
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            event = events.recv() => event,
        };
        let resynced = match event {
            Ok(crate::registry::RegistryEvent::Resynced) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                true
            }
            Ok(_) => false,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        if !resynced {
            continue;
        }
        let Some(hub) = hub.upgrade() else { return };
        for agent_id in hub.states.live_agents() {
            hub.claim(agent_id).await;
        }
    }
}

/// An error a peer kas answered, as this kas's own.
pub(super) fn from_peer(kas: &KasInstanceInfo, status: &tonic::Status) -> KasError {
    match status.code() {
        tonic::Code::NotFound => KasError::NotFound(status.message().to_owned()),
        tonic::Code::InvalidArgument => KasError::InvalidArgument(status.message().to_owned()),
        _ => KasError::PeerUnavailable(format!(
            "kas {} holding the cluster state did not answer: {}",
            kas.instance_id,
            status.message()
        )),
    }
}
