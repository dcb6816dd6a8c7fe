//! Reusable tunnels (issue 14): an agentk tunnel whose exchange ended cleanly goes back to kas's
//! idle pool and carries the next request, instead of agentk opening a stream per request; one
//! that did not end cleanly is never reused, and requests keep working either way.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kas_e2e::{Cluster, eventually};

const PODS: &str = "/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods";

/// `kas_tunnels_reused_total` of kas number `kas` (0 before the first reuse). One recorder per
/// process: every kas of this test binary counts into it (forwarded streams are tested in
/// `forward_reuse.rs`, their own binary, for that reason).
async fn reused(c: &Cluster, kas: usize) -> u64 {
    c.counter(kas, "kas_tunnels_reused_total").await
}

async fn get_pods(c: &Cluster, kas: usize) -> String {
    c.rest_get_ok(kas, PODS).await
}

#[tokio::test]
async fn sequential_requests_reuse_tunnels_through_one_kas_and_through_a_second() {
    let c = Cluster::builder().redis().kas(2).start().await;
    c.kube.add_pod("default", "web-1");
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    assert_eq!(reused(&c, 0).await, 0);
    for _ in 0..20 {
        assert!(get_pods(&c, 0).await.contains("web-1"));
    }
    // Each exchange ended cleanly: its tunnel went back (the last one may still be on its way).
    let kube = &c;
    eventually!(reused(kube, 0).await >= 19, "reused {}", reused(kube, 0).await);
    // Through kas 1: kas 0 holds agentk's tunnels and reuses them after relaying.
    let before = reused(&c, 0).await;
    for _ in 0..10 {
        assert!(get_pods(&c, 1).await.contains("web-1"));
    }
    eventually!(reused(kube, 0).await >= before + 9, "reused {}", reused(kube, 0).await);
    // A request with a body (create) half-closes after it, and its tunnel is reused too.
    let before = reused(&c, 0).await;
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "created"}});
    let created = reqwest::Client::new()
        .post(format!("{}{PODS}", c.rest_url(0)))
        .bearer_auth(c.gitlab_jwt())
        .json(&pod)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    assert!(get_pods(&c, 0).await.contains("created"));
    eventually!(reused(kube, 0).await >= before + 2, "reused {}", reused(kube, 0).await);

    // A `logs -f` the caller abandons mid-response: kas drops its tunnel (agentk cancels the
    // API server request) and never puts it back.
    let before = reused(&c, 0).await;
    let fake = c.kube.clone();
    let follow = reqwest::Client::new()
        .get(format!("{}{PODS}/web-1/log?follow=true", c.rest_url(0)))
        .bearer_auth(c.gitlab_jwt())
        .send()
        .await
        .unwrap();
    assert_eq!(follow.status(), 200);
    eventually!(fake.log_followers() == 1, "the API server streams the log");
    drop(follow);
    eventually!(fake.log_followers() == 0, "the abandoned logs -f ended at the API server");
    assert_eq!(reused(&c, 0).await, before, "the abandoned exchange's tunnel was not reused");
    for _ in 0..5 {
        assert!(get_pods(&c, 0).await.contains("web-1"));
    }
    eventually!(reused(kube, 0).await >= before + 4, "reused {}", reused(kube, 0).await);
    assert!(reused(&c, 0).await <= before + 5, "reused {}", reused(&c, 0).await);
}
