//! Metric values, not presence: real requests through real `kas` and `agentk` processes, each
//! process scraped on its own observability listener (one recorder per process, so no other
//! test or component can supply a series), and each metric asserted by its change across the
//! action.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use kas::registry::redis::RedisConfig;
use kas_e2e::process::{self, ConfiguredKas, Process};
use kas_e2e::{FakeKube, RedisServer, eventually};

/// routing.max_wait: long enough for agentk's cold start on a loaded machine in the `waited`
/// case. Requests meant to time out carry a short gRPC deadline instead (the caller's deadline
/// ends the wait the same way, as `timed_out`), so the test does not sit out the whole wait.
const MAX_WAIT: Duration = Duration::from_secs(15);
/// The caller's deadline of requests that must time out waiting for the agent.
const SHORT_DEADLINE: Duration = Duration::from_secs(2);

/// The sum of the samples named `name` whose labels include every `label="value"` pair (0 when
/// the series does not exist yet: a counter that was never incremented is not rendered).
fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, label_text) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let all = labels.iter().all(|(k, v)| label_text.split(',').any(|p| p == format!("{k}=\"{v}\"")));
            all.then(|| value.parse::<f64>().unwrap_or_else(|e| panic!("{l}: {e}")))
        })
        .sum()
}

async fn scrape(observability: SocketAddr) -> String {
    let r = reqwest::get(format!("http://{observability}/metrics")).await.unwrap();
    assert!(r.status().is_success(), "/metrics: {}", r.status());
    r.text().await.unwrap()
}

/// The change of one metric between two scrapes.
fn delta(before: &str, after: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(after, name, labels) - sample(before, name, labels)
}

/// KasApi.GetPods over gRPC with a deadline; the error it ends with.
async fn grpc_get_pods_error(api: SocketAddr, jwt: &str, agent_id: i64, deadline: Duration) -> tonic::Status {
    let mut client = kas_proto::kas::kas_api_client::KasApiClient::new(kas_e2e::cluster::channel(api));
    let mut request = kas_e2e::authorized(kas_proto::kas::GetPodsRequest { agent_id, connection_id: 0 }, jwt);
    request.set_timeout(deadline);
    client.get_pods(request).await.expect_err("GetPods should fail")
}

fn routed<'a>(method: &'a str, outcome: &'a str) -> [(&'a str, &'a str); 2] {
    [("method", method), ("outcome", outcome)]
}

/// agentk's observability address, from its "observability listening" log line.
async fn agentk_observability(agentk: &mut Process) -> SocketAddr {
    let line = agentk
        .wait_for_log("observability listening", |v| {
            process::log_message(v).is_some_and(|m| m.starts_with("observability listening"))
        })
        .await;
    line["fields"]["address"].as_str().unwrap().parse().unwrap()
}

struct Setup {
    dir: tempfile::TempDir,
    dev: kas::standalone::DevSetup,
    kube: FakeKube,
    kubeconfig: std::path::PathBuf,
    jwt: String,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let dev = kas::standalone::ensure_dev_setup(&dir.path().join("dev")).unwrap();
    let kube = FakeKube::start().await;
    kube.add_pod("default", "web-1");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let secret = kas::auth::Secret::from_file(&dev.gitlab_secret_file).unwrap();
    let jwt = kas::auth::mint_jwt(&secret, "gitlab", "gitlab-kas", Duration::from_secs(600)).unwrap();
    Setup { dir, dev, kube, kubeconfig, jwt }
}

async fn start_kas(s: &Setup, configure: impl FnOnce(&mut kas::Config)) -> ConfiguredKas {
    let mut config = s.dev.config.clone().with_ephemeral_ports();
    config.routing.max_wait = MAX_WAIT;
    configure(&mut config);
    process::start_kas_with_config(&config, s.dir.path()).await
}

fn start_agentk(s: &Setup, kas: &ConfiguredKas) -> Process {
    process::start_agentk(kas.addresses.agent, &s.dev.agent_token_file, &s.kubeconfig, "agentk-0", "agentk")
}

#[tokio::test]
async fn routed_request_outcomes_proxy_bytes_and_agentk_requests_are_counted_per_request() {
    let s = setup().await;
    let kas = start_kas(&s, |_| {}).await;
    let kas_metrics = kas.addresses.observability;
    let rest = kas.addresses.rest;
    let client = reqwest::Client::new();
    let get_pods = || client.get(format!("http://{rest}/api/v1/agents/1/pods")).bearer_auth(&s.jwt).send();

    // timed_out: the agent does not connect within the caller's deadline.
    let before = scrape(kas_metrics).await;
    let status = grpc_get_pods_error(kas.addresses.api, &s.jwt, 1, SHORT_DEADLINE).await;
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "no agent: {status:?}");
    let after = scrape(kas_metrics).await;
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "timed_out")), 1.0);
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "waited")), 0.0);
    assert_eq!(delta(&before, &after, "kas_route_wait_seconds_count", &[("method", "get_pods")]), 1.0);

    // waited: the request is made (and is waiting in kas) before agentk connects.
    let before = scrape(kas_metrics).await;
    let waiting = tokio::spawn(get_pods());
    eventually!(
        sample(&scrape(kas_metrics).await, "kas_waiting_requests", &[]) == 1.0,
        "the request waits in kas for the agent"
    );
    let mut agentk = start_agentk(&s, &kas);
    let agentk_metrics = agentk_observability(&mut agentk).await;
    let r = waiting.await.unwrap().unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let after = scrape(kas_metrics).await;
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "waited")), 1.0);
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "local")), 0.0);
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "timed_out")), 0.0);

    // local: agentk's idle tunnels are there; agentk counts the GetPods it served.
    eventually!(sample(&scrape(kas_metrics).await, "kas_idle_tunnels", &[]) >= 1.0, "agentk has idle tunnels");
    let before = scrape(kas_metrics).await;
    let agentk_before = scrape(agentk_metrics).await;
    let r = get_pods().await.unwrap();
    assert_eq!(r.status(), 200);
    let after = scrape(kas_metrics).await;
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "local")), 1.0);
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "waited")), 0.0);
    let requests = &[("module", "get_pods"), ("outcome", "ok")];
    // agentk records after it has answered: the count may land just after kas's response.
    eventually!(delta(&agentk_before, &scrape(agentk_metrics).await, "agentk_requests_total", requests) == 1.0);

    // failed: a bad request reaches the router (gRPC does not check the id first).
    let before = scrape(kas_metrics).await;
    let status = grpc_get_pods_error(kas.addresses.api, &s.jwt, 0, SHORT_DEADLINE).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let after = scrape(kas_metrics).await;
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "failed")), 1.0);

    // The Kubernetes API proxy: request bytes are the body sent, response bytes the body
    // received; agentk counts the request and times the API server once.
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "created", "namespace": "default", "annotations": {"pad": "x".repeat(10_000)}},
    });
    let body = serde_json::to_vec(&pod).unwrap();
    let before = scrape(kas_metrics).await;
    let agentk_before = scrape(agentk_metrics).await;
    let r = client
        .post(format!("http://{rest}/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods"))
        .bearer_auth(&s.jwt)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let received = r.bytes().await.unwrap();
    assert!(status.is_success(), "{status}: {}", String::from_utf8_lossy(&received));
    assert!(!received.is_empty());
    let after = scrape(kas_metrics).await;
    let bytes = |direction| delta(&before, &after, "kas_proxied_bytes_total", &[("direction", direction)]);
    assert_eq!(bytes("request"), body.len() as f64, "request bytes");
    assert_eq!(bytes("response"), received.len() as f64, "response bytes");
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("kubernetes_api", "local")), 1.0);
    let requests = &[("module", "kubernetes_api"), ("outcome", "ok")];
    eventually!(delta(&agentk_before, &scrape(agentk_metrics).await, "agentk_requests_total", requests) == 1.0);
    let agentk_after = scrape(agentk_metrics).await;
    assert_eq!(delta(&agentk_before, &agentk_after, "agentk_api_server_response_seconds_count", &[]), 1.0);
    assert_eq!(delta(&agentk_before, &agentk_after, "agentk_requests_total", &[("outcome", "error")]), 0.0);
    let created = s.kube.pod_names();
    assert!(created.iter().any(|(_, name)| name == "created"), "{created:?}");

    let status = agentk.terminate().await;
    assert!(status.success(), "agentk exit: {status}");
}

#[tokio::test]
async fn a_request_routed_to_a_killed_peer_counts_a_peer_forward_error_on_the_routing_kas() {
    let s = setup().await;
    let redis = RedisServer::start().await;
    let prefix = format!("kas-test-{}", rand::random::<u32>());
    let with_redis = |c: &mut kas::Config| {
        let mut redis_config = RedisConfig::new(redis.url());
        redis_config.key_prefix = prefix.clone();
        c.registry.redis = Some(redis_config);
    };
    let kas_a = start_kas(&s, with_redis).await;
    let kas_b = start_kas(&s, with_redis).await;
    let mut agentk = start_agentk(&s, &kas_b);
    agentk.wait_for_message("connected to kas").await;
    let rest_a = kas_a.addresses.rest;
    let client = reqwest::Client::new();
    let get_pods = || client.get(format!("http://{rest_a}/api/v1/agents/1/pods")).bearer_auth(&s.jwt).send();
    // kas A sees the agent on kas B through the registry and forwards.
    eventually!(get_pods().await.is_ok_and(|r| r.status() == 200), "kas A reaches the agent through kas B");
    let after_peer = scrape(kas_a.addresses.observability).await;
    assert!(sample(&after_peer, "kas_routed_requests_total", &routed("get_pods", "peer")) >= 1.0);
    assert_eq!(sample(&after_peer, "kas_peer_forward_errors_total", &[]), 0.0, "no errors while B is up");

    // kas B crashes (before agentk goes, so B cannot remove the agent's connection record): its
    // registry records stay until they expire, and agentk has nowhere to reconnect.
    kas_b.process.kill().await;
    agentk.kill().await;
    let before = scrape(kas_a.addresses.observability).await;
    let status = grpc_get_pods_error(kas_a.addresses.api, &s.jwt, 1, SHORT_DEADLINE).await;
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    let after = scrape(kas_a.addresses.observability).await;
    let errors = |reason| delta(&before, &after, "kas_peer_forward_errors_total", &[("reason", reason)]);
    // The refused connection marks B down (once) and counts as a `down` forward error; later
    // scans within the wait skip B as down, so the count is at least one.
    assert!(errors("down") >= 1.0, "the forward to the dead peer is counted: {}", errors("down"));
    assert_eq!(errors("unavailable"), 0.0);
    assert_eq!(errors("not_here"), 0.0);
    assert_eq!(delta(&before, &after, "kas_peer_state_changes_total", &[("state", "down")]), 1.0);
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "timed_out")), 1.0);
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "peer")), 0.0);
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "local")), 0.0);
}

#[tokio::test]
async fn a_request_outlasting_routing_max_wait_counts_timed_out() {
    let s = setup().await;
    // Here kas's own limit ends the wait (not the caller's deadline, as above): the REST
    // route's deadline (rest.request_timeout) is far longer.
    let kas = start_kas(&s, |c| c.routing.max_wait = Duration::from_secs(1)).await;
    let before = scrape(kas.addresses.observability).await;
    let r = reqwest::Client::new()
        .get(format!("http://{}/api/v1/agents/1/pods", kas.addresses.rest))
        .bearer_auth(&s.jwt)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503, "no agent within routing.max_wait: {}", r.text().await.unwrap());
    let after = scrape(kas.addresses.observability).await;
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "timed_out")), 1.0);
    assert_eq!(delta(&before, &after, "kas_routed_requests_total", &routed("get_pods", "failed")), 0.0);
    assert_eq!(delta(&before, &after, "kas_route_wait_seconds_count", &[("method", "get_pods")]), 1.0);
}

/// agentk's own answers are counted as what they are, not as `ok`: a 504 it answers because the
/// API server never sends a response head is `timeout`.
#[tokio::test]
async fn agentk_counts_its_own_timeout_answers_as_timeout() {
    let s = setup().await;
    let kas = start_kas(&s, |_| {}).await;
    // An "API server" whose kernel completes handshakes but which never reads or answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let kubeconfig = s.dir.path().join("silent-kubeconfig");
    let server = format!("http://{}", silent.local_addr().unwrap());
    std::fs::write(&kubeconfig, s.kube.kubeconfig().replace(&s.kube.url(), &server)).unwrap();
    let mut agentk = process::start_agentk_with_args(
        kas.addresses.agent,
        &s.dev.agent_token_file,
        &kubeconfig,
        "agentk-0",
        "agentk",
        &["--kube-api-response-header-timeout=1s"],
    );
    let agentk_metrics = agentk_observability(&mut agentk).await;
    // Connected first: the Kubernetes proxy does not wait for an agent no kas has seen yet.
    let ready = format!("http://{agentk_metrics}/readyz");
    eventually!(reqwest::get(&ready).await.is_ok_and(|r| r.status().is_success()), "agentk ready");
    let rest = kas.addresses.rest;
    let before = scrape(agentk_metrics).await;
    let r = reqwest::Client::new()
        .get(format!("http://{rest}/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods"))
        .bearer_auth(&s.jwt)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504, "{}", r.text().await.unwrap());
    let outcome = |o| [("module", "kubernetes_api"), ("outcome", o)];
    eventually!(delta(&before, &scrape(agentk_metrics).await, "agentk_requests_total", &outcome("timeout")) == 1.0);
    let after = scrape(agentk_metrics).await;
    assert_eq!(delta(&before, &after, "agentk_requests_total", &outcome("ok")), 0.0);
    assert_eq!(delta(&before, &after, "agentk_requests_total", &outcome("error")), 0.0);
    let status = agentk.terminate().await;
    assert!(status.success(), "agentk exit: {status}");
    drop(silent);
}
