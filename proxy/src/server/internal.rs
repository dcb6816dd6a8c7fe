//! The internal listener: `KasInternal` for other kas. Its own secret; requests name the agent
//! connection and are served from local tunnels only (no discovery, so no routing cycles).

use futures::StreamExt;
use kas_proto::kas::kas_internal_server::KasInternal;
use kas_proto::kas::{GetPodsRequest, GetPodsResponse};
use kas_proto::metadata::{HOP_AGENT_ID, HOP_CONNECTION_ID, HOP_METHOD};
use kas_proto::tunnel::pb::{ConnectRequest, ConnectResponse};
use kas_proto::{AgentId, ConnectionId};
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::error::KasError;
use crate::modules::get_pods::{self, Scope};
use crate::router::{Router, Target};
use crate::tunnel::{TunnelReceiver, TunnelSender};

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

/// routing kas -> agentk: request frames, in order, until CloseSend or the routing kas leaves.
/// How long the request side of a relayed exchange may go on after its response ended.
const RELAY_END_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

async fn pipe_requests(from_routing: &mut Streaming<ConnectResponse>, to_agent: TunnelSender) {
    loop {
        match from_routing.next().await {
            Some(Ok(frame)) => {
                if let Some(kas_proto::tunnel::pb::connect_response::Msg::RequestInfo(info)) = &frame.msg {
                    let request_id = kas_proto::metadata::request_id(&info.metadata).unwrap_or_default();
                    tracing::debug!(%request_id, "forwarding a request to a local tunnel");
                }
                if let Err(e) = to_agent.send(frame).await {
                    tracing::debug!(error = %e, "forwarding a request frame failed");
                    return;
                }
            }
            // The routing kas ended its side (after CloseSend) or went away.
            None | Some(Err(_)) => return,
        }
    }
}

/// agentk -> routing kas: response frames until the response ends, pulled from agentk's tunnel
/// only when the routing kas's stream can take the next one (tonic polls this stream once hyper
/// has handed the previous frame to HTTP/2). A relay through a channel would hold its frames
/// (and the task would keep taking agentk's data) for a routing kas that stopped reading; this
/// way an unread stream costs the gateway its HTTP/2 window and one frame (`kas_proto::flow`).
/// Ends when the request side ended (the routing kas went away); dropping it (the response
/// ended, or the routing kas reset the stream) drops `ended`, which ends the request side.
fn responses(
    from_agent: TunnelReceiver,
    requests_ended: CancellationToken,
    ended: DropGuard,
) -> impl futures::Stream<Item = Result<ConnectRequest, Status>> + Send + 'static {
    futures::stream::unfold(Some((from_agent, requests_ended, ended)), |state| async move {
        let (mut from_agent, requests_ended, ended) = state?;
        let next = tokio::select! {
            // The routing kas went away: dropping the tunnel cancels agentk's work.
            () = requests_ended.cancelled() => return None,
            next = from_agent.recv() => next,
        };
        match next {
            Ok(Some(msg)) => {
                let more = !from_agent.is_done();
                Some((Ok(ConnectRequest { msg: Some(msg) }), more.then_some((from_agent, requests_ended, ended))))
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
        // NOT_FOUND here, before the response headers, tells the routing kas to try elsewhere.
        let mut tunnel = self.router.route_local(&target, deadline).await?;
        // The routing kas grants the response credit; its WindowUpdates reach agentk through
        // `pipe_requests` (or are dropped if this agentk does not take them).
        tunnel.relay();
        let (to_agent, from_agent) = tunnel.split();
        let from_routing = request.into_inner();
        let span = tracing::debug_span!(
            "forward",
            agent_id = %target.agent_id,
            connection_id = %target.connection_id,
            kas = %self.router.registry().instance().instance_id
        );
        // Whichever side ends first ends the exchange: the response is complete (or the routing
        // kas reset the stream), or the routing kas went away (its caller cancelled) and the
        // agent's tunnel must be dropped so agentk cancels the API server request. The request
        // side does not end at CloseSend: it waits for the routing kas to close the stream.
        let requests_ended = CancellationToken::new();
        let responses_ended = CancellationToken::new();
        tokio::spawn(tracing::Instrument::instrument(
            {
                let requests_ended = requests_ended.clone();
                let responses_ended = responses_ended.clone();
                async move {
                    let mut from_routing = from_routing;
                    {
                        let pipe = pipe_requests(&mut from_routing, to_agent);
                        tokio::pin!(pipe);
                        tokio::select! {
                            () = &mut pipe => {
                                requests_ended.cancel();
                                return;
                            }
                            () = responses_ended.cancelled() => {}
                        }
                        // The response ended: what the routing kas still sends (its CloseSend,
                        // following at once) goes on to agentk, so that the exchange ends cleanly
                        // and agentk's tunnel can be reused. Then the agent's tunnel is released
                        // (`to_agent` dropped with the pipe).
                        let _ = tokio::time::timeout(RELAY_END_WAIT, &mut pipe).await;
                    }
                    // The routing kas's side is read to its end, not reset.
                    crate::tunnel::read_to_end(from_routing).await;
                }
            },
            span,
        ));
        let mut response =
            Response::new(Box::pin(responses(from_agent, requests_ended, responses_ended.drop_guard()))
                as Self::ForwardTunnelStream);
        response
            .metadata_mut()
            .insert(kas_proto::metadata::HOP_RESPONSE_CREDIT, tonic::metadata::MetadataValue::from_static("1"));
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
