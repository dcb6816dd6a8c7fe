//! `KasApi.MakeKubernetesRequest`: the Kubernetes API proxy for gRPC callers (GitLab).

use futures::{Stream, StreamExt};
use kas_proto::kas::KubernetesRequest;
use kas_proto::kubernetes_api::{HttpFrame, METHOD, http_frame};
use kas_proto::{AgentId, ConnectionId};
use tonic::{Request, Response, Status, Streaming};

use crate::error::KasError;
use crate::router::{Router, Target};

/// The response stream: the response head, then body chunks.
pub type FrameStream = std::pin::Pin<Box<dyn Stream<Item = Result<HttpFrame, Status>> + Send>>;

pub async fn make_kubernetes_request(
    router: &Router,
    request: Request<Streaming<KubernetesRequest>>,
) -> Result<Response<FrameStream>, Status> {
    let metadata = kas_proto::metadata::forwarded(request.metadata());
    let mut inbound = request.into_inner();
    let first = inbound.message().await?.ok_or_else(|| Status::invalid_argument("empty request stream"))?;
    let Some(http_frame::Frame::RequestHead(head)) = first.frame.and_then(|f| f.frame) else {
        return Err(Status::invalid_argument("the first message must carry the request head"));
    };
    let target = Target::new(
        AgentId::from_wire("agent_id", first.agent_id).map_err(KasError::from)?,
        ConnectionId::from_wire_or_any("connection_id", first.connection_id).map_err(KasError::from)?,
        METHOD,
    );
    let mut exchange = super::start(router, target, metadata, super::RequestHead::Raw(head), None, false).await?;
    let body = inbound.filter_map(|m| async move {
        match m {
            Ok(KubernetesRequest {
                frame: Some(HttpFrame { frame: Some(http_frame::Frame::Body(chunk)) }), ..
            }) => Some(Ok(chunk)),
            Ok(_) => None,
            Err(status) => Some(Err(status)),
        }
    });
    let pump = exchange.take_sender().map(|sender| super::pump_body(sender, body));
    // Routing errors (agent not connected, bad request) failed the call above. From here on
    // the stream is returned at once: a gRPC client sends its request body only after the
    // response headers, and the API server answers only after the body. The response head
    // is the stream's first item; failures after routing arrive as the stream's status.
    let stream = futures::stream::once(async move {
        let head = exchange.response_head().await.map_err(Status::from)?;
        Ok::<_, Status>((head, exchange))
    })
    .flat_map(move |first| {
        let _pump = &pump;
        match first {
            Ok((head, exchange)) => futures::stream::once(async move { Ok(HttpFrame::response_head(head)) })
                .chain(exchange.into_body_stream(None).map(|chunk| chunk.map(HttpFrame::body).map_err(Status::from)))
                .boxed(),
            Err(status) => futures::stream::once(async move { Err(status) }).boxed(),
        }
    });
    Ok(Response::new(Box::pin(stream)))
}
