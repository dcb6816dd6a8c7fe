//! Metrics of the Kubernetes API proxy.

use crate::metrics::Registered;

pub const PROXIED_BYTES: &str = "kas_proxied_bytes_total";

pub fn describe() {
    metrics::describe_counter!(PROXIED_BYTES, "Kubernetes API proxy body bytes, by direction (request, response)");
}

/// Which body `kas_proxied_bytes_total` counts (its `direction` label).
#[derive(Debug, Clone, Copy)]
pub enum Direction {
    Request,
    Response,
}

pub fn proxied_bytes(direction: Direction, n: usize) {
    static REQUEST: Registered<metrics::Counter> = Registered::new();
    static RESPONSE: Registered<metrics::Counter> = Registered::new();
    let (handle, label) = match direction {
        Direction::Request => (&REQUEST, "request"),
        Direction::Response => (&RESPONSE, "response"),
    };
    handle.get(|| metrics::counter!(PROXIED_BYTES, "direction" => label)).increment(n as u64);
}
