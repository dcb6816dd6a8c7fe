//! GitOps, agentk's half (issue 16): real kas serving a real Git repository's manifests to agentk,
//! which applies them to the fake API server: server-side apply, the inventory and prune,
//! inventory policies, dry runs, propagation policies, drift correction, cancellation by a newer
//! commit, run-time configuration changes, and the report of each sync.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use agentk::modules::gitops::inventory_name;
use k8s_openapi::api::core::v1::ConfigMap;
use kas::agent::AgentConfigDocument;
use kas_e2e::cluster::set_configuration_repository;
use kas_e2e::{AgentkHandle, Cluster, FakeKube, GitRepo, eventually};
use kas_proto::gitops::SyncReport;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps}\n";
const APP: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n\
                   spec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    \
                   metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: nginx}]}\n\
                   ---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {mode: fast}\n";
const EXTRA: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: extra}\ndata: {a: b}\n";

/// A kube-rs client for the fake API server (what a user's kubectl would be).
async fn kube_client(kube: &FakeKube) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&kube.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The agent configuration with one manifest project: the repository, and `extra` keys.
fn gitops(repo: &GitRepo, extra: &str) -> String {
    format!("gitops:\n  manifest_projects:\n    - id: {}\n{extra}", repo.bare.display())
}

/// A cluster whose agent 1 applies `repo` with `extra` settings, kas polling both every 100 ms; the
/// fake has the namespace of agentk's Lease.
async fn cluster(repo: &GitRepo, extra: &str) -> Cluster {
    let c = Cluster::builder()
        .agent_configuration(1, AgentConfigDocument::parse(&gitops(repo, extra)).unwrap())
        .configure(|config, _| {
            config.agents.configuration_poll_period = Duration::from_millis(100);
            config.gitops.poll_period = Duration::from_millis(100);
        })
        .start()
        .await;
    c.kube.add_namespace("agentk");
    c
}

/// agentk for agent 1 re-applying every `reapply`.
async fn start_agentk(c: &Cluster, reapply: Duration) -> AgentkHandle {
    let mut config = c.agentk_config(1, 0, "agentk-0");
    config.gitops.reapply_period = reapply;
    c.start_agentk_with(config).await
}

/// Waits for agentk's last sync report to satisfy `matches`.
async fn report(a: &AgentkHandle, what: &str, matches: impl Fn(&SyncReport) -> bool) -> SyncReport {
    let mut gitops = a.status.gitops.clone();
    let found = tokio::time::timeout(
        kas_e2e::EVENTUALLY_TIMEOUT,
        gitops.wait_for(|s| s.projects.values().any(|p| p.last.as_ref().is_some_and(&matches))),
    )
    .await;
    let state = a.status.gitops.borrow().clone();
    assert!(found.is_ok(), "no report {what}; last: {state:?}");
    state.projects.values().find_map(|p| p.last.clone().filter(&matches)).unwrap()
}

fn annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object["metadata"]["annotations"][key].as_str()
}

fn managers(object: &Value) -> Vec<String> {
    object["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{}:{}", e["manager"].as_str().unwrap(), e["operation"].as_str().unwrap()))
        .collect()
}

/// The inventory's recorded objects as "Kind namespace/name".
fn recorded(kube: &FakeKube, namespace: &str, name: &str) -> Vec<String> {
    let cm = kube.object("v1/configmaps", namespace, name).expect("inventory ConfigMap");
    let objects: Vec<Value> = serde_json::from_str(cm["data"]["objects"].as_str().unwrap()).unwrap();
    let mut found: Vec<String> = objects
        .iter()
        .map(|o| {
            format!(
                "{} {}/{}",
                o["kind"].as_str().unwrap(),
                o["namespace"].as_str().unwrap(),
                o["name"].as_str().unwrap()
            )
        })
        .collect();
    found.sort();
    found
}

#[tokio::test]
async fn a_commit_is_applied_and_the_next_prunes_what_left_without_touching_other_objects() {
    let repo = GitRepo::new();
    repo.commit("deploy/namespace.yaml", NAMESPACE.as_bytes());
    repo.commit("deploy/app.yaml", APP.as_bytes());
    let first = repo.commit("deploy/extra.yaml", EXTRA.as_bytes());
    // The inventory lives in `apps`, which the commit itself creates.
    let c = cluster(&repo, "      default_namespace: apps\n").await;
    let a = start_agentk(&c, Duration::from_secs(300)).await;

    let r = report(&a, "for the first commit", |r| r.commit_id == first).await;
    assert_eq!((r.applied, r.unchanged, r.pruned, r.failed, r.error.as_str()), (4, 0, 0, 0, ""), "{r:?}");
    assert_eq!((r.pod_name.as_str(), r.dry_run_strategy.as_str()), ("agentk-0", "none"));
    let project = repo.bare.display().to_string();
    let inventory = inventory_name(1, &project, "");
    let web = c.kube.object("apps/v1/deployments", "apps", "web").expect("deployment applied");
    assert_eq!(web["spec"]["replicas"], 2);
    assert_eq!(web["spec"]["template"]["spec"]["containers"][0]["image"], "nginx");
    assert_eq!(annotation(&web, "config.k8s.io/owning-inventory"), Some(inventory.as_str()));
    assert_eq!(managers(&web), ["agentk:Apply"]);
    let settings = c.kube.object("v1/configmaps", "apps", "settings").unwrap();
    assert_eq!(settings["data"], json!({"mode": "fast"}));
    assert!(c.kube.object("v1/configmaps", "apps", "extra").is_some());
    assert!(c.kube.object("v1/namespaces", "", "apps").is_some());
    let cm = c.kube.object("v1/configmaps", "apps", &inventory).unwrap();
    assert_eq!(cm["metadata"]["labels"]["app.kubernetes.io/managed-by"], "agentk");
    assert_eq!(annotation(&cm, "agentk/manifest-project"), Some(project.as_str()));
    let mut expected = ["ConfigMap apps/extra", "ConfigMap apps/settings", "Deployment apps/web", "Namespace /apps"];
    expected.sort();
    assert_eq!(recorded(&c.kube, "apps", &inventory), expected);
    // The report reached kas: its status API answers it (item 6, agentk and kas together).
    let url = format!("{}/api/v1/agents/1/gitops", c.rest_url(0));
    let mut body: Value;
    eventually!(
        {
            let response = reqwest::Client::new().get(&url).bearer_auth(c.gitlab_jwt()).send().await.unwrap();
            body = response.json().await.unwrap();
            body["manifest_projects"][0]["last_sync"]["commit_id"] == first.as_str()
        },
        "kas has agentk's report of the first commit: {body}"
    );
    let sync = &body["manifest_projects"][0]["last_sync"];
    assert_eq!(body["manifest_projects"][0]["project_id"], project.as_str(), "{body}");
    assert_eq!(
        (sync["applied"].as_u64(), sync["pruned"].as_u64(), sync["failed"].as_u64()),
        (Some(4), Some(0), Some(0))
    );
    assert_eq!(sync["pod_name"], "agentk-0", "{body}");

    // Someone else's ConfigMap next to ours, and one that has our name pattern but is not ours.
    let client = kube_client(&c.kube).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client, "apps");
    let bystander = serde_json::from_value(json!({"metadata": {"name": "bystander"}, "data": {"x": "y"}})).unwrap();
    configmaps.create(&PostParams::default(), &bystander).await.unwrap();

    let second = repo.remove("deploy/extra.yaml");
    let r = report(&a, "for the second commit", |r| r.commit_id == second).await;
    assert_eq!((r.applied, r.unchanged, r.pruned, r.failed, r.error.as_str()), (0, 3, 1, 0, ""), "{r:?}");
    assert!(c.kube.object("v1/configmaps", "apps", "extra").is_none(), "extra pruned");
    assert_eq!(c.kube.object("v1/configmaps", "apps", "bystander").unwrap()["data"], json!({"x": "y"}));
    assert!(c.kube.object("apps/v1/deployments", "apps", "web").is_some());
    let mut expected = ["ConfigMap apps/settings", "Deployment apps/web", "Namespace /apps"];
    expected.sort();
    assert_eq!(recorded(&c.kube, "apps", &inventory), expected);
    assert!(a.status.gitops.borrow().leader);
    // In one process the first recorder installed (kas's) renders agentk's metrics too.
    let series = [
        "agentk_gitops_leader",
        "agentk_gitops_syncs_total{outcome=\"ok\"}",
        "agentk_gitops_objects_total{result=\"applied\"}",
        "agentk_gitops_objects_total{result=\"pruned\"}",
    ];
    c.assert_metrics(0, &series).await;
}

#[tokio::test]
async fn must_match_refuses_an_existing_object_and_adopt_all_takes_it_over_when_the_configuration_changes() {
    let manifests = GitRepo::new();
    let commit =
        manifests.commit("cm.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: taken}\ndata: {from: git}\n");
    let config_repo = GitRepo::new();
    let config_path = ".gitlab/agents/agent-1/config.yaml";
    config_repo.commit(config_path, gitops(&manifests, "      inventory_policy: must_match\n").as_bytes());
    let bare = config_repo.bare.clone();
    let c = Cluster::builder()
        .configure(move |config, _| {
            config.agents.configuration_poll_period = Duration::from_millis(100);
            config.gitops.poll_period = Duration::from_millis(100);
            set_configuration_repository(config.agents.static_file.as_ref().unwrap(), 0, bare.display().to_string());
        })
        .start()
        .await;
    c.kube.add_namespace("agentk");
    let configmaps: Api<ConfigMap> = Api::namespaced(kube_client(&c.kube).await, "default");
    let existing = serde_json::from_value(json!({"metadata": {"name": "taken"}, "data": {"from": "someone"}})).unwrap();
    configmaps.create(&PostParams::default(), &existing).await.unwrap();
    let a = start_agentk(&c, Duration::from_secs(300)).await;

    let r = report(&a, "refusing the object", |r| r.commit_id == commit).await;
    assert_eq!((r.applied, r.failed, r.error.as_str()), (0, 1, ""), "{r:?}");
    let e = &r.errors[0];
    assert_eq!((e.kind.as_str(), e.namespace.as_str(), e.name.as_str()), ("ConfigMap", "default", "taken"));
    assert_eq!((e.operation.as_str(), e.source.as_str(), e.version.as_str()), ("apply", "cm.yaml", "v1"));
    assert!(e.message.contains("inventory_policy must_match does not take it over"), "{e:?}");
    let live = c.kube.object("v1/configmaps", "default", "taken").unwrap();
    assert_eq!(live["data"], json!({"from": "someone"}));
    assert_eq!(annotation(&live, "config.k8s.io/owning-inventory"), None);
    // Not recorded either, so a later prune could never delete it.
    let inventory = inventory_name(1, &manifests.bare.display().to_string(), "");
    assert!(c.kube.object("v1/configmaps", "default", &inventory).is_none(), "nothing recorded");

    // The configuration changes at run time: the worker restarts with the new policy.
    config_repo.commit(config_path, gitops(&manifests, "      inventory_policy: adopt_all\n").as_bytes());
    let r = report(&a, "adopting the object", |r| r.commit_id == commit && r.failed == 0).await;
    assert_eq!((r.applied, r.error.as_str()), (1, ""), "{r:?}");
    let live = c.kube.object("v1/configmaps", "default", "taken").unwrap();
    assert_eq!(live["data"], json!({"from": "git"}));
    assert_eq!(annotation(&live, "config.k8s.io/owning-inventory"), Some(inventory.as_str()));
    assert_eq!(recorded(&c.kube, "default", &inventory), ["ConfigMap default/taken"]);

    // Without manifest projects the worker stops and the Lease is released.
    config_repo.commit(config_path, b"observability: {logging: {level: info}}\n");
    eventually!(a.status.gitops.borrow().projects.is_empty() && !a.status.gitops.borrow().leader, "worker stopped");
    let lease = c.kube.object("coordination.k8s.io/v1/leases", "agentk", "agentk-gitops-1").unwrap();
    assert!(lease["spec"]["holderIdentity"].is_null(), "{lease}");
}

#[tokio::test]
async fn a_server_dry_run_stores_nothing() {
    let repo = GitRepo::new();
    let commit = repo.commit("app.yaml", APP.as_bytes());
    let c = cluster(&repo, "      dry_run_strategy: server\n").await;
    let a = start_agentk(&c, Duration::from_secs(300)).await;

    let r = report(&a, "of the dry run", |r| r.commit_id == commit).await;
    assert_eq!((r.applied, r.failed, r.error.as_str(), r.dry_run_strategy.as_str()), (2, 0, "", "server"), "{r:?}");
    assert!(c.kube.objects("apps/v1/deployments", None).is_empty());
    assert!(c.kube.objects("v1/configmaps", Some("default")).is_empty(), "no object and no inventory stored");
    // The API server saw both applies, as dry runs.
    let applies: Vec<_> = c.kube.requests().into_iter().filter(|r| r.method == "PATCH").collect();
    assert_eq!(applies.len(), 2, "{applies:?}");
    assert!(
        applies.iter().all(|r| r.query.contains("dryRun=All") && r.query.contains("fieldManager=agentk")),
        "{applies:?}"
    );
}

#[tokio::test]
async fn prune_propagation_policy_orphan_leaves_the_dependents() {
    let repo = GitRepo::new();
    repo.commit("parent.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: parent}\n");
    let first = repo.commit("keep.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: keep}\n");
    let c = cluster(&repo, "      prune_propagation_policy: orphan\n").await;
    let a = start_agentk(&c, Duration::from_secs(300)).await;
    report(&a, "for the first commit", |r| r.commit_id == first && r.failed == 0).await;

    // A dependent of the parent (as a controller would create it), not in the inventory.
    let parent = c.kube.object("v1/configmaps", "default", "parent").unwrap();
    let owner = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": parent["metadata"]["uid"]});
    let child = json!({"metadata": {"name": "child", "ownerReferences": [owner]}});
    let configmaps: Api<ConfigMap> = Api::namespaced(kube_client(&c.kube).await, "default");
    configmaps.create(&PostParams::default(), &serde_json::from_value(child).unwrap()).await.unwrap();

    let second = repo.remove("parent.yaml");
    let r = report(&a, "pruning the parent", |r| r.commit_id == second).await;
    assert_eq!((r.pruned, r.failed), (1, 0), "{r:?}");
    assert!(c.kube.object("v1/configmaps", "default", "parent").is_none());
    // Orphaned: the garbage collector removed the owner reference instead of the object (the
    // default, background, would have deleted it).
    let child = c.kube.object("v1/configmaps", "default", "child").expect("child kept");
    assert!(child["metadata"]["ownerReferences"].is_null(), "{child}");
}

#[tokio::test]
async fn drift_is_corrected_by_the_periodic_apply() {
    let repo = GitRepo::new();
    let commit = repo.commit("app.yaml", APP.as_bytes());
    let c = cluster(&repo, "").await;
    let a = start_agentk(&c, Duration::from_millis(300)).await;
    report(&a, "for the commit", |r| r.commit_id == commit && r.failed == 0).await;

    // Someone edits an applied object and adds a field of their own.
    let configmaps: Api<ConfigMap> = Api::namespaced(kube_client(&c.kube).await, "default");
    let edit = json!({"data": {"mode": "slow", "mine": "kept"}});
    configmaps.patch("settings", &PatchParams::default(), &Patch::Merge(&edit)).await.unwrap();
    assert_eq!(c.kube.object("v1/configmaps", "default", "settings").unwrap()["data"]["mode"], "slow");

    eventually!(
        c.kube.object("v1/configmaps", "default", "settings").unwrap()["data"]["mode"] == "fast",
        "drift corrected"
    );
    let settings = c.kube.object("v1/configmaps", "default", "settings").unwrap();
    // Server-side apply takes back agentk's field and leaves the other manager's.
    assert_eq!(settings["data"], json!({"mode": "fast", "mine": "kept"}));
    let r = report(&a, "with the correction", |r| r.commit_id == commit && r.applied == 1).await;
    assert_eq!((r.unchanged, r.failed), (1, 0), "{r:?}");
    // And then nothing changes: the deployment and the configmap are as applied.
    report(&a, "without changes", |r| r.commit_id == commit && r.unchanged == 2).await;
}

#[tokio::test]
async fn a_new_commit_cancels_a_slow_apply() {
    let repo = GitRepo::new();
    let many: String =
        (0..30).map(|i| format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: old-{i}}}\n")).collect();
    let first = repo.commit("old.yaml", many.as_bytes());
    let c = cluster(&repo, "").await;
    // Every API call takes 100 ms: the first commit's 30 objects take seconds.
    c.kube.delay(Some(Duration::from_millis(100)));
    let a = start_agentk(&c, Duration::from_secs(300)).await;
    // Applies go one at a time: once old-1's is asked for, old-0 exists.
    eventually!(
        c.kube.requests().iter().any(|r| r.method == "PATCH" && r.path.ends_with("/configmaps/old-1")),
        "the first commit's apply started"
    );
    let second = repo.commit("old.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: new}\n");
    let r = report(&a, "cancelling the first commit", |r| r.commit_id == first).await;
    assert_eq!(r.error, format!("cancelled: commit {second} arrived"));
    assert!(r.applied < 30, "{r:?}");
    c.kube.delay(None);

    let r = report(&a, "for the second commit", |r| r.commit_id == second).await;
    assert_eq!((r.applied, r.failed, r.error.as_str()), (1, 0, ""), "{r:?}");
    assert!(c.kube.object("v1/configmaps", "default", "new").is_some());
    // What the cancelled apply had created was recorded before it started, so it is pruned.
    assert!(r.pruned >= 1, "{r:?}");
    assert!(
        c.kube
            .objects("v1/configmaps", Some("default"))
            .iter()
            .all(|o| !o["metadata"]["name"].as_str().unwrap().starts_with("old-"))
    );
}

#[tokio::test]
async fn a_custom_resource_waits_for_its_crd_of_the_same_commit() {
    let repo = GitRepo::new();
    // The custom resource's file comes first: order is agentk's, not the files'.
    repo.commit("a-widget.yaml", b"apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\nspec: {size: 3}\n");
    let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\n\
               spec:\n  group: example.com\n  scope: Namespaced\n  names: {kind: Widget, plural: widgets}\n  \
               versions: [{name: v1, served: true, storage: true}]\n";
    let first = repo.commit("crd.yaml", crd.as_bytes());
    let c = cluster(&repo, "").await;
    let a = start_agentk(&c, Duration::from_secs(300)).await;
    let r = report(&a, "for the commit", |r| r.commit_id == first).await;
    assert_eq!((r.applied, r.failed, r.error.as_str()), (2, 0, ""), "{r:?}");
    let widget = c.kube.object("example.com/v1/widgets", "default", "w").expect("custom resource applied");
    assert_eq!(widget["spec"]["size"], 3);

    let second = repo.remove("a-widget.yaml");
    let r = report(&a, "pruning the custom resource", |r| r.commit_id == second).await;
    assert_eq!((r.pruned, r.failed), (1, 0), "{r:?}");
    assert!(c.kube.object("example.com/v1/widgets", "default", "w").is_none());
    assert!(c.kube.object("apiextensions.k8s.io/v1/customresourcedefinitions", "", "widgets.example.com").is_some());
}

#[tokio::test]
async fn manifests_kas_refuses_are_reported_until_a_commit_fixes_them() {
    let repo = GitRepo::new();
    repo.commit("a.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: same}\n");
    let broken = repo.commit("b.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: same}\n");
    let c = cluster(&repo, "").await;
    let a = start_agentk(&c, Duration::from_secs(300)).await;
    let r = report(&a, "of kas's refusal", |r| !r.error.is_empty()).await;
    assert_eq!(r.commit_id, "", "{r:?}");
    assert!(r.error.contains(&broken) && r.error.contains("is in both a.yaml and b.yaml"), "{r:?}");
    assert!(c.kube.object("v1/configmaps", "default", "same").is_none());

    let fixed = repo.remove("b.yaml");
    let r = report(&a, "for the fixed commit", |r| r.commit_id == fixed).await;
    assert_eq!((r.applied, r.failed, r.error.as_str()), (1, 0, ""), "{r:?}");
    assert!(c.kube.object("v1/configmaps", "default", "same").is_some());
}

#[tokio::test]
async fn a_custom_resource_whose_crd_fails_fails_at_once() {
    let repo = GitRepo::new();
    repo.commit("a-widget.yaml", b"apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n");
    // The name must be <plural>.<group>: the API server refuses this CRD.
    let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets}\n\
               spec:\n  group: example.com\n  scope: Namespaced\n  names: {kind: Widget, plural: widgets}\n  \
               versions: [{name: v1, served: true, storage: true}]\n";
    let commit = repo.commit("crd.yaml", crd.as_bytes());
    let c = cluster(&repo, "").await;
    let a = start_agentk(&c, Duration::from_secs(300)).await;
    let r = report(&a, "for the commit", |r| r.commit_id == commit).await;
    assert_eq!((r.applied, r.failed, r.error.as_str()), (0, 2, ""), "{r:?}");
    assert!(r.errors[0].message.contains("must be spec.names.plural+\".\"+spec.group"), "{r:?}");
    assert_eq!(r.errors[1].kind, "Widget");
    assert_eq!(r.errors[1].message, "its CustomResourceDefinition (in this commit) was not applied");
}

#[tokio::test]
async fn an_apply_longer_than_reconcile_timeout_fails() {
    let repo = GitRepo::new();
    let many: String =
        (0..30).map(|i| format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cm-{i}}}\n")).collect();
    let commit = repo.commit("many.yaml", many.as_bytes());
    let c = cluster(&repo, "      reconcile_timeout: 1s\n").await;
    c.kube.delay(Some(Duration::from_millis(100)));
    let a = start_agentk(&c, Duration::from_secs(300)).await;
    let r = report(&a, "of the timeout", |r| r.commit_id == commit).await;
    assert_eq!(r.error, "the apply did not finish within reconcile_timeout (1s)", "{r:?}");
    assert!(r.applied < 30, "{r:?}");
}

#[tokio::test]
async fn an_object_that_outlives_prune_timeout_fails_and_stays_recorded_until_it_is_gone() {
    let repo = GitRepo::new();
    repo.commit(
        "stuck.yaml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: stuck, finalizers: [example.com/hold]}\n",
    );
    let first = repo.commit("keep.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: keep}\n");
    let c = cluster(&repo, "      prune_timeout: 500ms\n").await;
    let a = start_agentk(&c, Duration::from_secs(300)).await;
    report(&a, "for the first commit", |r| r.commit_id == first && r.failed == 0).await;

    let second = repo.remove("stuck.yaml");
    let r = report(&a, "of the prune timeout", |r| r.commit_id == second).await;
    assert_eq!(r.error, "pruning did not finish within prune_timeout (500ms)", "{r:?}");
    assert_eq!((r.pruned, r.failed), (0, 1), "{r:?}");
    let e = &r.errors[0];
    assert_eq!((e.name.as_str(), e.operation.as_str()), ("stuck", "prune"));
    assert!(e.message.contains("still there after prune_timeout"), "{e:?}");
    let stuck = c.kube.object("v1/configmaps", "default", "stuck").unwrap();
    assert!(stuck["metadata"]["deletionTimestamp"].is_string(), "{stuck}");
    let inventory = inventory_name(1, &repo.bare.display().to_string(), "");
    assert_eq!(recorded(&c.kube, "default", &inventory), ["ConfigMap default/keep", "ConfigMap default/stuck"]);

    // Whoever holds the finalizer lets go; the retry finds it gone and forgets it.
    let configmaps: Api<ConfigMap> = Api::namespaced(kube_client(&c.kube).await, "default");
    configmaps
        .patch("stuck", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    report(&a, "after the finalizer went", |r| r.commit_id == second && r.error.is_empty() && r.failed == 0).await;
    assert_eq!(recorded(&c.kube, "default", &inventory), ["ConfigMap default/keep"]);
}

/// Two replicas in one process: never both leaders; the leader's graceful stop releases the
/// Lease and the other applies at once.
#[tokio::test]
async fn replicas_elect_one_leader_and_a_graceful_stop_hands_over() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let repo = GitRepo::new();
    let first = repo.commit("a.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n");
    let c = cluster(&repo, "").await;
    let start = |pod: &str| {
        let mut config = c.agentk_config(1, 0, pod);
        config.gitops.lease_duration = Duration::from_secs(3);
        config.gitops.lease_renew_deadline = Duration::from_secs(2);
        config.gitops.lease_retry_period = Duration::from_millis(200);
        c.start_agentk_with(config)
    };
    let (one, two) = (start("agentk-one").await, start("agentk-two").await);
    let both = Arc::new(AtomicBool::new(false));
    let (mut x, mut y, seen) = (one.status.gitops.clone(), two.status.gitops.clone(), both.clone());
    tokio::spawn(async move {
        loop {
            if x.borrow_and_update().leader && y.borrow_and_update().leader {
                seen.store(true, Ordering::Relaxed);
            }
            tokio::select! {
                r = x.changed() => if r.is_err() { return },
                r = y.changed() => if r.is_err() { return },
            }
        }
    });
    let leader_of = |a: &AgentkHandle| a.status.gitops.borrow().leader;
    eventually!(leader_of(&one) || leader_of(&two), "a leader");
    let (leader, follower) = if leader_of(&one) { (one, two) } else { (two, one) };
    report(&leader, "from the leader", |r| r.commit_id == first).await;
    assert!(follower.status.gitops.borrow().projects.is_empty(), "the follower runs no worker");

    leader.stop().await;
    let r = report(&follower, "from the new leader", |r| r.commit_id == first).await;
    assert_eq!((r.unchanged, r.failed), (1, 0), "{r:?}");
    assert!(!both.load(Ordering::Relaxed), "two leaders at once");
}

/// Two replicas of one agent: only the Lease holder applies; when it dies (SIGKILL, no release)
/// the other takes the Lease once it expires and applies from then on.
#[tokio::test]
async fn only_the_lease_holder_applies_and_another_replica_takes_over_when_it_dies() {
    use kas_e2e::process::{log_message, start_agentk_with_args};
    let repo = GitRepo::new();
    let first = repo.commit("a.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n");
    let c = cluster(&repo, "").await;
    let lease_timings = [
        "--gitops-lease-duration",
        "2s",
        "--gitops-lease-renew-deadline",
        "1s",
        "--gitops-lease-retry-period",
        "200ms",
    ];
    let agent = c.kas[0].addresses.agent;
    let token = c.agent(1).token_file.clone();
    let start = |pod: &str| start_agentk_with_args(agent, &token, &c.kubeconfig, pod, "agentk", &lease_timings);
    let synced = |commit: String| {
        move |v: &Value| log_message(v) == Some("GitOps sync finished") && v["fields"]["commit"] == commit.as_str()
    };

    let acquired_gitops_lease = |v: &Value| {
        log_message(v) == Some("acquired the lease: this replica leads") && v["fields"]["lease"] == "agentk-gitops-1"
    };
    let mut one = start("agentk-one");
    one.wait_for_log("the GitOps lease acquired", acquired_gitops_lease).await;
    one.wait_for_log("the first commit applied", synced(first.clone())).await;
    let mut two = start("agentk-two");
    two.wait_for_message("competing for the GitOps lease").await;
    let holder = || {
        c.kube.object("coordination.k8s.io/v1/leases", "agentk", "agentk-gitops-1").unwrap()["spec"]["holderIdentity"]
            .clone()
    };
    // agentk-one keeps renewing: the holder stays while agentk-two tries every 200 ms.
    let renewed = |rv: &str| {
        let lease = c.kube.object("coordination.k8s.io/v1/leases", "agentk", "agentk-gitops-1").unwrap();
        lease["metadata"]["resourceVersion"] != rv
    };
    for _ in 0..3 {
        let rv = c.kube.object("coordination.k8s.io/v1/leases", "agentk", "agentk-gitops-1").unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned();
        eventually!(renewed(&rv), "lease renewed");
        assert_eq!(holder(), "agentk-one");
    }

    one.kill().await;
    two.wait_for_log("the GitOps lease taken over", acquired_gitops_lease).await;
    assert_eq!(holder(), "agentk-two");
    // agentk-two applied nothing before it held the Lease.
    let lines = two.stderr();
    let acquired = lines.find("acquired the lease").unwrap();
    assert!(!lines[..acquired].contains("GitOps sync finished"), "{lines}");
    two.wait_for_log("the first commit re-applied by the new holder", synced(first)).await;
    let second = repo.commit("b.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n");
    two.wait_for_log("the second commit applied", synced(second)).await;
    assert!(c.kube.object("v1/configmaps", "default", "b").is_some());
}

/// What agentk reports to kas (`GitopsStatus.ReportSync`) after a sync, against a fake kas that
/// serves a configuration, one commit (an object in two messages, and one of a kind the cluster
/// does not serve) and records the reports.
#[tokio::test]
async fn each_sync_is_reported_to_kas() {
    use fake_kas::FakeKas;
    let kube = FakeKube::start().await;
    kube.add_namespace("agentk");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "the-token").unwrap();
    let configmap = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"reported"},"data":{"k":"v"}}"#;
    let widget = br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}"#;
    let (kas, mut reports) = FakeKas::start(vec![("cm.json", &configmap[..]), ("widget.json", &widget[..])]).await;

    let mut config = agentk::AgentConfig::new(
        format!("grpc://{}", kas.address),
        &token_file,
        agentk::KubeSource::Kubeconfig(kubeconfig),
    );
    config.pod_name = "agentk-0".into();
    config.pod_namespace = "agentk".into();
    let app = agentk::App::new(config).await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(app.run(shutdown.clone()));
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;

    let (authorization, r) = tokio::time::timeout(kas_e2e::EVENTUALLY_TIMEOUT, reports.recv()).await.unwrap().unwrap();
    assert_eq!(authorization.as_deref(), Some("Bearer the-token"));
    assert_eq!(
        (r.project_id.as_str(), r.r#ref.as_str(), r.commit_id.as_str()),
        ("group/manifests", "branch:main", fake_kas::COMMIT)
    );
    assert_eq!((r.pod_name.as_str(), r.dry_run_strategy.as_str(), r.error.as_str()), ("agentk-0", "none", ""));
    assert_eq!((r.applied, r.unchanged, r.pruned, r.failed), (1, 0, 0, 1), "{r:?}");
    assert!(r.started_at_unix_ms >= before - 1000 && r.duration_ms < 20_000, "{r:?}");
    let e = &r.errors[0];
    assert_eq!(
        (e.group.as_str(), e.version.as_str(), e.kind.as_str(), e.name.as_str()),
        ("example.com", "v1", "Widget", "w")
    );
    assert_eq!((e.source.as_str(), e.operation.as_str()), ("widget.json", "apply"));
    assert!(e.message.contains("serves no kind Widget in example.com/v1"), "{e:?}");
    // The object that arrived in two messages was applied whole.
    assert_eq!(kube.object("v1/configmaps", "default", "reported").unwrap()["data"], json!({"k": "v"}));
    // A failed object makes agentk retry (with backoff), and report again.
    let (_, again) = tokio::time::timeout(kas_e2e::EVENTUALLY_TIMEOUT, reports.recv()).await.unwrap().unwrap();
    assert_eq!((again.commit_id.as_str(), again.unchanged, again.failed), (fake_kas::COMMIT, 1, 1), "{again:?}");
    shutdown.cancel();
    task.await.unwrap();
}

/// A kas as far as GitOps needs one: presence (a fixed configuration), tunnels that stay idle,
/// one commit, and the reports.
mod fake_kas {
    use std::net::SocketAddr;
    use std::pin::Pin;

    use futures::Stream;
    use kas_proto::gitops::gitops_agent_server::{GitopsAgent, GitopsAgentServer};
    use kas_proto::gitops::gitops_status_server::{GitopsStatus, GitopsStatusServer};
    use kas_proto::gitops::objects_to_synchronize_response::{Header, Message, Object, Trailer};
    use kas_proto::gitops::{
        ObjectsToSynchronizeRequest, ObjectsToSynchronizeResponse, ReportSyncResponse, SyncReport,
    };
    use kas_proto::tunnel::pb::agent_tunnel_server::{AgentTunnel, AgentTunnelServer};
    use kas_proto::tunnel::pb::{
        AgentConfiguration, ConfigurationRequest, ConfigurationResponse, ConnectRequest, ConnectResponse,
        GitopsConfiguration, ManifestProjectConfiguration,
    };
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
    use tonic::{Request, Response, Status, Streaming};

    pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

    #[derive(Clone)]
    pub struct FakeKas {
        pub address: SocketAddr,
        objects: Vec<(String, Vec<u8>)>,
        reports: mpsc::UnboundedSender<(Option<String>, SyncReport)>,
    }

    impl FakeKas {
        pub async fn start(
            objects: Vec<(&str, &[u8])>,
        ) -> (Self, mpsc::UnboundedReceiver<(Option<String>, SyncReport)>) {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let (reports, rx) = mpsc::unbounded_channel();
            let kas = Self {
                address: listener.local_addr().unwrap(),
                objects: objects.into_iter().map(|(s, d)| (s.to_owned(), d.to_vec())).collect(),
                reports,
            };
            let server = tonic::transport::Server::builder()
                .add_service(AgentTunnelServer::new(kas.clone()))
                .add_service(GitopsAgentServer::new(kas.clone()))
                .add_service(GitopsStatusServer::new(kas.clone()));
            tokio::spawn(server.serve_with_incoming(TcpListenerStream::new(listener)));
            (kas, rx)
        }
    }

    /// A stream that sends `items` and then stays open until the client goes.
    fn open_stream<T: Send + 'static>(items: Vec<T>) -> ReceiverStream<Result<T, Status>> {
        let (tx, rx) = mpsc::channel(items.len().max(1));
        tokio::spawn(async move {
            for item in items {
                let _ = tx.send(Ok(item)).await;
            }
            tx.closed().await;
        });
        ReceiverStream::new(rx)
    }

    #[tonic::async_trait]
    impl AgentTunnel for FakeKas {
        type GetConfigurationStream = ReceiverStream<Result<ConfigurationResponse, Status>>;
        type ConnectStream = Boxed<ConnectResponse>;

        async fn get_configuration(
            &self,
            _request: Request<ConfigurationRequest>,
        ) -> Result<Response<Self::GetConfigurationStream>, Status> {
            let project = ManifestProjectConfiguration {
                id: "group/manifests".into(),
                r#ref: "branch:main".into(),
                default_namespace: "default".into(),
                reconcile_timeout_ms: 60_000,
                prune: true,
                prune_timeout_ms: 60_000,
                ..Default::default()
            };
            let configuration = AgentConfiguration {
                agent_id: 5,
                gitops: Some(GitopsConfiguration { manifest_projects: vec![project] }),
                ..Default::default()
            };
            let response = ConfigurationResponse { configuration: Some(configuration), commit_id: "config-1".into() };
            Ok(Response::new(open_stream(vec![response])))
        }

        async fn connect(
            &self,
            _request: Request<Streaming<ConnectRequest>>,
        ) -> Result<Response<Self::ConnectStream>, Status> {
            Ok(Response::new(Box::pin(futures::stream::pending())))
        }
    }

    #[tonic::async_trait]
    impl GitopsAgent for FakeKas {
        type GetObjectsToSynchronizeStream = ReceiverStream<Result<ObjectsToSynchronizeResponse, Status>>;

        async fn get_objects_to_synchronize(
            &self,
            request: Request<ObjectsToSynchronizeRequest>,
        ) -> Result<Response<Self::GetObjectsToSynchronizeStream>, Status> {
            let message = |m| ObjectsToSynchronizeResponse { message: Some(m) };
            let mut messages = Vec::new();
            if request.get_ref().commit_id != COMMIT {
                messages.push(message(Message::Header(Header {
                    commit_id: COMMIT.into(),
                    project_id: "group/manifests".into(),
                })));
                for (source, data) in &self.objects {
                    // Each object in two pieces, as kas splits large ones.
                    let (a, b) = data.split_at(data.len() / 2);
                    for (piece, more) in [(a, true), (b, false)] {
                        let object =
                            Object { source: source.clone(), data: bytes::Bytes::copy_from_slice(piece), more };
                        messages.push(message(Message::Object(object)));
                    }
                }
                messages.push(message(Message::Trailer(Trailer {})));
            }
            Ok(Response::new(open_stream(messages)))
        }
    }

    #[tonic::async_trait]
    impl GitopsStatus for FakeKas {
        async fn report_sync(&self, request: Request<SyncReport>) -> Result<Response<ReportSyncResponse>, Status> {
            let authorization =
                request.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
            let _ = self.reports.send((authorization, request.into_inner()));
            Ok(Response::new(ReportSyncResponse {}))
        }
    }
}

/// Issue 16's "done when": a push on one kas makes the agent connected to another kas apply the
/// new commit while kas polls only every hour. Until kas A's push subscription is up a push may
/// be missed, so the push is repeated until one is applied; that one must be applied within a
/// second of its push.
#[tokio::test]
async fn a_push_on_another_kas_is_applied_within_a_second() {
    let repo = GitRepo::new();
    let first = repo.commit("deploy/extra.yaml", EXTRA.as_bytes());
    let project = repo.bare.display().to_string();
    let c = Cluster::builder()
        .kas(2)
        .redis()
        .agent_configuration(1, AgentConfigDocument::parse(&gitops(&repo, "")).unwrap())
        .configure(|config, _| config.gitops.poll_period = Duration::from_secs(3600))
        .start()
        .await;
    c.kube.add_namespace("agentk");
    let a = start_agentk(&c, Duration::from_secs(3600)).await; // connected to kas A (0)
    report(&a, "for the first commit", |r| r.commit_id == first).await;

    let second = repo.commit("deploy/pushed.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: pushed}\n");
    let http = reqwest::Client::new();
    let body = json!({"project": {"full_path": project}});
    let mut latency = None;
    eventually!(
        {
            if latency.is_none() {
                let started = std::time::Instant::now();
                let response = http
                    .post(format!("{}/api/v1/git_push_events", c.rest_url(1)))
                    .bearer_auth(c.gitlab_jwt())
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 204);
                let mut gitops = a.status.gitops.clone();
                let applied = gitops
                    .wait_for(|s| s.projects.values().any(|p| p.last.as_ref().is_some_and(|r| r.commit_id == second)));
                if tokio::time::timeout(Duration::from_secs(1), applied).await.is_ok() {
                    latency = Some(started.elapsed());
                }
            }
            latency.is_some()
        },
        "a push on kas B applied by the agent on kas A within a second"
    );
    assert!(c.kube.object("v1/configmaps", "default", "pushed").is_some());
    eprintln!("push on kas B to applied through kas A: {latency:?}");
}

/// A commit with a broken YAML file applies nothing: the report (and so the status API) names
/// the file and the line, and what the last good commit applied stays as it was.
#[tokio::test]
async fn a_broken_file_applies_nothing_names_file_and_line_and_the_last_good_state_stays() {
    let repo = GitRepo::new();
    let good =
        repo.commit("deploy/app.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\ndata: {v: one}\n");
    let c = cluster(&repo, "").await;
    let a = start_agentk(&c, Duration::from_secs(300)).await;
    report(&a, "for the good commit", |r| r.commit_id == good).await;

    // One commit changes the good file and adds a broken one (two commits would let kas, which
    // polls on its own thread, see and apply the first).
    repo.stage("deploy/app.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\ndata: {v: two}\n");
    let broken = repo.commit("deploy/broken.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: [unclosed\n");
    let r = report(&a, "of the broken commit", |r| r.error.contains(&broken)).await;
    assert!(r.error.contains("deploy/broken.yaml") && r.error.contains("line 4"), "{r:?}");
    assert_eq!(c.kube.object("v1/configmaps", "default", "app").unwrap()["data"]["v"], "one", "nothing applied");
    let url = format!("{}/api/v1/agents/1/gitops", c.rest_url(0));
    let mut body: Value;
    eventually!(
        {
            let response = reqwest::Client::new().get(&url).bearer_auth(c.gitlab_jwt()).send().await.unwrap();
            body = response.json().await.unwrap();
            body["manifest_projects"][0]["last_sync"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("deploy/broken.yaml"))
        },
        "the status API names the broken file: {body}"
    );

    let fixed = repo.remove("deploy/broken.yaml");
    report(&a, "for the fixed commit", |r| r.commit_id == fixed && r.error.is_empty()).await;
    assert_eq!(c.kube.object("v1/configmaps", "default", "app").unwrap()["data"]["v"], "two");
}

/// What agentk applied, seen with the real kubectl through kas: a Namespace, a ConfigMap, a
/// Deployment and a custom resource with its CRD; a changed file changes the object.
#[tokio::test]
async fn kubectl_through_kas_lists_what_was_applied() {
    let kubectl = "kubectl";
    let ok =
        std::process::Command::new(kubectl).args(["version", "--client"]).output().is_ok_and(|o| o.status.success());
    assert!(ok, "kubectl is required (part of the machine image)");
    let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\n\
               spec:\n  group: example.com\n  scope: Namespaced\n  names: {kind: Widget, plural: widgets, singular: widget}\n  \
               versions: [{name: v1, served: true, storage: true}]\n";
    let widget = |size: u32| {
        format!(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w, namespace: apps}}\nspec: {{size: {size}}}\n"
        )
    };
    let repo = GitRepo::new();
    repo.commit("deploy/namespace.yaml", NAMESPACE.as_bytes());
    repo.commit("deploy/app.yaml", APP.as_bytes());
    repo.commit("deploy/crd.yaml", crd.as_bytes());
    let first = repo.commit("deploy/widget.yaml", widget(3).as_bytes());
    let c = Cluster::builder()
        .rest_tls()
        .agent_configuration(1, AgentConfigDocument::parse(&gitops(&repo, "      default_namespace: apps\n")).unwrap())
        .configure(|config, _| config.gitops.poll_period = Duration::from_millis(100))
        .start()
        .await;
    c.kube.add_namespace("agentk");
    let a = start_agentk(&c, Duration::from_secs(300)).await;
    let r = report(&a, "for the first commit", |r| r.commit_id == first).await;
    assert_eq!((r.applied, r.failed), (5, 0), "{r:?}");

    let target = kas_e2e::kubectl::KubectlTarget::new(&c, 0);
    let run = |args: &'static [&'static str]| {
        let mut cmd = target.command(kubectl, args);
        async move {
            let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.unwrap().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(out.status.success(), "kubectl {args:?}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
            stdout
        }
    };
    let out = run(&["get", "namespaces,configmaps,deployments,widgets", "-n", "apps", "-o", "name"]).await;
    for name in ["configmap/settings", "deployment.apps/web", "widget.example.com/w"] {
        assert!(out.lines().any(|l| l == name), "{name} missing:\n{out}");
    }
    let out = run(&["get", "namespace", "apps", "-o", "name"]).await;
    assert_eq!(out.trim(), "namespace/apps");

    let second = repo.commit("deploy/widget.yaml", widget(5).as_bytes());
    report(&a, "for the changed widget", |r| r.commit_id == second).await;
    let out = run(&["get", "widget", "w", "-n", "apps", "-o", "jsonpath={.spec.size}"]).await;
    assert_eq!(out.trim(), "5");
}
