//! kas's copies of remote configuration repositories (Git over HTTP(S), with gitoxide).
//!
//! Each repository + branch gets a bare mirror under the mirror directory holding that one
//! branch, fetched into `refs/kas/config`. A poll is one fetch: a ref listing when nothing
//! changed, plus a pack of the new objects when something did. Fetches run with none of the
//! host's Git configuration; credentials come only from `agents.git`, and are sent only on
//! the server's request (HTTP 401), never in URLs or logs.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use gix::protocol::transport::client::blocking_io::http;
use sha2::{Digest, Sha256};

use super::config::AgentGitConfig;
use super::git::{describe, open, unavailable};
use crate::auth::Secret;
use crate::error::KasError;

/// The local ref each mirror fetches its branch into.
const MIRROR_REF: &str = "refs/kas/config";
/// A mirror no agent polled for this long is deleted (its agents went away; disk is reclaimed).
const MIRROR_IDLE_TTL: Duration = Duration::from_secs(3600);
/// How often fetches look for idle mirrors.
const SWEEP_PERIOD: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum MirrorSetupError {
    #[error("agents.git.mirror_dir: cannot create {path}: {source}")]
    Dir { path: String, source: std::io::Error },
    #[error("agents.git.password_file: cannot read {path}: {source}")]
    Password { path: String, source: std::io::Error },
    #[error("agents.git.password_file: {path} is empty")]
    EmptyPassword { path: String },
    #[error("agents.git.ca_cert_file: {0}")]
    Ca(String),
}

/// HTTP basic credentials for remote repositories (the password never reaches Debug output).
struct Credentials {
    username: String,
    password: Secret,
}

pub struct Mirrors {
    dir: PathBuf,
    /// Owns the default (temporary) mirror directory, removed when kas stops.
    _temporary: Option<tempfile::TempDir>,
    credentials: Option<Arc<Credentials>>,
    /// PEM bundle trusted for https repositories, besides the system's roots.
    ca_pem: Option<Arc<Vec<u8>>>,
    connect_timeout: Duration,
    fetch_timeout: Duration,
    /// When each mirror this kas made was last fetched, and when idle ones were last swept.
    /// Only blocking fetch threads take the lock, never across an `.await`.
    usage: std::sync::Mutex<Usage>,
    /// At least [`MIRROR_IDLE_TTL`]; longer with a long poll period (see `AgentConfigurations`).
    pub(super) idle_ttl: Duration,
}

#[derive(Default)]
struct Usage {
    last_fetch: std::collections::HashMap<PathBuf, std::time::Instant>,
    last_sweep: Option<std::time::Instant>,
}

impl Mirrors {
    pub fn new(config: &AgentGitConfig) -> Result<Self, MirrorSetupError> {
        let (dir, temporary) = match &config.mirror_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|source| MirrorSetupError::Dir { path: dir.display().to_string(), source })?;
                (dir.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new().prefix("kas-git-mirrors-").tempdir().map_err(|source| {
                    MirrorSetupError::Dir { path: std::env::temp_dir().display().to_string(), source }
                })?;
                (t.path().to_owned(), Some(t))
            }
        };
        let credentials = match (&config.username, &config.password_file) {
            (Some(username), Some(file)) => {
                let path = file.display().to_string();
                let text = std::fs::read_to_string(file)
                    .map_err(|source| MirrorSetupError::Password { path: path.clone(), source })?;
                let password = text.trim_end_matches(['\r', '\n']);
                if password.is_empty() {
                    return Err(MirrorSetupError::EmptyPassword { path });
                }
                Some(Arc::new(Credentials {
                    username: username.clone(),
                    password: Secret::new(password.as_bytes().to_vec()),
                }))
            }
            _ => None,
        };
        let ca_pem = match &config.ca_cert_file {
            Some(file) => Some(Arc::new(crate::tools::tls::read_ca_bundle(file).map_err(MirrorSetupError::Ca)?)),
            None => None,
        };
        Ok(Self {
            dir,
            _temporary: temporary,
            credentials,
            ca_pem,
            connect_timeout: config.connect_timeout,
            fetch_timeout: config.fetch_timeout,
            usage: std::sync::Mutex::default(),
            idle_ttl: MIRROR_IDLE_TTL,
        })
    }

    /// Records that `path` is in use and, every [`SWEEP_PERIOD`], deletes the mirrors nobody
    /// fetched for `idle_ttl`. Under the lock, so a mirror is never deleted while its fetch
    /// starts (fetches of one mirror are already one at a time: polls are shared per repository).
    fn touch_and_sweep(&self, path: &std::path::Path) {
        let now = std::time::Instant::now();
        let mut usage = self.usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        usage.last_fetch.insert(path.to_owned(), now);
        if usage.last_sweep.is_some_and(|t| now.duration_since(t) < SWEEP_PERIOD.min(self.idle_ttl)) {
            return;
        }
        usage.last_sweep = Some(now);
        let idle: Vec<PathBuf> = usage
            .last_fetch
            .iter()
            .filter(|(p, t)| p.as_path() != path && now.duration_since(**t) >= self.idle_ttl)
            .map(|(p, _)| p.clone())
            .collect();
        for p in idle {
            usage.last_fetch.remove(&p);
            if let Err(e) = std::fs::remove_dir_all(&p) {
                tracing::warn!(mirror = %p.display(), error = %e, "cannot delete an idle configuration mirror");
            }
        }
    }

    /// The mirror of `url`'s `branch` (`None`: the remote's `HEAD`).
    pub fn path(&self, url: &str, branch: Option<&str>) -> PathBuf {
        let digest = Sha256::digest(format!("{url}\n{}", branch.unwrap_or("HEAD")));
        self.dir.join(format!("{}.git", hex::encode(&digest[..12])))
    }

    /// Fetches `branch` of `url` into its mirror; returns the commit it points to. Blocking.
    pub fn fetch(&self, url: &str, branch: Option<&str>) -> Result<String, KasError> {
        let path = self.path(url, branch);
        self.touch_and_sweep(&path);
        let failed = |what: &str, e: &(dyn std::error::Error + 'static)| {
            let mut cause = describe(e);
            if cause.contains("application/x-git-upload-pack-advertisement") {
                // gitoxide's words for "this answer is not Git's": say what that usually means.
                cause.push_str(
                    " (the server did not answer as a Git server: a redirect, which kas does not follow, a login \
                     page, or a wrong URL)",
                );
            }
            let lower = cause.to_lowercase();
            if lower.contains("timed out") || lower.contains("deadline has elapsed") {
                // Name the settings, so an operator knows which knob bounds the wait.
                cause.push_str(&format!(
                    " (kas waits agents.git.connect_timeout = {} to connect and agents.git.fetch_timeout = {} \
                     for each request)",
                    crate::error::Rounded(self.connect_timeout),
                    crate::error::Rounded(self.fetch_timeout),
                ));
            }
            KasError::GitUnavailable(format!("configuration repository {url}: {what}: {cause}"))
        };
        if !path.join("HEAD").exists() {
            // A mirror whose creation was cut short (kas stopped) is started over.
            let _ = std::fs::remove_dir_all(&path);
            gix::init_bare(&path).map_err(|e| unavailable(&path, "cannot create the mirror", &e))?;
        }
        let repo = open(&path)?;
        let source = branch.map_or_else(|| "HEAD".to_owned(), |b| format!("refs/heads/{b}"));
        let remote = repo
            .remote_at(url)
            .map_err(|e| failed("invalid URL", &e))?
            .with_fetch_tags(gix::remote::fetch::Tags::None)
            .with_refspecs([format!("+{source}:{MIRROR_REF}").as_str()], gix::remote::Direction::Fetch)
            .map_err(|e| failed("invalid branch", &e))?;
        let mut options = match repo.transport_options(url, None) {
            Ok(Some(options)) => options.downcast::<http::Options>().map(|o| *o).unwrap_or_default(),
            _ => http::Options::default(),
        };
        options.connect_timeout = Some(self.connect_timeout);
        // Like kas's GitLab client: a redirect is an error, never a second host seeing the
        // credentials.
        options.follow_redirects = http::options::FollowRedirects::None;
        options.user_agent = Some(format!("kas/{}", crate::VERSION));
        options.backend = Some(Arc::new(std::sync::Mutex::new(self.reqwest_options())));
        let credentials = self.credentials.clone();
        let connection = remote
            .connect(gix::remote::Direction::Fetch)
            .map_err(|e| failed("cannot connect", &e))?
            .with_transport_options(Box::new(options))
            .with_credentials(move |action| authenticate(credentials.as_deref(), action));
        let interrupt = AtomicBool::new(false);
        connection
            .prepare_fetch(gix::progress::Discard, Default::default())
            .map_err(|e| failed(&format!("cannot list {source}"), &e))?
            .receive(gix::progress::Discard, &interrupt)
            .map_err(|e| failed(&format!("cannot fetch {source}"), &e))?;
        let mut reference =
            repo.find_reference(MIRROR_REF).map_err(|e| failed(&format!("{source} was not fetched"), &e))?;
        let commit =
            reference.peel_to_commit().map_err(|e| failed(&format!("{source} does not point to a commit"), &e))?;
        Ok(commit.id.to_string())
    }

    /// The reqwest client of gitoxide's HTTP transport: request timeout, private CA, and
    /// rustls with ring like the rest of kas.
    fn reqwest_options(&self) -> http::reqwest::Options {
        let (ca_pem, timeout, connect_timeout) = (self.ca_pem.clone(), self.fetch_timeout, self.connect_timeout);
        http::reqwest::Options {
            configure_client: Some(Box::new(move |builder| {
                // reqwest is built without a default crypto provider; kas uses ring.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let mut builder = builder.timeout(timeout).connect_timeout(connect_timeout);
                if let Some(pem) = &ca_pem {
                    let certs = reqwest_git::Certificate::from_pem_bundle(pem).map_err(|e| {
                        gix::error::message!("agents.git.ca_cert_file holds no usable certificate: {e}")
                    })?;
                    for cert in certs {
                        builder = builder.add_root_certificate(cert);
                    }
                }
                Ok(builder)
            })),
            configure_request: None,
        }
    }
}

/// Answers gitoxide's request for credentials (made after an HTTP 401) from `agents.git`.
fn authenticate(
    credentials: Option<&Credentials>,
    action: gix::credentials::helper::Action,
) -> gix::Result<Option<gix::credentials::protocol::Outcome>> {
    use gix::credentials::helper::Action;
    match action {
        Action::Get(context) => match credentials {
            Some(c) => Ok(Some(gix::credentials::protocol::Outcome {
                identity: gix::sec::identity::Account {
                    username: c.username.clone(),
                    password: String::from_utf8_lossy(c.password.bytes()).into_owned(),
                    oauth_refresh_token: None,
                },
                next: context.into(),
            })),
            None => Err(gix::error::message(
                "the repository requires authentication: set agents.git.username and agents.git.password_file",
            )
            .into()),
        },
        Action::Store(_) | Action::Erase(_) => Ok(None),
    }
}

impl std::fmt::Debug for Mirrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirrors")
            .field("dir", &self.dir)
            .field("credentials", &self.credentials.as_ref().map(|c| c.username.as_str()))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modules::configuration::git::tests::TestRepo;

    /// The whole fetch path but HTTP (covered end to end by kas-e2e against `git http-backend`):
    /// gitoxide's file transport runs `git upload-pack`, a real Git server.
    #[test]
    fn fetches_the_branch_into_a_mirror_and_follows_new_commits() {
        let repo = TestRepo::new();
        let first = repo.commit(".gitlab/agents/a/config.yaml", b"observability:\n  logging:\n    level: debug\n");
        let mirrors = Mirrors::new(&AgentGitConfig::default()).unwrap();
        let url = format!("file://{}", repo.bare.display());
        assert_eq!(mirrors.fetch(&url, Some("main")).unwrap(), first);
        // Unchanged: same commit; HEAD (the default branch) is its own mirror.
        assert_eq!(mirrors.fetch(&url, Some("main")).unwrap(), first);
        assert_eq!(mirrors.fetch(&url, None).unwrap(), first);
        assert_ne!(mirrors.path(&url, None), mirrors.path(&url, Some("main")));

        let second = repo.commit(".gitlab/agents/a/config.yaml", b"observability:\n  logging:\n    level: warn\n");
        assert_eq!(mirrors.fetch(&url, Some("main")).unwrap(), second);
        let r =
            super::super::git::read_configuration_at(&mirrors.path(&url, Some("main")), &second, "a", 1024).unwrap();
        assert_eq!(r.configuration.unwrap().observability.unwrap().logging.unwrap().level, "warn");

        // A mirror left half-created (no HEAD) is started over.
        let half = mirrors.path(&url, Some("main"));
        std::fs::remove_file(half.join("HEAD")).unwrap();
        assert_eq!(mirrors.fetch(&url, Some("main")).unwrap(), second);

        let e = mirrors.fetch(&url, Some("no-such-branch")).unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::Unavailable);
        assert!(e.to_string().contains("refs/heads/no-such-branch"), "{e}");
    }

    #[test]
    fn idle_mirrors_are_deleted() {
        let repo = TestRepo::new();
        repo.commit(".gitlab/agents/a/config.yaml", b"{}\n");
        let url = format!("file://{}", repo.bare.display());
        let mut mirrors = Mirrors::new(&AgentGitConfig::default()).unwrap();
        mirrors.idle_ttl = Duration::ZERO; // every other mirror is idle at the next fetch
        mirrors.fetch(&url, Some("main")).unwrap();
        let main = mirrors.path(&url, Some("main"));
        assert!(main.exists());
        mirrors.fetch(&url, None).unwrap();
        assert!(!main.exists(), "the idle mirror was deleted");
        assert!(mirrors.path(&url, None).exists(), "the one being fetched stays");
        mirrors.fetch(&url, Some("main")).unwrap();
        assert!(main.exists(), "and comes back when polled again");
    }

    #[test]
    fn setup_errors_name_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let config = AgentGitConfig {
            username: Some("kas".into()),
            password_file: Some(dir.path().join("missing")),
            ..Default::default()
        };
        let e = Mirrors::new(&config).unwrap_err().to_string();
        assert!(e.starts_with("agents.git.password_file: cannot read"), "{e}");
        std::fs::write(dir.path().join("empty"), "\n").unwrap();
        let config = AgentGitConfig { password_file: Some(dir.path().join("empty")), ..config };
        assert!(Mirrors::new(&config).unwrap_err().to_string().contains("is empty"));
        std::fs::write(dir.path().join("password"), "s3cret\n").unwrap();
        let config = AgentGitConfig { password_file: Some(dir.path().join("password")), ..config };
        let mirrors = Mirrors::new(&config).unwrap();
        assert!(!format!("{mirrors:?}").contains("s3cret"));
    }
}
