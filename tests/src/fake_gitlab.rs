//! A fake GitLab serving the one internal API kas calls in GitLab mode:
//! `GET /api/v4/internal/kubernetes/agent_info`.
//!
//! It checks the `Gitlab-Kas-Api-Request` JWT the way GitLab does (HS256 only, issuer
//! `gitlab-kas`, audience `gitlab`, not expired, signed with the shared secret), with
//! `jsonwebtoken` directly rather than kas's own verifier, so a passing test proves kas
//! interoperates with GitLab's rules rather than agreeing with itself. A failed check is a 401.
//! Then it looks the `Authorization: Bearer <agent token>` up: unknown or revoked → 401,
//! forbidden → 403, known → the documented agent_info JSON.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use kas::auth::Secret;
use serde_json::json;
use tokio_util::sync::{CancellationToken, DropGuard};

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
    delay: Duration,
}

struct Shared {
    key: DecodingKey,
    inner: Mutex<Inner>,
    requests: AtomicUsize,
    jwt_rejections: AtomicUsize,
}

/// Handle to a running fake GitLab; the server stops when the last handle is dropped.
#[derive(Clone)]
pub struct FakeGitlab {
    shared: Arc<Shared>,
    addr: SocketAddr,
    _stop_on_drop: Arc<DropGuard>,
}

impl FakeGitlab {
    /// Starts the fake on an ephemeral loopback port; `secret` is the secret GitLab shares with kas.
    pub async fn start(secret: &Secret) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind fake gitlab");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            key: DecodingKey::from_secret(secret.bytes()),
            inner: Mutex::default(),
            requests: AtomicUsize::new(0),
            jwt_rejections: AtomicUsize::new(0),
        });
        let app =
            Router::new().route("/api/v4/internal/kubernetes/agent_info", get(agent_info)).with_state(shared.clone());
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        });
        Self { shared, addr, _stop_on_drop: Arc::new(shutdown.drop_guard()) }
    }

    /// GitLab's base URL, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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

    /// Every answer is delayed this long (makes concurrent requests overlap).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.inner.lock().unwrap().delay = delay;
    }

    /// agent_info requests received (whatever the answer).
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Requests refused because their `Gitlab-Kas-Api-Request` JWT failed a check.
    pub fn jwt_rejections(&self) -> usize {
        self.shared.jwt_rejections.load(Ordering::SeqCst)
    }
}

fn unauthorized(message: &str) -> Response {
    (StatusCode::UNAUTHORIZED, axum::Json(json!({ "message": format!("401 Unauthorized - {message}") })))
        .into_response()
}

async fn agent_info(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
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
            "gl_project_path": format!("group/project-{}", a.project_id),
        },
        "default_branch": "main",
        "added_by_a_future_gitlab": true,
    }))
    .into_response()
}
