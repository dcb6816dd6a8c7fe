//! kas's data plane: `connections.data_plane_threads` threads, each running a single-threaded
//! tokio runtime, that serve the connections of the agent, api, internal and rest listeners
//! (each connection stays on one thread). Everything else (the registry and Redis, GitOps
//! polls, the cluster state hub, the observability listener, the accept loops and gRPC TLS
//! handshakes) runs on kas's multi-threaded runtime, and so do the rest listener's routes other
//! than the Kubernetes API proxy (`rest::scope::run_on`), whose work (a cluster state read
//! encodes every view) would otherwise delay proxied requests.
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

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kas_proto::runtime_thread::RuntimeThread;
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
    /// Starts `threads` threads; with 0, everything stays on the calling runtime.
    pub fn start(threads: usize) -> io::Result<Self> {
        if threads == 0 {
            return Ok(Self::disabled());
        }
        let threads =
            (0..threads).map(|i| RuntimeThread::start(format!("{THREAD_NAME}-{i}"))).collect::<io::Result<Vec<_>>>()?;
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

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    fn thread_name() -> Option<String> {
        std::thread::current().name().map(str::to_owned)
    }

    #[tokio::test]
    async fn connections_take_the_threads_in_turn_and_end_with_them() {
        let plane = DataPlane::start(2).unwrap();
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
        let plane = DataPlane::start(0).unwrap();
        assert!(!plane.is_enabled());
        assert!(plane.handles().is_empty());
        let here = thread_name();
        assert_eq!(plane.spawn(async { thread_name() }).await.unwrap(), here);
    }
}
