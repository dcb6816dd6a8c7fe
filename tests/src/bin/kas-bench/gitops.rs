//! GitOps (issue 16): how long a push takes to be applied, and what polling a manifest project
//! costs as the number of agents applying it grows.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use kas::agent::AgentConfigDocument;
use kas_e2e::git_http::{GitHttpServer, GitRepo};
use kas_e2e::{Cluster, authorized, cluster::channel};
use kas_proto::gitops::ObjectsToSynchronizeRequest;
use kas_proto::gitops::gitops_agent_client::GitopsAgentClient;

use crate::{ms, percentile};

/// Objects in the manifest project of the push benchmark.
const OBJECTS: usize = 50;

fn configmap(i: usize, generation: usize) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: app-{i}}}\ndata: {{generation: \"{generation}\"}}\n")
}

pub async fn run(trials: usize, report: &mut String) {
    let _ = writeln!(report, "## GitOps (issue 16)\n");
    push_to_applied(trials, report).await;
    poll_cost(report).await;
}

/// A push on kas B, agentk (in this process) connected to kas A, kas polling every hour: from the
/// push (REST `POST /api/v1/git_push_events`) to agentk's report of the new commit.
async fn push_to_applied(trials: usize, report: &mut String) {
    let repo = GitRepo::new();
    for i in 0..OBJECTS {
        repo.commit(&format!("deploy/app-{i}.yaml"), configmap(i, 0).as_bytes());
    }
    let project = repo.bare.display().to_string();
    let config = format!("gitops:\n  manifest_projects:\n    - id: {project}\n");
    let c = Cluster::builder()
        .kas(2)
        .redis()
        .agent_configuration(1, AgentConfigDocument::parse(&config).expect("configuration"))
        .configure(|config, _| config.gitops.poll_period = Duration::from_secs(3600))
        .start()
        .await;
    c.kube.add_namespace("agentk");
    let a = c.start_agentk_with(c.agentk_config(1, 0, "agentk-0")).await;
    let http = reqwest::Client::new();
    let push = || {
        http.post(format!("{}/api/v1/git_push_events", c.rest_url(1)))
            .bearer_auth(c.gitlab_jwt())
            .json(&serde_json::json!({"project": {"full_path": project}}))
            .send()
    };
    let applied = |commit: String| {
        let mut gitops = a.status.gitops.clone();
        async move {
            let seen = gitops
                .wait_for(|s| s.projects.values().any(|p| p.last.as_ref().is_some_and(|r| r.commit_id == commit)));
            tokio::time::timeout(Duration::from_secs(10), seen).await.is_ok()
        }
    };
    // Until kas A subscribed to pushes one may be missed: the first push that is applied at once
    // is the start.
    let mut ready = false;
    for generation in 1..=20 {
        let commit = repo.commit("deploy/app-0.yaml", configmap(0, generation).as_bytes());
        push().await.expect("push");
        if applied(commit).await {
            ready = true;
            break;
        }
    }
    if !ready {
        let _ = writeln!(report, "Push to applied could not be measured: no push was applied.\n");
        return;
    }
    let mut times = Vec::with_capacity(trials);
    for t in 0..trials {
        // Each commit changes one object; agentk applies all 50 (server-side apply each).
        let commit =
            repo.commit(&format!("deploy/app-{}.yaml", t % OBJECTS), configmap(t % OBJECTS, 100 + t).as_bytes());
        let started = Instant::now();
        push().await.expect("push");
        if !applied(commit).await {
            let _ = writeln!(report, "Push to applied: trial {t} was not applied within 10 s.\n");
            return;
        }
        times.push(started.elapsed());
    }
    times.sort();
    let _ = writeln!(
        report,
        "### Push to applied\n\n{trials} sequential trials. A manifest project of {OBJECTS} ConfigMaps (a local \
         repository); two kas on one Redis, kas polling every hour; agentk (in this process) connected to kas A \
         applies to the fake API server (server-side apply of every object, then its inventory). Each trial commits a \
         change to one file, posts the push to kas B's REST gateway and waits for agentk's report of that commit.\n"
    );
    let _ = writeln!(report, "| objects | p50 (ms) | p99 (ms) | max (ms) |\n| --- | --- | --- | --- |");
    let max = times.last().copied().unwrap_or_default();
    let _ = writeln!(
        report,
        "| {OBJECTS} | {} | {} | {} |\n",
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99)),
        ms(max)
    );
}

/// N agents with the same manifest project (an HTTP remote), each with an open
/// GetObjectsToSynchronize stream on one kas: Git HTTP requests per poll period.
async fn poll_cost(report: &mut String) {
    const PERIOD: Duration = Duration::from_millis(200);
    const MEASURED: Duration = Duration::from_secs(10);
    let _ = writeln!(
        report,
        "### Poll cost per manifest project\n\nN agents whose configurations name the same manifest project (a \
         remote on a branch, served by `git http-backend` in this process), each with an open \
         `GetObjectsToSynchronize` stream on one kas; `gitops.poll_period` and `agents.configuration_poll_period` \
         {} ms (polls of one repository within a tenth of the latter share one fetch). Git HTTP requests over {} s, \
         and per poll period (one fetch of an unchanged branch is 2 requests here).\n",
        PERIOD.as_millis(),
        MEASURED.as_secs()
    );
    let _ = writeln!(report, "| agents | Git HTTP requests | per poll period |\n| --- | --- | --- |");
    for agents in [1_i64, 10, 100] {
        let root = tempfile::tempdir().expect("tempdir");
        let repo = GitRepo::create_in(root.path(), "group/manifests.git");
        for i in 0..OBJECTS {
            repo.commit(&format!("deploy/app-{i}.yaml"), configmap(i, 0).as_bytes());
        }
        let server = GitHttpServer::start(root.path()).await;
        let url = format!("{}/group/manifests.git", server.url());
        let config = format!("gitops:\n  manifest_projects:\n    - id: {url}\n      ref: {{branch: main}}\n");
        let ids: Vec<(i64, i64)> = (1..=agents).map(|id| (id, 1)).collect();
        // The configuration's poll period sets how long polls of one repository share a read
        // (a tenth of it): the same period here, so sharing, not that window, is measured.
        let mut builder = Cluster::builder().agents(&ids).configure(|config, _| {
            config.gitops.poll_period = PERIOD;
            config.agents.configuration_poll_period = PERIOD;
        });
        for id in 1..=agents {
            builder = builder.agent_configuration(id, AgentConfigDocument::parse(&config).expect("configuration"));
        }
        let c = builder.start().await;
        let mut streams = Vec::new();
        for id in 1..=agents {
            let mut client = GitopsAgentClient::new(channel(c.kas[0].addresses.agent));
            let request = ObjectsToSynchronizeRequest {
                project_id: url.clone(),
                r#ref: "branch:main".into(),
                ..Default::default()
            };
            let mut stream = client
                .get_objects_to_synchronize(authorized(request, &c.agent(id).token))
                .await
                .expect("stream")
                .into_inner();
            // The first commit, whole (header, objects, trailer), before the measurement.
            for _ in 0..OBJECTS + 2 {
                stream.message().await.expect("message").expect("open");
            }
            streams.push(stream);
        }
        let before = server.requests();
        tokio::time::sleep(MEASURED).await;
        let requests = server.requests() - before;
        let per_period = requests as f64 / (MEASURED.as_secs_f64() / PERIOD.as_secs_f64());
        let _ = writeln!(report, "| {agents} | {requests} | {per_period:.2} |");
        drop(streams);
    }
    let _ = writeln!(report);
}
