//! A real kubectl pointed at an agent through kas's Kubernetes API proxy, isolated from the
//! machine's own configuration: used by every kubectl test.

use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::Command;

use crate::Cluster;

/// Where kubectl goes (agent 1 through one kas, on the rest listener's TLS, with a GitLab-style
/// JWT) and its private home: an empty kubeconfig and its own discovery cache, so nothing from
/// the machine's ~/.kube leaks in.
pub struct KubectlTarget {
    server: String,
    token: String,
    ca: PathBuf,
    home: tempfile::TempDir,
}

impl KubectlTarget {
    pub fn new(c: &Cluster, kas: usize) -> Self {
        let home = tempfile::tempdir().expect("kubectl home");
        std::fs::write(home.path().join("config"), "apiVersion: v1\nkind: Config\n").expect("empty kubeconfig");
        Self {
            server: format!("{}/api/v1/agents/1/kubernetes", c.rest_url(kas)),
            token: c.gitlab_jwt(),
            ca: c.rest_ca_file().expect("kubectl needs the rest listener on TLS: it sends tokens only over TLS"),
            home,
        }
    }

    /// The same target with another credential (`--token`).
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = token.into();
        self
    }

    /// The same kas with another agent id in the path (not necessarily a valid one).
    #[must_use]
    pub fn with_agent(mut self, agent_id: &str) -> Self {
        let base = self.server.split("/api/v1/agents/").next().unwrap_or_default().to_owned();
        self.server = format!("{base}/api/v1/agents/{agent_id}/kubernetes");
        self
    }

    /// `binary args...` against the target, without stdin, killed when dropped.
    pub fn command(&self, binary: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
        let mut cmd = Command::new(binary);
        cmd.env("KUBECONFIG", self.home.path().join("config"))
            .env("HOME", self.home.path())
            .arg(format!("--server={}", self.server))
            .arg(format!("--token={}", self.token))
            .arg(format!("--certificate-authority={}", self.ca.display()))
            .arg(format!("--cache-dir={}", self.home.path().join("cache").display()))
            .arg("--request-timeout=0")
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    pub fn home(&self) -> &std::path::Path {
        self.home.path()
    }
}
