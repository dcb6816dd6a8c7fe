//! Agent configuration: the documented schema of what agentk receives on `GetConfiguration`.
//!
//! The YAML form (in the static agents file now, in `.gitlab/agents/<name>/config.yaml` later)
//! is parsed strictly: unknown fields are an error.

pub mod git;

use kas_proto::tunnel::pb;
use prost::Message;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The agent configuration document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfigDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observability: Option<ObservabilityDocument>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservabilityDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logging: Option<LoggingDocument>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingDocument {
    /// A tracing filter directive for agentk, such as `info` or `agentk=debug`.
    pub level: String,
}

impl AgentConfigDocument {
    pub fn to_proto(&self) -> pb::AgentConfiguration {
        pb::AgentConfiguration {
            observability: self.observability.as_ref().map(|o| pb::ObservabilityConfiguration {
                logging: o.logging.as_ref().map(|l| pb::LoggingConfiguration { level: l.level.clone() }),
            }),
        }
    }

    /// The response for this document; its commit id is a content hash, so an unchanged static
    /// configuration is recognised when agentk reconnects.
    pub fn to_response(&self) -> pb::ConfigurationResponse {
        let configuration = self.to_proto();
        let digest = Sha256::digest(configuration.encode_to_vec());
        pb::ConfigurationResponse {
            configuration: Some(configuration),
            commit_id: format!("static-{}", hex::encode(&digest[..10])),
        }
    }
}

/// Where agent configurations come from (static agents file now; a Git repository later).
#[async_trait::async_trait]
pub trait ConfigurationSource: Send + Sync + 'static {
    /// The agent's current configuration.
    async fn configuration(
        &self,
        agent: &crate::auth::AgentIdentity,
    ) -> Result<pb::ConfigurationResponse, crate::error::KasError>;
}

#[async_trait::async_trait]
impl ConfigurationSource for crate::auth::StaticAgents {
    async fn configuration(
        &self,
        agent: &crate::auth::AgentIdentity,
    ) -> Result<pb::ConfigurationResponse, crate::error::KasError> {
        let Some(repository) = self.configuration_repository(agent.agent_id) else {
            return Ok(crate::auth::StaticAgents::configuration(self, agent.agent_id).to_response());
        };
        let (repository, name) = (repository.to_owned(), agent.name.clone());
        let result = tokio::task::spawn_blocking(move || git::read_configuration(&repository, &name))
            .await
            .map_err(|e| crate::error::KasError::Internal(format!("reading the agent configuration: {e}")))?;
        crate::metrics::git_poll(result.is_ok());
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_parsing_and_stable_commit() {
        let d: AgentConfigDocument = serde_norway::from_str("observability:\n  logging:\n    level: debug\n").unwrap();
        assert_eq!(d.to_proto().observability.unwrap().logging.unwrap().level, "debug");
        assert_eq!(d.to_response().commit_id, d.to_response().commit_id);
        assert_ne!(d.to_response().commit_id, AgentConfigDocument::default().to_response().commit_id);
        let e = serde_norway::from_str::<AgentConfigDocument>("observability:\n  loging: {}\n").unwrap_err();
        assert!(e.to_string().contains("unknown field `loging`"));
    }
}
