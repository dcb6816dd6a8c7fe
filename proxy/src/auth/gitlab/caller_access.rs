//! Callers of the Kubernetes API proxy, checked with GitLab as GitLab's own kas does.
//!
//! - CI jobs: `GET {gitlab}/api/v4/job/allowed_agents` with the job's `CI_JOB_TOKEN` in the
//!   `Job-Token` header (GitLab's public API, no kas JWT). The answer lists the agents the job's
//!   project may use (each with its `ci_access` configuration) and who runs the job.
//! - Users: `POST {gitlab}/api/v4/internal/kubernetes/authorize_proxy_user` (internal API, with
//!   kas's `Gitlab-Kas-Api-Request` JWT) with `{agent_id, access_type, access_key, csrf_token}`.
//!   The answer says as whom the user may use that agent.
//!
//! GitLab's refusals: allowed_agents answers 401 for a job token it does not accept (unknown,
//! or the job is not running), 403/404 when the token may not list agents.
//! authorize_proxy_user answers 400 when no user has the token, 401 when the token is revoked
//! or expired, 403 when the user may not use the agent (or the token lacks the `k8s_proxy`
//! scope), 404 when the agent does not exist. 400/401 are UNAUTHENTICATED, 403/404
//! PERMISSION_DENIED, anything else, network errors and timeouts UNAVAILABLE. Messages name
//! what happened and never carry the token.
//!
//! [`CallerAccess`] caches the answers per token (keyed by a SHA-256; for users, of the agent
//! id and the token) for `gitlab.caller_cache.ttl`, refusals and failures for `error_ttl`;
//! concurrent identical requests share one GitLab request. Every request passes the
//! [`GitlabClient`]'s token bucket, the one agent_info requests pass.

use std::collections::BTreeMap;
use std::sync::Arc;

use kas_proto::{AgentId, ProjectId};
use serde::{Deserialize, Deserializer};
use sha2::{Digest, Sha256};

use super::config::CallerCacheConfig;
use super::{API_REQUEST_HEADER, GitlabClient, counted, read_body, unavailable};
use crate::error::KasError;
use crate::tools::ttl_cache::{CacheKey, TtlCache};

/// GitLab's API answering "which agents may this CI job use".
pub const ALLOWED_AGENTS_PATH: &str = "/api/v4/job/allowed_agents";
/// GitLab's internal API answering "may this user use this agent, and as whom".
pub const AUTHORIZE_PROXY_USER_PATH: &str = "/api/v4/internal/kubernetes/authorize_proxy_user";
/// The header carrying a CI job token to GitLab (as GitLab's kas sends it).
pub const JOB_TOKEN_HEADER: &str = "Job-Token";
/// A project may be authorized for many agents, each with its configuration: a larger bound
/// than for single-agent answers.
const MAX_ALLOWED_AGENTS_BYTES: usize = 1024 * 1024;
const MAX_AUTHORIZE_PROXY_USER_BYTES: usize = 256 * 1024;
/// How much of a refusal's body is read for GitLab's `message`.
const MAX_REFUSAL_BYTES: usize = 4 * 1024;

/// GitLab's allowed_agents answer (documented in gitlab-agent's `kubernetes_ci_access.md`).
/// Unknown fields are ignored: GitLab adds fields over time.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AllowedAgentsForJob {
    #[serde(default, deserialize_with = "null_as_default")]
    pub allowed_agents: Vec<AllowedAgent>,
    pub job: JobInfo,
    pub pipeline: PipelineInfo,
    pub project: ProjectInfo,
    /// The job's environment, when it deploys to one.
    #[serde(default)]
    pub environment: Option<EnvironmentInfo>,
    /// The user running the job.
    pub user: UserInfo,
}

impl AllowedAgentsForJob {
    /// The entry of `agent_id`, if the job may use that agent.
    pub fn agent(&self, agent_id: AgentId) -> Option<&AllowedAgent> {
        self.allowed_agents.iter().find(|a| a.id == agent_id)
    }

    /// Ids kas routes and impersonates with must be real ones.
    fn check(&self) -> Result<(), String> {
        positive("job.id", self.job.id)?;
        positive("pipeline.id", self.pipeline.id)?;
        positive("project.id", self.project.id.0)?;
        self.user.check()?;
        for a in &self.allowed_agents {
            positive("allowed_agents[].id", a.id.0)?;
        }
        Ok(())
    }
}

/// An agent the job may use, with the `ci_access` entry (project or group) that allows it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AllowedAgent {
    pub id: AgentId,
    pub config_project: ConfigProject,
    #[serde(default, deserialize_with = "null_as_default")]
    pub configuration: CiAccessConfiguration,
}

/// The project holding an agent's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ConfigProject {
    pub id: ProjectId,
}

/// The `ci_access` entry of the agent's configuration file that authorizes the job (other keys
/// of the entry, e.g. `environments`, are GitLab's business and ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct CiAccessConfiguration {
    /// Empty: not set.
    #[serde(default, deserialize_with = "null_as_default")]
    pub default_namespace: String,
    /// Missing: as the agent (GitLab's kas's default).
    #[serde(default)]
    pub access_as: CiAccessAs,
}

/// `ci_access.*.access_as`: as whom the job's requests reach the Kubernetes API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawOneOf")]
pub enum CiAccessAs {
    /// `agent: {}`: with the agent's own service account.
    #[default]
    Agent,
    /// `impersonate: {...}`: as the named user.
    Impersonate(Impersonate),
    /// `ci_job: {}`: as `gitlab:ci_job:<job id>` with groups naming the project, its groups and
    /// environment.
    CiJob,
    /// A mode this kas does not know (a newer GitLab): the caller must be refused for it.
    Unsupported(String),
}

/// `access_as.impersonate`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Impersonate {
    pub username: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub uid: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub groups: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub extra: Vec<ExtraKeyVal>,
}

/// One `Impersonate-Extra-<key>` with its values.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ExtraKeyVal {
    pub key: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub val: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct JobInfo {
    pub id: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PipelineInfo {
    pub id: i64,
}

/// The job's project and the groups it is in (its group and that group's ancestors).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ProjectInfo {
    pub id: ProjectId,
    #[serde(default, deserialize_with = "null_as_default")]
    pub groups: Vec<GroupInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GroupInfo {
    pub id: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EnvironmentInfo {
    pub slug: String,
    pub tier: String,
}

/// A GitLab user. `roles_in_project` (allowed_agents only: the user's roles in the job's
/// project, e.g. `guest`, `reporter`) is empty in authorize_proxy_user answers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct UserInfo {
    pub id: i64,
    pub username: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub roles_in_project: Vec<String>,
}

impl UserInfo {
    fn check(&self) -> Result<(), String> {
        positive("user.id", self.id)?;
        if self.username.is_empty() {
            return Err("user.username is empty".into());
        }
        Ok(())
    }
}

/// How a user's token is presented to authorize_proxy_user (`access_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyUserAccessType {
    /// A personal access token with the `k8s_proxy` scope.
    PersonalAccessToken,
}

impl ProxyUserAccessType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PersonalAccessToken => "personal_access_token",
        }
    }
}

/// GitLab's authorize_proxy_user answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AuthorizeProxyUserResponse {
    pub agent: AuthorizedAgent,
    pub user: UserInfo,
    pub access_as: UserAccessAs,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AuthorizedAgent {
    pub id: AgentId,
    pub config_project: ConfigProject,
}

/// `user_access.access_as` of the agent's configuration, as GitLab resolved it for the user.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawOneOf")]
pub enum UserAccessAs {
    /// `agent: {}`: with the agent's own service account.
    Agent,
    /// `user: {...}`: as the GitLab user, with the roles GitLab lists per project and group.
    User(AccessAsUser),
    /// A mode this kas does not know (a newer GitLab): the caller must be refused for it.
    Unsupported(String),
}

/// `access_as.user`: the projects and groups (of the agent's `user_access`) the user is a
/// member of, with the user's roles there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct AccessAsUser {
    #[serde(default, deserialize_with = "null_as_default")]
    pub projects: Vec<RoleGrant>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub groups: Vec<RoleGrant>,
}

/// A project or group id with the user's roles in it (`developer`, `maintainer`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RoleGrant {
    pub id: i64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub roles: Vec<String>,
}

/// A protobuf `oneof` as GitLab writes it: an object with one key naming the mode
/// (`{"impersonate": {...}}`); `null` or `{}` set none.
type RawOneOf = Option<BTreeMap<String, serde_json::Value>>;

/// The mode a [`RawOneOf`] sets, with its object; `None` when it sets none.
fn one_of(raw: RawOneOf) -> Result<Option<(String, serde_json::Value)>, String> {
    let mut set = raw.unwrap_or_default().into_iter().filter(|(_, v)| !v.is_null());
    let first = set.next();
    if let (Some((a, _)), Some((b, _))) = (&first, set.next()) {
        return Err(format!("access_as sets more than one mode ({a}, {b})"));
    }
    Ok(first)
}

impl TryFrom<RawOneOf> for CiAccessAs {
    type Error = String;

    fn try_from(raw: RawOneOf) -> Result<Self, String> {
        Ok(match one_of(raw)? {
            None => Self::Agent,
            Some((mode, value)) => match mode.as_str() {
                "agent" => Self::Agent,
                "ci_job" => Self::CiJob,
                "impersonate" => {
                    Self::Impersonate(serde_json::from_value(value).map_err(|e| format!("access_as.impersonate: {e}"))?)
                }
                _ => Self::Unsupported(mode),
            },
        })
    }
}

impl TryFrom<RawOneOf> for UserAccessAs {
    type Error = String;

    fn try_from(raw: RawOneOf) -> Result<Self, String> {
        let (mode, value) = one_of(raw)?.ok_or("access_as sets no mode")?;
        Ok(match mode.as_str() {
            "agent" => Self::Agent,
            "user" => Self::User(serde_json::from_value(value).map_err(|e| format!("access_as.user: {e}"))?),
            _ => Self::Unsupported(mode),
        })
    }
}

/// `null` reads as the default (GitLab's JSON has nulls where protobuf has empty values).
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn positive(field: &str, v: i64) -> Result<(), String> {
    if v <= 0 {
        return Err(format!("{field} must be positive, got {v}"));
    }
    Ok(())
}

/// What GitLab said when refusing (its `{"message": "..."}`), if it adds to the status line and
/// does not contain `token`. Read from at most [`MAX_REFUSAL_BYTES`] of the body.
async fn refusal_message(mut response: reqwest::Response, token: &str) -> Option<String> {
    let status = response.status();
    let mut body = Vec::new();
    while body.len() < MAX_REFUSAL_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    let value: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let message = value.get("message")?.as_str()?.trim();
    let status_line = format!("{} {}", status.as_u16(), status.canonical_reason().unwrap_or_default());
    if message.is_empty() || message == status_line || message.chars().count() > 300 || message.contains(token) {
        return None;
    }
    Some(message.to_owned())
}

/// "GitLab answered 403 Forbidden" and GitLab's message, if any.
async fn answered(response: reqwest::Response, token: &str) -> String {
    let status = response.status();
    let line = format!("GitLab answered {} {}", status.as_u16(), status.canonical_reason().unwrap_or_default());
    match refusal_message(response, token).await {
        Some(message) => format!("{line}: {message}"),
        None => line,
    }
}

/// A token as a header value GitLab can receive (marked sensitive: never logged by the client).
fn token_header(token: &str, what: &str) -> Result<http::HeaderValue, KasError> {
    if token.is_empty() {
        return Err(KasError::Unauthenticated(format!("the {what} is empty")));
    }
    let mut value =
        http::HeaderValue::try_from(token).map_err(|_| KasError::Unauthenticated(format!("malformed {what}")))?;
    value.set_sensitive(true);
    Ok(value)
}

impl GitlabClient {
    /// Asks GitLab which agents the CI job holding `job_token` may use (one request, rate
    /// limited, not cached; see [`CallerAccess`]).
    pub async fn allowed_agents_for_job(&self, job_token: &str) -> Result<AllowedAgentsForJob, KasError> {
        counted(self.allowed_agents_uncounted(job_token).await)
    }

    async fn allowed_agents_uncounted(&self, job_token: &str) -> Result<AllowedAgentsForJob, KasError> {
        let header = token_header(job_token, "CI job token")?;
        self.acquire().await?;
        let response = self
            .http
            .get(&self.allowed_agents_url)
            .header(JOB_TOKEN_HEADER, header)
            .send()
            .await
            .map_err(|e| unavailable(&e, "allowed_agents"))?;
        match response.status() {
            http::StatusCode::OK => {}
            http::StatusCode::UNAUTHORIZED => {
                let answer = answered(response, job_token).await;
                return Err(KasError::Unauthenticated(format!(
                    "the CI job token is not valid (unknown, or its job is not running; {answer})"
                )));
            }
            http::StatusCode::FORBIDDEN | http::StatusCode::NOT_FOUND => {
                let answer = answered(response, job_token).await;
                return Err(KasError::PermissionDenied(format!(
                    "the CI job token may not list the agents of its project ({answer})"
                )));
            }
            other => {
                tracing::warn!(status = %other, "GitLab allowed_agents failed");
                return Err(KasError::GitlabUnavailable(format!("allowed_agents answered HTTP {other}")));
            }
        }
        let body = read_body(response, MAX_ALLOWED_AGENTS_BYTES, "allowed_agents").await?;
        let invalid = |e: String| KasError::GitlabUnavailable(format!("invalid allowed_agents response: {e}"));
        let answer: AllowedAgentsForJob = serde_json::from_slice(&body).map_err(|e| invalid(e.to_string()))?;
        answer.check().map_err(invalid)?;
        Ok(answer)
    }

    /// Asks GitLab whether the user holding `access_key` may use agent `agent_id` through the
    /// Kubernetes API proxy, and as whom (one request, rate limited, not cached).
    pub async fn authorize_proxy_user(
        &self,
        agent_id: AgentId,
        access_type: ProxyUserAccessType,
        access_key: &str,
    ) -> Result<AuthorizeProxyUserResponse, KasError> {
        counted(self.authorize_proxy_user_uncounted(agent_id, access_type, access_key).await)
    }

    async fn authorize_proxy_user_uncounted(
        &self,
        agent_id: AgentId,
        access_type: ProxyUserAccessType,
        access_key: &str,
    ) -> Result<AuthorizeProxyUserResponse, KasError> {
        let what = match access_type {
            ProxyUserAccessType::PersonalAccessToken => "personal access token",
        };
        // Checked as a header value would be: GitLab could not know such a token anyway.
        token_header(access_key, what)?;
        self.acquire().await?;
        let jwt = self.api_jwt()?;
        // csrf_token: GitLab checks it for session cookies only, and requires the key.
        let body = serde_json::json!({
            "agent_id": agent_id.0,
            "access_type": access_type.as_str(),
            "access_key": access_key,
            "csrf_token": "",
        });
        let response = self
            .http
            .post(&self.authorize_proxy_user_url)
            .header(API_REQUEST_HEADER, jwt)
            .json(&body)
            .send()
            .await
            .map_err(|e| unavailable(&e, "authorize_proxy_user"))?;
        match response.status() {
            http::StatusCode::OK | http::StatusCode::CREATED => {}
            http::StatusCode::BAD_REQUEST | http::StatusCode::UNAUTHORIZED => {
                let answer = answered(response, access_key).await;
                return Err(KasError::Unauthenticated(format!(
                    "the {what} is not valid (unknown, revoked or expired; {answer})"
                )));
            }
            http::StatusCode::FORBIDDEN => {
                let answer = answered(response, access_key).await;
                return Err(KasError::PermissionDenied(format!(
                    "the {what}'s user may not use agent {agent_id} (no user_access for the user, or the token \
                     lacks the k8s_proxy scope; {answer})"
                )));
            }
            http::StatusCode::NOT_FOUND => {
                let answer = answered(response, access_key).await;
                return Err(KasError::PermissionDenied(format!("GitLab knows no agent {agent_id} ({answer})")));
            }
            other => {
                tracing::warn!(status = %other, "GitLab authorize_proxy_user failed");
                return Err(KasError::GitlabUnavailable(format!("authorize_proxy_user answered HTTP {other}")));
            }
        }
        let body = read_body(response, MAX_AUTHORIZE_PROXY_USER_BYTES, "authorize_proxy_user").await?;
        let invalid = |e: String| KasError::GitlabUnavailable(format!("invalid authorize_proxy_user response: {e}"));
        let answer: AuthorizeProxyUserResponse = serde_json::from_slice(&body).map_err(|e| invalid(e.to_string()))?;
        answer.user.check().map_err(invalid)?;
        if answer.agent.id != agent_id {
            return Err(invalid(format!("it names agent {}, kas asked about agent {agent_id}", answer.agent.id)));
        }
        Ok(answer)
    }
}

/// GitLab's answers about Kubernetes API proxy callers, cached per token (see the module
/// documentation). Shares the [`GitlabClient`] (and its request bucket) of agent verification.
#[derive(Debug)]
pub struct CallerAccess {
    client: Arc<GitlabClient>,
    jobs: TtlCache<Arc<AllowedAgentsForJob>>,
    users: TtlCache<Arc<AuthorizeProxyUserResponse>>,
}

impl CallerAccess {
    /// `client`: [`super::GitlabVerifier::client`], so all requests to GitLab share one bucket.
    pub fn new(client: Arc<GitlabClient>, config: &CallerCacheConfig) -> Self {
        let c = config;
        Self {
            client,
            jobs: TtlCache::new(c.ttl, c.error_ttl, c.max_entries),
            users: TtlCache::new(c.ttl, c.error_ttl, c.max_entries),
        }
    }

    /// The agents the CI job holding `job_token` may use, from the cache or from GitLab.
    pub async fn allowed_agents_for_job(&self, job_token: &str) -> Result<Arc<AllowedAgentsForJob>, KasError> {
        self.jobs
            .get_or_fetch(job_key(job_token), || async {
                self.client.allowed_agents_for_job(job_token).await.map(Arc::new)
            })
            .await
    }

    /// Whether (and as whom) the user holding `access_key` may use `agent_id`, from the cache or
    /// from GitLab.
    pub async fn authorize_proxy_user(
        &self,
        agent_id: AgentId,
        access_type: ProxyUserAccessType,
        access_key: &str,
    ) -> Result<Arc<AuthorizeProxyUserResponse>, KasError> {
        self.users
            .get_or_fetch(user_key(agent_id, access_type, access_key), || async {
                self.client.authorize_proxy_user(agent_id, access_type, access_key).await.map(Arc::new)
            })
            .await
    }
}

/// The cache key of a job token: a SHA-256 (the token itself is never kept), with a prefix so
/// that no other kind of key can collide with it.
fn job_key(job_token: &str) -> CacheKey {
    let mut h = Sha256::new();
    h.update(b"ci_job_token\0");
    h.update(job_token.as_bytes());
    h.finalize().into()
}

/// The cache key of a user's token for one agent (fixed-width agent id, then the token).
fn user_key(agent_id: AgentId, access_type: ProxyUserAccessType, access_key: &str) -> CacheKey {
    let mut h = Sha256::new();
    h.update(b"proxy_user\0");
    h.update(access_type.as_str().as_bytes());
    h.update(b"\0");
    h.update(agent_id.0.to_be_bytes());
    h.update(access_key.as_bytes());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::http::StatusCode;
    use axum::response::IntoResponse;

    use super::*;
    use crate::auth::Secret;
    use crate::auth::gitlab::GitlabConfig;

    /// The documented answer, with fields kas does not know (GitLab adds some, e.g.
    /// `roles_in_project` arrived later; `environments` is part of the ci_access entry).
    const ALLOWED_AGENTS: &str = r#"{
        "allowed_agents": [
            {"id": 5, "config_project": {"id": 50, "path": "g/agents"},
             "configuration": {"default_namespace": "prod", "access_as": {"ci_job": {}},
                               "environments": ["production"], "protected_branches_only": true}},
            {"id": 6, "config_project": {"id": 60},
             "configuration": {"access_as": {"impersonate": {"username": "deployer", "uid": "42",
                "groups": ["ops", "devs"], "extra": [{"key": "team", "val": ["a", "b"]}]}}}},
            {"id": 7, "config_project": {"id": 70}, "configuration": {"access_as": {"agent": {}}}},
            {"id": 8, "config_project": {"id": 80}},
            {"id": 9, "config_project": {"id": 90}, "configuration": {"default_namespace": null, "access_as": null}},
            {"id": 10, "config_project": {"id": 100}, "configuration": {"access_as": {"ci_user": {}}}}
        ],
        "job": {"id": 1001, "name": "deploy"},
        "pipeline": {"id": 2002},
        "project": {"id": 3003, "groups": [{"id": 11}, {"id": 12}]},
        "environment": {"slug": "production-abc", "tier": "production", "url": "https://x"},
        "user": {"id": 4004, "username": "alice", "roles_in_project": ["guest", "reporter", "developer"]},
        "added_by_a_future_gitlab": {"nested": [1, 2]}
    }"#;

    #[test]
    fn parses_gitlabs_allowed_agents_and_ignores_new_fields() {
        let a: AllowedAgentsForJob = serde_json::from_str(ALLOWED_AGENTS).unwrap();
        a.check().unwrap();
        assert_eq!((a.job.id, a.pipeline.id, a.project.id), (1001, 2002, ProjectId(3003)));
        assert_eq!(a.project.groups, vec![GroupInfo { id: 11 }, GroupInfo { id: 12 }]);
        assert_eq!(a.environment, Some(EnvironmentInfo { slug: "production-abc".into(), tier: "production".into() }));
        assert_eq!((a.user.id, a.user.username.as_str()), (4004, "alice"));
        assert_eq!(a.user.roles_in_project, ["guest", "reporter", "developer"]);
        let modes: Vec<_> = a.allowed_agents.iter().map(|x| (x.id.0, x.configuration.access_as.clone())).collect();
        let impersonate = Impersonate {
            username: "deployer".into(),
            uid: "42".into(),
            groups: vec!["ops".into(), "devs".into()],
            extra: vec![ExtraKeyVal { key: "team".into(), val: vec!["a".into(), "b".into()] }],
        };
        assert_eq!(
            modes,
            vec![
                (5, CiAccessAs::CiJob),
                (6, CiAccessAs::Impersonate(impersonate)),
                (7, CiAccessAs::Agent),
                (8, CiAccessAs::Agent), // no configuration: as the agent, as GitLab's kas does
                (9, CiAccessAs::Agent),
                (10, CiAccessAs::Unsupported("ci_user".into())),
            ]
        );
        let first = a.agent(AgentId(5)).unwrap();
        assert_eq!((first.config_project.id, first.configuration.default_namespace.as_str()), (ProjectId(50), "prod"));
        assert_eq!(a.agent(AgentId(9)).unwrap().configuration.default_namespace, "");
        assert!(a.agent(AgentId(99)).is_none());
    }

    #[test]
    fn minimal_allowed_agents_and_invalid_ones() {
        let minimal = r#"{"job": {"id": 1}, "pipeline": {"id": 2}, "project": {"id": 3},
                          "user": {"id": 4, "username": "u"}}"#;
        let a: AllowedAgentsForJob = serde_json::from_str(minimal).unwrap();
        a.check().unwrap();
        assert!(a.allowed_agents.is_empty() && a.environment.is_none() && a.project.groups.is_empty());

        let e = serde_json::from_str::<AllowedAgentsForJob>(r#"{"job": {"id": 1}}"#).unwrap_err().to_string();
        assert!(e.contains("missing field `pipeline`"), "{e}");
        let two_modes = ALLOWED_AGENTS.replace(r#"{"agent": {}}"#, r#"{"agent": {}, "ci_job": {}}"#);
        let e = serde_json::from_str::<AllowedAgentsForJob>(&two_modes).unwrap_err().to_string();
        assert!(e.contains("access_as sets more than one mode (agent, ci_job)"), "{e}");
        let no_username = ALLOWED_AGENTS.replace(r#""username": "deployer", "#, "");
        let e = serde_json::from_str::<AllowedAgentsForJob>(&no_username).unwrap_err().to_string();
        assert!(e.contains("access_as.impersonate: missing field `username`"), "{e}");
        let bad_user = ALLOWED_AGENTS.replace(r#""id": 4004"#, r#""id": 0"#);
        let e = serde_json::from_str::<AllowedAgentsForJob>(&bad_user).unwrap().check().unwrap_err();
        assert_eq!(e, "user.id must be positive, got 0");
    }

    #[test]
    fn parses_gitlabs_authorize_proxy_user() {
        let as_user = r#"{
            "agent": {"id": 5, "config_project": {"id": 50}},
            "user": {"id": 7, "username": "bob", "email": "not-read@example.com"},
            "access_as": {"user": {"projects": [{"id": 1, "roles": ["developer"]}],
                                   "groups": [{"id": 2, "roles": ["reporter", "developer"]}]}},
            "new_field": 1
        }"#;
        let r: AuthorizeProxyUserResponse = serde_json::from_str(as_user).unwrap();
        assert_eq!((r.agent.id, r.agent.config_project.id), (AgentId(5), ProjectId(50)));
        assert_eq!((r.user.id, r.user.username.as_str()), (7, "bob"));
        let UserAccessAs::User(user) = &r.access_as else { panic!("{r:?}") };
        assert_eq!(user.projects, vec![RoleGrant { id: 1, roles: vec!["developer".into()] }]);
        assert_eq!(user.groups, vec![RoleGrant { id: 2, roles: vec!["reporter".into(), "developer".into()] }]);

        let with = |access_as: &str| {
            let start = as_user.find(r#""access_as""#).unwrap();
            let end = as_user.find(r#""new_field""#).unwrap();
            format!("{}\"access_as\": {access_as},\n{}", &as_user[..start], &as_user[end..])
        };
        let parse = |access_as: &str| serde_json::from_str::<AuthorizeProxyUserResponse>(&with(access_as));
        assert_eq!(parse(r#"{"agent": {}}"#).unwrap().access_as, UserAccessAs::Agent);
        assert_eq!(parse(r#"{"agent": {}, "user": null}"#).unwrap().access_as, UserAccessAs::Agent);
        assert_eq!(parse(r#"{"user": {}}"#).unwrap().access_as, UserAccessAs::User(AccessAsUser::default()));
        assert_eq!(
            parse(r#"{"cluster_admin": {}}"#).unwrap().access_as,
            UserAccessAs::Unsupported("cluster_admin".into())
        );
        // GitLab always names a mode: an answer without one is not understood.
        for missing in ["{}", "null"] {
            let e = parse(missing).unwrap_err().to_string();
            assert!(e.contains("access_as sets no mode"), "{e}");
        }
        let e = parse(r#"{"agent": {}, "user": {}}"#).unwrap_err().to_string();
        assert!(e.contains("more than one mode"), "{e}");
    }

    /// One request as the fake GitLab below saw it: method, path, headers, body.
    type Seen = (String, String, http::HeaderMap, String);

    #[derive(Default)]
    struct Answer {
        status: Mutex<(u16, String)>,
        seen: Mutex<Vec<Seen>>,
        requests: AtomicUsize,
    }

    /// A GitLab answering every request with the status and body set in [`Answer`].
    async fn gitlab() -> (Arc<GitlabClient>, Arc<Answer>, Secret) {
        let answer = Arc::new(Answer::default());
        let state = answer.clone();
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let state = state.clone();
            async move {
                state.requests.fetch_add(1, Ordering::SeqCst);
                let (parts, body) = request.into_parts();
                let body = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
                let seen = (
                    parts.method.to_string(),
                    parts.uri.path().to_owned(),
                    parts.headers,
                    String::from_utf8_lossy(&body).into_owned(),
                );
                state.seen.lock().unwrap().push(seen);
                let (status, body) = state.status.lock().unwrap().clone();
                let headers =
                    [(http::header::CONTENT_TYPE, "application/json"), (http::header::LOCATION, "http://127.0.0.1:1/")];
                (StatusCode::from_u16(status).unwrap(), headers, body).into_response()
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let secret = Secret::generate();
        let client = GitlabClient::new(&GitlabConfig::default(), &address, secret.clone()).unwrap();
        (Arc::new(client), answer, secret)
    }

    impl Answer {
        fn set(&self, status: u16, body: &str) {
            *self.status.lock().unwrap() = (status, body.to_owned());
        }
        fn last(&self) -> Seen {
            self.seen.lock().unwrap().last().cloned().unwrap()
        }
    }

    const TOKEN: &str = "glcbt-secret-job-token";
    const PAT: &str = "glpat-secret-user-token";

    #[tokio::test]
    async fn allowed_agents_sends_the_job_token_and_maps_gitlabs_answers() {
        let (client, answer, _) = gitlab().await;
        answer.set(200, ALLOWED_AGENTS);
        let a = client.allowed_agents_for_job(TOKEN).await.unwrap();
        assert_eq!(a.allowed_agents.len(), 6);
        let (method, path, headers, _) = answer.last();
        assert_eq!((method.as_str(), path.as_str()), ("GET", ALLOWED_AGENTS_PATH));
        assert_eq!(headers.get("job-token").unwrap(), TOKEN);
        assert!(headers.get(API_REQUEST_HEADER).is_none(), "a public API call carries no kas JWT");

        // (status, GitLab's body, kind, what the message says)
        let cases = [
            (
                401,
                r#"{"message":"401 Unauthorized"}"#,
                tonic::Code::Unauthenticated,
                "the CI job token is not valid (unknown, or its job is not running; GitLab answered 401 Unauthorized)",
            ),
            (
                403,
                r#"{"message":"403 Forbidden - job token scope"}"#,
                tonic::Code::PermissionDenied,
                "the CI job token may not list the agents of its project (GitLab answered 403 Forbidden: 403 Forbidden - job token scope)",
            ),
            (
                404,
                r#"{"message":"404 Job Not Found"}"#,
                tonic::Code::PermissionDenied,
                "(GitLab answered 404 Not Found: 404 Job Not Found)",
            ),
            // GitLab's message is dropped if it repeats the token.
            (
                401,
                &format!(r#"{{"message":"bad token {TOKEN}"}}"#),
                tonic::Code::Unauthenticated,
                "GitLab answered 401 Unauthorized)",
            ),
            (
                500,
                "oops",
                tonic::Code::Unavailable,
                "GitLab is unavailable: allowed_agents answered HTTP 500 Internal Server Error",
            ),
            (302, "", tonic::Code::Unavailable, "allowed_agents answered HTTP 302 Found"),
            (200, "{}", tonic::Code::Unavailable, "invalid allowed_agents response: missing field `job`"),
            (
                200,
                &ALLOWED_AGENTS.replace(r#""id": 1001"#, r#""id": -1"#),
                tonic::Code::Unavailable,
                "invalid allowed_agents response: job.id must be positive, got -1",
            ),
        ];
        for (status, body, code, message) in cases {
            answer.set(status, body);
            let e = client.allowed_agents_for_job(TOKEN).await.unwrap_err();
            assert_eq!(e.grpc_code(), code, "{status}: {e}");
            assert!(e.to_string().contains(message), "{status}: {e}");
            assert!(!e.to_string().contains(TOKEN), "{e}");
        }
        // Tokens GitLab cannot be sent are refused without a request.
        let before = answer.requests.load(Ordering::SeqCst);
        for bad in ["", "a\nb"] {
            let e = client.allowed_agents_for_job(bad).await.unwrap_err();
            assert_eq!(e.grpc_code(), tonic::Code::Unauthenticated, "{e}");
        }
        assert_eq!(answer.requests.load(Ordering::SeqCst), before);
    }

    #[tokio::test]
    async fn authorize_proxy_user_sends_gitlabs_request_and_maps_its_answers() {
        let (client, answer, secret) = gitlab().await;
        let ok = r#"{"agent": {"id": 5, "config_project": {"id": 50}}, "user": {"id": 7, "username": "bob"},
                     "access_as": {"agent": {}}}"#;
        answer.set(200, ok);
        let pat = ProxyUserAccessType::PersonalAccessToken;
        let r = client.authorize_proxy_user(AgentId(5), pat, PAT).await.unwrap();
        assert_eq!((r.user.username.as_str(), r.access_as.clone()), ("bob", UserAccessAs::Agent));
        let (method, path, headers, body) = answer.last();
        assert_eq!((method.as_str(), path.as_str()), ("POST", AUTHORIZE_PROXY_USER_PATH));
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        let expected = serde_json::json!({"agent_id": 5, "access_type": "personal_access_token", "access_key": PAT, "csrf_token": ""});
        assert_eq!(body, expected);
        assert_eq!(headers.get("content-type").unwrap(), "application/json");
        // The internal API's JWT, as for agent_info.
        let jwt = headers.get(API_REQUEST_HEADER).unwrap().to_str().unwrap();
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.set_issuer(&["gitlab-kas"]);
        validation.set_audience(&["gitlab"]);
        jsonwebtoken::decode::<serde_json::Value>(
            jwt,
            &jsonwebtoken::DecodingKey::from_secret(secret.bytes()),
            &validation,
        )
        .unwrap();

        let cases = [
            (
                400,
                r#"{"message":"400 Bad request - Unable to get user from request data"}"#,
                tonic::Code::Unauthenticated,
                "the personal access token is not valid (unknown, revoked or expired; GitLab answered 400 Bad Request: 400 Bad request - Unable to get user from request data)",
            ),
            (
                401,
                r#"{"message":"401 Unauthorized - Token was revoked"}"#,
                tonic::Code::Unauthenticated,
                "GitLab answered 401 Unauthorized: 401 Unauthorized - Token was revoked)",
            ),
            (
                403,
                r#"{"message":"403 Forbidden"}"#,
                tonic::Code::PermissionDenied,
                "the personal access token's user may not use agent 5 (no user_access for the user, or the token lacks the k8s_proxy scope; GitLab answered 403 Forbidden)",
            ),
            (
                404,
                r#"{"message":"404 Agent Not Found"}"#,
                tonic::Code::PermissionDenied,
                "GitLab knows no agent 5 (GitLab answered 404 Not Found: 404 Agent Not Found)",
            ),
            (503, "", tonic::Code::Unavailable, "authorize_proxy_user answered HTTP 503 Service Unavailable"),
            (
                200,
                &ok.replace(r#""id": 5"#, r#""id": 6"#),
                tonic::Code::Unavailable,
                "invalid authorize_proxy_user response: it names agent 6, kas asked about agent 5",
            ),
            (200, &ok.replace(r#"{"agent": {}}"#, "{}"), tonic::Code::Unavailable, "access_as sets no mode"),
        ];
        for (status, body, code, message) in cases {
            answer.set(status, body);
            let e = client.authorize_proxy_user(AgentId(5), pat, PAT).await.unwrap_err();
            assert_eq!(e.grpc_code(), code, "{status}: {e}");
            assert!(e.to_string().contains(message), "{status}: {e}");
            assert!(!e.to_string().contains(PAT), "{e}");
        }
    }

    #[tokio::test]
    async fn answers_are_cached_per_token_and_agent() {
        let (client, answer, _) = gitlab().await;
        let access = CallerAccess::new(client, &CallerCacheConfig::default());
        answer.set(401, "{}");
        for _ in 0..3 {
            access.allowed_agents_for_job(TOKEN).await.unwrap_err();
        }
        assert_eq!(answer.requests.load(Ordering::SeqCst), 1, "the refusal is cached");
        answer.set(200, ALLOWED_AGENTS);
        let a = access.allowed_agents_for_job("another-token").await.unwrap();
        let b = access.allowed_agents_for_job("another-token").await.unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(answer.requests.load(Ordering::SeqCst), 2);

        answer.set(
            200,
            r#"{"agent": {"id": 5, "config_project": {"id": 50}}, "user": {"id": 7, "username": "bob"},
                          "access_as": {"agent": {}}}"#,
        );
        let pat = ProxyUserAccessType::PersonalAccessToken;
        access.authorize_proxy_user(AgentId(5), pat, PAT).await.unwrap();
        access.authorize_proxy_user(AgentId(5), pat, PAT).await.unwrap();
        assert_eq!(answer.requests.load(Ordering::SeqCst), 3);
        // Another agent is another question (GitLab's answer names agent 5: not understood).
        access.authorize_proxy_user(AgentId(6), pat, PAT).await.unwrap_err();
        assert_eq!(answer.requests.load(Ordering::SeqCst), 4);

        // Keys are digests (never the token), distinct per kind, agent and token.
        assert!(access.jobs.contains(&job_key(TOKEN)));
        let plain: CacheKey = Sha256::digest(TOKEN.as_bytes()).into();
        assert!(!access.jobs.contains(&plain));
        assert_ne!(user_key(AgentId(5), pat, PAT), user_key(AgentId(6), pat, PAT));
        assert_ne!(user_key(AgentId(5), pat, TOKEN), job_key(TOKEN));
        assert!(access.users.contains(&user_key(AgentId(5), pat, PAT)));
        assert_eq!(access.users.len(), 2);
    }
}
