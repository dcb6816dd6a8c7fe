//! A private `redis-server` per test: TCP disabled (port 0), a unix socket in a temp dir, no
//! persistence, killed on drop. It can be stopped and started again on the same socket to test
//! Redis restarts. [`RedisCluster`]: a private Redis Cluster of three masters.
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

/// Fails (never skips) when redis-cli is missing, with how to install it.
fn redis_cli_binary() -> &'static str {
    let found = std::process::Command::new("redis-cli").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(
        found,
        "redis-cli is required to create a Redis Cluster: install it with `apt-get install redis-server` \
         (or redis-tools)"
    );
    "redis-cli"
}

/// Masters of a [`RedisCluster`].
pub const CLUSTER_MASTERS: usize = 3;

/// A private Redis Cluster: three masters (`cluster-enabled yes`, no replicas) on free TCP ports
/// of 127.0.0.1 (cluster nodes only talk TCP), each in its own temp dir, without persistence,
/// created with `redis-cli --cluster create`; killed on drop. A node can be restarted on the same
/// ports: it comes back as the same master of the same slots (its `nodes.conf`), empty.
pub struct RedisCluster {
    _dir: tempfile::TempDir,
    nodes: Vec<ClusterNode>,
}

struct ClusterNode {
    dir: PathBuf,
    port: u16,
    bus_port: u16,
    child: Option<Child>,
}

/// Two distinct ports the OS considers free now (held together, so they differ). Another process
/// may take one before redis-server binds it: the caller retries with others.
fn two_free_ports() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    let b = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

impl ClusterNode {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts a node on free ports, trying other ports when one was taken meanwhile.
    async fn start(dir: PathBuf) -> Self {
        std::fs::create_dir_all(&dir).expect("node dir");
        for _ in 0..5 {
            let (port, bus_port) = two_free_ports();
            let mut node = Self { dir: dir.clone(), port, bus_port, child: None };
            if node.spawn().await {
                return node;
            }
        }
        panic!("redis-server (cluster node) did not start on free ports in 5 attempts");
    }

    /// Spawns redis-server on this node's ports and waits until it answers as itself; false if it
    /// exited first (a port was taken).
    async fn spawn(&mut self) -> bool {
        assert!(self.child.is_none(), "already running");
        let mut child = Command::new(redis_server_binary())
            .args(["--port", &self.port.to_string(), "--cluster-port", &self.bus_port.to_string()])
            .args(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
            // Redis's default, longer than a test keeps a node down: a restarted master is never
            // marked failed (the cluster would refuse every request for a while).
            .args(["--cluster-node-timeout", "15000"])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn redis-server");
        let pid = child.id().expect("pid");
        let url = self.url();
        let deadline = tokio::time::Instant::now() + crate::EVENTUALLY_TIMEOUT;
        loop {
            if child.try_wait().expect("redis-server status").is_some() {
                return false;
            }
            // Its own process id: not some other server that took the port.
            if server_process_id(&url).await == Some(pid) {
                self.child = Some(child);
                return true;
            }
            assert!(tokio::time::Instant::now() < deadline, "redis-server on port {} not answering", self.port);
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

async fn server_process_id(url: &str) -> Option<u32> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await.ok()?;
    info.lines().find_map(|l| l.strip_prefix("process_id:")).and_then(|pid| pid.trim().parse().ok())
}

async fn node_query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    cmd.query_async(&mut conn).await
}

impl RedisCluster {
    pub async fn start() -> Self {
        let cli = redis_cli_binary();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut nodes = Vec::new();
        for i in 0..CLUSTER_MASTERS {
            nodes.push(ClusterNode::start(dir.path().join(format!("node-{i}"))).await);
        }
        let output = Command::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .await
            .expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = Self { _dir: dir, nodes };
        cluster.wait_until_ok().await;
        cluster
    }

    /// The nodes' URLs (`redis://127.0.0.1:<port>`): kas's `registry.redis.cluster_nodes`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(ClusterNode::url).collect()
    }

    /// Waits until every node says `cluster_state:ok` (every slot served) and serves its slots.
    pub async fn wait_until_ok(&self) {
        for node in &self.nodes {
            let url = node.url();
            crate::eventually!(
                node_query::<String>(&url, redis::cmd("CLUSTER").arg("INFO"))
                    .await
                    .is_ok_and(|info| info.lines().any(|l| l.trim() == "cluster_state:ok")),
                "cluster_state:ok on {url}"
            );
        }
    }

    /// Which node (index into [`RedisCluster::urls`]) serves `key`'s slot: the others answer MOVED.
    pub async fn node_serving(&self, key: &str) -> usize {
        for (i, node) in self.nodes.iter().enumerate() {
            if node_query::<i64>(&node.url(), redis::cmd("EXISTS").arg(key)).await.is_ok() {
                return i;
            }
        }
        panic!("no node serves {key}");
    }

    /// Every key of node `index` under `pattern` (KEYS: test data is small).
    pub async fn node_keys(&self, index: usize, pattern: &str) -> Vec<String> {
        node_query(&self.nodes[index].url(), redis::cmd("KEYS").arg(pattern)).await.expect("KEYS")
    }

    /// The slot of a key (`CLUSTER KEYSLOT`, computed by a node).
    pub async fn key_slot(&self, key: &str) -> u16 {
        node_query(&self.nodes[0].url(), redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).await.expect("KEYSLOT")
    }

    /// A command through redis-rs's cluster client (routed to the node serving its key).
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let client = redis::cluster::ClusterClient::new(self.urls()).unwrap();
        let mut conn = client.get_async_connection().await.unwrap();
        cmd.query_async(&mut conn).await.unwrap()
    }

    /// Kills node `index` (as a crash would) and starts it again on the same ports: the same
    /// master of the same slots, without its data. Returns once the cluster is ok again.
    pub async fn restart_node(&mut self, index: usize) {
        self.stop_node(index).await;
        self.start_node_again(index).await;
    }

    /// Kills node `index` (as a crash would). Its slots stay its own (no replica takes over);
    /// start it again within `cluster-node-timeout` (15 s) or the cluster marks it failed.
    pub async fn stop_node(&mut self, index: usize) {
        if let Some(mut child) = self.nodes[index].child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts stopped node `index` again on its ports, empty; returns once the cluster is ok.
    pub async fn start_node_again(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        assert!(node.spawn().await, "redis-server did not start again on port {} (taken meanwhile?)", node.port);
        self.wait_until_ok().await;
    }

    /// Kills every node (the whole cluster down).
    pub async fn stop_all(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill().await;
            }
        }
    }

    /// Starts every stopped node again on its ports; returns once the cluster is ok.
    pub async fn start_all_again(&mut self) {
        for node in &mut self.nodes {
            if node.child.is_none() {
                assert!(node.spawn().await, "redis-server did not start again on port {}", node.port);
            }
        }
        self.wait_until_ok().await;
    }
}
