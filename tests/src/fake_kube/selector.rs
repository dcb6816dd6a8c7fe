//! List and watch selectors: `labelSelector` (k8s.io/apimachinery `labels.Parse`: `a=b`, `a==b`,
//! `a!=b`, `a in (x,y)`, `a notin (x,y)`, `a`, `!a`) and `fieldSelector` on `metadata.name`,
//! `metadata.namespace` for a namespaced kind (what the API server supports for every kind), and
//! the fields a kind adds (its registry's `ToSelectableFields`: pods' `status.phase`,
//! `spec.nodeName` and others, nodes' `spec.unschedulable`, secrets' `type`, namespaces'
//! `status.phase`).

use std::collections::HashMap;

use axum::http::StatusCode;
use serde_json::Value;

use super::errors::failure;
use super::patch::Refusal;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// A request's label and field selectors.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selector {
    labels: Vec<Requirement>,
    /// (field, value, whether it must equal)
    fields: Vec<(String, String, bool)>,
}

fn bad_request(message: &str) -> Refusal {
    Box::new(failure(StatusCode::BAD_REQUEST, "BadRequest", message, None))
}

/// Splits on the commas outside parentheses.
fn terms(selector: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&selector[start..]);
    out.into_iter().map(str::trim).filter(|t| !t.is_empty()).collect()
}

fn requirement(term: &str) -> Option<Requirement> {
    let simple = |key: &str, op: Op, values: Vec<String>| {
        let key = key.trim();
        (!key.is_empty() && !key.contains(char::is_whitespace)).then(|| Requirement { key: key.to_owned(), op, values })
    };
    if let Some(key) = term.strip_prefix('!') {
        return simple(key, Op::DoesNotExist, Vec::new());
    }
    if let Some((head, rest)) = term.split_once('(') {
        let inner = rest.strip_suffix(')')?;
        let values = inner.split(',').map(|v| v.trim().to_owned()).collect();
        let head = head.trim_end();
        return if let Some(key) = head.strip_suffix(" notin") {
            simple(key, Op::NotIn, values)
        } else if let Some(key) = head.strip_suffix(" in") {
            simple(key, Op::In, values)
        } else {
            None
        };
    }
    if let Some((key, value)) = term.split_once("!=") {
        return simple(key, Op::NotEquals, vec![value.trim().to_owned()]);
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return simple(key, Op::Equals, vec![value.trim().to_owned()]);
    }
    simple(term, Op::Exists, Vec::new())
}

impl Selector {
    /// The selectors of a list or watch of `resource` (as the API server prints a
    /// GroupVersionResource: `apps/v1, Resource=deployments`), whose objects can be selected on
    /// `metadata.name`, `metadata.namespace` if `namespaced`, and `selectable`; a field it cannot
    /// select on is a 400 as the real one answers.
    pub(crate) fn from_query(
        q: &HashMap<String, String>,
        resource: &str,
        namespaced: bool,
        selectable: &[&str],
    ) -> Result<Self, Refusal> {
        let mut selector = Self::default();
        if let Some(labels) = q.get("labelSelector") {
            for term in terms(labels) {
                let parsed =
                    requirement(term).ok_or_else(|| bad_request(&format!("unable to parse requirement: {term:?}")))?;
                selector.labels.push(parsed);
            }
        }
        if let Some(fields) = q.get("fieldSelector").filter(|s| !s.is_empty()) {
            for term in terms(fields) {
                let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
                    (f, v, false)
                } else {
                    let (f, v) = term.split_once("==").or_else(|| term.split_once('=')).unwrap_or((term, ""));
                    (f, v, true)
                };
                let supported = field == "metadata.name"
                    || (namespaced && field == "metadata.namespace")
                    || selectable.contains(&field);
                if !supported {
                    return Err(bad_request(&format!(
                        "Unable to find \"{resource}\" that match label selector \"{}\", field selector \"{fields}\": field label not supported: {field}",
                        q.get("labelSelector").map_or("", String::as_str)
                    )));
                }
                selector.fields.push((field.to_owned(), value.to_owned(), equal));
            }
        }
        Ok(selector)
    }

    /// Whether it selects everything (no label or field requirement).
    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        let meta = &object["metadata"];
        let fields_match =
            self.fields.iter().all(|(field, value, equal)| (field_value(object, field) == *value) == *equal);
        let labels_match = self.labels.iter().all(|r| {
            let actual = meta["labels"][r.key.as_str()].as_str();
            match r.op {
                Op::Exists => actual.is_some(),
                Op::DoesNotExist => actual.is_none(),
                Op::Equals | Op::In => actual.is_some_and(|a| r.values.iter().any(|v| v == a)),
                // As the API server: an object without the label matches `!=` and `notin`.
                Op::NotEquals | Op::NotIn => actual.is_none_or(|a| r.values.iter().all(|v| v != a)),
            }
        });
        fields_match && labels_match
    }
}

/// A selectable field's value as the registry's `ToSelectableFields` sets it: the string, a
/// boolean as `true`/`false` (false when unset), an unset string as empty.
fn field_value(object: &Value, field: &str) -> String {
    let value = field.split('.').fold(object, |v, part| &v[part]);
    match value {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Null if matches!(field, "spec.hostNetwork" | "spec.unschedulable") => "false".to_owned(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}
