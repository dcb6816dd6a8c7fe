//! The fake API server's apps/v1 Deployments answer as the real API server does: server-side
//! apply (create, merge, ownership, conflicts, force), the patch options it checks, the content
//! types it takes, the schema check, watches with a field selector, and the OpenAPI kubectl
//! reads to decide on field validation. (kubectl itself against it: `kubectl_versions`.)
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kas_e2e::FakeKube;
use serde_json::{Value, json};

const PATH: &str = "/apis/apps/v1/namespaces/team/deployments/web";

fn manifest(replicas: u32, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "main", "image": image}]}},
        },
    })
}

async fn patch(fake: &FakeKube, query: &str, content_type: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .patch(format!("{}{PATH}?{query}", fake.url()))
        .bearer_auth(fake.token())
        .header("content-type", content_type)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

async fn get(fake: &FakeKube, path: &str) -> Value {
    let response =
        reqwest::Client::new().get(format!("{}{path}", fake.url())).bearer_auth(fake.token()).send().await.unwrap();
    assert!(response.status().is_success(), "{path}: {}", response.status());
    response.json().await.unwrap()
}

const APPLY: &str = "application/apply-patch+yaml";

#[tokio::test]
async fn server_side_apply_creates_merges_and_records_the_field_manager() {
    let fake = FakeKube::start().await;
    let (code, created) =
        patch(&fake, "fieldManager=deployer&fieldValidation=Strict", APPLY, &manifest(1, "app:1")).await;
    assert_eq!(code, 201, "{created}");
    let meta = &created["metadata"];
    assert_eq!(meta["generation"], 1);
    assert_eq!(meta["namespace"], "team");
    assert!(meta["uid"].as_str().is_some_and(|u| u.len() == 36), "{meta}");
    assert!(meta["creationTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{meta}");
    assert_eq!(created["spec"]["revisionHistoryLimit"], 10, "defaulted: {created}");
    let entry = &meta["managedFields"][0];
    assert_eq!((entry["manager"].as_str(), entry["operation"].as_str()), (Some("deployer"), Some("Apply")));
    assert_eq!(entry["fieldsV1"]["f:spec"]["f:replicas"], json!({}), "{entry}");
    assert_eq!(
        entry["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"main\"}"]["f:image"],
        json!({}),
        "{entry}"
    );
    assert!(entry["fieldsV1"]["f:metadata"].get("f:name").is_none(), "name is never owned: {entry}");

    // The same apply again changes nothing (no new resourceVersion, generation or time).
    let (code, again) = patch(&fake, "fieldManager=deployer", APPLY, &manifest(1, "app:1")).await;
    assert_eq!(code, 200);
    assert_eq!(again, created);

    // A label dropped from the applied configuration is removed (the manager owned it); a spec
    // change is a new generation.
    let mut changed = manifest(2, "app:1");
    changed["metadata"]["labels"] = json!({"tier": "front"});
    let (code, updated) = patch(&fake, "fieldManager=deployer", APPLY, &changed).await;
    assert_eq!(code, 200, "{updated}");
    assert_eq!(updated["metadata"]["labels"], json!({"tier": "front"}));
    assert_eq!(updated["metadata"]["generation"], 2);
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(fake.deployment("team", "web").unwrap(), updated);
}

#[tokio::test]
async fn another_manager_conflicts_unless_it_forces() {
    let fake = FakeKube::start().await;
    patch(&fake, "fieldManager=deployer", APPLY, &manifest(1, "app:1")).await;
    let (code, status) = patch(&fake, "fieldManager=hpa&force=false", APPLY, &manifest(5, "app:1")).await;
    assert_eq!(code, 409, "{status}");
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(status["message"], "Apply failed with 1 conflict: conflict with \"deployer\": .spec.replicas");
    assert_eq!(status["details"]["causes"][0]["field"], ".spec.replicas");

    // The same values are shared ownership, not a conflict.
    let (code, _) = patch(&fake, "fieldManager=hpa", APPLY, &manifest(1, "app:1")).await;
    assert_eq!(code, 200);

    let (code, forced) = patch(&fake, "fieldManager=hpa2&force=true", APPLY, &manifest(5, "app:1")).await;
    assert_eq!(code, 200, "{forced}");
    assert_eq!(forced["spec"]["replicas"], 5);
    let managed = forced["metadata"]["managedFields"].as_array().unwrap();
    let owns_replicas =
        |m: &str| managed.iter().any(|e| e["manager"] == m && e["fieldsV1"]["f:spec"].get("f:replicas").is_some());
    assert!(owns_replicas("hpa2") && !owns_replicas("deployer") && !owns_replicas("hpa"), "{managed:?}");
}

#[tokio::test]
async fn patch_options_content_types_and_the_schema_are_checked_as_the_api_server_does() {
    let fake = FakeKube::start().await;
    let (code, status) = patch(&fake, "", APPLY, &manifest(1, "app:1")).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
    assert!(fake.deployment("team", "web").is_none());

    let (code, status) = patch(&fake, "fieldManager=x", "application/yaml", &manifest(1, "app:1")).await;
    assert_eq!(code, 415, "{status}");
    assert_eq!(status["reason"], "UnsupportedMediaType");
    assert_eq!(
        status["message"],
        "the body of the request was in an unknown format - accepted media types include: \
         application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, \
         application/apply-patch+yaml"
    );

    let (code, status) = patch(&fake, "force=true", "application/merge-patch+json", &json!({})).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch"
    );

    let mut unknown = manifest(1, "app:1");
    unknown["spec"]["template"]["spec"]["containers"][0]["imagePolicy"] = json!("Always");
    let (code, status) = patch(&fake, "fieldManager=x&fieldValidation=Ignore", APPLY, &unknown).await;
    assert_eq!(code, 500, "{status}");
    assert_eq!(
        status["message"],
        "failed to create typed patch object (team/web; apps/v1, Kind=Deployment): \
         .spec.template.spec.containers[name=\"main\"].imagePolicy: field not declared in schema"
    );

    let mut no_selector = manifest(1, "app:1");
    no_selector["spec"].as_object_mut().unwrap().remove("selector");
    let (code, status) = patch(&fake, "fieldManager=x", APPLY, &no_selector).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["message"], "Deployment.apps \"web\" is invalid: spec.selector: Required value");

    // A merge patch needs the object to exist.
    let (code, status) = patch(&fake, "", "application/merge-patch+json", &json!({"spec": {"replicas": 2}})).await;
    assert_eq!((code, status["reason"].as_str()), (404, Some("NotFound")), "{status}");
}

#[tokio::test]
async fn a_watch_with_a_field_selector_sees_its_deployment_roll_out() {
    let fake = FakeKube::start().await;
    patch(&fake, "fieldManager=x", APPLY, &manifest(1, "app:1")).await;
    let other = manifest(1, "app:1").to_string().replace("\"web\"", "\"api\"");
    let response = reqwest::Client::new()
        .patch(format!("{}/apis/apps/v1/namespaces/team/deployments/api?fieldManager=x", fake.url()))
        .bearer_auth(fake.token())
        .header("content-type", APPLY)
        .body(other)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let list = get(&fake, "/apis/apps/v1/namespaces/team/deployments?fieldSelector=metadata.name%3Dweb").await;
    assert_eq!(list["kind"], "DeploymentList");
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_owned();

    let url = format!(
        "{}/apis/apps/v1/namespaces/team/deployments?watch=true&fieldSelector=metadata.name%3Dweb&resourceVersion={rv}",
        fake.url()
    );
    let mut response = reqwest::Client::new().get(url).bearer_auth(fake.token()).send().await.unwrap();
    fake.observe_deployment("team", "api");
    fake.observe_deployment("team", "web");
    fake.roll_out("team", "web");
    let mut buffer = Vec::new();
    let mut next = async || -> Value {
        loop {
            if let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                return serde_json::from_slice(&line).unwrap();
            }
            let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), response.chunk()).await;
            buffer.extend_from_slice(&chunk.expect("a watch event within 10s").unwrap().expect("the watch ended"));
        }
    };
    let observed = next().await;
    assert_eq!(observed["type"], "MODIFIED");
    assert_eq!(observed["object"]["metadata"]["name"], "web", "only web: {observed}");
    assert_eq!(observed["object"]["status"]["observedGeneration"], 1);
    assert_eq!(observed["object"]["status"]["updatedReplicas"], 0);
    let done = next().await;
    let status = &done["object"]["status"];
    assert_eq!((status["updatedReplicas"].as_i64(), status["availableReplicas"].as_i64()), (Some(1), Some(1)));
    let progressing = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Progressing").unwrap();
    assert_eq!(progressing["reason"], "NewReplicaSetAvailable");
    assert_eq!(done["object"]["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "1");
    assert_eq!(done["object"]["metadata"]["generation"], 1, "status writes are not a new generation");
}

#[tokio::test]
async fn openapi_v3_says_deployment_patch_takes_field_validation() {
    let fake = FakeKube::start().await;
    let root = get(&fake, "/openapi/v3").await;
    let url = root["paths"]["apis/apps/v1"]["serverRelativeURL"].as_str().unwrap().to_owned();
    assert!(url.starts_with("/openapi/v3/apis/apps/v1?hash="), "{root}");
    let document = get(&fake, &url).await;
    let patch = &document["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        json!({"group": "apps", "kind": "Deployment", "version": "v1"})
    );
    let params: Vec<&str> = patch["parameters"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(params.contains(&"fieldValidation") && params.contains(&"fieldManager"), "{params:?}");
    assert!(document["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"].is_object());

    let groups = get(&fake, "/apis").await;
    assert_eq!(groups["groups"][0]["preferredVersion"]["groupVersion"], "apps/v1");
    let resources = get(&fake, "/apis/apps/v1").await;
    assert_eq!(resources["resources"][0]["name"], "deployments");
}
