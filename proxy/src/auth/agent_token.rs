//! Agent token verification (agent listener). A trait so that the GitLab-backed verifier can
//! replace the static one; the static backend reads a YAML file of agents.

use std::collections::HashMap;
use std::path::Path;

use async_trait::async_trait;
use kas_proto::{AgentId, ProjectId};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::agent::{AgentConfigDocument, AgentIdentity, ConfigurationOrigin, GitRepository, RepositoryLocation};
use crate::error::KasError;

#[async_trait]
pub trait TokenVerifier: Send + Sync + 'static {
    /// Resolves a token to its agent, or `Unauthenticated`.
    async fn verify(&self, token: &str) -> Result<AgentIdentity, KasError>;
}

/// One agent in the static agents file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticAgent {
    pub id: i64,
    pub name: String,
    /// The agent's configuration project id.
    pub project_id: i64,
    /// Lower-case hex SHA-256 of the agent token. The token itself is never stored.
    pub token_sha256: String,
    /// The agent configuration sent to agentk; empty when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<AgentConfigDocument>,
    /// The agent's configuration project as a Git repository: a local bare repository's path,
    /// or an `http(s)://` URL. The configuration is `.gitlab/agents/<name>/config.yaml` on
    /// `configuration_branch` (default: the repository's default branch), polled for changes.
    /// Exclusive with `configuration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_repository: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_branch: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticAgentsFile {
    #[serde(default)]
    pub agents: Vec<StaticAgent>,
}

#[derive(Debug, thiserror::Error)]
pub enum StaticAgentsError {
    #[error("cannot read agents file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("invalid agents file {path}: {message}")]
    Invalid { path: String, message: String },
    #[error("cannot write agents file {path}: {source}")]
    Write { path: String, source: std::io::Error },
}

/// The static agents backend: token hashes and configurations from a YAML file.
#[derive(Debug, Clone)]
pub struct StaticAgents {
    by_hash: HashMap<[u8; 32], AgentIdentity>,
    by_id: HashMap<AgentId, AgentIdentity>,
    /// Configurations the file sets explicitly (GitLab mode uses them instead of GitLab's).
    explicit: HashMap<AgentId, ConfigurationOrigin>,
}

pub fn token_sha256_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new random agent token (URL-safe, 256 bits).
pub fn generate_agent_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("kas-agent-{}", hex::encode(bytes))
}

impl StaticAgentsFile {
    pub fn load(path: &Path) -> Result<Self, StaticAgentsError> {
        let p = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| StaticAgentsError::Read { path: p.clone(), source })?;
        let file: Self = serde_norway::from_str(&text)
            .map_err(|e| StaticAgentsError::Invalid { path: p.clone(), message: e.to_string() })?;
        file.validate().map_err(|message| StaticAgentsError::Invalid { path: p, message })?;
        Ok(file)
    }

    /// Writes the file (0600: it names every agent) through a temporary file and a rename, so
    /// kas never reads a half-written file.
    pub fn save(&self, path: &Path) -> Result<(), StaticAgentsError> {
        let p = path.display().to_string();
        let text = serde_norway::to_string(self)
            .map_err(|e| StaticAgentsError::Invalid { path: p.clone(), message: e.to_string() })?;
        crate::tools::private_file::replace(path, text.as_bytes())
            .map_err(|source| StaticAgentsError::Write { path: p, source })
    }

    /// The file at `path` (empty if missing) with `agent` appended, validated as kas loads it.
    /// Nothing is written: the caller saves it once the agent's token is safely stored.
    pub fn with_added(path: &Path, agent: StaticAgent) -> Result<Self, StaticAgentsError> {
        let mut file = if path.exists() { Self::load(path)? } else { Self::default() };
        if file.agents.iter().any(|a| a.id == agent.id) {
            return Err(StaticAgentsError::Invalid {
                path: path.display().to_string(),
                message: format!("agent id {} is already in the file", agent.id),
            });
        }
        file.agents.push(agent);
        file.validate().map_err(|message| StaticAgentsError::Invalid { path: path.display().to_string(), message })?;
        Ok(file)
    }

    fn validate(&self) -> Result<(), String> {
        let mut ids = std::collections::HashSet::new();
        let mut hashes = std::collections::HashSet::new();
        for (i, a) in self.agents.iter().enumerate() {
            let at = format!("agents[{i}]");
            AgentId::from_wire(&format!("{at}.id"), a.id).map_err(|e| e.to_string())?;
            ProjectId::from_wire(&format!("{at}.project_id"), a.project_id).map_err(|e| e.to_string())?;
            if a.name.trim().is_empty() {
                return Err(format!("{at}.name must not be empty"));
            }
            let hash = a.token_sha256.to_ascii_lowercase();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("{at}.token_sha256 must be 64 hex characters (the SHA-256 of the token)"));
            }
            if !ids.insert(a.id) {
                return Err(format!("{at}.id {} appears twice", a.id));
            }
            if !hashes.insert(hash) {
                return Err(format!("{at}.token_sha256 is used by another agent"));
            }
            if let Some(document) = &a.configuration {
                document.validate().map_err(|e| format!("{at}.configuration.{e}"))?;
            }
            if a.configuration.is_some() && a.configuration_repository.is_some() {
                return Err(format!("{at}: set configuration or configuration_repository, not both"));
            }
            if let Some(r) = &a.configuration_repository {
                RepositoryLocation::parse(r).map_err(|e| format!("{at}.configuration_repository {e}"))?;
            }
            if let Some(b) = &a.configuration_branch {
                if a.configuration_repository.is_none() {
                    return Err(format!("{at}.configuration_branch needs configuration_repository"));
                }
                if gix::validate::reference::name_partial(b.as_str().into()).is_err() || b.starts_with("refs/") {
                    return Err(format!("{at}.configuration_branch \"{b}\" is not a branch name"));
                }
            }
        }
        Ok(())
    }
}

impl StaticAgents {
    pub fn from_file(path: &Path) -> Result<Self, StaticAgentsError> {
        Ok(Self::new(StaticAgentsFile::load(path)?))
    }

    pub fn new(file: StaticAgentsFile) -> Self {
        let mut by_hash = HashMap::new();
        let mut by_id = HashMap::new();
        let mut explicit = HashMap::new();
        for a in file.agents {
            let mut hash = [0u8; 32];
            if hex::decode_to_slice(a.token_sha256.to_ascii_lowercase(), &mut hash).is_err() {
                continue; // validated on load; an in-code file with a bad hash matches nothing
            }
            let repository = a.configuration_repository.as_deref().and_then(|r| RepositoryLocation::parse(r).ok());
            let origin = match (repository, a.configuration) {
                (Some(location), _) => {
                    Some(ConfigurationOrigin::Git(GitRepository { location, branch: a.configuration_branch }))
                }
                (None, Some(document)) => Some(ConfigurationOrigin::Static(document)),
                (None, None) => None,
            };
            if let Some(origin) = &origin {
                explicit.insert(AgentId(a.id), origin.clone());
            }
            let identity = AgentIdentity {
                agent_id: AgentId(a.id),
                name: a.name,
                project_id: ProjectId(a.project_id),
                configuration: origin.unwrap_or_default(),
            };
            by_id.insert(identity.agent_id, identity.clone());
            by_hash.insert(hash, identity);
        }
        Self { by_hash, by_id, explicit }
    }

    /// The agent with this id (static mode: callers other than agentk name agents by id).
    pub fn identity(&self, agent_id: AgentId) -> Option<&AgentIdentity> {
        self.by_id.get(&agent_id)
    }

    /// The configuration the file sets for an agent, if it sets one.
    pub fn explicit_configuration(&self, agent_id: AgentId) -> Option<&ConfigurationOrigin> {
        self.explicit.get(&agent_id)
    }
}

#[async_trait]
impl TokenVerifier for StaticAgents {
    async fn verify(&self, token: &str) -> Result<AgentIdentity, KasError> {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.by_hash.get(&hash).cloned().ok_or_else(|| KasError::Unauthenticated("invalid agent token".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(token: &str) -> StaticAgentsFile {
        StaticAgentsFile {
            agents: vec![StaticAgent {
                id: 5,
                name: "a".into(),
                project_id: 9,
                token_sha256: token_sha256_hex(token),
                configuration: None,
                configuration_repository: None,
                configuration_branch: None,
            }],
        }
    }

    #[tokio::test]
    async fn verifies_by_hash() {
        let token = generate_agent_token();
        let agents = StaticAgents::new(file_with(&token));
        let id = agents.verify(&token).await.unwrap();
        assert_eq!(id.agent_id, AgentId(5));
        assert_eq!(id.project_id, ProjectId(9));
        assert!(agents.verify("other").await.is_err());
    }

    #[test]
    fn load_validates_with_clear_messages() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("agents.yaml");
        std::fs::write(&p, "agents:\n  - id: 1\n    name: a\n    project_id: 1\n    token_sha256: abc\n").unwrap();
        let e = StaticAgentsFile::load(&p).unwrap_err().to_string();
        assert!(e.contains("agents[0].token_sha256 must be 64 hex"), "{e}");
        std::fs::write(&p, "agents:\n  - id: 1\n    nme: a\n").unwrap();
        let e = StaticAgentsFile::load(&p).unwrap_err().to_string();
        assert!(e.contains("unknown field `nme`"), "{e}");
        file_with("t").save(&p).unwrap();
        assert_eq!(StaticAgentsFile::load(&p).unwrap(), file_with("t"));

        let mut file = file_with("t");
        file.agents[0].configuration_repository = Some("https://kas:hunter2@git.example.com/a.git".into());
        let e = file.validate().unwrap_err();
        assert!(e.contains("agents[0].configuration_repository must not contain credentials"), "{e}");
        assert!(!e.contains("hunter2"));
        file.agents[0].configuration_repository = None;
        file.agents[0].configuration_branch = Some("main".into());
        assert!(file.validate().unwrap_err().contains("configuration_branch needs configuration_repository"));
        file.agents[0].configuration_repository = Some("https://git.example.com/a.git".into());
        file.validate().unwrap();
        file.agents[0].configuration_branch = Some("bad..name".into());
        assert!(file.validate().unwrap_err().contains("is not a branch name"));
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    fn agent() -> impl Strategy<Value = String> {
        let id = prop_oneof![
            Just("1".to_owned()),
            Just("0".to_owned()),
            Just("-1".to_owned()),
            Just("+2".to_owned()),
            any::<i64>().prop_map(|v| v.to_string()),
            "[a-z0-9.]{0,4}"
        ];
        let hash = prop_oneof!["[0-9a-f]{64}", "[0-9A-F]{64}", "[0-9a-z]{60,66}", Just(String::new())];
        let repo = prop_oneof![
            Just(None),
            Just(Some("/srv/a.git".to_owned())),
            Just(Some("https://u:p@h/a.git".to_owned())),
            "[a-z:/.]{0,12}".prop_map(Some)
        ];
        let branch = prop_oneof![
            Just(None),
            Just(Some("main".to_owned())),
            Just(Some("refs/heads/x".to_owned())),
            "[a-z./~^: -]{0,8}".prop_map(Some)
        ];
        let configuration = prop_oneof![
            Just(None),
            Just(Some("{}")),
            Just(Some("{kubernetes_api: {read_only: true}}")),
            Just(Some("{nope: 1}"))
        ];
        (id.clone(), "[a-z ]{0,6}", id, hash, repo, branch, configuration).prop_map(
            |(id, name, project, hash, repo, branch, configuration)| {
                let mut s =
                    format!("- id: {id}\n  name: \"{name}\"\n  project_id: {project}\n  token_sha256: \"{hash}\"\n");
                if let Some(r) = repo {
                    s.push_str(&format!("  configuration_repository: \"{r}\"\n"));
                }
                if let Some(b) = branch {
                    s.push_str(&format!("  configuration_branch: \"{b}\"\n"));
                }
                if let Some(c) = configuration {
                    s.push_str(&format!("  configuration: {c}\n"));
                }
                s
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The static agents file with arbitrary entries: refused with a message naming the
        /// entry, or a file whose agents are all usable (positive ids, one per id and hash).
        #[test]
        fn arbitrary_static_agents_files(agents in proptest::collection::vec(agent(), 0..4), junk in prop_oneof![Just(String::new()), ".{0,20}"]) {
            let text = format!("agents:\n{}{junk}", agents.concat());
            let Ok(file) = serde_norway::from_str::<StaticAgentsFile>(&text) else { return Ok(()) };
            match file.validate() {
                Ok(()) => {
                    let n = file.agents.len();
                    for a in &file.agents {
                        prop_assert!(a.id > 0 && a.project_id > 0 && !a.name.trim().is_empty());
                        prop_assert!(a.configuration_repository.as_deref().is_none_or(|r| RepositoryLocation::parse(r).is_ok()));
                    }
                    let agents = StaticAgents::new(file);
                    prop_assert_eq!(agents.by_hash.len(), n, "every validated agent can log in");
                }
                Err(e) => prop_assert!(e.starts_with("agents["), "{e}"),
            }
        }
    }
}
