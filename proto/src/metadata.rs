//! Metadata keys and conversions between tonic metadata and tunnel metadata maps.

use std::collections::BTreeMap;

use crate::tunnel::pb::MetadataValues;

/// The metadata key carrying `Bearer <token>` on every listener.
pub const AUTHORIZATION: &str = "authorization";

/// kas -> kas routing metadata of `KasInternal.ForwardTunnel`: the target of the request.
/// Never forwarded to agentk (not in [`FORWARDED_METADATA`]).
pub const HOP_AGENT_ID: &str = "kas-hop-agent-id";
pub const HOP_CONNECTION_ID: &str = "kas-hop-connection-id";
pub const HOP_METHOD: &str = "kas-hop-method";
/// Response header of `ForwardTunnel`: the gateway kas relays `WindowUpdate` frames to agentk
/// (a kas without it would refuse them), so the routing kas may grant response credit.
pub const HOP_RESPONSE_CREDIT: &str = "kas-hop-response-credit";
/// Request and response header of `ForwardTunnel`: the routing kas may send another exchange
/// (a new `RequestInfo`) on the stream once one ended cleanly both ways, and the gateway kas
/// serves it from any of its tunnels of the same connection. Both must say so.
pub const HOP_REUSABLE: &str = "kas-hop-reusable";

/// The correlation id of a request: the caller's, or one kas makes up. It travels in the
/// forwarded metadata from the routing kas through the gateway kas to agentk, and every hop logs
/// it as `request_id`.
pub const REQUEST_ID: &str = "x-request-id";

/// The request id in tunnel metadata, if any.
pub fn request_id(md: &BTreeMap<String, MetadataValues>) -> Option<&str> {
    md.get(REQUEST_ID).and_then(|v| v.values.first()).map(String::as_str)
}

/// The request id in tunnel metadata, generated and inserted when the caller sent none.
pub fn ensure_request_id(md: &mut BTreeMap<String, MetadataValues>) -> String {
    if let Some(id) = request_id(md).filter(|id| !id.is_empty()) {
        return id.to_owned();
    }
    let id = format!("{:032x}", rand::random::<u128>());
    md.insert(REQUEST_ID.to_owned(), MetadataValues { values: vec![id.clone()] });
    id
}

/// gRPC's retry pushback (the name gRPC's retry policy reads): on an `UNAVAILABLE` answer, the
/// milliseconds the server asks the client to wait before it tries again. kas sends it when it
/// sheds a new agent connection (`limits.agent_connection_accept_rate`); agentk waits at least
/// that long, plus jitter.
pub const RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";
/// The longest pushback a client honours: a bad value cannot park an agent for hours.
pub const MAX_RETRY_PUSHBACK: std::time::Duration = std::time::Duration::from_secs(300);

/// The status with a retry pushback of `after` (whole milliseconds, rounded up).
pub fn with_retry_pushback(mut status: tonic::Status, after: std::time::Duration) -> tonic::Status {
    let ms = after.as_micros().div_ceil(1000).min(MAX_RETRY_PUSHBACK.as_millis());
    if let Ok(v) = ms.to_string().parse() {
        status.metadata_mut().insert(RETRY_PUSHBACK_MS, v);
    }
    status
}

/// The retry pushback of an `UNAVAILABLE` status (capped at [`MAX_RETRY_PUSHBACK`]); `None`
/// when absent or not a decimal number of milliseconds (gRPC: a negative or malformed value
/// means "do not retry", which an agent never obeys: it keeps its own backoff).
pub fn retry_pushback(status: &tonic::Status) -> Option<std::time::Duration> {
    if status.code() != tonic::Code::Unavailable {
        return None;
    }
    let v = status.metadata().get(RETRY_PUSHBACK_MS)?.to_str().ok()?;
    if v.is_empty() || v.len() > 12 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms: u64 = v.parse().ok()?;
    Some(std::time::Duration::from_millis(ms).min(MAX_RETRY_PUSHBACK))
}

/// Caller metadata that kas forwards to agentk. Everything else (routing metadata, the caller's
/// credentials, transport headers) stays in kas.
pub const FORWARDED_METADATA: &[&str] = &["x-request-id", "user-agent"];

/// Extracts `<token>` from `Bearer <token>`; `None` when absent or not a Bearer value.
pub fn bearer_token(value: Option<&str>) -> Option<&str> {
    let v = value?.trim();
    let (scheme, token) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// Copies the whitelisted ASCII metadata into a tunnel metadata map.
pub fn forwarded(md: &tonic::metadata::MetadataMap) -> BTreeMap<String, MetadataValues> {
    let mut out = BTreeMap::new();
    for key in FORWARDED_METADATA {
        let values: Vec<String> = md.get_all(*key).iter().filter_map(|v| v.to_str().ok().map(str::to_owned)).collect();
        if !values.is_empty() {
            out.insert((*key).to_owned(), MetadataValues { values });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(Some("Bearer")), None);
        assert_eq!(bearer_token(None), None);
    }

    #[test]
    fn retry_pushback_round_trips_only_on_unavailable_and_is_capped() {
        use std::time::Duration;
        let s = with_retry_pushback(tonic::Status::unavailable("busy"), Duration::from_micros(1_234_001));
        assert_eq!(s.metadata().get(RETRY_PUSHBACK_MS).unwrap(), "1235");
        assert_eq!(retry_pushback(&s), Some(Duration::from_millis(1235)));
        let s = with_retry_pushback(tonic::Status::unavailable("busy"), Duration::from_secs(86_400));
        assert_eq!(retry_pushback(&s), Some(MAX_RETRY_PUSHBACK));
        let other = with_retry_pushback(tonic::Status::resource_exhausted("limit"), Duration::from_secs(1));
        assert_eq!(retry_pushback(&other), None, "only UNAVAILABLE carries a pushback");
        for bad in ["-1", "", "1.5", "+3", "99999999999999"] {
            let mut s = tonic::Status::unavailable("busy");
            if let Ok(v) = bad.parse() {
                s.metadata_mut().insert(RETRY_PUSHBACK_MS, v);
            }
            assert_eq!(retry_pushback(&s), None, "{bad:?}");
        }
        assert_eq!(retry_pushback(&tonic::Status::unavailable("no hint")), None);
    }

    #[test]
    fn only_whitelisted_metadata_is_forwarded() {
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert("authorization", "Bearer secret".parse().unwrap());
        md.insert("kas-hop-count", "1".parse().unwrap());
        md.insert("x-request-id", "r1".parse().unwrap());
        let f = forwarded(&md);
        assert_eq!(f.len(), 1);
        assert_eq!(f["x-request-id"].values, vec!["r1".to_owned()]);
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any `authorization` value: never a panic; a token comes back only from a
        /// `Bearer <token>` value (scheme in any case), trimmed and non-empty.
        #[test]
        fn bearer_token_of_arbitrary_values(value in prop_oneof![".{0,24}", "(?i:bearer)[ \t]{0,2}.{0,12}"]) {
            if let Some(token) = bearer_token(Some(&value)) {
                prop_assert!(!token.is_empty());
                prop_assert_eq!(token, token.trim());
                let v = value.trim();
                prop_assert!(v.len() > 7 && v[..6].eq_ignore_ascii_case("bearer") && v.as_bytes()[6] == b' ', "{value:?}");
                prop_assert_eq!(v[7..].trim(), token);
            }
        }

        /// A token without whitespace round-trips through `Bearer <token>`.
        #[test]
        fn bearer_tokens_round_trip(token in "[!-~]{1,64}", scheme in "(?i:bearer)") {
            let value = format!("{scheme} {token}");
            prop_assert_eq!(bearer_token(Some(&value)), Some(token.as_str()));
        }
    }
}
