//! Real-time cluster state, kas's half (issue 17; agentk's half is agentk's
//! `modules::cluster_state`):
//! - [`push`]: the agentk replica holding the Lease `agentk-cluster-state-<agent id>` pushes
//!   compact views of the objects its informers cache, and their changes
//!   (`kas.cluster_state.v1.ClusterStateAgent/Push`, agent listener). The kas receiving the stream
//!   holds the agent's state ([`store`]) and says so in the registry
//!   ([`AgentRegistry::put_cluster_state_holder`]).
//! - [`service`] and [`rest`]: callers read summaries and object views, and watch changes
//!   (`kas.cluster_state.v1.ClusterState` on the api listener; `GET .../cluster_state`,
//!   `GET .../events` as Server-Sent Events), on any kas. A kas that does not hold the state asks
//!   the holder over the internal listener (the same service, answered from local state only):
//!   the views stay in the memory of one kas per agent, and a change costs nothing in Redis (see
//!   ARCHITECTURE.md).
//! - After agentk's stream ends the views stay for `cluster_state.retention`, marked
//!   `live: false` with the time kas last heard from agentk.

pub mod config;
pub mod metrics;
pub mod push;
pub mod rest;
pub mod service;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use kas_proto::AgentId;
use kas_proto::cluster_state::cluster_state_agent_server::ClusterStateAgentServer;
use kas_proto::cluster_state::cluster_state_client::ClusterStateClient;
use kas_proto::cluster_state::cluster_state_server::ClusterStateServer;
use kas_proto::kas::KasInstanceInfo;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub use config::ClusterStateConfig;
use store::{AgentState, ClusterStates};

use crate::error::KasError;
use crate::registry::AgentRegistry;
use crate::router::peers::Peers;

/// Push messages larger than this are refused (a listing is sent in chunks well below it).
pub const MAX_PUSH_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The feature's registration (see [`crate::modules::Module`]).
pub struct ClusterState;

impl super::Module for ClusterState {
    fn name(&self) -> &'static str {
        "cluster_state"
    }

    fn rest_routes(&self) -> utoipa_axum::router::OpenApiRouter<crate::server::rest::state::RestState> {
        rest::routes()
    }

    fn self_authenticated_rest_routes(
        &self,
    ) -> utoipa_axum::router::OpenApiRouter<crate::server::rest::state::RestState> {
        rest::streaming_routes()
    }

    fn grpc_services(&self, context: &super::ModuleContext, services: &mut super::GrpcServices) {
        let hub = context.cluster_state.clone();
        let push = push::PushService { auth: context.agent_auth.clone(), hub: hub.clone() };
        services
            .agent
            .add_service(ClusterStateAgentServer::new(push).max_decoding_message_size(MAX_PUSH_MESSAGE_BYTES));
        services.api.add_service(ClusterStateServer::new(service::ClusterStateService {
            hub: hub.clone(),
            scope: Scope::Routed,
        }));
        services.internal.add_service(
            ClusterStateServer::new(service::ClusterStateService { hub, scope: Scope::LocalOnly })
                // Snapshots of large clusters travel between kas.
                .max_encoding_message_size(usize::MAX)
                .max_decoding_message_size(usize::MAX),
        );
    }

    fn describe_metrics(&self) {
        metrics::describe();
    }
}

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
const HOLDER_REFRESH: Duration = Duration::from_secs(30);

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
    async fn claim(&self, agent_id: AgentId) {
        if let Err(e) = self.registry.put_cluster_state_holder(agent_id, self.config.retention).await {
            tracing::warn!(agent_id = %agent_id, error = %e, "could not record this kas as the holder of the agent's cluster state");
        }
    }

    fn is_self(&self, kas: &KasInstanceInfo) -> bool {
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
    fn peer_client(&self, kas: &KasInstanceInfo) -> Result<(ClusterStateClient<Channel>, String), KasError> {
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
    fn peer_request<T>(message: T, bearer: &str) -> tonic::Request<T> {
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
fn from_peer(kas: &KasInstanceInfo, status: &tonic::Status) -> KasError {
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
