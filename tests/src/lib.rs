//! End-to-end harness: kas and agentk in-process (or as real processes, see [`process`]) on
//! ephemeral ports, a fake Kubernetes API server, and helpers to call kas the way GitLab does.

pub mod cluster;
pub mod fake_gitlab;
pub mod fake_kube;
pub mod git_http;
pub mod process;
pub mod redis_server;
pub mod slow_client;

pub use cluster::{AgentkHandle, Cluster, ClusterBuilder, KasHandle};
pub use fake_gitlab::FakeGitlab;
pub use fake_kube::FakeKube;
pub use git_http::{GitHttpOptions, GitHttpServer, GitRepo};
pub use process::{KasProcess, Process, workspace_binary};
pub use redis_server::RedisServer;

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
