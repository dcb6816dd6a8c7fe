//! Kubernetes API proxy, kas half: one HTTP exchange with the agent's in-cluster API server,
//! streamed both ways through a tunnel (routed like every other call: local, peer, or wait).
//!
//! kas never buffers a body: request chunks are forwarded as they arrive, response chunks are
//! handed to the caller as they arrive, and flow control is the tunnel's HTTP/2 flow control.
//! Nothing here has a read or write timeout: watches and `logs -f` run until a side closes.
//! When the caller goes away, the tunnel is dropped, which cancels the request in agentk.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use futures::StreamExt;
use kas_proto::kubernetes_api::{HttpFrame, HttpRequestHead, HttpResponseHead, METHOD, http_frame, strip_hop_by_hop};
use kas_proto::tunnel::pb::{ConnectResponse, MetadataValues, RequestInfo, connect_request};
use prost::Message;
use tokio_util::task::AbortOnDropHandle;

pub mod callers;
pub mod grpc;
pub mod metrics;
pub mod rest;

use crate::error::KasError;
use crate::router::{Router, Target};
use crate::tunnel::{TunnelReceiver, TunnelSender, agent_error};

/// Request headers kas itself drops before anything leaves for agentk: the caller's credentials
/// (kas's own JWT) and what only meant something on the caller's connection to kas.
const DROPPED_REQUEST_HEADERS: [http::HeaderName; 3] =
    [http::header::AUTHORIZATION, http::header::COOKIE, http::header::HOST];

/// Cleans the headers of a request received from a caller (a gRPC caller's head, or the rest
/// listener's request before it becomes one).
pub fn sanitize_request_headers(headers: &mut http::HeaderMap) {
    let upgrade = kas_proto::kubernetes_api::is_upgrade(headers);
    strip_hop_by_hop(headers, upgrade);
    for h in &DROPPED_REQUEST_HEADERS {
        headers.remove(h);
    }
    let hops: Vec<_> = headers.keys().filter(|n| n.as_str().starts_with("kas-hop-")).cloned().collect();
    for h in hops {
        headers.remove(h);
    }
}

/// A request head as [`start`] takes it.
pub enum RequestHead {
    /// From a caller: cleaned by [`start`].
    Raw(HttpRequestHead),
    /// Cleaned already ([`sanitize_request_headers`]).
    Sanitized(HttpRequestHead),
}

/// An exchange in progress: the request side is being pumped, the response side is read here.
pub struct Exchange {
    receiver: TunnelReceiver,
    sender: Option<TunnelSender>,
}

/// Opens an exchange: routes, sends the request head. The caller then streams the body with
/// [`pump_body`] (unless `bodiless`: the head then goes with the request's end, in one write)
/// and reads the response with [`Exchange::response_head`] and [`body_stream`].
pub async fn start(
    router: &Router,
    target: Target,
    mut metadata: BTreeMap<String, MetadataValues>,
    head: RequestHead,
    deadline: Option<Duration>,
    bodiless: bool,
) -> Result<Exchange, KasError> {
    let request_id = kas_proto::metadata::ensure_request_id(&mut metadata);
    let head = match head {
        RequestHead::Raw(mut head) => {
            sanitize_request_headers(&mut head.headers);
            head
        }
        RequestHead::Sanitized(head) => head,
    };
    if head.method.is_empty() || !head.path.starts_with('/') {
        return Err(KasError::InvalidArgument("the request head needs a method and a path starting with /".into()));
    }
    let agent_id = target.agent_id;
    let tunnel = router.route(&target, deadline).await?;
    tracing::debug!(
        %request_id,
        agent_id = %agent_id,
        kas = %router.registry().instance().instance_id,
        method = %head.method,
        "Kubernetes API request routed"
    );
    let (sender, receiver) = tunnel.split();
    let mut frames = vec![
        ConnectResponse::request_info(RequestInfo { method: METHOD.to_owned(), metadata, response_window: 0 }),
        ConnectResponse::message(HttpFrame::request_head(head).to_bytes()),
    ];
    if bodiless {
        frames.push(ConnectResponse::close_send());
    }
    sender.send_all(frames).await?;
    Ok(Exchange { receiver, sender: (!bodiless).then_some(sender) })
}

impl Exchange {
    /// The sending side, to pump the request body (or upgraded bytes) with [`pump_body`].
    pub fn take_sender(&mut self) -> Option<TunnelSender> {
        self.sender.take()
    }

    /// Waits for the response head. Errors before it (agentk could not reach the API server,
    /// the agent broke the protocol) come back as errors the caller maps to 502 and friends.
    pub async fn response_head(&mut self) -> Result<HttpResponseHead, KasError> {
        loop {
            match self.receiver.recv().await? {
                Some(connect_request::Msg::Header(_)) => continue,
                Some(connect_request::Msg::Message(m)) => match decode(m.data)? {
                    http_frame::Frame::ResponseHead(head) => return Ok(head),
                    _ => return Err(KasError::Tunnel("agentk sent a body before the response head".into())),
                },
                Some(connect_request::Msg::Error(e)) => return Err(agent_error(e)),
                Some(_) => return Err(KasError::Tunnel("agentk ended the response before its head".into())),
                None => return Err(KasError::Tunnel("agentk closed the tunnel before the response head".into())),
            }
        }
    }

    /// Reads the response's end when it has no body (see [`read_end`]).
    pub async fn read_end(&mut self) -> Result<(), KasError> {
        read_end(&mut self.receiver).await
    }

    /// The response body (or, after a 101, the bytes of the upgraded connection) as it arrives.
    /// An error item means the response was cut short: the caller must abort, not finish it.
    /// `length`: the body's `Content-Length`, after which an HTTP server stops reading the
    /// stream: its last chunk is held back until the response's end (Trailer) is read, so the
    /// exchange ends cleanly and the tunnel can be reused.
    pub fn into_body_stream(self, length: Option<u64>) -> impl Stream<Item = Result<Bytes, KasError>> + Send + 'static {
        futures::stream::unfold(Some((self.receiver, length)), |state| async move {
            let (mut receiver, mut remaining) = state?;
            loop {
                match receiver.recv().await {
                    Ok(Some(connect_request::Msg::Message(m))) => match decode(m.data) {
                        Ok(http_frame::Frame::Body(chunk)) => {
                            if chunk.is_empty() {
                                continue;
                            }
                            metrics::proxied_bytes(metrics::Direction::Response, chunk.len());
                            remaining = remaining.map(|r| r.saturating_sub(chunk.len() as u64));
                            if remaining == Some(0) {
                                return Some((read_end(&mut receiver).await.map(|()| chunk), None));
                            }
                            // The chunk holds only its own message's bytes (`flow::OwnedDecoder`),
                            // not tonic's receive buffer, however long the caller leaves it unwritten.
                            return Some((Ok(chunk), Some((receiver, remaining))));
                        }
                        Ok(_) => {
                            return Some((Err(KasError::Tunnel("unexpected frame in the response body".into())), None));
                        }
                        Err(e) => return Some((Err(e), None)),
                    },
                    Ok(Some(connect_request::Msg::Trailer(_))) => return None,
                    Ok(Some(connect_request::Msg::Error(e))) => return Some((Err(agent_error(e)), None)),
                    Ok(Some(_)) => continue,
                    Ok(None) => {
                        return Some((Err(KasError::Tunnel("agentk closed the tunnel mid-response".into())), None));
                    }
                    Err(e) => return Some((Err(e), None)),
                }
            }
        })
    }
}

/// Reads the response's end (Trailer) after the whole body arrived; an Error frame or more body
/// is an error.
pub async fn read_end(receiver: &mut TunnelReceiver) -> Result<(), KasError> {
    loop {
        match receiver.recv().await? {
            Some(connect_request::Msg::Trailer(_)) => return Ok(()),
            Some(connect_request::Msg::Error(e)) => return Err(agent_error(e)),
            Some(connect_request::Msg::Message(m)) => match decode(m.data)? {
                http_frame::Frame::Body(chunk) if chunk.is_empty() => {}
                _ => return Err(KasError::Tunnel("agentk sent more than the response's Content-Length".into())),
            },
            Some(_) => {}
            None => return Err(KasError::Tunnel("agentk closed the tunnel mid-response".into())),
        }
    }
}

fn decode(data: Bytes) -> Result<http_frame::Frame, KasError> {
    HttpFrame::decode(data)
        .ok()
        .and_then(|f| f.frame)
        .ok_or_else(|| KasError::Tunnel("agentk sent an invalid HTTP frame".into()))
}

/// Why a caller's request body failed, as the caller sees it.
pub trait BodyError: std::fmt::Display + Send + 'static {
    /// A broken body is a bad request unless the error says otherwise.
    fn kas_error(&self) -> KasError {
        KasError::InvalidArgument(format!("the request body failed: {self}"))
    }
}

impl BodyError for axum::Error {}
impl BodyError for std::io::Error {}

/// A gRPC request stream's failure keeps its meaning: a message over
/// `limits.max_grpc_message_bytes` is OUT_OF_RANGE (as documented), not a bad request.
impl BodyError for tonic::Status {
    fn kas_error(&self) -> KasError {
        let message = format!("the request body failed: {}", self.message());
        match self.code() {
            tonic::Code::OutOfRange => KasError::TooLarge(message),
            _ => KasError::InvalidArgument(message),
        }
    }
}

/// Forwards request body chunks (or upgraded bytes) to agentk, then half-closes. Runs until the
/// body ends, the tunnel closes, or the returned handle is dropped (the exchange is over).
pub fn pump_body<S, E>(sender: TunnelSender, body: S) -> AbortOnDropHandle<()>
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: BodyError,
{
    AbortOnDropHandle::new(tokio::spawn(async move {
        let mut body = std::pin::pin!(body);
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(chunk) if chunk.is_empty() => continue,
                Ok(chunk) => {
                    metrics::proxied_bytes(metrics::Direction::Request, chunk.len());
                    // Bounded messages keep every hop's buffers bounded in bytes.
                    for piece in kas_proto::flow::split_chunk(chunk) {
                        if sender.send(ConnectResponse::message(HttpFrame::body(piece).to_bytes())).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    // The caller's body broke: the exchange ends (agentk cancels the request).
                    tracing::debug!(error = %e, "request body failed; cancelling the exchange");
                    sender.abort(e.kas_error());
                    return;
                }
            }
        }
        let _ = sender.send(ConnectResponse::close_send()).await;
    }))
}

/// The feature's registration (see [`crate::modules::Module`]). Its gRPC method is the
/// specification's `KasApi.MakeKubernetesRequest` ([`grpc`]).
pub struct KubernetesApi;

impl super::Module for KubernetesApi {
    fn name(&self) -> &'static str {
        "kubernetes_api"
    }

    fn self_authenticated_rest_routes(
        &self,
    ) -> utoipa_axum::router::OpenApiRouter<crate::server::rest::state::RestState> {
        rest::routes()
    }

    fn describe_metrics(&self) {
        metrics::describe();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kas_proto::kubernetes_api::{HeaderValues, WireRequestHead};

    /// A head as kas decodes it from a caller that sent `headers` (names as sent).
    pub(super) fn decoded_head(headers: BTreeMap<String, HeaderValues>) -> HttpRequestHead {
        WireRequestHead { method: "GET".into(), path: "/api".into(), headers }.decoded().unwrap()
    }

    #[test]
    fn caller_credentials_and_hop_headers_never_leave_kas() {
        let mut headers = BTreeMap::new();
        for (k, v) in [
            ("authorization", "Bearer jwt"),
            ("cookie", "a=b"),
            ("host", "kas:8154"),
            ("connection", "keep-alive"),
            ("keep-alive", "5"),
            ("kas-hop-agent-id", "1"),
            ("accept", "application/json"),
        ] {
            headers.insert(k.to_owned(), HeaderValues { values: vec![Bytes::from(v)] });
        }
        let mut head = decoded_head(headers);
        assert_eq!(head.headers.len(), 7);
        sanitize_request_headers(&mut head.headers);
        let h = &head.headers;
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["accept"], "application/json");
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever agentk puts in a tunnel Message: a frame, or the documented tunnel error.
        #[test]
        fn decode_of_arbitrary_messages(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            match decode(Bytes::from(data.clone())) {
                Ok(frame) => prop_assert_eq!(HttpFrame::decode(data.as_slice()).ok().and_then(|f| f.frame), Some(frame)),
                Err(e) => prop_assert_eq!(e.to_string(), "tunnel to agentk failed: agentk sent an invalid HTTP frame"),
            }
        }

        /// A caller's request head with arbitrary headers: never a panic, and nothing that must
        /// stay in kas (credentials, hop-by-hop and kas-hop-* headers) survives.
        #[test]
        fn sanitized_heads_keep_nothing_private(
            headers in proptest::collection::btree_map(
                prop_oneof![
                    proptest::sample::select(vec!["authorization", "Cookie", "host", "connection", "upgrade", "te", "kas-hop-agent-id", "KAS-HOP-x", "accept"]).prop_map(str::to_owned),
                    ".{0,10}",
                ],
                proptest::collection::vec(prop_oneof!["[ -~]{0,20}".prop_map(Bytes::from), proptest::collection::vec(any::<u8>(), 0..8).prop_map(Bytes::from)], 0..3)
                    .prop_map(|values| kas_proto::kubernetes_api::HeaderValues { values }),
                0..8,
            ),
        ) {
            let mut head = super::tests::decoded_head(headers);
            sanitize_request_headers(&mut head.headers);
            let h = &head.headers;
            // What goes on the wire to agentk: exactly these headers, each value once.
            let sent = kas_proto::kubernetes_api::WireRequestHead::decode(head.encode_to_vec().as_slice()).unwrap();
            prop_assert_eq!(h.len(), sent.headers.values().map(|v| v.values.len()).sum::<usize>(), "only valid headers are sent on");
            for name in h.keys() {
                let name = name.as_str();
                prop_assert!(!DROPPED_REQUEST_HEADERS.iter().any(|h| h == name) && !name.starts_with("kas-hop-"), "{name} left kas");
                if !h.contains_key(http::header::UPGRADE) {
                    prop_assert!(!kas_proto::kubernetes_api::HOP_BY_HOP.iter().any(|h| h == name), "{name} left kas");
                }
            }
        }
    }
}
