//! The rest listener: a JSON-over-HTTP gateway to the same `Router` and registry `KasApi` uses
//! (no second routing path). The features (`modules::all()`) hand it their routes; it adds
//! authentication, limits, request ids, CORS, problem errors, the OpenAPI document generated
//! from the routes, and Swagger UI.
//!
//! - `/api/...` needs `Authorization: Bearer <JWT>`, verified exactly like the api listener
//!   ([`JwtVerifier::gitlab`]); `/openapi.json` and `/swagger-ui` are public.
//! - 64-bit ids are decimal **strings** in response bodies (a JavaScript number loses precision
//!   above 2^53); in paths and queries they are plain decimal digits.
//! - Every error is `application/problem+json` (RFC 9457) built from [`KasError::classify`]
//!   (the one error table) with [`KasError::public_message`] as `detail`, plus `code` (the
//!   gRPC code name of the same error) and `request_id`. Errors produced by layers (404, 405,
//!   413, 504 timeouts) get the same body.
//! - Every response carries `x-request-id` (the caller's, or a generated UUID); logs of the
//!   request run in a span with it, and agentk receives it in the forwarded metadata.

pub mod config;
pub mod problem;
mod scope;
pub mod serve;
pub mod state;

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use self::config::RestConfig;
use self::problem::not_found;
pub use self::problem::{OwnErrorFormat, PROBLEM_JSON, Problem};
use self::scope::RequestScopeLayer;
pub use self::state::{RestState, RestStateParts, forwarded_metadata, path_text};
use crate::modules::Module;

/// Where the OpenAPI document is served.
pub const OPENAPI_PATH: &str = "/openapi.json";
/// Where Swagger UI is served.
pub const SWAGGER_UI_PATH: &str = "/swagger-ui";
/// The request id header: taken from the caller, generated when absent, echoed in the response.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// Name of the security scheme in the OpenAPI document (the handlers' `security` repeats it).
const BEARER: &str = "bearer";

/// One handler documented for several methods shares its `operation_id`; OpenAPI requires
/// operation ids to be unique, so each method's copy gets the method as a suffix
/// (`kubernetesApiProxy` -> `kubernetesApiProxyGet`, ...).
struct UniqueOperationIds;

impl Modify for UniqueOperationIds {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                ("Get", &mut item.get),
                ("Put", &mut item.put),
                ("Post", &mut item.post),
                ("Delete", &mut item.delete),
                ("Options", &mut item.options),
                ("Head", &mut item.head),
                ("Patch", &mut item.patch),
                ("Trace", &mut item.trace),
            ];
            let mut present: Vec<(&str, &mut utoipa::openapi::path::Operation)> =
                operations.into_iter().filter_map(|(method, op)| op.as_mut().map(|op| (method, op))).collect();
            for i in 0..present.len() {
                let id = present[i].1.operation_id.clone();
                let shared = id.is_some() && present.iter().filter(|(_, op)| op.operation_id == id).count() > 1;
                if shared && let Some(id) = id {
                    // Rename every holder of this id at once, so later ones no longer count as shared.
                    for (method, op) in present.iter_mut().skip(i) {
                        if op.operation_id.as_deref() == Some(id.as_str()) {
                            op.operation_id = Some(format!("{id}{method}"));
                        }
                    }
                }
            }
        }
    }
}

struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "HS256 JWT signed with the GitLab shared secret, issuer `gitlab`, audience `gitlab-kas` \
                         (`kas mint-jwt --secret-file ...`)",
                    ))
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "kas REST gateway",
        description = "JSON over HTTP to kas: list agent connections, call agents. Ids are decimal strings in \
                       response bodies (64-bit); errors are application/problem+json (RFC 9457)."
    ),
    components(schemas(Problem)),
    modifiers(&BearerScheme),
    tags(
        (name = "agents", description = "Agent connections and agent calls"),
        (name = "kubernetes", description = "The agent's Kubernetes API, proxied"),
        (name = "gitops", description = "GitOps: sync status and push notifications"),
        (name = "cluster_state", description = "Real-time cluster state from agentk's informer cache, answered by kas"),
    )
)]
struct ApiDoc;

/// Every feature's routes: those answering within `rest.request_timeout`, those that stream,
/// and those that stream and authenticate callers themselves.
struct FeatureRoutes {
    json: OpenApiRouter<RestState>,
    streaming: OpenApiRouter<RestState>,
    self_authenticated: OpenApiRouter<RestState>,
}

fn feature_routes(modules: &[Box<dyn Module>]) -> FeatureRoutes {
    let empty = FeatureRoutes {
        json: OpenApiRouter::new(),
        streaming: OpenApiRouter::new(),
        self_authenticated: OpenApiRouter::new(),
    };
    modules.iter().fold(empty, |routes, module| FeatureRoutes {
        json: routes.json.merge(module.rest_routes()),
        streaming: routes.streaming.merge(module.streaming_rest_routes()),
        self_authenticated: routes.self_authenticated.merge(module.self_authenticated_rest_routes()),
    })
}

/// The document: the gateway's own description plus every route's operations.
fn document(parts: [utoipa::openapi::OpenApi; 3]) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    for part in parts {
        doc.merge(part);
    }
    UniqueOperationIds.modify(&mut doc);
    doc
}

/// The OpenAPI document of the rest listener serving `modules`.
pub fn openapi(modules: &[Box<dyn Module>]) -> utoipa::openapi::OpenApi {
    let routes = feature_routes(modules);
    document([routes.json.into_openapi(), routes.streaming.into_openapi(), routes.self_authenticated.into_openapi()])
}

/// The OpenAPI document of kas (every feature) as committed in `openapi/openapi.json` (pretty
/// JSON, trailing newline).
pub fn openapi_json() -> String {
    let mut s = serde_json::to_string_pretty(&openapi(&crate::modules::all())).unwrap_or_default();
    s.push('\n');
    s
}

/// The rest listener's whole service: the features' routes, auth, limits, request ids, CORS,
/// problem errors. With `off_data_plane` (kas's multi-threaded runtime, when connections are
/// served on the data plane), the routes other than the self-authenticated ones (the
/// Kubernetes API proxy) run their handlers there ([`crate::server::data_plane::run_on`], in
/// the request's scope: [`scope::with_request_id`]).
pub fn router(
    state: RestState,
    modules: &[Box<dyn Module>],
    off_data_plane: Option<tokio::runtime::Handle>,
) -> axum::Router {
    let config = state.config.clone();
    let routes = feature_routes(modules);
    let (json, json_doc) = routes.json.split_for_parts();
    let (streaming, streaming_doc) = routes.streaming.split_for_parts();
    let (self_authenticated, self_authenticated_doc) = routes.self_authenticated.split_for_parts();
    let spec = document([json_doc, streaming_doc, self_authenticated_doc]);
    let json = json
        .layer(RequestBodyLimitLayer::new(config.max_request_body_bytes))
        .layer(TimeoutLayer::with_status_code(StatusCode::GATEWAY_TIMEOUT, config.request_timeout));
    // Streaming routes (watches, logs, exec) run outside the timeout and bound bodies themselves.
    let authenticated = json.merge(streaming);
    let mut authenticated = authenticated.route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    if let Some(runtime) = off_data_plane {
        authenticated = authenticated.layer(tower::layer::layer_fn(move |route| {
            crate::server::data_plane::run_on(runtime.clone(), scope::with_request_id(route))
        }));
    }
    let mut app = axum::Router::new()
        .merge(authenticated)
        .merge(self_authenticated)
        .merge(SwaggerUi::new(SWAGGER_UI_PATH).url(OPENAPI_PATH, spec))
        .fallback(not_found)
        .with_state(state)
        // The request id, the request's span and task-local scope, and problem+json for every
        // bare error (404, 405, the body limit's 413, timeouts), which so carries its id.
        .layer(RequestScopeLayer);
    if let Some(cors) = cors_layer(&config) {
        app = app.layer(cors);
    }
    app
}

fn cors_layer(config: &RestConfig) -> Option<CorsLayer> {
    let origins = &config.cors.allowed_origins;
    if origins.is_empty() {
        return None;
    }
    let allow_origin = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow_origin)
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::ACCEPT,
                HeaderName::from_static(REQUEST_ID_HEADER),
            ])
            .expose_headers([HeaderName::from_static(REQUEST_ID_HEADER)])
            .max_age(Duration::from_secs(600)),
    )
}

/// Rejects requests without a valid JWT, then removes the credential so nothing forwards it.
async fn authenticate(State(state): State<RestState>, mut req: Request, next: Next) -> Response {
    let authorization = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if let Err(e) = state.verifier.verify_authorization(authorization) {
        return e.into_response();
    }
    req.headers_mut().remove(header::AUTHORIZATION);
    next.run(req).await
}

#[cfg(test)]
mod tests;
