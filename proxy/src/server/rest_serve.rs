//! Serves the rest listener: HTTP/1.1 and HTTP/2 (h2 over TLS with ALPN, h2c in plaintext),
//! protocol upgrades (kubectl exec), optional TLS, graceful shutdown. TLS matters here beyond
//! transport security: kubectl (client-go) does not send a bearer token to a plaintext server.

use std::sync::Arc;

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::config::TlsConfig;

/// How far the bytes a caller's HTTP/1.1 connection has written to its socket run behind what a
/// streamed response handed to hyper. hyper buffers a response body up to its `max_buf_size`
/// once the socket is full, and that is the header limit (`limits.max_http_header_bytes`, which
/// operators may raise); a proxied response waits on this instead ([`WriteProgress::gate`]), so
/// a caller that stops reading leaves at most this much (plus one chunk) in kas. Two chunks:
/// one being written while the next is ready (one chunk cost a third of the throughput).
pub const MAX_UNSENT_RESPONSE_BYTES: u64 = 2 * kas_proto::flow::MAX_CHUNK as u64;

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

/// A connection's IO, counting what reaches the socket into [`WriteProgress`].
struct Counted<T> {
    io: T,
    progress: WriteProgress,
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

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counted<T> {
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
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A listener's certificate and key, loaded for rustls (HTTP/2 and HTTP/1.1 offered by ALPN).
pub fn tls_acceptor(tls: &TlsConfig) -> Result<TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert_file = tls.certificate_file.display();
    let certs = CertificateDer::pem_file_iter(&tls.certificate_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read certificates from {cert_file}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{cert_file} holds no certificate"));
    }
    let key = PrivateKeyDer::from_pem_file(&tls.key_file)
        .map_err(|e| format!("cannot read the private key from {}: {e}", tls.key_file.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate and key do not form a usable identity: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts connections until `shutdown`, then lets open connections finish (the caller bounds
/// that with its grace period).
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: axum::Router,
    max_header_bytes: usize,
    shutdown: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    // Request heads larger than this are refused (HTTP/1.1: 431; HTTP/2: the stream is reset).
    builder.http1().max_buf_size(max_header_bytes.max(8192));
    builder.http2().max_header_list_size(u32::try_from(max_header_bytes).unwrap_or(u32::MAX));
    loop {
        let tcp = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // E.g. too many open files: keep serving the connections we have.
                    tracing::warn!(error = %e, "rest listener accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
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
        tokio::spawn(async move {
            let result = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(stream) => {
                        let io = TokioIo::new(Counted { io: stream, progress });
                        watcher.watch(builder.serve_connection_with_upgrades(io, service).into_owned()).await
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                },
                None => {
                    let io = TokioIo::new(Counted { io: tcp, progress });
                    watcher.watch(builder.serve_connection_with_upgrades(io, service).into_owned()).await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "rest connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
}
