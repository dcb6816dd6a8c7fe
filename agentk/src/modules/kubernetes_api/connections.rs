//! agentk's connections to the API server, each driven by the exchange that uses it: hyper's
//! HTTP/1 connection future is polled in the tunnel's own task ([`drive`]), not in a task of its
//! own as in hyper-util's pooled client, whose connection task took a wakeup per request, per
//! response head and per body chunk (issue 14). Idle connections are kept, the most recently
//! used taken first; one the API server closed is noticed when it is next taken (its connection
//! future has ended), and [`ApiConnections::sweep`] closes those idle too long.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http::header::{HOST, HeaderValue};
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use kube::client::ConfigExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// The body of a request to the API server.
pub type ProxyBody = BoxBody<Bytes, std::io::Error>;
/// What kube-rs's layers do to a request (base URL, credentials, extra headers), as a service
/// that hands the request back instead of sending it (in a response: the layers want one).
type Prepare = BoxCloneSyncService<http::Request<ProxyBody>, http::Response<http::Request<ProxyBody>>, BoxError>;

type Io = MaybeHttpsStream<TokioIo<TcpStream>>;
/// hyper's connection future (its type cannot be named).
type Driver = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// An idle connection is closed after this long (hyper-util's pool default), by the sweep or
/// when it is next taken.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept; more (after a burst) are closed as they come back.
const MAX_IDLE: usize = 256;

/// One HTTP/1 connection to the API server.
pub struct ApiConnection {
    sender: http1::SendRequest<ProxyBody>,
    /// `None` once the connection future ended (closed, failed, or handed over by an upgrade).
    driver: Option<Driver>,
    /// Taken from the idle connections: the API server may have closed it meanwhile.
    reused: bool,
}

impl ApiConnection {
    /// Runs `work` while driving the connection (its reads and writes happen only while polled).
    pub async fn drive<F: Future>(&mut self, work: F) -> F::Output {
        drive(&mut self.driver, work).await
    }

    /// Whether the connection is still open, driving it once without waiting.
    fn poll_open(&mut self) -> bool {
        if let Some(driver) = self.driver.as_mut()
            && let Some(result) = driver.as_mut().now_or_never()
        {
            if let Err(e) = result {
                tracing::debug!(error = %e, "Kubernetes API connection ended");
            }
            self.driver = None;
        }
        self.driver.is_some() && !self.sender.is_closed()
    }

    /// Sends the request, driving the connection until the response head arrives. The request
    /// comes back if it was not sent (the connection had closed before it was written).
    async fn send(
        &mut self,
        request: http::Request<ProxyBody>,
    ) -> Result<http::Response<Incoming>, (hyper::Error, Option<http::Request<ProxyBody>>)> {
        let response = self.sender.try_send_request(request);
        drive(&mut self.driver, response).await.map_err(|mut e| {
            let request = e.take_message();
            (e.into_error(), request)
        })
    }
}

/// Runs `work` and polls `driver` with it, in the caller's task, until `work` is done.
async fn drive<F: Future>(driver: &mut Option<Driver>, work: F) -> F::Output {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        if let Some(d) = driver.as_mut()
            && let Poll::Ready(result) = d.as_mut().poll(cx)
        {
            if let Err(e) = result {
                tracing::debug!(error = %e, "Kubernetes API connection ended");
            }
            // An ended connection future must not be polled again.
            *driver = None;
        }
        work.as_mut().poll(cx)
    })
    .await
}

struct Idle {
    connection: ApiConnection,
    since: Instant,
}

/// The API server connections of one agentk.
pub struct ApiConnections {
    connector: HttpsConnector<HttpConnector>,
    prepare: Prepare,
    builder: http1::Builder,
    /// Never held across an await, and nothing is closed under it.
    idle: Mutex<Vec<Idle>>,
}

impl ApiConnections {
    /// The same TLS, base URL and authentication stack kube-rs builds, with streaming bodies and
    /// without kube-rs's read/write timeouts (agentk's own timeouts apply instead; kube-rs's 30 s
    /// connect timeout is not from the kubeconfig). `read_buffer` bounds hyper's read buffer
    /// per connection.
    pub fn new(config: &kube::Config, connect_timeout: Duration, read_buffer: usize) -> Result<Self, kube::Error> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        let connector = config.rustls_https_connector_with_connector(http)?;
        let prepare = ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            .map_err(BoxError::from)
            .service_fn(|request: http::Request<ProxyBody>| {
                std::future::ready(Ok::<_, BoxError>(http::Response::new(request)))
            });
        let mut builder = http1::Builder::new();
        builder.max_buf_size(read_buffer);
        Ok(Self { connector, prepare: BoxCloneSyncService::new(prepare), builder, idle: Mutex::new(Vec::new()) })
    }

    /// Sends `request` (origin-form URI, as kas sent it) to the API server on an idle
    /// connection or a new one, and returns the response head with the connection, which the
    /// caller drives while it reads the body ([`ApiConnection::drive`]) and then gives back
    /// ([`Self::give_back`]). A request that a reused connection did not send (the API server
    /// had closed it) is sent on another.
    pub async fn send(
        &self,
        request: http::Request<ProxyBody>,
    ) -> Result<(http::Response<Incoming>, ApiConnection), BoxError> {
        let mut request = self.prepare.clone().oneshot(request).await?.into_body();
        let uri = request.uri().clone();
        let host = host_header(&uri).ok_or("the Kubernetes API URL has no host")?;
        request.headers_mut().entry(HOST).or_insert(host);
        // HTTP/1 to the server itself: origin-form, as hyper-util's client sends it.
        *request.uri_mut() = uri.path_and_query().cloned().map_or_else(|| http::Uri::from_static("/"), http::Uri::from);
        loop {
            let mut connection = match self.take() {
                Some(connection) => connection,
                None => self.connect(&uri).await?,
            };
            match connection.send(request).await {
                Ok(response) => return Ok((response, connection)),
                Err((_, Some(unsent))) if connection.reused => request = unsent,
                Err((e, _)) => return Err(e.into()),
            }
        }
    }

    async fn connect(&self, uri: &http::Uri) -> Result<ApiConnection, BoxError> {
        let io = self.connector.clone().oneshot(uri.clone()).await?;
        let (sender, connection) = self.builder.handshake::<Io, ProxyBody>(io).await?;
        Ok(ApiConnection { sender, driver: Some(Box::pin(connection.with_upgrades())), reused: false })
    }

    /// The most recently used idle connection that is still open.
    fn take(&self) -> Option<ApiConnection> {
        loop {
            let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop()?;
            let mut connection = idle.connection;
            if idle.since.elapsed() < IDLE_TIMEOUT && connection.poll_open() {
                connection.reused = true;
                return Some(connection);
            }
            // Dropped here, outside the lock: closes it.
        }
    }

    /// A connection whose exchange ended (its response read to the end) is kept for the next
    /// request if it is ready for one; otherwise it is closed.
    pub fn give_back(&self, mut connection: ApiConnection) {
        // Driven once more: hyper marks it ready for the next request as it sees the last one end.
        if !connection.poll_open() || !connection.sender.is_ready() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(Idle { connection, since: Instant::now() });
        }
    }

    /// Closes idle connections that the API server closed or that idled out.
    pub fn sweep(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(PoisonError::into_inner));
        let mut kept: Vec<Idle> = idle
            .into_iter()
            .filter_map(|mut i| (i.since.elapsed() < IDLE_TIMEOUT && i.connection.poll_open()).then_some(i))
            .collect();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // Connections given back meanwhile are more recent: they stay on top.
        kept.append(&mut idle);
        *idle = kept;
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// `Host` for the API server's URL, without the scheme's default port (as hyper-util sets it).
fn host_header(uri: &http::Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let secure = matches!(uri.scheme_str(), Some("https" | "wss"));
    match uri.port_u16() {
        Some(443) if secure => HeaderValue::from_str(host).ok(),
        Some(80) if !secure => HeaderValue::from_str(host).ok(),
        Some(port) => HeaderValue::from_str(&format!("{host}:{port}")).ok(),
        None => HeaderValue::from_str(host).ok(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body_util::{BodyExt, Empty};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// How the test server answers.
    #[derive(Clone, Copy, PartialEq)]
    enum Answer {
        /// "ok", keeping the connection open.
        Ok,
        /// "ok", then it closes the connection without saying so (a keep-alive timeout).
        OkThenClose,
        /// The first of the body's 10 bytes only, the rest never.
        Partial,
    }

    /// A plain HTTP/1.1 server that records the request heads and the connections it accepted.
    struct Server {
        url: String,
        heads: Arc<Mutex<Vec<String>>>,
        accepted: Arc<std::sync::atomic::AtomicUsize>,
    }

    async fn server(answer: Answer) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let heads = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (h, a) = (heads.clone(), accepted.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                a.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let h = h.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 4096];
                        let Ok(n) = socket.read(&mut chunk).await else { return };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head: Vec<u8> = buf.drain(..end + 4).collect();
                            h.lock().unwrap().push(String::from_utf8_lossy(&head).into_owned());
                            let response: &[u8] = match answer {
                                Answer::Partial => b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\no",
                                _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                            };
                            let _ = socket.write_all(response).await;
                            if answer == Answer::OkThenClose {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Server { url, heads, accepted }
    }

    fn connections(url: &str) -> ApiConnections {
        let config = kube::Config::new(url.parse().unwrap());
        ApiConnections::new(&config, Duration::from_secs(5), 64 * 1024).unwrap()
    }

    fn get(path: &str) -> http::Request<ProxyBody> {
        let body = Empty::<Bytes>::new().map_err(|e: std::convert::Infallible| match e {}).boxed();
        http::Request::builder().uri(path).body(body).unwrap()
    }

    /// Sends a GET and reads its body to the end while driving the connection, then gives the
    /// connection back.
    async fn exchange(connections: &ApiConnections, path: &str) -> Bytes {
        let (response, mut connection) = connections.send(get(path)).await.unwrap();
        let body = connection.drive(response.into_body().collect()).await.unwrap().to_bytes();
        connections.give_back(connection);
        body
    }

    #[tokio::test]
    async fn a_connection_is_reused_and_requests_are_origin_form_with_a_host() {
        let server = server(Answer::Ok).await;
        let connections = connections(&server.url);
        assert_eq!(exchange(&connections, "/api/v1/pods?limit=1").await, "ok");
        assert_eq!(connections.idle_count(), 1);
        assert_eq!(exchange(&connections, "/api").await, "ok");
        assert_eq!(server.accepted.load(std::sync::atomic::Ordering::SeqCst), 1, "one connection for both");
        let heads = server.heads.lock().unwrap().clone();
        let host = server.url.trim_start_matches("http://");
        assert!(heads[0].starts_with("GET /api/v1/pods?limit=1 HTTP/1.1\r\n"), "{}", heads[0]);
        assert!(heads[0].to_ascii_lowercase().contains(&format!("host: {host}\r\n")), "{}", heads[0]);
        assert!(heads[1].starts_with("GET /api HTTP/1.1\r\n"), "{}", heads[1]);
    }

    /// The API server closed an idle connection (its keep-alive timeout): the next request
    /// goes out on a new one and succeeds.
    #[tokio::test]
    async fn a_connection_closed_while_idle_is_replaced() {
        let server = server(Answer::OkThenClose).await;
        let connections = connections(&server.url);
        assert_eq!(exchange(&connections, "/a").await, "ok");
        assert_eq!(exchange(&connections, "/b").await, "ok");
        assert_eq!(exchange(&connections, "/c").await, "ok");
        assert_eq!(server.accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(server.heads.lock().unwrap().len(), 3, "each request sent once");
    }

    /// A connection whose response was not read to its end cannot carry the next request: it
    /// is closed, not kept.
    #[tokio::test]
    async fn a_connection_with_an_unread_response_is_not_kept() {
        let server = server(Answer::Partial).await;
        let connections = connections(&server.url);
        let (response, mut connection) = connections.send(get("/a")).await.unwrap();
        let mut body = response.into_body();
        let first = connection.drive(body.frame()).await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "o");
        drop(body);
        connections.give_back(connection);
        assert_eq!(connections.idle_count(), 0);
    }

    /// The sweep closes idle connections the API server closed.
    #[tokio::test]
    async fn the_sweep_closes_connections_the_server_closed() {
        let server = server(Answer::OkThenClose).await;
        let connections = connections(&server.url);
        assert_eq!(exchange(&connections, "/a").await, "ok");
        let closed = async {
            loop {
                connections.sweep();
                if connections.idle_count() == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), closed).await.expect("the closed connection is swept");
    }

    #[test]
    fn host_header_leaves_out_the_default_port() {
        let host = |u: &str| host_header(&u.parse().unwrap()).unwrap();
        assert_eq!(host("https://10.0.0.1:443/api"), "10.0.0.1");
        assert_eq!(host("https://kubernetes.default.svc:6443"), "kubernetes.default.svc:6443");
        assert_eq!(host("http://127.0.0.1:80/"), "127.0.0.1");
        assert_eq!(host("http://127.0.0.1:8080/"), "127.0.0.1:8080");
        assert_eq!(host("https://[::1]:443/"), "[::1]");
    }
}
