//! In-memory registry: the default for a single kas. Records and heartbeats expire like Redis
//! records do, so the same conformance suite applies. Several `MemoryRegistry` values can share
//! one [`MemoryStore`] to act as several kas instances in one process (tests).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use kas_proto::kas::{ConnectedAgentInfo, GitopsSync, KasInstanceInfo, git_push_event};
use kas_proto::{AgentId, ConnectionId, ProjectId};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{
    AgentRegistry, EVENT_BUFFER, GitPush, GitopsStatusRecord, ManifestProjectKey, RegistryError, RegistryEvent,
    RegistryTiming, WindowCounts, record_key, sorted, window_position,
};

type Key = (AgentId, ProjectId, ConnectionId);

#[derive(Debug)]
struct Entry {
    info: ConnectedAgentInfo,
    expires_at: Instant,
}

#[derive(Debug, Default)]
struct Data {
    entries: HashMap<Key, Entry>,
    /// instance id -> heartbeat expiry
    instances: HashMap<String, Instant>,
    /// (agent, window index) -> connections counted in that window
    connection_counts: HashMap<(AgentId, u64), u64>,
    /// agent -> until when it counts as seen after its last connection was unregistered
    seen_until: HashMap<AgentId, Instant>,
    /// agent -> its GitOps syncs (as Redis's `gitops:<agent>` hash)
    gitops: HashMap<AgentId, GitopsEntry>,
    /// agent -> the kas holding its cluster state, until when
    cluster_state_holders: HashMap<AgentId, (KasInstanceInfo, Instant)>,
}

#[derive(Debug)]
struct GitopsEntry {
    expires_at: Instant,
    configured: Vec<ManifestProjectKey>,
    syncs: BTreeMap<ManifestProjectKey, GitopsSync>,
}

/// The shared state (what Redis is for the Redis backend). Plain maps behind a lock that is
/// never held across an await: each operation is a few map updates.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    data: Arc<Mutex<Data>>,
    events: broadcast::Sender<RegistryEvent>,
    pushes: broadcast::Sender<GitPush>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            data: Arc::default(),
            events: broadcast::channel(EVENT_BUFFER).0,
            pushes: broadcast::channel(EVENT_BUFFER).0,
        }
    }
}

impl MemoryStore {
    fn lock(&self) -> MutexGuard<'_, Data> {
        // Each critical section is a handful of inserts/removes, so a poisoned lock still holds
        // consistent maps.
        self.data.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One kas instance's view of a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryRegistry {
    store: MemoryStore,
    instance: KasInstanceInfo,
    timing: RegistryTiming,
    owned: Mutex<HashSet<Key>>,
}

impl MemoryRegistry {
    /// A registry with its own store; the instance is alive from the start.
    pub fn new(instance: KasInstanceInfo, timing: RegistryTiming) -> Self {
        Self::with_store(MemoryStore::default(), instance, timing)
    }

    pub fn with_store(store: MemoryStore, instance: KasInstanceInfo, timing: RegistryTiming) -> Self {
        store.lock().instances.insert(instance.instance_id.clone(), Instant::now() + timing.heartbeat_ttl);
        Self { store, instance, timing, owned: Mutex::default() }
    }

    fn owned(&self) -> MutexGuard<'_, HashSet<Key>> {
        self.owned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn live(&self, pred: impl Fn(&Key) -> bool) -> Vec<ConnectedAgentInfo> {
        let now = Instant::now();
        let mut data = self.store.lock();
        // Readers delete expired records, as the Redis backend does.
        data.entries.retain(|_, e| e.expires_at > now);
        let data = &*data;
        let alive = |id: &str| data.instances.get(id).is_some_and(|t| *t > now);
        sorted(
            data.entries
                .iter()
                .filter(|(k, e)| pred(k) && alive(&e.info.kas_instance_id))
                .map(|(_, e)| e.info.clone())
                .collect(),
        )
    }
}

#[async_trait]
impl AgentRegistry for MemoryRegistry {
    fn instance(&self) -> &KasInstanceInfo {
        &self.instance
    }

    async fn register(&self, info: ConnectedAgentInfo) -> Result<(), RegistryError> {
        let info = super::stamped(info, &self.instance);
        let key = record_key(&info);
        self.owned().insert(key);
        self.store.lock().entries.insert(key, Entry { info, expires_at: Instant::now() + self.timing.ttl });
        let _ = self.store.events.send(RegistryEvent::Connected { agent_id: key.0, connection_id: key.2 });
        Ok(())
    }

    async fn unregister(
        &self,
        agent_id: AgentId,
        project_id: ProjectId,
        connection_id: ConnectionId,
    ) -> Result<(), RegistryError> {
        let key = (agent_id, project_id, connection_id);
        self.owned().remove(&key);
        let mut data = self.store.lock();
        data.entries.remove(&key);
        data.seen_until.insert(agent_id, Instant::now() + self.timing.ttl);
        drop(data);
        let _ = self.store.events.send(RegistryEvent::Disconnected { agent_id, connection_id });
        Ok(())
    }

    async fn refresh(&self) -> Result<(), RegistryError> {
        let owned = self.owned().clone();
        let expires_at = Instant::now() + self.timing.ttl;
        let mut data = self.store.lock();
        for key in owned {
            if let Some(e) = data.entries.get_mut(&key) {
                e.expires_at = expires_at;
            }
        }
        Ok(())
    }

    async fn heartbeat(&self) -> Result<(), RegistryError> {
        let expires_at = Instant::now() + self.timing.heartbeat_ttl;
        self.store.lock().instances.insert(self.instance.instance_id.clone(), expires_at);
        Ok(())
    }

    async fn gc(&self) -> Result<(), RegistryError> {
        let now = Instant::now();
        let mut data = self.store.lock();
        data.entries.retain(|_, e| e.expires_at > now);
        data.instances.retain(|_, t| *t > now);
        data.seen_until.retain(|_, t| *t > now);
        data.gitops.retain(|_, e| e.expires_at > now);
        data.cluster_state_holders.retain(|_, (_, until)| *until > now);
        Ok(())
    }

    async fn connections_by_agent_id(&self, agent_id: AgentId) -> Result<Vec<ConnectedAgentInfo>, RegistryError> {
        Ok(self.live(|k| k.0 == agent_id))
    }

    async fn connections_by_project_id(&self, project_id: ProjectId) -> Result<Vec<ConnectedAgentInfo>, RegistryError> {
        Ok(self.live(|k| k.1 == project_id))
    }

    async fn seen_recently(&self, agent_id: AgentId) -> Result<bool, RegistryError> {
        let now = Instant::now();
        let data = self.store.lock();
        let registered = data.entries.iter().any(|(k, e)| k.0 == agent_id && e.expires_at > now);
        Ok(registered || data.seen_until.get(&agent_id).is_some_and(|t| *t > now))
    }

    fn subscribe(&self) -> broadcast::Receiver<RegistryEvent> {
        self.store.events.subscribe()
    }

    async fn ping(&self) -> Result<(), RegistryError> {
        Ok(())
    }

    async fn count_connection(&self, agent_id: AgentId, window: Duration) -> Result<WindowCounts, RegistryError> {
        let (index, elapsed) = window_position(window);
        let mut data = self.store.lock();
        // Only the current and the previous window matter; older ones are dropped as windows pass.
        data.connection_counts.retain(|(_, i), _| *i + 1 >= index);
        let count = data.connection_counts.entry((agent_id, index)).or_default();
        *count += 1;
        let current = *count;
        let previous = index.checked_sub(1).and_then(|p| data.connection_counts.get(&(agent_id, p))).copied();
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
        let now = Instant::now();
        let mut data = self.store.lock();
        let entry = data.gitops.entry(agent_id).or_insert_with(|| GitopsEntry {
            expires_at: now,
            configured: Vec::new(),
            syncs: BTreeMap::new(),
        });
        // An expired entry is gone, as an expired Redis key would be.
        if entry.expires_at <= now {
            entry.syncs.clear();
        }
        entry.expires_at = now + ttl;
        entry.configured = configured.to_vec();
        entry.syncs.insert(key, sync);
        entry.syncs.retain(|k, _| configured.contains(k));
        Ok(())
    }

    async fn gitops_status(&self, agent_id: AgentId) -> Result<GitopsStatusRecord, RegistryError> {
        let now = Instant::now();
        let data = self.store.lock();
        Ok(match data.gitops.get(&agent_id) {
            Some(e) if e.expires_at > now => {
                GitopsStatusRecord { configured: e.configured.clone(), syncs: e.syncs.values().cloned().collect() }
            }
            _ => GitopsStatusRecord::default(),
        })
    }

    async fn publish_git_push(&self, project: git_push_event::Project) -> Result<(), RegistryError> {
        let _ = self.store.pushes.send(GitPush { project, received_at: Instant::now() });
        Ok(())
    }

    fn subscribe_git_pushes(&self) -> broadcast::Receiver<GitPush> {
        self.store.pushes.subscribe()
    }

    async fn put_cluster_state_holder(&self, agent_id: AgentId, ttl: Duration) -> Result<(), RegistryError> {
        let until = Instant::now() + ttl;
        self.store.lock().cluster_state_holders.insert(agent_id, (self.instance.clone(), until));
        Ok(())
    }

    async fn cluster_state_holder(&self, agent_id: AgentId) -> Result<Option<KasInstanceInfo>, RegistryError> {
        let now = Instant::now();
        let data = self.store.lock();
        Ok(data.cluster_state_holders.get(&agent_id).filter(|(_, until)| *until > now).map(|(kas, _)| kas.clone()))
    }

    async fn remove_all_owned(&self) -> Result<(), RegistryError> {
        let owned: Vec<Key> = self.owned().drain().collect();
        let mut data = self.store.lock();
        let seen_until = Instant::now() + self.timing.ttl;
        for key in &owned {
            data.entries.remove(key);
            data.seen_until.insert(key.0, seen_until);
        }
        data.instances.remove(&self.instance.instance_id);
        drop(data);
        for (agent_id, _, connection_id) in owned {
            let _ = self.store.events.send(RegistryEvent::Disconnected { agent_id, connection_id });
        }
        Ok(())
    }
}
