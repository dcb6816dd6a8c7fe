//! Cluster state on the REST gateway: `GET /api/v1/agents/{agent_id}/cluster_state` (summaries),
//! `GET /api/v1/agents/{agent_id}/cluster_state/{resource}` (object views) and
//! `GET /api/v1/agents/{agent_id}/events` (Server-Sent Events: the state, then every change).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use kas_proto::AgentId;
use kas_proto::cluster_state::{
    ClusterStateSummary, Event, Freshness, ObjectChange, ObjectList, ObjectView, ResourceKey, ResourceSummary, event,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::hub::Scope;
use crate::error::KasError;
use crate::server::rest::problem::{PROBLEM_JSON, Problem};
use crate::server::rest::state::{RestState, path_text};

/// The JSON routes, with their OpenAPI operations.
pub fn routes() -> OpenApiRouter<RestState> {
    OpenApiRouter::new().routes(routes!(cluster_state)).routes(routes!(cluster_state_objects))
}

/// The event stream: it authenticates itself, since a browser's `EventSource` cannot send an
/// `Authorization` header (the token may come as `access_token`, RFC 6750 section 2.3).
pub fn streaming_routes() -> OpenApiRouter<RestState> {
    OpenApiRouter::new().routes(routes!(cluster_state_events))
}

/// SSE comments this often keep proxies from closing a quiet stream.
const SSE_KEEPALIVE: Duration = Duration::from_secs(15);

/// Whether kas hears from agentk now, and when it last did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FreshnessJson {
    /// agentk's stream is open: the views are current (within the push latency).
    pub live: bool,
    /// When kas last heard from agentk about this state (RFC 3339, UTC; now while live).
    #[schema(format = DateTime, example = "2026-01-02T03:04:05.678Z")]
    pub observed_at: String,
}

/// A resource's views summed up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResourceSummaryJson {
    /// The resource as kubectl names it: `pods`, `deployments.apps`.
    #[schema(example = "pods")]
    pub name: String,
    #[schema(example = "")]
    pub group: String,
    #[schema(example = "v1")]
    pub version: String,
    #[schema(example = "pods")]
    pub resource: String,
    #[schema(example = "Pod")]
    pub kind: String,
    pub namespaced: bool,
    /// Objects held.
    pub count: u32,
    /// Objects by status (pod phase; node and deployment readiness).
    #[schema(example = json!({"Running": 12, "Pending": 1}))]
    pub by_status: BTreeMap<String, u32>,
    /// Objects that are ready.
    pub ready: u32,
    /// A full listing reached kas (false while agentk's informer lists for the first time).
    pub synced: bool,
    /// Why agentk's informer cannot list or watch the resource; null when it can.
    pub error: Option<String>,
}

/// The summaries of an agent's cluster state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterStateJson {
    #[schema(example = "1", pattern = "^[0-9]+$")]
    pub agent_id: String,
    #[serde(flatten)]
    pub freshness: FreshnessJson,
    pub resources: Vec<ResourceSummaryJson>,
}

/// What kas keeps of one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ObjectViewJson {
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    /// Pods: the phase. Nodes: `Ready`, `NotReady` or `Unknown`. Deployments: `Available` or
    /// `Progressing`. Null for other kinds.
    pub status: Option<String>,
    pub ready: bool,
    /// Deployments (kinds with replicas): desired and ready replicas.
    pub replicas: Option<ReplicasJson>,
    /// Pods: the node it runs on.
    pub node_name: Option<String>,
    /// Pods: container restarts.
    pub restarts: Option<i32>,
    /// metadata.creationTimestamp (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReplicasJson {
    pub desired: i32,
    pub ready: i32,
}

/// The object views of one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ObjectListJson {
    #[schema(example = "1", pattern = "^[0-9]+$")]
    pub agent_id: String,
    #[serde(flatten)]
    pub freshness: FreshnessJson,
    pub summary: ResourceSummaryJson,
    pub objects: Vec<ObjectViewJson>,
}

/// The `data` of an `upsert` or `delete` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ObjectChangeJson {
    /// `pods`, `deployments.apps`.
    pub resource: String,
    pub object: ObjectViewJson,
}

/// A resource's views in a `snapshot` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResourceObjectsJson {
    pub summary: ResourceSummaryJson,
    pub objects: Vec<ObjectViewJson>,
}

/// The `data` of a `snapshot` event: the whole state, replacing what the subscriber held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotJson {
    #[serde(flatten)]
    pub freshness: FreshnessJson,
    pub resources: Vec<ResourceObjectsJson>,
}

fn rfc3339_ms(unix_ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(unix_ms).unwrap_or(0));
    humantime::format_rfc3339_millis(t).to_string()
}

fn freshness(f: Option<Freshness>) -> FreshnessJson {
    let f = f.unwrap_or_default();
    FreshnessJson { live: f.live, observed_at: rfc3339_ms(f.observed_at_unix_ms) }
}

/// `pods`, `deployments.apps`.
pub fn resource_name(key: &ResourceKey) -> String {
    crate::agent::cluster_state::resource_name(&key.group, &key.resource)
}

fn summary(s: ResourceSummary) -> ResourceSummaryJson {
    let key = s.resource.unwrap_or_default();
    ResourceSummaryJson {
        name: resource_name(&key),
        group: key.group,
        version: key.version,
        resource: key.resource,
        kind: s.kind,
        namespaced: s.namespaced,
        count: s.count,
        by_status: s.by_status.into_iter().collect(),
        ready: s.ready,
        synced: s.synced,
        error: (!s.error.is_empty()).then_some(s.error),
    }
}

fn view(o: ObjectView) -> ObjectViewJson {
    let created_at = (o.created_at_unix > 0).then(|| rfc3339_ms(o.created_at_unix.saturating_mul(1000)));
    let replicas = (o.replicas_desired != 0 || o.replicas_ready != 0)
        .then_some(ReplicasJson { desired: o.replicas_desired, ready: o.replicas_ready });
    let is_pod = !o.node_name.is_empty() || o.restarts != 0;
    ObjectViewJson {
        namespace: o.namespace,
        name: o.name,
        uid: o.uid,
        resource_version: o.resource_version,
        labels: o.labels.into_iter().collect(),
        status: (!o.status.is_empty()).then_some(o.status),
        ready: o.ready,
        replicas,
        node_name: (!o.node_name.is_empty()).then_some(o.node_name),
        restarts: is_pod.then_some(o.restarts),
        created_at,
    }
}

impl ClusterStateJson {
    pub fn new(s: ClusterStateSummary) -> Self {
        Self {
            agent_id: s.agent_id.to_string(),
            freshness: freshness(s.freshness),
            resources: s.resources.into_iter().map(summary).collect(),
        }
    }
}

impl ObjectListJson {
    pub fn new(l: ObjectList) -> Self {
        Self {
            agent_id: l.agent_id.to_string(),
            freshness: freshness(l.freshness),
            summary: summary(l.summary.unwrap_or_default()),
            objects: l.objects.into_iter().map(view).collect(),
        }
    }
}

fn change(c: &ObjectChange) -> ObjectChangeJson {
    ObjectChangeJson {
        resource: c.resource.as_ref().map(resource_name).unwrap_or_default(),
        object: view(c.object.clone().unwrap_or_default()),
    }
}

/// One event as SSE: its name says what `data` holds.
pub fn sse_event(e: &Event) -> Option<SseEvent> {
    let (name, data) = match e.event.as_ref()? {
        event::Event::Snapshot(s) => {
            let snapshot = SnapshotJson {
                freshness: freshness(s.freshness),
                resources: s
                    .resources
                    .iter()
                    .map(|r| ResourceObjectsJson {
                        summary: summary(r.summary.clone().unwrap_or_default()),
                        objects: r.objects.iter().cloned().map(view).collect(),
                    })
                    .collect(),
            };
            ("snapshot", serde_json::to_string(&snapshot))
        }
        event::Event::Upsert(c) => ("upsert", serde_json::to_string(&change(c))),
        event::Event::Delete(c) => ("delete", serde_json::to_string(&change(c))),
        event::Event::ResourceRemoved(k) => {
            ("resource_removed", serde_json::to_string(&serde_json::json!({"resource": resource_name(k)})))
        }
        event::Event::Freshness(f) => ("freshness", serde_json::to_string(&freshness(Some(*f)))),
    };
    Some(SseEvent::default().event(name).id(e.id.clone()).data(data.ok()?))
}

fn agent_path(path: Result<Path<String>, PathRejection>) -> Result<AgentId, KasError> {
    Ok(AgentId::parse("agent_id", &path_text(path)?)?)
}

/// Show an agent's cluster state
///
/// Per resource the configuration's `cluster_state.resources` names: how many objects, by
/// status, how many ready, and whether agentk's informer works. Answered from kas's copy of
/// agentk's informer cache, from any kas; no request goes into the cluster. `live` says whether
/// agentk's stream is open; when it is not, `observed_at` says how old the data is.
#[utoipa::path(
    get,
    path = "/api/v1/agents/{agent_id}/cluster_state",
    tag = "cluster_state",
    operation_id = "getClusterState",
    params(("agent_id" = i64, Path, description = "The agent's id", minimum = 1, maximum = 9223372036854775807_i64)),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Summaries per resource", body = ClusterStateJson),
        (status = 400, description = "Bad agent id", body = Problem, content_type = PROBLEM_JSON),
        (status = 401, description = "Missing or invalid JWT", body = Problem, content_type = PROBLEM_JSON),
        (status = 404, description = "No kas holds a cluster state of the agent", body = Problem, content_type = PROBLEM_JSON),
        (status = 503, description = "The registry or the kas holding the state is unavailable", body = Problem, content_type = PROBLEM_JSON),
        (status = 504, description = "rest.request_timeout passed", body = Problem, content_type = PROBLEM_JSON),
    )
)]
async fn cluster_state(
    State(state): State<RestState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ClusterStateJson>, KasError> {
    let agent_id = agent_path(path)?;
    Ok(Json(ClusterStateJson::new(state.cluster_state.summary(agent_id, Scope::Routed).await?)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ObjectsQuery {
    /// Only objects of this namespace.
    #[serde(default)]
    #[param(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub namespace: Option<String>,
}

/// List the object views of one resource
///
/// What kas holds of each object of the resource (identity, labels, a small status
/// projection), optionally of one namespace, from kas's copy of agentk's informer cache.
#[utoipa::path(
    get,
    path = "/api/v1/agents/{agent_id}/cluster_state/{resource}",
    tag = "cluster_state",
    operation_id = "listClusterStateObjects",
    params(
        ("agent_id" = i64, Path, description = "The agent's id", minimum = 1, maximum = 9223372036854775807_i64),
        ("resource" = String, Path, description = "The resource as kubectl names it: `pods`, `deployments.apps`", example = "pods", pattern = "^[a-z0-9.-]{1,253}$"),
        ObjectsQuery,
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The resource's object views", body = ObjectListJson),
        (status = 400, description = "Bad agent id, resource or namespace", body = Problem, content_type = PROBLEM_JSON),
        (status = 401, description = "Missing or invalid JWT", body = Problem, content_type = PROBLEM_JSON),
        (status = 404, description = "No cluster state of the agent, or it does not observe the resource", body = Problem, content_type = PROBLEM_JSON),
        (status = 503, description = "The registry or the kas holding the state is unavailable", body = Problem, content_type = PROBLEM_JSON),
        (status = 504, description = "rest.request_timeout passed", body = Problem, content_type = PROBLEM_JSON),
    )
)]
async fn cluster_state_objects(
    State(state): State<RestState>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<ObjectsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ObjectListJson>, KasError> {
    let Path((agent, resource)) =
        path.map_err(|e| KasError::InvalidArgument(format!("bad path: {}", e.body_text())))?;
    let agent_id = AgentId::parse("agent_id", &agent)?;
    let Query(query) = query.map_err(|e| KasError::InvalidArgument(e.body_text()))?;
    let namespace = query.namespace.unwrap_or_default();
    Ok(Json(ObjectListJson::new(state.cluster_state.objects(agent_id, &resource, &namespace, Scope::Routed).await?)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// The JWT, for clients that cannot send an `Authorization` header (a browser's
    /// `EventSource`); the header wins when both are present.
    #[serde(default)]
    pub access_token: Option<String>,
    /// As the `Last-Event-ID` header (which wins when both are present).
    #[serde(default)]
    pub last_event_id: Option<String>,
}

/// Watch an agent's cluster state
///
/// Server-Sent Events: first `snapshot` (the whole state), then `upsert` and `delete` (an
/// object's view changed or went away), `resource_removed` (the configuration stopped naming a
/// resource) and `freshness` (agentk's stream ended or came back: `live`, `observed_at`). Every
/// event has an id; a client that reconnects with `Last-Event-ID` (a browser's `EventSource`
/// does) gets only what it missed when kas still has it, else a new `snapshot`. Works on any
/// kas, and keeps following the state when agentk reconnects to another kas. A client that
/// reads too slowly gets a new `snapshot` instead of the changes it fell behind on.
#[utoipa::path(
    get,
    path = "/api/v1/agents/{agent_id}/events",
    tag = "cluster_state",
    operation_id = "watchClusterState",
    params(
        ("agent_id" = i64, Path, description = "The agent's id", minimum = 1, maximum = 9223372036854775807_i64),
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event received"),
        EventsQuery,
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The event stream", content_type = "text/event-stream", body = String),
        (status = 400, description = "Bad agent id", body = Problem, content_type = PROBLEM_JSON),
        (status = 401, description = "Missing or invalid JWT", body = Problem, content_type = PROBLEM_JSON),
        (status = 404, description = "No kas holds a cluster state of the agent", body = Problem, content_type = PROBLEM_JSON),
        (status = 503, description = "The registry or the kas holding the state is unavailable", body = Problem, content_type = PROBLEM_JSON),
    )
)]
async fn cluster_state_events(
    State(state): State<RestState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Response {
    match events(state, path, query, headers).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn events(
    state: RestState,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, KasError> {
    let Query(query) = query.map_err(|e| KasError::InvalidArgument(e.body_text()))?;
    let header = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let authorization = header.or_else(|| query.access_token.as_ref().map(|t| format!("Bearer {t}")));
    state.verifier.verify_authorization(authorization.as_deref())?;
    let agent_id = agent_path(path)?;
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or(query.last_event_id)
        .unwrap_or_default();
    let rx = state.cluster_state.watch(agent_id, last_event_id, Scope::Routed).await?;
    let events = tokio_stream::wrappers::ReceiverStream::new(rx)
        .filter_map(|e| async move { sse_event(&e).map(Ok::<_, Infallible>) });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(SSE_KEEPALIVE)).into_response())
}
