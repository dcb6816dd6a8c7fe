//! Wake-ups a data plane thread does not pay for (issue 14): a task that registers a timer due
//! before every other timer of its runtime, as hyper's header read timer after each HTTP/1
//! request, makes tokio's time driver wake its own thread through the runtime's event fd (a
//! `write`). `RuntimeThread` keeps a near timer so that it does not. Counted from `/proc`
//! (`syscw`: the thread's `write` system calls).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use kas_proto::runtime_thread::{NEAR_TIMER_PERIOD, RuntimeThread, Scheduling};

/// Registrations made in the test: each would cost one `write` without the near timer.
const REGISTRATIONS: u64 = 100;

/// The `write`-family system calls a thread has made (`/proc/<pid>/task/<tid>/io`).
fn writes_of(thread: &str) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{thread}/io")).unwrap();
    io.lines().find_map(|l| l.strip_prefix("syscw: ")).unwrap().trim().parse().unwrap()
}

/// Waits until the thread is parked: blocked in `epoll_wait`, where tokio's driver looks at its
/// timers before it blocks. On a busy machine the runtime thread may otherwise still be running
/// when the next timer is registered, and a test that counted then would count the start-up's
/// registrations, not the one it is about.
fn wait_until_parked(thread: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{thread}/wchan")).unwrap() != "do_epoll_wait" {
        assert!(std::time::Instant::now() < deadline, "the runtime thread did not park within 10 s");
        std::thread::yield_now();
    }
}

#[test]
fn a_timer_registered_on_a_runtime_thread_writes_nothing_to_wake_it() {
    let runtime = RuntimeThread::start("rt-test-timers".to_owned(), Scheduling::Normal).unwrap();
    let handle = runtime.handle().clone();
    // The runtime thread's `/proc` entry ("<pid>/task/<tid>").
    let thread = futures::executor::block_on(
        handle.spawn(async { std::fs::read_link("/proc/thread-self").unwrap().display().to_string() }),
    )
    .unwrap();
    // A far timer, as an idle connection's: without the near timer it is the soonest one.
    handle.spawn(async { tokio::time::sleep(Duration::from_secs(3600)).await });
    let timer = Duration::from_secs(10);
    assert!(timer > NEAR_TIMER_PERIOD);

    let (ask, mut asked) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (done, registered) = std::sync::mpsc::channel::<()>();
    handle.spawn(async move {
        while asked.recv().await.is_some() {
            // Registered by its first poll, then dropped: hyper's header read timer, which it
            // makes anew for each request head it waits for.
            let mut sleep = std::pin::pin!(tokio::time::sleep(timer));
            assert!(futures::poll!(sleep.as_mut()).is_pending());
            done.send(()).unwrap();
        }
    });
    let ask_and_wait = || {
        ask.send(()).unwrap();
        registered.recv_timeout(Duration::from_secs(10)).unwrap();
    };
    // Once before counting: the far timer is in place and the thread has parked with it.
    ask_and_wait();
    wait_until_parked(&thread);
    let before = writes_of(&thread);
    for _ in 0..REGISTRATIONS {
        // Each from a parked thread, as hyper's after the next request head arrives (the test's
        // send wakes it: a write of this thread, not of the runtime's).
        ask_and_wait();
        wait_until_parked(&thread);
    }
    let writes = writes_of(&thread) - before;
    // The near timer fires once a period at most in the loop (milliseconds; a few hundred under
    // load), and the driver, which looked at its timers as it fired, sees none near until the
    // thread parks again: its next tick and the test's timer before that may pay a write each.
    assert!(writes <= 2, "{writes} writes for {REGISTRATIONS} timers registered on the runtime thread");
    drop(runtime);
}
