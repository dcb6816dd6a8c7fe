//! The GitOps feature's settings (`gitops`) and their defaults.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// An open GitOps stream polls its manifest project this often (all streams of one project at
/// the same instants, `objects::until_next_poll`). Pushes (`KasApi.GitPushEvent`) make it poll
/// at once, so polling is only the safety net.
pub const DEFAULT_GITOPS_POLL_PERIOD: Duration = Duration::from_secs(300);
/// agentk's sync reports are kept this long after an agent's last report.
pub const DEFAULT_GITOPS_STATUS_TTL: Duration = Duration::from_secs(24 * 3600);
/// GitLab mode: project_info answers (where a manifest project is, whether the agent may read
/// it) are reused this long per agent token and project (as the reference's
/// `project_info_cache_ttl`); refusals and failures for the error TTL.
pub const DEFAULT_PROJECT_INFO_TTL: Duration = Duration::from_secs(300);
pub const DEFAULT_PROJECT_INFO_ERROR_TTL: Duration = Duration::from_secs(10);
pub const DEFAULT_PROJECT_INFO_MAX_ENTRIES: usize = 10_000;

/// `gitops`: how kas serves agentk's GitOps streams and keeps their status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GitopsConfig {
    /// How often an open GitOps stream polls its manifest project (the streams of one project
    /// together, at its phase). A push
    /// notification (`KasApi.GitPushEvent`, `POST /api/v1/git_push_events`) polls at once.
    #[serde(with = "humantime_serde")]
    pub poll_period: Duration,
    /// How long agentk's last sync reports are kept (in the registry, for every kas) after the
    /// agent's last report.
    #[serde(with = "humantime_serde")]
    pub status_ttl: Duration,
    /// GitLab mode: cache of project_info answers, per agent token and manifest project.
    pub project_info_cache: ProjectInfoCacheConfig,
}

impl Default for GitopsConfig {
    fn default() -> Self {
        Self {
            poll_period: DEFAULT_GITOPS_POLL_PERIOD,
            status_ttl: DEFAULT_GITOPS_STATUS_TTL,
            project_info_cache: ProjectInfoCacheConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProjectInfoCacheConfig {
    /// How long an answer is reused (an agent whose access was revoked keeps it this long).
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How long a refusal (403, 404) or a GitLab failure is reused.
    #[serde(with = "humantime_serde")]
    pub error_ttl: Duration,
    /// Most answers kept.
    pub max_entries: usize,
}

impl Default for ProjectInfoCacheConfig {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_PROJECT_INFO_TTL,
            error_ttl: DEFAULT_PROJECT_INFO_ERROR_TTL,
            max_entries: DEFAULT_PROJECT_INFO_MAX_ENTRIES,
        }
    }
}
