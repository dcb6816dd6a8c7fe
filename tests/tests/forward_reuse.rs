//! Kept forwarded streams (issue 14): through a second kas, a `ForwardTunnel` stream whose
//! exchange ended cleanly carries the next request to the same agent connection. Its own test
//! binary: it compares process-wide counters (`kas_forwards_reused_total`,
//! `kas_tunnels_reused_total`) that other tests would move.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kas_e2e::{Cluster, eventually};

const PODS: &str = "/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods";

async fn reused(c: &Cluster, kas: usize) -> u64 {
    c.counter(kas, "kas_tunnels_reused_total").await
}

async fn get_pods(c: &Cluster, kas: usize) -> String {
    c.rest_get_ok(kas, PODS).await
}

/// `kas_forwards_reused_total` (counted by the routing kas).
async fn forwards_reused(c: &Cluster, kas: usize) -> u64 {
    c.counter(kas, "kas_forwards_reused_total").await
}

/// Through a second kas, a `ForwardTunnel` stream whose exchange ended cleanly carries the next
/// request to the same agent connection; an abandoned request on a reused stream still reaches
/// the API server as a cancellation; when the agent's connection moves, requests follow it.
#[tokio::test]
async fn requests_through_a_second_kas_reuse_forwarded_streams() {
    let c = Cluster::builder().redis().kas(2).start().await;
    c.kube.add_pod("default", "web-1");
    let agentk = c.start_agentk(1, 0, "agentk-0").await;
    assert!(get_pods(&c, 1).await.contains("web-1"));
    let first = forwards_reused(&c, 1).await;
    for _ in 0..10 {
        assert!(get_pods(&c, 1).await.contains("web-1"));
    }
    let kube = &c;
    eventually!(forwards_reused(kube, 1).await >= first + 9, "reused {}", forwards_reused(kube, 1).await);
    // Each reused exchange also put agentk's tunnel back on kas 0.
    let tunnels_before = reused(&c, 0).await;
    let forwards_before = forwards_reused(&c, 1).await;
    assert!(get_pods(&c, 1).await.contains("web-1"));
    eventually!(reused(kube, 0).await > tunnels_before, "agentk's tunnel was not put back on kas 0");
    assert!(forwards_reused(&c, 1).await > forwards_before, "the request did not take a kept stream");

    // A `logs -f` on a kept stream, abandoned mid-response: the API server request ends.
    let fake = c.kube.clone();
    let forwards_before = forwards_reused(&c, 1).await;
    let follow = reqwest::Client::new()
        .get(format!("{}{PODS}/web-1/log?follow=true", c.rest_url(1)))
        .bearer_auth(c.gitlab_jwt())
        .send()
        .await
        .unwrap();
    assert_eq!(follow.status(), 200);
    assert_eq!(forwards_reused(&c, 1).await, forwards_before + 1, "logs -f did not take a kept stream");
    eventually!(fake.log_followers() == 1, "the API server streams the log");
    drop(follow);
    eventually!(fake.log_followers() == 0, "the abandoned logs -f ended at the API server");

    // agentk restarts (a new connection on kas 0): the kept streams of the old connection end,
    // and every request after the new connection registered succeeds.
    let old = agentk.connection_id();
    agentk.stop().await;
    let agentk = c.start_agentk(1, 0, "agentk-0").await;
    eventually!(
        c.connections(1, 1)
            .await
            .iter()
            .any(|i| Some(i.connection_id) == agentk.connection_id() && Some(i.connection_id) != old)
    );
    for _ in 0..10 {
        assert!(get_pods(&c, 1).await.contains("web-1"));
    }
}
