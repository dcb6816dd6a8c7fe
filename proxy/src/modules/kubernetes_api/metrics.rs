//! Metrics of the Kubernetes API proxy.

use crate::metrics::Registered;

pub const PROXIED_BYTES: &str = "kas_proxied_bytes_total";

pub fn describe() {
    metrics::describe_counter!(PROXIED_BYTES, "Kubernetes API proxy body bytes, by direction (request, response)");
}

pub fn proxied_bytes(direction: &'static str, n: usize) {
    static REQUEST: Registered<metrics::Counter> = Registered::new();
    static RESPONSE: Registered<metrics::Counter> = Registered::new();
    let handle = match direction {
        "request" => &REQUEST,
        "response" => &RESPONSE,
        _ => return metrics::counter!(PROXIED_BYTES, "direction" => direction).increment(n as u64),
    };
    handle.get(|| metrics::counter!(PROXIED_BYTES, "direction" => direction)).increment(n as u64);
}
