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
        let service =
            TowerToHyperService::new(app.clone().map_request(|req: http::Request<Incoming>| req.map(Body::new)));
        let builder = builder.clone();
        let tls = tls.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let result = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(stream) => {
                        watcher
                            .watch(builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned())
                            .await
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                },
                None => {
                    watcher.watch(builder.serve_connection_with_upgrades(TokioIo::new(tcp), service).into_owned()).await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "rest connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
}
