//! Kubernetes API proxy, agentk half: one HTTP exchange from a tunnel to the in-cluster API
//! server, made with agentk's own credentials (service account or kubeconfig), streamed both
//! ways. Protocol upgrades (kubectl exec, attach, port-forward) become a byte stream.
//!
//! What reaches the API server: the method and path kas sent, a documented whitelist of request
//! headers ([`FORWARDED_REQUEST_HEADERS`]: never the caller's `Authorization`, never
//! `Impersonate-*`), agentk's own credentials, and `User-Agent` extended with `via agentk/<v>`.
//! Redirects are not followed. There are no read or write timeouts: watches and `logs -f` run
//! until a side closes. If kas goes away (the caller cancelled), the tunnel ends and the request
//! to the API server is dropped, which cancels it.
//!
//! The agent configuration's `kubernetes_api` section can disable the proxy or make it
//! read-only; refused requests get HTTP 403 with a Kubernetes `Status`, as an RBAC denial would,
//! so kubectl prints "Error from server (Forbidden)". Until the first configuration arrives,
//! the proxy serves everything (the configuration's default).

use std::convert::Infallible;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, USER_AGENT};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kas_proto::kubernetes_api::{
    HttpFrame, HttpRequestHead, HttpResponseHead, headers_from_proto, headers_to_proto, http_frame, is_upgrade,
    strip_hop_by_hop,
};
use kube::client::ConfigExt;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use crate::tunnel::{Responder, TunnelRequest};

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

/// Connecting to the API server should be quick; only the connect has a limit.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Request body chunks buffered towards the API server (each at most one tunnel chunk).
const BODY_BUFFER: usize = kas_proto::flow::HOP_BUFFER;
/// hyper's read buffer per API server connection (it holds response heads, and body bytes not
/// yet forwarded): bounded so a stuck tunnel leaves little here, not hyper's ~400 KiB.
const API_SERVER_READ_BUFFER: usize = 64 * 1024;
/// Read size for an upgraded connection.
const UPGRADED_READ_BUFFER: usize = 16 * 1024;

// A concrete body error type (not BoxError): keeps the service's request type free of trait-object
// lifetimes, which async-trait futures cannot prove general enough.
type ProxyBody = BoxBody<Bytes, std::io::Error>;
type ApiService = BoxCloneSyncService<http::Request<ProxyBody>, http::Response<Incoming>, BoxError>;

pub struct KubernetesApi {
    service: ApiService,
    /// The agent configuration as last received from kas.
    configuration: Configuration,
}

type Configuration = tokio::sync::watch::Receiver<Option<kas_proto::tunnel::pb::ConfigurationResponse>>;

impl KubernetesApi {
    /// The same TLS, base URL and authentication stack kube-rs builds, around a plain hyper
    /// client with streaming bodies and without kube-rs's read/write timeouts.
    pub fn new(config: &kube::Config, configuration: Configuration) -> Result<Self, kube::Error> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(config.connect_timeout.unwrap_or(CONNECT_TIMEOUT)));
        http.set_nodelay(true);
        let connector = config.rustls_https_connector_with_connector(http)?;
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .http1_max_buf_size(API_SERVER_READ_BUFFER)
            .build(connector);
        let service = ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            .map_err(BoxError::from)
            .service(client);
        Ok(Self { service: BoxCloneSyncService::new(service), configuration })
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
async fn forbidden(responder: &Responder, method: &str, path: &str, reason: &str) -> Result<(), Status> {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("{method} {path}: {reason}"),
        "reason": "Forbidden",
        "details": {},
        "code": 403,
    })
    .to_string();
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    responder.header(Default::default()).await?;
    let head = HttpResponseHead { status: 403, headers: headers_to_proto(&headers) };
    responder.message(HttpFrame::response_head(head).to_bytes()).await?;
    responder.message(HttpFrame::body(Bytes::from(body)).to_bytes()).await?;
    responder.trailer(Default::default()).await
}

fn decode(data: Bytes) -> Result<http_frame::Frame, Status> {
    HttpFrame::decode(data).ok().and_then(|f| f.frame).ok_or_else(|| Status::invalid_argument("invalid HTTP frame"))
}

/// The headers that go to the API server.
fn forwarded_headers(head: &HttpRequestHead) -> HeaderMap {
    let mut headers = headers_from_proto(&head.headers);
    let upgrade = is_upgrade(&headers);
    strip_hop_by_hop(&mut headers, upgrade);
    let mut out = HeaderMap::new();
    for name in FORWARDED_REQUEST_HEADERS {
        for v in headers.get_all(*name) {
            out.append(HeaderName::from_static(name), v.clone());
        }
    }
    let ua = match headers.get(USER_AGENT).and_then(|v| v.to_str().ok()) {
        Some(ua) if !ua.is_empty() => format!("{ua} via agentk/{}", crate::VERSION),
        _ => format!("agentk/{}", crate::VERSION),
    };
    if let Ok(v) = HeaderValue::from_str(&ua) {
        out.insert(USER_AGENT, v);
    }
    out
}

fn response_head(response: &http::Response<Incoming>) -> HttpResponseHead {
    let mut headers = response.headers().clone();
    strip_hop_by_hop(&mut headers, response.status() == http::StatusCode::SWITCHING_PROTOCOLS);
    HttpResponseHead { status: u32::from(response.status().as_u16()), headers: headers_to_proto(&headers) }
}

impl KubernetesApi {
    async fn exchange(&self, request: &mut TunnelRequest, responder: &Responder) -> Result<(), Status> {
        let first = request.next_message().await?.ok_or_else(|| Status::invalid_argument("request without a head"))?;
        let http_frame::Frame::RequestHead(head) = decode(first)? else {
            return Err(Status::invalid_argument("the first frame must be the request head"));
        };
        let method = http::Method::from_bytes(head.method.as_bytes())
            .map_err(|_| Status::invalid_argument(format!("invalid HTTP method {:?}", head.method)))?;
        let uri: http::Uri = head
            .path
            .parse()
            .ok()
            .filter(|u: &http::Uri| u.scheme().is_none() && u.path().starts_with('/'))
            .ok_or_else(|| Status::invalid_argument(format!("invalid request path {:?}", head.path)))?;
        let headers = forwarded_headers(&head);
        let upgrade = is_upgrade(&headers);
        if let Some(reason) = self.refusal(&method, upgrade) {
            tracing::info!(method = %head.method, path = %uri.path(), "Kubernetes API request refused by the agent configuration");
            return forbidden(responder, &head.method, uri.path(), reason).await;
        }
        let (body_tx, body_rx) = mpsc::channel(BODY_BUFFER);
        let body: ProxyBody = if upgrade {
            Empty::<Bytes>::new().map_err(|e: Infallible| match e {}).boxed()
        } else {
            StreamBody::new(ReceiverStream::new(body_rx)).boxed()
        };
        let mut http_request = http::Request::new(body);
        *http_request.method_mut() = method;
        *http_request.uri_mut() = uri;
        *http_request.headers_mut() = headers;
        tracing::debug!(method = %head.method, path = %head.path, upgrade, "proxying to the Kubernetes API");

        let started = std::time::Instant::now();
        let call = self.service.clone().oneshot(http_request);
        tokio::pin!(call);
        let mut body_tx = (!upgrade).then_some(body_tx);
        // The request body and the response proceed together (the API server reads the body
        // before it answers, and may answer before it read all of it). Once the body is sent,
        // the tunnel is still watched: kas ending it means the caller went away, and dropping
        // the API server request here cancels it (watches, logs -f).
        let response = loop {
            tokio::select! {
                r = &mut call => break r,
                r = next_body_chunk(request, &mut body_tx) => r?,
            }
        }
        .map_err(|e| Status::unavailable(format!("Kubernetes API unreachable: {e}")))?;
        crate::metrics::api_server_latency(started.elapsed());
        responder.header(Default::default()).await?;
        responder.message(HttpFrame::response_head(response_head(&response)).to_bytes()).await?;
        if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            return upgraded(request, responder, response).await;
        }
        let mut body = response.into_body();
        loop {
            let frame = tokio::select! {
                f = body.frame() => f,
                r = next_body_chunk(request, &mut body_tx) => {
                    r?;
                    continue;
                }
            };
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| Status::unavailable(format!("Kubernetes API response failed: {e}")))?;
            if let Ok(data) = frame.into_data() {
                // Bounded messages keep every hop's buffers bounded in bytes.
                for piece in kas_proto::flow::split_chunk(data) {
                    responder.message(HttpFrame::body(piece).to_bytes()).await?;
                }
            }
        }
        responder.trailer(Default::default()).await
    }
}

/// Moves one request body chunk from the tunnel to the API server. After the body ended
/// (`body` is `None`) it resolves only when kas ends the tunnel, as an error: the caller is gone.
async fn next_body_chunk(
    request: &mut TunnelRequest,
    body: &mut Option<mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>>,
) -> Result<(), Status> {
    let Some(tx) = body else {
        request.finish().await;
        return Err(Status::cancelled("kas ended the tunnel: the caller went away"));
    };
    match request.next_message().await? {
        Some(data) => {
            let http_frame::Frame::Body(chunk) = decode(data)? else {
                return Err(Status::invalid_argument("unexpected frame in the request body"));
            };
            if tx.send(Ok(Frame::data(chunk))).await.is_err() {
                // The API server stopped reading the body (it answered already).
                *body = None;
            }
        }
        // CloseSend: the body is complete; dropping the sender ends it for the API server.
        None => *body = None,
    }
    Ok(())
}

/// After a 101: bytes both ways between the tunnel and the API server's upgraded connection.
async fn upgraded(
    request: &mut TunnelRequest,
    responder: &Responder,
    response: http::Response<Incoming>,
) -> Result<(), Status> {
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
            responder.message(HttpFrame::body(Bytes::copy_from_slice(&buf[..n])).to_bytes()).await?;
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
        crate::metrics::request("kubernetes_api", result.is_ok());
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
    use kas_proto::kubernetes_api::HeaderValues;

    fn head(headers: &[(&str, &str)]) -> HttpRequestHead {
        let mut map = std::collections::HashMap::new();
        for (k, v) in headers {
            map.entry((*k).to_owned())
                .or_insert_with(HeaderValues::default)
                .values
                .push(Bytes::copy_from_slice(v.as_bytes()));
        }
        HttpRequestHead { method: "GET".into(), path: "/api".into(), headers: map }
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
            configuration: Some(AgentConfiguration { observability: None, kubernetes_api: settings }),
            commit_id: "c".into(),
        };
        KubernetesApi::new(&config, tokio::sync::watch::channel(Some(response)).1).unwrap()
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
