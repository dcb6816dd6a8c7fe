//! kas: the Kubernetes agent server. See ARCHITECTURE.md for the map of this crate.

pub mod agent;
pub mod app;
pub mod auth;
pub mod config;
pub mod error;
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
