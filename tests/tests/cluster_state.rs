//! Real-time cluster state (issue 17): agentk's informers watch the fake API server, agentk
//! pushes views to the kas it is connected to, and callers on another kas read them and watch
//! their changes as Server-Sent Events; across agentk restarts, kas restarts and configuration
//! changes.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kas_e2e::cluster::set_configuration_repository;
use kas_e2e::{AgentkHandle, Cluster, FakeKube, GitRepo, authorized, eventually};
use kas_proto::cluster_state::cluster_state_client::ClusterStateClient;
use kas_proto::cluster_state::{GetClusterStateRequest, ListObjectsRequest, WatchRequest, event};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const CONFIG_PATH: &str = ".gitlab/agents/agent-1/config.yaml";
const PODS_AND_CONFIGMAPS: &str = "cluster_state:\n  resources:\n    - {version: v1, resource: pods}\n    \
                                   - {version: v1, resource: configmaps, namespaces: [apps]}\n";
const PODS_ONLY: &str = "cluster_state:\n  resources:\n    - {version: v1, resource: pods}\n";

async fn kube_client(kube: &FakeKube) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&kube.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Two kas sharing a Redis; agent 1's configuration comes from `config_repo` (polled every 100 ms).
async fn cluster(config_repo: &GitRepo) -> Cluster {
    let bare = config_repo.bare.clone();
    let c = Cluster::builder()
        .kas(2)
        .redis()
        .configure(move |config, _| {
            config.agents.configuration_poll_period = Duration::from_millis(100);
            set_configuration_repository(config.agents.static_file.as_ref().unwrap(), 0, bare.display().to_string());
        })
        .start()
        .await;
    c.kube.add_namespace("agentk");
    c.kube.add_namespace("apps");
    c
}

/// agentk for agent 1 connected to the kas numbered `kas` (in that order), with short Lease timings.
async fn start_agentk(c: &Cluster, kas: &[usize], pod: &str) -> AgentkHandle {
    let mut config = c.agentk_config(1, kas[0], pod);
    config.kas_address =
        kas.iter().map(|k| format!("grpc://{}", c.kas[*k].addresses.agent)).collect::<Vec<_>>().join(",");
    config.gitops.lease_duration = Duration::from_millis(1500);
    config.gitops.lease_renew_deadline = Duration::from_millis(1000);
    config.gitops.lease_retry_period = Duration::from_millis(200);
    c.start_agentk_with(config).await
}

/// `GET` on kas number `kas`'s REST gateway.
async fn get(c: &Cluster, kas: usize, path: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("{}{path}", c.rest_url(kas)))
        .bearer_auth(c.gitlab_jwt())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// One Server-Sent Event.
#[derive(Debug, Clone)]
struct Sse {
    event: String,
    id: String,
    data: Value,
}

impl Sse {
    /// `upsert p1 Running`, `delete p1`, `snapshot p0,p1`, `freshness false`: what a test compares.
    fn describe(&self) -> String {
        match self.event.as_str() {
            "upsert" => format!(
                "upsert {} {} {}",
                self.data["resource"].as_str().unwrap(),
                self.data["object"]["name"].as_str().unwrap(),
                self.data["object"]["status"].as_str().unwrap_or("-")
            ),
            "delete" => format!(
                "delete {} {}",
                self.data["resource"].as_str().unwrap(),
                self.data["object"]["name"].as_str().unwrap()
            ),
            "snapshot" => {
                let mut names: Vec<String> = self.data["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|r| {
                        let resource = r["summary"]["name"].as_str().unwrap().to_owned();
                        r["objects"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(move |o| format!("{resource}/{}", o["name"].as_str().unwrap()))
                    })
                    .collect();
                names.sort();
                format!("snapshot {}", names.join(","))
            }
            "freshness" => format!("freshness {}", self.data["live"]),
            "resource_removed" => format!("resource_removed {}", self.data["resource"].as_str().unwrap()),
            other => other.to_owned(),
        }
    }
}

/// An SSE subscription read event by event, and the state its events make.
struct Subscriber {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: String,
    /// `resource/name` of every object, as the events so far say.
    objects: std::collections::BTreeSet<String>,
    live: Option<bool>,
}

impl Subscriber {
    async fn open(c: &Cluster, kas: usize, agent: i64, last_event_id: Option<&str>) -> Self {
        let mut request = reqwest::Client::new()
            .get(format!("{}/api/v1/agents/{agent}/events", c.rest_url(kas)))
            .bearer_auth(c.gitlab_jwt());
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let resp = request.send().await.unwrap();
        assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        Self { body: resp.bytes_stream().boxed(), buffer: String::new(), objects: Default::default(), live: None }
    }

    async fn next(&mut self) -> Sse {
        let read = async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let raw: String = self.buffer.drain(..end + 2).collect();
                    let mut sse = Sse { event: String::new(), id: String::new(), data: Value::Null };
                    for line in raw.lines() {
                        if let Some(v) = line.strip_prefix("event: ") {
                            sse.event = v.to_owned();
                        } else if let Some(v) = line.strip_prefix("id: ") {
                            sse.id = v.to_owned();
                        } else if let Some(v) = line.strip_prefix("data: ") {
                            sse.data = serde_json::from_str(v).unwrap();
                        }
                    }
                    if sse.event.is_empty() {
                        continue; // a keep-alive comment
                    }
                    self.apply(&sse);
                    return sse;
                }
                let chunk = self.body.next().await.expect("the event stream ended").unwrap();
                self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        };
        tokio::time::timeout(kas_e2e::EVENTUALLY_TIMEOUT, read).await.expect("no event in time")
    }

    fn apply(&mut self, e: &Sse) {
        let name = |d: &Value| format!("{}/{}", d["resource"].as_str().unwrap(), d["object"]["name"].as_str().unwrap());
        match e.event.as_str() {
            "snapshot" => {
                self.objects = e
                    .describe()
                    .trim_start_matches("snapshot")
                    .trim()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
                self.live = e.data["live"].as_bool();
            }
            "upsert" => {
                self.objects.insert(name(&e.data));
            }
            "delete" => {
                self.objects.remove(&name(&e.data));
            }
            "freshness" => self.live = e.data["live"].as_bool(),
            _ => {}
        }
    }

    /// Reads events until they make `objects`, `live`; returns them.
    async fn until_state(&mut self, objects: &[&str], live: bool) -> Vec<String> {
        let want: std::collections::BTreeSet<String> = objects.iter().map(|o| (*o).to_owned()).collect();
        let mut seen = Vec::new();
        while self.objects != want || self.live != Some(live) {
            seen.push(self.next().await.describe());
        }
        seen
    }

    /// Reads events until one is `want`, returning the ones before it.
    async fn until(&mut self, want: &str) -> Vec<String> {
        let mut before = Vec::new();
        loop {
            let e = self.next().await;
            let d = e.describe();
            if d == want {
                return before;
            }
            before.push(d);
        }
    }
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap()
}

async fn set_phase(pods: &Api<Pod>, name: &str, phase: &str, ready: bool) {
    let status = json!({"status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

/// Pods created, changed and deleted on the API server reach a subscriber on the other kas in
/// order with the right views; the REST reads agree; a resource removed from the configuration
/// says so and sends nothing more.
#[tokio::test]
async fn pod_changes_reach_a_subscriber_on_another_kas_in_order_and_a_removed_resource_goes_quiet() {
    let config_repo = GitRepo::new();
    config_repo.commit(CONFIG_PATH, PODS_AND_CONFIGMAPS.as_bytes());
    let c = cluster(&config_repo).await;
    let client = kube_client(&c.kube).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    let configmaps: Api<ConfigMap> = Api::namespaced(client, "apps");
    pods.create(&PostParams::default(), &pod("before")).await.unwrap();
    let _agentk = start_agentk(&c, &[0], "agentk-0").await;

    // kas 1 answers from kas 0's copy: no request into the cluster.
    eventually!(
        get(&c, 1, "/api/v1/agents/1/cluster_state").await.1["resources"]
            .as_array()
            .is_some_and(|r| r.len() == 2 && r.iter().all(|r| r["synced"] == true)),
        "both resources listed, as seen from kas 1"
    );
    let (status, body) = get(&c, 1, "/api/v1/agents/1/cluster_state/pods?namespace=apps").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["live"], true);
    assert_eq!(body["objects"][0]["name"], "before");
    assert_eq!(body["objects"][0]["labels"], json!({"app": "web"}));
    let requests_before = c.kube.requests().len();
    let (status, _) = get(&c, 1, "/api/v1/agents/1/cluster_state").await;
    assert_eq!(status, 200);
    assert_eq!(c.kube.requests().len(), requests_before, "reads went into the cluster");

    let mut sse = Subscriber::open(&c, 1, 1, None).await;
    assert_eq!(sse.next().await.describe(), "snapshot pods/before");
    pods.create(&PostParams::default(), &pod("web")).await.unwrap();
    assert_eq!(sse.next().await.describe(), "upsert pods web Pending");
    set_phase(&pods, "web", "Running", true).await;
    let running = sse.next().await;
    assert_eq!(running.describe(), "upsert pods web Running");
    assert_eq!(running.data["object"]["ready"], true);
    assert_eq!(running.data["object"]["namespace"], "apps");
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    assert_eq!(sse.next().await.describe(), "delete pods web");
    let cm = serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": "settings"}})).unwrap();
    configmaps.create(&PostParams::default(), &cm).await.unwrap();
    assert_eq!(sse.next().await.describe(), "upsert configmaps settings -");
    let (_, body) = get(&c, 1, "/api/v1/agents/1/cluster_state").await;
    let pods_summary = body["resources"].as_array().unwrap().iter().find(|r| r["name"] == "pods").unwrap().clone();
    assert_eq!(pods_summary["count"], 1, "{body}");

    // The configuration stops naming configmaps: subscribers hear it, then nothing of them.
    config_repo.commit(CONFIG_PATH, PODS_ONLY.as_bytes());
    assert_eq!(sse.until("resource_removed configmaps").await, Vec::<String>::new());
    let cm2 = serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": "ignored"}})).unwrap();
    configmaps.create(&PostParams::default(), &cm2).await.unwrap();
    pods.create(&PostParams::default(), &pod("after")).await.unwrap();
    assert_eq!(sse.next().await.describe(), "upsert pods after Pending", "no event of the configmap");
    let (status, body) = get(&c, 1, "/api/v1/agents/1/cluster_state/configmaps").await;
    assert_eq!(status, 404, "{body}");

    // The same on gRPC (`kas.cluster_state.v1.ClusterState` on kas 1's api listener).
    let mut grpc = ClusterStateClient::new(kas_e2e::cluster::channel(c.kas[1].addresses.api));
    let summary = grpc
        .get_cluster_state(authorized(GetClusterStateRequest { agent_id: 1 }, &c.gitlab_jwt()))
        .await
        .unwrap()
        .into_inner();
    assert!(summary.freshness.unwrap().live);
    assert_eq!(summary.resources.len(), 1, "configmaps went with the configuration");
    assert_eq!(summary.resources[0].count, 2, "before, after");
    let list = ListObjectsRequest { agent_id: 1, resource: "pods".into(), namespace: "apps".into() };
    let names: Vec<String> = grpc
        .list_objects(authorized(list, &c.gitlab_jwt()))
        .await
        .unwrap()
        .into_inner()
        .objects
        .into_iter()
        .map(|o| o.name)
        .collect();
    assert_eq!(names, ["after", "before"]);
    let mut watch = grpc
        .watch(authorized(WatchRequest { agent_id: 1, last_event_id: String::new() }, &c.gitlab_jwt()))
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(event::Event::Snapshot(_))), "{first:?}");
    pods.delete("after", &DeleteParams::default()).await.unwrap();
    let next = tokio::time::timeout(kas_e2e::EVENTUALLY_TIMEOUT, watch.message()).await.unwrap().unwrap().unwrap();
    let Some(event::Event::Delete(change)) = next.event else { panic!("{next:?}") };
    assert_eq!(change.object.unwrap().name, "after");
    let missing =
        grpc.get_cluster_state(authorized(GetClusterStateRequest { agent_id: 2 }, &c.gitlab_jwt())).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    let unauthenticated = grpc.get_cluster_state(GetClusterStateRequest { agent_id: 1 }).await.unwrap_err();
    assert_eq!(unauthenticated.code(), tonic::Code::Unauthenticated);
    c.assert_metrics(0, &["kas_cluster_state_pushed_messages_total", "kas_cluster_state_events_total"]).await;

    // The configuration drops the section: kas is told, not left holding views it thinks stale.
    config_repo.commit(CONFIG_PATH, b"observability: {logging: {level: info}}\n");
    assert_eq!(
        sse.until("resource_removed pods").await,
        ["delete pods after"],
        "the delete seen over gRPC, then the removal"
    );
    eventually!(get(&c, 1, "/api/v1/agents/1/cluster_state").await.1["resources"] == json!([]), "no resource observed");
    c.assert_metrics(1, &["kas_cluster_state_subscribers"]).await;
}

/// agentk stops: subscribers see `live: false`; changes made meanwhile arrive once it is back,
/// making the subscriber's state the cluster's again. Then the kas holding the state stops: the
/// subscriber on the other kas sees the staleness, then a snapshot from the kas agentk moved to.
#[tokio::test]
async fn restarts_of_agentk_and_of_its_kas_show_staleness_then_a_consistent_state() {
    let config_repo = GitRepo::new();
    config_repo.commit(CONFIG_PATH, PODS_ONLY.as_bytes());
    let mut c = cluster(&config_repo).await;
    let pods: Api<Pod> = Api::namespaced(kube_client(&c.kube).await, "apps");
    for name in ["a", "b"] {
        pods.create(&PostParams::default(), &pod(name)).await.unwrap();
    }
    let agentk = start_agentk(&c, &[0, 1], "agentk-0").await;
    eventually!(get(&c, 1, "/api/v1/agents/1/cluster_state/pods").await.1["summary"]["synced"] == true, "listed");
    let mut sse = Subscriber::open(&c, 1, 1, None).await;
    assert_eq!(sse.next().await.describe(), "snapshot pods/a,pods/b");

    agentk.stop().await;
    assert_eq!(sse.next().await.describe(), "freshness false");
    let (_, body) = get(&c, 1, "/api/v1/agents/1/cluster_state").await;
    assert_eq!(body["live"], false, "reads say the data is not current: {body}");
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    pods.create(&PostParams::default(), &pod("c")).await.unwrap();
    let _agentk = start_agentk(&c, &[0, 1], "agentk-1").await;
    // The same kas holds the state: the relist's difference, not a new snapshot.
    let mut seen = vec![sse.next().await.describe()];
    while seen.len() < 3 {
        seen.push(sse.next().await.describe());
    }
    seen.sort();
    assert_eq!(seen, ["delete pods a", "freshness true", "upsert pods c Pending"]);

    // The kas holding the state goes away: agentk moves to kas 1, the subscriber (on kas 1) sees
    // the staleness, then the state kas 1 now holds.
    pods.create(&PostParams::default(), &pod("d")).await.unwrap();
    let d = sse.next().await;
    assert_eq!(d.describe(), "upsert pods d Pending");
    let kas0 = c.kas.remove(0);
    kas0.stop().await;
    let before_stale = sse.until("freshness false").await;
    assert!(before_stale.iter().all(|e| !e.starts_with("snapshot")), "{before_stale:?}");
    let seen = sse.until_state(&["pods/b", "pods/c", "pods/d"], true).await;
    assert!(seen[0].starts_with("snapshot"), "the new kas's state starts with a snapshot: {seen:?}");
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(sse.until("delete pods b").await, Vec::<String>::new());
    // A subscriber resuming from an id of the old kas gets the whole state, not a gap.
    let mut resumed = Subscriber::open(&c, 0, 1, Some(&d.id)).await;
    assert_eq!(resumed.next().await.describe(), "snapshot pods/c,pods/d");
}

/// Reads from a raw socket until `done` says the text so far is enough.
async fn read_until(stream: &mut tokio::net::TcpStream, text: &mut String, done: impl Fn(&str) -> bool) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let read = async {
        while !done(text) {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the event stream ended");
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read).await.expect("read in time");
}

/// A subscriber that stops reading while thousands of changes happen is not sent a backlog when
/// it reads again: kas held a bounded amount for it and catches it up with a snapshot of the
/// current state, then changes.
#[tokio::test]
async fn a_subscriber_that_stops_reading_is_caught_up_with_a_snapshot_not_a_backlog() {
    use tokio::io::AsyncWriteExt;
    const PODS: usize = 500;
    const GENERATIONS: usize = 8;
    let config_repo = GitRepo::new();
    config_repo.commit(CONFIG_PATH, PODS_ONLY.as_bytes());
    let c = cluster(&config_repo).await;
    for i in 0..PODS {
        c.kube.put_pod("apps", &format!("p{i}"), "Running", true, &[("gen", "0")]);
    }
    let _agentk = start_agentk(&c, &[0], "agentk-0").await;
    eventually!(
        get(&c, 1, "/api/v1/agents/1/cluster_state").await.1["resources"][0]["count"] == PODS,
        "the pods listed"
    );

    // A client with a tiny receive window (as tests/src/slow_client.rs) on kas 1, the kas that
    // does not hold the state: the backlog would pile up in kas 0's relay or kas 1.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(c.kas[1].addresses.rest).await.unwrap();
    let request = format!(
        "GET /api/v1/agents/1/events HTTP/1.1\r\nHost: kas\r\nAuthorization: Bearer {}\r\n\r\n",
        c.gitlab_jwt()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    read_until(&mut stream, &mut text, |t| t.contains("event: snapshot")).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{}", &text[..text.len().min(200)]);

    // It stops reading; every pod changes GENERATIONS times.
    for generation in 1..=GENERATIONS {
        for i in 0..PODS {
            c.kube.put_pod("apps", &format!("p{i}"), "Running", true, &[("gen", &generation.to_string())]);
        }
    }
    let last = GENERATIONS.to_string();
    eventually!(
        {
            let (_, b) = get(&c, 1, "/api/v1/agents/1/cluster_state/pods").await;
            b["objects"].as_array().is_some_and(|o| o.iter().all(|o| o["labels"]["gen"] == last.as_str()))
        },
        "kas has the last generation"
    );

    // It reads again: until every pod is at the last generation, as its events say.
    let mut state: std::collections::BTreeMap<String, String> = Default::default();
    let mut events = 0usize;
    let mut snapshots = 0usize;
    let mut consumed = 0usize;
    let all_current =
        |state: &std::collections::BTreeMap<String, String>| state.len() == PODS && state.values().all(|g| *g == last);
    while !all_current(&state) {
        read_until(&mut stream, &mut text, |t| t[consumed..].contains("\n\n")).await;
        while let Some(end) = text[consumed..].find("\n\n") {
            let raw = text[consumed..consumed + end].to_owned();
            consumed += end + 2;
            let event = raw.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_default().to_owned();
            // HTTP/1.1 chunked framing lines sit between events: only `data:` lines are JSON.
            let Some(data) = raw.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
            let data: Value = serde_json::from_str(data).unwrap();
            events += 1;
            match event.as_str() {
                "snapshot" => {
                    snapshots += 1;
                    state = data["resources"][0]["objects"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|o| {
                            (o["name"].as_str().unwrap().to_owned(), o["labels"]["gen"].as_str().unwrap().to_owned())
                        })
                        .collect();
                }
                "upsert" => {
                    let o = &data["object"];
                    state.insert(
                        o["name"].as_str().unwrap().to_owned(),
                        o["labels"]["gen"].as_str().unwrap().to_owned(),
                    );
                }
                _ => {}
            }
        }
    }
    let changes = PODS * GENERATIONS;
    // The first snapshot is the one read before it stopped (still in `text`).
    assert!(snapshots >= 2, "caught up with a second snapshot ({snapshots} in all)");
    assert!(events < changes / 2, "{events} events for {changes} changes: a backlog was kept for the client");
}

/// Redis restarts empty: the kas holding the state says so again as soon as Redis is back (with
/// the registry's resync), so reads on the other kas work again within seconds, not at the next
/// holder refresh (30 s).
#[tokio::test]
async fn reads_through_another_kas_recover_soon_after_redis_restarts_empty() {
    let config_repo = GitRepo::new();
    config_repo.commit(CONFIG_PATH, PODS_ONLY.as_bytes());
    let mut c = cluster(&config_repo).await;
    c.kube.put_pod("apps", "web", "Running", true, &[]);
    let _agentk = start_agentk(&c, &[0], "agentk-0").await;
    eventually!(get(&c, 1, "/api/v1/agents/1/cluster_state/pods").await.0 == 200, "read through kas 1");

    c.redis.as_mut().unwrap().stop().await;
    c.redis.as_mut().unwrap().start_again().await;
    let restarted = std::time::Instant::now();
    eventually!(
        get(&c, 1, "/api/v1/agents/1/cluster_state/pods").await.1["objects"][0]["name"] == "web",
        "read through kas 1 after the restart"
    );
    assert!(restarted.elapsed() < Duration::from_secs(10), "took {:?}", restarted.elapsed());
}

/// What agentk may push is bounded and checked: a bad message is INVALID_ARGUMENT naming the
/// field, more resources than a configuration allows or more views than
/// `cluster_state.max_objects_per_agent` is RESOURCE_EXHAUSTED; no agent token, UNAUTHENTICATED.
#[tokio::test]
async fn bad_or_oversized_pushes_are_refused_with_the_reason() {
    use kas_proto::cluster_state::cluster_state_agent_client::ClusterStateAgentClient;
    use kas_proto::cluster_state::resource_update::Phase;
    use kas_proto::cluster_state::{ObjectView, PushRequest, ResourceKey, ResourceUpdate};
    let c = Cluster::builder().configure(|config, _| config.cluster_state.max_objects_per_agent = 10).start().await;
    let token = c.agent(1).token.clone();
    let push = |messages: Vec<PushRequest>, token: Option<String>| {
        let mut client = ClusterStateAgentClient::new(kas_e2e::cluster::channel(c.kas[0].addresses.agent));
        async move {
            let stream = futures::stream::iter(messages);
            let request = match token {
                Some(t) => authorized(stream, &t),
                None => tonic::Request::new(stream),
            };
            client.push(request).await.unwrap_err()
        }
    };
    let key = |i: usize| ResourceKey { group: "example.com".into(), version: "v1".into(), resource: format!("r{i}") };
    let update = |key: ResourceKey, phase: Phase, objects: usize| ResourceUpdate {
        resource: Some(key),
        phase: phase as i32,
        upserts: (0..objects).map(|i| ObjectView { name: format!("o{i}"), ..Default::default() }).collect(),
        ..Default::default()
    };

    let e =
        push(vec![PushRequest { updates: vec![ResourceUpdate::default()], resources: vec![] }], Some(token.clone()))
            .await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("PushRequest.updates[0].resource is missing"), "{e:?}");
    let e = push(vec![PushRequest { updates: vec![update(key(0), Phase::Changes, 0)], resources: vec![] }], None).await;
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

    let many: Vec<ResourceUpdate> = (0..=50).map(|i| update(key(i), Phase::SnapshotBegin, 0)).collect();
    let e = push(vec![PushRequest { updates: many, resources: vec![] }], Some(token.clone())).await;
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("more than 50 resources"), "{e:?}");

    // A new stream names its resources first: kas forgets the 51 of the last one.
    let big = vec![PushRequest { updates: vec![update(key(0), Phase::SnapshotBegin, 11)], resources: vec![key(0)] }];
    let e = push(big, Some(token)).await;
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("11 object views, more than cluster_state.max_objects_per_agent (10)"), "{e:?}");
}
