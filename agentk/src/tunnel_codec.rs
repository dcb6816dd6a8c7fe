//! What agentk sends kas on a tunnel, and how it is encoded.
//!
//! A proxied HTTP body's data stays as it came from the API server: agentk writes the gRPC
//! message prefix and the `ConnectRequest { message: Message { data: HttpFrame { body } } }` keys
//! and lengths, and hands the data itself to HTTP/2 as it is ([`chunks`]), which writes it to
//! the socket from there (the vendored h2 writes a DATA frame's payload of 4 KiB or more from
//! where it is, `CHAIN_THRESHOLD` in vendor/h2/src/codec/framed_write.rs). Encoding the `HttpFrame` first and then the `ConnectRequest` made two copies of
//! every body byte (issue 14: 11 % of agentk's samples on a 200 MiB response); writing it into
//! tonic's send buffer made one (4.6-5.3 %). The bytes on the wire are exactly what prost writes
//! for that message, in the gRPC framing tonic writes.

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt as _;
use hyper::body::Frame;
use kas_proto::tunnel::pb::{ConnectRequest, ConnectResponse};
use prost::Message as _;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tonic::codec::{Codec, Streaming};
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

/// `ConnectRequest.msg.message` (tunnel.proto).
const CONNECT_REQUEST_MESSAGE: u32 = 3;
/// `Message.data` (tunnel.proto).
const MESSAGE_DATA: u32 = 1;
/// `HttpFrame.frame.body` (kubernetes_api.proto).
const HTTP_FRAME_BODY: u32 = 3;

/// One item of a tunnel's send stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    Frame(ConnectRequest),
    /// A `Message` whose data is an `HttpFrame` carrying this body data.
    HttpBody(Bytes),
}

impl From<ConnectRequest> for Outbound {
    fn from(frame: ConnectRequest) -> Self {
        Self::Frame(frame)
    }
}

impl Outbound {
    /// The length of the `Message` data this item carries (what response credit counts), if it
    /// is a `Message`.
    pub fn message_len(&self) -> Option<usize> {
        match self {
            Self::Frame(frame) => match &frame.msg {
                Some(kas_proto::tunnel::pb::connect_request::Msg::Message(m)) => Some(m.data.len()),
                _ => None,
            },
            Self::HttpBody(data) => Some(http_body_frame_len(data.len())),
        }
    }

    /// The frame as prost types (tests compare what was sent).
    #[cfg(test)]
    pub(crate) fn into_frame(self) -> ConnectRequest {
        match self {
            Self::Frame(frame) => frame,
            Self::HttpBody(data) => {
                ConnectRequest::message(kas_proto::kubernetes_api::HttpFrame::body(data).to_bytes())
            }
        }
    }
}

/// The encoded length of `HttpFrame { body }` for `body_len` bytes of body.
fn http_body_frame_len(body_len: usize) -> usize {
    key_len(HTTP_FRAME_BODY) + encoded_len_varint(body_len as u64) + body_len
}

/// The encoded length of `Message { data: HttpFrame { body } }`.
fn http_body_message_len(body_len: usize) -> usize {
    let frame_len = http_body_frame_len(body_len);
    key_len(MESSAGE_DATA) + encoded_len_varint(frame_len as u64) + frame_len
}

/// The encoded length of the whole `ConnectRequest` [`encode_http_body`] writes.
fn http_body_request_len(body_len: usize) -> usize {
    let message_len = http_body_message_len(body_len);
    key_len(CONNECT_REQUEST_MESSAGE) + encoded_len_varint(message_len as u64) + message_len
}

/// Writes the keys and lengths of `ConnectRequest { message: Message { data: HttpFrame { body } } }`
/// for `body_len` bytes of body, as prost would: the body's bytes follow them.
fn encode_http_body_head(body_len: usize, buf: &mut impl BufMut) {
    let frame_len = http_body_frame_len(body_len);
    let message_len = http_body_message_len(body_len);
    encode_key(CONNECT_REQUEST_MESSAGE, WireType::LengthDelimited, buf);
    encode_varint(message_len as u64, buf);
    encode_key(MESSAGE_DATA, WireType::LengthDelimited, buf);
    encode_varint(frame_len as u64, buf);
    encode_key(HTTP_FRAME_BODY, WireType::LengthDelimited, buf);
    encode_varint(body_len as u64, buf);
}

/// The gRPC message prefix: a byte saying "not compressed", then the message's length.
const GRPC_PREFIX_LEN: usize = 5;
/// A body this small is copied behind its message's head (one DATA frame, as tonic sends it):
/// h2 copies a payload under its `CHAIN_THRESHOLD` (4 KiB in the vendored h2) into its write
/// buffer anyway, so a frame of its own would save no copy.
const COPY_BODY_BELOW: usize = 4 * 1024;

fn grpc_prefix(message_len: usize, buf: &mut BytesMut) -> Result<(), Status> {
    let len = u32::try_from(message_len)
        .map_err(|_| Status::resource_exhausted(format!("a tunnel message of {message_len} bytes is too large")))?;
    buf.put_u8(0);
    buf.put_u32(len);
    Ok(())
}

/// Whether a body goes into the buffer behind its message's head ([`COPY_BODY_BELOW`]).
fn copied(body: &Bytes) -> bool {
    body.len() < COPY_BODY_BELOW
}

/// What [`frame_into`] writes into its buffer for `item`: a frame, or a body message's head
/// and, when it is copied, its body.
fn buffered_len(item: &Outbound) -> usize {
    GRPC_PREFIX_LEN
        + match item {
            Outbound::Frame(frame) => frame.encoded_len(),
            Outbound::HttpBody(body) if copied(body) => http_body_request_len(body.len()),
            Outbound::HttpBody(body) => http_body_request_len(body.len()) - body.len(),
        }
}

/// Writes `item` in gRPC's framing at the end of `buf`; a body of [`COPY_BODY_BELOW`] or more
/// bytes is not copied: only its message's head is written, and the body is returned, to be
/// sent right after `buf`'s bytes.
fn frame_into(item: Outbound, buf: &mut BytesMut) -> Result<Option<Bytes>, Status> {
    match item {
        Outbound::Frame(frame) => {
            let len = frame.encoded_len();
            grpc_prefix(len, buf)?;
            frame.encode(buf).map_err(|e| Status::internal(e.to_string()))?;
            Ok(None)
        }
        Outbound::HttpBody(body) => {
            grpc_prefix(http_body_request_len(body.len()), buf)?;
            encode_http_body_head(body.len(), buf);
            if copied(&body) {
                buf.put_slice(&body);
                return Ok(None);
            }
            Ok(Some(body))
        }
    }
}

/// The items that were ready together, as few chunks as possible (each becomes an HTTP/2 DATA
/// frame, all written at once): small ones copied together, as tonic's encoder buffers them (a
/// small response's head, body and trailer in one), a large body's bytes a chunk of their own.
/// One allocation for all of them (growing the buffer item by item reallocated it up to four
/// times per small response: 2.5 % of agentk's instructions per request, callgrind).
fn chunks(items: Vec<Outbound>) -> Vec<Result<Bytes, Status>> {
    let mut out = Vec::new();
    let mut buf = BytesMut::with_capacity(items.iter().map(buffered_len).sum());
    for item in items {
        match frame_into(item, &mut buf) {
            Ok(None) => {}
            Ok(Some(body)) => {
                out.push(Ok(buf.split().freeze()));
                out.push(Ok(body));
            }
            Err(status) => {
                out.push(Err(status));
                return out;
            }
        }
    }
    if !buf.is_empty() {
        out.push(Ok(buf.freeze()));
    }
    out
}

/// Items that were ready together are framed together up to this many: as many as the tunnel's
/// send buffer holds (a small response's head, body and trailer are sent as one batch).
const READY_ITEMS: usize = kas_proto::flow::HOP_BUFFER;

/// The path of `AgentTunnel.Connect`.
const CONNECT_PATH: &str = "/kas.tunnel.v1.AgentTunnel/Connect";

/// Opens a tunnel (`AgentTunnel.Connect`) sending `request`'s items, as tonic's generated client
/// would (the same headers, framing and response handling) but with body data written as it is
/// ([`chunks`]): tonic's client encodes every message into its own send buffer.
pub async fn connect<S>(
    channel: tonic::transport::Channel,
    request: tonic::Request<S>,
) -> Result<tonic::Response<Streaming<ConnectResponse>>, Status>
where
    S: futures::Stream<Item = Outbound> + Send + 'static,
{
    use tower::{Service as _, ServiceExt as _};

    let mut channel = channel;
    channel.ready().await.map_err(|e| Status::unavailable(format!("the connection to kas is not ready: {e}")))?;
    let (metadata, mut extensions, items) = request.into_parts();
    // An item that cannot be framed (a message over 4 GiB) ends the request body with an error,
    // which resets the stream, as tonic's encoder does.
    let data = items
        .ready_chunks(READY_ITEMS)
        .flat_map(|ready| futures::stream::iter(chunks(ready).into_iter().map(|chunk| chunk.map(Frame::data))));
    let mut http_request = http::Request::new(tonic::body::Body::new(http_body_util::StreamBody::new(data)));
    *http_request.method_mut() = http::Method::POST;
    *http_request.uri_mut() = http::Uri::from_static(CONNECT_PATH);
    *http_request.version_mut() = http::Version::HTTP_2;
    let headers = http_request.headers_mut();
    *headers = metadata.into_headers();
    headers.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    extensions.insert(tonic::GrpcMethod::new("kas.tunnel.v1.AgentTunnel", "Connect"));
    *http_request.extensions_mut() = extensions;
    let response = channel.call(http_request).await.map_err(|e| Status::from_error(Box::new(e)))?;
    let (parts, body) = response.into_parts();
    let decoder = kas_proto::flow::Codec::<ConnectRequest, ConnectResponse>::default().decoder();
    // As tonic's client: a `grpc-status` in the headers makes a trailers-only response, an error
    // unless it says OK (then the stream is empty).
    let messages = match Status::from_header_map(&parts.headers) {
        Some(status) if status.code() != Code::Ok => return Err(status),
        Some(_) => Streaming::new_empty(decoder, body),
        None => Streaming::new_response(decoder, body, parts.status, None, None),
    };
    Ok(tonic::Response::from_parts(MetadataMap::from_headers(parts.headers), messages, parts.extensions))
}

#[cfg(test)]
mod tests {
    use kas_proto::kubernetes_api::HttpFrame;

    use super::*;

    /// What tonic's client writes for one message: the gRPC prefix, then prost's encoding.
    fn as_tonic_writes(frame: &ConnectRequest) -> Vec<u8> {
        let encoded = frame.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&u32::try_from(encoded.len()).unwrap().to_be_bytes());
        out.extend_from_slice(&encoded);
        out
    }

    /// The hand-written framing is byte for byte what tonic and prost write for the nested
    /// messages, a body of 4 KiB or more is handed on without a copy (the same allocation), and
    /// the length is what kas counts as the message's data (response credit).
    #[test]
    fn http_body_frames_as_tonic_and_prost_write_it() {
        for len in [0, 1, 100, 127, 128, 4_095, 4_096, 16_383, 16_384, 65_536, 2_097_151, 2_097_152] {
            let body = Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
            let frame = ConnectRequest::message(HttpFrame::body(body.clone()).to_bytes());
            let sent = chunks(vec![Outbound::HttpBody(body.clone())]);
            let sent: Vec<Bytes> = sent.into_iter().map(Result::unwrap).collect();
            if len >= COPY_BODY_BELOW {
                assert_eq!(sent.len(), 2, "body of {len} bytes sent apart");
                assert_eq!(sent[1].as_ptr(), body.as_ptr(), "body of {len} bytes was copied");
            } else {
                assert_eq!(sent.len(), 1, "body of {len} bytes copied behind its head");
            }
            let written = sent.concat();
            assert_eq!(written, as_tonic_writes(&frame), "body of {len} bytes");
            assert_eq!(http_body_request_len(len), frame.encoded_len(), "body of {len} bytes");
            assert_eq!(http_body_frame_len(len), HttpFrame::body(body.clone()).encoded_len(), "body of {len} bytes");
            let decoded = ConnectRequest::decode(&written[GRPC_PREFIX_LEN..]).unwrap();
            assert_eq!(Outbound::Frame(decoded.clone()).message_len(), Some(http_body_frame_len(len)));
            assert_eq!(Outbound::HttpBody(body).into_frame(), decoded);
        }
        let descriptor = ConnectRequest::descriptor(kas_proto::tunnel::pb::Descriptor {
            connection_id: 7,
            methods: vec!["/m".into()],
            response_credit: true,
            reusable: true,
        });
        // Ready together: the small items in one chunk, a large body's bytes in their own.
        let large = Bytes::from(vec![7u8; 65_536]);
        let items = vec![
            Outbound::Frame(descriptor.clone()),
            Outbound::HttpBody(Bytes::from_static(b"{}")),
            Outbound::HttpBody(large.clone()),
            Outbound::Frame(descriptor.clone()),
        ];
        let buffered: usize = items.iter().map(buffered_len).sum();
        let sent: Vec<Bytes> = chunks(items).into_iter().map(Result::unwrap).collect();
        assert_eq!(sent.len(), 3);
        assert_eq!(sent[1].as_ptr(), large.as_ptr());
        // The one allocation is exactly what is copied: the two copied chunks follow each other in it.
        assert_eq!(sent[0].len() + sent[2].len(), buffered);
        assert_eq!(sent[0].as_ptr().wrapping_add(sent[0].len()), sent[2].as_ptr());
        let expected = [
            as_tonic_writes(&descriptor),
            as_tonic_writes(&ConnectRequest::message(HttpFrame::body(Bytes::from_static(b"{}")).to_bytes())),
            as_tonic_writes(&ConnectRequest::message(HttpFrame::body(large).to_bytes())),
            as_tonic_writes(&descriptor),
        ]
        .concat();
        assert_eq!(sent.concat(), expected);
    }
}
