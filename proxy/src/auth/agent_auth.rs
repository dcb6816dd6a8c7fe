//! Authentication of agentk's calls on the agent listener, shared by every service there (the
//! presence stream, tunnels, and the features' own services such as GitOps), so that every one
//! of them bounds failed attempts per peer (`auth.failed_agent_authentications`).

use std::sync::Arc;

use tonic::{Request, Status};

use super::failures::{FailureLimitConfig, FailureLimiter, FailureLog};
use super::{AgentIdentity, TokenVerifier};
use crate::error::KasError;

pub struct AgentAuthenticator {
    verifier: Arc<dyn TokenVerifier>,
    limiter: FailureLimiter,
    log: FailureLog,
}

impl AgentAuthenticator {
    pub fn new(verifier: Arc<dyn TokenVerifier>, config: &FailureLimitConfig) -> Self {
        Self { verifier, limiter: FailureLimiter::new(config), log: FailureLog::new("agent") }
    }

    /// Verifies the agent token, unless this peer has used up its failed attempts: then it is
    /// refused at once, unverified (no GitLab request). Only failures count against the peer.
    pub async fn authenticate<T>(&self, request: &Request<T>) -> Result<AgentIdentity, Status> {
        self.authenticate_admitted(request, || Ok(())).await
    }

    /// [`AgentAuthenticator::authenticate`], with `admit` deciding between the peer check and
    /// the token verification whether kas takes the call at all (the accept rate of new agent
    /// connections): a peer out of failed attempts uses up no admission, a shed call costs no
    /// verification.
    pub async fn authenticate_admitted<T>(
        &self,
        request: &Request<T>,
        admit: impl FnOnce() -> Result<(), Status>,
    ) -> Result<AgentIdentity, Status> {
        let peer = request.remote_addr().map(|a| a.ip());
        if let Err(e) = self.limiter.check(peer) {
            self.log.record(peer, "rate_limited");
            return Err(Status::resource_exhausted(format!("{e} (auth.failed_agent_authentications)")));
        }
        admit()?;
        let authorization = request.metadata().get(kas_proto::metadata::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let Some(token) = kas_proto::metadata::bearer_token(authorization) else {
            self.limiter.failed(peer);
            self.log.record(peer, "missing_token");
            return Err(Status::unauthenticated(
                "missing agent token: expected \"authorization: Bearer <agent token>\"",
            ));
        };
        match self.verifier.verify(token).await {
            Ok(agent) => Ok(agent),
            Err(e) => {
                // GitLab unreachable or rate-limited is not the caller's failure.
                if let Some(reason) = match &e {
                    KasError::Unauthenticated(_) => Some("invalid_token"),
                    KasError::PermissionDenied(_) => Some("permission_denied"),
                    _ => None,
                } {
                    self.limiter.failed(peer);
                    self.log.record(peer, reason);
                }
                Err(e.into())
            }
        }
    }
}
