//! Metrics of the Kubernetes API proxy.

pub const PROXIED_BYTES: &str = "kas_proxied_bytes_total";

pub fn describe() {
    metrics::describe_counter!(PROXIED_BYTES, "Kubernetes API proxy body bytes, by direction (request, response)");
}

pub fn proxied_bytes(direction: &'static str, n: usize) {
    metrics::counter!(PROXIED_BYTES, "direction" => direction).increment(n as u64);
}
