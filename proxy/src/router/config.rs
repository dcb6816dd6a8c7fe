//! The router's configuration section (`routing`); its defaults are the router's own.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{DEFAULT_MAX_CONCURRENT_REQUESTS, DEFAULT_MAX_CONCURRENT_REQUESTS_PER_AGENT, DEFAULT_MAX_WAIT};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// Longest wait for an agent to connect (the caller's own deadline wins when shorter).
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// Requests (in flight or waiting for their agent) this kas takes at once; more get
    /// RESOURCE_EXHAUSTED / 429. Watches and log streams count while they stream.
    pub max_concurrent_requests: usize,
    /// The same per agent, so one busy agent cannot take all of a kas.
    pub max_concurrent_requests_per_agent: usize,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            max_wait: DEFAULT_MAX_WAIT,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_concurrent_requests_per_agent: DEFAULT_MAX_CONCURRENT_REQUESTS_PER_AGENT,
        }
    }
}
