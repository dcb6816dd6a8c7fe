//! agentk's connections to the API server, kept open between requests: HTTP/1.1, the only
//! protocol kube-rs's TLS connector offers.
//!
//! hyper-util's pooling client did this before (issue 14): per request it hashed the pool key
//! with SipHash some fifty times, spawned a task to return the connection once the response
//! body ended, and wrapped the connection in two layers of futures (agentk's instructions per
//! proxied GET fell by 11.5 % without it, callgrind). Here the exchange hands the connection back itself
//! ([`Reusable::release`]) once it read the response body to its end and the request body was
//! all handed on; a request takes an idle connection only once hyper says it is ready for
//! another. A connection not handed back (the caller went away, an upgrade, a body left
//! unsent) is closed when the exchange drops it.
//!
//! One instance serves one API server, whose URL it is made with: the idle connections all go
//! there, and only a request's path and query are used.
//!
//! As with hyper-util's client: the `Host` header is set from the API server URL, the request
//! goes out in origin form, an idle connection is used for at most [`IDLE_TIMEOUT`] after its
//! last response (the API server closes idle connections after 90 s too), and a request the
//! connection closed before sending (an idle connection the server had just closed) is sent
//! again on another connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::header::{HOST, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use tower::{BoxError, Service, ServiceExt};

use super::ProxyBody;

/// How long an idle connection is kept for reuse: hyper-util's default, and what the API
/// server waits before it closes an idle connection itself.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

type Sender = http1::SendRequest<ProxyBody>;

/// A [`Service`] sending each request on an idle connection to the API server, or a new one
/// made with `connector` (kube-rs's TLS connector around hyper-util's `HttpConnector`, whose
/// connect timeout applies). The response carries a [`Reusable`] in its extensions.
#[derive(Clone)]
pub struct ApiServerConnections<C> {
    connector: C,
    /// The API server's URL, what the connector connects to.
    api_server: Uri,
    /// Its `Host` header, made once; `None` for a URL without a host (every request fails).
    host: Option<HeaderValue>,
    read_buffer: usize,
    idle: Arc<IdleList>,
}

/// The idle connections, ordered by `since`.
type IdleList = Mutex<Vec<Idle>>;

/// Ordered by `since`: connections are taken from the end (the most recently used, whose
/// socket and TLS state are warmest) and expire from the start.
struct Idle {
    sender: Sender,
    since: Instant,
}

impl<C> ApiServerConnections<C> {
    /// Connections to `api_server`; `read_buffer`: hyper's read buffer per connection
    /// (`max_buf_size`).
    pub fn new(connector: C, api_server: &Uri, read_buffer: usize) -> Self {
        let host = host_header(api_server).ok();
        Self { connector, api_server: api_server.clone(), host, read_buffer, idle: Arc::default() }
    }

    /// An idle connection that can take a request now, if there is one. Expired and closed
    /// ones are dropped; one that is not ready yet (hyper still finishing its last exchange)
    /// is left for a later request.
    fn checkout(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().ok()?;
        let now = Instant::now();
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            let Idle { sender, since } = &idle[i];
            if now.duration_since(*since) >= IDLE_TIMEOUT || sender.is_closed() {
                idle.remove(i);
            } else if sender.is_ready() {
                return Some(idle.remove(i).sender);
            }
        }
        None
    }

    /// Idle connections (for tests).
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.lock().map(|idle| idle.len()).unwrap_or_default()
    }
}

impl<C> ApiServerConnections<C>
where
    C: Service<Uri> + Clone + Send + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send,
{
    async fn connect(&self) -> Result<Sender, BoxError> {
        let mut connector = self.connector.clone();
        let io =
            connector.ready().await.map_err(Into::into)?.call(self.api_server.clone()).await.map_err(Into::into)?;
        let (sender, connection) = http1::Builder::new().max_buf_size(self.read_buffer).handshake(io).await?;
        tokio::spawn(async move {
            // Upgrades (exec, attach, port-forward) take the connection over after a 101.
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(error = %e, "Kubernetes API connection ended");
            }
        });
        Ok(sender)
    }

    async fn send(self, mut request: http::Request<ProxyBody>) -> Result<http::Response<Incoming>, BoxError> {
        let host = self.host.clone().ok_or("the API server URL has no host")?;
        request.headers_mut().entry(HOST).or_insert(host);
        let origin_form = request.uri().path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        *request.uri_mut() = Uri::from(origin_form);
        loop {
            let (mut sender, reused) = match self.checkout() {
                Some(sender) => (sender, true),
                None => (self.connect().await?, false),
            };
            match sender.try_send_request(request).await {
                Ok(mut response) => {
                    let handback = Handback { sender, idle: Arc::downgrade(&self.idle) };
                    let reusable = Reusable(Arc::new(Mutex::new(Some(handback))));
                    response.extensions_mut().insert(reusable);
                    return Ok(response);
                }
                Err(mut e) => match e.take_message() {
                    // Closed before the request went out: an idle connection the server closed.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }
}

/// The `Host` header for `uri` (an absolute URL): its host, and its port unless it is the
/// scheme's default, as hyper-util's client writes it.
fn host_header(uri: &Uri) -> Result<HeaderValue, BoxError> {
    let host = uri.host().ok_or("the API server URL has no host")?;
    let default_port = match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    };
    let value = match uri.port_u16() {
        Some(port) if Some(port) != default_port => HeaderValue::try_from(format!("{host}:{port}")),
        _ => HeaderValue::try_from(host),
    };
    Ok(value?)
}

impl<C> Service<http::Request<ProxyBody>> for ApiServerConnections<C>
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send,
{
    type Response = http::Response<Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<ProxyBody>) -> Self::Future {
        Box::pin(self.clone().send(request))
    }
}

/// The connection a response came on (in the response's extensions, which must be `Clone`):
/// [`Reusable::release`] puts it back among the idle ones.
#[derive(Clone)]
pub struct Reusable(Arc<Mutex<Option<Handback>>>);

/// A connection and the idle list it goes back to (gone with the service).
struct Handback {
    sender: Sender,
    idle: std::sync::Weak<IdleList>,
}

impl Reusable {
    /// The response body was read to its end and the request body was all sent: the
    /// connection can take the next request once hyper has finished the exchange.
    pub fn release(self) {
        let Some(Handback { sender, idle }) = self.0.lock().ok().and_then(|mut slot| slot.take()) else { return };
        let Some(idle) = idle.upgrade() else { return };
        let Ok(mut idle) = idle.lock() else { return };
        let now = Instant::now();
        let expired = idle.iter().take_while(|i| now.duration_since(i.since) >= IDLE_TIMEOUT).count();
        idle.drain(..expired);
        idle.push(Idle { sender, since: now });
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioIo;

    use super::*;

    /// An HTTP/1.1 server answering each request with its `Host` header, its request target and
    /// its body, closing the connection after a response when `close_after` says so.
    async fn server(close_after: fn(usize) -> bool) -> (Uri, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            let served = Arc::new(AtomicUsize::new(0));
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                let served = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
                        let n = served.fetch_add(1, Ordering::SeqCst) + 1;
                        async move {
                            let host = request.headers().get(HOST).cloned();
                            let target = request.uri().to_string();
                            let body = request.into_body().collect().await.unwrap().to_bytes();
                            let text = format!(
                                "{} {target} {}",
                                host.as_ref().map_or("-", |h| h.to_str().unwrap()),
                                body.len()
                            );
                            let mut response = http::Response::new(Full::new(Bytes::from(text)));
                            if close_after(n) {
                                response
                                    .headers_mut()
                                    .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
                            }
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        (uri, accepted)
    }

    fn connections(api_server: &Uri) -> ApiServerConnections<HttpConnector> {
        ApiServerConnections::new(HttpConnector::new(), api_server, 64 * 1024)
    }

    /// A GET, or a POST of `body` when there is one, to `path` on the server at `uri`.
    fn request(uri: &Uri, path: &str, body: &'static [u8]) -> http::Request<ProxyBody> {
        let method = if body.is_empty() { http::Method::GET } else { http::Method::POST };
        let mut request =
            http::Request::new(Full::new(Bytes::from_static(body)).map_err(|e: Infallible| match e {}).boxed());
        *request.method_mut() = method;
        *request.uri_mut() = format!("{uri}{}", &path[1..]).parse().unwrap();
        request
    }

    /// Sends `request` and reads the response as the exchange does: the body to its end, then
    /// the connection released unless `release` is false.
    async fn exchange(
        connections: &mut ApiServerConnections<HttpConnector>,
        request: http::Request<ProxyBody>,
        release: bool,
    ) -> String {
        let mut response = connections.ready().await.unwrap().call(request).await.unwrap();
        let reusable = response.extensions_mut().remove::<Reusable>().expect("the connection comes with the response");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        if release {
            reusable.release();
        }
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn sequential_requests_share_one_connection() {
        let (uri, accepted) = server(|_| false).await;
        let mut connections = connections(&uri);
        let host = uri.authority().unwrap().to_string();
        for i in 0..5 {
            let answer = exchange(&mut connections, request(&uri, "/api/v1/pods?limit=1", b""), true).await;
            // The Host of the URL, and the request target in origin form.
            assert_eq!(answer, format!("{host} /api/v1/pods?limit=1 0"), "request {i}");
            let answer =
                exchange(&mut connections, request(&uri, "/api/v1/namespaces", b"{\"kind\":\"Namespace\"}"), true)
                    .await;
            assert_eq!(answer, format!("{host} /api/v1/namespaces 20"), "request {i}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(connections.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_connection_not_released_is_not_reused() {
        let (uri, accepted) = server(|_| false).await;
        let mut connections = connections(&uri);
        exchange(&mut connections, request(&uri, "/api", b""), false).await;
        exchange(&mut connections, request(&uri, "/api", b""), true).await;
        exchange(&mut connections, request(&uri, "/api", b""), true).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn concurrent_requests_get_connections_of_their_own() {
        let (uri, accepted) = server(|_| false).await;
        let connections = connections(&uri);
        let first = connections.clone().send(request(&uri, "/a", b""));
        let second = connections.clone().send(request(&uri, "/b", b""));
        let (first, second) = tokio::join!(first, second);
        for response in [first.unwrap(), second.unwrap()] {
            let reusable = response.extensions().get::<Reusable>().cloned().unwrap();
            response.into_body().collect().await.unwrap();
            reusable.release();
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(connections.idle_count(), 2);
    }

    /// The server closing a connection after a response (`Connection: close`), or closing it
    /// while it sat idle: the next request goes out on a new connection, without an error.
    #[tokio::test]
    async fn closed_connections_are_replaced() {
        let (uri, accepted) = server(|n| n % 2 == 0).await;
        let mut connections = connections(&uri);
        for i in 0..6 {
            let answer = exchange(&mut connections, request(&uri, "/version", b""), true).await;
            assert!(answer.ends_with(" /version 0"), "request {i}: {answer}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    /// A server that closes every connection right after its response, without saying so
    /// (as one whose idle timeout struck does): the connection looks reusable when it is
    /// released, and the next request still succeeds, on a new connection.
    #[tokio::test]
    async fn connections_the_server_closed_while_idle_are_replaced() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let mut byte = [0u8; 1];
                    if socket.read(&mut byte).await.unwrap() == 0 {
                        break;
                    }
                    head.push(byte[0]);
                }
                socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.unwrap();
            }
        });
        let mut connections = connections(&uri);
        for i in 0..3 {
            assert_eq!(exchange(&mut connections, request(&uri, "/healthz", b""), true).await, "ok", "request {i}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_unreachable_api_server_is_an_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let uri: Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        let error = connections(&uri).send(request(&uri, "/api", b"")).await.unwrap_err();
        assert!(error.to_string().contains("tcp connect error"), "{error}");
    }

    #[test]
    fn host_headers_leave_out_default_ports() {
        for (url, host) in [
            ("https://10.0.0.1:6443/", "10.0.0.1:6443"),
            ("https://kubernetes.default.svc:443", "kubernetes.default.svc"),
            ("https://kubernetes.default.svc", "kubernetes.default.svc"),
            ("http://[::1]:80/api", "[::1]"),
            ("http://[::1]:8080/api", "[::1]:8080"),
        ] {
            assert_eq!(host_header(&url.parse().unwrap()).unwrap(), host, "{url}");
        }
        assert!(host_header(&"/api".parse().unwrap()).is_err());
    }
}
