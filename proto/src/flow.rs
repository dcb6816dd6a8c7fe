//! Flow control of the tunnel path (issue 12): what every hop may hold per stream, in bytes.
//!
//! All tunnels of an agentk connection share one HTTP/2 connection (and all forwarded tunnels
//! between two kas share one), so a stream whose reader stopped must never hold the
//! connection's window: the connection window is sized for every stream holding its full stream
//! window at once ([`CONNECTION_WINDOW`] = [`MAX_CONCURRENT_STREAMS`] × [`STREAM_WINDOW`]).
//! The stream window is also what a receiving hop buffers for a reader that stopped: 1,000
//! unread streams cost each kas about 1,000 × (window + a few chunks).
//! See ARCHITECTURE.md ("Back-pressure") for the throughput side of the choice.

/// HTTP/2 stream window on every tunnel hop (agentk <-> kas, kas <-> kas): the unread bytes
/// one stream may leave in a receiver's buffer. One stream's throughput is at most window /
/// round trip: 128 KiB kept a 200 MiB response at hyper's-default speed on loopback, where 64 KiB
/// lost about half of it.
pub const STREAM_WINDOW: u32 = 128 * 1024;

/// Streams one tunnel connection may carry at once (advertised as MAX_CONCURRENT_STREAMS by the
/// agent and internal listeners): agentk's tunnels of one connection, or forwarded tunnels
/// between two kas. Far above agentk's default of 500 tunnels.
pub const MAX_CONCURRENT_STREAMS: u32 = 4096;

/// HTTP/2 connection window: every stream may hold its whole window and the connection still
/// has room, so one stuck stream (or 4,095) never stalls the others. It is a permission, not an
/// allocation: what is buffered is bounded by the streams' windows.
pub const CONNECTION_WINDOW: u32 = STREAM_WINDOW * MAX_CONCURRENT_STREAMS;
// HTTP/2 windows are at most 2^31 - 1 (checked at compile time).
const _: () = assert!(CONNECTION_WINDOW < 1 << 31);

/// Largest body chunk put into one tunnel message: larger chunks are split, so a message-counted
/// buffer is also byte-bounded. (16 KiB cost a third of the throughput in per-message work.)
pub const MAX_CHUNK: usize = 32 * 1024;

/// Tunnel messages buffered in a channel between two tasks of one hop (each at most
/// [`MAX_CHUNK`] of body, for agentk and kas as shipped).
pub const HOP_BUFFER: usize = 2;

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
    fn chunks_are_split_without_loss() {
        let data: Vec<u8> = (0..(MAX_CHUNK * 2 + 5)).map(|i| i as u8).collect();
        let pieces: Vec<_> = split_chunk(bytes::Bytes::from(data.clone())).collect();
        assert_eq!(pieces.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![MAX_CHUNK, MAX_CHUNK, 5]);
        assert_eq!(pieces.concat(), data);
        assert_eq!(split_chunk(bytes::Bytes::new()).count(), 0);
    }
}
