//! The agent configuration document: `.gitlab/agents/<name>/config.yaml` in the agent's
//! configuration project, or the static agents file's `configuration`. Every feature with
//! agent-side settings adds its section here; kas sends the document to agentk as
//! `AgentConfiguration`.

use kas_proto::tunnel::pb;
use prost::Message;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::access::{CiAccessDocument, UserAccessDocument};
use super::cluster_state::ClusterStateDocument;
use super::gitops::GitopsDocument;

/// The agent configuration document (`config.yaml`; every section optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfigDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observability: Option<ObservabilityDocument>,
    /// The Kubernetes API proxy feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_api: Option<KubernetesApiDocument>,
    /// CI jobs that may use the agent through the Kubernetes API proxy (kas and GitLab read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_access: Option<CiAccessDocument>,
    /// People who may use the agent through the Kubernetes API proxy (kas and GitLab read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_access: Option<UserAccessDocument>,
    /// Manifest projects kas polls and agentk applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitops: Option<GitopsDocument>,
    /// Resources agentk watches and whose views it pushes to kas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_state: Option<ClusterStateDocument>,
}

/// How agentk serves the Kubernetes API proxy; refusals are HTTP 403 Kubernetes `Status`es.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesApiDocument {
    /// `false` refuses every proxied request.
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// Only reads (GET, HEAD, OPTIONS without an upgrade: get, list, watch, logs).
    #[serde(default)]
    pub read_only: bool,
}

fn enabled() -> bool {
    true
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
    /// Parses `config.yaml` text strictly (unknown keys refused) and checks what YAML cannot
    /// (paths, names, duplicates); every error names the key.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let document: Self = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        document.validate()?;
        Ok(document)
    }

    /// What YAML's shape cannot say: each section's own checks.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(ci) = &self.ci_access {
            ci.validate()?;
        }
        if let Some(users) = &self.user_access {
            users.validate()?;
        }
        if let Some(gitops) = &self.gitops {
            gitops.validate()?;
        }
        if let Some(cluster_state) = &self.cluster_state {
            cluster_state.validate()?;
        }
        Ok(())
    }

    pub fn to_proto(&self) -> pb::AgentConfiguration {
        pb::AgentConfiguration {
            observability: self.observability.as_ref().map(|o| pb::ObservabilityConfiguration {
                logging: o.logging.as_ref().map(|l| pb::LoggingConfiguration { level: l.level.clone() }),
            }),
            kubernetes_api: self
                .kubernetes_api
                .as_ref()
                .map(|k| pb::KubernetesApiConfiguration { disabled: !k.enabled, read_only: k.read_only }),
            // Set per agent by the presence stream (`server::agent`), not part of the document.
            agent_id: 0,
            gitops: self.gitops.as_ref().map(GitopsDocument::to_proto),
            cluster_state: self.cluster_state.as_ref().map(ClusterStateDocument::to_proto),
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

        let d: AgentConfigDocument = serde_norway::from_str("kubernetes_api:\n  read_only: true\n").unwrap();
        let k = d.to_proto().kubernetes_api.unwrap();
        assert!(k.read_only && !k.disabled, "enabled by default");
        let d: AgentConfigDocument = serde_norway::from_str("kubernetes_api: {enabled: false}").unwrap();
        assert!(d.to_proto().kubernetes_api.unwrap().disabled);
        assert!(serde_norway::from_str::<AgentConfigDocument>("kubernetes_api: {readonly: true}").is_err());
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;
    use serde_norway::Value;

    use super::*;

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|v| Value::Number(v.into())),
            prop_oneof![Just("info"), Just("agentk=debug"), Just("[{"), Just(""), Just("yes")]
                .prop_map(|s| Value::String(s.into())),
            ".{0,16}".prop_map(Value::String),
        ]
    }

    /// A document made of known sections and keys (and some unknown ones), values of any shape.
    fn document() -> impl Strategy<Value = Value> {
        let key = proptest::sample::select(vec![
            "observability",
            "logging",
            "level",
            "kubernetes_api",
            "enabled",
            "read_only",
            "readonly",
            "extra",
        ]);
        let leaf = scalar();
        leaf.prop_recursive(3, 12, 3, move |inner| {
            proptest::collection::vec((key.clone(), inner), 0..3)
                .prop_map(|kv| Value::Mapping(kv.into_iter().map(|(k, v)| (Value::String(k.to_owned()), v)).collect()))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any `config.yaml` text: a document or a YAML error, never a panic; a document gives
        /// the same commit id every time and survives YAML round-trips.
        #[test]
        fn arbitrary_agent_configuration_text(text in prop_oneof![".{0,120}", "([a-z_]{1,14}:( [ -~]{0,10})?\n {0,4}){0,8}"]) {
            match serde_norway::from_str::<AgentConfigDocument>(&text) {
                Ok(d) => {
                    prop_assert_eq!(d.to_response(), d.to_response());
                    let again: AgentConfigDocument = serde_norway::from_str(&serde_norway::to_string(&d).unwrap()).unwrap();
                    prop_assert_eq!(again, d);
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }

        /// Known keys with values of any shape: accepted exactly when the schema says so
        /// (unknown keys refused and named), and what is accepted reaches agentk unchanged.
        #[test]
        fn arbitrary_agent_configuration_values(doc in document()) {
            let text = serde_norway::to_string(&doc).unwrap();
            match serde_norway::from_str::<AgentConfigDocument>(&text) {
                Ok(d) => {
                    let p = d.to_proto();
                    if let Some(k) = &d.kubernetes_api {
                        prop_assert_eq!(p.kubernetes_api, Some(pb::KubernetesApiConfiguration { disabled: !k.enabled, read_only: k.read_only }));
                    }
                    let level = d.observability.as_ref().and_then(|o| o.logging.as_ref()).map(|l| l.level.clone());
                    prop_assert_eq!(p.observability.and_then(|o| o.logging).map(|l| l.level), level);
                    prop_assert!(!text.contains("readonly") && !text.contains("extra"), "unknown key accepted: {text}");
                }
                Err(e) => {
                    let e = e.to_string();
                    for unknown in ["readonly", "extra"] {
                        if e.contains(&format!("unknown field `{unknown}`")) {
                            prop_assert!(text.contains(unknown));
                        }
                    }
                }
            }
        }
    }
}
