//! The fake's generic object store: every kind but pods, served as the API server serves it.
//!
//! Built in: v1 namespaces and nodes (cluster-scoped; nodes in module `nodes`), configmaps,
//! secrets, services, serviceaccounts; coordination.k8s.io/v1 leases;
//! apiextensions.k8s.io/v1 customresourcedefinitions (cluster-scoped); apps/v1 deployments
//! (module `apps`). A CRD's served versions are served,
//! namespaced or cluster-scoped as it says, from the moment it is created, and appear in
//! discovery; deleting the CRD deletes its objects.
//!
//! Verbs: get, list and watch (selectors, pagination, resourceVersions and bookmarks as the real
//! ones: modules `list` and `watch`), create, update (optimistic
//! concurrency on `metadata.resourceVersion`), patch (apply, merge, strategic merge as a merge,
//! JSON patch; see `super::patch`), delete (preconditions, `propagationPolicy`) and
//! deletecollection, `dryRun=All` on every write, and the `status` subresource where the kind has
//! one. Every object gets a uid, a creationTimestamp and a resourceVersion from the one counter
//! the whole fake shares (as etcd's revision); `metadata.generation` where the real kind keeps
//! one (Deployments, CRDs, custom resources; not configmaps, secrets, services and the like).
//!
//! The controllers the API server relies on act at once, inside the request that calls for them:
//! the garbage collector (dependents found by `metadata.ownerReferences[].uid` are deleted, or
//! for `Orphan` lose that owner reference), the namespace controller (deleting a namespace
//! deletes its contents; the namespace is gone when the DELETE answers, without a lasting
//! Terminating phase), and the CRD controllers (names accepted and Established on create, objects
//! removed on delete). The DELETE's answer is still the real one: the object marked for deletion
//! (`deletionTimestamp`, the finalizers) where the real API server would keep it for its
//! controllers. Finalizers nobody handles (a user's) keep the object until an update removes
//! them, as in a real cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, MutexGuard};

use super::errors::{GroupResource, OPTIMISTIC_LOCK, details, failure, invalid};
use super::history::{ChangeKind, Target};
use super::patch::{self, PatchRequest, Refusal, Updater, now, uid};
use super::selector::Selector;
use super::watch::View;
use super::{FakeKube, Inner, Shared, St};
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// (group, resource, namespace or "" for cluster-scoped, name)
pub(super) type Key = (String, String, String, String);

/// How `metadata.generation` moves.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Generation {
    /// The kind keeps none.
    None,
    /// The spec changed (CRDs).
    Spec,
    /// The spec or the annotations changed (Deployments).
    SpecOrAnnotations,
    /// Anything but metadata (and status, where it is a subresource) changed (custom resources).
    Content,
}

/// What a DELETE that removes the object answers.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Deleted {
    /// A `Status` naming it (the generic store's `finalizeDelete`).
    Status,
    /// The object itself (`ReturnDeletedObject`: services, serviceaccounts).
    Object,
}

const VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
/// Namespaces cannot be deleted as a collection.
const NAMESPACE_VERBS: &[&str] = &["create", "delete", "get", "list", "patch", "update", "watch"];
/// A custom resource's verbs, in the order the API server lists them.
const CUSTOM_VERBS: &[&str] = &["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"];

/// A kind the store serves, at one version, with what makes it itself.
#[derive(Clone)]
pub(crate) struct Kind {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub verbs: &'static [&'static str],
    /// A status subresource: writes to the main resource neither set nor own status.
    pub status: bool,
    /// A write to the status subresource may change the annotations too (Deployments: the
    /// revision the controller keeps there).
    pub status_writes_annotations: bool,
    pub generation: Generation,
    /// A PUT of a missing object creates it (`AllowCreateOnUpdate`).
    pub create_on_update: bool,
    /// A PUT without `metadata.resourceVersion` is allowed (`AllowUnconditionalUpdate`).
    pub unconditional_update: bool,
    pub deleted: Deleted,
    /// A custom resource (no strategic merge patch; list items carry apiVersion and kind).
    pub custom: bool,
    /// A create needs the namespace to exist (the NamespaceLifecycle admission plugin).
    pub needs_namespace: bool,
    /// The OpenAPI schema server-side apply checks applied fields against.
    pub schema: Option<&'static str>,
    /// Defaults and what the kind's strategy sets, on the new object (with the old one, if any).
    pub prepare: fn(&mut Value, Option<&Value>),
    pub validate: fn(&Value) -> Result<(), Refusal>,
    /// How kubectl's Table shows it (else Name and Age).
    pub table: Option<fn(&[Value], &str) -> Value>,
    /// Subresources discovery lists besides `status` (which `status` stands for), with their verbs.
    pub subresources: &'static [(&'static str, &'static [&'static str])],
    /// Fields a field selector may name besides `metadata.name` (and `metadata.namespace` for a
    /// namespaced kind).
    pub fields: &'static [&'static str],
}

impl Kind {
    fn base(group: &str, resource: &str, kind: &str, namespaced: bool) -> Self {
        Self {
            group: group.to_owned(),
            version: "v1".to_owned(),
            resource: resource.to_owned(),
            singular: kind.to_lowercase(),
            kind: kind.to_owned(),
            namespaced,
            short_names: Vec::new(),
            categories: Vec::new(),
            verbs: VERBS,
            status: false,
            status_writes_annotations: false,
            generation: Generation::None,
            create_on_update: false,
            unconditional_update: true,
            deleted: Deleted::Status,
            custom: false,
            needs_namespace: namespaced,
            schema: None,
            prepare: |_, _| {},
            validate: |_| Ok(()),
            table: None,
            subresources: &[],
            fields: &[],
        }
    }

    pub(super) fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// As the API server prints a GroupVersionResource: `apps/v1, Resource=deployments`.
    fn gvr(&self) -> String {
        format!("{}/{}, Resource={}", self.group, self.version, self.resource)
    }

    /// Its selectors in a list's or watch's query.
    fn selector(&self, q: &HashMap<String, String>) -> Result<Selector, Refusal> {
        Selector::from_query(q, &self.gvr(), self.namespaced, self.fields)
    }

    /// How it is listed and watched (in namespace `ns`, or all if empty).
    fn view(&self, ns: &str, q: &HashMap<String, String>) -> Result<View, Refusal> {
        let printer = {
            let kind = self.clone();
            Box::new(move |objects: &[Value], rv: &str| table(&kind, objects, rv))
        };
        Ok(View {
            target: Target {
                group: self.group.clone(),
                resource: self.resource.clone(),
                namespace: (self.namespaced && !ns.is_empty()).then(|| ns.to_owned()),
            },
            api_version: self.api_version(),
            kind: self.kind.clone(),
            typed: !self.custom,
            selector: self.selector(q)?,
            printer,
        })
    }

    fn group_resource(&self) -> GroupResource<'_> {
        GroupResource { group: &self.group, resource: &self.resource }
    }

    fn key(&self, ns: &str, name: &str) -> Key {
        let ns = if self.namespaced { ns } else { "" };
        (self.group.clone(), self.resource.clone(), ns.to_owned(), name.to_owned())
    }

    /// The object as this version shows it (custom resources are served in every version
    /// without conversion, as a CRD with the `None` strategy).
    fn present(&self, mut object: Value) -> Value {
        object["apiVersion"] = json!(self.api_version());
        object
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// The kinds served whether or not anything was created.
fn built_in_kinds() -> Vec<Kind> {
    vec![
        super::apps::kind(Kind::base("apps", "deployments", "Deployment", true)),
        Kind { short_names: names(&["cm"]), ..Kind::base("", "configmaps", "ConfigMap", true) },
        Kind {
            short_names: names(&["ns"]),
            verbs: NAMESPACE_VERBS,
            status: true,
            prepare: prepare_namespace,
            fields: &["status.phase"],
            ..Kind::base("", "namespaces", "Namespace", false)
        },
        super::nodes::kind(Kind::base("", "nodes", "Node", false)),
        Kind { prepare: prepare_secret, fields: &["type"], ..Kind::base("", "secrets", "Secret", true) },
        Kind {
            short_names: names(&["sa"]),
            deleted: Deleted::Object,
            ..Kind::base("", "serviceaccounts", "ServiceAccount", true)
        },
        Kind {
            short_names: names(&["svc"]),
            categories: names(&["all"]),
            status: true,
            create_on_update: true,
            deleted: Deleted::Object,
            prepare: prepare_service,
            ..Kind::base("", "services", "Service", true)
        },
        Kind {
            create_on_update: true,
            unconditional_update: false,
            ..Kind::base("coordination.k8s.io", "leases", "Lease", true)
        },
        Kind {
            short_names: names(&["crd", "crds"]),
            categories: names(&["api-extensions"]),
            status: true,
            generation: Generation::Spec,
            unconditional_update: false,
            prepare: prepare_crd,
            validate: validate_crd,
            ..Kind::base("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", false)
        },
    ]
}

const CRDS: (&str, &str) = ("apiextensions.k8s.io", "customresourcedefinitions");
const CRD_CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";

/// The kinds a CRD defines: one per served version.
fn crd_kinds(crd: &Value) -> Vec<Kind> {
    let spec = &crd["spec"];
    let names_of = &spec["names"];
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()).unwrap_or_default()
    };
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    versions
        .iter()
        .filter(|v| v["served"].as_bool().unwrap_or(false))
        .map(|v| Kind {
            group: text(&spec["group"]),
            version: text(&v["name"]),
            resource: text(&names_of["plural"]),
            singular: text(&names_of["singular"]),
            kind: text(&names_of["kind"]),
            namespaced: spec["scope"] == "Namespaced",
            short_names: strings(&names_of["shortNames"]),
            categories: strings(&names_of["categories"]),
            verbs: CUSTOM_VERBS,
            status: v["subresources"]["status"].is_object(),
            generation: Generation::Content,
            unconditional_update: false,
            custom: true,
            ..Kind::base("", "", "", spec["scope"] == "Namespaced")
        })
        .collect()
}

fn prepare_namespace(object: &mut Value, _old: Option<&Value>) {
    // What the namespace strategy keeps: the name as a label, the `kubernetes` finalizer.
    let name = object["metadata"]["name"].clone();
    object["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
    if object["spec"]["finalizers"].is_null() {
        object["spec"]["finalizers"] = json!(["kubernetes"]);
    }
    if object["status"]["phase"].is_null() {
        object["status"]["phase"] = json!("Active");
    }
}

fn prepare_secret(object: &mut Value, _old: Option<&Value>) {
    use base64::Engine;
    if object["type"].is_null() {
        object["type"] = json!("Opaque");
    }
    // stringData is write-only: it lands in data, base64-encoded.
    if let Some(string_data) = object.as_object_mut().and_then(|o| o.remove("stringData"))
        && let Some(entries) = string_data.as_object()
    {
        for (key, value) in entries {
            let encoded = base64::engine::general_purpose::STANDARD.encode(value.as_str().unwrap_or_default());
            object["data"][key.as_str()] = json!(encoded);
        }
    }
}

fn prepare_service(object: &mut Value, old: Option<&Value>) {
    let spec = &mut object["spec"];
    if spec["type"].is_null() {
        spec["type"] = json!("ClusterIP");
    }
    if spec["sessionAffinity"].is_null() {
        spec["sessionAffinity"] = json!("None");
    }
    // The allocated IP stays the service's (an update without it keeps it, as the real one).
    if spec["clusterIP"].is_null() {
        spec["clusterIP"] = match old {
            Some(old) => old["spec"]["clusterIP"].clone(),
            None => {
                let [a, b]: [u8; 2] = rand::random();
                json!(format!("10.96.{a}.{}", b.max(1)))
            }
        };
    }
    if spec["clusterIPs"].is_null() {
        spec["clusterIPs"] = json!([spec["clusterIP"]]);
    }
    for (field, value) in [
        ("ipFamilies", json!(["IPv4"])),
        ("ipFamilyPolicy", json!("SingleStack")),
        ("internalTrafficPolicy", json!("Cluster")),
    ] {
        if spec[field].is_null() {
            spec[field] = value;
        }
    }
    if let Some(ports) = spec["ports"].as_array_mut() {
        for port in ports {
            if port["protocol"].is_null() {
                port["protocol"] = json!("TCP");
            }
            if port["targetPort"].is_null() {
                port["targetPort"] = port["port"].clone();
            }
        }
    }
    if object["status"].is_null() {
        object["status"] = json!({"loadBalancer": {}});
    }
}

/// The CRD's defaults, and what its controllers would write at once: the finalizer that removes
/// its objects, the accepted names, Established, the stored version.
fn prepare_crd(object: &mut Value, _old: Option<&Value>) {
    let names_of = &mut object["spec"]["names"];
    let kind = names_of["kind"].as_str().unwrap_or_default().to_owned();
    if names_of["singular"].is_null() {
        names_of["singular"] = json!(kind.to_lowercase());
    }
    if names_of["listKind"].is_null() {
        names_of["listKind"] = json!(format!("{kind}List"));
    }
    if object["spec"]["conversion"].is_null() {
        object["spec"]["conversion"] = json!({"strategy": "None"});
    }
    if object["metadata"]["deletionTimestamp"].is_null() {
        let mut list = finalizers(object);
        if !list.iter().any(|f| f == CRD_CLEANUP) {
            list.push(CRD_CLEANUP.to_owned());
            set_finalizers(object, &list);
        }
    }
    let at = now();
    let storage = object["spec"]["versions"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["storage"] == true))
        .map(|v| v["name"].clone())
        .unwrap_or_default();
    let mut stored: Vec<Value> = object["status"]["storedVersions"].as_array().cloned().unwrap_or_default();
    if !stored.contains(&storage) {
        stored.push(storage);
    }
    object["status"] = json!({
        "acceptedNames": object["spec"]["names"],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": at, "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": at, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"},
        ],
        "storedVersions": stored,
    });
}

fn validate_crd(object: &Value) -> Result<(), Refusal> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let spec = &object["spec"];
    let plural = spec["names"]["plural"].as_str().unwrap_or_default();
    let group = spec["group"].as_str().unwrap_or_default();
    let mut causes: Vec<(&str, &str, String)> = Vec::new();
    if name != format!("{plural}.{group}") {
        causes.push((
            "metadata.name",
            "FieldValueInvalid",
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let scope = spec["scope"].as_str().unwrap_or_default();
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push((
            "spec.scope",
            "FieldValueNotSupported",
            format!("Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""),
        ));
    }
    let storage = spec["versions"].as_array().map_or(0, |v| v.iter().filter(|v| v["storage"] == true).count());
    if storage != 1 {
        causes.push((
            "spec.versions",
            "FieldValueInvalid",
            "must have exactly one version marked as storage version".into(),
        ));
    }
    if causes.is_empty() {
        return Ok(());
    }
    let causes: Vec<(&str, &str, &str)> = causes.iter().map(|(f, r, m)| (*f, *r, m.as_str())).collect();
    Err(Box::new(invalid("apiextensions.k8s.io", "CustomResourceDefinition", name, &causes)))
}

/// The store under the fake's lock: reads, writes with their watch events, and the controllers'
/// work.
pub(super) struct Tx<'a> {
    inner: MutexGuard<'a, Inner>,
}

impl Shared {
    pub(super) fn tx(&self) -> Tx<'_> {
        Tx { inner: self.lock() }
    }
}

fn meta<'a>(object: &'a Value, field: &str) -> &'a str {
    object["metadata"][field].as_str().unwrap_or_default()
}

fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|f| f.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

fn set_finalizers(object: &mut Value, list: &[String]) {
    if list.is_empty() {
        if let Some(m) = object["metadata"].as_object_mut() {
            m.remove("finalizers");
        }
    } else {
        object["metadata"]["finalizers"] = json!(list);
    }
}

/// The uids an object's ownerReferences name.
fn owners(object: &Value) -> Vec<String> {
    object["metadata"]["ownerReferences"]
        .as_array()
        .map(|refs| refs.iter().filter_map(|r| r["uid"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

impl Tx<'_> {
    /// Every kind served now: the built-in ones and those of the CRDs.
    pub(super) fn kinds(&self) -> Vec<Kind> {
        let mut kinds = built_in_kinds();
        for ((group, resource, _, _), crd) in &self.inner.objects {
            if (group.as_str(), resource.as_str()) == CRDS {
                kinds.extend(crd_kinds(crd));
            }
        }
        kinds
    }

    fn kind(&self, group: &str, version: &str, resource: &str) -> Option<Kind> {
        self.kinds().into_iter().find(|k| k.group == group && k.version == version && k.resource == resource)
    }

    /// The objects of a kind, in one namespace or all.
    fn objects_of<'k>(&'k self, kind: &'k Kind, ns: Option<&'k str>) -> impl Iterator<Item = (Key, Value)> + 'k {
        self.inner
            .objects
            .iter()
            .filter(move |((g, r, n, _), _)| *g == kind.group && *r == kind.resource && ns.is_none_or(|ns| ns == n))
            .map(|(k, o)| (k.clone(), o.clone()))
    }

    fn get(&self, key: &Key) -> Option<Value> {
        self.inner.objects.get(key).cloned()
    }

    fn namespace_exists(&self, ns: &str) -> bool {
        self.inner.objects.contains_key(&(String::new(), "namespaces".into(), String::new(), ns.to_owned()))
    }

    /// Stores the object with a new resourceVersion and tells the watchers.
    fn put(&mut self, key: Key, mut object: Value) -> Value {
        self.inner.resource_version += 1;
        object["metadata"]["resourceVersion"] = json!(self.inner.resource_version.to_string());
        let prev = self.inner.objects.insert(key.clone(), object.clone());
        let kind = if prev.is_some() { ChangeKind::Modified } else { ChangeKind::Added };
        self.inner.record(kind, key, &object, prev);
        object
    }

    /// Removes the object (the DELETED event carries the deletion's resourceVersion), then the
    /// garbage collector deals with its dependents.
    fn remove(&mut self, key: &Key) -> Option<Value> {
        let prev = self.inner.objects.remove(key)?;
        self.inner.resource_version += 1;
        let mut object = prev.clone();
        object["metadata"]["resourceVersion"] = json!(self.inner.resource_version.to_string());
        self.inner.record(ChangeKind::Deleted, key.clone(), &object, Some(prev));
        self.collect_dependents(meta(&object, "uid"));
        Some(object)
    }

    fn uid_exists(&self, uid: &str) -> bool {
        self.inner.objects.values().any(|o| meta(o, "uid") == uid)
    }

    fn dependents(&self, uid: &str) -> Vec<Key> {
        self.inner.objects.iter().filter(|(_, o)| owners(o).iter().any(|u| u == uid)).map(|(k, _)| k.clone()).collect()
    }

    /// Drops the ownerReference to `uid` from a dependent (an update, as the garbage collector's
    /// patch).
    fn disown(&mut self, key: Key, uid: &str) {
        let Some(mut dependent) = self.get(&key) else { return };
        if let Some(refs) = dependent["metadata"]["ownerReferences"].as_array_mut() {
            refs.retain(|r| r["uid"] != uid);
            if refs.is_empty()
                && let Some(m) = dependent["metadata"].as_object_mut()
            {
                m.remove("ownerReferences");
            }
        }
        self.put(key, dependent);
    }

    /// The garbage collector for an owner that is gone: a dependent with no other owner left is
    /// deleted, one with another owner loses the reference.
    fn collect_dependents(&mut self, uid: &str) {
        for key in self.dependents(uid) {
            let Some(dependent) = self.get(&key) else { continue };
            let others_alive = owners(&dependent).iter().any(|u| u != uid && self.uid_exists(u));
            if others_alive {
                self.disown(key, uid);
            } else {
                self.delete_now(&key, Policy::Background);
            }
        }
    }

    /// A deletion the controllers make (no response): marks the object or removes it.
    fn delete_now(&mut self, key: &Key, policy: Policy) {
        if let Some(live) = self.get(key) {
            let _ = self.finish_delete(key, live, policy);
        }
    }

    /// Marks the object for deletion with its pending finalizers (the one `policy` adds among
    /// them) and runs the controllers those finalizers wait for; removes it once none is left.
    /// Returns the marked object (as the DELETE answers), or None if it went at once.
    fn finish_delete(&mut self, key: &Key, live: Value, policy: Policy) -> Option<Value> {
        let pending = pending_finalizers(key, &live, policy);
        if pending.is_empty() {
            self.remove(key);
            return None;
        }
        let marked = mark_for_deletion(key, &live, &pending);
        let mut object = self.put(key.clone(), marked.clone());
        let uid = meta(&live, "uid").to_owned();
        let mut left = Vec::new();
        for finalizer in pending {
            match finalizer.as_str() {
                "orphan" => {
                    for dependent in self.dependents(&uid) {
                        self.disown(dependent, &uid);
                    }
                }
                "foregroundDeletion" => {
                    for dependent in self.dependents(&uid) {
                        self.delete_now(&dependent, Policy::Foreground);
                    }
                }
                CRD_CLEANUP => self.remove_custom_resources(&live),
                "kubernetes" if key.1 == "namespaces" => self.empty_namespace(&key.3),
                _ => left.push(finalizer),
            }
        }
        if left.is_empty() {
            self.remove(key);
        } else {
            // Waits for whoever handles the other finalizers (an update that removes them).
            set_finalizers(&mut object, &left);
            if key.1 == "namespaces" {
                object["spec"]["finalizers"] = json!([]);
            }
            self.put(key.clone(), object);
        }
        Some(marked)
    }

    fn remove_custom_resources(&mut self, crd: &Value) {
        let group = crd["spec"]["group"].as_str().unwrap_or_default();
        let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
        let keys: Vec<Key> =
            self.inner.objects.keys().filter(|(g, r, _, _)| g == group && r == plural).cloned().collect();
        for key in keys {
            self.remove(&key);
        }
    }

    /// The namespace controller: everything in the namespace goes (pods too).
    fn empty_namespace(&mut self, ns: &str) {
        let keys: Vec<Key> = self.inner.objects.keys().filter(|(_, _, n, _)| n == ns).cloned().collect();
        for key in keys {
            self.delete_now(&key, Policy::Background);
        }
        let pods: Vec<(String, String)> = self.inner.pods.keys().filter(|(n, _)| n == ns).cloned().collect();
        for (pod_ns, pod) in pods {
            self.inner.remove_pod(&pod_ns, &pod);
        }
    }
}

/// `propagationPolicy`.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Policy {
    Background,
    Foreground,
    Orphan,
}

/// The finalizers a deletion waits for: the object's own, the policy's, and the namespace's
/// `kubernetes` (in its spec).
fn pending_finalizers(key: &Key, live: &Value, policy: Policy) -> Vec<String> {
    let mut pending = finalizers(live);
    let add = match policy {
        Policy::Orphan => Some("orphan"),
        Policy::Foreground => Some("foregroundDeletion"),
        Policy::Background => None,
    };
    if let Some(add) = add
        && !pending.iter().any(|f| f == add)
    {
        pending.push(add.to_owned());
    }
    if key.1 == "namespaces" && key.0.is_empty() {
        pending.push("kubernetes".to_owned());
    }
    pending
}

/// The object as a deletion leaves it while finalizers are pending.
fn mark_for_deletion(key: &Key, live: &Value, pending: &[String]) -> Value {
    let mut marked = live.clone();
    if marked["metadata"]["deletionTimestamp"].is_null() {
        marked["metadata"]["deletionTimestamp"] = json!(now());
        marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        if let Some(generation) = marked["metadata"]["generation"].as_i64().filter(|g| *g > 0) {
            marked["metadata"]["generation"] = json!(generation + 1);
        }
    }
    let metadata_finalizers: Vec<String> = pending.iter().filter(|f| *f != "kubernetes").cloned().collect();
    set_finalizers(&mut marked, &metadata_finalizers);
    if key.1 == "namespaces" {
        marked["status"]["phase"] = json!("Terminating");
    }
    marked
}

/// Which part of the object a write is for.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Main,
    Status,
}

/// One write's target and options.
struct Write<'a> {
    kind: &'a Kind,
    ns: &'a str,
    name: &'a str,
    part: Part,
    dry_run: bool,
}

impl Write<'_> {
    fn key(&self) -> Key {
        self.kind.key(self.ns, self.name)
    }

    /// The managedFields entry's author for a non-apply write.
    fn updater<'m>(&'m self, manager: &'m str, api_version: &'m str) -> Updater<'m> {
        Updater {
            manager,
            api_version,
            subresource: (self.part == Part::Status).then_some("status"),
            ignore_status: self.part == Part::Main && self.kind.status,
        }
    }
}

/// `new` gets `old`'s field, or none if `old` has none.
fn keep(new: &mut Value, old: &Value, field: &str) {
    match old.get(field) {
        Some(value) => new[field] = value.clone(),
        None => {
            if let Some(o) = new.as_object_mut() {
                o.remove(field);
            }
        }
    }
}

fn content_changed(kind: &Kind, old: &Value, new: &Value) -> bool {
    match kind.generation {
        Generation::None => false,
        Generation::Spec => old["spec"] != new["spec"],
        Generation::SpecOrAnnotations => {
            old["spec"] != new["spec"] || old["metadata"]["annotations"] != new["metadata"]["annotations"]
        }
        Generation::Content => {
            let strip = |v: &Value| {
                let mut v = v.clone();
                if let Some(o) = v.as_object_mut() {
                    o.remove("metadata");
                    o.remove("apiVersion");
                    if kind.status {
                        o.remove("status");
                    }
                }
                v
            };
            strip(old) != strip(new)
        }
    }
}

/// What the API server does with every create and update once the request's object is made:
/// the kind's strategy (identity, system fields, status where it is a subresource, generation,
/// defaults), validation, the managedFields of a non-apply write (`updater`), then the write
/// itself unless it changes nothing or is a dry run. A terminating object whose last finalizer an
/// update removes is deleted.
fn commit(
    tx: &mut Tx,
    w: &Write,
    old: Option<&Value>,
    mut new: Value,
    updater: Option<&Updater>,
) -> Result<Value, Refusal> {
    let kind = w.kind;
    new["apiVersion"] = json!(kind.api_version());
    new["kind"] = json!(kind.kind);
    new["metadata"]["name"] = json!(w.name);
    if kind.namespaced {
        new["metadata"]["namespace"] = json!(w.ns);
    } else if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    match old {
        None => {
            if kind.needs_namespace && !tx.namespace_exists(w.ns) {
                return Err(Box::new(GroupResource { group: "", resource: "namespaces" }.not_found(w.ns)));
            }
            let m = &mut new["metadata"];
            m["uid"] = json!(uid());
            m["creationTimestamp"] = json!(now());
            if let Some(m) = m.as_object_mut() {
                for field in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"] {
                    m.remove(field);
                }
            }
            if kind.generation != Generation::None {
                new["metadata"]["generation"] = json!(1);
            }
            if kind.status
                && let Some(o) = new.as_object_mut()
            {
                o.remove("status");
            }
        }
        Some(old) => {
            if w.part == Part::Status {
                let mut merged = old.clone();
                keep(&mut merged, &new, "status");
                keep(&mut merged["metadata"], &new["metadata"], "managedFields");
                if kind.status_writes_annotations {
                    keep(&mut merged["metadata"], &new["metadata"], "annotations");
                }
                new = merged;
            } else if kind.status {
                keep(&mut new, old, "status");
            }
            for field in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"] {
                keep(&mut new["metadata"], &old["metadata"], field);
            }
            new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
            if w.part == Part::Main && content_changed(kind, old, &new) {
                let generation = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
                new["metadata"]["generation"] = json!(generation);
            }
        }
    }
    (kind.prepare)(&mut new, old);
    (kind.validate)(&new)?;
    if let Some(updater) = updater {
        patch::record_update(old, &mut new, updater);
    }
    if old == Some(&new) {
        return Ok(new); // a no-op write is not a write
    }
    let key = w.key();
    let terminating = !new["metadata"]["deletionTimestamp"].is_null();
    if w.dry_run {
        return Ok(new);
    }
    if terminating && finalizers(&new).is_empty() {
        tx.inner.objects.insert(key.clone(), new);
        return tx.remove(&key).ok_or_else(|| Box::new(kind.group_resource().not_found(w.name)));
    }
    Ok(tx.put(key, new))
}

/// A POST or PUT body: JSON or YAML (the fake reads no protobuf, which typed Go clients such as
/// `kubectl create` send: 415, as the API server answers a type it does not take).
fn parse_object(body: &Bytes, headers: &HeaderMap) -> Result<Value, Refusal> {
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    let parsed = match content_type.split(';').next().unwrap_or_default().trim() {
        "application/json" | "" => serde_json::from_slice::<Value>(body).ok(),
        "application/yaml" => serde_norway::from_slice::<Value>(body).ok(),
        _ => {
            return Err(Box::new(failure(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
                None,
            )));
        }
    };
    match parsed {
        Some(v) if v.is_object() => Ok(v),
        _ => Err(Box::new(failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body of the request is not an object",
            None,
        ))),
    }
}

/// A request for one resource, as the URL and query name it.
struct Call<'a> {
    kind: &'a Kind,
    ns: &'a str,
    q: &'a HashMap<String, String>,
    headers: &'a HeaderMap,
}

impl Call<'_> {
    fn write<'w>(&'w self, name: &'w str, part: Part, dry_run: bool) -> Write<'w> {
        Write { kind: self.kind, ns: self.ns, name, part, dry_run }
    }

    /// The name and namespace an object in a PUT or apply body gives, against the URL's (a
    /// cluster-scoped object's namespace is not looked at).
    fn check_identity(&self, object: &Value, name: &str) -> Result<(), Refusal> {
        let bad = |message: &str| Err(Box::new(failure(StatusCode::BAD_REQUEST, "BadRequest", message, None)));
        let body_name = meta(object, "name");
        if !body_name.is_empty() && body_name != name {
            return bad(&format!("the name of the object ({body_name}) does not match the name on the URL ({name})"));
        }
        let body_ns = meta(object, "namespace");
        if self.kind.namespaced && !body_ns.is_empty() && body_ns != self.ns {
            return bad("the namespace of the provided object does not match the namespace sent on the request");
        }
        Ok(())
    }

    fn manager(&self) -> String {
        patch::update_manager(self.q, self.headers)
    }

    /// The objects the URL's namespace (if any) and the query's selectors pick.
    fn selected(&self, tx: &Tx) -> Result<Vec<(Key, Value)>, Refusal> {
        let selector = self.kind.selector(self.q)?;
        let ns = (!self.ns.is_empty()).then_some(self.ns);
        Ok(tx.objects_of(self.kind, ns).filter(|(_, o)| selector.matches(o)).collect())
    }

    fn create(&self, tx: &mut Tx, body: &Bytes) -> Result<Response, Refusal> {
        let kind = self.kind;
        let mut object = parse_object(body, self.headers)?;
        let mut name = meta(&object, "name").to_owned();
        if name.is_empty() {
            let prefix = meta(&object, "generateName");
            if prefix.is_empty() {
                return Err(Box::new(invalid(
                    &kind.group,
                    &kind.kind,
                    "",
                    &[("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")],
                )));
            }
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            let suffix: String = (0..5).map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char).collect();
            name = format!("{prefix}{suffix}");
        }
        self.check_identity(&object, &name)?;
        if !meta(&object, "resourceVersion").is_empty() {
            // A plain storage error, so a 500 without a reason.
            return Err(Box::new(failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                "",
                "resourceVersion should not be set on objects to be created",
                None,
            )));
        }
        let w = self.write(&name, Part::Main, patch::dry_run(self.q));
        if kind.needs_namespace && !tx.namespace_exists(self.ns) {
            return Err(Box::new(GroupResource { group: "", resource: "namespaces" }.not_found(self.ns)));
        }
        if tx.get(&w.key()).is_some() {
            return Err(Box::new(kind.group_resource().already_exists(&name)));
        }
        if let Some(m) = object["metadata"].as_object_mut() {
            m.remove("managedFields");
        }
        let manager = self.manager();
        let api_version = kind.api_version();
        let created = commit(tx, &w, None, object, Some(&w.updater(&manager, &api_version)))?;
        Ok((StatusCode::CREATED, axum::Json(kind.present(created))).into_response())
    }

    /// PUT: the whole object, with optimistic concurrency on its resourceVersion.
    fn update(&self, tx: &mut Tx, name: &str, part: Part, body: &Bytes) -> Result<Response, Refusal> {
        let kind = self.kind;
        let object = parse_object(body, self.headers)?;
        self.check_identity(&object, name)?;
        let w = self.write(name, part, patch::dry_run(self.q));
        let manager = self.manager();
        let api_version = kind.api_version();
        let updater = w.updater(&manager, &api_version);
        let Some(old) = tx.get(&w.key()) else {
            if !kind.create_on_update || part == Part::Status {
                return Err(Box::new(kind.group_resource().not_found(name)));
            }
            let created = commit(tx, &w, None, object, Some(&updater))?;
            return Ok((StatusCode::CREATED, axum::Json(kind.present(created))).into_response());
        };
        let rv = meta(&object, "resourceVersion");
        if rv.is_empty() {
            if !kind.unconditional_update {
                // NewInvalid with the resource as the kind, as the generic store words it.
                return Err(Box::new(invalid(
                    &kind.group,
                    &kind.resource,
                    name,
                    &[(
                        "metadata.resourceVersion",
                        "FieldValueInvalid",
                        "Invalid value: 0x0: must be specified for an update",
                    )],
                )));
            }
        } else if rv != meta(&old, "resourceVersion") {
            return Err(Box::new(kind.group_resource().conflict(name, OPTIMISTIC_LOCK)));
        }
        let updated = commit(tx, &w, Some(&old), object, Some(&updater))?;
        Ok(axum::Json(kind.present(updated)).into_response())
    }

    fn patch(&self, tx: &mut Tx, name: &str, part: Part, body: &Bytes) -> Result<Response, Refusal> {
        let kind = self.kind;
        let accepted: &[&str] = if kind.custom { &patch::CUSTOM_PATCH_TYPES } else { &patch::BUILT_IN_PATCH_TYPES };
        let request = PatchRequest::read(self.q, self.headers, accepted)?;
        let w = self.write(name, part, request.dry_run);
        let old = tx.get(&w.key());
        let api_version = kind.api_version();
        if request.is_apply() {
            let mut applied = patch::parse_apply(body, &request.validation)?;
            self.check_identity(&applied, name)?;
            if let Some(schema) = kind.schema {
                let gvk = format!("{api_version}, Kind={}", kind.kind);
                patch::check_schema(schema, &gvk, self.ns, name, &applied)?;
            }
            // Status is reset on the main resource of a kind with a status subresource: an apply
            // there neither sets nor owns it (and the reverse for the subresource).
            if let Some(o) = applied.as_object_mut() {
                match part {
                    Part::Main if kind.status => {
                        o.remove("status");
                    }
                    Part::Status => {
                        o.retain(|k, _| k == "status" || k == "apiVersion" || k == "kind" || k == "metadata")
                    }
                    Part::Main => {}
                }
            }
            if part == Part::Status && old.is_none() {
                return Err(Box::new(kind.group_resource().not_found(name)));
            }
            let mut object = old.clone().unwrap_or_else(|| json!({"metadata": {}}));
            patch::apply(&mut object, &applied, &request.manager, request.force, &api_version)?;
            let stale = old.as_ref().is_some_and(|o| meta(&object, "resourceVersion") != meta(o, "resourceVersion"));
            if stale {
                return Err(Box::new(kind.group_resource().conflict(name, OPTIMISTIC_LOCK)));
            }
            let created = old.is_none();
            let object = commit(tx, &w, old.as_ref(), object, None)?;
            let code = if created { StatusCode::CREATED } else { StatusCode::OK };
            return Ok((code, axum::Json(kind.present(object))).into_response());
        }
        let Some(old) = old else {
            return Err(Box::new(kind.group_resource().not_found(name)));
        };
        let object = request.patched(&old, body)?;
        if meta(&object, "resourceVersion") != meta(&old, "resourceVersion") {
            return Err(Box::new(kind.group_resource().conflict(name, OPTIMISTIC_LOCK)));
        }
        let manager = self.manager();
        let updated = commit(tx, &w, Some(&old), object, Some(&w.updater(&manager, &api_version)))?;
        Ok(axum::Json(kind.present(updated)).into_response())
    }

    fn delete_options(&self, body: &Bytes) -> Result<DeleteOptions, Refusal> {
        let options: Value = if body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            serde_json::from_slice(body).map_err(|e| {
                Box::new(failure(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("error decoding DeleteOptions: {e}"),
                    None,
                ))
            })?
        };
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let policy = self.q.get("propagationPolicy").cloned().or_else(|| text(&options["propagationPolicy"]));
        let policy = match policy.as_deref() {
            None => match options["orphanDependents"].as_bool() {
                Some(true) => Policy::Orphan,
                _ => Policy::Background,
            },
            Some("Background") => Policy::Background,
            Some("Foreground") => Policy::Foreground,
            Some("Orphan") => Policy::Orphan,
            Some(other) => {
                let message = format!(
                    "Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
                );
                return Err(Box::new(invalid(
                    "meta.k8s.io",
                    "DeleteOptions",
                    "",
                    &[("propagationPolicy", "FieldValueNotSupported", &message)],
                )));
            }
        };
        let dry_run =
            patch::dry_run(self.q) || options["dryRun"].as_array().is_some_and(|d| d.iter().any(|v| v == "All"));
        Ok(DeleteOptions {
            policy,
            uid: text(&options["preconditions"]["uid"]),
            resource_version: text(&options["preconditions"]["resourceVersion"]),
            dry_run,
        })
    }

    /// DELETE of one object: what it answers.
    fn delete(&self, tx: &mut Tx, name: &str, options: &DeleteOptions) -> Result<Value, Refusal> {
        let kind = self.kind;
        let key = kind.key(self.ns, name);
        let Some(live) = tx.get(&key) else {
            return Err(Box::new(kind.group_resource().not_found(name)));
        };
        check_preconditions(kind, name, &live, options)?;
        let answer_removed = |live: &Value| match kind.deleted {
            Deleted::Object => kind.present(live.clone()),
            Deleted::Status => {
                let mut d = details(name, &kind.group, &kind.resource);
                d["uid"] = live["metadata"]["uid"].clone();
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d})
            }
        };
        if options.dry_run {
            let pending = pending_finalizers(&key, &live, options.policy);
            return Ok(if pending.is_empty() {
                answer_removed(&live)
            } else {
                kind.present(mark_for_deletion(&key, &live, &pending))
            });
        }
        let marked = tx.finish_delete(&key, live.clone(), options.policy);
        Ok(match marked {
            Some(marked) => kind.present(marked),
            None => answer_removed(&live),
        })
    }

    fn delete_collection(&self, tx: &mut Tx, options: &DeleteOptions) -> Result<Response, Refusal> {
        let kind = self.kind;
        let mut items = Vec::new();
        for ((_, _, _, name), _) in self.selected(tx)? {
            // An earlier deletion may have collected this one.
            if let Some(live) = tx.get(&kind.key(self.ns, &name)) {
                self.delete(tx, &name, options)?;
                items.push(kind.present(live));
            }
        }
        Ok(axum::Json(json!({
            "kind": format!("{}List", kind.kind), "apiVersion": kind.api_version(),
            "metadata": {"resourceVersion": tx.inner.resource_version.to_string()}, "items": items,
        }))
        .into_response())
    }
}

struct DeleteOptions {
    policy: Policy,
    uid: Option<String>,
    resource_version: Option<String>,
    dry_run: bool,
}

/// DeleteOptions.preconditions. The generic store checks them first thing (`rest.BeforeDelete`,
/// which names the kind where the other errors name the resource); namespaces and CRDs have
/// their own DELETE with its own wording.
fn check_preconditions(kind: &Kind, name: &str, live: &Value, options: &DeleteOptions) -> Result<(), Refusal> {
    let own_delete = kind.resource == "namespaces" || (kind.group.as_str(), kind.resource.as_str()) == CRDS;
    let checks = [
        ("UID", options.uid.as_deref(), meta(live, "uid"), "The object might have been deleted and then recreated"),
        (
            "ResourceVersion",
            options.resource_version.as_deref(),
            meta(live, "resourceVersion"),
            "The object might have been modified",
        ),
    ];
    for (what, wanted, actual, hint) in checks {
        let Some(wanted) = wanted.filter(|w| *w != actual) else { continue };
        return Err(Box::new(if own_delete {
            kind.group_resource().conflict(
                name,
                &format!("Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {actual}"),
            )
        } else {
            GroupResource { group: &kind.group, resource: &kind.kind }.conflict(
                name,
                &format!(
                    "the {what} in the precondition ({wanted}) does not match the {what} in record ({actual}). {hint}"
                ),
            )
        }));
    }
    Ok(())
}

/// A Table of any kind: its own columns, else Name and Age.
pub(super) fn table(kind: &Kind, objects: &[Value], resource_version: &str) -> Value {
    match kind.table {
        Some(table) => table(objects, resource_version),
        None => super::table(
            &[("Name", "string", "name"), ("Age", "string", "")],
            objects,
            |o| json!([o["metadata"]["name"], "0s"]),
            resource_version,
        ),
    }
}

/// 404 for a path no resource answers, as the API server words it.
fn no_such_resource() -> Response {
    failure(StatusCode::NOT_FOUND, "NotFound", "the server could not find the requested resource", Some(json!({})))
}

/// Every request under /api and /apis the fake has no route of its own for.
pub(super) async fn serve(
    State(fake): St,
    method: Method,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["apis", group] if method == Method::GET => return group_document(&fake, group),
        ["apis", group, version] if method == Method::GET => return resource_list(&fake, group, version),
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return (StatusCode::NOT_FOUND, "404 page not found\n").into_response(),
    };
    // namespaces/{ns}/{resource}[/{name}[/{subresource}]], or {resource}[/{name}[/{subresource}]]
    // (a namespace's own subresources are `namespaces/{name}/status`).
    let namespaced_path = rest.len() >= 3 && rest[0] == "namespaces" && !(rest.len() == 3 && rest[2] == "status");
    let (ns, rest) = if namespaced_path { (rest[1], &rest[2..]) } else { ("", rest) };
    let (resource, name, subresource) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub] => (*resource, Some(*name), Some(*sub)),
        _ => return no_such_resource(),
    };
    if [Method::POST, Method::PUT, Method::PATCH].contains(&method) {
        super::record_body(&fake, method.as_str(), uri.path().to_owned(), &headers, &body);
    }
    let kind = fake.tx().kind(group, version, resource);
    let Some(kind) = kind else {
        return no_such_resource();
    };
    // A namespaced kind's objects are only named in a namespace; a cluster-scoped one has none.
    if (namespaced_path && !kind.namespaced) || (kind.namespaced && !namespaced_path && name.is_some()) {
        return no_such_resource();
    }
    let part = match subresource {
        None => Part::Main,
        Some("status") if kind.status => Part::Status,
        Some(_) => return no_such_resource(),
    };
    let call = Call { kind: &kind, ns, q: &q, headers: &headers };
    if method == Method::GET && name.is_none() {
        let view = match kind.view(ns, &q) {
            Ok(view) => view,
            Err(response) => return *response,
        };
        if super::is_watch(&q) {
            return super::watch::serve(fake, view, &q, &headers).await;
        }
        return super::list::serve(&fake, &view, &q, &headers);
    }
    let mut tx = fake.tx();
    let result = match (&method, name) {
        (&Method::POST, None) if namespaced_path || !kind.namespaced => call.create(&mut tx, &body),
        (&Method::DELETE, None) if kind.verbs.contains(&"deletecollection") => {
            call.delete_options(&body).and_then(|options| call.delete_collection(&mut tx, &options))
        }
        (&Method::GET, Some(name)) => match tx.get(&kind.key(ns, name)) {
            Some(object) if super::wants_table(&headers) => {
                let rv = meta(&object, "resourceVersion").to_owned();
                Ok(axum::Json(table(&kind, &[object], &rv)).into_response())
            }
            Some(object) => Ok(axum::Json(kind.present(object)).into_response()),
            None => Err(Box::new(kind.group_resource().not_found(name))),
        },
        (&Method::PUT, Some(name)) => call.update(&mut tx, name, part, &body),
        (&Method::PATCH, Some(name)) => call.patch(&mut tx, name, part, &body),
        (&Method::DELETE, Some(name)) if part == Part::Main => call
            .delete_options(&body)
            .and_then(|options| call.delete(&mut tx, name, &options))
            .map(|answer| axum::Json(answer).into_response()),
        _ => Err(Box::new(failure(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            Some(json!({})),
        ))),
    };
    drop(tx);
    result.unwrap_or_else(|refusal| *refusal)
}

/// Versions in the order the API server prefers them (`version.CompareKubeAwareVersionStrings`):
/// GA before beta before alpha, higher numbers first, anything else last, alphabetically.
fn version_order(v: &str) -> (u8, i64, i64, String) {
    let parsed = v.strip_prefix('v').and_then(|rest| {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let major: i64 = rest[..digits].parse().ok()?;
        let tail = &rest[digits..];
        let (class, minor) = if tail.is_empty() {
            (0, 0)
        } else if let Some(n) = tail.strip_prefix("beta") {
            (1, n.parse().ok()?)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (2, n.parse().ok()?)
        } else {
            return None;
        };
        Some((class, -major, -minor))
    });
    match parsed {
        Some((class, major, minor)) => (class, major, minor, String::new()),
        None => (3, 0, 0, v.to_owned()),
    }
}

/// The groups the store serves (but the core one), each with its versions, preferred first;
/// built-in groups first, then the CRDs' in name order.
fn groups(kinds: &[Kind]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut custom: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for kind in kinds.iter().filter(|k| !k.group.is_empty()) {
        if kind.custom {
            custom.entry(kind.group.clone()).or_default().insert(kind.version.clone());
        } else if let Some((_, versions)) = out.iter_mut().find(|(g, _)| *g == kind.group) {
            if !versions.contains(&kind.version) {
                versions.push(kind.version.clone());
            }
        } else {
            out.push((kind.group.clone(), vec![kind.version.clone()]));
        }
    }
    out.extend(custom.into_iter().map(|(group, versions)| {
        let mut versions: Vec<String> = versions.into_iter().collect();
        versions.sort_by_key(|v| version_order(v));
        (group, versions)
    }));
    out
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> =
        versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect();
    json!({"name": group, "versions": versions, "preferredVersion": versions.first()})
}

/// `GET /apis`: every group, aggregated (with its resources) where the client asks for it.
pub(super) async fn api_groups(State(fake): St, headers: HeaderMap) -> Response {
    let kinds = fake.tx().kinds();
    if wants_aggregated(&headers) {
        return discovery_list(
            groups(&kinds).iter().map(|(g, versions)| group_discovery(&fake, g, versions)).collect(),
        );
    }
    let groups: Vec<Value> = groups(&kinds).iter().map(|(g, versions)| group_json(g, versions)).collect();
    axum::Json(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})).into_response()
}

/// `GET /apis/{group}`.
fn group_document(fake: &Shared, group: &str) -> Response {
    let kinds = fake.tx().kinds();
    match groups(&kinds).into_iter().find(|(g, _)| g == group) {
        Some((g, versions)) => {
            let mut document = group_json(&g, &versions);
            document["kind"] = json!("APIGroup");
            document["apiVersion"] = json!("v1");
            axum::Json(document).into_response()
        }
        None => (StatusCode::NOT_FOUND, "404 page not found\n").into_response(),
    }
}

/// Pods as discovery shows them (the fake serves them itself, outside the store).
fn pods() -> Kind {
    Kind {
        short_names: names(&["po"]),
        categories: names(&["all"]),
        verbs: &["create", "delete", "get", "list", "patch", "update", "watch"],
        subresources: &[("log", &["get"])],
        ..Kind::base("", "pods", "Pod", true)
    }
}

/// The kinds discovery lists at one group version: the store's, and pods in v1.
fn discovered(fake: &Shared, group: &str, version: &str) -> Vec<Kind> {
    let mut kinds: Vec<Kind> =
        fake.tx().kinds().into_iter().filter(|k| k.group == group && k.version == version).collect();
    if (group, version) == ("", "v1") {
        kinds.push(pods());
    }
    kinds.sort_by(|a, b| a.resource.cmp(&b.resource));
    kinds
}

/// A kind's subresources with their verbs.
fn subresources(kind: &Kind) -> Vec<(&'static str, &'static [&'static str])> {
    let status: Option<(&str, &[&str])> = kind.status.then_some(("status", &["get", "patch", "update"]));
    kind.subresources.iter().copied().chain(status).collect()
}

/// The discovery entries (`APIResource`) of the kinds at one group version, each followed by its
/// subresources, as `/api/v1` and `/apis/{group}/{version}` list them.
pub(super) fn resource_entries(fake: &Shared, group: &str, version: &str) -> Vec<Value> {
    let mut entries = Vec::new();
    for kind in discovered(fake, group, version) {
        let mut entry = json!({
            "name": kind.resource, "singularName": kind.singular, "namespaced": kind.namespaced,
            "kind": kind.kind, "verbs": kind.verbs,
        });
        if !kind.short_names.is_empty() {
            entry["shortNames"] = json!(kind.short_names);
        }
        if !kind.categories.is_empty() {
            entry["categories"] = json!(kind.categories);
        }
        entries.push(entry);
        for (sub, verbs) in subresources(&kind) {
            entries.push(json!({
                "name": format!("{}/{sub}", kind.resource), "singularName": "", "namespaced": kind.namespaced,
                "kind": kind.kind, "verbs": verbs,
            }));
        }
    }
    entries
}

/// The aggregated discovery document kube-rs (`Discovery::run_aggregated`) and kubectl ask for
/// with this Accept (`apidiscovery.k8s.io/v2`), and the Content-Type it comes with.
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether the client takes aggregated discovery (v2; the fake, as a 1.34 API server, serves no
/// v2beta1).
pub(super) fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers.get_all("accept").iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|range| {
        let params: BTreeSet<&str> = range.split(';').map(str::trim).collect();
        ["g=apidiscovery.k8s.io", "v=v2", "as=APIGroupDiscoveryList"].iter().all(|p| params.contains(p))
    })
}

/// One group's `APIGroupDiscovery`, its versions preferred first.
fn group_discovery(fake: &Shared, group: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|version| {
            let resources: Vec<Value> = discovered(fake, group, version)
                .iter()
                .map(|kind| {
                    let response_kind = json!({"group": group, "version": version, "kind": kind.kind});
                    let subresources: Vec<Value> = subresources(kind)
                        .into_iter()
                        .map(|(sub, verbs)| json!({"subresource": sub, "responseKind": response_kind, "verbs": verbs}))
                        .collect();
                    let mut entry = json!({
                        "resource": kind.resource, "responseKind": response_kind,
                        "scope": if kind.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": kind.singular, "verbs": kind.verbs,
                    });
                    for (field, list) in [("shortNames", &kind.short_names), ("categories", &kind.categories)] {
                        if !list.is_empty() {
                            entry[field] = json!(list);
                        }
                    }
                    if !subresources.is_empty() {
                        entry["subresources"] = json!(subresources);
                    }
                    entry
                })
                .collect();
            json!({"version": version, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions})
}

fn discovery_list(items: Vec<Value>) -> Response {
    let body = json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items});
    ([("content-type", AGGREGATED)], body.to_string()).into_response()
}

/// `GET /api` asking for aggregated discovery: the core group.
pub(super) fn aggregated_core(fake: &Shared) -> Response {
    discovery_list(vec![group_discovery(fake, "", &["v1".to_owned()])])
}

/// `GET /apis/{group}/{version}`.
fn resource_list(fake: &Shared, group: &str, version: &str) -> Response {
    let entries = resource_entries(fake, group, version);
    if entries.is_empty() {
        return (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
    }
    axum::Json(json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{group}/{version}"),
        "resources": entries,
    }))
    .into_response()
}

/// `v1/configmaps`, `coordination.k8s.io/v1/leases` -> (group, version, resource).
fn parse_resource(resource: &str) -> (&str, &str, &str) {
    let mut parts = resource.rsplitn(3, '/');
    let plural = parts.next().unwrap_or_default();
    let version = parts.next().unwrap_or_default();
    (parts.next().unwrap_or_default(), version, plural)
}

impl FakeKube {
    /// A stored object as `resource` (`v1/configmaps`, `coordination.k8s.io/v1/leases`,
    /// `example.com/v1/widgets`) shows it; `namespace` is empty for a cluster-scoped one.
    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let (group, version, plural) = parse_resource(resource);
        let tx = self.shared.tx();
        let kind = tx.kind(group, version, plural)?;
        tx.get(&kind.key(namespace, name)).map(|o| kind.present(o))
    }

    /// The stored objects of `resource` (as in [`FakeKube::object`]), in one namespace or all.
    pub fn objects(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        let (group, version, plural) = parse_resource(resource);
        let tx = self.shared.tx();
        let Some(kind) = tx.kind(group, version, plural) else {
            return Vec::new();
        };
        tx.objects_of(&kind, namespace).map(|(_, o)| kind.present(o)).collect()
    }

    /// Creates a namespace (as `kubectl create namespace` would), if it is not there yet.
    pub fn add_namespace(&self, name: &str) {
        add_namespace(&self.shared, name);
    }

    /// Creates or updates an object of `resource` (as in [`FakeKube::object`]) as a client's
    /// create or update would (whatever `metadata.resourceVersion` it carries; the status stays
    /// where the kind has a status subresource). Returns the stored object, or None if there is
    /// no such resource or the object is refused (e.g. invalid, or its namespace is missing).
    pub fn put_object(&self, resource: &str, object: Value) -> Option<Value> {
        let (group, version, plural) = parse_resource(resource);
        let mut tx = self.shared.tx();
        let kind = tx.kind(group, version, plural)?;
        let (ns, name) = (meta(&object, "namespace").to_owned(), meta(&object, "name").to_owned());
        let w = Write { kind: &kind, ns: &ns, name: &name, part: Part::Main, dry_run: false };
        let old = tx.get(&w.key());
        let api_version = kind.api_version();
        let updater = w.updater("e2e-test", &api_version);
        commit(&mut tx, &w, old.as_ref(), object, Some(&updater)).ok().map(|o| kind.present(o))
    }

    /// Deletes an object of `resource` as a DELETE with background propagation would (finalizers
    /// still hold it). False if there was none.
    pub fn delete_object(&self, resource: &str, namespace: &str, name: &str) -> bool {
        let (group, version, plural) = parse_resource(resource);
        let mut tx = self.shared.tx();
        let Some(kind) = tx.kind(group, version, plural) else { return false };
        let key = kind.key(namespace, name);
        let exists = tx.get(&key).is_some();
        tx.delete_now(&key, Policy::Background);
        exists
    }

    /// A controller's write to an object's status subresource (the object as it wants it).
    pub(super) fn write_status(&self, resource: &str, object: Value, manager: &str) {
        let (group, version, plural) = parse_resource(resource);
        let mut tx = self.shared.tx();
        let Some(kind) = tx.kind(group, version, plural) else { return };
        let (ns, name) = (meta(&object, "namespace").to_owned(), meta(&object, "name").to_owned());
        let w = Write { kind: &kind, ns: &ns, name: &name, part: Part::Status, dry_run: false };
        let old = tx.get(&w.key());
        let api_version = kind.api_version();
        let updater = w.updater(manager, &api_version);
        // Only a bug in the fake could make the kind's own validation fail here.
        let _ = commit(&mut tx, &w, old.as_ref(), object, Some(&updater));
    }
}

pub(super) fn add_namespace(fake: &Arc<Shared>, name: &str) {
    let mut tx = fake.tx();
    let Some(kind) = tx.kind("", "v1", "namespaces") else { return };
    let w = Write { kind: &kind, ns: "", name, part: Part::Main, dry_run: false };
    if tx.get(&w.key()).is_none() {
        let updater = w.updater("kube-apiserver", "v1");
        let _ = commit(&mut tx, &w, None, json!({"metadata": {}}), Some(&updater));
    }
}
