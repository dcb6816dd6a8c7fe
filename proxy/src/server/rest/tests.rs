//! The REST gateway through `Router::oneshot` (no sockets): every route and error case.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use kas_proto::kas::{ConnectedAgentInfo, KasAddress as PbKasAddress, KasInstanceInfo};
use serde_json::Value;
use tokio_util::sync::{CancellationToken, DropGuard};
use tower::ServiceExt;

use crate::auth::JwtVerifier;
use crate::error::KasError;
use crate::router::Router;

use super::problem::problem_for_bare_errors;
use super::*;
use crate::auth::jwt::{GITLAB_ISSUER, KAS_AUDIENCE, KAS_ISSUER};
use crate::auth::{Secret, mint_jwt};
use crate::registry::{AgentRegistry, MemoryRegistry, RegistryTiming};
use crate::router::peers::Peers;
use crate::tunnel::TunnelRegistry;

struct Fixture {
    app: axum::Router,
    secret: Secret,
    registry: Arc<dyn AgentRegistry>,
    cluster_state: Arc<crate::modules::cluster_state::hub::ClusterStateHub>,
    _stop: DropGuard,
}

fn fixture_with(config: RestConfig, max_wait: Duration) -> Fixture {
    let stop = CancellationToken::new();
    let tunnels = TunnelRegistry::spawn(stop.clone(), crate::config::DEFAULT_IDLE_TUNNEL_TIMEOUT);
    let instance = KasInstanceInfo {
        version: "test".into(),
        commit: "test".into(),
        address: Some(PbKasAddress { ip: "127.0.0.1".into(), port: 8155 }),
        instance_id: "kas-test".into(),
    };
    let timing = RegistryTiming { ttl: Duration::from_secs(300), heartbeat_ttl: Duration::from_secs(60) };
    let registry: Arc<dyn AgentRegistry> = Arc::new(MemoryRegistry::new(instance, timing));
    let secret = Secret::generate();
    let peers = Arc::new(Peers::new(Secret::generate()));
    let kas_router = Router::new(tunnels, registry.clone(), peers.clone(), max_wait);
    let cluster_state = crate::modules::cluster_state::hub::ClusterStateHub::new(
        Default::default(),
        registry.clone(),
        peers,
        stop.clone(),
    );
    let state = RestState::new(crate::server::rest::RestStateParts {
        router: kas_router,
        verifier: JwtVerifier::gitlab(&secret),
        config: config.into(),
        callers: Default::default(),
        gitops: gitops_state(registry.clone()),
        cluster_state: cluster_state.clone(),
    });
    let app = router(state, &crate::modules::all(), None);
    Fixture { app, secret, registry, cluster_state, _stop: stop.drop_guard() }
}

/// Agent 1 of the static agents file has two manifest projects; agent 2 none.
const GITOPS_CONFIGURATION: &str = "gitops:\n  manifest_projects:\n    - id: group/manifests\n    \
                                    - id: group/other\n      ref: {branch: stable}\n";

fn gitops_state(registry: Arc<dyn AgentRegistry>) -> Arc<crate::modules::gitops::state::GitopsState> {
    use crate::auth::StaticAgents;
    use crate::auth::agent_token::{StaticAgent, StaticAgentsFile};
    let agent = |id, configuration| StaticAgent {
        id,
        name: format!("agent-{id}"),
        project_id: 10,
        token_sha256: crate::auth::agent_token::token_sha256_hex(&format!("token-{id}")),
        configuration,
        configuration_repository: None,
        configuration_branch: None,
    };
    let document = crate::agent::AgentConfigDocument::parse(GITOPS_CONFIGURATION).unwrap();
    let agents = StaticAgents::new(StaticAgentsFile { agents: vec![agent(1, Some(document)), agent(2, None)] });
    let git = Arc::new(
        crate::modules::configuration::AgentConfigurations::new(&Default::default(), Duration::from_secs(20)).unwrap(),
    );
    Arc::new(crate::modules::gitops::state::GitopsState {
        config: Default::default(),
        registry,
        configurations: git.clone(),
        git,
        repositories: crate::modules::gitops::repository::ManifestRepositories::Static,
        static_agents: Some(Arc::new(agents)),
        shutdown: CancellationToken::new(),
    })
}

fn fixture() -> Fixture {
    fixture_with(RestConfig::default(), Duration::from_millis(200))
}

impl Fixture {
    fn token(&self) -> String {
        mint_jwt(&self.secret, GITLAB_ISSUER, KAS_AUDIENCE, Duration::from_secs(60)).unwrap()
    }

    async fn send(&self, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Value) {
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = axum::body::to_bytes(body, 10 << 20).await.unwrap();
        let json = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap_or(Value::Null) };
        (parts.status, parts.headers, json)
    }

    async fn get(&self, uri: &str) -> (StatusCode, axum::http::HeaderMap, Value) {
        let req = Request::get(uri).header("authorization", format!("Bearer {}", self.token()));
        self.send(req.body(Body::empty()).unwrap()).await
    }
}

fn content_type(h: &axum::http::HeaderMap) -> &str {
    h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default()
}

/// Asserts an RFC 9457 problem with this status and returns its detail.
fn assert_problem(status: StatusCode, headers: &axum::http::HeaderMap, body: &Value, expected: StatusCode) -> String {
    assert_eq!(status, expected, "{body}");
    assert_eq!(content_type(headers), PROBLEM_JSON);
    assert_eq!(body["type"], "about:blank");
    assert_eq!(body["status"], expected.as_u16());
    assert_eq!(body["title"], expected.canonical_reason().unwrap());
    assert!(body["code"].as_str().is_some_and(|c| !c.is_empty()), "{body}");
    let id = headers.get(REQUEST_ID_HEADER).expect("x-request-id in every response").to_str().unwrap();
    assert_eq!(body["request_id"], id, "the problem names the request id");
    body["detail"].as_str().expect("detail").to_owned()
}

fn connection(agent_id: i64, project_id: i64, connection_id: i64, pod: &str) -> ConnectedAgentInfo {
    ConnectedAgentInfo {
        id: agent_id,
        connection_id,
        version: "v1.2.3".into(),
        commit: "abc".into(),
        pod_namespace: "agentk".into(),
        pod_name: pod.into(),
        connected_at: Some(prost_types::Timestamp { seconds: 1_767_323_045, nanos: 678_000_000 }),
        kas_address: Some(PbKasAddress { ip: "127.0.0.1".into(), port: 8155 }),
        project_id,
        kas_instance_id: "kas-test".into(),
    }
}

#[tokio::test]
async fn missing_or_bad_tokens_are_401_problems() {
    let f = fixture();
    for uri in ["/api/v1/agents/1/connections", "/api/v1/projects/1/agents", "/api/v1/agents/1/pods"] {
        let (s, h, b) = f.send(Request::get(uri).body(Body::empty()).unwrap()).await;
        let detail = assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
        assert!(detail.contains("missing authorization"), "{detail}");
        assert_eq!(h.get(header::WWW_AUTHENTICATE).unwrap(), "Bearer");
        assert_eq!(b["code"], "UNAUTHENTICATED");
    }
    let bad = |auth: String| Request::get("/api/v1/agents/1/connections").header("authorization", auth);
    let (s, h, b) = f.send(bad("Bearer garbage".into()).body(Body::empty()).unwrap()).await;
    assert!(assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED).contains("invalid JWT: malformed"));
    let (s, h, b) = f.send(bad("Basic dXNlcjpwdw==".into()).body(Body::empty()).unwrap()).await;
    assert!(assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED).contains("malformed authorization"));
    // Signed by the right secret but not a GitLab token (the internal listener's issuer).
    let kas_token = mint_jwt(&f.secret, KAS_ISSUER, KAS_AUDIENCE, Duration::from_secs(60)).unwrap();
    let (s, h, b) = f.send(bad(format!("Bearer {kas_token}")).body(Body::empty()).unwrap()).await;
    assert!(assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED).contains("wrong issuer"));
    let other = mint_jwt(&Secret::generate(), GITLAB_ISSUER, KAS_AUDIENCE, Duration::from_secs(60)).unwrap();
    let (s, h, b) = f.send(bad(format!("Bearer {other}")).body(Body::empty()).unwrap()).await;
    assert!(assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED).contains("invalid signature"));
}

#[tokio::test]
async fn bad_ids_and_parameters_are_400_problems() {
    let f = fixture();
    for (uri, needle) in [
        ("/api/v1/agents/abc/connections", "agent_id must be a positive integer"),
        ("/api/v1/agents/0/connections", "agent_id must be a positive integer"),
        ("/api/v1/agents/-1/connections", "agent_id must be a positive integer"),
        ("/api/v1/agents/+1/connections", "agent_id must be a positive integer"),
        ("/api/v1/agents/1.5/connections", "agent_id must be a positive integer"),
        ("/api/v1/agents/99999999999999999999/connections", "agent_id must be a positive integer"),
        ("/api/v1/projects/x/agents", "project_id must be a positive integer"),
        ("/api/v1/agents/abc/pods", "agent_id must be a positive integer"),
        ("/api/v1/agents/1/pods?connection_id=abc", "connection_id must be a non-negative integer"),
        ("/api/v1/agents/1/pods?connection_id=-1", "connection_id must be a non-negative integer"),
        ("/api/v1/agents/1/pods?connection_id=", "connection_id must be a non-negative integer"),
        ("/api/v1/agents/1/pods?connection_id=1&connection_id=2", "bad query"),
        ("/api/v1/agents/%FF/connections", "bad path"),
    ] {
        let (s, h, b) = f.get(uri).await;
        let detail = assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
        assert!(detail.contains(needle), "{uri}: {detail}");
        assert_eq!(b["code"], "INVALID_ARGUMENT");
    }
}

#[tokio::test]
async fn unknown_routes_are_404_and_wrong_methods_405_problems() {
    let f = fixture();
    for uri in ["/", "/nope", "/api/v1/agents", "/api/v1/agents/1", "/api/v2/agents/1/pods"] {
        let (s, h, b) = f.get(uri).await;
        let detail = assert_problem(s, &h, &b, StatusCode::NOT_FOUND);
        assert!(detail.contains("no route for GET"), "{detail}");
    }
    let req = Request::post("/api/v1/agents/1/connections")
        .header("authorization", format!("Bearer {}", f.token()))
        .body(Body::empty())
        .unwrap();
    let (s, h, b) = f.send(req).await;
    assert_problem(s, &h, &b, StatusCode::METHOD_NOT_ALLOWED);
    assert!(h.get(header::ALLOW).unwrap().to_str().unwrap().contains("GET"), "{h:?}");
}

#[tokio::test]
async fn connections_by_agent_and_project_have_string_ids_and_rfc3339_times() {
    let f = fixture();
    f.registry.heartbeat().await.unwrap();
    // Above 2^53: a JavaScript number would round these.
    let big = 9_007_199_254_740_993_i64;
    f.registry.register(connection(1, 10, big, "agentk-0")).await.unwrap();
    f.registry.register(connection(1, 10, 7, "agentk-1")).await.unwrap();
    f.registry.register(connection(2, 10, 8, "other")).await.unwrap();

    let (s, h, b) = f.get("/api/v1/agents/1/connections").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(content_type(&h), "application/json");
    let conns = b["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 2);
    let first = conns.iter().find(|c| c["pod_name"] == "agentk-0").unwrap();
    assert_eq!(first["agent_id"], "1");
    assert_eq!(first["connection_id"], big.to_string());
    assert_eq!(first["project_id"], "10");
    assert_eq!(first["version"], "v1.2.3");
    assert_eq!(first["commit"], "abc");
    assert_eq!(first["pod_namespace"], "agentk");
    assert_eq!(first["kas_instance_id"], "kas-test");
    assert_eq!(first["kas_address"], serde_json::json!({"ip": "127.0.0.1", "port": 8155}));
    let at = first["connected_at"].as_str().unwrap();
    assert_eq!(at, "2026-01-02T03:04:05.678Z");
    humantime::parse_rfc3339(at).unwrap();

    let (s, _, b) = f.get("/api/v1/projects/10/agents").await;
    assert_eq!(s, StatusCode::OK);
    let mut ids: Vec<&str> =
        b["connections"].as_array().unwrap().iter().map(|c| c["agent_id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, vec!["1", "1", "2"]);
    let (s, _, b) = f.get("/api/v1/projects/11/agents").await;
    assert_eq!((s, b), (StatusCode::OK, serde_json::json!({"connections": []})));
    let (s, _, b) = f.get("/api/v1/agents/3/connections").await;
    assert_eq!((s, b), (StatusCode::OK, serde_json::json!({"connections": []})));
}

#[tokio::test]
async fn get_pods_for_an_agent_that_is_not_connected_is_503_or_504() {
    let f = fixture();
    let started = std::time::Instant::now();
    let (s, h, b) = f.get("/api/v1/agents/5/pods").await;
    let detail = assert_problem(s, &h, &b, StatusCode::SERVICE_UNAVAILABLE);
    assert!(detail.contains("agent 5 is not connected"), "{detail}");
    assert_eq!(b["code"], "UNAVAILABLE");
    assert!(started.elapsed() < Duration::from_secs(5));
    let (s, h, b) = f.get("/api/v1/agents/5/pods?connection_id=42").await;
    assert!(assert_problem(s, &h, &b, StatusCode::SERVICE_UNAVAILABLE).contains("connection 42 of agent 5"));

    // A request timeout shorter than routing.max_wait is the caller's deadline: 504, explained.
    let config = RestConfig { request_timeout: Duration::from_millis(300), ..RestConfig::default() };
    let f = fixture_with(config, Duration::from_secs(30));
    let (s, h, b) = f.get("/api/v1/agents/5/pods").await;
    let detail = assert_problem(s, &h, &b, StatusCode::GATEWAY_TIMEOUT);
    assert!(detail.contains("waiting for agent 5"), "{detail}");
    assert_eq!(b["code"], "DEADLINE_EXCEEDED");
}

#[tokio::test]
async fn request_ids_are_echoed_or_generated() {
    let f = fixture();
    let req = Request::get("/api/v1/agents/1/connections")
        .header("authorization", format!("Bearer {}", f.token()))
        .header("x-request-id", "caller-id-1")
        .body(Body::empty())
        .unwrap();
    let (s, h, _) = f.send(req).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h.get(REQUEST_ID_HEADER).unwrap(), "caller-id-1");
    let req = Request::get("/nope").header("x-request-id", "caller-id-2").body(Body::empty()).unwrap();
    let (_, h, b) = f.send(req).await;
    assert_eq!(h.get(REQUEST_ID_HEADER).unwrap(), "caller-id-2");
    assert_eq!(b["request_id"], "caller-id-2");
    let (_, h1, _) = f.get("/api/v1/agents/1/connections").await;
    let (_, h2, _) = f.get("/api/v1/agents/1/connections").await;
    let (a, b) = (h1.get(REQUEST_ID_HEADER).unwrap(), h2.get(REQUEST_ID_HEADER).unwrap());
    assert_eq!(a.len(), 36, "a generated UUID: {a:?}");
    assert_ne!(a, b);
    // A version 4 UUID, as tower-http's generator made them.
    let a = a.to_str().unwrap();
    assert_eq!(a.as_bytes()[14], b'4', "{a}");
    assert!(matches!(a.as_bytes()[19], b'8' | b'9' | b'a' | b'b'), "{a}");
    assert_eq!(a.split('-').map(str::len).collect::<Vec<_>>(), [8, 4, 4, 4, 12], "{a}");
}

#[tokio::test]
async fn openapi_and_swagger_ui_are_public() {
    let f = fixture();
    let (s, h, spec) = f.send(Request::get(OPENAPI_PATH).body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(content_type(&h), "application/json");
    assert_eq!(spec["openapi"], "3.1.0");
    let scheme = &spec["components"]["securitySchemes"]["bearer"];
    assert_eq!((scheme["type"].as_str(), scheme["scheme"].as_str()), (Some("http"), Some("bearer")));
    assert_eq!(scheme["bearerFormat"], "JWT");
    for (path, op) in [
        ("/api/v1/agents/{agent_id}/connections", "connectedAgentsById"),
        ("/api/v1/projects/{project_id}/agents", "connectedAgentsForProject"),
        ("/api/v1/agents/{agent_id}/pods", "getPods"),
        ("/api/v1/agents/{agent_id}/gitops", "getGitopsStatus"),
        ("/api/v1/agents/{agent_id}/cluster_state", "getClusterState"),
        ("/api/v1/agents/{agent_id}/cluster_state/{resource}", "listClusterStateObjects"),
        ("/api/v1/agents/{agent_id}/events", "watchClusterState"),
    ] {
        let get = &spec["paths"][path]["get"];
        assert_eq!(get["operationId"], op);
        assert_eq!(get["security"], serde_json::json!([{"bearer": []}]));
        assert!(get["responses"]["400"]["content"][PROBLEM_JSON].is_object(), "{path}");
    }
    let k8s = &spec["paths"]["/api/v1/agents/{agent_id}/kubernetes/{path}"];
    // One handler for five methods, but OpenAPI operation ids must be unique.
    for (m, id) in [
        ("get", "kubernetesApiProxyGet"),
        ("post", "kubernetesApiProxyPost"),
        ("put", "kubernetesApiProxyPut"),
        ("patch", "kubernetesApiProxyPatch"),
        ("delete", "kubernetesApiProxyDelete"),
    ] {
        assert_eq!(k8s[m]["operationId"], id, "{m}");
    }

    let resp = f.app.clone().oneshot(Request::get("/swagger-ui/").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let html = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    assert!(String::from_utf8_lossy(&html).contains("swagger-ui"));
    let resp = f.app.clone().oneshot(Request::get("/swagger-ui").body(Body::empty()).unwrap()).await.unwrap();
    assert!(resp.status().is_redirection());
    let resp =
        f.app.clone().oneshot(Request::get("/swagger-ui/swagger-initializer.js").body(Body::empty()).unwrap()).await;
    let js = axum::body::to_bytes(resp.unwrap().into_body(), 1 << 20).await.unwrap();
    assert!(String::from_utf8_lossy(&js).contains(OPENAPI_PATH));
}

#[test]
fn openapi_document_is_committed() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi/openapi.json");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == openapi_json(),
        "{} differs from the OpenAPI document the code generates; regenerate it with\n  \
         cargo run -q --bin kas -- openapi > openapi/openapi.json",
        path.display()
    );
}

/// A 100-byte body with its Content-Length, to a rest listener whose body limit is 16 bytes.
async fn post_100_bytes_with_a_16_byte_limit(path: &str) -> (StatusCode, HeaderMap, Value) {
    let config = RestConfig { max_request_body_bytes: 16, ..RestConfig::default() };
    let f = fixture_with(config, Duration::from_millis(200));
    let req = Request::post(path)
        .header("authorization", format!("Bearer {}", f.token()))
        .header(header::CONTENT_LENGTH, "100")
        .body(Body::from(vec![b'x'; 100]))
        .unwrap();
    f.send(req).await
}

#[tokio::test]
async fn large_bodies_are_413_problems() {
    let (s, h, b) = post_100_bytes_with_a_16_byte_limit("/api/v1/agents/1/connections").await;
    assert!(assert_problem(s, &h, &b, StatusCode::PAYLOAD_TOO_LARGE).contains("max_request_body_bytes"));
}

#[tokio::test]
async fn cors_is_off_by_default_and_configurable() {
    let preflight = || {
        Request::options("/api/v1/agents/1/connections")
            .header(header::ORIGIN, "https://gitlab.example.com")
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "GET")
            .header(header::ACCESS_CONTROL_REQUEST_HEADERS, "authorization")
            .body(Body::empty())
            .unwrap()
    };
    let f = fixture();
    let (_, h, _) = f.send(preflight()).await;
    assert!(h.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none(), "{h:?}");

    let mut config = RestConfig::default();
    config.cors.allowed_origins = vec!["https://gitlab.example.com".into()];
    let f = fixture_with(config, Duration::from_millis(200));
    let (s, h, _) = f.send(preflight()).await;
    assert!(s.is_success(), "{s}");
    assert_eq!(h.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).unwrap(), "https://gitlab.example.com");
    let req = Request::get("/api/v1/agents/1/connections")
        .header(header::ORIGIN, "https://evil.example.com")
        .header("authorization", format!("Bearer {}", f.token()))
        .body(Body::empty())
        .unwrap();
    let (_, h, _) = f.send(req).await;
    assert!(h.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none());
}

#[tokio::test]
async fn internal_detail_is_not_in_problems_and_bare_errors_become_problems() {
    let resp = KasError::Internal("secret path /x".into()).into_response();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body: Value = serde_json::from_slice(&axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap()).unwrap();
    assert_eq!(body["detail"], "internal error");
    assert_eq!(body["code"], "INTERNAL");
    let resp =
        KasError::AgentError { code: tonic::Code::PermissionDenied, message: "forbidden".into() }.into_response();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let body: Value = serde_json::from_slice(&axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap()).unwrap();
    assert_eq!(body["code"], "PERMISSION_DENIED");

    // What TimeoutLayer answers (an empty 504) becomes a problem.
    let resp = problem_for_bare_errors(StatusCode::GATEWAY_TIMEOUT.into_response()).await;
    assert_eq!(resp.headers().get(header::CONTENT_TYPE).unwrap(), PROBLEM_JSON);
    let body: Value = serde_json::from_slice(&axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap()).unwrap();
    assert!(body["detail"].as_str().unwrap().contains("rest.request_timeout"));
    // A typed error body (e.g. a Kubernetes Status passing through) is left alone.
    let typed = (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "application/json")], "{}").into_response();
    let resp = problem_for_bare_errors(typed).await;
    assert_eq!(resp.headers().get(header::CONTENT_TYPE).unwrap(), "application/json");
    // A response in its caller's own format (a Kubernetes Status) is left alone too.
    let mut own = (StatusCode::PAYLOAD_TOO_LARGE, [(header::CONTENT_TYPE, "text/plain")], "x").into_response();
    own.extensions_mut().insert(OwnErrorFormat);
    let resp = problem_for_bare_errors(own).await;
    assert_eq!(resp.headers().get(header::CONTENT_TYPE).unwrap(), "text/plain");
}

/// A Content-Length over `rest.max_request_body_bytes` on the Kubernetes API proxy path is a 413
/// Kubernetes `Status` (what the API server answers; kubectl prints it), not a problem.
#[tokio::test]
async fn large_bodies_on_the_kubernetes_path_are_413_statuses() {
    let (s, h, body) =
        post_100_bytes_with_a_16_byte_limit("/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods").await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(h.get(header::CONTENT_TYPE).unwrap(), "application/json");
    assert_eq!((body["kind"].as_str(), body["code"].as_u64()), (Some("Status"), Some(413)), "{body}");
    assert_eq!(body["reason"], "RequestEntityTooLarge");
}

#[test]
fn only_whitelisted_headers_reach_agentk() {
    let mut h = HeaderMap::new();
    h.insert("authorization", "Bearer secret".parse().unwrap());
    h.insert("x-request-id", "r1".parse().unwrap());
    h.insert("user-agent", "curl/8".parse().unwrap());
    h.insert("cookie", "a=b".parse().unwrap());
    let m = forwarded_metadata(&h);
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!(m["x-request-id"].values, vec!["r1".to_owned()]);
    assert_eq!(m["user-agent"].values, vec!["curl/8".to_owned()]);
}

#[tokio::test]
async fn gitops_status_lists_each_configured_project_with_its_last_sync() {
    use kas_proto::gitops::{ObjectError, SyncReport};
    use kas_proto::kas::GitopsSync;

    use crate::registry::ManifestProjectKey;

    let f = fixture();
    // Before any report: every configured project, none synced.
    let (s, _, b) = f.get("/api/v1/agents/1/gitops").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(
        b,
        serde_json::json!({"agent_id": "1", "projects_from": "configuration", "manifest_projects": [
            {"project_id": "group/manifests", "ref": "", "last_sync": null},
            {"project_id": "group/other", "ref": "branch:stable", "last_sync": null},
        ]})
    );
    let report = SyncReport {
        project_id: "group/other".into(),
        r#ref: "branch:stable".into(),
        commit_id: "0123456789abcdef0123456789abcdef01234567".into(),
        pod_name: "agentk-0".into(),
        started_at_unix_ms: 1_767_323_045_000,
        duration_ms: 1500,
        dry_run_strategy: "server".into(),
        applied: 2,
        unchanged: 5,
        pruned: 1,
        failed: 1,
        errors: vec![ObjectError {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespace: "prod".into(),
            name: "web".into(),
            source: "deploy/web.yaml".into(),
            operation: "apply".into(),
            message: "admission webhook denied the request".into(),
        }],
        error: String::new(),
    };
    let sync = GitopsSync {
        report: Some(report),
        received_at: Some(prost_types::Timestamp { seconds: 1_767_323_047, nanos: 0 }),
        kas_instance_id: "kas-b".into(),
    };
    let configured = [
        ManifestProjectKey { project_id: "group/manifests".into(), git_ref: String::new() },
        ManifestProjectKey { project_id: "group/other".into(), git_ref: "branch:stable".into() },
    ];
    f.registry.put_gitops_sync(kas_proto::AgentId(1), sync, &configured, Duration::from_secs(60)).await.unwrap();
    let (s, _, b) = f.get("/api/v1/agents/1/gitops").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["manifest_projects"][0]["last_sync"], Value::Null);
    assert_eq!(
        b["manifest_projects"][1]["last_sync"],
        serde_json::json!({
            "received_at": "2026-01-02T03:04:07.000Z", "kas_instance_id": "kas-b",
            "commit_id": "0123456789abcdef0123456789abcdef01234567", "pod_name": "agentk-0",
            "started_at": "2026-01-02T03:04:05.000Z", "duration_ms": 1500, "dry_run_strategy": "server",
            "applied": 2, "unchanged": 5, "pruned": 1, "failed": 1, "error": null,
            "errors": [{"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "prod", "name": "web",
                "source": "deploy/web.yaml", "operation": "apply", "message": "admission webhook denied the request"}],
        })
    );

    // An agent without GitOps has no projects; an unknown agent is a 404; a bad id a 400.
    let (s, _, b) = f.get("/api/v1/agents/2/gitops").await;
    assert_eq!((s, &b["manifest_projects"]), (StatusCode::OK, &serde_json::json!([])));
    let (s, h, b) = f.get("/api/v1/agents/3/gitops").await;
    assert!(assert_problem(s, &h, &b, StatusCode::NOT_FOUND).contains("agent 3 is not in kas's static agents file"));
    let (s, h, b) = f.get("/api/v1/agents/x/gitops").await;
    assert!(assert_problem(s, &h, &b, StatusCode::BAD_REQUEST).contains("agent_id must be a positive integer"));
}

#[tokio::test]
async fn git_push_events_are_published_and_bad_ones_are_400_problems() {
    let f = fixture();
    let mut pushes = f.registry.subscribe_git_pushes();
    let post = |body: &str| {
        Request::post("/api/v1/git_push_events")
            .header("authorization", format!("Bearer {}", f.token()))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    let (s, _, b) = f.send(post(r#"{"project": {"id": "7", "full_path": "group/manifests"}}"#)).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let push = pushes.try_recv().unwrap();
    assert_eq!((push.project.id, push.project.full_path.as_str()), (7, "group/manifests"));
    // The id is optional (repositories of static agents have none).
    let (s, _, _) = f.send(post(r#"{"project": {"full_path": "/srv/git/manifests.git"}}"#)).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(pushes.try_recv().unwrap().project.id, 0);
    for (body, needle) in [
        ("", "bad push event"),
        ("{}", "missing field `project`"),
        (r#"{"project": {"id": "7"}}"#, "missing field `full_path`"),
        (r#"{"project": {"full_path": ""}}"#, "full_path is required"),
        (r#"{"project": {"id": "-1", "full_path": "g/p"}}"#, "project.id must be a positive integer"),
        (r#"{"project": {"full_path": "g/p", "extra": 1}}"#, "unknown field `extra`"),
    ] {
        let (s, h, b) = f.send(post(body)).await;
        let detail = assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
        assert!(detail.contains(needle), "{body}: {detail}");
    }
    assert!(pushes.try_recv().is_err(), "a refused event was published");
    // Without a JWT: 401, nothing published.
    let req =
        Request::post("/api/v1/git_push_events").body(Body::from(r#"{"project": {"full_path": "g/p"}}"#)).unwrap();
    let (s, h, b) = f.send(req).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
    assert!(pushes.try_recv().is_err());
}

/// Pushes a listing of pods (and deployments) into the hub, as agentk's stream would.
fn push_pods(f: &Fixture, agent: i64, pods: &[(&str, &str, &str)]) {
    use kas_proto::cluster_state::resource_update::Phase;
    use kas_proto::cluster_state::{ObjectView, PushRequest, ResourceKey, ResourceUpdate};
    let state = f.cluster_state.states.get_or_create(kas_proto::AgentId(agent));
    state.stream_opened();
    let key = ResourceKey { group: String::new(), version: "v1".into(), resource: "pods".into() };
    let upserts = pods
        .iter()
        .map(|(ns, name, phase)| ObjectView {
            namespace: (*ns).into(),
            name: (*name).into(),
            uid: format!("uid-{name}"),
            resource_version: "1".into(),
            status: (*phase).into(),
            ready: *phase == "Running",
            node_name: "node-a".into(),
            ..Default::default()
        })
        .collect();
    let update = |phase: Phase, upserts| ResourceUpdate {
        resource: Some(key.clone()),
        phase: phase as i32,
        upserts,
        kind: "Pod".into(),
        namespaced: true,
        ..Default::default()
    };
    state.apply(PushRequest {
        resources: vec![key.clone()],
        updates: vec![update(Phase::SnapshotBegin, upserts), update(Phase::SnapshotEnd, vec![])],
    });
}

#[tokio::test]
async fn cluster_state_answers_summaries_and_views_from_kas_memory() {
    let f = fixture();
    let (s, h, b) = f.get("/api/v1/agents/1/cluster_state").await;
    let detail = assert_problem(s, &h, &b, StatusCode::NOT_FOUND);
    assert!(detail.contains("no cluster state for agent 1"), "{detail}");

    push_pods(&f, 1, &[("prod", "web-1", "Running"), ("prod", "web-2", "Pending"), ("dev", "db", "Running")]);
    let (s, _, b) = f.get("/api/v1/agents/1/cluster_state").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["agent_id"], "1");
    assert_eq!(b["live"], true);
    assert!(b["observed_at"].as_str().unwrap().ends_with('Z'), "{b}");
    let pods = &b["resources"][0];
    assert_eq!(
        (pods["name"].as_str(), pods["kind"].as_str(), pods["count"].as_u64()),
        (Some("pods"), Some("Pod"), Some(3))
    );
    assert_eq!(pods["by_status"], serde_json::json!({"Running": 2, "Pending": 1}));
    assert_eq!((pods["ready"].as_u64(), pods["synced"].as_bool()), (Some(2), Some(true)));

    let (s, _, b) = f.get("/api/v1/agents/1/cluster_state/pods?namespace=prod").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let names: Vec<&str> = b["objects"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["web-1", "web-2"]);
    assert_eq!(b["objects"][0]["node_name"], "node-a");
    assert_eq!(b["summary"]["count"], 3, "the summary is of the whole resource");

    // The agent's stream ended: the data stays, and says how old it is.
    f.cluster_state.states.get(kas_proto::AgentId(1)).unwrap().stream_closed();
    let (_, _, b) = f.get("/api/v1/agents/1/cluster_state").await;
    assert_eq!(b["live"], false);

    for (uri, status, needle) in [
        (
            "/api/v1/agents/1/cluster_state/deployments.apps",
            StatusCode::NOT_FOUND,
            "does not observe \"deployments.apps\" (cluster_state.resources: pods)",
        ),
        ("/api/v1/agents/1/cluster_state/Pods", StatusCode::BAD_REQUEST, "is not a resource name"),
        ("/api/v1/agents/1/cluster_state/pods?namespace=Prod", StatusCode::BAD_REQUEST, "is not a namespace name"),
        ("/api/v1/agents/0/cluster_state", StatusCode::BAD_REQUEST, "agent_id"),
    ] {
        let (s, h, b) = f.get(uri).await;
        let detail = assert_problem(s, &h, &b, status);
        assert!(detail.contains(needle), "{uri}: {detail}");
    }
}

#[tokio::test]
async fn cluster_state_events_stream_a_snapshot_then_changes_with_a_token_in_the_query() {
    use futures::StreamExt;
    let f = fixture();
    push_pods(&f, 1, &[("prod", "web-1", "Running")]);
    // No credential: 401 as problem+json, like every /api route.
    let (s, h, b) = f.send(Request::get("/api/v1/agents/1/events").body(Body::empty()).unwrap()).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
    let (s, h, b) =
        f.send(Request::get("/api/v1/agents/1/events?access_token=nope").body(Body::empty()).unwrap()).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);

    // A browser's EventSource cannot set headers: the token comes in the query.
    let uri = format!("/api/v1/agents/1/events?access_token={}", f.token());
    let resp = f.app.clone().oneshot(Request::get(uri).body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(content_type(resp.headers()), "text/event-stream");
    let mut body = resp.into_body().into_data_stream();
    let mut text = String::new();
    let mut next_event = async || loop {
        if let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            if !event.starts_with(':') {
                return event;
            }
            continue;
        }
        let chunk = body.next().await.expect("stream open").unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    };
    let snapshot = next_event().await;
    assert!(snapshot.starts_with("event: snapshot\n"), "{snapshot}");
    assert!(snapshot.contains("\"name\":\"web-1\"") && snapshot.contains("\"live\":true"), "{snapshot}");
    push_pods(&f, 1, &[("prod", "web-1", "Running"), ("prod", "web-2", "Pending")]);
    let upsert = next_event().await;
    assert!(upsert.starts_with("event: upsert\n"), "{upsert}");
    assert!(upsert.contains("\"resource\":\"pods\"") && upsert.contains("\"name\":\"web-2\""), "{upsert}");
    assert!(upsert.contains("\nid: "), "events have ids: {upsert}");
}
