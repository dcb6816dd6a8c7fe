//! The observability listener: `GET /livez` and `GET /readyz` for the kubelet's probes.
//!
//! - `/livez`: 200 `ok` while the process runs (the listener is served until agentk has stopped,
//!   so a draining agentk is not killed early).
//! - `/readyz`: 200 `ok` when [`Status::is_ready`] (connected to kas with at least one idle
//!   tunnel), else 503 with a one-line reason. A draining agentk is not ready.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::AgentError;
use crate::status::Status;

/// Liveness probe path.
pub const LIVEZ_PATH: &str = "/livez";
/// Readiness probe path.
pub const READYZ_PATH: &str = "/readyz";

/// Binds the listener; a bad or busy address is a startup error naming the address.
pub async fn bind(address: SocketAddr) -> Result<TcpListener, AgentError> {
    TcpListener::bind(address).await.map_err(|source| AgentError::ObservabilityBind { address, source })
}

/// The probe endpoints, answering from `status`.
pub fn router(status: Status) -> Router {
    Router::new()
        .route(LIVEZ_PATH, get(livez))
        .route(READYZ_PATH, get(readyz))
        .route("/metrics", get(metrics))
        .with_state(status)
}

async fn metrics(State(status): State<Status>) -> ([(axum::http::header::HeaderName, &'static str); 1], String) {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], crate::metrics::render(&status))
}

async fn livez() -> &'static str {
    "ok\n"
}

async fn readyz(State(status): State<Status>) -> (StatusCode, &'static str) {
    match not_ready_reason(&status) {
        None => (StatusCode::OK, "ok\n"),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason),
    }
}

/// Why agentk is not ready, or `None` when it is.
pub fn not_ready_reason(status: &Status) -> Option<&'static str> {
    if status.connected.borrow().is_none() {
        Some("not ready: not connected to kas\n")
    } else if status.pool.borrow().idle == 0 {
        Some("not ready: connected to kas, no idle tunnel yet\n")
    } else {
        None
    }
}

/// Serves the probes on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, status: Status, shutdown: CancellationToken) {
    match listener.local_addr() {
        Ok(address) => tracing::info!(%address, "observability listening ({LIVEZ_PATH}, {READYZ_PATH})"),
        Err(e) => tracing::warn!(error = %e, "observability listening, address unknown"),
    }
    if let Err(e) = axum::serve(listener, router(status)).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::error!(error = %e, "observability listener failed");
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use kas_proto::ConnectionId;
    use tokio::sync::watch;
    use tower::ServiceExt;

    use super::*;
    use crate::pool::PoolStats;

    struct Fake {
        connected: watch::Sender<Option<ConnectionId>>,
        pool: watch::Sender<PoolStats>,
        status: Status,
    }

    fn fake() -> Fake {
        let (connected, connected_rx) = watch::channel(None);
        let (pool, pool_rx) = watch::channel(PoolStats::default());
        let status = Status {
            connected: connected_rx,
            pool: pool_rx,
            configuration: watch::channel(None).1,
            failed_attempts: watch::channel(0).1,
            observability_address: SocketAddr::from(([127, 0, 0, 1], 0)),
            gitops: watch::channel(Default::default()).1,
        };
        Fake { connected, pool, status }
    }

    async fn get(status: &Status, method: &str, path: &str) -> (StatusCode, String) {
        let request = Request::builder().method(method).uri(path).body(Body::empty()).unwrap();
        let response = router(status.clone()).oneshot(request).await.unwrap();
        let code = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (code, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn metrics_report_tunnels_connection_and_requests() {
        crate::metrics::handle();
        let f = fake();
        f.connected.send_replace(Some(ConnectionId(7)));
        f.pool.send_replace(PoolStats { idle: 3, in_use: 2 });
        crate::metrics::request("get_pods", crate::metrics::Outcome::Ok);
        crate::metrics::request("kubernetes_api", crate::metrics::Outcome::Error);
        crate::metrics::connected();
        let (code, body) = get(&f.status, "GET", "/metrics").await;
        assert_eq!(code, StatusCode::OK);
        for expected in [
            r#"agentk_tunnels{state="idle"} 3"#,
            r#"agentk_tunnels{state="in_use"} 2"#,
            "agentk_connected 1",
            "agentk_connections_total",
            r#"agentk_requests_total{module="get_pods",outcome="ok"}"#,
            r#"agentk_requests_total{module="kubernetes_api",outcome="error"}"#,
            "agentk_build_info{",
        ] {
            assert!(body.contains(expected), "{expected} missing from:\n{body}");
        }
        assert!(!body.contains("connection_id"), "no unbounded labels");
    }

    #[tokio::test]
    async fn livez_is_ok_whatever_the_connection() {
        let f = fake();
        assert_eq!(get(&f.status, "GET", "/livez").await, (StatusCode::OK, "ok\n".into()));
        f.connected.send_replace(Some(ConnectionId(7)));
        assert_eq!(get(&f.status, "GET", "/livez").await, (StatusCode::OK, "ok\n".into()));
    }

    #[tokio::test]
    async fn readyz_follows_connection_and_idle_tunnels() {
        let f = fake();
        let (code, body) = get(&f.status, "GET", "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("not connected to kas"), "{body}");

        f.connected.send_replace(Some(ConnectionId(7)));
        let (code, body) = get(&f.status, "GET", "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("no idle tunnel"), "{body}");

        f.pool.send_replace(PoolStats { idle: 1, in_use: 0 });
        assert_eq!(get(&f.status, "GET", "/readyz").await, (StatusCode::OK, "ok\n".into()));

        // Busy tunnels alone do not make agentk ready: a new request would have to wait.
        f.pool.send_replace(PoolStats { idle: 0, in_use: 3 });
        assert_eq!(get(&f.status, "GET", "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);

        f.pool.send_replace(PoolStats { idle: 2, in_use: 3 });
        assert_eq!(get(&f.status, "GET", "/readyz").await.0, StatusCode::OK);
        f.connected.send_replace(None);
        let (code, body) = get(&f.status, "GET", "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("not connected to kas"), "{body}");
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_are_refused() {
        let f = fake();
        assert_eq!(get(&f.status, "GET", "/healthz").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get(&f.status, "POST", "/livez").await.0, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn bind_error_names_the_address() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = taken.local_addr().unwrap();
        let err = bind(address).await.unwrap_err().to_string();
        assert!(err.contains(&address.to_string()) && err.contains("--observability-address"), "{err}");
    }

    #[tokio::test]
    async fn serves_over_tcp_until_shutdown() {
        let f = fake();
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let address = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, f.status.clone(), shutdown.clone()));
        let response = raw_get(address, "/livez").await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("\r\n\r\nok\n"), "{response}");
        shutdown.cancel();
        server.await.unwrap();
        assert!(tokio::net::TcpStream::connect(address).await.is_err(), "listener closed after shutdown");
    }

    async fn raw_get(address: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }
}
