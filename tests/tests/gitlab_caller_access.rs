//! kas's GitLab client for Kubernetes API proxy callers (CI job tokens, personal access
//! tokens), driven against the fake GitLab: answers parsed, refusals mapped, answers cached per
//! token, concurrent callers sharing one request, the agent_info request bucket shared.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use kas::auth::Secret;
use kas::auth::gitlab::caller_access::{
    AllowedAgentsForJob, CiAccessAs, EnvironmentInfo, ExtraKeyVal, Impersonate, ProxyUserAccessType, RoleGrant,
    UserAccessAs,
};
use kas::auth::gitlab::config::CallerCacheConfig;
use kas::auth::gitlab::{CallerAccess, GitlabClient, GitlabConfig, GitlabVerifier};
use kas::error::KasError;
use kas_e2e::fake_gitlab::{FakeAllowedAgent, FakeEnvironment, FakeJob, FakeUser, GitlabAgent};
use kas_e2e::{FakeGitlab, eventually};
use kas_proto::{AgentId, ProjectId};
use serde_json::json;
use tonic::Code;

const JOB_TOKEN: &str = "glcbt-64-job-token-never-in-messages";
const PAT: &str = "glpat-user-token-never-in-messages";
const PAT_ACCESS: ProxyUserAccessType = ProxyUserAccessType::PersonalAccessToken;

/// A fake GitLab knowing agents 1, 2 and 3 (configuration projects 10, 20, 30), and kas's
/// caller access to it with `cache`.
async fn setup(cache: CallerCacheConfig) -> (FakeGitlab, CallerAccess, GitlabConfig, Secret) {
    let secret = Secret::generate();
    let fake = FakeGitlab::start(&secret).await;
    for id in 1..=3 {
        fake.add_agent(
            &format!("agent-token-{id}"),
            GitlabAgent { agent_id: id, project_id: id * 10, name: format!("a{id}") },
        );
    }
    let config = GitlabConfig { caller_cache: cache, ..Default::default() };
    let client = GitlabClient::new(&config, &fake.url(), secret.clone()).unwrap();
    let access = CallerAccess::new(Arc::new(client), &config.caller_cache);
    (fake, access, config, secret)
}

fn short_ttl() -> CallerCacheConfig {
    CallerCacheConfig { ttl: Duration::from_millis(300), error_ttl: Duration::from_millis(300), max_entries: 100 }
}

/// A deploy job of project 100 (in groups 7 and 8) to `production`, allowed to use agent 1 as
/// itself (`ci_job`), agent 2 impersonating `deployer`, agent 3 as the agent.
fn deploy_job() -> FakeJob {
    let impersonate = json!({"impersonate": {"username": "deployer", "uid": "1000", "groups": ["ops"],
                                             "extra": [{"key": "reason", "val": ["deploy"]}]}});
    FakeJob {
        job_id: 501,
        pipeline_id: 401,
        project_id: 100,
        group_ids: vec![7, 8],
        environment: Some(FakeEnvironment { slug: "production".into(), tier: "production".into() }),
        user_id: 42,
        username: "alice".into(),
        allowed_agents: vec![
            FakeAllowedAgent {
                agent_id: 1,
                config_project_id: 10,
                configuration: json!({"default_namespace": "apps", "access_as": {"ci_job": {}},
                                      "environments": ["production"]}),
            },
            FakeAllowedAgent { agent_id: 2, config_project_id: 20, configuration: json!({"access_as": impersonate}) },
            FakeAllowedAgent { agent_id: 3, config_project_id: 30, configuration: json!({}) },
        ],
    }
}

fn assert_unauthenticated(e: &KasError, token: &str, says: &str) {
    assert_eq!(e.grpc_code(), Code::Unauthenticated, "{e}");
    assert!(e.to_string().contains(says), "{e}");
    assert!(!e.to_string().contains(token), "{e}");
}

#[tokio::test]
async fn job_token_gets_its_allowed_agents_parsed_and_cached() {
    let (fake, access, _, _) = setup(CallerCacheConfig::default()).await;
    fake.add_job(JOB_TOKEN, deploy_job());
    let a: Arc<AllowedAgentsForJob> = access.allowed_agents_for_job(JOB_TOKEN).await.unwrap();
    assert_eq!((a.job.id, a.pipeline.id, a.project.id), (501, 401, ProjectId(100)));
    assert_eq!(a.project.groups.iter().map(|g| g.id).collect::<Vec<_>>(), [7, 8]);
    assert_eq!(a.environment, Some(EnvironmentInfo { slug: "production".into(), tier: "production".into() }));
    assert_eq!((a.user.id, a.user.username.as_str()), (42, "alice"));
    let agents: Vec<_> = a
        .allowed_agents
        .iter()
        .map(|x| {
            (x.id, x.config_project.id, x.configuration.default_namespace.as_str(), x.configuration.access_as.clone())
        })
        .collect();
    let impersonate = Impersonate {
        username: "deployer".into(),
        uid: "1000".into(),
        groups: vec!["ops".into()],
        extra: vec![ExtraKeyVal { key: "reason".into(), val: vec!["deploy".into()] }],
    };
    assert_eq!(
        agents,
        vec![
            (AgentId(1), ProjectId(10), "apps", CiAccessAs::CiJob),
            (AgentId(2), ProjectId(20), "", CiAccessAs::Impersonate(impersonate)),
            (AgentId(3), ProjectId(30), "", CiAccessAs::Agent),
        ]
    );
    assert!(a.agent(AgentId(2)).is_some() && a.agent(AgentId(4)).is_none());
    assert_eq!(fake.allowed_agents_requests(), 1);

    // Within the TTL (10 s by default) the answer is reused.
    let again = access.allowed_agents_for_job(JOB_TOKEN).await.unwrap();
    assert!(Arc::ptr_eq(&a, &again));
    assert_eq!(fake.allowed_agents_requests(), 1);
    assert_eq!(fake.jwt_rejections(), 0);
}

#[tokio::test]
async fn unknown_job_token_is_unauthenticated_and_the_refusal_is_cached() {
    let (fake, access, _, _) = setup(CallerCacheConfig::default()).await;
    let e = access.allowed_agents_for_job(JOB_TOKEN).await.unwrap_err();
    assert_unauthenticated(&e, JOB_TOKEN, "the CI job token is not valid");
    assert!(e.to_string().contains("GitLab answered 401 Unauthorized"), "{e}");
    // Remembered for error_ttl (5 s by default): no second request.
    access.allowed_agents_for_job(JOB_TOKEN).await.unwrap_err();
    assert_eq!(fake.allowed_agents_requests(), 1);
    // A job token GitLab never sees: refused by kas.
    let e = access.allowed_agents_for_job("").await.unwrap_err();
    assert_unauthenticated(&e, JOB_TOKEN, "the CI job token is empty");
    assert_eq!(fake.allowed_agents_requests(), 1);
}

/// A job that ended (its token revoked) loses access once its answer's TTL is over.
#[tokio::test]
async fn revoked_job_token_stops_working_within_the_ttl() {
    let cache = short_ttl();
    let (fake, access, _, _) = setup(cache.clone()).await;
    fake.add_job(JOB_TOKEN, deploy_job());
    let fetched = tokio::time::Instant::now();
    access.allowed_agents_for_job(JOB_TOKEN).await.unwrap();
    fake.revoke_job(JOB_TOKEN);
    eventually!(
        access.allowed_agents_for_job(JOB_TOKEN).await.is_err_and(|e| e.grpc_code() == Code::Unauthenticated),
        "the revoked job token is refused once its cache entry expired"
    );
    // Refused at the first look after the TTL (polls are 10 ms apart), not much later.
    let waited = fetched.elapsed();
    assert!(waited >= cache.ttl && waited < cache.ttl + Duration::from_secs(5), "{waited:?}");
    // One request for the answer, one after it expired.
    assert_eq!(fake.allowed_agents_requests(), 2);
}

#[tokio::test]
async fn concurrent_identical_requests_share_one_gitlab_request() {
    let (fake, access, _, _) = setup(CallerCacheConfig::default()).await;
    fake.add_job(JOB_TOKEN, deploy_job());
    fake.add_user_token(
        PAT,
        FakeUser { id: 9, username: "bob".into(), agents: HashMap::from([(1, json!({"agent": {}}))]) },
    );
    // Every answer takes a while, so all callers ask while the first request is on its way.
    fake.set_delay(Duration::from_millis(300));
    let jobs = futures::future::join_all((0..20).map(|_| access.allowed_agents_for_job(JOB_TOKEN)));
    let users = futures::future::join_all((0..20).map(|_| access.authorize_proxy_user(AgentId(1), PAT_ACCESS, PAT)));
    let (jobs, users) = tokio::join!(jobs, users);
    for j in jobs {
        assert_eq!(j.unwrap().job.id, 501);
    }
    for u in users {
        assert_eq!(u.unwrap().user.username, "bob");
    }
    assert_eq!(fake.allowed_agents_requests(), 1);
    assert_eq!(fake.authorize_proxy_user_requests(), 1);
}

#[tokio::test]
async fn personal_access_token_is_authorized_per_agent() {
    let (fake, access, _, _) = setup(short_ttl()).await;
    let as_user = json!({"user": {"projects": [{"id": 100, "roles": ["developer"]}],
                                   "groups": [{"id": 7, "roles": ["reporter"]}]}});
    let agents = HashMap::from([(1, json!({"agent": {}})), (2, as_user)]);
    fake.add_user_token(PAT, FakeUser { id: 9, username: "bob".into(), agents });

    let r = access.authorize_proxy_user(AgentId(1), PAT_ACCESS, PAT).await.unwrap();
    assert_eq!((r.agent.id, r.agent.config_project.id), (AgentId(1), ProjectId(10)));
    assert_eq!((r.user.id, r.user.username.as_str(), &r.access_as), (9, "bob", &UserAccessAs::Agent));
    let r = access.authorize_proxy_user(AgentId(2), PAT_ACCESS, PAT).await.unwrap();
    let UserAccessAs::User(user) = &r.access_as else { panic!("{r:?}") };
    assert_eq!(user.projects, [RoleGrant { id: 100, roles: vec!["developer".into()] }]);
    assert_eq!(user.groups, [RoleGrant { id: 7, roles: vec!["reporter".into()] }]);

    // Agent 3 exists but its configuration does not let bob in: GitLab's 403.
    let e = access.authorize_proxy_user(AgentId(3), PAT_ACCESS, PAT).await.unwrap_err();
    assert_eq!(e.grpc_code(), Code::PermissionDenied, "{e}");
    assert!(e.to_string().contains("may not use agent 3") && e.to_string().contains("403 Forbidden"), "{e}");
    // No agent 99: GitLab's 404.
    let e = access.authorize_proxy_user(AgentId(99), PAT_ACCESS, PAT).await.unwrap_err();
    assert_eq!(e.grpc_code(), Code::PermissionDenied, "{e}");
    assert!(e.to_string().contains("GitLab knows no agent 99"), "{e}");
    assert!(!e.to_string().contains(PAT), "{e}");
    // No user has this token: GitLab's 400.
    let e = access.authorize_proxy_user(AgentId(1), PAT_ACCESS, "glpat-nobody").await.unwrap_err();
    assert_unauthenticated(&e, "glpat-nobody", "GitLab answered 400 Bad Request");
    assert_eq!(fake.authorize_proxy_user_requests(), 5);
    assert_eq!(fake.jwt_rejections(), 0);

    // Revoked: GitLab's 401, seen once the cached authorization expired.
    fake.revoke_user_token(PAT);
    eventually!(
        access.authorize_proxy_user(AgentId(1), PAT_ACCESS, PAT).await.is_err_and(|e| {
            assert!(!e.to_string().contains(PAT), "{e}");
            e.grpc_code() == Code::Unauthenticated && e.to_string().contains("Token was revoked")
        }),
        "the revoked personal access token is refused once its cache entry expired"
    );
}

/// authorize_proxy_user is GitLab's internal API: kas signs it with the shared secret, and
/// GitLab refuses another one (401, UNAUTHENTICATED).
#[tokio::test]
async fn authorize_proxy_user_carries_kas_jwt() {
    let (fake, _, config, _) = setup(CallerCacheConfig::default()).await;
    fake.add_user_token(
        PAT,
        FakeUser { id: 9, username: "bob".into(), agents: HashMap::from([(1, json!({"agent": {}}))]) },
    );
    let wrong = GitlabClient::new(&config, &fake.url(), Secret::generate()).unwrap();
    let e = wrong.authorize_proxy_user(AgentId(1), PAT_ACCESS, PAT).await.unwrap_err();
    assert_unauthenticated(&e, PAT, "GitLab answered 401 Unauthorized");
    assert_eq!(fake.jwt_rejections(), 1);
}

#[tokio::test]
async fn failing_or_unreachable_gitlab_is_unavailable() {
    let (fake, access, config, secret) = setup(CallerCacheConfig::default()).await;
    fake.add_job(JOB_TOKEN, deploy_job());
    fake.fail_with(Some(StatusCode::BAD_GATEWAY));
    let e = access.allowed_agents_for_job(JOB_TOKEN).await.unwrap_err();
    assert_eq!(e.grpc_code(), Code::Unavailable, "{e}");
    assert!(e.to_string().contains("GitLab is unavailable: allowed_agents answered HTTP 502"), "{e}");
    let e = access.authorize_proxy_user(AgentId(1), PAT_ACCESS, PAT).await.unwrap_err();
    assert!(e.to_string().contains("GitLab is unavailable: authorize_proxy_user answered HTTP 502"), "{e}");

    // A bound socket that never listens: connections are refused.
    let closed = tokio::net::TcpSocket::new_v4().unwrap();
    closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let address = format!("http://{}", closed.local_addr().unwrap());
    let client = GitlabClient::new(&config, &address, secret).unwrap();
    let e = client.allowed_agents_for_job(JOB_TOKEN).await.unwrap_err();
    assert_eq!(e.grpc_code(), Code::Unavailable, "{e}");
    assert!(e.to_string().contains("cannot connect to GitLab") && !e.to_string().contains(JOB_TOKEN), "{e}");
    let e = client.authorize_proxy_user(AgentId(1), PAT_ACCESS, PAT).await.unwrap_err();
    assert!(e.to_string().contains("cannot connect to GitLab") && !e.to_string().contains(PAT), "{e}");
}

/// Caller checks and agent verification pass one bucket (`gitlab.rate_limit`): with room for one
/// request, an agent_info request leaves none for allowed_agents.
#[tokio::test]
async fn caller_checks_share_the_agent_info_rate_limit() {
    let secret = Secret::generate();
    let fake = FakeGitlab::start(&secret).await;
    fake.add_agent("agent-token", GitlabAgent { agent_id: 1, project_id: 10, name: "a".into() });
    fake.add_job(JOB_TOKEN, deploy_job());
    let mut config = GitlabConfig::default();
    config.rate_limit.requests_per_second = 1;
    config.rate_limit.burst = 1;
    config.rate_limit.max_wait = Duration::ZERO;
    let verifier = GitlabVerifier::new(&config, &fake.url(), secret).unwrap();
    let access = CallerAccess::new(verifier.client(), &config.caller_cache);
    verifier.agent_info("agent-token").await.unwrap();
    let e = access.allowed_agents_for_job(JOB_TOKEN).await.unwrap_err();
    assert_eq!(e.grpc_code(), Code::Unavailable, "{e}");
    assert!(e.to_string().contains("rate limited"), "{e}");
    assert_eq!(fake.allowed_agents_requests(), 0);
    // The refusal is not cached: once the bucket refills, the request goes through.
    eventually!(
        access.allowed_agents_for_job(JOB_TOKEN).await.is_ok(),
        "allowed_agents passes once the bucket refilled"
    );
    assert_eq!(fake.allowed_agents_requests(), 1);
}

/// The fake answers as GitLab does without kas: the job token travels in `Job-Token`.
#[tokio::test]
async fn fake_allowed_agents_takes_the_job_token_header() {
    let secret = Secret::generate();
    let fake = FakeGitlab::start(&secret).await;
    fake.add_job(JOB_TOKEN, deploy_job());
    let url = format!("{}/api/v4/job/allowed_agents", fake.url());
    let http = reqwest::Client::new();
    let status = |r: reqwest::RequestBuilder| async move { r.send().await.unwrap().status().as_u16() };
    assert_eq!(status(http.get(&url).header("JOB-TOKEN", JOB_TOKEN)).await, 200);
    assert_eq!(status(http.get(&url).header("Authorization", format!("Bearer {JOB_TOKEN}"))).await, 401);
    assert_eq!(status(http.get(&url).header("JOB-TOKEN", "other")).await, 401);
    assert_eq!(fake.allowed_agents_requests(), 3);
}
