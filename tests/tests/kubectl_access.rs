//! kubectl for CI jobs and people (issue 15): a CI job token or a personal access token, checked
//! with GitLab, and the identity agentk then impersonates at the API server. The real kubectl,
//! through a kas that does not hold the agent (so the identity crosses the kas -> kas hop too).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::HashMap;
use std::time::Duration;

use kas_e2e::fake_gitlab::{FakeAllowedAgent, FakeEnvironment, FakeJob, FakeUser};
use kas_e2e::fake_kube::RecordedRequest;
use kas_e2e::kubectl::KubectlTarget;
use kas_e2e::{Cluster, eventually};
use serde_json::json;

const PODS: &str = "/api/v1/namespaces/default/pods";

fn kubectl_binary() -> &'static str {
    "kubectl"
}

/// Two kas on Redis in GitLab mode, agent 1 (configuration project 10) on kas 0, a pod, and
/// GitLab's answers about callers cached for a short time.
async fn cluster() -> Cluster {
    let c = Cluster::builder()
        .gitlab()
        .redis()
        .kas(2)
        .rest_tls()
        .configure(|config, _| {
            config.gitlab.caller_cache.ttl = Duration::from_millis(500);
            config.gitlab.caller_cache.error_ttl = Duration::from_millis(500);
        })
        .start()
        .await;
    c.kube.add_pod("default", "web-1");
    c
}

fn gitlab(c: &Cluster) -> &kas_e2e::FakeGitlab {
    c.gitlab.as_ref().unwrap()
}

/// A job of project 20 (in group 3, under group 2) deploying to `production`.
fn job(job_id: i64, allowed_agents: Vec<FakeAllowedAgent>) -> FakeJob {
    FakeJob {
        job_id,
        pipeline_id: 7,
        project_id: 20,
        group_ids: vec![3, 2],
        environment: Some(FakeEnvironment { slug: "production".into(), tier: "production".into() }),
        user_id: 5,
        username: "alice".into(),
        allowed_agents,
    }
}

fn agent_1(access_as: serde_json::Value) -> FakeAllowedAgent {
    FakeAllowedAgent {
        agent_id: 1,
        config_project_id: 10,
        configuration: json!({"default_namespace": "default", "access_as": access_as}),
    }
}

/// kubectl's output for `get pods`, failing the test (with stderr) if kubectl failed.
async fn get_pods(target: &KubectlTarget) -> String {
    let out = target.command(kubectl_binary(), &["get", "pods", "-n", "default"]).output().await.unwrap();
    assert!(out.status.success(), "kubectl failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kubectl's stderr for a `get pods` that must fail.
async fn failed_get_pods(target: &KubectlTarget) -> String {
    let out = target.command(kubectl_binary(), &["get", "pods", "-n", "default"]).output().await.unwrap();
    assert!(!out.status.success(), "kubectl succeeded: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The last pods list the API server received.
fn last_pods_request(c: &Cluster) -> RecordedRequest {
    c.kube.requests().into_iter().rev().find(|r| r.path == PODS).expect("a pods request reached the API server")
}

fn values(r: &RecordedRequest, name: &str) -> Vec<String> {
    r.headers.get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect()
}

/// Only agentk's own credential, never the caller's or kas's.
fn assert_only_agentk_credentials(c: &Cluster, r: &RecordedRequest, caller_token: &str) {
    assert_eq!(values(r, "authorization"), [format!("Bearer {}", c.kube.token())]);
    for (name, value) in &r.headers {
        let value = value.to_str().unwrap_or_default();
        assert!(!value.contains(caller_token), "the caller's token reached the API server in {name}");
        assert!(!value.contains(&c.gitlab_jwt()), "a kas JWT reached the API server in {name}");
    }
}

#[tokio::test]
async fn a_ci_job_is_impersonated_as_itself_and_other_projects_are_refused() {
    let c = cluster().await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    gitlab(&c).add_job("job-token-42", job(42, vec![agent_1(json!({"ci_job": {}}))]));
    let kubectl = KubectlTarget::new(&c, 1).with_token("ci:1:job-token-42");

    assert!(get_pods(&kubectl).await.contains("web-1"));
    let r = last_pods_request(&c);
    assert_eq!(values(&r, "impersonate-user"), ["gitlab:ci_job:42"]);
    assert_eq!(
        values(&r, "impersonate-group"),
        [
            "gitlab:ci_job",
            "gitlab:group:3",
            "gitlab:group:2",
            "gitlab:group_env_tier:3:production",
            "gitlab:group_env_tier:2:production",
            "gitlab:project:20",
            "gitlab:project_env:20:production",
            "gitlab:project_env_tier:20:production",
        ]
    );
    for (key, value) in [
        ("id", "1"),
        ("config_project_id", "10"),
        ("project_id", "20"),
        ("ci_pipeline_id", "7"),
        ("ci_job_id", "42"),
        ("username", "alice"),
        ("environment_slug", "production"),
        ("environment_tier", "production"),
    ] {
        assert_eq!(values(&r, &format!("impersonate-extra-agent.gitlab.com%2f{key}")), [value], "{key}");
    }
    assert_only_agentk_credentials(&c, &r, "job-token-42");

    // A job of a project the agent is not shared with.
    gitlab(&c).add_job("job-token-43", job(43, vec![]));
    let stderr = failed_get_pods(&KubectlTarget::new(&c, 1).with_token("ci:1:job-token-43")).await;
    assert!(
        stderr.contains("Warning: agent 1 is not shared with project 20 of CI job 43 (the agent's ci_access names"),
        "{stderr}"
    );
    assert!(stderr.contains("Forbidden"), "{stderr}");

    // `access_as: agent`: the job's requests run as agentk's service account.
    gitlab(&c).add_job("job-token-44", job(44, vec![agent_1(json!({"agent": {}}))]));
    assert!(get_pods(&KubectlTarget::new(&c, 1).with_token("ci:1:job-token-44")).await.contains("web-1"));
    let r = last_pods_request(&c);
    assert!(r.headers.keys().all(|k| !k.as_str().starts_with("impersonate-")), "{:?}", r.headers);

    // `access_as: impersonate`: as the configured identity.
    let impersonate = json!({"impersonate": {"username": "deployer", "groups": ["deployers"], "extra": [{"key": "team", "val": ["a", "b"]}]}});
    gitlab(&c).add_job("job-token-45", job(45, vec![agent_1(impersonate)]));
    assert!(get_pods(&KubectlTarget::new(&c, 1).with_token("ci:1:job-token-45")).await.contains("web-1"));
    let r = last_pods_request(&c);
    assert_eq!(values(&r, "impersonate-user"), ["deployer"]);
    assert_eq!(values(&r, "impersonate-group"), ["deployers"]);
    assert_eq!(values(&r, "impersonate-extra-team"), ["a", "b"]);

    // A revoked job token stops working once the cached answer expires (500 ms here). This
    // kubectl has discovery cached, so the Status of the pods request itself is what it prints.
    gitlab(&c).revoke_job("job-token-42");
    let refused = "error: You must be logged in to the server (the CI job token is not valid";
    eventually!(
        {
            let out = kubectl.command(kubectl_binary(), &["get", "pods", "-n", "default"]).output().await.unwrap();
            String::from_utf8_lossy(&out.stderr).contains(refused)
        },
        "the revoked job token is refused"
    );
}

#[tokio::test]
async fn a_person_is_impersonated_with_their_roles_or_refused() {
    let c = cluster().await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let access = json!({"user": {"projects": [{"id": 20, "roles": ["developer"]}], "groups": [{"id": 3, "roles": ["maintainer", "owner"]}]}});
    gitlab(&c).add_user_token(
        "glpat-alice",
        FakeUser { id: 5, username: "alice".into(), agents: HashMap::from([(1, access)]) },
    );
    gitlab(&c).add_user_token("glpat-bob", FakeUser { id: 6, username: "bob".into(), agents: HashMap::new() });

    assert!(get_pods(&KubectlTarget::new(&c, 1).with_token("pat:1:glpat-alice")).await.contains("web-1"));
    let r = last_pods_request(&c);
    assert_eq!(values(&r, "impersonate-user"), ["gitlab:user:alice"]);
    assert_eq!(
        values(&r, "impersonate-group"),
        [
            "gitlab:user",
            "gitlab:project_role:20:developer",
            "gitlab:group_role:3:maintainer",
            "gitlab:group_role:3:owner"
        ]
    );
    assert_eq!(values(&r, "impersonate-extra-agent.gitlab.com%2faccess_type"), ["personal_access_token"]);
    assert_eq!(values(&r, "impersonate-extra-agent.gitlab.com%2fusername"), ["alice"]);
    assert_only_agentk_credentials(&c, &r, "glpat-alice");

    let stderr = failed_get_pods(&KubectlTarget::new(&c, 1).with_token("pat:1:glpat-bob")).await;
    assert!(stderr.contains("Warning: ") && stderr.contains("may not use agent 1"), "{stderr}");

    let stderr = failed_get_pods(&KubectlTarget::new(&c, 1).with_token("pat:1:glpat-unknown")).await;
    assert!(stderr.contains("error: You must be logged in to the server"), "{stderr}");

    // Without the impersonate permission (rbac.impersonate off) the API server's refusal shows
    // (on a request that is not discovery: kubectl prints "unknown" for a 403 there, as it does
    // with any API server).
    c.kube.forbid_impersonation(true);
    let out = KubectlTarget::new(&c, 1)
        .with_token("pat:1:glpat-alice")
        .command(kubectl_binary(), &["get", "--raw", &format!("/api/v1/agents/1/kubernetes{PODS}")])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot impersonate resource \"users\""), "{stderr}");
}

/// Standalone mode (no GitLab): kas's own users (`auth.users_file`, as `kas add-user` writes
/// it), admitted by the agent's `user_access` through their groups (inherited by subgroups) and
/// projects, and impersonated with them.
#[tokio::test]
async fn a_static_user_is_admitted_by_user_access_and_impersonated() {
    use kas::agent::AgentConfigDocument;
    use kas::auth::agent_token::token_sha256_hex;
    use kas::auth::static_users::{StaticUser, StaticUsersFile, generate_user_token};

    let (alice, bob) = (generate_user_token(), generate_user_token());
    let users = StaticUsersFile {
        users: vec![
            StaticUser {
                name: "alice".into(),
                token_sha256: token_sha256_hex(&alice),
                groups: vec!["platform".into()],
                projects: vec!["web/shop".into()],
            },
            StaticUser {
                name: "bob".into(),
                token_sha256: token_sha256_hex(&bob),
                groups: vec![],
                projects: vec!["web/blog".into()],
            },
        ],
    };
    let as_user =
        AgentConfigDocument::parse("user_access: {access_as: {user: {}}, groups: [{id: platform/infra}]}").unwrap();
    let c = Cluster::builder()
        .redis()
        .kas(2)
        .rest_tls()
        .agents(&[(1, 10), (2, 10)])
        .agent_configuration(1, as_user)
        .configure(move |config, dir| {
            let path = dir.join("users.yaml");
            users.save(&path).unwrap();
            config.auth.users_file = Some(path);
        })
        .start()
        .await;
    c.kube.add_pod("default", "web-1");
    let _a = c.start_agentk(1, 0, "agentk-0").await;

    // alice is a member of group platform, so of platform/infra, which agent 1's user_access lists.
    assert!(get_pods(&KubectlTarget::new(&c, 1).with_token(alice.as_str())).await.contains("web-1"));
    let r = last_pods_request(&c);
    assert_eq!(values(&r, "impersonate-user"), ["gitlab:user:alice"]);
    assert_eq!(values(&r, "impersonate-group"), ["gitlab:user", "gitlab:group:platform", "gitlab:project:web/shop"]);
    assert_eq!(values(&r, "impersonate-extra-agent.gitlab.com%2faccess_type"), ["static_user"]);
    assert_eq!(values(&r, "impersonate-extra-agent.gitlab.com%2fid"), ["1"]);
    assert_only_agentk_credentials(&c, &r, &alice);

    // bob's only project is not in user_access.
    let stderr = failed_get_pods(&KubectlTarget::new(&c, 1).with_token(bob.as_str())).await;
    assert!(
        stderr.contains("Warning: user bob is not a member of any project or group in agent 1's user_access"),
        "{stderr}"
    );
    // Agent 2's configuration has no user_access: nobody may use it.
    let stderr = failed_get_pods(&KubectlTarget::new(&c, 1).with_agent("2").with_token(alice.as_str())).await;
    assert!(stderr.contains("Warning: agent 2 has no user_access in its configuration"), "{stderr}");
    // A token that is in no users file.
    let stderr = failed_get_pods(&KubectlTarget::new(&c, 1).with_token("kasu_not-a-user")).await;
    assert!(stderr.contains("Warning: invalid kas user token"), "{stderr}");
    assert!(stderr.contains("error: You must be logged in to the server"), "{stderr}");
}
