//! Exponential backoff with full jitter: the delay is uniform in [0, min(cap, base * 2^n)], so
//! many agents that lost the same kas do not reconnect in lockstep. A kas that sheds a new
//! connection says when to come back (`grpc-retry-pushback-ms`): the delay is then at least that,
//! plus jitter.

use std::time::Duration;

/// A pushback is stretched by up to this fraction (uniformly): kas hands shed agents successive
/// slots, and agents told the same slot should still not arrive in the same millisecond.
pub const PUSHBACK_JITTER: f64 = 0.2;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self { base, cap, attempt: 0 }
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        ceiling.mul_f64(rand::random::<f64>())
    }

    /// The delay before the next attempt after kas asked to wait `pushback` (if it did): never
    /// shorter than the pushback (stretched by up to [`PUSHBACK_JITTER`]) nor than the backoff's
    /// own delay, which keeps growing so that a kas that always answers "0 ms" cannot make the
    /// agent spin.
    pub fn next_delay_after(&mut self, pushback: Option<Duration>) -> Duration {
        let delay = self.next_delay();
        match pushback {
            Some(p) => delay.max(p.mul_f64(1.0 + rand::random::<f64>() * PUSHBACK_JITTER)),
            None => delay,
        }
    }

    /// The current upper bound of the delay.
    pub fn ceiling(&self) -> Duration {
        let factor = 2u32.saturating_pow(self.attempt.min(31));
        self.base.saturating_mul(factor).min(self.cap)
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let mut ceilings = Vec::new();
        for _ in 0..12 {
            let c = b.ceiling();
            let d = b.next_delay();
            assert!(d <= c);
            ceilings.push(c);
        }
        assert_eq!(ceilings[0], Duration::from_millis(100));
        assert_eq!(ceilings[3], Duration::from_millis(800));
        assert_eq!(*ceilings.last().unwrap(), Duration::from_secs(30));
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_millis(100));
    }

    #[test]
    fn a_pushback_is_waited_at_least_and_jittered() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let pushback = Duration::from_secs(2);
        let delays: Vec<Duration> = (0..200)
            .map(|_| {
                b.reset();
                b.next_delay_after(Some(pushback))
            })
            .collect();
        let most = pushback.mul_f64(1.0 + PUSHBACK_JITTER);
        assert!(delays.iter().all(|d| *d >= pushback && *d <= most), "{delays:?}");
        assert!(delays.iter().any(|d| *d != delays[0]), "jittered: {delays:?}");
        // A pushback below the backoff's own delay does not shorten it, and the backoff grows.
        for _ in 0..10 {
            b.next_delay_after(Some(Duration::ZERO));
        }
        assert_eq!(b.ceiling(), Duration::from_secs(30));
        b.reset();
        assert!(b.next_delay_after(None) <= Duration::from_millis(100));
    }
}
