//! agentk's one error type (start-up and configuration failures).

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot read {what} {path}: {source}")]
    ReadFile { what: &'static str, path: String, source: std::io::Error },
    #[error("token file {0} is empty")]
    EmptyToken(String),
    #[error("invalid kas address {address}: {message}")]
    KasAddress { address: String, message: String },
    #[error("Kubernetes client configuration: {0}")]
    Kube(String),
    #[error("cannot start the tunnels' runtime thread: {0}")]
    DataPlane(std::io::Error),
    #[error("cannot listen on --observability-address {address}: {source}")]
    ObservabilityBind { address: SocketAddr, source: std::io::Error },
}
