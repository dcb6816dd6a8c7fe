//! The one error type of kas and the one table mapping it to gRPC codes and HTTP statuses.

use std::time::Duration;

use kas_proto::{AgentId, ConnectionId};
use tonic::Code;

/// Every error a caller of kas can observe.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KasError {
    /// The caller's credentials are missing or invalid (message says which check failed).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller is known but not allowed (GitLab answered 403 for an agent token).
    #[error("{0}")]
    PermissionDenied(String),
    /// GitLab could not answer (down, timed out, rate limited, unexpected status). The message
    /// names the reason; it never carries a token.
    #[error("GitLab is unavailable: {0}")]
    GitlabUnavailable(String),
    /// The agent's configuration file is invalid (too large, unknown keys, bad YAML).
    #[error("{0}")]
    InvalidAgentConfiguration(String),
    /// A configuration repository could not be read or fetched (transient).
    #[error("{0}")]
    GitUnavailable(String),
    /// kas's own rate limit (towards GitLab or Git servers) refused the request. Not an answer
    /// from the backend, so never cached beyond concurrent callers.
    #[error("{0}")]
    RateLimited(String),
    /// The request itself is malformed (bad id, bad parameter).
    #[error("{0}")]
    InvalidArgument(String),
    /// The request (a message, a body) is larger than a documented limit.
    #[error("{0}")]
    TooLarge(String),
    /// No connection of the agent appeared before the wait ended.
    #[error("agent {agent_id} is not connected (waited {} for it to connect)", Rounded(*.waited))]
    AgentNotConnected { agent_id: AgentId, waited: Duration },
    /// No connection of the agent exists and no kas has seen one within the registry TTL, on a
    /// path that does not wait for such agents (the Kubernetes API proxy: kubectl's discovery
    /// would otherwise wait `routing.max_wait` per request).
    #[error(
        "agent {agent_id} is not connected to kas, and no kas has seen it connected within registry.ttl; \
         is agentk running, and is its token for this agent?"
    )]
    AgentNotSeen { agent_id: AgentId },
    /// The named connection does not exist (anywhere the router looked).
    #[error("connection {connection_id} of agent {agent_id} is not connected (waited {})", Rounded(*.waited))]
    ConnectionNotConnected { agent_id: AgentId, connection_id: ConnectionId, waited: Duration },
    /// The agent is connected but no tunnel became free before the wait ended.
    #[error("agent {agent_id} is connected but had no free tunnel within {}", Rounded(*.waited))]
    AgentBusy { agent_id: AgentId, waited: Duration },
    /// The caller's own deadline passed while waiting for the agent.
    #[error("deadline exceeded after {} while waiting for agent {agent_id}", Rounded(*.waited))]
    DeadlineExceeded { agent_id: AgentId, waited: Duration },
    /// KasInternal: this kas does not hold the named connection (the routing kas tries another).
    #[error("connection {connection_id} of agent {agent_id} is not connected to this kas")]
    NotHere { agent_id: AgentId, connection_id: ConnectionId },
    /// agentk answered with an error status; code and message come from agentk.
    #[error("agentk: {message}")]
    AgentError { code: Code, message: String },
    /// agentk broke the tunnel protocol or the tunnel broke before the response ended.
    #[error("tunnel to agentk failed: {0}")]
    Tunnel(String),
    /// A registry backend failed.
    #[error("agent registry unavailable: {0}")]
    Registry(String),
    /// kas is shutting down and takes no new requests.
    #[error("kas is shutting down")]
    ShuttingDown,
    /// A concurrency limit was reached (the message names it).
    #[error("{0}")]
    ResourceExhausted(String),
    /// The caller named something that does not exist (e.g. a manifest project the agent's
    /// configuration does not list).
    #[error("{0}")]
    NotFound(String),
    /// Another kas this request needs (the one holding an agent's cluster state) did not answer.
    #[error("{0}")]
    PeerUnavailable(String),
    /// A bug or an unexpected local failure. The detail is logged, never returned.
    #[error("internal error: {0}")]
    Internal(String),
}

impl KasError {
    /// The one table: gRPC code and HTTP status of each error.
    pub fn classify(&self) -> (Code, http::StatusCode) {
        use http::StatusCode as S;
        match self {
            Self::Unauthenticated(_) => (Code::Unauthenticated, S::UNAUTHORIZED),
            Self::PermissionDenied(_) => (Code::PermissionDenied, S::FORBIDDEN),
            Self::GitlabUnavailable(_) => (Code::Unavailable, S::SERVICE_UNAVAILABLE),
            Self::InvalidAgentConfiguration(_) => (Code::FailedPrecondition, S::PRECONDITION_FAILED),
            Self::GitUnavailable(_) | Self::RateLimited(_) => (Code::Unavailable, S::SERVICE_UNAVAILABLE),
            Self::InvalidArgument(_) => (Code::InvalidArgument, S::BAD_REQUEST),
            Self::TooLarge(_) => (Code::OutOfRange, S::PAYLOAD_TOO_LARGE),
            Self::AgentNotConnected { .. } | Self::ConnectionNotConnected { .. } | Self::AgentNotSeen { .. } => {
                (Code::Unavailable, S::SERVICE_UNAVAILABLE)
            }
            Self::AgentBusy { .. } => (Code::Unavailable, S::SERVICE_UNAVAILABLE),
            Self::DeadlineExceeded { .. } => (Code::DeadlineExceeded, S::GATEWAY_TIMEOUT),
            Self::NotHere { .. } => (Code::NotFound, S::NOT_FOUND),
            Self::AgentError { code, .. } => (*code, S::BAD_GATEWAY),
            Self::Tunnel(_) => (Code::Unavailable, S::BAD_GATEWAY),
            Self::Registry(_) => (Code::Unavailable, S::SERVICE_UNAVAILABLE),
            Self::ShuttingDown => (Code::Unavailable, S::SERVICE_UNAVAILABLE),
            Self::ResourceExhausted(_) => (Code::ResourceExhausted, S::TOO_MANY_REQUESTS),
            Self::Internal(_) => (Code::Internal, S::INTERNAL_SERVER_ERROR),
            Self::NotFound(_) => (Code::NotFound, S::NOT_FOUND),
            Self::PeerUnavailable(_) => (Code::Unavailable, S::SERVICE_UNAVAILABLE),
        }
    }

    pub fn grpc_code(&self) -> Code {
        self.classify().0
    }

    pub fn http_status(&self) -> http::StatusCode {
        self.classify().1
    }

    /// The message a caller may see. Internal failures are not described to callers.
    pub fn public_message(&self) -> String {
        match self {
            Self::Internal(_) => "internal error".to_owned(),
            Self::Registry(_) => "agent registry unavailable".to_owned(),
            other => other.to_string(),
        }
    }
}

impl From<kas_proto::InvalidId> for KasError {
    fn from(e: kas_proto::InvalidId) -> Self {
        KasError::InvalidArgument(e.to_string())
    }
}

impl From<crate::registry::RegistryError> for KasError {
    fn from(e: crate::registry::RegistryError) -> Self {
        Self::Registry(e.0)
    }
}

impl From<KasError> for tonic::Status {
    fn from(e: KasError) -> Self {
        if matches!(e, KasError::Internal(_) | KasError::Registry(_)) {
            tracing::error!(error = %e, "request failed");
        }
        tonic::Status::new(e.grpc_code(), e.public_message())
    }
}

/// A duration as people read it in a message: `20s`, `1.5s`, `300ms` (not `20.001183635s`).
pub struct Rounded(pub Duration);

impl std::fmt::Display for Rounded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0.as_millis();
        if ms < 1000 {
            return write!(f, "{ms}ms");
        }
        let tenths = (ms + 50) / 100;
        if tenths.is_multiple_of(10) {
            write!(f, "{}s", tenths / 10)
        } else {
            write!(f, "{}.{}s", tenths / 10, tenths % 10)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_detail_is_not_public() {
        let s: tonic::Status = KasError::Internal("secret path /x".into()).into();
        assert_eq!(s.code(), Code::Internal);
        assert_eq!(s.message(), "internal error");
    }

    #[test]
    fn not_connected_says_so() {
        let e = KasError::AgentNotConnected { agent_id: AgentId(7), waited: Duration::from_secs(1) };
        assert_eq!(e.http_status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.public_message().contains("agent 7 is not connected"));
    }

    #[test]
    fn waits_are_printed_rounded() {
        let e = KasError::AgentNotConnected { agent_id: AgentId(7), waited: Duration::from_nanos(20_001_183_635) };
        assert_eq!(e.public_message(), "agent 7 is not connected (waited 20s for it to connect)");
        assert_eq!(Rounded(Duration::from_millis(1_460)).to_string(), "1.5s");
        assert_eq!(Rounded(Duration::from_millis(299)).to_string(), "299ms");
        assert_eq!(Rounded(Duration::from_millis(59_960)).to_string(), "60s");
    }
}
