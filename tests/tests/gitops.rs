//! GitOps, kas's half (issue 16): agentk's `GetObjectsToSynchronize` against a real Git
//! repository: the objects of the current commit, then of each new one, nothing while it is
//! unchanged, and the user's mistakes as FAILED_PRECONDITION naming the files; pushes
//! (`KasApi.GitPushEvent`, `POST /api/v1/git_push_events`) reaching a stream on another kas at
//! once; sync reports (`GitopsStatus.ReportSync`) read from another kas (REST and KasApi); GitLab
//! mode (manifest projects located with GitLab's project_info).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use kas::agent::AgentConfigDocument;
use kas_e2e::Cluster;
use kas_e2e::cluster::channel;
use kas_e2e::eventually;
use kas_e2e::git_http::GitRepo;
use kas_proto::gitops::gitops_agent_client::GitopsAgentClient;
use kas_proto::gitops::gitops_status_client::GitopsStatusClient;
use kas_proto::gitops::objects_to_synchronize_response::Message;
use kas_proto::gitops::{ObjectError, ObjectsToSynchronizeRequest, ObjectsToSynchronizeResponse, SyncReport};
use kas_proto::kas::get_gitops_status_response::ProjectsSource;
use kas_proto::kas::{GetGitopsStatusRequest, GitPushEvent, GitPushEventRequest, git_push_event};
use tonic::Code;

const APP: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {replicas: 2}\n---\n\
                   apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: other}\ndata: {a: b}\n";

async fn next(
    stream: &mut tonic::Streaming<ObjectsToSynchronizeResponse>,
) -> Result<Option<ObjectsToSynchronizeResponse>, tonic::Status> {
    tokio::time::timeout(kas_e2e::EVENTUALLY_TIMEOUT, stream.message()).await.unwrap()
}

/// One commit as the stream delivers it: its id and its objects (source file, JSON).
async fn next_commit(
    stream: &mut tonic::Streaming<ObjectsToSynchronizeResponse>,
) -> Result<(String, Vec<(String, serde_json::Value)>), tonic::Status> {
    let Some(Message::Header(header)) = next(stream).await?.unwrap().message else {
        panic!("a commit starts with a header")
    };
    let mut objects = Vec::new();
    let mut data = Vec::new();
    loop {
        match next(stream).await?.unwrap().message.unwrap() {
            Message::Object(o) => {
                data.extend_from_slice(&o.data);
                if !o.more {
                    objects.push((o.source, serde_json::from_slice(&std::mem::take(&mut data)).unwrap()));
                }
            }
            Message::Trailer(_) => return Ok((header.commit_id, objects)),
            Message::Header(_) => panic!("a header inside a commit"),
        }
    }
}

/// The next commit if its first message arrives within `within` (the rest may take longer).
async fn next_commit_within(
    stream: &mut tonic::Streaming<ObjectsToSynchronizeResponse>,
    within: Duration,
) -> Option<Result<(String, Vec<(String, serde_json::Value)>), tonic::Status>> {
    let first = tokio::time::timeout(within, stream.message()).await.ok()?;
    let header = match first {
        Ok(Some(ObjectsToSynchronizeResponse { message: Some(Message::Header(header)) })) => header,
        Ok(other) => panic!("a commit starts with a header, got {other:?}"),
        Err(e) => return Some(Err(e)),
    };
    let mut objects = Vec::new();
    let mut data = Vec::new();
    loop {
        match next(stream).await {
            Err(e) => return Some(Err(e)),
            Ok(m) => match m.unwrap().message.unwrap() {
                Message::Object(o) => {
                    data.extend_from_slice(&o.data);
                    if !o.more {
                        objects.push((o.source, serde_json::from_slice(&std::mem::take(&mut data)).unwrap()));
                    }
                }
                Message::Trailer(_) => return Some(Ok((header.commit_id, objects))),
                Message::Header(_) => panic!("a header inside a commit"),
            },
        }
    }
}

#[tokio::test]
async fn objects_of_each_new_commit_reach_the_agent_and_mistakes_name_the_file() {
    let repo = GitRepo::new();
    let first = repo.commit("deploy/app.yaml", APP.as_bytes());
    let config = format!(
        "gitops:\n  manifest_projects:\n    - id: {}\n      paths: [{{glob: 'deploy/**/*.yaml'}}]\n      default_namespace: apps\n",
        repo.bare.display()
    );
    let c = Cluster::builder()
        .agent_configuration(1, AgentConfigDocument::parse(&config).unwrap())
        .configure(|config, _| config.gitops.poll_period = Duration::from_millis(100))
        .start()
        .await;
    let project_id = repo.bare.display().to_string();
    let request = |commit_id: &str| ObjectsToSynchronizeRequest {
        project_id: project_id.clone(),
        r#ref: String::new(),
        commit_id: commit_id.into(),
    };
    let mut client = GitopsAgentClient::new(channel(c.kas[0].addresses.agent));
    let token = c.agent(1).token.clone();

    let mut stream =
        client.get_objects_to_synchronize(kas_e2e::authorized(request(""), &token)).await.unwrap().into_inner();
    let (commit, objects) = next_commit(&mut stream).await.unwrap();
    assert_eq!(commit, first);
    let kinds: Vec<(&str, &str, &str)> = objects
        .iter()
        .map(|(source, o)| (source.as_str(), o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("deploy/app.yaml", "Deployment", "web"), ("deploy/app.yaml", "ConfigMap", "settings")]);
    assert_eq!(objects[0].1["spec"]["replicas"], 2);

    // A new commit reaches the open stream; a file outside the globs changes nothing.
    let second = repo.commit("deploy/more/cm.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: more}\n");
    let (commit, objects) = next_commit(&mut stream).await.unwrap();
    assert_eq!((commit.as_str(), objects.len()), (second.as_str(), 3));
    assert_eq!(objects[0].0, "deploy/app.yaml");
    assert_eq!(objects[2].0, "deploy/more/cm.yaml");

    // An agent that has the current commit is sent nothing, poll after poll.
    let mut current =
        client.get_objects_to_synchronize(kas_e2e::authorized(request(&second), &token)).await.unwrap().into_inner();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), current.message()).await.is_err(),
        "unchanged commit resent"
    );

    // Two manifests of one object: the open streams end with FAILED_PRECONDITION naming both files.
    let third = repo
        .commit("deploy/copy.yaml", b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: apps}\n");
    let e = next_commit(&mut stream).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(&third) && e.message().contains("is in both deploy/app.yaml and deploy/copy.yaml"),
        "{e:?}"
    );

    // A project the configuration does not list, and a bad token, are refused at once.
    let mut other = request("");
    other.project_id = "/somewhere/else.git".into();
    let e = client.get_objects_to_synchronize(kas_e2e::authorized(other, &token)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("has no manifest project \"/somewhere/else.git\""), "{e:?}");
    let e = client.get_objects_to_synchronize(kas_e2e::authorized(request(""), "not-a-token")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

/// GitOps is a service on the agent listener like the presence stream, and shares its bound on
/// failed agent authentications per peer: guessing tokens through it is no cheaper.
#[tokio::test]
async fn failed_authentications_through_gitops_count_against_the_peer() {
    let c = Cluster::builder()
        .configure(|config, _| {
            config.auth.failed_agent_authentications.burst = 2;
            config.auth.failed_agent_authentications.per_second = 1;
        })
        .start()
        .await;
    let mut client = GitopsAgentClient::new(channel(c.kas[0].addresses.agent));
    let request = || ObjectsToSynchronizeRequest { project_id: "p".into(), ..Default::default() };
    for _ in 0..2 {
        let e = client.get_objects_to_synchronize(kas_e2e::authorized(request(), "guess")).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    }
    let e = client.get_objects_to_synchronize(kas_e2e::authorized(request(), "guess")).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // The same peer's presence stream, even with the right token, waits for the bound too.
    let e = c.open_configuration(1, "").await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
}

/// A kas that shuts down ends its GitOps streams at once (agentk then asks another kas from its
/// last commit) instead of holding the shutdown for its grace period (5 s here).
#[tokio::test]
async fn streams_end_when_kas_shuts_down() {
    let repo = GitRepo::new();
    repo.commit("app.yaml", APP.as_bytes());
    let config = format!("gitops:\n  manifest_projects:\n    - id: {}\n", repo.bare.display());
    let mut c = Cluster::builder()
        .agent_configuration(1, AgentConfigDocument::parse(&config).unwrap())
        .configure(|config, _| config.gitops.poll_period = Duration::from_millis(100))
        .start()
        .await;
    let request = ObjectsToSynchronizeRequest { project_id: repo.bare.display().to_string(), ..Default::default() };
    let mut client = GitopsAgentClient::new(channel(c.kas[0].addresses.agent));
    let token = c.agent(1).token.clone();
    let mut stream =
        client.get_objects_to_synchronize(kas_e2e::authorized(request, &token)).await.unwrap().into_inner();
    next_commit(&mut stream).await.unwrap();
    let kas = c.kas.remove(0);
    let started = std::time::Instant::now();
    kas.stop().await;
    assert!(started.elapsed() < Duration::from_secs(3), "kas took {:?} to stop", started.elapsed());
    let end = tokio::time::timeout(kas_e2e::EVENTUALLY_TIMEOUT, stream.message()).await.unwrap();
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
}

/// `KasApi.GitPushEvent` on kas number `kas` for a project.
async fn push(c: &Cluster, kas: usize, id: i64, full_path: &str) {
    let event = GitPushEvent { project: Some(git_push_event::Project { id, full_path: full_path.into() }) };
    c.api(kas).git_push_event(GitPushEventRequest { event: Some(event) }).await.unwrap();
}

/// A push to the project on kas B makes the stream on kas A send the new commit at once (both
/// on Redis); the poll period is an hour, so only the push explains it. The same through the
/// REST gateway.
#[tokio::test]
async fn a_push_on_one_kas_makes_the_stream_on_another_send_the_new_commit() {
    let repo = GitRepo::new();
    let first = repo.commit("app.yaml", APP.as_bytes());
    let project_id = repo.bare.display().to_string();
    let config = format!("gitops:\n  manifest_projects:\n    - id: {project_id}\n");
    let c = Cluster::builder()
        .kas(2)
        .redis()
        .agent_configuration(1, AgentConfigDocument::parse(&config).unwrap())
        .configure(|config, _| config.gitops.poll_period = Duration::from_secs(3600))
        .start()
        .await;
    let request = ObjectsToSynchronizeRequest { project_id: project_id.clone(), ..Default::default() };
    let mut client = GitopsAgentClient::new(channel(c.kas[0].addresses.agent));
    let mut stream =
        client.get_objects_to_synchronize(kas_e2e::authorized(request, &c.agent(1).token)).await.unwrap().into_inner();
    assert_eq!(next_commit(&mut stream).await.unwrap().0, first);

    // A push to another project wakes nothing.
    let second = repo.commit("more.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: more}\n");
    push(&c, 1, 0, "/somewhere/else.git").await;
    assert!(next_commit_within(&mut stream, Duration::from_millis(500)).await.is_none(), "another project's push");

    // The push itself: until kas A's subscription is up a push may be missed, so push again
    // until one arrives; each attempt must arrive within a second.
    let started = std::time::Instant::now();
    let mut got = None;
    eventually!(
        {
            if got.is_none() {
                push(&c, 1, 0, &project_id).await;
                got = next_commit_within(&mut stream, Duration::from_secs(1)).await;
            }
            got.is_some()
        },
        "the push reached the stream on the other kas"
    );
    let (commit, objects) = got.unwrap().unwrap();
    assert_eq!((commit.as_str(), objects.len()), (second.as_str(), 3));
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());

    // Through the REST gateway of kas B, a burst of pushes: the stream sends the commit once.
    let third = repo.commit("app.yaml", APP.replace("replicas: 2", "replicas: 3").as_bytes());
    let http = reqwest::Client::new();
    let body = serde_json::json!({"project": {"full_path": project_id}});
    for _ in 0..5 {
        let response = http
            .post(format!("{}/api/v1/git_push_events", c.rest_url(1)))
            .bearer_auth(c.gitlab_jwt())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
    }
    let (commit, objects) = next_commit_within(&mut stream, Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(commit, third);
    assert_eq!(objects[0].1["spec"]["replicas"], 3);
    assert!(next_commit_within(&mut stream, Duration::from_millis(500)).await.is_none(), "the commit was sent twice");
    c.assert_metrics(1, &["kas_git_push_events_total{outcome=\"published\"}", "kas_gitops_push_polls_total"]).await;
}

fn report(project_id: &str, git_ref: &str) -> SyncReport {
    SyncReport {
        project_id: project_id.into(),
        r#ref: git_ref.into(),
        commit_id: "0123456789abcdef0123456789abcdef01234567".into(),
        pod_name: "agentk-0".into(),
        started_at_unix_ms: 1_767_323_045_000,
        duration_ms: 840,
        dry_run_strategy: "none".into(),
        applied: 3,
        unchanged: 10,
        pruned: 1,
        failed: 1,
        errors: vec![ObjectError {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespace: "prod".into(),
            name: "web".into(),
            source: "deploy/web.yaml".into(),
            operation: "apply".into(),
            message: "admission webhook denied the request".into(),
        }],
        error: String::new(),
    }
}

/// agentk reports a sync to kas A; GitLab reads it from kas B through the REST gateway and
/// KasApi. Reports of projects the configuration does not list, malformed ones, and reports
/// without a valid agent token are refused.
#[tokio::test]
async fn a_report_sent_to_one_kas_is_read_from_another() {
    let config = "gitops:\n  manifest_projects:\n    - id: /srv/git/manifests.git\n    \
                  - id: /srv/git/other.git\n      ref: {branch: stable}\n";
    let c = Cluster::builder()
        .kas(2)
        .redis()
        .agent_configuration(1, AgentConfigDocument::parse(config).unwrap())
        .start()
        .await;
    let token = c.agent(1).token.clone();
    let mut status = GitopsStatusClient::new(channel(c.kas[0].addresses.agent));
    status.report_sync(kas_e2e::authorized(report("/srv/git/manifests.git", ""), &token)).await.unwrap();

    let e = status.report_sync(kas_e2e::authorized(report("/srv/git/unknown.git", ""), &token)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("no manifest project \"/srv/git/unknown.git\" with ref \"\""), "{e:?}");
    let e =
        status.report_sync(kas_e2e::authorized(report("/srv/git/other.git", "branch:main"), &token)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "another ref of a configured project: {e:?}");
    let mut too_many = report("/srv/git/other.git", "branch:stable");
    too_many.errors = vec![too_many.errors[0].clone(); 101];
    too_many.failed = 101;
    let e = status.report_sync(kas_e2e::authorized(too_many, &token)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("errors has 101 entries, more than the limit of 100"), "{e:?}");
    let e = status.report_sync(kas_e2e::authorized(report("/srv/git/manifests.git", ""), "nope")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

    // kas B, REST: both configured projects, the reported one with its report and when kas A got it.
    let url = format!("{}/api/v1/agents/1/gitops", c.rest_url(1));
    let response = reqwest::Client::new().get(&url).bearer_auth(c.gitlab_jwt()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["projects_from"], "configuration");
    let projects = body["manifest_projects"].as_array().unwrap();
    assert_eq!(projects.len(), 2, "{body}");
    assert_eq!(
        (&projects[1]["project_id"], &projects[1]["ref"]),
        (&"/srv/git/other.git".into(), &"branch:stable".into())
    );
    assert_eq!(projects[1]["last_sync"], serde_json::Value::Null);
    let sync = &projects[0]["last_sync"];
    assert_eq!(sync["kas_instance_id"], c.kas[0].instance_id(), "{body}");
    assert_eq!(
        (sync["applied"].as_u64(), sync["unchanged"].as_u64(), sync["pruned"].as_u64()),
        (Some(3), Some(10), Some(1))
    );
    assert_eq!(sync["errors"][0]["message"], "admission webhook denied the request");
    assert_eq!(sync["started_at"], "2026-01-02T03:04:05.000Z");
    let received_at = humantime::parse_rfc3339(sync["received_at"].as_str().unwrap()).unwrap();
    let age = std::time::SystemTime::now().duration_since(received_at).unwrap_or_default();
    assert!(age < Duration::from_secs(60), "received {age:?} ago");

    // kas B, KasApi: the same.
    let answer = c.api(1).get_gitops_status(GetGitopsStatusRequest { agent_id: 1 }).await.unwrap().into_inner();
    assert_eq!(answer.projects_from(), ProjectsSource::Configuration);
    let sync = answer.manifest_projects[0].last_sync.clone().unwrap();
    assert_eq!(sync.report.unwrap(), report("/srv/git/manifests.git", ""));
    assert_eq!(sync.kas_instance_id, c.kas[0].instance_id());
    assert!(answer.manifest_projects[1].last_sync.is_none());
    let e = c.api(1).get_gitops_status(GetGitopsStatusRequest { agent_id: 0 }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = c.api_with_token(1, None).get_gitops_status(GetGitopsStatusRequest { agent_id: 1 }).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    c.assert_metrics(
        0,
        &["kas_gitops_sync_reports_total{outcome=\"stored\"}", "kas_gitops_sync_reports_total{outcome=\"refused\"}"],
    )
    .await;
}

/// GitLab mode: manifest projects are GitLab project paths, located with GitLab's project_info
/// (with the agent's token) and fetched over HTTP like configuration projects. A project the
/// agent may not read is NOT_FOUND (GitLab answers 404 for it, as for a project that does not
/// exist); a token GitLab refuses (403) ends the stream with PERMISSION_DENIED. Pushes name the
/// project by path and GitLab id. The status API lists the projects as configured at the last
/// report (kas cannot read a GitLab agent's configuration without its token).
#[tokio::test]
async fn gitlab_mode_locates_manifest_projects_with_project_info() {
    let c = Cluster::builder()
        .gitlab()
        .configure(|config, _| {
            config.gitops.poll_period = Duration::from_secs(3600);
            // Polls of a repository share one fetch for a tenth of this (6 min): only a push's
            // own fetch can see a new commit.
            config.agents.configuration_poll_period = Duration::from_secs(3600);
            // Every poll asks GitLab again, so a refusal shows at the next poll.
            config.gitops.project_info_cache.ttl = Duration::ZERO;
        })
        .start()
        .await;
    let gitlab = c.gitlab.as_ref().unwrap();
    let token = c.agent(1).token.clone();
    let manifests = GitRepo::create_in(&c.dir.path().join("git"), "group/manifests.git");
    let first = manifests.commit("deploy/app.yaml", APP.as_bytes());
    gitlab.add_project("group/manifests", 77, "main");
    gitlab.add_project("group/secret", 78, "main");
    gitlab.deny_project(&token, "group/secret");
    c.projects[&10].commit(
        ".gitlab/agents/agent-1/config.yaml",
        b"gitops:\n  manifest_projects:\n    - id: group/manifests\n    - id: group/secret\n",
    );

    let mut client = GitopsAgentClient::new(channel(c.kas[0].addresses.agent));
    let request =
        |project_id: &str| ObjectsToSynchronizeRequest { project_id: project_id.into(), ..Default::default() };
    let mut stream = client
        .get_objects_to_synchronize(kas_e2e::authorized(request("group/manifests"), &token))
        .await
        .unwrap()
        .into_inner();
    let (commit, objects) = next_commit(&mut stream).await.unwrap();
    assert_eq!((commit.as_str(), objects.len()), (first.as_str(), 2));
    assert!(gitlab.project_info_requests() >= 1);

    let mut denied = client
        .get_objects_to_synchronize(kas_e2e::authorized(request("group/secret"), &token))
        .await
        .unwrap()
        .into_inner();
    let e = next(&mut denied).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("GitLab has no project \"group/secret\""), "{e:?}");

    // A push naming the project by its GitLab id (its path as GitLab now names it) is this
    // project's; the fetch is a new one, not the poll shared a moment ago.
    let second = manifests.commit("deploy/cm.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: more}\n");
    let mut got = None;
    eventually!(
        {
            if got.is_none() {
                push(&c, 0, 77, "group/manifests-renamed").await;
                got = next_commit_within(&mut stream, Duration::from_secs(1)).await;
            }
            got.is_some()
        },
        "the push reached the stream"
    );
    assert_eq!(got.unwrap().unwrap().0, second);

    // GitLab now refuses the token (403): the next poll ends the stream.
    gitlab.forbid(&token);
    let mut end = None;
    eventually!(
        {
            if end.is_none() {
                push(&c, 0, 77, "group/manifests").await;
                end = tokio::time::timeout(Duration::from_secs(1), stream.message()).await.ok();
            }
            end.is_some()
        },
        "the stream ended"
    );
    let e = end.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("may not read project \"group/manifests\""), "{e:?}");

    // Status: nothing listed before the first report, then the configuration at that report.
    let answer = c.api(0).get_gitops_status(GetGitopsStatusRequest { agent_id: 1 }).await.unwrap().into_inner();
    assert_eq!((answer.projects_from(), answer.manifest_projects.len()), (ProjectsSource::LastReport, 0));
    // (The agent token still authenticates: agent_info answers are cached.)
    let mut status = GitopsStatusClient::new(channel(c.kas[0].addresses.agent));
    status.report_sync(kas_e2e::authorized(report("group/manifests", ""), &token)).await.unwrap();
    let answer = c.api(0).get_gitops_status(GetGitopsStatusRequest { agent_id: 1 }).await.unwrap().into_inner();
    assert_eq!(answer.projects_from(), ProjectsSource::LastReport);
    let listed: Vec<(&str, bool)> =
        answer.manifest_projects.iter().map(|p| (p.project_id.as_str(), p.last_sync.is_some())).collect();
    assert_eq!(listed, [("group/manifests", true), ("group/secret", false)]);
}
