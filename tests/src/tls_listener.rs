//! [`TlsListener`]: an `axum::serve` listener over TLS for the harness's HTTPS servers (the fake
//! GitLab, the Git HTTP server).

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// Connections whose TLS handshakes are done in their own tasks, so a slow or failing client
/// (e.g. one rejecting the certificate) never holds up the others. Only connections whose
/// handshake succeeded reach axum.
pub struct TlsListener {
    connections: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp` until `stop` is cancelled; `on_handshake_failure` runs for each
    /// handshake that fails (not for one cut short by `stop`).
    pub fn start(
        tcp: TcpListener,
        acceptor: TlsAcceptor,
        stop: CancellationToken,
        on_handshake_failure: impl Fn() + Clone + Send + 'static,
    ) -> Self {
        let addr = tcp.local_addr().expect("addr");
        let (tx, connections) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(accepted) = stop.run_until_cancelled(tcp.accept()).await {
                let Ok((stream, peer)) = accepted else { continue };
                let (acceptor, tx, stop, failed) =
                    (acceptor.clone(), tx.clone(), stop.clone(), on_handshake_failure.clone());
                tokio::spawn(async move {
                    match stop.run_until_cancelled(acceptor.accept(stream)).await {
                        Some(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Some(Err(_)) => failed(),
                        None => {}
                    }
                });
            }
        });
        Self { connections, addr }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accept loop stopped: graceful shutdown ends the server.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
