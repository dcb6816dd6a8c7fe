//! Concurrency limits per kas and per agent: a clear RESOURCE_EXHAUSTED / 429 when reached, and
//! a streaming request holds its slot for as long as it streams.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kas_e2e::{Cluster, authorized, eventually};
use kas_proto::kas::{GetPodsRequest, KubernetesRequest};
use kas_proto::kubernetes_api::{HttpFrame, HttpRequestHead};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

#[tokio::test]
async fn a_watch_holds_the_agents_only_slot_until_it_ends() {
    let c = Cluster::builder()
        .agents(&[(1, 10), (2, 10)])
        .configure(|config, _| config.routing.max_concurrent_requests_per_agent = 1)
        .start()
        .await;
    let _a1 = c.start_agentk(1, 0, "a1").await;
    let _a2 = c.start_agentk(2, 0, "a2").await;
    let watch = c.open_watch(1).await;

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
    let (tx, _frames) = c.open_watch(1).await;
    let err = c.api(0).get_pods(GetPodsRequest { agent_id: 2, connection_id: 0 }).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("kas is at its limit of 1 concurrent requests"), "{}", err.message());
    drop(tx);
}

#[tokio::test]
async fn new_agent_connections_are_rate_limited_but_tunnels_are_not() {
    use kas_proto::tunnel::pb::agent_tunnel_client::AgentTunnelClient;
    use kas_proto::tunnel::pb::{ConfigurationRequest, ConnectRequest, Descriptor};
    let c = Cluster::builder().configure(|config, _| config.limits.agent_connections_per_minute = 2).start().await;
    let token = c.agent(1).token.clone();
    let mut client = AgentTunnelClient::new(kas_e2e::cluster::channel(c.kas[0].addresses.agent));
    let mut streams = Vec::new();
    for id in 1..=2 {
        let req = ConfigurationRequest { connection_id: id, ..Default::default() };
        streams.push(client.get_configuration(authorized(req, &token)).await.expect("within the limit"));
    }
    let req = ConfigurationRequest { connection_id: 3, ..Default::default() };
    let err = client.get_configuration(authorized(req, &token)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("the limit is 2 (limits.agent_connections_per_minute)"), "{}", err.message());
    // Tunnels do not count: many can still be opened.
    for _ in 0..5 {
        let (tx, rx) = mpsc::channel(2);
        let descriptor = Descriptor {
            connection_id: 1,
            methods: vec![kas_proto::get_pods::METHOD.into()],
            response_credit: false,
            reusable: false,
        };
        tx.send(ConnectRequest::descriptor(descriptor)).await.unwrap();
        client.connect(authorized(ReceiverStream::new(rx), &token)).await.expect("tunnels are not rate limited");
        drop(tx);
    }
}

#[tokio::test]
async fn oversized_grpc_messages_and_http_headers_are_refused() {
    let c = Cluster::builder()
        .configure(|config, _| {
            config.limits.max_grpc_message_bytes = 1024;
            config.limits.max_http_header_bytes = 16 * 1024;
        })
        .start()
        .await;
    let _a = c.start_agentk(1, 0, "a1").await;
    // A request body message over the gRPC limit ends the call.
    let (tx, rx) = mpsc::channel(4);
    let head = HttpRequestHead {
        method: "POST".into(),
        path: "/api/v1/namespaces/default/pods".into(),
        headers: Default::default(),
    };
    tx.send(KubernetesRequest { agent_id: 1, connection_id: 0, frame: Some(HttpFrame::request_head(head)) })
        .await
        .unwrap();
    let big = HttpFrame::body(vec![b'x'; 4096].into());
    tx.send(KubernetesRequest { agent_id: 0, connection_id: 0, frame: Some(big) }).await.unwrap();
    drop(tx);
    let outcome = match c.api(0).make_kubernetes_request(ReceiverStream::new(rx)).await {
        Err(status) => status,
        Ok(resp) => {
            let mut frames = resp.into_inner();
            loop {
                match frames.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("the oversized message was accepted"),
                    Err(status) => break status,
                }
            }
        }
    };
    // README: a message over limits.max_grpc_message_bytes is OUT_OF_RANGE, also mid-exchange.
    assert_eq!(outcome.code(), tonic::Code::OutOfRange, "{outcome:?}");
    assert!(outcome.message().contains("too large"), "{outcome:?}");
    // An HTTP request head over the limit: 431.
    let url = format!("{}/api/v1/agents/1/pods", c.rest_url(0));
    let resp = reqwest::Client::new()
        .get(&url)
        .bearer_auth(c.gitlab_jwt())
        .header("x-padding", "p".repeat(32 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 431);
}

/// Issue 12 item 8: wrong agent tokens are counted, and bounded per peer address: after the
/// burst (`auth.failed_agent_authentications`, 20 by default) further attempts are refused at once
/// with RESOURCE_EXHAUSTED, without asking GitLab.
#[tokio::test]
async fn wrong_agent_tokens_are_bounded_per_peer_and_do_not_reach_gitlab_beyond_the_burst() {
    use kas_proto::tunnel::pb::ConfigurationRequest;
    use kas_proto::tunnel::pb::agent_tunnel_client::AgentTunnelClient;
    let c = Cluster::builder().gitlab().start().await;
    let gitlab = c.gitlab.as_ref().unwrap();
    let mut client = AgentTunnelClient::new(kas_e2e::cluster::channel(c.kas[0].addresses.agent));
    let before = gitlab.requests();
    let started = std::time::Instant::now();
    let (mut unauthenticated, mut exhausted) = (0, 0);
    let attempts = 60;
    for i in 0..attempts {
        let req = ConfigurationRequest { connection_id: 1, ..Default::default() };
        let err = client.get_configuration(authorized(req, &format!("wrong-token-{i}"))).await.unwrap_err();
        match err.code() {
            Code::Unauthenticated => unauthenticated += 1,
            Code::ResourceExhausted => {
                assert!(err.message().contains("auth.failed_agent_authentications"), "{}", err.message());
                exhausted += 1;
            }
            other => panic!("unexpected {other:?}: {}", err.message()),
        }
    }
    let took = started.elapsed();
    let asked_gitlab = gitlab.requests() - before;
    eprintln!(
        "{attempts} wrong tokens in {took:?}: {unauthenticated} verified, {exhausted} refused unverified, {asked_gitlab} GitLab requests"
    );
    // The burst, plus what refilled (1/s) while the test ran.
    let allowed = 20 + took.as_secs() as usize + 1;
    assert!(unauthenticated <= allowed, "{unauthenticated} attempts verified (allowed {allowed})");
    assert!(asked_gitlab <= allowed, "{asked_gitlab} GitLab requests (allowed {allowed})");
    assert_eq!(unauthenticated + exhausted, attempts);
    c.assert_metrics(
        0,
        &[
            r#"kas_auth_failures_total{listener="agent",reason="invalid_token"}"#,
            r#"kas_auth_failures_total{listener="agent",reason="rate_limited"}"#,
        ],
    )
    .await;
}

/// Issue 12 item 9 (JWT) across listeners: a far `exp` or a future `iat` is refused on the api
/// (UNAUTHENTICATED) and rest (401 problem+json) listeners, saying which check failed; an `aud`
/// array containing `gitlab-kas` is accepted. Refusals are counted per listener.
#[tokio::test]
async fn jwt_lifetime_and_audience_checks_on_the_api_and_rest_listeners() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let c = Cluster::builder().start().await;
    let sign = |claims: serde_json::Value| {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(c.gitlab_secret.bytes()),
        )
        .unwrap()
    };
    let now = jsonwebtoken::get_current_timestamp() as i64;
    let forever =
        sign(serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "iat": now, "exp": 253_402_300_799_i64}));
    let future = sign(serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "iat": now + 3600, "exp": now + 3660}));
    let array = sign(serde_json::json!({"iss": "gitlab", "aud": ["gitlab-kas", "other"], "iat": now, "exp": now + 60}));
    let req = || kas_proto::kas::ConnectedAgentsByIdRequest { agent_id: 1 };

    let err = c.api_with_token(0, Some(forever.clone())).connected_agents_by_id(req()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("lifetime") && err.message().contains("auth.jwt_max_lifetime"), "{}", err.message());
    let err = c.api_with_token(0, Some(future.clone())).connected_agents_by_id(req()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("issued in the future"), "{}", err.message());
    c.api_with_token(0, Some(array.clone())).connected_agents_by_id(req()).await.expect("aud array with gitlab-kas");

    let http = reqwest::Client::new();
    let url = format!("{}/api/v1/agents/1/connections", c.rest_url(0));
    for (token, expect) in [(&forever, "lifetime"), (&future, "issued in the future")] {
        let resp = http.get(&url).bearer_auth(token).send().await.unwrap();
        assert_eq!(resp.status(), reqwest::StatusCode::UNAUTHORIZED);
        let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
        assert_eq!(content_type, "application/problem+json");
        let body = resp.text().await.unwrap();
        assert!(body.contains(expect), "{body}");
    }
    let resp = http.get(&url).bearer_auth(&array).send().await.unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::OK, "{}", resp.text().await.unwrap());
    c.assert_metrics(
        0,
        &[
            r#"kas_auth_failures_total{listener="api",reason="lifetime_too_long"}"#,
            r#"kas_auth_failures_total{listener="api",reason="iat_in_future"}"#,
            r#"kas_auth_failures_total{listener="rest",reason="lifetime_too_long"}"#,
        ],
    )
    .await;
}
