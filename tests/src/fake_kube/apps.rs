//! apps/v1 Deployments in the fake: discovery, list/get/watch, server-side apply (and the other
//! patch types), and a deployment controller the test drives ([`FakeKube::observe_deployment`],
//! [`FakeKube::roll_out`]) so a test decides when a rollout progresses.
//!
//! Server-side apply follows the API server (k8s.io/apiserver `handlers/patch.go`,
//! `managedfields`): the patch options are checked first (`fieldManager` required for apply,
//! `force` only for apply), the object is created when missing (201) or the applied fields are
//! merged in (200), the manager's `Apply` entry in `metadata.managedFields` records the fields it
//! applied, fields another manager owns with a different value are conflicts (409) unless
//! `force=true`, fields the manager applied before and no longer applies are removed, status in
//! an apply to the main resource is ignored, and `metadata.generation` goes up when the spec or
//! the annotations change. A field the schema does not declare fails the apply whatever
//! `fieldValidation` says (structured-merge-diff checks apply patches against the schema; see
//! [`super::openapi`]); `fieldValidation=Strict` additionally rejects duplicate keys.
//! Simplifications: lists are replaced as a whole (the real merge merges keyed lists such as
//! containers by name), and defaults are the Deployment's own (not the pod template's).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{FakeKube, Shared, St, merge, status};

/// A refusal: the API server's error response.
type Refusal = Box<Response>;

pub(super) async fn resources() -> impl IntoResponse {
    axum::Json(json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "apps/v1",
        "resources": [
            {"name": "deployments", "singularName": "deployment", "namespaced": true, "kind": "Deployment",
             "verbs": ["delete", "get", "list", "patch", "watch"], "shortNames": ["deploy"],
             "categories": ["all"], "storageVersionHash": "8aSe+NMegvE="},
            {"name": "deployments/status", "singularName": "", "namespaced": true, "kind": "Deployment",
             "verbs": ["get"]},
        ],
    }))
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

fn uid() -> String {
    let b: [u8; 16] = rand::random();
    let h = hex::encode(b);
    format!("{}-{}-4{}-a{}-{}", &h[..8], &h[8..12], &h[13..16], &h[17..20], &h[20..32])
}

fn not_found(name: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("deployments.apps \"{name}\" not found"), "reason": "NotFound",
        "details": {"name": name, "group": "apps", "kind": "deployments"}, "code": 404,
    });
    (StatusCode::NOT_FOUND, [("content-type", "application/json")], body.to_string()).into_response()
}

/// 422 Invalid with its causes, as `errors.NewInvalid` words it.
fn invalid(group: &str, kind: &str, name: &str, causes: &[(&str, &str, &str)]) -> Response {
    let qualified = if group.is_empty() { kind.to_owned() } else { format!("{kind}.{group}") };
    let messages: Vec<String> = causes.iter().map(|(field, _, message)| format!("{field}: {message}")).collect();
    let message = if messages.len() == 1 {
        format!("{qualified} \"{name}\" is invalid: {}", messages[0])
    } else {
        format!("{qualified} \"{name}\" is invalid: [{}]", messages.join(", "))
    };
    let causes: Vec<Value> = causes
        .iter()
        .map(|(field, reason, message)| json!({"reason": reason, "message": message, "field": field}))
        .collect();
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
        "reason": "Invalid", "details": {"name": name, "group": group, "kind": kind, "causes": causes}, "code": 422,
    });
    (StatusCode::UNPROCESSABLE_ENTITY, [("content-type", "application/json")], body.to_string()).into_response()
}

/// `metadata.name=x` / `metadata.namespace=y` field selectors (what the API server supports for
/// every kind); anything else is a 400 as the real one answers.
pub(super) fn field_selector(q: &HashMap<String, String>) -> Result<Vec<(String, String)>, Refusal> {
    let Some(selector) = q.get("fieldSelector").filter(|s| !s.is_empty()) else {
        return Ok(Vec::new());
    };
    selector
        .split(',')
        .map(|term| {
            let (field, value) = term.split_once("==").or_else(|| term.split_once('=')).unwrap_or((term, ""));
            match field {
                "metadata.name" | "metadata.namespace" => Ok((field.to_owned(), value.to_owned())),
                _ => Err(Box::new(status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("Unable to find \"apps/v1, Resource=deployments\" that match label selector \"\", field selector \"{selector}\": field label not supported: {field}"),
                ))),
            }
        })
        .collect()
}

pub(super) fn selects(selector: &[(String, String)], object: &Value) -> bool {
    selector.iter().all(|(field, value)| {
        let actual = match field.as_str() {
            "metadata.name" => &object["metadata"]["name"],
            _ => &object["metadata"]["namespace"],
        };
        actual.as_str() == Some(value.as_str())
    })
}

/// A `meta.k8s.io/v1` Table of deployments, with the columns `kubectl get deployments` shows.
pub(super) fn table(deployments: &[Value], resource_version: &str) -> Value {
    let columns = [
        ("Name", "string", "name"),
        ("Ready", "string", ""),
        ("Up-to-date", "string", ""),
        ("Available", "string", ""),
        ("Age", "string", ""),
    ];
    let n = |v: &Value| v.as_i64().unwrap_or(0);
    let cells = |d: &Value| {
        let s = &d["status"];
        json!([
            d["metadata"]["name"],
            format!("{}/{}", n(&s["readyReplicas"]), n(&d["spec"]["replicas"])),
            n(&s["updatedReplicas"]),
            n(&s["availableReplicas"]),
            "0s",
        ])
    };
    super::table(&columns, deployments, cells, resource_version)
}

fn list(fake: &Shared, namespace: Option<&str>, selector: &[(String, String)], headers: &HeaderMap) -> Response {
    let inner = fake.lock();
    let items: Vec<Value> = inner
        .deployments
        .iter()
        .filter(|((ns, _), d)| namespace.is_none_or(|n| n == ns) && selects(selector, d))
        .map(|(_, d)| d.clone())
        .collect();
    let rv = inner.resource_version.to_string();
    drop(inner);
    if super::wants_table(headers) {
        return axum::Json(table(&items, &rv)).into_response();
    }
    axum::Json(json!({
        "apiVersion": "apps/v1", "kind": "DeploymentList", "metadata": {"resourceVersion": rv}, "items": items,
    }))
    .into_response()
}

fn list_or_watch(
    fake: Arc<Shared>,
    namespace: Option<String>,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    let selector = match field_selector(q) {
        Ok(s) => s,
        Err(response) => return *response,
    };
    if super::is_watch(q) {
        let filter = super::WatchFilter { kind: "Deployment", namespace, selector };
        return super::watch(fake, filter, super::wants_table(headers), super::since(q));
    }
    list(&fake, namespace.as_deref(), &selector, headers)
}

pub(super) async fn list_all(
    State(fake): St,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    list_or_watch(fake, None, &q, &headers)
}

pub(super) async fn list_namespaced(
    State(fake): St,
    headers: HeaderMap,
    Path(ns): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    list_or_watch(fake, Some(ns), &q, &headers)
}

pub(super) async fn get(State(fake): St, headers: HeaderMap, Path((ns, name)): Path<(String, String)>) -> Response {
    let deployment = fake.lock().deployments.get(&(ns, name.clone())).cloned();
    match deployment {
        Some(d) if super::wants_table(&headers) => {
            let rv = d["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_owned();
            axum::Json(table(&[d], &rv)).into_response()
        }
        Some(d) => axum::Json(d).into_response(),
        None => not_found(&name),
    }
}

pub(super) async fn get_status(State(fake): St, Path((ns, name)): Path<(String, String)>) -> Response {
    let deployment = fake.lock().deployments.get(&(ns, name.clone())).cloned();
    match deployment {
        Some(d) => axum::Json(d).into_response(),
        None => not_found(&name),
    }
}

pub(super) async fn delete(State(fake): St, Path((ns, name)): Path<(String, String)>) -> Response {
    let removed = {
        let mut inner = fake.lock();
        inner.resource_version += 1;
        let rv = inner.resource_version;
        inner.deployments.remove(&(ns, name.clone())).map(|mut d| {
            d["metadata"]["resourceVersion"] = json!(rv.to_string());
            d
        })
    };
    match removed {
        Some(d) => {
            fake.publish(json!({"type": "DELETED", "object": d}));
            axum::Json(json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": "apps", "kind": "deployments", "uid": d["metadata"]["uid"]},
            }))
            .into_response()
        }
        None => not_found(&name),
    }
}

/// The patch types the API server takes for a built-in kind, in its order.
const PATCH_TYPES: [&str; 4] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

pub(super) async fn patch(
    State(fake): St,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    super::record_body(&fake, "PATCH", format!("/apis/apps/v1/namespaces/{ns}/deployments/{name}"), &headers, &body);
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let content_type = content_type.split(';').next().unwrap_or_default().trim().to_owned();
    if !PATCH_TYPES.contains(&content_type.as_str()) {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            &format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                PATCH_TYPES.join(", ")
            ),
        );
    }
    let apply = content_type == "application/apply-patch+yaml";
    // validation.ValidatePatchOptions
    let manager = q.get("fieldManager").cloned().unwrap_or_default();
    let mut causes = Vec::new();
    if apply && manager.is_empty() {
        causes.push(("fieldManager", "FieldValueRequired", "Required value: is required for apply patch"));
    }
    if !apply && q.contains_key("force") {
        causes.push(("force", "FieldValueForbidden", "Forbidden: may not be specified for non-apply patch"));
    }
    let validation = q.get("fieldValidation").cloned().unwrap_or_default();
    let unsupported_validation;
    if !["", "Ignore", "Warn", "Strict"].contains(&validation.as_str()) {
        unsupported_validation =
            format!("Unsupported value: \"{validation}\": supported values: \"\", \"Ignore\", \"Warn\", \"Strict\"");
        causes.push(("fieldValidation", "FieldValueNotSupported", &unsupported_validation));
    }
    if !causes.is_empty() {
        return invalid("meta.k8s.io", "PatchOptions", "", &causes);
    }
    let force = q.get("force").is_some_and(|f| f == "true" || f == "1");
    let dry_run = q.get("dryRun").is_some_and(|d| d == "All");
    let existing = fake.lock().deployments.get(&(ns.clone(), name.clone())).cloned();
    let result = if apply {
        server_side_apply(existing, &ns, &name, &body, &manager, force, &validation)
    } else {
        let Some(existing) = existing else {
            return not_found(&name);
        };
        other_patch(existing, &content_type, &body, &name, &manager, &headers)
    };
    let (object, created) = match result {
        Ok(r) => r,
        Err(response) => return *response,
    };
    let stored = if dry_run { object } else { store(&fake, &ns, &name, object, created) };
    let code = if created { StatusCode::CREATED } else { StatusCode::OK };
    (code, axum::Json(stored)).into_response()
}

/// Writes the object (a new resourceVersion) and tells the watchers, unless nothing changed.
fn store(fake: &Shared, ns: &str, name: &str, mut object: Value, created: bool) -> Value {
    let mut inner = fake.lock();
    let key = (ns.to_owned(), name.to_owned());
    if let Some(old) = inner.deployments.get(&key)
        && *old == object
    {
        return object; // a no-op write is not a write
    }
    inner.resource_version += 1;
    object["metadata"]["resourceVersion"] = json!(inner.resource_version.to_string());
    inner.deployments.insert(key, object.clone());
    drop(inner);
    let event = if created { "ADDED" } else { "MODIFIED" };
    fake.publish(json!({"type": event, "object": object}));
    object
}

fn parse_body(body: &Bytes, validation: &str) -> Result<Value, Refusal> {
    // The API server decodes apply patches as YAML (JSON is YAML); with Strict, a key given twice
    // fails the request ("error strict decoding YAML"), otherwise the last one wins.
    let strict: Result<Value, _> = serde_norway::from_slice(body);
    if let Err(e) = &strict
        && validation == "Strict"
        && e.to_string().contains("duplicate")
    {
        return Err(Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("error strict decoding YAML: {e}"),
        )));
    }
    let lenient = serde_json::from_slice::<Value>(body).ok().or_else(|| strict.ok());
    match lenient {
        Some(v) if v.is_object() => Ok(v),
        Some(_) => Err(Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "error decoding YAML: the patch is not an object",
        ))),
        None => {
            Err(Box::new(status(StatusCode::BAD_REQUEST, "BadRequest", "error decoding YAML: the patch is not YAML")))
        }
    }
}

/// Fields the field manager never records (structured-merge-diff's stripped meta fields).
fn strip_meta(fields: &mut Value) {
    if let Some(f) = fields.as_object_mut() {
        f.remove("f:apiVersion");
        f.remove("f:kind");
        if let Some(meta) = f.get_mut("f:metadata").and_then(Value::as_object_mut) {
            for k in [
                "f:name",
                "f:namespace",
                "f:creationTimestamp",
                "f:selfLink",
                "f:uid",
                "f:resourceVersion",
                "f:generation",
                "f:managedFields",
            ] {
                meta.remove(k);
            }
            if meta.is_empty() {
                f.remove("f:metadata");
            }
        }
    }
}

/// The `fieldsV1` of an object: every field it sets (`f:name`), list items with a name as
/// `k:{"name":...}` with `.` for the item itself, other lists as one field.
fn fields_v1(value: &Value) -> Value {
    match value {
        Value::Object(fields) if !fields.is_empty() => {
            Value::Object(fields.iter().map(|(k, v)| (format!("f:{k}"), fields_v1(v))).collect())
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(|i| i["name"].is_string()) => Value::Object(
            items
                .iter()
                .map(|item| {
                    let mut inner = fields_v1(item);
                    inner["."] = json!({});
                    (format!("k:{}", json!({"name": item["name"]})), inner)
                })
                .collect(),
        ),
        _ => json!({}),
    }
}

/// The leaf paths of a `fieldsV1` tree.
fn leaves(fields: &Value) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    fn walk(node: &Value, path: &mut Vec<String>, out: &mut BTreeSet<Vec<String>>) {
        match node.as_object() {
            Some(children) if !children.is_empty() => {
                for (k, v) in children {
                    path.push(k.clone());
                    walk(v, path, out);
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone());
            }
        }
    }
    walk(fields, &mut Vec::new(), &mut out);
    out
}

fn from_leaves(paths: &BTreeSet<Vec<String>>) -> Value {
    let mut root = json!({});
    for path in paths {
        let mut node = &mut root;
        for seg in path {
            if !node.is_object() {
                *node = json!({});
            }
            node = &mut node[seg.as_str()];
            if node.is_null() {
                *node = json!({});
            }
        }
    }
    root
}

/// The value at a `fieldsV1` path, if the object has it.
fn at<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut node = object;
    for seg in path {
        node = if let Some(field) = seg.strip_prefix("f:") {
            node.get(field)?
        } else if let Some(key) = seg.strip_prefix("k:") {
            let key: Value = serde_json::from_str(key).ok()?;
            node.as_array()?.iter().find(|item| item["name"] == key["name"])?
        } else {
            node // "."
        };
    }
    Some(node)
}

fn remove_at(object: &mut Value, path: &[String]) {
    let Some((last, parent_path)) = path.split_last() else { return };
    let (last, parent_path) = if last == "." {
        match parent_path.split_last() {
            Some((item, rest)) => (item, rest),
            None => return,
        }
    } else {
        (last, parent_path)
    };
    let mut node = object;
    for seg in parent_path {
        let next = if let Some(field) = seg.strip_prefix("f:") {
            node.get_mut(field)
        } else if let Some(key) = seg.strip_prefix("k:") {
            let key: Value = serde_json::from_str(key).unwrap_or_default();
            node.as_array_mut().and_then(|items| items.iter_mut().find(|item| item["name"] == key["name"]))
        } else {
            Some(node)
        };
        let Some(next) = next else { return };
        node = next;
    }
    if let Some(field) = last.strip_prefix("f:") {
        if let Some(o) = node.as_object_mut() {
            o.remove(field);
        }
    } else if let Some(key) = last.strip_prefix("k:") {
        let key: Value = serde_json::from_str(key).unwrap_or_default();
        if let Some(items) = node.as_array_mut() {
            items.retain(|item| item["name"] != key["name"]);
        }
    }
}

/// A path as structured-merge-diff prints it: `.spec.template.spec.containers[name="main"].image`.
fn path_string(path: &[String]) -> String {
    path.iter()
        .filter(|seg| *seg != ".")
        .map(|seg| {
            if let Some(field) = seg.strip_prefix("f:") {
                format!(".{field}")
            } else if let Some(key) = seg.strip_prefix("k:") {
                let key: Value = serde_json::from_str(key).unwrap_or_default();
                format!("[name={}]", key["name"])
            } else {
                String::new()
            }
        })
        .collect()
}

/// How the API server names a manager in a conflict (fieldmanager `printManager`).
fn print_manager(entry: &Value) -> String {
    let mut out = format!("{:?}", entry["manager"].as_str().unwrap_or_default());
    if let Some(sub) = entry["subresource"].as_str().filter(|s| !s.is_empty()) {
        out = format!("{out} with subresource {sub:?}");
    }
    if entry["operation"] == "Update" {
        out = format!("{out} using {}", entry["apiVersion"].as_str().unwrap_or_default());
        if let Some(time) = entry["time"].as_str() {
            out = format!("{out} at {time}");
        }
    }
    out
}

fn conflict(conflicts: &[(String, String)]) -> Response {
    let message = if let [(manager, path)] = conflicts {
        format!("Apply failed with 1 conflict: conflict with {manager}: {path}")
    } else {
        let mut managers: Vec<&String> = conflicts.iter().map(|(m, _)| m).collect();
        managers.sort();
        managers.dedup();
        let mut lines = Vec::new();
        for manager in managers {
            lines.push(format!("conflicts with {manager}:"));
            lines.extend(conflicts.iter().filter(|(m, _)| m == manager).map(|(_, p)| format!("- {p}")));
        }
        format!("Apply failed with {} conflicts: {}", conflicts.len(), lines.join("\n"))
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(manager, path)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with {manager}"), "field": path}))
        .collect();
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
        "reason": "Conflict", "details": {"causes": causes}, "code": 409,
    });
    (StatusCode::CONFLICT, [("content-type", "application/json")], body.to_string()).into_response()
}

/// The Deployment's defaults (k8s.io/kubernetes pkg/apis/apps/v1 defaults.go).
fn default_spec(object: &mut Value) {
    let spec = &mut object["spec"];
    if !spec.is_object() {
        *spec = json!({});
    }
    let mut default = |field: &str, value: Value| {
        if spec.get(field).is_none_or(Value::is_null) {
            spec[field] = value;
        }
    };
    default("replicas", json!(1));
    default("revisionHistoryLimit", json!(10));
    default("progressDeadlineSeconds", json!(600));
    default("strategy", json!({"type": "RollingUpdate"}));
    if spec["strategy"]["type"] == "RollingUpdate" && spec["strategy"].get("rollingUpdate").is_none() {
        spec["strategy"]["rollingUpdate"] = json!({"maxUnavailable": "25%", "maxSurge": "25%"});
    }
}

fn validate(object: &Value, name: &str) -> Result<(), Refusal> {
    let spec = &object["spec"];
    let mut causes: Vec<(&str, &str, String)> = Vec::new();
    let selector = &spec["selector"]["matchLabels"];
    if spec["selector"].is_null() {
        causes.push(("spec.selector", "FieldValueRequired", "Required value".into()));
    } else if let Some(labels) = selector.as_object() {
        let template = &spec["template"]["metadata"]["labels"];
        if labels.iter().any(|(k, v)| template[k] != *v) {
            causes.push((
                "spec.template.metadata.labels",
                "FieldValueInvalid",
                format!("Invalid value: {template}: `selector` does not match template `labels`"),
            ));
        }
    }
    if spec["template"]["spec"]["containers"].as_array().is_none_or(Vec::is_empty) {
        causes.push(("spec.template.spec.containers", "FieldValueRequired", "Required value".into()));
    }
    if causes.is_empty() {
        return Ok(());
    }
    let causes: Vec<(&str, &str, &str)> = causes.iter().map(|(f, r, m)| (*f, *r, m.as_str())).collect();
    Err(Box::new(invalid("apps", "Deployment", name, &causes)))
}

/// Server-side apply of `body` by `manager` onto the live object (if any): (object, created).
fn server_side_apply(
    live: Option<Value>,
    ns: &str,
    name: &str,
    body: &Bytes,
    manager: &str,
    force: bool,
    validation: &str,
) -> Result<(Value, bool), Refusal> {
    let mut applied = parse_body(body, validation)?;
    if let Some(body_name) = applied["metadata"]["name"].as_str()
        && body_name != name
    {
        return Err(Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("the name of the object ({body_name}) does not match the name on the URL ({name})"),
        )));
    }
    if let Some(body_ns) = applied["metadata"]["namespace"].as_str()
        && body_ns != ns
    {
        return Err(Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
        )));
    }
    if let Some(field) = super::openapi::undeclared_field("io.k8s.api.apps.v1.Deployment", &applied) {
        // A plain error in the API server, so a 500 Status without a reason (kubernetes#122480).
        let body = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 500,
            "message": format!("failed to create typed patch object ({ns}/{name}; apps/v1, Kind=Deployment): {field}: field not declared in schema"),
        });
        return Err(Box::new(
            (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "application/json")], body.to_string())
                .into_response(),
        ));
    }
    // Status is reset on the main resource: an apply there neither sets nor owns it.
    if let Some(o) = applied.as_object_mut() {
        o.remove("status");
    }
    let created = live.is_none();
    let mut object = live.clone().unwrap_or_else(|| {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "uid": uid(), "generation": 0, "creationTimestamp": now()},
            "spec": {}, "status": {},
        })
    });
    let mut managed: Vec<Value> = object["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
    let is_mine = |e: &Value| e["manager"] == manager && e["operation"] == "Apply" && e["subresource"].is_null();
    let mut mine_now = fields_v1(&applied);
    strip_meta(&mut mine_now);
    let new_set = leaves(&mine_now);
    let old_set = managed.iter().find(|e| is_mine(e)).map(|e| leaves(&e["fieldsV1"])).unwrap_or_default();

    // Conflicts: a field another manager owns, applied with a different value.
    let mut conflicts = Vec::new();
    for entry in managed.iter_mut().filter(|e| !is_mine(e)) {
        let theirs = leaves(&entry["fieldsV1"]);
        let contested: Vec<&Vec<String>> = new_set
            .iter()
            .filter(|p| p.last().is_some_and(|l| l != ".") && theirs.contains(*p) && at(&object, p) != at(&applied, p))
            .collect();
        if contested.is_empty() {
            continue;
        }
        if force {
            let kept: BTreeSet<Vec<String>> = theirs.iter().filter(|p| !contested.contains(p)).cloned().collect();
            entry["fieldsV1"] = from_leaves(&kept);
        } else {
            conflicts.extend(contested.iter().map(|p| (print_manager(entry), path_string(p))));
        }
    }
    if !conflicts.is_empty() {
        return Err(Box::new(conflict(&conflicts)));
    }
    managed.retain(|e| e["fieldsV1"].as_object().is_some_and(|f| !f.is_empty()));

    let before = object.clone();
    merge(&mut object, &applied);
    // Fields this manager applied before and applies no more go, unless someone else owns them.
    let others: BTreeSet<Vec<String>> =
        managed.iter().filter(|e| !is_mine(e)).flat_map(|e| leaves(&e["fieldsV1"])).collect();
    for gone in old_set.difference(&new_set) {
        if !others.contains(gone) {
            remove_at(&mut object, gone);
        }
    }
    default_spec(&mut object);
    validate(&object, name)?;
    object["apiVersion"] = json!("apps/v1");
    object["kind"] = json!("Deployment");
    let meta = &mut object["metadata"];
    meta["name"] = json!(name);
    meta["namespace"] = json!(ns);
    if before["spec"] != object["spec"] || before["metadata"]["annotations"] != object["metadata"]["annotations"] {
        let generation = before["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        object["metadata"]["generation"] = json!(generation);
    }
    // The manager's entry, its time moved only when what it owns changed.
    match managed.iter_mut().find(|e| is_mine(e)) {
        Some(entry) if old_set == new_set => {
            entry["fieldsV1"] = mine_now;
        }
        Some(entry) => {
            entry["fieldsV1"] = mine_now;
            entry["time"] = json!(now());
        }
        None => managed.push(json!({
            "manager": manager, "operation": "Apply", "apiVersion": "apps/v1", "time": now(),
            "fieldsType": "FieldsV1", "fieldsV1": mine_now,
        })),
    }
    object["metadata"]["managedFields"] = json!(managed);
    Ok((object, created))
}

/// merge-patch, strategic-merge-patch (as a merge: lists replaced) and JSON patch, recorded as an
/// `Update` by the manager (`fieldManager`, else the User-Agent's program name).
fn other_patch(
    live: Value,
    content_type: &str,
    body: &Bytes,
    name: &str,
    manager: &str,
    headers: &HeaderMap,
) -> Result<(Value, bool), Refusal> {
    let Ok(patch) = serde_json::from_slice::<Value>(body) else {
        return Err(Box::new(status(StatusCode::BAD_REQUEST, "BadRequest", "error decoding patch: invalid JSON")));
    };
    let mut object = live.clone();
    if content_type == "application/json-patch+json" {
        json_patch(&mut object, &patch)?;
    } else {
        if let Some(o) = object.as_object_mut() {
            o.remove("status");
        }
        merge(&mut object, &patch);
    }
    object["status"] = live["status"].clone();
    object["metadata"]["name"] = json!(name);
    object["metadata"]["uid"] = live["metadata"]["uid"].clone();
    object["metadata"]["managedFields"] = live["metadata"]["managedFields"].clone();
    default_spec(&mut object);
    validate(&object, name)?;
    if live["spec"] != object["spec"] || live["metadata"]["annotations"] != object["metadata"]["annotations"] {
        let generation = live["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        object["metadata"]["generation"] = json!(generation);
    }
    let manager = if manager.is_empty() {
        let agent = headers.get("user-agent").and_then(|v| v.to_str().ok()).unwrap_or_default();
        agent.split('/').next().unwrap_or_default().to_owned()
    } else {
        manager.to_owned()
    };
    let mut changed = object.clone();
    for k in ["metadata", "status"] {
        if let Some(o) = changed.as_object_mut() {
            o.remove(k);
        }
    }
    let mut fields = fields_v1(&changed);
    strip_meta(&mut fields);
    let mut managed: Vec<Value> = live["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
    managed.retain(|e| !(e["manager"] == manager.as_str() && e["operation"] == "Update" && e["subresource"].is_null()));
    managed.push(json!({
        "manager": manager, "operation": "Update", "apiVersion": "apps/v1", "time": now(),
        "fieldsType": "FieldsV1", "fieldsV1": fields,
    }));
    object["metadata"]["managedFields"] = json!(managed);
    Ok((object, false))
}

/// RFC 6902 `add`, `remove`, `replace` and `test`.
fn json_patch(object: &mut Value, patch: &Value) -> Result<(), Refusal> {
    let bad = |m: String| status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &m);
    let Some(ops) = patch.as_array() else {
        return Err(Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch",
        )));
    };
    for op in ops {
        let path = op["path"].as_str().unwrap_or_default();
        let (parent, last) = path.rsplit_once('/').unwrap_or(("", path));
        let last = last.replace("~1", "/").replace("~0", "~");
        match op["op"].as_str().unwrap_or_default() {
            "test" => {
                if object.pointer(path) != Some(&op["value"]) {
                    return Err(Box::new(bad(format!(
                        "the server rejected our request due to an error in our request: testing value {path} failed"
                    ))));
                }
            }
            "remove" => {
                let removed = match object.pointer_mut(parent) {
                    Some(Value::Object(o)) => o.remove(&last).is_some(),
                    Some(Value::Array(a)) => {
                        last.parse::<usize>().ok().filter(|i| *i < a.len()).map(|i| a.remove(i)).is_some()
                    }
                    _ => false,
                };
                if !removed {
                    return Err(Box::new(bad(format!(
                        "the server rejected our request due to an error in our request: remove operation does not apply: doc is missing path: \"{path}\""
                    ))));
                }
            }
            action @ ("add" | "replace") => {
                let value = op["value"].clone();
                let done = match object.pointer_mut(parent) {
                    Some(Value::Object(o)) if action == "add" || o.contains_key(&last) => {
                        o.insert(last.clone(), value);
                        true
                    }
                    Some(Value::Array(a)) if last == "-" && action == "add" => {
                        a.push(value);
                        true
                    }
                    Some(Value::Array(a)) => match last.parse::<usize>() {
                        Ok(i) if action == "add" && i <= a.len() => {
                            a.insert(i, value);
                            true
                        }
                        Ok(i) if i < a.len() => {
                            a[i] = value;
                            true
                        }
                        _ => false,
                    },
                    _ => false,
                };
                if !done {
                    return Err(Box::new(bad(format!(
                        "the server rejected our request due to an error in our request: {action} operation does not apply: doc is missing path: \"{path}\""
                    ))));
                }
            }
            other => return Err(Box::new(bad(format!("Unexpected kind: {other}")))),
        }
    }
    Ok(())
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, at: &str) -> Value {
    json!({"type": type_, "status": status, "lastUpdateTime": at, "lastTransitionTime": at, "reason": reason, "message": message})
}

impl FakeKube {
    /// The stored Deployment.
    pub fn deployment(&self, namespace: &str, name: &str) -> Option<Value> {
        self.lock().deployments.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    /// The deployment controller sees the current spec (`status.observedGeneration`) and starts
    /// the rollout: a new ReplicaSet with none of its replicas updated yet.
    pub fn observe_deployment(&self, namespace: &str, name: &str) {
        self.update_deployment_status(namespace, name, |deployment, at| {
            let spec = &deployment["spec"];
            let old = &deployment["status"];
            let ready = old["readyReplicas"].as_i64().unwrap_or(0);
            let mut status = json!({
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": old["replicas"].as_i64().unwrap_or(0),
                "updatedReplicas": 0,
                "readyReplicas": ready,
                "availableReplicas": old["availableReplicas"].as_i64().unwrap_or(0),
                "unavailableReplicas": spec["replicas"].as_i64().unwrap_or(1) - ready,
                "conditions": [
                    condition("Progressing", "True", "ReplicaSetUpdated", &format!("ReplicaSet \"{name}-{}\" is progressing.", template_hash(spec)), at),
                    if ready > 0 {
                        condition("Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.", at)
                    } else {
                        condition("Available", "False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.", at)
                    },
                ],
            });
            if status["unavailableReplicas"].as_i64().unwrap_or(0) <= 0 {
                status.as_object_mut().map(|s| s.remove("unavailableReplicas"));
            }
            status
        });
    }

    /// The deployment controller finishes the rollout: every replica updated, ready and
    /// available, conditions as the real controller leaves them.
    pub fn roll_out(&self, namespace: &str, name: &str) {
        self.update_deployment_status(namespace, name, |deployment, at| {
            let replicas = deployment["spec"]["replicas"].as_i64().unwrap_or(1);
            json!({
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": replicas,
                "availableReplicas": replicas,
                "conditions": [
                    condition("Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.", at),
                    condition("Progressing", "True", "NewReplicaSetAvailable", &format!("ReplicaSet \"{name}-{}\" has successfully progressed.", template_hash(&deployment["spec"])), at),
                ],
            })
        });
    }

    /// A status write by kube-controller-manager through `deployments/status` (its own
    /// managedFields entry; the revision annotation it keeps).
    fn update_deployment_status(&self, namespace: &str, name: &str, status: impl FnOnce(&Value, &str) -> Value) {
        let Some(mut deployment) = self.deployment(namespace, name) else {
            panic!("no deployment {namespace}/{name} in the fake");
        };
        let at = now();
        deployment["status"] = status(&deployment, &at);
        // A new pod template is a new ReplicaSet, and a new revision.
        let revision =
            deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"].as_str().unwrap_or("0");
        let mut revision = revision.parse::<u64>().unwrap_or(0);
        let template = template_hash(&deployment["spec"]);
        let key = (namespace.to_owned(), name.to_owned());
        if self.lock().deployment_templates.insert(key, template.clone()).as_ref() != Some(&template) {
            revision += 1;
        }
        deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!(revision.to_string());
        let mut fields = fields_v1(
            &json!({"status": deployment["status"], "metadata": {"annotations": {"deployment.kubernetes.io/revision": ""}}}),
        );
        strip_meta(&mut fields);
        let managed = deployment["metadata"]["managedFields"].as_array_mut();
        if let Some(managed) = managed {
            managed.retain(|e| !(e["manager"] == "kube-controller-manager" && e["subresource"] == "status"));
            managed.push(json!({
                "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1", "time": at,
                "fieldsType": "FieldsV1", "fieldsV1": fields, "subresource": "status",
            }));
        }
        store(&self.shared, namespace, name, deployment, false);
    }
}

/// A stable stand-in for the pod-template-hash.
fn template_hash(spec: &Value) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(spec["template"].to_string().as_bytes());
    hex::encode(&digest[..5])
}
