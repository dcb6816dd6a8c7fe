//! A thread that runs a single-threaded tokio runtime until it is stopped: the data planes of
//! kas (`server::data_plane`) and agentk (`data_plane`), which serve their connections on such
//! threads (issue 14).

use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Numbers the runtime threads of the process, so code can tell which one it runs on.
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The id of the runtime thread this is, if it is one.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The runtime's thread. Dropping it stops the thread: its tasks are dropped, as when the
/// process exits.
pub struct RuntimeThread {
    id: usize,
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
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        // The runtime is built and dropped on its own thread only: dropping a runtime on another
        // runtime's thread (kas and agentk start from one) panics.
        std::thread::Builder::new().name(name).spawn(move || {
            let _logs = tracing::dispatcher::set_default(&logs);
            CURRENT.set(Some(id));
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
        Ok(Self { id, handle, stop: Some(stop) })
    }

    /// This thread's id, unique in the process.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The id of the runtime thread the caller runs on (`None` on any other thread).
    pub fn current_id() -> Option<usize> {
        CURRENT.get()
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
