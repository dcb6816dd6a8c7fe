//! `FaultProxy`: a TCP proxy on an ephemeral port that injects network faults at run time, for
//! hung-peer and partition scenarios (agentk → kas, kas → kas, kas → Redis).
//!
//! - [`FaultProxy::pause`]: nothing is forwarded either way, sockets stay open (a SIGSTOPped
//!   process: the kernel still accepts connections, nobody reads or answers).
//! - [`FaultProxy::blackhole`]: bytes are read and dropped silently, no RST.
//! - [`FaultProxy::delay`]: every chunk is delivered this much later (latency, not a throughput cap).
//! - [`FaultProxy::throttle`]: at most this many bytes per second per direction and connection.
//! - [`FaultProxy::cut`]: closes every open connection now (new ones are forwarded).
//! - [`FaultProxy::refuse`]: new connections are reset at once and open ones cut (a killed process).
//! - [`FaultProxy::resume`]: normal forwarding again (delay and throttle cleared).
//!
//! [`FaultProxy::accepted`] counts accepted connections, i.e. the dial attempts of the client side.
#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Where the proxy forwards to.
#[derive(Debug, Clone)]
pub enum ProxyTarget {
    Tcp(SocketAddr),
    /// A unix socket (the test redis-server listens on one).
    Unix(PathBuf),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forward,
    Pause,
    Blackhole,
    Refuse,
}

#[derive(Debug, Clone, Copy)]
struct Faults {
    mode: Mode,
    delay: Duration,
    bytes_per_second: Option<u64>,
    /// Bumped by `cut`: connections opened before end.
    cuts: u64,
}

struct Shared {
    faults: watch::Sender<Faults>,
    target: Mutex<Option<ProxyTarget>>,
    accepted: AtomicU64,
    open: AtomicUsize,
}

pub struct FaultProxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

const CHUNK: usize = 16 * 1024;

impl FaultProxy {
    /// A proxy forwarding to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let p = Self::bind().await;
        p.set_target(ProxyTarget::Tcp(target));
        p
    }

    /// A proxy forwarding to a unix socket (e.g. `RedisServer::socket()`).
    pub async fn start_unix(path: PathBuf) -> Self {
        let p = Self::bind().await;
        p.set_target(ProxyTarget::Unix(path));
        p
    }

    /// A proxy without a target yet (connections are dropped until [`FaultProxy::set_target`]):
    /// for a kas that must advertise the proxy's port before it is bound itself.
    pub async fn bind() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind fault proxy");
        let address = listener.local_addr().unwrap();
        let faults = Faults { mode: Mode::Forward, delay: Duration::ZERO, bytes_per_second: None, cuts: 0 };
        let shared = Arc::new(Shared {
            faults: watch::channel(faults).0,
            target: Mutex::new(None),
            accepted: AtomicU64::new(0),
            open: AtomicUsize::new(0),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(listener, shared.clone(), stop.clone()));
        Self { address, shared, stop }
    }

    pub fn set_target(&self, target: ProxyTarget) {
        *self.shared.target.lock().unwrap() = Some(target);
    }

    /// The address clients dial instead of the target.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Connections accepted so far (dial attempts through the proxy, refused ones included).
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections currently open through the proxy.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    fn set_mode(&self, mode: Mode) {
        self.shared.faults.send_modify(|f| f.mode = mode);
    }

    /// Forwards nothing either way, keeping every socket open (a hung process).
    pub fn pause(&self) {
        self.set_mode(Mode::Pause);
    }

    /// Reads and drops every byte both ways, silently (no RST, no FIN).
    pub fn blackhole(&self) {
        self.set_mode(Mode::Blackhole);
    }

    /// Adds `latency` to every chunk in both directions.
    pub fn delay(&self, latency: Duration) {
        self.shared.faults.send_modify(|f| f.delay = latency);
    }

    /// Limits each direction of each connection to `bytes_per_second`.
    pub fn throttle(&self, bytes_per_second: u64) {
        self.shared.faults.send_modify(|f| f.bytes_per_second = Some(bytes_per_second.max(1)));
    }

    /// Closes every open connection (new ones are accepted and forwarded as before).
    pub fn cut(&self) {
        self.shared.faults.send_modify(|f| f.cuts += 1);
    }

    /// Like a killed process: open connections are cut and new ones reset at once.
    pub fn refuse(&self) {
        self.shared.faults.send_modify(|f| {
            f.mode = Mode::Refuse;
            f.cuts += 1;
        });
    }

    /// Normal forwarding: no pause, blackhole, refusal, delay or throttle.
    pub fn resume(&self) {
        self.shared.faults.send_modify(|f| {
            f.mode = Mode::Forward;
            f.delay = Duration::ZERO;
            f.bytes_per_second = None;
        });
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((client, _)) = accepted else { continue };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let faults = *shared.faults.borrow();
        let target = shared.target.lock().unwrap().clone();
        if faults.mode == Mode::Refuse || target.is_none() {
            // Closed before a byte is exchanged, as by a process that is gone.
            drop(client);
            continue;
        }
        let _ = client.set_nodelay(true);
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let upstream: Box<dyn Stream> = match target {
                Some(ProxyTarget::Tcp(a)) => match TcpStream::connect(a).await {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        Box::new(s)
                    }
                    Err(_) => return,
                },
                Some(ProxyTarget::Unix(p)) => match tokio::net::UnixStream::connect(p).await {
                    Ok(s) => Box::new(s),
                    Err(_) => return,
                },
                None => return,
            };
            shared.open.fetch_add(1, Ordering::SeqCst);
            let mut faults = shared.faults.subscribe();
            let cuts = faults.borrow().cuts;
            let (client_read, client_write) = tokio::io::split(Box::new(client) as Box<dyn Stream>);
            let (upstream_read, upstream_write) = tokio::io::split(upstream);
            let both = async {
                tokio::join!(
                    pump(client_read, upstream_write, shared.faults.subscribe()),
                    pump(upstream_read, client_write, shared.faults.subscribe()),
                )
            };
            tokio::select! {
                () = stop.cancelled() => {}
                _ = both => {}
                _ = faults.wait_for(|f| f.cuts != cuts) => {}
            }
            shared.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Waits while the proxy is paused.
async fn unpaused(faults: &mut watch::Receiver<Faults>) -> Faults {
    match faults.wait_for(|f| f.mode != Mode::Pause).await {
        Ok(f) => *f,
        // The proxy is gone: forward as is until the connection ends.
        Err(_) => Faults { mode: Mode::Forward, delay: Duration::ZERO, bytes_per_second: None, cuts: 0 },
    }
}

/// One direction: a reader queues chunks stamped with their arrival, a writer delivers each at
/// arrival + delay (so delay adds latency without capping throughput), throttled if asked.
async fn pump(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin, faults: watch::Receiver<Faults>) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(64);
    let mut read_faults = faults.clone();
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            // Paused: stop reading, so the sender's buffers fill as with a stopped process.
            unpaused(&mut read_faults).await;
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // The mode when the bytes arrived, not when the read began.
            if read_faults.borrow().mode == Mode::Blackhole {
                continue;
            }
            if tx.send((Instant::now(), buf[..n].to_vec())).await.is_err() {
                return;
            }
        }
    };
    let mut write_faults = faults;
    let writer = async move {
        while let Some((arrived, chunk)) = rx.recv().await {
            let f = unpaused(&mut write_faults).await;
            if f.mode == Mode::Blackhole {
                continue;
            }
            tokio::time::sleep_until(arrived + f.delay).await;
            // A pause that began while the chunk waited out its delay holds it too.
            unpaused(&mut write_faults).await;
            // Paced before writing: a chunk leaves when the rate allows it.
            if let Some(rate) = f.bytes_per_second {
                tokio::time::sleep(Duration::from_secs_f64(chunk.len() as f64 / rate as f64)).await;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        address
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
        s.write_all(msg).await.unwrap();
        let mut buf = vec![0u8; msg.len()];
        s.read_exact(&mut buf).await.unwrap();
        buf
    }

    #[tokio::test]
    async fn forwards_pauses_blackholes_delays_and_resumes() {
        let proxy = FaultProxy::start(echo_server().await).await;
        let mut s = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut s, b"hello").await, b"hello");
        assert_eq!(proxy.accepted(), 1);

        // Paused: the socket stays open but nothing comes back, until resumed.
        proxy.pause();
        s.write_all(b"held").await.unwrap();
        let mut buf = [0u8; 4];
        let r = tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut buf)).await;
        assert!(r.is_err(), "a paused proxy forwarded: {r:?}");
        proxy.resume();
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf)).await.unwrap().unwrap();
        assert_eq!(&buf, b"held");

        // Blackholed: bytes vanish, the connection stays up (no RST).
        proxy.blackhole();
        s.write_all(b"lost").await.unwrap();
        let r = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await;
        assert!(r.is_err(), "a blackholed proxy answered: {r:?}");
        proxy.resume();
        assert_eq!(round_trip(&mut s, b"back").await, b"back");

        // Delay: each direction adds it.
        proxy.delay(Duration::from_millis(200));
        let started = Instant::now();
        assert_eq!(round_trip(&mut s, b"slow").await, b"slow");
        assert!(started.elapsed() >= Duration::from_millis(400), "{:?}", started.elapsed());
        proxy.resume();
    }

    #[tokio::test]
    async fn forwards_to_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("echo.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let proxy = FaultProxy::start_unix(path).await;
        let mut s = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut s, b"redis").await, b"redis");
    }

    #[tokio::test]
    async fn throttles_cuts_and_refuses() {
        let proxy = FaultProxy::start(echo_server().await).await;
        let mut s = TcpStream::connect(proxy.address()).await.unwrap();
        proxy.throttle(64 * 1024);
        let started = Instant::now();
        let payload = vec![7u8; 64 * 1024];
        assert_eq!(round_trip(&mut s, &payload).await.len(), payload.len());
        // 64 KiB at 64 KiB/s per direction: about a second at least.
        assert!(started.elapsed() >= Duration::from_millis(800), "{:?}", started.elapsed());
        proxy.resume();

        proxy.cut();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "cut connection still open: {n:?}");
        crate::eventually!(proxy.open_connections() == 0);

        // New connections after a cut are forwarded.
        let mut s = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut s, b"again").await, b"again");

        proxy.refuse();
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "refuse did not cut: {n:?}");
        let mut s = TcpStream::connect(proxy.address()).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "refused connection answered: {n:?}");
        assert_eq!(proxy.accepted(), 3);
    }
}
