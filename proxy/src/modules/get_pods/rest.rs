//! GetPods on the REST gateway: `GET /api/v1/agents/{agent_id}/pods`.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use kas_proto::kas::GetPodsRequest;
use kas_proto::{AgentId, ConnectionId};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Scope;
use crate::error::KasError;
use crate::server::rest::problem::{PROBLEM_JSON, Problem};
use crate::server::rest::state::{RestState, forwarded_metadata, path_text};

/// The route, with its OpenAPI operation.
pub fn routes() -> OpenApiRouter<RestState> {
    OpenApiRouter::new().routes(routes!(get_pods_handler))
}

/// A pod, as agentk listed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
}

/// The pods of the agent's cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PodsResponse {
    pub pods: Vec<Pod>,
}

/// Query of GetPods.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PodsQuery {
    /// Which agentk connection (replica) to ask; absent or 0: any.
    #[param(value_type = Option<i64>, minimum = 0, maximum = 9223372036854775807_i64)]
    pub connection_id: Option<String>,
}

/// List the pods of an agent's cluster
///
/// Asks agentk (through a tunnel, via whichever kas holds one) to list pods with its own
/// service account. When the agent is not connected, waits up to `routing.max_wait` for it.
#[utoipa::path(
    get,
    path = "/api/v1/agents/{agent_id}/pods",
    tag = "agents",
    operation_id = "getPods",
    params(
        ("agent_id" = i64, Path, description = "The agent's id", minimum = 1, maximum = 9223372036854775807_i64),
        PodsQuery,
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The pods", body = PodsResponse),
        (status = 400, description = "Bad agent id or connection_id", body = Problem, content_type = PROBLEM_JSON),
        (status = 401, description = "Missing or invalid JWT", body = Problem, content_type = PROBLEM_JSON),
        (status = 404, description = "No such route (e.g. an empty id)", body = Problem, content_type = PROBLEM_JSON),
        (status = 502, description = "agentk or the Kubernetes API failed (`code` is agentk's)", body = Problem, content_type = PROBLEM_JSON),
        (status = 503, description = "The agent (or the named connection) is not connected, or has no free tunnel, within routing.max_wait", body = Problem, content_type = PROBLEM_JSON),
        (status = 504, description = "rest.request_timeout passed while waiting for the agent", body = Problem, content_type = PROBLEM_JSON),
    )
)]
async fn get_pods_handler(
    State(state): State<RestState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<PodsQuery>, QueryRejection>,
) -> Result<Json<PodsResponse>, KasError> {
    let agent_id = AgentId::parse("agent_id", &path_text(path)?)?;
    let Query(query) = query.map_err(|e| KasError::InvalidArgument(format!("bad query: {}", e.body_text())))?;
    let connection_id = match query.connection_id.as_deref() {
        None => ConnectionId::ANY,
        Some(raw) => ConnectionId::parse_or_any("connection_id", raw)?,
    };
    let request = GetPodsRequest { agent_id: agent_id.0, connection_id: connection_id.0 };
    // The route's own timeout is the caller's deadline: the router ends its wait just before it
    // and explains why (504 with the agent named) instead of a bare timeout.
    let deadline = Some(state.config.request_timeout);
    let response =
        super::get_pods(&state.router, Scope::External, request, forwarded_metadata(&headers), deadline).await?;
    let pods = response.pods.into_iter().map(|p| Pod { namespace: p.namespace, name: p.name }).collect();
    Ok(Json(PodsResponse { pods }))
}
