//! The registry conformance suite against the in-memory backend (one kas): it expires records
//! like Redis does, so the same suite applies.

use std::sync::Arc;

use kas::registry::memory::{MemoryRegistry, MemoryStore};
use kas::registry::{AgentRegistry, RegistryTiming};
use kas_e2e::registry_conformance::{self as conformance, Backend};

/// Instances share one store; an isolated registry gets a store of its own.
struct Memory(MemoryStore);

impl Backend for Memory {
    async fn instance(&self, timing: RegistryTiming) -> Arc<dyn AgentRegistry> {
        Arc::new(MemoryRegistry::with_store(self.0.clone(), conformance::instance_info(), timing))
    }

    async fn isolated(&self, timing: RegistryTiming) -> Arc<dyn AgentRegistry> {
        Arc::new(MemoryRegistry::new(conformance::instance_info(), timing))
    }
}

#[tokio::test]
async fn conformance_in_memory() {
    conformance::run_all(&Memory(MemoryStore::default())).await;
}
