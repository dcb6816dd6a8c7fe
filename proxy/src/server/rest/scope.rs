//! Each request's scope on the rest listener, as one layer around every route: its request id
//! (the caller's `x-request-id`, or a generated UUID, set on the request and echoed in the
//! response), the task-local id and the log span it runs in, and problem+json for what the
//! routes' own layers answer bare (see [`problem_for_bare_errors`]).
//!
//! One hand-written layer instead of four (tower-http's set and propagate request id, a
//! `from_fn` scope and a `map_response`): each of those boxed a future or cloned the boxed route
//! per request. The REST framework's share of kas's CPU on the Kubernetes API proxy path went
//! from 15.0 % to 9.6 % (perf, issue 14).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::response::Response;
use axum::routing::Route;
use tower::{Layer, Service};
use tracing::Instrument;

use super::REQUEST_ID_HEADER;
use super::problem::{REQUEST_ID, current_request_id, problem_for_bare_errors};

/// [`REQUEST_ID_HEADER`] as a header name, made once (not validated per request).
const REQUEST_ID_NAME: HeaderName = HeaderName::from_static(REQUEST_ID_HEADER);

/// See the module documentation.
#[derive(Clone, Copy, Default)]
pub struct RequestScopeLayer;

impl Layer<Route> for RequestScopeLayer {
    type Service = RequestScope;

    fn layer(&self, route: Route) -> RequestScope {
        RequestScope { route }
    }
}

#[derive(Clone)]
pub struct RequestScope {
    route: Route,
}

impl Service<Request> for RequestScope {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // axum's `Route` is always ready.
        Service::<Request>::poll_ready(&mut self.route, cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let id = match request.headers().get(REQUEST_ID_NAME) {
            Some(id) => id.clone(),
            None => {
                let id = random_request_id();
                request.headers_mut().insert(REQUEST_ID_NAME, id.clone());
                id
            }
        };
        let text = id.to_str().unwrap_or("-").to_owned();
        // Recorded as strings (not `%`, `Display`): no formatting machinery per request.
        let span = tracing::info_span!(
            "rest",
            request_id = text.as_str(),
            method = request.method().as_str(),
            path = request.uri().path()
        );
        let started = std::time::Instant::now();
        // `Route::call` serves the request on a clone of the route's service (no clone here).
        let routed = self.route.call(request);
        Box::pin(async move {
            let served = async move {
                let response = match routed.await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                let response = problem_for_bare_errors(response).await;
                // Inside the span already: no clone of it and no second entry per request.
                tracing::debug!(status = response.status().as_u16(), elapsed = ?started.elapsed(), "rest request");
                response
            };
            let mut response = REQUEST_ID.scope(text, served).instrument(span).await;
            response.headers_mut().entry(REQUEST_ID_NAME).or_insert(id);
            Ok(response)
        })
    }
}

/// `service` with each call's future run in the caller's request scope (its task-local id,
/// which problem+json bodies carry), wherever that future is polled: the rest routes run off the
/// data plane (`data_plane::run_on`) are polled by a task that the scope does not reach.
pub fn with_request_id<S>(
    service: S,
) -> impl Service<Request, Response = Response, Error = Infallible, Future = ScopedFuture> + Clone
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone,
    S::Future: Send + 'static,
{
    // `map_future` runs in `call`, where the caller's scope is still current.
    tower::ServiceExt::map_future(service, |called: S::Future| -> ScopedFuture {
        match current_request_id() {
            Some(id) => Box::pin(REQUEST_ID.scope(id, called)),
            None => Box::pin(called),
        }
    })
}

/// The future of [`with_request_id`]'s service.
pub type ScopedFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// A random version 4 UUID, from the thread's RNG (tower-http's `MakeRequestUuid` asks the
/// kernel: a `getrandom` call per request), written without an intermediate `String`.
fn random_request_id() -> HeaderValue {
    let text = uuid_v4(rand::random());
    // Hex digits and dashes only: always a valid header value.
    HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

/// `bits` as a version 4 (random) UUID: the version nibble and the RFC 4122 variant set.
fn uuid_v4(bits: u128) -> [u8; 36] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = (bits & !(0xf << 76)) | (0x4 << 76);
    let bits = (bits & !(0x3 << 62)) | (0x2 << 62);
    let mut out = [b'-'; 36];
    let mut nibble = 0;
    for (i, byte) in out.iter_mut().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            continue;
        }
        let shift = 124 - 4 * nibble;
        *byte = HEX[((bits >> shift) & 0xf) as usize];
        nibble += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_name() -> String {
        std::thread::current().name().unwrap_or_default().to_owned()
    }

    #[tokio::test]
    async fn a_route_run_off_the_data_plane_keeps_the_request_id() {
        let plane =
            crate::server::data_plane::DataPlane::start(1, kas_proto::runtime_thread::Scheduling::Normal).unwrap();
        let main = tokio::runtime::Handle::current();
        let handler = tower::service_fn(|_request: Request| async {
            let id = REQUEST_ID.try_with(Clone::clone).unwrap_or_default();
            Ok::<_, Infallible>(axum::response::IntoResponse::into_response(format!("{}|{id}", thread_name())))
        });
        let service = crate::server::data_plane::run_on(main, with_request_id(handler));
        // Called on a data plane thread in a request's scope, answered on this test's runtime.
        let (body, called_on) = plane
            .spawn(REQUEST_ID.scope("req-7".to_owned(), async move {
                let response = tower::ServiceExt::oneshot(service, Request::default()).await.unwrap();
                let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
                (String::from_utf8(body.to_vec()).unwrap(), thread_name())
            }))
            .await
            .unwrap();
        assert_eq!(called_on, "kas-data-0");
        assert_eq!(body, format!("{}|req-7", thread_name()));
        assert_ne!(thread_name(), "kas-data-0");
    }

    #[test]
    fn uuid_v4_sets_the_version_and_the_variant() {
        let text = |bits| String::from_utf8(uuid_v4(bits).to_vec()).unwrap();
        assert_eq!(text(0), "00000000-0000-4000-8000-000000000000");
        assert_eq!(text(u128::MAX), "ffffffff-ffff-4fff-bfff-ffffffffffff");
        assert_eq!(text(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef), "01234567-89ab-4def-8123-456789abcdef");
    }
}
