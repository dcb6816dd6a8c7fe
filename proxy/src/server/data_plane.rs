//! kas's data plane: `connections.data_plane_threads` threads, each running a single-threaded
//! tokio runtime, that serve the connections of the agent, api, internal and rest listeners
//! (each connection stays on one thread). Everything else (the registry and Redis, GitOps
//! polls, the cluster state hub, the observability listener, the accept loops and gRPC TLS
//! handshakes) runs on kas's multi-threaded runtime. So do the handlers of what is not the
//! path to an agent ([`run_on`]): the rest listener's routes other than the Kubernetes API
//! proxy, and the features' gRPC services ([`grpc_routes`]: cluster state pushes and reads,
//! GitOps), whose work (a cluster state read encodes every view, a push decodes one) would
//! otherwise delay proxied requests.
//!
//! Why (issue 14): every request to an agent uses the agent's one HTTP/2 connection, whose
//! task and lock all its streams share. On a work-stealing runtime each request touched them
//! from whichever worker ran its caller's connection: the lock was contended (a third of kas's
//! futex calls) and tasks woke workers on the other core (another third). On one data plane
//! thread kas used ~35 % less CPU per proxied request, with a p50 ~23 % lower
//! (docs/benchmarks.md, issue 14's sixth part). With more than one thread, connections are
//! spread over them in turn: a request whose caller's connection and agent's connection are on
//! different threads crosses between them, as on the multi-threaded runtime (more capacity, no
//! gain per request). `0` keeps every connection on the multi-threaded runtime.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use kas_proto::runtime_thread::{RuntimeThread, Scheduling};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// The threads' name (as `ps -T` and profilers show it), with the thread's number after it.
pub const THREAD_NAME: &str = "kas-data";

/// Where connections are served: the data plane's threads in turn, or kas's multi-threaded
/// runtime. Cheap to clone.
#[derive(Clone)]
pub struct DataPlane {
    inner: Option<Arc<Threads>>,
}

struct Threads {
    /// Dropping these stops the threads: their tasks are dropped, as when kas exits.
    threads: Vec<RuntimeThread>,
    next: AtomicUsize,
}

impl DataPlane {
    /// Starts `threads` threads scheduled as `scheduling` says; with 0, everything stays on the
    /// calling runtime.
    pub fn start(threads: usize, scheduling: Scheduling) -> io::Result<Self> {
        if threads == 0 {
            return Ok(Self::disabled());
        }
        let threads = (0..threads)
            .map(|i| RuntimeThread::start(format!("{THREAD_NAME}-{i}"), scheduling))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { inner: Some(Arc::new(Threads { threads, next: AtomicUsize::new(0) })) })
    }

    /// Connections stay on the current runtime (the observability listener's).
    pub fn disabled() -> Self {
        Self { inner: None }
    }

    /// Whether connections leave the multi-threaded runtime.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// The threads' runtimes, in order (none when disabled).
    pub fn handles(&self) -> Vec<Handle> {
        self.inner.as_ref().map_or_else(Vec::new, |t| t.threads.iter().map(|t| t.handle().clone()).collect())
    }

    /// Spawns a task on the next thread (on the current runtime when disabled).
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.next() {
            Some(thread) => thread.spawn(task),
            None => tokio::spawn(task),
        }
    }

    /// Serves an accepted connection on the next thread (on the current runtime when
    /// disabled), its socket moved to that thread's runtime ([`spawn_with_socket`]).
    pub fn spawn_connection<F>(&self, tcp: TcpStream, serve: impl FnOnce(TcpStream) -> F + Send + 'static)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match self.next() {
            Some(thread) => spawn_with_socket(thread, tcp, serve),
            None => {
                tokio::spawn(serve(tcp));
            }
        }
    }

    fn next(&self) -> Option<&Handle> {
        let threads = self.inner.as_ref()?;
        let i = threads.next.fetch_add(1, Ordering::Relaxed) % threads.threads.len();
        threads.threads.get(i).map(RuntimeThread::handle)
    }
}

/// Spawns `serve` on `thread` with the socket moved to that thread's runtime. A tokio socket
/// stays with the runtime whose I/O driver registered it (the accept loop's): left there, each
/// of its readiness events would be taken by that runtime's thread and handed across to this
/// one, a wake-up between threads per event, which is what the data plane is for avoiding.
pub fn spawn_with_socket<F>(thread: &Handle, tcp: TcpStream, serve: impl FnOnce(TcpStream) -> F + Send + 'static)
where
    F: Future<Output = ()> + Send + 'static,
{
    let tcp = match tcp.into_std() {
        Ok(tcp) => tcp,
        Err(e) => {
            tracing::debug!(error = %e, "cannot hand a connection to its data plane thread");
            return;
        }
    };
    thread.spawn(async move {
        match TcpStream::from_std(tcp) {
            Ok(tcp) => serve(tcp).await,
            Err(e) => tracing::debug!(error = %e, "cannot take a connection on its data plane thread"),
        }
    });
}

/// Runs each request's handler on `runtime` (kas's multi-threaded runtime) and hands the
/// response back: the routes whose work must not hold a data plane thread. The request's log
/// span goes with it. A streamed body (Server-Sent Events whose first event may be a whole
/// cluster's state, a gRPC response stream) is produced there too and handed over one frame at a
/// time, trailers included. A handler that panics answers 500, as it would on the data plane; a
/// request whose caller goes away cancels its handler, as before.
pub fn run_on<S>(runtime: Handle, service: S) -> RunOn<S> {
    RunOn { runtime, service }
}

/// See [`run_on`].
#[derive(Clone)]
pub struct RunOn<S> {
    runtime: Handle,
    service: S,
}

impl<S> tower::Service<Request> for RunOn<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        use tracing::Instrument;

        // The ready service is taken and a fresh clone left for the next call (tower's rule).
        let clone = self.service.clone();
        let mut service = std::mem::replace(&mut self.service, clone);
        let handled = service.call(request).instrument(tracing::Span::current());
        let task = tokio_util::task::AbortOnDropHandle::new(
            self.runtime.spawn(async move { handled.await.map(body_produced_here) }),
        );
        Box::pin(async move {
            match task.await {
                Ok(result) => result,
                Err(e) => {
                    tracing::error!(error = %e, "a handler run off the data plane failed");
                    Ok(axum::response::IntoResponse::into_response(http::StatusCode::INTERNAL_SERVER_ERROR))
                }
            }
        })
    }
}

/// The features' gRPC services of a listener (`modules::GrpcServices`), their handlers run on
/// `off_data_plane` when connections are served on the data plane ([`run_on`]). The
/// specification's services, added to the result afterwards, stay on the connection's thread:
/// their calls are the path to an agent.
pub fn grpc_routes(features: tonic::service::RoutesBuilder, off_data_plane: Option<&Handle>) -> tonic::service::Routes {
    let routes = features.routes();
    match off_data_plane {
        Some(runtime) => {
            let runtime = runtime.clone();
            routes.into_axum_router().layer(tower::layer::layer_fn(move |route| run_on(runtime.clone(), route))).into()
        }
        None => routes,
    }
}

/// `response` with a streamed body read by a task on the current runtime and handed over one
/// frame at a time (one in hand: the caller's pace still sets the stream's). A body of known
/// length is already encoded and stays as it is. The task ends when the body ends or the
/// caller's side is dropped.
fn body_produced_here(response: Response) -> Response {
    use http_body_util::BodyExt;

    let (parts, mut body) = response.into_parts();
    if axum::body::HttpBody::size_hint(&body).exact().is_some() {
        return Response::from_parts(parts, body);
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>>(1);
    tokio::spawn(async move {
        loop {
            let frame = tokio::select! {
                () = tx.closed() => return,
                frame = body.frame() => frame,
            };
            let Some(frame) = frame else { return };
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    let frames = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    Response::from_parts(parts, axum::body::Body::new(frames))
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use tokio::sync::oneshot;

    use super::*;

    fn thread_name() -> Option<String> {
        std::thread::current().name().map(str::to_owned)
    }

    #[tokio::test]
    async fn connections_take_the_threads_in_turn_and_end_with_them() {
        let plane = DataPlane::start(2, Scheduling::Normal).unwrap();
        assert!(plane.is_enabled());
        let mut names = Vec::new();
        for _ in 0..4 {
            names.push(plane.spawn(async { thread_name() }).await.unwrap().unwrap());
        }
        assert_eq!(names, ["kas-data-0", "kas-data-1", "kas-data-0", "kas-data-1"]);
        // What a connection's task spawns (its streams) runs on the same thread.
        let nested = plane.spawn(async { tokio::spawn(async { thread_name() }).await.unwrap() });
        assert_eq!(nested.await.unwrap().as_deref(), Some("kas-data-0"));

        let (_tx, rx) = oneshot::channel::<()>();
        let forever = plane.spawn(async move {
            let _ = rx.await;
        });
        drop(plane);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), forever).await;
        assert!(ended.expect("the task ended when the data plane stopped").unwrap_err().is_cancelled());
    }

    #[tokio::test]
    async fn disabled_keeps_tasks_on_the_current_runtime() {
        let plane = DataPlane::start(0, Scheduling::Normal).unwrap();
        assert!(!plane.is_enabled());
        assert!(plane.handles().is_empty());
        let here = thread_name();
        assert_eq!(plane.spawn(async { thread_name() }).await.unwrap(), here);
    }

    #[tokio::test]
    async fn run_on_produces_a_streamed_body_and_its_trailers_on_the_given_runtime() {
        use http_body_util::BodyExt;

        let plane = DataPlane::start(1, Scheduling::Normal).unwrap();
        let main = Handle::current();
        // Each chunk says where it was produced (a stream of unknown length, like SSE or a gRPC
        // response), and the body ends with trailers (as gRPC's `grpc-status`).
        let handler = tower::service_fn(|_request: Request| async {
            let chunks = futures::stream::iter(0..3).then(|_| async {
                Ok::<_, Infallible>(hyper::body::Frame::data(bytes::Bytes::from(format!(
                    "{};",
                    thread_name().unwrap_or_default()
                ))))
            });
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let frames = chunks.chain(futures::stream::once(async { Ok(hyper::body::Frame::trailers(trailers)) }));
            Ok::<_, Infallible>(Response::new(axum::body::Body::new(http_body_util::StreamBody::new(frames))))
        });
        let collected = plane
            .spawn(async move {
                let response = tower::ServiceExt::oneshot(run_on(main, handler), Request::default()).await.unwrap();
                response.into_body().collect().await.unwrap()
            })
            .await
            .unwrap();
        let trailers = collected.trailers().cloned();
        let here = thread_name().unwrap_or_default();
        assert_ne!(here, "kas-data-0");
        assert_eq!(String::from_utf8(collected.to_bytes().to_vec()).unwrap(), format!("{here};{here};{here};"));
        assert_eq!(trailers.and_then(|t| t.get("grpc-status").cloned()), Some(http::HeaderValue::from_static("0")));
    }

    /// Answers where it ran: in a response header, or in the message of an error status.
    struct WhereItRan;

    #[tonic::async_trait]
    impl kas_proto::gitops::gitops_status_server::GitopsStatus for WhereItRan {
        async fn report_sync(
            &self,
            request: tonic::Request<kas_proto::gitops::SyncReport>,
        ) -> Result<tonic::Response<kas_proto::gitops::ReportSyncResponse>, tonic::Status> {
            let here = thread_name().unwrap_or_default();
            if request.into_inner().commit_id == "fail" {
                return Err(tonic::Status::failed_precondition(here));
            }
            let mut response = tonic::Response::new(kas_proto::gitops::ReportSyncResponse {});
            response.metadata_mut().insert("ran-on", here.parse().unwrap());
            Ok(response)
        }
    }

    #[tokio::test]
    async fn features_grpc_services_run_off_the_data_plane_and_answer_as_before() {
        use kas_proto::gitops::gitops_status_client::GitopsStatusClient;
        use kas_proto::gitops::gitops_status_server::GitopsStatusServer;

        let plane = DataPlane::start(1, Scheduling::Normal).unwrap();
        let mut features = tonic::service::RoutesBuilder::default();
        features.add_service(GitopsStatusServer::new(WhereItRan));
        let routes = grpc_routes(features, Some(&Handle::current()));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        // The server (its connections) on the data plane thread, as kas's listeners.
        let _server = tokio_util::task::AbortOnDropHandle::new(plane.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            tonic::transport::Server::builder()
                .add_routes(routes)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
        }));
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect_lazy();
        let mut client = GitopsStatusClient::new(channel);
        let here = thread_name().unwrap_or_default();
        assert_ne!(here, "kas-data-0");

        let ok = client.report_sync(kas_proto::gitops::SyncReport::default()).await.unwrap();
        assert_eq!(ok.metadata().get("ran-on").and_then(|v| v.to_str().ok()), Some(here.as_str()));
        let failed = client
            .report_sync(kas_proto::gitops::SyncReport { commit_id: "fail".into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!((failed.code(), failed.message()), (tonic::Code::FailedPrecondition, here.as_str()));
        // A method the routes do not have is still UNIMPLEMENTED.
        let mut unknown = kas_proto::kas::kas_api_client::KasApiClient::new(
            tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect_lazy(),
        );
        let missing = unknown.get_pods(kas_proto::kas::GetPodsRequest::default()).await.unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unimplemented);
    }
}
