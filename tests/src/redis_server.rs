//! A private `redis-server` per test: TCP disabled (port 0), a unix socket in a temp dir, no
//! persistence, killed on drop. It can be stopped and started again on the same socket to test
//! Redis restarts.
#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::{Child, Command};

use crate::certificates::{Certificate, CertificateFiles};

pub struct RedisServer {
    dir: tempfile::TempDir,
    child: Option<Child>,
    extra_args: Vec<String>,
    password: Option<String>,
}

/// Fails (never skips) when redis-server is missing, with how to install it.
fn redis_server_binary() -> &'static str {
    let found = std::process::Command::new("redis-server").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(found, "redis-server is required for this test: install it with `apt-get install redis-server`");
    "redis-server"
}

impl RedisServer {
    pub async fn start() -> Self {
        Self::start_with_password(None).await
    }

    /// A server that also serves TLS on a free TCP port, with a self-signed certificate for
    /// `localhost` (the returned PEM is its own CA). Plain clients still use the unix socket.
    pub async fn start_tls() -> (Self, u16, Vec<u8>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let certificate = Certificate::self_signed(&["localhost"]);
        let CertificateFiles { certificate_file: cert_file, key_file } = certificate.write(dir.path(), "redis");
        // Redis serves TLS only on TCP: a free port picked by the OS (not a fixed one).
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let path = |p: &std::path::Path| p.display().to_string();
        let extra_args = vec![
            "--tls-port".to_owned(),
            port.to_string(),
            "--bind".to_owned(),
            "127.0.0.1".to_owned(),
            "--tls-cert-file".to_owned(),
            path(&cert_file),
            "--tls-key-file".to_owned(),
            path(&key_file),
            "--tls-ca-cert-file".to_owned(),
            path(&cert_file),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        let mut server = Self { dir, child: None, extra_args, password: None };
        server.start_again().await;
        (server, port, certificate.pem().into_bytes())
    }

    /// A server that requires this password (`requirepass`) from every client.
    pub async fn start_with_password(password: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let extra_args = password.map(|p| vec!["--requirepass".to_owned(), p.to_owned()]).unwrap_or_default();
        let mut server = Self { dir, child: None, extra_args, password: password.map(str::to_owned) };
        server.start_again().await;
        server
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// The URL kas uses.
    pub fn url(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the server (again) on the same socket and waits until it answers.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "already running");
        let socket = self.socket();
        let _ = std::fs::remove_file(&socket);
        let child = Command::new(redis_server_binary())
            .args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .args(["--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir"])
            .arg(self.dir.path())
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        wait_until_answering(&self.client_url()).await;
    }

    /// Kills the server (as a crash would) and waits until it is gone.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// The URL with the password, for the harness's own connections.
    fn client_url(&self) -> String {
        match &self.password {
            Some(p) => format!("redis+unix://{}?pass={p}", self.socket().display()),
            None => self.url(),
        }
    }

    /// A raw command through redis-cli semantics, for assertions (e.g. KEYS).
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let client = redis::Client::open(self.client_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        cmd.query_async(&mut conn).await.unwrap()
    }
}

async fn wait_until_answering(url: &str) {
    crate::eventually!(
        async {
            let Ok(client) = redis::Client::open(url) else { return false };
            let Ok(mut conn) = client.get_multiplexed_async_connection().await else { return false };
            redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok()
        }
        .await,
        "redis-server answering on {url}"
    );
}
