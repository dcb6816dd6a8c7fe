//! Logs along a full request path (caller -> routing kas -> gateway kas -> agentk): the
//! correlation id appears at every hop, and no token or secret appears anywhere, at debug level.
//! One test function: the log subscriber is process-wide.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use base64::Engine;
use kas_e2e::Cluster;
use kas_proto::kas::GetPodsRequest;
use serde_json::Value;

/// Log lines (JSON) whose target starts with `target` and that mention `text` anywhere.
fn lines_with(logs: &str, target: &str, text: &str) -> usize {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"].as_str().is_some_and(|t| t.starts_with(target)) && v.to_string().contains(text))
        .count()
}

#[tokio::test]
async fn a_request_is_correlated_across_hops_and_no_secret_is_logged() {
    let buffer = kas_e2e::CapturedLogs::default();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter("kas=debug,agentk=debug")
        .with_writer(buffer.clone())
        .try_init()
        .expect("the only subscriber in this test binary");

    let c = Cluster::builder().redis().kas(2).start().await;
    c.kube.add_pod("default", "p");
    let _a = c.start_agentk(1, 1, "agentk-0").await;

    // gRPC, through kas 0 (routing) to kas 1 (gateway) to agentk, with the caller's id.
    let jwt = c.gitlab_jwt();
    let mut api = c.api_with_token(0, Some(jwt.clone()));
    let mut request = tonic::Request::new(GetPodsRequest { agent_id: 1, connection_id: 0 });
    request.metadata_mut().insert("x-request-id", "corr-grpc-42".parse().unwrap());
    api.get_pods(request).await.unwrap();
    // REST, the Kubernetes proxy, same path, with the caller's id.
    let url = format!("{}/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods/p", c.rest_url(0));
    let resp =
        reqwest::Client::new().get(&url).bearer_auth(&jwt).header("x-request-id", "corr-rest-43").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let pod: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(pod["metadata"]["name"], "p", "{pod}");
    // A request without an id still gets one, logged at every hop.
    c.api(0).get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap();

    let logs = buffer.text();
    for id in ["corr-grpc-42", "corr-rest-43"] {
        assert!(lines_with(&logs, "kas::modules", id) >= 1, "routing kas did not log {id}:\n{logs}");
        assert!(lines_with(&logs, "kas::server::internal", id) >= 1, "gateway kas did not log {id}:\n{logs}");
        assert!(lines_with(&logs, "agentk::pool", id) >= 1, "agentk did not log {id}:\n{logs}");
    }
    // The generated id of the third request: the one agentk logged that is neither of ours.
    let generated: Vec<String> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "agentk::pool")
        .filter_map(|v| v["fields"]["request_id"].as_str().map(str::to_owned))
        .filter(|id| id != "corr-grpc-42" && id != "corr-rest-43")
        .collect();
    assert_eq!(generated.len(), 1, "{logs}");
    assert!(lines_with(&logs, "kas::server::internal", &generated[0]) >= 1, "{logs}");

    // Nothing secret, anywhere.
    let b64 = |s: &kas::auth::Secret| base64::engine::general_purpose::STANDARD.encode(s.bytes());
    let secrets = [
        ("GitLab JWT", jwt.clone()),
        ("agent token", c.agent(1).token.clone()),
        ("service account token", c.kube.token().to_owned()),
        ("GitLab secret", b64(&c.gitlab_secret)),
        ("kas internal secret", b64(&c.internal_secret)),
    ];
    for (what, secret) in secrets {
        assert!(!logs.contains(&secret), "the {what} appears in the logs");
    }
    // Field names are the fixed ones.
    assert!(lines_with(&logs, "kas::", "\"agent_id\"") >= 1);
    assert!(lines_with(&logs, "kas::", "\"connection_id\"") >= 1);
}
