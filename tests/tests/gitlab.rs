//! GitLab mode: agent tokens verified by (a fake) GitLab's internal API, cached, rate limited.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use axum::http::StatusCode;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kas::auth::Secret;
use kas_e2e::{Cluster, eventually};
use kas_proto::kas::GetPodsRequest;
use tonic::Code;

fn gitlab(c: &Cluster) -> &kas_e2e::FakeGitlab {
    c.gitlab.as_ref().unwrap()
}

#[tokio::test]
async fn agent_verified_by_gitlab_serves_get_pods_and_is_cached() {
    let c = Cluster::builder().gitlab().start().await;
    assert!(c.config.agents.static_file.is_none(), "no static agents file in GitLab mode");
    c.kube.add_pod("default", "web-1");
    let a = c.start_agentk(1, 0, "agentk-0").await;
    let pods = c.api(0).get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap().into_inner().pods;
    assert_eq!(pods.len(), 1);
    // Presence and every tunnel authenticated; they shared one GitLab request.
    assert_eq!(gitlab(&c).requests(), 1);
    assert_eq!(gitlab(&c).jwt_rejections(), 0);

    // A second connection of the same agent within the TTL: no new GitLab request.
    let b = c.start_agentk(1, 0, "agentk-1").await;
    assert_ne!(a.connection_id(), b.connection_id());
    c.open_configuration(1, "").await.unwrap();
    assert_eq!(gitlab(&c).requests(), 1);

    // A token GitLab does not know.
    let e = c.open_configuration_with_token("not-a-token", "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("invalid agent token"), "{e:?}");
    assert!(!e.message().contains("not-a-token"));
    assert_eq!(gitlab(&c).requests(), 2);

    // Both outcomes are counted.
    c.assert_metrics(
        0,
        &[r#"kas_gitlab_requests_total{outcome="ok"}"#, r#"kas_gitlab_requests_total{outcome="unauthenticated"}"#],
    )
    .await;
}

#[tokio::test]
async fn concurrent_verifications_of_one_token_make_one_gitlab_request() {
    let c = Cluster::builder().gitlab().start().await;
    gitlab(&c).set_delay(Duration::from_millis(300));
    let token = c.agent(1).token.clone();
    let streams = futures::future::join_all((0..20).map(|_| c.open_configuration_with_token(&token, ""))).await;
    for s in streams {
        s.unwrap();
    }
    assert_eq!(gitlab(&c).requests(), 1);
}

#[tokio::test]
async fn revoked_token_is_rejected_after_the_cache_ttl() {
    let c = Cluster::builder()
        .gitlab()
        .configure(|config, _| {
            config.gitlab.agent_info_cache.ttl = Duration::from_millis(500);
            config.gitlab.agent_info_cache.error_ttl = Duration::from_millis(500);
        })
        .start()
        .await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let token = c.agent(1).token.clone();
    c.open_configuration_with_token(&token, "").await.unwrap();
    gitlab(&c).revoke(&token);
    eventually!(
        c.open_configuration_with_token(&token, "").await.is_err_and(|e| e.code() == Code::Unauthenticated),
        "the revoked token is rejected once its cache entry expired"
    );
    // And a new agentk with it never becomes ready.
    let b = c.start_agentk_with(c.agentk_config(1, 0, "agentk-1")).await;
    let mut attempts = b.status.failed_attempts.clone();
    attempts.wait_for(|n| *n >= 1).await.unwrap();
    assert!(!b.status.is_ready());
}

#[tokio::test]
async fn forbidden_token_is_permission_denied() {
    let c = Cluster::builder().gitlab().start().await;
    gitlab(&c).forbid(&c.agent(1).token);
    let e = c.open_configuration(1, "").await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("403"), "{e:?}");
}

#[tokio::test]
async fn failing_gitlab_is_unavailable_and_errors_are_cached_briefly() {
    let c = Cluster::builder().agents(&[(1, 10), (2, 10)]).gitlab().start().await;
    gitlab(&c).fail_with(Some(axum::http::StatusCode::INTERNAL_SERVER_ERROR));
    let e = c.open_configuration(1, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("GitLab is unavailable: agent_info answered HTTP 500"), "{e:?}");
    gitlab(&c).fail_with(None);
    c.open_configuration(2, "").await.unwrap();
    // Agent 1's failure is remembered for gitlab.agent_info_cache.error_ttl (10 s by default).
    let before = gitlab(&c).requests();
    assert_eq!(c.open_configuration(1, "").await.unwrap_err().code(), Code::Unavailable);
    assert_eq!(gitlab(&c).requests(), before);
}

#[tokio::test]
async fn unreachable_gitlab_is_unavailable() {
    // A port held by a bound socket that never listens: connections are refused, and no other
    // server (e.g. a fake GitLab started meanwhile) can take the port, as it could once freed.
    let closed = tokio::net::TcpSocket::new_v4().unwrap();
    closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let address = format!("http://{}", closed.local_addr().unwrap());
    let c = Cluster::builder().gitlab().configure(move |config, _| config.gitlab.address = Some(address)).start().await;
    let e = c.open_configuration(1, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("cannot connect to GitLab"), "{e:?}");
    assert!(!e.message().contains(&c.agent(1).token));
}

#[tokio::test]
async fn kas_signing_with_the_wrong_secret_is_rejected_by_gitlab() {
    let c = Cluster::builder()
        .gitlab()
        .configure(|config, dir| {
            let other = dir.join("other-gitlab-secret");
            std::fs::write(&other, Secret::generate().to_file_text()).unwrap();
            config.gitlab.authentication_secret_file = Some(other);
        })
        .start()
        .await;
    let e = c.open_configuration(1, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert_eq!(gitlab(&c).jwt_rejections(), 1);
}

/// The fake applies GitLab's rules to the `Gitlab-Kas-Api-Request` JWT (so the tests above
/// prove kas follows them): each wrong claim is a 401.
#[tokio::test]
async fn fake_gitlab_checks_the_kas_jwt_like_gitlab() {
    let secret = Secret::generate();
    let fake = kas_e2e::FakeGitlab::start(&secret).await;
    let agent = kas_e2e::fake_gitlab::GitlabAgent { agent_id: 3, project_id: 7, name: "a".into() };
    fake.add_agent("tok", agent);
    let now = jsonwebtoken::get_current_timestamp();
    let jwt = |alg: Algorithm, key: &Secret, iss: &str, aud: &str, exp: u64| {
        let claims = serde_json::json!({ "iss": iss, "aud": aud, "iat": now, "exp": exp });
        jsonwebtoken::encode(&Header::new(alg), &claims, &EncodingKey::from_secret(key.bytes())).unwrap()
    };
    let http = reqwest::Client::new();
    let call = |jwt: Option<String>| {
        let mut r = http
            .get(format!("{}/api/v4/internal/kubernetes/agent_info", fake.url()))
            .header("authorization", "Bearer tok");
        if let Some(jwt) = jwt {
            r = r.header("Gitlab-Kas-Api-Request", jwt);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    let good = jwt(Algorithm::HS256, &secret, "gitlab-kas", "gitlab", now + 5);
    assert_eq!(call(Some(good)).await, 200);
    assert_eq!(call(Some(jwt(Algorithm::HS256, &secret, "gitlab", "gitlab", now + 5))).await, 401);
    assert_eq!(call(Some(jwt(Algorithm::HS256, &secret, "gitlab-kas", "gitlab-kas", now + 5))).await, 401);
    assert_eq!(call(Some(jwt(Algorithm::HS256, &Secret::generate(), "gitlab-kas", "gitlab", now + 5))).await, 401);
    assert_eq!(call(Some(jwt(Algorithm::HS256, &secret, "gitlab-kas", "gitlab", now - 60))).await, 401);
    assert_eq!(call(Some(jwt(Algorithm::HS512, &secret, "gitlab-kas", "gitlab", now + 5))).await, 401);
    assert_eq!(call(None).await, 401);
    assert_eq!(fake.jwt_rejections(), 6);
    // And kas's own minting passes.
    let kas_jwt = kas::auth::mint_jwt(&secret, "gitlab-kas", "gitlab", Duration::from_secs(5)).unwrap();
    assert_eq!(call(Some(kas_jwt)).await, 200);
}

/// GitLab served over HTTPS with a private CA: kas trusts it through `gitlab.ca_cert_file`.
#[tokio::test]
async fn gitlab_over_tls_with_a_custom_ca_verifies_agents() {
    let c = Cluster::builder().gitlab_tls().start().await;
    let fake = gitlab(&c);
    assert!(fake.url().starts_with("https://localhost:"), "{}", fake.url());
    assert_eq!(c.config.gitlab.address.as_deref(), Some(fake.url().as_str()));
    assert_eq!(c.config.gitlab.ca_cert_file.as_deref(), fake.ca_file());
    assert!(fake.ca_pem().unwrap().contains("BEGIN CERTIFICATE"));
    // Fails fast (with kas's reason) if kas does not trust the certificate.
    c.open_configuration(1, "").await.unwrap();
    c.kube.add_pod("default", "web-1");
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let pods = c.api(0).get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap().into_inner().pods;
    assert_eq!(pods.len(), 1);
    // The presence call above, agentk's presence and tunnels: one GitLab request (cached).
    assert_eq!(fake.requests(), 1);
    assert_eq!(fake.jwt_rejections(), 0);
    assert_eq!(fake.tls_handshake_failures(), 0);
    // Unknown tokens get GitLab's answer over TLS too.
    let e = c.open_configuration_with_token("not-a-token", "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert_eq!(fake.requests(), 2);
}

/// The same HTTPS GitLab without `gitlab.ca_cert_file`: kas does not trust the certificate, so
/// verification fails as UNAVAILABLE (GitLab unusable), naming the failed request, not the token.
#[tokio::test]
async fn gitlab_over_tls_without_its_ca_is_unavailable() {
    let c = Cluster::builder().gitlab_tls().configure(|config, _| config.gitlab.ca_cert_file = None).start().await;
    assert!(c.config.gitlab.ca_cert_file.is_none());
    let fake = gitlab(&c);
    let token = &c.agent(1).token;
    let e = c.open_configuration_with_token(token, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().starts_with("GitLab is unavailable: "), "{e:?}");
    assert!(e.message().to_lowercase().contains("certificate"), "{e:?}");
    assert!(!e.message().contains(token.as_str()), "{e:?}");
    // kas reached the server and refused its certificate: no HTTP request was made.
    eventually!(fake.tls_handshake_failures() >= 1, "the fake saw the refused TLS handshake");
    assert_eq!(fake.requests(), 0);
    // An agentk with that token never becomes ready.
    let b = c.start_agentk_with(c.agentk_config(1, 0, "agentk-0")).await;
    let mut attempts = b.status.failed_attempts.clone();
    attempts.wait_for(|n| *n >= 1).await.unwrap();
    assert!(!b.status.is_ready());
    assert_eq!(fake.requests(), 0);
}

/// kas does not follow redirects from GitLab (its agent token would go wherever a redirect
/// points): a 3xx is UNAVAILABLE naming the status, and the target gets no request.
#[tokio::test]
async fn gitlab_redirects_are_not_followed() {
    let c = Cluster::builder().agents(&[(1, 10), (2, 10)]).gitlab().start().await;
    let fake = gitlab(&c);
    // Agent 1: 302 to another GitLab that knows the token.
    let other = kas_e2e::FakeGitlab::start(&c.gitlab_secret).await;
    let agent = kas_e2e::fake_gitlab::GitlabAgent { agent_id: 1, project_id: 10, name: "agent-1".into() };
    other.add_agent(&c.agent(1).token, agent);
    let path = "/api/v4/internal/kubernetes/agent_info";
    fake.redirect_to(Some((StatusCode::FOUND, format!("{}{path}", other.url()))));
    let token = &c.agent(1).token;
    let e = c.open_configuration_with_token(token, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("agent_info answered HTTP 302"), "{e:?}");
    assert!(!e.message().contains(token.as_str()), "{e:?}");
    assert_eq!(fake.requests(), 1);
    assert_eq!(other.requests(), 0, "the redirect target got a request");

    // Agent 2: 307 to the same GitLab (same origin: a follower would even keep the token).
    let same_origin = format!("{}{path}?redirected=1", fake.url());
    fake.redirect_to(Some((StatusCode::TEMPORARY_REDIRECT, same_origin)));
    let token = &c.agent(2).token;
    let e = c.open_configuration_with_token(token, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("agent_info answered HTTP 307"), "{e:?}");
    assert!(!e.message().contains(token.as_str()), "{e:?}");
    assert_eq!(fake.requests(), 2);
    assert_eq!(fake.query_requests(), 0, "the redirect target got a request");

    // The redirect leads somewhere that works: a client following it gets the agent's info.
    let jwt = kas::auth::mint_jwt(&c.gitlab_secret, "gitlab-kas", "gitlab", Duration::from_secs(5)).unwrap();
    let followed = reqwest::Client::new()
        .get(format!("{}{path}", fake.url()))
        .header("authorization", format!("Bearer {token}"))
        .header("Gitlab-Kas-Api-Request", jwt)
        .send()
        .await
        .unwrap();
    assert_eq!(followed.status(), 200);
    assert_eq!(followed.json::<serde_json::Value>().await.unwrap()["agent_id"], 2);
    assert_eq!(fake.query_requests(), 1);
}

/// `gitlab.rate_limit` end to end: with 1 request/s, burst 1 and no waiting, a second GitLab
/// request right after the first is refused by kas itself; once the bucket refills, requests
/// reach GitLab again.
#[tokio::test]
async fn gitlab_requests_are_rate_limited() {
    let c = Cluster::builder()
        .gitlab()
        .configure(|config, _| {
            let rl = &mut config.gitlab.rate_limit;
            rl.requests_per_second = 1;
            rl.burst = 1;
            rl.max_wait = Duration::ZERO;
        })
        .start()
        .await;
    let fake = gitlab(&c);
    // Distinct unknown tokens: none is answered from the cache.
    let unknown = |n: u32| format!("unknown-token-{n}-{}", rand::random::<u64>());
    let first = unknown(0);
    let e = c.open_configuration_with_token(&first, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert_eq!(fake.requests(), 1);

    // Milliseconds later the bucket holds a tiny fraction of a token: refused without a request.
    let second = unknown(1);
    let e = c.open_configuration_with_token(&second, "").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("GitLab is unavailable: rate limited"), "{e:?}");
    assert!(!e.message().contains(&second), "{e:?}");
    assert_eq!(fake.requests(), 1, "a rate-limited verification reached GitLab");

    // The bucket refills (1 token/s): a later verification reaches GitLab again. Refused
    // attempts meanwhile make no request and reserve nothing.
    let mut n = 2;
    eventually!(
        {
            n += 1;
            let token = unknown(n);
            match c.open_configuration_with_token(&token, "").await {
                Err(e) if e.code() == Code::Unavailable => {
                    assert!(e.message().contains("rate limited") && !e.message().contains(&token), "{e:?}");
                    assert_eq!(fake.requests(), 1);
                    false
                }
                Err(e) if e.code() == Code::Unauthenticated => true,
                other => panic!("unexpected answer: {other:?}"),
            }
        },
        "a verification reaches GitLab once the bucket refilled"
    );
    assert_eq!(fake.requests(), 2);
    assert_eq!(fake.jwt_rejections(), 0);
}
