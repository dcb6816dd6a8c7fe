//! The internal listener: `KasInternal` for other kas. Its own secret; requests name the agent
//! connection and are served from local tunnels only (no discovery, so no routing cycles).

use std::time::Duration;

use futures::StreamExt;
use futures::stream::Peekable;
use kas_proto::kas::kas_internal_server::KasInternal;
use kas_proto::kas::{GetPodsRequest, GetPodsResponse};
use kas_proto::metadata::{HOP_AGENT_ID, HOP_CONNECTION_ID, HOP_METHOD, HOP_REUSABLE};
use kas_proto::tunnel::pb::{ConnectRequest, ConnectResponse, connect_response};
use kas_proto::{AgentId, ConnectionId};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::error::KasError;
use crate::modules::get_pods::{self, Scope};
use crate::router::{Router, Target};
use crate::tunnel::{Tripwire, TunnelIo, TunnelReceiver, TunnelSender};

pub struct InternalService {
    pub router: Router,
}

fn hop(md: &MetadataMap, key: &'static str) -> Result<String, KasError> {
    md.get(key)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| KasError::InvalidArgument(format!("missing {key} metadata")))
}

/// The agent connection and method a routing kas names in its hop metadata.
fn hop_target(md: &MetadataMap) -> Result<Target, KasError> {
    Ok(Target::new(
        AgentId::parse(HOP_AGENT_ID, &hop(md, HOP_AGENT_ID)?)?,
        // The routing kas always names the connection it found in the registry: 0 ("any")
        // would let a peer pick any local connection.
        ConnectionId::parse(HOP_CONNECTION_ID, &hop(md, HOP_CONNECTION_ID)?)?,
        &hop(md, HOP_METHOD)?,
    ))
}

/// How long the request side of a relayed exchange may go on after its response ended (the
/// routing kas's CloseSend follows at once).
const RELAY_END_WAIT: Duration = Duration::from_secs(10);
/// How long a reusable forwarded stream waits for its next exchange: longer than the routing
/// kas keeps it idle (`tunnel::forwards::IDLE_FORWARD_TIMEOUT`), so the routing kas ends it.
const NEXT_EXCHANGE_WAIT: Duration = Duration::from_secs(30);

/// One exchange of a forwarded stream, as its response side takes it.
enum Exchange {
    /// A local tunnel carries it; `done` is told when its response has ended.
    Tunnel { from_agent: TunnelReceiver, done: oneshot::Sender<()> },
    /// No local tunnel could take it: this error is its response, and the stream ends.
    Refused(Status),
    /// The connection is no longer held here: the stream ends with this status before any
    /// response frame, which makes the routing kas route the request again (`tunnel::Reroute`).
    Moved(Status),
}

/// How the request side of one exchange ended.
enum ExchangeEnd {
    /// CloseSend went to agentk and the response ended: the stream may carry another.
    Finished,
    /// The routing kas ended or reset its side before that: agentk's work is cancelled.
    RoutingGone,
    /// The response side is gone (it failed, or the routing kas reset the stream), agentk's
    /// tunnel refused a frame, or the request side did not end in time after the response.
    Over,
}

/// Every hop logs the request id of each request it forwards (the first of a stream, and each
/// later one on a kept stream).
fn log_request_info(frame: &ConnectResponse) {
    if let Some(connect_response::Msg::RequestInfo(info)) = &frame.msg {
        let request_id = kas_proto::metadata::request_id(&info.metadata).unwrap_or_default();
        tracing::debug!(%request_id, "forwarding a request to a local tunnel");
    }
}

fn is_close_send(frame: &ConnectResponse) -> bool {
    matches!(frame.msg, Some(connect_response::Msg::CloseSend(_)))
}

/// routing kas -> agentk, one exchange: request frames in order until CloseSend went to agentk
/// and the response ended. Frames after CloseSend (`WindowUpdate`s) still go to agentk while the
/// response lasts.
async fn relay_exchange(
    from_routing: &mut Peekable<Streaming<ConnectResponse>>,
    to_agent: TunnelSender,
    mut response_done: oneshot::Receiver<()>,
) -> ExchangeEnd {
    let mut close_sent = false;
    let mut responded = false;
    let end_wait = tokio::time::sleep(NEXT_EXCHANGE_WAIT);
    tokio::pin!(end_wait);
    loop {
        tokio::select! {
            // The response's end first: it is signalled before its last frame goes to the routing
            // kas, so a next exchange's RequestInfo that is already here comes after it and must
            // not go to this exchange's tunnel.
            biased;
            done = &mut response_done, if !responded => {
                if done.is_err() {
                    return ExchangeEnd::Over;
                }
                responded = true;
                if close_sent {
                    return ExchangeEnd::Finished;
                }
                end_wait.as_mut().reset(tokio::time::Instant::now() + RELAY_END_WAIT);
            }
            () = &mut end_wait, if responded => return ExchangeEnd::Over,
            next = from_routing.next() => {
                let Some(Ok(frame)) = next else { return ExchangeEnd::RoutingGone };
                log_request_info(&frame);
                let close = is_close_send(&frame);
                if let Err(e) = to_agent.send(frame).await {
                    tracing::debug!(error = %e, "forwarding a request frame failed");
                    return ExchangeEnd::Over;
                }
                close_sent |= close;
                if close_sent && responded {
                    return ExchangeEnd::Finished;
                }
            }
        }
    }
}

/// The request side of a forwarded stream: relays each exchange and, on a reusable stream
/// (`exchanges` is `Some`), finds a local tunnel for the next `RequestInfo`.
async fn relay_requests(
    router: Router,
    mut target: Target,
    mut from_routing: Peekable<Streaming<ConnectResponse>>,
    mut to_agent: TunnelSender,
    mut response_done: oneshot::Receiver<()>,
    exchanges: Option<(mpsc::Sender<Exchange>, CancellationToken)>,
    requests_ended: Tripwire,
) {
    loop {
        match relay_exchange(&mut from_routing, to_agent, response_done).await {
            ExchangeEnd::Finished => {}
            ExchangeEnd::RoutingGone => {
                requests_ended.trip();
                return;
            }
            ExchangeEnd::Over => break,
        }
        // agentk's tunnel is released here (both halves dropped): back to the idle pool.
        let Some((exchanges, connection_gone)) = &exchanges else { break };
        // A stream of a connection that went down ends at once: the routing kas then sees it
        // ended before it sends the next request on it.
        // The token is shared by every stream of the connection: waiting on it takes a lock and a
        // place in its waiter list, so it is only waited on when the next request is not there.
        let next = if connection_gone.is_cancelled() {
            None
        } else {
            tokio::select! {
                biased;
                next = next_request_info(&mut from_routing) => next,
                () = connection_gone.cancelled() => None,
            }
        };
        let Some(info) = next else { break };
        let Some(connect_response::Msg::RequestInfo(request)) = &info.msg else { break };
        request.method.clone_into(&mut target.method);
        let Some(found) = local_tunnel(&router, &target, &mut from_routing).await else {
            requests_ended.trip();
            return;
        };
        let mut tunnel = match found {
            Ok(tunnel) => tunnel,
            Err(e) => {
                tracing::debug!(agent_id = %target.agent_id, error = %e, "no local tunnel for the next exchange of a forwarded stream");
                let exchange = match e {
                    // The routing kas asked before, when the connection was here; it moved since.
                    KasError::NotHere { .. } => Exchange::Moved(Status::unavailable(format!("{e}; it moved, retry"))),
                    e => Exchange::Refused(Status::from(e)),
                };
                let _ = exchanges.send(exchange).await;
                break;
            }
        };
        tunnel.relay();
        let (sender, receiver) = tunnel.split();
        let (done, done_rx) = oneshot::channel();
        if exchanges.send(Exchange::Tunnel { from_agent: receiver, done }).await.is_err() {
            break;
        }
        log_request_info(&info);
        if let Err(e) = sender.send(info).await {
            tracing::debug!(error = %e, "forwarding a request frame failed");
            break;
        }
        to_agent = sender;
        response_done = done_rx;
    }
    // The response side ends once `exchanges` is gone; the routing kas's side is read to its
    // end, not reset.
    drop(exchanges);
    crate::tunnel::read_to_end(from_routing).await;
}

/// The first frame of the next exchange on a reusable stream; `None` when the routing kas ended
/// the stream, sent something else, or nothing for [`NEXT_EXCHANGE_WAIT`].
async fn next_request_info(from_routing: &mut Peekable<Streaming<ConnectResponse>>) -> Option<ConnectResponse> {
    loop {
        let frame = tokio::time::timeout(NEXT_EXCHANGE_WAIT, from_routing.next()).await.ok()?.and_then(Result::ok)?;
        match frame.msg {
            Some(connect_response::Msg::RequestInfo(_)) => return Some(frame),
            // Credit for the response that just ended, sent before the routing kas saw its end.
            Some(connect_response::Msg::WindowUpdate(_)) => {}
            _ => {
                tracing::warn!(
                    "a routing kas sent a frame other than RequestInfo between exchanges; ending the stream"
                );
                return None;
            }
        }
    }
}

/// A local tunnel for `target`, waiting as `route_local` does; `None` if the routing kas went
/// away meanwhile (its next frames are left in the stream).
async fn local_tunnel(
    router: &Router,
    target: &Target,
    from_routing: &mut Peekable<Streaming<ConnectResponse>>,
) -> Option<Result<TunnelIo, KasError>> {
    let route = router.route_local(target, None);
    tokio::pin!(route);
    tokio::select! {
        found = &mut route => return Some(found),
        next = std::pin::Pin::new(&mut *from_routing).peek() => {
            if !matches!(next, Some(Ok(_))) {
                return None;
            }
        }
    }
    // The request's next frames are there; they are relayed once a tunnel is found.
    Some(route.await)
}

/// agentk -> routing kas: response frames of each exchange in turn, pulled from agentk's tunnel
/// only when the routing kas's stream can take the next one (tonic polls this stream once hyper
/// has handed the previous frame to HTTP/2). A relay through a channel would hold its frames
/// (and the task would keep taking agentk's data) for a routing kas that stopped reading; this
/// way an unread stream costs the gateway its HTTP/2 window and one frame (`kas_proto::flow`).
/// Ends when the request side ended (the routing kas went away: the current tunnel is dropped,
/// which cancels agentk's work) or has no further exchange; dropping it (the routing kas reset
/// the stream) drops the exchange's `done`, which ends the request side.
fn responses(
    exchanges: mpsc::Receiver<Exchange>,
    requests_ended: Tripwire,
) -> impl futures::Stream<Item = Result<ConnectRequest, Status>> + Send + 'static {
    struct State {
        exchanges: mpsc::Receiver<Exchange>,
        current: Option<(TunnelReceiver, oneshot::Sender<()>)>,
        requests_ended: Tripwire,
    }
    let state = State { exchanges, current: None, requests_ended };
    futures::stream::unfold(Some(state), |state| async move {
        let mut state = state?;
        let (from_agent, _) = loop {
            if let Some(current) = &mut state.current {
                break current;
            }
            let next = tokio::select! {
                () = state.requests_ended.tripped() => return None,
                next = state.exchanges.recv() => next,
            };
            match next? {
                Exchange::Tunnel { from_agent, done } => state.current = Some((from_agent, done)),
                Exchange::Refused(status) => {
                    return Some((Ok(ConnectRequest::error(&status)), None));
                }
                Exchange::Moved(status) => return Some((Err(status), None)),
            }
        };
        let next = tokio::select! {
            () = state.requests_ended.tripped() => return None,
            next = from_agent.recv() => next,
        };
        match next {
            Ok(Some(msg)) => {
                if from_agent.is_done()
                    && let Some((from_agent, done)) = state.current.take()
                {
                    // agentk's tunnel goes back to the pool once the request side lets go too.
                    drop(from_agent);
                    let _ = done.send(());
                }
                Some((Ok(ConnectRequest { msg: Some(msg) }), Some(state)))
            }
            Ok(None) => Some((Err(Status::unavailable("agentk closed the tunnel before the response ended")), None)),
            Err(e) => Some((Err(Status::unavailable(e.to_string())), None)),
        }
    })
}

#[tonic::async_trait]
impl KasInternal for InternalService {
    type ForwardTunnelStream = futures::stream::BoxStream<'static, Result<ConnectRequest, Status>>;

    async fn get_pods(&self, request: Request<GetPodsRequest>) -> Result<Response<GetPodsResponse>, Status> {
        let deadline = super::grpc_timeout(request.metadata());
        let metadata = kas_proto::metadata::forwarded(request.metadata());
        let response =
            get_pods::get_pods(&self.router, Scope::LocalOnly, request.into_inner(), metadata, deadline).await?;
        Ok(Response::new(response))
    }

    async fn forward_tunnel(
        &self,
        request: Request<Streaming<ConnectResponse>>,
    ) -> Result<Response<Self::ForwardTunnelStream>, Status> {
        let md = request.metadata();
        let target = hop_target(md)?;
        let deadline = super::grpc_timeout(md);
        let reusable = md.contains_key(HOP_REUSABLE);
        // NOT_FOUND here, before the response headers, tells the routing kas to try elsewhere.
        let mut tunnel = self.router.route_local(&target, deadline).await?;
        // The routing kas grants the response credit; its WindowUpdates reach agentk through
        // `relay_exchange` (or are dropped if this agentk does not take them).
        tunnel.relay();
        let (to_agent, from_agent) = tunnel.split();
        let span = tracing::debug_span!(
            "forward",
            agent_id = %target.agent_id,
            connection_id = %target.connection_id,
            kas = %self.router.registry().instance().instance_id
        );
        let connection_gone = if reusable { Some(self.router.connection_gone(&target).await?) } else { None };
        let (exchanges, exchanges_rx) = mpsc::channel(1);
        let (done, response_done) = oneshot::channel();
        exchanges
            .try_send(Exchange::Tunnel { from_agent, done })
            .map_err(|_| Status::internal("the first exchange of a forwarded stream could not be queued"))?;
        // Whichever side ends first ends the exchange: the response is complete (or the routing
        // kas reset the stream), or the routing kas went away (its caller cancelled) and the
        // agent's tunnel must be dropped so agentk cancels the API server request.
        let requests_ended = Tripwire::new();
        tokio::spawn(tracing::Instrument::instrument(
            relay_requests(
                self.router.clone(),
                target,
                request.into_inner().peekable(),
                to_agent,
                response_done,
                connection_gone.map(|gone| (exchanges, gone)),
                requests_ended.clone(),
            ),
            span,
        ));
        let mut response =
            Response::new(Box::pin(responses(exchanges_rx, requests_ended)) as Self::ForwardTunnelStream);
        let md = response.metadata_mut();
        md.insert(kas_proto::metadata::HOP_RESPONSE_CREDIT, tonic::metadata::MetadataValue::from_static("1"));
        if reusable {
            md.insert(HOP_REUSABLE, tonic::metadata::MetadataValue::from_static("1"));
        }
        Ok(response)
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// `kas-hop-agent-id` / `kas-hop-connection-id` from a peer kas: any value is a target
        /// exactly when it is a positive id in decimal digits (the rule of every id, see
        /// `kas_proto::ids`), else INVALID_ARGUMENT naming the key; never a panic.
        #[test]
        fn hop_ids_of_arbitrary_metadata(raw in prop_oneof![any::<i64>().prop_map(|v| v.to_string()), "[+-]?[0-9]{0,21}", "[ -~]{0,12}"]) {
            let mut md = MetadataMap::new();
            let Ok(value) = raw.parse() else { return Ok(()) };
            md.insert(HOP_AGENT_ID, "7".parse().unwrap());
            md.insert(HOP_METHOD, "/m".parse().unwrap());
            md.insert(HOP_CONNECTION_ID, value);
            let valid = !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) && raw.parse::<i64>().is_ok_and(|v| v > 0);
            match hop_target(&md) {
                Ok(t) => {
                    prop_assert!(valid, "{raw:?} accepted");
                    prop_assert_eq!((t.agent_id, Ok(t.connection_id.0)), (AgentId(7), raw.parse::<i64>()));
                }
                Err(e) => {
                    prop_assert!(!valid, "{raw:?} refused");
                    prop_assert!(e.to_string().starts_with("kas-hop-connection-id must be a positive integer"), "{e}");
                    prop_assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);
                }
            }
            prop_assert_eq!(
                hop_target(&MetadataMap::new()).unwrap_err().to_string(),
                "missing kas-hop-agent-id metadata"
            );
        }
    }
}
