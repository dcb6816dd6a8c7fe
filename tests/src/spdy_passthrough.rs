//! `pods/portforward` on the fake API server, as a byte pass-through check only: it is NOT a
//! SPDY/3.1 server. A request with `Connection: Upgrade` and `Upgrade: SPDY/3.1` is answered
//! `101 Switching Protocols` (with the headers a real API server sends:
//! `Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version`), and from then on every byte received is sent
//! back unchanged. That proves kas and agentk carry a SPDY upgrade and the raw bytes after it both
//! ways untouched, which is all a SPDY session (exec/attach/cp of kubectl ≤ 1.29, port-forward of
//! kubectl ≤ 1.30) needs from them; the frames themselves are never parsed.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;

/// The `portforward.k8s.io` protocol kubectl asks for (client-go tools/portforward: `PortForwardProtocolV1Name`).
pub const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";

pub async fn port_forward(mut req: Request) -> Response {
    let upgrade = req.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if !upgrade.eq_ignore_ascii_case("SPDY/3.1") {
        let body = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 400,
            "reason": "BadRequest",
            "message": "the fake API server's port-forward is a SPDY/3.1 byte pass-through check only",
        });
        return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else { return };
        let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded));
        let _ = tokio::io::copy(&mut reader, &mut writer).await;
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    headers.insert("X-Stream-Protocol-Version", HeaderValue::from_static(PORT_FORWARD_PROTOCOL));
    response
}
