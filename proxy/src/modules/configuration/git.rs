//! Agent configuration from Git: `.gitlab/agents/<agent name>/config.yaml` on the default
//! branch (the repository's `HEAD`) of a local bare repository, read with gitoxide.
//!
//! The response's commit id is the commit's id, so agentk (which sends the last commit id it
//! applied) gets a configuration only when the commit changed. A missing file is an empty
//! configuration (as in GitLab); a file above [`MAX_CONFIG_BYTES`], or one that does not parse
//! strictly, is `FAILED_PRECONDITION` naming the file, the commit and the problem.

use std::path::Path;

use kas_proto::tunnel::pb;

use super::AgentConfigDocument;
use crate::error::KasError;

/// Largest configuration file accepted.
pub const MAX_CONFIG_BYTES: u64 = 128 * 1024;

/// The path of an agent's configuration file inside its configuration project.
pub fn config_path(agent_name: &str) -> String {
    format!(".gitlab/agents/{agent_name}/config.yaml")
}

/// Reads the agent's configuration at the repository's `HEAD` (blocking: call it from
/// `spawn_blocking`).
pub fn read_configuration(repository: &Path, agent_name: &str) -> Result<pb::ConfigurationResponse, KasError> {
    let repo_name = repository.display();
    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        KasError::Internal(format!("configuration repository {repo_name}: {what}: {e}"))
    };
    let repo = gix::open(repository).map_err(|e| unavailable("cannot open", &e))?;
    let commit = repo.head_commit().map_err(|e| unavailable("cannot resolve HEAD (the default branch)", &e))?;
    let commit_id = commit.id.to_string();
    let tree = commit.tree().map_err(|e| unavailable("cannot read the commit's tree", &e))?;
    let path = config_path(agent_name);
    let invalid = |problem: String| {
        KasError::InvalidAgentConfiguration(format!("agent configuration {path} at commit {commit_id}: {problem}"))
    };
    let entry = tree.lookup_entry_by_path(&path).map_err(|e| unavailable("cannot read the tree", &e))?;
    let document = match entry {
        None => AgentConfigDocument::default(),
        Some(entry) => {
            if !entry.mode().is_blob() {
                return Err(invalid("is not a regular file".into()));
            }
            let header = repo.find_header(entry.oid()).map_err(|e| unavailable("cannot read the file", &e))?;
            if header.size() > MAX_CONFIG_BYTES {
                return Err(invalid(format!(
                    "is {} bytes, larger than the limit of {MAX_CONFIG_BYTES} bytes",
                    header.size()
                )));
            }
            let object = entry.object().map_err(|e| unavailable("cannot read the file", &e))?;
            let text = std::str::from_utf8(&object.data).map_err(|_| invalid("is not UTF-8 text".into()))?;
            if text.trim().is_empty() {
                AgentConfigDocument::default()
            } else {
                serde_norway::from_str(text).map_err(|e| invalid(e.to_string()))?
            }
        }
    };
    Ok(pb::ConfigurationResponse { configuration: Some(document.to_proto()), commit_id })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;
    use std::process::Command;

    use super::*;

    /// A bare repository (default branch `main`) and a work tree that pushes to it, driven by
    /// the git command line (a repository as git itself writes it).
    pub struct TestRepo {
        pub bare: PathBuf,
        work: PathBuf,
        _dir: tempfile::TempDir,
    }

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=kas-test", "-c", "user.email=kas@test.invalid"])
            .args(args)
            .output()
            .expect("git must be installed");
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    impl TestRepo {
        pub fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let bare = dir.path().join("config.git");
            let work = dir.path().join("work");
            git(dir.path(), &["init", "-q", "--bare", "--initial-branch=main", "config.git"]);
            git(dir.path(), &["init", "-q", "--initial-branch=main", "work"]);
            Self { bare, work, _dir: dir }
        }

        /// Commits `content` at `path` and pushes; returns the commit id.
        pub fn commit(&self, path: &str, content: &[u8]) -> String {
            let file = self.work.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, content).unwrap();
            git(&self.work, &["add", "-A"]);
            git(&self.work, &["commit", "-q", "--allow-empty", "-m", "change"]);
            git(&self.work, &["push", "-q", self.bare.to_str().unwrap(), "main"]);
            git(&self.work, &["rev-parse", "HEAD"])
        }
    }

    #[test]
    fn reads_the_file_of_the_agent_at_head() {
        let repo = TestRepo::new();
        let first = repo.commit(".gitlab/agents/a/config.yaml", b"observability:\n  logging:\n    level: debug\n");
        let r = read_configuration(&repo.bare, "a").unwrap();
        assert_eq!(r.commit_id, first);
        assert_eq!(r.configuration.unwrap().observability.unwrap().logging.unwrap().level, "debug");
        // Another agent of the same project has no file: empty configuration.
        let r = read_configuration(&repo.bare, "b").unwrap();
        assert_eq!(r.configuration.unwrap(), pb::AgentConfiguration::default());

        let second = repo.commit(".gitlab/agents/a/config.yaml", b"observability:\n  logging:\n    level: warn\n");
        let r = read_configuration(&repo.bare, "a").unwrap();
        assert_eq!(r.commit_id, second);
        assert_eq!(r.configuration.unwrap().observability.unwrap().logging.unwrap().level, "warn");
    }

    #[test]
    fn invalid_or_large_files_are_failed_precondition() {
        let repo = TestRepo::new();
        repo.commit(".gitlab/agents/a/config.yaml", b"observability:\n  loging: {}\n");
        let e = read_configuration(&repo.bare, "a").unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::FailedPrecondition);
        let m = e.to_string();
        assert!(m.contains(".gitlab/agents/a/config.yaml") && m.contains("unknown field `loging`"), "{m}");

        let big = format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES as usize));
        repo.commit(".gitlab/agents/a/config.yaml", big.as_bytes());
        let e = read_configuration(&repo.bare, "a").unwrap_err();
        assert!(e.to_string().contains("larger than the limit of 131072 bytes"), "{e}");

        let e = read_configuration(Path::new("/nonexistent/repo.git"), "a").unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::Internal);
    }
}
