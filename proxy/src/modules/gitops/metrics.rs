//! Metrics of the GitOps feature.

pub const SYNC_REPORTS: &str = "kas_gitops_sync_reports_total";
pub const PUSH_EVENTS: &str = "kas_git_push_events_total";
pub const PUSH_POLLS: &str = "kas_gitops_push_polls_total";

pub fn describe() {
    metrics::describe_counter!(
        SYNC_REPORTS,
        "agentk's GitOps sync reports received, by outcome (stored; refused: invalid or not a configured manifest \
         project; failed: the registry could not store it)"
    );
    metrics::describe_counter!(
        PUSH_EVENTS,
        "Push notifications received from GitLab (KasApi.GitPushEvent, POST /api/v1/git_push_events), by outcome \
         (published to every kas, failed)"
    );
    metrics::describe_counter!(
        PUSH_POLLS,
        "GitOps polls that a push event started at once (one per open stream of the pushed project; bursts count once)"
    );
}

/// One ReportSync: `stored`, `refused` or `failed`.
pub fn sync_report(outcome: &'static str) {
    metrics::counter!(SYNC_REPORTS, "outcome" => outcome).increment(1);
}

/// One push notification: published to every kas or not.
pub fn push_event(published: bool) {
    metrics::counter!(PUSH_EVENTS, "outcome" => if published { "published" } else { "failed" }).increment(1);
}

/// One poll that a push started.
pub fn push_poll() {
    metrics::counter!(PUSH_POLLS).increment(1);
}
