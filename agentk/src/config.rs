//! agentk flags (and their environment variables) and the resolved configuration.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use kas_proto::runtime_thread::Scheduling;

/// Idle tunnels kept open: enough that a request rarely waits for a new one.
pub const DEFAULT_MIN_IDLE_TUNNELS: usize = 2;
/// Upper bound on concurrently open tunnels (idle + in use) per agentk process.
pub const DEFAULT_MAX_TUNNELS: usize = 500;
/// In-flight requests get this long to finish on SIGTERM (below Kubernetes' default 30 s).
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(20);
/// The observability listener (`/livez`, `/readyz`) of the `agentk` binary: all interfaces, so
/// the kubelet can probe the pod. Embedded agentk ([`AgentConfig::new`]) uses `127.0.0.1:0`.
pub const DEFAULT_OBSERVABILITY_ADDRESS: &str = "0.0.0.0:8080";
// Owned by the Kubernetes API module they configure.
pub use crate::modules::gitops::{
    DEFAULT_LEASE_DURATION, DEFAULT_LEASE_RENEW_DEADLINE, DEFAULT_LEASE_RETRY_PERIOD, DEFAULT_REAPPLY_PERIOD,
    GitopsSettings,
};
pub use crate::modules::kubernetes_api::{DEFAULT_KUBE_API_CONNECT_TIMEOUT, DEFAULT_KUBE_API_RESPONSE_HEADER_TIMEOUT};

/// The environment variables the `agentk` binary reads: each flag's (checked against
/// `agentk --help` by kas-e2e's `process` tests), then the ones read by libraries (kube-rs finds
/// the API server of the pod's cluster from `KUBERNETES_SERVICE_*`; anyhow prints a backtrace
/// with an error when `RUST_*` are set). Tests clear them from the processes they start, so the
/// caller's shell cannot change what runs.
pub const ENVIRONMENT_VARIABLES: &[&str] = &[
    "AGENTK_KAS_ADDRESS",
    "AGENTK_TOKEN_FILE",
    "AGENTK_CA_CERT_FILE",
    "KUBECONFIG",
    "AGENTK_MIN_IDLE_TUNNELS",
    "AGENTK_MAX_TUNNELS",
    "AGENTK_GRACE_PERIOD",
    "AGENTK_KUBE_API_CONNECT_TIMEOUT",
    "AGENTK_KUBE_API_RESPONSE_HEADER_TIMEOUT",
    "AGENTK_GITOPS_REAPPLY_PERIOD",
    "AGENTK_GITOPS_LEASE_DURATION",
    "AGENTK_GITOPS_LEASE_RENEW_DEADLINE",
    "AGENTK_GITOPS_LEASE_RETRY_PERIOD",
    "POD_NAME",
    "POD_NAMESPACE",
    "AGENTK_LOG",
    "AGENTK_OBSERVABILITY_ADDRESS",
    "AGENTK_DATA_PLANE_SCHEDULING",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
];

#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "agentk",
    version,
    about = "agentk: keeps reverse tunnels open to kas and serves requests in the cluster"
)]
pub struct Args {
    /// kas agent listener: grpc://host:port or grpcs://host:port. A comma-separated list of
    /// replicas is tried in turn: each new connection goes to the next address.
    #[arg(long, env = "AGENTK_KAS_ADDRESS")]
    pub kas_address: String,
    /// File holding the agent token.
    #[arg(long, env = "AGENTK_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// PEM CA certificate(s) to trust for grpcs:// (default: system roots).
    #[arg(long, env = "AGENTK_CA_CERT_FILE")]
    pub ca_cert_file: Option<PathBuf>,
    /// Use this kubeconfig instead of the in-cluster service account (development).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Idle tunnels to keep open.
    #[arg(long, env = "AGENTK_MIN_IDLE_TUNNELS", default_value_t = DEFAULT_MIN_IDLE_TUNNELS)]
    pub min_idle_tunnels: usize,
    /// Maximum open tunnels (idle + in use).
    #[arg(long, env = "AGENTK_MAX_TUNNELS", default_value_t = DEFAULT_MAX_TUNNELS)]
    pub max_tunnels: usize,
    /// How long in-flight requests may run after SIGTERM.
    #[arg(long, env = "AGENTK_GRACE_PERIOD", default_value = "20s", value_parser = humantime::parse_duration)]
    pub grace_period: Duration,
    /// Kubernetes API proxy: longest wait for a TCP connection to the API server (504 after it).
    #[arg(long, env = "AGENTK_KUBE_API_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub kube_api_connect_timeout: Duration,
    /// Kubernetes API proxy: longest wait for the API server's response head, counted from
    /// the start of the request (504 after it). Bodies after the head stream without limit.
    #[arg(long, env = "AGENTK_KUBE_API_RESPONSE_HEADER_TIMEOUT", default_value = "70s", value_parser = humantime::parse_duration)]
    pub kube_api_response_header_timeout: Duration,
    /// GitOps: how often the commit in force is applied again, correcting drift (changes made
    /// to the objects in the cluster). A new commit is applied at once regardless.
    #[arg(long, env = "AGENTK_GITOPS_REAPPLY_PERIOD", default_value = "5m", value_parser = humantime::parse_duration)]
    pub gitops_reapply_period: Duration,
    /// GitOps leader election (one replica applies): how long the Lease holds without renewal.
    /// Another replica takes over this long after the holder stopped renewing.
    #[arg(long, env = "AGENTK_GITOPS_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub gitops_lease_duration: Duration,
    /// GitOps leader election: the holder stops applying when it could not renew for this long
    /// (below --gitops-lease-duration, so it stops before another replica may start).
    #[arg(long, env = "AGENTK_GITOPS_LEASE_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub gitops_lease_renew_deadline: Duration,
    /// GitOps leader election: how often the holder renews and the others try to acquire.
    #[arg(long, env = "AGENTK_GITOPS_LEASE_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    pub gitops_lease_retry_period: Duration,
    /// Pod name (from the downward API).
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub pod_name: String,
    /// Pod namespace (from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    pub pod_namespace: String,
    /// Log filter, e.g. `info` or `agentk=debug`. The agent configuration may override it.
    #[arg(long, env = "AGENTK_LOG", default_value = "info")]
    pub log: String,
    /// HTTP listener for the liveness (`/livez`) and readiness (`/readyz`) probes: IP:port.
    #[arg(long, env = "AGENTK_OBSERVABILITY_ADDRESS", default_value = DEFAULT_OBSERVABILITY_ADDRESS)]
    pub observability_address: SocketAddr,
    /// How Linux schedules the thread that carries the tunnels and proxied requests: `batch`
    /// (SCHED_BATCH: woken by a request, it does not preempt the thread running on its CPU;
    /// fewer context switches and less CPU per request) or `normal` (as agentk was started).
    #[arg(long, env = "AGENTK_DATA_PLANE_SCHEDULING", default_value_t = Scheduling::default())]
    pub data_plane_scheduling: Scheduling,
}

/// How agentk reaches the Kubernetes API.
#[derive(Clone)]
pub enum KubeSource {
    /// The pod's service account (token and CA mounted by Kubernetes).
    InCluster,
    /// A kubeconfig file (its current context).
    Kubeconfig(PathBuf),
    /// A ready configuration (tests).
    Config(Box<kube::Config>),
}

impl std::fmt::Debug for KubeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InCluster => f.write_str("InCluster"),
            Self::Kubeconfig(p) => write!(f, "Kubeconfig({})", p.display()),
            Self::Config(c) => write!(f, "Config({})", c.cluster_url),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub kas_address: String,
    pub token_file: PathBuf,
    pub ca_cert_file: Option<PathBuf>,
    pub kube: KubeSource,
    pub min_idle_tunnels: usize,
    pub max_tunnels: usize,
    pub grace_period: Duration,
    /// See [`DEFAULT_KUBE_API_CONNECT_TIMEOUT`].
    pub kube_api_connect_timeout: Duration,
    /// See [`DEFAULT_KUBE_API_RESPONSE_HEADER_TIMEOUT`].
    pub kube_api_response_header_timeout: Duration,
    /// How long the idle target waits without load before it halves (no flag: tests shorten it).
    pub idle_quiet_period: Duration,
    /// The `--gitops-*` flags.
    pub gitops: GitopsSettings,
    pub pod_name: String,
    pub pod_namespace: String,
    /// Where `/livez` and `/readyz` are served; port 0 picks a free port.
    pub observability_address: SocketAddr,
    /// See [`Args::data_plane_scheduling`].
    pub data_plane_scheduling: Scheduling,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--kas-address must start with grpc:// or grpcs://, got \"{0}\"")]
    KasAddress(String),
    #[error("--min-idle-tunnels ({min}) must be at least 1 and at most --max-tunnels ({max})")]
    Pool { min: usize, max: usize },
    #[error("--{0} must be above zero")]
    ZeroTimeout(&'static str),
    #[error(
        "--gitops-lease-duration ({duration:?}) must exceed --gitops-lease-renew-deadline ({renew_deadline:?}), \
         which must exceed 1.2 x --gitops-lease-retry-period ({retry_period:?})"
    )]
    LeaseTimings { duration: Duration, renew_deadline: Duration, retry_period: Duration },
}

impl AgentConfig {
    pub fn from_args(args: &Args) -> Result<Self, ConfigError> {
        let config = Self {
            kas_address: args.kas_address.clone(),
            token_file: args.token_file.clone(),
            ca_cert_file: args.ca_cert_file.clone(),
            kube: args.kubeconfig.clone().map_or(KubeSource::InCluster, KubeSource::Kubeconfig),
            min_idle_tunnels: args.min_idle_tunnels,
            max_tunnels: args.max_tunnels,
            grace_period: args.grace_period,
            kube_api_connect_timeout: args.kube_api_connect_timeout,
            kube_api_response_header_timeout: args.kube_api_response_header_timeout,
            idle_quiet_period: crate::pool::DEFAULT_IDLE_QUIET_PERIOD,
            gitops: GitopsSettings {
                reapply_period: args.gitops_reapply_period,
                lease_duration: args.gitops_lease_duration,
                lease_renew_deadline: args.gitops_lease_renew_deadline,
                lease_retry_period: args.gitops_lease_retry_period,
            },
            pod_name: args.pod_name.clone(),
            pod_namespace: args.pod_namespace.clone(),
            observability_address: args.observability_address,
            data_plane_scheduling: args.data_plane_scheduling,
        };
        config.validate()?;
        Ok(config)
    }

    /// A config with defaults, for embedding agentk (tests). The observability listener is on
    /// `127.0.0.1:0` (a free loopback port, see [`crate::App::observability_address`]), never
    /// the binary's fixed default.
    pub fn new(kas_address: impl Into<String>, token_file: impl Into<PathBuf>, kube: KubeSource) -> Self {
        Self {
            kas_address: kas_address.into(),
            token_file: token_file.into(),
            ca_cert_file: None,
            kube,
            min_idle_tunnels: DEFAULT_MIN_IDLE_TUNNELS,
            max_tunnels: DEFAULT_MAX_TUNNELS,
            grace_period: DEFAULT_GRACE_PERIOD,
            kube_api_connect_timeout: DEFAULT_KUBE_API_CONNECT_TIMEOUT,
            kube_api_response_header_timeout: DEFAULT_KUBE_API_RESPONSE_HEADER_TIMEOUT,
            idle_quiet_period: crate::pool::DEFAULT_IDLE_QUIET_PERIOD,
            gitops: GitopsSettings::default(),
            pod_name: String::new(),
            pod_namespace: String::new(),
            observability_address: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            data_plane_scheduling: Scheduling::default(),
        }
    }

    /// The kas addresses (`--kas-address` takes a comma-separated list).
    pub fn kas_addresses(&self) -> Vec<&str> {
        self.kas_address.split(',').map(str::trim).filter(|a| !a.is_empty()).collect()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let addresses = self.kas_addresses();
        if addresses.is_empty() {
            return Err(ConfigError::KasAddress(self.kas_address.clone()));
        }
        for a in addresses {
            if !(a.starts_with("grpc://") || a.starts_with("grpcs://")) {
                return Err(ConfigError::KasAddress(a.to_owned()));
            }
        }
        if self.min_idle_tunnels == 0 || self.min_idle_tunnels > self.max_tunnels {
            return Err(ConfigError::Pool { min: self.min_idle_tunnels, max: self.max_tunnels });
        }
        if self.kube_api_connect_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout("kube-api-connect-timeout"));
        }
        if self.kube_api_response_header_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout("kube-api-response-header-timeout"));
        }
        let g = &self.gitops;
        for (flag, value) in [
            ("gitops-reapply-period", g.reapply_period),
            ("gitops-lease-duration", g.lease_duration),
            ("gitops-lease-renew-deadline", g.lease_renew_deadline),
            ("gitops-lease-retry-period", g.lease_retry_period),
        ] {
            if value.is_zero() {
                return Err(ConfigError::ZeroTimeout(flag));
            }
        }
        // client-go's rules for the same three values (leaderelection.NewLeaderElector).
        if g.lease_duration <= g.lease_renew_deadline || g.lease_renew_deadline <= g.lease_retry_period.mul_f64(1.2) {
            return Err(ConfigError::LeaseTimings {
                duration: g.lease_duration,
                renew_deadline: g.lease_renew_deadline,
                retry_period: g.lease_retry_period,
            });
        }
        Ok(())
    }
}
