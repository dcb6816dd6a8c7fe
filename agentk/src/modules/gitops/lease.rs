//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it:
//! a candidate takes the Lease when it does not exist, when nobody holds it, or when its holder
//! has not renewed it for `leaseDurationSeconds` (measured from when this candidate last saw the
//! record change, on its own clock, so clock skew between nodes does not matter); every write is
//! a create or a PUT carrying the `resourceVersion` read, so of two candidates exactly one wins
//! (the other gets 409 Conflict or AlreadyExists). The holder renews every retry period and
//! steps down when it could not renew for the renew deadline, which is shorter than the lease
//! duration: it stops before anyone else may start. On a clean stop the holder releases the
//! Lease (empty holder, 1 s duration), so another replica takes over at its next try.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::GitopsSettings;

/// How long a release may take on shutdown (agentk is stopping; the Lease expires anyway).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Elector {
    pub api: Api<Lease>,
    pub name: String,
    pub identity: String,
    pub settings: GitopsSettings,
    /// Told each change of leadership (the feature's leader metric).
    pub report: fn(bool),
}

/// The record as last read, and when (this process's clock) it was last seen to change.
struct Observed {
    holder: String,
    renew_time: Option<MicroTime>,
    duration: Duration,
    at: Instant,
}

fn micro_time(t: SystemTime) -> MicroTime {
    let micros =
        t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    MicroTime(k8s_openapi::jiff::Timestamp::from_microsecond(micros).unwrap_or_default())
}

/// `leaseDurationSeconds`: whole seconds, at least 1.
fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs_f64().ceil() as u64).unwrap_or(i32::MAX).max(1)
}

/// client-go's `wait.Jitter(retryPeriod, 1.2)`: candidates do not retry in lockstep.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(1.0 + 1.2 * rand::random::<f64>())
}

impl Elector {
    /// Competes until `stop`; `leader` says whether this process holds the Lease.
    pub async fn run(self, leader: watch::Sender<bool>, stop: CancellationToken) {
        let mut observed = None;
        // The last error warned about: the same one again (missing RBAC, say) is logged at debug.
        let mut last_error = String::new();
        loop {
            // Acquire.
            loop {
                match self.try_acquire_or_renew(&mut observed).await {
                    Ok(true) => break,
                    Ok(false) => last_error.clear(),
                    Err(e) => {
                        let e = super::apply::describe(&e);
                        if e == last_error {
                            tracing::debug!(lease = %self.name, error = %e, "lease: cannot read or write it");
                        } else {
                            tracing::warn!(lease = %self.name, error = %e, "lease: cannot read or write it");
                            last_error = e;
                        }
                    }
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(jittered(self.settings.lease_retry_period)) => {}
                }
            }
            last_error.clear();
            tracing::info!(lease = %self.name, identity = %self.identity, "acquired the lease: this replica leads");
            (self.report)(true);
            leader.send_replace(true);
            // Renew; step down when the renew deadline passes without a successful renewal.
            let mut renewed = Instant::now();
            let stepped_down = loop {
                tokio::select! {
                    () = stop.cancelled() => break false,
                    () = tokio::time::sleep(self.settings.lease_retry_period) => {}
                }
                let left = self.settings.lease_renew_deadline.saturating_sub(renewed.elapsed());
                match tokio::time::timeout(left, self.try_acquire_or_renew(&mut observed)).await {
                    Ok(Ok(true)) => renewed = Instant::now(),
                    Ok(Ok(false)) => {
                        tracing::warn!(lease = %self.name, "lease: taken over by another replica");
                        break true;
                    }
                    Ok(Err(e)) => tracing::warn!(lease = %self.name, error = %e, "lease: renewal failed"),
                    Err(_) => {}
                }
                if renewed.elapsed() >= self.settings.lease_renew_deadline {
                    tracing::warn!(lease = %self.name, "lease: not renewed within the renew deadline");
                    break true;
                }
            };
            leader.send_replace(false);
            (self.report)(false);
            if !stepped_down {
                // `stop`: the workers have ended (the caller stops them first); let another
                // replica take over now rather than after the lease duration.
                match tokio::time::timeout(RELEASE_TIMEOUT, self.release()).await {
                    Ok(Ok(())) => tracing::info!(lease = %self.name, "released the lease"),
                    Ok(Err(e)) => tracing::warn!(lease = %self.name, error = %e, "lease: release failed"),
                    Err(_) => tracing::warn!(lease = %self.name, "lease: release timed out"),
                }
                return;
            }
            tracing::info!(lease = %self.name, "lost the lease: stopped leading");
        }
    }

    /// One attempt: Ok(true) when this process holds the Lease afterwards.
    async fn try_acquire_or_renew(&self, observed: &mut Option<Observed>) -> Result<bool, kube::Error> {
        let now = SystemTime::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds(self.settings.lease_duration)),
                    acquire_time: Some(micro_time(now)),
                    renew_time: Some(micro_time(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0));
        let changed = observed.as_ref().is_none_or(|o| o.holder != holder || o.renew_time != spec.renew_time);
        if changed {
            *observed = Some(Observed {
                holder: holder.clone(),
                renew_time: spec.renew_time.clone(),
                duration,
                at: Instant::now(),
            });
        }
        let seen = observed.as_ref().map_or(Instant::now(), |o| o.at + o.duration);
        if !holder.is_empty() && holder != self.identity && seen > Instant::now() {
            return Ok(false);
        }
        let mut spec = spec;
        if holder != self.identity {
            spec.acquire_time = Some(micro_time(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(seconds(self.settings.lease_duration));
        spec.renew_time = Some(micro_time(now));
        lease.spec = Some(spec);
        // The resourceVersion read makes this write lose to any other since.
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if this process still holds it.
    async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else { return Ok(()) };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        let now = micro_time(SystemTime::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        lease.spec = Some(spec);
        self.api.replace(&self.name, &PostParams::default(), &lease).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_become_whole_seconds_of_at_least_one() {
        assert_eq!(seconds(Duration::from_secs(15)), 15);
        assert_eq!(seconds(Duration::from_millis(1500)), 2);
        assert_eq!(seconds(Duration::from_millis(10)), 1);
        for _ in 0..100 {
            let j = jittered(Duration::from_secs(1));
            assert!(j >= Duration::from_secs(1) && j <= Duration::from_millis(2200), "{j:?}");
        }
    }
}
