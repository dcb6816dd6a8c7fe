//! Authentication: secrets, JWT (api and internal listeners), agent tokens (agent listener:
//! the static agents file, or GitLab in GitLab mode).

pub mod agent_token;
pub mod cache;
pub mod gitlab;
pub mod jwt;
pub mod secret;
pub mod token_bucket;

pub use agent_token::{AgentIdentity, StaticAgents, TokenVerifier};
pub use gitlab::GitlabVerifier;
pub use jwt::{JwtVerifier, mint_jwt};
pub use secret::Secret;
