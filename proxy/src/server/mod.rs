//! One file per listener.

pub mod agent;
pub mod api;
pub mod internal;
pub mod listen;
pub mod observability;
pub mod rest;
pub mod rest_serve;

use std::time::Duration;

use tonic::metadata::MetadataMap;

/// The caller's deadline from the `grpc-timeout` header (e.g. `100m`, `20S`), if any.
pub fn grpc_timeout(md: &MetadataMap) -> Option<Duration> {
    let v = md.get("grpc-timeout")?.to_str().ok()?;
    if v.len() < 2 || v.len() > 9 {
        return None; // the spec allows at most 8 digits
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The `authorization` value as text, if present and ASCII.
fn authorization(md: &MetadataMap) -> Option<&str> {
    md.get(kas_proto::metadata::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_grpc_timeout() {
        let mut md = MetadataMap::new();
        assert_eq!(grpc_timeout(&md), None);
        for (v, d) in
            [("100m", Duration::from_millis(100)), ("2S", Duration::from_secs(2)), ("1H", Duration::from_secs(3600))]
        {
            md.insert("grpc-timeout", v.parse().unwrap());
            assert_eq!(grpc_timeout(&md), Some(d), "{v}");
        }
        md.insert("grpc-timeout", "abc".parse().unwrap());
        assert_eq!(grpc_timeout(&md), None);
    }
}
