//! agentk's lifecycle: connect to kas, hold `GetConfiguration` (presence) and a tunnel pool,
//! reconnect with backoff, drain on shutdown, and the observability listener (`/livez`,
//! `/readyz`). Tests run agentk through exactly this path.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kas_proto::ConnectionId;
use kas_proto::tunnel::pb::agent_tunnel_client::AgentTunnelClient;
use kas_proto::tunnel::pb::{self, AgentMeta, ConfigurationRequest};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::backoff::Backoff;
use crate::config::{AgentConfig, KubeSource};
use crate::data_plane::DataPlane;
pub use crate::error::AgentError;
use crate::modules::{self, Module};
use crate::pool::{self, IDLE_LINGER, PoolContext, PoolStats};
pub use crate::status::Status;

/// First reconnect delay ceiling, and the cap (full jitter below it). Public, with
/// `HEALTHY_AFTER`, so that kas-sim reconnects its simulated agents exactly as agentk does.
pub const RECONNECT_BASE: Duration = Duration::from_millis(200);
pub const RECONNECT_CAP: Duration = Duration::from_secs(30);
/// A connection that lasted this long was healthy: the next failure starts backoff afresh.
pub const HEALTHY_AFTER: Duration = Duration::from_secs(30);
/// HTTP/2 pings when nothing was received for the interval: a hung kas (no FIN, no RST) is
/// left for the next address within interval + timeout (6 s), not when TCP gives up. Cost: one
/// 17-byte ping and its ack per idle connection every 3 s (10,000 agents: 3,300 pings/s on
/// the kas side, about 1 MB/s with TCP/IP headers and a fraction of a core).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Called with each configuration kas sends (e.g. to change the log level).
pub type ConfigurationObserver = Arc<dyn Fn(&pb::AgentConfiguration) + Send + Sync>;

pub struct App {
    config: AgentConfig,
    token: Arc<str>,
    /// One lazily connected channel per kas address, in `--kas-address` order (their
    /// connections run on the data plane).
    channels: Arc<[(String, Channel)]>,
    /// The tunnels' runtime: kas connections, the tunnel pool, the tunnels.
    data_plane: DataPlane,
    modules: Arc<[Arc<dyn Module>]>,
    observer: Option<ConfigurationObserver>,
    connected: watch::Sender<Option<ConnectionId>>,
    pool_stats: watch::Sender<PoolStats>,
    configuration: watch::Sender<Option<pb::ConfigurationResponse>>,
    failed_attempts: watch::Sender<u64>,
    gitops: watch::Sender<crate::status::GitopsState>,
    /// Bound in `new`, served by `run` (taken there).
    observability: Option<TcpListener>,
    observability_address: SocketAddr,
}

async fn kube_config(source: &KubeSource) -> Result<kube::Config, AgentError> {
    let config = match source {
        KubeSource::InCluster => kube::Config::incluster().map_err(|e| {
                AgentError::Kube(format!(
                    "{e}: agentk is not running in a Kubernetes pod; outside a cluster pass --kubeconfig (or set KUBECONFIG)"
                ))
            })?,
        KubeSource::Kubeconfig(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| AgentError::Kube(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| AgentError::Kube(e.to_string()))?
        }
        KubeSource::Config(c) => (**c).clone(),
    };
    Ok(config)
}

fn read_file(what: &'static str, path: &std::path::Path) -> Result<Vec<u8>, AgentError> {
    std::fs::read(path).map_err(|source| AgentError::ReadFile { what, path: path.display().to_string(), source })
}

fn endpoint(config: &AgentConfig, address: &str) -> Result<Endpoint, AgentError> {
    let bad = |message: String| AgentError::KasAddress { address: address.to_owned(), message };
    let (uri, tls) = if let Some(rest) = address.strip_prefix("grpcs://") {
        (format!("https://{rest}"), true)
    } else if let Some(rest) = address.strip_prefix("grpc://") {
        (format!("http://{rest}"), false)
    } else {
        return Err(bad("expected grpc:// or grpcs://".into()));
    };
    kas_proto::flow::grow_stream_windows();
    let mut ep = Endpoint::from_shared(uri)
        .map_err(|e| bad(e.to_string()))?
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        // Request bodies of all tunnels share this connection: one unread stream must not hold
        // its window (`kas_proto::flow`).
        .initial_stream_window_size(kas_proto::flow::STREAM_WINDOW)
        .initial_connection_window_size(kas_proto::flow::CONNECTION_WINDOW)
        .max_frame_size(kas_proto::flow::MAX_FRAME_SIZE);
    if tls {
        let mut tls_config = ClientTlsConfig::new().with_native_roots();
        if let Some(ca) = &config.ca_cert_file {
            tls_config = tls_config.ca_certificate(Certificate::from_pem(read_file("CA certificate file", ca)?));
        }
        ep = ep.tls_config(tls_config).map_err(|e| bad(e.to_string()))?;
    } else if config.ca_cert_file.is_some() {
        return Err(bad("--ca-cert-file needs a grpcs:// address".into()));
    }
    Ok(ep)
}

impl App {
    /// Validates the configuration, reads the token, builds the Kubernetes client and binds the
    /// observability listener (so a bad or busy address fails startup, not a probe later).
    pub async fn new(config: AgentConfig) -> Result<Self, AgentError> {
        // Installed before anything is recorded (metrics recorded without a recorder are lost).
        crate::metrics::handle();
        config.validate()?;
        let token_text = read_file("token file", &config.token_file)?;
        let token = String::from_utf8_lossy(&token_text).trim().to_owned();
        if token.is_empty() {
            return Err(AgentError::EmptyToken(config.token_file.display().to_string()));
        }
        let data_plane = DataPlane::start(config.data_plane_scheduling).map_err(AgentError::DataPlane)?;
        let channels = {
            // A channel's connection task is spawned where it is created: on the data plane.
            let _data_plane = data_plane.handle().enter();
            config
                .kas_addresses()
                .into_iter()
                .map(|address| Ok((address.to_owned(), endpoint(&config, address)?.connect_lazy())))
                .collect::<Result<Vec<_>, AgentError>>()?
        };
        let kube = kube_config(&config.kube).await?;
        let configuration = watch::channel(None).0;
        let gitops = watch::channel(crate::status::GitopsState::default()).0;
        let context = modules::ModuleContext {
            kube_config: &kube,
            configuration: &configuration,
            api_timeouts: modules::kubernetes_api::ApiTimeouts {
                connect: config.kube_api_connect_timeout,
                response_header: config.kube_api_response_header_timeout,
            },
            gitops: config.gitops,
            pod_name: &config.pod_name,
            pod_namespace: &config.pod_namespace,
            gitops_state: &gitops,
        };
        let modules = modules::all(&context).map_err(|e| AgentError::Kube(e.to_string()))?;
        let observability = crate::observability::bind(config.observability_address).await?;
        let observability_address = observability
            .local_addr()
            .map_err(|source| AgentError::ObservabilityBind { address: config.observability_address, source })?;
        Ok(Self {
            config,
            token: token.into(),
            channels: channels.into(),
            data_plane,
            modules: modules.into(),
            observer: None,
            connected: watch::channel(None).0,
            pool_stats: watch::channel(PoolStats::default()).0,
            configuration,
            failed_attempts: watch::channel(0).0,
            gitops,
            observability: Some(observability),
            observability_address,
        })
    }

    /// Where `/livez` and `/readyz` are served (the bound port when the config asked for 0).
    pub fn observability_address(&self) -> SocketAddr {
        self.observability_address
    }

    pub fn with_configuration_observer(mut self, observer: ConfigurationObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Puts a configuration from kas in force.
    fn apply(&self, update: pb::ConfigurationResponse, last_commit: &mut String) {
        tracing::info!(commit_id = %update.commit_id, "received agent configuration");
        if let (Some(observer), Some(c)) = (&self.observer, &update.configuration) {
            observer(c);
        }
        last_commit.clone_from(&update.commit_id);
        self.configuration.send_replace(Some(update));
    }

    pub fn status(&self) -> Status {
        Status {
            connected: self.connected.subscribe(),
            pool: self.pool_stats.subscribe(),
            configuration: self.configuration.subscribe(),
            failed_attempts: self.failed_attempts.subscribe(),
            observability_address: self.observability_address,
            gitops: self.gitops.subscribe(),
        }
    }

    /// Runs until `shutdown`; then stops taking requests, lets in-flight ones finish within the
    /// grace period, and returns. The observability listener is served throughout: `/readyz`
    /// turns 503 as soon as the kas connection ends, `/livez` stays 200 until agentk has stopped.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let stop_observability = CancellationToken::new();
        let observability = self.observability.take().map(|listener| {
            tokio::spawn(crate::observability::serve(listener, self.status(), stop_observability.clone()))
        });
        let stop_all = CancellationToken::new();
        let in_flight = TaskTracker::new();
        // Modules' own work (GitOps) runs beside the connection, across reconnects.
        let run_context = modules::RunContext { kas: self.channels.clone(), token: self.token.clone() };
        let module_tasks: Vec<_> = self
            .modules
            .iter()
            .map(|m| tokio::spawn(m.clone().run(run_context.clone(), shutdown.child_token())))
            .collect();
        let mut backoff = Backoff::new(RECONNECT_BASE, RECONNECT_CAP);
        let mut last_commit = String::new();
        // Each new connection goes to the next kas address: when a kas ends the connection
        // (draining for a restart, or the connection reached its maximum age) or fails, agentk
        // moves to another replica rather than waiting for the same one.
        for attempt in 0usize.. {
            if shutdown.is_cancelled() {
                break;
            }
            let (address, channel) = &self.channels[attempt % self.channels.len()];
            let started = Instant::now();
            let mut pushback = None;
            match self.session(address, channel, &shutdown, &stop_all, &in_flight, &mut last_commit).await {
                Ok(()) if shutdown.is_cancelled() => tracing::info!("connection to kas closed for shutdown"),
                Ok(()) => tracing::info!("kas ended the connection; reconnecting"),
                Err(status) => {
                    self.failed_attempts.send_modify(|n| *n += 1);
                    // A busy kas (a failover storm) says when to come back: never sooner.
                    pushback = kas_proto::metadata::retry_pushback(&status);
                    tracing::warn!(
                        code = ?status.code(),
                        error = %status.message(),
                        retry_pushback_ms = pushback.map(|p| p.as_millis() as u64),
                        "connection to kas failed"
                    );
                }
            }
            if started.elapsed() >= HEALTHY_AFTER {
                backoff.reset();
            }
            let delay = backoff.next_delay_after(pushback);
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(delay) => {}
            }
        }
        in_flight.close();
        if tokio::time::timeout(self.config.grace_period, in_flight.wait()).await.is_err() {
            tracing::warn!("grace period over: cancelling in-flight requests");
            stop_all.cancel();
            in_flight.wait().await;
        }
        // They stopped at the signal; GitOps releases its Lease within its own bound.
        for task in module_tasks {
            let _ = task.await;
        }
        stop_observability.cancel();
        if let Some(task) = observability {
            let _ = task.await;
        }
        tracing::info!("agentk stopped");
    }

    /// One kas connection: presence stream plus tunnel pool, until either ends.
    async fn session(
        &self,
        address: &str,
        channel: &Channel,
        shutdown: &CancellationToken,
        stop_all: &CancellationToken,
        in_flight: &TaskTracker,
        last_commit: &mut String,
    ) -> Result<(), tonic::Status> {
        let connection_id = ConnectionId::random();
        let mut client = AgentTunnelClient::new(channel.clone());
        let request = ConfigurationRequest {
            connection_id: connection_id.0,
            agent_meta: Some(AgentMeta {
                version: crate::VERSION.into(),
                commit: crate::COMMIT.into(),
                pod_namespace: self.config.pod_namespace.clone(),
                pod_name: self.config.pod_name.clone(),
            }),
            commit_id: last_commit.clone(),
        };
        let mut req = tonic::Request::new(request);
        if let Ok(v) = format!("Bearer {}", self.token).parse() {
            req.metadata_mut().insert(kas_proto::metadata::AUTHORIZATION, v);
        }
        let mut stream = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            r = client.get_configuration(req) => r?.into_inner(),
        };
        tracing::info!(%connection_id, kas = %address, "connected to kas");
        // The first configuration (which may restrict the Kubernetes API proxy) is in force
        // before any tunnel serves a request. kas always sends one to an agentk without one.
        if self.configuration.borrow().is_none() {
            let first = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                m = stream.message() => m?,
            };
            let Some(update) = first else { return Ok(()) };
            self.apply(update, last_commit);
        }
        crate::metrics::connected();
        let stop_idle = shutdown.child_token();
        let stop_opening = CancellationToken::new();
        let pool = self.data_plane.handle().spawn(pool::run(PoolContext {
            channel: channel.clone(),
            token: self.token.clone(),
            connection_id,
            modules: self.modules.clone(),
            stop_opening: stop_opening.clone(),
            stop_idle: stop_idle.clone(),
            stop_all: stop_all.clone(),
            in_flight: in_flight.clone(),
            min_idle: self.config.min_idle_tunnels,
            max: self.config.max_tunnels,
            idle_quiet_period: self.config.idle_quiet_period,
            stats: self.pool_stats.clone(),
        }));
        self.connected.send_replace(Some(connection_id));
        let result = loop {
            let message = tokio::select! {
                () = shutdown.cancelled() => break Ok(()),
                m = stream.message() => m,
            };
            match message {
                Ok(Some(update)) => self.apply(update, last_commit),
                Ok(None) => break Ok(()),
                Err(status) => break Err(status),
            }
        };
        self.connected.send_replace(None);
        // kas closes this connection's idle tunnels when it sees the presence stream end; until
        // then a request may still arrive on one (it is served). Closing them here at once would
        // race with kas sending a request down one of them. In-use tunnels finish (`in_flight`).
        stop_opening.cancel();
        let mut pool_stats = self.pool_stats.subscribe();
        let _ = tokio::time::timeout(IDLE_LINGER, pool_stats.wait_for(|s| s.idle == 0)).await;
        stop_idle.cancel();
        let _ = pool.await;
        result
    }
}

#[cfg(test)]
mod proptests {
    use clap::Parser;
    use proptest::prelude::*;

    use super::*;
    use crate::config::{Args, ConfigError};

    fn address() -> impl Strategy<Value = String> {
        prop_oneof![
            "(grpcs?|https?|tcp)://[a-z0-9.:\\[\\]@/-]{0,16}",
            "grpc://127\\.0\\.0\\.1:[0-9]{1,6}",
            "grpcs://[a-z]{1,8}(:[0-9]{1,5})?",
            "[ -~]{0,20}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary flag values: refused by clap or by validate() with the documented message,
        /// or a configuration whose every kas address makes an endpoint or a clear error at
        /// startup; never a panic.
        #[test]
        fn arbitrary_flags(
            addresses in proptest::collection::vec(address(), 0..3),
            separator in prop_oneof![Just(","), Just(", "), Just(",,")],
            min in prop_oneof![Just("0".to_owned()), Just("2".to_owned()), "[0-9-]{0,21}"],
            max in prop_oneof![Just("500".to_owned()), Just("1".to_owned()), "[0-9-]{0,21}"],
            grace in prop_oneof![Just("20s".to_owned()), Just("300000000000y".to_owned()), "[0-9a-z ]{0,8}"],
            observability in prop_oneof![Just("0.0.0.0:8080".to_owned()), "[0-9.:\\[\\]a-z]{0,16}"],
        ) {
            let kas_address = addresses.join(separator);
            let args = [
                "agentk", "--kas-address", &kas_address, "--token-file", "/t",
                "--min-idle-tunnels", &min, "--max-tunnels", &max,
                "--grace-period", &grace, "--observability-address", &observability,
            ];
            let Ok(args) = Args::try_parse_from(args) else { return Ok(()) };
            match AgentConfig::from_args(&args) {
                Ok(config) => {
                    prop_assert!(config.min_idle_tunnels >= 1 && config.min_idle_tunnels <= config.max_tunnels);
                    let addresses = config.kas_addresses();
                    prop_assert!(!addresses.is_empty());
                    for a in addresses {
                        prop_assert!(a.starts_with("grpc://") || a.starts_with("grpcs://"));
                        if let Err(e) = endpoint(&config, a) {
                            prop_assert!(matches!(e, AgentError::KasAddress { .. }), "{e}");
                        }
                    }
                }
                Err(ConfigError::KasAddress(a)) => prop_assert!(
                    !(a.starts_with("grpc://") || a.starts_with("grpcs://")),
                    "{a:?} refused"
                ),
                Err(ConfigError::Pool { min, max }) => prop_assert!(min == 0 || min > max),
                // No timeout flag is generated, so the defaults apply and are never zero.
                Err(ConfigError::ZeroTimeout(flag)) => prop_assert!(false, "{flag} refused though not given"),
                Err(e @ ConfigError::LeaseTimings { .. }) => prop_assert!(false, "defaults refused: {e}"),
            }
        }
    }
}
