//! Static users (`auth.users_file`): people who use the Kubernetes API proxy without GitLab, in
//! standalone mode. The file holds each user's name, the SHA-256 of their token (never the
//! token), and the groups and projects they are a member of; an agent's `user_access` decides
//! which of them may use it, as GitLab's memberships would.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::agent::access::check_full_path;
use crate::error::KasError;

/// Static user tokens start with this, so the Kubernetes proxy tells them from other credentials.
pub const STATIC_USER_TOKEN_PREFIX: &str = "kasu_";

/// One user of the users file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticUser {
    /// The user name (impersonated as `gitlab:user:<name>` with `access_as: {user: {}}`).
    pub name: String,
    /// Lower-case hex SHA-256 of the user's token.
    pub token_sha256: String,
    /// Full paths of the groups the user is a member of (and so of their subgroups and projects).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Full paths of the projects the user is a member of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticUsersFile {
    #[serde(default)]
    pub users: Vec<StaticUser>,
}

#[derive(Debug, thiserror::Error)]
pub enum StaticUsersError {
    #[error("cannot read users file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("invalid users file {path}: {message}")]
    Invalid { path: String, message: String },
    #[error("cannot write users file {path}: {source}")]
    Write { path: String, source: std::io::Error },
}

/// A new random user token (256 bits).
pub fn generate_user_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("{STATIC_USER_TOKEN_PREFIX}{}", hex::encode(bytes))
}

impl StaticUsersFile {
    pub fn load(path: &Path) -> Result<Self, StaticUsersError> {
        let p = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| StaticUsersError::Read { path: p.clone(), source })?;
        let file: Self = if text.trim().is_empty() {
            Self::default()
        } else {
            serde_norway::from_str(&text)
                .map_err(|e| StaticUsersError::Invalid { path: p.clone(), message: e.to_string() })?
        };
        file.validate().map_err(|message| StaticUsersError::Invalid { path: p, message })?;
        Ok(file)
    }

    /// Writes the file (0600) through a temporary file and a rename.
    pub fn save(&self, path: &Path) -> Result<(), StaticUsersError> {
        let p = path.display().to_string();
        let text = serde_norway::to_string(self)
            .map_err(|e| StaticUsersError::Invalid { path: p.clone(), message: e.to_string() })?;
        crate::tools::private_file::replace(path, text.as_bytes())
            .map_err(|source| StaticUsersError::Write { path: p, source })
    }

    /// The file at `path` (empty if missing) with `user` appended, validated as kas loads it.
    pub fn with_added(path: &Path, user: StaticUser) -> Result<Self, StaticUsersError> {
        let mut file = if path.exists() { Self::load(path)? } else { Self::default() };
        if file.users.iter().any(|u| u.name == user.name) {
            return Err(StaticUsersError::Invalid {
                path: path.display().to_string(),
                message: format!("user \"{}\" is already in the file", user.name),
            });
        }
        file.users.push(user);
        file.validate().map_err(|message| StaticUsersError::Invalid { path: path.display().to_string(), message })?;
        Ok(file)
    }

    fn validate(&self) -> Result<(), String> {
        let mut names = HashSet::new();
        let mut hashes = HashSet::new();
        for (i, u) in self.users.iter().enumerate() {
            let at = format!("users[{i}]");
            let name_ok = !u.name.is_empty()
                && u.name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !name_ok {
                return Err(format!("{at}.name \"{}\" must be letters, digits, '_', '-' or '.'", u.name));
            }
            let hash = u.token_sha256.to_ascii_lowercase();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("{at}.token_sha256 must be 64 hex characters (the SHA-256 of the token)"));
            }
            if !names.insert(u.name.as_str()) {
                return Err(format!("{at}.name \"{}\" appears twice", u.name));
            }
            if !hashes.insert(hash) {
                return Err(format!("{at}.token_sha256 is used by another user"));
            }
            for (key, paths) in [("groups", &u.groups), ("projects", &u.projects)] {
                for (j, p) in paths.iter().enumerate() {
                    check_full_path(p).map_err(|e| format!("{at}.{key}[{j}] {e}"))?;
                }
            }
        }
        Ok(())
    }
}

/// The users of the users file, by token hash.
#[derive(Debug, Clone, Default)]
pub struct StaticUsers {
    by_hash: HashMap<[u8; 32], StaticUser>,
}

impl StaticUsers {
    pub fn from_file(path: &Path) -> Result<Self, StaticUsersError> {
        Ok(Self::new(StaticUsersFile::load(path)?))
    }

    pub fn new(file: StaticUsersFile) -> Self {
        let mut by_hash = HashMap::new();
        for u in file.users {
            let mut hash = [0u8; 32];
            if hex::decode_to_slice(u.token_sha256.to_ascii_lowercase(), &mut hash).is_ok() {
                by_hash.insert(hash, u);
            }
        }
        Self { by_hash }
    }

    /// The user a token belongs to, or `Unauthenticated`.
    pub fn verify(&self, token: &str) -> Result<&StaticUser, KasError> {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.by_hash.get(&hash).ok_or_else(|| KasError::Unauthenticated("invalid kas user token".into()))
    }
}

impl StaticUser {
    /// Whether the user is a member of the project or group at `path`: listed, or under one of
    /// the user's groups (GitLab's membership is inherited by subgroups and projects).
    pub fn is_member_of(&self, path: &str) -> bool {
        let under = |group: &String| path.strip_prefix(group.as_str()).is_some_and(|rest| rest.starts_with('/'));
        self.projects.iter().any(|p| p == path) || self.groups.iter().any(|g| g == path || under(g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::agent_token::token_sha256_hex;

    fn user(name: &str, token: &str) -> StaticUser {
        StaticUser {
            name: name.into(),
            token_sha256: token_sha256_hex(token),
            groups: vec!["platform".into()],
            projects: vec!["web/shop".into()],
        }
    }

    #[test]
    fn membership_is_inherited_from_groups_only() {
        let u = user("alice", "t");
        for (path, member) in [
            ("platform", true),
            ("platform/infra", true),
            ("platform/infra/app", true),
            ("platformer", false),
            ("web/shop", true),
            ("web", false),
            ("web/shop/sub", false),
        ] {
            assert_eq!(u.is_member_of(path), member, "{path}");
        }
    }

    #[test]
    fn tokens_resolve_to_their_user_and_nothing_else() {
        let token = generate_user_token();
        assert!(token.starts_with(STATIC_USER_TOKEN_PREFIX) && token.len() == 5 + 64);
        let users = StaticUsers::new(StaticUsersFile { users: vec![user("alice", &token), user("bob", "other")] });
        assert_eq!(users.verify(&token).unwrap().name, "alice");
        assert_eq!(users.verify("other").unwrap().name, "bob");
        let e = users.verify("kasu_nope").unwrap_err().to_string();
        assert!(e.contains("invalid kas user token") && !e.contains("nope"), "{e}");
    }

    #[test]
    fn the_file_is_checked_with_the_key_named_and_written_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.yaml");
        let file = StaticUsersFile::with_added(&path, user("alice", "a")).unwrap();
        file.save(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(StaticUsersFile::load(&path).unwrap(), file);
        let e = StaticUsersFile::with_added(&path, user("alice", "b")).unwrap_err().to_string();
        assert!(e.contains("user \"alice\" is already in the file"), "{e}");
        let e = StaticUsersFile::with_added(&path, user("bob", "a")).unwrap_err().to_string();
        assert!(e.contains("users[1].token_sha256 is used by another user"), "{e}");
        for (text, expected) in [
            ("users: [{name: a, token_sha256: abc}]", "users[0].token_sha256 must be 64 hex"),
            ("users: [{name: 'a b', token_sha256: abc}]", "users[0].name \"a b\""),
            ("users: [{name: a, token: x}]", "unknown field `token`"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = StaticUsersFile::load(&path).unwrap_err().to_string();
            assert!(e.contains(expected), "{text}: {e}");
        }
        let hash = token_sha256_hex("x");
        std::fs::write(&path, format!("users: [{{name: a, token_sha256: {hash}, groups: ['a//b']}}]")).unwrap();
        let e = StaticUsersFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("users[0].groups[0]"), "{e}");
        std::fs::write(&path, "").unwrap();
        assert_eq!(StaticUsersFile::load(&path).unwrap(), StaticUsersFile::default());
    }
}
