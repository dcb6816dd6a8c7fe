//! A client that asks for a large proxied response and then never reads it: the hostile or
//! stuck caller of issue 12. It speaks plain HTTP/1.1 over a socket with a tiny receive buffer,
//! so the kernel holds almost nothing for it and kas (not the kernel) is where unread bytes
//! would pile up.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// The receive buffer asked for (Linux doubles it and enforces a minimum of about 2 KiB).
const RECEIVE_BUFFER: u32 = 4 * 1024;

/// An open request whose response body is never read. Dropping it closes the connection.
pub struct SlowClient {
    _stream: TcpStream,
    /// The response status kas answered.
    pub status: u16,
}

impl SlowClient {
    /// Sends `GET path` with `Authorization: Bearer <jwt>` to kas's plaintext rest listener at
    /// `rest`, reads the response head (so the exchange is known to be in flight, data flowing)
    /// and then stops reading for good.
    pub async fn open(rest: SocketAddr, path: &str, jwt: &str) -> std::io::Result<Self> {
        let socket = if rest.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        // Before connecting, so the advertised window is small from the first segment.
        socket.set_recv_buffer_size(RECEIVE_BUFFER)?;
        let mut stream = socket.connect(rest).await?;
        let request = format!("GET {path} HTTP/1.1\r\nhost: {rest}\r\nauthorization: Bearer {jwt}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        // Read byte by byte up to the end of the head: nothing of the body is consumed beyond it.
        let mut head = Vec::with_capacity(512);
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await? == 0 {
                return Err(std::io::Error::other(format!(
                    "kas closed the connection before the response head ended: {}",
                    String::from_utf8_lossy(&head)
                )));
            }
            head.push(byte[0]);
            if head.len() > 64 * 1024 {
                return Err(std::io::Error::other("response head too large"));
            }
        }
        let text = String::from_utf8_lossy(&head);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {text}")))?;
        Ok(Self { _stream: stream, status })
    }

    /// Opens `n` slow clients, `parallel` at a time, each given `timeout` to see its response
    /// head. Returns those that did and the errors of the others.
    pub async fn open_many(
        rest: SocketAddr,
        path: &str,
        jwt: &str,
        n: usize,
        parallel: usize,
        timeout: std::time::Duration,
    ) -> (Vec<Self>, Vec<String>) {
        use futures::StreamExt;
        let results: Vec<_> = futures::stream::iter(0..n)
            .map(|_| async move {
                match tokio::time::timeout(timeout, Self::open(rest, path, jwt)).await {
                    Ok(Ok(c)) => Ok(c),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("no response head within {timeout:?}")),
                }
            })
            .buffer_unordered(parallel)
            .collect()
            .await;
        let mut open = Vec::new();
        let mut failed = Vec::new();
        for r in results {
            match r {
                Ok(c) => open.push(c),
                Err(e) => failed.push(e),
            }
        }
        (open, failed)
    }
}

/// This process's resident set size in MiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_mib(pid: u32) -> f64 {
    proc_status_kib(pid, "VmRSS:") / 1024.0
}

fn proc_status_kib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap())
        .unwrap()
}
