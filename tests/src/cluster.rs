//! `Cluster`: N kas (sharing one registry store) and any number of agentk, in-process on
//! ephemeral ports, with a fake Kubernetes API server and generated secrets.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kas::agent::AgentConfigDocument;
use kas::auth::agent_token::{StaticAgent, StaticAgentsFile, token_sha256_hex};
use kas::auth::jwt::{GITLAB_ISSUER, KAS_AUDIENCE, KAS_ISSUER};
use kas::auth::{Secret, mint_jwt};
use kas::registry::AgentRegistry;
use kas::registry::memory::MemoryStore;
use kas::registry::redis::RedisConfig;
use kas_proto::kas::KubernetesRequest;
use kas_proto::kas::kas_api_client::KasApiClient;
use kas_proto::kas::kas_internal_client::KasInternalClient;
use kas_proto::kubernetes_api::{HttpFrame, HttpRequestHead, http_frame};
use kas_proto::tunnel::pb::agent_tunnel_client::AgentTunnelClient;
use kas_proto::tunnel::pb::{ConfigurationRequest, ConfigurationResponse};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::certificates::{Certificate, LOCALHOST_AND_IP};
use crate::fake_gitlab::{FakeGitlab, GitlabAgent};
use crate::fake_kube::FakeKube;
use crate::git_http::{GitHttpServer, GitRepo};
use crate::redis_server::{RedisCluster, RedisServer};

/// An agent in the static agents file of the cluster.
#[derive(Debug, Clone)]
pub struct TestAgent {
    pub id: i64,
    pub project_id: i64,
    pub token: String,
    pub token_file: PathBuf,
    pub configuration: Option<AgentConfigDocument>,
}

type ConfigEdit = Box<dyn FnOnce(&mut kas::Config, &std::path::Path)>;

pub struct ClusterBuilder {
    kas_count: usize,
    agents: Vec<(i64, i64, Option<AgentConfigDocument>)>,
    max_wait: Duration,
    edits: Vec<ConfigEdit>,
    redis: bool,
    redis_cluster: bool,
    gitlab: bool,
    gitlab_tls: bool,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        Self {
            kas_count: 1,
            agents: vec![(1, 10, None)],
            max_wait: Duration::from_secs(10),
            edits: Vec::new(),
            redis: false,
            redis_cluster: false,
            gitlab: false,
            gitlab_tls: false,
        }
    }
}

impl ClusterBuilder {
    pub fn kas(mut self, n: usize) -> Self {
        self.kas_count = n;
        self
    }

    /// Replaces the agents: (agent id, project id).
    pub fn agents(mut self, agents: &[(i64, i64)]) -> Self {
        self.agents = agents.iter().map(|&(a, p)| (a, p, None)).collect();
        self
    }

    /// Gives an agent a configuration in the static agents file.
    pub fn agent_configuration(mut self, agent_id: i64, doc: AgentConfigDocument) -> Self {
        if let Some(a) = self.agents.iter_mut().find(|a| a.0 == agent_id) {
            a.2 = Some(doc);
        }
        self
    }

    /// Changes kas's configuration before kas starts (given the cluster's temp dir for files).
    pub fn configure(mut self, edit: impl FnOnce(&mut kas::Config, &std::path::Path) + 'static) -> Self {
        self.edits.push(Box::new(edit));
        self
    }

    /// Use a private real redis-server as the registry (instead of a shared in-memory store),
    /// with short heartbeat and refresh periods so expiry is observable in tests.
    pub fn redis(mut self) -> Self {
        self.redis = true;
        self
    }

    /// Use a private Redis Cluster (three masters, [`RedisCluster`]) as the registry, with the
    /// same short periods as [`ClusterBuilder::redis`].
    pub fn redis_cluster(mut self) -> Self {
        self.redis_cluster = true;
        self
    }

    /// Serve the rest listener over TLS with a self-signed certificate for `localhost` (kubectl
    /// sends its bearer token only over TLS). The certificate is its own CA.
    pub fn rest_tls(self) -> Self {
        self.configure(|config, dir| {
            let files = Certificate::self_signed(LOCALHOST_AND_IP).write(dir, "rest");
            config.listeners.rest.tls = Some(files.tls_config());
        })
    }

    /// GitLab mode: a [`FakeGitlab`] (sharing the cluster's GitLab secret, knowing every
    /// agent's token) verifies agent tokens; kas gets no static agents file.
    pub fn gitlab(mut self) -> Self {
        self.gitlab = true;
        self
    }

    /// GitLab mode ([`ClusterBuilder::gitlab`]) with the fake serving HTTPS
    /// ([`FakeGitlab::start_tls`]) and its CA certificate as kas's `gitlab.ca_cert_file`.
    pub fn gitlab_tls(mut self) -> Self {
        self.gitlab = true;
        self.gitlab_tls = true;
        self
    }

    /// kas's routing.max_wait.
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }

    pub async fn start(self) -> Cluster {
        // Boxed: the setup holds much across awaits, and every test's future would carry it.
        Box::pin(self.start_boxed()).await
    }

    async fn start_boxed(self) -> Cluster {
        crate::init_test_logging();
        let dir = tempfile::tempdir().expect("tempdir");
        let gitlab_secret = Secret::generate();
        let internal_secret = Secret::generate();
        let gitlab_secret_file = dir.path().join("gitlab-secret");
        let internal_secret_file = dir.path().join("internal-secret");
        std::fs::write(&gitlab_secret_file, gitlab_secret.to_file_text()).expect("write");
        std::fs::write(&internal_secret_file, internal_secret.to_file_text()).expect("write");
        let mut agents = Vec::new();
        let mut file = StaticAgentsFile::default();
        for (id, project_id, configuration) in self.agents {
            let token = format!("agent-token-{id}-{}", rand::random::<u64>());
            let token_file = dir.path().join(format!("agent-{id}-token"));
            std::fs::write(&token_file, &token).expect("write");
            file.agents.push(StaticAgent {
                id,
                name: format!("agent-{id}"),
                project_id,
                token_sha256: token_sha256_hex(&token),
                configuration: configuration.clone(),
                configuration_repository: None,
                configuration_branch: None,
            });
            agents.push(TestAgent { id, project_id, token, token_file, configuration });
        }
        let agents_file = dir.path().join("agents.yaml");
        file.save(&agents_file).expect("save agents");
        let kube = FakeKube::start().await;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kube.kubeconfig()).expect("write kubeconfig");

        let mut config = kas::Config::default().with_ephemeral_ports();
        config.gitlab.authentication_secret_file = Some(gitlab_secret_file);
        config.kas_internal.authentication_secret_file = Some(internal_secret_file);
        config.agents.static_file = Some(agents_file);
        config.routing.max_wait = self.max_wait;
        config.shutdown.grace_period = Duration::from_secs(5);
        let redis = if self.redis { Some(RedisServer::start().await) } else { None };
        let redis_cluster = if self.redis_cluster { Some(RedisCluster::start().await) } else { None };
        let redis_config = match (&redis, &redis_cluster) {
            (Some(server), _) => Some(RedisConfig::new(server.url())),
            (None, Some(cluster)) => Some(RedisConfig::cluster(cluster.urls())),
            (None, None) => None,
        };
        if let Some(mut redis) = redis_config {
            redis.key_prefix = format!("kas-test-{}", rand::random::<u32>());
            config.registry.redis = Some(redis);
            config.registry.heartbeat_ttl = Duration::from_millis(1500);
            config.registry.heartbeat_period = Duration::from_millis(300);
            config.registry.refresh_period = Duration::from_secs(1);
            config.registry.ttl = Duration::from_secs(30);
        }
        let gitlab = if self.gitlab {
            let fake = if self.gitlab_tls {
                let fake = FakeGitlab::start_tls(&gitlab_secret).await;
                config.gitlab.ca_cert_file = fake.ca_file().map(std::path::Path::to_path_buf);
                fake
            } else {
                FakeGitlab::start(&gitlab_secret).await
            };
            for a in &agents {
                let agent = GitlabAgent { agent_id: a.id, project_id: a.project_id, name: format!("agent-{}", a.id) };
                fake.add_agent(&a.token, agent);
            }
            config.gitlab.address = Some(fake.url());
            config.agents.static_file = None;
            Some(fake)
        } else {
            None
        };
        // GitLab mode reads each agent's configuration project: serve one repository per
        // project (where the fake GitLab's agent_info says it is) over Git's HTTP protocol.
        let mut projects = std::collections::BTreeMap::new();
        let git = if self.gitlab {
            let root = dir.path().join("git");
            for a in &agents {
                projects.entry(a.project_id).or_insert_with(|| {
                    let repo = GitRepo::create_in(&root, &format!("{}.git", project_path(a.project_id)));
                    repo.commit("README.md", b"agent configuration project\n");
                    repo
                });
            }
            let server = GitHttpServer::start(&root).await;
            config.gitlab.repository_url = format!("{}/{{project_path}}.git", server.url());
            Some(server)
        } else {
            None
        };
        for edit in self.edits {
            edit(&mut config, dir.path());
        }

        let mut cluster = Cluster {
            dir,
            config,
            store: MemoryStore::default(),
            gitlab_secret,
            internal_secret,
            agents,
            kube,
            kubeconfig,
            kas: Vec::new(),
            redis,
            redis_cluster,
            gitlab,
            git,
            projects,
        };
        for _ in 0..self.kas_count {
            let k = cluster.start_kas().await;
            cluster.kas.push(k);
        }
        cluster
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub config: kas::Config,
    pub store: MemoryStore,
    pub gitlab_secret: Secret,
    pub internal_secret: Secret,
    pub agents: Vec<TestAgent>,
    pub kube: FakeKube,
    pub kubeconfig: PathBuf,
    pub kas: Vec<KasHandle>,
    /// The private redis-server, when the cluster uses Redis.
    pub redis: Option<RedisServer>,
    /// The private Redis Cluster, when the cluster uses one ([`ClusterBuilder::redis_cluster`]).
    pub redis_cluster: Option<RedisCluster>,
    /// The fake GitLab verifying agent tokens (`ClusterBuilder::gitlab`).
    pub gitlab: Option<FakeGitlab>,
    /// GitLab mode: the Git server of the agents' configuration projects, and each project's
    /// repository by project id (commit `.gitlab/agents/agent-<id>/config.yaml` to configure).
    pub git: Option<GitHttpServer>,
    pub projects: std::collections::BTreeMap<i64, GitRepo>,
}

/// Points agent number `index` of a static agents file at a configuration `repository` (in a
/// [`ClusterBuilder::configure`] edit, with `config.agents.static_file`).
pub fn set_configuration_repository(agents_file: &std::path::Path, index: usize, repository: String) {
    let mut file = StaticAgentsFile::load(agents_file).expect("load agents file");
    file.agents[index].configuration_repository = Some(repository);
    file.save(agents_file).expect("save agents file");
}

/// Where the fake GitLab says a project's repository is (`gitaly_repository.gl_project_path`).
pub fn project_path(project_id: i64) -> String {
    format!("group/project-{project_id}")
}

pub struct KasHandle {
    pub addresses: kas::Addresses,
    pub handle: kas::Handle,
    pub registry: Arc<dyn AgentRegistry>,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), kas::AppError>>>,
}

impl KasHandle {
    /// This kas's instance id (what its connection records name).
    pub fn instance_id(&self) -> &str {
        &self.registry.instance().instance_id
    }

    /// Graceful shutdown; waits until kas has stopped.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.expect("kas task").expect("kas serve");
        }
    }
}

impl Drop for KasHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub struct AgentkHandle {
    pub status: agentk::Status,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl AgentkHandle {
    /// Waits until connected with at least one idle tunnel.
    pub async fn ready(&self) {
        crate::eventually!(self.status.is_ready(), "agentk ready");
    }

    pub fn connection_id(&self) -> Option<i64> {
        self.status.connected.borrow().map(|c| c.0)
    }

    /// Graceful shutdown; waits until agentk has stopped.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.expect("agentk task");
        }
    }
}

impl Drop for AgentkHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub type ApiClient = KasApiClient<InterceptedService<Channel, BearerInterceptor>>;
pub type InternalClient = KasInternalClient<InterceptedService<Channel, BearerInterceptor>>;

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct BearerInterceptor(Option<String>);

impl tonic::service::Interceptor for BearerInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            let v = format!("Bearer {token}").parse().map_err(|_| tonic::Status::internal("bad token"))?;
            req.metadata_mut().insert("authorization", v);
        }
        Ok(req)
    }
}

pub fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}")).expect("uri").connect_lazy()
}

impl Cluster {
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// Starts another kas sharing the registry (appended to `self.kas` by the caller).
    pub async fn start_kas(&self) -> KasHandle {
        self.start_kas_with(self.config.clone()).await
    }

    /// Starts another kas with its own configuration (e.g. `c.config` with one key changed).
    pub async fn start_kas_with(&self, config: kas::Config) -> KasHandle {
        let bound = kas::App::new(config).with_memory_store(self.store.clone()).bind().await.expect("bind kas");
        let addresses = bound.addresses();
        let handle = bound.handle();
        let registry = handle.registry().clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(bound.serve(shutdown.clone()));
        crate::eventually!(handle.tunnel_stats().await.is_some(), "kas serving");
        KasHandle { addresses, handle, registry, shutdown, task: Some(task) }
    }

    pub fn agent(&self, id: i64) -> &TestAgent {
        self.agents.iter().find(|a| a.id == id).expect("agent in cluster")
    }

    /// An agentk config for `agent_id` connecting to kas number `kas`.
    pub fn agentk_config(&self, agent_id: i64, kas: usize, pod_name: &str) -> agentk::AgentConfig {
        let mut c = agentk::AgentConfig::new(
            format!("grpc://{}", self.kas[kas].addresses.agent),
            self.agent(agent_id).token_file.clone(),
            agentk::KubeSource::Kubeconfig(self.kubeconfig.clone()),
        );
        c.pod_name = pod_name.to_owned();
        c.pod_namespace = "agentk".into();
        c.grace_period = Duration::from_secs(5);
        c
    }

    /// Starts agentk in-process (not waiting for it to connect).
    pub async fn start_agentk_with(&self, config: agentk::AgentConfig) -> AgentkHandle {
        let app = agentk::App::new(config).await.expect("agentk config");
        let status = app.status();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(app.run(shutdown.clone()));
        AgentkHandle { status, shutdown, task: Some(task) }
    }

    /// Starts agentk (ready) in front of its own fake API server holding one pod named after the
    /// replica (`pod_name` in namespace `default`), so answers show which replica served them.
    pub async fn start_agentk_with_own_cluster(
        &self,
        agent_id: i64,
        kas: usize,
        pod_name: &str,
    ) -> (AgentkHandle, FakeKube) {
        let kube = FakeKube::start().await;
        kube.add_pod("default", pod_name);
        let kubeconfig = self.dir.path().join(format!("kubeconfig-{pod_name}"));
        std::fs::write(&kubeconfig, kube.kubeconfig()).expect("write kubeconfig");
        let mut config = self.agentk_config(agent_id, kas, pod_name);
        config.kube = agentk::KubeSource::Kubeconfig(kubeconfig);
        let a = self.start_agentk_with(config).await;
        a.ready().await;
        (a, kube)
    }

    /// Starts agentk for `agent_id` against kas number `kas` and waits until it is ready.
    pub async fn start_agentk(&self, agent_id: i64, kas: usize, pod_name: &str) -> AgentkHandle {
        let a = self.start_agentk_with(self.agentk_config(agent_id, kas, pod_name)).await;
        a.ready().await;
        a
    }

    pub fn gitlab_jwt(&self) -> String {
        mint_jwt(&self.gitlab_secret, GITLAB_ISSUER, KAS_AUDIENCE, Duration::from_secs(60)).expect("jwt")
    }

    pub fn internal_jwt(&self) -> String {
        mint_jwt(&self.internal_secret, KAS_ISSUER, KAS_AUDIENCE, Duration::from_secs(60)).expect("jwt")
    }

    /// KasApi client for kas number `kas` authenticating as GitLab.
    pub fn api(&self, kas: usize) -> ApiClient {
        self.api_with_token(kas, Some(self.gitlab_jwt()))
    }

    pub fn api_with_token(&self, kas: usize, token: Option<String>) -> ApiClient {
        KasApiClient::with_interceptor(channel(self.kas[kas].addresses.api), BearerInterceptor(token))
    }

    /// The agent's connections as kas number `kas` lists them (`ConnectedAgentsById`).
    pub async fn connections(&self, kas: usize, agent_id: i64) -> Vec<kas_proto::kas::ConnectedAgentInfo> {
        let request = kas_proto::kas::ConnectedAgentsByIdRequest { agent_id };
        self.api(kas).connected_agents_by_id(request).await.expect("ConnectedAgentsById").into_inner().agents
    }

    /// Panics unless kas number `kas`'s `/metrics` contains every one of `series` (e.g.
    /// `kas_git_polls_total{outcome="ok"}`). The recorder is process-wide: counts are shared by
    /// the tests of one test binary, so only presence is checked.
    pub async fn assert_metrics(&self, kas: usize, series: &[&str]) {
        let url = format!("http://{}/metrics", self.kas[kas].addresses.observability);
        let text = reqwest::get(&url).await.expect("GET /metrics").text().await.expect("metrics text");
        for line in series {
            assert!(text.contains(line), "{line} missing from /metrics:\n{text}");
        }
    }

    /// The value of an unlabelled counter on kas number `kas`'s `/metrics` (0 before it was
    /// first counted). The recorder is process-wide: a test that compares counts must be the
    /// only one of its test binary that moves them.
    pub async fn counter(&self, kas: usize, name: &str) -> u64 {
        let url = format!("http://{}/metrics", self.kas[kas].addresses.observability);
        let text = reqwest::get(&url).await.expect("GET /metrics").text().await.expect("metrics text");
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .map_or(0, |v| v.trim().parse::<f64>().expect("a counter value") as u64)
    }

    /// GET `path` on kas number `kas`'s REST gateway as GitLab would call it; panics unless 200,
    /// returns the body.
    pub async fn rest_get_ok(&self, kas: usize, path: &str) -> String {
        let response = reqwest::Client::new()
            .get(format!("{}{path}", self.rest_url(kas)))
            .bearer_auth(self.gitlab_jwt())
            .send()
            .await
            .expect("REST request");
        assert_eq!(response.status(), 200, "GET {path} on kas {kas}");
        response.text().await.expect("REST body")
    }

    /// Base URL of kas number `kas`'s REST gateway, e.g. `http://127.0.0.1:40123`.
    /// The rest listener's base URL (`https://localhost:port` when it serves TLS).
    pub fn rest_url(&self, kas: usize) -> String {
        let rest = self.kas[kas].addresses.rest;
        if self.config.listeners.rest.tls.is_some() {
            format!("https://localhost:{}", rest.port())
        } else {
            format!("http://{rest}")
        }
    }

    /// The CA certificate that signed the rest listener's certificate, when it serves TLS.
    pub fn rest_ca_file(&self) -> Option<PathBuf> {
        self.config.listeners.rest.tls.as_ref().map(|t| t.certificate_file.clone())
    }

    pub fn internal_with_token(&self, kas: usize, token: Option<String>) -> InternalClient {
        KasInternalClient::with_interceptor(channel(self.kas[kas].addresses.internal), BearerInterceptor(token))
    }

    /// Opens a presence stream (GetConfiguration) on kas 0's agent listener as agent
    /// `agent_id`, as agentk does (a fresh connection id; `commit_id` is the configuration it
    /// already has). With a configuration repository kas polls it before it answers.
    pub async fn open_configuration(
        &self,
        agent_id: i64,
        commit_id: &str,
    ) -> Result<tonic::Streaming<ConfigurationResponse>, tonic::Status> {
        self.open_configuration_with_token(&self.agent(agent_id).token, commit_id).await
    }

    /// [`Cluster::open_configuration`] with any token (a revoked or unknown one).
    pub async fn open_configuration_with_token(
        &self,
        token: &str,
        commit_id: &str,
    ) -> Result<tonic::Streaming<ConfigurationResponse>, tonic::Status> {
        self.open_configuration_on(0, token, commit_id).await
    }

    /// [`Cluster::open_configuration_with_token`] on kas number `kas`.
    pub async fn open_configuration_on(
        &self,
        kas: usize,
        token: &str,
        commit_id: &str,
    ) -> Result<tonic::Streaming<ConfigurationResponse>, tonic::Status> {
        let mut client = AgentTunnelClient::new(channel(self.kas[kas].addresses.agent));
        let connection_id = i64::from(rand::random::<u32>()) + 1;
        let request = ConfigurationRequest { connection_id, commit_id: commit_id.into(), ..Default::default() };
        client.get_configuration(crate::authorized(request, token)).await.map(tonic::Response::into_inner)
    }

    /// Opens a watch of pods through kas 0's KasApi for `agent_id` and waits for its response
    /// head; it streams until the frames are dropped. The sender holds the request open.
    pub async fn open_watch(&self, agent_id: i64) -> (mpsc::Sender<KubernetesRequest>, tonic::Streaming<HttpFrame>) {
        let (tx, rx) = mpsc::channel(4);
        let head =
            HttpRequestHead { method: "GET".into(), path: "/api/v1/pods?watch=1".into(), headers: Default::default() };
        let request = KubernetesRequest { agent_id, connection_id: 0, frame: Some(HttpFrame::request_head(head)) };
        tx.send(request).await.expect("send the request head");
        let mut frames =
            self.api(0).make_kubernetes_request(ReceiverStream::new(rx)).await.expect("watch").into_inner();
        let first = frames.message().await.expect("response head").expect("response head");
        assert!(matches!(first.frame, Some(http_frame::Frame::ResponseHead(_))), "not a response head: {first:?}");
        (tx, frames)
    }
}
