//! The objects of a commit as agentk applies them: who they are (group, kind, namespace, name),
//! their scope (from discovery, or from a CustomResourceDefinition of the same commit), the
//! namespace they get, and the order of application.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An object of a commit as kas sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceObject {
    /// The manifest file it came from.
    pub source: String,
    pub object: Value,
}

/// Which object: what the inventory records and what prune compares. The version is not part of
/// it: `apps/v1` and `apps/v1beta1` name the same object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectId {
    /// The API group, `""` for the core group.
    pub group: String,
    pub kind: String,
    /// `""` for a cluster-scoped object.
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() { String::new() } else { format!(".{}", self.group) };
        if self.namespace.is_empty() {
            write!(f, "{}{group} {}", self.kind, self.name)
        } else {
            write!(f, "{}{group} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// When an object is applied: CRDs before what they define, namespaces before what they hold,
/// cluster-scoped objects (ClusterRoles, ...) before the namespaced ones that may use them.
/// Prune goes the other way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    CustomResourceDefinitions,
    Namespaces,
    ClusterScoped,
    Namespaced,
}

pub fn stage(group: &str, kind: &str, namespaced: bool) -> Stage {
    match (group, kind) {
        ("apiextensions.k8s.io", "CustomResourceDefinition") => Stage::CustomResourceDefinitions,
        ("", "Namespace") => Stage::Namespaces,
        _ if namespaced => Stage::Namespaced,
        _ => Stage::ClusterScoped,
    }
}

/// `apiVersion` → (group, version).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

/// The kinds the commit's CRDs define: (group, kind) → (versions, namespaced).
pub type CommitKinds = BTreeMap<(String, String), (Vec<String>, bool)>;

pub fn kinds_defined(objects: &[SourceObject]) -> CommitKinds {
    let mut kinds = CommitKinds::new();
    for o in objects {
        let (group, _) = split_api_version(o.object["apiVersion"].as_str().unwrap_or_default());
        if (group, o.object["kind"].as_str().unwrap_or_default())
            != ("apiextensions.k8s.io", "CustomResourceDefinition")
        {
            continue;
        }
        let spec = &o.object["spec"];
        let (Some(group), Some(kind)) = (spec["group"].as_str(), spec["names"]["kind"].as_str()) else { continue };
        let versions = spec["versions"]
            .as_array()
            .map(|vs| vs.iter().filter_map(|v| v["name"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        kinds.insert((group.to_owned(), kind.to_owned()), (versions, spec["scope"] != "Cluster"));
    }
    kinds
}

/// How the API server serves a kind, as far as ordering and namespacing need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Discovery lists it.
    Yes { namespaced: bool },
    /// Not yet: a CRD of this commit defines it.
    AfterItsCrd { namespaced: bool },
}

/// An object ready to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub source: String,
    pub id: ObjectId,
    pub version: String,
    pub stage: Stage,
    pub served: Served,
    /// The object as applied: namespace set (default namespace) or removed (cluster-scoped).
    pub object: Value,
}

/// Resolves one object: `served` says how the API server serves (group, version, kind), if at
/// all. Errors are the message of a failed object.
pub fn resolve(
    source: &SourceObject,
    default_namespace: &str,
    served: impl Fn(&str, &str, &str) -> Option<bool>,
    commit_kinds: &CommitKinds,
) -> Result<Desired, String> {
    let o = &source.object;
    let api_version = o["apiVersion"].as_str().filter(|s| !s.is_empty()).ok_or("no apiVersion")?;
    let kind = o["kind"].as_str().filter(|s| !s.is_empty()).ok_or("no kind")?;
    let name = o["metadata"]["name"].as_str().filter(|s| !s.is_empty()).ok_or("no metadata.name")?;
    let (group, version) = split_api_version(api_version);
    let served = match served(group, version, kind) {
        Some(namespaced) => Served::Yes { namespaced },
        None => match commit_kinds.get(&(group.to_owned(), kind.to_owned())) {
            Some((versions, namespaced)) if versions.iter().any(|v| v == version) => {
                Served::AfterItsCrd { namespaced: *namespaced }
            }
            _ => {
                return Err(format!(
                    "the API server serves no kind {kind} in {api_version} (is its CustomResourceDefinition installed?)"
                ));
            }
        },
    };
    let (Served::Yes { namespaced } | Served::AfterItsCrd { namespaced }) = served;
    let mut object = o.clone();
    let namespace = if namespaced {
        let ns = o["metadata"]["namespace"].as_str().filter(|s| !s.is_empty()).unwrap_or(default_namespace).to_owned();
        object["metadata"]["namespace"] = Value::String(ns.clone());
        ns
    } else {
        if let Some(m) = object["metadata"].as_object_mut() {
            m.remove("namespace");
        }
        String::new()
    };
    Ok(Desired {
        source: source.source.clone(),
        id: ObjectId { group: group.to_owned(), kind: kind.to_owned(), namespace, name: name.to_owned() },
        version: version.to_owned(),
        stage: stage(group, kind, namespaced),
        served,
        object,
    })
}

/// Puts objects in application order; within a stage, the commit's order (file path, then
/// position in the file) is kept.
pub fn order(objects: &mut [Desired]) {
    objects.sort_by_key(|d| d.stage);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn source(object: Value) -> SourceObject {
        SourceObject { source: "m.yaml".into(), object }
    }

    /// What discovery of a small cluster says: core and apps kinds.
    fn cluster(group: &str, version: &str, kind: &str) -> Option<bool> {
        match (group, version, kind) {
            ("", "v1", "ConfigMap" | "Service") | ("apps", "v1", "Deployment") => Some(true),
            ("", "v1", "Namespace")
            | ("rbac.authorization.k8s.io", "v1", "ClusterRole")
            | ("apiextensions.k8s.io", "v1", "CustomResourceDefinition") => Some(false),
            _ => None,
        }
    }

    fn crd(kind: &str, scope: &str) -> Value {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": format!("{}s.example.com", kind.to_lowercase())},
               "spec": {"group": "example.com", "scope": scope, "names": {"kind": kind, "plural": format!("{}s", kind.to_lowercase())},
                        "versions": [{"name": "v1", "served": true, "storage": true}]}})
    }

    #[test]
    fn objects_are_applied_crds_namespaces_cluster_scoped_then_namespaced_keeping_commit_order() {
        let sources: Vec<SourceObject> = [
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}),
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "apps"}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}}),
            crd("Widget", "Namespaced"),
            json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g", "namespace": "x"}}),
            crd("Gadget", "Cluster"),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}}),
        ]
        .into_iter()
        .map(source)
        .collect();
        let kinds = kinds_defined(&sources);
        let mut desired: Vec<Desired> =
            sources.iter().map(|s| resolve(s, "default", cluster, &kinds).unwrap()).collect();
        order(&mut desired);
        let got: Vec<String> = desired.iter().map(|d| d.id.to_string()).collect();
        assert_eq!(
            got,
            [
                "CustomResourceDefinition.apiextensions.k8s.io widgets.example.com",
                "CustomResourceDefinition.apiextensions.k8s.io gadgets.example.com",
                "Namespace apps",
                "ClusterRole.rbac.authorization.k8s.io r",
                // Cluster-scoped by its CRD: the namespace written in the manifest is dropped.
                "Gadget.example.com g",
                "ConfigMap default/a",
                "Widget.example.com default/w",
                "Deployment.apps apps/d",
                "ConfigMap default/b",
            ]
        );
        let widget = desired.iter().find(|d| d.id.kind == "Widget").unwrap();
        assert_eq!(widget.served, Served::AfterItsCrd { namespaced: true });
        assert_eq!(widget.object["metadata"]["namespace"], "default");
        let gadget = desired.iter().find(|d| d.id.kind == "Gadget").unwrap();
        assert!(gadget.object["metadata"].get("namespace").is_none());
        let deployment = desired.iter().find(|d| d.id.kind == "Deployment").unwrap();
        assert_eq!((deployment.version.as_str(), deployment.served), ("v1", Served::Yes { namespaced: true }));
    }

    #[test]
    fn unknown_kinds_and_incomplete_objects_fail_with_the_reason() {
        let kinds = kinds_defined(&[source(crd("Widget", "Namespaced"))]);
        for (object, expected) in [
            (
                json!({"apiVersion": "example.com/v2", "kind": "Widget", "metadata": {"name": "w"}}),
                "serves no kind Widget in example.com/v2",
            ),
            (json!({"apiVersion": "other.io/v1", "kind": "Thing", "metadata": {"name": "t"}}), "serves no kind Thing"),
            (json!({"kind": "ConfigMap", "metadata": {"name": "a"}}), "no apiVersion"),
            (json!({"apiVersion": "v1", "metadata": {"name": "a"}}), "no kind"),
            (json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}), "no metadata.name"),
        ] {
            let e = resolve(&source(object), "default", cluster, &kinds).unwrap_err();
            assert!(e.contains(expected), "{e}");
        }
    }

    #[test]
    fn identity_ignores_the_version() {
        let a = resolve(
            &source(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})),
            "ns",
            cluster,
            &CommitKinds::new(),
        )
        .unwrap();
        let b = ObjectId { group: "apps".into(), kind: "Deployment".into(), namespace: "ns".into(), name: "d".into() };
        assert_eq!(a.id, b);
        assert_eq!(split_api_version("v1"), ("", "v1"));
        assert_eq!(split_api_version("apps/v1beta1"), ("apps", "v1beta1"));
    }
}
