//! Agent configuration: the documented schema of what agentk receives on `GetConfiguration`,
//! and where it comes from (the static agents file, or `.gitlab/agents/<name>/config.yaml` in
//! a Git repository: a local path or a remote one over HTTP(S)).
//!
//! The YAML form is parsed strictly: unknown fields are an error.

pub mod git;
pub mod mirror;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kas_proto::tunnel::pb;
use prost::Message;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::auth::AgentIdentity;
use crate::auth::cache::TtlCache;
use crate::auth::token_bucket::TokenBucket;
use crate::config::AgentGitConfig;
use crate::error::KasError;

/// The agent configuration document (`config.yaml`; every section optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfigDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observability: Option<ObservabilityDocument>,
    /// The Kubernetes API proxy feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_api: Option<KubernetesApiDocument>,
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
    pub fn to_proto(&self) -> pb::AgentConfiguration {
        pb::AgentConfiguration {
            observability: self.observability.as_ref().map(|o| pb::ObservabilityConfiguration {
                logging: o.logging.as_ref().map(|l| pb::LoggingConfiguration { level: l.level.clone() }),
            }),
            kubernetes_api: self
                .kubernetes_api
                .as_ref()
                .map(|k| pb::KubernetesApiConfiguration { disabled: !k.enabled, read_only: k.read_only }),
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

/// Where an agent's configuration comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigurationOrigin {
    /// A fixed document (the static agents file's `configuration`; empty when absent).
    Static(AgentConfigDocument),
    /// `.gitlab/agents/<agent name>/config.yaml` in a Git repository, polled.
    Git(GitRepository),
    /// The configuration cannot be located (GitLab's answer names no usable repository).
    Unusable(String),
}

impl Default for ConfigurationOrigin {
    fn default() -> Self {
        Self::Static(AgentConfigDocument::default())
    }
}

/// A branch of a Git repository.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GitRepository {
    pub location: RepositoryLocation,
    /// `None`: the repository's default branch (its `HEAD`).
    pub branch: Option<String>,
}

/// A Git repository: a directory on this machine, or an `http(s)://` URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RepositoryLocation {
    Local(PathBuf),
    Remote(String),
}

impl RepositoryLocation {
    /// A URL (`http://`, `https://`) or else a local path. URLs must not carry credentials
    /// (they would end up in logs): those go in `agents.git.password_file`.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("is empty".into());
        }
        let Some((scheme, rest)) = s.split_once("://") else { return Ok(Self::Local(PathBuf::from(s))) };
        if !matches!(scheme, "http" | "https") {
            return Err(format!("\"{scheme}://\" repositories are not supported: use a local path or http(s)://"));
        }
        let authority = rest.split('/').next().unwrap_or_default();
        if authority.contains('@') {
            return Err("must not contain credentials: set agents.git.username and agents.git.password_file".into());
        }
        if authority.is_empty() || s.parse::<http::Uri>().is_err() {
            return Err(format!("\"{s}\" is not a valid URL"));
        }
        Ok(Self::Remote(s.to_owned()))
    }
}

impl std::fmt::Display for RepositoryLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(p) => write!(f, "{}", p.display()),
            Self::Remote(url) => f.write_str(url),
        }
    }
}

/// `gitlab.repository_url`: the configuration project's location, from GitLab's agent_info.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositoryUrlTemplate(String);

/// The placeholders of [`RepositoryUrlTemplate`].
const TEMPLATE_PLACEHOLDERS: [&str; 5] = ["gitlab", "project_path", "relative_path", "storage_name", "gl_repository"];

impl RepositoryUrlTemplate {
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut rest = template;
        while let Some(start) = rest.find('{') {
            let Some(len) = rest[start..].find('}') else {
                return Err(format!("\"{template}\" has an unclosed '{{'"));
            };
            let name = &rest[start + 1..start + len];
            if !TEMPLATE_PLACEHOLDERS.contains(&name) {
                return Err(format!(
                    "\"{template}\": unknown placeholder {{{name}}} (known: {})",
                    TEMPLATE_PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
                ));
            }
            rest = &rest[start + len + 1..];
        }
        if template.trim().is_empty() {
            return Err("is empty".into());
        }
        Ok(Self(template.to_owned()))
    }

    /// The agent's configuration repository (its default branch) from agent_info's fields.
    pub fn render(
        &self,
        gitlab: &str,
        repository: &crate::auth::gitlab::GitalyRepository,
        default_branch: &str,
    ) -> Result<GitRepository, String> {
        let values = [
            ("gitlab", gitlab.trim_end_matches('/')),
            ("project_path", repository.gl_project_path.as_str()),
            ("relative_path", repository.relative_path.as_str()),
            ("storage_name", repository.storage_name.as_str()),
            ("gl_repository", repository.gl_repository.as_str()),
        ];
        let mut out = self.0.clone();
        for (name, value) in values {
            let placeholder = format!("{{{name}}}");
            if out.contains(&placeholder) {
                // Values come from GitLab; refuse ones that could leave the intended location.
                if value.is_empty() || value.split('/').any(|s| s == "..") || value.contains(['?', '#']) {
                    return Err(format!("agent_info's {name} \"{value}\" cannot be used in gitlab.repository_url"));
                }
                out = out.replace(&placeholder, value);
            }
        }
        let location =
            RepositoryLocation::parse(&out).map_err(|e| format!("gitlab.repository_url gives {out}: {e}"))?;
        let branch = (!default_branch.is_empty()).then(|| default_branch.to_owned());
        Ok(GitRepository { location, branch })
    }
}

/// Where agent configurations come from.
#[async_trait::async_trait]
pub trait ConfigurationSource: Send + Sync + 'static {
    /// The agent's current configuration.
    async fn configuration(&self, agent: &AgentIdentity) -> Result<pb::ConfigurationResponse, KasError>;
}

/// The configuration source of kas: static documents as they are, Git repositories read at
/// the commit their branch points to. Polls of one repository within a tenth of the poll
/// period share one read (one fetch, for remote repositories), and all reads pass one token
/// bucket, so many agents of one project, or a reconnect storm, do not flood the Git server.
/// (A commit therefore reaches agentk within 1.2 poll periods: ±10 % jitter plus the share.)
pub struct AgentConfigurations {
    mirrors: Arc<mirror::Mirrors>,
    /// Repository + branch -> the commit the branch points to.
    commits: TtlCache<String>,
    limiter: TokenBucket,
    max_config_bytes: u64,
}

impl AgentConfigurations {
    pub fn new(config: &AgentGitConfig, poll_period: Duration) -> Result<Self, mirror::MirrorSetupError> {
        let share = poll_period / 10;
        let rl = &config.rate_limit;
        let mut mirrors = mirror::Mirrors::new(config)?;
        // A mirror in use is fetched at least every poll period: only a much longer quiet
        // means its agents are gone.
        mirrors.idle_ttl = mirrors.idle_ttl.max(poll_period * 3);
        Ok(Self {
            mirrors: Arc::new(mirrors),
            // Failures are shared only by concurrent polls: the next poll tries again.
            commits: TtlCache::new(share, Duration::ZERO, 100_000),
            limiter: TokenBucket::new(rl.requests_per_second, rl.burst, rl.max_wait),
            max_config_bytes: config.max_config_bytes,
        })
    }

    /// The commit `repository`'s branch points to, and the directory to read it from.
    async fn resolve(&self, repository: &GitRepository) -> Result<(PathBuf, String), KasError> {
        let key: [u8; 32] = Sha256::digest(format!("{:?}", repository)).into();
        let commit = self
            .commits
            .get_or_fetch(key, || async {
                self.limiter.acquire().await.map_err(|e| {
                    KasError::RateLimited(format!("configuration repository {}: {e}", repository.location))
                })?;
                let (mirrors, repo) = (self.mirrors.clone(), repository.clone());
                let remote = matches!(repo.location, RepositoryLocation::Remote(_));
                let started = std::time::Instant::now();
                let result = blocking(move || match &repo.location {
                    RepositoryLocation::Local(path) => git::resolve_branch(path, repo.branch.as_deref()),
                    RepositoryLocation::Remote(url) => mirrors.fetch(url, repo.branch.as_deref()),
                })
                .await;
                crate::metrics::git_poll(result.is_ok(), remote, started.elapsed());
                if let Err(e) = &result {
                    tracing::warn!(repository = %repository.location, error = %e, "configuration repository poll failed");
                }
                result
            })
            .await?;
        let dir = match &repository.location {
            RepositoryLocation::Local(path) => path.clone(),
            RepositoryLocation::Remote(url) => self.mirrors.path(url, repository.branch.as_deref()),
        };
        Ok((dir, commit))
    }
}

/// Runs blocking Git work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, KasError> + Send + 'static) -> Result<T, KasError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| KasError::Internal(format!("reading the agent configuration: {e}")))?
}

#[async_trait::async_trait]
impl ConfigurationSource for AgentConfigurations {
    async fn configuration(&self, agent: &AgentIdentity) -> Result<pb::ConfigurationResponse, KasError> {
        let repository = match &agent.configuration {
            ConfigurationOrigin::Static(document) => return Ok(document.to_response()),
            ConfigurationOrigin::Git(repository) => repository,
            ConfigurationOrigin::Unusable(problem) => {
                return Err(KasError::InvalidAgentConfiguration(format!(
                    "the configuration of agent {} cannot be read: {problem}",
                    agent.agent_id
                )));
            }
        };
        let (dir, commit) = self.resolve(repository).await?;
        let (name, max) = (agent.name.clone(), self.max_config_bytes);
        blocking(move || git::read_configuration_at(&dir, &commit, &name, max)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::gitlab::GitalyRepository;

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

    #[test]
    fn repository_locations() {
        assert_eq!(RepositoryLocation::parse("/srv/a.git"), Ok(RepositoryLocation::Local("/srv/a.git".into())));
        assert_eq!(
            RepositoryLocation::parse("https://git.example.com/a/b.git"),
            Ok(RepositoryLocation::Remote("https://git.example.com/a/b.git".into()))
        );
        let e = RepositoryLocation::parse("https://user:secret@git.example.com/a.git").unwrap_err();
        assert!(e.contains("must not contain credentials") && !e.contains("secret"), "{e}");
        assert!(RepositoryLocation::parse("ssh://git@example.com/a.git").unwrap_err().contains("not supported"));
        assert!(RepositoryLocation::parse("").is_err());
    }

    #[test]
    fn repository_url_template() {
        let repo = GitalyRepository {
            storage_name: "default".into(),
            relative_path: "@hashed/aa/bb.git".into(),
            gl_repository: "project-7".into(),
            gl_project_path: "group/agents".into(),
        };
        let t = RepositoryUrlTemplate::parse(crate::config::DEFAULT_GITLAB_REPOSITORY_URL).unwrap();
        let r = t.render("https://gitlab.example.com/", &repo, "main").unwrap();
        assert_eq!(r.location, RepositoryLocation::Remote("https://gitlab.example.com/group/agents.git".into()));
        assert_eq!(r.branch.as_deref(), Some("main"));
        let t = RepositoryUrlTemplate::parse("/var/opt/gitlab/git-data/repositories/{relative_path}").unwrap();
        let r = t.render("https://gitlab.example.com", &repo, "").unwrap();
        assert_eq!(
            r.location,
            RepositoryLocation::Local("/var/opt/gitlab/git-data/repositories/@hashed/aa/bb.git".into())
        );
        assert_eq!(r.branch, None);

        assert!(
            RepositoryUrlTemplate::parse("{gitlab}/{project}.git")
                .unwrap_err()
                .contains("unknown placeholder {project}")
        );
        assert!(RepositoryUrlTemplate::parse("{gitlab/x").unwrap_err().contains("unclosed"));
        let escaping = GitalyRepository { gl_project_path: "../../etc".into(), ..repo };
        let t = RepositoryUrlTemplate::parse("{gitlab}/{project_path}.git").unwrap();
        assert!(t.render("https://g", &escaping, "main").unwrap_err().contains("cannot be used"));
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;
    use serde_norway::Value;

    use super::*;
    use crate::auth::gitlab::GitalyRepository;

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

    fn gitaly() -> impl Strategy<Value = GitalyRepository> {
        let part =
            prop_oneof![Just("..".to_owned()), Just("a/../b".to_owned()), Just(String::new()), "[a-z?#/.@:-]{0,12}"];
        (part.clone(), part.clone(), part.clone(), part).prop_map(
            |(storage_name, relative_path, gl_repository, gl_project_path)| GitalyRepository {
                storage_name,
                relative_path,
                gl_repository,
                gl_project_path,
            },
        )
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

        /// Repository locations: a local path, a credential-free http(s) URL, or refused with a
        /// message that never repeats the credentials.
        #[test]
        fn arbitrary_repository_locations(s in prop_oneof![
            ".{0,30}",
            "(https?|ssh|git|file)://[a-z.:@]{0,12}(/[a-z.]{0,6}){0,3}",
            "https://user:SECRET@[a-z.]{1,10}/[a-z]{0,6}",
        ]) {
            match RepositoryLocation::parse(&s) {
                Ok(RepositoryLocation::Local(p)) => prop_assert!(!s.contains("://") && p.as_os_str() == s.as_str()),
                Ok(RepositoryLocation::Remote(url)) => {
                    prop_assert!(url.starts_with("http://") || url.starts_with("https://"));
                    let authority = url.split_once("://").unwrap().1.split('/').next().unwrap();
                    prop_assert!(!authority.is_empty() && !authority.contains('@'));
                    prop_assert!(url.parse::<http::Uri>().is_ok());
                }
                Err(e) => {
                    prop_assert!(!e.is_empty());
                    prop_assert!(!e.contains("SECRET"), "{e}");
                }
            }
        }

        /// `gitlab.repository_url` templates and GitLab's values: never a panic; only known
        /// placeholders are accepted, and a value that could leave the intended location (empty,
        /// `..`, `?`, `#`) is refused whenever its placeholder is used.
        #[test]
        fn arbitrary_repository_url_templates(
            template in prop_oneof![
                "[a-z:/{}._]{0,30}",
                "(https://g/|/srv/)?(\\{(gitlab|project_path|relative_path|storage_name|gl_repository)\\}/?){0,3}(\\.git)?",
            ],
            repo in gitaly(),
            gitlab in prop_oneof![Just("https://gitlab.example.com/".to_owned()), "[a-z:/.]{0,16}"],
            branch in "[a-z/]{0,8}",
        ) {
            let Ok(t) = RepositoryUrlTemplate::parse(&template) else { return Ok(()) };
            let mut rest = template.as_str();
            while let Some(start) = rest.find('{') {
                let end = start + rest[start..].find('}').unwrap();
                prop_assert!(TEMPLATE_PLACEHOLDERS.contains(&&rest[start + 1..end]));
                rest = &rest[end + 1..];
            }
            let values = [
                ("gitlab", gitlab.trim_end_matches('/')),
                ("project_path", repo.gl_project_path.as_str()),
                ("relative_path", repo.relative_path.as_str()),
                ("storage_name", repo.storage_name.as_str()),
                ("gl_repository", repo.gl_repository.as_str()),
            ];
            let unsafe_value = values.iter().any(|(name, v)| {
                template.contains(&format!("{{{name}}}"))
                    && (v.is_empty() || v.split('/').any(|s| s == "..") || v.contains(['?', '#']))
            });
            match t.render(&gitlab, &repo, &branch) {
                Ok(r) => {
                    prop_assert!(!unsafe_value, "{template} rendered with {values:?}: {r:?}");
                    prop_assert_eq!(r.branch.is_none(), branch.is_empty());
                }
                Err(e) => prop_assert!(!e.is_empty()),
            }
        }
    }
}
