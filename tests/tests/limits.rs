//! Concurrency limits per kas and per agent: a clear RESOURCE_EXHAUSTED / 429 when reached, and
//! a streaming request holds its slot for as long as it streams.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kas_e2e::{Cluster, eventually};
use kas_proto::kas::{GetPodsRequest, KubernetesRequest};
use kas_proto::kubernetes_api::{HttpFrame, HttpRequestHead, http_frame};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// Opens a watch through KasApi and waits for its response head; the watch streams until dropped.
async fn open_watch(c: &Cluster, agent_id: i64) -> (mpsc::Sender<KubernetesRequest>, tonic::Streaming<HttpFrame>) {
    let (tx, rx) = mpsc::channel(4);
    let head =
        HttpRequestHead { method: "GET".into(), path: "/api/v1/pods?watch=1".into(), headers: Default::default() };
    tx.send(KubernetesRequest { agent_id, connection_id: 0, frame: Some(HttpFrame::request_head(head)) })
        .await
        .unwrap();
    let mut frames = c.api(0).make_kubernetes_request(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let first = frames.message().await.unwrap().unwrap();
    assert!(matches!(first.frame, Some(http_frame::Frame::ResponseHead(_))));
    (tx, frames)
}

#[tokio::test]
async fn a_watch_holds_the_agents_only_slot_until_it_ends() {
    let c = Cluster::builder()
        .agents(&[(1, 10), (2, 10)])
        .configure(|config, _| config.routing.max_concurrent_requests_per_agent = 1)
        .start()
        .await;
    let _a1 = c.start_agentk(1, 0, "a1").await;
    let _a2 = c.start_agentk(2, 0, "a2").await;
    let watch = open_watch(&c, 1).await;

    let err = c.api(0).get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("agent 1 is at its limit of 1 concurrent requests"), "{}", err.message());
    // Another agent is not affected.
    c.api(0).get_pods(GetPodsRequest { agent_id: 2, connection_id: 0 }).await.unwrap();
    // Over REST the same limit is 429.
    let url = format!("{}/api/v1/agents/1/pods", c.rest_url(0));
    let resp = reqwest::Client::new().get(&url).bearer_auth(c.gitlab_jwt()).send().await.unwrap();
    assert_eq!(resp.status(), 429);

    drop(watch);
    let mut api = c.api(0);
    eventually!(
        api.get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.is_ok(),
        "the slot is free once the watch ended"
    );
}

#[tokio::test]
async fn the_kas_wide_limit_applies_across_agents() {
    let c = Cluster::builder()
        .agents(&[(1, 10), (2, 10)])
        .configure(|config, _| config.routing.max_concurrent_requests = 1)
        .start()
        .await;
    let _a1 = c.start_agentk(1, 0, "a1").await;
    let _a2 = c.start_agentk(2, 0, "a2").await;
    let (tx, _frames) = open_watch(&c, 1).await;
    let err = c.api(0).get_pods(GetPodsRequest { agent_id: 2, connection_id: 0 }).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("kas is at its limit of 1 concurrent requests"), "{}", err.message());
    drop(tx);
}
