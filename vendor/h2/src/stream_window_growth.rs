//! kas patch: receive windows that grow per stream while the stream's reader keeps up.
//!
//! HTTP/2 gives every stream of a connection the same initial window
//! (SETTINGS_INITIAL_WINDOW_SIZE), which is also what an unread stream leaves buffered in the
//! receiver. A window small enough for many stalled streams limits one stream whose reader is
//! faster than the network to window / round trip. With a maximum set here, a stream's window
//! grows each time its reader has taken everything that arrived (the receive buffer ran empty:
//! the window, not the reader, was what limited the stream), by what was read, up to the
//! maximum: TCP's receive-buffer autotuning, per stream. A stream nobody reads, or whose reader
//! is slower than its sender (data always waiting), keeps the initial window; a fast reader that
//! stops holds at most the maximum. Off (standard HTTP/2 behaviour) until a maximum is set; the
//! setting is process-wide because hyper and tonic, which build h2's connections, pass no new
//! h2 options through.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::proto::MAX_WINDOW_SIZE;

static MAX: AtomicU32 = AtomicU32::new(0);

/// Lets every stream's receive window grow up to `max` bytes (0: no growth, as h2 upstream).
/// Applies to streams of every connection in the process from their next read on.
pub fn set_max(max: u32) {
    MAX.store(max.min(MAX_WINDOW_SIZE), Ordering::Relaxed);
}

/// A stream's growth beyond `initial` after its reader took `read` bytes and left nothing
/// buffered, from `growth` before.
pub(crate) fn grown(initial: u32, growth: u32, read: u32) -> u32 {
    let limit = MAX.load(Ordering::Relaxed).saturating_sub(initial);
    growth.saturating_add(read).min(limit).max(growth)
}
