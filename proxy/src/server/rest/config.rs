//! The rest listener's configuration section (`rest`) and its defaults.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// JSON routes of the rest listener answer 504 after this long (longer than routing.max_wait, so
/// a request for an agent that is not connected gets the router's explanation first).
pub const DEFAULT_REST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Request bodies above this size are refused (413): the Kubernetes API server's own limit.
pub const DEFAULT_REST_MAX_REQUEST_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The REST gateway (`listeners.rest`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RestConfig {
    /// Longest time a JSON route may take (504 after it). Not applied to the Kubernetes API
    /// proxy path, which streams (watches, logs, exec).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Largest request body accepted, in bytes (413 above it).
    pub max_request_body_bytes: usize,
    pub cors: CorsConfig,
}

impl Default for RestConfig {
    fn default() -> Self {
        Self {
            request_timeout: DEFAULT_REST_REQUEST_TIMEOUT,
            max_request_body_bytes: DEFAULT_REST_MAX_REQUEST_BODY_BYTES,
            cors: CorsConfig::default(),
        }
    }
}

/// Cross-origin requests (browsers): off unless origins are listed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorsConfig {
    /// Origins allowed to call the REST gateway from a browser, e.g. `https://gitlab.example.com`;
    /// `*` allows any origin. Empty: no CORS headers are sent (same-origin only).
    pub allowed_origins: Vec<String>,
}
