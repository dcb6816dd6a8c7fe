//! The Kubernetes API proxy's request and response heads, with their headers as the
//! [`HeaderMap`] both ends work with.
//!
//! On the wire a head's headers are `map<string, HeaderValues>` (the reference agent's
//! protocol). prost would decode that into a map of owned strings and vectors that kas and
//! agentk then converted to a `HeaderMap` (and back, for what they send): about 6.5 % of kas's
//! instructions per proxied request (callgrind, issue 14). These heads are encoded and decoded
//! by hand instead (`extern_path` in `build.rs` puts them in the generated `HttpFrame`): each
//! map entry becomes `HeaderMap` entries directly, the values sharing the received buffer.
//!
//! What a peer sends that is not valid HTTP (a name or value a `HeaderMap` cannot hold) is
//! skipped, as before; a name sent in two entries keeps the values of both.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use prost::DecodeError;
use prost::encoding::{
    DecodeContext, WireType, check_wire_type, decode_key, decode_varint, encode_key, encode_varint, encoded_len_varint,
    key_len, merge_loop, skip_field,
};

/// The head of a request kas sends to agentk (`kas.kubernetes_api.v1.HttpRequestHead`).
#[derive(Clone, PartialEq, Default, Debug)]
pub struct HttpRequestHead {
    pub method: String,
    /// The path and query (origin form).
    pub path: String,
    pub headers: HeaderMap,
}

/// The head of the API server's response (`kas.kubernetes_api.v1.HttpResponseHead`).
#[derive(Clone, PartialEq, Default, Debug)]
pub struct HttpResponseHead {
    pub status: u32,
    pub headers: HeaderMap,
}

const REQUEST_HEADERS_TAG: u32 = 3;
const RESPONSE_HEADERS_TAG: u32 = 2;

impl prost::Message for HttpRequestHead {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.method.is_empty() {
            prost::encoding::string::encode(1, &self.method, buf);
        }
        if !self.path.is_empty() {
            prost::encoding::string::encode(2, &self.path, buf);
        }
        encode_headers(REQUEST_HEADERS_TAG, &self.headers, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => prost::encoding::string::merge(wire_type, &mut self.method, buf, ctx),
            2 => prost::encoding::string::merge(wire_type, &mut self.path, buf, ctx),
            REQUEST_HEADERS_TAG => merge_header_entry(wire_type, &mut self.headers, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let string_len = |tag, s: &String| {
            if s.is_empty() { 0 } else { prost::encoding::string::encoded_len(tag, s) }
        };
        string_len(1, &self.method)
            + string_len(2, &self.path)
            + headers_encoded_len(REQUEST_HEADERS_TAG, &self.headers)
    }

    fn clear(&mut self) {
        self.method.clear();
        self.path.clear();
        self.headers.clear();
    }
}

impl prost::Message for HttpResponseHead {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if self.status != 0 {
            prost::encoding::uint32::encode(1, &self.status, buf);
        }
        encode_headers(RESPONSE_HEADERS_TAG, &self.headers, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => prost::encoding::uint32::merge(wire_type, &mut self.status, buf, ctx),
            RESPONSE_HEADERS_TAG => merge_header_entry(wire_type, &mut self.headers, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let status = if self.status == 0 { 0 } else { prost::encoding::uint32::encoded_len(1, &self.status) };
        status + headers_encoded_len(RESPONSE_HEADERS_TAG, &self.headers)
    }

    fn clear(&mut self) {
        self.status = 0;
        self.headers.clear();
    }
}

/// Field numbers inside a map entry, and inside `HeaderValues`.
const ENTRY_KEY: u32 = 1;
const ENTRY_VALUE: u32 = 2;
const VALUES: u32 = 1;

/// One map entry per header name: `{1: name, 2: HeaderValues {1: value, ...}}`.
///
/// Walks `headers.iter()`, which yields a name's values one after another (each name is one
/// entry of the map, its further values linked to it; `HeaderMap::into_iter` documents the same
/// grouping, and the proptest `heads_decode_and_encode_as_prosts_map_form` would see a name
/// split into two entries, of which a map keeps one). A name with one value needs no lookup;
/// one with more is looked up once for its values' length.
fn encode_headers(tag: u32, headers: &HeaderMap, buf: &mut impl BufMut) {
    let mut iter = headers.iter().peekable();
    while let Some((name, value)) = iter.next() {
        let single = iter.peek().is_none_or(|(next, _)| *next != name);
        let values_len = if single { value_len(value) } else { headers.get_all(name).iter().map(value_len).sum() };
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(entry_len(name, values_len) as u64, buf);
        encode_key(ENTRY_KEY, WireType::LengthDelimited, buf);
        encode_varint(name.as_str().len() as u64, buf);
        buf.put_slice(name.as_str().as_bytes());
        encode_key(ENTRY_VALUE, WireType::LengthDelimited, buf);
        encode_varint(values_len as u64, buf);
        encode_value(value, buf);
        while let Some((_, value)) = iter.next_if(|(next, _)| *next == name) {
            encode_value(value, buf);
        }
    }
}

fn encode_value(value: &HeaderValue, buf: &mut impl BufMut) {
    encode_key(VALUES, WireType::LengthDelimited, buf);
    encode_varint(value.len() as u64, buf);
    buf.put_slice(value.as_bytes());
}

fn headers_encoded_len(tag: u32, headers: &HeaderMap) -> usize {
    let entry = |name, values_len| {
        let entry_len = entry_len(name, values_len);
        key_len(tag) + encoded_len_varint(entry_len as u64) + entry_len
    };
    let mut total = 0;
    let mut current: Option<(&HeaderName, usize)> = None;
    for (name, value) in headers {
        match &mut current {
            Some((same, values_len)) if *same == name => *values_len += value_len(value),
            _ => {
                if let Some((name, values_len)) = current {
                    total += entry(name, values_len);
                }
                current = Some((name, value_len(value)));
            }
        }
    }
    total + current.map_or(0, |(name, values_len)| entry(name, values_len))
}

/// One value inside `HeaderValues`, encoded.
fn value_len(value: &HeaderValue) -> usize {
    key_len(VALUES) + encoded_len_varint(value.len() as u64) + value.len()
}

/// A map entry, without its length delimiter (a name always has at least one value, so
/// neither half is the default that prost would leave out).
fn entry_len(name: &HeaderName, values_len: usize) -> usize {
    let name_len = name.as_str().len();
    key_len(ENTRY_KEY)
        + encoded_len_varint(name_len as u64)
        + name_len
        + key_len(ENTRY_VALUE)
        + encoded_len_varint(values_len as u64)
        + values_len
}

/// Decodes one map entry into `headers`. Its `HeaderValues` is taken as bytes first (an
/// entry's fields may come in any order), without copying when `buf` is `Bytes`; the name is
/// parsed where it lies.
fn merge_header_entry(
    wire_type: WireType,
    headers: &mut HeaderMap,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    // `None` until a valid name is read: an entry without one is skipped, as is one whose
    // (last, as protobuf takes it) name is not a valid header name.
    let mut name: Option<HeaderName> = None;
    let mut values = Bytes::new();
    merge_loop(&mut (&mut name, &mut values), buf, ctx.clone(), |(name, values), buf, ctx| {
        let (tag, wire_type) = decode_key(buf)?;
        match tag {
            ENTRY_KEY => {
                let mut chunk = buf.chunk();
                let contiguous = match decode_varint(&mut chunk) {
                    Ok(len) if wire_type == WireType::LengthDelimited && len <= chunk.len() as u64 => {
                        let len = len as usize;
                        Some((HeaderName::from_bytes(&chunk[..len]).ok(), buf.chunk().len() - chunk.len() + len))
                    }
                    _ => None,
                };
                **name = match contiguous {
                    Some((parsed, consumed)) => {
                        buf.advance(consumed);
                        parsed
                    }
                    // Split across chunks of `buf`, or not a length-delimited field: read (or
                    // refused) as prost reads bytes.
                    None => {
                        let mut raw = Bytes::new();
                        prost::encoding::bytes::merge(wire_type, &mut raw, buf, ctx)?;
                        HeaderName::from_bytes(&raw).ok()
                    }
                };
                Ok(())
            }
            ENTRY_VALUE if values.is_empty() => prost::encoding::bytes::merge(wire_type, *values, buf, ctx),
            ENTRY_VALUE => {
                // A message field sent twice is merged: for `HeaderValues`, its values appended,
                // which is what the concatenation of the two encodings decodes to.
                let mut more = Bytes::new();
                prost::encoding::bytes::merge(wire_type, &mut more, buf, ctx)?;
                let mut both = BytesMut::with_capacity(values.len() + more.len());
                both.extend_from_slice(values);
                both.extend_from_slice(&more);
                **values = both.freeze();
                Ok(())
            }
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    })?;
    // Decoded even when the name is invalid: a malformed `HeaderValues` fails the head as it
    // would with prost's own decoding.
    while values.has_remaining() {
        let (tag, wire_type) = decode_key(&mut values)?;
        if tag != VALUES {
            skip_field(wire_type, tag, &mut values, ctx.clone())?;
            continue;
        }
        let mut value = Bytes::new();
        prost::encoding::bytes::merge(wire_type, &mut value, &mut values, ctx.clone())?;
        if let (Some(name), Ok(value)) = (&name, HeaderValue::from_maybe_shared(value)) {
            headers.append(name.clone(), value);
        }
    }
    Ok(())
}
