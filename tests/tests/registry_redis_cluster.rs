//! The registry conformance suite against a real Redis Cluster (three masters, started by the
//! harness), and what is particular to a cluster: hash-tagged keys, a refresh costing one round
//! trip per master, a master restarting empty, the whole cluster down at start.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kas::registry::redis::{RedisConfig, RedisRegistry};
use kas::registry::{AgentRegistry, ManifestProjectKey, RegistryEvent, RegistryTiming};
use kas_e2e::redis_server::CLUSTER_MASTERS;
use kas_e2e::registry_conformance::{self as conformance, Backend};
use kas_e2e::{RedisCluster, eventually};
use kas_proto::{AgentId, ProjectId};

struct Cluster {
    urls: Vec<String>,
    prefix: String,
}

fn registry(urls: &[String], prefix: &str, timing: RegistryTiming) -> RedisRegistry {
    let mut config = RedisConfig::cluster(urls.iter().cloned());
    config.key_prefix = prefix.to_owned();
    RedisRegistry::new(&config, conformance::instance_info(), timing).unwrap()
}

impl Backend for Cluster {
    async fn instance(&self, timing: RegistryTiming) -> Arc<dyn AgentRegistry> {
        let r = registry(&self.urls, &self.prefix, timing);
        assert!(r.is_cluster());
        r.heartbeat().await.unwrap();
        Arc::new(r)
    }

    async fn isolated(&self, timing: RegistryTiming) -> Arc<dyn AgentRegistry> {
        let r = registry(&self.urls, &format!("isolated-{}", rand::random::<u32>()), timing);
        r.heartbeat().await.unwrap();
        Arc::new(r)
    }
}

const LONG: RegistryTiming = RegistryTiming { ttl: Duration::from_secs(60), heartbeat_ttl: Duration::from_secs(60) };

#[tokio::test]
async fn conformance_against_a_real_redis_cluster() {
    let cluster = RedisCluster::start().await;
    conformance::run_all(&Cluster { urls: cluster.urls(), prefix: "conformance".into() }).await;
}

#[tokio::test]
async fn a_refresh_is_one_round_trip_per_master_whatever_the_number_of_connections() {
    let cluster = RedisCluster::start().await;
    for n in [1, 100, 2000] {
        let r = registry(&cluster.urls(), &format!("rt-{n}"), LONG);
        for i in 0..n {
            r.register(conformance::record(1 + i, 10_000 + i % 7, 1000 + i)).await.unwrap();
        }
        let before = r.round_trips();
        let started = std::time::Instant::now();
        r.refresh().await.unwrap();
        let took = started.elapsed();
        let round_trips = r.round_trips() - before;
        eprintln!("refresh of {n} connections on the cluster: {round_trips} round trips, {took:?}");
        // Agents' keys spread over every master as soon as there are a few of them.
        let expected = if n == 1 { 2 } else { CLUSTER_MASTERS as u64 };
        assert!(round_trips <= expected, "{n} connections: {round_trips} round trips");
        if n > 1 {
            assert_eq!(round_trips, expected, "{n} connections");
        }
        r.heartbeat().await.unwrap();
        assert_eq!(r.connections_by_agent_id(AgentId(n)).await.unwrap().len(), 1);
    }
}

/// Every key of an agent shares its slot (so each transaction on them is legal), and the agents
/// of a registry spread over every master (the cluster is used, not one node of it).
#[tokio::test]
async fn an_agents_keys_share_a_slot_and_agents_spread_over_the_masters() {
    let cluster = RedisCluster::start().await;
    let timing = RegistryTiming { ttl: Duration::from_secs(60), heartbeat_ttl: Duration::from_secs(60) };
    let r = registry(&cluster.urls(), "slots", timing);
    r.heartbeat().await.unwrap();
    for agent in 1..=30 {
        r.register(conformance::record(agent, 500 + agent % 3, agent * 10)).await.unwrap();
    }
    // Every kind of per-agent key for agent 7.
    r.unregister(AgentId(7), ProjectId(501), kas_proto::ConnectionId(70)).await.unwrap();
    r.register(conformance::record(7, 501, 71)).await.unwrap();
    r.count_connection(AgentId(7), Duration::from_secs(60)).await.unwrap();
    r.put_gitops_sync(AgentId(7), conformance::sync("group/a", "", 1), &[key("group/a")], Duration::from_secs(60))
        .await
        .unwrap();
    r.put_cluster_state_holder(AgentId(7), Duration::from_secs(60)).await.unwrap();

    let mut keys = Vec::new();
    let mut masters_with_records = 0;
    for node in 0..CLUSTER_MASTERS {
        let on_node = cluster.node_keys(node, "slots:*").await;
        masters_with_records += usize::from(on_node.iter().any(|k| k.starts_with("slots:agent:")));
        keys.extend(on_node);
    }
    assert_eq!(masters_with_records, CLUSTER_MASTERS, "agents' records on every master: {keys:?}");
    let agent_keys: Vec<&String> = keys.iter().filter(|k| k.contains("{7}")).collect();
    let kinds: BTreeSet<&str> = agent_keys.iter().map(|k| k.split(':').nth(1).unwrap()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["agent", "cluster_state", "conn-rate", "gitops", "seen"]),
        "every kind of agent key, tagged with the agent id: {agent_keys:?}"
    );
    let mut slots = BTreeSet::new();
    for k in &agent_keys {
        slots.insert(cluster.key_slot(k).await);
    }
    assert_eq!(slots.len(), 1, "{agent_keys:?} in slots {slots:?}");
    // Heartbeats share one slot too (one request checks those behind a record list).
    let heartbeats: Vec<&String> = keys.iter().filter(|k| k.starts_with("slots:kas:{instances}:")).collect();
    assert_eq!(heartbeats.len(), 1, "{keys:?}");
}

fn key(project: &str) -> ManifestProjectKey {
    ManifestProjectKey { project_id: project.into(), git_ref: String::new() }
}

/// A master restarts empty (no persistence, no replica): the kas whose records lived there
/// rewrites them without waiting for a refresh, and its local waiters are told to look again.
#[tokio::test]
async fn a_master_restarting_empty_gets_its_records_back_and_waiters_look_again() {
    let mut cluster = RedisCluster::start().await;
    let urls = cluster.urls();
    let holder = registry(&urls, "restart", LONG);
    let reader = registry(&urls, "restart", LONG);
    holder.heartbeat().await.unwrap();
    reader.heartbeat().await.unwrap();
    for agent in 1..=30 {
        holder.register(conformance::record(agent, 900 + agent, agent)).await.unwrap();
    }
    let node = cluster.node_serving("restart:agent:{1}").await;
    // A key nobody rewrites: gone after the restart shows the node came back empty.
    let mut marker = 100;
    while cluster.node_serving(&format!("restart:gitops:{{{marker}}}")).await != node {
        marker += 1;
    }
    holder.put_gitops_sync(AgentId(marker), conformance::sync("g/p", "", 1), &[key("g/p")], LONG.ttl).await.unwrap();
    let mut events = holder.subscribe();

    cluster.restart_node(node).await;
    let restarted = std::time::Instant::now();
    eventually!(
        reader.gitops_status(AgentId(marker)).await.is_ok_and(|s| s == Default::default()),
        "the master came back empty"
    );
    for agent in 1..=30 {
        eventually!(
            reader.connections_by_agent_id(AgentId(agent)).await.is_ok_and(|c| c.len() == 1),
            "agent {agent}'s record back after the restart"
        );
    }
    eprintln!("records back {:?} after the master restarted", restarted.elapsed());
    // Not the 60 s refresh: the resync.
    assert!(restarted.elapsed() < Duration::from_secs(10), "took {:?}", restarted.elapsed());
    let resynced = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(RegistryEvent::Resynced) = events.recv().await {
                return;
            }
        }
    })
    .await;
    assert!(resynced.is_ok(), "no Resynced event after the master came back");
}

/// The master serving the events channel restarts: the subscription follows (redis-rs
/// subscribes again on the new connection), events flow again, and waiters are told to look again
/// (events published meanwhile are lost).
#[tokio::test]
async fn events_flow_again_after_the_master_serving_their_channel_restarts() {
    let mut cluster = RedisCluster::start().await;
    let urls = cluster.urls();
    let listener = registry(&urls, "events", LONG);
    let publisher = registry(&urls, "events", LONG);
    let mut events = listener.subscribe();
    let delivered = |events: &mut tokio::sync::broadcast::Receiver<RegistryEvent>, wanted: RegistryEvent| {
        let mut seen = false;
        while let Ok(ev) = events.try_recv() {
            seen |= ev == wanted;
        }
        seen
    };
    let connected = |c| RegistryEvent::Connected { agent_id: AgentId(1), connection_id: kas_proto::ConnectionId(c) };
    eventually!(
        {
            publisher.register(conformance::record(1, 10, 1)).await.unwrap();
            delivered(&mut events, connected(1))
        },
        "an event before the restart"
    );

    cluster.restart_node(cluster.node_serving("events:events:{pubsub}").await).await;
    let mut resynced = false;
    eventually!(
        {
            let _ = publisher.register(conformance::record(1, 10, 2)).await;
            let mut seen = false;
            while let Ok(ev) = events.try_recv() {
                seen |= ev == connected(2);
                resynced |= ev == RegistryEvent::Resynced;
            }
            seen
        },
        "an event after the restart"
    );
    eventually!(resynced || delivered(&mut events, RegistryEvent::Resynced), "waiters told to look again");
}

/// kas starts while the whole cluster is down: calls fail with a clear error; once the cluster is
/// back, a refresh writes what failed, and events flow (the first subscription is made late).
#[tokio::test]
async fn a_registry_made_while_the_cluster_is_down_catches_up_when_it_is_back() {
    let mut cluster = RedisCluster::start().await;
    cluster.stop_all().await;
    let urls = cluster.urls();
    let r = registry(&urls, "down", LONG);
    let err = r.register(conformance::record(1, 10, 100)).await.unwrap_err();
    assert!(err.to_string().starts_with("redis"), "{err}");
    assert!(r.ping().await.is_err());
    let mut events = r.subscribe();

    cluster.start_all_again().await;
    eventually!(r.refresh().await.is_ok(), "refresh succeeds once the cluster is back");
    r.heartbeat().await.unwrap();
    assert_eq!(r.connections_by_agent_id(AgentId(1)).await.unwrap().len(), 1);
    r.ping().await.unwrap();
    // Another kas's registration reaches this one's subscribers.
    let other = registry(&urls, "down", LONG);
    other.heartbeat().await.unwrap();
    let connected = RegistryEvent::Connected { agent_id: AgentId(2), connection_id: kas_proto::ConnectionId(200) };
    eventually!(
        {
            other.register(conformance::record(2, 20, 200)).await.unwrap();
            let mut seen = false;
            while let Ok(ev) = events.try_recv() {
                seen |= ev == connected;
            }
            seen
        },
        "an event from another kas after the cluster came back"
    );
}

#[tokio::test]
async fn bad_cluster_settings_are_refused_by_name() {
    let refused =
        |config: RedisConfig| RedisRegistry::new(&config, conformance::instance_info(), LONG).unwrap_err().to_string();
    let err = refused(RedisConfig::cluster(["unix:///run/redis.sock"]));
    assert!(err.contains("registry.redis.cluster_nodes") && err.contains("over TCP"), "{err}");
    let err = refused(RedisConfig::cluster(["redis://a:6379", "rediss://b:6379"]));
    assert!(err.contains("mixes redis:// and rediss://"), "{err}");
    let err = refused(RedisConfig::cluster(["redis://a:6379/2"]));
    assert!(err.contains("database 2"), "{err}");
    let mut both = RedisConfig::cluster(["redis://a:6379"]);
    both.url = Some("redis://b:6379".into());
    assert!(refused(both).contains("not both"));
    let mut braces = RedisConfig::cluster(["redis://a:6379"]);
    braces.key_prefix = "kas{x}".into();
    let err = refused(braces);
    assert!(err.contains("registry.redis.key_prefix"), "{err}");
    // A prefix with braces stays fine on one server (keys are not tagged there).
    let mut server = RedisConfig::new("redis://a:6379");
    server.key_prefix = "kas{x}".into();
    RedisRegistry::new(&server, conformance::instance_info(), LONG).unwrap();
}
