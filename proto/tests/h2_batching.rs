//! The patched h2 (vendor/h2/KAS-PATCH.md, "batched writes, reads that grow") on the shape of
//! the tunnel traffic: many streams of one connection each sending a few hundred bytes at the
//! same moment (proxied requests one way, responses the other). Their frames must share
//! system calls: h2 as released wrote each DATA frame over 256 bytes with its own write, and
//! with kas's small initial buffers also each one under it, and read at most ~1 KiB a time.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

const STREAMS: usize = 32;
/// A proxied request's or response's size on the tunnel (kas-bench's pod object: ~500 bytes).
const BODY: usize = 400;

/// Counts the writes and reads that reach the pipe; writes are vectored, as on a TCP socket.
struct Counted {
    io: DuplexStream,
    writes: Arc<AtomicUsize>,
    reads: Arc<AtomicUsize>,
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.reads.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // One system call for all the slices, as writev: the pipe takes them as one copy.
        let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        let polled = Pin::new(&mut self.io).poll_write(cx, &all);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.writes.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

fn counted(io: DuplexStream) -> (Counted, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (writes, reads) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    (Counted { io, writes: writes.clone(), reads: reads.clone() }, writes, reads)
}

/// On one thread, as kas's and agentk's data planes: every stream's frames are queued before
/// the connection task runs.
#[tokio::test(flavor = "current_thread")]
async fn small_frames_of_many_streams_share_writes_and_reads() {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let (client_io, client_writes, client_reads) = counted(client_io);
    let (server_io, server_writes, server_reads) = counted(server_io);
    let writes_seen = server_writes.clone();
    let server = tokio::spawn(async move {
        let mut connection = h2::server::Builder::new().handshake::<_, Bytes>(server_io).await.unwrap();
        let mut requests = Vec::new();
        while requests.len() < STREAMS {
            let (request, respond) = connection.accept().await.unwrap().unwrap();
            requests.push((request, respond));
        }
        // The connection makes progress only while polled: from here on, by its own task.
        let answered = tokio::spawn(async move { while connection.accept().await.is_some() {} });
        let mut received = 0;
        for (request, _) in &mut requests {
            let body = request.body_mut();
            while let Some(data) = body.data().await {
                let data = data.unwrap();
                body.flow_control().release_capacity(data.len()).unwrap();
                received += data.len();
            }
        }
        assert_eq!(received, STREAMS * BODY);
        let handshake_writes = writes_seen.load(Ordering::Relaxed);
        // Every response at once, as when a batch of answers arrives.
        for (_, mut respond) in requests {
            let mut send = respond.send_response(http::Response::new(()), false).unwrap();
            send.send_data(Bytes::from(vec![b'r'; BODY]), true).unwrap();
        }
        (handshake_writes, answered)
    });

    let (client, connection) = h2::client::handshake(client_io).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let settled_writes = client_writes.load(Ordering::Relaxed);
    let mut responses = Vec::new();
    for i in 0..STREAMS {
        let request = http::Request::post(format!("http://kas/{i}")).body(()).unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        send.send_data(Bytes::from(vec![b'q'; BODY]), true).unwrap();
        responses.push(response);
    }
    let reads_before = client_reads.load(Ordering::Relaxed);
    let mut received = 0;
    for response in responses {
        let mut body = response.await.unwrap().into_body();
        while let Some(data) = body.data().await {
            let data = data.unwrap();
            body.flow_control().release_capacity(data.len()).unwrap();
            received += data.len();
        }
    }
    assert_eq!(received, STREAMS * BODY);
    let request_writes = client_writes.load(Ordering::Relaxed) - settled_writes;
    let response_reads = client_reads.load(Ordering::Relaxed) - reads_before;
    let (handshake_writes, answered) = server.await.unwrap();
    let response_writes = server_writes.load(Ordering::Relaxed) - handshake_writes;
    let request_reads = server_reads.load(Ordering::Relaxed);
    eprintln!(
        "{STREAMS} streams of {BODY} bytes: requests {request_writes} writes, {request_reads} reads; \
         responses {response_writes} writes, {response_reads} reads"
    );
    // ~15 KiB each way: a write per 12 KiB or so (window updates may add one), and reads
    // growing from 1 KiB. Unpatched: one write per stream, one read per ~1 KiB.
    assert!(request_writes <= 4, "{request_writes} writes for {STREAMS} requests");
    assert!(response_writes <= 4, "{response_writes} writes for {STREAMS} responses");
    assert!(response_reads <= 8, "{response_reads} reads for {STREAMS} responses");
    assert!(request_reads <= 12, "{request_reads} reads for the handshake and {STREAMS} requests");
    drop(client);
    connection.abort();
    answered.abort();
}
