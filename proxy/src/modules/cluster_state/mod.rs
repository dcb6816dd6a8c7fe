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
pub mod hub;
pub mod metrics;
pub mod push;
pub mod rest;
pub mod service;
pub mod store;

use kas_proto::cluster_state::cluster_state_agent_server::ClusterStateAgentServer;
use kas_proto::cluster_state::cluster_state_server::ClusterStateServer;

pub use config::ClusterStateConfig;
use hub::Scope;

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
