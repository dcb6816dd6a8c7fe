//! Redis registry: the backend for many kas replicas, on one Redis server or a Redis Cluster.
//!
//! Layout (all keys under a configurable prefix `P`):
//! - `P:agent:<agent id>` and `P:project:<project id>`: hashes, field = connection id, value =
//!   `ExpiringValue { expires_at, ConnectedAgentInfo }`. Both are written with the same expiry,
//!   and the keys get a PEXPIRE of the record TTL.
//! - `P:seen:<agent id>`: set for a record TTL when a connection of the agent is unregistered.
//! - `P:kas:<instance id>`: this kas's `KasInstanceInfo`, with a short TTL (the heartbeat).
//! - `P:events`: pub-sub channel of `ConnectionEvent`s.
//! - `P:conn-rate:<agent id>:<window>`: the agent's connection count in one window.
//! - `P:gitops:<agent id>`: hash of the agent's GitOps syncs: field `projects` =
//!   `GitopsManifestProjects` (the agent's manifest projects as configured at its last report),
//!   field `sync:<hex SHA-256 of project id, NUL, ref>` = `kas.v1.GitopsSync` (the last report of
//!   that project and ref). PEXPIRE = `gitops.status_ttl`, renewed by every report; one script
//!   writes a report, the list, drops reports of projects no longer configured and renews the
//!   expiry, atomically.
//! - `P:cluster_state:<agent id>`: the `KasInstanceInfo` of the kas holding the agent's cluster
//!   state (issue 17), PX = how long that kas keeps the state after agentk's stream ends.
//! - `P:git_push`: pub-sub channel of `kas.v1.GitPushEvent`s (pushes, from any kas), on the same
//!   subscription as the events.
//! - `P:agent_info:<hex HMAC-SHA256 of an agent token>`: GitLab mode's agent_info cache shared
//!   between kas (JSON of GitLab's answer, never the token; see `auth::gitlab::shared`), PX = what
//!   is left of `gitlab.agent_info_cache.ttl` since GitLab said yes.
//!
//! Every write this kas makes is remembered locally (`owned`), so a refresh rewrites all of it at
//! once, and a registration that failed while Redis was down is written by the next refresh once
//! Redis is back.
//!
//! **One Redis server** (`url`): a registration (both hashes and its event) is one MULTI/EXEC; a
//! refresh is one pipelined transaction (one round trip however many agents).
//!
//! **A Redis Cluster** (`cluster_nodes`): a transaction must stay within one hash slot, so the
//! keys carry hash tags: the agent or project id (`P:agent:{7}`, `P:seen:{7}`,
//! `P:conn-rate:{7}:<window>`, `P:gitops:{7}`, `P:cluster_state:{7}`, `P:project:{10}`: every
//! transaction on an agent's keys stays in its slot; `P:agent_info:{<hex>}`, each in its own), `{instances}` for every heartbeat
//! (`P:kas:{instances}:<id>`, so one request checks the heartbeats behind a record list) and
//! `{pubsub}` for the channels (`P:events:{pubsub}`, `P:git_push:{pubsub}`). An agent's hash and
//! its project's hash are in different slots: each is written in a MULTI/EXEC of its own slot,
//! with the same expiry, and a refresh rewrites both (a kas dying in between leaves one without
//! the other until it expires). Writes to many slots (refresh, resync, shutdown, GC) are grouped
//! into one MULTI/EXEC block per slot and one pipeline per master, sent concurrently
//! ([`cluster`]): a refresh is one round trip per master, however many agents. Events use sharded
//! pub-sub (SPUBLISH/SSUBSCRIBE, Redis 7): a classic PUBLISH is relayed to every node of the
//! cluster, a sharded one only within the shard serving the channel's slot, which every kas
//! subscribes to. A sharded channel counts as a key of its slot, so an event cannot join the
//! transaction of the records it announces: it is published once they are written.
//!
//! Redis may come back empty (restarted without persistence, flushed, failed over). Waiting for
//! the next refresh would leave cross-kas routing broken for up to a refresh period, so a
//! *resync* (heartbeat + every owned record + a `Connected` event per record; on one server one
//! transaction) runs as soon as any of these shows Redis is back: the events subscription is
//! re-established after it broke, a call succeeds after one failed, the heartbeat finds its own
//! key gone, (one server) a write is refused as by a replica (a failover demoted the primary: kas
//! connects again, to the new one), or (cluster) the connection to some node dropped (a node that
//! restarts may come back empty; the resync is retried until every node answers). After a resync, local waiters get
//! [`RegistryEvent::Resynced`] so they look again (events published while this kas was not
//! subscribed are lost).

mod cluster;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use kas_proto::kas::{ConnectedAgentInfo, GitPushEvent, GitopsSync, KasInstanceInfo, git_push_event};
use kas_proto::registry::{
    ConnectionEvent, ExpiringValue, GitopsManifestProjects, connection_event, gitops_manifest_projects,
};
use kas_proto::{AgentId, ConnectionId, ProjectId};
use prost::Message;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, OnceCell, broadcast, mpsc};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::auth::gitlab::{SharedAgentInfoCache, SharedCacheError, SharedKey};

use super::{
    AgentRegistry, EVENT_BUFFER, GitPush, GitopsStatusRecord, ManifestProjectKey, RegistryError, RegistryEvent,
    RegistryTiming, WindowCounts, record_key, sorted,
};

/// A Redis call that takes longer is failed: a slow Redis must not stall routing.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_KEY_PREFIX: &str = "kas";
/// Longest pause between attempts to re-subscribe to the events channel: a Redis that comes back
/// is noticed within it (and re-registered at once); a failed attempt costs one connect.
const SUBSCRIBE_BACKOFF_CAP: Duration = Duration::from_millis(500);
/// Longest pause between attempts of a resync that failed (Redis flapping).
const RESYNC_BACKOFF_CAP: Duration = Duration::from_secs(1);
/// Resyncs (each announcing every record of this kas) run at most this often: a flapping Redis
/// must not turn every failed call into a burst of events.
const RESYNC_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Retries of a cluster request redirected (MOVED, ASK), refused (TRYAGAIN) while slots move, or
/// whose node connection failed; all within `response_timeout`.
const CLUSTER_RETRIES: u32 = 3;
/// Pause before such a retry (ms; redis-rs grows it from the first to the second bound). redis-rs
/// waits at least 1.28 s by default: a node that is down would then hold every call to it for
/// most of `response_timeout`, and delay noticing that it is back.
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (50, 500);

/// `registry.redis` in the kas config: `url` (one Redis server) or `cluster_nodes` (a Redis
/// Cluster), exactly one of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// One Redis server: `redis://host:port[/db]`, `rediss://host:port` (TLS) or
    /// `unix:///path/to/redis.sock`. Behind Sentinel or a managed Redis with failover: the
    /// address that follows the primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A Redis Cluster instead: some of its nodes, `redis://host:port` or `rediss://host:port`
    /// (kas learns the others from them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_nodes: Vec<String>,
    /// ACL user name (Redis 6+); the URL may carry one too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// File holding the password (plain text, surrounding whitespace ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// Prefix of every key and of the events channel; kas sharing a prefix share a registry.
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
    /// PEM CA to trust for `rediss://` (default: public web roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert_file: Option<PathBuf>,
    /// Calls slower than this fail (routing falls back to what it knows locally).
    #[serde(default = "default_response_timeout", with = "humantime_serde")]
    pub response_timeout: Duration,
}

fn default_prefix() -> String {
    DEFAULT_KEY_PREFIX.to_owned()
}

fn default_response_timeout() -> Duration {
    DEFAULT_RESPONSE_TIMEOUT
}

impl RedisConfig {
    /// One Redis server.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: Some(url.into()),
            cluster_nodes: Vec::new(),
            username: None,
            password_file: None,
            ca_cert_file: None,
            key_prefix: default_prefix(),
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
        }
    }

    /// A Redis Cluster, reached first through these nodes.
    pub fn cluster(nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self { url: None, cluster_nodes: nodes.into_iter().map(Into::into).collect(), ..Self::new("") }
    }

    /// Finds what would fail later, or worse, work differently than written: the key
    /// (`registry.redis.<field>`) and what is wrong with it.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let invalid = |key, message: String| Err((key, message));
        if self.key_prefix.is_empty() {
            return invalid("registry.redis.key_prefix", "must not be empty".into());
        }
        match (&self.url, self.cluster_nodes.is_empty()) {
            (Some(_), false) => {
                return invalid(
                    "registry.redis",
                    "set either url (one Redis server) or cluster_nodes (a Redis Cluster), not both".into(),
                );
            }
            (None, true) => {
                return invalid(
                    "registry.redis",
                    "set url (one Redis server) or cluster_nodes (some nodes of a Redis Cluster)".into(),
                );
            }
            (Some(url), true) if url.trim().is_empty() => {
                return invalid("registry.redis.url", "must not be empty".into());
            }
            (Some(_), true) => return Ok(()),
            (None, false) => {}
        }
        let mut tls = None;
        for node in &self.cluster_nodes {
            let scheme_tls = match node.split_once("://").map(|(scheme, _)| scheme) {
                Some("redis") => false,
                Some("rediss") => true,
                _ => {
                    return invalid(
                        "registry.redis.cluster_nodes",
                        format!(
                            "`{node}` is not a cluster node address: cluster nodes are reached over TCP, \
                             redis://host:port or rediss://host:port"
                        ),
                    );
                }
            };
            if tls.replace(scheme_tls).is_some_and(|t| t != scheme_tls) {
                return invalid(
                    "registry.redis.cluster_nodes",
                    "mixes redis:// and rediss://: the nodes of a cluster all use TLS or none does".into(),
                );
            }
            match node.as_str().into_connection_info() {
                Err(e) => return invalid("registry.redis.cluster_nodes", format!("`{node}`: {e}")),
                Ok(info) if info.redis_settings().db() != 0 => {
                    return invalid(
                        "registry.redis.cluster_nodes",
                        format!(
                            "`{node}` names database {}: a Redis Cluster has only database 0",
                            info.redis_settings().db()
                        ),
                    );
                }
                Ok(_) => {}
            }
        }
        if self.key_prefix.contains(['{', '}']) {
            return invalid(
                "registry.redis.key_prefix",
                "must not contain `{` or `}` with cluster_nodes: kas tags its keys itself (a key's hash tag \
                 decides its slot)"
                    .into(),
            );
        }
        Ok(())
    }
}

fn err(context: &str, e: impl std::fmt::Display) -> RegistryError {
    RegistryError(format!("redis {context}: {e}"))
}

/// Key and channel names (see the module docs); on a cluster with hash tags.
struct Keys {
    prefix: String,
    cluster: bool,
}

impl Keys {
    /// An agent or project id as it appears in keys: on a cluster, the hash tag.
    fn id(&self, id: impl std::fmt::Display) -> String {
        if self.cluster { format!("{{{id}}}") } else { id.to_string() }
    }
    fn agent(&self, id: AgentId) -> String {
        format!("{}:agent:{}", self.prefix, self.id(id))
    }
    fn project(&self, id: ProjectId) -> String {
        format!("{}:project:{}", self.prefix, self.id(id))
    }
    /// Set (for a record TTL) when a connection of the agent is unregistered: see `seen_recently`.
    fn seen(&self, id: AgentId) -> String {
        format!("{}:seen:{}", self.prefix, self.id(id))
    }
    fn instance(&self, id: &str) -> String {
        if self.cluster {
            format!("{}:kas:{{instances}}:{id}", self.prefix)
        } else {
            format!("{}:kas:{id}", self.prefix)
        }
    }
    fn events(&self) -> String {
        if self.cluster { format!("{}:events:{{pubsub}}", self.prefix) } else { format!("{}:events", self.prefix) }
    }
    fn connection_count(&self, agent: AgentId, window: u64) -> String {
        format!("{}:conn-rate:{}:{window}", self.prefix, self.id(agent))
    }
    fn gitops(&self, agent: AgentId) -> String {
        format!("{}:gitops:{}", self.prefix, self.id(agent))
    }
    fn cluster_state_holder(&self, agent: AgentId) -> String {
        format!("{}:cluster_state:{}", self.prefix, self.id(agent))
    }
    /// An entry of the shared agent_info cache; on a cluster the digest is the hash tag, so the
    /// entries spread over every slot.
    fn agent_info(&self, key: &SharedKey) -> String {
        format!("{}:agent_info:{}", self.prefix, self.id(hex::encode(key)))
    }
    fn git_push(&self) -> String {
        if self.cluster { format!("{}:git_push:{{pubsub}}", self.prefix) } else { format!("{}:git_push", self.prefix) }
    }
}

/// The field of `P:gitops:<agent>` holding the configured manifest projects.
const GITOPS_PROJECTS_FIELD: &str = "projects";

/// The field of `P:gitops:<agent>` holding the last report of one manifest project and ref (a
/// digest: ids and refs may hold any character).
fn gitops_sync_field(key: &ManifestProjectKey) -> String {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new();
    digest.update(key.project_id.as_bytes());
    digest.update([0]);
    digest.update(key.git_ref.as_bytes());
    format!("sync:{}", hex::encode(digest.finalize()))
}

/// Writes one report and the configured list, drops the reports of projects no longer
/// configured, and renews the expiry, in one step. KEYS[1]: the agent's hash; ARGV: the expiry
/// (ms), the list, the report's field and value, then the fields of every configured project.
const PUT_GITOPS_SYNC: &str = r"
redis.call('HSET', KEYS[1], 'projects', ARGV[2], ARGV[3], ARGV[4])
local keep = {}
for i = 5, #ARGV do keep[ARGV[i]] = true end
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if field ~= 'projects' and not keep[field] then redis.call('HDEL', KEYS[1], field) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
";

#[derive(Debug, Clone)]
struct OwnedRecord {
    project_id: ProjectId,
    info: Bytes,
}

/// Commands of one registry operation that may touch many keys, each with its key (on a
/// cluster, what decides its slot), and the events announcing them.
#[derive(Default)]
struct Batch {
    commands: Vec<(String, redis::Cmd)>,
    /// One transaction on one server; one per slot on a cluster.
    atomic: bool,
    events: Vec<Vec<u8>>,
}

impl Batch {
    fn atomic() -> Self {
        Self { atomic: true, ..Self::default() }
    }

    fn push(&mut self, key: String, cmd: redis::Cmd) {
        self.commands.push((key, cmd));
    }
}

pub struct RedisRegistry {
    inner: Arc<Inner>,
    _stop_tasks: DropGuard,
}

enum Backend {
    Server {
        client: redis::Client,
        /// Replaced by an empty cell to reconnect (see `forget_demoted_primary`).
        conn: Mutex<Arc<OnceCell<ConnectionManager>>>,
        manager_config: ConnectionManagerConfig,
    },
    Cluster {
        client: ClusterClient,
        conn: OnceCell<ClusterConnection>,
        /// Which master serves which slot, read when first needed and again after a failure.
        owners: Mutex<Option<Arc<cluster::SlotOwners>>>,
    },
}

/// A connection of either backend (both reconnect by themselves once made).
#[derive(Clone)]
enum Connection {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    async fn query<T: redis::FromRedisValue>(&mut self, pipe: &redis::Pipeline) -> redis::RedisResult<T> {
        match self {
            Self::Server(conn) => pipe.query_async(conn).await,
            Self::Cluster(conn) => pipe.query_async(conn).await,
        }
    }

    /// On a cluster redis-rs sends PING to every master.
    async fn ping(&mut self) -> redis::RedisResult<()> {
        let ping = redis::cmd("PING");
        match self {
            Self::Server(conn) => ping.query_async::<String>(conn).await,
            Self::Cluster(conn) => ping.query_async::<String>(conn).await,
        }
        .map(drop)
    }
}

/// What the registry and its background tasks (events subscriber, resync) share.
pub struct Inner {
    backend: Backend,
    keys: Keys,
    instance: KasInstanceInfo,
    timing: RegistryTiming,
    owned: Mutex<HashMap<(AgentId, ConnectionId), OwnedRecord>>,
    /// Hash keys this kas has written (what GC sweeps).
    written_keys: Mutex<HashSet<String>>,
    events: broadcast::Sender<RegistryEvent>,
    /// Push events from the `git_push` channel.
    pushes: broadcast::Sender<GitPush>,
    round_trips: AtomicU64,
    /// Wakes the resync task.
    resync: Notify,
    /// A call failed: the next successful one starts a resync (Redis may have lost our data).
    failed_since_resync: AtomicBool,
    /// The heartbeat key was written once: finding it gone later means Redis lost our data.
    heartbeat_written: AtomicBool,
    /// `remove_all_owned` ran: nothing may be re-registered any more.
    closed: AtomicBool,
}

impl std::ops::Deref for RedisRegistry {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl std::fmt::Debug for RedisRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRegistry")
            .field("prefix", &self.inner.keys.prefix)
            .field("cluster", &self.inner.keys.cluster)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or_default()
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn expiring(info: &Bytes, ttl: Duration) -> Vec<u8> {
    ExpiringValue { expires_at_unix_ms: now_ms() + ms(ttl), value: info.clone() }.encode_to_vec()
}

fn event_bytes(
    kind: connection_event::Kind,
    agent_id: AgentId,
    connection_id: ConnectionId,
    instance: &str,
) -> Vec<u8> {
    ConnectionEvent {
        kind: kind as i32,
        agent_id: agent_id.0,
        connection_id: connection_id.0,
        kas_instance_id: instance.to_owned(),
    }
    .encode_to_vec()
}

impl RedisRegistry {
    /// Prepares the registry and starts the events subscriber. Connects lazily: kas starts (and
    /// serves local agents) while Redis is down.
    pub fn new(config: &RedisConfig, instance: KasInstanceInfo, timing: RegistryTiming) -> Result<Self, RegistryError> {
        config.check().map_err(|(key, message)| RegistryError(format!("{key}: {message}")))?;
        let password = config
            .password_file
            .as_ref()
            .map(|path| {
                std::fs::read_to_string(path)
                    .map(|p| p.trim().to_owned())
                    .map_err(|e| RegistryError(format!("cannot read redis password file {}: {e}", path.display())))
            })
            .transpose()?;
        let root_cert = config
            .ca_cert_file
            .as_ref()
            .map(|path| {
                crate::tools::tls::read_ca_bundle(path).map_err(|e| RegistryError(format!("redis CA file: {e}")))
            })
            .transpose()?;
        let connection_info = |url: &str, protocol: Option<ProtocolVersion>| -> Result<ConnectionInfo, RegistryError> {
            let info = url.into_connection_info().map_err(|e| err("url", e))?;
            let mut settings = info.redis_settings().clone();
            if let Some(user) = &config.username {
                settings = settings.set_username(user);
            }
            if let Some(password) = &password {
                settings = settings.set_password(password);
            }
            if let Some(protocol) = protocol {
                settings = settings.set_protocol(protocol);
            }
            Ok(info.set_redis_settings(settings))
        };
        let (push_sender, push_receiver) = mpsc::unbounded_channel();
        let (backend, push_receiver) = match &config.url {
            Some(url) => {
                let info = connection_info(url, None)?;
                let client = match root_cert {
                    Some(root_cert) => redis::Client::build_with_tls(
                        info,
                        redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) },
                    ),
                    None => redis::Client::open(info),
                }
                .map_err(|e| err("client", e))?;
                let manager_config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(config.response_timeout))
                    .set_connection_timeout(Some(config.response_timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_secs(1));
                (Backend::Server { client, conn: Mutex::default(), manager_config }, None)
            }
            None => {
                // RESP3: redis-rs's cluster client subscribes only with it (messages arrive as
                // pushes, on `push_sender`, with the notice of every dropped node connection).
                let nodes = config
                    .cluster_nodes
                    .iter()
                    .map(|node| connection_info(node, Some(ProtocolVersion::RESP3)))
                    .collect::<Result<Vec<_>, _>>()?;
                let tls = config.cluster_nodes.iter().any(|node| node.starts_with("rediss://"));
                let mut builder = ClusterClientBuilder::new(nodes)
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(push_sender)
                    .connection_timeout(config.response_timeout)
                    .response_timeout(config.response_timeout)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
                    .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1);
                if let Some(root_cert) = root_cert.filter(|_| tls) {
                    builder = builder.certs(redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) });
                }
                let client = builder.build().map_err(|e| err("cluster client", e))?;
                (Backend::Cluster { client, conn: OnceCell::new(), owners: Mutex::new(None) }, Some(push_receiver))
            }
        };
        let keys = Keys { prefix: config.key_prefix.clone(), cluster: push_receiver.is_some() };
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            backend,
            keys,
            instance,
            timing,
            owned: Mutex::default(),
            written_keys: Mutex::default(),
            events: broadcast::channel(EVENT_BUFFER).0,
            pushes: broadcast::channel(EVENT_BUFFER).0,
            round_trips: AtomicU64::new(0),
            resync: Notify::new(),
            failed_since_resync: AtomicBool::new(false),
            heartbeat_written: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        });
        match push_receiver {
            None => tokio::spawn(subscribe_events(inner.clone(), config.response_timeout, stop.clone())),
            Some(pushes) => {
                tokio::spawn(subscribe_sharded_events(inner.clone(), pushes, config.response_timeout, stop.clone()))
            }
        };
        tokio::spawn(resync_task(inner.clone(), stop.clone()));
        Ok(Self { inner, _stop_tasks: stop.drop_guard() })
    }
}

impl RedisRegistry {
    /// This registry's Redis connection as GitLab mode's shared agent_info cache (it outlives
    /// the registry's background tasks if kept longer).
    pub fn shared_agent_info_cache(&self) -> Arc<dyn SharedAgentInfoCache> {
        self.inner.clone()
    }
}

impl Inner {
    /// Requests sent to Redis so far (tests check that a refresh costs one, or one per master of
    /// a cluster, whatever the number of agents).
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Whether this registry uses a Redis Cluster (`cluster_nodes`).
    pub fn is_cluster(&self) -> bool {
        self.keys.cluster
    }

    async fn connection(&self) -> Result<Connection, RegistryError> {
        // Concurrent first callers share one connection attempt; a failed attempt is retried by
        // the next call. Both connection kinds reconnect by themselves afterwards.
        match &self.backend {
            Backend::Server { client, conn, manager_config } => {
                let cell = lock(conn).clone();
                cell.get_or_try_init(|| client.get_connection_manager_with_config(manager_config.clone()))
                    .await
                    .cloned()
                    .map(Connection::Server)
            }
            Backend::Cluster { client, conn, .. } => {
                conn.get_or_try_init(|| Box::pin(client.get_async_connection())).await.cloned().map(Connection::Cluster)
            }
        }
        .map_err(|e| err("connect", e))
    }

    /// Counts an operation's outcome; a success after a failure starts a resync.
    fn outcome<T>(&self, context: &'static str, result: &Result<T, RegistryError>) {
        crate::metrics::registry_operation(context, result.is_ok());
        if result.is_err() {
            self.failed_since_resync.store(true, Ordering::Relaxed);
        } else if self.failed_since_resync.swap(false, Ordering::Relaxed) {
            // Redis answers again after a failure: it may have restarted empty.
            self.resync.notify_one();
        }
    }

    /// One request (on a cluster, its keys must share a slot).
    async fn query<T: redis::FromRedisValue>(
        &self,
        context: &'static str,
        pipe: &redis::Pipeline,
    ) -> Result<T, RegistryError> {
        let result = async {
            let mut conn = self.connection().await?;
            self.round_trips.fetch_add(1, Ordering::Relaxed);
            conn.query(pipe).await.map_err(|e| {
                self.forget_demoted_primary(&e);
                err(context, e)
            })
        }
        .await;
        self.outcome(context, &result);
        result
    }

    /// One server: a primary demoted to replica by a failover (Sentinel, a managed Redis) keeps
    /// its client connections open and refuses their writes with READONLY (inside a transaction:
    /// EXECABORT), which redis-rs's connection manager does not take as a reason to reconnect.
    /// Dropping the connection makes the next call connect again, to where the URL points now:
    /// the new primary, which may lack our records: a resync follows at once. (redis-rs's
    /// cluster client handles READONLY itself.)
    fn forget_demoted_primary(&self, e: &redis::RedisError) {
        use redis::{ErrorKind, ServerErrorKind};
        let refused = matches!(e.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::ExecAbort));
        if let (true, Backend::Server { conn, .. }) = (refused, &self.backend) {
            tracing::info!(error = %e, "Redis refused a write as a replica; connecting again");
            *lock(conn) = Arc::default();
            self.resync.notify_one();
        }
    }

    /// Runs a batch and publishes its events; returns each command's reply. One server: one
    /// pipeline (one transaction when atomic) with the events inside. Cluster: one pipeline per
    /// master, concurrently (one transaction per slot when atomic), then the events.
    async fn run(&self, context: &'static str, batch: Batch) -> Result<Vec<Value>, RegistryError> {
        if batch.commands.is_empty() && batch.events.is_empty() {
            return Ok(Vec::new());
        }
        let Backend::Cluster { owners, .. } = &self.backend else {
            let mut pipe = redis::pipe();
            if batch.atomic {
                pipe.atomic();
            }
            for (_, cmd) in batch.commands {
                pipe.add_command(cmd);
            }
            for event in batch.events {
                pipe.publish(self.keys.events(), event).ignore();
            }
            return self.query(context, &pipe).await;
        };
        // Boxed: the cluster's futures are large, and every caller's future would carry them.
        let result = Box::pin(self.run_on_cluster(context, owners, batch)).await;
        self.outcome(context, &result);
        result
    }

    async fn run_on_cluster(
        &self,
        context: &'static str,
        owners: &Mutex<Option<Arc<cluster::SlotOwners>>>,
        batch: Batch,
    ) -> Result<Vec<Value>, RegistryError> {
        let Connection::Cluster(mut conn) = self.connection().await? else {
            return Err(err(context, "not a cluster connection"));
        };
        let mut replies = Vec::new();
        if !batch.commands.is_empty() {
            // A slot that moved since the map was read fails its pipeline: read the map again
            // and run the batch once more (its writes can be repeated).
            let mut attempts = 0;
            replies = loop {
                let cached = lock(owners).clone();
                let map = match cached {
                    Some(map) => map,
                    None => {
                        self.round_trips.fetch_add(1, Ordering::Relaxed);
                        let map = Arc::new(cluster::slot_owners(&mut conn).await.map_err(|e| err(context, e))?);
                        *lock(owners) = Some(map.clone());
                        map
                    }
                };
                let sent = || {
                    self.round_trips.fetch_add(1, Ordering::Relaxed);
                };
                match cluster::run_per_master(&conn, &map, &batch.commands, batch.atomic, sent).await {
                    Ok(replies) => break replies,
                    Err(e) => {
                        *lock(owners) = None;
                        attempts += 1;
                        if attempts == 2 {
                            return Err(err(context, e));
                        }
                    }
                }
            };
        }
        if !batch.events.is_empty() {
            // After the writes: a kas woken by an event must find what it announces.
            let mut pipe = redis::pipe();
            for event in batch.events {
                pipe.cmd("SPUBLISH").arg(self.keys.events()).arg(event).ignore();
            }
            self.round_trips.fetch_add(1, Ordering::Relaxed);
            pipe.query_async::<()>(&mut conn).await.map_err(|e| err(context, e))?;
        }
        Ok(replies)
    }

    /// Rewrites this kas's heartbeat and every record it owns, and announces each record (one
    /// transaction on one server). Returns how many records were written.
    async fn resync_once(&self) -> Result<usize, RegistryError> {
        if self.closed.load(Ordering::Relaxed) {
            return Ok(0);
        }
        if self.keys.cluster {
            // While a node is still down, a PING to every master fails before rewriting every
            // record on the others again.
            self.connection().await?.ping().await.map_err(|e| err("resync", e))?;
        }
        let owned: Vec<_> = self.owned().iter().map(|(k, v)| (*k, v.clone())).collect();
        let mut batch = Batch::atomic();
        let (key, heartbeat) = self.heartbeat_write();
        batch.push(key, heartbeat);
        for ((agent_id, connection_id), record) in &owned {
            self.write_record(&mut batch, *agent_id, *connection_id, record);
            let event =
                event_bytes(connection_event::Kind::Connected, *agent_id, *connection_id, &self.instance.instance_id);
            batch.events.push(event);
        }
        self.run("resync", batch).await?;
        self.heartbeat_written.store(true, Ordering::Relaxed);
        Ok(owned.len())
    }

    fn heartbeat_write(&self) -> (String, redis::Cmd) {
        let key = self.keys.instance(&self.instance.instance_id);
        let ttl = u64::try_from(ms(self.timing.heartbeat_ttl)).unwrap_or(u64::MAX);
        let cmd = redis::Cmd::pset_ex(&key, self.instance.encode_to_vec(), ttl);
        (key, cmd)
    }

    fn owned(&self) -> MutexGuard<'_, HashMap<(AgentId, ConnectionId), OwnedRecord>> {
        lock(&self.owned)
    }

    fn written_keys(&self) -> MutexGuard<'_, HashSet<String>> {
        lock(&self.written_keys)
    }

    /// Adds the writes of one connection record to a batch.
    fn write_record(&self, batch: &mut Batch, agent_id: AgentId, connection_id: ConnectionId, r: &OwnedRecord) {
        let value = expiring(&r.info, self.timing.ttl);
        let ttl = ms(self.timing.ttl);
        let field = connection_id.0.to_string();
        for key in [self.keys.agent(agent_id), self.keys.project(r.project_id)] {
            batch.push(key.clone(), redis::Cmd::hset(&key, &field, value.as_slice()));
            batch.push(key.clone(), redis::Cmd::pexpire(&key, ttl));
        }
    }

    /// Adds the removal of one connection record to a batch (and marks the agent seen).
    fn remove_record(&self, batch: &mut Batch, agent_id: AgentId, project_id: ProjectId, connection_id: ConnectionId) {
        let field = connection_id.0.to_string();
        for key in [self.keys.agent(agent_id), self.keys.project(project_id)] {
            batch.push(key.clone(), redis::Cmd::hdel(&key, &field));
        }
        let seen = self.keys.seen(agent_id);
        let ttl = self.timing.ttl.as_millis().try_into().unwrap_or(u64::MAX);
        batch.push(seen.clone(), redis::Cmd::pset_ex(&seen, 1u8, ttl));
        let event =
            event_bytes(connection_event::Kind::Disconnected, agent_id, connection_id, &self.instance.instance_id);
        batch.events.push(event);
    }

    /// Reads a hash of connection records: live ones of live kas instances; deletes expired
    /// fields on the way.
    async fn read(&self, key: String) -> Result<Vec<ConnectedAgentInfo>, RegistryError> {
        let fields: HashMap<String, Vec<u8>> =
            self.query("read", redis::pipe().hgetall(&key)).await.map(|(v,): (HashMap<String, Vec<u8>>,)| v)?;
        let now = now_ms();
        let mut expired = Vec::new();
        let mut live = Vec::new();
        for (field, raw) in fields {
            let decoded = ExpiringValue::decode(raw.as_slice())
                .ok()
                .filter(|v| v.expires_at_unix_ms > now)
                .and_then(|v| ConnectedAgentInfo::decode(v.value).ok());
            match decoded {
                Some(info) => live.push(info),
                None => expired.push(field),
            }
        }
        if !expired.is_empty() {
            let mut pipe = redis::pipe();
            pipe.hdel(&key, expired).ignore();
            if let Err(e) = self.query::<()>("delete_expired", &pipe).await {
                tracing::debug!(error = %e, "deleting expired registry fields failed");
            }
        }
        let instances: Vec<String> = {
            let set: HashSet<&str> = live.iter().map(|i| i.kas_instance_id.as_str()).collect();
            set.into_iter().map(str::to_owned).collect()
        };
        if instances.is_empty() {
            return Ok(Vec::new());
        }
        // On a cluster every heartbeat shares the `{instances}` slot: still one request.
        let mut pipe = redis::pipe();
        for id in &instances {
            pipe.exists(self.keys.instance(id));
        }
        let alive: Vec<bool> = self.query("heartbeats", &pipe).await?;
        let alive: HashSet<&str> = instances.iter().zip(alive).filter(|(_, a)| *a).map(|(id, _)| id.as_str()).collect();
        Ok(sorted(live.into_iter().filter(|i| alive.contains(i.kas_instance_id.as_str())).collect()))
    }

    /// Hands a message of the events or push channel to local subscribers.
    fn deliver(&self, channel: &[u8], payload: &[u8]) {
        if channel == self.keys.git_push().as_bytes() {
            if let Ok(GitPushEvent { project: Some(project) }) = GitPushEvent::decode(payload) {
                let _ = self.pushes.send(GitPush { project, received_at: tokio::time::Instant::now() });
            }
            return;
        }
        let Ok(ev) = ConnectionEvent::decode(payload) else { return };
        let (agent_id, connection_id) = (AgentId(ev.agent_id), ConnectionId(ev.connection_id));
        let event = match connection_event::Kind::try_from(ev.kind) {
            Ok(connection_event::Kind::Connected) => RegistryEvent::Connected { agent_id, connection_id },
            Ok(connection_event::Kind::Disconnected) => RegistryEvent::Disconnected { agent_id, connection_id },
            _ => return,
        };
        let _ = self.events.send(event);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[async_trait]
impl AgentRegistry for RedisRegistry {
    fn instance(&self) -> &KasInstanceInfo {
        &self.instance
    }

    async fn register(&self, info: ConnectedAgentInfo) -> Result<(), RegistryError> {
        let info = super::stamped(info, &self.instance);
        let (agent_id, project_id, connection_id) = record_key(&info);
        let record = OwnedRecord { project_id, info: Bytes::from(info.encode_to_vec()) };
        // Remembered first: if Redis is down, the next refresh writes it.
        self.owned().insert((agent_id, connection_id), record.clone());
        self.written_keys().extend([self.keys.agent(agent_id), self.keys.project(project_id)]);
        let mut batch = Batch::atomic();
        self.write_record(&mut batch, agent_id, connection_id, &record);
        let event = event_bytes(connection_event::Kind::Connected, agent_id, connection_id, &self.instance.instance_id);
        batch.events.push(event);
        self.run("register", batch).await.map(drop)
    }

    async fn unregister(
        &self,
        agent_id: AgentId,
        project_id: ProjectId,
        connection_id: ConnectionId,
    ) -> Result<(), RegistryError> {
        self.owned().remove(&(agent_id, connection_id));
        let mut batch = Batch::atomic();
        self.remove_record(&mut batch, agent_id, project_id, connection_id);
        self.run("unregister", batch).await.map(drop)
    }

    async fn refresh(&self) -> Result<(), RegistryError> {
        let owned: Vec<_> = self.owned().iter().map(|(k, v)| (*k, v.clone())).collect();
        // One transaction and one round trip on one server, one per master on a cluster,
        // however many connections this kas holds.
        let mut batch = Batch::atomic();
        for ((agent_id, connection_id), record) in &owned {
            self.write_record(&mut batch, *agent_id, *connection_id, record);
        }
        self.run("refresh", batch).await.map(drop)
    }

    async fn heartbeat(&self) -> Result<(), RegistryError> {
        // Same round trip: was our previous heartbeat still there?
        let (key, write) = self.heartbeat_write();
        let mut pipe = redis::pipe();
        pipe.exists(&key).add_command(write).ignore();
        let (existed,): (bool,) = self.query("heartbeat", &pipe).await?;
        if !existed && self.heartbeat_written.swap(true, Ordering::Relaxed) {
            // Gone before its TTL (Redis flushed or restarted) or expired (this kas stalled):
            // either way others no longer see our records.
            tracing::info!("registry heartbeat key was gone; re-registering this kas's connections");
            self.resync.notify_one();
        }
        Ok(())
    }

    async fn gc(&self) -> Result<(), RegistryError> {
        let keys: Vec<String> = self.written_keys().iter().cloned().collect();
        let mut reads = Batch::default();
        for key in &keys {
            reads.push(key.clone(), redis::Cmd::hgetall(key));
        }
        let hashes = self
            .run("gc_read", reads)
            .await?
            .into_iter()
            .map(|reply| redis::from_redis_value::<HashMap<String, Vec<u8>>>(reply).map_err(|e| err("gc_read", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let now = now_ms();
        let mut deletes = Batch::default();
        for (key, fields) in keys.iter().zip(&hashes) {
            let expired: Vec<&String> = fields
                .iter()
                .filter(|(_, raw)| ExpiringValue::decode(raw.as_slice()).map_or(true, |v| v.expires_at_unix_ms <= now))
                .map(|(f, _)| f)
                .collect();
            if !expired.is_empty() {
                deletes.push(key.clone(), redis::Cmd::hdel(key, expired));
            }
        }
        // Keys that are gone (expired or emptied) need no more sweeping.
        let empty: HashSet<&String> = keys.iter().zip(&hashes).filter(|(_, h)| h.is_empty()).map(|(k, _)| k).collect();
        self.written_keys().retain(|k| !empty.contains(k));
        self.run("gc_delete", deletes).await.map(drop)
    }

    async fn connections_by_agent_id(&self, agent_id: AgentId) -> Result<Vec<ConnectedAgentInfo>, RegistryError> {
        self.read(self.keys.agent(agent_id)).await
    }

    async fn seen_recently(&self, agent_id: AgentId) -> Result<bool, RegistryError> {
        let mut pipe = redis::pipe();
        pipe.exists(&[self.keys.agent(agent_id), self.keys.seen(agent_id)]);
        let (count,): (u64,) = self.query("seen_recently", &pipe).await?;
        Ok(count > 0)
    }

    async fn connections_by_project_id(&self, project_id: ProjectId) -> Result<Vec<ConnectedAgentInfo>, RegistryError> {
        self.read(self.keys.project(project_id)).await
    }

    fn subscribe(&self) -> broadcast::Receiver<RegistryEvent> {
        self.events.subscribe()
    }

    async fn ping(&self) -> Result<(), RegistryError> {
        self.connection().await?.ping().await.map_err(|e| err("ping", e))
    }

    async fn count_connection(&self, agent_id: AgentId, window: Duration) -> Result<WindowCounts, RegistryError> {
        let (index, elapsed) = super::window_position(window);
        let key = self.keys.connection_count(agent_id, index);
        let previous_key = self.keys.connection_count(agent_id, index.saturating_sub(1));
        let mut pipe = redis::pipe();
        pipe.atomic().incr(&key, 1u64).pexpire(&key, ms(window) * 2).ignore().get(&previous_key);
        let (current, previous): (u64, Option<u64>) = self.query("count_connection", &pipe).await?;
        Ok(WindowCounts { current, previous: previous.unwrap_or(0), elapsed })
    }

    async fn put_gitops_sync(
        &self,
        agent_id: AgentId,
        sync: GitopsSync,
        configured: &[ManifestProjectKey],
        ttl: Duration,
    ) -> Result<(), RegistryError> {
        let key = ManifestProjectKey::of_sync(&sync)?;
        let projects = GitopsManifestProjects {
            projects: configured
                .iter()
                .map(|k| gitops_manifest_projects::Entry { project_id: k.project_id.clone(), r#ref: k.git_ref.clone() })
                .collect(),
        };
        let mut pipe = redis::pipe();
        let cmd = pipe.cmd("EVAL").arg(PUT_GITOPS_SYNC).arg(1).arg(self.keys.gitops(agent_id));
        cmd.arg(ms(ttl).max(1)).arg(projects.encode_to_vec()).arg(gitops_sync_field(&key)).arg(sync.encode_to_vec());
        for k in configured {
            cmd.arg(gitops_sync_field(k));
        }
        cmd.ignore();
        self.query("put_gitops_sync", &pipe).await
    }

    async fn gitops_status(&self, agent_id: AgentId) -> Result<GitopsStatusRecord, RegistryError> {
        let (fields,): (HashMap<String, Vec<u8>>,) =
            self.query("gitops_status", redis::pipe().hgetall(self.keys.gitops(agent_id))).await?;
        let mut record = GitopsStatusRecord::default();
        for (field, raw) in fields {
            if field == GITOPS_PROJECTS_FIELD {
                let projects = GitopsManifestProjects::decode(raw.as_slice())
                    .map_err(|e| err("gitops_status", format!("{field}: {e}")))?;
                record.configured = projects
                    .projects
                    .into_iter()
                    .map(|p| ManifestProjectKey { project_id: p.project_id, git_ref: p.r#ref })
                    .collect();
            } else {
                record.syncs.push(
                    GitopsSync::decode(raw.as_slice()).map_err(|e| err("gitops_status", format!("{field}: {e}")))?,
                );
            }
        }
        Ok(record)
    }

    async fn publish_git_push(&self, project: git_push_event::Project) -> Result<(), RegistryError> {
        let event = GitPushEvent { project: Some(project) }.encode_to_vec();
        let publish = if self.keys.cluster { "SPUBLISH" } else { "PUBLISH" };
        self.query("publish_git_push", redis::pipe().cmd(publish).arg(self.keys.git_push()).arg(event).ignore()).await
    }

    fn subscribe_git_pushes(&self) -> broadcast::Receiver<GitPush> {
        self.pushes.subscribe()
    }

    async fn put_cluster_state_holder(&self, agent_id: AgentId, ttl: Duration) -> Result<(), RegistryError> {
        let key = self.keys.cluster_state_holder(agent_id);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        self.query(
            "put_cluster_state_holder",
            redis::pipe().pset_ex(key, self.instance.encode_to_vec(), ttl_ms).ignore(),
        )
        .await
    }

    async fn cluster_state_holder(&self, agent_id: AgentId) -> Result<Option<KasInstanceInfo>, RegistryError> {
        let (raw,): (Option<Vec<u8>>,) =
            self.query("cluster_state_holder", redis::pipe().get(self.keys.cluster_state_holder(agent_id))).await?;
        raw.map(|raw| KasInstanceInfo::decode(raw.as_slice()).map_err(|e| err("cluster_state_holder", e))).transpose()
    }

    async fn remove_all_owned(&self) -> Result<(), RegistryError> {
        self.closed.store(true, Ordering::Relaxed);
        let owned: Vec<_> = self.owned().drain().collect();
        let mut batch = Batch::atomic();
        for ((agent_id, connection_id), record) in &owned {
            self.remove_record(&mut batch, *agent_id, record.project_id, *connection_id);
        }
        let heartbeat = self.keys.instance(&self.instance.instance_id);
        batch.push(heartbeat.clone(), redis::Cmd::del(&heartbeat));
        self.run("remove_all", batch).await.map(drop)
    }
}

/// GitLab mode's agent_info cache shared between kas: `P:agent_info:<hex HMAC of the token>`
/// (see [`crate::auth::gitlab::shared`]), one key per entry with its own expiry.
#[async_trait]
impl SharedAgentInfoCache for Inner {
    async fn get(&self, key: &SharedKey) -> Result<Option<(Vec<u8>, Duration)>, SharedCacheError> {
        let key = self.keys.agent_info(key);
        let mut pipe = redis::pipe();
        pipe.get(&key).pttl(&key);
        let (value, left): (Option<Vec<u8>>, i64) =
            self.query("agent_info_get", &pipe).await.map_err(|e| SharedCacheError(e.0))?;
        // PTTL -2: gone since the GET; -1: no expiry, so not written by kas (never trusted: an
        // entry must end, or a revoked token would work forever).
        let left = u64::try_from(left).ok().filter(|&ms| ms > 0).map(Duration::from_millis);
        Ok(value.zip(left))
    }

    async fn put(&self, key: &SharedKey, value: &[u8], ttl: Duration) -> Result<(), SharedCacheError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let key = self.keys.agent_info(key);
        self.query("agent_info_put", redis::pipe().pset_ex(key, value, ttl_ms).ignore())
            .await
            .map_err(|e| SharedCacheError(e.0))
    }
}

/// Resyncs (see the module docs) when woken, retrying until it succeeds; then tells local
/// waiters to look again.
async fn resync_task(inner: Arc<Inner>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = inner.resync.notified() => {}
        }
        let mut delay = Duration::from_millis(50);
        loop {
            match inner.resync_once().await {
                Ok(records) => {
                    tracing::info!(records, "registry rewritten after Redis came back");
                    let _ = inner.events.send(RegistryEvent::Resynced);
                    break;
                }
                Err(e) => tracing::debug!(error = %e, "registry resync failed; retrying"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(RESYNC_BACKOFF_CAP);
        }
        // A trigger meanwhile is kept (Notify stores one permit) and served after the pause.
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RESYNC_MIN_INTERVAL) => {}
        }
    }
}

/// One Redis server: forwards the events and push channels to local subscribers, re-subscribing
/// after Redis failures. A subscription re-established after it broke starts a resync (Redis may
/// be back empty).
async fn subscribe_events(inner: Arc<Inner>, connect_timeout: Duration, stop: CancellationToken) {
    let Backend::Server { client, .. } = &inner.backend else { return };
    let channel = inner.keys.events();
    let push_channel = inner.keys.git_push();
    let mut delay = Duration::from_millis(50);
    let mut interrupted = false;
    // One warning per outage, not one per attempt.
    let mut warned = false;
    loop {
        let session = async {
            // Bounded: a blackholed Redis must not stall re-subscribing for the OS connect timeout.
            let mut pubsub = tokio::time::timeout(connect_timeout, async {
                let mut pubsub = client.get_async_pubsub().await.map_err(|e| err("subscribe", e))?;
                pubsub.subscribe(&[&channel, &push_channel]).await.map_err(|e| err("subscribe", e))?;
                Ok::<_, RegistryError>(pubsub)
            })
            .await
            .map_err(|_| err("subscribe", "timed out"))??;
            warned = false;
            if interrupted {
                tracing::info!(%channel, "re-subscribed to registry events");
                inner.resync.notify_one();
            } else {
                tracing::debug!(%channel, "subscribed to registry events");
            }
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                inner.deliver(msg.get_channel_name().as_bytes(), msg.get_payload_bytes());
            }
            Ok::<_, RegistryError>(())
        };
        tokio::select! {
            () = stop.cancelled() => return,
            r = session => match r {
                // The subscription worked until Redis went away: retry quickly.
                Ok(()) => {
                    tracing::warn!("registry events subscription ended; re-subscribing");
                    delay = Duration::from_millis(50);
                    warned = true;
                }
                Err(e) if !warned => {
                    tracing::warn!(error = %e, "registry events subscription failed; retrying");
                    warned = true;
                }
                Err(e) => tracing::debug!(error = %e, "registry events subscription failed; retrying"),
            },
        }
        interrupted = true;
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(SUBSCRIBE_BACKOFF_CAP);
    }
}

/// A Redis Cluster: subscribes to the events and push channels (sharded, on the master serving
/// their `{pubsub}` slot) and forwards what arrives (RESP3 pushes) to local subscribers.
/// redis-rs's cluster client keeps the subscription once made: it subscribes again after a
/// reconnection and follows the slot to another master. This task subscribes the first time
/// (kas may start while Redis is down), again when the server ends the subscription, and starts
/// a resync when a node connection dropped (that node may come back empty) and when the
/// subscription is back after one.
async fn subscribe_sharded_events(
    inner: Arc<Inner>,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    connect_timeout: Duration,
    stop: CancellationToken,
) {
    let channels = [inner.keys.events(), inner.keys.git_push()];
    let mut delay = Duration::from_millis(50);
    let mut interrupted = false;
    let mut warned = false;
    loop {
        let subscribed = tokio::time::timeout(connect_timeout, async {
            let Connection::Cluster(mut conn) = inner.connection().await? else {
                return Err(err("subscribe", "not a cluster connection"));
            };
            conn.ssubscribe(&channels).await.map_err(|e| err("subscribe", e))
        })
        .await
        .map_err(|_| err("subscribe", "timed out"))
        .and_then(|r| r);
        if let Err(e) = subscribed {
            if warned {
                tracing::debug!(error = %e, "registry events subscription failed; retrying");
            } else {
                tracing::warn!(error = %e, "registry events subscription failed; retrying");
                warned = true;
            }
            interrupted = true;
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(SUBSCRIBE_BACKOFF_CAP);
            continue;
        }
        delay = Duration::from_millis(50);
        warned = false;
        if std::mem::take(&mut interrupted) {
            tracing::info!(channel = %channels[0], "re-subscribed to registry events");
            inner.resync.notify_one();
        } else {
            tracing::debug!(channel = %channels[0], "subscribed to registry events");
        }
        loop {
            let push = tokio::select! {
                () = stop.cancelled() => return,
                push = pushes.recv() => push,
            };
            let Some(PushInfo { kind, data }) = push else { return };
            match kind {
                PushKind::SMessage => {
                    if let [Value::BulkString(channel), Value::BulkString(payload), ..] = data.as_slice() {
                        inner.deliver(channel, payload);
                    }
                }
                PushKind::Disconnection => {
                    if !interrupted {
                        tracing::info!(
                            "a Redis Cluster node connection dropped; rewriting the registry once it answers"
                        );
                    }
                    interrupted = true;
                    inner.resync.notify_one();
                }
                // redis-rs subscribed again (reconnected, or followed the slot).
                PushKind::SSubscribe if interrupted => {
                    interrupted = false;
                    tracing::info!(channel = %channels[0], "re-subscribed to registry events");
                    inner.resync.notify_one();
                }
                // The server ended the subscription (e.g. the slot moved): subscribe again.
                PushKind::SUnsubscribe => {
                    interrupted = true;
                    break;
                }
                _ => {}
            }
        }
    }
}
