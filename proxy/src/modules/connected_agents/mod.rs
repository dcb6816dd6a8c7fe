//! Connected agents: which agentk connections exist, from the registry that all kas share
//! (`KasApi.ConnectedAgentsById` / `ConnectedAgentsForProject` and their REST routes). Answered
//! by kas alone: no request reaches an agent, so there is no agentk half.

pub mod rest;

use kas_proto::kas::ConnectedAgentInfo;
use kas_proto::{AgentId, ProjectId};

use crate::error::KasError;
use crate::router::Router;

/// Every connection of the agent, on any kas.
pub async fn by_agent_id(router: &Router, agent_id: AgentId) -> Result<Vec<ConnectedAgentInfo>, KasError> {
    Ok(router.registry().connections_by_agent_id(agent_id).await?)
}

/// Every connection of every agent of the configuration project, on any kas.
pub async fn by_project_id(router: &Router, project_id: ProjectId) -> Result<Vec<ConnectedAgentInfo>, KasError> {
    Ok(router.registry().connections_by_project_id(project_id).await?)
}

/// The feature's registration (see [`crate::modules::Module`]).
pub struct ConnectedAgents;

impl super::Module for ConnectedAgents {
    fn name(&self) -> &'static str {
        "connected_agents"
    }

    fn rest_routes(&self) -> utoipa_axum::router::OpenApiRouter<crate::server::rest::state::RestState> {
        rest::routes()
    }
}
