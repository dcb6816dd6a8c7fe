//! A thread that runs a single-threaded tokio runtime until it is stopped: the data planes of
//! kas (`server::data_plane`) and agentk (`data_plane`), which serve their connections on such
//! threads (issue 14), and how Linux schedules those threads ([`Scheduling`]).

use std::fmt;
use std::io;
use std::str::FromStr;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The runtime's thread. Dropping it stops the thread: its tasks are dropped, as when the
/// process exits.
pub struct RuntimeThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
}

impl RuntimeThread {
    /// Starts the thread `name` (as `ps -T` and profilers show it), scheduled as `scheduling`
    /// says. It logs where the thread that starts it does (the global subscriber, or a test's
    /// own on its thread).
    pub fn start(name: String, scheduling: Scheduling) -> io::Result<Self> {
        let (stop, stopped) = oneshot::channel::<()>();
        let (started, handle) = std::sync::mpsc::sync_channel(1);
        let logs = tracing::dispatcher::get_default(Clone::clone);
        // The runtime is built and dropped on its own thread only: dropping a runtime on another
        // runtime's thread (kas and agentk start from one) panics.
        std::thread::Builder::new().name(name).spawn(move || {
            let _logs = tracing::dispatcher::set_default(&logs);
            if let Err(e) = scheduling.apply_to_current_thread() {
                // Only speed depends on it: the thread serves as it would have.
                tracing::warn!(
                    thread = std::thread::current().name().unwrap_or_default(),
                    scheduling = %scheduling,
                    error = %e,
                    "cannot set the data plane thread's scheduling policy; it keeps the process's"
                );
            }
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
                tokio::select! {
                    _ = stopped => {}
                    () = keep_a_near_timer() => {}
                }
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

/// The period of [`keep_a_near_timer`]: shorter than the timers registered per request (kas's
/// HTTP/1 header read timeout is its handshake timeout, 10 s by default).
pub const NEAR_TIMER_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps a timer due within [`NEAR_TIMER_PERIOD`] on the runtime. tokio's time driver wakes its
/// thread through the runtime's event fd whenever a timer is registered that is due before every
/// timer it had when it last looked (it may be parked on the later one); on a single-threaded
/// runtime the registering task runs on that very thread, so the wake is a wasted `write` and a
/// spurious event. hyper registers a new header read timer after every HTTP/1 request, and with
/// no sooner timer each request paid one (issue 14). With this timer every later timer of at
/// least the period is never the soonest; the cost is one wake-up of the thread per period.
async fn keep_a_near_timer() {
    // Not `interval`, whose first tick is due at once: its firing would make the driver see no
    // near timer until the thread parks again, as after each later tick.
    let first = tokio::time::Instant::now() + NEAR_TIMER_PERIOD;
    let mut tick = tokio::time::interval_at(first, NEAR_TIMER_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

impl Drop for RuntimeThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// How Linux schedules a data plane thread (kas's `connections.data_plane_scheduling`,
/// agentk's `--data-plane-scheduling`).
///
/// Why `batch` by default (issue 14): a proxied request wakes the next process on its way (the
/// caller's write wakes kas, kas's write wakes agentk, ...). A woken `SCHED_OTHER` thread may
/// preempt the thread that woke it on the same CPU, before that one has finished its turn and
/// gone back to waiting for events: two context switches where one would do, and the woken
/// thread runs while the writer's batch of work is half done. A woken `SCHED_BATCH` thread does
/// not preempt the thread running on its CPU (the kernel's tick or that thread's sleep hands
/// the CPU over); it is otherwise scheduled as `SCHED_OTHER`, at the same nice level. Measured
/// with kas-bench and in held load (docs/benchmarks.md, issue 14's eleventh part): a third
/// fewer context switches per request, about 8 % less CPU per request, 5-9 % more requests a
/// second, and a ~14 % lower p50 through two kas. The cost: when every CPU is busy with other
/// work, a woken data plane thread waits for the running thread's turn to end (at most a
/// scheduler slice, a few milliseconds) instead of taking the CPU at once. `normal` leaves the
/// thread as the process started it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheduling {
    /// `SCHED_BATCH` (`sched(7)`): woken, the thread does not preempt the one running.
    #[default]
    Batch,
    /// The process's own policy (`SCHED_OTHER` unless changed from outside, e.g. by `chrt`).
    Normal,
}

impl Scheduling {
    /// Sets the calling thread's policy (threads it starts afterwards inherit it). Allowed
    /// without privileges: `SCHED_BATCH` at static priority 0, the nice level unchanged.
    fn apply_to_current_thread(self) -> io::Result<()> {
        match self {
            Self::Batch => set_current_thread_batch(),
            Self::Normal => Ok(()),
        }
    }
}

#[allow(unsafe_code)] // the one system call; libc has no safe wrapper
fn set_current_thread_batch() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param` that outlives the call; pid 0 is the calling
    // thread, whose policy is all the call changes.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

impl fmt::Display for Scheduling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Batch => "batch",
            Self::Normal => "normal",
        })
    }
}

impl FromStr for Scheduling {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "batch" => Ok(Self::Batch),
            "normal" => Ok(Self::Normal),
            other => Err(format!("unknown scheduling \"{other}\": expected batch or normal")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // How the threads are scheduled is tested against /proc in the e2e crate
    // (`tests/tests/scheduling.rs`), with the real binaries.

    #[test]
    fn scheduling_parses_its_two_names_and_refuses_others() {
        assert_eq!("batch".parse::<Scheduling>(), Ok(Scheduling::Batch));
        assert_eq!("normal".parse::<Scheduling>(), Ok(Scheduling::Normal));
        assert_eq!(Scheduling::default(), Scheduling::Batch);
        let e = "fifo".parse::<Scheduling>().unwrap_err();
        assert!(e.contains("\"fifo\"") && e.contains("batch or normal"), "{e}");
        for s in [Scheduling::Batch, Scheduling::Normal] {
            assert_eq!(s.to_string().parse::<Scheduling>(), Ok(s));
        }
    }
}
