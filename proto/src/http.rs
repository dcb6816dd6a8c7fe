//! HTTP <-> tunnel frame adapters for the Kubernetes API proxy (both kas and agentk use them).

use std::collections::HashMap;

use bytes::Bytes;
use http::header::{CONNECTION, HeaderMap, HeaderName, HeaderValue, UPGRADE};
use prost::Message;

use crate::kubernetes_api::{HeaderValues, HttpFrame, HttpRequestHead, HttpResponseHead, http_frame};

/// Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection and are never forwarded,
/// except `Connection`/`Upgrade` of a protocol upgrade, which the proxy carries end to end.
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether the request asks for a protocol upgrade (WebSocket, SPDY).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(UPGRADE)
        && headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes hop-by-hop headers, including those the `Connection` header names. With
/// `keep_upgrade`, `Connection: Upgrade` and `Upgrade` survive (a protocol switch passes through).
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| !(keep_upgrade && n == UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        if keep_upgrade && (*name == "connection" || *name == "upgrade") {
            continue;
        }
        headers.remove(*name);
    }
    if keep_upgrade && headers.contains_key(UPGRADE) {
        headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    }
}

pub fn headers_to_proto(headers: &HeaderMap) -> HashMap<String, HeaderValues> {
    let mut out: HashMap<String, HeaderValues> = HashMap::new();
    for (name, value) in headers {
        out.entry(name.as_str().to_owned()).or_default().values.push(Bytes::copy_from_slice(value.as_bytes()));
    }
    out
}

/// Converts back, skipping names or values that are not valid HTTP (never panics on peer input).
pub fn headers_from_proto(headers: &HashMap<String, HeaderValues>) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, values) in headers {
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else { continue };
        for v in &values.values {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                out.append(name.clone(), v);
            }
        }
    }
    out
}

impl HttpFrame {
    pub fn request_head(head: HttpRequestHead) -> Self {
        Self { frame: Some(http_frame::Frame::RequestHead(head)) }
    }

    pub fn response_head(head: HttpResponseHead) -> Self {
        Self { frame: Some(http_frame::Frame::ResponseHead(head)) }
    }

    pub fn body(data: Bytes) -> Self {
        Self { frame: Some(http_frame::Frame::Body(data)) }
    }

    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(self.encode_to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", "close, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("accept", "application/json".parse().unwrap());
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("accept"));
    }

    #[test]
    fn upgrade_survives_when_asked() {
        let mut h = HeaderMap::new();
        h.insert("connection", "Upgrade, keep-alive".parse().unwrap());
        h.insert("upgrade", "websocket".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "Upgrade");
        assert!(!h.contains_key("keep-alive"));
        let mut plain = HeaderMap::new();
        plain.insert("upgrade", "websocket".parse().unwrap());
        assert!(!is_upgrade(&plain), "Upgrade without Connection: Upgrade is not an upgrade");
    }

    #[test]
    fn header_round_trip_keeps_repeated_values_and_skips_invalid() {
        let mut h = HeaderMap::new();
        h.append("accept", "a".parse().unwrap());
        h.append("accept", "b".parse().unwrap());
        let mut p = headers_to_proto(&h);
        assert_eq!(headers_from_proto(&p), h);
        p.insert("bad name".into(), HeaderValues { values: vec![Bytes::from_static(b"x")] });
        p.insert("x-bad-value".into(), HeaderValues { values: vec![Bytes::from_static(b"a\nb")] });
        assert_eq!(headers_from_proto(&p), h);
    }
}
