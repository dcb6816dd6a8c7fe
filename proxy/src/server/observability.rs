//! The observability listener: Prometheus `/metrics`, `/livez`, `/readyz`. No authentication:
//! it binds loopback by default.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::registry::AgentRegistry;
use crate::tunnel::TunnelRegistry;

#[derive(Clone)]
pub struct ObservabilityState {
    pub tunnels: TunnelRegistry,
    pub registry: Arc<dyn AgentRegistry>,
    /// Whether a registry outage makes kas not ready (true with Redis).
    pub registry_required: bool,
    /// Cancelled when kas starts shutting down: not ready from then on, while still live.
    pub shutdown: tokio_util::sync::CancellationToken,
}

pub fn router(state: ObservabilityState) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(state): State<ObservabilityState>) -> Response {
    if let Ok(stats) = state.tunnels.stats().await {
        stats.record_gauges();
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], crate::metrics::handle().render()).into_response()
}

/// Ready: serving (not shutting down, the tunnel registry runs) and, with Redis, Redis answers.
async fn readyz(State(state): State<ObservabilityState>) -> Response {
    if state.shutdown.is_cancelled() || state.tunnels.stats().await.is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response();
    }
    if state.registry_required
        && let Err(e) = state.registry.ping().await
    {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("registry unavailable: {e}\n")).into_response();
    }
    (StatusCode::OK, "ok\n").into_response()
}
