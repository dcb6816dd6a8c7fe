//! What kas knows about an agent: who it is and where its configuration comes from. Shared by
//! authentication (which resolves tokens to identities) and the features that serve agents, so
//! it depends on neither.

pub mod access;
pub mod cluster_state;
pub mod document;
pub mod gitops;

use std::path::PathBuf;

use kas_proto::{AgentId, ProjectId};

pub use document::AgentConfigDocument;

/// Who an agent token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentIdentity {
    pub agent_id: AgentId,
    pub name: String,
    /// The agent's configuration project.
    pub project_id: ProjectId,
    /// Where its configuration comes from.
    pub configuration: ConfigurationOrigin,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

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
    }
}
