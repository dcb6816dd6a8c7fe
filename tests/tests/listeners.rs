//! Every listener bounds its connections: half-open connections are closed after
//! `connections.handshake_timeout`, a flood of idle connections on one listener leaves the
//! others and readiness working, and on SIGTERM the external listeners refuse new connections
//! while the observability listener answers until kas exits. kas runs as a real process (its
//! own file descriptor limit).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use kas_e2e::eventually;
use kas_e2e::process::{self, ConfiguredKas};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The HTTP/2 client connection preface.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

async fn start_kas(dir: &Path, configure: impl FnOnce(&mut kas::Config)) -> ConfiguredKas {
    let setup = kas::standalone::ensure_dev_setup(&dir.join("dev")).unwrap();
    let mut config = setup.config.with_ephemeral_ports();
    configure(&mut config);
    process::start_kas_with_config(&config, dir).await
}

/// Reads until the server closes the connection (EOF or reset); how long that took, or None if
/// it was still open after `limit`.
async fn closed_within(mut s: TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(start + limit, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {} // e.g. the server's SETTINGS frame
        }
    }
}

async fn connect_and_send(address: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(address).await.unwrap();
    s.write_all(bytes).await.unwrap();
    s
}

/// Every connection was closed by kas, and not before `timeout`; names every one that was not.
fn assert_closed_after(timeout: Duration, results: Vec<(&str, Option<Duration>)>) {
    let wrong: Vec<String> = results
        .iter()
        .filter_map(|(name, closed)| match closed {
            None => Some(format!("{name}: still open 10 s after connecting")),
            Some(took) if *took < timeout - Duration::from_millis(100) => {
                Some(format!("{name}: closed after {took:?}, before the timeout"))
            }
            Some(_) => None,
        })
        .collect();
    assert!(wrong.is_empty(), "handshake timeout {timeout:?}:\n{}", wrong.join("\n"));
}

#[tokio::test]
async fn half_open_connections_are_closed_after_the_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let timeout = Duration::from_secs(1);
    let kas = start_kas(dir.path(), |c| c.connections.handshake_timeout = timeout).await;
    let a = kas.addresses;
    let settings_header_only: &[u8] = &[0, 0, 6, 4, 0, 0, 0, 0, 0]; // 6 payload bytes never come
    let cases: Vec<(&str, SocketAddr, Vec<u8>)> = vec![
        ("rest, nothing sent", a.rest, vec![]),
        ("rest, partial HTTP/1 head", a.rest, b"GET /openapi.json HTTP/1.1\r\nHost: kas\r\n".to_vec()),
        ("rest, partial HTTP/2 preface", a.rest, H2_PREFACE[..16].to_vec()),
        ("observability, nothing sent", a.observability, vec![]),
        ("observability, partial HTTP/1 head", a.observability, b"GET /livez HTTP/1.1\r\n".to_vec()),
        ("api, nothing sent", a.api, vec![]),
        ("api, partial HTTP/2 preface", a.api, H2_PREFACE[..10].to_vec()),
        ("agent, preface and part of SETTINGS", a.agent, [H2_PREFACE, settings_header_only].concat()),
        ("internal, partial HTTP/2 preface", a.internal, H2_PREFACE[..20].to_vec()),
    ];
    // A connection that completed its handshake is not touched by the timeout.
    let complete = connect_and_send(a.api, &[H2_PREFACE, &[0, 0, 0, 4, 0, 0, 0, 0, 0]].concat()).await;
    let checks = cases.into_iter().map(|(name, address, bytes)| async move {
        let s = connect_and_send(address, &bytes).await;
        (name, closed_within(s, Duration::from_secs(10)).await)
    });
    assert_closed_after(timeout, futures::future::join_all(checks).await);
    assert_eq!(
        closed_within(complete, timeout * 2).await,
        None,
        "a connection that completed the HTTP/2 handshake was closed"
    );
}

#[tokio::test]
async fn tls_handshakes_that_never_finish_are_closed_after_the_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let tls = kas_e2e::certificates::localhost_tls(dir.path(), "tls");
    let timeout = Duration::from_secs(1);
    let kas = start_kas(dir.path(), |c| {
        c.connections.handshake_timeout = timeout;
        c.listeners.rest.tls = Some(tls.clone());
        c.listeners.agent.tls = Some(tls.clone());
    })
    .await;
    // The first bytes of a TLS record carrying a ClientHello; the rest never comes.
    let partial_client_hello: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01];
    let cases = [
        ("rest (TLS), nothing sent", kas.addresses.rest, &[][..]),
        ("rest (TLS), partial ClientHello", kas.addresses.rest, partial_client_hello),
        ("agent (TLS), nothing sent", kas.addresses.agent, &[][..]),
        ("agent (TLS), partial ClientHello", kas.addresses.agent, partial_client_hello),
    ];
    let checks = cases.into_iter().map(|(name, address, bytes)| async move {
        let s = connect_and_send(address, bytes).await;
        (name, closed_within(s, Duration::from_secs(10)).await)
    });
    assert_closed_after(timeout, futures::future::join_all(checks).await);
}

/// The SETTINGS the server sends first on an HTTP/2 (prior knowledge) connection, as (id, value).
async fn server_settings(address: SocketAddr) -> Vec<(u16, u32)> {
    let mut s = connect_and_send(address, &[H2_PREFACE, &[0, 0, 0, 4, 0, 0, 0, 0, 0]].concat()).await;
    let mut header = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut header)).await.unwrap().unwrap();
    assert_eq!(header[3], 4, "the first frame is not SETTINGS: {header:?}");
    let length = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let mut payload = vec![0u8; length];
    s.read_exact(&mut payload).await.unwrap();
    payload
        .chunks_exact(6)
        .map(|c| (u16::from_be_bytes([c[0], c[1]]), u32::from_be_bytes([c[2], c[3], c[4], c[5]])))
        .collect()
}

#[tokio::test]
async fn http2_listeners_advertise_max_concurrent_streams() {
    const MAX_CONCURRENT_STREAMS: u16 = 3;
    let dir = tempfile::tempdir().unwrap();
    let kas = start_kas(dir.path(), |_| {}).await;
    let a = kas.addresses;
    let defaults = kas::Config::default();
    let streams = defaults.connections.max_concurrent_streams;
    let internal = u32::try_from(defaults.routing.max_concurrent_requests).unwrap().max(streams);
    for (name, address, expected) in [
        ("agent", a.agent, streams),
        ("api", a.api, streams),
        ("internal", a.internal, internal),
        ("rest", a.rest, streams),
    ] {
        let settings = server_settings(address).await;
        let advertised = settings.iter().find(|(id, _)| *id == MAX_CONCURRENT_STREAMS).map(|(_, v)| *v);
        assert_eq!(advertised, Some(expected), "{name} listener's SETTINGS: {settings:?}");
    }
    // agentk opens up to --max-tunnels (500 by default) streams on its one connection.
    assert!(streams > 500);
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// 20,000 connections that send nothing, held by two Python processes (10,000 each: the file
/// descriptor limit here is 20,000 per process and cannot be raised).
async fn flood(target: SocketAddr) -> Vec<tokio::process::Child> {
    idle_connections(target, 10_000, &["127.0.0.2", "127.0.0.3"]).await
}

/// `per_source` idle connections to `target` from each source address, one Python child each.
async fn idle_connections(target: SocketAddr, per_source: u32, sources: &[&str]) -> Vec<tokio::process::Child> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/idle_connections.py");
    let mut children = Vec::new();
    for source in sources {
        let child = tokio::process::Command::new("python3")
            .arg(&script)
            .arg(target.ip().to_string())
            .arg(target.port().to_string())
            .arg(per_source.to_string())
            .arg(source)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 is required for this test");
        children.push(child);
    }
    for child in &mut children {
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).await.unwrap();
        assert_eq!(line.trim(), "started", "idle_connections.py did not start");
    }
    children
}

/// kas's open file limit in the flood test: started at 1024 (a common default soft limit) with a
/// hard limit of 4096, which kas raises it to. The flood (20,000) is five times that. Scaled
/// down from this machine's 20,000 so that the test takes seconds, not minutes: on a loaded
/// 2-core machine a debug kas accepts a few hundred connections per second.
const FLOOD_SOFT_FDS: u64 = 1024;
const FLOOD_HARD_FDS: u64 = 4096;

#[tokio::test]
async fn twenty_thousand_idle_connections_leave_kas_ready_and_serving() {
    let dir = tempfile::tempdir().unwrap();
    let setup = kas::standalone::ensure_dev_setup(&dir.path().join("dev")).unwrap();
    // Default settings otherwise: the protection must not depend on tuning.
    let config = setup.config.with_ephemeral_ports();
    let mut kas =
        process::start_kas_with_config_and_fd_limit(&config, dir.path(), FLOOD_SOFT_FDS, FLOOD_HARD_FDS).await;
    let a = kas.addresses;
    let pid = kas.process.pid();
    let limit = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let open_files = limit.lines().find(|l| l.starts_with("Max open files")).unwrap().to_owned();
    assert_eq!(open_files.split_whitespace().nth(3), Some("4096"), "kas raised its soft limit: {open_files}");

    let _flood = flood(a.agent).await;
    // kas took hundreds of them and stopped taking more (before the fix: all it could, until it
    // ran out of descriptors).
    let mut last = (0, Instant::now());
    eventually!(
        {
            let now = open_fds(pid);
            if now != last.0 {
                last = (now, Instant::now());
            }
            now >= 700 && last.1.elapsed() >= Duration::from_secs(1)
        },
        "kas's descriptors settle: {} now",
        last.0
    );
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let started = Instant::now();
    let readyz = http.get(format!("http://{}/readyz", a.observability)).send().await;
    let status = readyz.as_ref().map(|r| r.status().as_u16());
    assert_eq!(status.ok(), Some(200), "/readyz during the flood: {readyz:?} (kas holds {} fds)", open_fds(pid));
    let openapi = http.get(format!("http://{}/openapi.json", a.rest)).send().await;
    assert_eq!(openapi.as_ref().map(|r| r.status().as_u16()).ok(), Some(200), "rest during the flood: {openapi:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    // Bounded by the cap ((4096 - 1024) / 4 = 768 on the agent listener), room left for the rest.
    assert!(open_fds(pid) < 1000, "kas holds {} descriptors", open_fds(pid));
    kas.process.wait_for_message("listener at its connection limit: new connections wait until one closes").await;
}

#[tokio::test]
async fn when_out_of_descriptors_kas_backs_off_logs_once_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let setup = kas::standalone::ensure_dev_setup(&dir.path().join("dev")).unwrap();
    let mut config = setup.config.with_ephemeral_ports();
    // A cap above the descriptor limit: accept() itself fails (EMFILE).
    config.connections.max_per_listener = Some(10_000);
    let mut kas = process::start_kas_with_config_and_fd_limit(&config, dir.path(), 64, 64).await;
    let a = kas.addresses;
    let flood = idle_connections(a.rest, 200, &["127.0.0.2"]).await;
    let accept_warning =
        |v: &serde_json::Value| v["level"] == "WARN" && process::log_message(v).is_some_and(|m| m.contains("accept"));
    kas.process.wait_for_log("a warning that accepting failed", accept_warning).await;
    // A window in which a loop retrying at once (or logging every retry) would have logged again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let warnings = kas
        .process
        .stderr()
        .lines()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| accept_warning(&v)))
        .count();
    assert_eq!(warnings, 1, "accept failure warnings in 2 s (one per change of state expected)");
    // The flood leaves: kas accepts again, and says so once.
    for mut child in flood {
        child.kill().await.unwrap();
    }
    kas.process.wait_for_message("listener accepting connections again").await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
    eventually!(status(&http, format!("http://{}/readyz", a.observability)).await == Some(200), "/readyz answers 200");
}

/// `GET /api/v1/agents/1/pods` for an agent that is not connected: it waits (in flight) for the
/// agent until `routing.max_wait`.
fn waiting_request(
    kas: &ConfiguredKas,
    dir: &Path,
) -> tokio::task::JoinHandle<Result<reqwest::Response, reqwest::Error>> {
    let secret = kas::auth::Secret::from_file(&dir.join("dev/gitlab-secret")).unwrap();
    let jwt = kas::auth::mint_jwt(&secret, "gitlab", "gitlab-kas", Duration::from_secs(300)).unwrap();
    let url = format!("http://{}/api/v1/agents/1/pods", kas.addresses.rest);
    tokio::spawn(async move { reqwest::Client::new().get(url).bearer_auth(jwt).send().await })
}

async fn status(http: &reqwest::Client, url: String) -> Option<u16> {
    http.get(url).send().await.ok().map(|r| r.status().as_u16())
}

/// Whether a new connection to `address` is refused at once, or answered with 503 (HTTP): not
/// left hanging in an accept queue nobody serves.
async fn refused_promptly(address: SocketAddr, http_path: Option<&str>) -> Result<(), String> {
    let attempt = async {
        let mut s = match TcpStream::connect(address).await {
            Err(_) => return Ok(()),
            Ok(s) => s,
        };
        let Some(path) = http_path else {
            return match closed_within(s, Duration::from_secs(2)).await {
                Some(_) => Ok(()),
                None => Err("connected and left open".to_owned()),
            };
        };
        let _ = s.write_all(format!("GET {path} HTTP/1.1\r\nHost: kas\r\nConnection: close\r\n\r\n").as_bytes()).await;
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer);
        if answer.is_empty() || answer.starts_with("HTTP/1.1 503") { Ok(()) } else { Err(format!("answered {answer}")) }
    };
    tokio::time::timeout(Duration::from_secs(3), attempt).await.map_err(|_| "no answer within 3 s".to_owned())?
}

#[tokio::test]
async fn while_draining_new_connections_are_refused_and_probes_answer() {
    let dir = tempfile::tempdir().unwrap();
    let kas = start_kas(dir.path(), |c| {
        c.shutdown.grace_period = Duration::from_secs(8);
        c.routing.max_wait = Duration::from_secs(30);
    })
    .await;
    let a = kas.addresses;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
    let in_flight = waiting_request(&kas, dir.path());
    let metrics = format!("http://{}/metrics", a.observability);
    eventually!(
        http.get(&metrics).send().await.unwrap().text().await.unwrap().contains("kas_waiting_requests 1"),
        "the request waits for its agent"
    );
    assert_eq!(status(&http, format!("http://{}/readyz", a.observability)).await, Some(200));

    let pid = kas.process.pid();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
    let draining = Instant::now();
    eventually!(
        status(&http, format!("http://{}/readyz", a.observability)).await == Some(503),
        "/readyz answers 503 while kas drains"
    );
    assert_eq!(status(&http, format!("http://{}/livez", a.observability)).await, Some(200), "/livez while draining");
    for (name, address, path) in [
        ("rest", a.rest, Some("/openapi.json")),
        ("api", a.api, None),
        ("internal", a.internal, None),
        ("agent", a.agent, None),
    ] {
        refused_promptly(address, path).await.unwrap_or_else(|e| panic!("{name} listener while draining: {e}"));
    }
    assert!(!in_flight.is_finished(), "the in-flight request ended before the checks: not draining any more");
    assert!(draining.elapsed() < Duration::from_secs(8), "checks took longer than the grace period");
    let status = kas.process.terminate().await;
    assert!(status.success(), "kas exit: {status}");
}
