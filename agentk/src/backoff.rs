//! Exponential backoff with full jitter: the delay is uniform in [0, min(cap, base * 2^n)], so
//! many agents that lost the same kas do not reconnect in lockstep.

use std::time::Duration;

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
}
