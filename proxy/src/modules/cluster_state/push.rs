//! agentk's stream of views (`ClusterStateAgent.Push`, agent token, agent listener): applied to
//! the agent's state on this kas while it lasts; the registry names this kas as the holder.

use std::sync::Arc;

use kas_proto::cluster_state::cluster_state_agent_server::ClusterStateAgent;
use kas_proto::cluster_state::{PushRequest, PushResponse};
use tonic::{Request, Response, Status, Streaming};

use super::hub::{ClusterStateHub, HOLDER_REFRESH};
use super::store::AgentState;
use crate::auth::agent_auth::AgentAuthenticator;
use crate::error::KasError;

pub struct PushService {
    pub auth: Arc<AgentAuthenticator>,
    pub hub: Arc<ClusterStateHub>,
}

/// Marks the state not live when the stream ends, however it ends (tonic drops the handler's
/// future when agentk goes away).
struct StreamOpen(Arc<AgentState>);

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.stream_closed();
    }
}

/// What a push message must hold (INVALID_ARGUMENT naming the field otherwise).
fn validate(message: &PushRequest) -> Result<(), KasError> {
    for (i, update) in message.updates.iter().enumerate() {
        let Some(resource) = &update.resource else {
            return Err(KasError::InvalidArgument(format!("PushRequest.updates[{i}].resource is missing")));
        };
        if resource.resource.is_empty() || resource.version.is_empty() {
            return Err(KasError::InvalidArgument(format!(
                "PushRequest.updates[{i}].resource needs a version and a resource name"
            )));
        }
        if let Some(j) = update.upserts.iter().position(|o| o.name.is_empty()) {
            return Err(KasError::InvalidArgument(format!("PushRequest.updates[{i}].upserts[{j}].name is empty")));
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl ClusterStateAgent for PushService {
    async fn push(&self, request: Request<Streaming<PushRequest>>) -> Result<Response<PushResponse>, Status> {
        let identity = self.auth.authenticate(&request).await?;
        let agent_id = identity.agent_id;
        let hub = &self.hub;
        let state = hub.states.get_or_create(agent_id);
        state.stream_opened();
        let _open = StreamOpen(state.clone());
        hub.claim(agent_id).await;
        tracing::info!(agent_id = %agent_id, "agentk's cluster state stream opened");
        let mut messages = request.into_inner();
        let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + HOLDER_REFRESH, HOLDER_REFRESH);
        loop {
            tokio::select! {
                // agentk reconnects to another kas.
                () = hub.shutdown.cancelled() => return Ok(Response::new(PushResponse {})),
                _ = refresh.tick() => {
                    hub.claim(agent_id).await;
                    super::metrics::held(hub.states.len(), hub.states.views());
                }
                message = messages.message() => match message {
                    Ok(Some(message)) => {
                        validate(&message)?;
                        let applied = state.apply(message);
                        super::metrics::pushed(applied.events);
                        // What the agent configuration allows (`cluster_state.resources`), so
                        // only a broken or hostile agentk reaches it.
                        if state.resource_count() > crate::agent::cluster_state::MAX_RESOURCES {
                            return Err(KasError::ResourceExhausted(format!(
                                "agent {agent_id} pushed more than {} resources (cluster_state.resources allows no more)",
                                crate::agent::cluster_state::MAX_RESOURCES
                            ))
                            .into());
                        }
                        let held = state.object_count();
                        if held > hub.config.max_objects_per_agent {
                            return Err(KasError::ResourceExhausted(format!(
                                "agent {agent_id} pushed {held} object views, more than cluster_state.max_objects_per_agent ({}); \
                                 observe fewer resources or namespaces",
                                hub.config.max_objects_per_agent
                            ))
                            .into());
                        }
                    }
                    Ok(None) => {
                        tracing::info!(agent_id = %agent_id, "agentk ended its cluster state stream");
                        return Ok(Response::new(PushResponse {}));
                    }
                    Err(status) => {
                        tracing::debug!(agent_id = %agent_id, error = %status.message(), "agentk's cluster state stream broke");
                        return Err(status);
                    }
                },
            }
        }
    }
}
