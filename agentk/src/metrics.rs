//! Prometheus metrics of agentk, served at `/metrics` on the observability listener. Label sets
//! are bounded (module names and outcomes, never ids).

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::status::Status;

pub const TUNNELS: &str = "agentk_tunnels";
pub const CONNECTED: &str = "agentk_connected";
pub const FAILED_CONNECTION_ATTEMPTS: &str = "agentk_failed_connection_attempts_total";
pub const CONNECTIONS: &str = "agentk_connections_total";
pub const REQUESTS: &str = "agentk_requests_total";
pub const API_SERVER_LATENCY: &str = "agentk_api_server_response_seconds";
pub const BUILD_INFO: &str = "agentk_build_info";
pub const GITOPS_LEADER: &str = "agentk_gitops_leader";
pub const GITOPS_SYNCS: &str = "agentk_gitops_syncs_total";
pub const GITOPS_OBJECTS: &str = "agentk_gitops_objects_total";
pub const CLUSTER_STATE_LEADER: &str = "agentk_cluster_state_leader";
pub const CLUSTER_STATE_MESSAGES: &str = "agentk_cluster_state_pushed_messages_total";
pub const CLUSTER_STATE_COALESCED: &str = "agentk_cluster_state_coalesced_changes_total";

/// The process's Prometheus handle, installing the recorder on first use (at startup).
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = match PrometheusBuilder::new()
            .set_buckets(&[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
            .and_then(|b| b.install_recorder())
        {
            Ok(h) => h,
            // Another recorder is installed (several agentk in one test process): render an
            // empty registry rather than fail.
            Err(_) => PrometheusBuilder::new().build_recorder().handle(),
        };
        metrics::describe_gauge!(TUNNELS, "Tunnels to kas, by state (idle, in_use)");
        metrics::describe_gauge!(CONNECTED, "1 while connected to kas (presence stream open)");
        metrics::describe_counter!(FAILED_CONNECTION_ATTEMPTS, "Connection attempts to kas that failed");
        metrics::describe_counter!(CONNECTIONS, "Connections to kas established (the first and every reconnect)");
        metrics::describe_counter!(
            REQUESTS,
            "Requests served through tunnels, by module and outcome (ok, refused, timeout, error)"
        );
        metrics::describe_histogram!(
            API_SERVER_LATENCY,
            metrics::Unit::Seconds,
            "Time until the Kubernetes API server's response head (proxy requests)"
        );
        metrics::describe_gauge!(BUILD_INFO, "Always 1; labels carry the version and commit");
        metrics::describe_gauge!(GITOPS_LEADER, "1 while this replica holds the GitOps Lease (and applies manifests)");
        metrics::describe_counter!(
            GITOPS_SYNCS,
            "GitOps syncs (apply of a commit or periodic re-apply), by outcome (ok, failed, cancelled)"
        );
        metrics::describe_counter!(
            GITOPS_OBJECTS,
            "Objects of GitOps syncs, by result (applied, unchanged, pruned, failed)"
        );
        metrics::describe_gauge!(
            CLUSTER_STATE_LEADER,
            "1 while this replica holds the cluster state Lease (runs the informers and pushes views to kas)"
        );
        metrics::describe_counter!(CLUSTER_STATE_MESSAGES, "Messages of views and changes pushed to kas");
        metrics::describe_counter!(
            CLUSTER_STATE_COALESCED,
            "Object changes replaced by a newer change of the same object before kas took them (kas read slowly)"
        );
        metrics::gauge!(GITOPS_LEADER).set(0.0);
        metrics::gauge!(CLUSTER_STATE_LEADER).set(0.0);
        metrics::gauge!(BUILD_INFO, "version" => crate::VERSION, "commit" => crate::COMMIT).set(1.0);
        handle
    })
}

/// Renders the metrics, with the gauges read from the current status.
pub fn render(status: &Status) -> String {
    let pool = *status.pool.borrow();
    metrics::gauge!(TUNNELS, "state" => "idle").set(pool.idle as f64);
    metrics::gauge!(TUNNELS, "state" => "in_use").set(pool.in_use as f64);
    metrics::gauge!(CONNECTED).set(if status.connected.borrow().is_some() { 1.0 } else { 0.0 });
    metrics::counter!(FAILED_CONNECTION_ATTEMPTS).absolute(*status.failed_attempts.borrow());
    handle().render()
}

/// How agentk ended a request (the `outcome` label of `agentk_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered: by the Kubernetes API server (whatever its status) or by the module itself.
    Ok,
    /// agentk refused it itself (the agent configuration's `kubernetes_api`: a 403 `Status`).
    Refused,
    /// agentk answered a 504 `Status` itself: the API server did not accept the connection or
    /// send its response head in time.
    Timeout,
    /// The exchange failed (the API server unreachable or failing, the caller gone, bad frames).
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Refused => "refused",
            Self::Timeout => "timeout",
            Self::Error => "error",
        }
    }
}

pub fn request(module: &'static str, outcome: Outcome) {
    // The proxy's counters registered once: the macro looks its key up on every call.
    static KUBERNETES_API: [OnceLock<metrics::Counter>; 4] = [const { OnceLock::new() }; 4];
    let register = || metrics::counter!(REQUESTS, "module" => module, "outcome" => outcome.label());
    match (module, KUBERNETES_API.get(outcome as usize)) {
        ("kubernetes_api", Some(slot)) => registered(slot, register).increment(1),
        _ => register().increment(1),
    }
}

pub fn api_server_latency(took: Duration) {
    static LATENCY: OnceLock<metrics::Histogram> = OnceLock::new();
    registered(&LATENCY, || metrics::histogram!(API_SERVER_LATENCY)).record(took.as_secs_f64());
}

/// A metric handle registered on its first use, after the recorder is installed (a handle
/// taken before would record nothing), and kept: for the metrics of every proxied request.
fn registered<T>(slot: &OnceLock<T>, register: impl FnOnce() -> T) -> &T {
    slot.get_or_init(|| {
        handle();
        register()
    })
}

pub fn connected() {
    metrics::counter!(CONNECTIONS).increment(1);
}

/// How a GitOps sync ended (the `outcome` label of `agentk_gitops_syncs_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// Every object applied (or unchanged) and pruned.
    Ok,
    /// The sync failed, or some objects did.
    Failed,
    /// A newer commit arrived during the apply.
    Cancelled,
}

impl SyncOutcome {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

pub fn gitops_sync(outcome: SyncOutcome, report: &kas_proto::gitops::SyncReport) {
    metrics::counter!(GITOPS_SYNCS, "outcome" => outcome.label()).increment(1);
    for (result, n) in [
        ("applied", report.applied),
        ("unchanged", report.unchanged),
        ("pruned", report.pruned),
        ("failed", report.failed),
    ] {
        metrics::counter!(GITOPS_OBJECTS, "result" => result).increment(u64::from(n));
    }
}

pub fn gitops_leader(leader: bool) {
    metrics::gauge!(GITOPS_LEADER).set(if leader { 1.0 } else { 0.0 });
}

pub fn cluster_state_leader(leader: bool) {
    metrics::gauge!(CLUSTER_STATE_LEADER).set(if leader { 1.0 } else { 0.0 });
}

pub fn cluster_state_pushed() {
    metrics::counter!(CLUSTER_STATE_MESSAGES).increment(1);
}

pub fn cluster_state_coalesced() {
    metrics::counter!(CLUSTER_STATE_COALESCED).increment(1);
}
