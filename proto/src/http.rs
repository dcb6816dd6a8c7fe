//! HTTP <-> tunnel frame adapters for the Kubernetes API proxy (both kas and agentk use them).

use std::collections::BTreeMap;

use bytes::Bytes;
use http::header::{
    CONNECTION, HeaderMap, HeaderName, HeaderValue, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE,
};
use prost::Message;

use crate::kubernetes_api::{HeaderValues, HttpFrame, http_frame};

mod head;
pub use head::{HttpRequestHead, HttpResponseHead};

/// Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection and are never forwarded,
/// except `Connection`/`Upgrade` of a protocol upgrade, which the proxy carries end to end.
/// Parsed names: a lookup by `&str` parses the name each time (issue 14).
pub static HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    TE,
    TRAILER,
    TRANSFER_ENCODING,
    UPGRADE,
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
    // Most heads carry none: one pass over the names costs less than a lookup per hop-by-hop
    // name (callgrind, issue 14). With none present there is nothing below to do.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
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
    for name in &HOP_BY_HOP {
        if keep_upgrade && (name == CONNECTION || name == UPGRADE) {
            continue;
        }
        headers.remove(name);
    }
    if keep_upgrade {
        if headers.contains_key(UPGRADE) {
            headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        } else {
            // Nothing to switch to (e.g. a 101 without `Upgrade`): `Connection` is hop-by-hop.
            headers.remove(CONNECTION);
        }
    }
}

/// A request head as a peer may put it on the wire: its headers a map keyed by the names as
/// sent, which is what prost generates for the message. For tests of what arbitrary peers send
/// (names that differ in case, or are not valid HTTP); kas and agentk use [`HttpRequestHead`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireRequestHead {
    #[prost(string, tag = "1")]
    pub method: String,
    #[prost(string, tag = "2")]
    pub path: String,
    #[prost(btree_map = "string, message", tag = "3")]
    pub headers: BTreeMap<String, HeaderValues>,
}

impl WireRequestHead {
    /// This head as kas and agentk decode it from the wire.
    pub fn decoded(&self) -> Result<HttpRequestHead, prost::DecodeError> {
        HttpRequestHead::decode(self.encode_to_vec().as_slice())
    }
}

/// A response head as a peer may put it on the wire (see [`WireRequestHead`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireResponseHead {
    #[prost(uint32, tag = "1")]
    pub status: u32,
    #[prost(btree_map = "string, message", tag = "2")]
    pub headers: BTreeMap<String, HeaderValues>,
}

impl WireResponseHead {
    /// This head as kas and agentk decode it from the wire.
    pub fn decoded(&self) -> Result<HttpResponseHead, prost::DecodeError> {
        HttpResponseHead::decode(self.encode_to_vec().as_slice())
    }
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

    /// Found by `proptests::no_hop_by_hop_header_survives`: with `keep_upgrade` but no `Upgrade`
    /// header, `Connection` (any tokens, e.g. `close`) used to pass through unchanged.
    #[test]
    fn connection_without_upgrade_is_stripped_even_when_keeping_upgrades() {
        let mut h = HeaderMap::new();
        h.insert("connection", "close".parse().unwrap());
        h.insert("accept", "*/*".parse().unwrap());
        strip_hop_by_hop(&mut h, true);
        assert!(!h.contains_key("connection"), "{h:?}");
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn head_round_trip_keeps_repeated_values_and_decoding_skips_invalid_headers() {
        let mut h = HeaderMap::new();
        h.append("accept", "a".parse().unwrap());
        h.append("accept", "b".parse().unwrap());
        h.append("x-other", "c".parse().unwrap());
        let head = HttpResponseHead { status: 200, headers: h.clone() };
        assert_eq!(HttpResponseHead::decode(head.encode_to_vec().as_slice()).unwrap(), head);
        let values =
            |v: &[&'static str]| HeaderValues { values: v.iter().map(|v| Bytes::from_static(v.as_bytes())).collect() };
        let mut wire = WireResponseHead { status: 200, headers: BTreeMap::new() };
        wire.headers.insert("Accept".into(), values(&["a", "b"]));
        wire.headers.insert("X-Other".into(), values(&["c", "bad\nvalue"]));
        wire.headers.insert("bad name".into(), values(&["x"]));
        wire.headers.insert("x-none".into(), values(&[]));
        assert_eq!(wire.decoded().unwrap().headers, h);
    }

    /// A name appended to again after another name is still one map entry, with all its values
    /// (a peer's map would otherwise keep only one of two entries of the same name).
    #[test]
    fn a_name_appended_to_between_others_is_encoded_as_one_entry() {
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-b", HeaderValue::from_static("2"));
        headers.append("x-a", HeaderValue::from_static("3"));
        let head = HttpResponseHead { status: 200, headers };
        let wire = WireResponseHead::decode(head.encode_to_vec().as_slice()).unwrap();
        assert_eq!(wire.headers.len(), 2);
        assert_eq!(wire.headers["x-a"].values, [Bytes::from_static(b"1"), Bytes::from_static(b"3")]);
        assert_eq!(head.encode_to_vec().len(), head.encoded_len());
    }

    /// A head received in two pieces (a `Buf` whose chunks split a name or a length anywhere)
    /// decodes as the whole does.
    #[test]
    fn a_head_split_anywhere_decodes_as_the_whole() {
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-kubernetes-pf-flowschema-uid", HeaderValue::from_static("0a1b"));
        headers.append("x-kubernetes-pf-flowschema-uid", HeaderValue::from_static("2c3d"));
        let head = HttpRequestHead { method: "GET".into(), path: "/api/v1/pods".into(), headers };
        let encoded = head.encode_to_vec();
        for at in 0..=encoded.len() {
            let (a, b) = encoded.split_at(at);
            assert_eq!(HttpRequestHead::decode(bytes::Buf::chain(a, b)).unwrap(), head, "split at {at}");
        }
    }

    /// The values of a decoded head share the buffer it was decoded from (no copy per value).
    #[test]
    fn decoded_header_values_share_the_received_buffer() {
        let mut headers = HeaderMap::new();
        headers.insert("x-long", HeaderValue::from_static("a value long enough to be found"));
        let encoded = Bytes::from(HttpFrame::response_head(HttpResponseHead { status: 200, headers }).encode_to_vec());
        let Some(http_frame::Frame::ResponseHead(head)) = HttpFrame::decode(encoded.clone()).unwrap().frame else {
            panic!("not a response head")
        };
        let value = head.headers["x-long"].as_bytes().as_ptr_range();
        assert!(encoded.as_ptr_range().contains(&value.start), "the value was copied");
    }

    /// Protobuf merges a message field that appears twice: a map entry whose `HeaderValues`
    /// comes in two parts keeps the values of both, and an entry may name its key last.
    #[test]
    fn a_header_entry_in_any_field_order_and_in_parts_decodes_whole() {
        use prost::encoding::{WireType, encode_key, encode_varint};
        let field = |tag: u32, bytes: &[u8], out: &mut Vec<u8>| {
            encode_key(tag, WireType::LengthDelimited, out);
            encode_varint(bytes.len() as u64, out);
            out.extend_from_slice(bytes);
        };
        let mut values_a = Vec::new();
        field(1, b"a", &mut values_a);
        let mut values_b = Vec::new();
        field(1, b"b", &mut values_b);
        let mut entry = Vec::new();
        field(2, &values_a, &mut entry);
        field(2, &values_b, &mut entry);
        field(1, b"Accept", &mut entry);
        let mut head = Vec::new();
        field(2, &entry, &mut head);
        let decoded = HttpResponseHead::decode(head.as_slice()).unwrap();
        let got: Vec<&[u8]> = decoded.headers.get_all("accept").iter().map(HeaderValue::as_bytes).collect();
        assert_eq!(got, [b"a".as_slice(), b"b"]);
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    /// Header names: mostly plausible tokens (including the hop-by-hop ones and mixed case),
    /// sometimes anything at all.
    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(
                HOP_BY_HOP
                    .iter()
                    .map(HeaderName::as_str)
                    .chain(["accept", "x-private", "Connection", "UPGRADE", "Keep-Alive"])
                    .collect::<Vec<_>>()
            )
            .prop_map(str::to_owned),
            "[a-zA-Z0-9!#$%&'*+.^_`|~-]{1,12}",
            ".{0,12}",
        ]
    }

    /// Header values: token lists as found in `Connection`, or arbitrary bytes.
    fn value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(name(), 0..4).prop_map(|v| v.join(", ").into_bytes()),
            proptest::collection::vec(any::<u8>(), 0..16),
        ]
    }

    fn proto_headers() -> impl Strategy<Value = BTreeMap<String, HeaderValues>> {
        proptest::collection::btree_map(
            name(),
            proptest::collection::vec(value().prop_map(Bytes::from), 0..3).prop_map(|values| HeaderValues { values }),
            0..8,
        )
    }

    /// The conversion kas and agentk made from prost's map before the heads were decoded by hand
    /// (`head.rs`): the reference the decoding is held to.
    fn header_map_of(headers: &BTreeMap<String, HeaderValues>) -> HeaderMap {
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

    /// Headers as prost's map, the names lowercased (what kas and agentk sent before).
    fn map_of(headers: &HeaderMap) -> BTreeMap<String, HeaderValues> {
        let mut out: BTreeMap<String, HeaderValues> = BTreeMap::new();
        for (name, value) in headers {
            out.entry(name.as_str().to_owned()).or_default().values.push(Bytes::copy_from_slice(value.as_bytes()));
        }
        out
    }

    /// Arbitrary peer headers, decoded as kas and agentk decode them (prost's own encoding of
    /// them always decodes).
    fn decoded(headers: &BTreeMap<String, HeaderValues>) -> HeaderMap {
        WireResponseHead { status: 200, headers: headers.clone() }.decoded().expect("a well-formed head").headers
    }

    fn valid(name: &str, value: &[u8]) -> bool {
        HeaderName::from_bytes(name.as_bytes()).is_ok() && HeaderValue::from_bytes(value).is_ok()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary bytes as an HTTP frame (what a peer puts in a tunnel Message): never a panic.
        #[test]
        fn arbitrary_bytes_as_http_frames(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(frame) = HttpFrame::decode(data.as_slice()) {
                // Whatever decoded encodes again to something that decodes to the same frame.
                prop_assert_eq!(HttpFrame::decode(frame.to_bytes()).ok(), Some(frame));
            }
        }

        /// Request and response heads with arbitrary methods, paths, statuses and headers survive
        /// the frame encoding unchanged.
        #[test]
        fn heads_round_trip(method in ".{0,10}", path in ".{0,40}", status in any::<u32>(), headers in proto_headers()) {
            let headers = decoded(&headers);
            let request = HttpFrame::request_head(HttpRequestHead { method, path, headers: headers.clone() });
            prop_assert_eq!(HttpFrame::decode(request.to_bytes()).ok(), Some(request));
            let response = HttpFrame::response_head(HttpResponseHead { status, headers });
            prop_assert_eq!(HttpFrame::decode(response.to_bytes()).ok(), Some(response));
        }

        /// The heads are what prost's generated messages put on the wire, both ways: whatever a
        /// peer sends as a map decodes as the conversion from prost's map did, and what kas and
        /// agentk send decodes, with prost's map, to the headers they meant.
        #[test]
        fn heads_decode_and_encode_as_prosts_map_form(method in ".{0,10}", path in ".{0,40}", headers in proto_headers()) {
            let head = WireRequestHead { method: method.clone(), path: path.clone(), headers: headers.clone() }.decoded().unwrap();
            prop_assert_eq!((&head.method, &head.path), (&method, &path));
            prop_assert_eq!(&head.headers, &header_map_of(&headers));
            let back = WireRequestHead::decode(head.encode_to_vec().as_slice()).unwrap();
            prop_assert_eq!(back.headers, map_of(&head.headers));
            prop_assert_eq!((back.method, back.path), (method, path));
        }

        /// Peer headers: invalid names and values are skipped (documented), valid ones all kept
        /// (names lowercased), and encoding them again is lossless.
        #[test]
        fn decoding_keeps_exactly_the_valid_headers(headers in proto_headers()) {
            let map = decoded(&headers);
            let mut expected = 0;
            for (name, values) in &headers {
                let kept: Vec<&Bytes> = values.values.iter().filter(|v| valid(name, v)).collect();
                expected += kept.len();
                if let Ok(n) = HeaderName::from_bytes(name.as_bytes()) {
                    let got: Vec<&[u8]> = map.get_all(&n).iter().map(HeaderValue::as_bytes).collect();
                    // Names differing only in case land on the same header; each keeps its values.
                    for v in kept {
                        prop_assert!(got.contains(&v.as_ref()), "{name:?}: {v:?} missing from {got:?}");
                    }
                }
            }
            prop_assert_eq!(map.len(), expected);
            let head = HttpResponseHead { status: 200, headers: map };
            prop_assert_eq!(HttpResponseHead::decode(head.encode_to_vec().as_slice()).ok(), Some(head));
        }

        /// After stripping, no hop-by-hop header is left, nor any the Connection header named;
        /// an upgrade keeps exactly `Upgrade` and `Connection: Upgrade`.
        #[test]
        fn no_hop_by_hop_header_survives(headers in proto_headers(), keep_upgrade in any::<bool>()) {
            let mut map = decoded(&headers);
            let named: Vec<HeaderName> = map
                .get_all(CONNECTION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
                .collect();
            let upgrade_before = map.get_all(UPGRADE).iter().cloned().collect::<Vec<_>>();
            let _ = is_upgrade(&map);
            strip_hop_by_hop(&mut map, keep_upgrade);
            for name in &HOP_BY_HOP {
                if keep_upgrade && (name == CONNECTION || name == UPGRADE) {
                    continue;
                }
                prop_assert!(!map.contains_key(name), "{name} survived: {map:?}");
            }
            for name in named {
                if !(keep_upgrade && (name == UPGRADE || name == CONNECTION)) {
                    prop_assert!(!map.contains_key(&name), "{name} (named by Connection) survived: {map:?}");
                }
            }
            if keep_upgrade {
                prop_assert_eq!(map.get_all(UPGRADE).iter().cloned().collect::<Vec<_>>(), upgrade_before.clone());
                let connection: Vec<HeaderValue> = map.get_all(CONNECTION).iter().cloned().collect();
                if upgrade_before.is_empty() {
                    prop_assert!(connection.is_empty(), "Connection without Upgrade survived: {connection:?}");
                } else {
                    prop_assert_eq!(connection, vec![HeaderValue::from_static("Upgrade")]);
                }
            }
        }
    }
}

/// Whether a request is one of client-go's discovery requests (`/version`, `/api`, `/apis`, a
/// group or group version, `/openapi/...`). client-go reads their errors with `Result.Raw()`,
/// which replaces a `Status`'s message with a fixed text for most codes ("the server has asked
/// for the client to provide credentials"), so kas and agentk repeat their own message in a
/// `Warning` header there, which kubectl prints as is.
pub fn is_discovery_request(method: &str, path: &str) -> bool {
    if method != "GET" {
        return false;
    }
    let path = path.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(segments.as_slice(), ["version"] | ["api"] | ["api", _] | ["apis"] | ["apis", _] | ["apis", _, _])
        || segments.first() == Some(&"openapi")
}

/// A `Warning` header (RFC 9111 syntax, code 299, as the API server sends them) carrying
/// `message`: quotes and backslashes escaped, anything but printable ASCII replaced.
pub fn warning_header(message: &str) -> HeaderValue {
    let mut text = String::with_capacity(message.len() + 8);
    text.push_str("299 - \"");
    for c in message.chars() {
        match c {
            '"' | '\\' => {
                text.push('\\');
                text.push(c);
            }
            ' '..='~' => text.push(c),
            _ => text.push('?'),
        }
    }
    text.push('"');
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("299 - \"kas error\""))
}

#[cfg(test)]
mod discovery_tests {
    use super::*;

    #[test]
    fn discovery_requests_are_recognised() {
        for path in ["/version?timeout=5s", "/api", "/api/v1", "/apis", "/apis/apps", "/apis/apps/v1", "/openapi/v3"] {
            assert!(is_discovery_request("GET", path), "{path}");
        }
        for path in ["/api/v1/pods", "/apis/apps/v1/deployments", "/healthz"] {
            assert!(!is_discovery_request("GET", path), "{path}");
        }
        assert!(!is_discovery_request("POST", "/api"));
    }

    #[test]
    fn warnings_are_quoted_and_ascii() {
        assert_eq!(warning_header("agent 1 \"x\" \\ é\n"), "299 - \"agent 1 \\\"x\\\" \\\\ ??\"");
    }
}
