//! The api listener: `KasApi` for GitLab. Every call carries a GitLab JWT. Each method is a call
//! into the feature (`modules/`) that implements it.

use kas_proto::kas::kas_api_server::KasApi;
use kas_proto::kas::{
    ConnectedAgentsByIdRequest, ConnectedAgentsByIdResponse, ConnectedAgentsForProjectRequest,
    ConnectedAgentsForProjectResponse, GetGitopsStatusRequest, GetGitopsStatusResponse, GetPodsRequest,
    GetPodsResponse, GitPushEventRequest, GitPushEventResponse, KubernetesRequest,
};
use kas_proto::{AgentId, ProjectId};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::JwtVerifier;
use crate::error::KasError;
use crate::modules::get_pods::{self, Scope};
use crate::modules::{connected_agents, gitops, kubernetes_api};
use crate::router::Router;

pub struct ApiService {
    pub router: Router,
    pub gitops: std::sync::Arc<gitops::state::GitopsState>,
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

use kubernetes_api::grpc::FrameStream;

#[tonic::async_trait]
impl KasApi for ApiService {
    type MakeKubernetesRequestStream = FrameStream;

    async fn make_kubernetes_request(
        &self,
        request: Request<Streaming<KubernetesRequest>>,
    ) -> Result<Response<FrameStream>, Status> {
        kubernetes_api::grpc::make_kubernetes_request(&self.router, request).await
    }

    async fn connected_agents_for_project(
        &self,
        request: Request<ConnectedAgentsForProjectRequest>,
    ) -> Result<Response<ConnectedAgentsForProjectResponse>, Status> {
        let project_id = ProjectId::from_wire("project_id", request.into_inner().project_id).map_err(KasError::from)?;
        let agents = connected_agents::by_project_id(&self.router, project_id).await?;
        Ok(Response::new(ConnectedAgentsForProjectResponse { agents }))
    }

    async fn connected_agents_by_id(
        &self,
        request: Request<ConnectedAgentsByIdRequest>,
    ) -> Result<Response<ConnectedAgentsByIdResponse>, Status> {
        let agent_id = AgentId::from_wire("agent_id", request.into_inner().agent_id).map_err(KasError::from)?;
        let agents = connected_agents::by_agent_id(&self.router, agent_id).await?;
        Ok(Response::new(ConnectedAgentsByIdResponse { agents }))
    }

    async fn get_pods(&self, request: Request<GetPodsRequest>) -> Result<Response<GetPodsResponse>, Status> {
        let deadline = super::grpc_timeout(request.metadata());
        let metadata = kas_proto::metadata::forwarded(request.metadata());
        let response =
            get_pods::get_pods(&self.router, Scope::External, request.into_inner(), metadata, deadline).await?;
        Ok(Response::new(response))
    }

    async fn get_gitops_status(
        &self,
        request: Request<GetGitopsStatusRequest>,
    ) -> Result<Response<GetGitopsStatusResponse>, Status> {
        let agent_id = AgentId::from_wire("agent_id", request.into_inner().agent_id).map_err(KasError::from)?;
        Ok(Response::new(gitops::status::status(&self.gitops, agent_id).await?))
    }

    async fn git_push_event(
        &self,
        request: Request<GitPushEventRequest>,
    ) -> Result<Response<GitPushEventResponse>, Status> {
        let event = request.into_inner().event.unwrap_or_default();
        gitops::push::publish(&self.gitops, event.project.as_ref()).await?;
        Ok(Response::new(GitPushEventResponse {}))
    }
}
