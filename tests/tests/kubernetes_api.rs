//! The Kubernetes API proxy through KasApi.MakeKubernetesRequest (GitLab's gRPC path): streaming
//! both ways, watches, cancellation, request bodies, errors.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use bytes::Bytes;
use kas_e2e::{Cluster, eventually};
use kas_proto::kas::KubernetesRequest;
use kas_proto::kubernetes_api::{HttpFrame, HttpRequestHead, http_frame};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

fn head(method: &str, path: &str, headers: &[(&str, &str)]) -> HttpRequestHead {
    let mut map = http::HeaderMap::new();
    for (k, v) in headers {
        map.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), http::HeaderValue::from_str(v).unwrap());
    }
    HttpRequestHead { method: method.into(), path: path.into(), headers: map }
}

struct Exchange {
    tx: Option<mpsc::Sender<KubernetesRequest>>,
    frames: tonic::Streaming<HttpFrame>,
}

impl Exchange {
    async fn open(c: &Cluster, kas: usize, agent_id: i64, head: HttpRequestHead) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(KubernetesRequest { agent_id, connection_id: 0, frame: Some(HttpFrame::request_head(head)) })
            .await
            .unwrap();
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        request.metadata_mut().insert("user-agent", "test-client/1".parse().unwrap());
        let frames = c.api(kas).make_kubernetes_request(request).await?.into_inner();
        Ok(Self { tx: Some(tx), frames })
    }

    async fn send_body(&self, chunk: &[u8]) {
        let frame = HttpFrame::body(Bytes::copy_from_slice(chunk));
        let tx = self.tx.as_ref().expect("request still open");
        tx.send(KubernetesRequest { agent_id: 0, connection_id: 0, frame: Some(frame) }).await.unwrap();
    }

    /// Ends the request body (half-close).
    fn close_request(&mut self) {
        self.tx = None;
    }

    async fn status(&mut self) -> u32 {
        match self.head().await.unwrap() {
            Some(http_frame::Frame::ResponseHead(h)) => h.status,
            other => panic!("expected a response head, got {other:?}"),
        }
    }

    /// The first frame, or the error that replaced it.
    async fn head(&mut self) -> Result<Option<http_frame::Frame>, tonic::Status> {
        Ok(self.frames.message().await?.and_then(|f| f.frame))
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        match self.frames.message().await.unwrap()?.frame {
            Some(http_frame::Frame::Body(b)) => Some(b),
            other => panic!("expected a body chunk, got {other:?}"),
        }
    }

    async fn body(self) -> Vec<u8> {
        let Self { tx, mut frames } = self;
        drop(tx);
        let mut out = Vec::new();
        while let Some(frame) = frames.message().await.unwrap() {
            match frame.frame {
                Some(http_frame::Frame::Body(b)) => out.extend_from_slice(&b),
                other => panic!("expected a body chunk, got {other:?}"),
            }
        }
        out
    }
}

#[tokio::test]
async fn get_goes_to_the_api_server_with_agentk_credentials() {
    let c = Cluster::builder().start().await;
    c.kube.add_pod("default", "web-1");
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let mut ex = Exchange::open(
        &c,
        0,
        1,
        head(
            "GET",
            "/api/v1/namespaces/default/pods/web-1",
            &[
                ("accept", "application/json"),
                ("authorization", "Bearer caller-secret"),
                ("impersonate-user", "admin"),
                ("user-agent", "kubectl/v1.32.4"),
            ],
        ),
    )
    .await
    .unwrap();
    assert_eq!(ex.status().await, 200);
    let body: serde_json::Value = serde_json::from_slice(&ex.body().await).unwrap();
    assert_eq!(body["metadata"]["name"], "web-1");

    let reqs = c.kube.requests();
    let r = reqs.iter().find(|r| r.path == "/api/v1/namespaces/default/pods/web-1").unwrap();
    assert_eq!(r.headers["authorization"], format!("Bearer {}", c.kube.token()).as_str(), "agentk's own credentials");
    assert!(!r.headers.contains_key("impersonate-user"), "not on the whitelist");
    let ua = r.headers["user-agent"].to_str().unwrap();
    assert_eq!(ua, format!("kubectl/v1.32.4 via agentk/{}", agentk::VERSION));
    assert_eq!(r.headers["accept"], "application/json");
}

#[tokio::test]
async fn a_watch_streams_events_until_the_caller_closes() {
    let c = Cluster::builder().start().await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let mut ex = Exchange::open(&c, 0, 1, head("GET", "/api/v1/pods?watch=1", &[])).await.unwrap();
    assert_eq!(ex.status().await, 200);
    for i in 0..3 {
        // Each event arrives as it happens, not when the response ends.
        c.kube.add_pod("default", &format!("w-{i}"));
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains(&format!("w-{i}")) {
            got.extend_from_slice(&ex.next_chunk().await.expect("stream still open"));
        }
        assert!(String::from_utf8_lossy(&got).contains("ADDED"));
    }
}

#[tokio::test]
async fn caller_cancellation_reaches_the_api_server() {
    let c = Cluster::builder().start().await;
    c.kube.add_pod("default", "app");
    c.kube.append_log("default", "app", "first");
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let mut ex = Exchange::open(&c, 0, 1, head("GET", "/api/v1/namespaces/default/pods/app/log?follow=true", &[]))
        .await
        .unwrap();
    assert_eq!(ex.status().await, 200);
    assert_eq!(&ex.next_chunk().await.unwrap()[..], b"first\n");
    c.kube.append_log("default", "app", "second");
    assert_eq!(&ex.next_chunk().await.unwrap()[..], b"second\n");
    assert_eq!(c.kube.log_followers(), 1);
    drop(ex);
    let kube = c.kube.clone();
    eventually!(kube.log_followers() == 0, "the API server request was cancelled");
}

#[tokio::test]
async fn request_bodies_arrive_intact_in_chunks() {
    let c = Cluster::builder().start().await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "posted", "labels": {"a": "ü"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let raw = serde_json::to_vec(&pod).unwrap();
    let ex = Exchange::open(
        &c,
        0,
        1,
        head("POST", "/api/v1/namespaces/default/pods", &[("content-type", "application/json")]),
    )
    .await
    .unwrap();
    let mut ex = ex;
    for chunk in raw.chunks(7) {
        ex.send_body(chunk).await;
    }
    ex.close_request();
    assert_eq!(ex.status().await, 201);
    let _ = ex.body().await;
    let bodies = c.kube.bodies();
    assert_eq!(bodies.len(), 1);
    assert_eq!(&bodies[0].body[..], &raw[..]);
    assert_eq!(bodies[0].content_type, "application/json");
    assert!(c.kube.pod("default", "posted").is_some());
}

#[tokio::test]
async fn api_server_statuses_pass_through_and_failures_are_errors() {
    let c = Cluster::builder().max_wait(Duration::from_millis(300)).start().await;
    // Agent not connected: a gRPC error, before any frame.
    let err = Exchange::open(&c, 0, 1, head("GET", "/api", &[])).await.err().unwrap();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("agent 1 is not connected"), "{}", err.message());

    let _a = c.start_agentk(1, 0, "agentk-0").await;
    // The API server's own 404 is a response, not an error.
    let mut ex = Exchange::open(&c, 0, 1, head("GET", "/api/v1/namespaces/default/pods/nope", &[])).await.unwrap();
    assert_eq!(ex.status().await, 404);
    let body: serde_json::Value = serde_json::from_slice(&ex.body().await).unwrap();
    assert_eq!(body["kind"], "Status");

    // A request head that is not one.
    let err = Exchange::open(&c, 0, 1, head("GET", "no-slash", &[])).await.err().unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn unreachable_api_server_is_an_error_before_the_head() {
    let c = Cluster::builder().start().await;
    let mut config = c.agentk_config(1, 0, "broken");
    let kubeconfig = c.dir.path().join("kubeconfig-closed");
    // A port nothing listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    std::fs::write(&kubeconfig, c.kube.kubeconfig().replace(&c.kube.url(), &format!("http://{closed}"))).unwrap();
    config.kube = agentk::KubeSource::Kubeconfig(kubeconfig);
    let a = c.start_agentk_with(config).await;
    a.ready().await;
    // Routed fine; the failure replaces the response head.
    let mut ex = Exchange::open(&c, 0, 1, head("GET", "/api", &[])).await.unwrap();
    let err = ex.head().await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("Kubernetes API unreachable"), "{}", err.message());
}

#[tokio::test]
async fn a_failure_after_the_head_aborts_the_response_instead_of_a_second_status() {
    let c = Cluster::builder().start().await;
    c.kube.add_pod("default", "flaky");
    c.kube.add_broken_log("default", "flaky", 100_000);
    let _a = c.start_agentk(1, 0, "agentk-0").await;

    // gRPC: the head, some body, then the stream ends with an error status (no trailer).
    let mut ex = Exchange::open(&c, 0, 1, head("GET", "/api/v1/namespaces/default/pods/flaky/log", &[])).await.unwrap();
    assert_eq!(ex.status().await, 200);
    let mut received = 0usize;
    let err = loop {
        match ex.frames.message().await {
            Ok(Some(f)) => match f.frame {
                Some(http_frame::Frame::Body(b)) => received += b.len(),
                other => panic!("unexpected frame {other:?}"),
            },
            Ok(None) => panic!("the response ended cleanly after {received} bytes; it must fail"),
            Err(status) => break status,
        }
    };
    assert!(received <= 100_000, "{received}");
    assert!(err.message().contains("Kubernetes API response failed"), "{}", err.message());

    // REST: status 200 was sent, then the body is cut: the client sees an error, not a status.
    let url = format!("{}/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods/flaky/log", c.rest_url(0));
    let mut resp = reqwest::Client::new().get(&url).bearer_auth(c.gitlab_jwt()).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let outcome = loop {
        match resp.chunk().await {
            Ok(Some(_)) => continue,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    assert!(outcome.is_err(), "the REST response must be aborted, not completed");
}
