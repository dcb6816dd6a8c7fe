//! `pods/portforward` on the fake API server. `portforward.k8s.io` upgrades get the SPDY/3.1
//! port-forward server of [`crate::spdy`]: over the raw connection after `Upgrade: SPDY/3.1`
//! (kubectl ≤ 1.30), or inside WebSocket binary messages with subprotocol
//! `SPDY/3.1+portforward.k8s.io` (kubectl ≥ 1.31; the API server tunnels it to the kubelet).
//!
//! A SPDY upgrade asking for [`BYTE_ECHO_PROTOCOL`] instead (a test-only protocol, never sent by
//! kubectl) is a byte pass-through check, NOT SPDY: `101 Switching Protocols`, then every byte
//! received is sent back unchanged, never parsed.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;

/// The `portforward.k8s.io` protocol kubectl asks for (client-go tools/portforward: `PortForwardProtocolV1Name`).
pub const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";
/// The WebSocket subprotocol of port-forward tunnelled over WebSocket (client-go
/// tools/portforward/tunneling_dialer.go).
pub const TUNNELED_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// `X-Stream-Protocol-Version` of the byte-echo check (test-only).
pub const BYTE_ECHO_PROTOCOL: &str = "byte-echo.kas-e2e.test";

/// Port-forward sessions served so far: (transport, what the session saw).
pub type Sessions = std::sync::Arc<std::sync::Mutex<Vec<(&'static str, crate::spdy::SharedRecord)>>>;

/// A new session's record, listed from its start.
fn record(sessions: &Sessions, transport: &'static str) -> crate::spdy::SharedRecord {
    let record = crate::spdy::SharedRecord::default();
    sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((transport, record.clone()));
    record
}

pub async fn port_forward(sessions: Sessions, mut req: Request) -> Response {
    let upgrade = req.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if upgrade.eq_ignore_ascii_case("websocket") {
        use axum::extract::FromRequest;
        let ws = match axum::extract::ws::WebSocketUpgrade::from_request(req, &()).await {
            Ok(ws) => ws,
            Err(rejection) => return rejection.into_response(),
        };
        return ws.protocols([TUNNELED_PROTOCOL]).on_upgrade(move |socket| async move {
            let _ = crate::spdy::serve(websocket_bytes(socket), &record(&sessions, "websocket")).await;
        });
    }
    let version =
        req.headers().get("X-Stream-Protocol-Version").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let echo = version == BYTE_ECHO_PROTOCOL;
    if !upgrade.eq_ignore_ascii_case("SPDY/3.1") || !(echo || version.contains(PORT_FORWARD_PROTOCOL)) {
        let body = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 400,
            "reason": "BadRequest",
            "message": "port-forward needs an upgrade to SPDY/3.1 or WebSocket with portforward.k8s.io",
        });
        return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else { return };
        if echo {
            let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded));
            let _ = tokio::io::copy(&mut reader, &mut writer).await;
        } else {
            let _ = crate::spdy::serve(TokioIo::new(upgraded), &record(&sessions, "spdy")).await;
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    let version = if echo { BYTE_ECHO_PROTOCOL } else { PORT_FORWARD_PROTOCOL };
    headers.insert("X-Stream-Protocol-Version", HeaderValue::from_static(version));
    response
}

/// A WebSocket as a byte stream: binary messages in, binary messages out (the tunnel's framing).
fn websocket_bytes(socket: axum::extract::ws::WebSocket) -> tokio::io::DuplexStream {
    use axum::extract::ws::Message;
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (mut from_session, mut to_session) = tokio::io::split(ours);
    let (mut sink, mut incoming) = socket.split();
    tokio::spawn(async move {
        while let Some(Ok(message)) = incoming.next().await {
            match message {
                Message::Binary(data) if to_session.write_all(&data).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        // The end of input for the session (dropping one half of a split duplex would not be).
        let _ = to_session.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from_session.read(&mut buf).await {
            if sink.send(Message::Binary(buf[..n].to_vec().into())).await.is_err() {
                return;
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    });
    theirs
}
