//! End-to-end harness: kas and agentk in-process (or as real processes, see [`process`]) on
//! ephemeral ports, a fake Kubernetes API server, and helpers to call kas the way GitLab does.

pub mod captured_logs;
pub mod certificates;
pub mod cluster;
pub mod fake_gitlab;
pub mod fake_kube;
pub mod fault_proxy;
pub mod git_http;
pub mod kubectl;
pub mod process;
pub mod redis_server;
pub mod registry_conformance;
pub mod remote_command;
pub mod slow_client;
pub mod spdy;
pub mod spdy_passthrough;
pub mod spdy_remote_command;
pub mod tls_listener;
pub mod unconnectable;

pub use captured_logs::CapturedLogs;
pub use cluster::{AgentkHandle, Cluster, ClusterBuilder, KasHandle};
pub use fake_gitlab::FakeGitlab;
pub use fake_kube::FakeKube;
pub use fault_proxy::{FaultProxy, ProxyTarget};
pub use git_http::{GitHttpOptions, GitHttpServer, GitRepo};
pub use process::{KasProcess, Process, workspace_binary};
pub use redis_server::{RedisCluster, RedisServer};
pub use unconnectable::Unconnectable;

/// How long `eventually!` waits before failing a test.
pub const EVENTUALLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Waits until a condition (which may `.await`) holds, or panics with the message after
/// [`EVENTUALLY_TIMEOUT`]. Polls every 10 ms: a condition check, not a sleep standing in for one.
#[macro_export]
macro_rules! eventually {
    ($cond:expr) => { $crate::eventually!($cond, "{}", stringify!($cond)) };
    ($cond:expr, $($msg:tt)+) => {{
        let deadline = tokio::time::Instant::now() + $crate::EVENTUALLY_TIMEOUT;
        loop {
            if $cond {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("timed out waiting for: {}", format!($($msg)+));
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }};
}

/// Whether this is CI (`CI` set to anything but empty, `0` or `false`): there a missing tool fails
/// the test instead of skipping it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// A test cannot run because a tool is missing: in CI this panics (a failure); elsewhere it
/// prints a visible `SKIPPED` with the install hint. Written straight to the process's stderr:
/// libtest captures `eprintln!` of passing tests, and a skip must be seen.
pub fn missing_tool(test: &str, problem: &str) {
    assert!(!in_ci(), "{test}: {problem} (CI is set, so this fails)");
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n==========\nSKIPPED: {test}: {problem}\n(set CI=true to make this a failure)\n==========\n"
    );
}

/// Logs for tests (set `TEST_LOG=debug` to see them).
pub fn init_test_logging() {
    let filter = std::env::var("TEST_LOG").unwrap_or_else(|_| "off".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// A request carrying `authorization: Bearer <token>` (agent tokens on hand-driven tunnels).
pub fn authorized<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Ok(v) = format!("Bearer {token}").parse() {
        r.metadata_mut().insert("authorization", v);
    }
    r
}

/// One HTTP GET: (status code, body).
pub async fn http_get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_else(|e| panic!("body of GET {url}: {e}")))
}
