//! GitOps on the REST gateway: `GET /api/v1/agents/{agent_id}/gitops` (the last sync of each
//! manifest project) and `POST /api/v1/git_push_events` (a project was pushed to).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kas_proto::AgentId;
use kas_proto::kas::get_gitops_status_response::ProjectsSource;
use kas_proto::kas::{GetGitopsStatusResponse, GitopsSync, git_push_event};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::KasError;
use crate::server::rest::problem::{PROBLEM_JSON, Problem};
use crate::server::rest::state::{RestState, path_text};

/// The routes, with their OpenAPI operations.
pub fn routes() -> OpenApiRouter<RestState> {
    OpenApiRouter::new().routes(routes!(gitops_status)).routes(routes!(git_push_event_handler))
}

/// The GitOps status of an agent: the last sync agentk reported for each manifest project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GitopsStatus {
    #[schema(example = "1", pattern = "^[0-9]+$")]
    pub agent_id: String,
    /// Where the list of manifest projects comes from: `configuration` (the agent's current
    /// configuration: agents of the static agents file), or `last_report` (the configuration when
    /// the agent's last report arrived: GitLab mode, where kas reads an agent's configuration only
    /// with the agent's token; empty before the first report).
    pub projects_from: ProjectsFrom,
    /// One entry per manifest project (and ref), in the configuration's order.
    pub manifest_projects: Vec<ManifestProjectStatus>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProjectsFrom {
    Configuration,
    LastReport,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ManifestProjectStatus {
    /// `gitops.manifest_projects[].id` as the configuration writes it.
    #[schema(example = "platform/manifests")]
    pub project_id: String,
    /// The ref as kas names it: "" (the default branch), `branch:<name>`, `tag:<name>`,
    /// `commit:<id>`.
    #[serde(rename = "ref")]
    #[schema(example = "branch:main")]
    pub git_ref: String,
    /// The last sync agentk reported; null when none was (yet, or within `gitops.status_ttl`).
    pub last_sync: Option<SyncStatus>,
}

/// One sync of a manifest project, as agentk reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SyncStatus {
    /// When a kas received the report (RFC 3339, UTC): how stale this status is.
    #[schema(value_type = Option<String>, format = DateTime, example = "2026-01-02T03:04:05.678Z")]
    pub received_at: Option<String>,
    /// The kas instance that received it.
    pub kas_instance_id: String,
    /// The commit applied (or tried); empty when the sync failed before it had one.
    #[schema(example = "0123456789abcdef0123456789abcdef01234567")]
    pub commit_id: String,
    /// The agentk pod that applied it.
    pub pod_name: String,
    /// When the sync started (RFC 3339, UTC); null if agentk did not say.
    #[schema(value_type = Option<String>, format = DateTime, example = "2026-01-02T03:04:05.000Z")]
    pub started_at: Option<String>,
    pub duration_ms: u32,
    /// The configuration's `dry_run_strategy`: `none`, `client` or `server`.
    pub dry_run_strategy: String,
    /// Objects created or changed.
    pub applied: u32,
    /// Objects already as applied.
    pub unchanged: u32,
    /// Objects deleted because they left the manifests.
    pub pruned: u32,
    /// Objects that failed (`errors` lists at most 100 of them).
    pub failed: u32,
    pub errors: Vec<ObjectError>,
    /// Why the sync as a whole failed; null when it did not.
    pub error: Option<String>,
}

/// An object whose apply or prune failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ObjectError {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The manifest file it came from ("" for a pruned object).
    pub source: String,
    /// `apply` or `prune`.
    pub operation: String,
    pub message: String,
}

/// RFC 3339 with milliseconds, UTC.
fn rfc3339(t: Option<std::time::SystemTime>) -> Option<String> {
    t.map(|t| humantime::format_rfc3339_millis(t).to_string())
}

impl From<GitopsSync> for SyncStatus {
    fn from(sync: GitopsSync) -> Self {
        let received_at = rfc3339(sync.received_at.and_then(|t| std::time::SystemTime::try_from(t).ok()));
        let r = sync.report.unwrap_or_default();
        let started_at = u64::try_from(r.started_at_unix_ms)
            .ok()
            .filter(|ms| *ms > 0)
            .and_then(|ms| std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(ms)));
        Self {
            received_at,
            kas_instance_id: sync.kas_instance_id,
            commit_id: r.commit_id,
            pod_name: r.pod_name,
            started_at: rfc3339(started_at),
            duration_ms: r.duration_ms,
            dry_run_strategy: r.dry_run_strategy,
            applied: r.applied,
            unchanged: r.unchanged,
            pruned: r.pruned,
            failed: r.failed,
            errors: r
                .errors
                .into_iter()
                .map(|e| ObjectError {
                    group: e.group,
                    version: e.version,
                    kind: e.kind,
                    namespace: e.namespace,
                    name: e.name,
                    source: e.source,
                    operation: e.operation,
                    message: e.message,
                })
                .collect(),
            error: (!r.error.is_empty()).then_some(r.error),
        }
    }
}

impl GitopsStatus {
    pub fn new(agent_id: AgentId, response: GetGitopsStatusResponse) -> Self {
        let projects_from = match response.projects_from() {
            ProjectsSource::Configuration => ProjectsFrom::Configuration,
            ProjectsSource::LastReport | ProjectsSource::Unspecified => ProjectsFrom::LastReport,
        };
        Self {
            agent_id: agent_id.to_string(),
            projects_from,
            manifest_projects: response
                .manifest_projects
                .into_iter()
                .map(|p| ManifestProjectStatus {
                    project_id: p.project_id,
                    git_ref: p.r#ref,
                    last_sync: p.last_sync.map(Into::into),
                })
                .collect(),
        }
    }
}

/// Show the GitOps status of an agent
///
/// The last sync agentk reported for each manifest project of the agent (commit, objects
/// applied, unchanged, pruned and failed with their errors, duration) and when it arrived, from
/// any kas.
#[utoipa::path(
    get,
    path = "/api/v1/agents/{agent_id}/gitops",
    tag = "gitops",
    operation_id = "getGitopsStatus",
    params(("agent_id" = i64, Path, description = "The agent's id", minimum = 1, maximum = 9223372036854775807_i64)),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The last sync of each manifest project", body = GitopsStatus),
        (status = 400, description = "Bad agent id", body = Problem, content_type = PROBLEM_JSON),
        (status = 401, description = "Missing or invalid JWT", body = Problem, content_type = PROBLEM_JSON),
        (status = 404, description = "No such agent (static agents), or no such route", body = Problem, content_type = PROBLEM_JSON),
        (status = 503, description = "The agent registry is unavailable", body = Problem, content_type = PROBLEM_JSON),
        (status = 504, description = "rest.request_timeout passed", body = Problem, content_type = PROBLEM_JSON),
    )
)]
async fn gitops_status(
    State(state): State<RestState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<GitopsStatus>, KasError> {
    let agent_id = AgentId::parse("agent_id", &path_text(path)?)?;
    let status = super::status::status(&state.gitops, agent_id).await?;
    Ok(Json(GitopsStatus::new(agent_id, status)))
}

/// A push to a project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitPushEvent {
    pub project: PushedProject,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PushedProject {
    /// GitLab's numeric project id (a decimal string); absent or "0" when unknown.
    #[schema(example = "7", pattern = "^[0-9]+$")]
    #[serde(default)]
    pub id: Option<String>,
    /// The project's full path as manifest projects name it (`group/project`; with static agents
    /// the repository path or URL as the agent configuration writes it).
    #[schema(example = "platform/manifests", min_length = 1, max_length = 1024)]
    pub full_path: String,
}

/// Notify kas of a push to a project
///
/// Every kas polls the project's GitOps streams (and nothing else) at once, so agents get the
/// new commit in about a second instead of at their next poll. GitLab calls the same as
/// `KasApi.GitPushEvent`.
#[utoipa::path(
    post,
    path = "/api/v1/git_push_events",
    tag = "gitops",
    operation_id = "gitPushEvent",
    request_body(content = GitPushEvent, content_type = "application/json"),
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Published to every kas"),
        (status = 400, description = "The body is not a push event", body = Problem, content_type = PROBLEM_JSON),
        (status = 401, description = "Missing or invalid JWT", body = Problem, content_type = PROBLEM_JSON),
        (status = 413, description = "Body above rest.max_request_body_bytes", body = Problem, content_type = PROBLEM_JSON),
        (status = 503, description = "The registry could not publish it", body = Problem, content_type = PROBLEM_JSON),
        (status = 504, description = "rest.request_timeout passed", body = Problem, content_type = PROBLEM_JSON),
    )
)]
async fn git_push_event_handler(State(state): State<RestState>, body: Bytes) -> Result<StatusCode, KasError> {
    let event: GitPushEvent =
        serde_json::from_slice(&body).map_err(|e| KasError::InvalidArgument(format!("bad push event: {e}")))?;
    let id = match event.project.id.as_deref() {
        None | Some("0") => 0,
        Some(id) => kas_proto::ProjectId::parse("project.id", id)?.0,
    };
    let project = git_push_event::Project { id, full_path: event.project.full_path };
    super::push::publish(&state.gitops, Some(&project)).await?;
    Ok(StatusCode::NO_CONTENT)
}
