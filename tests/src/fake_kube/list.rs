//! Lists, as the API server serves them (k8s.io/apiserver's etcd3 store and its `ListOptions`
//! validation):
//!
//! - items in (namespace, name) order, those the `labelSelector` and `fieldSelector` pick;
//! - `limit` and `continue`: at most `limit` items, a `metadata.continue` token while more remain
//!   (with `remainingItemCount` when nothing is selected on), every page read at the first
//!   page's resourceVersion and answering it (the fake reads earlier states from its history);
//!   a token whose resourceVersion the history no longer reaches is `410 Expired` with a token
//!   for the rest at the current state (the inconsistent continuation);
//! - `resourceVersion`: unset is the current state, `0` too (the real one may answer from a
//!   slightly older cache), `N` with `resourceVersionMatch=NotOlderThan` (or without a match and
//!   without a limit) is the current state if it is not older than N, `N` with
//!   `resourceVersionMatch=Exact` (or without a match but with a limit, the legacy rule) is the
//!   state at N, `410 Expired` if the history no longer reaches N; a resourceVersion the fake has
//!   not reached yet is the real one's `504 Too large resource version`, at once.

use std::collections::HashMap;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};

use super::Shared;
use super::errors::failure;
use super::history::TooOld;
use super::store::Key;
use super::watch::{View, invalid_options, parse_rv, query_flag};

const CONTINUE_VERSION: &str = "meta.k8s.io/v1";

/// etcd3's `inconsistentContinue`.
const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. \
     You can start a new list without the continue parameter, or use the continue token in this response to \
     retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - \
     objects that were created, modified, or deleted between the time the first chunk was returned and now may \
     show up in the list.";

/// Where a list page starts: after `start` (namespace and name), at resourceVersion `rv` (-1: at
/// the current one, an inconsistent continuation).
struct Continue {
    rv: i64,
    start: (String, String),
}

fn encode_continue(rv: i64, ns: &str, name: &str) -> String {
    // The real token is etcd's key after the resource's prefix; the namespace and name here.
    let start = if ns.is_empty() { format!("{name}\u{0}") } else { format!("{ns}/{name}\u{0}") };
    let token = json!({"v": CONTINUE_VERSION, "rv": rv, "start": start});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

/// `storage.DecodeContinue`: the token, or why it is not one.
fn decode_continue(token: &str) -> Result<Continue, String> {
    let invalid = |why: &str| format!("continue key is not valid: {why}");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|e| invalid(&e.to_string()))?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| invalid(&e.to_string()))?;
    if value["v"] != CONTINUE_VERSION {
        return Err(invalid("server does not recognize this encoded version"));
    }
    let rv = value["rv"].as_i64().unwrap_or(0);
    if rv == 0 {
        return Err(invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"));
    }
    let start = value["start"].as_str().unwrap_or_default().trim_end_matches('\u{0}');
    if start.is_empty() {
        return Err(invalid("encoded start key empty (version meta.k8s.io/v1)"));
    }
    let (ns, name) = start.split_once('/').unwrap_or(("", start));
    Ok(Continue { rv, start: (ns.to_owned(), name.to_owned()) })
}

fn too_large(asked: u64, now: u64) -> Response {
    let details = json!({
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    });
    failure(
        StatusCode::GATEWAY_TIMEOUT,
        "Timeout",
        &format!("Timeout: Too large resource version: {asked}, current: {now}"),
        Some(details),
    )
}

/// Which state a list reads.
enum Read {
    Current,
    /// The state at this resourceVersion.
    At(u64),
    /// The current state, which must not be older than this resourceVersion.
    NotOlderThan(u64),
}

/// The parts of `ListOptions` a list reads, validated as the API server validates them.
struct ListParams {
    read: Read,
    limit: Option<usize>,
    continue_from: Option<Continue>,
}

impl ListParams {
    fn read(q: &HashMap<String, String>) -> Result<Self, Box<Response>> {
        let get = |name: &str| q.get(name).map(String::as_str).filter(|v| !v.is_empty());
        let (rv, rv_match, token) = (get("resourceVersion"), get("resourceVersionMatch"), get("continue"));
        // validateListOptions
        let mut causes = Vec::new();
        let forbidden = |detail: &str| ("resourceVersionMatch", "FieldValueForbidden", format!("Forbidden: {detail}"));
        if let Some(m) = rv_match {
            if rv.is_none() {
                causes.push(forbidden("resourceVersionMatch is forbidden unless resourceVersion is provided"));
            }
            if token.is_some() {
                causes.push(forbidden("resourceVersionMatch is forbidden when continue is provided"));
            }
            if m != "Exact" && m != "NotOlderThan" {
                causes.push((
                    "resourceVersionMatch",
                    "FieldValueNotSupported",
                    format!("Unsupported value: \"{m}\": supported values: \"Exact\", \"NotOlderThan\", \"\""),
                ));
            }
            if m == "Exact" && rv == Some("0") {
                causes.push(forbidden("resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""));
            }
        }
        if query_flag(q, "sendInitialEvents")?.is_some() {
            causes.push((
                "sendInitialEvents",
                "FieldValueForbidden",
                "Forbidden: sendInitialEvents is forbidden for list".to_owned(),
            ));
        }
        if !causes.is_empty() {
            return Err(Box::new(invalid_options(&causes)));
        }
        let limit = match get("limit") {
            None => None,
            Some(l) => {
                let n: i64 = l.parse().map_err(|_| {
                    Box::new(failure(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        &format!("limit: Invalid value: \"{l}\": strconv.ParseInt: parsing {l:?}: invalid syntax"),
                        None,
                    ))
                })?;
                // A limit of 0 or less is no limit.
                usize::try_from(n).ok().filter(|n| *n > 0)
            }
        };
        let bad = |message: &str| Box::new(failure(StatusCode::BAD_REQUEST, "BadRequest", message, None));
        if let Some(token) = token {
            if rv.is_some_and(|rv| rv != "0") {
                return Err(bad("specifying resource version is not allowed when using continue"));
            }
            let from = decode_continue(token).map_err(|why| bad(&why))?;
            let read = if from.rv > 0 { Read::At(from.rv.unsigned_abs()) } else { Read::Current };
            return Ok(Self { read, limit, continue_from: Some(from) });
        }
        let read = match (rv, rv_match) {
            (None | Some("0"), _) => Read::Current,
            (Some(rv), Some("Exact")) => Read::At(parse_rv(rv)?),
            (Some(rv), None) if limit.is_some() => Read::At(parse_rv(rv)?),
            (Some(rv), _) => Read::NotOlderThan(parse_rv(rv)?),
        };
        Ok(Self { read, limit, continue_from: None })
    }
}

/// `GET` of a collection.
pub(super) fn serve(fake: &Shared, view: &View, q: &HashMap<String, String>, headers: &HeaderMap) -> Response {
    let params = match ListParams::read(q) {
        Ok(p) => p,
        Err(response) => return *response,
    };
    let (rv, objects) = {
        let inner = fake.lock();
        let now = inner.resource_version;
        let read = match params.read {
            Read::Current => Ok((now, inner.current(&view.target))),
            Read::NotOlderThan(asked) | Read::At(asked) if asked > now => return too_large(asked, now),
            Read::NotOlderThan(_) => Ok((now, inner.current(&view.target))),
            Read::At(asked) => inner.at(&view.target, asked).map(|objects| (asked, objects)),
        };
        match read {
            Ok(read) => read,
            Err(TooOld(..)) => {
                drop(inner);
                let Some(from) = &params.continue_from else {
                    return failure(
                        StatusCode::GONE,
                        "Expired",
                        "The resourceVersion for the provided list is too old.",
                        None,
                    );
                };
                // The rest can still be read at the current state, inconsistently.
                let body = json!({
                    "kind": "Status", "apiVersion": "v1",
                    "metadata": {"continue": encode_continue(-1, &from.start.0, &from.start.1)},
                    "status": "Failure", "message": CONTINUE_EXPIRED, "reason": "Expired", "code": 410,
                });
                return (StatusCode::GONE, [("content-type", "application/json")], body.to_string()).into_response();
            }
        }
    };
    let after = |key: &Key| {
        params
            .continue_from
            .as_ref()
            .is_none_or(|from| (key.2.as_str(), key.3.as_str()) > (&from.start.0, &from.start.1))
    };
    let mut selected: Vec<(Key, Value)> =
        objects.into_iter().filter(|(key, o)| after(key) && view.selector.matches(o)).collect();
    let remaining = params.limit.map_or(0, |limit| selected.len().saturating_sub(limit));
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(limit) = params.limit
        && remaining > 0
    {
        selected.truncate(limit);
        if let Some(((_, _, ns, name), _)) = selected.last() {
            // A continuation of an inconsistent list goes on at the state it read.
            metadata["continue"] = json!(encode_continue(i64::try_from(rv).unwrap_or(i64::MAX), ns, name));
        }
        if view.selector.is_empty() {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    let items: Vec<Value> = selected.into_iter().map(|(_, o)| view.present(o)).collect();
    if super::wants_table(headers) {
        let mut table = (view.printer)(&items, &rv.to_string());
        for field in ["continue", "remainingItemCount"] {
            if let Some(value) = metadata.get(field) {
                table["metadata"][field] = value.clone();
            }
        }
        return axum::Json(table).into_response();
    }
    let items: Vec<Value> = if view.typed {
        items
            .into_iter()
            .map(|mut o| {
                if let Some(m) = o.as_object_mut() {
                    m.remove("apiVersion");
                    m.remove("kind");
                }
                o
            })
            .collect()
    } else {
        items
    };
    axum::Json(json!({
        "kind": format!("{}List", view.kind), "apiVersion": view.api_version, "metadata": metadata, "items": items,
    }))
    .into_response()
}
