//! The api listener: `KasApi` for GitLab. Every call carries a GitLab JWT.

use kas_proto::kas::kas_api_server::KasApi;
use kas_proto::kas::{
    ConnectedAgentsByIdRequest, ConnectedAgentsByIdResponse, ConnectedAgentsForProjectRequest,
    ConnectedAgentsForProjectResponse, GetPodsRequest, GetPodsResponse,
};
use kas_proto::{AgentId, ProjectId};
use tonic::{Request, Response, Status};

use crate::auth::JwtVerifier;
use crate::error::KasError;
use crate::modules::get_pods::{self, Scope};
use crate::router::Router;

pub struct ApiService {
    pub router: Router,
}

/// Rejects calls without a valid JWT, then removes the credential so nothing forwards it.
pub fn jwt_interceptor(verifier: JwtVerifier) -> impl tonic::service::Interceptor + Clone {
    move |mut req: Request<()>| {
        verifier.verify_authorization(super::authorization(req.metadata()))?;
        req.metadata_mut().remove(kas_proto::metadata::AUTHORIZATION);
        Ok(req)
    }
}

fn positive(name: &str, v: i64) -> Result<(), KasError> {
    if v <= 0 {
        return Err(KasError::InvalidArgument(format!("{name} must be a positive integer, got {v}")));
    }
    Ok(())
}

#[tonic::async_trait]
impl KasApi for ApiService {
    async fn connected_agents_for_project(
        &self,
        request: Request<ConnectedAgentsForProjectRequest>,
    ) -> Result<Response<ConnectedAgentsForProjectResponse>, Status> {
        let project_id = request.into_inner().project_id;
        positive("project_id", project_id)?;
        let agents = self
            .router
            .registry()
            .connections_by_project_id(ProjectId(project_id))
            .await
            .map_err(|e| KasError::Registry(e.0))?;
        Ok(Response::new(ConnectedAgentsForProjectResponse { agents }))
    }

    async fn connected_agents_by_id(
        &self,
        request: Request<ConnectedAgentsByIdRequest>,
    ) -> Result<Response<ConnectedAgentsByIdResponse>, Status> {
        let agent_id = request.into_inner().agent_id;
        positive("agent_id", agent_id)?;
        let agents = self
            .router
            .registry()
            .connections_by_agent_id(AgentId(agent_id))
            .await
            .map_err(|e| KasError::Registry(e.0))?;
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
