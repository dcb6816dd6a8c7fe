//! Where a manifest project's repository is.
//!
//! Static agents name repositories directly (`gitops.manifest_projects[].id` is a local path or
//! an `http(s)://` URL). In GitLab mode the id is a GitLab project path, and kas asks GitLab's
//! internal `project_info` API with the agent's own token, as the reference kas does: GitLab
//! answers where the repository is and its default branch if the agent may read the project,
//! 403 (PERMISSION_DENIED) if it may not, 404 (NOT_FOUND) if there is no such project. The
//! repository is then located like the agent's configuration project (`gitlab.repository_url`).
//! Answers are cached per agent token and project (`gitops.project_info_cache`).

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::config::ProjectInfoCacheConfig;
use crate::agent::RepositoryLocation;
use crate::auth::gitlab::{GitlabClient, ProjectInfo, RepositoryUrlTemplate};
use crate::error::KasError;
use crate::tools::ttl_cache::TtlCache;

/// A manifest project's repository as kas reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub location: RepositoryLocation,
    /// The default branch GitLab named; `None`: the repository's `HEAD`.
    pub default_branch: Option<String>,
    /// GitLab's numeric id of the project (GitLab mode), so that a push naming only the id is
    /// recognised.
    pub gitlab_project_id: Option<i64>,
}

/// Locates manifest projects: by their id (static agents) or through GitLab.
pub enum ManifestRepositories {
    Static,
    Gitlab(GitlabProjects),
}

/// GitLab mode: project_info behind a cache.
pub struct GitlabProjects {
    client: Arc<GitlabClient>,
    cache: TtlCache<ProjectInfo>,
    repositories: RepositoryUrlTemplate,
    address: String,
}

impl GitlabProjects {
    pub fn new(
        client: Arc<GitlabClient>,
        repositories: RepositoryUrlTemplate,
        address: String,
        cache: &ProjectInfoCacheConfig,
    ) -> Self {
        Self { client, cache: TtlCache::new(cache.ttl, cache.error_ttl, cache.max_entries), repositories, address }
    }
}

impl ManifestRepositories {
    /// Where the manifest project `id` of the agent holding `token` is.
    pub async fn locate(&self, token: &str, id: &str) -> Result<Located, KasError> {
        match self {
            Self::Static => {
                let location = RepositoryLocation::parse(id)
                    .map_err(|e| KasError::InvalidAgentConfiguration(format!("manifest project \"{id}\": {e}")))?;
                Ok(Located { location, default_branch: None, gitlab_project_id: None })
            }
            Self::Gitlab(gitlab) => {
                // The token itself is not kept: the key is a digest of it and the project.
                let mut digest = Sha256::new();
                digest.update(token.as_bytes());
                digest.update([0]);
                digest.update(id.as_bytes());
                let key: [u8; 32] = digest.finalize().into();
                let info = gitlab.cache.get_or_fetch(key, || gitlab.client.project_info(token, id)).await?;
                let repository = info
                    .repository(&gitlab.repositories, &gitlab.address)
                    .map_err(|e| KasError::GitlabUnavailable(format!("manifest project \"{id}\": {e}")))?;
                Ok(Located {
                    location: repository.location,
                    default_branch: repository.branch,
                    gitlab_project_id: Some(info.project_id),
                })
            }
        }
    }
}
