//! The agent listener: `AgentTunnel` (GetConfiguration = presence, Connect = tunnels).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kas_proto::kas::ConnectedAgentInfo;
use kas_proto::tunnel::FrameOrder;
use kas_proto::tunnel::pb::agent_tunnel_server::AgentTunnel;
use kas_proto::tunnel::pb::{self, ConfigurationRequest, ConnectRequest, ConnectResponse, connect_request};
use kas_proto::{AgentId, ConnectionId};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::admission::Admission;
use crate::auth::agent_auth::AgentAuthenticator;
use crate::error::KasError;
use crate::modules::configuration::{ConfigurationSource, is_pushed};
use crate::registry::{AgentRegistry, next_git_push};
use crate::tunnel::{TunnelIo, TunnelRegistry};

/// A tunnel must describe itself promptly; a silent stream only holds resources.
const DESCRIPTOR_TIMEOUT: Duration = Duration::from_secs(10);
/// Frames buffered towards agentk per tunnel (each at most one body chunk); HTTP/2 flow control
/// does the rest.
const TUNNEL_SEND_BUFFER: usize = kas_proto::flow::HOP_BUFFER;

pub struct AgentService {
    pub configurations: Arc<dyn ConfigurationSource>,
    /// How often an open presence stream re-reads the configuration (jittered ±10 %).
    pub configuration_poll_period: Duration,
    pub registry: Arc<dyn AgentRegistry>,
    pub tunnels: TunnelRegistry,
    pub shutdown: CancellationToken,
    /// Presence streams end cleanly at this age (±10% jitter).
    pub max_connection_age: Duration,
    /// New presence streams per agent per minute (tunnels do not count), counted once admitted.
    pub connections_per_minute: u64,
    /// The accept rate of new presence streams on this kas (sheds before anything is verified).
    pub admission: Admission,
    /// Failed agent-token authentications: counted, logged (rate-limited), bounded per peer.
    /// Agent tokens, with failed attempts bounded per peer (shared with the features' agent
    /// services).
    pub auth: Arc<AgentAuthenticator>,
}

/// The window of the agent connection rate limit.
const CONNECTION_RATE_WINDOW: Duration = Duration::from_secs(60);

/// `period` ± 10 %, so presence streams opened together do not poll together (Git) or end
/// together (maximum connection age).
fn jittered(period: Duration) -> Duration {
    period.mul_f64(rand::random_range(0.9..=1.1))
}

fn now() -> prost_types::Timestamp {
    prost_types::Timestamp::from(std::time::SystemTime::now())
}

/// The configuration as this agent receives it: with its agent id (agentk names its GitOps Lease
/// and inventories after it). The commit id stays the document's.
fn for_agent(mut response: pb::ConfigurationResponse, agent_id: AgentId) -> pb::ConfigurationResponse {
    response.configuration.get_or_insert_with(Default::default).agent_id = agent_id.0;
    response
}

/// A response stream whose items travel boxed through their channel: tokio's channel allocates
/// 32 slots up front and every connected agent holds one per stream (see [`crate::tunnel::ToAgentItem`]).
type Unboxed<T> = futures::stream::Map<ReceiverStream<Box<T>>, fn(Box<T>) -> T>;

fn unboxed<T>(rx: mpsc::Receiver<Box<T>>) -> Unboxed<T> {
    ReceiverStream::new(rx).map((|item: Box<T>| *item) as fn(Box<T>) -> T)
}

#[tonic::async_trait]
impl AgentTunnel for AgentService {
    type GetConfigurationStream = Unboxed<Result<pb::ConfigurationResponse, Status>>;
    type ConnectStream = Unboxed<Result<ConnectResponse, Status>>;

    async fn get_configuration(
        &self,
        request: Request<ConfigurationRequest>,
    ) -> Result<Response<Self::GetConfigurationStream>, Status> {
        // Shed first (no verification, not counted against the agent) when kas is at its rate.
        let agent = self.auth.authenticate_admitted(&request, || Ok(self.admission.admit()?)).await?;
        let req = request.into_inner();
        let connection_id = ConnectionId::from_wire("connection_id", req.connection_id).map_err(KasError::from)?;
        let agent_id = agent.agent_id;
        // Only presence streams count: tunnels are opened per request and must never be limited.
        // Only admitted ones: an agent shed while kas is busy (a failover) did nothing wrong.
        match self.registry.count_connection(agent_id, CONNECTION_RATE_WINDOW).await {
            Ok(counts) if counts.sliding_estimate() > self.connections_per_minute => {
                return Err(Status::resource_exhausted(format!(
                    "agent {agent_id} opened {} connections in the last minute; the limit is {} \
                     (limits.agent_connections_per_minute)",
                    counts.sliding_estimate(),
                    self.connections_per_minute
                )));
            }
            Ok(_) => {}
            // The registry is down: do not lock agents out for it.
            Err(e) => tracing::warn!(%agent_id, error = %e, "counting the agent connection failed"),
        }
        // Subscribed before the first read: a push during it is not lost.
        let mut pushes = self.registry.subscribe_git_pushes();
        let first = for_agent(self.configurations.configuration(&agent).await?, agent.agent_id);
        match self.tunnels.connection_up(agent_id, connection_id).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(Status::already_exists(format!(
                    "connection {connection_id} of agent {agent_id} is already connected"
                )));
            }
            Err(_) => return Err(Status::unavailable("kas is shutting down")),
        }
        let meta = req.agent_meta.unwrap_or_default();
        let pod = format!("{}/{}", meta.pod_namespace, meta.pod_name);
        let info = ConnectedAgentInfo {
            id: agent_id.0,
            connection_id: connection_id.0,
            version: meta.version,
            commit: meta.commit,
            pod_namespace: meta.pod_namespace,
            pod_name: meta.pod_name,
            connected_at: Some(now()),
            // The registry stamps its kas instance id and internal address.
            kas_address: None,
            kas_instance_id: String::new(),
            project_id: agent.project_id.0,
        };
        // A registry failure must not stop local service: the record is rewritten on refresh.
        if let Err(e) = self.registry.register(info).await {
            tracing::warn!(%agent_id, %connection_id, error = %e, "registering connection failed");
        }
        tracing::info!(%agent_id, %connection_id, pod = %pod, "agent connected");

        let (tx, rx) = mpsc::channel(1);
        let registry = self.registry.clone();
        let tunnels = self.tunnels.clone();
        let shutdown = self.shutdown.clone();
        let project_id = agent.project_id;
        let configurations = self.configurations.clone();
        let poll_period = self.configuration_poll_period;
        // The connection ends cleanly at its maximum age (jittered), so agentk reconnects
        // (to its next kas address) and load rebalances after a scale-out.
        let ends_at = tokio::time::Instant::now() + jittered(self.max_connection_age);
        tokio::spawn(async move {
            let mut last_commit = req.commit_id;
            if first.commit_id != last_commit {
                last_commit.clone_from(&first.commit_id);
                let _ = tx.send(Box::new(Ok(first))).await;
            }
            loop {
                let since = tokio::select! {
                    () = tx.closed() => break,
                    // Ending the stream tells agentk to reconnect, to another kas when there is one.
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep_until(ends_at) => {
                        tracing::info!(%agent_id, %connection_id, "agent connection reached its maximum age; ending it");
                        break;
                    }
                    () = tokio::time::sleep(jittered(poll_period)) => None,
                    // A push to the configuration project: read it now, not at the next period.
                    pushed = next_git_push(&mut pushes, |push| is_pushed(&agent, push)) => Some(pushed),
                };
                // Boxed: the loop's future lives as long as the connection, and holding the read
                // inline would size it for the read's state (memory per idle agent).
                match Box::pin(configurations.configuration_since(&agent, since)).await.map(|c| for_agent(c, agent_id))
                {
                    Ok(update) if update.commit_id != last_commit => {
                        tracing::info!(%agent_id, commit_id = %update.commit_id, "agent configuration changed");
                        last_commit.clone_from(&update.commit_id);
                        if tx.send(Box::new(Ok(update))).await.is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    // An invalid file ends the stream; agentk keeps its last good configuration.
                    Err(e @ crate::error::KasError::InvalidAgentConfiguration(_)) => {
                        tracing::warn!(%agent_id, error = %e, "invalid agent configuration");
                        let _ = tx.send(Box::new(Err(e.into()))).await;
                        break;
                    }
                    // Transient (repository unreadable): keep the connection, try next period.
                    Err(e) => tracing::warn!(%agent_id, error = %e, "reading the agent configuration failed"),
                }
            }
            drop(tx);
            disconnect(&*registry, &tunnels, agent_id, project_id, connection_id).await;
        });
        Ok(Response::new(unboxed(rx)))
    }

    async fn connect(
        &self,
        request: Request<Streaming<ConnectRequest>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let agent = self.auth.authenticate(&request).await?;
        let mut inbound = request.into_inner();
        let first = match tokio::time::timeout(DESCRIPTOR_TIMEOUT, inbound.message()).await {
            Err(_) => return Err(Status::deadline_exceeded("no Descriptor received within 10s")),
            Ok(Err(status)) => return Err(status),
            Ok(Ok(None)) => return Err(Status::invalid_argument("tunnel closed before its Descriptor")),
            Ok(Ok(Some(frame))) => frame,
        };
        let mut order = FrameOrder::new();
        order.response(first.kind()?)?;
        let Some(connect_request::Msg::Descriptor(descriptor)) = first.msg else {
            return Err(Status::internal("frame order accepted a non-descriptor first frame"));
        };
        let connection_id =
            ConnectionId::from_wire("Descriptor.connection_id", descriptor.connection_id).map_err(KasError::from)?;
        if descriptor.methods.is_empty() {
            return Err(Status::invalid_argument("Descriptor.methods must name at least one method"));
        }
        let (tx, rx) = mpsc::channel(TUNNEL_SEND_BUFFER);
        let (io, closed) = TunnelIo::local(tx, inbound.boxed(), order, descriptor.response_credit);
        self.tunnels.register(agent.agent_id, connection_id, descriptor.methods, io, closed, descriptor.reusable);
        Ok(Response::new(unboxed(rx)))
    }
}

async fn disconnect(
    registry: &dyn AgentRegistry,
    tunnels: &TunnelRegistry,
    agent_id: AgentId,
    project_id: kas_proto::ProjectId,
    connection_id: ConnectionId,
) {
    tunnels.connection_down(agent_id, connection_id);
    if let Err(e) = registry.unregister(agent_id, project_id, connection_id).await {
        tracing::warn!(%agent_id, %connection_id, error = %e, "unregistering connection failed");
    }
    tracing::info!(%agent_id, %connection_id, "agent disconnected");
}
