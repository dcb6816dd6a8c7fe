//! The registry's configuration section (`registry`) and its defaults.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Records live this long without a refresh: long enough to survive a few missed refreshes.
pub const DEFAULT_REGISTRY_TTL: Duration = Duration::from_secs(300);
/// Refresh well inside the TTL.
pub const DEFAULT_REGISTRY_REFRESH: Duration = Duration::from_secs(60);
/// Stale records are rare (a refresh keeps them alive); sweeping every few minutes is enough.
pub const DEFAULT_REGISTRY_GC: Duration = Duration::from_secs(300);
/// A kas that stops heartbeating (crashed) stops receiving routed requests this soon.
pub const DEFAULT_HEARTBEAT_TTL: Duration = Duration::from_secs(15);
/// Heartbeat a few times per TTL, so one slow write does not mark a live kas dead.
pub const DEFAULT_HEARTBEAT_PERIOD: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// Lifetime of a connection record without refresh.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How often this kas rewrites the expiry of its records.
    #[serde(with = "humantime_serde")]
    pub refresh_period: Duration,
    /// How often this kas removes stale records.
    #[serde(with = "humantime_serde")]
    pub gc_period: Duration,
    /// A kas instance whose heartbeat is older than this is treated as gone.
    #[serde(with = "humantime_serde")]
    pub heartbeat_ttl: Duration,
    /// How often this kas heartbeats.
    #[serde(with = "humantime_serde")]
    pub heartbeat_period: Duration,
    /// Use Redis (many kas replicas). Absent: in-memory registry (a single kas).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<super::redis::RedisConfig>,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_REGISTRY_TTL,
            refresh_period: DEFAULT_REGISTRY_REFRESH,
            gc_period: DEFAULT_REGISTRY_GC,
            heartbeat_ttl: DEFAULT_HEARTBEAT_TTL,
            heartbeat_period: DEFAULT_HEARTBEAT_PERIOD,
            redis: None,
        }
    }
}

impl RegistryConfig {
    pub fn timing(&self) -> super::RegistryTiming {
        super::RegistryTiming { ttl: self.ttl, heartbeat_ttl: self.heartbeat_ttl }
    }
}
