//! The cluster state feature's settings (`cluster_state`) and their defaults.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// After agentk's stream ends, its views are kept (and served, marked with `observed_at`) this
/// long: long enough to ride out an agentk restart or a kas rollout.
pub const DEFAULT_CLUSTER_STATE_RETENTION: Duration = Duration::from_secs(15 * 60);
/// Views one agent may push (10,000-pod clusters with room to spare): the bound on what one
/// agent costs kas's memory.
pub const DEFAULT_MAX_OBJECTS_PER_AGENT: usize = 100_000;

/// `cluster_state`: what kas keeps of the views agentk pushes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterStateConfig {
    /// How long an agent's views stay readable after its stream ended.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Views one agent may push; agentk's stream fails with RESOURCE_EXHAUSTED beyond it.
    pub max_objects_per_agent: usize,
}

impl Default for ClusterStateConfig {
    fn default() -> Self {
        Self { retention: DEFAULT_CLUSTER_STATE_RETENTION, max_objects_per_agent: DEFAULT_MAX_OBJECTS_PER_AGENT }
    }
}
