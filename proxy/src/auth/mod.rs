//! Authentication: secrets, JWT (api and internal listeners), agent tokens (agent listener:
//! the static agents file, or GitLab in GitLab mode).

pub mod agent_auth;
pub mod agent_token;
pub mod failures;
pub mod gitlab;
pub mod jwt;
pub mod secret;
pub mod static_users;

pub use crate::agent::AgentIdentity;
pub use agent_token::{StaticAgents, TokenVerifier};
pub use gitlab::GitlabVerifier;
pub use jwt::{JwtVerifier, mint_jwt};
pub use secret::Secret;

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `auth` in the kas config: bounds on credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// JWTs (api, rest and internal listeners) living longer than this (`exp - iat`, or
    /// `exp - now` without `iat`) are refused.
    #[serde(with = "humantime_serde")]
    pub jwt_max_lifetime: Duration,
    /// Failed agent-token authentications per peer address (agent listener).
    pub failed_agent_authentications: failures::FailureLimitConfig,
    /// Static users of the Kubernetes API proxy (`kas add-user`): standalone mode only; in
    /// GitLab mode people use personal access tokens.
    pub users_file: Option<std::path::PathBuf>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            jwt_max_lifetime: jwt::DEFAULT_JWT_MAX_LIFETIME,
            failed_agent_authentications: failures::FailureLimitConfig::default(),
            users_file: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;

    fn example() -> Config {
        Config::parse(include_str!("../../config.example.yaml")).unwrap()
    }

    #[test]
    fn auth_limits_are_validated_with_their_key() {
        let mut c = example();
        c.auth.jwt_max_lifetime = Duration::from_secs(30);
        assert!(c.validate().unwrap_err().to_string().contains("auth.jwt_max_lifetime"));
        let mut c = example();
        c.auth.failed_agent_authentications.burst = 0;
        assert!(c.validate().unwrap_err().to_string().contains("auth.failed_agent_authentications.burst"));
        let c = Config::parse("auth:\n  jwt_max_lifetime: 10m\n  failed_agent_authentications:\n    per_second: 5\n")
            .unwrap();
        assert_eq!(c.auth.jwt_max_lifetime, Duration::from_secs(600));
        assert_eq!(c.auth.failed_agent_authentications.per_second, 5);
        assert_eq!(c.auth.failed_agent_authentications.burst, super::failures::DEFAULT_FAILED_AGENT_AUTH_BURST);
    }
}
