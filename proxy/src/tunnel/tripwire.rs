//! [`Tripwire`]: a flag set once, awaited by one task, on the data path.
//!
//! The tunnel's relay loops wait for "the other side gave up" beside every frame they take. A
//! `CancellationToken` built, polled and dropped a `cancelled()` future for each of them: a mutex
//! and a waiter list each time, about 7 % of a relaying kas's samples (issue 14). These signals
//! have one waiter, so an atomic flag and one stored waker do.

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;

/// Set once by any holder; awaited by one task at a time (a second waiting task would take the
/// first one's place and the first would not be woken).
#[derive(Clone, Debug, Default)]
pub struct Tripwire(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    tripped: AtomicBool,
    waiter: AtomicWaker,
}

impl Tripwire {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag and wakes the waiting task, if any. Idempotent.
    pub fn trip(&self) {
        self.0.tripped.store(true, Ordering::Release);
        self.0.waiter.wake();
    }

    pub fn is_tripped(&self) -> bool {
        self.0.tripped.load(Ordering::Acquire)
    }

    fn poll_tripped(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_tripped() {
            return Poll::Ready(());
        }
        self.0.waiter.register(cx.waker());
        // A trip between the check and the registration woke no one: look again.
        if self.is_tripped() { Poll::Ready(()) } else { Poll::Pending }
    }

    /// Resolves once the flag is set.
    pub async fn tripped(&self) {
        poll_fn(|cx| self.poll_tripped(cx)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_waiting_task_wakes_when_tripped_from_another() {
        let wire = Tripwire::new();
        let waiter = tokio::spawn({
            let wire = wire.clone();
            async move { wire.tripped().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished() && !wire.is_tripped());
        wire.trip();
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken").expect("joined");
        assert!(wire.is_tripped());
    }

    #[tokio::test]
    async fn tripped_before_waiting_resolves_at_once_and_stays_tripped() {
        let wire = Tripwire::new();
        wire.trip();
        wire.trip();
        wire.tripped().await;
        wire.tripped().await;
        assert!(wire.is_tripped());
    }

    /// The relay loops poll the wire beside another future, once per frame: a poll that found it
    /// unset must still be woken by a later trip.
    #[tokio::test]
    async fn polled_again_and_again_it_is_still_woken() {
        let wire = Tripwire::new();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(1);
        let trip = wire.clone();
        let producer = tokio::spawn(async move {
            for n in 0..100 {
                tx.send(n).await.expect("receiver alive");
            }
            trip.trip();
            // Keeps the channel open: only the wire can end the loop below.
            std::future::pending::<()>().await;
        });
        let mut frames = 0;
        let relay = async {
            loop {
                tokio::select! {
                    () = wire.tripped() => break,
                    Some(_) = rx.recv() => frames += 1,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), relay).await.expect("the trip ends the loop");
        producer.abort();
        // The frames sent before the trip were relayed (the last one may lose the race to it).
        assert!(wire.is_tripped() && (99..=100).contains(&frames), "{frames}");
    }
}
