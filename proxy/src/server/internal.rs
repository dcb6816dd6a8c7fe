//! The internal listener: `KasInternal` for other kas. Its own secret; requests name the agent
//! connection and are served from local tunnels only (no discovery, so no routing cycles).

use futures::StreamExt;
use kas_proto::kas::kas_internal_server::KasInternal;
use kas_proto::kas::{GetPodsRequest, GetPodsResponse};
use kas_proto::metadata::{HOP_AGENT_ID, HOP_CONNECTION_ID, HOP_METHOD};
use kas_proto::tunnel::pb::{ConnectRequest, ConnectResponse};
use kas_proto::{AgentId, ConnectionId};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::error::KasError;
use crate::modules::get_pods::{self, Scope};
use crate::router::{Router, Target};
use crate::tunnel::{TunnelReceiver, TunnelSender};

/// Frames buffered towards the routing kas (each at most one body chunk); HTTP/2 flow control
/// does the rest.
const FORWARD_BUFFER: usize = kas_proto::flow::HOP_BUFFER;

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
async fn pipe_requests(mut from_routing: Streaming<ConnectResponse>, to_agent: TunnelSender) {
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

/// agentk -> routing kas: response frames until the response ends.
async fn pipe_responses(mut from_agent: TunnelReceiver, to_routing: mpsc::Sender<Result<ConnectRequest, Status>>) {
    loop {
        match from_agent.recv().await {
            Ok(Some(msg)) => {
                if to_routing.send(Ok(ConnectRequest { msg: Some(msg) })).await.is_err() {
                    return; // the routing kas went away; dropping the tunnel cancels agentk's work
                }
                if from_agent.is_done() {
                    return;
                }
            }
            Ok(None) => {
                let _ = to_routing
                    .send(Err(Status::unavailable("agentk closed the tunnel before the response ended")))
                    .await;
                return;
            }
            Err(e) => {
                let _ = to_routing.send(Err(Status::unavailable(e.to_string()))).await;
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl KasInternal for InternalService {
    type ForwardTunnelStream = ReceiverStream<Result<ConnectRequest, Status>>;

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
        let tunnel = self.router.route_local(&target, deadline).await?;
        let (to_agent, from_agent) = tunnel.split();
        let (tx, rx) = mpsc::channel(FORWARD_BUFFER);
        let from_routing = request.into_inner();
        let span = tracing::debug_span!(
            "forward",
            agent_id = %target.agent_id,
            connection_id = %target.connection_id,
            kas = %self.router.registry().instance().instance_id
        );
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                // Whichever side ends first ends the exchange: the response is complete, or the
                // routing kas went away (its caller cancelled) and the agent's tunnel must be
                // dropped so agentk cancels the API server request. The request side does not end
                // at CloseSend: it waits for the routing kas to close the stream.
                tokio::select! {
                    () = pipe_requests(from_routing, to_agent) => {}
                    () = pipe_responses(from_agent, tx) => {}
                }
            },
            span,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
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
