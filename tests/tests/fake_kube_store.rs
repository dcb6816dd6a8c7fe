//! The fake API server's generic object store answers kube-rs (`Api<DynamicObject>`,
//! `kube::discovery`) as the real API server does, the way agentk's GitOps applier will use it:
//! discovery, create/get/list, optimistic concurrency, server-side apply and the other patches,
//! dry runs, deletion with propagation and preconditions, namespaces, and CRDs with their custom
//! resources.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kas_e2e::FakeKube;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    Preconditions, WatchEvent, WatchParams,
};
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};

async fn client(fake: &FakeKube) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&fake.kubeconfig()).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn configmaps() -> ApiResource {
    resource("", "v1", "ConfigMap", "configmaps")
}

fn namespaced(client: &kube::Client, ns: &str, ar: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, ar)
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

fn configmap(name: &str, labels: Value, data: Value) -> DynamicObject {
    object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": data}))
}

/// The Status of a refused call.
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

const WIDGETS_CRD: &str = "widgets.example.com";

fn widget_crd(scope: &str) -> DynamicObject {
    object(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": WIDGETS_CRD},
        "spec": {
            "group": "example.com", "scope": scope,
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [
                {"name": "v1beta1", "served": true, "storage": false,
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
            ],
        },
    }))
}

fn crds(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &resource("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions"),
    )
}

fn widget_resource() -> ApiResource {
    resource("example.com", "v1", "Widget", "widgets")
}

#[tokio::test]
async fn discovery_finds_every_resource_and_a_crds_once_it_is_created() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let legacy = Discovery::new(client.clone()).run().await.unwrap();
    let aggregated = Discovery::new(client.clone()).run_aggregated().await.unwrap();
    for discovery in [legacy, aggregated] {
        every_built_in_resource(&discovery);
    }
    let core = client.list_core_api_resources("v1").await.unwrap();
    let short = |name: &str| core.resources.iter().find(|r| r.name == name).and_then(|r| r.short_names.clone());
    assert_eq!(short("configmaps"), Some(vec!["cm".to_owned()]));
    assert_eq!(short("namespaces"), Some(vec!["ns".to_owned()]));

    crds(&client).create(&PostParams::default(), &widget_crd("Namespaced")).await.unwrap();
    let legacy = Discovery::new(client.clone()).run().await.unwrap();
    let aggregated = Discovery::new(client.clone()).run_aggregated().await.unwrap();
    for discovery in [legacy, aggregated] {
        let group = discovery.get("example.com").unwrap();
        assert_eq!(group.preferred_version_or_latest(), "v1", "v1 is preferred over v1beta1");
        let widget = discovery.resolve_gvk(&GroupVersionKind::gvk("example.com", "v1beta1", "Widget"));
        let (ar, caps) = widget.unwrap();
        assert_eq!((ar.plural.as_str(), caps.scope), ("widgets", Scope::Namespaced));
        let (_, caps) = discovery.resolve_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget")).unwrap();
        let subresources: Vec<&str> = caps.subresources.iter().map(|(ar, _)| ar.plural.as_str()).collect();
        assert_eq!(subresources, ["status"]);
    }
}

fn every_built_in_resource(discovery: &Discovery) {
    let expected = [
        ("", "v1", "Namespace", "namespaces", Scope::Cluster),
        ("", "v1", "ConfigMap", "configmaps", Scope::Namespaced),
        ("", "v1", "Secret", "secrets", Scope::Namespaced),
        ("", "v1", "Service", "services", Scope::Namespaced),
        ("", "v1", "ServiceAccount", "serviceaccounts", Scope::Namespaced),
        ("", "v1", "Pod", "pods", Scope::Namespaced),
        ("apps", "v1", "Deployment", "deployments", Scope::Namespaced),
        ("coordination.k8s.io", "v1", "Lease", "leases", Scope::Namespaced),
        ("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", Scope::Cluster),
    ];
    for (group, version, kind, plural, scope) in expected {
        let (ar, caps) = discovery
            .resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
            .unwrap_or_else(|| panic!("discovery has no {group}/{version} {kind}"));
        assert_eq!((ar.plural.as_str(), caps.scope), (plural, scope), "{kind}");
        assert!(caps.operations.iter().any(|v| v == "patch") && caps.operations.iter().any(|v| v == "delete"));
    }
    assert!(discovery.resolve_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget")).is_none());
}

#[tokio::test]
async fn objects_get_uid_creation_timestamp_one_resource_version_counter_and_list_by_label_selector() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let api = namespaced(&client, "default", &configmaps());
    let pp = PostParams::default();
    let a = api.create(&pp, &configmap("a", json!({"app": "web", "tier": "front"}), json!({"k": "1"}))).await.unwrap();
    let b =
        api.create(&pp, &configmap("b", json!({"app": "web", "tier": "back", "flag": ""}), json!({}))).await.unwrap();
    let c = api.create(&pp, &configmap("c", json!({"app": "db"}), json!({}))).await.unwrap();
    let leases = namespaced(&client, "default", &resource("coordination.k8s.io", "v1", "Lease", "leases"));
    let lease = leases
        .create(
            &pp,
            &object(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}})),
        )
        .await
        .unwrap();
    let rv = |o: &DynamicObject| o.metadata.resource_version.clone().unwrap().parse::<u64>().unwrap();
    assert!(rv(&a) < rv(&b) && rv(&b) < rv(&c) && rv(&c) < rv(&lease), "one counter for every kind");
    assert_eq!(a.metadata.uid.as_deref().map(str::len), Some(36));
    assert!(a.metadata.creation_timestamp.is_some());
    assert_eq!(a.metadata.generation, None, "a ConfigMap keeps no generation, as the real one");

    let names = |list: kube::api::ObjectList<DynamicObject>| -> Vec<String> {
        list.items.into_iter().map(|o| o.metadata.name.unwrap()).collect()
    };
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.metadata.resource_version, Some(rv(&lease).to_string()), "the list's resourceVersion");
    assert_eq!(names(list), ["a", "b", "c"]);
    let select = async |selector: &str| names(api.list(&ListParams::default().labels(selector)).await.unwrap());
    assert_eq!(select("app=web,tier!=back").await, ["a"]);
    assert_eq!(select("app in (web,db),tier notin (front)").await, ["b", "c"]);
    assert_eq!(select("flag").await, ["b"]);
    assert_eq!(select("!tier").await, ["c"]);
    assert_eq!(fake.objects("v1/configmaps", Some("default")).len(), 3);
    assert_eq!(fake.object("v1/configmaps", "default", "a").unwrap()["data"]["k"], "1");
}

#[tokio::test]
async fn creating_an_existing_object_is_already_exists() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let api = namespaced(&client, "default", &configmaps());
    api.create(&PostParams::default(), &configmap("a", json!({}), json!({}))).await.unwrap();
    let status = refusal(api.create(&PostParams::default(), &configmap("a", json!({}), json!({}))).await);
    assert_eq!((status.code, status.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(status.message, "configmaps \"a\" already exists");
    let details = status.details.unwrap();
    assert_eq!((details.name.as_str(), details.kind.as_str()), ("a", "configmaps"));
}

#[tokio::test]
async fn creating_in_a_missing_namespace_is_namespace_not_found() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let api = namespaced(&client, "nowhere", &configmaps());
    let status = refusal(api.create(&PostParams::default(), &configmap("a", json!({}), json!({}))).await);
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(status.message, "namespaces \"nowhere\" not found");
    assert_eq!(status.details.unwrap().kind, "namespaces");
    // An apply that would create it is refused the same way.
    let params = PatchParams::apply("agentk").force();
    let status = refusal(api.patch("a", &params, &Patch::Apply(configmap("a", json!({}), json!({})))).await);
    assert_eq!(status.message, "namespaces \"nowhere\" not found");
    assert!(fake.object("v1/configmaps", "nowhere", "a").is_none());
}

#[tokio::test]
async fn a_lease_update_with_a_stale_resource_version_is_a_conflict() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let leases = namespaced(&client, "kube-system", &resource("coordination.k8s.io", "v1", "Lease", "leases"));
    let lease = object(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "agentk-leader"}, "spec": {"holderIdentity": "agent-a", "leaseDurationSeconds": 15},
    }));
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut renewed = created.clone();
    renewed.data["spec"]["holderIdentity"] = json!("agent-b");
    let replaced = leases.replace("agentk-leader", &PostParams::default(), &renewed).await.unwrap();
    assert_eq!(replaced.data["spec"]["holderIdentity"], "agent-b");
    assert_ne!(replaced.metadata.resource_version, created.metadata.resource_version);

    // The other candidate still holds the old resourceVersion.
    let mut stale = created.clone();
    stale.data["spec"]["holderIdentity"] = json!("agent-c");
    let status = refusal(leases.replace("agentk-leader", &PostParams::default(), &stale).await);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        status.message,
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"agentk-leader\": the object has been \
         modified; please apply your changes to the latest version and try again"
    );
    let details = status.details.unwrap();
    assert_eq!(
        (details.name.as_str(), details.group.as_str(), details.kind.as_str()),
        ("agentk-leader", "coordination.k8s.io", "leases")
    );
    // A Lease update must name the version it replaces.
    let mut unconditional = renewed.clone();
    unconditional.metadata.resource_version = None;
    let status = refusal(leases.replace("agentk-leader", &PostParams::default(), &unconditional).await);
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        "leases.coordination.k8s.io \"agentk-leader\" is invalid: metadata.resourceVersion: Invalid value: 0x0: \
         must be specified for an update"
    );
    let stored = fake.object("coordination.k8s.io/v1/leases", "kube-system", "agentk-leader").unwrap();
    assert_eq!(stored["spec"]["holderIdentity"], "agent-b");
}

#[tokio::test]
async fn server_side_apply_creates_records_the_manager_conflicts_and_forces() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let api = namespaced(&client, "default", &configmaps());
    let applied = api
        .patch(
            "cfg",
            &PatchParams::apply("agentk").force(),
            &Patch::Apply(configmap("cfg", json!({"a": "1"}), json!({"key": "v1"}))),
        )
        .await
        .unwrap();
    assert_eq!(applied.data["data"]["key"], "v1");
    let managed = applied.metadata.managed_fields.clone().unwrap();
    assert_eq!(managed.len(), 1);
    assert_eq!((managed[0].manager.as_deref(), managed[0].operation.as_deref()), (Some("agentk"), Some("Apply")));
    let fields = &managed[0].fields_v1.as_ref().unwrap().0;
    assert_eq!(fields["f:data"]["f:key"], json!({}), "{fields}");
    assert_eq!(fields["f:metadata"]["f:labels"]["f:a"], json!({}), "{fields}");

    let other = PatchParams::apply("someone-else");
    let status =
        refusal(api.patch("cfg", &other, &Patch::Apply(configmap("cfg", json!({}), json!({"key": "v2"})))).await);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(status.message, "Apply failed with 1 conflict: conflict with \"agentk\": .data.key");

    let forced = api
        .patch("cfg", &other.clone().force(), &Patch::Apply(configmap("cfg", json!({}), json!({"key": "v2"}))))
        .await
        .unwrap();
    assert_eq!(forced.data["data"]["key"], "v2");
    let managed = forced.metadata.managed_fields.unwrap();
    let owns_key = |m: &str| {
        managed.iter().any(|e| {
            e.manager.as_deref() == Some(m) && e.fields_v1.as_ref().unwrap().0["f:data"].get("f:key").is_some()
        })
    };
    assert!(owns_key("someone-else") && !owns_key("agentk"), "{managed:?}");

    // agentk no longer applying a label it applied removes it.
    let again = api
        .patch(
            "cfg",
            &PatchParams::apply("agentk").force(),
            &Patch::Apply(configmap("cfg", json!({}), json!({"key": "v2"}))),
        )
        .await
        .unwrap();
    assert!(again.metadata.labels.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn merge_strategic_and_json_patches_update_and_record_an_update_manager() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let api = namespaced(&client, "default", &configmaps());
    api.create(&PostParams::default(), &configmap("cfg", json!({}), json!({"a": "1"}))).await.unwrap();
    let params = PatchParams { field_manager: Some("editor".into()), ..PatchParams::default() };
    let merged = api.patch("cfg", &params, &Patch::Merge(json!({"data": {"b": "2"}}))).await.unwrap();
    assert_eq!(merged.data["data"], json!({"a": "1", "b": "2"}));
    let managed = merged.metadata.managed_fields.unwrap();
    let editor = managed.iter().find(|e| e.manager.as_deref() == Some("editor")).unwrap();
    assert_eq!(editor.operation.as_deref(), Some("Update"));
    assert_eq!(editor.fields_v1.as_ref().unwrap().0, json!({"f:data": {"f:b": {}}}), "only what it changed");
    // Strategic merge patch is a merge for these kinds.
    let strategic = api.patch("cfg", &params, &Patch::Strategic(json!({"data": {"a": null}}))).await.unwrap();
    assert_eq!(strategic.data["data"], json!({"b": "2"}));

    let response = reqwest::Client::new()
        .patch(format!("{}/api/v1/namespaces/default/configmaps/cfg", fake.url()))
        .bearer_auth(fake.token())
        .header("content-type", "application/json-patch+json")
        .body(json!([{"op": "replace", "path": "/data/b", "value": "3"}]).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(fake.object("v1/configmaps", "default", "cfg").unwrap()["data"], json!({"b": "3"}));

    // A custom resource has no strategic merge patch.
    crds(&client).create(&PostParams::default(), &widget_crd("Namespaced")).await.unwrap();
    let widgets = namespaced(&client, "default", &widget_resource());
    let widget = object(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}));
    widgets.create(&PostParams::default(), &widget).await.unwrap();
    let status = refusal(widgets.patch("w", &params, &Patch::Strategic(json!({"spec": {}}))).await);
    assert_eq!((status.code, status.reason.as_str()), (415, "UnsupportedMediaType"));
    assert_eq!(
        status.message,
        "the body of the request was in an unknown format - accepted media types include: \
         application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    );
}

#[tokio::test]
async fn dry_runs_answer_as_if_and_store_nothing() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let api = namespaced(&client, "default", &configmaps());
    let dry = PostParams { dry_run: true, ..PostParams::default() };
    let created = api.create(&dry, &configmap("new", json!({}), json!({"k": "v"}))).await.unwrap();
    assert_eq!(created.data["data"]["k"], "v");
    assert!(created.metadata.uid.is_some());
    assert!(fake.object("v1/configmaps", "default", "new").is_none(), "dry-run create stored it");
    let applied = api
        .patch(
            "new",
            &PatchParams::apply("agentk").force().dry_run(),
            &Patch::Apply(configmap("new", json!({}), json!({}))),
        )
        .await
        .unwrap();
    assert_eq!(applied.metadata.managed_fields.unwrap()[0].manager.as_deref(), Some("agentk"));
    assert!(fake.object("v1/configmaps", "default", "new").is_none(), "dry-run apply stored it");

    let stored = api.create(&PostParams::default(), &configmap("cfg", json!({}), json!({"k": "v"}))).await.unwrap();
    let mut changed = stored.clone();
    changed.data["data"]["k"] = json!("changed");
    let replaced = api.replace("cfg", &dry, &changed).await.unwrap();
    assert_eq!(replaced.data["data"]["k"], "changed");
    let patched = api
        .patch("cfg", &PatchParams::default().dry_run(), &Patch::Merge(json!({"data": {"k": "patched"}})))
        .await
        .unwrap();
    assert_eq!(patched.data["data"]["k"], "patched");
    let deleted = api.delete("cfg", &DeleteParams { dry_run: true, ..DeleteParams::default() }).await.unwrap();
    assert!(deleted.is_right(), "a dry-run delete answers the Status a delete would");
    let now = fake.object("v1/configmaps", "default", "cfg").unwrap();
    assert_eq!(now["data"]["k"], "v");
    assert_eq!(now["metadata"]["resourceVersion"], json!(stored.metadata.resource_version), "nothing was written");
}

/// Deletes an owner ConfigMap that a Secret depends on: (the fake, the owner's uid, the object
/// the DELETE answered, or the Status it answered).
async fn delete_owner(params: DeleteParams) -> (FakeKube, String, Option<DynamicObject>, Option<kube::core::Status>) {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let owners = namespaced(&client, "default", &configmaps());
    let owner = owners.create(&PostParams::default(), &configmap("owner", json!({}), json!({}))).await.unwrap();
    let uid = owner.metadata.uid.unwrap();
    let secrets = namespaced(&client, "default", &resource("", "v1", "Secret", "secrets"));
    let dependent = object(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "dependent", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid, "blockOwnerDeletion": true},
        ]},
        "stringData": {"password": "hunter2"},
    }));
    let created = secrets.create(&PostParams::default(), &dependent).await.unwrap();
    assert_eq!(created.data["data"]["password"], "aHVudGVyMg==", "stringData lands in data");
    assert_eq!(created.data["type"], "Opaque");
    let answer = owners.delete("owner", &params).await.unwrap();
    assert!(fake.object("v1/configmaps", "default", "owner").is_none(), "the owner is still there");
    (fake, uid, answer.clone().left(), answer.right())
}

#[tokio::test]
async fn background_deletion_deletes_the_dependents() {
    let (fake, uid, _, status) = delete_owner(DeleteParams::background()).await;
    let details = status.expect("a ConfigMap's delete answers a Status").details.unwrap();
    assert_eq!(
        (details.name.as_str(), details.kind.as_str(), details.uid.as_str()),
        ("owner", "configmaps", uid.as_str())
    );
    assert!(fake.object("v1/secrets", "default", "dependent").is_none(), "the dependent was not collected");
}

#[tokio::test]
async fn foreground_deletion_answers_the_marked_owner_and_deletes_the_dependents() {
    let (fake, _, marked, _) = delete_owner(DeleteParams::foreground()).await;
    let marked = marked.expect("a foreground delete answers the object it marked");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.finalizers, Some(vec!["foregroundDeletion".to_owned()]));
    assert!(fake.object("v1/secrets", "default", "dependent").is_none());
}

#[tokio::test]
async fn orphan_deletion_keeps_the_dependents_without_the_owner_reference() {
    let (fake, _, marked, _) = delete_owner(DeleteParams::orphan()).await;
    assert_eq!(marked.unwrap().metadata.finalizers, Some(vec!["orphan".to_owned()]));
    let dependent = fake.object("v1/secrets", "default", "dependent").expect("the orphan was deleted");
    assert!(dependent["metadata"].get("ownerReferences").is_none(), "{dependent}");
}

#[tokio::test]
async fn a_delete_whose_preconditions_fail_is_a_conflict_and_deletes_nothing() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let api = namespaced(&client, "default", &configmaps());
    let created = api.create(&PostParams::default(), &configmap("cfg", json!({}), json!({}))).await.unwrap();
    let uid = created.metadata.uid.unwrap();
    let wrong = DeleteParams {
        preconditions: Some(Preconditions { uid: Some("not-the-uid".into()), resource_version: None }),
        ..DeleteParams::default()
    };
    let status = refusal(api.delete("cfg", &wrong).await);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        status.message,
        format!(
            "Operation cannot be fulfilled on ConfigMap \"cfg\": the UID in the precondition (not-the-uid) does not \
             match the UID in record ({uid}). The object might have been deleted and then recreated"
        )
    );
    let stale_rv = DeleteParams {
        preconditions: Some(Preconditions { uid: None, resource_version: Some("1".into()) }),
        ..DeleteParams::default()
    };
    assert_eq!(refusal(api.delete("cfg", &stale_rv).await).code, 409);
    assert!(fake.object("v1/configmaps", "default", "cfg").is_some());

    let right = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(uid), resource_version: created.metadata.resource_version }),
        ..DeleteParams::default()
    };
    api.delete("cfg", &right).await.unwrap();
    assert!(fake.object("v1/configmaps", "default", "cfg").is_none());
    let status = refusal(api.delete("cfg", &DeleteParams::default()).await);
    assert_eq!((status.code, status.message.as_str()), (404, "configmaps \"cfg\" not found"));
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_contents() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let namespaces: Api<DynamicObject> = Api::all_with(client.clone(), &resource("", "v1", "Namespace", "namespaces"));
    let created = namespaces
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})),
        )
        .await
        .unwrap();
    assert_eq!(created.data["status"]["phase"], "Active");
    assert_eq!(created.metadata.labels.unwrap()["kubernetes.io/metadata.name"], "team");
    let services = namespaced(&client, "team", &resource("", "v1", "Service", "services"));
    let service = object(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }));
    let service = services.create(&PostParams::default(), &service).await.unwrap();
    assert!(service.data["spec"]["clusterIP"].as_str().is_some_and(|ip| ip.starts_with("10.96.")));
    assert_eq!(service.data["spec"]["ports"][0]["targetPort"], 80);
    namespaced(&client, "team", &configmaps())
        .create(&PostParams::default(), &configmap("cfg", json!({}), json!({})))
        .await
        .unwrap();
    fake.add_pod("team", "web-1");

    let answer = namespaces.delete("team", &DeleteParams::default()).await.unwrap();
    let terminating = answer.left().expect("a namespace's delete answers the namespace");
    assert_eq!(terminating.data["status"]["phase"], "Terminating");
    assert!(fake.object("v1/namespaces", "", "team").is_none());
    assert!(fake.objects("v1/configmaps", Some("team")).is_empty());
    assert!(fake.objects("v1/services", Some("team")).is_empty());
    assert!(fake.pod("team", "web-1").is_none());
    assert!(fake.object("v1/namespaces", "", "default").is_some(), "other namespaces stay");
}

#[tokio::test]
async fn a_crd_serves_its_custom_resources_until_it_is_deleted() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let crd = crds(&client).create(&PostParams::default(), &widget_crd("Namespaced")).await.unwrap();
    assert_eq!(crd.metadata.generation, Some(1));
    let established = crd.data["status"]["conditions"].as_array().unwrap().iter().any(|c| c["type"] == "Established");
    assert!(established, "{:?}", crd.data);

    let widgets = namespaced(&client, "default", &widget_resource());
    let widget = object(json!({
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "labels": {"a": "1"}},
        "spec": {"size": 1},
    }));
    let created = widgets.create(&PostParams::default(), &widget).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    // A label is not a new generation; a spec change is; status is its subresource's.
    let labelled = widgets
        .patch("w", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "2"}}})))
        .await
        .unwrap();
    assert_eq!(labelled.metadata.generation, Some(1));
    let applied = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                         "spec": {"size": 2}, "status": {"ready": true}});
    let resized =
        widgets.patch("w", &PatchParams::apply("agentk").force(), &Patch::Apply(object(applied))).await.unwrap();
    assert_eq!((resized.metadata.generation, &resized.data["spec"]["size"]), (Some(2), &json!(2)));
    assert!(resized.data.get("status").is_none(), "status is written through its subresource");
    let with_status = widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}, "spec": {"size": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(with_status.data["status"]["ready"], true);
    assert_eq!(with_status.data["spec"]["size"], 2, "the status subresource does not write the spec");
    assert_eq!(with_status.metadata.generation, Some(2), "nor is a status write a new generation");
    // The other served version shows the same object.
    let old_version = namespaced(&client, "default", &resource("example.com", "v1beta1", "Widget", "widgets"));
    assert_eq!(old_version.get("w").await.unwrap().types.unwrap().api_version, "example.com/v1beta1");
    assert_eq!(fake.object("example.com/v1/widgets", "default", "w").unwrap()["spec"]["size"], 2);

    let answer = crds(&client).delete(WIDGETS_CRD, &DeleteParams::default()).await.unwrap();
    assert!(answer.left().unwrap().metadata.deletion_timestamp.is_some());
    assert!(fake.object("apiextensions.k8s.io/v1/customresourcedefinitions", "", WIDGETS_CRD).is_none());
    let status = refusal(widgets.get("w").await);
    assert_eq!((status.code, status.message.as_str()), (404, "the server could not find the requested resource"));
    assert!(fake.objects("example.com/v1/widgets", None).is_empty());

    // Created again, cluster-scoped: its objects have no namespace, and none came back.
    crds(&client).create(&PostParams::default(), &widget_crd("Cluster")).await.unwrap();
    let cluster: Api<DynamicObject> = Api::all_with(client.clone(), &widget_resource());
    assert!(cluster.list(&ListParams::default()).await.unwrap().items.is_empty());
    let widget = object(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "global"}}));
    let created = cluster.create(&PostParams::default(), &widget).await.unwrap();
    assert_eq!(created.metadata.namespace, None);
    assert!(fake.object("example.com/v1/widgets", "", "global").is_some());
}

#[tokio::test]
async fn a_crd_whose_name_is_not_plural_dot_group_is_invalid() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let mut crd = widget_crd("Namespaced");
    crd.metadata.name = Some("gadgets.example.com".into());
    let status = refusal(crds(&client).create(&PostParams::default(), &crd).await);
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        status.message,
        "CustomResourceDefinition.apiextensions.k8s.io \"gadgets.example.com\" is invalid: metadata.name: Invalid \
         value: \"gadgets.example.com\": must be spec.names.plural+\".\"+spec.group"
    );
}

#[tokio::test]
async fn a_watch_sees_the_selected_objects_change() {
    use futures::StreamExt;
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let api = namespaced(&client, "default", &configmaps());
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let events = api.watch(&WatchParams::default().labels("app=web"), &rv).await.unwrap();
    let mut events = std::pin::pin!(events);
    api.create(&PostParams::default(), &configmap("other", json!({"app": "db"}), json!({}))).await.unwrap();
    api.create(&PostParams::default(), &configmap("web", json!({"app": "web"}), json!({}))).await.unwrap();
    api.delete("web", &DeleteParams::default()).await.unwrap();
    let mut next = async || {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), events.next()).await;
        event.expect("an event within 10s").expect("the watch ended").unwrap()
    };
    let WatchEvent::Added(added) = next().await else { panic!("not ADDED") };
    assert_eq!(added.metadata.name.as_deref(), Some("web"), "only the selected object");
    let WatchEvent::Deleted(deleted) = next().await else { panic!("not DELETED") };
    assert_eq!(deleted.metadata.name.as_deref(), Some("web"));
}

#[tokio::test]
async fn a_finalizer_keeps_a_deleted_object_until_an_update_removes_it() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let api = namespaced(&client, "default", &configmaps());
    let mut held = configmap("held", json!({}), json!({}));
    held.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    let answer = api.delete("held", &DeleteParams::default()).await.unwrap();
    let marked = answer.left().expect("a delete that waits for finalizers answers the object");
    assert!(marked.metadata.deletion_timestamp.is_some());
    let stored = fake.object("v1/configmaps", "default", "held").expect("deleted despite its finalizer");
    assert_eq!(stored["metadata"]["finalizers"], json!(["example.com/keep"]));

    api.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    assert!(fake.object("v1/configmaps", "default", "held").is_none(), "its last finalizer gone, so is it");
}

#[tokio::test]
async fn delete_collection_deletes_the_selected_objects() {
    let fake = FakeKube::start().await;
    let client = client(&fake).await;
    let api = namespaced(&client, "default", &configmaps());
    for (name, app) in [("a", "web"), ("b", "web"), ("c", "db")] {
        api.create(&PostParams::default(), &configmap(name, json!({"app": app}), json!({}))).await.unwrap();
    }
    let answer =
        api.delete_collection(&DeleteParams::default(), &ListParams::default().labels("app=web")).await.unwrap();
    let deleted: Vec<String> = answer.left().unwrap().items.into_iter().map(|o| o.metadata.name.unwrap()).collect();
    assert_eq!(deleted, ["a", "b"]);
    let left: Vec<Value> = fake.objects("v1/configmaps", Some("default"));
    assert_eq!(left.iter().map(|o| o["metadata"]["name"].clone()).collect::<Vec<_>>(), [json!("c")]);
}
