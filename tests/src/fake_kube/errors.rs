//! The API server's failure `Status` bodies for one resource (k8s.io/apimachinery
//! `pkg/api/errors`): the message worded as `errors.New*` words it, and `details` with the name,
//! the group and, as the API server fills it, the resource's plural as `kind`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// A `Status` of `code` with `reason` (empty: none, as for plain errors), `message` and `details`.
pub(crate) fn failure(code: StatusCode, reason: &str, message: &str, details: Option<Value>) -> Response {
    let mut body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "code": code.as_u16(),
    });
    if !reason.is_empty() {
        body["reason"] = json!(reason);
    }
    if let Some(details) = details {
        body["details"] = details;
    }
    (code, [("content-type", "application/json")], body.to_string()).into_response()
}

/// `StatusDetails` without the empty fields (they are `omitempty`).
pub(crate) fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = Map::new();
    for (key, value) in [("name", name), ("group", group), ("kind", kind)] {
        if !value.is_empty() {
            d.insert(key.to_owned(), json!(value));
        }
    }
    Value::Object(d)
}

/// A resource as the errors name it (`schema.GroupResource`): `configmaps`,
/// `leases.coordination.k8s.io`.
#[derive(Clone, Copy)]
pub(crate) struct GroupResource<'a> {
    pub group: &'a str,
    pub resource: &'a str,
}

impl GroupResource<'_> {
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() { self.resource.to_owned() } else { format!("{}.{}", self.resource, self.group) }
    }

    fn details(&self, name: &str) -> Option<Value> {
        Some(details(name, self.group, self.resource))
    }

    /// 404 `configmaps "x" not found`.
    pub(crate) fn not_found(&self, name: &str) -> Response {
        let message = format!("{} \"{name}\" not found", self.qualified());
        failure(StatusCode::NOT_FOUND, "NotFound", &message, self.details(name))
    }

    /// 409 `configmaps "x" already exists`.
    pub(crate) fn already_exists(&self, name: &str) -> Response {
        let message = format!("{} \"{name}\" already exists", self.qualified());
        failure(StatusCode::CONFLICT, "AlreadyExists", &message, self.details(name))
    }

    /// 409 `Operation cannot be fulfilled on configmaps "x": {cause}`.
    pub(crate) fn conflict(&self, name: &str, cause: &str) -> Response {
        let message = format!("Operation cannot be fulfilled on {} \"{name}\": {cause}", self.qualified());
        failure(StatusCode::CONFLICT, "Conflict", &message, self.details(name))
    }
}

/// What `errors.NewConflict` says of a stale `metadata.resourceVersion` (storage's
/// `OptimisticLockErrorMsg`).
pub(crate) const OPTIMISTIC_LOCK: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// 422 Invalid with its causes (field, reason, message), as `errors.NewInvalid` words it.
pub(crate) fn invalid(group: &str, kind: &str, name: &str, causes: &[(&str, &str, &str)]) -> Response {
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
    let mut details = details(name, group, kind);
    details["causes"] = json!(causes);
    failure(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &message, Some(details))
}
