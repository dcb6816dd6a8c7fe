//! kas: the Kubernetes agent server. See ARCHITECTURE.md for the map of this crate.

pub mod agent;
pub mod app;
pub mod auth;
pub mod config;
pub mod error;
pub mod log_format;
pub mod metrics;
pub mod modules;
pub mod registry;
pub mod router;
pub mod server;
pub mod standalone;
pub mod tools;
pub mod tunnel;

pub use app::{Addresses, App, AppError, Bound, Handle};
pub use config::Config;
pub use error::KasError;

/// kas version (the crate version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit kas was built from, when the build set `KAS_COMMIT`.
pub const COMMIT: &str = match option_env!("KAS_COMMIT") {
    Some(c) => c,
    None => "unknown",
};

/// The environment variables the `kas` binary reads: each flag's (checked against `kas --help`
/// by kas-e2e's `process` tests), then the ones read by libraries (anyhow prints a
/// backtrace with an error when these are set). Tests clear them from the processes they start,
/// so the caller's shell cannot change what runs.
pub const ENVIRONMENT_VARIABLES: &[&str] = &[
    "KAS_CONFIG",
    "KAS_DEV_DIR",
    "KAS_AGENT_ADDRESS",
    "KAS_API_ADDRESS",
    "KAS_INTERNAL_ADDRESS",
    "KAS_REST_ADDRESS",
    "KAS_OBSERVABILITY_ADDRESS",
    "KAS_REDIS_URL",
    "KAS_LOG",
    "KAS_LOG_FORMAT",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
];
