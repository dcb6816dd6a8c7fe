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
pub mod state;
pub mod status;

use kas_proto::gitops::gitops_agent_server::GitopsAgentServer;
use kas_proto::gitops::gitops_status_server::GitopsStatusServer;

pub use config::GitopsConfig;

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
