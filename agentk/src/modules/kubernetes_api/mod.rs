//! Kubernetes API proxy, agentk half: one HTTP exchange from a tunnel to the in-cluster API
//! server, made with agentk's own credentials (service account or kubeconfig), streamed both
//! ways. Protocol upgrades (kubectl exec, attach, port-forward) become a byte stream.
//!
//! What reaches the API server: the method and path kas sent, a documented whitelist of request
//! headers ([`FORWARDED_REQUEST_HEADERS`]: never the caller's `Authorization`, never the caller's
//! `Impersonate-*`), agentk's own credentials, `User-Agent` extended with `via agentk/<v>`, and
//! the `Impersonate-*` headers of the identity kas put in the tunnel's metadata, if any
//! ([`Impersonation`]: a CI job or user per the agent's `ci_access` / `user_access`).
//! Redirects are not followed. Two timeouts bound the wait for the API server (see
//! [`ApiTimeouts`]): the TCP connect, and the response head counted from the start of the
//! request; both are answered with a 504 Kubernetes `Status`. After the head there are no read
//! or write timeouts: watches and `logs -f` run until a side closes. If kas ends the tunnel (the
//! caller went away) at any stage, even while the API server is not reading the request body,
//! the request to the API server is dropped, which cancels it and frees the tunnel.
//!
//! The agent configuration's `kubernetes_api` section can disable the proxy or make it
//! read-only; refused requests get HTTP 403 with a Kubernetes `Status`, as an RBAC denial would,
//! so kubectl prints "Error from server (Forbidden)". Until the first configuration arrives,
//! the proxy serves everything (the configuration's default).

mod connections;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::FutureExt;
use http::header::{HeaderMap, HeaderName, HeaderValue, USER_AGENT};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use kas_proto::impersonation::Impersonation;
use kas_proto::kubernetes_api::{
    HttpFrame, HttpRequestHead, HttpResponseHead, http_frame, is_discovery_request, is_upgrade, strip_hop_by_hop,
    warning_header,
};
use kube::client::ConfigExt;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use self::connections::{ApiServerConnections, Reusable};
use crate::metrics::Outcome;
use crate::tunnel::{Batch, Responder, TunnelRequest};

/// Request headers agentk forwards to the API server. Everything else is dropped: notably
/// `Authorization` (the caller's kas credentials) and `Impersonate-*` (agentk acts as itself).
pub const FORWARDED_REQUEST_HEADERS: &[&str] = &[
    "accept",
    "accept-encoding",
    "accept-language",
    "cache-control",
    "content-encoding",
    "content-length",
    "content-type",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "kubectl-command",
    "kubectl-session",
    "user-agent",
    "x-request-id",
    // Protocol upgrades (WebSocket / SPDY remote command, port-forward).
    "connection",
    "upgrade",
    "sec-websocket-extensions",
    "sec-websocket-key",
    "sec-websocket-protocol",
    "sec-websocket-version",
    "x-stream-protocol-version",
];

/// TCP connect to the Kubernetes API: in-cluster it takes milliseconds; a server that does not
/// accept within this is overloaded or gone (kube-rs waits 30 s, client-go's dialer too).
pub const DEFAULT_KUBE_API_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// From sending a proxied request to the API server's response head (connect, TLS and request
/// body included). Above the API server's own 60 s `--request-timeout`, so its answer comes
/// first; watches, `logs -f` and exec answer their head at once and then stream without limit.
pub const DEFAULT_KUBE_API_RESPONSE_HEADER_TIMEOUT: Duration = Duration::from_secs(70);
/// How long agentk waits for the API server before answering 504 itself.
#[derive(Debug, Clone, Copy)]
pub struct ApiTimeouts {
    /// The TCP connect (`--kube-api-connect-timeout`).
    pub connect: Duration,
    /// From the start of the request to the response head (`--kube-api-response-header-timeout`).
    pub response_header: Duration,
}

impl Default for ApiTimeouts {
    fn default() -> Self {
        Self { connect: DEFAULT_KUBE_API_CONNECT_TIMEOUT, response_header: DEFAULT_KUBE_API_RESPONSE_HEADER_TIMEOUT }
    }
}
/// Request body chunks buffered towards the API server (each at most one tunnel chunk).
const BODY_BUFFER: usize = kas_proto::flow::HOP_BUFFER;
/// hyper's read buffer per API server connection (it holds response heads, and body bytes not
/// yet forwarded): bounded so a stuck tunnel leaves little here, not hyper's ~400 KiB.
const API_SERVER_READ_BUFFER: usize = 64 * 1024;
/// Request body read from the tunnel ahead of an API server that is not reading it. The end of
/// an HTTP/2 stream queues behind its data, so kas ending the tunnel (the caller went away) is
/// seen only once the frames before it are read. With the tunnel's own read-ahead
/// ([`crate::tunnel::REQUEST_READ_AHEAD`], 1 MiB) 4 MiB in all, above the API server's own 3 MiB
/// body limit (and kas's REST limit), so such a body is read to its end and the tunnel's end is
/// seen; for a larger body the response header timeout frees the tunnel.
const BODY_READ_AHEAD: usize = 3 * 1024 * 1024;
/// Read size for an upgraded connection.
const UPGRADED_READ_BUFFER: usize = 16 * 1024;

// A concrete body error type (not BoxError): keeps the service's request type free of trait-object
// lifetimes, which async-trait futures cannot prove general enough.
type ProxyBody = BoxBody<Bytes, std::io::Error>;
type ApiService = BoxCloneSyncService<http::Request<ProxyBody>, http::Response<Incoming>, BoxError>;

pub struct KubernetesApi {
    service: ApiService,
    api_server: ApiServerUrl,
    timeouts: ApiTimeouts,
    /// The agent configuration as last received from kas.
    configuration: Configuration,
}

type Configuration = tokio::sync::watch::Receiver<Option<kas_proto::tunnel::pb::ConfigurationResponse>>;

impl KubernetesApi {
    /// The same TLS and authentication stack kube-rs builds, around agentk's own HTTP/1.1
    /// connections ([`ApiServerConnections`]) with streaming bodies and without kube-rs's
    /// read/write timeouts (agentk's own `timeouts` apply instead; kube-rs's 30 s connect
    /// timeout is not from the kubeconfig). The base URL is joined as kube-rs joins it, by
    /// [`ApiServerUrl`].
    pub fn new(
        config: &kube::Config,
        configuration: Configuration,
        timeouts: ApiTimeouts,
    ) -> Result<Self, kube::Error> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeouts.connect));
        http.set_nodelay(true);
        let connector = config.rustls_https_connector_with_connector(http)?;
        let client = ApiServerConnections::new(connector, &config.cluster_url, API_SERVER_READ_BUFFER);
        // The API server's URL is joined to each request's path here (`ApiServerUrl`), not by
        // kube-rs's base URI layer, which parses its scheme and authority again per request.
        let service = ServiceBuilder::new()
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            .map_err(BoxError::from)
            .service(client);
        Ok(Self {
            service: BoxCloneSyncService::new(service),
            api_server: ApiServerUrl::new(&config.cluster_url),
            timeouts,
            configuration,
        })
    }

    /// Why the agent configuration refuses this request, if it does.
    fn refusal(&self, method: &http::Method, upgrade: bool) -> Option<&'static str> {
        let settings = self
            .configuration
            .borrow()
            .as_ref()
            .and_then(|r| r.configuration.as_ref())
            .and_then(|c| c.kubernetes_api)
            .unwrap_or_default();
        let read = matches!(*method, http::Method::GET | http::Method::HEAD | http::Method::OPTIONS) && !upgrade;
        if settings.disabled {
            Some("the Kubernetes API proxy is disabled by this agent's configuration (kubernetes_api.enabled: false)")
        } else if settings.read_only && !read {
            Some(
                "the Kubernetes API proxy is read-only by this agent's configuration (kubernetes_api.read_only: \
                 true): only get, list, watch and logs are allowed",
            )
        } else {
            None
        }
    }
}

/// A Kubernetes `Status` (HTTP 403 Forbidden) for a request the agent configuration refuses.
async fn forbidden(responder: &Responder, head: &HttpRequestHead, path: &str, reason: &str) -> Result<Outcome, Status> {
    kubernetes_status(responder, head, 403, "Forbidden", &format!("{} {path}: {reason}", head.method)).await?;
    Ok(Outcome::Refused)
}

/// agentk's own answer as a Kubernetes `Status`, as the API server would send it (with the
/// message in a `Warning` too for discovery requests, whose `Status` kubectl does not print).
async fn kubernetes_status(
    responder: &Responder,
    request: &HttpRequestHead,
    code: u16,
    reason: &str,
    message: &str,
) -> Result<(), Status> {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {},
        "code": code,
    })
    .to_string();
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if is_discovery_request(&request.method, &request.path) {
        headers.insert(http::header::WARNING, warning_header(message));
    }
    let head = HttpResponseHead { status: u32::from(code), headers };
    let mut batch = Batch::default();
    batch
        .header(Default::default())
        .message(HttpFrame::response_head(head).to_bytes())
        .http_body(Bytes::from(body))
        .trailer(Default::default());
    responder.send_batch(batch).await
}

fn decode(data: Bytes) -> Result<http_frame::Frame, Status> {
    HttpFrame::decode(data).ok().and_then(|f| f.frame).ok_or_else(|| Status::invalid_argument("invalid HTTP frame"))
}

/// The request line kas sent: a valid method, and an origin-form path (no scheme or host, so
/// the request cannot be pointed anywhere but the API server).
fn method_and_uri(head: &HttpRequestHead) -> Result<(http::Method, http::Uri), Status> {
    let method = http::Method::from_bytes(head.method.as_bytes())
        .map_err(|_| Status::invalid_argument(format!("invalid HTTP method {:?}", head.method)))?;
    let uri: http::Uri = head
        .path
        .parse()
        .ok()
        .filter(|u: &http::Uri| u.scheme().is_none() && u.path().starts_with('/'))
        .ok_or_else(|| Status::invalid_argument(format!("invalid request path {:?}", head.path)))?;
    Ok((method, uri))
}

/// The API server's URL, which each request's path and query are joined to as kube-rs's
/// `BaseUriLayer` joins them (a path in the URL, e.g. a Rancher proxy's, prefixes every request
/// path), with the scheme and authority kept parsed rather than parsed again per request.
#[derive(Debug)]
struct ApiServerUrl {
    scheme: Option<http::uri::Scheme>,
    authority: Option<http::uri::Authority>,
    /// The URL's path and query; `None` when it has none.
    path_and_query: Option<http::uri::PathAndQuery>,
    /// Its path without trailing slashes: what request paths are appended to.
    prefix: String,
}

impl ApiServerUrl {
    fn new(url: &http::Uri) -> Self {
        let path_and_query = url.path_and_query().cloned();
        let prefix = path_and_query.as_ref().map(|pq| pq.path().trim_end_matches('/').to_owned()).unwrap_or_default();
        Self { scheme: url.scheme().cloned(), authority: url.authority().cloned(), path_and_query, prefix }
    }

    /// `request` (a path and query, as `method_and_uri` makes it) on the API server.
    fn join(&self, request: http::Uri) -> Result<http::Uri, Status> {
        let requested = request.into_parts().path_and_query;
        let path_and_query = match (&self.path_and_query, requested) {
            (Some(_), Some(requested)) if self.prefix.is_empty() => Some(requested),
            (Some(_), Some(requested)) => Some(
                format!("{}{requested}", self.prefix)
                    .parse()
                    .map_err(|e| Status::invalid_argument(format!("invalid request path: {e}")))?,
            ),
            (Some(own), None) => Some(own.clone()),
            (None, requested) => requested,
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = self.scheme.clone();
        parts.authority = self.authority.clone();
        parts.path_and_query = path_and_query;
        http::Uri::from_parts(parts)
            .map_err(|e| Status::internal(format!("the API server URL does not take the path: {e}")))
    }
}

/// [`FORWARDED_REQUEST_HEADERS`], parsed once.
static FORWARDED_NAMES: std::sync::LazyLock<Vec<HeaderName>> =
    std::sync::LazyLock::new(|| FORWARDED_REQUEST_HEADERS.iter().map(|n| HeaderName::from_static(n)).collect());

/// The headers that go to the API server: only the whitelisted ones are taken from the head,
/// then hop-by-hop ones are stripped as from the whole set (the `Connection` header that names
/// them is whitelisted).
fn forwarded_headers(head: &HttpRequestHead) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in &head.headers {
        if FORWARDED_NAMES.contains(name) {
            // The values share the tunnel message's buffer: cloning one copies no bytes.
            out.append(name.clone(), value.clone());
        }
    }
    let upgrade = is_upgrade(&out);
    strip_hop_by_hop(&mut out, upgrade);
    let ua = match out.get(USER_AGENT).and_then(|v| v.to_str().ok()) {
        Some(ua) if !ua.is_empty() => HeaderValue::from_str(&format!("{ua} via agentk/{}", crate::VERSION)).ok(),
        _ => Some(AGENTK_USER_AGENT.clone()),
    };
    if let Some(ua) = ua {
        out.insert(USER_AGENT, ua);
    }
    out
}

/// `User-Agent` of a request whose caller sent none, made once.
static AGENTK_USER_AGENT: std::sync::LazyLock<HeaderValue> = std::sync::LazyLock::new(|| {
    HeaderValue::from_str(&format!("agentk/{}", crate::VERSION)).unwrap_or_else(|_| HeaderValue::from_static("agentk"))
});

fn response_head(response: &http::Response<Incoming>) -> HttpResponseHead {
    let mut headers = response.headers().clone();
    strip_hop_by_hop(&mut headers, response.status() == http::StatusCode::SWITCHING_PROTOCOLS);
    HttpResponseHead { status: u32::from(response.status().as_u16()), headers }
}

impl KubernetesApi {
    async fn exchange(&self, request: &mut TunnelRequest, responder: &Responder) -> Result<Outcome, Status> {
        let first = request.next_message().await?.ok_or_else(|| Status::invalid_argument("request without a head"))?;
        let http_frame::Frame::RequestHead(head) = decode(first)? else {
            return Err(Status::invalid_argument("the first frame must be the request head"));
        };
        let (method, uri) = method_and_uri(&head)?;
        let mut headers = forwarded_headers(&head);
        // Who kas says the caller is (CI job, user, or an `impersonate` identity); without
        // it agentk acts as itself.
        let impersonation = Impersonation::from_metadata(&request.metadata)
            .and_then(|i| i.map(|i| i.headers().map(|h| (i.user, h))).transpose())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let impersonated = impersonation.as_ref().map(|(user, _)| user.clone());
        if let Some((_, impersonate)) = impersonation {
            headers.extend(impersonate);
        }
        let upgrade = is_upgrade(&headers);
        if let Some(reason) = self.refusal(&method, upgrade) {
            tracing::info!(method = %head.method, path = %uri.path(), "Kubernetes API request refused by the agent configuration");
            return forbidden(responder, &head, uri.path(), reason).await;
        }
        // A request whose end came with its head (a GET: kas sends RequestInfo, head and
        // CloseSend together) goes out without a body. A streamed body of unknown length would
        // make hyper send it chunked, its end ("0\r\n\r\n") in a write of its own.
        let bodiless = !upgrade && request.ended_now();
        // The channel only for a streamed body: a GET's would be allocated for nothing.
        let (body, body_tx): (ProxyBody, _) = if upgrade || bodiless {
            (Empty::<Bytes>::new().map_err(|e: Infallible| match e {}).boxed(), None)
        } else {
            let (body_tx, body_rx) = mpsc::channel(BODY_BUFFER);
            (StreamBody::new(ReceiverStream::new(body_rx)).boxed(), Some(body_tx))
        };
        let mut http_request = http::Request::new(body);
        *http_request.method_mut() = method;
        *http_request.uri_mut() = self.api_server.join(uri)?;
        *http_request.headers_mut() = headers;
        tracing::debug!(method = %head.method, path = %head.path, upgrade, impersonated, "proxying to the Kubernetes API");

        let started = std::time::Instant::now();
        let head_deadline = tokio::time::Instant::now() + self.timeouts.response_header;
        let call = self.service.clone().oneshot(http_request);
        tokio::pin!(call);
        let mut body = if bodiless { BodyPump::ended() } else { BodyPump::new(body_tx) };
        // The request body and the response proceed together (the API server reads the body
        // before it answers, and may answer before it read all of it). Once the body is sent,
        // the tunnel is still watched: kas ending it means the caller went away, and dropping
        // the API server request here cancels it (watches, logs -f). The body pump reads ahead
        // of an API server that does not read, so the tunnel's end is seen then too.
        let response = loop {
            tokio::select! {
                r = &mut call => break r,
                r = body.step(request) => r?,
                () = responder.closed() => return Err(caller_gone()),
                () = tokio::time::sleep_until(head_deadline) => {
                    let message = format!(
                        "{} {}: the Kubernetes API server sent no response within {:?} (agentk \
                         --kube-api-response-header-timeout)",
                        head.method, head.path, self.timeouts.response_header
                    );
                    tracing::info!(method = %head.method, path = %head.path, "Kubernetes API response header timeout");
                    return kubernetes_status(responder, &head, 504, "Timeout", &message).await.map(|()| Outcome::Timeout);
                }
            }
        };
        let mut response = match response {
            Ok(r) => r,
            Err(e) if is_connect_timeout(e.as_ref()) => {
                let message = format!(
                    "{} {}: could not connect to the Kubernetes API server within {:?} (agentk \
                     --kube-api-connect-timeout)",
                    head.method, head.path, self.timeouts.connect
                );
                tracing::info!(method = %head.method, path = %head.path, "Kubernetes API connect timeout");
                return kubernetes_status(responder, &head, 504, "Timeout", &message).await.map(|()| Outcome::Timeout);
            }
            Err(e) => return Err(Status::unavailable(format!("Kubernetes API unreachable: {e}"))),
        };
        crate::metrics::api_server_latency(started.elapsed());
        // Dropped (the connection closed) unless the exchange ends cleanly; kept through an
        // upgrade, which takes the connection over.
        let mut connection = response.extensions_mut().remove::<Reusable>();
        let mut batch = Batch::default();
        batch.header(Default::default()).message(HttpFrame::response_head(response_head(&response)).to_bytes());
        if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            responder.send_batch(batch).await?;
            return upgraded(request, responder, response).await.map(|()| Outcome::Ok);
        }
        let mut response_body = response.into_body();
        // Body read from the API server and not sent yet; the body's end was read.
        let mut data = Bytes::new();
        let mut ended = false;
        loop {
            // What the API server sent already goes out with what is waiting (the head, the
            // trailer), at most one body message per write: a small response goes out whole, in
            // one write. Bounded messages keep every hop's buffers bounded in bytes; within the
            // response credit, a reader that stopped gets small ones.
            let mut has_body = false;
            loop {
                if data.is_empty() && !ended {
                    match response_body.frame().now_or_never() {
                        None => break,
                        Some(None) => ended = true,
                        Some(Some(frame)) => data = body_data(frame)?,
                    }
                    continue;
                }
                if data.is_empty() || has_body {
                    break;
                }
                let Some(size) = responder.message_size_now(kas_proto::flow::MAX_CHUNK) else { break };
                batch.http_body(data.split_to(size.min(data.len())));
                has_body = true;
            }
            let done = ended && data.is_empty();
            if done {
                batch.trailer(Default::default());
            }
            if done && body.sent_all() {
                // Back among the idle connections before this response's end goes out: the
                // caller may send its next request as soon as it reads the end.
                if let Some(connection) = connection.take() {
                    connection.release();
                }
            }
            if !batch.is_empty() {
                responder.send_batch(std::mem::take(&mut batch)).await?;
            }
            if done {
                return Ok(Outcome::Ok);
            }
            if !data.is_empty() {
                // Only credit is missing.
                tokio::select! {
                    r = responder.wait_for_credit() => r?,
                    () = responder.closed() => return Err(caller_gone()),
                };
                continue;
            }
            let frame = tokio::select! {
                f = response_body.frame() => f,
                r = body.step(request) => {
                    r?;
                    continue;
                }
                () = responder.closed() => return Err(caller_gone()),
            };
            match frame {
                None => ended = true,
                Some(frame) => data = body_data(frame)?,
            }
        }
    }
}

/// The data of a response body frame (HTTP trailers are not passed on).
fn body_data(frame: Result<Frame<Bytes>, hyper::Error>) -> Result<Bytes, Status> {
    let frame = frame.map_err(|e| Status::unavailable(format!("Kubernetes API response failed: {e}")))?;
    Ok(frame.into_data().unwrap_or_default())
}

fn caller_gone() -> Status {
    Status::cancelled("kas ended the tunnel: the caller went away")
}

/// Whether the API server request failed because the TCP connect timed out (hyper-util's
/// connector reports its timeout as an `io::Error` of kind `TimedOut` in the error chain).
fn is_connect_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(e);
    while let Some(err) = current {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return true;
        }
        current = err.source();
    }
    false
}

type BodySender = mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;

/// The request body on its way from the tunnel to the API server. Every step also watches the
/// tunnel: kas ending it (the caller went away) is an error.
struct BodyPump {
    /// `None` once the body ended for the API server, or when it takes none (upgrades).
    tx: Option<BodySender>,
    /// Read from the tunnel, not yet taken by the API server (at most [`BODY_READ_AHEAD`]).
    pending: VecDeque<Bytes>,
    pending_bytes: usize,
    /// kas sent CloseSend.
    complete: bool,
}

impl BodyPump {
    fn new(tx: Option<BodySender>) -> Self {
        Self { tx, pending: VecDeque::new(), pending_bytes: 0, complete: false }
    }

    /// Whether the whole request body was handed to the API server connection (kas ended it
    /// and nothing is left here): only then can the connection take another request once
    /// the response ended.
    fn sent_all(&self) -> bool {
        self.complete && self.pending.is_empty()
    }

    /// The request had no body and its CloseSend was read: only kas ending the tunnel is watched.
    fn ended() -> Self {
        Self { tx: None, pending: VecDeque::new(), pending_bytes: 0, complete: true }
    }

    /// Moves the body one step: reads a frame from the tunnel or hands a chunk to the API
    /// server. After CloseSend (and once all is handed on) it resolves only when kas ends the
    /// tunnel, as an error: the caller is gone. Cancel-safe, so it can race the response.
    async fn step(&mut self, request: &mut TunnelRequest) -> Result<(), Status> {
        if self.complete && self.pending.is_empty() {
            // Dropping the sender ends the body for the API server.
            self.tx = None;
        }
        let reserve = {
            let tx = self.tx.clone().filter(|_| !self.pending.is_empty());
            async move {
                match tx {
                    Some(tx) => tx.reserve_owned().await.ok(),
                    None => std::future::pending().await,
                }
            }
        };
        let complete = self.complete;
        let read = complete || self.pending_bytes < BODY_READ_AHEAD;
        let next = async move {
            if complete {
                request.finish().await;
                return Err(caller_gone());
            }
            request.next_message().await
        };
        tokio::select! {
            permit = reserve => match (permit, self.pending.pop_front()) {
                (Some(permit), Some(chunk)) => {
                    self.pending_bytes -= chunk.len();
                    permit.send(Ok(Frame::data(chunk)));
                }
                _ => {
                    // The API server stopped reading the body (it answered already).
                    self.tx = None;
                    self.pending.clear();
                    self.pending_bytes = 0;
                }
            },
            message = next, if read => match message? {
                Some(data) => {
                    let http_frame::Frame::Body(chunk) = decode(data)? else {
                        return Err(Status::invalid_argument("unexpected frame in the request body"));
                    };
                    if self.tx.is_some() && !chunk.is_empty() {
                        self.pending_bytes += chunk.len();
                        self.pending.push_back(chunk);
                    }
                }
                None => self.complete = true,
            },
        }
        Ok(())
    }
}

/// After a 101: bytes both ways between the tunnel and the API server's upgraded connection.
async fn upgraded(
    request: &mut TunnelRequest,
    responder: &Responder,
    response: http::Response<Incoming>,
) -> Result<(), Status> {
    responder.without_credit();
    let io = hyper::upgrade::on(response)
        .await
        .map_err(|e| Status::unavailable(format!("Kubernetes API upgrade failed: {e}")))?;
    let (mut read, mut write) = tokio::io::split(TokioIo::new(io));
    let upstream = async {
        while let Some(data) = request.next_message().await? {
            let http_frame::Frame::Body(chunk) = decode(data)? else {
                return Err(Status::invalid_argument("unexpected frame in an upgraded stream"));
            };
            write.write_all(&chunk).await.map_err(|e| Status::unavailable(format!("upgraded write: {e}")))?;
        }
        // kas half-closed: the caller closed its side.
        let _ = write.shutdown().await;
        std::future::pending::<Result<(), Status>>().await
    };
    let downstream = async {
        let mut buf = vec![0u8; UPGRADED_READ_BUFFER];
        loop {
            let n = read.read(&mut buf).await.map_err(|e| Status::unavailable(format!("upgraded read: {e}")))?;
            if n == 0 {
                return responder.trailer(Default::default()).await;
            }
            responder.http_body(Bytes::copy_from_slice(&buf[..n])).await?;
        }
    };
    // The API server's side closing ends the exchange; an error on either side ends it too.
    tokio::select! {
        r = upstream => r,
        r = downstream => r,
    }
}

#[async_trait]
impl super::Module for KubernetesApi {
    fn methods(&self) -> &'static [&'static str] {
        &[kas_proto::kubernetes_api::METHOD]
    }

    async fn handle(&self, request: &mut TunnelRequest, responder: &Responder) {
        let result = self.exchange(request, responder).await;
        crate::metrics::request("kubernetes_api", result.as_ref().map_or(Outcome::Error, |outcome| *outcome));
        if let Err(status) = result {
            tracing::debug!(code = ?status.code(), error = %status.message(), "Kubernetes API exchange failed");
            // Before the response head kas answers with an error; after it, kas aborts.
            let _ = responder.error(&status).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kas_proto::kubernetes_api::WireRequestHead;

    /// A head as kas would decode it from a peer that sent these names and values.
    fn head(headers: &[(&str, &str)]) -> HttpRequestHead {
        let mut wire = WireRequestHead { method: "GET".into(), path: "/api".into(), headers: Default::default() };
        for (k, v) in headers {
            wire.headers.entry((*k).to_owned()).or_default().values.push(Bytes::copy_from_slice(v.as_bytes()));
        }
        wire.decoded().unwrap()
    }

    /// The URL each request goes to is the one kube-rs's `BaseUriLayer` (which agentk used
    /// before) makes: API server URLs with and without a path, trailing slashes, IPv6, and
    /// request paths with queries and escapes.
    #[tokio::test]
    async fn api_server_urls_join_request_paths_as_kube_rs_does() {
        let bases = [
            "https://10.0.0.1:6443",
            "https://10.0.0.1:6443/",
            "http://[::1]:8080",
            "https://rancher.example/k8s/clusters/c-m-1",
            "https://rancher.example/k8s/clusters/c-m-1//",
            "https://kubernetes.default.svc",
        ];
        let paths = ["/", "/api", "/api/v1/namespaces/default/pods?watch=1&labelSelector=a%3Db", "/apis/apps/v1/"];
        for base in bases {
            let base: http::Uri = base.parse().unwrap();
            let ours = ApiServerUrl::new(&base);
            for path in paths {
                let request = method_and_uri(&HttpRequestHead { method: "GET".into(), path: path.into(), ..head(&[]) })
                    .unwrap()
                    .1;
                let kube_rs = tower::ServiceBuilder::new()
                    .layer(kube::client::middleware::BaseUriLayer::new(base.clone()))
                    .service_fn(|r: http::Request<()>| async move { Ok::<_, Infallible>(r.uri().clone()) });
                let mut http_request = http::Request::new(());
                *http_request.uri_mut() = request.clone();
                let expected = kube_rs.oneshot(http_request).await.unwrap();
                assert_eq!(ours.join(request).unwrap(), expected, "{base} + {path}");
            }
        }
    }

    #[test]
    fn only_whitelisted_headers_reach_the_api_server() {
        let h = forwarded_headers(&head(&[
            ("authorization", "Bearer caller"),
            ("impersonate-user", "admin"),
            ("accept", "application/json"),
            ("x-custom", "1"),
            ("transfer-encoding", "chunked"),
            ("user-agent", "kubectl/v1.32"),
        ]));
        assert!(!h.contains_key("authorization"));
        assert!(!h.contains_key("impersonate-user"));
        assert!(!h.contains_key("x-custom"));
        assert!(!h.contains_key("transfer-encoding"));
        assert_eq!(h["accept"], "application/json");
        assert_eq!(h["user-agent"], format!("kubectl/v1.32 via agentk/{}", crate::VERSION).as_str());
    }

    #[test]
    fn upgrade_headers_pass_only_for_upgrades() {
        let h = forwarded_headers(&head(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-protocol", "v5.channel.k8s.io"),
        ]));
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "Upgrade");
        let h = forwarded_headers(&head(&[("connection", "keep-alive"), ("upgrade", "websocket")]));
        assert!(!h.contains_key("upgrade") && !h.contains_key("connection"));
        assert_eq!(h["user-agent"], format!("agentk/{}", crate::VERSION).as_str());
    }
}

#[cfg(test)]
mod configuration_tests {
    use super::*;
    use kas_proto::tunnel::pb::{AgentConfiguration, ConfigurationResponse, KubernetesApiConfiguration};

    fn api(settings: Option<KubernetesApiConfiguration>) -> KubernetesApi {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let response = ConfigurationResponse {
            configuration: Some(AgentConfiguration { kubernetes_api: settings, ..Default::default() }),
            commit_id: "c".into(),
        };
        KubernetesApi::new(&config, tokio::sync::watch::channel(Some(response)).1, ApiTimeouts::default()).unwrap()
    }

    #[tokio::test]
    async fn the_agent_configuration_decides_what_is_served() {
        use http::Method;
        let all = api(None);
        assert_eq!(all.refusal(&Method::DELETE, false), None);
        assert_eq!(all.refusal(&Method::GET, true), None);

        let read_only = api(Some(KubernetesApiConfiguration { disabled: false, read_only: true }));
        for (method, upgrade) in [(Method::GET, false), (Method::HEAD, false), (Method::OPTIONS, false)] {
            assert_eq!(read_only.refusal(&method, upgrade), None, "{method}");
        }
        for (method, upgrade) in
            [(Method::GET, true), (Method::POST, false), (Method::PATCH, false), (Method::DELETE, false)]
        {
            assert!(read_only.refusal(&method, upgrade).unwrap().contains("read-only"), "{method} {upgrade}");
        }

        let disabled = api(Some(KubernetesApiConfiguration { disabled: true, read_only: false }));
        assert!(disabled.refusal(&Method::GET, false).unwrap().contains("disabled"));
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;
    use kas_proto::kubernetes_api::HeaderValues;

    fn headers() -> impl Strategy<Value = std::collections::BTreeMap<String, HeaderValues>> {
        let name = prop_oneof![
            proptest::sample::select(
                FORWARDED_REQUEST_HEADERS
                    .iter()
                    .copied()
                    .chain(["authorization", "impersonate-user", "Impersonate-Group", "transfer-encoding", "x-custom"])
                    .collect::<Vec<_>>()
            )
            .prop_map(str::to_owned),
            ".{0,10}",
        ];
        let value = prop_oneof![
            Just(Bytes::from_static(b"Upgrade")),
            "[ -~]{0,20}".prop_map(Bytes::from),
            proptest::collection::vec(any::<u8>(), 0..8).prop_map(Bytes::from),
        ];
        proptest::collection::btree_map(
            name,
            proptest::collection::vec(value, 0..3).prop_map(|values| HeaderValues { values }),
            0..8,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever kas puts in a tunnel Message: a frame, or INVALID_ARGUMENT, never a panic.
        #[test]
        fn decode_of_arbitrary_messages(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            match decode(Bytes::from(data.clone())) {
                Ok(frame) => prop_assert_eq!(HttpFrame::decode(data.as_slice()).ok().and_then(|f| f.frame), Some(frame)),
                Err(status) => {
                    prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
                    prop_assert_eq!(status.message(), "invalid HTTP frame");
                }
            }
        }

        /// Arbitrary methods and paths: a valid method and an origin-form URI (never one with a
        /// scheme or host, which would send the request elsewhere), or INVALID_ARGUMENT naming
        /// what was wrong, never a panic.
        #[test]
        fn request_lines_of_arbitrary_heads(
            method in prop_oneof![Just("GET".to_owned()), Just("get".to_owned()), Just("PATCH".to_owned()), ".{0,10}"],
            path in prop_oneof![
                "/[ -~]{0,30}",
                "(https?://[a-z.@:]{0,10})?(/[a-z%?#=&.]{0,8}){0,3}",
                "//[a-z.]{1,8}/[a-z]{0,4}",
                "[*a-z:]{0,6}",
                ".{0,20}",
            ],
        ) {
            let head = HttpRequestHead { method: method.clone(), path: path.clone(), headers: Default::default() };
            match method_and_uri(&head) {
                Ok((m, uri)) => {
                    prop_assert_eq!(m.as_str(), method.as_str());
                    prop_assert!(uri.scheme().is_none() && uri.authority().is_none(), "{path:?} -> {uri:?}");
                    prop_assert!(uri.path().starts_with('/'));
                    // A fragment is dropped (it never goes on the wire); the rest is kept.
                    prop_assert_eq!(uri.to_string(), path.split('#').next().unwrap_or_default());
                }
                Err(status) => {
                    prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
                    prop_assert!(
                        status.message().starts_with("invalid HTTP method") || status.message().starts_with("invalid request path")
                    );
                }
            }
        }

        /// Arbitrary caller headers: only the whitelist reaches the API server, never the
        /// caller's credentials or impersonation, and always agentk's User-Agent.
        #[test]
        fn forwarded_headers_of_arbitrary_heads(headers in headers()) {
            let head = kas_proto::kubernetes_api::WireRequestHead { method: "GET".into(), path: "/api".into(), headers }
                .decoded()
                .unwrap();
            let out = forwarded_headers(&head);
            for name in out.keys() {
                prop_assert!(FORWARDED_REQUEST_HEADERS.contains(&name.as_str()), "{name} forwarded");
            }
            prop_assert!(!out.contains_key("authorization"));
            let ua = out.get(USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default();
            prop_assert!(ua.contains(&format!("agentk/{}", crate::VERSION)), "{ua:?}");
            prop_assert_eq!(out.get_all(USER_AGENT).iter().count(), 1);
        }
    }
}
