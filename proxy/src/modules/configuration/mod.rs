//! Agent configuration: the documented schema of what agentk receives on `GetConfiguration`,
//! and where it comes from (the static agents file, or `.gitlab/agents/<name>/config.yaml` in
//! a Git repository: a local path or a remote one over HTTP(S)).
//!
//! The YAML form is parsed strictly: unknown fields are an error.

pub mod config;
pub mod git;
pub mod metrics;
pub mod mirror;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kas_proto::tunnel::pb;
use sha2::{Digest, Sha256};

pub use config::AgentGitConfig;

use crate::agent::{AgentConfigDocument, AgentIdentity, ConfigurationOrigin, GitRepository, RepositoryLocation};
use crate::error::KasError;
use crate::tools::token_bucket::TokenBucket;
use crate::tools::ttl_cache::TtlCache;

/// Where agent configurations come from.
#[async_trait::async_trait]
pub trait ConfigurationSource: Send + Sync + 'static {
    /// The agent's current configuration.
    async fn configuration(&self, agent: &AgentIdentity) -> Result<pb::ConfigurationResponse, KasError> {
        self.configuration_since(agent, None).await
    }

    /// The agent's configuration, read at `since` or later when given (a push to its
    /// configuration project arrived then: a shared read begun earlier may not have seen it).
    async fn configuration_since(
        &self,
        agent: &AgentIdentity,
        since: Option<tokio::time::Instant>,
    ) -> Result<pb::ConfigurationResponse, KasError>;

    /// The agent's current configuration document, with what only kas reads (`ci_access`,
    /// `user_access`).
    async fn document(&self, agent: &AgentIdentity) -> Result<AgentConfigDocument, KasError>;
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

    /// The commit `repository`'s branch points to, and the directory to read it from (shared
    /// polls, the token bucket, kas's mirror for remote repositories).
    pub async fn resolve(&self, repository: &GitRepository) -> Result<(PathBuf, String), KasError> {
        self.resolve_since(repository, None).await
    }

    /// [`AgentConfigurations::resolve`] with a read that began at `since` or later (a push
    /// arrived then: a read that began before it may not have seen it). Polls passing the same
    /// `since` still share one read.
    pub async fn resolve_since(
        &self,
        repository: &GitRepository,
        since: Option<tokio::time::Instant>,
    ) -> Result<(PathBuf, String), KasError> {
        let key: [u8; 32] = Sha256::digest(format!("{:?}", repository)).into();
        let commit = self
            .commits
            .get_or_fetch_since(key, since, || async {
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
                metrics::git_poll(result.is_ok(), remote, started.elapsed());
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
    async fn configuration_since(
        &self,
        agent: &AgentIdentity,
        since: Option<tokio::time::Instant>,
    ) -> Result<pb::ConfigurationResponse, KasError> {
        let repository = match source_of(agent)? {
            Source::Git(repository) => repository,
            Source::Fixed(document) => return Ok(document.to_response()),
        };
        let (dir, commit) = self.resolve_since(repository, since).await?;
        let (name, max) = (agent.name.clone(), self.max_config_bytes);
        blocking(move || git::read_configuration_at(&dir, &commit, &name, max)).await
    }

    async fn document(&self, agent: &AgentIdentity) -> Result<AgentConfigDocument, KasError> {
        let repository = match source_of(agent)? {
            Source::Git(repository) => repository,
            Source::Fixed(document) => return Ok(document.clone()),
        };
        let (dir, commit) = self.resolve(repository).await?;
        let (name, max) = (agent.name.clone(), self.max_config_bytes);
        blocking(move || git::read_document_at(&dir, &commit, &name, max)).await
    }
}

/// Whether a push (`KasApi.GitPushEvent`) is to the agent's configuration project: GitLab's id
/// of it (the agent's project id, GitLab mode), or its repository as the static agents file names
/// it (`configuration_repository`). Fixed configurations are never pushed to.
pub fn is_pushed(agent: &AgentIdentity, push: &crate::registry::GitPush) -> bool {
    match &agent.configuration {
        ConfigurationOrigin::Git(repository) => {
            (push.project.id > 0 && push.project.id == agent.project_id.0)
                || push.project.full_path == repository.location.to_string()
        }
        ConfigurationOrigin::Static(_) | ConfigurationOrigin::Unusable(_) => false,
    }
}

/// Where an agent's configuration is read from.
enum Source<'a> {
    Fixed(&'a AgentConfigDocument),
    Git(&'a GitRepository),
}

fn source_of(agent: &AgentIdentity) -> Result<Source<'_>, KasError> {
    match &agent.configuration {
        ConfigurationOrigin::Static(document) => Ok(Source::Fixed(document)),
        ConfigurationOrigin::Git(repository) => Ok(Source::Git(repository)),
        ConfigurationOrigin::Unusable(problem) => Err(KasError::InvalidAgentConfiguration(format!(
            "the configuration of agent {} cannot be read: {problem}",
            agent.agent_id
        ))),
    }
}

/// The feature's registration (see [`crate::modules::Module`]). Its service is the
/// specification's `AgentTunnel.GetConfiguration` (the agent listener's presence stream).
pub struct Configuration;

impl super::Module for Configuration {
    fn name(&self) -> &'static str {
        "configuration"
    }

    fn describe_metrics(&self) {
        metrics::describe();
    }
}
