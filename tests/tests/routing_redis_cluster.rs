//! kas replicas sharing a real Redis Cluster (three masters): a request reaches the agent through
//! the kas holding it, in both directions between a kas in this process and a real kas process
//! (which reads `registry.redis.cluster_nodes` from its config file); a waiting request is woken by
//! the sharded events channel; a master restarting empty costs about a second of cross-kas routing.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use kas_e2e::process::start_kas_with_config;
use kas_e2e::{Cluster, authorized, eventually};
use kas_proto::kas::kas_api_client::KasApiClient;
use kas_proto::kas::{ConnectedAgentsByIdRequest, GetPodsRequest};

fn get_pods(agent_id: i64, connection_id: i64) -> GetPodsRequest {
    GetPodsRequest { agent_id, connection_id }
}

#[tokio::test]
async fn requests_cross_kas_both_ways_between_a_kas_process_and_an_in_process_kas() {
    let c = Cluster::builder().redis_cluster().agents(&[(1, 10), (2, 20)]).kas(1).start().await;
    assert!(!c.config.registry.redis.as_ref().unwrap().cluster_nodes.is_empty());
    c.kube.add_pod("default", "p");
    // kas B: a real process with the same configuration (cluster nodes included), in YAML.
    let b = start_kas_with_config(&c.config.clone().with_ephemeral_ports(), c.dir.path()).await;
    // Agent 1 on kas A (in-process), agent 2 on kas B.
    let _on_a = c.start_agentk(1, 0, "agentk-on-a").await;
    let mut on_b = c.agentk_config(2, 0, "agentk-on-b");
    on_b.kas_address = format!("grpc://{}", b.addresses.agent);
    let on_b = c.start_agentk_with(on_b).await;
    on_b.ready().await;

    // Through kas B to agent 1 on kas A.
    let mut api_b = KasApiClient::new(kas_e2e::cluster::channel(b.addresses.api));
    let jwt = c.gitlab_jwt();
    let pods = api_b.get_pods(authorized(get_pods(1, 0), &jwt)).await.expect("kas B -> kas A").into_inner().pods;
    assert_eq!(pods.len(), 1);
    // Through kas A to agent 2 on kas B.
    let pods = c.api(0).get_pods(get_pods(2, 0)).await.expect("kas A -> kas B").into_inner().pods;
    assert_eq!(pods.len(), 1);
    // Each kas lists the other's connection, with the address of the kas holding it.
    let agents = c.connections(0, 2).await;
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert_eq!(agents[0].kas_instance_id, b.instance_id);
    assert_eq!(agents[0].kas_address.as_ref().unwrap().port, u32::from(b.addresses.internal.port()));
    let request = ConnectedAgentsByIdRequest { agent_id: 1 };
    let agents = api_b.connected_agents_by_id(authorized(request, &jwt)).await.unwrap().into_inner().agents;
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert_eq!(agents[0].kas_instance_id, c.kas[0].instance_id());
}

#[tokio::test]
async fn a_waiting_request_is_woken_by_the_sharded_events_channel() {
    let c = Cluster::builder().redis_cluster().kas(2).start().await;
    c.kube.add_pod("default", "late");
    let mut api = c.api(0);
    let call = tokio::spawn(async move { api.get_pods(get_pods(1, 0)).await });
    let handle = c.kas[0].handle.clone();
    eventually!(handle.tunnel_stats().await.is_some_and(|s| s.waiting_requests == 1), "request parked on kas 0");

    let started = Instant::now();
    let _a = c.start_agentk(1, 1, "agentk-0").await;
    let resp = call.await.unwrap().expect("served via kas 1 once the agent connected").into_inner();
    assert_eq!(resp.pods.len(), 1);
    // Woken by the Connected event, not by the slow fallback re-scan (5 s).
    assert!(started.elapsed() < Duration::from_secs(4), "took {:?}", started.elapsed());
}

/// The master holding the agent's record crashes and restarts empty (no replica, no
/// persistence): a request parked meanwhile on the other kas is served within a second or so of
/// the master serving again (the holding kas rewrites its records at once and announces them),
/// not at the next refresh (60 s here).
#[tokio::test]
async fn cross_kas_routing_recovers_quickly_when_a_master_restarts_empty() {
    let mut c = Cluster::builder()
        .redis_cluster()
        .kas(2)
        .configure(|config, _| {
            config.registry.refresh_period = kas::config::DEFAULT_REGISTRY_REFRESH;
            config.registry.ttl = kas::config::DEFAULT_REGISTRY_TTL;
            config.registry.heartbeat_period = kas::config::DEFAULT_HEARTBEAT_PERIOD;
            config.registry.heartbeat_ttl = kas::config::DEFAULT_HEARTBEAT_TTL;
        })
        .start()
        .await;
    c.kube.add_pod("default", "p");
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let listed = |c: &Cluster| {
        let mut api = c.api(1);
        async move {
            matches!(api.connected_agents_by_id(ConnectedAgentsByIdRequest { agent_id: 1 }).await, Ok(r) if r.get_ref().agents.len() == 1)
        }
    };
    eventually!(listed(&c).await, "kas 1 sees the agent on kas 0");

    let prefix = c.config.registry.redis.as_ref().unwrap().key_prefix.clone();
    let cluster = c.redis_cluster.as_mut().unwrap();
    let node = cluster.node_serving(&format!("{prefix}:agent:{{1}}")).await;
    cluster.stop_node(node).await;
    eventually!(
        c.api(1).connected_agents_by_id(ConnectedAgentsByIdRequest { agent_id: 1 }).await.is_err(),
        "kas 1 cannot read the agent's record"
    );
    let mut api = c.api(1);
    let waiting = tokio::spawn(async move {
        let mut req = tonic::Request::new(get_pods(1, 0));
        req.set_timeout(Duration::from_secs(15));
        let r = api.get_pods(req).await;
        (r, Instant::now())
    });
    let handle = c.kas[1].handle.clone();
    eventually!(handle.tunnel_stats().await.is_some_and(|s| s.waiting_requests == 1), "request parked on kas 1");

    let restarted = Instant::now();
    // A restarted master refuses requests (CLUSTERDOWN) for its first 2 s, to learn of changes
    // made while it was away (Redis's CLUSTER_WRITABLE_DELAY): this returns after that.
    c.redis_cluster.as_mut().unwrap().start_node_again(node).await;
    let serving = Instant::now();
    let (result, served_at) = waiting.await.unwrap();
    let waited = served_at.saturating_duration_since(serving);
    eprintln!(
        "waiting request served {:?} after the master was restarted, {waited:?} after it served again",
        served_at - restarted
    );
    result.expect("the waiting request is served once the master is back");
    // Slack for a loaded machine; what this tells apart is the next refresh (60 s).
    assert!(waited < Duration::from_secs(2), "waiting request served {waited:?} after the master served again");
    eventually!(listed(&c).await, "kas 1 lists the agent again");
}
