//! A fake GitLab serving the APIs kas calls in GitLab mode:
//! `GET /api/v4/internal/kubernetes/agent_info` (agent tokens), `GET /api/v4/job/allowed_agents`
//! (CI job tokens), `POST /api/v4/internal/kubernetes/authorize_proxy_user` (users'
//! personal access tokens) and `GET /api/v4/internal/kubernetes/project_info` (GitOps manifest
//! projects).
//!
//! It checks the `Gitlab-Kas-Api-Request` JWT the way GitLab does (HS256 only, issuer
//! `gitlab-kas`, audience `gitlab`, not expired, signed with the shared secret), with
//! `jsonwebtoken` directly rather than kas's own verifier, so a passing test proves kas
//! interoperates with GitLab's rules rather than agreeing with itself. A failed check is a 401.
//! Then it looks the `Authorization: Bearer <agent token>` up: unknown or revoked → 401,
//! forbidden → 403, known → the documented agent_info JSON.
//!
//! allowed_agents takes the `Job-Token` header (no kas JWT: it is GitLab's public API): a job
//! token of no running job (unknown, or revoked with [`FakeGitlab::revoke_job`]) → 401, else the
//! job's agents as GitLab's `API::Ci::Jobs` writes them. authorize_proxy_user checks the JWT as
//! agent_info does, then answers as GitLab's `API::Internal::Kubernetes` does for a personal
//! access token: no user has it → 400, revoked → 401, the agent does not exist (no
//! [`FakeGitlab::add_agent`] named it) → 404, the user may not use it → 403, else 201 with the
//! user's `access_as`.
//!
//! project_info checks the JWT and the agent token as agent_info does (unknown → 401, forbidden
//! → 403), then answers as GitLab's `API::Internal::Kubernetes`: a project that does not exist
//! ([`FakeGitlab::add_project`] never named it, by full path or id) or that the agent may not
//! read ([`FakeGitlab::deny_project`]) → 404 (GitLab does not tell them apart), else the
//! project's id, Gitaly location (`gl_project_path` = its full path) and default branch.
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
use axum::routing::{get, post};
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

/// A running CI job as GitLab knows it: what allowed_agents answers for its token.
#[derive(Debug, Clone, Default)]
pub struct FakeJob {
    pub job_id: i64,
    pub pipeline_id: i64,
    pub project_id: i64,
    /// The project's group and its ancestors.
    pub group_ids: Vec<i64>,
    pub environment: Option<FakeEnvironment>,
    /// The user running the job.
    pub user_id: i64,
    pub username: String,
    pub allowed_agents: Vec<FakeAllowedAgent>,
}

#[derive(Debug, Clone)]
pub struct FakeEnvironment {
    pub slug: String,
    pub tier: String,
}

/// An agent whose `ci_access` authorizes the job's project (or one of its groups).
#[derive(Debug, Clone)]
pub struct FakeAllowedAgent {
    pub agent_id: i64,
    pub config_project_id: i64,
    /// The `ci_access` entry as GitLab stores it, e.g.
    /// `{"default_namespace": "prod", "access_as": {"ci_job": {}}}` (answered as is).
    pub configuration: serde_json::Value,
}

/// A GitLab user holding a personal access token.
#[derive(Debug, Clone, Default)]
pub struct FakeUser {
    pub id: i64,
    pub username: String,
    /// Agent id → the `access_as` GitLab answers for this user on that agent, e.g.
    /// `{"agent": {}}` or `{"user": {"projects": [{"id": 1, "roles": ["developer"]}]}}`.
    /// Agents not listed: 403.
    pub agents: HashMap<i64, serde_json::Value>,
}

#[derive(Default)]
struct Inner {
    agents: HashMap<String, GitlabAgent>,
    /// Agents that exist (agent id → configuration project id): every agent ever added, revoked
    /// tokens or not.
    known_agents: HashMap<i64, i64>,
    jobs: HashMap<String, FakeJob>,
    users: HashMap<String, FakeUser>,
    revoked_user_tokens: HashSet<String>,
    forbidden: HashSet<String>,
    /// Manifest projects: full path → (project id, default branch).
    projects: HashMap<String, (i64, String)>,
    /// (agent token, project full path) the agent may not read.
    denied_projects: HashSet<(String, String)>,
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
    allowed_agents_requests: AtomicUsize,
    authorize_proxy_user_requests: AtomicUsize,
    project_info_requests: AtomicUsize,
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

    /// Registers an agent token (and the agent: it exists from now on).
    pub fn add_agent(&self, token: &str, agent: GitlabAgent) {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.known_agents.insert(agent.agent_id, agent.project_id);
        inner.agents.insert(token.to_owned(), agent);
    }

    /// Starts a CI job holding `token`: allowed_agents answers with `job`.
    pub fn add_job(&self, token: &str, job: FakeJob) {
        self.shared.inner.lock().unwrap().jobs.insert(token.to_owned(), job);
    }

    /// Ends the job holding `token`: allowed_agents answers 401 for it from now on.
    pub fn revoke_job(&self, token: &str) {
        self.shared.inner.lock().unwrap().jobs.remove(token);
    }

    /// Gives `user` the personal access token `token`.
    pub fn add_user_token(&self, token: &str, user: FakeUser) {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.revoked_user_tokens.remove(token);
        inner.users.insert(token.to_owned(), user);
    }

    /// Revokes a personal access token: authorize_proxy_user answers 401 for it from now on.
    pub fn revoke_user_token(&self, token: &str) {
        self.shared.inner.lock().unwrap().revoked_user_tokens.insert(token.to_owned());
    }

    /// Revokes a token: GitLab answers 401 for it from now on.
    pub fn revoke(&self, token: &str) {
        self.shared.inner.lock().unwrap().agents.remove(token);
    }

    /// GitLab answers 403 for this token from now on.
    pub fn forbid(&self, token: &str) {
        self.shared.inner.lock().unwrap().forbidden.insert(token.to_owned());
    }

    /// Creates a project (project_info answers for it, by full path or id, with this default
    /// branch).
    pub fn add_project(&self, full_path: &str, id: i64, default_branch: &str) {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.projects.insert(full_path.to_owned(), (id, default_branch.to_owned()));
    }

    /// The agent holding `token` may not read the project any more: project_info answers 404.
    pub fn deny_project(&self, token: &str, full_path: &str) {
        self.shared.inner.lock().unwrap().denied_projects.insert((token.to_owned(), full_path.to_owned()));
    }

    /// project_info requests received (whatever the answer).
    pub fn project_info_requests(&self) -> usize {
        self.shared.project_info_requests.load(Ordering::SeqCst)
    }

    /// Every request (with a valid JWT, to any endpoint) is answered with this status; `None` restores service.
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

    /// Every answer (of every endpoint) is delayed this long (makes concurrent requests overlap).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.inner.lock().unwrap().delay = delay;
    }

    /// agent_info requests received (whatever the answer).
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// allowed_agents requests received (whatever the answer).
    pub fn allowed_agents_requests(&self) -> usize {
        self.shared.allowed_agents_requests.load(Ordering::SeqCst)
    }

    /// authorize_proxy_user requests received (whatever the answer).
    pub fn authorize_proxy_user_requests(&self) -> usize {
        self.shared.authorize_proxy_user_requests.load(Ordering::SeqCst)
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
            allowed_agents_requests: AtomicUsize::new(0),
            authorize_proxy_user_requests: AtomicUsize::new(0),
            project_info_requests: AtomicUsize::new(0),
            jwt_rejections: AtomicUsize::new(0),
            query_requests: AtomicUsize::new(0),
            tls_handshake_failures: AtomicUsize::new(0),
        })
    }
}

fn router(shared: &Arc<Shared>) -> Router {
    Router::new()
        .route("/api/v4/internal/kubernetes/agent_info", get(agent_info))
        .route("/api/v4/job/allowed_agents", get(allowed_agents))
        .route("/api/v4/internal/kubernetes/authorize_proxy_user", post(authorize_proxy_user))
        .route("/api/v4/internal/kubernetes/project_info", get(project_info))
        .with_state(shared.clone())
}

fn unauthorized(message: &str) -> Response {
    (StatusCode::UNAUTHORIZED, axum::Json(json!({ "message": format!("401 Unauthorized - {message}") })))
        .into_response()
}

/// GitLab's Gitlab::Kas.verify_api_request: HS256, iss gitlab-kas, aud gitlab, exp. The 401 to
/// answer if the `Gitlab-Kas-Api-Request` JWT fails a check.
fn check_kas_jwt(shared: &Shared, headers: &HeaderMap) -> Option<Response> {
    let jwt = headers.get("gitlab-kas-api-request").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_issuer(&["gitlab-kas"]);
    validation.set_audience(&["gitlab"]);
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    validation.leeway = 0;
    let e = jsonwebtoken::decode::<serde_json::Value>(jwt, &shared.key, &validation).err()?;
    shared.jwt_rejections.fetch_add(1, Ordering::SeqCst);
    Some(unauthorized(&format!("kas JWT rejected: {e}")))
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "message": message }))).into_response()
}

/// The configured delay, then the configured failure if any.
async fn delay_or_fail(shared: &Shared) -> Option<Response> {
    let (delay, fail_with) = {
        let inner = shared.inner.lock().unwrap();
        (inner.delay, inner.fail_with)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    fail_with.map(|status| error(status, &status.to_string()))
}

/// GitLab's `ProjectIdentity` entity (kas reads only the id).
fn project_identity(id: i64) -> serde_json::Value {
    let path = crate::cluster::project_path(id);
    json!({
        "id": id, "description": "", "name": format!("project-{id}"), "name_with_namespace": path,
        "path": format!("project-{id}"), "path_with_namespace": path, "created_at": "2024-01-01T00:00:00.000Z",
    })
}

/// `GET /api/v4/job/allowed_agents`, as GitLab's `API::Ci::Jobs` answers it.
async fn allowed_agents(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    shared.allowed_agents_requests.fetch_add(1, Ordering::SeqCst);
    let token = headers.get("job-token").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let job = shared.inner.lock().unwrap().jobs.get(&token).cloned();
    if let Some(failed) = delay_or_fail(&shared).await {
        return failed;
    }
    // No running job holds the token: GitLab's job token authentication fails.
    let Some(job) = job else { return unauthorized("invalid job token") };
    let agents: Vec<_> = job
        .allowed_agents
        .iter()
        .map(|a| {
            json!({
                "id": a.agent_id,
                "config_project": project_identity(a.config_project_id),
                "configuration": a.configuration,
            })
        })
        .collect();
    let mut answer = json!({
        "allowed_agents": agents,
        "job": {"id": job.job_id},
        "pipeline": {"id": job.pipeline_id},
        "project": {"id": job.project_id, "groups": job.group_ids.iter().map(|id| json!({"id": id})).collect::<Vec<_>>()},
        "user": {"id": job.user_id, "username": job.username, "roles_in_project": ["guest", "reporter", "developer"]},
    });
    // GitLab `compact`s the answer: no environment key for jobs without one.
    if let Some(e) = &job.environment {
        answer["environment"] = json!({"slug": e.slug, "tier": e.tier});
    }
    axum::Json(answer).into_response()
}

/// `POST /api/v4/internal/kubernetes/authorize_proxy_user`, as GitLab's
/// `API::Internal::Kubernetes` answers it for personal access tokens.
async fn authorize_proxy_user(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    shared.authorize_proxy_user_requests.fetch_add(1, Ordering::SeqCst);
    if let Some(rejected) = check_kas_jwt(&shared, &headers) {
        return rejected;
    }
    // Grape reads parameters from a JSON body only when it says it is JSON.
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let params: serde_json::Value =
        if json_body { serde_json::from_slice(&body).unwrap_or_default() } else { serde_json::Value::Null };
    let Some(agent_id) = params["agent_id"].as_i64() else {
        return error(StatusCode::BAD_REQUEST, "agent_id is missing");
    };
    let access_type = params["access_type"].as_str().unwrap_or_default();
    if access_type != "personal_access_token" {
        // The fake has no browser sessions (the other access_type).
        return error(StatusCode::BAD_REQUEST, "access_type does not have a valid value");
    }
    let Some(access_key) = params["access_key"].as_str() else {
        return error(StatusCode::BAD_REQUEST, "access_key is missing");
    };
    let (user, revoked, config_project) = {
        let inner = shared.inner.lock().unwrap();
        let revoked = inner.revoked_user_tokens.contains(access_key);
        (inner.users.get(access_key).cloned(), revoked, inner.known_agents.get(&agent_id).copied())
    };
    if let Some(failed) = delay_or_fail(&shared).await {
        return failed;
    }
    let Some(user) = user else {
        return error(StatusCode::BAD_REQUEST, "400 Bad request - Unable to get user from request data");
    };
    if revoked {
        return unauthorized("Token was revoked. You have to re-authorize from the user profile.");
    }
    let Some(config_project) = config_project else { return error(StatusCode::NOT_FOUND, "404 Not found") };
    let Some(access_as) = user.agents.get(&agent_id) else { return error(StatusCode::FORBIDDEN, "403 Forbidden") };
    // A POST without an explicit status: Grape answers 201.
    let answer = json!({
        "agent": {"id": agent_id, "config_project": {"id": config_project}},
        "user": {"id": user.id, "username": user.username},
        "access_as": access_as,
    });
    (StatusCode::CREATED, axum::Json(answer)).into_response()
}

/// `GET /api/v4/internal/kubernetes/project_info?id=<full path or id>`.
async fn project_info(
    State(shared): State<Arc<Shared>>,
    axum::extract::Query(query): axum::extract::Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    shared.project_info_requests.fetch_add(1, Ordering::SeqCst);
    if let Some(rejected) = check_kas_jwt(&shared, &headers) {
        return rejected;
    }
    let token = bearer(&headers);
    let id = query.get("id").cloned().unwrap_or_default();
    let (forbidden, agent, project, denied) = {
        let inner = shared.inner.lock().unwrap();
        let project = inner
            .projects
            .iter()
            .find(|(path, (project_id, _))| **path == id || project_id.to_string() == id)
            .map(|(path, (project_id, branch))| (path.clone(), *project_id, branch.clone()));
        let denied = project.as_ref().is_some_and(|p| inner.denied_projects.contains(&(token.clone(), p.0.clone())));
        (inner.forbidden.contains(&token), inner.agents.contains_key(&token), project, denied)
    };
    if let Some(failed) = delay_or_fail(&shared).await {
        return failed;
    }
    if forbidden {
        return error(StatusCode::FORBIDDEN, "403 Forbidden");
    }
    if !agent {
        return unauthorized("invalid agent token");
    }
    let Some((path, project_id, default_branch)) = project.filter(|_| !denied) else {
        return error(StatusCode::NOT_FOUND, "404 Project Not Found");
    };
    axum::Json(json!({
        "project_id": project_id,
        "gitaly_info": {"address": "unix:/fake/gitaly.socket", "token": "fake-gitaly-token", "features": {}},
        "gitaly_repository": {
            "storage_name": "default",
            "relative_path": format!("@hashed/{project_id}.git"),
            "gl_repository": format!("project-{project_id}"),
            "gl_project_path": path,
        },
        "default_branch": default_branch,
    }))
    .into_response()
}

/// The agent token of `Authorization: Bearer <token>` ("" when absent).
fn bearer(headers: &HeaderMap) -> String {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_owned()
}

async fn agent_info(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery, headers: HeaderMap) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    if query.is_some() {
        shared.query_requests.fetch_add(1, Ordering::SeqCst);
    } else if let Some((status, location)) = shared.inner.lock().unwrap().redirect.clone() {
        return (status, [(header::LOCATION, location)]).into_response();
    }
    if let Some(rejected) = check_kas_jwt(&shared, &headers) {
        return rejected;
    }
    let token = bearer(&headers);
    let (forbidden, agent) = {
        let inner = shared.inner.lock().unwrap();
        (inner.forbidden.contains(&token), inner.agents.get(&token).cloned())
    };
    if let Some(failed) = delay_or_fail(&shared).await {
        return failed;
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
