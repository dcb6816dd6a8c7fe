//! Admission control of new agent connections (presence streams) on one kas.
//!
//! When a kas dies, every agent it held reconnects within a fraction of a second (agentk's
//! backoff starts at 200 ms after a healthy connection), and a load balancer spreads them over
//! the survivors. Each new connection costs the survivor an agent token verification (a GitLab
//! request when the token is not cached), the per-agent connection count, the registry write and
//! a configuration read. A token bucket (`limits.agent_connection_accept_rate`) admits new
//! presence streams at a sustained rate with a burst; the rest are shed at once with
//! `UNAVAILABLE` and a retry pushback (`grpc-retry-pushback-ms`) before anything is verified or
//! counted, so shedding costs almost nothing and is never held against the agent
//! (`limits.agent_connections_per_minute` counts only admitted connections).
//!
//! The pushbacks of shed agents are spread: each one gets the next free slot after those already
//! handed out (one every `1 / per_second`), so the shed agents come back at the rate kas admits,
//! not all at once. Tunnels are not limited: an agent opens them only once its presence stream
//! was admitted, and refusing them would leave admitted agents unable to serve.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// New agent connections a kas admits per second, sustained, and at once after a quiet period.
/// A kas killed with a third of 10,000 agents sends 3,333 to two survivors (1,667 each) within
/// about 200 ms: the burst admits them at once. 10,000 agents moving to two survivors take
/// (5,000 - 2,000) / 1,000 = 3 s of shedding each. A release kas on the shared 2-core machine
/// of docs/scale.md took up to 1,900 new agent connections a second at about half a core, so the
/// rate protects a smaller kas without slowing a failover down.
pub const DEFAULT_AGENT_CONNECTION_ACCEPT_PER_SECOND: u32 = 1000;
pub const DEFAULT_AGENT_CONNECTION_ACCEPT_BURST: u32 = 2000;
/// The longest pushback kas gives: beyond it, shed agents come back and are shed again.
pub const MAX_RETRY_AFTER: Duration = kas_proto::metadata::MAX_RETRY_PUSHBACK;

/// `limits.agent_connection_accept_rate` in the kas config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AcceptRateConfig {
    /// New agent connections (presence streams) admitted per second, sustained.
    pub per_second: u32,
    /// New agent connections admitted at once after a quiet period (the bucket size).
    pub burst: u32,
}

impl Default for AcceptRateConfig {
    fn default() -> Self {
        Self { per_second: DEFAULT_AGENT_CONNECTION_ACCEPT_PER_SECOND, burst: DEFAULT_AGENT_CONNECTION_ACCEPT_BURST }
    }
}

/// A new agent connection was shed: the agent should try again after `retry_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "kas is admitting new agent connections at its limit of {per_second}/s (limits.agent_connection_accept_rate); retry in {}",
    crate::error::Rounded(*.retry_after)
)]
pub struct Shed {
    pub retry_after: Duration,
    pub per_second: u32,
}

impl From<Shed> for tonic::Status {
    fn from(shed: Shed) -> Self {
        kas_proto::metadata::with_retry_pushback(tonic::Status::unavailable(shed.to_string()), shed.retry_after)
    }
}

#[derive(Debug)]
struct State {
    tokens: f64,
    updated: Instant,
    /// The slot after the last one handed out to a shed agent.
    next_slot: Instant,
}

/// The accept-rate limiter of one kas's agent listener.
#[derive(Debug)]
pub struct Admission {
    per_second: u32,
    rate: f64,
    burst: f64,
    state: Mutex<State>,
}

impl Admission {
    pub fn new(config: &AcceptRateConfig) -> Self {
        let burst = f64::from(config.burst.max(1));
        let now = Instant::now();
        Self {
            per_second: config.per_second.max(1),
            rate: f64::from(config.per_second.max(1)),
            burst,
            state: Mutex::new(State { tokens: burst, updated: now, next_slot: now }),
        }
    }

    /// Admits one new connection, or sheds it with the time its agent should come back.
    pub fn admit(&self) -> Result<(), Shed> {
        let now = Instant::now();
        let outcome = {
            let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let elapsed = now.saturating_duration_since(s.updated).as_secs_f64();
            s.tokens = (s.tokens + elapsed * self.rate).min(self.burst);
            s.updated = now;
            if s.tokens >= 1.0 {
                s.tokens -= 1.0;
                Ok(())
            } else {
                // The next token, or the slot after the shed agents told before this one.
                let next_token = now + Duration::from_secs_f64((1.0 - s.tokens) / self.rate);
                let slot = s.next_slot.max(next_token).min(now + MAX_RETRY_AFTER);
                s.next_slot = slot + Duration::from_secs_f64(1.0 / self.rate);
                Err(Shed { retry_after: slot - now, per_second: self.per_second })
            }
        };
        crate::metrics::agent_connection_admission(outcome.is_ok());
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(per_second: u32, burst: u32) -> Admission {
        Admission::new(&AcceptRateConfig { per_second, burst })
    }

    #[tokio::test(start_paused = true)]
    async fn the_burst_is_admitted_then_the_rate() {
        let a = admission(10, 5);
        for _ in 0..5 {
            a.admit().unwrap();
        }
        let shed = a.admit().unwrap_err();
        assert_eq!(shed.retry_after, Duration::from_millis(100));
        tokio::time::advance(Duration::from_millis(100)).await;
        a.admit().unwrap();
        assert!(a.admit().is_err());
        // Refills up to the burst, not beyond.
        tokio::time::advance(Duration::from_secs(3600)).await;
        for _ in 0..5 {
            a.admit().unwrap();
        }
        assert!(a.admit().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn shed_agents_are_told_successive_slots_at_the_rate() {
        let a = admission(100, 1);
        a.admit().unwrap();
        let hints: Vec<Duration> = (0..300).map(|_| a.admit().unwrap_err().retry_after).collect();
        // One slot every 10 ms: the 300 shed agents come back over 3 s, not at once.
        assert_eq!(hints[0], Duration::from_millis(10));
        assert_eq!(hints[1], Duration::from_millis(20));
        assert_eq!(hints[299], Duration::from_millis(3000));
        // Agents that come back at their slot are admitted (one token per slot).
        tokio::time::advance(Duration::from_millis(10)).await;
        a.admit().unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        a.admit().unwrap();
        // Once the slots handed out are past, a shed agent gets the next token's time again.
        tokio::time::advance(Duration::from_secs(10)).await;
        a.admit().unwrap();
        assert_eq!(a.admit().unwrap_err().retry_after, Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn pushbacks_are_capped() {
        let a = admission(1, 1);
        a.admit().unwrap();
        let mut last = Duration::ZERO;
        for _ in 0..(MAX_RETRY_AFTER.as_secs() + 100) {
            last = a.admit().unwrap_err().retry_after;
        }
        assert_eq!(last, MAX_RETRY_AFTER);
    }

    #[test]
    fn a_shed_is_unavailable_with_the_pushback_and_the_key() {
        let status: tonic::Status = Shed { retry_after: Duration::from_millis(1500), per_second: 7 }.into();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("limits.agent_connection_accept_rate"), "{}", status.message());
        assert!(status.message().contains("7/s") && status.message().contains("retry in 1.5s"), "{}", status.message());
        assert_eq!(kas_proto::metadata::retry_pushback(&status), Some(Duration::from_millis(1500)));
    }
}
