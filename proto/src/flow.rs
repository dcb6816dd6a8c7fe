//! Flow control of the tunnel path (issue 12): what every hop may hold per stream, in bytes.
//!
//! Two layers:
//! - **Response credit** ([`ResponseWindow`]): the kas whose caller reads a proxied response
//!   tells agentk how many response bytes it may send (`RequestInfo.response_window`, then
//!   `WindowUpdate` frames) as the caller takes them, end to end through a relaying kas. The
//!   window starts at [`INITIAL_RESPONSE_WINDOW`] and grows with what the reader has taken (an
//!   eighth of it) up to [`MAX_RESPONSE_WINDOW`]: a response that is being read gets a large
//!   window, one whose reader stopped keeps a few KiB in flight, however many share a
//!   connection. HTTP/2 alone cannot do this (every stream of a connection starts from the same
//!   window and a receiver grants only what was consumed).
//! - **HTTP/2 windows**: all tunnels of an agentk connection share one HTTP/2 connection (and
//!   all forwarded tunnels between two kas share one), so a stream whose reader stopped must
//!   never hold the connection's window: the connection window is sized for every stream holding
//!   its full grown stream window at once ([`connection_window`] = streams allowed ×
//!   [`GROWN_STREAM_WINDOW`], capped at the HTTP/2 maximum). A stream starts at
//!   [`STREAM_WINDOW`] and its window grows while its reader keeps up ([`grow_stream_windows`]). The
//!   stream window bounds what response credit does not: a peer that ignores credit, request
//!   bodies, upgraded connections.
//!
//! Per stream a receiving hop also holds tonic's receive buffer (it reserves a whole message
//! ahead and keeps its largest size for the stream's life): messages are split to the credit,
//! so a stalled stream's buffer stays small. Issue 12's bound,
//! 64 MiB per kas for 1,000 unread streams through two kas, is tested in
//! `tests/backpressure.rs`; ARCHITECTURE.md ("Back-pressure") has the figures.

/// Initial HTTP/2 stream window on every tunnel hop (agentk <-> kas, kas <-> kas): the unread
/// bytes a stream nobody reads may leave in a receiver's buffer. One stream's throughput is at
/// most window / round trip: 128 KiB kept a 200 MiB response at hyper's-default speed on
/// loopback, where 64 KiB lost about half of it; a stream whose reader keeps up grows its
/// window up to [`GROWN_STREAM_WINDOW`].
pub const STREAM_WINDOW: u32 = 128 * 1024;

/// The window a stream grows to while its reader keeps up ([`grow_stream_windows`]): the
/// response credit's maximum, so a stream read at full speed and then stalled holds what credit
/// already allows in flight.
pub const GROWN_STREAM_WINDOW: u32 = 1024 * 1024;

/// Lets the HTTP/2 receive window of every stream in this process grow, up to
/// [`GROWN_STREAM_WINDOW`], each time its reader has taken everything that arrived (then the
/// window, not the reader, limits the stream), by what was read: h2 as patched in `vendor/h2`
/// (`KAS-PATCH.md`), a process-wide setting. A stream nobody reads, or read slower than it is
/// sent, keeps [`STREAM_WINDOW`]. kas and agentk call it when they build their HTTP/2
/// connections (idempotent).
pub fn grow_stream_windows() {
    h2::stream_window_growth::set_max(GROWN_STREAM_WINDOW);
}

/// SETTINGS_MAX_FRAME_SIZE every tunnel hop announces (HTTP/2's default is 16 KiB): a 64 KiB
/// body message then crosses as one DATA frame instead of five (four full frames and a tail),
/// with one frame header and one wakeup of the receiving connection task each.
pub const MAX_FRAME_SIZE: u32 = STREAM_WINDOW;

/// The largest HTTP/2 window (2^31 - 1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// HTTP/2 connection window for a listener that allows `max_streams` streams per connection:
/// every stream may hold its whole (grown) window and the connection still has room, so one
/// stuck stream (or all but one) never stalls the others. It is a permission, not an allocation:
/// what is buffered is bounded by the streams' windows.
pub const fn connection_window(max_streams: u32) -> u32 {
    let window = GROWN_STREAM_WINDOW as u64 * max_streams as u64;
    if window > MAX_WINDOW as u64 { MAX_WINDOW } else { window as u32 }
}

/// The connection window of the dialing side (agentk towards kas, a routing kas towards a peer):
/// the listener's MAX_CONCURRENT_STREAMS bounds the streams, so the window never needs to.
pub const CONNECTION_WINDOW: u32 = MAX_WINDOW;

/// Largest body chunk put into one tunnel message: larger chunks are split, so a message-counted
/// buffer is also byte-bounded. (16 KiB cost a third of the throughput in per-message work;
/// 64 KiB gave a 200 MiB response 15-17 % more MB/s than 32 KiB, through one kas and two.)
pub const MAX_CHUNK: usize = 64 * 1024;

/// Tunnel messages buffered in a channel between two tasks of one hop (each at most
/// [`MAX_CHUNK`] of body, for agentk and kas as shipped). Four: a small exchange's frames
/// (RequestInfo, head, CloseSend; Header, head, body, Trailer) are queued together and go out
/// in one HTTP/2 write.
pub const HOP_BUFFER: usize = 4;

/// tonic's yield threshold: messages produced back to back (a response's header, head, small
/// body and trailer) go out in one HTTP/2 write of up to one chunk. Under response credit a
/// stalled stream produces little, so its receiver's buffer stays small either way (one message
/// per write measured the same memory with 1,000 stalled streams, and 5-10% fewer requests/s).
pub const YIELD_THRESHOLD: usize = MAX_CHUNK;

/// Initial size of tonic's per-stream encode and decode buffers (tonic's default is 8 KiB). Every
/// stream allocates one of each up front, idle tunnels included; the buffers grow to the message
/// being coded, so a small start costs nothing for large messages and saves up to 15.5 KiB per
/// stream (256 rather than 1 KiB: 2.3 KiB less per idle agent, issue 18).
pub const CODEC_BUFFER: usize = 256;

/// The codec of every generated service (`proto/build.rs`): prost with [`CODEC_BUFFER`]-sized
/// initial buffers, writes of up to one chunk ([`YIELD_THRESHOLD`]), and messages decoded into
/// their own memory ([`OwnedDecoder`]).
#[derive(Debug, Clone, Copy)]
pub struct Codec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

/// tonic's buffer settings of every tunnel call: [`CODEC_BUFFER`] and [`YIELD_THRESHOLD`].
/// agentk's `AgentTunnel.Connect` request body is the exception: agentk frames it itself
/// (`agentk::tunnel_codec`), with items ready together in one write as here, and body data not
/// copied.
pub fn buffer_settings() -> tonic::codec::BufferSettings {
    tonic::codec::BufferSettings::new(CODEC_BUFFER, YIELD_THRESHOLD)
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = OwnedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        OwnedDecoder(std::marker::PhantomData)
    }
}

/// Messages at least this large are sliced out of tonic's receive buffer instead of copied
/// ([`OwnedDecoder`]).
pub const SLICE_FROM: usize = MAX_CHUNK / 2;

/// Decodes each small message from its own copy of the bytes. prost's decoder slices `bytes`
/// fields out of tonic's receive buffer, so one live message keeps the whole buffer allocated
/// and the next message makes tonic allocate another (heap profiles: ~50 KiB per stream in both
/// kas with 1,000 stalled streams). With a message-sized copy tonic's buffer is free again as
/// soon as a message is decoded and is reused in place, and a message holds only its own bytes.
///
/// A message of [`SLICE_FROM`] bytes or more is sliced instead: tonic reserves room for a whole
/// message before it reads one, so such a message is most of its allocation and keeps little
/// else alive, while copying it was 4 % of kas's samples on a large response (issue 14: a
/// 200 MiB body 3-7 % faster). Small messages, what stalled streams get under response credit,
/// are still copied.
#[derive(Debug)]
pub struct OwnedDecoder<U>(std::marker::PhantomData<U>);

impl<U: prost::Message + Default> tonic::codec::Decoder for OwnedDecoder<U> {
    type Item = U;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<U>, tonic::Status> {
        use bytes::Buf as _;
        let len = src.remaining();
        let bytes = if len >= SLICE_FROM {
            src.copy_to_bytes(len)
        } else {
            let mut owned = bytes::BytesMut::with_capacity(len);
            while src.has_remaining() {
                let chunk = src.chunk();
                owned.extend_from_slice(chunk);
                let n = chunk.len();
                src.advance(n);
            }
            owned.freeze()
        };
        U::decode(bytes).map(Some).map_err(|e| tonic::Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        buffer_settings()
    }
}

/// Response credit a receiving kas grants a tunnel's response at first (`RequestInfo`), in bytes
/// of `Message` data. What a reader that stopped leaves in flight across every hop.
pub const INITIAL_RESPONSE_WINDOW: u32 = 4 * 1024;

/// The most response credit outstanding for one response: one stream's throughput is at most
/// this per round trip between agentk and the kas that consumes the response.
pub const MAX_RESPONSE_WINDOW: u64 = 1024 * 1024;

/// The window grows with what the reader has taken so far (an eighth of it): a reader that took
/// little before it stopped leaves little in flight, one that keeps reading gets the full window.
const RESPONSE_WINDOW_GROWTH_DIVISOR: u64 = 8;

/// Response credit, the receiving side (the kas whose caller reads the response): how much more
/// agentk may send as the caller takes what came. HTTP/2 cannot give one stream a larger window
/// than the others; this can, so a response being read gets a large window and one whose reader
/// stopped keeps a small one, however many share the connection.
#[derive(Debug, Clone)]
pub struct ResponseWindow {
    consumed: u64,
    granted: u64,
    window: u64,
}

impl Default for ResponseWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl ResponseWindow {
    pub fn new() -> Self {
        let window = u64::from(INITIAL_RESPONSE_WINDOW);
        Self { consumed: 0, granted: window, window }
    }

    /// The credit to announce in `RequestInfo.response_window`.
    pub fn initial(&self) -> u32 {
        INITIAL_RESPONSE_WINDOW
    }

    /// The window now (bytes in flight allowed).
    pub fn window(&self) -> u64 {
        self.window
    }

    /// `bytes` of response data were taken by the reader. Returns the credit to grant now, if any:
    /// grants are batched to at least half a window, so credit never arrives in slivers.
    pub fn consumed(&mut self, bytes: usize) -> Option<u32> {
        self.consumed += bytes as u64;
        self.window = (self.consumed / RESPONSE_WINDOW_GROWTH_DIVISOR)
            .clamp(u64::from(INITIAL_RESPONSE_WINDOW), MAX_RESPONSE_WINDOW);
        let target = self.consumed + self.window;
        let update = target.saturating_sub(self.granted);
        if update == 0 || update < self.window / 2 {
            return None;
        }
        self.granted = target;
        Some(u32::try_from(update).unwrap_or(u32::MAX))
    }
}

/// Splits a body chunk into pieces of at most [`MAX_CHUNK`] bytes (zero-copy slices).
pub fn split_chunk(mut chunk: bytes::Bytes) -> impl Iterator<Item = bytes::Bytes> {
    std::iter::from_fn(move || {
        if chunk.is_empty() {
            return None;
        }
        let take = chunk.len().min(MAX_CHUNK);
        Some(chunk.split_to(take))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_windows_leave_room_for_every_stream() {
        assert_eq!(connection_window(1024), 1024 * GROWN_STREAM_WINDOW);
        assert_eq!(connection_window(u32::MAX), MAX_WINDOW);
        assert!(connection_window(10_000) >= 10_000u32.saturating_mul(GROWN_STREAM_WINDOW).min(MAX_WINDOW));
    }

    /// Through the patched h2 (HTTP/2 over an in-memory pipe, windows as on every tunnel hop),
    /// three streams on one connection: the window of one whose reader takes everything at once
    /// grows to [`GROWN_STREAM_WINDOW`]; one read slower than it is sent (data always waiting)
    /// and one nobody reads keep [`STREAM_WINDOW`].
    #[tokio::test]
    async fn stream_windows_grow_only_while_the_reader_keeps_up() {
        use bytes::Bytes;
        use futures::future::poll_fn;
        use tokio::sync::{mpsc, oneshot};
        const PIECE: usize = 16 * 1024;
        const FAST_BODY: usize = 8 << 20;
        const SLOW_READS: usize = 64;
        // A receiver's window of a stream: capacity not yet granted plus data not yet read.
        fn window(body: &mut h2::RecvStream) -> usize {
            let flow = body.flow_control();
            usize::try_from(flow.available_capacity()).unwrap() + flow.used_capacity()
        }
        grow_stream_windows();
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        // The slow stream's reader takes one piece per message and answers with its window.
        let (read_one, read_one_rx) = mpsc::unbounded_channel::<()>();
        let (read_done, mut read_done_rx) = mpsc::unbounded_channel::<usize>();
        let (fast_done, fast_window) = oneshot::channel::<usize>();
        let server = tokio::spawn(async move {
            let mut connection = h2::server::Builder::new()
                .initial_window_size(STREAM_WINDOW)
                .initial_connection_window_size(connection_window(16))
                .max_frame_size(MAX_FRAME_SIZE)
                .handshake::<_, Bytes>(server_io)
                .await
                .unwrap();
            let (mut unread, mut read_one_rx, mut fast_done) = (Vec::new(), Some(read_one_rx), Some(fast_done));
            while let Some(accepted) = connection.accept().await {
                let (request, respond) = accepted.unwrap();
                let path = request.uri().path().to_owned();
                let mut body = request.into_body();
                match path.as_str() {
                    "/unread" => unread.push((body, respond)),
                    "/slow" => {
                        let (mut read_one_rx, read_done) = (read_one_rx.take().unwrap(), read_done.clone());
                        tokio::spawn(async move {
                            while read_one_rx.recv().await.is_some() {
                                let n = body.data().await.unwrap().unwrap().len();
                                body.flow_control().release_capacity(n).unwrap();
                                read_done.send(window(&mut body)).unwrap();
                            }
                        });
                    }
                    _ => {
                        let fast_done = fast_done.take().unwrap();
                        tokio::spawn(async move {
                            let mut largest = 0;
                            while let Some(data) = body.data().await {
                                let n = data.unwrap().len();
                                body.flow_control().release_capacity(n).unwrap();
                                largest = largest.max(window(&mut body));
                            }
                            fast_done.send(largest).unwrap();
                        });
                    }
                }
            }
        });
        let (mut client, connection) =
            h2::client::Builder::new().max_send_buffer_size(4 << 20).handshake::<_, Bytes>(client_io).await.unwrap();
        tokio::spawn(connection);
        // Sends `total` bytes in frames of at most `piece` as window comes.
        async fn send(send: &mut h2::SendStream<Bytes>, total: usize, piece: usize) {
            let mut sent = 0;
            while sent < total {
                send.reserve_capacity(total - sent);
                let capacity = poll_fn(|cx| send.poll_capacity(cx)).await.unwrap().unwrap();
                for start in (0..capacity).step_by(piece) {
                    send.send_data(Bytes::from(vec![b'x'; piece.min(capacity - start)]), false).unwrap();
                }
                sent += capacity;
            }
        }
        let mut open = async |path: &str| {
            client = client.clone().ready().await.unwrap();
            client.send_request(http::Request::post(path).body(()).unwrap(), false).unwrap().1
        };
        let initial = STREAM_WINDOW as usize;

        let mut unread = open("/unread").await;
        send(&mut unread, initial, PIECE).await;

        // The window full, then one piece read and one sent, in turn: the reader always leaves
        // seven or eight pieces waiting.
        let mut slow = open("/slow").await;
        send(&mut slow, initial, PIECE).await;
        for _ in 0..SLOW_READS {
            read_one.send(()).unwrap();
            assert_eq!(read_done_rx.recv().await.unwrap(), initial, "the window of a stream read slower than sent");
            send(&mut slow, PIECE, PIECE).await;
        }

        let mut fast = open("/fast").await;
        send(&mut fast, FAST_BODY, MAX_CHUNK).await;
        fast.send_data(Bytes::new(), true).unwrap();
        assert_eq!(
            fast_window.await.unwrap(),
            GROWN_STREAM_WINDOW as usize,
            "the window of a stream whose reader keeps up"
        );

        // No window came for the unread stream meanwhile.
        unread.reserve_capacity(1);
        assert_eq!(unread.capacity(), 0, "the unread stream's window grew");
        server.abort();
    }

    #[test]
    fn the_codec_starts_small_and_yields_each_chunk() {
        use tonic::codec::{Codec as _, Decoder as _, Encoder as _};
        let mut codec = Codec::<crate::tunnel::pb::ConnectRequest, crate::tunnel::pb::ConnectResponse>::default();
        for settings in [codec.encoder().buffer_settings(), codec.decoder().buffer_settings()] {
            assert_eq!(
                format!("{settings:?}"),
                format!("{:?}", tonic::codec::BufferSettings::new(CODEC_BUFFER, YIELD_THRESHOLD))
            );
        }
    }

    #[test]
    fn a_stopped_reader_keeps_a_small_window_and_a_steady_one_gets_the_maximum() {
        let mut w = ResponseWindow::new();
        let mut outstanding = u64::from(w.initial());
        // A reader that takes 40 KiB in 4 KiB messages and stops.
        for _ in 0..10 {
            outstanding -= 4096;
            outstanding += u64::from(w.consumed(4096).unwrap_or(0));
        }
        assert!(outstanding <= 16 * 1024, "{outstanding}");
        // A reader that keeps reading: the window reaches the maximum and the credit outstanding
        // never exceeds it.
        for _ in 0..2_000 {
            let take = outstanding.min(MAX_CHUNK as u64);
            outstanding -= take;
            outstanding += u64::from(w.consumed(take as usize).unwrap_or(0));
            assert!(outstanding <= MAX_RESPONSE_WINDOW);
            assert!(outstanding > 0, "the sender would stall");
        }
        assert_eq!(w.window(), MAX_RESPONSE_WINDOW);
        assert!(outstanding >= MAX_RESPONSE_WINDOW / 2);
    }

    #[test]
    fn chunks_are_split_without_loss() {
        let data: Vec<u8> = (0..(MAX_CHUNK * 2 + 5)).map(|i| i as u8).collect();
        let pieces: Vec<_> = split_chunk(bytes::Bytes::from(data.clone())).collect();
        assert_eq!(pieces.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![MAX_CHUNK, MAX_CHUNK, 5]);
        assert_eq!(pieces.concat(), data);
        assert_eq!(split_chunk(bytes::Bytes::new()).count(), 0);
    }
}
