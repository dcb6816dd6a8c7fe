//! What every listener shares: a bounded accept loop (connection cap, back-off when accept()
//! fails, e.g. out of file descriptors) and a handshake deadline on each connection, so that
//! idle and half-open connections cannot pile up until kas runs out of file descriptors.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use crate::server::data_plane::DataPlane;

/// After accept() fails with anything but a per-connection error (EMFILE, ENFILE, ENOBUFS),
/// retrying at once would spin: wait this long first.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// TCP keepalive on accepted connections: a peer that vanished without a FIN (host gone,
/// cable cut) is detected by the kernel even when no HTTP/2 ping is due.
pub const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(60);
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Descriptors kept free for everything that is not a listener's connection (Redis, peers,
/// GitLab, Git mirrors, log files): the automatic per-listener cap leaves this many.
pub const RESERVED_FDS: u64 = 1024;
/// The automatic cap splits the remaining descriptors between the four external listeners
/// (agent, api, internal, rest): a flood on all of them still leaves the reserve.
pub const EXTERNAL_LISTENERS: u64 = 4;
/// Used when the descriptor limit cannot be read.
pub const FALLBACK_MAX_CONNECTIONS: usize = 1024;
/// Probes and scrapes need few connections; a small fixed cap keeps /readyz reachable even
/// when every external listener is flooded.
pub const OBSERVABILITY_MAX_CONNECTIONS: usize = 128;

/// Connections a listener's kernel accept queue holds: as many as the kernel allows (it caps
/// the value at `net.core.somaxconn`, 4096 by default since Linux 5.4). tokio's own default, 1024,
/// overflowed when a kas died and 5,000 agents reconnected to each survivor within 200 ms: the
/// kernel dropped their handshakes and they came back only after TCP's 1, 3, 7 s retransmissions
/// (docs/scale.md, "Failover").
pub const LISTEN_BACKLOG: u32 = 65_535;

/// A listening socket on `address` with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as tokio's
/// `TcpListener::bind` sets it, so a restarted kas can bind while old connections linger).
pub fn bind(address: std::net::SocketAddr) -> io::Result<TcpListener> {
    let socket = if address.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Raises the soft RLIMIT_NOFILE to the hard limit (the default soft limit, often 1024, is far
/// below what a kas with thousands of agents needs). Returns the soft limit now in force.
pub fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    match (limit.current, limit.maximum) {
        (Some(current), Some(maximum)) if current < maximum => {
            match setrlimit(Resource::Nofile, Rlimit { current: Some(maximum), maximum: Some(maximum) }) {
                Ok(()) => Some(maximum),
                Err(e) => {
                    tracing::warn!(error = %e, current, maximum, "cannot raise the open file limit");
                    Some(current)
                }
            }
        }
        // Unlimited (None) soft limit: report the hard limit, or nothing.
        (Some(current), _) => Some(current),
        (None, maximum) => maximum,
    }
}

/// The default connection cap of each external listener, from the process's descriptor limit.
pub fn default_max_connections() -> usize {
    use rustix::process::{Resource, getrlimit};
    match getrlimit(Resource::Nofile).current {
        Some(limit) if limit > RESERVED_FDS + EXTERNAL_LISTENERS * 16 => {
            usize::try_from((limit - RESERVED_FDS) / EXTERNAL_LISTENERS).unwrap_or(FALLBACK_MAX_CONNECTIONS)
        }
        Some(_) => FALLBACK_MAX_CONNECTIONS.min(64),
        None => FALLBACK_MAX_CONNECTIONS * 16,
    }
}

/// Per-listener connection settings.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; more wait in the kernel's accept queue.
    pub max_connections: usize,
    /// TLS handshake plus the HTTP/2 preface and first frame (or the first byte of an HTTP/1
    /// request, after which hyper's header read timeout takes over) must arrive within this.
    pub handshake_timeout: Duration,
}

/// A listener's accept loop state: its connection slots and what has been logged.
pub struct Acceptor {
    pub(crate) name: &'static str,
    listener: TcpListener,
    slots: Arc<Semaphore>,
    limits: ConnectionLimits,
    keepalive: socket2::TcpKeepalive,
    /// Logged "at its connection limit" and not yet "below it again".
    at_cap: bool,
    /// Logged "accept failed" and not yet "accepting again".
    failing: bool,
}

/// An accepted TCP connection holding its slot, and when its handshake must be complete.
pub struct Accepted {
    pub tcp: TcpStream,
    pub permit: OwnedSemaphorePermit,
    pub deadline: Instant,
}

impl Acceptor {
    pub fn new(name: &'static str, listener: TcpListener, limits: ConnectionLimits) -> Self {
        Self {
            name,
            listener,
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            limits,
            keepalive: socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE_TIME).with_interval(TCP_KEEPALIVE_INTERVAL),
            at_cap: false,
            failing: false,
        }
    }

    /// The next connection. Waits (without accepting) while the listener is at its cap, and
    /// backs off while accept() fails; logs once per change of either state. Cancel-safe.
    pub async fn accept(&mut self) -> Accepted {
        loop {
            let permit = match self.slots.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    if !self.at_cap {
                        tracing::warn!(
                            listener = self.name,
                            max_connections = self.limits.max_connections,
                            "listener at its connection limit: new connections wait until one closes"
                        );
                        self.at_cap = true;
                    }
                    // The semaphore is never closed; a closed one would end in a plain retry.
                    match self.slots.clone().acquire_owned().await {
                        Ok(p) => p,
                        Err(_) => continue,
                    }
                }
            };
            if self.at_cap && self.slots.available_permits() * 10 >= self.limits.max_connections {
                tracing::info!(listener = self.name, "listener below its connection limit again");
                self.at_cap = false;
            }
            match self.listener.accept().await {
                Ok((tcp, _)) => {
                    if self.failing {
                        tracing::info!(listener = self.name, "listener accepting connections again");
                        self.failing = false;
                    }
                    let _ = tcp.set_nodelay(true);
                    let _ = socket2::SockRef::from(&tcp).set_tcp_keepalive(&self.keepalive);
                    return Accepted { tcp, permit, deadline: Instant::now() + self.limits.handshake_timeout };
                }
                // The connection was gone before we took it: nothing wrong with the listener.
                Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset) => {}
                Err(e) => {
                    if !self.failing {
                        tracing::warn!(
                            listener = self.name,
                            error = %e,
                            "accepting connections failed (out of file descriptors?): retrying every {ACCEPT_BACKOFF:?}"
                        );
                        self.failing = true;
                    }
                    drop(permit);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
}

/// What a gRPC listener's connections are: plaintext or TLS, with their handshake deadline.
pub type GrpcIo = Guarded<Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>>;

/// The incoming connections of a gRPC listener for tonic's `serve_with_incoming_shutdown`:
/// capped, TLS (when configured) bounded by the handshake deadline, each connection closed if it
/// sends no complete HTTP/2 preface and first frame in time. Accepting stops (the listening
/// socket closes, new connections are refused) when `shutdown` is cancelled.
///
/// One stream per data plane thread, each to be served on its thread (one stream, served on
/// the current runtime, when the data plane is disabled): the accept loop hands connections to
/// the threads in turn, and each connection's socket is moved to its thread's runtime before
/// its TLS handshake (`data_plane::spawn_with_socket`).
pub fn grpc_incoming(
    mut acceptor: Acceptor,
    tls: Option<tokio_rustls::TlsAcceptor>,
    data_plane: &DataPlane,
    shutdown: CancellationToken,
) -> Vec<tokio_stream::wrappers::ReceiverStream<io::Result<GrpcIo>>> {
    let threads: Vec<Option<tokio::runtime::Handle>> =
        if data_plane.is_enabled() { data_plane.handles().into_iter().map(Some).collect() } else { vec![None] };
    let (queues, streams): (Vec<_>, Vec<_>) = threads
        .iter()
        .map(|_| {
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            (tx, tokio_stream::wrappers::ReceiverStream::new(rx))
        })
        .unzip();
    tokio::spawn(async move {
        let mut next = 0usize;
        loop {
            // Shutdown first: once it is cancelled no connection is accepted, even one already
            // waiting (tonic no longer takes them, so it would be left open, not refused).
            let accepted = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = all_closed(&queues) => break,
                a = acceptor.accept() => a,
            };
            // The next thread whose server still takes connections.
            let Some(i) = (0..queues.len()).map(|k| (next + k) % queues.len()).find(|&i| !queues[i].is_closed()) else {
                break;
            };
            next = i + 1;
            let (tx, thread, tls, name) = (queues[i].clone(), threads[i].clone(), tls.clone(), acceptor.name);
            match thread {
                None => serve_accepted(accepted, tls, tx, name).await,
                Some(thread) => {
                    let Accepted { tcp, permit, deadline } = accepted;
                    crate::server::data_plane::spawn_with_socket(&thread, tcp, move |tcp| {
                        serve_accepted(Accepted { tcp, permit, deadline }, tls, tx, name)
                    });
                }
            }
        }
        // `acceptor` (the listening socket) is dropped here: new connections are refused.
    });
    streams
}

/// Resolves once every server stopped taking connections.
async fn all_closed(queues: &[tokio::sync::mpsc::Sender<io::Result<GrpcIo>>]) {
    for queue in queues {
        queue.closed().await;
    }
}

/// Hands an accepted connection to its server: plaintext at once; TLS after its handshake, in a
/// task of its own (on the current runtime) bounded by the connection's deadline.
async fn serve_accepted(
    accepted: Accepted,
    tls: Option<tokio_rustls::TlsAcceptor>,
    tx: tokio::sync::mpsc::Sender<io::Result<GrpcIo>>,
    name: &'static str,
) {
    let Accepted { tcp, permit, deadline } = accepted;
    let connect_info = tonic::transport::server::TcpConnectInfo {
        local_addr: tcp.local_addr().ok(),
        remote_addr: tcp.peer_addr().ok(),
    };
    match tls {
        None => {
            let io = Guarded::new(Either::Left(tcp), permit, deadline, connect_info);
            let _ = tx.send(Ok(io)).await;
        }
        Some(tls) => {
            tokio::spawn(async move {
                if let Some(stream) = tls_handshake(&tls, tcp, deadline, name).await {
                    let io = Guarded::new(Either::Right(stream), permit, deadline, connect_info);
                    let _ = tx.send(Ok(io)).await;
                }
            });
        }
    }
}

/// How long a connection whose TLS handshake failed is read (and its bytes dropped) after kas
/// sent its alert and closed its side.
const FAILED_HANDSHAKE_LINGER: Duration = Duration::from_secs(1);

/// A server-side TLS handshake, bounded by the connection's deadline. When it fails, rustls's
/// alert (e.g. `CertificateRequired`) is followed by kas closing its side, and what the client
/// sends meanwhile is read and dropped for a moment: closing a socket with unread bytes resets
/// the connection, and a TLS 1.3 client (its side of the handshake done, its request already
/// sent) then sees "connection reset" instead of the alert that says what was wrong.
pub async fn tls_handshake(
    tls: &tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    deadline: Instant,
    listener: &'static str,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    match tokio::time::timeout_at(deadline, tls.accept(tcp).into_fallible()).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err((e, mut tcp))) => {
            tracing::debug!(listener, error = %e, "TLS handshake failed");
            let _ = tokio::time::timeout(FAILED_HANDSHAKE_LINGER, async {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let _ = tcp.shutdown().await;
                let mut sink = [0u8; 4096];
                while tcp.read(&mut sink).await.is_ok_and(|n| n > 0) {}
            })
            .await;
            None
        }
        Err(_) => {
            tracing::debug!(listener, "TLS handshake timed out");
            None
        }
    }
}

/// How far the peer got through the HTTP/2 connection preface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handshake {
    /// This many bytes of the 24-byte preface matched.
    Preface(usize),
    /// The preface is complete; this many bytes of the first frame's 9-byte header arrived.
    FrameHeader { length: u32, seen: usize },
    /// The first frame's payload: this many bytes still to come.
    FramePayload(u32),
    /// Done, or not HTTP/2 (HTTP/1: hyper's header read timeout applies from here).
    Complete,
}

impl Handshake {
    fn observe(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match *self {
                Handshake::Preface(n) => {
                    let take = (H2_PREFACE.len() - n).min(bytes.len());
                    if bytes[..take] != H2_PREFACE[n..n + take] {
                        *self = Handshake::Complete;
                        return;
                    }
                    bytes = &bytes[take..];
                    *self = if n + take == H2_PREFACE.len() {
                        Handshake::FrameHeader { length: 0, seen: 0 }
                    } else {
                        Handshake::Preface(n + take)
                    };
                }
                Handshake::FrameHeader { mut length, mut seen } => {
                    while seen < 9 && !bytes.is_empty() {
                        if seen < 3 {
                            length = (length << 8) | u32::from(bytes[0]);
                        }
                        seen += 1;
                        bytes = &bytes[1..];
                    }
                    *self = match (seen, length) {
                        (9, 0) => Handshake::Complete,
                        (9, length) => Handshake::FramePayload(length),
                        _ => Handshake::FrameHeader { length, seen },
                    };
                }
                Handshake::FramePayload(remaining) => {
                    let take = u32::try_from(bytes.len()).unwrap_or(u32::MAX).min(remaining);
                    bytes = &bytes[take as usize..];
                    *self =
                        if take == remaining { Handshake::Complete } else { Handshake::FramePayload(remaining - take) };
                }
                Handshake::Complete => return,
            }
        }
    }
}

/// A connection that must complete its handshake (see [`Handshake`]) before a deadline, else
/// its reads fail with `TimedOut` and the server closes it. Holds its listener slot until dropped.
pub struct Guarded<IO> {
    io: IO,
    handshake: Handshake,
    deadline: Option<Pin<Box<Sleep>>>,
    connect_info: tonic::transport::server::TcpConnectInfo,
    _permit: OwnedSemaphorePermit,
}

impl<IO> Guarded<IO> {
    pub fn new(
        io: IO,
        permit: OwnedSemaphorePermit,
        deadline: Instant,
        connect_info: tonic::transport::server::TcpConnectInfo,
    ) -> Self {
        Self {
            io,
            handshake: Handshake::Preface(0),
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
            connect_info,
            _permit: permit,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.deadline.is_some() {
                    this.handshake.observe(&buf.filled()[before..]);
                    if this.handshake == Handshake::Complete {
                        this.deadline = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let expired = this.deadline.as_mut().is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if expired {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent no complete request head or HTTP/2 preface in time",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO> tonic::transport::server::Connected for Guarded<IO> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.connect_info.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(chunks: &[&[u8]]) -> Handshake {
        let mut h = Handshake::Preface(0);
        for c in chunks {
            h.observe(c);
        }
        h
    }

    #[test]
    fn the_handshake_completes_with_the_preface_and_first_frame() {
        // SETTINGS frame with one 6-byte setting.
        let settings: &[u8] = &[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        assert_eq!(after(&[H2_PREFACE, settings]), Handshake::Complete);
        let whole = [H2_PREFACE.as_slice(), settings].concat();
        for split in 0..whole.len() {
            assert_eq!(after(&[&whole[..split], &whole[split..]]), Handshake::Complete, "split at {split}");
        }
        assert_eq!(after(&[&whole[..whole.len() - 1]]), Handshake::FramePayload(1));
        assert_eq!(after(&[&H2_PREFACE[..10]]), Handshake::Preface(10));
        // An empty SETTINGS frame completes it too.
        assert_eq!(after(&[H2_PREFACE, &[0, 0, 0, 4, 0, 0, 0, 0, 0]]), Handshake::Complete);
    }

    /// A burst of connections larger than tokio's default backlog (1024) waits in the accept
    /// queue instead of having its handshakes dropped (the client would retry only after 1 s).
    #[tokio::test]
    async fn connections_beyond_1024_wait_in_the_accept_queue() {
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .expect("/proc/sys/net/core/somaxconn");
        assert!(somaxconn > 1100, "net.core.somaxconn is {somaxconn}: this test needs more than 1100");
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = listener.local_addr().unwrap();
        // Never accepted: each connect completes only while the accept queue has room.
        let n = 1100;
        let held: Vec<std::net::TcpStream> = (0..n)
            .map(|i| {
                std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500))
                    .unwrap_or_else(|e| panic!("connection {i} of {n} not queued: {e}"))
            })
            .collect();
        assert_eq!(held.len(), n);
    }

    #[test]
    fn http1_is_left_to_hyper() {
        assert_eq!(after(&[b"GET / HTTP/1.1\r\n"]), Handshake::Complete);
        assert_eq!(after(&[b"PRI * HTTP/1.1"]), Handshake::Complete);
    }
}
