//! One file per listener.

pub mod admission;
pub mod agent;
pub mod api;
pub mod data_plane;
pub mod internal;
pub mod listen;
pub mod observability;
pub mod rest;

use std::time::Duration;

use tonic::metadata::MetadataMap;

/// The caller's deadline from the `grpc-timeout` header (e.g. `100m`, `20S`), if any.
pub fn grpc_timeout(md: &MetadataMap) -> Option<Duration> {
    let v = md.get("grpc-timeout")?.to_str().ok()?;
    if v.len() < 2 || v.len() > 9 {
        return None; // the spec allows at most 8 digits
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    // Digits only: `u64::from_str` would also take a sign (`+5S`), which the spec does not.
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
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
        // Found by proptests::grpc_timeout_accepts_exactly_the_spec_grammar: a sign was taken.
        for v in ["+0M", "+5S", "-5S", "+1234567S"] {
            md.insert("grpc-timeout", v.parse().unwrap());
            assert_eq!(grpc_timeout(&md), None, "{v}");
        }
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    /// The gRPC specification's grammar: `TimeoutValue TimeoutUnit`, at most 8 ASCII digits and
    /// one of `HMSmun`.
    fn spec(v: &str) -> Option<Duration> {
        let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
        if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u64 = digits.parse().ok()?;
        Some(match unit {
            "H" => Duration::from_secs(n * 3600),
            "M" => Duration::from_secs(n * 60),
            "S" => Duration::from_secs(n),
            "m" => Duration::from_millis(n),
            "u" => Duration::from_micros(n),
            "n" => Duration::from_nanos(n),
            _ => return None,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any `grpc-timeout` value a caller can send: never a panic, and a deadline exactly for
        /// the values the gRPC specification allows (anything else is ignored: no deadline).
        #[test]
        fn grpc_timeout_accepts_exactly_the_spec_grammar(v in prop_oneof![
            "[+-]?[0-9]{0,10}[HMSmunhs]?",
            "[ -~]{0,12}",
        ]) {
            let mut md = MetadataMap::new();
            if let Ok(value) = v.parse() {
                md.insert("grpc-timeout", value);
                prop_assert_eq!(grpc_timeout(&md), spec(&v), "{:?}", v);
            }
        }

        /// Valid timeouts round-trip.
        #[test]
        fn valid_grpc_timeouts_parse(n in 0u64..=99_999_999, unit in proptest::sample::select(vec!['H', 'M', 'S', 'm', 'u', 'n'])) {
            let v = format!("{n}{unit}");
            let mut md = MetadataMap::new();
            md.insert("grpc-timeout", v.parse().unwrap());
            prop_assert_eq!(grpc_timeout(&md), spec(&v));
            prop_assert!(grpc_timeout(&md).is_some());
        }
    }
}
