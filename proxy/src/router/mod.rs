//! The router: the one path every agent-bound call takes.
//!
//! It finds a tunnel for (agent, connection, method): an idle local tunnel at once, else it
//! waits until one appears, until the caller's deadline, or until the configured maximum wait;
//! then it says plainly whether the agent is not connected or just busy.

use std::sync::Arc;
use std::time::Duration;

use kas_proto::{AgentId, ConnectionId};
use tokio::time::Instant;

use crate::error::KasError;
use crate::registry::AgentRegistry;
use crate::tunnel::{IdleTunnel, TunnelQuery, TunnelRegistry};

/// How long a request waits for an agent when the caller sets no shorter deadline: long enough
/// to ride out an agentk restart, short enough that a caller is not left hanging.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(20);

/// How much earlier than the caller's deadline the wait ends (at most 10% of the deadline).
const DEADLINE_MARGIN: Duration = Duration::from_millis(50);

#[derive(Clone)]
pub struct Router {
    tunnels: TunnelRegistry,
    registry: Arc<dyn AgentRegistry>,
    max_wait: Duration,
}

/// Where a call must go.
#[derive(Debug, Clone)]
pub struct Target {
    pub agent_id: AgentId,
    pub connection_id: ConnectionId,
    pub method: &'static str,
}

impl Target {
    pub fn validate(&self) -> Result<(), KasError> {
        if self.agent_id.0 <= 0 {
            return Err(KasError::InvalidArgument(format!(
                "agent_id must be a positive integer, got {}",
                self.agent_id
            )));
        }
        if self.connection_id.0 < 0 {
            return Err(KasError::InvalidArgument(format!(
                "connection_id must be 0 (any) or a positive integer, got {}",
                self.connection_id
            )));
        }
        Ok(())
    }

    fn query(&self) -> TunnelQuery {
        TunnelQuery { agent_id: self.agent_id, connection_id: self.connection_id, method: self.method.to_owned() }
    }
}

impl Router {
    pub fn new(tunnels: TunnelRegistry, registry: Arc<dyn AgentRegistry>, max_wait: Duration) -> Self {
        Self { tunnels, registry, max_wait }
    }

    /// Finds a tunnel for an external call (GitLab, REST): waits for the agent if needed.
    pub async fn route(&self, target: &Target, caller_deadline: Option<Duration>) -> Result<IdleTunnel, KasError> {
        target.validate()?;
        let (wait, caller_bound) = match caller_deadline {
            // End a little early: tonic's server enforces grpc-timeout too, and when it fires
            // first the caller gets a bare CANCELLED instead of this router's explanation.
            Some(d) if d < self.max_wait => (d.saturating_sub(DEADLINE_MARGIN.min(d / 10)), true),
            _ => (self.max_wait, false),
        };
        let started = Instant::now();
        match tokio::time::timeout(wait, self.tunnels.find(target.query())).await {
            Ok(Ok(tunnel)) => {
                tracing::debug!(agent_id = %target.agent_id, connection_id = %tunnel.connection_id, method = target.method, waited = ?started.elapsed(), "routed to local tunnel");
                Ok(tunnel)
            }
            Ok(Err(_stopped)) => Err(KasError::ShuttingDown),
            Err(_elapsed) => Err(self.explain_timeout(target, started.elapsed(), caller_bound).await),
        }
    }

    /// Finds a tunnel of a connection this kas must hold itself (KasInternal: no discovery).
    pub async fn route_local(
        &self,
        target: &Target,
        caller_deadline: Option<Duration>,
    ) -> Result<IdleTunnel, KasError> {
        target.validate()?;
        if target.connection_id.is_any() {
            return Err(KasError::InvalidArgument("connection_id is required on the internal API".into()));
        }
        let here = self
            .tunnels
            .has_connection(target.agent_id, target.connection_id)
            .await
            .map_err(|_| KasError::ShuttingDown)?;
        if !here {
            return Err(KasError::NotHere { agent_id: target.agent_id, connection_id: target.connection_id });
        }
        self.route(target, caller_deadline).await
    }

    async fn explain_timeout(&self, target: &Target, waited: Duration, caller_bound: bool) -> KasError {
        if caller_bound {
            return KasError::DeadlineExceeded { agent_id: target.agent_id, waited };
        }
        let connected = match self.registry.connections_by_agent_id(target.agent_id).await {
            Ok(conns) => {
                conns.iter().any(|c| target.connection_id.is_any() || c.connection_id == target.connection_id.0)
            }
            Err(e) => {
                tracing::warn!(agent_id = %target.agent_id, error = %e, "registry lookup failed after waiting");
                false
            }
        };
        match (connected, target.connection_id.is_any()) {
            (true, _) => KasError::AgentBusy { agent_id: target.agent_id, waited },
            (false, true) => KasError::AgentNotConnected { agent_id: target.agent_id, waited },
            (false, false) => KasError::ConnectionNotConnected {
                agent_id: target.agent_id,
                connection_id: target.connection_id,
                waited,
            },
        }
    }

    pub fn registry(&self) -> &Arc<dyn AgentRegistry> {
        &self.registry
    }

    pub fn tunnels(&self) -> &TunnelRegistry {
        &self.tunnels
    }
}
