//! GitLab mode: agent tokens are verified by GitLab's internal API.
//!
//! `GET {gitlab}/api/v4/internal/kubernetes/agent_info` with the agent token as
//! `Authorization: Bearer <agent token>` and a `Gitlab-Kas-Api-Request` header carrying a
//! short-lived JWT (HS256, issuer `gitlab-kas`, audience `gitlab`) signed with the secret shared
//! with GitLab. 200 → the agent's info; 401 → UNAUTHENTICATED; 403 → PERMISSION_DENIED;
//! anything else, network errors and timeouts → UNAVAILABLE.
//!
//! Answers are cached per token (keyed by the token's SHA-256, see [`TtlCache`]): successes for
//! `gitlab.agent_info_cache.ttl`, failures for `error_ttl`; concurrent verifications of one token
//! share one request. With a Redis registry, successes are also shared between kas ([`shared`]):
//! a local miss reads the shared entry before asking GitLab. Requests to GitLab pass a
//! [`TokenBucket`]. Tokens are never logged.
//!
//! [`caller_access`] asks GitLab about callers of the Kubernetes API proxy (CI job tokens,
//! personal access tokens) through the same client, so the same bucket, and
//! [`GitlabClient::project_info`] where a GitOps manifest project is, as the agent sees it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kas_proto::{AgentId, ProjectId};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub mod caller_access;
pub mod config;
pub mod repository_url;
pub mod shared;

pub use caller_access::CallerAccess;
pub use config::GitlabConfig;
pub use repository_url::RepositoryUrlTemplate;
pub use shared::{SharedAgentInfoCache, SharedCacheError, SharedKey, SharedKeys};

use super::agent_token::{StaticAgents, TokenVerifier};
use super::jwt::{KAS_ISSUER, mint_jwt};
use super::secret::Secret;
use crate::agent::{AgentIdentity, ConfigurationOrigin};
use crate::error::KasError;
use crate::tools::token_bucket::TokenBucket;
use crate::tools::ttl_cache::TtlCache;
use shared::{SHARED_CACHE_TIMEOUT, SharedLevel};

/// GitLab's internal API path answering "whose agent token is this".
pub const AGENT_INFO_PATH: &str = "/api/v4/internal/kubernetes/agent_info";
/// GitLab's internal API path answering "where is this project, and may this agent read it".
pub const PROJECT_INFO_PATH: &str = "/api/v4/internal/kubernetes/project_info";
/// The header carrying kas's JWT on requests to GitLab's internal API.
pub const API_REQUEST_HEADER: &str = "Gitlab-Kas-Api-Request";
/// Audience of kas -> GitLab JWTs (the issuer is [`KAS_ISSUER`], `gitlab-kas`).
pub const GITLAB_AUDIENCE: &str = "gitlab";
/// Validity of the JWT on each request: just long enough to arrive.
const API_JWT_TTL: Duration = Duration::from_secs(5);
/// With the shared cache, an answer in use is renewed once less than `ttl` / this is left.
const RENEW_AHEAD_DIVISOR: u32 = 4;
/// Larger agent_info bodies are refused (a real one is well under 2 KiB).
const MAX_RESPONSE_BYTES: usize = 256 * 1024;

/// GitLab's agent_info answer (the fields kas uses; unknown fields are ignored because GitLab
/// adds fields over time). `gitaly_info.token` is deliberately not read. Serialized (JSON) as
/// the value of the shared cache's entries ([`shared`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    pub project_id: i64,
    pub agent_id: i64,
    pub agent_name: String,
    #[serde(default)]
    pub gitaly_info: Option<GitalyInfo>,
    /// The agent's configuration project repository.
    #[serde(default)]
    pub gitaly_repository: Option<GitalyRepository>,
    #[serde(default)]
    pub default_branch: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitalyInfo {
    #[serde(default)]
    pub address: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitalyRepository {
    #[serde(default)]
    pub storage_name: String,
    #[serde(default)]
    pub relative_path: String,
    #[serde(default)]
    pub gl_repository: String,
    #[serde(default)]
    pub gl_project_path: String,
}

impl AgentInfo {
    /// The agent, with its configuration project's repository located by `repositories`
    /// (`gitlab.repository_url`) on the project's default branch.
    pub fn identity(&self, repositories: &RepositoryUrlTemplate, gitlab: &str) -> AgentIdentity {
        let configuration = match &self.gitaly_repository {
            Some(repository) => match repositories.render(gitlab, repository, &self.default_branch) {
                Ok(repository) => ConfigurationOrigin::Git(repository),
                Err(problem) => ConfigurationOrigin::Unusable(problem),
            },
            None => ConfigurationOrigin::Unusable("GitLab's agent_info names no configuration repository".into()),
        };
        AgentIdentity {
            agent_id: AgentId(self.agent_id),
            name: self.agent_name.clone(),
            project_id: ProjectId(self.project_id),
            configuration,
        }
    }
}

/// GitLab's project_info answer (unknown fields ignored, `gitaly_info` not read: this kas reads
/// repositories over HTTP or from a path, see `gitlab.repository_url`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ProjectInfo {
    pub project_id: i64,
    #[serde(default)]
    pub gitaly_repository: Option<GitalyRepository>,
    #[serde(default)]
    pub default_branch: String,
}

impl ProjectInfo {
    /// The project's repository (its default branch) located by `repositories`.
    pub fn repository(
        &self,
        repositories: &RepositoryUrlTemplate,
        gitlab: &str,
    ) -> Result<crate::agent::GitRepository, String> {
        let repository =
            self.gitaly_repository.as_ref().ok_or("GitLab's project_info names no repository".to_owned())?;
        repositories.render(gitlab, repository, &self.default_branch)
    }
}

/// Building the GitLab client failed (bad CA file, bad address).
#[derive(Debug, thiserror::Error)]
pub enum GitlabSetupError {
    #[error("gitlab.ca_cert_file: {0}")]
    Ca(String),
    #[error("gitlab: cannot build the HTTP client: {0}")]
    Client(String),
}

/// kas's client of GitLab's internal API (no cache; see [`GitlabVerifier`]).
#[derive(Debug)]
pub struct GitlabClient {
    http: reqwest::Client,
    agent_info_url: String,
    project_info_url: String,
    allowed_agents_url: String,
    authorize_proxy_user_url: String,
    secret: Secret,
    limiter: TokenBucket,
}

impl GitlabClient {
    /// `address` is GitLab's base URL (validated by `Config::validate`).
    pub fn new(config: &GitlabConfig, address: &str, secret: Secret) -> Result<Self, GitlabSetupError> {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .user_agent(format!("kas/{}", crate::VERSION));
        if let Some(path) = &config.ca_cert_file {
            let pem = crate::tools::tls::read_ca_bundle(path).map_err(GitlabSetupError::Ca)?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| GitlabSetupError::Ca(format!("{}: {e}", path.display())))?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| GitlabSetupError::Client(e.to_string()))?;
        let rl = &config.rate_limit;
        let base = address.trim_end_matches('/');
        Ok(Self {
            http,
            agent_info_url: format!("{base}{AGENT_INFO_PATH}"),
            project_info_url: format!("{base}{PROJECT_INFO_PATH}"),
            allowed_agents_url: format!("{base}{}", caller_access::ALLOWED_AGENTS_PATH),
            authorize_proxy_user_url: format!("{base}{}", caller_access::AUTHORIZE_PROXY_USER_PATH),
            secret,
            limiter: TokenBucket::new(rl.requests_per_second, rl.burst, rl.max_wait),
        })
    }

    /// Asks GitLab whose token this is (one request, rate limited, not cached).
    pub async fn agent_info(&self, token: &str) -> Result<AgentInfo, KasError> {
        counted(self.agent_info_uncounted(token).await)
    }

    /// Where `project` (a full path or a numeric id) is, and its default branch, as the agent
    /// holding `token` sees it (one request, rate limited, not cached). GitLab answers 403 when
    /// the agent may not read the project (PERMISSION_DENIED) and 404 when there is no such
    /// project (NOT_FOUND).
    pub async fn project_info(&self, token: &str, project: &str) -> Result<ProjectInfo, KasError> {
        counted(self.project_info_uncounted(token, project).await)
    }

    async fn project_info_uncounted(&self, token: &str, project: &str) -> Result<ProjectInfo, KasError> {
        self.acquire().await?;
        let jwt = self.api_jwt()?;
        let authorization = agent_authorization(token)?;
        let response = self
            .http
            .get(&self.project_info_url)
            .query(&[("id", project)])
            .header(http::header::AUTHORIZATION, authorization)
            .header(API_REQUEST_HEADER, jwt)
            .send()
            .await
            .map_err(|e| unavailable(&e, "project_info"))?;
        match response.status() {
            http::StatusCode::OK => {}
            http::StatusCode::UNAUTHORIZED => {
                return Err(KasError::Unauthenticated("invalid agent token (GitLab answered 401 Unauthorized)".into()));
            }
            http::StatusCode::FORBIDDEN => {
                return Err(KasError::PermissionDenied(format!(
                    "the agent may not read project \"{project}\" (GitLab's project_info answered 403 Forbidden)"
                )));
            }
            http::StatusCode::NOT_FOUND => {
                return Err(KasError::NotFound(format!(
                    "GitLab has no project \"{project}\" (project_info answered 404 Not Found)"
                )));
            }
            other => {
                tracing::warn!(status = %other, "GitLab project_info failed");
                return Err(KasError::GitlabUnavailable(format!("project_info answered HTTP {other}")));
            }
        }
        let body = read_body(response, MAX_RESPONSE_BYTES, "project_info").await?;
        let info: ProjectInfo = serde_json::from_slice(&body)
            .map_err(|e| KasError::GitlabUnavailable(format!("invalid project_info response: {e}")))?;
        if info.project_id <= 0 {
            return Err(KasError::GitlabUnavailable(format!(
                "invalid project_info response: project_id {} must be positive",
                info.project_id
            )));
        }
        Ok(info)
    }

    /// Waits for kas's GitLab request bucket (every request to GitLab passes it).
    async fn acquire(&self) -> Result<(), KasError> {
        self.limiter.acquire().await.map_err(|e| KasError::RateLimited(format!("GitLab is unavailable: {e}")))
    }

    /// The `Gitlab-Kas-Api-Request` JWT of one request to GitLab's internal API.
    fn api_jwt(&self) -> Result<String, KasError> {
        mint_jwt(&self.secret, KAS_ISSUER, GITLAB_AUDIENCE, API_JWT_TTL)
    }

    async fn agent_info_uncounted(&self, token: &str) -> Result<AgentInfo, KasError> {
        self.acquire().await?;
        let jwt = self.api_jwt()?;
        let authorization = agent_authorization(token)?;
        let response = self
            .http
            .get(&self.agent_info_url)
            .header(http::header::AUTHORIZATION, authorization)
            .header(API_REQUEST_HEADER, jwt)
            .send()
            .await
            .map_err(|e| unavailable(&e, "agent_info"))?;
        let status = response.status();
        match status {
            http::StatusCode::OK => {}
            http::StatusCode::UNAUTHORIZED => {
                return Err(KasError::Unauthenticated("invalid agent token (GitLab answered 401 Unauthorized)".into()));
            }
            http::StatusCode::FORBIDDEN => {
                return Err(KasError::PermissionDenied(
                    "the agent token is not allowed to connect (GitLab answered 403 Forbidden)".into(),
                ));
            }
            other => {
                tracing::warn!(status = %other, "GitLab agent_info failed");
                return Err(KasError::GitlabUnavailable(format!("agent_info answered HTTP {other}")));
            }
        }
        let body = read_body(response, MAX_RESPONSE_BYTES, "agent_info").await?;
        let info: AgentInfo = serde_json::from_slice(&body)
            .map_err(|e| KasError::GitlabUnavailable(format!("invalid agent_info response: {e}")))?;
        if info.agent_id <= 0 || info.project_id <= 0 {
            return Err(KasError::GitlabUnavailable(format!(
                "invalid agent_info response: agent_id {} and project_id {} must be positive",
                info.agent_id, info.project_id
            )));
        }
        Ok(info)
    }
}

/// Counts a finished request to GitLab by outcome (`kas_gitlab_requests_total`).
fn counted<T>(result: Result<T, KasError>) -> Result<T, KasError> {
    crate::metrics::gitlab_request(match &result {
        Ok(_) => "ok",
        Err(KasError::Unauthenticated(_)) => "unauthenticated",
        Err(KasError::PermissionDenied(_)) => "permission_denied",
        Err(KasError::NotFound(_)) => "not_found",
        Err(KasError::RateLimited(_)) => "rate_limited",
        Err(_) => "unavailable",
    });
    result
}

/// The body of a successful answer of `endpoint`, refused (UNAVAILABLE) beyond `max` bytes.
async fn read_body(response: reqwest::Response, max: usize, endpoint: &str) -> Result<bytes::Bytes, KasError> {
    let too_large = || KasError::GitlabUnavailable(format!("{endpoint} response is too large"));
    if response.content_length().is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let body = response.bytes().await.map_err(|e| unavailable(&e, endpoint))?;
    if body.len() > max {
        return Err(too_large());
    }
    Ok(body)
}

/// UNAVAILABLE with the reason of a failed request (no URL, no headers: never the token).
fn unavailable(e: &reqwest::Error, endpoint: &str) -> KasError {
    let reason = if e.is_timeout() {
        "request to GitLab timed out".to_owned()
    } else if e.is_connect() {
        "cannot connect to GitLab".to_owned()
    } else {
        "request to GitLab failed".to_owned()
    };
    // The innermost cause (e.g. "Connection refused (os error 111)") helps operators.
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    tracing::warn!(reason, cause = %cause, endpoint, "GitLab request failed");
    KasError::GitlabUnavailable(format!("{reason}: {cause}"))
}

/// The [`TokenVerifier`] of GitLab mode: [`GitlabClient`] behind a per-token cache, and behind
/// that (with a Redis registry) a cache shared by every kas ([`shared`]).
#[derive(Debug)]
pub struct GitlabVerifier {
    client: Arc<GitlabClient>,
    cache: Arc<TtlCache<AgentInfo>>,
    /// `gitlab.agent_info_cache.ttl`: how long GitLab's yes holds, on this kas and in the shared cache.
    ttl: Duration,
    shared: Option<Arc<SharedLevel>>,
    /// Answers being renewed ahead of their expiry, or whose renewal failed (by cache key): no
    /// other attempt before the time kept here, the end of the answer the attempt began with.
    renewals: Arc<std::sync::Mutex<std::collections::HashMap<[u8; 32], tokio::time::Instant>>>,
    address: String,
    repositories: RepositoryUrlTemplate,
    /// Configurations set in the static agents file win over the project repository's.
    overrides: Option<Arc<StaticAgents>>,
}

impl GitlabVerifier {
    pub fn new(config: &GitlabConfig, address: &str, secret: Secret) -> Result<Self, GitlabSetupError> {
        let c = &config.agent_info_cache;
        Ok(Self {
            client: Arc::new(GitlabClient::new(config, address, secret)?),
            cache: Arc::new(TtlCache::new(c.ttl, c.error_ttl, c.max_entries)),
            renewals: Arc::default(),
            ttl: c.ttl,
            shared: None,
            address: address.to_owned(),
            repositories: RepositoryUrlTemplate::parse(&config.repository_url)
                .map_err(|e| GitlabSetupError::Client(format!("gitlab.repository_url: {e}")))?,
            overrides: None,
        })
    }

    /// The GitLab client (and its request bucket), shared with [`CallerAccess`].
    pub fn client(&self) -> Arc<GitlabClient> {
        self.client.clone()
    }

    /// Agents whose configuration the static agents file sets get that one.
    pub fn with_overrides(mut self, agents: Arc<StaticAgents>) -> Self {
        self.overrides = Some(agents);
        self
    }

    /// Behind the local cache, `store`: the cache every kas of the registry shares, keyed by
    /// `keys` (see [`shared`]).
    pub fn with_shared_cache(mut self, store: Arc<dyn SharedAgentInfoCache>, keys: SharedKeys) -> Self {
        self.shared = Some(Arc::new(SharedLevel::new(store, keys, SHARED_CACHE_TIMEOUT)));
        self
    }

    /// The agent info of `token`, from the local cache, the shared cache or GitLab. Concurrent
    /// callers share one load (both levels).
    pub async fn agent_info(&self, token: &str) -> Result<AgentInfo, KasError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let info = self.cache.get_or_fetch_expiring(key, || self.load(token)).await?;
        // Only with the shared cache (the renewal's purpose): no extra lookup without it.
        if self.shared.is_some()
            && let Some(left) = self.cache.remaining(&key).filter(|left| *left < self.ttl / RENEW_AHEAD_DIVISOR)
        {
            self.renew(key, token, left);
        }
        Ok(info)
    }

    /// With the shared cache: an answer in use is renewed in the background during the last
    /// quarter of its life, so the shared entry of a connected agent (verified at least once a
    /// minute by its tunnels) never lapses, and a failover finds every moved agent's entry
    /// instead of asking GitLab for those whose entry had just lapsed (issue 18: 20-30 % of
    /// them). The renewal adopts an entry another kas renewed, or asks GitLab; a failure leaves
    /// the answer to expire as before (a revoked token still stops working `ttl` after GitLab's
    /// last yes). One attempt per answer: a failed one is not repeated by the verifications
    /// that follow (a revoked token would otherwise ask GitLab on each).
    fn renew(&self, key: [u8; 32], token: &str, left: Duration) {
        let Some(shared) = self.shared.clone() else { return };
        {
            let now = tokio::time::Instant::now();
            let mut renewals = self.renewals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if renewals.get(&key).is_some_and(|not_before| *not_before > now) {
                return;
            }
            renewals.retain(|_, not_before| *not_before > now);
            renewals.insert(key, now + left);
        }
        let (client, cache, renewals, ttl) = (self.client.clone(), self.cache.clone(), self.renewals.clone(), self.ttl);
        let token = token.to_owned();
        tokio::spawn(async move {
            let shared_key = shared.key(&token);
            let renewed = match shared.get(&shared_key).await {
                Some((info, left)) if left >= ttl / RENEW_AHEAD_DIVISOR => {
                    cache.insert(key, info, left);
                    true
                }
                _ => match client.agent_info(&token).await {
                    Ok(info) => {
                        let answered = tokio::time::Instant::now();
                        shared.put(&shared_key, &info, ttl).await;
                        cache.insert(key, info, ttl.saturating_sub(answered.elapsed()));
                        crate::metrics::shared_agent_info("renewed");
                        true
                    }
                    Err(_) => false,
                },
            };
            // A new answer may be renewed in its own last quarter; a failed attempt waits for
            // the end of the answer it began with.
            if renewed {
                renewals.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&key);
            }
        });
    }

    /// A local miss: the shared entry if there is one (kept locally only as long as it lives
    /// there), else GitLab's answer, shared when it is a yes. Returns how long it holds.
    async fn load(&self, token: &str) -> Result<(AgentInfo, Duration), KasError> {
        let Some(shared) = &self.shared else {
            return self.client.agent_info(token).await.map(|info| (info, self.ttl));
        };
        let key = shared.key(token);
        if let Some((info, left)) = shared.get(&key).await {
            return Ok((info, left));
        }
        let info = self.client.agent_info(token).await?;
        let answered = tokio::time::Instant::now();
        shared.put(&key, &info, self.ttl).await;
        // Locally too, the yes holds `ttl` from GitLab's answer, not from the end of the write.
        Ok((info, self.ttl.saturating_sub(answered.elapsed())))
    }
}

#[async_trait]
impl TokenVerifier for GitlabVerifier {
    async fn verify(&self, token: &str) -> Result<AgentIdentity, KasError> {
        let mut identity = self.agent_info(token).await?.identity(&self.repositories, &self.address);
        if let Some(origin) = self.overrides.as_ref().and_then(|o| o.explicit_configuration(identity.agent_id)) {
            identity.configuration = origin.clone();
        }
        Ok(identity)
    }
}

/// `Authorization: Bearer <agent token>` for GitLab's internal API, marked sensitive (never logged).
fn agent_authorization(token: &str) -> Result<http::HeaderValue, KasError> {
    let mut authorization = http::HeaderValue::try_from(format!("Bearer {token}"))
        .map_err(|_| KasError::Unauthenticated("malformed agent token".into()))?;
    authorization.set_sensitive(true);
    Ok(authorization)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_response_and_ignores_new_fields() {
        let body = r#"{
            "project_id": 7, "agent_id": 3, "agent_name": "prod",
            "gitaly_info": {"address": "tcp://gitaly:8075", "token": "gitaly-secret", "features": {}},
            "gitaly_repository": {"storage_name": "default", "relative_path": "@hashed/aa/bb.git",
                "gl_repository": "project-7", "gl_project_path": "group/agents"},
            "default_branch": "main", "some_future_field": [1, 2]
        }"#;
        let info: AgentInfo = serde_json::from_str(body).unwrap();
        let template = RepositoryUrlTemplate::parse(config::DEFAULT_GITLAB_REPOSITORY_URL).unwrap();
        let identity = info.identity(&template, "https://gitlab.example.com");
        assert_eq!(
            (identity.agent_id, identity.name.as_str(), identity.project_id),
            (AgentId(3), "prod", ProjectId(7))
        );
        let ConfigurationOrigin::Git(repository) = identity.configuration else { panic!("{identity:?}") };
        assert_eq!(repository.location.to_string(), "https://gitlab.example.com/group/agents.git");
        assert_eq!(repository.branch.as_deref(), Some("main"));
        assert_eq!(info.default_branch, "main");
        assert_eq!(info.gitaly_repository.unwrap().gl_project_path, "group/agents");
        assert!(!format!("{:?}", info.gitaly_info).contains("gitaly-secret"), "the Gitaly token is not kept");
    }

    #[test]
    fn project_info_names_the_repository_and_its_default_branch() {
        let body = r#"{
            "project_id": 9,
            "gitaly_info": {"address": "tcp://gitaly:8075", "token": "gitaly-secret"},
            "gitaly_repository": {"storage_name": "default", "relative_path": "@hashed/cc.git",
                "gl_repository": "project-9", "gl_project_path": "platform/manifests"},
            "default_branch": "trunk", "new_field": {}
        }"#;
        let info: ProjectInfo = serde_json::from_str(body).unwrap();
        let template = RepositoryUrlTemplate::parse(config::DEFAULT_GITLAB_REPOSITORY_URL).unwrap();
        let repository = info.repository(&template, "https://gitlab.example.com").unwrap();
        assert_eq!(repository.location.to_string(), "https://gitlab.example.com/platform/manifests.git");
        assert_eq!(repository.branch.as_deref(), Some("trunk"));
        let bare: ProjectInfo = serde_json::from_str(r#"{"project_id": 9}"#).unwrap();
        assert!(bare.repository(&template, "https://g").unwrap_err().contains("names no repository"));
    }

    #[test]
    fn ca_file_problems_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = GitlabConfig { ca_cert_file: Some(dir.path().join("missing.pem")), ..Default::default() };
        let new = |c: &GitlabConfig| GitlabClient::new(c, "https://gitlab.example.com", Secret::generate());
        let e = new(&config).unwrap_err().to_string();
        assert!(e.contains("gitlab.ca_cert_file: cannot read") && e.contains("missing.pem"), "{e}");
        let pem = dir.path().join("ca.pem");
        std::fs::write(&pem, "not a certificate\n").unwrap();
        config.ca_cert_file = Some(pem);
        let e = new(&config).unwrap_err().to_string();
        assert!(e.contains("holds no usable PEM certificate"), "{e}");
        config.ca_cert_file = None;
        new(&config).unwrap();
    }

    #[tokio::test]
    async fn unreachable_gitlab_is_unavailable_and_the_cache_key_is_a_hash() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let v = GitlabVerifier::new(&GitlabConfig::default(), &address, Secret::generate()).unwrap();
        let token = "agent-token-never-logged";
        let e = v.verify(token).await.unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::Unavailable, "{e}");
        assert!(e.to_string().contains("cannot connect to GitLab"), "{e}");
        assert!(!e.to_string().contains(token));
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        assert!(v.cache.contains(&key));
        assert_eq!(v.cache.len(), 1);
    }
}
