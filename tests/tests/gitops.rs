//! GitOps, kas's half (issue 16): agentk's `GetObjectsToSynchronize` against a real Git
//! repository: the objects of the current commit, then of each new one, nothing while it is
//! unchanged, and the user's mistakes as FAILED_PRECONDITION naming the files.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use kas::agent::AgentConfigDocument;
use kas_e2e::Cluster;
use kas_e2e::cluster::channel;
use kas_e2e::git_http::GitRepo;
use kas_proto::gitops::gitops_agent_client::GitopsAgentClient;
use kas_proto::gitops::objects_to_synchronize_response::Message;
use kas_proto::gitops::{ObjectsToSynchronizeRequest, ObjectsToSynchronizeResponse};
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
        .configure(|config, _| config.agents.configuration_poll_period = Duration::from_millis(100))
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
        .configure(|config, _| config.agents.configuration_poll_period = Duration::from_millis(100))
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
