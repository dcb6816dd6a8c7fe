//! The compact view of an object that agentk pushes instead of the object: identity, labels and
//! a small status projection per kind (what a UI lists), a few hundred bytes where a pod is
//! several KiB.

use kas_proto::cluster_state::ObjectView;
use kube::api::DynamicObject;
use serde_json::Value;

/// Whether `conditions` (a status's list) has `type` with status "True"; `None` without it.
fn condition(status: &Value, kind: &str) -> Option<bool> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == kind).map(|c| c["status"] == "True")
}

fn int(v: &Value) -> i32 {
    v.as_i64().and_then(|n| i32::try_from(n).ok()).unwrap_or(0)
}

/// The view of `object`, of kind `kind`.
pub fn view(kind: &str, object: &DynamicObject) -> ObjectView {
    let meta = &object.metadata;
    let mut v = ObjectView {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default().into_iter().collect(),
        created_at_unix: meta.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
        ..Default::default()
    };
    let status = &object.data["status"];
    let spec = &object.data["spec"];
    match kind {
        "Pod" => {
            v.status = status["phase"].as_str().unwrap_or("Unknown").to_owned();
            v.ready = condition(status, "Ready").unwrap_or(false);
            v.node_name = spec["nodeName"].as_str().unwrap_or_default().to_owned();
            v.restarts = status["containerStatuses"]
                .as_array()
                .map_or(0, |cs| cs.iter().map(|c| int(&c["restartCount"])).fold(0i32, i32::saturating_add));
        }
        "Node" => {
            let ready = condition(status, "Ready");
            v.ready = ready == Some(true);
            v.status = match ready {
                Some(true) => "Ready",
                Some(false) => "NotReady",
                None => "Unknown",
            }
            .to_owned();
        }
        _ if spec.get("replicas").is_some() => {
            v.replicas_desired = int(&spec["replicas"]);
            v.replicas_ready = int(&status["readyReplicas"]);
            v.ready = v.replicas_ready >= v.replicas_desired;
            v.status = if v.ready { "Available" } else { "Progressing" }.to_owned();
        }
        _ => {}
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn pods_nodes_and_deployments_project_their_status() {
        let pod = object(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "prod", "uid": "u1", "resourceVersion": "7",
                         "labels": {"app": "web"}, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"restartCount": 2}, {"restartCount": 1}]},
        }));
        let v = view("Pod", &pod);
        assert_eq!(
            (v.namespace.as_str(), v.name.as_str(), v.uid.as_str(), v.resource_version.as_str()),
            ("prod", "web-1", "u1", "7")
        );
        assert_eq!((v.status.as_str(), v.ready, v.node_name.as_str(), v.restarts), ("Running", true, "node-a", 3));
        assert_eq!(v.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(v.created_at_unix, 1_767_225_600);

        let node = object(serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}}));
        let v = view("Node", &node);
        assert_eq!((v.status.as_str(), v.ready, v.namespace.as_str()), ("NotReady", false, ""));

        let deployment = object(serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "prod"}, "spec": {"replicas": 3}, "status": {"readyReplicas": 2}}));
        let v = view("Deployment", &deployment);
        assert_eq!((v.replicas_desired, v.replicas_ready, v.ready, v.status.as_str()), (3, 2, false, "Progressing"));

        let config_map = object(
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}),
        );
        assert_eq!(view("ConfigMap", &config_map).status, "");
    }
}
