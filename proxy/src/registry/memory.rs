//! In-memory registry: the default for a single kas. Records expire like Redis records do, so
//! the same conformance suite applies. Several `MemoryRegistry` values can share one
//! [`MemoryStore`] to act as several kas instances in tests.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kas_proto::kas::ConnectedAgentInfo;
use kas_proto::{AgentId, ConnectionId, ProjectId};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{AgentRegistry, RegistryError, RegistryEvent, record_key};

/// Buffered events per subscriber; a subscriber that lags re-scans (see the router).
const EVENT_BUFFER: usize = 1024;

type Key = (AgentId, ProjectId, ConnectionId);

#[derive(Debug)]
struct Entry {
    info: ConnectedAgentInfo,
    expires_at: Instant,
}

/// The shared state (what Redis is for the Redis backend).
#[derive(Debug, Clone)]
pub struct MemoryStore {
    entries: Arc<Mutex<HashMap<Key, Entry>>>,
    events: broadcast::Sender<RegistryEvent>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self { entries: Arc::default(), events: broadcast::channel(EVENT_BUFFER).0 }
    }
}

/// One kas instance's view of a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryRegistry {
    store: MemoryStore,
    ttl: Duration,
    owned: Mutex<HashSet<Key>>,
}

impl MemoryRegistry {
    pub fn new(ttl: Duration) -> Self {
        Self::with_store(MemoryStore::default(), ttl)
    }

    pub fn with_store(store: MemoryStore, ttl: Duration) -> Self {
        Self { store, ttl, owned: Mutex::default() }
    }

    fn lock_entries(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        // A panic while holding this lock cannot leave the map half-updated (single inserts and
        // removes), so a poisoned lock is still usable.
        self.store.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_owned(&self) -> std::sync::MutexGuard<'_, HashSet<Key>> {
        self.owned.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn live(&self, pred: impl Fn(&Key) -> bool) -> Vec<ConnectedAgentInfo> {
        let now = Instant::now();
        let mut entries = self.lock_entries();
        // Readers delete expired records, as the Redis backend does.
        entries.retain(|_, e| e.expires_at > now);
        let mut out: Vec<_> = entries.iter().filter(|(k, _)| pred(k)).map(|(_, e)| e.info.clone()).collect();
        out.sort_by_key(|i| (i.id, i.connection_id));
        out
    }
}

#[async_trait]
impl AgentRegistry for MemoryRegistry {
    async fn register(&self, info: ConnectedAgentInfo) -> Result<(), RegistryError> {
        let key = record_key(&info);
        self.lock_owned().insert(key);
        self.lock_entries().insert(key, Entry { info, expires_at: Instant::now() + self.ttl });
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
        self.lock_owned().remove(&key);
        self.lock_entries().remove(&key);
        let _ = self.store.events.send(RegistryEvent::Disconnected { agent_id, connection_id });
        Ok(())
    }

    async fn refresh(&self) -> Result<(), RegistryError> {
        let owned = self.lock_owned().clone();
        let expires_at = Instant::now() + self.ttl;
        let mut entries = self.lock_entries();
        for key in owned {
            if let Some(e) = entries.get_mut(&key) {
                e.expires_at = expires_at;
            }
        }
        Ok(())
    }

    async fn gc(&self) -> Result<(), RegistryError> {
        let now = Instant::now();
        self.lock_entries().retain(|_, e| e.expires_at > now);
        Ok(())
    }

    async fn connections_by_agent_id(&self, agent_id: AgentId) -> Result<Vec<ConnectedAgentInfo>, RegistryError> {
        Ok(self.live(|k| k.0 == agent_id))
    }

    async fn connections_by_project_id(&self, project_id: ProjectId) -> Result<Vec<ConnectedAgentInfo>, RegistryError> {
        Ok(self.live(|k| k.1 == project_id))
    }

    fn subscribe(&self) -> broadcast::Receiver<RegistryEvent> {
        self.store.events.subscribe()
    }

    async fn remove_all_owned(&self) -> Result<(), RegistryError> {
        let owned: Vec<Key> = self.lock_owned().drain().collect();
        let mut entries = self.lock_entries();
        for key in &owned {
            entries.remove(key);
        }
        drop(entries);
        for (agent_id, _, connection_id) in owned {
            let _ = self.store.events.send(RegistryEvent::Disconnected { agent_id, connection_id });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::conformance::{self, Backend};

    struct Memory(MemoryStore);

    impl Backend for Memory {
        async fn instance(&self, ttl: Duration) -> Arc<dyn AgentRegistry> {
            Arc::new(MemoryRegistry::with_store(self.0.clone(), ttl))
        }
        async fn isolated(&self, ttl: Duration) -> Arc<dyn AgentRegistry> {
            Arc::new(MemoryRegistry::new(ttl))
        }
    }

    #[tokio::test]
    async fn conformance() {
        conformance::run_all(&Memory(MemoryStore::default())).await;
    }
}
