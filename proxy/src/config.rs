//! kas configuration: a YAML file (`--config`), parsed strictly and validated.
//! `config.example.yaml` at the crate root shows every option with its default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kas_proto::runtime_thread::Scheduling;
use serde::{Deserialize, Serialize};

/// Default listener addresses: loopback, so a kas started without configuration exposes nothing.
pub const DEFAULT_AGENT_ADDRESS: &str = "127.0.0.1:8150";
pub const DEFAULT_API_ADDRESS: &str = "127.0.0.1:8153";
pub const DEFAULT_INTERNAL_ADDRESS: &str = "127.0.0.1:8155";
pub const DEFAULT_REST_ADDRESS: &str = "127.0.0.1:8154";
/// Metrics and health: loopback by default, since it has no authentication.
pub const DEFAULT_OBSERVABILITY_ADDRESS: &str = "127.0.0.1:8151";
/// The longest duration any setting takes: far beyond any sensible value, and small enough
/// that adding it to the current time or scaling it a little never overflows.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600); // 100 years of 365.25 days
/// In-flight requests get this long to finish after SIGTERM (Kubernetes' default grace is 30 s).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listeners: ListenersConfig,
    pub gitlab: GitlabConfig,
    pub kas_internal: KasInternalConfig,
    pub agents: AgentsConfig,
    pub routing: RoutingConfig,
    pub registry: RegistryConfig,
    pub shutdown: ShutdownConfig,
    pub agent_connections: AgentConnectionsConfig,
    pub limits: LimitsConfig,
    pub rest: RestConfig,
    /// Bounds on credentials (JWT lifetime, failed agent authentications).
    pub auth: crate::auth::AuthConfig,
    pub connections: ConnectionsConfig,
    /// GitOps: poll period of manifest projects, how long sync reports are kept.
    pub gitops: crate::modules::gitops::GitopsConfig,
    /// Real-time cluster state: how long views stay after agentk's stream ends, how many per agent.
    pub cluster_state: crate::modules::cluster_state::ClusterStateConfig,
}

// Sections owned by the components they configure (their defaults live there too).
pub use crate::auth::gitlab::config::*;
pub use crate::modules::cluster_state::config::*;
pub use crate::modules::configuration::config::*;
pub use crate::modules::gitops::config::*;
pub use crate::registry::config::*;
pub use crate::router::config::*;
pub use crate::server::admission::{
    AcceptRateConfig, DEFAULT_AGENT_CONNECTION_ACCEPT_BURST, DEFAULT_AGENT_CONNECTION_ACCEPT_PER_SECOND,
};
pub use crate::server::rest::config::*;
pub use crate::tools::tls::TlsConfig;
pub use crate::tools::token_bucket::RateLimitConfig;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenersConfig {
    /// agentk connects here (AgentTunnel).
    pub agent: ListenerConfig,
    /// GitLab calls KasApi here.
    pub api: ListenerConfig,
    /// Other kas call KasInternal here.
    pub internal: ListenerConfig,
    /// The REST gateway (JSON over HTTP, OpenAPI, Swagger UI) and the Kubernetes API proxy.
    /// kubectl sends its token only over TLS, so give it `tls` when kubectl uses it.
    pub rest: ListenerConfig,
    /// Prometheus `/metrics`, `/livez`, `/readyz` (no authentication: keep it on loopback or a
    /// private network). Optional `tls` like the rest listener.
    pub observability: ListenerConfig,
}

impl ListenersConfig {
    /// Every listener, with its config key.
    pub fn all_mut(&mut self) -> [(&'static str, &mut ListenerConfig); 5] {
        [
            ("listeners.agent", &mut self.agent),
            ("listeners.api", &mut self.api),
            ("listeners.internal", &mut self.internal),
            ("listeners.rest", &mut self.rest),
            ("listeners.observability", &mut self.observability),
        ]
    }
}

impl Default for ListenersConfig {
    fn default() -> Self {
        Self {
            agent: ListenerConfig::new(DEFAULT_AGENT_ADDRESS),
            api: ListenerConfig::new(DEFAULT_API_ADDRESS),
            internal: ListenerConfig::new(DEFAULT_INTERNAL_ADDRESS),
            rest: ListenerConfig::new(DEFAULT_REST_ADDRESS),
            observability: ListenerConfig::new(DEFAULT_OBSERVABILITY_ADDRESS),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// `ip:port`; port 0 picks a free port (the bound address is logged).
    pub address: String,
    /// Serve TLS with this certificate and key; plaintext when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

impl ListenerConfig {
    pub fn new(address: &str) -> Self {
        Self { address: address.to_owned(), tls: None }
    }
}

// Owned by the peer connections they configure.
pub use crate::router::peers::{DEFAULT_PEER_PING_INTERVAL, DEFAULT_PEER_PING_TIMEOUT};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KasInternalConfig {
    /// File with the base64 secret shared only among kas instances. Required.
    pub authentication_secret_file: Option<PathBuf>,
    /// The IP other kas use to reach this kas's internal listener (e.g. the pod IP). Default:
    /// the bound IP, which must then not be a wildcard (0.0.0.0 / ::) when Redis is used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_ip: Option<std::net::IpAddr>,
    /// The port other kas use to reach the internal listener, when it differs from the bound
    /// one (a port mapping or proxy in between). Default: the bound port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_port: Option<u16>,
    /// HTTP/2 pings on connections to other kas, sent when a forward is open and nothing was
    /// received for this long.
    #[serde(with = "humantime_serde")]
    pub peer_ping_interval: Duration,
    /// A peer that does not answer a ping within this is treated as down: its connection is
    /// closed, requests waiting on it try the agent's other connections.
    #[serde(with = "humantime_serde")]
    pub peer_ping_timeout: Duration,
    /// TLS between kas replicas: the internal listener serves it and peers dial with it
    /// (instead of `listeners.internal.tls`). Off: plaintext (a private network).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<InternalTlsConfig>,
}

/// One certificate per kas (server and client), issued by a CA only kas replicas trust.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InternalTlsConfig {
    pub certificate_file: PathBuf,
    pub key_file: PathBuf,
    /// The CA that issued every kas's certificate: peers' server certificates are verified
    /// against it, and so are client certificates when they are required.
    pub ca_file: PathBuf,
    /// The name peers verify in a kas's certificate (peers dial IPs, so certificates carry this
    /// name rather than every pod IP).
    #[serde(default = "default_internal_server_name")]
    pub server_name: String,
    /// Mutual TLS: the internal listener accepts only clients with a certificate from `ca_file`.
    #[serde(default)]
    pub require_client_certificates: bool,
}

impl Default for KasInternalConfig {
    fn default() -> Self {
        Self {
            authentication_secret_file: None,
            advertise_ip: None,
            advertise_port: None,
            peer_ping_interval: DEFAULT_PEER_PING_INTERVAL,
            peer_ping_timeout: DEFAULT_PEER_PING_TIMEOUT,
            tls: None,
        }
    }
}

fn default_internal_server_name() -> String {
    "kas-internal".to_owned()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentsConfig {
    /// The static agents file (agents, token hashes, configurations). Required unless
    /// `gitlab.address` is set.
    pub static_file: Option<PathBuf>,
    /// How often an open presence stream re-reads the agent's configuration (± 10 % jitter);
    /// a changed commit is sent to agentk.
    #[serde(with = "humantime_serde")]
    pub configuration_poll_period: Duration,
    /// Reading configurations from Git repositories.
    pub git: AgentGitConfig,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        Self {
            static_file: None,
            configuration_poll_period: DEFAULT_CONFIGURATION_POLL_PERIOD,
            git: AgentGitConfig::default(),
        }
    }
}

/// An agent connection older than this is ended cleanly (agentk reconnects, to the next kas
/// address): after a scale-out, load spreads to new replicas within this time.
pub const DEFAULT_AGENT_CONNECTION_MAX_AGE: Duration = Duration::from_secs(2 * 3600);
/// kas closes a tunnel that stayed idle this long; agentk opens again only as many as its idle
/// target (which halves after 30 s without running short), so a burst's extra tunnels go away.
pub const DEFAULT_IDLE_TUNNEL_TIMEOUT: Duration = Duration::from_secs(60);

/// An agent reconnects a few times a minute at most when healthy; far more is a crash loop or
/// a misconfiguration that should not load kas and GitLab.
pub const DEFAULT_AGENT_CONNECTIONS_PER_MINUTE: u64 = 60;
/// tonic's own default; GetPods answers of large clusters fit.
pub const DEFAULT_MAX_GRPC_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Generous for kubectl and browsers (cookies, long tokens); bounded against abuse.
pub const DEFAULT_MAX_HTTP_HEADER_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// New agent connections (presence streams) per agent per minute; across every kas when
    /// Redis is used. Tunnels do not count. More are refused with RESOURCE_EXHAUSTED.
    pub agent_connections_per_minute: u64,
    /// New agent connections (presence streams) this kas admits per second, and at once; more
    /// are shed with UNAVAILABLE and a retry pushback before their token is verified or counted.
    pub agent_connection_accept_rate: AcceptRateConfig,
    /// The largest gRPC message kas accepts on its gRPC listeners (bigger: OUT_OF_RANGE).
    pub max_grpc_message_bytes: usize,
    /// The largest HTTP request header block on the rest listener (bigger: 431).
    pub max_http_header_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            agent_connections_per_minute: DEFAULT_AGENT_CONNECTIONS_PER_MINUTE,
            agent_connection_accept_rate: AcceptRateConfig::default(),
            max_grpc_message_bytes: DEFAULT_MAX_GRPC_MESSAGE_BYTES,
            max_http_header_bytes: DEFAULT_MAX_HTTP_HEADER_BYTES,
        }
    }
}

/// A client has this long for its TLS handshake and HTTP/2 preface (or HTTP/1 request head):
/// generous for slow networks, short enough that half-open connections do not pile up.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// agentk opens up to --max-tunnels (500 by default) streams on one connection, plus presence:
/// twice that leaves room for larger --max-tunnels.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Connections of every listener (idle and half-open connections, file descriptors).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionsConfig {
    /// TLS handshake plus HTTP/2 preface, or HTTP/1 request head, must arrive within this; also
    /// the longest an HTTP/1.1 connection waits for its next request.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// Connections each of the agent, api, internal and rest listeners serves at once (more
    /// wait in the accept queue). Default: (open file limit - 1024) / 4.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_per_listener: Option<usize>,
    /// HTTP/2 streams per connection on the agent, api and rest listeners (the internal
    /// listener allows at least routing.max_concurrent_requests).
    pub max_concurrent_streams: u32,
    /// Threads that serve the connections of the agent, api, internal and rest listeners, each
    /// connection on one of them (`server::data_plane`); 0 serves them on kas's multi-threaded
    /// runtime, beside everything else.
    pub data_plane_threads: usize,
    /// How Linux schedules the data plane threads: `batch` (`SCHED_BATCH`: a woken thread does
    /// not preempt the one running on its CPU; fewer context switches per request) or `normal`
    /// (as kas was started); nothing to schedule with `data_plane_threads: 0`. See
    /// `kas_proto::runtime_thread::Scheduling`.
    pub data_plane_scheduling: Scheduling,
}

/// One thread: the lowest CPU per proxied request (issue 14); more for more than a core of
/// proxying per kas.
pub const DEFAULT_DATA_PLANE_THREADS: usize = 1;
/// More threads than this is a mistake (a thread per core is the most that helps).
pub const MAX_DATA_PLANE_THREADS: usize = 256;

impl Default for ConnectionsConfig {
    fn default() -> Self {
        Self {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_per_listener: None,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            data_plane_threads: DEFAULT_DATA_PLANE_THREADS,
            data_plane_scheduling: Scheduling::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConnectionsConfig {
    /// Maximum age of an agent connection (presence stream), with ±10% jitter so reconnects do
    /// not come in waves. In-flight requests on its tunnels finish normally.
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// A tunnel idle this long is closed by kas (only kas closes idle tunnels of a live
    /// connection, so no request is ever sent down a tunnel agentk is closing). agentk opens as
    /// many again as it still wants, so idle tunnels shrink back to agentk's target after load.
    #[serde(with = "humantime_serde")]
    pub idle_tunnel_timeout: Duration,
}

impl Default for AgentConnectionsConfig {
    fn default() -> Self {
        Self { max_age: DEFAULT_AGENT_CONNECTION_MAX_AGE, idle_tunnel_timeout: DEFAULT_IDLE_TUNNEL_TIMEOUT }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// How long in-flight requests may run after a shutdown signal.
    #[serde(with = "humantime_serde")]
    pub grace_period: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self { grace_period: DEFAULT_SHUTDOWN_GRACE }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("invalid config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid configuration: {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

impl Config {
    /// Reads, parses (unknown keys are errors) and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: p.clone(), source })?;
        let config = Self::parse(&text).map_err(|message| ConfigError::Parse { path: p, message })?;
        config.validate()?;
        Ok(config)
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_norway::from_str(text).map_err(|e| e.to_string())
    }

    /// Checks what the types cannot: addresses parse, required files are set, periods make sense.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, l) in [
            ("listeners.agent.address", &self.listeners.agent),
            ("listeners.api.address", &self.listeners.api),
            ("listeners.internal.address", &self.listeners.internal),
            ("listeners.rest.address", &self.listeners.rest),
            ("listeners.observability.address", &self.listeners.observability),
        ] {
            l.address.parse::<SocketAddr>().map_err(|e| ConfigError::Invalid {
                key,
                message: format!("\"{}\" is not an ip:port address ({e})", l.address),
            })?;
        }
        for origin in &self.rest.cors.allowed_origins {
            let ok = origin == "*"
                || ((origin.starts_with("http://") || origin.starts_with("https://"))
                    && !origin.ends_with('/')
                    && http::HeaderValue::from_str(origin).is_ok());
            if !ok {
                return Err(ConfigError::Invalid {
                    key: "rest.cors.allowed_origins",
                    message: format!("\"{origin}\" is not an origin (scheme://host[:port], no path) or \"*\""),
                });
            }
        }
        let required = [
            ("gitlab.authentication_secret_file", &self.gitlab.authentication_secret_file),
            ("kas_internal.authentication_secret_file", &self.kas_internal.authentication_secret_file),
        ];
        for (key, v) in required {
            if v.is_none() {
                return Err(ConfigError::Invalid { key, message: "is required".into() });
            }
        }
        // GitLab mode verifies agent tokens with GitLab; the static file is then optional.
        if self.gitlab.address.is_none() && self.agents.static_file.is_none() {
            return Err(ConfigError::Invalid {
                key: "agents.static_file",
                message: "is required (unless gitlab.address is set)".into(),
            });
        }
        if self.gitlab.address.is_some() && self.auth.users_file.is_some() {
            return Err(ConfigError::Invalid {
                key: "auth.users_file",
                message: "static users need static agents (no gitlab.address): in GitLab mode people use personal \
                          access tokens (pat:<agent_id>:<token>) and CI jobs their job token"
                    .into(),
            });
        }
        for (key, d) in [
            ("kas_internal.peer_ping_interval", self.kas_internal.peer_ping_interval),
            ("kas_internal.peer_ping_timeout", self.kas_internal.peer_ping_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::Invalid { key, message: "must be greater than zero".into() });
            }
        }
        if let Some(address) = &self.gitlab.address {
            let ok = address
                .parse::<http::Uri>()
                .is_ok_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some());
            if !ok || address.contains('?') || address.contains('#') {
                return Err(ConfigError::Invalid {
                    key: "gitlab.address",
                    message: format!("\"{address}\" is not an http(s) URL such as https://gitlab.example.com"),
                });
            }
        }
        if self.gitlab.rate_limit.requests_per_second == 0 {
            return Err(ConfigError::Invalid {
                key: "gitlab.rate_limit.requests_per_second",
                message: "must be greater than zero".into(),
            });
        }
        if self.gitlab.rate_limit.burst == 0 {
            return Err(ConfigError::Invalid {
                key: "gitlab.rate_limit.burst",
                message: "must be greater than zero".into(),
            });
        }
        let git = &self.agents.git;
        if git.rate_limit.requests_per_second == 0 || git.rate_limit.burst == 0 {
            return Err(ConfigError::Invalid {
                key: "agents.git.rate_limit",
                message: "requests_per_second and burst must be greater than zero".into(),
            });
        }
        if git.max_config_bytes == 0 {
            return Err(ConfigError::Invalid {
                key: "agents.git.max_config_bytes",
                message: "must be greater than zero".into(),
            });
        }
        if git.username.is_some() != git.password_file.is_some() {
            return Err(ConfigError::Invalid {
                key: "agents.git.password_file",
                message: "agents.git.username and agents.git.password_file go together".into(),
            });
        }
        if let Err(message) = crate::auth::gitlab::RepositoryUrlTemplate::parse(&self.gitlab.repository_url) {
            return Err(ConfigError::Invalid { key: "gitlab.repository_url", message });
        }
        if self.gitlab.agent_info_cache.max_entries == 0 {
            return Err(ConfigError::Invalid {
                key: "gitlab.agent_info_cache.max_entries",
                message: "must be greater than zero".into(),
            });
        }
        if self.gitops.project_info_cache.max_entries == 0 {
            return Err(ConfigError::Invalid {
                key: "gitops.project_info_cache.max_entries",
                message: "must be greater than zero".into(),
            });
        }
        if self.cluster_state.max_objects_per_agent == 0 {
            return Err(ConfigError::Invalid {
                key: "cluster_state.max_objects_per_agent",
                message: "must be greater than zero".into(),
            });
        }
        if self.gitlab.caller_cache.max_entries == 0 {
            return Err(ConfigError::Invalid {
                key: "gitlab.caller_cache.max_entries",
                message: "must be greater than zero".into(),
            });
        }
        // kas adds durations to the current time and scales them (jitter, `poll_period * 3`);
        // a huge one (`300000000000y` parses) would overflow there and panic.
        for (key, d) in self.durations() {
            if d > MAX_DURATION {
                return Err(ConfigError::Invalid {
                    key,
                    message: format!("must be at most {}", humantime::format_duration(MAX_DURATION)),
                });
            }
        }
        let nonzero = [
            ("routing.max_wait", self.routing.max_wait),
            ("gitlab.connect_timeout", self.gitlab.connect_timeout),
            ("gitlab.request_timeout", self.gitlab.request_timeout),
            ("gitlab.agent_info_cache.ttl", self.gitlab.agent_info_cache.ttl),
            ("gitlab.caller_cache.ttl", self.gitlab.caller_cache.ttl),
            ("agents.configuration_poll_period", self.agents.configuration_poll_period),
            ("agents.git.connect_timeout", self.agents.git.connect_timeout),
            ("agents.git.fetch_timeout", self.agents.git.fetch_timeout),
            ("gitops.poll_period", self.gitops.poll_period),
            ("gitops.status_ttl", self.gitops.status_ttl),
            ("cluster_state.retention", self.cluster_state.retention),
            ("rest.request_timeout", self.rest.request_timeout),
            ("registry.ttl", self.registry.ttl),
            ("registry.refresh_period", self.registry.refresh_period),
            ("registry.gc_period", self.registry.gc_period),
            ("registry.heartbeat_ttl", self.registry.heartbeat_ttl),
            ("registry.heartbeat_period", self.registry.heartbeat_period),
            ("agent_connections.max_age", self.agent_connections.max_age),
            ("agent_connections.idle_tunnel_timeout", self.agent_connections.idle_tunnel_timeout),
            ("connections.handshake_timeout", self.connections.handshake_timeout),
        ];
        for (key, d) in nonzero {
            if d.is_zero() {
                return Err(ConfigError::Invalid { key, message: "must be greater than zero".into() });
            }
        }
        if self.registry.refresh_period >= self.registry.ttl {
            return Err(ConfigError::Invalid {
                key: "registry.refresh_period",
                message: format!(
                    "must be shorter than registry.ttl ({}), or records expire between refreshes",
                    humantime::format_duration(self.registry.ttl)
                ),
            });
        }
        if self.kas_internal.tls.is_some() && self.listeners.internal.tls.is_some() {
            return Err(ConfigError::Invalid {
                key: "kas_internal.tls",
                message: "set either kas_internal.tls (kas <-> kas TLS, optionally mutual) or listeners.internal.tls, \
                          not both"
                    .into(),
            });
        }
        for (key, v) in [
            ("routing.max_concurrent_requests", self.routing.max_concurrent_requests),
            ("routing.max_concurrent_requests_per_agent", self.routing.max_concurrent_requests_per_agent),
            ("limits.agent_connections_per_minute", self.limits.agent_connections_per_minute as usize),
            (
                "limits.agent_connection_accept_rate.per_second",
                self.limits.agent_connection_accept_rate.per_second as usize,
            ),
            ("limits.agent_connection_accept_rate.burst", self.limits.agent_connection_accept_rate.burst as usize),
            ("limits.max_grpc_message_bytes", self.limits.max_grpc_message_bytes),
            ("limits.max_http_header_bytes", self.limits.max_http_header_bytes),
            (
                "auth.failed_agent_authentications.per_second",
                self.auth.failed_agent_authentications.per_second as usize,
            ),
            ("auth.failed_agent_authentications.burst", self.auth.failed_agent_authentications.burst as usize),
            ("connections.max_per_listener", self.connections.max_per_listener.unwrap_or(1)),
            ("connections.max_concurrent_streams", self.connections.max_concurrent_streams as usize),
        ] {
            if v == 0 {
                return Err(ConfigError::Invalid { key, message: "must be at least 1".into() });
            }
        }
        if self.connections.data_plane_threads > MAX_DATA_PLANE_THREADS {
            return Err(ConfigError::Invalid {
                key: "connections.data_plane_threads",
                message: format!("must be at most {MAX_DATA_PLANE_THREADS} (0 serves connections on kas's runtime)"),
            });
        }
        if self.auth.jwt_max_lifetime < crate::auth::jwt::MIN_JWT_MAX_LIFETIME {
            return Err(ConfigError::Invalid {
                key: "auth.jwt_max_lifetime",
                message: "must be at least 1m (GitLab's tokens and kas -> kas tokens live a minute)".into(),
            });
        }
        if self.registry.heartbeat_period >= self.registry.heartbeat_ttl {
            return Err(ConfigError::Invalid {
                key: "registry.heartbeat_period",
                message: format!(
                    "must be shorter than registry.heartbeat_ttl ({}), or live kas look dead between heartbeats",
                    humantime::format_duration(self.registry.heartbeat_ttl)
                ),
            });
        }
        if let Some(redis) = &self.registry.redis {
            redis.check().map_err(|(key, message)| ConfigError::Invalid { key, message })?;
        }
        Ok(())
    }

    /// Every duration setting, with its key.
    pub fn durations(&self) -> Vec<(&'static str, Duration)> {
        let mut out = vec![
            ("gitlab.connect_timeout", self.gitlab.connect_timeout),
            ("gitlab.request_timeout", self.gitlab.request_timeout),
            ("gitlab.agent_info_cache.ttl", self.gitlab.agent_info_cache.ttl),
            ("gitlab.agent_info_cache.error_ttl", self.gitlab.agent_info_cache.error_ttl),
            ("gitlab.caller_cache.ttl", self.gitlab.caller_cache.ttl),
            ("gitlab.caller_cache.error_ttl", self.gitlab.caller_cache.error_ttl),
            ("gitlab.rate_limit.max_wait", self.gitlab.rate_limit.max_wait),
            ("agents.configuration_poll_period", self.agents.configuration_poll_period),
            ("agents.git.connect_timeout", self.agents.git.connect_timeout),
            ("agents.git.fetch_timeout", self.agents.git.fetch_timeout),
            ("agents.git.rate_limit.max_wait", self.agents.git.rate_limit.max_wait),
            ("gitops.poll_period", self.gitops.poll_period),
            ("gitops.status_ttl", self.gitops.status_ttl),
            ("gitops.project_info_cache.ttl", self.gitops.project_info_cache.ttl),
            ("gitops.project_info_cache.error_ttl", self.gitops.project_info_cache.error_ttl),
            ("cluster_state.retention", self.cluster_state.retention),
            ("routing.max_wait", self.routing.max_wait),
            ("registry.ttl", self.registry.ttl),
            ("registry.refresh_period", self.registry.refresh_period),
            ("registry.gc_period", self.registry.gc_period),
            ("registry.heartbeat_ttl", self.registry.heartbeat_ttl),
            ("registry.heartbeat_period", self.registry.heartbeat_period),
            ("shutdown.grace_period", self.shutdown.grace_period),
            ("rest.request_timeout", self.rest.request_timeout),
            ("agent_connections.max_age", self.agent_connections.max_age),
        ];
        if let Some(redis) = &self.registry.redis {
            out.push(("registry.redis.response_timeout", redis.response_timeout));
        }
        out
    }

    /// Every listener on `127.0.0.1:0` (free ports picked by the OS): tests and benchmarks.
    pub fn with_ephemeral_ports(mut self) -> Self {
        for (_, l) in self.listeners.all_mut() {
            l.address = "127.0.0.1:0".into();
        }
        self
    }

    pub fn listener_address(l: &ListenerConfig) -> SocketAddr {
        // validate() has checked it; the fallback keeps this total.
        l.address.parse().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> &'static str {
        include_str!("../config.example.yaml")
    }

    #[test]
    fn example_config_parses_and_matches_defaults() {
        let parsed = Config::parse(example()).unwrap();
        parsed.validate().unwrap();
        // The example sets the required files; everything else must be exactly the defaults.
        let mut expected = Config::default();
        expected.gitlab.authentication_secret_file = Some("/etc/kas/gitlab-secret".into());
        expected.kas_internal.authentication_secret_file = Some("/etc/kas/internal-secret".into());
        expected.agents.static_file = Some("/etc/kas/agents.yaml".into());
        assert_eq!(parsed, expected);
    }

    /// The dotted paths of the keys the example shows, written out or commented out (`# key:`
    /// lines count, at the indentation of their text), e.g. `gitlab.rate_limit.burst`.
    fn example_paths() -> std::collections::HashSet<String> {
        let mut paths = std::collections::HashSet::new();
        let mut stack: Vec<(usize, String)> = Vec::new();
        for line in example().lines() {
            let indent = line.len() - line.trim_start().len();
            let rest = line.trim_start();
            // "# key: ..." is a commented-out option: uncommented, its key sits where the "#" was.
            let (indent, rest) = match rest.strip_prefix("# ") {
                Some(text) => (indent + (text.len() - text.trim_start().len()), text.trim_start()),
                None => (indent, rest),
            };
            let Some((key, _)) = rest.split_once(':') else { continue };
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
                continue;
            }
            while stack.last().is_some_and(|(i, _)| *i >= indent) {
                stack.pop();
            }
            stack.push((indent, key.to_owned()));
            paths.insert(stack.iter().map(|(_, k)| k.as_str()).collect::<Vec<_>>().join("."));
        }
        paths
    }

    /// Every option with a default value is shown (written out or commented) in the example,
    /// at its place: `gitlab.rate_limit.burst`, not just some `burst:` anywhere.
    #[test]
    fn example_config_shows_every_option() {
        fn keys(v: &serde_norway::Value, prefix: &str, out: &mut Vec<String>) {
            if let serde_norway::Value::Mapping(m) = v {
                for (k, v) in m {
                    if let Some(k) = k.as_str() {
                        let path = if prefix.is_empty() { k.to_owned() } else { format!("{prefix}.{k}") };
                        keys(v, &path, out);
                        out.push(path);
                    }
                }
            }
        }
        let mut all = Vec::new();
        keys(&serde_norway::to_value(Config::default()).unwrap(), "", &mut all);
        let shown = example_paths();
        assert!(shown.contains("gitlab.rate_limit.burst") && shown.contains("listeners.agent.tls.key_file"));
        for path in all {
            assert!(shown.contains(&path), "config.example.yaml does not show `{path}` at its place");
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::parse("listeners:\n  api:\n    adress: 1.2.3.4:5\n").unwrap_err();
        assert!(e.contains("unknown field `adress`"), "{e}");
        let e = Config::parse("routing:\n  max_wait: forever\n").unwrap_err();
        assert!(e.contains("routing.max_wait") && e.contains("forever"), "{e}");
    }

    /// `registry.redis` is one server (`url`) or a cluster (`cluster_nodes`): never both, never
    /// neither, and the messages name the key.
    #[test]
    fn redis_is_one_server_or_a_cluster() {
        let with_redis = |yaml: &str| {
            let mut c = Config::parse(example()).unwrap();
            c.registry.redis = Some(serde_norway::from_str(yaml).map_err(|e| e.to_string())?);
            c.validate().map(|()| c).map_err(|e| e.to_string())
        };
        let c = with_redis("cluster_nodes: [redis://10.0.0.1:6379, redis://10.0.0.2:6379]").unwrap();
        let redis = c.registry.redis.unwrap();
        assert_eq!((redis.url, redis.cluster_nodes.len()), (None, 2));
        with_redis("url: redis://redis:6379").unwrap();
        let e = with_redis("url: redis://redis:6379\ncluster_nodes: [redis://10.0.0.1:6379]").unwrap_err();
        assert!(e.contains("registry.redis: set either url") && e.contains("not both"), "{e}");
        let e = with_redis("key_prefix: kas").unwrap_err();
        assert!(e.contains("registry.redis: set url (one Redis server) or cluster_nodes"), "{e}");
        let e = with_redis("cluster_nodes: [unix:///run/redis.sock]").unwrap_err();
        assert!(e.contains("registry.redis.cluster_nodes: `unix:///run/redis.sock`"), "{e}");
        let e = with_redis("cluster: true\nurl: redis://redis:6379").unwrap_err();
        assert!(e.contains("unknown field `cluster`"), "{e}");
    }

    #[test]
    fn validation_messages_name_the_key() {
        let mut c = Config::parse(example()).unwrap();
        c.listeners.api.address = "nope".into();
        assert!(c.validate().unwrap_err().to_string().contains("listeners.api.address"));
        let mut c = Config::parse(example()).unwrap();
        c.agents.static_file = None;
        assert!(c.validate().unwrap_err().to_string().contains("agents.static_file: is required"));
        c.gitlab.address = Some("https://gitlab.example.com".into());
        c.validate().unwrap();
        c.gitlab.address = Some("gitlab.example.com".into());
        assert!(c.validate().unwrap_err().to_string().contains("gitlab.address"));
        let mut c = Config::parse(example()).unwrap();
        c.gitlab.rate_limit.burst = 0;
        assert!(c.validate().unwrap_err().to_string().contains("gitlab.rate_limit.burst"));
        let mut c = Config::parse(example()).unwrap();
        c.registry.refresh_period = c.registry.ttl;
        assert!(c.validate().unwrap_err().to_string().contains("registry.refresh_period"));
        let mut c = Config::parse(example()).unwrap();
        c.rest.cors.allowed_origins = vec!["https://ok.example".into(), "gitlab.example.com".into()];
        assert!(c.validate().unwrap_err().to_string().contains("rest.cors.allowed_origins"));
        c.rest.cors.allowed_origins = vec!["https://ok.example".into(), "*".into()];
        c.validate().unwrap();
        let mut c = Config::parse(example()).unwrap();
        c.gitlab.repository_url = "{gitlab}/{project}.git".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("gitlab.repository_url") && e.contains("unknown placeholder {project}"), "{e}");
        let mut c = Config::parse(example()).unwrap();
        c.agents.git.username = Some("kas".into());
        assert!(c.validate().unwrap_err().to_string().contains("agents.git.password_file"));
        let mut c = Config::parse(example()).unwrap();
        c.kas_internal.peer_ping_timeout = Duration::ZERO;
        assert!(c.validate().unwrap_err().to_string().contains("kas_internal.peer_ping_timeout"));
        let mut c = Config::parse(example()).unwrap();
        c.agents.git.fetch_timeout = Duration::ZERO;
        assert!(c.validate().unwrap_err().to_string().contains("agents.git.fetch_timeout"));
        let mut c = Config::parse(example()).unwrap();
        c.gitlab.caller_cache.max_entries = 0;
        assert!(c.validate().unwrap_err().to_string().contains("gitlab.caller_cache.max_entries"));
        let mut c = Config::parse(example()).unwrap();
        c.gitlab.caller_cache.ttl = Duration::ZERO;
        assert!(c.validate().unwrap_err().to_string().contains("gitlab.caller_cache.ttl"));
        let c = Config::parse("gitlab:\n  caller_cache:\n    ttl: 30s\n").unwrap();
        assert_eq!(c.gitlab.caller_cache.ttl, Duration::from_secs(30));
        assert_eq!(c.gitlab.caller_cache.error_ttl, crate::auth::gitlab::config::DEFAULT_CALLER_CACHE_ERROR_TTL);
        let e = Config::parse("gitlab:\n  caller_cache:\n    tll: 30s\n").unwrap_err();
        assert!(e.contains("unknown field `tll`"), "{e}");
        let mut c = Config::parse(example()).unwrap();
        assert_eq!(c.connections.data_plane_threads, DEFAULT_DATA_PLANE_THREADS);
        c.connections.data_plane_threads = MAX_DATA_PLANE_THREADS + 1;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("connections.data_plane_threads") && e.contains("at most 256"), "{e}");
        c.connections.data_plane_threads = 0;
        c.validate().unwrap();
        assert_eq!(c.connections.data_plane_scheduling, Scheduling::Batch);
        let c = Config::parse("connections:\n  data_plane_scheduling: normal\n").unwrap();
        assert_eq!(c.connections.data_plane_scheduling, Scheduling::Normal);
        let e = Config::parse("connections:\n  data_plane_scheduling: fifo\n").unwrap_err();
        assert!(e.contains("unknown variant `fifo`") && e.contains("batch") && e.contains("normal"), "{e}");
    }

    /// Found by `proptests::arbitrary_durations`: `300000000000y` parses (it fits a u64 of
    /// seconds) and was accepted, and kas then panicked adding it to the current time or
    /// scaling it (agent_connections.max_age jitter, registry ttls, shutdown grace, ...).
    #[test]
    fn huge_durations_are_refused() {
        let text = include_str!("../config.example.yaml").replace("max_age: 2h", "max_age: 300000000000y");
        let c = Config::parse(&text).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("agent_connections.max_age: must be at most 100years"), "{e}");
        let mut c = Config::parse(example()).unwrap();
        c.shutdown.grace_period = MAX_DURATION;
        c.validate().unwrap();
        c.shutdown.grace_period = MAX_DURATION + Duration::from_nanos(1);
        assert!(c.validate().unwrap_err().to_string().contains("shutdown.grace_period"));
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;
    use serde_norway::Value;

    use super::*;

    fn example() -> Value {
        serde_norway::from_str(include_str!("../config.example.yaml")).unwrap()
    }

    /// Every key path of a YAML mapping, leaves and sections, e.g. `routing.max_wait`.
    fn paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
        if let Value::Mapping(m) = v {
            for (k, v) in m {
                let Some(k) = k.as_str() else { continue };
                let path = if prefix.is_empty() { k.to_owned() } else { format!("{prefix}.{k}") };
                out.push(path.clone());
                paths(v, &path, out);
            }
        }
    }

    /// Known keys: the example's plus the optional ones it only shows in comments.
    fn known_paths() -> Vec<String> {
        let mut out = Vec::new();
        paths(&example(), "", &mut out);
        for extra in [
            "gitlab.address",
            "gitlab.ca_cert_file",
            "kas_internal.advertise_ip",
            "kas_internal.tls",
            "agents.git.username",
            "agents.git.password_file",
            "agents.git.mirror_dir",
            "registry.redis",
            "registry.redis.url",
            "registry.redis.cluster_nodes",
            "registry.redis.key_prefix",
            "registry.redis.response_timeout",
            "listeners.rest.tls",
            "listeners.rest.tls.certificate_file",
            "listeners.nope",
        ] {
            out.push(extra.to_owned());
        }
        out
    }

    /// Values of every shape, with the edge cases of the key types (zero, huge and malformed
    /// durations and numbers, addresses, URLs).
    fn value() -> impl Strategy<Value = Value> {
        let scalar = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|v| Value::Number(v.into())),
            any::<u64>().prop_map(|v| Value::Number(v.into())),
            (0u64..4).prop_map(|v| Value::Number(v.into())),
            any::<f64>().prop_map(|v| Value::Number(v.into())),
            prop_oneof![
                Just("0s"),
                Just("1ns"),
                Just("20s"),
                Just("300000000000y"),
                Just("584942417355y"),
                Just("99999999999999999999999h"),
                Just("1h 1ns"),
                Just("-1s"),
                Just("0.0.0.0:0"),
                Just("[::1]:8154"),
                Just("127.0.0.1:99999"),
                Just("https://gitlab.example.com"),
                Just("https://gitlab.example.com/"),
                Just("http://"),
                Just("*"),
                Just("{gitlab}/{x}"),
                Just("{"),
                Just(""),
                Just(" "),
            ]
            .prop_map(|s| Value::String(s.to_owned())),
            "([0-9]{1,12}(ns|us|ms|s|m|h|d|w|M|y) ?){1,3}".prop_map(Value::String),
            ".{0,20}".prop_map(Value::String),
        ];
        scalar.prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Sequence),
                proptest::collection::vec(("[a-z_]{1,10}", inner), 0..3)
                    .prop_map(|kv| { Value::Mapping(kv.into_iter().map(|(k, v)| (Value::String(k), v)).collect()) }),
            ]
        })
    }

    /// The example's value at `path`, if any.
    fn get<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
        path.split('.').try_fold(root, |node, k| node.get(k))
    }

    /// A value of the key's own type (edge cases included) most of the time, so that most cases
    /// get past the parser and exercise validate(); a value of any shape otherwise.
    fn typed_value(existing: Option<&Value>) -> BoxedStrategy<Value> {
        let string = |s: BoxedStrategy<String>| s.prop_map(Value::String).boxed();
        let typed = match existing {
            Some(Value::Number(_)) => prop_oneof![
                3 => (0u64..3).prop_map(|v| Value::Number(v.into())),
                3 => any::<u32>().prop_map(|v| Value::Number(v.into())),
                1 => any::<u64>().prop_map(|v| Value::Number(v.into())),
                1 => (i64::MIN..0).prop_map(|v| Value::Number(v.into())),
            ]
            .boxed(),
            Some(Value::String(s)) if humantime::parse_duration(s).is_ok() => string(
                prop_oneof![
                    Just("0s".to_owned()),
                    Just("300000000000y".to_owned()),
                    Just("100years".to_owned()),
                    "[0-9]{1,6}(ns|ms|s|m|h|d|y)",
                    any::<u64>().prop_map(|v| humantime::format_duration(Duration::from_secs(v)).to_string()),
                ]
                .boxed(),
            ),
            Some(Value::String(s)) if s.parse::<SocketAddr>().is_ok() => string(
                prop_oneof![
                    Just("0.0.0.0:0".to_owned()),
                    Just("[::1]:8154".to_owned()),
                    "127\\.0\\.0\\.1:[0-9]{1,6}",
                    "[0-9a-z.:\\[\\]]{0,16}",
                ]
                .boxed(),
            ),
            Some(Value::Sequence(_)) => proptest::collection::vec(
                prop_oneof![Just("*".to_owned()), "https?://[a-z.]{1,10}(:[0-9]{1,5})?/?", ".{0,12}"]
                    .prop_map(Value::String),
                0..3,
            )
            .prop_map(Value::Sequence)
            .boxed(),
            Some(Value::String(_)) => string(
                prop_oneof![
                    Just("{gitlab}/{project_path}.git".to_owned()),
                    Just(String::new()),
                    "[{}a-z_/.]{0,20}",
                    ".{0,20}"
                ]
                .boxed(),
            ),
            _ => value().boxed(),
        };
        prop_oneof![6 => typed, 1 => value()].boxed()
    }

    fn pick() -> impl Strategy<Value = (String, Value)> {
        let example = example();
        let keys = known_paths();
        let leaves: Vec<String> =
            keys.iter().filter(|k| !matches!(get(&example, k), Some(Value::Mapping(_)))).cloned().collect();
        prop_oneof![4 => proptest::sample::select(leaves), 1 => proptest::sample::select(keys)].prop_flat_map(
            move |key| {
                let v = typed_value(get(&example, &key));
                (Just(key), v)
            },
        )
    }

    fn set(root: &mut Value, path: &str, v: Value) {
        let mut node = root;
        let mut keys = path.split('.').peekable();
        while let Some(k) = keys.next() {
            if !matches!(node, Value::Mapping(_)) {
                *node = Value::Mapping(Default::default());
            }
            let Value::Mapping(m) = node else { unreachable!() };
            let key = Value::String(k.to_owned());
            if keys.peek().is_none() {
                m.insert(key, v);
                return;
            }
            node = m.entry(key).or_insert(Value::Null);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary text as the config file: parsed or refused with a message, never a panic.
        #[test]
        fn arbitrary_text_never_panics(text in prop_oneof![".{0,200}", "([a-z_]{1,12}:( [ -~]{0,12})?\n {0,4}){0,10}"]) {
            match Config::parse(&text) {
                Ok(c) => { let _ = c.validate(); }
                Err(e) => prop_assert!(!e.is_empty()),
            }
        }

        /// The example file with characters inserted or removed: never a panic.
        #[test]
        fn mangled_example_never_panics(at in any::<proptest::sample::Index>(), cut in 0usize..8, insert in ".{0,4}") {
            let text = include_str!("../config.example.yaml");
            let i = at.index(text.len());
            let (i, j) = (text.floor_char_boundary(i), text.floor_char_boundary((i + cut).min(text.len())));
            let mangled = format!("{}{insert}{}", &text[..i], &text[j..]);
            if let Ok(c) = Config::parse(&mangled) {
                let _ = c.validate();
            }
        }

        /// Any duration for any duration key: refused naming the key, or usable (no overflow
        /// when kas adds it to the current time or scales it).
        #[test]
        fn arbitrary_durations(
            key in any::<proptest::sample::Index>(),
            d in prop_oneof![
                any::<u64>().prop_map(Duration::from_secs),
                (0u64..=u64::MAX / 1_000_000_000).prop_map(Duration::from_secs),
                (0u64..4_000_000_000).prop_map(Duration::from_secs),
                any::<u64>().prop_map(Duration::from_nanos),
            ],
        ) {
            let keys: Vec<&str> = Config::default().durations().into_iter().map(|(k, _)| k).collect();
            let key = key.get(&keys);
            let mut doc = example();
            set(&mut doc, key, Value::String(humantime::format_duration(d).to_string()));
            let config = Config::parse(&serde_norway::to_string(&doc).unwrap());
            prop_assert!(config.is_ok(), "{key}: {d:?}: {config:?}");
            let config = config.unwrap();
            prop_assert_eq!(config.durations().into_iter().find(|(k, _)| k == key).map(|(_, v)| v), Some(d));
            match config.validate() {
                Err(ConfigError::Invalid { key: refused, .. }) => {
                    // Another key may be named when this one broke an ordering (refresh < ttl).
                    prop_assert!(keys.contains(&refused), "{refused}");
                }
                Err(e) => prop_assert!(false, "validate() gave {e}"),
                Ok(()) => {
                    let scaled = d.checked_mul(4);
                    prop_assert!(
                        scaled.and_then(|s| tokio::time::Instant::now().checked_add(s)).is_some(),
                        "{key}: {d:?} accepted but overflows when used"
                    );
                }
            }
        }

        /// Arbitrary values for known keys (and a few unknown ones): refused by the parser
        /// (naming the problem) or by validate() (naming the key), or a configuration whose
        /// invariants hold, and that kas can use without arithmetic overflow.
        #[test]
        fn arbitrary_values_for_known_keys(
            picks in proptest::collection::vec(pick(), 1..4),
        ) {
            let keys = known_paths();
            let mut doc = example();
            for (key, v) in picks {
                set(&mut doc, &key, v);
            }
            let text = serde_norway::to_string(&doc).unwrap();
            let config = match Config::parse(&text) {
                Ok(c) => c,
                Err(e) => {
                    prop_assert!(!e.is_empty());
                    return Ok(());
                }
            };
            match config.validate() {
                Err(ConfigError::Invalid { key, message }) => {
                    prop_assert!(!message.is_empty());
                    prop_assert!(keys.iter().any(|k| k == key), "unknown key {key} in an error");
                }
                Err(e) => prop_assert!(false, "validate() gave {e}"),
                Ok(()) => {
                    for l in [&config.listeners.agent, &config.listeners.api, &config.listeners.internal, &config.listeners.rest, &config.listeners.observability] {
                        prop_assert!(l.address.parse::<SocketAddr>().is_ok());
                    }
                    prop_assert!(config.registry.refresh_period < config.registry.ttl);
                    prop_assert!(config.registry.heartbeat_period < config.registry.heartbeat_ttl);
                    prop_assert!(config.routing.max_concurrent_requests > 0 && config.agents.git.max_config_bytes > 0);
                    // kas adds these to the current time and scales them by small factors
                    // (jitter, `poll_period * 3`): none of that may overflow.
                    for (key, d) in config.durations() {
                        let scaled = d.checked_mul(4);
                        prop_assert!(
                            scaled.and_then(|s| tokio::time::Instant::now().checked_add(s)).is_some(),
                            "{key}: {d:?} accepted but overflows when used"
                        );
                    }
                    // Serializing and parsing again gives the same configuration.
                    let again = Config::parse(&serde_norway::to_string(&config).unwrap());
                    prop_assert_eq!(again.as_ref(), Ok(&config));
                }
            }
        }
    }
}
