//! Flow control of the tunnel path (issue 12): what every hop may hold per stream, in bytes.
//!
//! All tunnels of an agentk connection share one HTTP/2 connection (and all forwarded tunnels
//! between two kas share one), so a stream whose reader stopped must never hold the
//! connection's window: the connection window is sized for every stream holding its full stream
//! window at once ([`connection_window`] = streams allowed × [`STREAM_WINDOW`], capped at the
//! HTTP/2 maximum).
//! The stream window is also what a hop buffers for a reader that stopped, twice over at a
//! relaying kas: its receive window towards the sender, and (while the next hop's socket is
//! backed up) up to the next hop's window queued to send. Heap profiles of 1,000 unread streams
//! through two kas also show tonic's per-stream receive buffer (it reserves a whole message
//! ahead and grows by doubling: 32-64 KiB per stream with 8-32 KiB messages) and fixed costs of
//! ~12 KiB per stream (gateway) and ~30 KiB (routing kas, most of it hyper's HTTP/1.1 buffers).
//! Issue 12's 64 MiB bound for 1,000 streams (~65 KiB per stream, everything included) was met
//! only with 8 KiB windows on kas's receiving sides and 4 KiB chunks, which cut a 200 MiB
//! response to a quarter to a fifth of its speed; these values keep the speed and do not meet it. See
//! ARCHITECTURE.md ("Back-pressure") for the figures.

/// HTTP/2 stream window on every tunnel hop (agentk <-> kas, kas <-> kas): the unread bytes
/// one stream may leave in a receiver's buffer. One stream's throughput is at most window /
/// round trip: 128 KiB kept a 200 MiB response at hyper's-default speed on loopback, where 64 KiB
/// lost about half of it.
pub const STREAM_WINDOW: u32 = 128 * 1024;

/// The largest HTTP/2 window (2^31 - 1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// HTTP/2 connection window for a listener that allows `max_streams` streams per connection:
/// every stream may hold its whole window and the connection still has room, so one stuck stream
/// (or all but one) never stalls the others. It is a permission, not an allocation: what is
/// buffered is bounded by the streams' windows.
pub const fn connection_window(max_streams: u32) -> u32 {
    let window = STREAM_WINDOW as u64 * max_streams as u64;
    if window > MAX_WINDOW as u64 { MAX_WINDOW } else { window as u32 }
}

/// The connection window of the dialing side (agentk towards kas, a routing kas towards a peer):
/// the listener's MAX_CONCURRENT_STREAMS bounds the streams, so the window never needs to.
pub const CONNECTION_WINDOW: u32 = MAX_WINDOW;

/// Largest body chunk put into one tunnel message: larger chunks are split, so a message-counted
/// buffer is also byte-bounded. (16 KiB cost a third of the throughput in per-message work.)
pub const MAX_CHUNK: usize = 32 * 1024;

/// Tunnel messages buffered in a channel between two tasks of one hop (each at most
/// [`MAX_CHUNK`] of body, for agentk and kas as shipped).
pub const HOP_BUFFER: usize = 2;

/// Initial size of tonic's per-stream encode and decode buffers (tonic's default is 8 KiB). Every
/// stream allocates one of each up front, idle tunnels included; the buffers grow to the message
/// being coded, so a small start costs nothing for large messages and saves up to 14 KiB per stream.
pub const CODEC_BUFFER: usize = 1024;

/// The codec of every generated service (`proto/build.rs`): prost with [`CODEC_BUFFER`]-sized
/// initial buffers and a [`MAX_CHUNK`] yield threshold (one tunnel message per HTTP/2 write).
#[derive(Debug, Clone, Copy)]
pub struct Codec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

fn buffer_settings() -> tonic::codec::BufferSettings {
    tonic::codec::BufferSettings::new(CODEC_BUFFER, MAX_CHUNK)
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = tonic_prost::ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(buffer_settings())
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
        assert_eq!(connection_window(1024), 1024 * STREAM_WINDOW);
        assert_eq!(connection_window(u32::MAX), MAX_WINDOW);
        assert!(connection_window(10_000) >= 10_000u32.saturating_mul(STREAM_WINDOW).min(MAX_WINDOW));
    }

    #[test]
    fn the_codec_starts_small_and_yields_each_chunk() {
        use tonic::codec::{Codec as _, Decoder as _, Encoder as _};
        let mut codec = Codec::<crate::tunnel::pb::ConnectRequest, crate::tunnel::pb::ConnectResponse>::default();
        for settings in [codec.encoder().buffer_settings(), codec.decoder().buffer_settings()] {
            assert_eq!(
                format!("{settings:?}"),
                format!("{:?}", tonic::codec::BufferSettings::new(CODEC_BUFFER, MAX_CHUNK))
            );
        }
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
