//! The internal listener: `KasInternal` for other kas. Its own secret; requests name the agent
//! connection and are served from local tunnels only (no discovery, so no routing cycles).

use kas_proto::kas::kas_internal_server::KasInternal;
use kas_proto::kas::{GetPodsRequest, GetPodsResponse};
use tonic::{Request, Response, Status};

use crate::modules::get_pods::{self, Scope};
use crate::router::Router;

pub struct InternalService {
    pub router: Router,
}

#[tonic::async_trait]
impl KasInternal for InternalService {
    async fn get_pods(&self, request: Request<GetPodsRequest>) -> Result<Response<GetPodsResponse>, Status> {
        let deadline = super::grpc_timeout(request.metadata());
        let metadata = kas_proto::metadata::forwarded(request.metadata());
        let response =
            get_pods::get_pods(&self.router, Scope::LocalOnly, request.into_inner(), metadata, deadline).await?;
        Ok(Response::new(response))
    }
}
