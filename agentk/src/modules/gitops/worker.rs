//! One manifest project's worker: receives commits from kas and keeps the latest one applied.
//!
//! Two halves run together. The receiver holds `GetObjectsToSynchronize` (resumed from the last
//! commit applied, so kas sends nothing it already has; reconnecting with backoff, to the next
//! kas address each time) and assembles each commit (Header, Objects continued with `more`,
//! Trailer). The applier applies the newest commit; a newer one arriving cancels an apply in
//! progress (the sync's future is dropped: requests in flight are abandoned, what was applied
//! stays, and the new commit's sync prunes what it no longer has). After a sync it waits
//! `--gitops-reapply-period` and applies the same commit again (drift correction), or, after a
//! failure, a backoff delay. Every sync is reported to kas (`GitopsStatus.ReportSync`, best
//! effort: a kas that does not serve it is noted once at debug level).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use kas_proto::gitops::gitops_agent_client::GitopsAgentClient;
use kas_proto::gitops::gitops_status_client::GitopsStatusClient;
use kas_proto::gitops::objects_to_synchronize_response::Message;
use kas_proto::gitops::{ObjectsToSynchronizeRequest, SyncReport};
use kas_proto::tunnel::pb::ManifestProjectConfiguration;
use kas_proto::tunnel::pb::manifest_project_configuration::DryRunStrategy;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use super::apply::{Commit, Progress, Syncer};
use super::objects::SourceObject;
use crate::backoff::Backoff;
use crate::metrics::SyncOutcome;
use crate::modules::RunContext;
use crate::status::GitopsState;

/// Reconnecting to kas: as the presence stream.
const RECONNECT_BASE: Duration = Duration::from_millis(200);
const RECONNECT_CAP: Duration = Duration::from_secs(30);
const HEALTHY_AFTER: Duration = Duration::from_secs(30);
/// Retrying a failed sync: from about a second, up to the reapply period.
const RETRY_BASE: Duration = Duration::from_secs(1);
/// How long a report may take (it is not retried).
const REPORT_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Worker {
    pub project: ManifestProjectConfiguration,
    pub agent_id: i64,
    pub syncer: Syncer,
    pub kas: RunContext,
    pub pod_name: String,
    pub reapply_period: Duration,
    pub state: watch::Sender<GitopsState>,
}

type Latest = watch::Receiver<Option<Arc<Commit>>>;

impl Worker {
    pub async fn run(self, stop: CancellationToken) {
        let (commits, latest) = watch::channel(None);
        let (applied, resume_from) = watch::channel(String::new());
        // Which kas the stream uses now: reports go to the same one.
        let kas_index = AtomicUsize::new(0);
        tokio::select! {
            () = stop.cancelled() => {}
            () = self.receive(commits, resume_from, &kas_index) => {}
            () = self.apply_loop(latest, applied, &kas_index) => {}
        }
    }

    fn labels(&self) -> (String, String) {
        (self.project.id.clone(), self.project.r#ref.clone())
    }

    async fn receive(
        &self,
        commits: watch::Sender<Option<Arc<Commit>>>,
        resume_from: watch::Receiver<String>,
        kas_index: &AtomicUsize,
    ) {
        let mut backoff = Backoff::new(RECONNECT_BASE, RECONNECT_CAP);
        let mut last_problem = String::new();
        let start = rand::random_range(0..self.kas.kas.len().max(1));
        for attempt in 0usize.. {
            let index = (start + attempt) % self.kas.kas.len().max(1);
            kas_index.store(index, Ordering::Relaxed);
            let Some((address, channel)) = self.kas.kas.get(index) else { return };
            let started = Instant::now();
            let from = resume_from.borrow().clone();
            let received =
                |commits: &watch::Sender<Option<Arc<Commit>>>| commits.borrow().as_ref().map(|c| c.id.clone());
            let before = received(&commits);
            let result = self.stream(channel.clone(), &from, &commits).await;
            if received(&commits) != before {
                last_problem.clear();
            }
            match result {
                Ok(()) => {
                    tracing::debug!(project = %self.project.id, kas = %address, "kas ended the GitOps stream; reconnecting")
                }
                // The manifests or the configuration need fixing: said once (also to kas), until
                // the problem changes or a commit arrives.
                Err(status)
                    if matches!(status.code(), Code::NotFound | Code::FailedPrecondition | Code::InvalidArgument) =>
                {
                    if status.message() == last_problem {
                        tracing::debug!(project = %self.project.id, error = %status.message(), "kas still cannot send the manifests");
                    } else {
                        last_problem = status.message().to_owned();
                        tracing::warn!(project = %self.project.id, error = %status.message(), "kas cannot send the manifests");
                        let report = SyncReport {
                            error: status.message().to_owned(),
                            ..self.report_base(SystemTime::now(), Duration::ZERO)
                        };
                        let last = report.clone();
                        self.state.send_modify(|s| s.projects.entry(self.labels()).or_default().last = Some(last));
                        self.send_report(report, kas_index).await;
                    }
                }
                Err(status) => {
                    tracing::warn!(project = %self.project.id, kas = %address, code = ?status.code(), error = %status.message(), "GitOps stream failed");
                }
            }
            if started.elapsed() >= HEALTHY_AFTER {
                backoff.reset();
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// One stream: every complete commit goes to `commits`. Ok when kas ended it cleanly.
    async fn stream(
        &self,
        channel: tonic::transport::Channel,
        from: &str,
        commits: &watch::Sender<Option<Arc<Commit>>>,
    ) -> Result<(), tonic::Status> {
        let mut client = GitopsAgentClient::new(channel);
        let request = ObjectsToSynchronizeRequest {
            project_id: self.project.id.clone(),
            r#ref: self.project.r#ref.clone(),
            commit_id: from.to_owned(),
        };
        let mut stream = client.get_objects_to_synchronize(self.kas.authorized(request)).await?.into_inner();
        let mut building: Option<Commit> = None;
        let mut data = Vec::new();
        while let Some(response) = stream.message().await? {
            match response.message {
                Some(Message::Header(header)) => {
                    building = Some(Commit { id: header.commit_id, objects: Vec::new() });
                    data.clear();
                }
                Some(Message::Object(object)) => {
                    let commit = building
                        .as_mut()
                        .ok_or_else(|| tonic::Status::internal("kas sent an object outside a commit"))?;
                    data.extend_from_slice(&object.data);
                    if !object.more {
                        let value = serde_json::from_slice(&std::mem::take(&mut data)).map_err(|e| {
                            tonic::Status::internal(format!(
                                "kas sent an object of {} that is not JSON: {e}",
                                object.source
                            ))
                        })?;
                        commit.objects.push(SourceObject { source: object.source, object: value });
                    }
                }
                Some(Message::Trailer(_)) => {
                    let commit = building
                        .take()
                        .ok_or_else(|| tonic::Status::internal("kas sent a trailer outside a commit"))?;
                    tracing::info!(project = %self.project.id, commit = %commit.id, objects = commit.objects.len(), "GitOps: received a commit");
                    commits.send_replace(Some(Arc::new(commit)));
                }
                None => {}
            }
        }
        Ok(())
    }

    async fn apply_loop(&self, mut latest: Latest, applied: watch::Sender<String>, kas_index: &AtomicUsize) {
        let mut backoff = Backoff::new(RETRY_BASE, self.reapply_period.max(RETRY_BASE));
        let mut current = match newer(&mut latest, "").await {
            Some(c) => c,
            None => return,
        };
        loop {
            let started_at = SystemTime::now();
            let started = Instant::now();
            let mut progress = Progress::default();
            let outcome = tokio::select! {
                result = self.syncer.sync(&self.project, &current, &mut progress) => Ok(result),
                next = newer(&mut latest, &current.id) => Err(next),
            };
            let took = started.elapsed();
            let (error, metric) = match &outcome {
                Ok(Ok(())) if progress.failed == 0 => (String::new(), SyncOutcome::Ok),
                Ok(Ok(())) => (String::new(), SyncOutcome::Failed),
                Ok(Err(e)) => (e.clone(), SyncOutcome::Failed),
                Err(Some(next)) => (format!("cancelled: commit {} arrived", next.id), SyncOutcome::Cancelled),
                Err(None) => return,
            };
            let mut report = self.report_base(started_at, took);
            report.commit_id.clone_from(&current.id);
            report.error = error;
            report.applied = progress.applied;
            report.unchanged = progress.unchanged;
            report.pruned = progress.pruned;
            report.failed = progress.failed;
            report.errors = progress.errors;
            crate::metrics::gitops_sync(metric, &report);
            tracing::info!(
                project = %self.project.id, commit = %report.commit_id, outcome = metric.label(),
                applied = report.applied, unchanged = report.unchanged, pruned = report.pruned,
                failed = report.failed, error = %report.error, took_ms = report.duration_ms,
                "GitOps sync finished"
            );
            let key = self.labels();
            let last = report.clone();
            self.state.send_modify(|s| {
                let p = s.projects.entry(key).or_default();
                p.syncs += 1;
                p.last = Some(last);
            });
            self.send_report(report, kas_index).await;
            let wait = match outcome {
                Err(Some(next)) => {
                    current = next;
                    backoff.reset();
                    continue;
                }
                Ok(Ok(())) if metric == SyncOutcome::Ok => {
                    applied.send_replace(current.id.clone());
                    backoff.reset();
                    self.reapply_period
                }
                _ => backoff.next_delay(),
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                next = newer(&mut latest, &current.id) => match next {
                    Some(next) => current = next,
                    None => return,
                },
            }
        }
    }

    fn report_base(&self, started_at: SystemTime, took: Duration) -> SyncReport {
        let started_ms = started_at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        SyncReport {
            project_id: self.project.id.clone(),
            r#ref: self.project.r#ref.clone(),
            pod_name: self.pod_name.clone(),
            started_at_unix_ms: i64::try_from(started_ms).unwrap_or(i64::MAX),
            duration_ms: u32::try_from(took.as_millis()).unwrap_or(u32::MAX),
            dry_run_strategy: match self.project.dry_run_strategy() {
                DryRunStrategy::DryRunNone => "none",
                DryRunStrategy::DryRunClient => "client",
                DryRunStrategy::DryRunServer => "server",
            }
            .to_owned(),
            ..Default::default()
        }
    }

    /// Sends a report to the kas the stream uses; once, without retries.
    async fn send_report(&self, report: SyncReport, kas_index: &AtomicUsize) {
        static UNIMPLEMENTED_NOTED: AtomicBool = AtomicBool::new(false);
        let Some((address, channel)) = self.kas.kas.get(kas_index.load(Ordering::Relaxed)) else { return };
        let mut client = GitopsStatusClient::new(channel.clone());
        match tokio::time::timeout(REPORT_TIMEOUT, client.report_sync(self.kas.authorized(report))).await {
            Ok(Ok(_)) => {}
            Ok(Err(status)) if status.code() == Code::Unimplemented => {
                if !UNIMPLEMENTED_NOTED.swap(true, Ordering::Relaxed) {
                    tracing::debug!(kas = %address, "kas does not take GitOps sync reports (GitopsStatus.ReportSync unimplemented)");
                }
            }
            Ok(Err(status)) => {
                tracing::warn!(kas = %address, code = ?status.code(), error = %status.message(), "GitOps: reporting the sync to kas failed")
            }
            Err(_) => tracing::warn!(kas = %address, "GitOps: reporting the sync to kas timed out"),
        }
    }
}

/// The newest commit once it differs from `current` (None when the receiver is gone).
async fn newer(latest: &mut Latest, current: &str) -> Option<Arc<Commit>> {
    loop {
        if let Some(c) = latest.borrow_and_update().as_ref().filter(|c| c.id != current) {
            return Some(c.clone());
        }
        latest.changed().await.ok()?;
    }
}
