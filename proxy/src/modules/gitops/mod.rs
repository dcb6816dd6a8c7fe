//! GitOps, kas's half (issue 16):
//! - [`objects`]: agentk asks for the objects of one of its manifest projects
//!   (`kas.gitops.v1.GitopsAgent/GetObjectsToSynchronize`, on the agent listener) and kas polls
//!   the project every `gitops.poll_period`, and at once on a push, streaming the objects of every
//!   new commit ([`manifests`] reads them; [`repository`] locates the project: a path or URL for
//!   static agents, GitLab's project_info in GitLab mode).
//! - [`status`]: agentk reports each sync (`kas.gitops.v1.GitopsStatus/ReportSync`); kas keeps the
//!   last report per manifest project in the registry, and callers read it from any kas
//!   (`KasApi.GetGitopsStatus`, `GET /api/v1/agents/{agent_id}/gitops`).
//! - [`push`]: GitLab says a project was pushed to (`KasApi.GitPushEvent`,
//!   `POST /api/v1/git_push_events`); kas publishes it to every kas through the registry, and the
//!   streams polling that project poll at once.

pub mod config;
pub mod manifests;
pub mod metrics;
pub mod objects;
pub mod push;
pub mod repository;
pub mod rest;
pub mod status;

use std::sync::Arc;

use kas_proto::gitops::gitops_agent_server::GitopsAgentServer;
use kas_proto::gitops::gitops_status_server::GitopsStatusServer;
use tokio_util::sync::CancellationToken;

pub use config::GitopsConfig;

use crate::auth::StaticAgents;
use crate::modules::configuration::{AgentConfigurations, ConfigurationSource};
use crate::registry::AgentRegistry;
use repository::ManifestRepositories;

/// What the feature's services and routes share (built once per kas in `app.rs`).
pub struct GitopsState {
    pub config: GitopsConfig,
    /// Where reports are kept and pushes are published (shared by every kas).
    pub registry: Arc<dyn AgentRegistry>,
    /// Agents' current configuration documents (their `gitops` sections).
    pub configurations: Arc<dyn ConfigurationSource>,
    /// Git repositories read as configurations are (mirrors, shared polls, token bucket).
    pub git: Arc<AgentConfigurations>,
    /// Where manifest projects are (static, or GitLab's project_info).
    pub repositories: ManifestRepositories,
    /// The agents of the static agents file, whose configuration kas can read by agent id
    /// (`None` in GitLab mode: GitLab answers only with the agent's own token).
    pub static_agents: Option<Arc<StaticAgents>>,
    /// kas is shutting down: streams end at once (agentk reconnects to another kas).
    pub shutdown: CancellationToken,
}

/// The feature's registration (see [`crate::modules::Module`]).
pub struct Gitops;

impl super::Module for Gitops {
    fn name(&self) -> &'static str {
        "gitops"
    }

    fn rest_routes(&self) -> utoipa_axum::router::OpenApiRouter<crate::server::rest::state::RestState> {
        rest::routes()
    }

    fn grpc_services(&self, context: &super::ModuleContext, services: &mut super::GrpcServices) {
        let objects = objects::ObjectsService { auth: context.agent_auth.clone(), state: context.gitops.clone() };
        services.agent.add_service(GitopsAgentServer::new(objects));
        let status = status::StatusService { auth: context.agent_auth.clone(), state: context.gitops.clone() };
        services.agent.add_service(GitopsStatusServer::new(status).max_decoding_message_size(status::MAX_REPORT_BYTES));
    }

    fn describe_metrics(&self) {
        metrics::describe();
    }
}
