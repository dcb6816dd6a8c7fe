//! agentk: keeps reverse tunnels open to kas and serves the requests that come through them.

pub mod app;
pub mod backoff;
pub mod config;
pub mod data_plane;
pub mod error;
pub mod metrics;
pub mod modules;
pub mod observability;
pub mod pool;
pub mod status;
pub mod tunnel;
pub mod tunnel_codec;

pub use app::App;
pub use config::{AgentConfig, Args, ENVIRONMENT_VARIABLES, KubeSource};
pub use error::AgentError;
pub use observability::{LIVEZ_PATH, READYZ_PATH};
pub use status::Status;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = match option_env!("AGENTK_COMMIT") {
    Some(c) => c,
    None => "unknown",
};
