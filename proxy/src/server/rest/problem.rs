//! Errors of the rest listener: RFC 9457 problems (`application/problem+json`) built from the one
//! error table ([`KasError::classify`]), for handler errors and for what layers answer bare
//! (404, 405, 413, 504).

use axum::body::Body;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::KasError;

/// Marks a response whose error body is already in its caller's own format (a Kubernetes
/// `Status` on the Kubernetes API proxy, or the API server's own answer), so it is never
/// rewritten as a problem.
#[derive(Debug, Clone, Copy)]
pub struct OwnErrorFormat;

/// Media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

tokio::task_local! {
    /// The request id of the request being served (set by `scope::RequestScope`).
    pub(super) static REQUEST_ID: String;
}

pub(super) fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

/// An RFC 9457 problem: the body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// Always `about:blank`: the status and `code` say what happened.
    #[serde(rename = "type")]
    pub type_: String,
    /// The HTTP status phrase, e.g. `Service Unavailable`.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong, for people. Never carries internal detail for 5xx errors.
    pub detail: String,
    /// The gRPC code kas uses for the same error on the api listener, e.g. `UNAVAILABLE`
    /// (for 502 errors: the code agentk answered with, e.g. `PERMISSION_DENIED`).
    pub code: String,
    /// The request's `x-request-id`, to find it in kas's logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl Problem {
    pub fn new(status: StatusCode, code: tonic::Code, detail: impl Into<String>) -> Self {
        Self {
            type_: "about:blank".to_owned(),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            code: code_name(code),
            request_id: current_request_id(),
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        (status, [(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))], body).into_response()
    }
}

/// `PermissionDenied` -> `PERMISSION_DENIED` (the canonical gRPC code names).
fn code_name(code: tonic::Code) -> String {
    let mut out = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

impl IntoResponse for KasError {
    fn into_response(self) -> Response {
        if matches!(self, KasError::Internal(_) | KasError::Registry(_)) {
            tracing::error!(error = %self, "request failed");
        }
        let (code, status) = self.classify();
        let mut response = Problem::new(status, code, self.public_message()).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

pub(super) async fn not_found(method: Method, uri: axum::http::Uri) -> Problem {
    Problem::new(StatusCode::NOT_FOUND, tonic::Code::NotFound, format!("no route for {method} {}", uri.path()))
}

/// Errors that layers answer without a body (405, timeouts) or as plain text (413) become
/// problem+json too. Responses that have a typed body (problems, the Kubernetes API's own
/// errors) are left alone.
pub(super) async fn problem_for_bare_errors(response: Response) -> Response {
    let status = response.status();
    // Responses in their callers' own error format (the Kubernetes API proxy's) stay as they are.
    let own_format = response.extensions().get::<OwnErrorFormat>().is_some();
    if own_format || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let bare = match response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(ct) => status == StatusCode::PAYLOAD_TOO_LARGE && ct.starts_with("text/plain"),
    };
    if !bare {
        return response;
    }
    let (code, detail) = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            (tonic::Code::Unimplemented, "method not allowed on this route (see the Allow header)".to_owned())
        }
        StatusCode::PAYLOAD_TOO_LARGE => {
            (tonic::Code::InvalidArgument, "request body too large (limit: rest.max_request_body_bytes)".to_owned())
        }
        StatusCode::GATEWAY_TIMEOUT | StatusCode::REQUEST_TIMEOUT => {
            (tonic::Code::DeadlineExceeded, "request did not complete within rest.request_timeout".to_owned())
        }
        StatusCode::NOT_FOUND => (tonic::Code::NotFound, "not found".to_owned()),
        other => (tonic::Code::Unknown, other.canonical_reason().unwrap_or("error").to_owned()),
    };
    let (mut parts, _) = response.into_parts();
    let problem = Problem::new(status, code, detail).into_response();
    let (problem_parts, body) = problem.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.extend(problem_parts.headers);
    Response::from_parts(parts, Body::new(body))
}
