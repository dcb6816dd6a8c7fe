//! Features. Each is a folder here with a kas half, and (when it reaches into the cluster) an
//! agentk half under the same name in `agentk/src/modules/`. A feature owns its routes, their
//! OpenAPI description, its gRPC services, its metrics and its configuration section; kas
//! registers every feature in [`all`], and the listeners serve what the features hand them.
//!
//! The specification's own services (`KasApi`, `KasInternal`, `AgentTunnel` in `server/`) keep
//! their method sets, plus the marked additions GitLab calls on `KasApi` (the Kubernetes API
//! proxy, GitOps status and push events); each of their methods is a one-line call into the
//! feature that implements it. A new feature adds its own gRPC service instead
//! ([`Module::grpc_services`]).

pub mod cluster_state;
pub mod configuration;
pub mod connected_agents;
pub mod get_pods;
pub mod gitops;
pub mod kubernetes_api;

use utoipa_axum::router::OpenApiRouter;

use crate::server::rest::state::RestState;

/// What a feature adds to kas's listeners. Every method has a default: a feature implements
/// only what it serves.
pub trait Module: Send + Sync {
    /// The feature's name (its folder, and its agentk half's name).
    fn name(&self) -> &'static str;

    /// Routes on the rest listener that answer within `rest.request_timeout` (JSON), with their
    /// OpenAPI operations. They run behind the listener's authentication and body limit.
    fn rest_routes(&self) -> OpenApiRouter<RestState> {
        OpenApiRouter::new()
    }

    /// Routes on the rest listener that stream (no request timeout, no listener body limit: the
    /// feature bounds bodies itself), with their OpenAPI operations. Behind authentication.
    fn streaming_rest_routes(&self) -> OpenApiRouter<RestState> {
        OpenApiRouter::new()
    }

    /// Streaming routes that authenticate callers themselves instead of the listener's JWT
    /// check (the Kubernetes API proxy: CI job and user tokens too, and its errors, even a bad
    /// credential, are Kubernetes `Status` objects). They must refuse unauthenticated calls.
    fn self_authenticated_rest_routes(&self) -> OpenApiRouter<RestState> {
        OpenApiRouter::new()
    }

    /// gRPC services the feature adds to the agent, api and internal listeners.
    fn grpc_services(&self, _context: &ModuleContext, _services: &mut GrpcServices) {}

    /// Describes the feature's metrics (names, help, units) once at startup.
    fn describe_metrics(&self) {}
}

/// What kas hands a feature when it builds its services.
#[derive(Clone)]
pub struct ModuleContext {
    /// The one router of agent-bound calls (local tunnel, peer kas, or wait).
    pub router: crate::router::Router,
    /// Authenticates agentk on the agent listener (tokens, failed attempts bounded per peer).
    pub agent_auth: std::sync::Arc<crate::auth::agent_auth::AgentAuthenticator>,
    /// Agents' current configuration documents.
    pub configurations: std::sync::Arc<dyn configuration::ConfigurationSource>,
    /// GitOps's state, shared with `KasApi` and the REST gateway.
    pub gitops: std::sync::Arc<gitops::state::GitopsState>,
    /// The cluster state agents push, shared with the REST gateway.
    pub cluster_state: std::sync::Arc<cluster_state::hub::ClusterStateHub>,
    /// kas is shutting down: long-lived streams end (agentk reconnects to another kas).
    pub shutdown: tokio_util::sync::CancellationToken,
}

/// gRPC services per listener. Services on the api and internal listeners run behind the
/// listener's JWT check; services on the agent listener authenticate the agent themselves
/// ([`ModuleContext::agent_auth`]).
#[derive(Default)]
pub struct GrpcServices {
    pub agent: tonic::service::RoutesBuilder,
    pub api: tonic::service::RoutesBuilder,
    pub internal: tonic::service::RoutesBuilder,
}

/// Every feature of kas, in the order their routes and services are registered.
pub fn all() -> Vec<Box<dyn Module>> {
    vec![
        Box::new(connected_agents::ConnectedAgents),
        Box::new(get_pods::GetPods),
        Box::new(kubernetes_api::KubernetesApi),
        Box::new(configuration::Configuration),
        Box::new(gitops::Gitops),
        Box::new(cluster_state::ClusterState),
    ]
}
