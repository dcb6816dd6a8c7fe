//! The Kubernetes API proxy on the rest listener: `/api/v1/agents/{agent_id}/kubernetes/...`,
//! so `kubectl --server http://kas:8154/api/v1/agents/1/kubernetes --token <JWT>` works.
//! Authentication (the caller's JWT, removed before this handler runs) is the rest listener's.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use kas_proto::kubernetes_api::{HttpRequestHead, headers_from_proto, headers_to_proto, is_upgrade, strip_hop_by_hop};
use kas_proto::{AgentId, ConnectionId};
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

use super::{Exchange, pump_body, start};
use crate::error::KasError;
use crate::server::rest::{RestState, forwarded_metadata};

/// Marks a response as the API server's own, so the rest listener never rewrites it.
#[derive(Debug, Clone, Copy)]
pub struct ProxiedResponse;

/// The routes, merged into the rest listener's authenticated routes (outside its timeout).
pub fn rest_routes() -> axum::Router<RestState> {
    axum::Router::new()
        .route("/api/v1/agents/{agent_id}/kubernetes", any(proxy))
        .route("/api/v1/agents/{agent_id}/kubernetes/{*path}", any(proxy))
}

async fn proxy(
    State(state): State<RestState>,
    Path(params): Path<HashMap<String, String>>,
    request: Request,
) -> Response {
    match proxy_inner(&state, params, request).await {
        Ok(response) => response,
        Err(e) => kubernetes_status(&e),
    }
}

/// kas's own errors on this path as a Kubernetes `Status` (what kubectl and client libraries
/// parse), with the status code and message of the one error table; no internal detail.
pub fn kubernetes_status(e: &KasError) -> Response {
    let status = e.http_status();
    let reason = match status {
        http::StatusCode::BAD_REQUEST => "BadRequest",
        http::StatusCode::UNAUTHORIZED => "Unauthorized",
        http::StatusCode::NOT_FOUND => "NotFound",
        http::StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        http::StatusCode::GATEWAY_TIMEOUT => "Timeout",
        http::StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
        _ => "InternalError",
    };
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": e.public_message(),
        "reason": reason,
        "code": status.as_u16(),
    });
    let mut response = (status, [(http::header::CONTENT_TYPE, "application/json")], body.to_string()).into_response();
    response.extensions_mut().insert(ProxiedResponse);
    response
}

async fn proxy_inner(
    state: &RestState,
    params: HashMap<String, String>,
    mut request: Request,
) -> Result<Response, KasError> {
    let agent_id = params
        .get("agent_id")
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|id| *id > 0)
        .ok_or_else(|| KasError::InvalidArgument("agent_id must be a positive integer".into()))?;
    let mut path = format!("/{}", params.get("path").map(String::as_str).unwrap_or_default());
    if let Some(query) = request.uri().query() {
        path.push('?');
        path.push_str(query);
    }
    let upgrade = is_upgrade(request.headers());
    let progress = request.extensions().get::<crate::server::rest_serve::WriteProgress>().cloned();
    // Taken before the body: after a 101 this is the caller's connection, as raw bytes.
    let on_upgrade = if upgrade { request.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() } else { None };
    let head = HttpRequestHead {
        method: request.method().as_str().to_owned(),
        path,
        headers: headers_to_proto(request.headers()),
    };
    let metadata = forwarded_metadata(request.headers());
    let mut exchange = start(&state.router, AgentId(agent_id), ConnectionId::ANY, metadata, head, None).await?;
    let sender = exchange.take_sender();
    let request_pump = match (&on_upgrade, sender) {
        (None, Some(sender)) => Some(pump_body(sender, request.into_body().into_data_stream())),
        (Some(_), Some(sender)) => {
            // An upgrade request has no body; the caller's bytes follow the 101.
            drop(request);
            return respond_upgrade(exchange, sender, on_upgrade).await;
        }
        _ => None,
    };
    let head = exchange.response_head().await?;
    let status = http::StatusCode::from_u16(u16::try_from(head.status).unwrap_or(502))
        .map_err(|_| KasError::Tunnel(format!("agentk sent an invalid HTTP status {}", head.status)))?;
    let mut headers = headers_from_proto(&head.headers);
    strip_hop_by_hop(&mut headers, false);
    // The request pump lives as long as the response body: a caller that goes away (the body is
    // dropped) ends both, which cancels the request in agentk.
    let body = exchange.into_body_stream().map(move |chunk| {
        let _pump = &request_pump;
        chunk.map_err(|e| {
            tracing::warn!(error = %e, "Kubernetes API response aborted");
            std::io::Error::other(e.public_message())
        })
    });
    // HTTP/1.1: passed on no faster than the caller's socket takes it (hyper would otherwise
    // buffer up to 64 KiB per connection for a caller that stopped reading).
    let body = match progress {
        Some(progress) => Body::from_stream(progress.gate(body)),
        None => Body::from_stream(body),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.extensions_mut().insert(ProxiedResponse);
    Ok(response)
}

/// An upgrade (kubectl exec/attach/port-forward): if the API server switches protocols, so does
/// the caller's connection, and bytes flow both ways through the tunnel until either side closes.
async fn respond_upgrade(
    mut exchange: Exchange,
    sender: crate::tunnel::TunnelSender,
    on_upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Result<Response, KasError> {
    let head = exchange.response_head().await?;
    let status = http::StatusCode::from_u16(u16::try_from(head.status).unwrap_or(502))
        .map_err(|_| KasError::Tunnel(format!("agentk sent an invalid HTTP status {}", head.status)))?;
    let switching = status == http::StatusCode::SWITCHING_PROTOCOLS;
    let mut headers = headers_from_proto(&head.headers);
    strip_hop_by_hop(&mut headers, switching);
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.extensions_mut().insert(ProxiedResponse);
    if !switching {
        // The API server refused the upgrade (e.g. 403): pass its answer through.
        let _ = sender.send(kas_proto::tunnel::pb::ConnectResponse::close_send()).await;
        let body = exchange.into_body_stream().map(|c| c.map_err(|e| std::io::Error::other(e.public_message())));
        *response.body_mut() = Body::from_stream(body);
        return Ok(response);
    }
    let Some(on_upgrade) = on_upgrade else {
        return Err(KasError::Internal("upgrade requested but the connection cannot be upgraded".into()));
    };
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "caller did not complete the upgrade");
                return;
            }
        };
        let (read, mut write) = tokio::io::split(TokioIo::new(upgraded));
        // caller -> agentk; ends with CloseSend when the caller closes its side.
        let _up = pump_body(sender, ReaderStream::new(read));
        // agentk -> caller, until the API server closes (or the tunnel breaks).
        let mut down = std::pin::pin!(exchange.into_body_stream());
        while let Some(chunk) = down.next().await {
            let Ok(chunk) = chunk else { break };
            if write.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    });
    Ok(response)
}
