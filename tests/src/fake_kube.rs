//! A fake Kubernetes API server (axum) following the real API's shapes: discovery (legacy and
//! aggregated), pods (list, get, watch, logs, exec, attach, port-forward), a generic object store
//! for every other kind (module `store`: namespaces, configmaps, secrets, services,
//! serviceaccounts, leases, CRDs and their custom resources, with server-side apply, dry runs and
//! deletion as the real one; the shared write machinery in `patch`), apps/v1 Deployments in that
//! store with a deployment controller the test drives (module `apps`), v1 Nodes (module
//! `nodes`), and the OpenAPI kubectl reads (module `openapi`). Pods and the store's kinds are
//! listed and watched alike, as the real API server does it (modules `list` and `watch`, over
//! the bounded change history of module `history`). It records every request (so tests can
//! check what agentk sent) and requires the service-account bearer token it was created with,
//! as a real API server would.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use tokio_util::sync::{CancellationToken, DropGuard};

mod apps;
mod errors;
mod history;
mod list;
mod nodes;
mod openapi;
mod patch;
mod selector;
mod store;
mod watch;

/// A request as the fake API server received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: HeaderMap,
}

/// A request body the fake received (POST, PUT, PATCH), byte for byte.
#[derive(Debug, Clone)]
pub struct RecordedBody {
    pub method: String,
    pub path: String,
    pub content_type: String,
    pub body: Bytes,
}

/// Reads to the end without keeping the content: (length, SHA-256).
pub async fn length_and_sha256(mut reader: impl tokio::io::AsyncRead + Unpin) -> (u64, [u8; 32]) {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::io::AsyncReadExt::read(&mut reader, &mut buf).await.expect("read");
        if n == 0 {
            return (total, hasher.finalize().into());
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
}

/// The SHA-256 of the generated log of `size` bytes ([`big_log_chunks`]).
pub fn big_log_sha256(size: u64) -> [u8; 32] {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    for chunk in big_log_chunks(size) {
        hasher.update(&chunk);
    }
    hasher.finalize().into()
}

/// The deterministic content of a generated log of `size` bytes (see [`FakeKube::add_big_log`]).
pub fn big_log_chunks(size: u64) -> impl Iterator<Item = Bytes> {
    const LINES_PER_CHUNK: u64 = 1000;
    let mut produced = 0u64;
    let mut line = 0u64;
    std::iter::from_fn(move || {
        if produced >= size {
            return None;
        }
        let mut chunk = String::with_capacity(64 * LINES_PER_CHUNK as usize);
        for _ in 0..LINES_PER_CHUNK {
            chunk.push_str(&format!("{line:010} the quick brown fox jumps over the lazy dog\n"));
            line += 1;
        }
        let take = (size - produced).min(chunk.len() as u64) as usize;
        produced += take as u64;
        Some(Bytes::from(chunk.into_bytes()).slice(..take))
    })
}

#[derive(Default)]
struct Inner {
    /// (namespace, name) -> pod object
    pods: BTreeMap<(String, String), Value>,
    /// Every object but pods (module `store`).
    objects: BTreeMap<store::Key, Value>,
    /// (namespace, deployment) -> the pod template the controller last rolled out (its hash)
    deployment_templates: BTreeMap<(String, String), String>,
    requests: Vec<RecordedRequest>,
    resource_version: u64,
    /// When set, every API call answers with this status (RBAC failures and the like).
    fail_with: Option<StatusCode>,
    /// When set, every API call is answered this much later (a slow API server).
    delay: Option<std::time::Duration>,
    /// Whether agentk's service account may impersonate (RBAC's `impersonate` verb, which the
    /// Helm chart grants with rbac.impersonate).
    impersonation_forbidden: bool,
    bodies: Vec<RecordedBody>,
    /// (namespace, pod) -> log lines so far
    logs: BTreeMap<(String, String), Vec<String>>,
    /// (namespace, pod) -> size of a generated log
    big_logs: BTreeMap<(String, String), u64>,
    /// size -> the generated log's chunks, made once: serving it costs no CPU in the test process
    /// (tests with several large responses measure latency on a shared machine).
    big_log_cache: BTreeMap<u64, Arc<Vec<Bytes>>>,
    /// Bytes of generated logs handed to connections so far (all requests).
    big_log_bytes_sent: u64,
    /// (namespace, pod) -> bytes sent before the log stream breaks (an API server failing
    /// mid-response)
    broken_logs: BTreeMap<(String, String), u64>,
    /// Live log followers (cancelled when the client goes away).
    log_followers: usize,
    /// Every change (bounded), so a watch from a resourceVersion replays what it missed (as the
    /// API server does: kubectl lists, then watches from the list's resourceVersion), and the
    /// open watches' queues.
    history: history::History,
    /// How often a watch gets a bookmark (None: [`watch::DEFAULT_BOOKMARK_INTERVAL`]).
    bookmark_interval: Option<std::time::Duration>,
    /// Cancelled to end the open watches ([`FakeKube::end_watches`]); a child of `Shared::stop`.
    watch_cut: CancellationToken,
}

/// What the server task shares with the handle.
struct Shared {
    inner: Mutex<Inner>,
    /// Cancelled when the server stops (the last handle is dropped): open watches end.
    stop: CancellationToken,
    /// Whether watch requests wait before reading anything ([`FakeKube::hold_watches`]).
    watches_held: tokio::sync::watch::Sender<bool>,
    /// (namespace, pod, line) appended to a log
    log_lines: broadcast::Sender<(String, String, String)>,
    token: String,
    /// Pod filesystems and remote-command sessions (exec, attach, cp).
    containers: Arc<crate::remote_command::Containers>,
    /// Port-forward sessions (transport, streams and bytes echoed).
    port_forwards: crate::spdy_passthrough::Sessions,
}

/// Handle to a running fake API server; the server stops when the last handle is dropped.
#[derive(Clone)]
pub struct FakeKube {
    shared: Arc<Shared>,
    addr: SocketAddr,
    _stop_on_drop: Arc<DropGuard>,
}

type St = State<Arc<Shared>>;

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, [("content-type", "application/json")], body.to_string()).into_response()
}

fn pod_object(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace,
            "uid": format!("uid-{namespace}-{name}"), "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running"},
    })
}

/// The fields a pod can be selected on besides its name and namespace (`PodToSelectableFields`).
const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

/// A store key for a pod (the fake keeps pods apart, but they change and are watched alike).
fn pod_key(namespace: &str, name: &str) -> store::Key {
    (String::new(), "pods".to_owned(), namespace.to_owned(), name.to_owned())
}

impl FakeKube {
    /// Starts the server on an ephemeral loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind fake kube");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner { watch_cut: shutdown.child_token(), ..Inner::default() }),
            stop: shutdown.clone(),
            watches_held: tokio::sync::watch::channel(false).0,
            log_lines: broadcast::channel(1024).0,
            token: format!("sa-token-{}", rand_suffix()),
            containers: Arc::default(),
            port_forwards: Arc::default(),
        });
        let app = Router::new()
            .route("/version", get(version))
            .route("/api", get(api_versions))
            .route("/apis", get(store::api_groups))
            .route("/api/v1", get(api_resources))
            .route("/openapi/v2", get(openapi::v2))
            .route("/openapi/v3", get(openapi::v3_root))
            .route("/openapi/v3/{*path}", get(openapi::v3_group_version))
            .route("/api/v1/pods", get(list_all_pods))
            .route("/api/v1/namespaces/{ns}/pods", get(list_namespaced_pods).post(create_pod))
            .route("/api/v1/namespaces/{ns}/pods/{name}", get(get_pod).patch(patch_pod).put(put_pod).delete(delete_pod))
            .route("/api/v1/namespaces/{ns}/pods/{name}/log", get(pod_log))
            .route("/api/v1/namespaces/{ns}/pods/{name}/exec", get(exec).post(exec))
            .route("/api/v1/namespaces/{ns}/pods/{name}/attach", get(attach).post(attach))
            .route("/api/v1/namespaces/{ns}/pods/{name}/portforward", get(port_forward).post(port_forward))
            .fallback(store::serve)
            .layer(middleware::from_fn_with_state(shared.clone(), record_and_authorize))
            .with_state(shared.clone());
        // The namespaces every cluster starts with.
        for namespace in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            store::add_namespace(&shared, namespace);
        }
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        });
        Self { shared, addr, _stop_on_drop: Arc::new(shutdown.drop_guard()) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The service account token the fake expects from agentk.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// A kubeconfig pointing at this server with its token (what agentk's `--kubeconfig` reads).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: sa\n  user:\n    token: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: sa\n    namespace: default\ncurrent-context: fake\n",
            self.url(),
            self.shared.token
        )
    }

    /// Creates (or replaces) a running pod.
    pub fn add_pod(&self, namespace: &str, name: &str) {
        self.lock().write_pod(namespace, name, pod_object(namespace, name));
    }

    /// Creates or updates a pod with a status: `phase` (`Pending`, `Running`, `Succeeded`,
    /// `Failed`), a `Ready` condition and its container's readiness, and exactly these labels
    /// (the rest of an existing pod stays). Returns the stored pod.
    pub fn put_pod(&self, namespace: &str, name: &str, phase: &str, ready: bool, labels: &[(&str, &str)]) -> Value {
        let mut inner = self.lock();
        let mut pod = inner.pods.get(&(namespace.to_owned(), name.to_owned())).cloned().unwrap_or_else(|| {
            let mut pod = pod_object(namespace, name);
            pod["metadata"]["creationTimestamp"] = json!(patch::now());
            pod
        });
        let labels: serde_json::Map<String, Value> = labels.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
        pod["metadata"]["labels"] = Value::Object(labels);
        let status = if ready { "True" } else { "False" };
        let container = pod["spec"]["containers"][0]["name"].as_str().unwrap_or("main").to_owned();
        let at = patch::now();
        pod["status"] = json!({
            "phase": phase,
            "conditions": [
                {"type": "Ready", "status": status, "lastProbeTime": null, "lastTransitionTime": at},
                {"type": "ContainersReady", "status": status, "lastProbeTime": null, "lastTransitionTime": at},
            ],
            "containerStatuses": [{"name": container, "ready": ready, "restartCount": 0, "image": "busybox"}],
        });
        inner.write_pod(namespace, name, pod)
    }

    /// Deletes a pod (a DELETED event with a new resourceVersion). False if there was none.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> bool {
        self.lock().remove_pod(namespace, name).is_some()
    }

    /// (namespace, name) of every pod, sorted.
    pub fn pod_names(&self) -> Vec<(String, String)> {
        self.lock().pods.keys().cloned().collect()
    }

    /// Appends a line to a pod's log (followers see it at once).
    pub fn append_log(&self, namespace: &str, pod: &str, line: &str) {
        self.lock().logs.entry((namespace.to_owned(), pod.to_owned())).or_default().push(line.to_owned());
        let _ = self.shared.log_lines.send((namespace.to_owned(), pod.to_owned(), line.to_owned()));
    }

    /// Makes a pod's log a generated stream of `size` bytes ([`big_log_chunks`]), produced on
    /// the fly so the fake holds none of it in memory.
    pub fn add_big_log(&self, namespace: &str, pod: &str, size: u64) {
        self.lock().big_logs.insert((namespace.to_owned(), pod.to_owned()), size);
    }

    /// Makes a pod's log send `bytes` bytes and then fail (the connection is cut mid-body).
    pub fn add_broken_log(&self, namespace: &str, pod: &str, bytes: u64) {
        self.lock().broken_logs.insert((namespace.to_owned(), pod.to_owned()), bytes);
    }

    /// Bytes of generated logs ([`FakeKube::add_big_log`]) handed to connections so far; it
    /// stops growing when every reader of one has stopped reading (and the buffers are full).
    pub fn big_log_bytes_sent(&self) -> u64 {
        self.lock().big_log_bytes_sent
    }

    /// Clients currently following a log.
    pub fn log_followers(&self) -> usize {
        self.lock().log_followers
    }

    /// Bodies received by POST, PUT and PATCH, in order.
    pub fn bodies(&self) -> Vec<RecordedBody> {
        self.lock().bodies.clone()
    }

    /// The stored object of a pod.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.lock().pods.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    pub fn delay(&self, d: Option<std::time::Duration>) {
        self.lock().delay = d;
    }

    pub fn fail_with(&self, code: Option<StatusCode>) {
        self.lock().fail_with = code;
    }

    /// Takes the `impersonate` permission from agentk's service account (or gives it back).
    pub fn forbid_impersonation(&self, forbidden: bool) {
        self.lock().impersonation_forbidden = forbidden;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared.lock()
    }
}

impl Inner {
    /// Stores a pod with a new resourceVersion and records the change (in one lock, so watches
    /// see changes in resourceVersion order).
    fn write_pod(&mut self, ns: &str, name: &str, mut pod: Value) -> Value {
        self.resource_version += 1;
        pod["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        let prev = self.pods.insert((ns.to_owned(), name.to_owned()), pod.clone());
        let kind = if prev.is_some() { history::ChangeKind::Modified } else { history::ChangeKind::Added };
        self.record(kind, pod_key(ns, name), &pod, prev);
        pod
    }

    /// Removes a pod: the deletion gets a new resourceVersion, which the DELETED event's object
    /// (and the answer) carry.
    fn remove_pod(&mut self, ns: &str, name: &str) -> Option<Value> {
        let prev = self.pods.remove(&(ns.to_owned(), name.to_owned()))?;
        self.resource_version += 1;
        let mut gone = prev.clone();
        gone["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.record(history::ChangeKind::Deleted, pod_key(ns, name), &gone, Some(prev));
        Some(gone)
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn rand_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    format!("{:016x}", h.finish())
}

async fn record_and_authorize(State(fake): St, req: Request, next: Next) -> Response {
    let recorded = RecordedRequest {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
        query: req.uri().query().unwrap_or_default().to_owned(),
        headers: req.headers().clone(),
    };
    let (fail_with, delay, impersonation_forbidden) = {
        let mut inner = fake.lock();
        inner.requests.push(recorded);
        (inner.fail_with, inner.delay, inner.impersonation_forbidden)
    };
    if let Some(d) = delay {
        tokio::time::sleep(d).await; // simulates a slow API server, not a synchronisation
    }
    let expected = format!("Bearer {}", fake.token);
    let authorized = req.headers().get("authorization").and_then(|v| v.to_str().ok()) == Some(expected.as_str());
    if !authorized {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    }
    // The API server's impersonation filter: after authentication, before everything else.
    let headers = req.headers();
    let impersonating = headers.keys().any(|k| k.as_str().starts_with("impersonate-"));
    if impersonating {
        let Some(user) = headers.get("impersonate-user").and_then(|v| v.to_str().ok()) else {
            let requested: Vec<_> = headers.keys().filter(|k| k.as_str().starts_with("impersonate-")).collect();
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                &format!("Internal error occurred: requested {requested:?} without impersonating a user"),
            );
        };
        if impersonation_forbidden {
            return status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "users \"{user}\" is forbidden: User \"system:serviceaccount:agentk:agentk\" cannot \
                     impersonate resource \"users\" in API group \"\" at the cluster scope"
                ),
            );
        }
    }
    if let Some(code) = fail_with {
        return status(
            code,
            "Forbidden",
            "pods is forbidden: User \"system:serviceaccount:agentk\" cannot list resource \"pods\"",
        );
    }
    next.run(req).await
}

async fn version() -> impl IntoResponse {
    axum::Json(json!({
        "major": "1", "minor": "34", "gitVersion": "v1.34.0-fake", "gitCommit": "fake",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
        "compiler": "gc", "platform": "linux/amd64",
    }))
}

async fn api_versions(State(fake): St, headers: HeaderMap) -> Response {
    if store::wants_aggregated(&headers) {
        return store::aggregated_core(&fake);
    }
    axum::Json(json!({
        "kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
    }))
    .into_response()
}

/// `GET /api/v1`: pods and the store's core kinds.
async fn api_resources(State(fake): St) -> impl IntoResponse {
    let resources = store::resource_entries(&fake, "", "v1");
    axum::Json(json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources}))
}

fn is_watch(q: &std::collections::HashMap<String, String>) -> bool {
    q.get("watch").and_then(|v| watch::flag(v)).unwrap_or(false)
}

/// Whether the client asked for server-side printing (`Accept: ...;as=Table;...`), as kubectl does.
fn wants_table(headers: &HeaderMap) -> bool {
    headers.get_all("accept").iter().filter_map(|v| v.to_str().ok()).any(|v| v.contains("as=Table"))
}

/// A `meta.k8s.io/v1` Table, the way the API server prints objects for kubectl: columns as
/// (name, type, format), one row of cells per object.
pub(crate) fn table(
    columns: &[(&str, &str, &str)],
    objects: &[Value],
    cells: impl Fn(&Value) -> Value,
    resource_version: &str,
) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            json!({
                "cells": cells(o),
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]},
            })
        })
        .collect();
    let columns: Vec<Value> = columns
        .iter()
        .map(|(name, ty, format)| json!({"name": name, "type": ty, "format": format, "description": "", "priority": 0}))
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// A Table of pods.
fn pod_table(pods: &[Value], resource_version: &str) -> Value {
    let columns = [
        ("Name", "string", "name"),
        ("Ready", "string", ""),
        ("Status", "string", ""),
        ("Restarts", "integer", ""),
        ("Age", "string", ""),
    ];
    // Ready containers of all, from the container statuses where the pod has them.
    let ready = |p: &Value| match p["status"]["containerStatuses"].as_array() {
        Some(statuses) => {
            let ready = statuses.iter().filter(|s| s["ready"] == true).count();
            let all = p["spec"]["containers"].as_array().map_or(statuses.len(), Vec::len);
            format!("{ready}/{all}")
        }
        None => "1/1".to_owned(),
    };
    table(
        &columns,
        pods,
        |p| json!([p["metadata"]["name"], ready(p), p["status"]["phase"].as_str().unwrap_or("Running"), 0, "1d"]),
        resource_version,
    )
}

/// How pods are listed and watched, in one namespace or all.
fn pod_view(
    namespace: Option<String>,
    q: &std::collections::HashMap<String, String>,
) -> Result<watch::View, patch::Refusal> {
    let selector = selector::Selector::from_query(q, "/v1, Resource=pods", true, POD_FIELDS)?;
    Ok(watch::View {
        target: history::Target { group: String::new(), resource: "pods".into(), namespace },
        api_version: "v1".into(),
        kind: "Pod".into(),
        typed: true,
        selector,
        printer: Box::new(pod_table),
    })
}

/// A watch of pods (all namespaces, or one), else their list.
async fn list_or_watch_pods(
    fake: Arc<Shared>,
    namespace: Option<String>,
    q: &std::collections::HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    let view = match pod_view(namespace, q) {
        Ok(view) => view,
        Err(response) => return *response,
    };
    if is_watch(q) {
        return watch::serve(fake, view, q, headers).await;
    }
    list::serve(&fake, &view, q, headers)
}

async fn list_all_pods(
    State(fake): St,
    headers: HeaderMap,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    list_or_watch_pods(fake, None, &q, &headers).await
}

async fn list_namespaced_pods(
    State(fake): St,
    headers: HeaderMap,
    Path(ns): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    list_or_watch_pods(fake, Some(ns), &q, &headers).await
}

async fn get_pod(State(fake): St, headers: HeaderMap, Path((ns, name)): Path<(String, String)>) -> Response {
    let pod = fake.lock().pods.get(&(ns.clone(), name.clone())).cloned();
    match pod {
        Some(p) if wants_table(&headers) => {
            let rv = p["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_owned();
            axum::Json(pod_table(&[p], &rv)).into_response()
        }
        Some(p) => axum::Json(p).into_response(),
        None => status(StatusCode::NOT_FOUND, "NotFound", &format!("pods \"{name}\" not found")),
    }
}

fn record_body(fake: &Shared, method: &str, path: String, headers: &HeaderMap, body: &Bytes) {
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    fake.lock().bodies.push(RecordedBody { method: method.to_owned(), path, content_type, body: body.clone() });
}

/// Stores a pod object as the API server would: namespace, name, resourceVersion, uid filled in.
fn store_pod(fake: &Shared, ns: &str, name: &str, mut obj: Value) -> Value {
    if !obj.is_object() {
        obj = json!({});
    }
    obj["apiVersion"] = json!("v1");
    obj["kind"] = json!("Pod");
    let meta = &mut obj["metadata"];
    if !meta.is_object() {
        *meta = json!({});
    }
    meta["name"] = json!(name);
    meta["namespace"] = json!(ns);
    meta["uid"] = json!(format!("uid-{ns}-{name}"));
    if meta.get("creationTimestamp").is_none_or(Value::is_null) {
        meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    if obj.get("status").is_none() {
        obj["status"] = json!({"phase": "Pending"});
    }
    fake.lock().write_pod(ns, name, obj)
}

async fn create_pod(State(fake): St, Path(ns): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    record_body(&fake, "POST", format!("/api/v1/namespaces/{ns}/pods"), &headers, &body);
    let Ok(obj) = serde_json::from_slice::<Value>(&body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "the body is not a JSON object");
    };
    let Some(name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", "metadata.name: Required value");
    };
    if fake.lock().pods.contains_key(&(ns.clone(), name.clone())) {
        return status(StatusCode::CONFLICT, "AlreadyExists", &format!("pods \"{name}\" already exists"));
    }
    (StatusCode::CREATED, axum::Json(store_pod(&fake, &ns, &name, obj))).into_response()
}

/// RFC 7386 merge (what merge-patch and, for the fields tests use, strategic-merge-patch do):
/// objects field by field, everything else (lists too) replaced.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

async fn patch_pod(
    State(fake): St,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    record_body(&fake, "PATCH", format!("/api/v1/namespaces/{ns}/pods/{name}"), &headers, &body);
    let Some(mut obj) = fake.lock().pods.get(&(ns.clone(), name.clone())).cloned() else {
        return status(StatusCode::NOT_FOUND, "NotFound", &format!("pods \"{name}\" not found"));
    };
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "the patch is not JSON");
    };
    merge(&mut obj, &patch);
    axum::Json(store_pod(&fake, &ns, &name, obj)).into_response()
}

async fn put_pod(
    State(fake): St,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    record_body(&fake, "PUT", format!("/api/v1/namespaces/{ns}/pods/{name}"), &headers, &body);
    let Ok(obj) = serde_json::from_slice::<Value>(&body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "the body is not JSON");
    };
    axum::Json(store_pod(&fake, &ns, &name, obj)).into_response()
}

async fn delete_pod(State(fake): St, Path((ns, name)): Path<(String, String)>) -> Response {
    let removed = fake.lock().remove_pod(&ns, &name);
    match removed {
        Some(obj) => axum::Json(obj).into_response(),
        None => status(StatusCode::NOT_FOUND, "NotFound", &format!("pods \"{name}\" not found")),
    }
}

/// Decrements the follower count when a follow stream is dropped (the client went away).
struct Follower(Arc<Shared>);

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.lock().log_followers -= 1;
    }
}

async fn pod_log(
    State(fake): St,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let key = (ns.clone(), name.clone());
    let text = |b: Body| {
        Response::builder()
            .header("content-type", "text/plain")
            .body(b)
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
    };
    let broken = fake.lock().broken_logs.get(&key).copied();
    if let Some(bytes) = broken {
        let head = futures::stream::iter(big_log_chunks(bytes).map(Ok::<_, std::io::Error>));
        // The failure comes a moment later, as a real one would: what was sent is on the wire
        // (an immediate failure would make hyper drop the unflushed head too).
        let failure = futures::stream::once(async {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            Err(std::io::Error::other("the API server failed mid-response"))
        });
        return text(Body::from_stream(head.chain(failure)));
    }
    let big = fake.lock().big_logs.get(&key).copied();
    if let Some(size) = big {
        let cached = fake.lock().big_log_cache.get(&size).cloned();
        let cached = match cached {
            Some(c) => c,
            None => {
                let made = Arc::new(big_log_chunks(size).collect::<Vec<_>>());
                fake.lock().big_log_cache.entry(size).or_insert(made).clone()
            }
        };
        let counter = fake.clone();
        let chunks = futures::stream::iter((0..cached.len()).map(move |i| {
            counter.lock().big_log_bytes_sent += cached[i].len() as u64;
            Ok::<_, Infallible>(cached[i].clone())
        }));
        return text(Body::from_stream(chunks));
    }
    let (existing, exists) = {
        let inner = fake.lock();
        (inner.logs.get(&key).cloned().unwrap_or_default(), inner.pods.contains_key(&key))
    };
    if !exists {
        return status(StatusCode::NOT_FOUND, "NotFound", &format!("pods \"{name}\" not found"));
    }
    let initial: String = existing.iter().map(|l| format!("{l}\n")).collect();
    let follow = q.get("follow").is_some_and(|v| v == "true" || v == "1");
    if !follow {
        return text(Body::from(initial));
    }
    // Subscribe before releasing the lock-held snapshot order: lines appended after the snapshot
    // arrive through the channel.
    let lines = BroadcastStream::new(fake.log_lines.subscribe());
    fake.lock().log_followers += 1;
    let follower = Follower(fake.clone());
    let live = lines.filter_map(move |ev| {
        let key = key.clone();
        let _keep = &follower;
        async move {
            let (ns, pod, line) = ev.ok()?;
            ((ns, pod) == key).then(|| Ok::<_, Infallible>(Bytes::from(format!("{line}\n"))))
        }
    });
    let stream = futures::stream::once(async move { Ok::<_, Infallible>(Bytes::from(initial)) }).chain(live);
    text(Body::from_stream(stream))
}

/// `pods/exec` over WebSocket (see [`crate::remote_command`]).
async fn exec(
    State(fake): St,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let command: Vec<String> = q.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.clone()).collect();
    remote_command(fake, ns, name, &q, req, Some(command)).await
}

/// `pods/attach` (see [`crate::remote_command`]).
async fn attach(
    State(fake): St,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    remote_command(fake, ns, name, &q, req, None).await
}

/// Exec (`command`) or attach (`None`) over WebSocket ([`crate::remote_command`]) or SPDY/3.1
/// ([`crate::spdy_remote_command`]).
async fn remote_command(
    fake: Arc<Shared>,
    ns: String,
    name: String,
    q: &[(String, String)],
    req: Request,
    command: Option<Vec<String>>,
) -> Response {
    use axum::extract::FromRequest;
    if !fake.lock().pods.contains_key(&(ns.clone(), name.clone())) {
        return status(StatusCode::NOT_FOUND, "NotFound", &format!("pods \"{name}\" not found"));
    }
    let flag = |name: &str| q.iter().any(|(k, v)| k == name && (v == "true" || v == "1"));
    let upgrade = req.headers().get("upgrade").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if upgrade.eq_ignore_ascii_case("SPDY/3.1") {
        let channels = crate::spdy_remote_command::Channels {
            stdin: flag("stdin"),
            stdout: flag("stdout"),
            stderr: flag("stderr"),
            tty: flag("tty"),
        };
        let dir = fake.containers.filesystem(&ns, &name);
        let command = command.unwrap_or_else(|| vec!["cat".to_owned()]);
        return crate::spdy_remote_command::serve(req, fake.containers.clone(), dir, command, channels);
    }
    let Ok(ws) = axum::extract::ws::WebSocketUpgrade::from_request(req, &()).await else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "this endpoint needs a WebSocket or SPDY/3.1 upgrade");
    };
    let session = match command {
        Some(command) => crate::remote_command::Session::Exec(command),
        None => crate::remote_command::Session::Attach,
    };
    crate::remote_command::serve(fake.containers.clone(), ws, ns, name, session, flag("stdin"), flag("tty"))
}

async fn port_forward(State(fake): St, req: Request) -> Response {
    crate::spdy_passthrough::port_forward(fake.port_forwards.clone(), req).await
}

impl FakeKube {
    /// Port-forward sessions so far: (transport `spdy` or `websocket`, what each saw).
    pub fn port_forwards(&self) -> Vec<(&'static str, crate::spdy::PortForwardRecord)> {
        let sessions = self.shared.port_forwards.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        sessions
            .into_iter()
            .map(|(transport, record)| {
                (transport, record.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
            })
            .collect()
    }

    /// Pod filesystems and what the remote-command sessions saw.
    pub fn containers(&self) -> Arc<crate::remote_command::Containers> {
        self.shared.containers.clone()
    }
}
