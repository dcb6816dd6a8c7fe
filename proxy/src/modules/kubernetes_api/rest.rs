//! The Kubernetes API proxy on the rest listener: `/api/v1/agents/{agent_id}/kubernetes/...`,
//! so `kubectl --server http://kas:8154/api/v1/agents/1/kubernetes --token <JWT>` works.
//! Authentication (the caller's JWT, removed before this handler runs) is the rest listener's.
//!
//! Request bodies are limited to `rest.max_request_body_bytes` (the API server's own 3 MiB by
//! default): a larger `Content-Length` is refused by the listener's body limit before this
//! handler runs, and a body of unknown length (chunked) is read up to the limit before anything
//! is routed, so a body over it gets 413 and no byte of it reaches agentk or the API server.
//! The bytes of an upgraded connection (exec, attach, port-forward) are not a body: unlimited.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use foldhash::HashMap;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use kas_proto::kubernetes_api::{HttpRequestHead, is_discovery_request, is_upgrade, strip_hop_by_hop, warning_header};
use kas_proto::tunnel::pb::ConnectResponse;
use kas_proto::{AgentId, ConnectionId};
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

use super::{Exchange, RequestHead, callers, pump_body, sanitize_request_headers, start};
use crate::error::KasError;
use crate::router::Target;
use serde::{Deserialize, Serialize};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;

use crate::server::rest::problem::OwnErrorFormat;
use crate::server::rest::state::{RestState, forwarded_metadata};

/// The routes (streaming: outside the rest listener's request timeout), with the OpenAPI
/// description of the path. They enforce `rest.max_request_body_bytes` themselves, answering
/// with a Kubernetes `Status`.
pub fn routes() -> OpenApiRouter<RestState> {
    OpenApiRouter::with_openapi(KubernetesApiDoc::openapi())
        .route("/api/v1/agents/{agent_id}/kubernetes", any(proxy))
        .route("/api/v1/agents/{agent_id}/kubernetes/{*path}", any(proxy))
}

/// Proxy a request to the agent's Kubernetes API server
///
/// The rest of the path, the query, the method and the body go to the cluster's Kubernetes API
/// (through agentk). The API server's responses (including errors, as Kubernetes `Status`
/// objects) pass through unchanged; watches and logs stream, and protocol upgrades (kubectl
/// exec, attach, port-forward) are carried through.
///
/// The bearer token is GitLab's JWT (agentk acts as its service account), a CI job's
/// `ci:<agent_id>:<job token>` or a person's `pat:<agent_id>:<personal access token>` (GitLab
/// mode; the agent's `ci_access` / `user_access` decide, and agentk impersonates the job or
/// person if `access_as` says so), or a kas user token from `kas add-user` (standalone).
///
/// Every error of kas or agentk on this path is a Kubernetes `Status` (so kubectl prints its
/// message); for discovery requests (`/api`, `/apis`, `/version`, ...), whose `Status` kubectl
/// replaces with a fixed text, the message is also in a `Warning` header. An agent that is not
/// connected is waited for (`routing.max_wait`) only if some kas saw it within `registry.ttl`;
/// otherwise the answer is 503 at once. kubectl sends its token only over TLS: give the rest
/// listener `tls` for kubectl. In Swagger UI, the `path` parameter's slashes are
/// percent-encoded; use curl or kubectl for real calls.
#[utoipa::path(
    method(get, post, put, patch, delete),
    path = "/api/v1/agents/{agent_id}/kubernetes/{path}",
    tag = "kubernetes",
    operation_id = "kubernetesApiProxy",
    params(
        ("agent_id" = i64, Path, description = "The agent's id", minimum = 1, maximum = 9223372036854775807_i64),
        ("path" = String, Path, description = "The Kubernetes API path without its leading slash, e.g. `api/v1/namespaces/default/pods` (may contain slashes)"),
    ),
    security(("bearer" = [])),
    responses(
        (status = "default", description = "The Kubernetes API server's own response, passed through"),
        (status = 400, description = "Bad agent id or request", body = KubernetesStatus),
        (status = 401, description = "Missing or invalid credentials", body = KubernetesStatus),
        (status = 403, description = "The credential may not use this agent (another agent's token, not shared with the CI job's project, not in user_access), or agentk refused the request (kubernetes_api settings)", body = KubernetesStatus),
        (status = 413, description = "The request body is larger than rest.max_request_body_bytes", body = KubernetesStatus),
        (status = 429, description = "The agent (or this kas) is at its limit of concurrent requests", body = KubernetesStatus),
        (status = 502, description = "agentk or the Kubernetes API server failed", body = KubernetesStatus),
        (status = 503, description = "The agent is not connected: at once if no kas saw it within registry.ttl, else after routing.max_wait", body = KubernetesStatus),
        (status = 504, description = "The caller's deadline passed while waiting for the agent", body = KubernetesStatus),
    )
)]
#[allow(dead_code)] // documentation only: `proxy` serves every method of the path
fn kubernetes_api_proxy() {}

#[derive(OpenApi)]
#[openapi(paths(kubernetes_api_proxy))]
struct KubernetesApiDoc;

/// A Kubernetes `Status` (`v1`), failure: kas's own errors on this path, shaped as the API
/// server's, so kubectl and client libraries show the message. The OpenAPI schema is this type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesStatus {
    /// Always `Status`.
    pub kind: String,
    /// Always `v1`.
    pub api_version: String,
    /// Always empty.
    pub metadata: StatusMetadata,
    /// Always `Failure`.
    pub status: String,
    /// What went wrong, e.g. "agent 1 is not connected (waited 20s for it to connect)".
    pub message: String,
    /// `BadRequest`, `Unauthorized`, `NotFound`, `TooManyRequests`, `RequestEntityTooLarge`,
    /// `ServiceUnavailable`, `Timeout` or `InternalError`.
    pub reason: String,
    /// The HTTP status code.
    pub code: u16,
}

/// `ListMeta` of a `Status`: kas sets none of its fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StatusMetadata {}

impl KubernetesStatus {
    pub fn failure(status: http::StatusCode, reason: &str, message: String) -> Self {
        Self {
            kind: "Status".to_owned(),
            api_version: "v1".to_owned(),
            metadata: StatusMetadata {},
            status: "Failure".to_owned(),
            message,
            reason: reason.to_owned(),
            code: status.as_u16(),
        }
    }
}

impl IntoResponse for KubernetesStatus {
    fn into_response(self) -> Response {
        let status = http::StatusCode::from_u16(self.code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_string(&self).unwrap_or_default();
        let mut response = (status, [(http::header::CONTENT_TYPE, "application/json")], body).into_response();
        response.extensions_mut().insert(OwnErrorFormat);
        response.extensions_mut().insert(KasStatus(self.message));
        response
    }
}

async fn proxy(
    State(state): State<RestState>,
    Path(params): Path<HashMap<String, String>>,
    request: Request,
) -> Response {
    let path = proxied_path(&params, request.uri());
    let discovery = is_discovery_request(request.method().as_str(), &path);
    let mut response = match proxy_inner(&state, &params, path, request).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(error = %e, "Kubernetes API proxy error");
            kubernetes_status(&e)
        }
    };
    if discovery && response.extensions().get::<KasStatus>().is_some() {
        // client-go prints a fixed text instead of the Status's message for discovery requests.
        let message = response.extensions().get::<KasStatus>().map(|s| s.0.clone()).unwrap_or_default();
        response.headers_mut().insert(http::header::WARNING, warning_header(&message));
    }
    response
}

/// Marks a response as kas's own `Status` (not the API server's), with its message.
#[derive(Clone)]
struct KasStatus(String);

/// The Kubernetes API path (and query) the caller asked for.
fn proxied_path(params: &HashMap<String, String>, uri: &http::Uri) -> String {
    let rest = params.get("path").map(String::as_str).unwrap_or_default();
    let query = uri.query();
    let mut path = String::with_capacity(1 + rest.len() + query.map_or(0, |q| 1 + q.len()));
    path.push('/');
    path.push_str(rest);
    if let Some(query) = query {
        path.push('?');
        path.push_str(query);
    }
    path
}

/// kas's own errors on this path as a Kubernetes `Status` (what kubectl and client libraries
/// parse), with the status code and message of the one error table; no internal detail.
pub fn kubernetes_status(e: &KasError) -> Response {
    let status = e.http_status();
    let reason = match status {
        http::StatusCode::BAD_REQUEST => "BadRequest",
        http::StatusCode::UNAUTHORIZED => "Unauthorized",
        http::StatusCode::FORBIDDEN => "Forbidden",
        http::StatusCode::NOT_FOUND => "NotFound",
        http::StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        http::StatusCode::GATEWAY_TIMEOUT => "Timeout",
        http::StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
        http::StatusCode::PAYLOAD_TOO_LARGE => "RequestEntityTooLarge",
        _ => "InternalError",
    };
    KubernetesStatus::failure(status, reason, e.public_message()).into_response()
}

async fn proxy_inner(
    state: &RestState,
    params: &HashMap<String, String>,
    path: String,
    mut request: Request,
) -> Result<Response, KasError> {
    let agent_id = agent_id_param(params)?;
    let authorization = request.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let impersonation = callers::authorize(&state.verifier, &state.callers, authorization, agent_id).await?;
    request.headers_mut().remove(http::header::AUTHORIZATION);
    let upgrade = is_upgrade(request.headers());
    let is_head = request.method() == http::Method::HEAD;
    let progress = request.extensions().get::<crate::server::rest::serve::WriteProgress>().cloned();
    // Taken before the body: after a 101 this is the caller's connection, as raw bytes.
    let on_upgrade = if upgrade { request.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() } else { None };
    let mut metadata = forwarded_metadata(request.headers());
    // Cleaned here, once, not converted to the tunnel's form and back to be cleaned.
    let mut headers = std::mem::take(request.headers_mut());
    sanitize_request_headers(&mut headers);
    let head = HttpRequestHead { method: request.method().as_str().to_owned(), path, headers };
    if let Some(impersonation) = &impersonation {
        impersonation.insert_into(&mut metadata);
    }
    let limit = state.config.max_request_body_bytes;
    // A body of unknown length is read to its end (at most the limit) before routing.
    let body = if upgrade {
        None
    } else {
        let body = request.into_body();
        match axum::body::HttpBody::size_hint(&body).exact() {
            Some(length) if length > limit as u64 => return Ok(body_too_large(limit)),
            Some(0) => Some(RequestBody::Empty),
            Some(_) => Some(RequestBody::Streamed(body)),
            None => match read_limited(body, limit).await {
                Ok(chunks) => Some(RequestBody::Buffered(chunks)),
                Err(BodyReadError::TooLarge) => return Ok(body_too_large(limit)),
                Err(BodyReadError::Failed(e)) => {
                    return Err(KasError::InvalidArgument(format!("reading the request body failed: {e}")));
                }
            },
        }
    };
    // kubectl's discovery would wait routing.max_wait per request for an agent that is not
    // connected: only an agent seen recently (probably reconnecting) is waited for.
    let target = Target::new(agent_id, ConnectionId::ANY, kas_proto::kubernetes_api::METHOD).waiting_only_if_seen();
    // Most requests (GET) have no body: the head half-closes the request, no pump task.
    let bodiless = matches!(body, Some(RequestBody::Empty));
    let mut exchange = start(&state.router, target, metadata, RequestHead::Sanitized(head), None, bodiless).await?;
    let sender = exchange.take_sender();
    let request_pump = match (body, sender) {
        (Some(RequestBody::Streamed(body)), Some(sender)) => Some(pump_body(sender, body.into_data_stream())),
        (Some(RequestBody::Buffered(chunks)), Some(sender)) => {
            Some(pump_body(sender, futures::stream::iter(chunks.into_iter().map(Ok::<_, axum::Error>))))
        }
        (None, Some(sender)) => {
            // An upgrade request has no body; the caller's bytes follow the 101.
            return respond_upgrade(exchange, sender, on_upgrade).await;
        }
        _ => None,
    };
    let head = exchange.response_head().await?;
    let status = response_status(head.status)?;
    let mut headers = head.headers;
    strip_hop_by_hop(&mut headers, false);
    // hyper stops reading a body once its length is sent (and never reads one a HEAD, 204 or
    // 304 cannot have): the stream then reads the response's end itself, so the exchange ends
    // cleanly and agentk's tunnel can carry the next request.
    let length = if is_head || matches!(status.as_u16(), 204 | 304) {
        Some(0)
    } else {
        headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    };
    let body = if length == Some(0) {
        exchange.read_end().await?;
        Body::empty()
    } else {
        // The request pump lives as long as the response body: a caller that goes away (the body
        // is dropped) ends both, which cancels the request in agentk.
        let body = exchange.into_body_stream(length).map(move |chunk| {
            let _pump = &request_pump;
            chunk.map_err(|e| {
                tracing::warn!(error = %e, "Kubernetes API response aborted");
                std::io::Error::other(e.public_message())
            })
        });
        // HTTP/1.1: passed on no faster than the caller's socket takes it (hyper would otherwise
        // buffer up to 64 KiB per connection for a caller that stopped reading).
        match progress {
            Some(progress) => Body::from_stream(progress.gate(body)),
            None => Body::from_stream(body),
        }
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.extensions_mut().insert(OwnErrorFormat);
    Ok(response)
}

/// The status of agentk's response head.
fn response_status(status: u32) -> Result<http::StatusCode, KasError> {
    u16::try_from(status)
        .ok()
        .and_then(|s| http::StatusCode::from_u16(s).ok())
        .ok_or_else(|| KasError::Tunnel(format!("agentk sent an invalid HTTP status {status}")))
}

/// The `{agent_id}` path parameter.
pub(crate) fn agent_id_param(params: &HashMap<String, String>) -> Result<AgentId, KasError> {
    Ok(AgentId::parse("agent_id", params.get("agent_id").map_or("", String::as_str))?)
}

enum RequestBody {
    /// No body (`Content-Length: 0` or none on a GET).
    Empty,
    /// Known length, within the limit: streamed as it arrives.
    Streamed(Body),
    /// Unknown length: read to its end, within the limit.
    Buffered(Vec<bytes::Bytes>),
}

enum BodyReadError {
    TooLarge,
    Failed(axum::Error),
}

/// Reads a body of unknown length to its end, refusing it as soon as it passes `limit` bytes.
async fn read_limited(body: Body, limit: usize) -> Result<Vec<bytes::Bytes>, BodyReadError> {
    let mut stream = body.into_data_stream();
    let mut chunks = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            // The rest listener's own body limit may end the body first (with an error).
            if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) {
                BodyReadError::TooLarge
            } else {
                BodyReadError::Failed(e)
            }
        })?;
        total = total.saturating_add(chunk.len());
        if total > limit {
            return Err(BodyReadError::TooLarge);
        }
        chunks.push(chunk);
    }
    Ok(chunks)
}

/// 413 as a Kubernetes `Status` (what the API server answers for a body over its limit).
fn body_too_large(limit: usize) -> Response {
    let message = format!("the request body is larger than {limit} bytes (kas rest.max_request_body_bytes)");
    KubernetesStatus::failure(http::StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge", message).into_response()
}

/// An upgrade (kubectl exec/attach/port-forward): if the API server switches protocols, so does
/// the caller's connection, and bytes flow both ways through the tunnel until either side closes.
async fn respond_upgrade(
    mut exchange: Exchange,
    sender: crate::tunnel::TunnelSender,
    on_upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Result<Response, KasError> {
    let head = exchange.response_head().await?;
    let status = response_status(head.status)?;
    let switching = status == http::StatusCode::SWITCHING_PROTOCOLS;
    let mut headers = head.headers;
    strip_hop_by_hop(&mut headers, switching);
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.extensions_mut().insert(OwnErrorFormat);
    if !switching {
        // The API server refused the upgrade (e.g. 403): pass its answer through.
        let _ = sender.send(ConnectResponse::close_send()).await;
        let body = exchange.into_body_stream(None).map(|c| c.map_err(|e| std::io::Error::other(e.public_message())));
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
        let mut down = std::pin::pin!(exchange.into_body_stream(None));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `proptests::response_status_of_arbitrary_heads`: a status above 65535 used to
    /// become a 502 passed off as the API server's answer (with agentk's headers and body).
    #[test]
    fn statuses_beyond_u16_are_invalid_not_502() {
        for status in [65_536, 65_536 + 200, u32::MAX] {
            let e = response_status(status).unwrap_err();
            assert!(e.to_string().contains("invalid HTTP status"), "{status}: {e}");
        }
        assert_eq!(response_status(502).unwrap(), http::StatusCode::BAD_GATEWAY);
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any status in agentk's response head: a status code for 100..=999 (what HTTP can
        /// carry), otherwise the documented tunnel error, never a panic.
        #[test]
        fn response_status_of_arbitrary_heads(status in prop_oneof![0u32..1200, proptest::arbitrary::any::<u32>(), Just(65_536 + 200)]) {
            match response_status(status) {
                Ok(s) => prop_assert_eq!(u32::from(s.as_u16()), status),
                Err(e) => {
                    prop_assert!(!(100..=999).contains(&status), "{status} refused");
                    prop_assert_eq!(e.to_string(), format!("tunnel to agentk failed: agentk sent an invalid HTTP status {status}"));
                    prop_assert_eq!(e.http_status(), http::StatusCode::BAD_GATEWAY);
                }
            }
        }
    }
}
