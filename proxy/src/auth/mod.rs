//! Authentication: secrets, JWT (api and internal listeners), agent tokens (agent listener).

pub mod agent_token;
pub mod jwt;
pub mod secret;

pub use agent_token::{AgentIdentity, StaticAgents, TokenVerifier};
pub use jwt::{JwtVerifier, mint_jwt};
pub use secret::Secret;
