//! Serves the rest listener: HTTP/1.1 and HTTP/2 (h2 over TLS with ALPN, h2c in plaintext),
//! protocol upgrades (kubectl exec), optional TLS, graceful shutdown. TLS matters here beyond
//! transport security: kubectl (client-go) does not send a bearer token to a plaintext server.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::server::data_plane::DataPlane;
use crate::server::listen::{Accepted, Acceptor, Guarded};

/// How far the bytes a caller's HTTP/1.1 connection has written to its socket run behind what a
/// streamed response handed to hyper. hyper buffers a response body up to its `max_buf_size`
/// once the socket is full, and that is the header limit (`limits.max_http_header_bytes`, which
/// operators may raise); a proxied response waits on this instead ([`WriteProgress::gate`]), so
/// a caller that stops reading leaves at most this much (plus one chunk) in kas. None: the
/// socket's own unsent bytes ([`MAX_UNSENT_SOCKET_BYTES`]) keep it busy while the next chunk
/// comes, and what hyper holds would count as read for the response credit.
pub const MAX_UNSENT_RESPONSE_BYTES: u64 = 0;

/// `TCP_NOTSENT_LOWAT` of callers' connections: the socket takes more of a response only while
/// less than this is waiting to be *sent*. Bytes in flight to the caller are still limited by TCP
/// alone (the window a fast, distant caller needs), but a caller that stopped reading no longer
/// lets the kernel swallow megabytes (send buffers autotune to 4 MiB), which kas would count as
/// read and answer with more response credit (`kas_proto::flow::ResponseWindow`).
pub const MAX_UNSENT_SOCKET_BYTES: u32 = 16 * 1024;

fn bound_unsent_bytes(tcp: &tokio::net::TcpStream) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_notsent_lowat(MAX_UNSENT_SOCKET_BYTES) {
        tracing::debug!(error = %e, "setting TCP_NOTSENT_LOWAT failed");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = tcp;
}

/// Bytes written to one connection's socket so far; a request extension on HTTP/1 connections
/// (one response at a time, so the connection's progress is the response's progress).
#[derive(Clone, Default)]
pub struct WriteProgress(Arc<ProgressInner>);

#[derive(Default)]
struct ProgressInner {
    written: std::sync::atomic::AtomicU64,
    advanced: tokio::sync::Notify,
}

impl WriteProgress {
    fn add(&self, n: usize) {
        if n > 0 {
            self.0.written.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            self.0.advanced.notify_waiters();
        }
    }

    fn written(&self) -> u64 {
        self.0.written.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `body` passed on no faster than the socket takes it: a chunk is pulled only while less than
    /// [`MAX_UNSENT_RESPONSE_BYTES`] of what was passed on is still unwritten.
    pub fn gate<S, E>(self, body: S) -> impl futures::Stream<Item = Result<bytes::Bytes, E>> + Send + 'static
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
        E: Send + 'static,
    {
        // Counted from now: the head and earlier responses on this connection are already ahead.
        let start = self.written();
        futures::stream::unfold((Box::pin(body), self, 0u64), move |(mut body, progress, passed)| async move {
            loop {
                // Registered before the check, so a write between the check and the wait wakes it.
                let advanced = progress.0.advanced.notified();
                if passed <= progress.written().saturating_sub(start) + MAX_UNSENT_RESPONSE_BYTES {
                    break;
                }
                advanced.await;
            }
            let item = futures::StreamExt::next(&mut body).await?;
            let passed = passed + item.as_ref().map_or(0, |c| c.len() as u64);
            Some((item, (body, progress, passed)))
        })
    }
}

/// How long a connection kas closes is still read (and the bytes dropped) after kas's side was
/// shut down, at most.
const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// A connection's IO, counting what reaches the socket into [`WriteProgress`], and closing with a
/// linger: kas may answer before it read the request (413 for a body over the limit, 401) and
/// then close, and a socket closed with unread bytes resets the connection, so the client gets
/// "broken pipe" or "connection reset" while still sending, never the answer. After shutting
/// down its side, kas reads and drops what the client still sends until the client closes too,
/// for at most [`CLOSE_LINGER`] (nginx's lingering close).
struct Counted<T> {
    io: T,
    progress: WriteProgress,
    /// Set once kas's side is shut down: the end of the linger.
    linger: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counted<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            self.progress.add(*n);
        }
        r
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            self.progress.add(*n);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;

        let this = &mut *self;
        if this.linger.is_none() {
            std::task::ready!(std::pin::Pin::new(&mut this.io).poll_shutdown(cx))?;
            this.linger = Some(Box::pin(tokio::time::sleep(CLOSE_LINGER)));
        }
        let mut sink = [0u8; 4096];
        loop {
            if this.linger.as_mut().is_some_and(|l| std::future::Future::poll(l.as_mut(), cx).is_ready()) {
                return Poll::Ready(Ok(()));
            }
            let mut buf = tokio::io::ReadBuf::new(&mut sink);
            match tokio::io::AsyncRead::poll_read(std::pin::Pin::new(&mut this.io), cx, &mut buf) {
                // The client closed (or the connection broke): nothing more can reset it.
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// HTTP/2 pings on the rest and observability listeners: a client that vanished is noticed
/// (and its connection closed) within interval + timeout even while no request is open.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections until `shutdown`, then closes the listening socket (new connections are
/// refused at once) and lets open connections finish (the caller bounds that with its grace
/// period). At most `limits.max_connections` at once; each must send its request head (HTTP/1)
/// or HTTP/2 preface, after TLS, within `limits.handshake_timeout`.
pub async fn serve(
    acceptor: Acceptor,
    tls: Option<TlsAcceptor>,
    app: axum::Router,
    settings: HttpSettings,
    data_plane: DataPlane,
    shutdown: CancellationToken,
) {
    let mut acceptor = acceptor;
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    // Request heads larger than this are refused (HTTP/1.1: 431; HTTP/2: the stream is reset).
    builder
        .http1()
        .max_buf_size(settings.max_header_bytes.max(8192))
        // Hyper runs this timer whenever it waits for a request head: a partial head, and an
        // idle kept-alive connection, are closed after it.
        .timer(TokioTimer::new())
        .header_read_timeout(settings.handshake_timeout);
    builder
        .http2()
        .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX))
        .timer(TokioTimer::new())
        .keep_alive_interval(HTTP2_KEEPALIVE_INTERVAL)
        .keep_alive_timeout(HTTP2_KEEPALIVE_TIMEOUT)
        .max_concurrent_streams(settings.max_concurrent_streams);
    loop {
        // Shutdown first (as in `grpc_incoming`): nothing is accepted once it is cancelled.
        let Accepted { tcp, permit, deadline } = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = acceptor.accept() => accepted,
        };
        bound_unsent_bytes(&tcp);
        let connect_info = tonic::transport::server::TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: tcp.peer_addr().ok(),
        };
        let progress = WriteProgress::default();
        let request_progress = progress.clone();
        let service = TowerToHyperService::new(app.clone().map_request(move |req: http::Request<Incoming>| {
            let mut req = req.map(Body::new);
            // HTTP/2 streams share the connection; their responses are bounded by stream windows.
            if req.version() < http::Version::HTTP_2 {
                req.extensions_mut().insert(request_progress.clone());
            }
            req
        }));
        let builder = builder.clone();
        let tls = tls.clone();
        let watcher = graceful.watcher();
        let name = acceptor.name;
        data_plane.spawn_connection(tcp, move |tcp| async move {
            let io = match tls {
                Some(acceptor) => match crate::server::listen::tls_handshake(&acceptor, tcp, deadline, name).await {
                    Some(stream) => Either::Right(stream),
                    None => return,
                },
                None => Either::Left(tcp),
            };
            let io = Counted { io: Guarded::new(io, permit, deadline, connect_info), progress, linger: None };
            let result =
                watcher.watch(builder.serve_connection_with_upgrades(TokioIo::new(io), service).into_owned()).await;
            if let Err(e) = result {
                tracing::debug!(error = %e, "rest connection ended with an error");
            }
        });
    }
    // Closes the listening socket now: connections arriving during the drain are refused
    // instead of waiting in the accept queue until kas exits.
    drop(acceptor);
    graceful.shutdown().await;
}

/// HTTP settings of one listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpSettings {
    pub max_header_bytes: usize,
    pub handshake_timeout: Duration,
    pub max_concurrent_streams: u32,
}
