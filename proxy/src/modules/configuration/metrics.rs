//! Metrics of the configuration feature.

use std::time::Duration;

pub const GIT_POLLS: &str = "kas_git_polls_total";
pub const GIT_POLL_DURATION: &str = "kas_git_poll_duration_seconds";

pub fn describe() {
    metrics::describe_counter!(GIT_POLLS, "Agent configuration reads from Git, by outcome (ok, error)");
    metrics::describe_histogram!(
        GIT_POLL_DURATION,
        metrics::Unit::Seconds,
        "Duration of a configuration repository poll (local read or remote fetch), by repository kind"
    );
}

/// One repository poll: `remote` fetched over HTTP(S), else a local read; its duration.
pub fn git_poll(ok: bool, remote: bool, took: Duration) {
    metrics::counter!(GIT_POLLS, "outcome" => if ok { "ok" } else { "error" }).increment(1);
    let kind = if remote { "remote" } else { "local" };
    metrics::histogram!(GIT_POLL_DURATION, "repository" => kind).record(took.as_secs_f64());
}
