//! Watches, as the API server serves them (k8s.io/apiserver's watch cache, `cacheWatcher`):
//!
//! - without `resourceVersion`, or with `0`: an `ADDED` for every object the watch selects, then
//!   the changes ("Get State and Start at Most Recent"/"at Any"); with `resourceVersion=N`: the
//!   changes after N, or, if the history no longer reaches back to N, one `ERROR` event carrying
//!   a `410 Expired` Status (`too old resource version: N (M)`) and the end of the stream;
//! - `sendInitialEvents=true` (with `resourceVersionMatch=NotOlderThan`, a streaming list): the
//!   state as `ADDED` events, then a `BOOKMARK` annotated `k8s.io/initial-events-end`;
//! - `labelSelector` and `fieldSelector` decide per change with the object before and after it:
//!   an object that starts matching arrives as `ADDED`, one that stops matching as `DELETED` (its
//!   previous content with the change's resourceVersion);
//! - `allowWatchBookmarks=true`: a `BOOKMARK` (an object of the watched kind with only
//!   `metadata.resourceVersion`, the current one) every [`FakeKube::set_bookmark_interval`]
//!   (a second unless set; the real one sends one about every minute), and one shortly before
//!   `timeoutSeconds` runs out, as the real one; never without the parameter;
//! - `timeoutSeconds`: the response ends cleanly after that long.
//!
//! A `resourceVersion` newer than the fake's is taken as is (the real one waits up to 3 s, then
//! answers `Too large resource version`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::errors::{failure, invalid};
use super::history::{Change, ChangeKind, Target, TooOld};
use super::selector::Selector;
use super::{FakeKube, Shared};

/// How often a watch that allows them gets a bookmark unless a test says otherwise.
pub(super) const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

/// How long before `timeoutSeconds` runs out the last bookmark comes (the real cacher's).
const BOOKMARK_BEFORE_TIMEOUT: Duration = Duration::from_secs(2);

/// Prints objects as a Table (with the list's resourceVersion).
pub(super) type Printer = Box<dyn Fn(&[Value], &str) -> Value + Send + Sync>;

/// How one resource is listed and watched: what it covers, how its objects look at the version
/// asked for, its selectors, its Table.
pub(super) struct View {
    pub target: Target,
    pub api_version: String,
    pub kind: String,
    /// Items of a typed list carry no apiVersion and kind (custom resources' do).
    pub typed: bool,
    pub selector: Selector,
    pub printer: Printer,
}

impl View {
    /// The object as the version asked for shows it.
    pub(super) fn present(&self, mut object: Value) -> Value {
        object["apiVersion"] = json!(self.api_version);
        object
    }

    /// The event a change makes for this watch, if any (the cacher's `convertToWatchEvent`).
    fn event(&self, change: &Change) -> Option<Value> {
        if !self.target.covers(&change.key) {
            return None;
        }
        let now_selected = change.kind != ChangeKind::Deleted && self.selector.matches(&change.object);
        let was_selected = change.prev.as_ref().is_some_and(|prev| self.selector.matches(prev));
        let (kind, object) = match (now_selected, was_selected) {
            (true, false) => ("ADDED", change.object.clone()),
            (true, true) => ("MODIFIED", change.object.clone()),
            (false, true) => {
                // The object as the watch last saw it, at the change's resourceVersion.
                let mut gone = change.prev.clone().unwrap_or_default();
                gone["metadata"]["resourceVersion"] = json!(change.rv.to_string());
                ("DELETED", gone)
            }
            (false, false) => return None,
        };
        Some(json!({"type": kind, "object": self.present(object)}))
    }

    fn bookmark(&self, rv: u64, initial_events_end: bool) -> Value {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({"type": "BOOKMARK", "object": {"kind": self.kind, "apiVersion": self.api_version, "metadata": metadata}})
    }
}

/// Where a watch starts.
#[derive(Debug, PartialEq)]
enum Start {
    /// The current state as ADDED events, then the changes.
    State,
    /// The changes from now on.
    Now,
    /// The changes after this resourceVersion.
    After(u64),
}

struct WatchParams {
    start: Start,
    bookmarks: bool,
    /// `sendInitialEvents=true`: the state ends with an annotated bookmark.
    initial_events: bool,
    timeout: Option<Duration>,
}

/// `strconv.ParseBool`, which the API server reads query booleans with.
pub(super) fn flag(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn bad_request(message: &str) -> Response {
    failure(StatusCode::BAD_REQUEST, "BadRequest", message, None)
}

/// `ListOptions` refused by validation (422, `ListOptions.meta.k8s.io "" is invalid`).
pub(super) fn invalid_options(causes: &[(&str, &str, String)]) -> Response {
    let causes: Vec<(&str, &str, &str)> = causes.iter().map(|(f, r, m)| (*f, *r, m.as_str())).collect();
    invalid("meta.k8s.io", "ListOptions", "", &causes)
}

/// A query boolean: absent, or what `strconv.ParseBool` reads (else 400, as the query decoder).
pub(super) fn query_flag(q: &HashMap<String, String>, name: &str) -> Result<Option<bool>, Box<Response>> {
    match q.get(name) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => flag(v).map(Some).ok_or_else(|| {
            Box::new(bad_request(&format!(
                "{name}: Invalid value: \"{v}\": strconv.ParseBool: parsing {v:?}: invalid syntax"
            )))
        }),
    }
}

/// A query resourceVersion as a number (else 400).
pub(super) fn parse_rv(rv: &str) -> Result<u64, Box<Response>> {
    rv.parse().map_err(|_| {
        Box::new(bad_request(&format!(
            "resourceVersion: Invalid value: \"{rv}\": strconv.ParseUint: parsing {rv:?}: invalid syntax"
        )))
    })
}

impl WatchParams {
    fn read(q: &HashMap<String, String>) -> Result<Self, Box<Response>> {
        let send_initial = query_flag(q, "sendInitialEvents")?;
        let rv_match = q.get("resourceVersionMatch").filter(|m| !m.is_empty());
        // validateWatchOptions
        let mut causes = Vec::new();
        if send_initial.is_some() && rv_match.is_none_or(|m| m != "NotOlderThan") {
            causes.push((
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".to_owned(),
            ));
        }
        if let Some(m) = rv_match {
            if send_initial.is_none() {
                causes.push((
                    "resourceVersionMatch",
                    "FieldValueForbidden",
                    "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
                        .to_owned(),
                ));
            }
            if m != "NotOlderThan" {
                causes.push((
                    "resourceVersionMatch",
                    "FieldValueNotSupported",
                    format!("Unsupported value: \"{m}\": supported values: \"NotOlderThan\""),
                ));
            }
        }
        if !causes.is_empty() {
            return Err(Box::new(invalid_options(&causes)));
        }
        let rv = q.get("resourceVersion").filter(|rv| !rv.is_empty() && *rv != "0");
        let start = match (rv, send_initial) {
            (_, Some(true)) => Start::State,
            (None, Some(false)) => Start::Now,
            (None, None) => Start::State,
            (Some(rv), _) => Start::After(parse_rv(rv)?),
        };
        let timeout = match q.get("timeoutSeconds").filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => {
                let seconds: u64 = t.parse().map_err(|_| {
                    Box::new(bad_request(&format!(
                        "timeoutSeconds: Invalid value: \"{t}\": strconv.ParseInt: parsing {t:?}: invalid syntax"
                    )))
                })?;
                // 0 is the server's default (a long, random time): no deadline here.
                (seconds > 0).then(|| Duration::from_secs(seconds))
            }
        };
        Ok(Self {
            start,
            bookmarks: query_flag(q, "allowWatchBookmarks")?.unwrap_or(false),
            initial_events: send_initial == Some(true),
            timeout,
        })
    }
}

/// One event as a line of the response, as a one-row Table for kubectl (`as=Table`).
fn encode(view: &View, table: bool, mut event: Value) -> Bytes {
    if table {
        let object = &event["object"];
        let rv = object["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_owned();
        // A bookmark is a Table without rows carrying the resourceVersion.
        let rows: &[Value] = if event["type"] == "BOOKMARK" { &[] } else { std::slice::from_ref(object) };
        event["object"] = (view.printer)(rows, &rv);
    }
    Bytes::from(format!("{event}\n"))
}

fn stream_response(body: Body) -> Response {
    Response::builder()
        .header("content-type", "application/json")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// `GET ...?watch=true`.
pub(super) async fn serve(fake: Arc<Shared>, view: View, q: &HashMap<String, String>, headers: &HeaderMap) -> Response {
    let params = match WatchParams::read(q) {
        Ok(p) => p,
        Err(response) => return *response,
    };
    let table = super::wants_table(headers);
    // A test holding watches decides when this one reads the state (FakeKube::hold_watches).
    let mut held = fake.watches_held.subscribe();
    let _ = held.wait_for(|held| !*held).await;
    let (initial, changes, rv, settings) = {
        let mut inner = fake.lock();
        let rv = inner.resource_version;
        let initial: Result<Vec<Value>, TooOld> = match params.start {
            Start::Now => Ok(Vec::new()),
            Start::State => Ok(inner
                .current(&view.target)
                .into_values()
                .filter(|o| view.selector.matches(o))
                .map(|o| json!({"type": "ADDED", "object": view.present(o)}))
                .collect()),
            Start::After(n) => inner.history.since(n).map(|changes| changes.filter_map(|c| view.event(c)).collect()),
        };
        let initial = match initial {
            Ok(events) => events,
            Err(TooOld(asked, floor)) => {
                drop(inner);
                let status = json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {asked} ({floor})"),
                    "reason": "Expired", "code": 410,
                });
                let line = Bytes::from(format!("{}\n", json!({"type": "ERROR", "object": status})));
                return stream_response(Body::from(line));
            }
        };
        let changes = inner.history.subscribe(view.target.clone());
        (initial, changes, rv, (inner.bookmark_interval.unwrap_or(DEFAULT_BOOKMARK_INTERVAL), inner.watch_cut.clone()))
    };
    let (bookmark_interval, cut) = settings;
    let (out, body) = mpsc::channel::<Bytes>(16);
    let watch = Watch {
        fake,
        view,
        table,
        bookmarks: params.bookmarks.then_some(bookmark_interval),
        deadline: params.timeout.map(|t| Instant::now() + t),
        cut,
        out,
        seen: rv,
    };
    let end_bookmark = (params.initial_events && params.bookmarks).then_some(rv);
    tokio::spawn(watch.run(initial, end_bookmark, changes));
    stream_response(Body::from_stream(ReceiverStream::new(body).map(Ok::<_, Infallible>)))
}

/// One open watch, sending its events to the response body.
struct Watch {
    fake: Arc<Shared>,
    view: View,
    table: bool,
    bookmarks: Option<Duration>,
    deadline: Option<Instant>,
    /// Cancelled when the fake closes its watches (or stops).
    cut: CancellationToken,
    out: mpsc::Sender<Bytes>,
    /// The resourceVersion up to which this watch has looked at every change.
    seen: u64,
}

impl Watch {
    /// False once the client is gone.
    async fn send(&self, event: Value) -> bool {
        self.out.send(encode(&self.view, self.table, event)).await.is_ok()
    }

    async fn deliver(&mut self, change: &Change) -> bool {
        self.seen = self.seen.max(change.rv);
        match self.view.event(change) {
            Some(event) => self.send(event).await,
            None => true,
        }
    }

    /// When the next bookmark is due: periodically, and once just before the deadline.
    fn next_bookmark(&self, interval: Duration, before_deadline_sent: bool) -> Instant {
        let periodic = Instant::now() + interval;
        match self.deadline {
            Some(deadline) if !before_deadline_sent => {
                let last = deadline.checked_sub(BOOKMARK_BEFORE_TIMEOUT).unwrap_or(deadline);
                last.min(periodic)
            }
            _ => periodic,
        }
    }

    async fn run(mut self, initial: Vec<Value>, end_bookmark: Option<u64>, mut changes: mpsc::Receiver<Arc<Change>>) {
        for event in initial {
            if !self.send(event).await {
                return;
            }
        }
        if let Some(rv) = end_bookmark
            && !self.send(self.view.bookmark(rv, true)).await
        {
            return;
        }
        // Far enough to never come during a test.
        let never = Instant::now() + Duration::from_secs(365 * 24 * 3600);
        let mut before_deadline_sent = false;
        let mut next_bookmark = self.bookmarks.map(|i| self.next_bookmark(i, false));
        loop {
            tokio::select! {
                biased;
                () = self.out.closed() => return,
                () = self.cut.cancelled() => return,
                () = tokio::time::sleep_until(self.deadline.unwrap_or(never)) => return,
                change = changes.recv() => {
                    // None: the fake dropped this watcher, which had stopped reading.
                    let Some(change) = change else { return };
                    if !self.deliver(&change).await {
                        return;
                    }
                }
                () = tokio::time::sleep_until(next_bookmark.unwrap_or(never)) => {
                    // Every change up to the bookmark's resourceVersion goes first (they are all
                    // queued: the fake queues a change under the lock that gives its version).
                    let now_rv = self.fake.lock().resource_version;
                    while let Ok(change) = changes.try_recv() {
                        if !self.deliver(&change).await {
                            return;
                        }
                    }
                    let rv = now_rv.max(self.seen);
                    if !self.send(self.view.bookmark(rv, false)).await {
                        return;
                    }
                    if self.deadline.is_some_and(|d| Instant::now() + BOOKMARK_BEFORE_TIMEOUT >= d) {
                        before_deadline_sent = true;
                    }
                    next_bookmark = self.bookmarks.map(|i| self.next_bookmark(i, before_deadline_sent));
                }
            }
        }
    }
}

impl FakeKube {
    /// How often a watch with `allowWatchBookmarks=true` gets a bookmark (a second unless set).
    /// Applies to watches started afterwards.
    pub fn set_bookmark_interval(&self, interval: Duration) {
        self.lock().bookmark_interval = Some(interval);
    }

    /// Ends every open watch cleanly, as the API server does when it restarts or reinitialises
    /// its watch cache: clients watch again from the last resourceVersion they saw.
    pub fn end_watches(&self) {
        let mut inner = self.lock();
        inner.watch_cut.cancel();
        inner.watch_cut = self.shared.stop.child_token();
    }

    /// While held, a watch request waits before it reads anything (it is already recorded in
    /// [`FakeKube::requests`]); released, it goes on. A test changes objects in between, e.g.
    /// between a client's list and its watch.
    pub fn hold_watches(&self, held: bool) {
        self.shared.watches_held.send_replace(held);
    }
}
