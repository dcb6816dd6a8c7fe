//! What agentk sends kas on a tunnel, and how it is encoded.
//!
//! A proxied HTTP body's data stays as it came from the API server and is encoded straight into
//! tonic's send buffer as `ConnectRequest { message: Message { data: HttpFrame { body } } }`:
//! one copy of each body byte where encoding the `HttpFrame` first (`HttpFrame::to_bytes`) and
//! then the `ConnectRequest` made two (issue 14: the two were 11 % of agentk's samples on a
//! 200 MiB response). The bytes on the wire are exactly what prost writes for that message.

use bytes::{BufMut, Bytes};
use kas_proto::tunnel::pb::{ConnectRequest, ConnectResponse};
use prost::Message as _;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};

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

/// Writes `ConnectRequest { message: Message { data: HttpFrame { body } } }`, as prost would.
fn encode_http_body(body: &[u8], buf: &mut impl BufMut) {
    let frame_len = http_body_frame_len(body.len());
    let message_len = http_body_message_len(body.len());
    encode_key(CONNECT_REQUEST_MESSAGE, WireType::LengthDelimited, buf);
    encode_varint(message_len as u64, buf);
    encode_key(MESSAGE_DATA, WireType::LengthDelimited, buf);
    encode_varint(frame_len as u64, buf);
    encode_key(HTTP_FRAME_BODY, WireType::LengthDelimited, buf);
    encode_varint(body.len() as u64, buf);
    buf.put_slice(body);
}

/// The codec of agentk's `AgentTunnel.Connect` call: [`Outbound`] items out, `ConnectResponse`
/// in, with the buffer settings and decoder of every other call (`kas_proto::flow::Codec`).
#[derive(Debug, Default)]
pub struct TunnelCodec(kas_proto::flow::Codec<ConnectRequest, ConnectResponse>);

impl Codec for TunnelCodec {
    type Encode = Outbound;
    type Decode = ConnectResponse;
    type Encoder = OutboundEncoder;
    type Decoder = <kas_proto::flow::Codec<ConnectRequest, ConnectResponse> as Codec>::Decoder;

    fn encoder(&mut self) -> OutboundEncoder {
        OutboundEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        self.0.decoder()
    }
}

#[derive(Debug)]
pub struct OutboundEncoder;

impl Encoder for OutboundEncoder {
    type Item = Outbound;
    type Error = Status;

    fn encode(&mut self, item: Outbound, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match item {
            Outbound::Frame(frame) => frame.encode(buf).map_err(|e| Status::internal(e.to_string())),
            Outbound::HttpBody(body) => {
                buf.reserve(http_body_request_len(body.len()));
                encode_http_body(&body, buf);
                Ok(())
            }
        }
    }

    fn buffer_settings(&self) -> BufferSettings {
        kas_proto::flow::buffer_settings()
    }
}

/// Opens a tunnel (`AgentTunnel.Connect`) sending `request`'s items.
pub async fn connect<S>(
    channel: tonic::transport::Channel,
    request: tonic::Request<S>,
) -> Result<tonic::Response<tonic::Streaming<ConnectResponse>>, Status>
where
    S: futures::Stream<Item = Outbound> + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| Status::unavailable(format!("the connection to kas is not ready: {e}")))?;
    let path = http::uri::PathAndQuery::from_static("/kas.tunnel.v1.AgentTunnel/Connect");
    let mut request = request;
    request.extensions_mut().insert(tonic::GrpcMethod::new("kas.tunnel.v1.AgentTunnel", "Connect"));
    grpc.streaming(request, path, TunnelCodec::default()).await
}

#[cfg(test)]
mod tests {
    use kas_proto::kubernetes_api::HttpFrame;

    use super::*;

    /// The hand-written encoding is byte for byte what prost writes for the nested messages, and
    /// its length is what kas counts as the message's data (response credit).
    #[test]
    fn http_body_encodes_as_prost_does() {
        for len in [0, 1, 100, 127, 128, 16_383, 16_384, 65_536, 2_097_151, 2_097_152] {
            let body = Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
            let expected = ConnectRequest::message(HttpFrame::body(body.clone()).to_bytes()).encode_to_vec();
            let mut written = Vec::new();
            encode_http_body(&body, &mut written);
            assert_eq!(written, expected, "body of {len} bytes");
            assert_eq!(http_body_request_len(len), expected.len(), "body of {len} bytes");
            assert_eq!(http_body_frame_len(len), HttpFrame::body(body.clone()).encoded_len(), "body of {len} bytes");
            let decoded = ConnectRequest::decode(&written[..]).unwrap();
            assert_eq!(Outbound::Frame(decoded.clone()).message_len(), Some(http_body_frame_len(len)));
            assert_eq!(Outbound::HttpBody(body).into_frame(), decoded);
        }
    }
}
