//! A fake Kubernetes API server (axum) following the real API's shapes: discovery, pods list,
//! get and watch. It records every request (so tests can check what agentk sent) and requires
//! the service-account bearer token it was created with, as a real API server would.

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

/// A request as the fake API server received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: HeaderMap,
}

#[derive(Default)]
struct Inner {
    /// (namespace, name) -> pod object
    pods: BTreeMap<(String, String), Value>,
    requests: Vec<RecordedRequest>,
    resource_version: u64,
    /// When set, every API call answers with this status (RBAC failures and the like).
    fail_with: Option<StatusCode>,
    /// When set, every API call is answered this much later (a slow API server).
    delay: Option<std::time::Duration>,
}

/// What the server task shares with the handle.
struct Shared {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Value>,
    token: String,
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

fn pod_object(namespace: &str, name: &str, rv: u64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "resourceVersion": rv.to_string(),
            "uid": format!("uid-{namespace}-{name}"), "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running"},
    })
}

impl FakeKube {
    /// Starts the server on an ephemeral loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind fake kube");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            inner: Mutex::default(),
            events: broadcast::channel(1024).0,
            token: format!("sa-token-{}", rand_suffix()),
        });
        let shutdown = CancellationToken::new();
        let app = Router::new()
            .route("/version", get(version))
            .route("/api", get(api_versions))
            .route("/apis", get(api_groups))
            .route("/api/v1", get(api_resources))
            .route("/api/v1/pods", get(list_all_pods))
            .route("/api/v1/namespaces/{ns}/pods", get(list_namespaced_pods))
            .route("/api/v1/namespaces/{ns}/pods/{name}", get(get_pod))
            .layer(middleware::from_fn_with_state(shared.clone(), record_and_authorize))
            .with_state(shared.clone());
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

    pub fn add_pod(&self, namespace: &str, name: &str) {
        let mut inner = self.lock();
        inner.resource_version += 1;
        let obj = pod_object(namespace, name, inner.resource_version);
        inner.pods.insert((namespace.to_owned(), name.to_owned()), obj.clone());
        drop(inner);
        let _ = self.shared.events.send(json!({"type": "ADDED", "object": obj}));
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut inner = self.lock();
        inner.resource_version += 1;
        if let Some(obj) = inner.pods.remove(&(namespace.to_owned(), name.to_owned())) {
            drop(inner);
            let _ = self.shared.events.send(json!({"type": "DELETED", "object": obj}));
        }
    }

    /// (namespace, name) of every pod, sorted.
    pub fn pod_names(&self) -> Vec<(String, String)> {
        self.lock().pods.keys().cloned().collect()
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared.lock()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn pod_list(&self, namespace: Option<&str>) -> Value {
        let inner = self.lock();
        let items: Vec<Value> = inner
            .pods
            .iter()
            .filter(|((ns, _), _)| namespace.is_none_or(|n| n == ns))
            .map(|(_, v)| v.clone())
            .collect();
        json!({
            "apiVersion": "v1", "kind": "PodList",
            "metadata": {"resourceVersion": inner.resource_version.to_string()},
            "items": items,
        })
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
    let (fail_with, delay) = {
        let mut inner = fake.lock();
        inner.requests.push(recorded);
        (inner.fail_with, inner.delay)
    };
    if let Some(d) = delay {
        tokio::time::sleep(d).await; // simulates a slow API server, not a synchronisation
    }
    let expected = format!("Bearer {}", fake.token);
    let authorized = req.headers().get("authorization").and_then(|v| v.to_str().ok()) == Some(expected.as_str());
    if !authorized {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
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

async fn api_versions() -> impl IntoResponse {
    axum::Json(json!({
        "kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
    }))
}

async fn api_groups() -> impl IntoResponse {
    axum::Json(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}))
}

async fn api_resources() -> impl IntoResponse {
    axum::Json(json!({
        "kind": "APIResourceList", "groupVersion": "v1",
        "resources": [
            {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["po"]},
            {"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]},
        ],
    }))
}

fn is_watch(q: &std::collections::HashMap<String, String>) -> bool {
    q.get("watch").is_some_and(|v| v == "1" || v == "true")
}

async fn list_all_pods(State(fake): St, Query(q): Query<std::collections::HashMap<String, String>>) -> Response {
    if is_watch(&q) {
        return watch(fake, None);
    }
    axum::Json(fake.pod_list(None)).into_response()
}

async fn list_namespaced_pods(
    State(fake): St,
    Path(ns): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    if is_watch(&q) {
        return watch(fake, Some(ns));
    }
    axum::Json(fake.pod_list(Some(&ns))).into_response()
}

async fn get_pod(State(fake): St, Path((ns, name)): Path<(String, String)>) -> Response {
    match fake.lock().pods.get(&(ns.clone(), name.clone())) {
        Some(p) => axum::Json(p.clone()).into_response(),
        None => status(StatusCode::NOT_FOUND, "NotFound", &format!("pods \"{name}\" not found")),
    }
}

/// Streams watch events (one JSON object per line) until the client goes away.
fn watch(fake: Arc<Shared>, namespace: Option<String>) -> Response {
    let events = BroadcastStream::new(fake.events.subscribe()).filter_map(move |ev| {
        let namespace = namespace.clone();
        async move {
            let ev = ev.ok()?;
            let ns = ev["object"]["metadata"]["namespace"].as_str().unwrap_or_default().to_owned();
            if namespace.as_ref().is_some_and(|n| *n != ns) {
                return None;
            }
            Some(Ok::<_, Infallible>(Bytes::from(format!("{ev}\n"))))
        }
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
