//! kas's observability listener: /livez, /readyz (Redis reachability), and Prometheus /metrics
//! with routing, tunnel and registry figures. One test function: the metrics recorder is
//! process-wide, so parallel tests in this binary would mix their counts, and so do the two
//! in-process kas here: this test checks what /metrics serves (names, labels, gauges of the one
//! kas holding the agents). Per-request values of each kas, in its own process, are checked in
//! `metric_outcomes.rs`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kas_e2e::{Cluster, eventually, http_get};
use kas_proto::kas::GetPodsRequest;

/// The value of a sample line `name{labels} value` (labels in the exporter's order).
fn sample(metrics: &str, name_and_labels: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

#[tokio::test]
async fn health_and_metrics() {
    let mut c = Cluster::builder().redis().kas(2).agents(&[(1, 10), (2, 10)]).start().await;
    let obs = |c: &Cluster, k: usize| format!("http://{}", c.kas[k].addresses.observability);
    assert_eq!(http_get(&format!("{}/livez", obs(&c, 0))).await.0, 200);
    assert_eq!(http_get(&format!("{}/readyz", obs(&c, 0))).await, (200, "ok\n".to_owned()));

    let _a = c.start_agentk(1, 0, "agentk-0").await;
    // agentk is ready once it sent a Descriptor; kas registers the tunnel a moment later, and a
    // request before that waits (outcome "waited", not "local": seen once in CI).
    eventually!(
        c.kas[0].handle.tunnel_stats().await.is_some_and(|s| s.idle_tunnels >= 1),
        "kas holds an idle tunnel of agent 1"
    );
    c.api(0).get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap();
    // Kubernetes API proxy bytes are counted.
    let url = format!("{}/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods", c.rest_url(0));
    let body =
        reqwest::Client::new().get(&url).bearer_auth(c.gitlab_jwt()).send().await.unwrap().bytes().await.unwrap();

    let (status, metrics) = http_get(&format!("{}/metrics", obs(&c, 0))).await;
    assert_eq!(status, 200);
    let local = sample(&metrics, r#"kas_routed_requests_total{method="get_pods",outcome="local"}"#);
    assert!(local.is_some_and(|v| v >= 1.0), "{metrics}");
    assert!(metrics.contains("kas_route_duration_seconds_bucket"), "{metrics}");
    // A request that waited for its agent is in the wait histogram.
    let mut api = c.api(0);
    let waiting = tokio::spawn(async move { api.get_pods(GetPodsRequest { agent_id: 2, connection_id: 0 }).await });
    eventually!(c.kas[0].handle.tunnel_stats().await.is_some_and(|s| s.waiting_requests == 1), "parked");
    let _b = c.start_agentk(2, 0, "agentk-2").await;
    waiting.await.unwrap().unwrap();
    let (_, metrics) = http_get(&format!("{}/metrics", obs(&c, 0))).await;
    assert!(metrics.contains(r#"kas_route_wait_seconds_count{method="get_pods"}"#), "{metrics}");
    // Gauges of this kas (kas 0 holds both agents' connections and their idle tunnels).
    assert_eq!(sample(&metrics, "kas_agent_connections"), Some(2.0), "{metrics}");
    assert!(sample(&metrics, "kas_idle_tunnels").is_some_and(|v| v >= 1.0), "{metrics}");
    assert!(metrics.contains(&format!(r#"kas_build_info{{version="{}""#, kas::VERSION)), "{metrics}");
    assert!(sample(&metrics, r#"kas_registry_operations_total{operation="register"}"#).is_some(), "{metrics}");
    let response_bytes = sample(&metrics, r#"kas_proxied_bytes_total{direction="response"}"#).unwrap_or_default();
    assert!(response_bytes >= body.len() as f64, "{response_bytes} < {}: {metrics}", body.len());
    // No unbounded labels: agent and connection ids never appear.
    assert!(!metrics.contains("agent_id") && !metrics.contains("connection_id"), "{metrics}");

    // Redis down: not ready (and the failures are counted); back: ready again.
    c.redis.as_mut().unwrap().stop().await;
    let url = format!("{}/readyz", obs(&c, 0));
    eventually!(http_get(&url).await.0 == 503, "not ready while Redis is down");
    assert!(http_get(&url).await.1.contains("registry unavailable"));
    c.redis.as_mut().unwrap().start_again().await;
    eventually!(http_get(&url).await.0 == 200, "ready again once Redis is back");
    let (_, metrics) = http_get(&format!("{}/metrics", obs(&c, 0))).await;
    assert!(metrics.contains("kas_registry_errors_total"), "{metrics}");
}
