//! kas's data plane (`connections.data_plane_threads`): whatever the number of threads (0 keeps
//! connections on kas's runtime; the other tests run the default, one), the Kubernetes API
//! proxy (REST and gRPC, through one kas and through a second) and the routes that run their
//! handlers off the data plane behave the same (the refused values: `config.rs`'s tests).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kas_e2e::Cluster;
use kas_proto::kas::GetPodsRequest;

async fn served_with(threads: usize) {
    let c = Cluster::builder()
        .redis()
        .kas(2)
        .configure(move |config, _| config.connections.data_plane_threads = threads)
        .start()
        .await;
    c.kube.add_pod("default", "p");
    let _a = c.start_agentk(1, 1, "agentk-0").await;
    let jwt = c.gitlab_jwt();
    let http = reqwest::Client::new();
    for kas in [1, 0] {
        // Several requests, on several connections: with two threads they take both.
        for _ in 0..4 {
            let url = format!("{}/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods/p", c.rest_url(kas));
            let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
            let resp = client.get(&url).bearer_auth(&jwt).send().await.unwrap();
            assert_eq!(resp.status(), 200, "threads {threads}, kas {kas}");
            let pod: serde_json::Value = resp.json().await.unwrap();
            assert_eq!(pod["metadata"]["name"], "p", "threads {threads}, kas {kas}: {pod}");
        }
        // A route whose handler runs off the data plane (when there is one).
        let resp = http
            .get(format!("{}/api/v1/agents/1/connections", c.rest_url(kas)))
            .bearer_auth(&jwt)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "threads {threads}, kas {kas}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["connections"].as_array().map(Vec::len), Some(1), "threads {threads}, kas {kas}: {body}");
        // gRPC (the api listener) too.
        let pods = c.api(kas).get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap().into_inner();
        assert_eq!(pods.pods.len(), 1, "threads {threads}, kas {kas}");
    }
    // An unknown path is still problem+json from the layers around every route.
    let resp = http.get(format!("{}/api/v1/nothing", c.rest_url(0))).bearer_auth(&jwt).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn connections_on_kas_runtime() {
    served_with(0).await;
}

#[tokio::test]
async fn connections_on_two_data_plane_threads() {
    served_with(2).await;
}
