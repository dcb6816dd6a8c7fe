#![allow(clippy::unwrap_used)] // test-support code: a failed call is a failed conformance check
//! The conformance suite every registry backend must pass. Backends supply two constructors:
//! `instance` (another kas sharing the same store) and `isolated` (a store that must not see the
//! others, e.g. another key prefix).

use std::sync::Arc;
use std::time::Duration;

use kas_proto::kas::{ConnectedAgentInfo, KasAddress};
use kas_proto::{AgentId, ConnectionId, ProjectId};

use super::{AgentRegistry, RegistryEvent};

pub trait Backend {
    fn instance(&self, ttl: Duration) -> impl Future<Output = Arc<dyn AgentRegistry>>;
    fn isolated(&self, ttl: Duration) -> impl Future<Output = Arc<dyn AgentRegistry>>;
}

/// A connection record as kas writes it.
pub fn record(agent: i64, project: i64, connection: i64) -> ConnectedAgentInfo {
    ConnectedAgentInfo {
        id: agent,
        connection_id: connection,
        project_id: project,
        version: "v1".into(),
        commit: "c".into(),
        pod_namespace: "ns".into(),
        pod_name: format!("pod-{connection}"),
        connected_at: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 }),
        kas_address: Some(KasAddress { ip: "127.0.0.1".into(), port: 8155 }),
    }
}

fn ids(v: &[ConnectedAgentInfo]) -> Vec<(i64, i64)> {
    let mut out: Vec<_> = v.iter().map(|i| (i.id, i.connection_id)).collect();
    out.sort();
    out
}

const LONG: Duration = Duration::from_secs(60);
// Expiry tests run in real time (Redis cannot be paused); short enough to keep suites fast.
const SHORT: Duration = Duration::from_millis(300);

pub async fn run_all(b: &impl Backend) {
    register_list_unregister(b).await;
    records_survive_while_refreshed_and_expire_after(b).await;
    gc_removes_expired(b).await;
    isolation(b).await;
    two_instances_see_each_other(b).await;
    events_are_delivered(b).await;
    remove_all_owned_removes_only_own(b).await;
}

pub async fn register_list_unregister(b: &impl Backend) {
    let r = b.isolated(LONG).await;
    let full = record(1, 10, 100);
    r.register(full.clone()).await.unwrap();
    r.register(record(1, 10, 101)).await.unwrap();
    r.register(record(2, 10, 200)).await.unwrap();
    r.register(record(3, 11, 300)).await.unwrap();
    let by_agent = r.connections_by_agent_id(AgentId(1)).await.unwrap();
    assert_eq!(ids(&by_agent), vec![(1, 100), (1, 101)]);
    // The record round-trips with every field.
    assert!(by_agent.contains(&full), "{by_agent:?}");
    assert_eq!(ids(&r.connections_by_project_id(ProjectId(10)).await.unwrap()), vec![(1, 100), (1, 101), (2, 200)]);
    r.unregister(AgentId(1), ProjectId(10), ConnectionId(100)).await.unwrap();
    assert_eq!(ids(&r.connections_by_agent_id(AgentId(1)).await.unwrap()), vec![(1, 101)]);
    assert_eq!(ids(&r.connections_by_project_id(ProjectId(10)).await.unwrap()), vec![(1, 101), (2, 200)]);
    assert!(r.connections_by_agent_id(AgentId(99)).await.unwrap().is_empty());
}

pub async fn records_survive_while_refreshed_and_expire_after(b: &impl Backend) {
    let r = b.isolated(SHORT).await;
    r.register(record(1, 10, 100)).await.unwrap();
    for _ in 0..4 {
        tokio::time::sleep(SHORT / 3).await;
        r.refresh().await.unwrap();
    }
    assert_eq!(r.connections_by_agent_id(AgentId(1)).await.unwrap().len(), 1, "refreshed record expired");
    tokio::time::sleep(SHORT * 2).await;
    assert!(r.connections_by_agent_id(AgentId(1)).await.unwrap().is_empty(), "record outlived its ttl");
    assert!(r.connections_by_project_id(ProjectId(10)).await.unwrap().is_empty());
}

pub async fn gc_removes_expired(b: &impl Backend) {
    let r = b.isolated(SHORT).await;
    r.register(record(1, 10, 100)).await.unwrap();
    tokio::time::sleep(SHORT * 2).await;
    r.gc().await.unwrap();
    assert!(r.connections_by_agent_id(AgentId(1)).await.unwrap().is_empty());
}

pub async fn isolation(b: &impl Backend) {
    let a = b.isolated(LONG).await;
    let other = b.isolated(LONG).await;
    a.register(record(1, 10, 100)).await.unwrap();
    assert!(other.connections_by_agent_id(AgentId(1)).await.unwrap().is_empty());
}

pub async fn two_instances_see_each_other(b: &impl Backend) {
    let k1 = b.instance(LONG).await;
    let k2 = b.instance(LONG).await;
    k1.register(record(7, 70, 1)).await.unwrap();
    k2.register(record(7, 70, 2)).await.unwrap();
    assert_eq!(ids(&k1.connections_by_agent_id(AgentId(7)).await.unwrap()), vec![(7, 1), (7, 2)]);
    assert_eq!(ids(&k2.connections_by_project_id(ProjectId(70)).await.unwrap()), vec![(7, 1), (7, 2)]);
    k1.remove_all_owned().await.unwrap();
    k2.remove_all_owned().await.unwrap();
}

pub async fn events_are_delivered(b: &impl Backend) {
    let k1 = b.instance(LONG).await;
    let k2 = b.instance(LONG).await;
    let mut events = k1.subscribe();
    k2.register(record(8, 80, 5)).await.unwrap();
    k2.unregister(AgentId(8), ProjectId(80), ConnectionId(5)).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.recv()).await.expect("event").expect("channel");
        if ev.agent_id() == AgentId(8) {
            seen.push(ev);
        }
    }
    assert_eq!(
        seen,
        vec![
            RegistryEvent::Connected { agent_id: AgentId(8), connection_id: ConnectionId(5) },
            RegistryEvent::Disconnected { agent_id: AgentId(8), connection_id: ConnectionId(5) },
        ]
    );
}

pub async fn remove_all_owned_removes_only_own(b: &impl Backend) {
    let k1 = b.instance(LONG).await;
    let k2 = b.instance(LONG).await;
    k1.register(record(9, 90, 1)).await.unwrap();
    k2.register(record(9, 90, 2)).await.unwrap();
    k1.remove_all_owned().await.unwrap();
    assert_eq!(ids(&k2.connections_by_agent_id(AgentId(9)).await.unwrap()), vec![(9, 2)]);
    k2.remove_all_owned().await.unwrap();
    assert!(k2.connections_by_agent_id(AgentId(9)).await.unwrap().is_empty());
}
