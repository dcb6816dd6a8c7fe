//! Redis registry: the backend for many kas replicas.
//!
//! Layout (all keys under a configurable prefix `P`):
//! - `P:agent:<agent id>` and `P:project:<project id>`: hashes, field = connection id, value =
//!   `ExpiringValue { expires_at, ConnectedAgentInfo }`. Both are written in one MULTI/EXEC with
//!   the same expiry, and the keys get a PEXPIRE of the record TTL.
//! - `P:kas:<instance id>`: this kas's `KasInstanceInfo`, with a short TTL (the heartbeat).
//! - `P:events`: pub-sub channel of `ConnectionEvent`s.
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
//!
//! Every write this kas makes is remembered locally (`owned`), so a refresh rewrites all of it in
//! one pipelined transaction (one round trip however many agents), and a registration that
//! failed while Redis was down is written by the next refresh once Redis is back.
//!
//! Redis may come back empty (restarted without persistence, flushed, failed over). Waiting for
//! the next refresh would leave cross-kas routing broken for up to a refresh period, so a
//! *resync* (heartbeat + every owned record + a `Connected` event per record, one transaction)
//! runs as soon as any of these shows Redis is back: the events subscription is re-established
//! after it broke, a call succeeds after one failed, or the heartbeat finds its own key gone.
//! After a resync, local waiters get [`RegistryEvent::Resynced`] so they look again (events
//! published while this kas was not subscribed are lost).

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
use redis::{AsyncCommands, IntoConnectionInfo};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, OnceCell, broadcast};
use tokio_util::sync::{CancellationToken, DropGuard};

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

/// `registry.redis` in the kas config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://host:port[/db]`, `rediss://host:port` (TLS) or `unix:///path/to/redis.sock`.
    pub url: String,
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
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            username: None,
            password_file: None,
            ca_cert_file: None,
            key_prefix: default_prefix(),
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
        }
    }
}

fn err(context: &str, e: impl std::fmt::Display) -> RegistryError {
    RegistryError(format!("redis {context}: {e}"))
}

struct Keys {
    prefix: String,
}

impl Keys {
    fn agent(&self, id: AgentId) -> String {
        format!("{}:agent:{id}", self.prefix)
    }
    fn project(&self, id: ProjectId) -> String {
        format!("{}:project:{id}", self.prefix)
    }
    /// Set (for a record TTL) when a connection of the agent is unregistered: see `seen_recently`.
    fn seen(&self, id: AgentId) -> String {
        format!("{}:seen:{id}", self.prefix)
    }
    fn instance(&self, id: &str) -> String {
        format!("{}:kas:{id}", self.prefix)
    }
    fn events(&self) -> String {
        format!("{}:events", self.prefix)
    }
    fn connection_count(&self, agent: AgentId, window: u64) -> String {
        format!("{}:conn-rate:{agent}:{window}", self.prefix)
    }
    fn gitops(&self, agent: AgentId) -> String {
        format!("{}:gitops:{agent}", self.prefix)
    }
    fn cluster_state_holder(&self, agent: AgentId) -> String {
        format!("{}:cluster_state:{agent}", self.prefix)
    }
    fn git_push(&self) -> String {
        format!("{}:git_push", self.prefix)
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

pub struct RedisRegistry {
    inner: Arc<Inner>,
    _stop_tasks: DropGuard,
}

/// What the registry and its background tasks (events subscriber, resync) share.
pub struct Inner {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    manager_config: ConnectionManagerConfig,
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
        f.debug_struct("RedisRegistry").field("prefix", &self.inner.keys.prefix).finish_non_exhaustive()
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
        let mut info = config.url.as_str().into_connection_info().map_err(|e| err("url", e))?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &config.username {
            settings = settings.set_username(user);
        }
        if let Some(path) = &config.password_file {
            let password = std::fs::read_to_string(path)
                .map_err(|e| RegistryError(format!("cannot read redis password file {}: {e}", path.display())))?;
            settings = settings.set_password(password.trim());
        }
        info = info.set_redis_settings(settings);
        let client = match &config.ca_cert_file {
            Some(path) => {
                let root_cert = crate::tools::tls::read_ca_bundle(path)
                    .map_err(|e| RegistryError(format!("redis CA file: {e}")))?;
                redis::Client::build_with_tls(
                    info,
                    redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) },
                )
            }
            None => redis::Client::open(info),
        }
        .map_err(|e| err("client", e))?;
        let keys = Keys { prefix: config.key_prefix.clone() };
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let stop = CancellationToken::new();
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.response_timeout))
            .set_connection_timeout(Some(config.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let inner = Arc::new(Inner {
            client,
            conn: OnceCell::new(),
            manager_config,
            keys,
            instance,
            timing,
            owned: Mutex::default(),
            written_keys: Mutex::default(),
            events,
            pushes: broadcast::channel(EVENT_BUFFER).0,
            round_trips: AtomicU64::new(0),
            resync: Notify::new(),
            failed_since_resync: AtomicBool::new(false),
            heartbeat_written: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(subscribe_events(inner.clone(), config.response_timeout, stop.clone()));
        tokio::spawn(resync_task(inner.clone(), stop.clone()));
        Ok(Self { inner, _stop_tasks: stop.drop_guard() })
    }
}

impl Inner {
    /// Round trips to Redis so far (benchmarks check a refresh costs one, whatever the count).
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    async fn conn(&self) -> Result<ConnectionManager, RegistryError> {
        // Concurrent first callers share one connection attempt; a failed attempt is retried by
        // the next call. ConnectionManager reconnects by itself afterwards.
        self.conn
            .get_or_try_init(|| self.client.get_connection_manager_with_config(self.manager_config.clone()))
            .await
            .cloned()
            .map_err(|e| err("connect", e))
    }

    async fn query<T: redis::FromRedisValue>(
        &self,
        context: &'static str,
        pipe: &redis::Pipeline,
    ) -> Result<T, RegistryError> {
        let result = async {
            let mut conn = self.conn().await?;
            self.round_trips.fetch_add(1, Ordering::Relaxed);
            pipe.query_async(&mut conn).await.map_err(|e| err(context, e))
        }
        .await;
        crate::metrics::registry_operation(context, result.is_ok());
        if result.is_err() {
            self.failed_since_resync.store(true, Ordering::Relaxed);
        } else if self.failed_since_resync.swap(false, Ordering::Relaxed) {
            // Redis answers again after a failure: it may have restarted empty.
            self.resync.notify_one();
        }
        result
    }

    /// Rewrites this kas's heartbeat and every record it owns, and announces each record, in
    /// one transaction. Returns how many records were written.
    async fn resync_once(&self) -> Result<usize, RegistryError> {
        if self.closed.load(Ordering::Relaxed) {
            return Ok(0);
        }
        let owned: Vec<_> = self.owned().iter().map(|(k, v)| (*k, v.clone())).collect();
        let mut pipe = redis::pipe();
        pipe.atomic();
        self.write_heartbeat(&mut pipe);
        for ((agent_id, connection_id), record) in &owned {
            self.write_record(&mut pipe, *agent_id, *connection_id, record);
            let event =
                event_bytes(connection_event::Kind::Connected, *agent_id, *connection_id, &self.instance.instance_id);
            pipe.publish(self.keys.events(), event).ignore();
        }
        self.query::<()>("resync", &pipe).await?;
        self.heartbeat_written.store(true, Ordering::Relaxed);
        Ok(owned.len())
    }

    fn write_heartbeat(&self, pipe: &mut redis::Pipeline) {
        pipe.pset_ex(
            self.keys.instance(&self.instance.instance_id),
            self.instance.encode_to_vec(),
            u64::try_from(ms(self.timing.heartbeat_ttl)).unwrap_or(u64::MAX),
        )
        .ignore();
    }

    fn owned(&self) -> MutexGuard<'_, HashMap<(AgentId, ConnectionId), OwnedRecord>> {
        self.owned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn written_keys(&self) -> MutexGuard<'_, HashSet<String>> {
        self.written_keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds the writes of one connection record to a pipeline.
    fn write_record(
        &self,
        pipe: &mut redis::Pipeline,
        agent_id: AgentId,
        connection_id: ConnectionId,
        r: &OwnedRecord,
    ) {
        let value = expiring(&r.info, self.timing.ttl);
        let ttl = ms(self.timing.ttl);
        let field = connection_id.0.to_string();
        for key in [self.keys.agent(agent_id), self.keys.project(r.project_id)] {
            pipe.hset(&key, &field, value.as_slice()).ignore().pexpire(&key, ttl).ignore();
        }
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
        let mut pipe = redis::pipe();
        for id in &instances {
            pipe.exists(self.keys.instance(id));
        }
        let alive: Vec<bool> = self.query("heartbeats", &pipe).await?;
        let alive: HashSet<&str> = instances.iter().zip(alive).filter(|(_, a)| *a).map(|(id, _)| id.as_str()).collect();
        Ok(sorted(live.into_iter().filter(|i| alive.contains(i.kas_instance_id.as_str())).collect()))
    }
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
        let mut pipe = redis::pipe();
        pipe.atomic();
        self.write_record(&mut pipe, agent_id, connection_id, &record);
        let event = event_bytes(connection_event::Kind::Connected, agent_id, connection_id, &self.instance.instance_id);
        pipe.publish(self.keys.events(), event).ignore();
        self.query("register", &pipe).await
    }

    async fn unregister(
        &self,
        agent_id: AgentId,
        project_id: ProjectId,
        connection_id: ConnectionId,
    ) -> Result<(), RegistryError> {
        self.owned().remove(&(agent_id, connection_id));
        let field = connection_id.0.to_string();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hdel(self.keys.agent(agent_id), &field)
            .ignore()
            .hdel(self.keys.project(project_id), &field)
            .ignore()
            .pset_ex(self.keys.seen(agent_id), 1u8, self.timing.ttl.as_millis().try_into().unwrap_or(u64::MAX))
            .ignore()
            .publish(
                self.keys.events(),
                event_bytes(connection_event::Kind::Disconnected, agent_id, connection_id, &self.instance.instance_id),
            )
            .ignore();
        self.query("unregister", &pipe).await
    }

    async fn refresh(&self) -> Result<(), RegistryError> {
        let owned: Vec<_> = self.owned().iter().map(|(k, v)| (*k, v.clone())).collect();
        if owned.is_empty() {
            return Ok(());
        }
        // One transaction, one round trip, however many connections this kas holds.
        let mut pipe = redis::pipe();
        pipe.atomic();
        for ((agent_id, connection_id), record) in &owned {
            self.write_record(&mut pipe, *agent_id, *connection_id, record);
        }
        self.query("refresh", &pipe).await
    }

    async fn heartbeat(&self) -> Result<(), RegistryError> {
        // Same round trip: was our previous heartbeat still there?
        let mut pipe = redis::pipe();
        pipe.exists(self.keys.instance(&self.instance.instance_id));
        self.write_heartbeat(&mut pipe);
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
        if keys.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.hgetall(key);
        }
        let hashes: Vec<HashMap<String, Vec<u8>>> = self.query("gc_read", &pipe).await?;
        let now = now_ms();
        let mut pipe = redis::pipe();
        let mut deletes = 0;
        for (key, fields) in keys.iter().zip(&hashes) {
            let expired: Vec<&String> = fields
                .iter()
                .filter(|(_, raw)| ExpiringValue::decode(raw.as_slice()).map_or(true, |v| v.expires_at_unix_ms <= now))
                .map(|(f, _)| f)
                .collect();
            if !expired.is_empty() {
                pipe.hdel(key, expired).ignore();
                deletes += 1;
            }
        }
        // Keys that are gone (expired or emptied) need no more sweeping.
        let empty: HashSet<&String> = keys.iter().zip(&hashes).filter(|(_, h)| h.is_empty()).map(|(k, _)| k).collect();
        self.written_keys().retain(|k| !empty.contains(k));
        if deletes > 0 {
            self.query::<()>("gc_delete", &pipe).await?;
        }
        Ok(())
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
        let mut conn = self.conn().await?;
        let _: String = conn.ping().await.map_err(|e| err("ping", e))?;
        Ok(())
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
        let event = GitPushEvent { project: Some(project) };
        self.query("publish_git_push", redis::pipe().publish(self.keys.git_push(), event.encode_to_vec()).ignore())
            .await
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
        let mut pipe = redis::pipe();
        pipe.atomic();
        for ((agent_id, connection_id), record) in &owned {
            let field = connection_id.0.to_string();
            pipe.hdel(self.keys.agent(*agent_id), &field).ignore();
            pipe.hdel(self.keys.project(record.project_id), &field).ignore();
            pipe.pset_ex(self.keys.seen(*agent_id), 1u8, self.timing.ttl.as_millis().try_into().unwrap_or(u64::MAX))
                .ignore();
            let event = event_bytes(
                connection_event::Kind::Disconnected,
                *agent_id,
                *connection_id,
                &self.instance.instance_id,
            );
            pipe.publish(self.keys.events(), event).ignore();
        }
        pipe.del(self.keys.instance(&self.instance.instance_id)).ignore();
        self.query("remove_all", &pipe).await
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

/// Forwards the events and push channels to local subscribers, re-subscribing after Redis
/// failures. A subscription re-established after it broke starts a resync (Redis may be back
/// empty).
async fn subscribe_events(inner: Arc<Inner>, connect_timeout: Duration, stop: CancellationToken) {
    let channel = inner.keys.events();
    let push_channel = inner.keys.git_push();
    let events = inner.events.clone();
    let mut delay = Duration::from_millis(50);
    let mut interrupted = false;
    // One warning per outage, not one per attempt.
    let mut warned = false;
    loop {
        let session = async {
            // Bounded: a blackholed Redis must not stall re-subscribing for the OS connect timeout.
            let mut pubsub = tokio::time::timeout(connect_timeout, async {
                let mut pubsub = inner.client.get_async_pubsub().await.map_err(|e| err("subscribe", e))?;
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
                if msg.get_channel_name() == push_channel {
                    if let Ok(GitPushEvent { project: Some(project) }) = GitPushEvent::decode(msg.get_payload_bytes()) {
                        let _ = inner.pushes.send(GitPush { project, received_at: tokio::time::Instant::now() });
                    }
                    continue;
                }
                let Ok(ev) = ConnectionEvent::decode(msg.get_payload_bytes()) else { continue };
                let (agent_id, connection_id) = (AgentId(ev.agent_id), ConnectionId(ev.connection_id));
                let event = match connection_event::Kind::try_from(ev.kind) {
                    Ok(connection_event::Kind::Connected) => RegistryEvent::Connected { agent_id, connection_id },
                    Ok(connection_event::Kind::Disconnected) => RegistryEvent::Disconnected { agent_id, connection_id },
                    _ => continue,
                };
                let _ = events.send(event);
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
