//! A fake GitLab serving the one internal API kas calls in GitLab mode:
//! `GET /api/v4/internal/kubernetes/agent_info`.
//!
//! It checks the `Gitlab-Kas-Api-Request` JWT the way GitLab does (HS256 only, issuer
//! `gitlab-kas`, audience `gitlab`, not expired, signed with the shared secret), with
//! `jsonwebtoken` directly rather than kas's own verifier, so a passing test proves kas
//! interoperates with GitLab's rules rather than agreeing with itself. A failed check is a 401.
//! Then it looks the `Authorization: Bearer <agent token>` up: unknown or revoked → 401,
//! forbidden → 403, known → the documented agent_info JSON.
//!
//! [`FakeGitlab::start_tls`] serves HTTPS with a self-signed certificate (its own CA, see
//! [`FakeGitlab::ca_file`]); [`FakeGitlab::redirect_to`] makes it answer with a redirect.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use kas::auth::Secret;
use serde_json::json;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::certificates::{Certificate, LOCALHOST_AND_IP};
use crate::tls_listener::TlsListener;

/// An agent as GitLab knows it.
#[derive(Debug, Clone)]
pub struct GitlabAgent {
    pub agent_id: i64,
    pub project_id: i64,
    pub name: String,
}

#[derive(Default)]
struct Inner {
    agents: HashMap<String, GitlabAgent>,
    forbidden: HashSet<String>,
    /// Answer every request with this status (GitLab failing), after the JWT check.
    fail_with: Option<StatusCode>,
    /// Answer requests without a query string with this redirect (status, `Location`).
    redirect: Option<(StatusCode, String)>,
    delay: Duration,
}

struct Shared {
    key: DecodingKey,
    inner: Mutex<Inner>,
    requests: AtomicUsize,
    jwt_rejections: AtomicUsize,
    query_requests: AtomicUsize,
    tls_handshake_failures: AtomicUsize,
}

/// The TLS side of a fake started with [`FakeGitlab::start_tls`].
struct Tls {
    ca_pem: String,
    ca_file: PathBuf,
    _dir: tempfile::TempDir,
}

/// Handle to a running fake GitLab; the server stops when the last handle is dropped.
#[derive(Clone)]
pub struct FakeGitlab {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tls: Option<Arc<Tls>>,
    _stop_on_drop: Arc<DropGuard>,
}

impl FakeGitlab {
    /// Starts the fake on an ephemeral loopback port; `secret` is the secret GitLab shares with kas.
    pub async fn start(secret: &Secret) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind fake gitlab");
        let addr = listener.local_addr().expect("addr");
        let shared = Shared::new(secret);
        let app = router(&shared);
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        });
        Self { shared, addr, tls: None, _stop_on_drop: Arc::new(shutdown.drop_guard()) }
    }

    /// Like [`FakeGitlab::start`], serving HTTPS with a fresh self-signed certificate for
    /// `localhost` and `127.0.0.1` (its own CA: [`FakeGitlab::ca_file`]). TLS handshakes run
    /// concurrently, off the accept loop; failed ones are counted
    /// ([`FakeGitlab::tls_handshake_failures`]).
    pub async fn start_tls(secret: &Secret) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let certificate = Certificate::self_signed(LOCALHOST_AND_IP);
        let ca_pem = certificate.pem();
        let ca_file = dir.path().join("gitlab.crt");
        std::fs::write(&ca_file, &ca_pem).expect("write cert");
        // HTTP/2 and HTTP/1.1 offered (ALPN), as kas's own HTTPS listeners do.
        let acceptor = certificate.acceptor(&[b"h2", b"http/1.1"]);

        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind fake gitlab");
        let addr = tcp.local_addr().expect("addr");
        let shared = Shared::new(secret);
        let app = router(&shared);
        let shutdown = CancellationToken::new();
        let counters = shared.clone();
        let listener = TlsListener::start(tcp, acceptor, shutdown.clone(), move || {
            counters.tls_handshake_failures.fetch_add(1, Ordering::SeqCst);
        });
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        });
        let tls = Tls { ca_pem, ca_file, _dir: dir };
        Self { shared, addr, tls: Some(Arc::new(tls)), _stop_on_drop: Arc::new(shutdown.drop_guard()) }
    }

    /// GitLab's base URL: `http://127.0.0.1:40123`, or `https://localhost:40123` over TLS.
    pub fn url(&self) -> String {
        if self.tls.is_some() {
            format!("https://localhost:{}", self.addr.port())
        } else {
            format!("http://{}", self.addr)
        }
    }

    /// The PEM certificate (its own CA) of a fake serving TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// A file holding [`FakeGitlab::ca_pem`] (lives as long as the fake), for `gitlab.ca_cert_file`.
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref().map(|t| t.ca_file.as_path())
    }

    /// Registers an agent token.
    pub fn add_agent(&self, token: &str, agent: GitlabAgent) {
        self.shared.inner.lock().unwrap().agents.insert(token.to_owned(), agent);
    }

    /// Revokes a token: GitLab answers 401 for it from now on.
    pub fn revoke(&self, token: &str) {
        self.shared.inner.lock().unwrap().agents.remove(token);
    }

    /// GitLab answers 403 for this token from now on.
    pub fn forbid(&self, token: &str) {
        self.shared.inner.lock().unwrap().forbidden.insert(token.to_owned());
    }

    /// Every request (with a valid JWT) is answered with this status; `None` restores service.
    pub fn fail_with(&self, status: Option<StatusCode>) {
        self.shared.inner.lock().unwrap().fail_with = status;
    }

    /// agent_info requests without a query string are answered with this redirect (status and
    /// `Location`), before any check; requests with a query string (e.g. a `Location` of
    /// `{url}/api/v4/internal/kubernetes/agent_info?redirected=1`) are served normally.
    /// `None` stops redirecting.
    pub fn redirect_to(&self, redirect: Option<(StatusCode, String)>) {
        self.shared.inner.lock().unwrap().redirect = redirect;
    }

    /// Every answer is delayed this long (makes concurrent requests overlap).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.inner.lock().unwrap().delay = delay;
    }

    /// agent_info requests received (whatever the answer).
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// agent_info requests that carried a query string (a followed redirect, see
    /// [`FakeGitlab::redirect_to`]).
    pub fn query_requests(&self) -> usize {
        self.shared.query_requests.load(Ordering::SeqCst)
    }

    /// TLS handshakes that failed (e.g. the client did not trust the certificate).
    pub fn tls_handshake_failures(&self) -> usize {
        self.shared.tls_handshake_failures.load(Ordering::SeqCst)
    }

    /// Requests refused because their `Gitlab-Kas-Api-Request` JWT failed a check.
    pub fn jwt_rejections(&self) -> usize {
        self.shared.jwt_rejections.load(Ordering::SeqCst)
    }
}

impl Shared {
    fn new(secret: &Secret) -> Arc<Self> {
        Arc::new(Self {
            key: DecodingKey::from_secret(secret.bytes()),
            inner: Mutex::default(),
            requests: AtomicUsize::new(0),
            jwt_rejections: AtomicUsize::new(0),
            query_requests: AtomicUsize::new(0),
            tls_handshake_failures: AtomicUsize::new(0),
        })
    }
}

fn router(shared: &Arc<Shared>) -> Router {
    Router::new().route("/api/v4/internal/kubernetes/agent_info", get(agent_info)).with_state(shared.clone())
}

fn unauthorized(message: &str) -> Response {
    (StatusCode::UNAUTHORIZED, axum::Json(json!({ "message": format!("401 Unauthorized - {message}") })))
        .into_response()
}

async fn agent_info(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery, headers: HeaderMap) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    if query.is_some() {
        shared.query_requests.fetch_add(1, Ordering::SeqCst);
    } else if let Some((status, location)) = shared.inner.lock().unwrap().redirect.clone() {
        return (status, [(header::LOCATION, location)]).into_response();
    }
    // GitLab's Gitlab::Kas.verify_api_request: HS256, iss gitlab-kas, aud gitlab, exp.
    let jwt = headers.get("gitlab-kas-api-request").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_issuer(&["gitlab-kas"]);
    validation.set_audience(&["gitlab"]);
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    validation.leeway = 0;
    if let Err(e) = jsonwebtoken::decode::<serde_json::Value>(jwt, &shared.key, &validation) {
        shared.jwt_rejections.fetch_add(1, Ordering::SeqCst);
        return unauthorized(&format!("kas JWT rejected: {e}"));
    }
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_owned();
    let (delay, fail_with, forbidden, agent) = {
        let inner = shared.inner.lock().unwrap();
        (inner.delay, inner.fail_with, inner.forbidden.contains(&token), inner.agents.get(&token).cloned())
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(status) = fail_with {
        return (status, axum::Json(json!({ "message": status.to_string() }))).into_response();
    }
    if forbidden {
        return (StatusCode::FORBIDDEN, axum::Json(json!({ "message": "403 Forbidden" }))).into_response();
    }
    let Some(a) = agent else { return unauthorized("invalid agent token") };
    // The documented agent_info response (plus a field kas does not know, as GitLab adds fields).
    axum::Json(json!({
        "project_id": a.project_id,
        "agent_id": a.agent_id,
        "agent_name": a.name,
        "gitaly_info": {"address": "unix:/fake/gitaly.socket", "token": "fake-gitaly-token", "features": {}},
        "gitaly_repository": {
            "storage_name": "default",
            "relative_path": format!("@hashed/{}.git", a.project_id),
            "gl_repository": format!("project-{}", a.project_id),
            "gl_project_path": crate::cluster::project_path(a.project_id),
        },
        "default_branch": "main",
        "added_by_a_future_gitlab": true,
    }))
    .into_response()
}
