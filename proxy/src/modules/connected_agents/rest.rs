//! The connected-agents routes of the REST gateway.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use kas_proto::kas::ConnectedAgentInfo;
use kas_proto::{AgentId, ProjectId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::KasError;
use crate::server::rest::problem::{PROBLEM_JSON, Problem};
use crate::server::rest::state::{RestState, path_text};

/// The routes, with their OpenAPI operations.
pub fn routes() -> OpenApiRouter<RestState> {
    OpenApiRouter::new().routes(routes!(connected_agents_by_id)).routes(routes!(connected_agents_for_project))
}

/// An agentk connection (one per agentk replica). Ids are decimal strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConnectedAgent {
    /// The agent's id.
    #[schema(example = "1", pattern = "^[0-9]+$")]
    pub agent_id: String,
    /// This connection's id (random, per agentk process).
    #[schema(example = "4711471147114711", pattern = "^[0-9]+$")]
    pub connection_id: String,
    /// The agent's configuration project.
    #[schema(example = "1", pattern = "^[0-9]+$")]
    pub project_id: String,
    /// agentk's version.
    pub version: String,
    /// The commit agentk was built from.
    pub commit: String,
    /// Namespace of the agentk pod.
    pub pod_namespace: String,
    /// Name of the agentk pod.
    pub pod_name: String,
    /// When the connection was established (RFC 3339, UTC); null if unknown.
    #[schema(value_type = Option<String>, format = DateTime, example = "2026-01-02T03:04:05.678Z")]
    pub connected_at: Option<String>,
    /// The internal address of the kas instance holding the connection; null if unknown.
    pub kas_address: Option<KasAddress>,
    /// The kas instance holding the connection.
    pub kas_instance_id: String,
}

/// A kas instance's internal (kas -> kas) address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KasAddress {
    pub ip: String,
    pub port: u16,
}

impl From<ConnectedAgentInfo> for ConnectedAgent {
    fn from(c: ConnectedAgentInfo) -> Self {
        let connected_at = c
            .connected_at
            .and_then(|t| std::time::SystemTime::try_from(t).ok())
            .map(|t| humantime::format_rfc3339_millis(t).to_string());
        Self {
            agent_id: c.id.to_string(),
            connection_id: c.connection_id.to_string(),
            project_id: c.project_id.to_string(),
            version: c.version,
            commit: c.commit,
            pod_namespace: c.pod_namespace,
            pod_name: c.pod_name,
            connected_at,
            kas_address: c.kas_address.map(|a| KasAddress { ip: a.ip, port: u16::try_from(a.port).unwrap_or(0) }),
            kas_instance_id: c.kas_instance_id,
        }
    }
}

/// Connections of agents, as the registry lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConnectionsResponse {
    pub connections: Vec<ConnectedAgent>,
}

/// List the connections of an agent
///
/// One entry per agentk connection (replica), from the registry (all kas replicas).
#[utoipa::path(
    get,
    path = "/api/v1/agents/{agent_id}/connections",
    tag = "agents",
    operation_id = "connectedAgentsById",
    params(("agent_id" = i64, Path, description = "The agent's id", minimum = 1, maximum = 9223372036854775807_i64)),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The agent's connections (empty when it is not connected)", body = ConnectionsResponse),
        (status = 400, description = "Bad agent id", body = Problem, content_type = PROBLEM_JSON),
        (status = 401, description = "Missing or invalid JWT", body = Problem, content_type = PROBLEM_JSON),
        (status = 404, description = "No such route (e.g. an empty id)", body = Problem, content_type = PROBLEM_JSON),
        (status = 503, description = "The agent registry is unavailable", body = Problem, content_type = PROBLEM_JSON),
        (status = 504, description = "rest.request_timeout passed", body = Problem, content_type = PROBLEM_JSON),
    )
)]
async fn connected_agents_by_id(
    State(state): State<RestState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ConnectionsResponse>, KasError> {
    let agent_id = AgentId::parse("agent_id", &path_text(path)?)?;
    let connections = super::by_agent_id(&state.router, agent_id).await?;
    Ok(Json(ConnectionsResponse { connections: connections.into_iter().map(Into::into).collect() }))
}

/// List the connected agents of a configuration project
///
/// Every connection of every agent whose configuration project this is.
#[utoipa::path(
    get,
    path = "/api/v1/projects/{project_id}/agents",
    tag = "agents",
    operation_id = "connectedAgentsForProject",
    params(("project_id" = i64, Path, description = "The configuration project's id", minimum = 1, maximum = 9223372036854775807_i64)),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The project's agent connections", body = ConnectionsResponse),
        (status = 400, description = "Bad project id", body = Problem, content_type = PROBLEM_JSON),
        (status = 401, description = "Missing or invalid JWT", body = Problem, content_type = PROBLEM_JSON),
        (status = 404, description = "No such route (e.g. an empty id)", body = Problem, content_type = PROBLEM_JSON),
        (status = 503, description = "The agent registry is unavailable", body = Problem, content_type = PROBLEM_JSON),
        (status = 504, description = "rest.request_timeout passed", body = Problem, content_type = PROBLEM_JSON),
    )
)]
async fn connected_agents_for_project(
    State(state): State<RestState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ConnectionsResponse>, KasError> {
    let project_id = ProjectId::parse("project_id", &path_text(path)?)?;
    let connections = super::by_project_id(&state.router, project_id).await?;
    Ok(Json(ConnectionsResponse { connections: connections.into_iter().map(Into::into).collect() }))
}
