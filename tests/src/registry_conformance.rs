//! The conformance suite every kas registry backend must pass (`kas::registry`'s memory and
//! Redis backends: `tests/registry_memory.rs`, `tests/registry_redis.rs`). Backends supply two
//! constructors: `instance` (another kas sharing the same store) and `isolated` (a store that
//! must not see the others, e.g. another key prefix). Here rather than in kas so that the
//! product does not carry a test suite.
#![allow(clippy::unwrap_used)] // test support: a failed call is a failed conformance check

use std::sync::Arc;
use std::time::Duration;

use kas_proto::gitops::SyncReport;
use kas_proto::kas::{ConnectedAgentInfo, GitopsSync, KasAddress, KasInstanceInfo, git_push_event};
use kas_proto::{AgentId, ConnectionId, ProjectId};

use kas::registry::{AgentRegistry, ManifestProjectKey, RegistryEvent, RegistryTiming};

pub trait Backend {
    fn instance(&self, timing: RegistryTiming) -> impl Future<Output = Arc<dyn AgentRegistry>>;
    fn isolated(&self, timing: RegistryTiming) -> impl Future<Output = Arc<dyn AgentRegistry>>;
}

/// A kas instance with a random id and port.
pub fn instance_info() -> KasInstanceInfo {
    KasInstanceInfo {
        version: "test".into(),
        commit: "c".into(),
        address: Some(KasAddress { ip: "127.0.0.1".into(), port: u32::from(rand::random::<u16>()) }),
        instance_id: kas::registry::new_instance_id(),
    }
}

/// A connection record as the agent listener passes it to `register`.
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
        kas_address: None,
        kas_instance_id: String::new(),
    }
}

fn ids(v: &[ConnectedAgentInfo]) -> Vec<(i64, i64)> {
    let mut out: Vec<_> = v.iter().map(|i| (i.id, i.connection_id)).collect();
    out.sort();
    out
}

const LONG: Duration = Duration::from_secs(60);
// Expiry tests run in real time (Redis cannot be paused); short enough to keep suites fast,
// long enough for a few round trips on a loaded machine.
const SHORT: Duration = Duration::from_millis(400);

fn timing(ttl: Duration, heartbeat_ttl: Duration) -> RegistryTiming {
    RegistryTiming { ttl, heartbeat_ttl }
}

pub async fn run_all(b: &impl Backend) {
    register_list_unregister(b).await;
    records_survive_while_refreshed_and_expire_after(b).await;
    gc_removes_expired(b).await;
    isolation(b).await;
    two_instances_see_each_other(b).await;
    records_of_a_dead_instance_are_ignored(b).await;
    events_are_delivered(b).await;
    remove_all_owned_removes_only_own(b).await;
    connection_counts_are_shared_between_instances(b).await;
    agents_count_as_seen_until_a_ttl_after_they_leave(b).await;
    gitops_syncs_are_shared_and_kept_per_configured_project(b).await;
    gitops_syncs_expire_a_ttl_after_the_last_report(b).await;
    git_pushes_reach_every_instance(b).await;
    cluster_state_holders_are_shared_replaced_and_expire(b).await;
}

pub async fn register_list_unregister(b: &impl Backend) {
    let r = b.isolated(timing(LONG, LONG)).await;
    r.register(record(1, 10, 100)).await.unwrap();
    r.register(record(1, 10, 101)).await.unwrap();
    r.register(record(2, 10, 200)).await.unwrap();
    r.register(record(3, 11, 300)).await.unwrap();
    let by_agent = r.connections_by_agent_id(AgentId(1)).await.unwrap();
    assert_eq!(ids(&by_agent), vec![(1, 100), (1, 101)]);
    // Every field round-trips; the registry stamps its instance id and address.
    let mut expected = record(1, 10, 100);
    expected.kas_instance_id.clone_from(&r.instance().instance_id);
    expected.kas_address.clone_from(&r.instance().address);
    assert!(by_agent.contains(&expected), "{by_agent:?}");
    assert_eq!(ids(&r.connections_by_project_id(ProjectId(10)).await.unwrap()), vec![(1, 100), (1, 101), (2, 200)]);
    r.unregister(AgentId(1), ProjectId(10), ConnectionId(100)).await.unwrap();
    assert_eq!(ids(&r.connections_by_agent_id(AgentId(1)).await.unwrap()), vec![(1, 101)]);
    assert_eq!(ids(&r.connections_by_project_id(ProjectId(10)).await.unwrap()), vec![(1, 101), (2, 200)]);
    assert!(r.connections_by_agent_id(AgentId(99)).await.unwrap().is_empty());
    r.remove_all_owned().await.unwrap();
}

pub async fn records_survive_while_refreshed_and_expire_after(b: &impl Backend) {
    let r = b.isolated(timing(SHORT, LONG)).await;
    r.register(record(1, 10, 100)).await.unwrap();
    for _ in 0..4 {
        tokio::time::sleep(SHORT / 3).await;
        r.refresh().await.unwrap();
    }
    assert_eq!(r.connections_by_agent_id(AgentId(1)).await.unwrap().len(), 1, "refreshed record expired");
    tokio::time::sleep(SHORT * 2).await;
    assert!(r.connections_by_agent_id(AgentId(1)).await.unwrap().is_empty(), "record outlived its ttl");
    assert!(r.connections_by_project_id(ProjectId(10)).await.unwrap().is_empty());
    r.remove_all_owned().await.unwrap();
}

pub async fn gc_removes_expired(b: &impl Backend) {
    let r = b.isolated(timing(SHORT, LONG)).await;
    r.register(record(1, 10, 100)).await.unwrap();
    tokio::time::sleep(SHORT * 2).await;
    r.gc().await.unwrap();
    assert!(r.connections_by_agent_id(AgentId(1)).await.unwrap().is_empty());
    r.remove_all_owned().await.unwrap();
}

pub async fn isolation(b: &impl Backend) {
    let a = b.isolated(timing(LONG, LONG)).await;
    let other = b.isolated(timing(LONG, LONG)).await;
    a.register(record(1, 10, 100)).await.unwrap();
    assert!(other.connections_by_agent_id(AgentId(1)).await.unwrap().is_empty());
    a.remove_all_owned().await.unwrap();
}

pub async fn two_instances_see_each_other(b: &impl Backend) {
    let k1 = b.instance(timing(LONG, LONG)).await;
    let k2 = b.instance(timing(LONG, LONG)).await;
    k1.register(record(7, 70, 1)).await.unwrap();
    k2.register(record(7, 70, 2)).await.unwrap();
    let seen = k1.connections_by_agent_id(AgentId(7)).await.unwrap();
    assert_eq!(ids(&seen), vec![(7, 1), (7, 2)]);
    // Each record names the kas holding it.
    assert_eq!(seen[1].kas_instance_id, k2.instance().instance_id);
    assert_eq!(seen[1].kas_address, k2.instance().address);
    assert_eq!(ids(&k2.connections_by_project_id(ProjectId(70)).await.unwrap()), vec![(7, 1), (7, 2)]);
    k1.remove_all_owned().await.unwrap();
    k2.remove_all_owned().await.unwrap();
}

pub async fn records_of_a_dead_instance_are_ignored(b: &impl Backend) {
    let alive = b.instance(timing(LONG, SHORT)).await;
    let crashed = b.instance(timing(LONG, SHORT)).await;
    alive.register(record(6, 60, 1)).await.unwrap();
    crashed.register(record(6, 60, 2)).await.unwrap();
    // `alive` keeps heartbeating; `crashed` stops (as if the process died without cleanup).
    for _ in 0..6 {
        tokio::time::sleep(SHORT / 3).await;
        alive.heartbeat().await.unwrap();
    }
    assert_eq!(ids(&alive.connections_by_agent_id(AgentId(6)).await.unwrap()), vec![(6, 1)]);
    assert_eq!(ids(&alive.connections_by_project_id(ProjectId(60)).await.unwrap()), vec![(6, 1)]);
    // A heartbeat brings the instance (and its records, still within their TTL) back.
    crashed.heartbeat().await.unwrap();
    assert_eq!(ids(&alive.connections_by_agent_id(AgentId(6)).await.unwrap()), vec![(6, 1), (6, 2)]);
    alive.remove_all_owned().await.unwrap();
    crashed.remove_all_owned().await.unwrap();
}

pub async fn events_are_delivered(b: &impl Backend) {
    let k1 = b.instance(timing(LONG, LONG)).await;
    let k2 = b.instance(timing(LONG, LONG)).await;
    let mut events = k1.subscribe();
    // Backends may subscribe asynchronously: publish until the first event arrives.
    let connected = RegistryEvent::Connected { agent_id: AgentId(8), connection_id: ConnectionId(5) };
    let first = loop {
        k2.register(record(8, 80, 5)).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(200), events.recv()).await {
            Ok(ev) => break ev.unwrap(),
            Err(_) => continue,
        }
    };
    assert_eq!(first, connected);
    k2.unregister(AgentId(8), ProjectId(80), ConnectionId(5)).await.unwrap();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.recv()).await.expect("event").unwrap();
        if ev == connected {
            continue; // a repeated registration from the loop above
        }
        assert_eq!(ev, RegistryEvent::Disconnected { agent_id: AgentId(8), connection_id: ConnectionId(5) });
        break;
    }
    k1.remove_all_owned().await.unwrap();
    k2.remove_all_owned().await.unwrap();
}

pub async fn remove_all_owned_removes_only_own(b: &impl Backend) {
    let k1 = b.instance(timing(LONG, LONG)).await;
    let k2 = b.instance(timing(LONG, LONG)).await;
    k1.register(record(9, 90, 1)).await.unwrap();
    k2.register(record(9, 90, 2)).await.unwrap();
    k1.remove_all_owned().await.unwrap();
    assert_eq!(ids(&k2.connections_by_agent_id(AgentId(9)).await.unwrap()), vec![(9, 2)]);
    k2.remove_all_owned().await.unwrap();
    assert!(k2.connections_by_agent_id(AgentId(9)).await.unwrap().is_empty());
}

pub async fn connection_counts_are_shared_between_instances(b: &impl Backend) {
    let k1 = b.instance(timing(LONG, LONG)).await;
    let k2 = b.instance(timing(LONG, LONG)).await;
    let other = b.isolated(timing(LONG, LONG)).await;
    let agent = AgentId(rand::random::<i64>() & i64::MAX);
    let window = Duration::from_secs(3600);
    // Counted across kas (a window boundary between calls would restart the count: an hour-long
    // window makes that practically impossible here).
    let first = k1.count_connection(agent, window).await.unwrap().current;
    assert_eq!(k2.count_connection(agent, window).await.unwrap().current, first + 1);
    assert_eq!(k1.count_connection(agent, window).await.unwrap().current, first + 2);
    assert_eq!(other.count_connection(agent, window).await.unwrap().current, 1, "isolated stores count separately");
    assert_eq!(k1.count_connection(AgentId(agent.0 ^ 1), window).await.unwrap().current, 1, "per agent");
    // The previous window is reported too: with a 1 ms window, counts from a moment ago are in
    // the previous window or older, never in a later one.
    let tiny = Duration::from_millis(1);
    let counts = k1.count_connection(AgentId(agent.0 ^ 2), tiny).await.unwrap();
    assert!(counts.current >= 1 && (0.0..1.0).contains(&counts.elapsed), "{counts:?}");
}

/// `seen_recently`: connected (on any kas), or left less than a record TTL ago (one connection
/// unregistered, or a whole kas shut down); never seen or long gone is not seen.
pub async fn agents_count_as_seen_until_a_ttl_after_they_leave(b: &impl Backend) {
    let k1 = b.instance(timing(SHORT, LONG)).await;
    let k2 = b.instance(timing(SHORT, LONG)).await;
    assert!(!k2.seen_recently(AgentId(81)).await.unwrap(), "never connected");
    k1.register(record(81, 80, 1)).await.unwrap();
    k1.register(record(82, 90, 1)).await.unwrap();
    assert!(k2.seen_recently(AgentId(81)).await.unwrap(), "connected to another kas");
    k1.unregister(AgentId(81), ProjectId(80), ConnectionId(1)).await.unwrap();
    assert!(k2.seen_recently(AgentId(81)).await.unwrap(), "left a moment ago");
    k1.remove_all_owned().await.unwrap();
    assert!(k2.seen_recently(AgentId(82)).await.unwrap(), "its kas shut down a moment ago");
    assert!(!k2.seen_recently(AgentId(83)).await.unwrap(), "another agent");
    tokio::time::sleep(SHORT * 2).await;
    assert!(!k2.seen_recently(AgentId(81)).await.unwrap(), "left more than a TTL ago");
    assert!(!k2.seen_recently(AgentId(82)).await.unwrap(), "its kas left more than a TTL ago");
    k2.remove_all_owned().await.unwrap();
}

/// A sync report of `project` at `git_ref` (commit `n` repeated, so reports are told apart).
pub fn sync(project: &str, git_ref: &str, n: u32) -> GitopsSync {
    GitopsSync {
        report: Some(SyncReport {
            project_id: project.into(),
            r#ref: git_ref.into(),
            commit_id: format!("{n:040x}"),
            dry_run_strategy: "none".into(),
            applied: n,
            ..Default::default()
        }),
        received_at: Some(prost_types::Timestamp { seconds: 1_700_000_000 + i64::from(n), nanos: 0 }),
        kas_instance_id: format!("kas-{n}"),
    }
}

fn key(project: &str, git_ref: &str) -> ManifestProjectKey {
    ManifestProjectKey { project_id: project.into(), git_ref: git_ref.into() }
}

/// Applied counts of the stored syncs by (project, ref), sorted.
fn applied(record: &kas::registry::GitopsStatusRecord) -> Vec<(String, String, u32)> {
    let mut v: Vec<_> = record
        .syncs
        .iter()
        .map(|s| {
            let r = s.report.as_ref().unwrap();
            (r.project_id.clone(), r.r#ref.clone(), r.applied)
        })
        .collect();
    v.sort();
    v
}

/// The last report per manifest project and ref, written by one kas and read by another, every
/// field intact; a later report replaces it; reports of projects no longer configured go.
pub async fn gitops_syncs_are_shared_and_kept_per_configured_project(b: &impl Backend) {
    let k1 = b.instance(timing(LONG, LONG)).await;
    let k2 = b.instance(timing(LONG, LONG)).await;
    let other = b.isolated(timing(LONG, LONG)).await;
    let agent = AgentId(rand::random::<i64>() & i64::MAX);
    assert_eq!(k2.gitops_status(agent).await.unwrap(), Default::default(), "nothing before the first report");
    let configured = [key("group/a", ""), key("group/a", "branch:stable"), key("/srv/git/b.git", "tag:v1")];
    k1.put_gitops_sync(agent, sync("group/a", "", 1), &configured, LONG).await.unwrap();
    k2.put_gitops_sync(agent, sync("group/a", "branch:stable", 2), &configured, LONG).await.unwrap();
    let record = k2.gitops_status(agent).await.unwrap();
    assert_eq!(record.configured, configured);
    assert_eq!(record.sync(&key("group/a", "")), Some(&sync("group/a", "", 1)), "every field round-trips");
    assert_eq!(applied(&record), [("group/a".into(), "".into(), 1), ("group/a".into(), "branch:stable".into(), 2)]);
    assert_eq!(record.sync(&key("/srv/git/b.git", "tag:v1")), None);
    // The next report of a project replaces its last one.
    k2.put_gitops_sync(agent, sync("group/a", "", 3), &configured, LONG).await.unwrap();
    let record = k1.gitops_status(agent).await.unwrap();
    assert_eq!(applied(&record), [("group/a".into(), "".into(), 3), ("group/a".into(), "branch:stable".into(), 2)]);
    // The configuration dropped a project: its report goes with the next report.
    let fewer = [key("group/a", ""), key("/srv/git/b.git", "tag:v1")];
    k1.put_gitops_sync(agent, sync("/srv/git/b.git", "tag:v1", 4), &fewer, LONG).await.unwrap();
    let record = k2.gitops_status(agent).await.unwrap();
    assert_eq!(record.configured, fewer);
    assert_eq!(applied(&record), [("/srv/git/b.git".into(), "tag:v1".into(), 4), ("group/a".into(), "".into(), 3)]);
    assert_eq!(other.gitops_status(agent).await.unwrap(), Default::default(), "isolated stores see nothing");
    assert_eq!(k1.gitops_status(AgentId(agent.0 ^ 1)).await.unwrap(), Default::default(), "per agent");
}

/// An agent's reports live `ttl` after its last report: each report renews all of them.
pub async fn gitops_syncs_expire_a_ttl_after_the_last_report(b: &impl Backend) {
    let k1 = b.instance(timing(LONG, LONG)).await;
    let agent = AgentId(rand::random::<i64>() & i64::MAX);
    let configured = [key("group/a", ""), key("group/b", "")];
    k1.put_gitops_sync(agent, sync("group/a", "", 1), &configured, SHORT).await.unwrap();
    for n in 0..4 {
        tokio::time::sleep(SHORT / 3).await;
        k1.put_gitops_sync(agent, sync("group/b", "", n), &configured, SHORT).await.unwrap();
    }
    assert_eq!(applied(&k1.gitops_status(agent).await.unwrap()).len(), 2, "renewed by the other project's reports");
    tokio::time::sleep(SHORT * 2).await;
    assert_eq!(k1.gitops_status(agent).await.unwrap(), Default::default(), "outlived its ttl");
}

/// A push published by one kas reaches every kas sharing the store (itself included), not others.
pub async fn git_pushes_reach_every_instance(b: &impl Backend) {
    let k1 = b.instance(timing(LONG, LONG)).await;
    let k2 = b.instance(timing(LONG, LONG)).await;
    let other = b.isolated(timing(LONG, LONG)).await;
    let (mut at_k1, mut at_k2, mut at_other) =
        (k1.subscribe_git_pushes(), k2.subscribe_git_pushes(), other.subscribe_git_pushes());
    let project = git_push_event::Project { id: 7, full_path: format!("group/{}", rand::random::<u32>()) };
    // Backends may subscribe asynchronously: publish until the first push arrives.
    let first = loop {
        k2.publish_git_push(project.clone()).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(200), at_k1.recv()).await {
            Ok(push) => break push.unwrap(),
            Err(_) => continue,
        }
    };
    assert_eq!(first.project, project);
    assert!(first.received_at <= tokio::time::Instant::now());
    let at_publisher = tokio::time::timeout(Duration::from_secs(5), at_k2.recv()).await.expect("push").unwrap();
    assert_eq!(at_publisher.project, project);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), at_other.recv()).await.is_err(),
        "an isolated store got the push"
    );
}

/// The kas holding an agent's cluster state is seen by every kas sharing the store; the last to
/// say it wins; the claim ends with its ttl.
pub async fn cluster_state_holders_are_shared_replaced_and_expire(b: &impl Backend) {
    let k1 = b.instance(timing(LONG, LONG)).await;
    let k2 = b.instance(timing(LONG, LONG)).await;
    let other = b.isolated(timing(LONG, LONG)).await;
    let agent = AgentId(rand::random::<i64>() & i64::MAX);
    assert_eq!(k1.cluster_state_holder(agent).await.unwrap(), None);
    k1.put_cluster_state_holder(agent, LONG).await.unwrap();
    let holder = k2.cluster_state_holder(agent).await.unwrap().expect("k2 sees k1's claim");
    assert_eq!(holder.instance_id, k1.instance().instance_id);
    assert_eq!(holder.address, k1.instance().address, "with its internal address");
    k2.put_cluster_state_holder(agent, SHORT).await.unwrap();
    let holder = k1.cluster_state_holder(agent).await.unwrap().expect("k2's claim");
    assert_eq!(holder.instance_id, k2.instance().instance_id, "the last claim wins");
    assert_eq!(other.cluster_state_holder(agent).await.unwrap(), None, "isolated stores see nothing");
    tokio::time::sleep(SHORT * 2).await;
    assert_eq!(k1.cluster_state_holder(agent).await.unwrap(), None, "outlived its ttl");
}
