//! The api listener: `KasApi` for GitLab. Every call carries a GitLab JWT.

use futures::{Stream, StreamExt};
use kas_proto::kas::kas_api_server::KasApi;
use kas_proto::kas::{
    ConnectedAgentsByIdRequest, ConnectedAgentsByIdResponse, ConnectedAgentsForProjectRequest,
    ConnectedAgentsForProjectResponse, GetPodsRequest, GetPodsResponse, KubernetesRequest,
};
use kas_proto::kubernetes_api::{HttpFrame, http_frame};
use kas_proto::{AgentId, ConnectionId, ProjectId};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::JwtVerifier;
use crate::error::KasError;
use crate::modules::get_pods::{self, Scope};
use crate::modules::kubernetes_api;
use crate::router::Router;

pub struct ApiService {
    pub router: Router,
}

/// Rejects calls without a valid JWT, then removes the credential so nothing forwards it.
pub fn jwt_interceptor(verifier: JwtVerifier) -> impl tonic::service::Interceptor + Clone {
    move |mut req: Request<()>| {
        let peer = req.remote_addr().map(|a| a.ip());
        verifier.verify_authorization_from(peer, super::authorization(req.metadata()))?;
        req.metadata_mut().remove(kas_proto::metadata::AUTHORIZATION);
        Ok(req)
    }
}

type FrameStream = std::pin::Pin<Box<dyn Stream<Item = Result<HttpFrame, Status>> + Send>>;

#[tonic::async_trait]
impl KasApi for ApiService {
    type MakeKubernetesRequestStream = FrameStream;

    async fn make_kubernetes_request(
        &self,
        request: Request<Streaming<KubernetesRequest>>,
    ) -> Result<Response<FrameStream>, Status> {
        let metadata = kas_proto::metadata::forwarded(request.metadata());
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.ok_or_else(|| Status::invalid_argument("empty request stream"))?;
        let Some(http_frame::Frame::RequestHead(head)) = first.frame.and_then(|f| f.frame) else {
            return Err(Status::invalid_argument("the first message must carry the request head"));
        };
        let mut exchange = kubernetes_api::start(
            &self.router,
            AgentId::from_wire("agent_id", first.agent_id).map_err(KasError::from)?,
            ConnectionId::from_wire_or_any("connection_id", first.connection_id).map_err(KasError::from)?,
            metadata,
            head,
            None,
        )
        .await?;
        let body = inbound.filter_map(|m| async move {
            match m {
                Ok(KubernetesRequest {
                    frame: Some(HttpFrame { frame: Some(http_frame::Frame::Body(chunk)) }),
                    ..
                }) => Some(Ok(chunk)),
                Ok(_) => None,
                Err(status) => Some(Err(status)),
            }
        });
        let pump = exchange.take_sender().map(|sender| kubernetes_api::pump_body(sender, body));
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
                    .chain(exchange.into_body_stream().map(|chunk| chunk.map(HttpFrame::body).map_err(Status::from)))
                    .boxed(),
                Err(status) => futures::stream::once(async move { Err(status) }).boxed(),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn connected_agents_for_project(
        &self,
        request: Request<ConnectedAgentsForProjectRequest>,
    ) -> Result<Response<ConnectedAgentsForProjectResponse>, Status> {
        let project_id = ProjectId::from_wire("project_id", request.into_inner().project_id).map_err(KasError::from)?;
        let agents = self.router.registry().connections_by_project_id(project_id).await.map_err(KasError::from)?;
        Ok(Response::new(ConnectedAgentsForProjectResponse { agents }))
    }

    async fn connected_agents_by_id(
        &self,
        request: Request<ConnectedAgentsByIdRequest>,
    ) -> Result<Response<ConnectedAgentsByIdResponse>, Status> {
        let agent_id = AgentId::from_wire("agent_id", request.into_inner().agent_id).map_err(KasError::from)?;
        let agents = self.router.registry().connections_by_agent_id(agent_id).await.map_err(KasError::from)?;
        Ok(Response::new(ConnectedAgentsByIdResponse { agents }))
    }

    async fn get_pods(&self, request: Request<GetPodsRequest>) -> Result<Response<GetPodsResponse>, Status> {
        let deadline = super::grpc_timeout(request.metadata());
        let metadata = kas_proto::metadata::forwarded(request.metadata());
        let response =
            get_pods::get_pods(&self.router, Scope::External, request.into_inner(), metadata, deadline).await?;
        Ok(Response::new(response))
    }
}
