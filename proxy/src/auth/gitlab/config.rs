//! GitLab mode's configuration section (`gitlab`) and its defaults.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::tools::token_bucket::RateLimitConfig;

/// The agent's configuration project over HTTP(S) from GitLab itself.
pub const DEFAULT_GITLAB_REPOSITORY_URL: &str = "{gitlab}/{project_path}.git";
/// GitLab mode: kas -> GitLab request timeouts.
pub const DEFAULT_GITLAB_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_GITLAB_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A verified agent token is re-checked with GitLab this often (revocation takes this long).
pub const DEFAULT_AGENT_INFO_TTL: Duration = Duration::from_secs(300);
/// Failed verifications are remembered briefly, so a broken agent cannot hammer GitLab.
pub const DEFAULT_AGENT_INFO_ERROR_TTL: Duration = Duration::from_secs(10);
pub const DEFAULT_AGENT_INFO_MAX_ENTRIES: usize = 10_000;
/// CI job tokens and personal access tokens are re-checked with GitLab this often: a job that
/// ended or a revoked token keeps access this long at most.
pub const DEFAULT_CALLER_CACHE_TTL: Duration = Duration::from_secs(10);
/// Refusals (and GitLab failures) for callers are remembered briefly, so a script retrying a
/// bad token cannot hammer GitLab.
pub const DEFAULT_CALLER_CACHE_ERROR_TTL: Duration = Duration::from_secs(5);
pub const DEFAULT_CALLER_CACHE_MAX_ENTRIES: usize = 10_000;
/// kas -> GitLab requests: 10 per second sustained, bursts of 50, callers wait up to 5 s.
pub const DEFAULT_GITLAB_RATE: u32 = RateLimitConfig::DEFAULT.requests_per_second;
pub const DEFAULT_GITLAB_BURST: u32 = RateLimitConfig::DEFAULT.burst;
pub const DEFAULT_GITLAB_RATE_MAX_WAIT: Duration = RateLimitConfig::DEFAULT.max_wait;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GitlabConfig {
    /// File with the base64 secret shared with GitLab (verifies api listener JWTs, signs kas's
    /// requests to GitLab). Required.
    pub authentication_secret_file: Option<PathBuf>,
    /// GitLab's URL (`https://gitlab.example.com`). When set, agent tokens are verified by
    /// GitLab's internal API instead of the static agents file ("GitLab mode").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// PEM CA certificates trusted for `address` (in addition to the public roots).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_cert_file: Option<PathBuf>,
    /// Connecting to GitLab fails after this long.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// A whole request to GitLab fails after this long.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    pub agent_info_cache: AgentInfoCacheConfig,
    /// Answers about callers of the Kubernetes API proxy: CI job tokens (allowed_agents) and
    /// personal access tokens (authorize_proxy_user), cached per token.
    pub caller_cache: CallerCacheConfig,
    pub rate_limit: RateLimitConfig,
    /// Where kas fetches an agent's configuration project from (GitLab's own kas uses Gitaly;
    /// this kas speaks Git's HTTP protocol, or reads a local path). Placeholders, from GitLab's
    /// agent_info: `{gitlab}` (gitlab.address), `{project_path}` (`group/project`),
    /// `{relative_path}` and `{storage_name}` (Gitaly's storage location), `{gl_repository}`.
    /// A value that is not an http(s) URL is a local path (e.g. Gitaly's storage directory).
    pub repository_url: String,
}

impl Default for GitlabConfig {
    fn default() -> Self {
        Self {
            authentication_secret_file: None,
            address: None,
            ca_cert_file: None,
            connect_timeout: DEFAULT_GITLAB_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_GITLAB_REQUEST_TIMEOUT,
            agent_info_cache: AgentInfoCacheConfig::default(),
            caller_cache: CallerCacheConfig::default(),
            rate_limit: RateLimitConfig::default(),
            repository_url: DEFAULT_GITLAB_REPOSITORY_URL.to_owned(),
        }
    }
}

/// Agent token -> agent info answers from GitLab, cached per token (keyed by its SHA-256), and
/// with Redis shared between kas (keyed by an HMAC of it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentInfoCacheConfig {
    /// How long a successful answer is reused (a revoked token keeps working this long).
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How long a failed answer (401, 403, GitLab unavailable) is reused.
    #[serde(with = "humantime_serde")]
    pub error_ttl: Duration,
    /// Most tokens kept; expired entries go first, then the ones expiring soonest.
    pub max_entries: usize,
    /// With a Redis registry, share successful answers between kas (for what is left of `ttl`):
    /// an agent moving to another kas is not verified with GitLab again. No effect without Redis.
    pub shared: bool,
}

impl Default for AgentInfoCacheConfig {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_AGENT_INFO_TTL,
            error_ttl: DEFAULT_AGENT_INFO_ERROR_TTL,
            max_entries: DEFAULT_AGENT_INFO_MAX_ENTRIES,
            shared: true,
        }
    }
}

/// CI job token -> allowed agents and (personal access token, agent) -> user authorization
/// answers from GitLab, cached per token (keyed by a SHA-256, the token itself is not kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CallerCacheConfig {
    /// How long a successful answer is reused (a revoked token or a finished job keeps access
    /// this long).
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How long a refusal (401, 403, 404) or a GitLab failure is reused.
    #[serde(with = "humantime_serde")]
    pub error_ttl: Duration,
    /// Most answers kept, per kind of token; expired entries go first, then the ones expiring
    /// soonest.
    pub max_entries: usize,
}

impl Default for CallerCacheConfig {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_CALLER_CACHE_TTL,
            error_ttl: DEFAULT_CALLER_CACHE_ERROR_TTL,
            max_entries: DEFAULT_CALLER_CACHE_MAX_ENTRIES,
        }
    }
}
