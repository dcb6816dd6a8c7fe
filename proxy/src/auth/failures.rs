//! Refused authentications: counted (`kas_auth_failures_total{listener, reason}`), logged without
//! flooding (one warning per source and [`LOG_INTERVAL`], saying how many were not logged), and on
//! the agent listener bounded per peer address ([`FailureLimiter`]): once a peer has used up its
//! failures, its further attempts are refused at once without verifying the token (in GitLab
//! mode: without asking GitLab, the expensive part). Tokens are never logged.
//!
//! Peers are keyed by IP address, IPv6 by its /64 (one host usually owns a whole /64). State is
//! bounded: above [`MAX_TRACKED_PEERS`] entries idle ones are dropped, and if that is not enough
//! new peers share one overflow entry (the `None` key, also used when the address is unknown).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// At most one warning per source per interval: an attack costs a few log lines a minute.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Peers tracked at once (per listener); beyond it, new peers share one entry.
pub const MAX_TRACKED_PEERS: usize = 10_000;
/// Failed agent authentications per peer: refilled at 1 per second, bursts of 20. An agentk
/// retrying with a wrong token (it backs off) never hits it; a token guesser gets 1 try/s.
pub const DEFAULT_FAILED_AGENT_AUTH_PER_SECOND: u32 = 1;
pub const DEFAULT_FAILED_AGENT_AUTH_BURST: u32 = 20;

/// `auth.failed_agent_authentications` in the kas config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailureLimitConfig {
    /// Failed agent-token authentications a peer address regains per second.
    pub per_second: u32,
    /// Failed attempts a peer may make in a row before further attempts are refused unverified.
    pub burst: u32,
}

impl Default for FailureLimitConfig {
    fn default() -> Self {
        Self { per_second: DEFAULT_FAILED_AGENT_AUTH_PER_SECOND, burst: DEFAULT_FAILED_AGENT_AUTH_BURST }
    }
}

/// The key of a peer: its address, IPv6 reduced to the /64.
fn peer_key(ip: Option<IpAddr>) -> Option<IpAddr> {
    match ip? {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => Some(IpAddr::V4(v4)),
            None => Some(IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into())),
        },
        v4 => Some(v4),
    }
}

/// Inserts into a bounded map: prunes with `idle` first, then falls back to the overflow key.
fn bounded_key<V>(
    map: &mut HashMap<Option<IpAddr>, V>,
    key: Option<IpAddr>,
    idle: impl Fn(&V) -> bool,
) -> Option<IpAddr> {
    if map.contains_key(&key) || map.len() < MAX_TRACKED_PEERS {
        return key;
    }
    map.retain(|_, v| !idle(v));
    if map.len() < MAX_TRACKED_PEERS { key } else { None }
}

/// Counts refusals of one listener and logs them, at most one warning per source per interval.
#[derive(Debug)]
pub struct FailureLog {
    listener: &'static str,
    sources: Mutex<HashMap<Option<IpAddr>, LogState>>,
}

#[derive(Debug)]
struct LogState {
    last: Instant,
    /// Refusals not logged since `last`.
    suppressed: u64,
}

impl FailureLog {
    pub fn new(listener: &'static str) -> Self {
        Self { listener, sources: Mutex::default() }
    }

    /// Counts a refusal (`reason` is one of a few fixed words) and logs it unless this source
    /// was logged less than [`LOG_INTERVAL`] ago. Returns whether it logged.
    pub fn record(&self, peer: Option<IpAddr>, reason: &'static str) -> bool {
        crate::metrics::auth_failure(self.listener, reason);
        let now = Instant::now();
        let suppressed = {
            let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
            let key =
                bounded_key(&mut sources, peer_key(peer), |s| now.saturating_duration_since(s.last) >= LOG_INTERVAL);
            match sources.get_mut(&key) {
                Some(s) if now.saturating_duration_since(s.last) < LOG_INTERVAL => {
                    s.suppressed += 1;
                    return false;
                }
                Some(s) => {
                    s.last = now;
                    std::mem::take(&mut s.suppressed)
                }
                None => {
                    sources.insert(key, LogState { last: now, suppressed: 0 });
                    0
                }
            }
        };
        let peer = peer.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
        tracing::warn!(
            listener = self.listener,
            %peer,
            reason,
            not_logged_since_last_warning = suppressed,
            "authentication refused (further refusals from this source are logged at most every {}s)",
            LOG_INTERVAL.as_secs()
        );
        true
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// Per-peer token bucket of failed authentications.
#[derive(Debug)]
pub struct FailureLimiter {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<Option<IpAddr>, Bucket>>,
}

/// The peer used up its failed attempts; `retry_after` until the next one is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many failed authentications from this address; retry in {}s", retry_after.as_secs().max(1))]
pub struct TooManyFailures {
    pub retry_after: Duration,
}

impl FailureLimiter {
    pub fn new(config: &FailureLimitConfig) -> Self {
        Self {
            per_second: f64::from(config.per_second.max(1)),
            burst: f64::from(config.burst.max(1)),
            buckets: Mutex::default(),
        }
    }

    fn refill(&self, b: &mut Bucket, now: Instant) {
        let elapsed = now.saturating_duration_since(b.updated).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.per_second).min(self.burst);
        b.updated = now;
    }

    /// Whether the peer may try (again): refused while its failures are used up.
    pub fn check(&self, peer: Option<IpAddr>) -> Result<(), TooManyFailures> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(b) = buckets.get_mut(&peer_key(peer)) else { return Ok(()) };
        self.refill(b, now);
        if b.tokens >= 1.0 {
            return Ok(());
        }
        Err(TooManyFailures { retry_after: Duration::from_secs_f64((1.0 - b.tokens) / self.per_second) })
    }

    /// Takes one failure from the peer's bucket.
    pub fn failed(&self, peer: Option<IpAddr>) {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let (per_second, burst) = (self.per_second, self.burst);
        // A bucket that has refilled completely carries no state: drop it when pruning.
        let key = bounded_key(&mut buckets, peer_key(peer), |b| {
            b.tokens + now.saturating_duration_since(b.updated).as_secs_f64() * per_second >= burst
        });
        let b = buckets.entry(key).or_insert(Bucket { tokens: self.burst, updated: now });
        self.refill(b, now);
        b.tokens = (b.tokens - 1.0).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_gets_its_burst_then_one_failure_per_interval() {
        let l = FailureLimiter::new(&FailureLimitConfig { per_second: 2, burst: 3 });
        for _ in 0..3 {
            l.check(ip(1)).unwrap();
            l.failed(ip(1));
        }
        let e = l.check(ip(1)).unwrap_err();
        assert_eq!(e.retry_after, Duration::from_millis(500));
        // Other peers are not affected.
        l.check(ip(2)).unwrap();
        tokio::time::advance(Duration::from_millis(500)).await;
        l.check(ip(1)).unwrap();
        l.failed(ip(1));
        assert!(l.check(ip(1)).is_err());
        // Refills up to the burst, not beyond.
        tokio::time::advance(Duration::from_secs(3600)).await;
        for _ in 0..3 {
            l.check(ip(1)).unwrap();
            l.failed(ip(1));
        }
        assert!(l.check(ip(1)).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn ipv6_peers_share_their_64_and_unknown_peers_share_one_bucket() {
        let l = FailureLimiter::new(&FailureLimitConfig { per_second: 1, burst: 1 });
        let a: Ipv6Addr = "2001:db8:1:2::1".parse().unwrap();
        let b: Ipv6Addr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: Ipv6Addr = "2001:db8:1:3::1".parse().unwrap();
        l.failed(Some(a.into()));
        assert!(l.check(Some(b.into())).is_err());
        l.check(Some(other.into())).unwrap();
        l.failed(None);
        assert!(l.check(None).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn tracked_peers_are_bounded() {
        let l = FailureLimiter::new(&FailureLimitConfig { per_second: 1, burst: 5 });
        for i in 0..(MAX_TRACKED_PEERS as u32 + 100) {
            l.failed(Some(IpAddr::V4(Ipv4Addr::from(i))));
        }
        // Plus the one shared overflow entry.
        assert!(l.buckets.lock().unwrap().len() <= MAX_TRACKED_PEERS + 1);
        // Once idle (refilled), old entries are dropped for new peers.
        tokio::time::advance(Duration::from_secs(10)).await;
        l.failed(ip(7));
        assert!(l.buckets.lock().unwrap().contains_key(&ip(7)));
    }

    #[tokio::test(start_paused = true)]
    async fn one_warning_per_source_per_interval() {
        let log = FailureLog::new("test");
        assert!(log.record(ip(1), "invalid_token"));
        for _ in 0..1000 {
            assert!(!log.record(ip(1), "invalid_token"));
        }
        assert!(log.record(ip(2), "invalid_token"), "another source is logged");
        tokio::time::advance(LOG_INTERVAL).await;
        assert!(log.record(ip(1), "invalid_token"));
        assert!(!log.record(ip(1), "invalid_token"));
    }
}
