//! The only wiring file: `App::bind` binds every listener, `Bound::serve` runs until shutdown.
//! Tests drive kas through exactly this path.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kas_proto::kas::kas_api_server::KasApiServer;
use kas_proto::kas::kas_internal_server::KasInternalServer;
use kas_proto::kas::{KasAddress, KasInstanceInfo};
use kas_proto::tunnel::pb::agent_tunnel_server::AgentTunnelServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptorLayer;
use tonic::transport::{Identity, Server};

use crate::auth::gitlab::SharedKeys;
use crate::auth::gitlab::caller_access::CallerAccess;
use crate::auth::static_users::StaticUsers;
use crate::auth::{JwtVerifier, Secret, StaticAgents, TokenVerifier};
use crate::config::{Config, ConfigError, ListenerConfig};
use crate::modules::configuration::{AgentConfigurations, ConfigurationSource};
use crate::modules::gitops::repository::{GitlabProjects, ManifestRepositories};
use crate::modules::gitops::state::GitopsState;
use crate::modules::kubernetes_api::callers::{CallerVerifiers, StaticCallers};
use crate::modules::{GrpcServices, ModuleContext};
use crate::registry::{AgentRegistry, MemoryRegistry, MemoryStore, RedisRegistry, new_instance_id};
use crate::router::Router;
use crate::router::peers::Peers;
use crate::server::agent::AgentService;
use crate::server::api::{ApiService, jwt_interceptor};
use crate::server::data_plane::DataPlane;
use crate::server::internal::InternalService;
use crate::server::listen::{self, Acceptor, ConnectionLimits};
use crate::server::rest::serve::HttpSettings;
use crate::server::rest::{self, RestState};
use crate::tunnel::{TunnelRegistry, TunnelStats};

/// agentk pings are answered by the transport; kas pings too so a dead agent is noticed in
/// seconds, not when TCP gives up.
const AGENT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const AGENT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// After the grace period the agent listener gets this long to close its streams.
const AGENT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The api and internal listeners ping idle callers too: a vanished GitLab or peer kas
/// connection is closed within interval + timeout instead of holding a descriptor until TCP
/// gives up.
const GRPC_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const GRPC_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Secret(#[from] crate::auth::secret::SecretError),
    #[error(transparent)]
    Agents(#[from] crate::auth::agent_token::StaticAgentsError),
    #[error(transparent)]
    Users(#[from] crate::auth::static_users::StaticUsersError),
    #[error(transparent)]
    Gitlab(#[from] crate::auth::gitlab::GitlabSetupError),
    #[error(transparent)]
    Git(#[from] crate::modules::configuration::mirror::MirrorSetupError),
    #[error("cannot bind the {listener} listener on {address}: {source}")]
    Bind { listener: &'static str, address: SocketAddr, source: std::io::Error },
    #[error("the {listener} listener failed: {source}")]
    Serve { listener: &'static str, source: tonic::transport::Error },
    #[error("the {listener} listener stopped unexpectedly: {reason}")]
    ListenerStopped { listener: &'static str, reason: String },
    #[error("TLS of the {listener} listener: {message}")]
    HttpTls { listener: &'static str, message: String },
    #[error("TLS of the {listener} listener: cannot read {path}: {source}")]
    TlsFile { listener: &'static str, path: String, source: std::io::Error },
    #[error("agent registry: {0}")]
    Registry(crate::registry::RegistryError),
    #[error("cannot start the data plane threads: {0}")]
    DataPlane(std::io::Error),
}

/// kas before binding: configuration plus optional injected dependencies.
pub struct App {
    config: Config,
    memory_store: Option<MemoryStore>,
}

/// kas with its listeners bound (addresses known), not yet serving.
pub struct Bound {
    config: Config,
    agent: TcpListener,
    api: TcpListener,
    internal: TcpListener,
    rest: TcpListener,
    observability: TcpListener,
    addresses: Addresses,
    gitlab_secret: Secret,
    internal_secret: Secret,
    configurations: Arc<AgentConfigurations>,
    verifier: Arc<dyn TokenVerifier>,
    callers: CallerVerifiers,
    /// GitLab mode: where GitOps manifest projects are (project_info); static otherwise.
    manifest_repositories: ManifestRepositories,
    /// The static agents file (`None` in GitLab mode, where it only overrides configurations).
    static_agents: Option<Arc<StaticAgents>>,
    registry: Arc<dyn AgentRegistry>,
    tunnels_handle: Arc<std::sync::OnceLock<TunnelRegistry>>,
    tls: ListenerTls,
}

/// TLS identities read at bind time, so a bad certificate fails startup, not the first call.
#[derive(Default)]
struct ListenerTls {
    agent: Option<tokio_rustls::TlsAcceptor>,
    api: Option<tokio_rustls::TlsAcceptor>,
    internal: Option<tokio_rustls::TlsAcceptor>,
    rest: Option<tokio_rustls::TlsAcceptor>,
    observability: Option<tokio_rustls::TlsAcceptor>,
}

impl ListenerTls {
    /// The listeners that serve TLS, for the startup log line ("none" when all are plaintext).
    fn listeners(&self) -> String {
        let on = [
            ("agent", self.agent.is_some()),
            ("api", self.api.is_some()),
            ("internal", self.internal.is_some()),
            ("rest", self.rest.is_some()),
            ("observability", self.observability.is_some()),
        ];
        let names: Vec<&str> = on.iter().filter(|(_, tls)| *tls).map(|(name, _)| *name).collect();
        if names.is_empty() { "none".to_owned() } else { names.join(",") }
    }
}

/// gRPC listeners offer only HTTP/2 by ALPN.
const GRPC_ALPN: &[&[u8]] = &[b"h2"];

/// TLS of a gRPC listener. kas runs the handshake itself (not tonic), so that it is bounded by
/// connections.handshake_timeout.
fn load_tls(listener: &'static str, config: &ListenerConfig) -> Result<Option<tokio_rustls::TlsAcceptor>, AppError> {
    let Some(tls) = &config.tls else { return Ok(None) };
    crate::tools::tls::server_tls(&tls.certificate_file, &tls.key_file, None, GRPC_ALPN)
        .map(Some)
        .map_err(|message| AppError::HttpTls { listener, message })
}

fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, AppError> {
    std::fs::read(path).map_err(|source| AppError::TlsFile {
        listener: "internal",
        path: path.display().to_string(),
        source,
    })
}

/// The internal listener's TLS from `kas_internal.tls`; mutual when client certificates are required.
fn internal_server_tls(t: &crate::config::InternalTlsConfig) -> Result<tokio_rustls::TlsAcceptor, AppError> {
    let client_ca = t.require_client_certificates.then_some(t.ca_file.as_path());
    crate::tools::tls::server_tls(&t.certificate_file, &t.key_file, client_ca, GRPC_ALPN)
        .map_err(|message| AppError::HttpTls { listener: "internal", message })
}

/// How this kas dials peers: their certificate verified against the kas CA for `server_name`,
/// this kas's certificate presented (for mutual TLS).
fn internal_client_tls(t: &crate::config::InternalTlsConfig) -> Result<tonic::transport::ClientTlsConfig, AppError> {
    Ok(tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            crate::tools::tls::read_ca_bundle(&t.ca_file)
                .map_err(|message| AppError::HttpTls { listener: "internal", message })?,
        ))
        .domain_name(t.server_name.clone())
        .identity(Identity::from_pem(read_pem(&t.certificate_file)?, read_pem(&t.key_file)?)))
}

/// A server builder for one gRPC listener (TLS, when configured, is done by its incoming
/// stream: see `listen::grpc_incoming`).
fn builder(max_concurrent_streams: u32) -> Server {
    Server::builder().max_concurrent_streams(max_concurrent_streams)
}

/// HTTP/2 flow control of the gRPC listeners (tunnels on agent and internal, request bodies on
/// api): one stream's unread bytes never hold the shared connection's window, whatever the
/// number of streams the listener allows (`kas_proto::flow`).
fn flow_control(server: Server, max_streams: u32) -> Server {
    kas_proto::flow::grow_stream_windows();
    server
        .initial_stream_window_size(kas_proto::flow::STREAM_WINDOW)
        .initial_connection_window_size(kas_proto::flow::connection_window(max_streams))
        .max_frame_size(kas_proto::flow::MAX_FRAME_SIZE)
}

#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    pub agent: SocketAddr,
    pub api: SocketAddr,
    pub internal: SocketAddr,
    /// The REST gateway (plaintext HTTP).
    pub rest: SocketAddr,
    pub observability: SocketAddr,
}

/// Read-only access to a serving kas, for tests and health checks.
#[derive(Clone)]
pub struct Handle {
    tunnels: Arc<std::sync::OnceLock<TunnelRegistry>>,
    registry: Arc<dyn AgentRegistry>,
}

impl Handle {
    /// This kas's registry (its instance info, and what it reads).
    pub fn registry(&self) -> &Arc<dyn AgentRegistry> {
        &self.registry
    }

    /// Counts of local connections, idle tunnels and parked requests (None before serving).
    pub async fn tunnel_stats(&self) -> Option<TunnelStats> {
        self.tunnels.get()?.stats().await.ok()
    }
}

impl App {
    pub fn new(config: Config) -> Self {
        Self { config, memory_store: None }
    }

    /// Uses this in-memory store (shared by several kas in one process, for tests) when no
    /// Redis is configured.
    pub fn with_memory_store(mut self, store: MemoryStore) -> Self {
        self.memory_store = Some(store);
        self
    }

    pub async fn bind(self) -> Result<Bound, AppError> {
        let config = self.config;
        config.validate()?;
        let required = |p: &Option<std::path::PathBuf>| p.clone().unwrap_or_default();
        let gitlab_secret = Secret::from_file(&required(&config.gitlab.authentication_secret_file))?;
        let internal_secret = Secret::from_file(&required(&config.kas_internal.authentication_secret_file))?;
        // GitLab mode: GitLab verifies agent tokens; the static file (optional then) only
        // supplies agent configurations by agent id.
        let agents = Arc::new(match &config.agents.static_file {
            Some(path) => StaticAgents::from_file(path)?,
            None => StaticAgents::new(Default::default()),
        });
        let mut callers = CallerVerifiers::default();
        let mut manifest_repositories = ManifestRepositories::Static;
        let gitlab_verifier = match &config.gitlab.address {
            Some(address) => {
                let gitlab = crate::auth::GitlabVerifier::new(&config.gitlab, address, gitlab_secret.clone())?
                    .with_overrides(agents.clone());
                // CI job and personal access tokens, and GitOps's project_info, share GitLab's
                // client (and rate limit).
                callers.gitlab = Some(Arc::new(CallerAccess::new(gitlab.client(), &config.gitlab.caller_cache)));
                let template = crate::auth::gitlab::RepositoryUrlTemplate::parse(&config.gitlab.repository_url)
                    .map_err(|e| {
                        crate::auth::gitlab::GitlabSetupError::Client(format!("gitlab.repository_url: {e}"))
                    })?;
                manifest_repositories = ManifestRepositories::Gitlab(GitlabProjects::new(
                    gitlab.client(),
                    template,
                    address.clone(),
                    &config.gitops.project_info_cache,
                ));
                Some(gitlab)
            }
            None => None,
        };
        let static_agents = config.gitlab.address.is_none().then(|| agents.clone());
        let configurations =
            Arc::new(AgentConfigurations::new(&config.agents.git, config.agents.configuration_poll_period)?);
        if let Some(path) = &config.auth.users_file {
            callers.users = Some(Arc::new(StaticCallers {
                users: StaticUsers::from_file(path)?,
                agents: agents.clone(),
                configurations: configurations.clone(),
            }));
        }
        let tls = ListenerTls {
            agent: load_tls("agent", &config.listeners.agent)?,
            api: load_tls("api", &config.listeners.api)?,
            internal: match &config.kas_internal.tls {
                Some(t) => Some(internal_server_tls(t)?),
                None => load_tls("internal", &config.listeners.internal)?,
            },
            rest: match &config.listeners.rest.tls {
                Some(tls) => Some(
                    crate::tools::tls::tls_acceptor(tls)
                        .map_err(|message| AppError::HttpTls { listener: "rest", message })?,
                ),
                None => None,
            },
            observability: match &config.listeners.observability.tls {
                Some(tls) => Some(
                    crate::tools::tls::tls_acceptor(tls)
                        .map_err(|message| AppError::HttpTls { listener: "observability", message })?,
                ),
                None => None,
            },
        };

        fn bind(listener: &'static str, address: SocketAddr) -> Result<TcpListener, AppError> {
            listen::bind(address).map_err(|source| AppError::Bind { listener, address, source })
        }
        let agent = bind("agent", Config::listener_address(&config.listeners.agent))?;
        let api = bind("api", Config::listener_address(&config.listeners.api))?;
        let internal = bind("internal", Config::listener_address(&config.listeners.internal))?;
        let rest = bind("rest", Config::listener_address(&config.listeners.rest))?;
        let observability = bind("observability", Config::listener_address(&config.listeners.observability))?;
        let local = |l: &TcpListener, name: &'static str| {
            l.local_addr().map_err(|source| AppError::Bind {
                listener: name,
                address: SocketAddr::from(([0, 0, 0, 0], 0)),
                source,
            })
        };
        let addresses = Addresses {
            agent: local(&agent, "agent")?,
            api: local(&api, "api")?,
            internal: local(&internal, "internal")?,
            rest: local(&rest, "rest")?,
            observability: local(&observability, "observability")?,
        };
        // Peers reach this kas at the internal listener's actually bound port.
        let advertised_ip = config.kas_internal.advertise_ip.unwrap_or(addresses.internal.ip());
        if config.registry.redis.is_some() && advertised_ip.is_unspecified() {
            return Err(AppError::Config(ConfigError::Invalid {
                key: "kas_internal.advertise_ip",
                message: format!(
                    "is required when listeners.internal.address binds a wildcard ({}): other kas must reach this one",
                    addresses.internal
                ),
            }));
        }
        let instance = KasInstanceInfo {
            version: crate::VERSION.to_owned(),
            commit: crate::COMMIT.to_owned(),
            address: Some(KasAddress {
                ip: advertised_ip.to_string(),
                port: u32::from(config.kas_internal.advertise_port.unwrap_or(addresses.internal.port())),
            }),
            instance_id: new_instance_id(),
        };
        let timing = config.registry.timing();
        let (registry, shared_agent_info): (Arc<dyn AgentRegistry>, _) = match &config.registry.redis {
            Some(redis) => {
                let redis = RedisRegistry::new(redis, instance, timing).map_err(AppError::Registry)?;
                let shared = redis.shared_agent_info_cache();
                (Arc::new(redis), Some(shared))
            }
            None => {
                let memory = MemoryRegistry::with_store(self.memory_store.unwrap_or_default(), instance, timing);
                (Arc::new(memory), None)
            }
        };
        let verifier: Arc<dyn TokenVerifier> = match gitlab_verifier {
            // Every kas of the registry shares GitLab's answers (auth::gitlab::shared), keyed by an
            // HMAC under the secret the kas share among themselves.
            Some(gitlab) => match shared_agent_info.filter(|_| config.gitlab.agent_info_cache.shared) {
                Some(store) => Arc::new(gitlab.with_shared_cache(store, SharedKeys::new(internal_secret.clone()))),
                None => Arc::new(gitlab),
            },
            None => agents.clone(),
        };
        Ok(Bound {
            config,
            agent,
            api,
            internal,
            rest,
            observability,
            addresses,
            gitlab_secret,
            internal_secret,
            configurations,
            verifier,
            callers,
            manifest_repositories,
            static_agents,
            registry,
            tunnels_handle: Arc::default(),
            tls,
        })
    }
}

fn spawn_server(
    listener: &'static str,
    server: impl Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
) -> JoinHandle<Result<(), AppError>> {
    tokio::spawn(async move { server.await.map_err(|source| AppError::Serve { listener, source }) })
}

/// A gRPC listener's incoming connections, one stream per thread (`listen::grpc_incoming`).
type GrpcIncoming = tokio_stream::wrappers::ReceiverStream<std::io::Result<listen::GrpcIo>>;

/// Serves a gRPC listener: one server per stream, each on its data plane thread (on kas's
/// runtime when the data plane is disabled). The task ends when every server has ended, or
/// with the first that failed; aborting it stops them all.
fn spawn_grpc_server<F>(
    listener: &'static str,
    incoming: Vec<GrpcIncoming>,
    data_plane: &DataPlane,
    serve: impl Fn(GrpcIncoming) -> F,
) -> JoinHandle<Result<(), AppError>>
where
    F: Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
{
    use futures::StreamExt;

    let threads = data_plane.handles();
    if threads.is_empty() {
        // One stream: the listener's server on this runtime, as before the data plane.
        let servers = futures::future::try_join_all(incoming.into_iter().map(serve));
        return spawn_server(listener, async move { servers.await.map(drop) });
    }
    let mut servers: futures::stream::FuturesUnordered<_> = incoming
        .into_iter()
        .zip(threads)
        .map(|(incoming, thread)| tokio_util::task::AbortOnDropHandle::new(thread.spawn(serve(incoming))))
        .collect();
    tokio::spawn(async move {
        while let Some(ended) = servers.next().await {
            match ended {
                Ok(Ok(())) => {}
                Ok(Err(source)) => return Err(AppError::Serve { listener, source }),
                Err(join) => {
                    return Err(AppError::ListenerStopped {
                        listener,
                        reason: format!("its server on a data plane thread failed: {join}"),
                    });
                }
            }
        }
        Ok(())
    })
}

impl Bound {
    pub fn addresses(&self) -> Addresses {
        self.addresses
    }

    pub fn handle(&self) -> Handle {
        Handle { tunnels: self.tunnels_handle.clone(), registry: self.registry.clone() }
    }

    /// Serves until `shutdown` is cancelled, then drains: external listeners finish in-flight
    /// requests within the grace period, agents are told to move, records are removed last.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), AppError> {
        let Bound {
            config,
            agent,
            api,
            internal,
            rest,
            observability,
            addresses,
            gitlab_secret,
            internal_secret,
            configurations,
            verifier,
            callers,
            manifest_repositories,
            static_agents,
            registry,
            tunnels_handle,
            tls,
        } = self;
        let tls_listeners = tls.listeners();
        let data_plane =
            DataPlane::start(config.connections.data_plane_threads, config.connections.data_plane_scheduling)
                .map_err(AppError::DataPlane)?;
        // Stops the tunnel registry and maintenance after the external listeners drained.
        let background = CancellationToken::new();
        let tunnels = TunnelRegistry::spawn(background.clone(), config.agent_connections.idle_tunnel_timeout);
        let _ = tunnels_handle.set(tunnels.clone());
        // Installed before anything is recorded (metrics recorded without a recorder are lost).
        crate::metrics::handle();
        // The features, in one list (modules::all): their metrics, services and routes.
        let modules = crate::modules::all();
        for module in &modules {
            module.describe_metrics();
        }
        let peers = match &config.kas_internal.tls {
            Some(t) => Peers::new(internal_secret.clone()).with_tls(internal_client_tls(t)?),
            None => Peers::new(internal_secret.clone()),
        };
        let peers = Arc::new(
            peers
                .with_ping(config.kas_internal.peer_ping_interval, config.kas_internal.peer_ping_timeout)
                .with_runtime(data_plane.handles().into_iter().next()),
        );
        let cluster_state = crate::modules::cluster_state::hub::ClusterStateHub::new(
            config.cluster_state.clone(),
            registry.clone(),
            peers.clone(),
            shutdown.clone(),
        );
        let router = Router::new(tunnels.clone(), registry.clone(), peers, config.routing.max_wait)
            .with_limits(config.routing.max_concurrent_requests, config.routing.max_concurrent_requests_per_agent);
        // Alive before the first agent registers, so peers do not ignore its records.
        if let Err(e) = registry.heartbeat().await {
            tracing::warn!(error = %e, "first registry heartbeat failed; retrying periodically");
        }
        let git = configurations.clone();
        let configurations: Arc<dyn ConfigurationSource> = configurations;
        let agent_auth = Arc::new(crate::auth::agent_auth::AgentAuthenticator::new(
            verifier,
            &config.auth.failed_agent_authentications,
        ));
        let gitops = Arc::new(GitopsState {
            config: config.gitops.clone(),
            registry: registry.clone(),
            configurations: configurations.clone(),
            git,
            repositories: manifest_repositories,
            static_agents,
            shutdown: shutdown.clone(),
        });
        let mut services = GrpcServices::default();
        let context = ModuleContext {
            router: router.clone(),
            agent_auth: agent_auth.clone(),
            configurations: configurations.clone(),
            gitops: gitops.clone(),
            cluster_state: cluster_state.clone(),
            shutdown: shutdown.clone(),
        };
        for module in &modules {
            module.grpc_services(&context, &mut services);
        }
        // The specification's services first; each feature's own follow.
        let GrpcServices { agent: agent_services, api: api_services, internal: internal_services } = services;

        let agent_service = AgentService {
            auth: agent_auth,
            configurations,
            configuration_poll_period: config.agents.configuration_poll_period,
            registry: registry.clone(),
            tunnels: tunnels.clone(),
            shutdown: shutdown.clone(),
            max_connection_age: config.agent_connections.max_age,
            connections_per_minute: config.limits.agent_connections_per_minute,
            admission: crate::server::admission::Admission::new(&config.limits.agent_connection_accept_rate),
        };
        // Every listener: capped connections, a handshake deadline, TCP keepalive.
        let limits = ConnectionLimits {
            max_connections: config.connections.max_per_listener.unwrap_or_else(listen::default_max_connections),
            handshake_timeout: config.connections.handshake_timeout,
        };
        let incoming = |name: &'static str, l: TcpListener, tls: Option<tokio_rustls::TlsAcceptor>| {
            listen::grpc_incoming(Acceptor::new(name, l, limits), tls, &data_plane, shutdown.clone())
        };
        let streams = config.connections.max_concurrent_streams;
        // A peer kas may forward up to its routing.max_concurrent_requests on one connection.
        let internal_streams = streams.max(u32::try_from(config.routing.max_concurrent_requests).unwrap_or(u32::MAX));
        let max_message = config.limits.max_grpc_message_bytes;
        // What is not the path to an agent keeps its handlers here, off the data plane: the
        // features' gRPC services (wrapped before the specification's are added) and the rest
        // routes other than the Kubernetes API proxy.
        let off_data_plane = data_plane.is_enabled().then(tokio::runtime::Handle::current);
        let agent_routes = crate::server::data_plane::grpc_routes(agent_services, off_data_plane.as_ref())
            .add_service(AgentTunnelServer::new(agent_service).max_decoding_message_size(max_message));
        let api_routes = crate::server::data_plane::grpc_routes(api_services, off_data_plane.as_ref()).add_service(
            KasApiServer::new(ApiService { router: router.clone(), gitops: gitops.clone() })
                .max_decoding_message_size(max_message),
        );
        let internal_routes = crate::server::data_plane::grpc_routes(internal_services, off_data_plane.as_ref())
            .add_service(
                KasInternalServer::new(InternalService { router: router.clone() })
                    .max_decoding_message_size(max_message),
            );
        let agent_server = flow_control(builder(streams), streams)
            .http2_keepalive_interval(Some(AGENT_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(AGENT_KEEPALIVE_TIMEOUT))
            .add_routes(agent_routes);
        let mut agent_task = spawn_grpc_server("agent", incoming("agent", agent, tls.agent), &data_plane, |incoming| {
            agent_server.clone().serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned())
        });
        let api_server = flow_control(builder(streams), streams)
            .http2_keepalive_interval(Some(GRPC_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(GRPC_KEEPALIVE_TIMEOUT))
            .layer(InterceptorLayer::new(jwt_interceptor(
                JwtVerifier::gitlab(&gitlab_secret).with_max_lifetime(config.auth.jwt_max_lifetime).for_listener("api"),
            )))
            .add_routes(api_routes);
        let mut api_task = spawn_grpc_server("api", incoming("api", api, tls.api), &data_plane, |incoming| {
            api_server.clone().serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned())
        });
        let rest_state = RestState::new(rest::RestStateParts {
            router: router.clone(),
            verifier: JwtVerifier::gitlab(&gitlab_secret)
                .with_max_lifetime(config.auth.jwt_max_lifetime)
                .for_listener("rest"),
            config: config.rest.clone().into(),
            callers,
            gitops,
            cluster_state,
        });
        // HTTP/1.1 and HTTP/2, upgrades, optional TLS; on shutdown it stops accepting and lets
        // in-flight requests finish (bounded by the grace period below).
        let rest_shutdown = shutdown.clone();
        let rest_tls = tls.rest;
        let http = HttpSettings {
            max_header_bytes: config.limits.max_http_header_bytes,
            handshake_timeout: config.connections.handshake_timeout,
            max_concurrent_streams: streams,
        };
        // Up until kas has stopped: probes and scrapes work during the drain. Its own small
        // connection cap: floods of the other listeners cannot take its descriptors.
        let stop_observability = CancellationToken::new();
        let observability_limits =
            ConnectionLimits { max_connections: listen::OBSERVABILITY_MAX_CONNECTIONS, ..limits };
        let observability_task = tokio::spawn(crate::server::rest::serve::serve(
            Acceptor::new("observability", observability, observability_limits),
            tls.observability,
            crate::server::observability::router(crate::server::observability::ObservabilityState {
                tunnels: tunnels.clone(),
                registry: registry.clone(),
                registry_required: config.registry.redis.is_some(),
                shutdown: shutdown.clone(),
            }),
            http,
            DataPlane::disabled(),
            stop_observability.clone(),
        ));
        let rest_router = rest::router(rest_state, &modules, off_data_plane);
        let rest_data_plane = data_plane.clone();
        let mut rest_task = tokio::spawn(async move {
            crate::server::rest::serve::serve(
                Acceptor::new("rest", rest, limits),
                rest_tls,
                rest_router,
                http,
                rest_data_plane,
                rest_shutdown,
            )
            .await;
            Ok(())
        });
        let internal_server = flow_control(builder(internal_streams), internal_streams)
            .http2_keepalive_interval(Some(GRPC_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(GRPC_KEEPALIVE_TIMEOUT))
            .layer(InterceptorLayer::new(jwt_interceptor(
                JwtVerifier::internal(&internal_secret)
                    .with_max_lifetime(config.auth.jwt_max_lifetime)
                    .for_listener("internal"),
            )))
            .add_routes(internal_routes);
        let mut internal_task =
            spawn_grpc_server("internal", incoming("internal", internal, tls.internal), &data_plane, |incoming| {
                internal_server.clone().serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned())
            });
        let maintenance =
            tokio::spawn(maintain_registry(registry.clone(), config.registry.clone(), background.clone()));
        tracing::info!(
            agent = %addresses.agent,
            api = %addresses.api,
            internal = %addresses.internal,
            rest = %addresses.rest,
            observability = %addresses.observability,
            tls = %tls_listeners,
            features = %modules.iter().map(|m| m.name()).collect::<Vec<_>>().join(","),
            kas = %registry.instance().instance_id,
            version = crate::VERSION,
            "kas listening"
        );

        // Run until asked to stop, or until a listener fails on its own.
        let early = tokio::select! {
            biased;
            () = shutdown.cancelled() => None,
            r = &mut agent_task => Some(("agent", r)),
            r = &mut api_task => Some(("api", r)),
            r = &mut internal_task => Some(("internal", r)),
            r = &mut rest_task => Some(("rest", r)),
        };
        // A listener that ends because shutdown began (it may be polled before the token) is fine.
        let early = early.filter(|(_, end)| !(shutdown.is_cancelled() && matches!(end, Ok(Ok(())))));
        shutdown.cancel();
        let grace = tokio::time::Instant::now() + config.shutdown.grace_period;
        tracing::info!(grace_period = ?config.shutdown.grace_period, "shutting down: draining listeners");
        for task in [&mut api_task, &mut internal_task, &mut rest_task] {
            if !task.is_finished() && tokio::time::timeout_at(grace, &mut *task).await.is_err() {
                tracing::warn!("grace period over: cancelling in-flight requests");
                task.abort();
            }
        }
        // Idle tunnels and parked requests end now, so the agent listener can close.
        background.cancel();
        if !agent_task.is_finished() && tokio::time::timeout(AGENT_DRAIN_TIMEOUT, &mut agent_task).await.is_err() {
            agent_task.abort();
        }
        let _ = maintenance.await;
        if let Err(e) = registry.remove_all_owned().await {
            tracing::warn!(error = %e, "removing registry records on shutdown failed");
        }
        stop_observability.cancel();
        let _ = observability_task.await;
        // Its threads stop here, with whatever connection was still open on them.
        drop(data_plane);
        tracing::info!("kas stopped");
        early_outcome(early)
    }
}

/// How a listener task ended: its own result, or how the task itself failed (a panic).
type ListenerEnd = Result<Result<(), AppError>, tokio::task::JoinError>;

/// How `serve` ends: `Ok` when it was asked to stop; otherwise the error of the listener that
/// ended first, including a panic or a listener that simply stopped (so callers and tests see it).
fn early_outcome(early: Option<(&'static str, ListenerEnd)>) -> Result<(), AppError> {
    match early {
        None => Ok(()),
        Some((_, Ok(Err(e)))) => Err(e),
        Some((listener, Ok(Ok(())))) => {
            Err(AppError::ListenerStopped { listener, reason: "it ended without being asked to".into() })
        }
        Some((listener, Err(join))) => {
            let reason = if join.is_panic() { "it panicked".to_owned() } else { join.to_string() };
            tracing::error!(listener, %reason, "listener task ended");
            Err(AppError::ListenerStopped { listener, reason })
        }
    }
}

async fn maintain_registry(
    registry: Arc<dyn AgentRegistry>,
    config: crate::config::RegistryConfig,
    stop: CancellationToken,
) {
    let start = tokio::time::Instant::now();
    // The first ticks come one period after start (register and heartbeat already wrote).
    let mut refresh = tokio::time::interval_at(start + config.refresh_period, config.refresh_period);
    let mut gc = tokio::time::interval_at(start + config.gc_period, config.gc_period);
    let mut heartbeat = tokio::time::interval_at(start + config.heartbeat_period, config.heartbeat_period);
    for t in [&mut refresh, &mut gc, &mut heartbeat] {
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = heartbeat.tick() => if let Err(e) = registry.heartbeat().await {
                tracing::warn!(error = %e, "registry heartbeat failed");
            },
            _ = refresh.tick() => if let Err(e) = registry.refresh().await {
                tracing::warn!(error = %e, "registry refresh failed");
            },
            _ = gc.tick() => if let Err(e) = registry.gc().await {
                tracing::warn!(error = %e, "registry gc failed");
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serve_reports_a_listener_that_panicked_or_stopped_on_its_own() {
        assert!(early_outcome(None).is_ok(), "asked to stop: Ok");
        let panicked = tokio::spawn(async { panic!("listener bug") }).await.map(|()| Ok(()));
        let err = early_outcome(Some(("rest", panicked))).unwrap_err();
        assert_eq!(err.to_string(), "the rest listener stopped unexpectedly: it panicked");
        let err = early_outcome(Some(("api", Ok(Ok(()))))).unwrap_err();
        assert!(err.to_string().starts_with("the api listener stopped unexpectedly"), "{err}");
    }
}
