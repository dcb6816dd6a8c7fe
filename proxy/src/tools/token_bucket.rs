//! A token bucket limiting request rate (kas -> GitLab requests, Git repository polls).
//!
//! `acquire` takes a token at once when one is available. Otherwise the caller reserves the
//! next token and waits for it, provided that wait is at most `max_wait`; a longer wait fails
//! at once (`RateLimited`) instead of queueing unboundedly. Reservations make waiters queue in
//! arrival order. The mutex is never held across an `.await`.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// A bucket's configuration section (`gitlab.rate_limit`, `agents.git.rate_limit`). Fields
/// missing from a section take [`RateLimitConfig::DEFAULT`]'s; each owner sets its own default
/// section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// Sustained requests per second.
    pub requests_per_second: u32,
    /// Requests allowed at once after a quiet period (the bucket size).
    pub burst: u32,
    /// A request waits at most this long for the bucket; longer waits fail at once with
    /// UNAVAILABLE "rate limited".
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
}

impl RateLimitConfig {
    /// 10 requests per second, bursts of 50, waits of at most 5 s.
    pub const DEFAULT: Self = Self { requests_per_second: 10, burst: 50, max_wait: Duration::from_secs(5) };
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl From<&RateLimitConfig> for TokenBucket {
    fn from(c: &RateLimitConfig) -> Self {
        Self::new(c.requests_per_second, c.burst, c.max_wait)
    }
}

#[derive(Debug)]
pub struct TokenBucket {
    state: Mutex<State>,
    per_second: f64,
    burst: f64,
    max_wait: Duration,
}

#[derive(Debug)]
struct State {
    /// May go negative: tokens reserved by waiting callers.
    tokens: f64,
    updated: Instant,
}

/// The bucket would make the caller wait longer than `max_wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("rate limited: the next request slot is {} away (limit {})", crate::error::Rounded(*.wait), crate::error::Rounded(*.max_wait))]
pub struct RateLimited {
    pub wait: Duration,
    pub max_wait: Duration,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `per_second` tokens per second.
    pub fn new(per_second: u32, burst: u32, max_wait: Duration) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            state: Mutex::new(State { tokens: burst, updated: Instant::now() }),
            per_second: f64::from(per_second.max(1)),
            burst,
            max_wait,
        }
    }

    /// Takes one token, waiting up to `max_wait` for it.
    pub async fn acquire(&self) -> Result<(), RateLimited> {
        let wait = {
            let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            let elapsed = now.saturating_duration_since(s.updated).as_secs_f64();
            s.tokens = (s.tokens + elapsed * self.per_second).min(self.burst);
            s.updated = now;
            if s.tokens >= 1.0 {
                s.tokens -= 1.0;
                return Ok(());
            }
            let wait = Duration::from_secs_f64((1.0 - s.tokens) / self.per_second);
            if wait > self.max_wait {
                return Err(RateLimited { wait, max_wait: self.max_wait });
            }
            s.tokens -= 1.0; // reserved: callers after this one wait behind it
            wait
        };
        // A caller that goes away while waiting gives its reserved token back.
        let mut reservation = Reservation { bucket: self, kept: false };
        tokio::time::sleep(wait).await;
        reservation.kept = true;
        Ok(())
    }
}

/// A token taken ahead of time; returned to the bucket if the waiting caller is dropped.
struct Reservation<'a> {
    bucket: &'a TokenBucket,
    kept: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let mut s = self.bucket.state.lock().unwrap_or_else(PoisonError::into_inner);
            s.tokens = (s.tokens + 1.0).min(self.bucket.burst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_rate_then_refuses_long_waits() {
        let bucket = TokenBucket::new(2, 3, Duration::from_millis(1200));
        let start = Instant::now();
        for _ in 0..3 {
            bucket.acquire().await.unwrap();
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst is immediate");
        bucket.acquire().await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(500), "then one token per 1/rate");

        // Reservations queue: the next two callers would wait 0.5 s and 1 s; a third 1.5 s > max.
        let b = std::sync::Arc::new(bucket);
        let first = tokio::spawn({
            let b = b.clone();
            async move { b.acquire().await }
        });
        let second = tokio::spawn({
            let b = b.clone();
            async move { b.acquire().await }
        });
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        let refused = b.acquire().await.unwrap_err();
        assert!(refused.wait > refused.max_wait, "{refused}");
        // Rounded as people read durations, not to the nanosecond.
        assert_eq!(refused.to_string(), "rate limited: the next request slot is 1.5s away (limit 1.2s)");
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(1500));

        // A quiet period refills the bucket up to the burst, not beyond.
        tokio::time::advance(Duration::from_secs(60)).await;
        let t = Instant::now();
        for _ in 0..3 {
            b.acquire().await.unwrap();
        }
        assert_eq!(t.elapsed(), Duration::ZERO);
        b.acquire().await.unwrap();
        assert_eq!(t.elapsed(), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_gives_its_token_back() {
        let bucket = TokenBucket::new(1, 1, Duration::from_secs(2));
        bucket.acquire().await.unwrap();
        // Waits 1 s for the next token; cancelled after 0.5 s.
        assert!(tokio::time::timeout(Duration::from_millis(500), bucket.acquire()).await.is_err());
        // Without the returned reservation the next token would be 1.5 s away.
        let t = Instant::now();
        bucket.acquire().await.unwrap();
        assert_eq!(t.elapsed(), Duration::from_millis(500));
    }
}
