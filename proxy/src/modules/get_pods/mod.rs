//! GetPods, kas half: route to an agentk replica, send the request through its tunnel, decode.

use std::collections::HashMap;
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
    metadata: HashMap<String, MetadataValues>,
    deadline: Option<Duration>,
) -> Result<GetPodsResponse, KasError> {
    let target = Target::new(AgentId(request.agent_id), ConnectionId(request.connection_id), get_pods::METHOD);
    let tunnel = match scope {
        Scope::External => router.route(&target, deadline).await?,
        Scope::LocalOnly => router.route_local(&target, deadline).await?,
    };
    let response = tunnel.unary(get_pods::METHOD, metadata, Bytes::from(request.encode_to_vec())).await?;
    GetPodsResponse::decode(response.body)
        .map_err(|e| KasError::Tunnel(format!("agentk sent an invalid GetPods response: {e}")))
}
