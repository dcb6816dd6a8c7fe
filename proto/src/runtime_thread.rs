//! A thread that runs a single-threaded tokio runtime until it is stopped: the data planes of
//! kas (`server::data_plane`) and agentk (`data_plane`), which serve their connections on such
//! threads (issue 14).

use std::io;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The runtime's thread. Dropping it stops the thread: its tasks are dropped, as when the
/// process exits.
pub struct RuntimeThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
}

impl RuntimeThread {
    /// Starts the thread `name` (as `ps -T` and profilers show it). It logs where the thread
    /// that starts it does (the global subscriber, or a test's own on its thread).
    pub fn start(name: String) -> io::Result<Self> {
        let (stop, stopped) = oneshot::channel::<()>();
        let (started, handle) = std::sync::mpsc::sync_channel(1);
        let logs = tracing::dispatcher::get_default(Clone::clone);
        // The runtime is built and dropped on its own thread only: dropping a runtime on another
        // runtime's thread (kas and agentk start from one) panics.
        std::thread::Builder::new().name(name).spawn(move || {
            let _logs = tracing::dispatcher::set_default(&logs);
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = started.send(Err(e));
                    return;
                }
            };
            let _ = started.send(Ok(runtime.handle().clone()));
            // Runs the spawned tasks until stopped; dropping the runtime then drops them.
            runtime.block_on(async {
                let _ = stopped.await;
            });
        })?;
        // Waits for the thread to build its runtime: once, at start-up, for microseconds.
        let handle = handle.recv().map_err(|_| io::Error::other("a runtime thread ended before it started"))??;
        Ok(Self { handle, stop: Some(stop) })
    }

    /// Where the thread's tasks go: `spawn` on it, or `enter` it while creating something that
    /// spawns its own tasks (a tonic `Channel`).
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for RuntimeThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
