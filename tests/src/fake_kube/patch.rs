//! What the fake's kinds share for writes (Deployments in `apps`, everything in `store`): the
//! PATCH request's options, server-side apply with the `metadata.managedFields` it keeps, the
//! managedFields entry of other writes, and the other patch types.
//!
//! Server-side apply follows the API server (k8s.io/apiserver `handlers/patch.go`,
//! `managedfields`): the patch options are checked first (`fieldManager` required for apply,
//! `force` only for apply), the applied fields are merged into the live object (or the new
//! object's skeleton), the manager's `Apply` entry in `metadata.managedFields` records the fields
//! it applied, fields another manager owns with a different value are conflicts (409) unless
//! `force=true` (then the other manager loses them), and fields the manager applied before and no
//! longer applies are removed unless another manager owns them. Other writes (create, update,
//! merge and JSON patches) give their manager (`fieldManager`, else the User-Agent's program name)
//! an `Update` entry with the fields they changed, which other managers lose.
//! Simplifications: lists are replaced as a whole (the real merge merges keyed lists such as
//! containers by name), and strategic merge patch is a JSON merge patch (the same for maps; the
//! kinds' keyed lists are replaced instead of merged).

use std::collections::{BTreeSet, HashMap};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::errors::{failure, invalid};
use super::merge;

/// A refusal: the API server's error response.
pub(super) type Refusal = Box<Response>;

fn bad_request(message: &str) -> Refusal {
    Box::new(failure(StatusCode::BAD_REQUEST, "BadRequest", message, None))
}

pub(super) fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

pub(super) fn uid() -> String {
    let b: [u8; 16] = rand::random();
    let h = hex::encode(b);
    format!("{}-{}-4{}-a{}-{}", &h[..8], &h[8..12], &h[13..16], &h[17..20], &h[20..32])
}

pub(super) const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";

/// The patch types the API server takes for a built-in kind, in its order.
pub(super) const BUILT_IN_PATCH_TYPES: [&str; 4] = [JSON_PATCH, MERGE, STRATEGIC, APPLY];
/// A custom resource's: no strategic merge patch (it needs the Go type's merge keys).
pub(super) const CUSTOM_PATCH_TYPES: [&str; 3] = [JSON_PATCH, MERGE, APPLY];

/// A PATCH request's type and options, checked as the API server checks them.
pub(super) struct PatchRequest {
    pub content_type: String,
    pub manager: String,
    pub force: bool,
    pub dry_run: bool,
    pub validation: String,
}

impl PatchRequest {
    /// The content type (415 unless `accepted`), then `validation.ValidatePatchOptions` (422).
    pub(super) fn read(q: &HashMap<String, String>, headers: &HeaderMap, accepted: &[&str]) -> Result<Self, Refusal> {
        let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let content_type = content_type.split(';').next().unwrap_or_default().trim().to_owned();
        if !accepted.contains(&content_type.as_str()) {
            return Err(Box::new(failure(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                &format!(
                    "the body of the request was in an unknown format - accepted media types include: {}",
                    accepted.join(", ")
                ),
                None,
            )));
        }
        let apply = content_type == APPLY;
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
            unsupported_validation = format!(
                "Unsupported value: \"{validation}\": supported values: \"\", \"Ignore\", \"Warn\", \"Strict\""
            );
            causes.push(("fieldValidation", "FieldValueNotSupported", &unsupported_validation));
        }
        if !causes.is_empty() {
            return Err(Box::new(invalid("meta.k8s.io", "PatchOptions", "", &causes)));
        }
        Ok(Self {
            content_type,
            manager,
            force: q.get("force").is_some_and(|f| f == "true" || f == "1"),
            dry_run: dry_run(q),
            validation,
        })
    }

    pub(super) fn is_apply(&self) -> bool {
        self.content_type == APPLY
    }

    /// The live object with a merge, strategic merge or JSON patch applied.
    pub(super) fn patched(&self, live: &Value, body: &Bytes) -> Result<Value, Refusal> {
        let Ok(patch) = serde_json::from_slice::<Value>(body) else {
            return Err(bad_request("error decoding patch: invalid JSON"));
        };
        let mut object = live.clone();
        if self.content_type == JSON_PATCH {
            json_patch(&mut object, &patch)?;
        } else {
            merge(&mut object, &patch);
        }
        Ok(object)
    }
}

/// `dryRun=All` in the query.
pub(super) fn dry_run(q: &HashMap<String, String>) -> bool {
    q.get("dryRun").is_some_and(|d| d == "All")
}

/// The manager of a non-apply write: `fieldManager`, else the User-Agent's program name (the
/// API server's `prefixFromUserAgent`).
pub(super) fn update_manager(q: &HashMap<String, String>, headers: &HeaderMap) -> String {
    match q.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(manager) => manager.clone(),
        None => {
            let agent = headers.get("user-agent").and_then(|v| v.to_str().ok()).unwrap_or_default();
            agent.split('/').next().unwrap_or_default().to_owned()
        }
    }
}

/// An apply patch's body: YAML (JSON is YAML); with Strict, a key given twice fails the request
/// ("error strict decoding YAML"), otherwise the last one wins.
pub(super) fn parse_apply(body: &Bytes, validation: &str) -> Result<Value, Refusal> {
    let strict: Result<Value, _> = serde_norway::from_slice(body);
    if let Err(e) = &strict
        && validation == "Strict"
        && e.to_string().contains("duplicate")
    {
        return Err(bad_request(&format!("error strict decoding YAML: {e}")));
    }
    let lenient = serde_json::from_slice::<Value>(body).ok().or_else(|| strict.ok());
    match lenient {
        Some(v) if v.is_object() => Ok(v),
        Some(_) => Err(bad_request("error decoding YAML: the patch is not an object")),
        None => Err(bad_request("error decoding YAML: the patch is not YAML")),
    }
}

/// Server-side apply's schema check: a field the schema does not declare fails the apply whatever
/// `fieldValidation` says (structured-merge-diff checks apply patches against the schema; see
/// [`super::openapi`]). A plain error in the API server, so a 500 Status without a reason
/// (kubernetes#122480).
pub(super) fn check_schema(schema: &str, gvk: &str, ns: &str, name: &str, applied: &Value) -> Result<(), Refusal> {
    let Some(field) = super::openapi::undeclared_field(schema, applied) else {
        return Ok(());
    };
    let object = if ns.is_empty() { name.to_owned() } else { format!("{ns}/{name}") };
    Err(Box::new(failure(
        StatusCode::INTERNAL_SERVER_ERROR,
        "",
        &format!("failed to create typed patch object ({object}; {gvk}): {field}: field not declared in schema"),
        None,
    )))
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
                "f:deletionTimestamp",
                "f:deletionGracePeriodSeconds",
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
/// `k:{"name":...}` with `.` for the item itself, other lists as one field; meta fields the
/// manager never owns left out.
fn fields_v1(value: &Value) -> Value {
    fn walk(value: &Value) -> Value {
        match value {
            Value::Object(fields) if !fields.is_empty() => {
                Value::Object(fields.iter().map(|(k, v)| (format!("f:{k}"), walk(v))).collect())
            }
            Value::Array(items) if !items.is_empty() && items.iter().all(|i| i["name"].is_string()) => Value::Object(
                items
                    .iter()
                    .map(|item| {
                        let mut inner = walk(item);
                        inner["."] = json!({});
                        (format!("k:{}", json!({"name": item["name"]})), inner)
                    })
                    .collect(),
            ),
            _ => json!({}),
        }
    }
    let mut fields = walk(value);
    strip_meta(&mut fields);
    fields
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
    failure(StatusCode::CONFLICT, "Conflict", &message, Some(json!({"causes": causes})))
}

fn managed_fields(object: &Value) -> Vec<Value> {
    object["metadata"]["managedFields"].as_array().cloned().unwrap_or_default()
}

/// Server-side apply of `applied` (already checked; status left out where a subresource owns
/// it) by `manager` onto `object`, the live object or the new object's skeleton: conflicts, the
/// merge, the fields the manager no longer applies, its `Apply` entry (`api_version`: the
/// request's).
pub(super) fn apply(
    object: &mut Value,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
) -> Result<(), Refusal> {
    let mut managed = managed_fields(object);
    let is_mine = |e: &Value| e["manager"] == manager && e["operation"] == "Apply" && e["subresource"].is_null();
    let mine_now = fields_v1(applied);
    let new_set = leaves(&mine_now);
    let old_set = managed.iter().find(|e| is_mine(e)).map(|e| leaves(&e["fieldsV1"])).unwrap_or_default();

    // Conflicts: a field another manager owns, applied with a different value.
    let mut conflicts = Vec::new();
    for entry in managed.iter_mut().filter(|e| !is_mine(e)) {
        let theirs = leaves(&entry["fieldsV1"]);
        let contested: Vec<&Vec<String>> = new_set
            .iter()
            .filter(|p| p.last().is_some_and(|l| l != ".") && theirs.contains(*p) && at(object, p) != at(applied, p))
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

    merge(object, applied);
    // Fields this manager applied before and applies no more go, unless someone else owns them.
    let others: BTreeSet<Vec<String>> =
        managed.iter().filter(|e| !is_mine(e)).flat_map(|e| leaves(&e["fieldsV1"])).collect();
    for gone in old_set.difference(&new_set) {
        if !others.contains(gone) {
            remove_at(object, gone);
        }
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
            "manager": manager, "operation": "Apply", "apiVersion": api_version, "time": now(),
            "fieldsType": "FieldsV1", "fieldsV1": mine_now,
        })),
    }
    object["metadata"]["managedFields"] = json!(managed);
    Ok(())
}

/// Who made a non-apply write, for its managedFields entry.
pub(super) struct Updater<'a> {
    pub manager: &'a str,
    /// The request's group version (`apps/v1`).
    pub api_version: &'a str,
    /// `status` for a write to the status subresource.
    pub subresource: Option<&'a str>,
    /// Whether `status` is left out: a write to the main resource of a kind whose status is a
    /// subresource neither sets nor owns it.
    pub ignore_status: bool,
}

/// The managedFields after a non-apply write from `old` (none: a create) to `object`: the
/// manager's `Update` entry gains the fields the write added or changed, other managers lose
/// them, and nobody keeps a field that is gone.
pub(super) fn record_update(old: Option<&Value>, object: &mut Value, by: &Updater) {
    let without_status = |v: &Value| {
        let mut v = v.clone();
        if by.ignore_status
            && let Some(o) = v.as_object_mut()
        {
            o.remove("status");
        }
        fields_v1(&v)
    };
    let new_set = leaves(&without_status(object));
    let old_set = old.map(|o| leaves(&without_status(o))).unwrap_or_default();
    let null = Value::Null;
    let old_object = old.unwrap_or(&null);
    let changed: BTreeSet<Vec<String>> = new_set
        .iter()
        .filter(|p| {
            let existed = old_set.contains(*p);
            // "." is the list item itself: changed only when it is new.
            !existed || (p.last().is_some_and(|l| l != ".") && at(old_object, p) != at(object, p))
        })
        .cloned()
        .collect();
    let removed: BTreeSet<Vec<String>> = old_set.difference(&new_set).cloned().collect();
    let mut managed = match old {
        // A write that brings its own managedFields (a PUT of a read object) keeps them.
        Some(old) if object["metadata"]["managedFields"].is_null() => managed_fields(old),
        _ => managed_fields(object),
    };
    if changed.is_empty() && removed.is_empty() {
        object["metadata"]["managedFields"] = json!(managed);
        return;
    }
    let subresource = by.subresource.map_or(Value::Null, |s| json!(s));
    let is_mine = |e: &Value| {
        e["manager"] == by.manager
            && e["operation"] == "Update"
            && e["apiVersion"] == by.api_version
            && e["subresource"] == subresource
    };
    let mut mine: BTreeSet<Vec<String>> =
        managed.iter().find(|e| is_mine(e)).map(|e| leaves(&e["fieldsV1"])).unwrap_or_default();
    mine.extend(changed.iter().cloned());
    for entry in managed.iter_mut().filter(|e| !is_mine(e)) {
        let kept: BTreeSet<Vec<String>> =
            leaves(&entry["fieldsV1"]).into_iter().filter(|p| !changed.contains(p) && !removed.contains(p)).collect();
        entry["fieldsV1"] = from_leaves(&kept);
    }
    managed.retain(|e| !is_mine(e) && e["fieldsV1"].as_object().is_some_and(|f| !f.is_empty()));
    mine.retain(|p| !removed.contains(p));
    if !mine.is_empty() {
        let mut entry = json!({
            "manager": by.manager, "operation": "Update", "apiVersion": by.api_version, "time": now(),
            "fieldsType": "FieldsV1", "fieldsV1": from_leaves(&mine),
        });
        if let Some(sub) = by.subresource {
            entry["subresource"] = json!(sub);
        }
        managed.push(entry);
    }
    object["metadata"]["managedFields"] = json!(managed);
}

/// RFC 6902 `add`, `remove`, `replace` and `test`.
fn json_patch(object: &mut Value, patch: &Value) -> Result<(), Refusal> {
    let bad = |m: String| Box::new(failure(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &m, None));
    let Some(ops) = patch.as_array() else {
        return Err(bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch"));
    };
    for op in ops {
        let path = op["path"].as_str().unwrap_or_default();
        let (parent, last) = path.rsplit_once('/').unwrap_or(("", path));
        let last = last.replace("~1", "/").replace("~0", "~");
        match op["op"].as_str().unwrap_or_default() {
            "test" => {
                if object.pointer(path) != Some(&op["value"]) {
                    return Err(bad(format!(
                        "the server rejected our request due to an error in our request: testing value {path} failed"
                    )));
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
                    return Err(bad(format!(
                        "the server rejected our request due to an error in our request: remove operation does not apply: doc is missing path: \"{path}\""
                    )));
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
                    return Err(bad(format!(
                        "the server rejected our request due to an error in our request: {action} operation does not apply: doc is missing path: \"{path}\""
                    )));
                }
            }
            other => return Err(bad(format!("Unexpected kind: {other}"))),
        }
    }
    Ok(())
}
