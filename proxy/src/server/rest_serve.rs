//! Serves the rest listener: HTTP/1.1 and HTTP/2 (h2 over TLS with ALPN, h2c in plaintext),
//! protocol upgrades (kubectl exec), optional TLS, graceful shutdown. TLS matters here beyond
//! transport security: kubectl (client-go) does not send a bearer token to a plaintext server.

use std::path::Path;
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

use crate::config::TlsConfig;
use crate::server::listen::{Accepted, Acceptor, Guarded};

/// A listener's certificate and key, loaded for rustls (HTTP/2 and HTTP/1.1 offered by ALPN).
pub fn tls_acceptor(tls: &TlsConfig) -> Result<TlsAcceptor, String> {
    server_tls(&tls.certificate_file, &tls.key_file, None, &[b"h2", b"http/1.1"])
}

/// rustls for a listener: its certificate chain and key, the ALPN protocols it offers, and when
/// `client_ca` is given, client certificates required and verified against that CA.
pub fn server_tls(
    certificate_file: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
    alpn: &[&[u8]],
) -> Result<TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let read_certs = |path: &Path| {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("{} holds no certificate", path.display()));
        }
        Ok(certs)
    };
    let certs = read_certs(certificate_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("cannot read the private key from {}: {e}", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs(ca)? {
                roots.add(cert).map_err(|e| format!("{}: unusable CA certificate: {e}", ca.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate and key do not form a usable identity: {e}"))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
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
        let Accepted { tcp, permit, deadline } = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = acceptor.accept() => accepted,
        };
        let connect_info = tonic::transport::server::TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: tcp.peer_addr().ok(),
        };
        let service =
            TowerToHyperService::new(app.clone().map_request(|req: http::Request<Incoming>| req.map(Body::new)));
        let builder = builder.clone();
        let tls = tls.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let io = match tls {
                Some(acceptor) => match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => Either::Right(stream),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake timed out");
                        return;
                    }
                },
                None => Either::Left(tcp),
            };
            let io = Guarded::new(io, permit, deadline, connect_info);
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
