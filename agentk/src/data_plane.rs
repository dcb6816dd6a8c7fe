//! The tunnels' own runtime: one thread running a single-threaded tokio runtime that carries
//! every kas connection (its HTTP/2 connection task), the tunnel pool, the tunnels, the modules'
//! handling of the requests they carry, and the Kubernetes API proxy's connections to the API
//! server (opened from there). kube-rs clients built at start-up (GetPods) keep their own
//! worker task on the main runtime.
//! Everything else (informers, GitOps, the presence stream's handling, observability) stays
//! on the main multi-threaded runtime.
//!
//! Why (issue 14): a proxied request passes through several tasks (the kas connection, the
//! tunnel, the API server connection). On a work-stealing runtime each hand-off between them
//! may wake a parked worker thread on another core, a context switch (and, in a VM, an
//! interrupt to another virtual CPU) that costs more than the work it hands over. On one
//! thread the hand-offs are plain queue pushes. Measured with kas-bench (docs/benchmarks.md):
//! agentk's context switches per request at one connection 3.8-4.6 -> 2.1 (the minimum: one
//! wake-up per direction), its CPU per request -18 %, the p50 through kas -5 %. One core of
//! agentk proxies far more requests than a Kubernetes API server answers, and heavy
//! work elsewhere in agentk (decoding a large informer list, applying GitOps manifests) can no
//! longer delay a proxied request, since it never runs on this thread.

use std::io;

use kas_proto::runtime_thread::{RuntimeThread, Scheduling};
use tokio::runtime::Handle;

/// The thread's name (as `ps -T` and profilers show it).
pub const THREAD_NAME: &str = "agentk-tunnels";

/// The runtime and its thread. Dropping it stops the thread: its tasks are dropped (tunnels
/// end, requests in progress are cancelled), as when agentk exits.
pub struct DataPlane {
    thread: RuntimeThread,
}

impl DataPlane {
    pub fn start(scheduling: Scheduling) -> io::Result<Self> {
        Ok(Self { thread: RuntimeThread::start(THREAD_NAME.to_owned(), scheduling)? })
    }

    /// Where the tunnels' tasks go: `spawn` on it, or `enter` it while creating something
    /// that spawns its own tasks (a tonic `Channel`).
    pub fn handle(&self) -> &Handle {
        self.thread.handle()
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test]
    async fn tasks_run_on_the_named_thread_and_end_when_it_stops() {
        let plane = DataPlane::start(Scheduling::Normal).unwrap();
        let name = plane.handle().spawn(async { std::thread::current().name().map(str::to_owned) });
        assert_eq!(name.await.unwrap().as_deref(), Some(THREAD_NAME));
        // What a task spawned from a data-plane task (a tunnel from the pool) runs on too.
        let nested = plane
            .handle()
            .spawn(async { tokio::spawn(async { std::thread::current().name().map(str::to_owned) }).await });
        assert_eq!(nested.await.unwrap().unwrap().as_deref(), Some(THREAD_NAME));

        let (_tx, rx) = oneshot::channel::<()>();
        let forever = plane.handle().spawn(async move {
            let _ = rx.await;
        });
        drop(plane);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), forever).await;
        assert!(ended.expect("the task ended when the data plane stopped").unwrap_err().is_cancelled());
    }
}
