//! v1 Nodes in the fake: the cluster-scoped kind the generic store (`super::store`) serves, with
//! its status subresource, `spec.unschedulable` as a selectable field and the Table
//! `kubectl get nodes` shows, and [`FakeKube::put_node`] standing in for a kubelet.

use serde_json::{Value, json};

use super::FakeKube;
use super::patch::now;
use super::store::Kind;

pub(super) fn kind(base: Kind) -> Kind {
    Kind { short_names: vec!["no".into()], status: true, fields: &["spec.unschedulable"], table: Some(table), ..base }
}

fn ready(node: &Value) -> bool {
    node["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// A `meta.k8s.io/v1` Table of nodes, with the columns `kubectl get nodes` shows.
fn table(nodes: &[Value], resource_version: &str) -> Value {
    let columns = [
        ("Name", "string", "name"),
        ("Status", "string", ""),
        ("Roles", "string", ""),
        ("Age", "string", ""),
        ("Version", "string", ""),
    ];
    let cells = |n: &Value| {
        let mut status = if ready(n) { "Ready".to_owned() } else { "NotReady".to_owned() };
        if n["spec"]["unschedulable"] == true {
            status.push_str(",SchedulingDisabled");
        }
        let roles: Vec<&str> = n["metadata"]["labels"]
            .as_object()
            .map(|l| l.keys().filter_map(|k| k.strip_prefix("node-role.kubernetes.io/")).collect())
            .unwrap_or_default();
        let roles = if roles.is_empty() { "<none>".to_owned() } else { roles.join(",") };
        json!([n["metadata"]["name"], status, roles, "0s", n["status"]["nodeInfo"]["kubeletVersion"]])
    };
    super::table(&columns, nodes, cells, resource_version)
}

impl FakeKube {
    /// The stored Node.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.object("v1/nodes", "", name)
    }

    /// Registers or updates a node as its kubelet would: exactly these labels (a create or update
    /// of the node), then its status with a `Ready` condition (a write to `nodes/status`).
    /// Returns the stored node.
    pub fn put_node(&self, name: &str, ready: bool, labels: &[(&str, &str)]) -> Option<Value> {
        let mut node = self.node(name).unwrap_or_else(|| json!({"apiVersion": "v1", "kind": "Node", "spec": {}}));
        node["metadata"]["name"] = json!(name);
        node["metadata"]["labels"] = Value::Object(labels.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect());
        let mut node = self.put_object("v1/nodes", node)?;
        let status = if ready { "True" } else { "False" };
        let old = node["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
            .filter(|c| c["status"] == status);
        // A condition keeps its transition time while its status stays.
        let at = old.as_ref().map_or_else(|| json!(now()), |c| c["lastTransitionTime"].clone());
        let (reason, message) = if ready {
            ("KubeletReady", "kubelet is posting ready status")
        } else {
            ("KubeletNotReady", "container runtime network not ready")
        };
        node["status"] = json!({
            "conditions": [{
                "type": "Ready", "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": at, "lastTransitionTime": at,
            }],
            "nodeInfo": {
                "kubeletVersion": "v1.34.0", "containerRuntimeVersion": "containerd://2.0.0",
                "operatingSystem": "linux", "architecture": "amd64",
            },
        });
        self.write_status("v1/nodes", node, "kubelet");
        self.node(name)
    }

    /// Deletes a node. False if there was none.
    pub fn delete_node(&self, name: &str) -> bool {
        self.delete_object("v1/nodes", "", name)
    }
}
