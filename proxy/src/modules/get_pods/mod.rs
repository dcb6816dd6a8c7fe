//! GetPods, kas half: route to an agentk replica, send the request through its tunnel, decode.

pub mod rest;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use kas_proto::kas::{GetPodsRequest, GetPodsResponse};
use kas_proto::tunnel::pb::MetadataValues;
use kas_proto::{AgentId, ConnectionId, get_pods};
use prost::Message;

use crate::error::KasError;
use crate::router::{Router, Target};

/// Where the call came from: the external API routes (and waits); the internal API uses local
/// tunnels only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    External,
    LocalOnly,
}

pub async fn get_pods(
    router: &Router,
    scope: Scope,
    request: GetPodsRequest,
    mut metadata: BTreeMap<String, MetadataValues>,
    deadline: Option<Duration>,
) -> Result<GetPodsResponse, KasError> {
    let request_id = kas_proto::metadata::ensure_request_id(&mut metadata);
    let target = Target::new(AgentId(request.agent_id), ConnectionId(request.connection_id), get_pods::METHOD);
    let tunnel = match scope {
        Scope::External => router.route(&target, deadline).await?,
        Scope::LocalOnly => router.route_local(&target, deadline).await?,
    };
    tracing::debug!(
        %request_id,
        agent_id = request.agent_id,
        connection_id = request.connection_id,
        kas = %router.registry().instance().instance_id,
        ?scope,
        "GetPods routed"
    );
    let response = tunnel.unary(get_pods::METHOD, metadata, Bytes::from(request.encode_to_vec())).await?;
    GetPodsResponse::decode(response.body)
        .map_err(|e| KasError::Tunnel(format!("agentk sent an invalid GetPods response: {e}")))
}

/// The feature's registration (see [`crate::modules::Module`]). Its gRPC methods are the
/// specification's `KasApi.GetPods` and `KasInternal.GetPods`.
pub struct GetPods;

impl super::Module for GetPods {
    fn name(&self) -> &'static str {
        "get_pods"
    }

    fn rest_routes(&self) -> utoipa_axum::router::OpenApiRouter<crate::server::rest::state::RestState> {
        rest::routes()
    }
}
