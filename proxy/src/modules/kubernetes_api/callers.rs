//! Who calls the Kubernetes API proxy on the rest listener, and who agentk acts as for them.
//!
//! `Authorization: Bearer <credential>`, where the credential is one of:
//! - `ci:<agent_id>:<CI job token>`: a CI job (GitLab mode); GitLab says which agents the job's
//!   project may use (the agent's `ci_access`) and how (`access_as`);
//! - `pat:<agent_id>:<personal access token>`: a person (GitLab mode; the agent's `user_access`);
//! - `kasu_...`: a static user token (`kas add-user`; the agent's `user_access`);
//! - anything else: GitLab's JWT, as on the other routes (agentk acts as itself).
//!
//! The agent id inside a `ci:` or `pat:` credential must be the one in the path: a token meant
//! for one agent is never used for another.

use kas_proto::AgentId;
use kas_proto::impersonation::Impersonation;

use crate::error::KasError;
use crate::server::rest::state::RestState;

/// Static user tokens start with this (they are told apart from JWTs and prefixed tokens).
pub const STATIC_USER_TOKEN_PREFIX: &str = "kasu_";

/// A caller's credential, parsed but not verified.
#[derive(Debug, PartialEq, Eq)]
pub enum Credential<'a> {
    Jwt(&'a str),
    CiJob { agent_id: AgentId, token: &'a str },
    PersonalAccessToken { agent_id: AgentId, token: &'a str },
    StaticUser(&'a str),
}

impl<'a> Credential<'a> {
    /// Parses `Authorization`; errors are 401s whose message says what is wrong (never the token).
    pub fn parse(authorization: Option<&'a str>) -> Result<Self, KasError> {
        let Some(value) = authorization else {
            return Err(KasError::Unauthenticated(
                "no credentials: send Authorization: Bearer <token> (a CI job's ci:<agent_id>:<job token>, \
                 pat:<agent_id>:<personal access token>, a kas user token, or GitLab's JWT)"
                    .into(),
            ));
        };
        let token = kas_proto::metadata::bearer_token(Some(value))
            .ok_or_else(|| KasError::Unauthenticated("the Authorization header is not \"Bearer <token>\"".into()))?;
        let prefixed = |kind: &str, rest: &'a str| -> Result<(AgentId, &'a str), KasError> {
            let (id, token) = rest.split_once(':').ok_or_else(|| {
                KasError::Unauthenticated(format!("a {kind} credential is {kind}:<agent_id>:<token>"))
            })?;
            let agent_id = AgentId::parse("agent_id", id)
                .map_err(|e| KasError::Unauthenticated(format!("the agent id of the {kind} credential: {e}")))?;
            if token.is_empty() {
                return Err(KasError::Unauthenticated(format!("the {kind} credential has no token")));
            }
            Ok((agent_id, token))
        };
        if let Some(rest) = token.strip_prefix("ci:") {
            let (agent_id, token) = prefixed("ci", rest)?;
            return Ok(Self::CiJob { agent_id, token });
        }
        if let Some(rest) = token.strip_prefix("pat:") {
            let (agent_id, token) = prefixed("pat", rest)?;
            return Ok(Self::PersonalAccessToken { agent_id, token });
        }
        if token.starts_with(STATIC_USER_TOKEN_PREFIX) {
            return Ok(Self::StaticUser(token));
        }
        Ok(Self::Jwt(token))
    }

    /// The agent a `ci:` / `pat:` credential is for.
    fn agent_id(&self) -> Option<AgentId> {
        match self {
            Self::CiJob { agent_id, .. } | Self::PersonalAccessToken { agent_id, .. } => Some(*agent_id),
            Self::Jwt(_) | Self::StaticUser(_) => None,
        }
    }
}

/// Authenticates the caller of a request for `agent_id` and decides who agentk acts as: `None`
/// is agentk's own service account.
pub async fn authorize(
    state: &RestState,
    authorization: Option<&str>,
    agent_id: AgentId,
) -> Result<Option<Impersonation>, KasError> {
    let credential = Credential::parse(authorization)?;
    if let Some(for_agent) = credential.agent_id().filter(|id| *id != agent_id) {
        return Err(KasError::PermissionDenied(format!(
            "the credential is for agent {for_agent}, but the request is for agent {agent_id}"
        )));
    }
    match credential {
        Credential::Jwt(token) => {
            state.verifier.verify_authorization(Some(&format!("Bearer {token}")))?;
            Ok(None)
        }
        Credential::CiJob { .. } => Err(KasError::Unauthenticated(
            "CI job tokens need kas in GitLab mode (gitlab.address): only GitLab can verify them".into(),
        )),
        Credential::PersonalAccessToken { .. } => Err(KasError::Unauthenticated(
            "personal access tokens need kas in GitLab mode (gitlab.address): only GitLab can verify them".into(),
        )),
        Credential::StaticUser(_) => Err(KasError::Unauthenticated(
            "this kas has no users file (users_file): kas user tokens are not accepted".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_told_apart() {
        assert_eq!(
            Credential::parse(Some("Bearer ci:5:job-token")).unwrap(),
            Credential::CiJob { agent_id: AgentId(5), token: "job-token" }
        );
        assert_eq!(
            Credential::parse(Some("bearer pat:7:glpat-x:y")).unwrap(),
            Credential::PersonalAccessToken { agent_id: AgentId(7), token: "glpat-x:y" }
        );
        assert_eq!(Credential::parse(Some("Bearer kasu_abc")).unwrap(), Credential::StaticUser("kasu_abc"));
        assert_eq!(Credential::parse(Some("Bearer a.b.c")).unwrap(), Credential::Jwt("a.b.c"));
        for (bad, expected) in [
            (None, "no credentials"),
            (Some("Basic dXNlcjpwYXNz"), "not \"Bearer <token>\""),
            (Some("Bearer ci:5"), "ci:<agent_id>:<token>"),
            (Some("Bearer ci:x:t"), "agent id of the ci credential"),
            (Some("Bearer pat:0:t"), "agent id of the pat credential"),
            (Some("Bearer pat:3:"), "has no token"),
        ] {
            let e = Credential::parse(bad).unwrap_err();
            assert!(matches!(e, KasError::Unauthenticated(_)), "{bad:?}: {e:?}");
            assert!(e.to_string().contains(expected), "{bad:?}: {e}");
        }
        let e = Credential::parse(Some("Bearer ci:x:secret-token")).unwrap_err();
        assert!(!e.to_string().contains("secret-token"), "the token is never in a message: {e}");
    }
}
