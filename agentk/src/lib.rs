//! agentk: keeps reverse tunnels open to kas and serves the requests that come through them.

pub mod app;
pub mod backoff;
pub mod config;
pub mod metrics;
pub mod modules;
pub mod observability;
pub mod pool;
pub mod tunnel;

pub use app::{AgentError, App, Status};
pub use config::{AgentConfig, Args, KubeSource};
pub use observability::{LIVEZ_PATH, READYZ_PATH};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = match option_env!("AGENTK_COMMIT") {
    Some(c) => c,
    None => "unknown",
};
