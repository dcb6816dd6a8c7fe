//! The REST gateway over real HTTP: caller -> kas rest listener -> router -> agentk -> Kubernetes
//! API (fake) and back, and the registry listings, with two agentk replicas.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use kas_e2e::{Cluster, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};

const PROBLEM_JSON: &str = "application/problem+json";

struct Rest {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Rest {
    fn new(c: &Cluster, kas: usize) -> Self {
        Self { base: c.rest_url(kas), token: c.gitlab_jwt(), http: reqwest::Client::new() }
    }

    async fn get(&self, path: &str) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let resp = self.http.get(format!("{}{path}", self.base)).bearer_auth(&self.token).send().await.unwrap();
        split(resp).await
    }
}

async fn split(resp: reqwest::Response) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let status = resp.status();
    let headers = resp.headers().clone();
    // An empty body is Null; anything else must be JSON.
    let bytes = resp.bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
    };
    (status, headers, body)
}

fn content_type(h: &reqwest::header::HeaderMap) -> &str {
    h.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default()
}

fn assert_problem(status: StatusCode, h: &reqwest::header::HeaderMap, body: &Value, expected: StatusCode) -> String {
    assert_eq!(status, expected, "{body}");
    assert_eq!(content_type(h), PROBLEM_JSON);
    assert_eq!(body["status"], expected.as_u16());
    assert_eq!(body["request_id"], h.get("x-request-id").unwrap().to_str().unwrap());
    body["detail"].as_str().unwrap().to_owned()
}

fn sorted_pods(body: &Value) -> Vec<(String, String)> {
    let mut pods: Vec<(String, String)> = body["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["namespace"].as_str().unwrap().to_owned(), p["name"].as_str().unwrap().to_owned()))
        .collect();
    pods.sort();
    pods
}

#[tokio::test]
async fn rest_gateway_end_to_end_with_two_replicas() {
    let c = Cluster::builder().agents(&[(1, 10), (2, 10), (3, 11)]).max_wait(Duration::from_millis(500)).start().await;
    c.kube.add_pod("default", "web-1");
    c.kube.add_pod("kube-system", "dns-1");
    let a0 = c.start_agentk(1, 0, "agentk-0").await;
    // The second replica has its own API server, so an answer shows which replica served it.
    let (a1, _kube1) = c.start_agentk_with_own_cluster(1, 0, "agentk-1").await;
    let _other = c.start_agentk(2, 0, "agentk-x").await;
    let rest = Rest::new(&c, 0);

    // GetPods through a real agentk.
    let (s, h, body) = rest.get("/api/v1/agents/1/pods").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(content_type(&h), "application/json");
    let expected = vec![("default".to_owned(), "web-1".to_owned()), ("kube-system".to_owned(), "dns-1".to_owned())];
    let replica_1 = vec![("default".to_owned(), "agentk-1".to_owned())];
    let any = sorted_pods(&body);
    assert!(any == expected || any == replica_1, "{any:?}");
    // Naming a connection reaches that replica (replica 1 answers from its own API server).
    for (conn, want) in [(a0.connection_id().unwrap(), &expected), (a1.connection_id().unwrap(), &replica_1)] {
        let (s, _, body) = rest.get(&format!("/api/v1/agents/1/pods?connection_id={conn}")).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(&sorted_pods(&body), want, "connection {conn}");
    }

    // Connections of the agent: one per replica, ids as strings.
    let (s, _, body) = rest.get("/api/v1/agents/1/connections").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let conns = body["connections"].as_array().unwrap();
    let mut got: Vec<(&str, &str)> =
        conns.iter().map(|c| (c["connection_id"].as_str().unwrap(), c["pod_name"].as_str().unwrap())).collect();
    got.sort();
    let (id0, id1) = (a0.connection_id().unwrap().to_string(), a1.connection_id().unwrap().to_string());
    let mut want = vec![(id0.as_str(), "agentk-0"), (id1.as_str(), "agentk-1")];
    want.sort();
    assert_eq!(got, want);
    for conn in conns {
        assert_eq!(conn["agent_id"], "1");
        assert_eq!(conn["project_id"], "10");
        assert_eq!(conn["version"], agentk::VERSION);
        assert_eq!(conn["pod_namespace"], "agentk");
        assert_eq!(conn["kas_instance_id"], c.kas[0].instance_id());
        assert_eq!(
            conn["kas_address"],
            json!({"ip": c.kas[0].addresses.internal.ip().to_string(), "port": c.kas[0].addresses.internal.port()})
        );
        let at = conn["connected_at"].as_str().unwrap();
        assert!(at.ends_with('Z') && at.contains('T'), "RFC 3339: {at}");
    }

    // By project: both replicas of agent 1 and agent 2; none for project 11 (agent 3 is offline).
    let (s, _, body) = rest.get("/api/v1/projects/10/agents").await;
    assert_eq!(s, StatusCode::OK);
    let mut ids: Vec<&str> =
        body["connections"].as_array().unwrap().iter().map(|c| c["agent_id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, vec!["1", "1", "2"]);
    let (s, _, body) = rest.get("/api/v1/projects/11/agents").await;
    assert_eq!((s, body), (StatusCode::OK, json!({"connections": []})));

    // Errors.
    let (s, h, body) = split(reqwest::get(format!("{}/api/v1/agents/1/pods", rest.base)).await.unwrap()).await;
    assert!(assert_problem(s, &h, &body, StatusCode::UNAUTHORIZED).contains("missing authorization"));
    let (s, h, body) = rest.get("/api/v1/agents/x/pods").await;
    assert!(assert_problem(s, &h, &body, StatusCode::BAD_REQUEST).contains("agent_id must be a positive integer"));
    let (s, h, body) = rest.get("/api/v1/agents/1/pods?connection_id=nope").await;
    assert!(assert_problem(s, &h, &body, StatusCode::BAD_REQUEST).contains("connection_id"));
    let (s, h, body) = rest.get("/api/v1/nothing-here").await;
    assert_problem(s, &h, &body, StatusCode::NOT_FOUND);
    let (s, h, body) = rest.get("/api/v1/agents/3/pods").await;
    assert!(assert_problem(s, &h, &body, StatusCode::SERVICE_UNAVAILABLE).contains("agent 3 is not connected"));
    // The Kubernetes API fails: 502 with agentk's code.
    c.kube.fail_with(Some(http::StatusCode::FORBIDDEN));
    let (s, h, body) = rest.get(&format!("/api/v1/agents/1/pods?connection_id={}", a0.connection_id().unwrap())).await;
    assert!(assert_problem(s, &h, &body, StatusCode::BAD_GATEWAY).starts_with("agentk: Kubernetes API:"));
    assert_eq!(body["code"], "PERMISSION_DENIED");
    c.kube.fail_with(None);

    // The caller's request id is echoed.
    let resp = rest
        .http
        .get(format!("{}/api/v1/agents/1/pods", rest.base))
        .bearer_auth(&rest.token)
        .header("x-request-id", "e2e-request-1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers().get("x-request-id").unwrap(), "e2e-request-1");
}

#[tokio::test]
async fn another_kas_answers_through_the_router() {
    // agentk on kas 0; the REST call reaches kas 1, which forwards it over KasInternal.
    let c = Cluster::builder().kas(2).start().await;
    c.kube.add_pod("default", "p");
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let rest = Rest::new(&c, 1);
    let (s, _, body) = rest.get("/api/v1/agents/1/pods").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(sorted_pods(&body), vec![("default".to_owned(), "p".to_owned())]);
    let (s, _, body) = rest.get("/api/v1/agents/1/connections").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["connections"][0]["kas_instance_id"], c.kas[0].instance_id());
}

#[tokio::test]
async fn shutdown_lets_in_flight_rest_requests_finish_then_stops_accepting() {
    let mut c = Cluster::builder().start().await;
    c.kube.add_pod("default", "slow");
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    c.kube.delay(Some(Duration::from_millis(500)));
    let rest = Rest::new(&c, 0);
    let base = rest.base.clone();
    let call = tokio::spawn(async move { rest.get("/api/v1/agents/1/pods").await });
    let kube = c.kube.clone();
    eventually!(kube.requests().iter().any(|r| r.path == "/api/v1/pods"), "request reached the API server");
    let kas = c.kas.pop().unwrap();
    let stopping = tokio::spawn(kas.stop());
    let (s, _, body) = call.await.unwrap();
    assert_eq!(s, StatusCode::OK, "in-flight request completed during shutdown: {body}");
    assert_eq!(sorted_pods(&body), vec![("default".to_owned(), "slow".to_owned())]);
    stopping.await.unwrap();
    let after = reqwest::get(format!("{base}/openapi.json")).await;
    assert!(after.is_err(), "the rest listener is closed after shutdown: {after:?}");
}
