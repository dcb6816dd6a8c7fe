//! What a running agentk exposes (readiness, metrics, tests): its own file, so that the
//! observability listener and the metrics read it without depending on the lifecycle in `app`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use kas_proto::ConnectionId;
use kas_proto::tunnel::pb;
use tokio::sync::watch;

/// What agentk exposes while running (readiness, tests).
#[derive(Clone, Debug)]
pub struct Status {
    pub connected: watch::Receiver<Option<ConnectionId>>,
    pub pool: watch::Receiver<PoolStats>,
    pub configuration: watch::Receiver<Option<pb::ConfigurationResponse>>,
    /// Connection attempts that ended in an error (rejected token, kas unreachable, ...).
    pub failed_attempts: watch::Receiver<u64>,
    /// The bound address of the observability listener (`/livez`, `/readyz`).
    pub observability_address: SocketAddr,
    pub gitops: watch::Receiver<GitopsState>,
}

impl Status {
    /// Ready: connected to kas with at least one idle tunnel.
    pub fn is_ready(&self) -> bool {
        self.connected.borrow().is_some() && self.pool.borrow().idle > 0
    }
}

/// The tunnel pool's counts (kept by `pool`, read by readiness and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub idle: usize,
    pub in_use: usize,
}

/// What the GitOps module is doing (tests; the metrics carry the same).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GitopsState {
    /// This replica holds the GitOps Lease and runs the manifest projects' workers.
    pub leader: bool,
    /// The manifest projects whose workers run here, by (project id, ref).
    pub projects: BTreeMap<(String, String), ProjectState>,
}

/// One manifest project's worker.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProjectState {
    /// Syncs finished (each one reported to kas).
    pub syncs: u64,
    /// The report of the last one, or of why kas cannot send the manifests (no commit then).
    pub last: Option<kas_proto::gitops::SyncReport>,
}
