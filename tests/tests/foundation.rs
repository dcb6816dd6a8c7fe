//! The foundation scenarios: GitLab -> kas -> agentk -> Kubernetes API and back, on one kas.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use base64::Engine;
use kas_e2e::{Cluster, authorized, eventually};
use kas_proto::kas::{ConnectedAgentsByIdRequest, ConnectedAgentsForProjectRequest, GetPodsRequest, Pod};
use kas_proto::tunnel::pb::agent_tunnel_client::AgentTunnelClient;
use kas_proto::tunnel::pb::{self, ConfigurationRequest, ConnectRequest, connect_response};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

fn pods(v: &[(&str, &str)]) -> Vec<Pod> {
    v.iter().map(|(ns, n)| Pod { namespace: (*ns).into(), name: (*n).into() }).collect()
}

fn get_pods(agent_id: i64) -> GetPodsRequest {
    GetPodsRequest { agent_id, connection_id: 0 }
}

#[tokio::test]
async fn get_pods_end_to_end() {
    let c = Cluster::builder().start().await;
    c.kube.add_pod("default", "web-1");
    c.kube.add_pod("kube-system", "dns-1");
    let _a = c.start_agentk(1, 0, "agentk-0").await;

    let resp = c.api(0).get_pods(get_pods(1)).await.expect("GetPods").into_inner();
    let mut got = resp.pods;
    got.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    assert_eq!(got, pods(&[("default", "web-1"), ("kube-system", "dns-1")]));

    // agentk listed pods with its own (service account) credentials, never the caller's JWT.
    let reqs = c.kube.requests();
    let list = reqs.iter().find(|r| r.path == "/api/v1/pods").expect("a pods list reached the API server");
    assert_eq!(list.method, "GET");
    let auth = list.headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert_eq!(auth, format!("Bearer {}", c.kube.token()));
}

#[tokio::test]
async fn connected_agents_by_id_and_project_with_two_replicas() {
    let c = Cluster::builder().agents(&[(1, 10), (2, 10), (3, 11)]).start().await;
    // Each replica has its own API server, so an answer shows which replica served it.
    let (a0, _kube0) = c.start_agentk_with_own_cluster(1, 0, "agentk-0").await;
    let (a1, _kube1) = c.start_agentk_with_own_cluster(1, 0, "agentk-1").await;
    let _other = c.start_agentk(2, 0, "agentk-x").await;
    let mut api = c.api(0);

    let agents = c.connections(0, 1).await;
    assert_eq!(agents.len(), 2, "{agents:?}");
    let mut conn_ids: Vec<i64> = agents.iter().map(|a| a.connection_id).collect();
    conn_ids.sort();
    let mut expected = vec![a0.connection_id().unwrap(), a1.connection_id().unwrap()];
    expected.sort();
    assert_eq!(conn_ids, expected);
    let mut pod_names: Vec<&str> = agents.iter().map(|a| a.pod_name.as_str()).collect();
    pod_names.sort();
    assert_eq!(pod_names, vec!["agentk-0", "agentk-1"]);
    for a in &agents {
        assert_eq!(a.id, 1);
        assert_eq!(a.project_id, 10);
        assert_eq!(a.version, agentk::VERSION);
        assert_eq!(a.commit, agentk::COMMIT);
        assert_eq!(a.pod_namespace, "agentk");
        assert!(a.connected_at.is_some());
        let kas_address = a.kas_address.as_ref().expect("kas address");
        assert_eq!(kas_address.ip, c.kas[0].addresses.internal.ip().to_string());
        assert_eq!(kas_address.port, u32::from(c.kas[0].addresses.internal.port()));
    }

    let by_project = api
        .connected_agents_for_project(ConnectedAgentsForProjectRequest { project_id: 10 })
        .await
        .unwrap()
        .into_inner()
        .agents;
    let mut ids: Vec<i64> = by_project.iter().map(|a| a.id).collect();
    ids.sort();
    assert_eq!(ids, vec![1, 1, 2]);
    let other_project = api
        .connected_agents_for_project(ConnectedAgentsForProjectRequest { project_id: 11 })
        .await
        .unwrap()
        .into_inner()
        .agents;
    assert!(other_project.is_empty());

    // Both replicas serve requests; naming a connection reaches that replica.
    for (replica, conn) in [("agentk-0", a0.connection_id().unwrap()), ("agentk-1", a1.connection_id().unwrap())] {
        let pods = api.get_pods(GetPodsRequest { agent_id: 1, connection_id: conn }).await.unwrap().into_inner().pods;
        assert_eq!(pods, self::pods(&[("default", replica)]), "connection {conn} must reach {replica}");
    }
}

#[tokio::test]
async fn request_made_before_the_agent_connects_waits_then_succeeds() {
    let c = Cluster::builder().start().await;
    c.kube.add_pod("default", "early");
    let mut api = c.api(0);
    let call = tokio::spawn(async move { api.get_pods(get_pods(1)).await });
    let handle = c.kas[0].handle.clone();
    eventually!(handle.tunnel_stats().await.is_some_and(|s| s.waiting_requests == 1), "request parked in kas");
    assert!(!call.is_finished());

    let _a = c.start_agentk(1, 0, "late").await;
    let resp = call.await.unwrap().expect("served once the agent connected").into_inner();
    assert_eq!(resp.pods, pods(&[("default", "early")]));
}

#[tokio::test]
async fn request_for_an_agent_that_never_connects_fails_with_a_clear_message() {
    let c = Cluster::builder().max_wait(Duration::from_millis(300)).start().await;
    let err = c.api(0).get_pods(get_pods(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("agent 1 is not connected"), "{}", err.message());

    // A named connection that does not exist says so too.
    let err = c.api(0).get_pods(GetPodsRequest { agent_id: 1, connection_id: 42 }).await.unwrap_err();
    assert!(err.message().contains("connection 42 of agent 1 is not connected"), "{}", err.message());

    // A caller deadline shorter than max_wait ends the wait at the caller's deadline.
    let c = Cluster::builder().max_wait(Duration::from_secs(30)).start().await;
    // Set as raw metadata: tonic's client-side timeout would fire first (as CANCELLED).
    let mut req = tonic::Request::new(get_pods(1));
    req.metadata_mut().insert("grpc-timeout", "200m".parse().unwrap());
    let started = std::time::Instant::now();
    let err = c.api(0).get_pods(req).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));

    // Bad ids are the caller's fault.
    let err = c.api(0).get_pods(get_pods(0)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("agent_id must be a positive integer"));
}

#[tokio::test]
async fn agentk_restart_reconnects_and_serves_again() {
    let c = Cluster::builder().start().await;
    let mut api = c.api(0);
    let first = c.start_agentk(1, 0, "agentk-0").await;
    let first_conn = first.connection_id().unwrap();
    api.get_pods(get_pods(1)).await.expect("before restart");
    first.stop().await;
    eventually!(c.connections(0, 1).await.is_empty(), "connection record removed after agentk stopped");
    let second = c.start_agentk(1, 0, "agentk-0").await;
    assert_ne!(second.connection_id().unwrap(), first_conn);
    api.get_pods(get_pods(1)).await.expect("after restart");
    let agents = c.connections(0, 1).await;
    assert_eq!(agents.len(), 1);
    assert_eq!(agents[0].connection_id, second.connection_id().unwrap());
}

#[tokio::test]
async fn agentk_reconnects_after_kas_restarts_on_the_same_address() {
    let mut c = Cluster::builder().start().await;
    let a = c.start_agentk(1, 0, "agentk-0").await;
    let first_conn = a.connection_id().unwrap();
    let old = c.kas.remove(0);
    let addresses = old.addresses;
    old.stop().await;
    // A new kas on the same agent port; agentk's backoff brings it back.
    c.config.listeners.agent.address = addresses.agent.to_string();
    let k = c.start_kas().await;
    c.kas.push(k);
    eventually!(a.connection_id().is_some_and(|id| id != first_conn) && a.status.is_ready(), "agentk reconnected");
    c.api(0).get_pods(get_pods(1)).await.expect("served by the new kas");
}

fn jwt(secret: &kas::auth::Secret, iss: &str, aud: &str, exp_offset: i64) -> String {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        iss: &'a str,
        aud: &'a str,
        exp: i64,
        iat: i64,
    }
    let now = jsonwebtoken::get_current_timestamp() as i64;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &Claims { iss, aud, exp: now + exp_offset, iat: now },
        &jsonwebtoken::EncodingKey::from_secret(secret.bytes()),
    )
    .unwrap()
}

#[tokio::test]
async fn api_listener_rejects_every_bad_jwt_with_a_clear_message() {
    let c = Cluster::builder().max_wait(Duration::from_millis(100)).start().await;
    let s = &c.gitlab_secret;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let alg_none = format!(
        "{}.{}.",
        b64.encode(br#"{"alg":"none","typ":"JWT"}"#),
        b64.encode(format!(
            r#"{{"iss":"gitlab","aud":"gitlab-kas","exp":{}}}"#,
            jsonwebtoken::get_current_timestamp() + 60
        ))
    );
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        ("no token", None, "missing authorization"),
        ("wrong issuer", Some(jwt(s, "someone", "gitlab-kas", 60)), "wrong issuer"),
        ("wrong audience", Some(jwt(s, "gitlab", "gitlab", 60)), "wrong audience"),
        ("expired", Some(jwt(s, "gitlab", "gitlab-kas", -600)), "expired"),
        ("wrong secret", Some(jwt(&kas::auth::Secret::generate(), "gitlab", "gitlab-kas", 60)), "invalid signature"),
        ("alg none", Some(alg_none), "invalid JWT"),
        ("kas token", Some(c.internal_jwt()), "invalid"),
        ("garbage", Some("not-a-jwt".into()), "malformed token"),
    ];
    for (name, token, want) in cases {
        let mut api = c.api_with_token(0, token);
        for err in [
            api.get_pods(get_pods(1)).await.unwrap_err(),
            api.connected_agents_by_id(ConnectedAgentsByIdRequest { agent_id: 1 }).await.unwrap_err(),
            api.connected_agents_for_project(ConnectedAgentsForProjectRequest { project_id: 1 }).await.unwrap_err(),
        ] {
            assert_eq!(err.code(), Code::Unauthenticated, "{name}: {err:?}");
            assert!(err.message().contains(want), "{name}: {}", err.message());
        }
    }
    // The valid token passes authentication (and then fails for the real reason).
    let err = c.api(0).get_pods(get_pods(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
}

#[tokio::test]
async fn internal_listener_takes_only_kas_tokens_and_never_discovers() {
    let c = Cluster::builder().start().await;
    let a = c.start_agentk(1, 0, "agentk-0").await;
    let conn = a.connection_id().unwrap();
    // A GitLab token is rejected here.
    let err = c
        .internal_with_token(0, Some(c.gitlab_jwt()))
        .get_pods(GetPodsRequest { agent_id: 1, connection_id: conn })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let mut internal = c.internal_with_token(0, Some(c.internal_jwt()));
    internal.get_pods(GetPodsRequest { agent_id: 1, connection_id: conn }).await.expect("served from the local tunnel");
    // A connection this kas does not hold: "not here", at once.
    let err = internal.get_pods(GetPodsRequest { agent_id: 1, connection_id: conn + 1 }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("not connected to this kas"), "{}", err.message());
    // The internal API needs the connection named.
    let err = internal.get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn bad_agent_token_is_rejected() {
    let c = Cluster::builder().start().await;
    let mut client = AgentTunnelClient::new(kas_e2e::cluster::channel(c.kas[0].addresses.agent));
    let err = client
        .get_configuration(authorized(ConfigurationRequest { connection_id: 5, ..Default::default() }, "wrong"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("invalid agent token"));
    let err = client
        .get_configuration(tonic::Request::new(ConfigurationRequest { connection_id: 5, ..Default::default() }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let (_tx, rx) = mpsc::channel::<ConnectRequest>(1);
    let err = client.connect(authorized(ReceiverStream::new(rx), "wrong")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    // A real agentk with a wrong token never becomes ready and never shows up.
    let mut cfg = c.agentk_config(1, 0, "bad");
    let bad_token = c.dir.path().join("bad-token");
    std::fs::write(&bad_token, "wrong").unwrap();
    cfg.token_file = bad_token;
    let a = c.start_agentk_with(cfg).await;
    let mut attempts = a.status.failed_attempts.clone();
    attempts.wait_for(|n| *n >= 2).await.unwrap();
    assert!(!a.status.is_ready());
    assert!(c.connections(0, 1).await.is_empty());
}

#[tokio::test]
async fn configuration_is_streamed_and_not_resent_when_unchanged() {
    let doc: kas::agent::AgentConfigDocument =
        serde_norway::from_str("observability:\n  logging:\n    level: debug\n").unwrap();
    let c = Cluster::builder().agent_configuration(1, doc).start().await;
    let a = c.start_agentk(1, 0, "agentk-0").await;
    let received = a.status.configuration.borrow().clone().expect("configuration delivered on connect");
    let level = received.configuration.unwrap().observability.unwrap().logging.unwrap().level;
    assert_eq!(level, "debug");

    // A reconnecting agent that already has this commit gets no resend; a stale one does.
    let token = &c.agent(1).token;
    let mut client = AgentTunnelClient::new(kas_e2e::cluster::channel(c.kas[0].addresses.agent));
    let mut stale = client
        .get_configuration(authorized(ConfigurationRequest { connection_id: 77, ..Default::default() }, token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stale.message().await.unwrap().unwrap().commit_id, received.commit_id);
    let mut current = client
        .get_configuration(authorized(
            ConfigurationRequest { connection_id: 78, commit_id: received.commit_id.clone(), ..Default::default() },
            token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), current.message()).await.is_err(),
        "unchanged config resent"
    );

    // The same connection id twice is refused while the first is open.
    let err = client
        .get_configuration(authorized(ConfigurationRequest { connection_id: 77, ..Default::default() }, token))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
}

/// A hand-driven tunnel: descriptor first, then whatever the test sends.
async fn raw_tunnel(
    c: &Cluster,
    first: ConnectRequest,
) -> (mpsc::Sender<ConnectRequest>, Result<tonic::Streaming<pb::ConnectResponse>, tonic::Status>) {
    let mut client = AgentTunnelClient::new(kas_e2e::cluster::channel(c.kas[0].addresses.agent));
    let (tx, rx) = mpsc::channel(8);
    tx.send(first).await.unwrap();
    let r = client.connect(authorized(ReceiverStream::new(rx), &c.agent(1).token)).await.map(|r| r.into_inner());
    (tx, r)
}

#[tokio::test]
async fn out_of_order_tunnel_frames_are_rejected_without_a_panic() {
    let c = Cluster::builder().max_wait(Duration::from_secs(5)).start().await;

    // 1. A first frame that is not a Descriptor.
    let (_tx, r) = raw_tunnel(&c, ConnectRequest::header(pb::Header::default())).await;
    let err = r.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("unexpected Header frame before the Descriptor"), "{}", err.message());
    // An empty frame.
    let (_tx, r) = raw_tunnel(&c, ConnectRequest { msg: None }).await;
    assert_eq!(r.unwrap_err().code(), Code::InvalidArgument);

    // 2. A body message before the Header, after kas sent a request.
    let descriptor = ConnectRequest::descriptor(pb::Descriptor {
        connection_id: 9,
        methods: vec![kas_proto::get_pods::METHOD.into()],
        // An agentk that predates response credit.
        response_credit: false,
        reusable: false,
    });
    let (tx, r) = raw_tunnel(&c, descriptor).await;
    let mut inbound = r.expect("tunnel accepted");
    let mut api = c.api(0);
    let call = tokio::spawn(async move { api.get_pods(get_pods(1)).await });
    let first = inbound.message().await.unwrap().unwrap();
    assert!(matches!(first.msg, Some(connect_response::Msg::RequestInfo(_))));
    tx.send(ConnectRequest::message(bytes::Bytes::from_static(b"early"))).await.unwrap();
    // kas ends this tunnel with INVALID_ARGUMENT ...
    let ended = loop {
        match inbound.message().await {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    let err = ended.expect_err("tunnel ended with a status");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("unexpected Message frame before the Header"), "{}", err.message());
    // ... and the caller gets a clean error, not a hang or a panic.
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("tunnel protocol violation"), "{}", err.message());

    // kas keeps serving well-behaved agents.
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    c.api(0).get_pods(get_pods(1)).await.expect("kas still serves");
}

#[tokio::test]
async fn api_server_errors_reach_the_caller_with_agentk_context() {
    let c = Cluster::builder().start().await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    c.kube.fail_with(Some(http::StatusCode::FORBIDDEN));
    let err = c.api(0).get_pods(get_pods(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().starts_with("agentk: Kubernetes API:"), "{}", err.message());
    c.kube.fail_with(None);
    c.api(0).get_pods(get_pods(1)).await.expect("works again");
}

#[tokio::test]
async fn agentk_shutdown_finishes_in_flight_requests() {
    let c = Cluster::builder().start().await;
    c.kube.add_pod("default", "slow");
    let a = c.start_agentk(1, 0, "agentk-0").await;
    c.kube.delay(Some(Duration::from_millis(500)));
    let mut api = c.api(0);
    let call = tokio::spawn(async move { api.get_pods(get_pods(1)).await });
    let kube = c.kube.clone();
    eventually!(kube.requests().iter().any(|r| r.path == "/api/v1/pods"), "request reached the API server");
    // SIGTERM-equivalent while the request is in flight: agentk lets it finish.
    let stopping = tokio::spawn(a.stop());
    let resp = call.await.unwrap().expect("in-flight request completed during shutdown").into_inner();
    assert_eq!(resp.pods, pods(&[("default", "slow")]));
    stopping.await.unwrap();
    // And the agent is gone afterwards.
    eventually!(c.connections(0, 1).await.is_empty(), "connection removed after agentk stopped");
}
