//! Agent configuration from Git: `.gitlab/agents/<agent name>/config.yaml` at a commit of a
//! bare repository on this machine (the repository itself, or kas's mirror of a remote one),
//! read with gitoxide.
//!
//! The response's commit id is the commit's id, so agentk (which sends the last commit id it
//! applied) gets a configuration only when the commit changed. A missing file is an empty
//! configuration (as in GitLab); a file above the size limit, or one that does not parse
//! strictly, is `FAILED_PRECONDITION` naming the file, the commit and the problem.

use std::path::Path;

use kas_proto::tunnel::pb;

use crate::agent::AgentConfigDocument;
use crate::error::KasError;

/// The path of an agent's configuration file inside its configuration project.
pub fn config_path(agent_name: &str) -> String {
    format!(".gitlab/agents/{agent_name}/config.yaml")
}

/// Opens a repository with none of the machine's or user's Git configuration (no credential
/// helpers, no URL rewrites): kas's behaviour must not depend on the host.
pub(super) fn open(repository: &Path) -> Result<gix::Repository, KasError> {
    gix::open_opts(repository, gix::open::Options::isolated()).map_err(|e| unavailable(repository, "cannot open", &e))
}

pub(super) fn unavailable(repository: &Path, what: &str, e: &(dyn std::error::Error + 'static)) -> KasError {
    KasError::GitUnavailable(format!("configuration repository {}: {what}: {}", repository.display(), describe(e)))
}

/// An error and its innermost cause (e.g. "Transport handshake failed: invalid peer
/// certificate: UnknownIssuer"): the middle of gitoxide's chains only repeats them.
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut innermost = e;
    while let Some(next) = innermost.source() {
        innermost = next;
    }
    let (top, cause) = (e.to_string(), innermost.to_string());
    if std::ptr::addr_eq(e, innermost) || top.contains(&cause) { top } else { format!("{top}: {cause}") }
}

/// The commit `branch` (`None`: `HEAD`, the default branch) of a local repository points to.
/// Blocking.
pub fn resolve_branch(repository: &Path, branch: Option<&str>) -> Result<String, KasError> {
    let repo = open(repository)?;
    let name = branch.map_or_else(|| "HEAD".to_owned(), |b| format!("refs/heads/{b}"));
    let mut reference = repo
        .find_reference(name.as_str())
        .map_err(|e| unavailable(repository, &format!("cannot find {name} (the default branch)"), &e))?;
    let commit =
        reference.peel_to_commit().map_err(|e| unavailable(repository, &format!("cannot resolve {name}"), &e))?;
    Ok(commit.id.to_string())
}

/// Reads the agent's configuration at `commit` (a 40-hex commit id). Blocking.
pub fn read_configuration_at(
    repository: &Path,
    commit_id: &str,
    agent_name: &str,
    max_bytes: u64,
) -> Result<pb::ConfigurationResponse, KasError> {
    let document = read_document_at(repository, commit_id, agent_name, max_bytes)?;
    Ok(pb::ConfigurationResponse { configuration: Some(document.to_proto()), commit_id: commit_id.to_owned() })
}

/// The agent's configuration document at `commit` (empty when the file is absent). Blocking.
pub fn read_document_at(
    repository: &Path,
    commit_id: &str,
    agent_name: &str,
    max_bytes: u64,
) -> Result<AgentConfigDocument, KasError> {
    let repo = open(repository)?;
    let id = gix::ObjectId::from_hex(commit_id.as_bytes()).map_err(|e| unavailable(repository, "bad commit id", &e))?;
    let commit = repo.find_commit(id).map_err(|e| unavailable(repository, "cannot read the commit", &e))?;
    let tree = commit.tree().map_err(|e| unavailable(repository, "cannot read the commit's tree", &e))?;
    let path = config_path(agent_name);
    let invalid = |problem: String| {
        KasError::InvalidAgentConfiguration(format!("agent configuration {path} at commit {commit_id}: {problem}"))
    };
    let entry = tree.lookup_entry_by_path(&path).map_err(|e| unavailable(repository, "cannot read the tree", &e))?;
    let document = match entry {
        None => AgentConfigDocument::default(),
        Some(entry) => {
            if !entry.mode().is_blob() {
                return Err(invalid("is not a regular file".into()));
            }
            let header =
                repo.find_header(entry.oid()).map_err(|e| unavailable(repository, "cannot read the file", &e))?;
            if header.size() > max_bytes {
                return Err(invalid(format!(
                    "is {} bytes, larger than the limit of {max_bytes} bytes (agents.git.max_config_bytes)",
                    header.size()
                )));
            }
            let object = entry.object().map_err(|e| unavailable(repository, "cannot read the file", &e))?;
            let text = std::str::from_utf8(&object.data).map_err(|_| invalid("is not UTF-8 text".into()))?;
            AgentConfigDocument::parse(text).map_err(invalid)?
        }
    };
    Ok(document)
}

/// The configuration at the default branch of a local repository. Blocking.
#[cfg(test)]
pub fn read_configuration(
    repository: &Path,
    agent_name: &str,
    max_bytes: u64,
) -> Result<pb::ConfigurationResponse, KasError> {
    let commit = resolve_branch(repository, None)?;
    read_configuration_at(repository, &commit, agent_name, max_bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;
    use std::process::Command;

    use super::*;

    const MAX: u64 = super::super::config::DEFAULT_MAX_CONFIG_BYTES;

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

        /// Tags the work tree's HEAD (`annotated`: with a tag object) and pushes the tag.
        pub fn tag(&self, name: &str, annotated: bool) {
            if annotated {
                git(&self.work, &["tag", "-a", "-m", "release", name]);
            } else {
                git(&self.work, &["tag", name]);
            }
            git(&self.work, &["push", "-q", self.bare.to_str().unwrap(), &format!("refs/tags/{name}")]);
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
        let r = read_configuration(&repo.bare, "a", MAX).unwrap();
        assert_eq!(r.commit_id, first);
        assert_eq!(r.configuration.unwrap().observability.unwrap().logging.unwrap().level, "debug");
        // Another agent of the same project has no file: empty configuration.
        let r = read_configuration(&repo.bare, "b", MAX).unwrap();
        assert_eq!(r.configuration.unwrap(), pb::AgentConfiguration::default());

        let second = repo.commit(".gitlab/agents/a/config.yaml", b"observability:\n  logging:\n    level: warn\n");
        let r = read_configuration(&repo.bare, "a", MAX).unwrap();
        assert_eq!(r.commit_id, second);
        assert_eq!(r.configuration.unwrap().observability.unwrap().logging.unwrap().level, "warn");
    }

    #[test]
    fn invalid_or_large_files_are_failed_precondition() {
        let repo = TestRepo::new();
        repo.commit(".gitlab/agents/a/config.yaml", b"observability:\n  loging: {}\n");
        let e = read_configuration(&repo.bare, "a", MAX).unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::FailedPrecondition);
        let m = e.to_string();
        assert!(m.contains(".gitlab/agents/a/config.yaml") && m.contains("unknown field `loging`"), "{m}");

        let big = format!("# {}\n", "x".repeat(MAX as usize));
        repo.commit(".gitlab/agents/a/config.yaml", big.as_bytes());
        let e = read_configuration(&repo.bare, "a", MAX).unwrap_err();
        assert!(e.to_string().contains("larger than the limit of 131072 bytes"), "{e}");

        let e = read_configuration(Path::new("/nonexistent/repo.git"), "a", MAX).unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::Unavailable);
    }
}
