//! The configuration feature's settings (`agents.git`, the poll period) and their defaults.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::tools::token_bucket::RateLimitConfig;

/// Agent configurations (Git) are re-read this often per open presence stream.
pub const DEFAULT_CONFIGURATION_POLL_PERIOD: Duration = Duration::from_secs(20);
/// Largest agent configuration file (as GitLab's kas).
pub const DEFAULT_MAX_CONFIG_BYTES: u64 = 128 * 1024;
pub const DEFAULT_GIT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_GIT_FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Repository polls per second and burst (GitLab's kas limits Gitaly calls to 30/s, burst 70).
pub const DEFAULT_GIT_POLL_RATE: u32 = 30;
pub const DEFAULT_GIT_POLL_BURST: u32 = 70;

/// Agent configurations from Git repositories (local paths, or remote over HTTP(S)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentGitConfig {
    /// Largest `config.yaml` accepted; a larger one is FAILED_PRECONDITION.
    pub max_config_bytes: u64,
    /// Where kas keeps its copies (bare mirrors, one branch each) of remote repositories; one
    /// directory per kas process. Default: a temporary directory, removed when kas stops.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror_dir: Option<PathBuf>,
    /// HTTP basic credentials for remote repositories (for GitLab: any user name and a token
    /// with `read_repository`). The password is read from a file and never logged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// PEM CA certificates trusted for https repositories (in addition to the system's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_cert_file: Option<PathBuf>,
    /// Connecting to a remote repository fails after this long.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Each HTTP request of a fetch fails after this long.
    #[serde(with = "humantime_serde")]
    pub fetch_timeout: Duration,
    /// All repository polls of this kas (local reads and remote fetches) share this bucket; a
    /// poll that would wait longer than `max_wait` is skipped until the next period.
    pub rate_limit: RateLimitConfig,
}

impl Default for AgentGitConfig {
    fn default() -> Self {
        Self {
            max_config_bytes: DEFAULT_MAX_CONFIG_BYTES,
            mirror_dir: None,
            username: None,
            password_file: None,
            ca_cert_file: None,
            connect_timeout: DEFAULT_GIT_CONNECT_TIMEOUT,
            fetch_timeout: DEFAULT_GIT_FETCH_TIMEOUT,
            rate_limit: RateLimitConfig {
                requests_per_second: DEFAULT_GIT_POLL_RATE,
                burst: DEFAULT_GIT_POLL_BURST,
                max_wait: RateLimitConfig::DEFAULT.max_wait,
            },
        }
    }
}
