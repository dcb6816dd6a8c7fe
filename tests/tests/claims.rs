//! Documented behaviour that had no end-to-end test (issue 19): each test drives the real
//! pieces (kas, agentk, redis-server) and asserts the claim it is named for.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kas::agent::AgentConfigDocument;
use kas_e2e::certificates::localhost_tls;
use kas_e2e::{Cluster, eventually};
use kas_proto::kas::kas_api_client::KasApiClient;
use kas_proto::kas::{ConnectedAgentsByIdRequest, GetPodsRequest, KubernetesRequest};
use kas_proto::kubernetes_api::{HttpFrame, HttpRequestHead, http_frame};
use tokio_stream::wrappers::ReceiverStream;

/// The key prefix the cluster's kas use in Redis.
fn redis_prefix(c: &Cluster) -> String {
    c.config.registry.redis.as_ref().unwrap().key_prefix.clone()
}

/// README "Redis": kas binds and serves local agents while Redis is down, and once Redis is back
/// the connection records it could not write appear there (the App, not only the registry).
#[tokio::test]
async fn kas_starts_while_redis_is_down_serves_local_agents_then_registers_them() {
    let mut c = Cluster::builder().redis().kas(0).start().await;
    c.redis.as_mut().unwrap().stop().await;
    let k = c.start_kas().await;
    c.kas.push(k);
    c.kube.add_pod("default", "while-redis-down");
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let pods = c.api(0).get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap().into_inner().pods;
    assert_eq!(pods.len(), 1, "GetPods through the local tunnel while Redis is down");

    let redis = c.redis.as_mut().unwrap();
    redis.start_again().await;
    let prefix = redis_prefix(&c);
    let redis = c.redis.as_ref().unwrap();
    let agent_key = format!("{prefix}:agent:1");
    let mut records: usize;
    eventually!(
        {
            records = redis.query::<usize>(redis::cmd("HLEN").arg(&agent_key)).await;
            records == 1
        },
        "the connection record in Redis once it is back (HLEN {agent_key} = {records})"
    );
    let instance_key = format!("{prefix}:kas:{}", c.kas[0].instance_id());
    eventually!(redis.query::<bool>(redis::cmd("EXISTS").arg(&instance_key)).await, "kas heartbeat key {instance_key}");
}

/// A Kubernetes API request through KasApi.MakeKubernetesRequest: (status, body).
async fn kubernetes_get(c: &Cluster, path: &str) -> (u32, Vec<u8>) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let head = HttpRequestHead { method: "GET".into(), path: path.into(), headers: Default::default() };
    tx.send(KubernetesRequest { agent_id: 1, connection_id: 0, frame: Some(HttpFrame::request_head(head)) })
        .await
        .unwrap();
    drop(tx);
    let mut frames = c.api(0).make_kubernetes_request(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let status = match frames.message().await.unwrap().and_then(|f| f.frame) {
        Some(http_frame::Frame::ResponseHead(h)) => h.status,
        other => panic!("expected a response head, got {other:?}"),
    };
    let mut body = Vec::new();
    while let Some(frame) = frames.message().await.unwrap() {
        if let Some(http_frame::Frame::Body(b)) = frame.frame {
            body.extend_from_slice(&b);
        }
    }
    (status, body)
}

/// README "Agent configuration": `kubernetes_api.enabled: false` refuses every proxied request
/// with HTTP 403 and a Kubernetes `Status` (reason Forbidden, the message names the setting).
#[tokio::test]
async fn kubernetes_api_disabled_in_the_agent_configuration_refuses_with_a_403_status() {
    let doc: AgentConfigDocument = serde_norway::from_str("kubernetes_api:\n  enabled: false\n").unwrap();
    let c = Cluster::builder().agent_configuration(1, doc).start().await;
    c.kube.add_pod("default", "web-1");
    let a = c.start_agentk(1, 0, "agentk-0").await;
    // The configuration has reached agentk before the request (it is applied when received).
    eventually!(
        a.status.configuration.borrow().as_ref().is_some_and(|u| u
            .configuration
            .as_ref()
            .and_then(|c| c.kubernetes_api.as_ref())
            .is_some_and(|k| k.disabled))
    );
    let (status, body) = kubernetes_get(&c, "/api/v1/namespaces/default/pods").await;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, 403, "{text}");
    let s: serde_json::Value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    assert_eq!(s["kind"], "Status", "{text}");
    assert_eq!(s["status"], "Failure", "{text}");
    assert_eq!(s["reason"], "Forbidden", "{text}");
    assert_eq!(s["code"], 403, "{text}");
    assert!(s["message"].as_str().unwrap_or_default().contains("kubernetes_api.enabled: false"), "{text}");
    assert!(!text.contains("web-1"), "the API server was reached: {text}");
}

/// README "Listeners": `listeners.api.tls` makes the api listener serve TLS; a client trusting the
/// certificate calls KasApi, plaintext is refused at the transport.
#[tokio::test]
async fn the_api_listener_serves_tls_when_configured() {
    let c = Cluster::builder()
        .configure(|config, dir| config.listeners.api.tls = Some(localhost_tls(dir, "api")))
        .start()
        .await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let port = c.kas[0].addresses.api.port();
    let ca = std::fs::read(c.dir.path().join("api.crt")).unwrap();
    let request = || {
        let mut r = tonic::Request::new(ConnectedAgentsByIdRequest { agent_id: 1 });
        r.metadata_mut().insert("authorization", format!("Bearer {}", c.gitlab_jwt()).parse().unwrap());
        r
    };
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .domain_name("localhost");
    let channel = tonic::transport::Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_lazy();
    let agents = KasApiClient::new(channel).connected_agents_by_id(request()).await.unwrap().into_inner().agents;
    assert_eq!(agents.len(), 1, "ConnectedAgentsById over TLS");
    assert_eq!(agents[0].pod_name, "agentk-0");

    // Plaintext against the TLS listener: no gRPC answer at all (not even an auth error).
    let err = KasApiClient::new(kas_e2e::cluster::channel(c.kas[0].addresses.api))
        .connected_agents_by_id(request())
        .await
        .unwrap_err();
    let chain = format!("{err:?}").to_lowercase();
    assert!(
        err.code() == tonic::Code::Unavailable
            || ["broken pipe", "connection reset", "closed", "transport"].iter().any(|s| chain.contains(s)),
        "plaintext was not refused at the transport: {err:?}"
    );
}

/// README "kas_internal.advertise_ip": with the internal listener on a wildcard address, the
/// registry records name the advertised IP (not the bound one), and another kas routes there.
#[tokio::test]
async fn advertise_ip_is_the_address_in_the_registry_and_routing_uses_it() {
    let c = Cluster::builder().redis().kas(0).start().await;
    // 127.0.0.2 is a loopback address no listener is bound to explicitly: only the wildcard
    // listener answers there, so reaching it proves the advertised IP was used.
    let advertised: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let mut config = c.config.clone();
    config.listeners.internal.address = "0.0.0.0:0".into();
    config.kas_internal.advertise_ip = Some(advertised);
    let mut c = c;
    let k0 = c.start_kas_with(config).await;
    assert!(k0.addresses.internal.ip().is_unspecified(), "bound on the wildcard: {}", k0.addresses.internal);
    let internal_port = k0.addresses.internal.port();
    c.kas.push(k0);
    let k1 = c.start_kas().await;
    c.kas.push(k1);
    c.kube.add_pod("default", "advertised");
    let _a = c.start_agentk(1, 0, "agentk-0").await;

    let mut records: Vec<kas_proto::kas::ConnectedAgentInfo>;
    eventually!(
        {
            records = c.connections(1, 1).await;
            !records.is_empty()
        },
        "kas 1 sees the connection held by kas 0"
    );
    let address = records[0].kas_address.clone().unwrap();
    assert_eq!(address.ip, advertised.to_string(), "{records:?}");
    assert_eq!(address.port, u32::from(internal_port), "{records:?}");
    // kas 1 has no tunnel of its own: the request goes to kas 0 at 127.0.0.2.
    let pods = c.api(1).get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap().into_inner().pods;
    assert_eq!(pods.len(), 1);
}

/// A redis client authenticating as `user` with `password` on the server's socket.
fn redis_client_as(server: &kas_e2e::RedisServer, user: Option<&str>, password: Option<&str>) -> redis::Client {
    use redis::IntoConnectionInfo;
    let info = server.url().as_str().into_connection_info().unwrap();
    let mut settings = info.redis_settings().clone();
    if let Some(user) = user {
        settings = settings.set_username(user);
    }
    if let Some(password) = password {
        settings = settings.set_password(password);
    }
    redis::Client::open(info.set_redis_settings(settings)).unwrap()
}

/// README "Redis": `registry.redis.username` (an ACL user) with `password_file` registers
/// records; a wrong password is refused with a clear error that does not contain it.
#[tokio::test]
async fn redis_acl_username_and_password_file() {
    let mut c = Cluster::builder().redis().kas(0).start().await;
    let server = c.redis.as_ref().unwrap();
    let _: String =
        server.query(redis::cmd("ACL").arg(&["SETUSER", "kas", "on", ">acl-secret", "~*", "&*", "+@all"])).await;
    // Only the ACL user may connect from now on (the default user is disabled).
    {
        let mut conn = redis_client_as(server, None, None).get_multiplexed_async_connection().await.unwrap();
        let _ = redis::cmd("ACL").arg(&["SETUSER", "default", "off"]).query_async::<String>(&mut conn).await;
    }
    let anonymous = async {
        let mut conn = redis_client_as(server, None, None).get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    assert!(
        anonymous.await.is_err(),
        "the default user still works: the test would not show that kas used its username"
    );
    let dir = c.dir.path().to_owned();
    let with_password = |c: &Cluster, password: &str| {
        let file = dir.join(format!("redis-password-{}", rand::random::<u32>()));
        std::fs::write(&file, format!("{password}\n")).unwrap();
        let mut config = c.config.clone();
        let redis = config.registry.redis.as_mut().unwrap();
        redis.username = Some("kas".into());
        redis.password_file = Some(file);
        config
    };
    let good = with_password(&c, "acl-secret");
    let k = c.start_kas_with(good).await;
    c.kas.push(k);
    let (code, body) = readyz(&c, 0).await;
    assert_eq!(code, 200, "kas with the ACL user is ready (Redis answers): {body}");
    let _a = c.start_agentk(1, 0, "agentk-0").await;

    let server = c.redis.as_ref().unwrap();
    let mut conn =
        redis_client_as(server, Some("kas"), Some("acl-secret")).get_multiplexed_async_connection().await.unwrap();
    let agent_key = format!("{}:agent:1", redis_prefix(&c));
    let mut records: usize;
    eventually!(
        {
            records = redis::cmd("HLEN").arg(&agent_key).query_async::<usize>(&mut conn).await.unwrap();
            records == 1
        },
        "kas wrote the connection record as ACL user kas (HLEN {agent_key} = {records})"
    );

    let bad = with_password(&c, "not-the-acl-secret");
    let k = c.start_kas_with(bad).await;
    c.kas.push(k);
    // What an operator sees: /readyz names the failure.
    let (code, err) = readyz(&c, 1).await;
    assert_eq!(code, 503, "{err}");
    assert!(
        err.starts_with("registry unavailable: redis") && err.to_lowercase().contains("authentication failed"),
        "not a clear authentication error: {err}"
    );
    assert!(!err.contains("not-the-acl-secret"), "the password must not appear in errors: {err}");
}

/// kas number `kas`'s `/readyz`: (status code, body).
async fn readyz(c: &Cluster, kas: usize) -> (u16, String) {
    let response = reqwest::get(format!("http://{}/readyz", c.kas[kas].addresses.observability)).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// The value of an unlabelled counter in Prometheus text, if present.
fn counter(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// README "Observability" (agentk): `agentk_failed_connection_attempts_total` counts real failed
/// connection attempts. A real agentk process dialing a port where nothing listens.
#[tokio::test]
async fn agentk_metrics_count_failed_connection_attempts() {
    kas_e2e::init_test_logging();
    let dir = tempfile::tempdir().unwrap();
    // A free port, closed again: connections to it are refused.
    let nothing = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let kube = kas_e2e::FakeKube::start().await;
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "some-agent-token").unwrap();
    let mut agentk = kas_e2e::process::start_agentk(nothing, &token, &kubeconfig, "agentk-0", "agentk");
    let line = agentk.wait_for_log("observability listening", |v| {
        kas_e2e::process::log_message(v).is_some_and(|m| m.starts_with("observability listening"))
    });
    let line = line.await;
    let address = line["fields"]["address"].as_str().unwrap().to_owned();
    let url = format!("http://{address}/metrics");
    let scrape = || async { reqwest::get(&url).await.unwrap().text().await.unwrap() };
    let name = agentk::metrics::FAILED_CONNECTION_ATTEMPTS;
    let mut first: Option<f64>;
    eventually!(
        {
            first = counter(&scrape().await, name);
            first.is_some_and(|n| n >= 1.0)
        },
        "{name} >= 1 (last: {first:?})"
    );
    let first = first.unwrap();
    let mut later: Option<f64>;
    eventually!(
        {
            later = counter(&scrape().await, name);
            later.is_some_and(|n| n > first)
        },
        "{name} increases past {first} with the next failed attempt (last: {later:?})"
    );
    let text = scrape().await;
    assert_eq!(counter(&text, agentk::metrics::CONNECTED), Some(0.0), "{text}");
}
