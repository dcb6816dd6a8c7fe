//! Prometheus metrics of kas's core (routing, registry, tunnels, authentication); each feature
//! owns its own (`modules::<feature>::metrics`). Names are stable and label sets bounded: no
//! agent or connection ids as labels (they are unbounded); methods are the few tunnel method
//! names.
//!
//! The recorder is process-wide (one kas per process in production; in-process tests that run
//! several kas see their sum).

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub const ROUTED: &str = "kas_routed_requests_total";
pub const ROUTE_DURATION: &str = "kas_route_duration_seconds";
pub const ROUTE_WAIT: &str = "kas_route_wait_seconds";
pub const PEER_ERRORS: &str = "kas_peer_forward_errors_total";
pub const PEER_STATE_CHANGES: &str = "kas_peer_state_changes_total";
pub const REGISTRY_OPERATIONS: &str = "kas_registry_operations_total";
pub const REGISTRY_ERRORS: &str = "kas_registry_errors_total";
pub const CONNECTIONS: &str = "kas_agent_connections";
pub const IDLE_TUNNELS: &str = "kas_idle_tunnels";
pub const WAITING_REQUESTS: &str = "kas_waiting_requests";
pub const BUILD_INFO: &str = "kas_build_info";
pub const GITLAB_REQUESTS: &str = "kas_gitlab_requests_total";
pub const SHARED_AGENT_INFO: &str = "kas_agent_info_shared_cache_total";
pub const AUTH_FAILURES: &str = "kas_auth_failures_total";
pub const AGENT_CONNECTION_ADMISSIONS: &str = "kas_agent_connection_admissions_total";
/// agentk tunnels put back into the idle pool after an exchange (counted in `tunnel::io`).
pub const TUNNELS_REUSED: &str = "kas_tunnels_reused_total";
/// Forwarded requests that reused an idle `ForwardTunnel` stream (counted in `tunnel::forwards`).
pub const FORWARDS_REUSED: &str = "kas_forwards_reused_total";
/// Requests sent again elsewhere after their kept stream failed before the response.
pub const FORWARDS_REROUTED: &str = "kas_forwards_rerouted_total";

/// How a routed request ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteOutcome {
    /// An idle local tunnel at once.
    Local,
    /// Through another kas at once.
    Peer,
    /// After waiting for the agent (locally or through a peer).
    Waited,
    /// The wait ended without a tunnel (agent not connected, busy, or the caller's deadline).
    TimedOut,
    /// Anything else (bad request, shutting down, peer failure).
    Failed,
}

impl RouteOutcome {
    fn label(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Peer => "peer",
            Self::Waited => "waited",
            Self::TimedOut => "timed_out",
            Self::Failed => "failed",
        }
    }
}

/// The process's Prometheus handle, installing the recorder on first use.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = match PrometheusBuilder::new()
            .set_buckets(&[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0])
            .and_then(|b| b.install_recorder())
        {
            Ok(h) => h,
            // Another recorder is installed (an embedding program): render an empty registry.
            Err(_) => PrometheusBuilder::new().build_recorder().handle(),
        };
        describe();
        metrics::gauge!(BUILD_INFO, "version" => crate::VERSION, "commit" => crate::COMMIT).set(1.0);
        handle
    })
}

fn describe() {
    metrics::describe_counter!(ROUTED, "Requests routed to an agent, by tunnel method and outcome");
    metrics::describe_histogram!(
        ROUTE_DURATION,
        metrics::Unit::Seconds,
        "Time from a request arriving to its tunnel being found (includes waiting for the agent)"
    );
    metrics::describe_histogram!(
        ROUTE_WAIT,
        metrics::Unit::Seconds,
        "Time requests waited for their agent to connect (outcomes waited and timed_out)"
    );
    metrics::describe_counter!(
        PEER_ERRORS,
        "kas -> kas forwards that failed or were skipped, by reason (not_here, down, unavailable)"
    );
    metrics::describe_counter!(
        PEER_STATE_CHANGES,
        "Other kas marked down or up again by this kas, by state (down, up)"
    );
    metrics::describe_counter!(REGISTRY_OPERATIONS, "Registry operations, by operation");
    metrics::describe_counter!(TUNNELS_REUSED, "agentk tunnels that carried another request after one ended cleanly");
    metrics::describe_counter!(
        FORWARDS_REUSED,
        "Requests forwarded to another kas on a ForwardTunnel stream kept from an earlier request"
    );
    metrics::describe_counter!(
        FORWARDS_REROUTED,
        "Requests routed again after their kept ForwardTunnel stream failed before the response"
    );
    metrics::describe_counter!(REGISTRY_ERRORS, "Registry operations that failed (e.g. Redis errors), by operation");
    metrics::describe_gauge!(CONNECTIONS, "Agent connections (GetConfiguration streams) held by this kas");
    metrics::describe_gauge!(IDLE_TUNNELS, "Idle tunnels held by this kas");
    metrics::describe_gauge!(WAITING_REQUESTS, "Requests waiting for a tunnel on this kas");
    metrics::describe_gauge!(BUILD_INFO, "Always 1; labels carry the version and commit");
    metrics::describe_counter!(
        GITLAB_REQUESTS,
        "Requests to GitLab's API (agent_info, project_info, allowed_agents, authorize_proxy_user), by outcome"
    );
    metrics::describe_counter!(
        SHARED_AGENT_INFO,
        "Calls to the agent_info cache shared between kas (GitLab mode with Redis), by outcome (hit, miss, \
         stored, error)"
    );
    metrics::describe_counter!(
        AUTH_FAILURES,
        "Refused authentications, by listener (agent, api, rest, internal) and reason (e.g. invalid_token, \
         expired, rate_limited)"
    );
    metrics::describe_counter!(
        AGENT_CONNECTION_ADMISSIONS,
        "New agent connections (presence streams) by outcome of the accept rate limit (admitted, shed)"
    );
}

pub fn routed(method: &str, outcome: RouteOutcome, took: Duration) {
    // Methods are the few tunnel method names agentk advertises; anything else is one bucket.
    let (i, method) = match method {
        kas_proto::get_pods::METHOD => (0, "get_pods"),
        kas_proto::kubernetes_api::METHOD => (1, "kubernetes_api"),
        _ => (2, "other"),
    };
    let register = || metrics::counter!(ROUTED, "method" => method, "outcome" => outcome.label());
    // An outcome added without a slot here is still counted, through the macro.
    match ROUTED_HANDLES[i].get(outcome as usize) {
        Some(slot) => slot.get(register).increment(1),
        None => register().increment(1),
    }
    ROUTE_DURATION_HANDLES[i]
        .get(|| metrics::histogram!(ROUTE_DURATION, "method" => method))
        .record(took.as_secs_f64());
    if matches!(outcome, RouteOutcome::Waited | RouteOutcome::TimedOut) {
        ROUTE_WAIT_HANDLES[i].get(|| metrics::histogram!(ROUTE_WAIT, "method" => method)).record(took.as_secs_f64());
    }
}

/// By method (`get_pods`, `kubernetes_api`, `other`), then outcome.
static ROUTED_HANDLES: [[Registered<metrics::Counter>; 5]; 3] = [const { [const { Registered::new() }; 5] }; 3];
static ROUTE_DURATION_HANDLES: [Registered<metrics::Histogram>; 3] = [const { Registered::new() }; 3];
static ROUTE_WAIT_HANDLES: [Registered<metrics::Histogram>; 3] = [const { Registered::new() }; 3];

/// A metric handle registered on its first use, as the `metrics` macros register it, and kept:
/// the macros look their key up in the registry on every call, and the metrics recorded for
/// every proxied request cost kas ~2,700 instructions per request that way (callgrind). The
/// recorder has no idle timeout, so a kept handle stays the registry's own.
pub struct Registered<T>(OnceLock<T>);

impl<T> Registered<T> {
    pub const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// The handle, made by `register` the first time.
    pub fn get(&self, register: impl FnOnce() -> T) -> &T {
        self.0.get_or_init(|| {
            // The recorder first: a handle taken before it is installed would record nothing.
            handle();
            register()
        })
    }
}

impl<T> Default for Registered<T> {
    fn default() -> Self {
        Self::new()
    }
}

pub fn peer_error(reason: &'static str) {
    metrics::counter!(PEER_ERRORS, "reason" => reason).increment(1);
}

/// A peer kas was marked `down` (a forward failed at the transport) or `up` (a probe answered).
pub fn peer_state_changed(state: &'static str) {
    metrics::counter!(PEER_STATE_CHANGES, "state" => state).increment(1);
}

pub fn registry_operation(operation: &'static str, ok: bool) {
    metrics::counter!(REGISTRY_OPERATIONS, "operation" => operation).increment(1);
    if !ok {
        metrics::counter!(REGISTRY_ERRORS, "operation" => operation).increment(1);
    }
}

/// An agentk tunnel went back into the idle pool after an exchange (once per reused exchange:
/// the handle is kept).
pub fn tunnel_reused() {
    static HANDLE: Registered<metrics::Counter> = Registered::new();
    HANDLE.get(|| metrics::counter!(TUNNELS_REUSED)).increment(1);
}

/// A forwarded request took an idle `ForwardTunnel` stream (once per such request: the handle is
/// kept).
pub fn forward_reused() {
    static HANDLE: Registered<metrics::Counter> = Registered::new();
    HANDLE.get(|| metrics::counter!(FORWARDS_REUSED)).increment(1);
}

/// A request was sent again elsewhere after its kept stream failed before the response (rare).
pub fn forward_rerouted() {
    metrics::counter!(FORWARDS_REROUTED).increment(1);
}

pub fn gitlab_request(outcome: &'static str) {
    metrics::counter!(GITLAB_REQUESTS, "outcome" => outcome).increment(1);
}

/// A call to the shared agent_info cache: `hit`, `miss` (ask GitLab), `stored` (GitLab's yes
/// shared), `renewed` (an answer in use renewed with GitLab before it lapsed) or `error`
/// (failed, timed out or unusable: GitLab asked instead).
pub fn shared_agent_info(outcome: &'static str) {
    metrics::counter!(SHARED_AGENT_INFO, "outcome" => outcome).increment(1);
}

/// A refused authentication; `reason` is one of a few fixed words.
pub fn auth_failure(listener: &'static str, reason: &'static str) {
    metrics::counter!(AUTH_FAILURES, "listener" => listener, "reason" => reason).increment(1);
}

/// A new agent connection passed (`admitted`) or was shed by the accept rate limit.
pub fn agent_connection_admission(admitted: bool) {
    let outcome = if admitted { "admitted" } else { "shed" };
    metrics::counter!(AGENT_CONNECTION_ADMISSIONS, "outcome" => outcome).increment(1);
}
