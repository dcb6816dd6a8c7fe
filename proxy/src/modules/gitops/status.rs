//! The status of an agent's GitOps syncs: agentk reports each sync
//! (`GitopsStatus.ReportSync`, agent token, on the agent listener); kas checks the report,
//! keeps the last one per manifest project and ref in the registry (every kas reads it) for
//! `gitops.status_ttl` after the agent's last report, and answers callers per manifest project of
//! the agent's configuration (`KasApi.GetGitopsStatus`, `GET /api/v1/agents/{agent_id}/gitops`).
//!
//! Which manifest projects: for agents of the static agents file, those of the agent's current
//! configuration. In GitLab mode kas can read an agent's configuration only with the agent's own
//! token, so the list is the one kas read when the agent's last report arrived.

use std::sync::Arc;

use kas_proto::AgentId;
use kas_proto::gitops::gitops_status_server::GitopsStatus;
use kas_proto::gitops::{ReportSyncResponse, SyncReport};
use kas_proto::kas::get_gitops_status_response::ProjectsSource;
use kas_proto::kas::{GetGitopsStatusResponse, GitopsSync, ManifestProjectStatus};
use tonic::{Request, Response, Status};

use super::state::GitopsState;
use crate::agent::AgentConfigDocument;
use crate::auth::agent_auth::AgentAuthenticator;
use crate::error::KasError;
use crate::registry::ManifestProjectKey;

/// A report message larger than this is refused by the server (reports are small: 100 errors of
/// a few KiB at most).
pub const MAX_REPORT_BYTES: usize = 1024 * 1024;
/// Per-object errors a report may carry (`failed` counts them all).
pub const MAX_OBJECT_ERRORS: usize = 100;
/// Kubernetes names (DNS subdomains) and the other identifying fields of an object.
const MAX_NAME_BYTES: usize = 253;
/// A manifest file path.
const MAX_SOURCE_BYTES: usize = 4096;
/// An error message (per object, or the sync's).
const MAX_MESSAGE_BYTES: usize = 4096;

pub struct StatusService {
    pub auth: Arc<AgentAuthenticator>,
    pub state: Arc<GitopsState>,
}

/// The manifest projects (and refs) of a configuration, in its order.
fn configured(document: &AgentConfigDocument) -> Vec<ManifestProjectKey> {
    document
        .gitops
        .iter()
        .flat_map(|g| &g.manifest_projects)
        .map(|p| ManifestProjectKey { project_id: p.id.clone(), git_ref: p.manifest_ref().wire_name() })
        .collect()
}

/// Checks what a report may hold (INVALID_ARGUMENT naming the field otherwise).
pub fn validate(report: &SyncReport) -> Result<(), KasError> {
    let invalid = |m: String| Err(KasError::InvalidArgument(format!("SyncReport.{m}")));
    let commit = &report.commit_id;
    if !commit.is_empty() && (!matches!(commit.len(), 40 | 64) || !commit.bytes().all(|b| b.is_ascii_hexdigit())) {
        return invalid(format!("commit_id \"{}\" is not a commit id (40 or 64 hex digits)", commit.escape_debug()));
    }
    if !matches!(report.dry_run_strategy.as_str(), "none" | "client" | "server") {
        return invalid(format!(
            "dry_run_strategy \"{}\" is not one of none, client, server",
            report.dry_run_strategy.escape_debug()
        ));
    }
    if report.started_at_unix_ms < 0 {
        return invalid("started_at_unix_ms must not be negative".into());
    }
    if report.errors.len() > MAX_OBJECT_ERRORS {
        return invalid(format!(
            "errors has {} entries, more than the limit of {MAX_OBJECT_ERRORS}",
            report.errors.len()
        ));
    }
    if (report.failed as usize) < report.errors.len() {
        return invalid(format!(
            "failed ({}) is less than the number of errors ({})",
            report.failed,
            report.errors.len()
        ));
    }
    let bounded = |field: &str, value: &str, max: usize| {
        if value.len() > max {
            invalid(format!("{field} has {} bytes, more than the limit of {max}", value.len()))
        } else {
            Ok(())
        }
    };
    bounded("pod_name", &report.pod_name, MAX_NAME_BYTES)?;
    bounded("error", &report.error, MAX_MESSAGE_BYTES)?;
    for (i, e) in report.errors.iter().enumerate() {
        for (field, value) in [
            ("group", &e.group),
            ("version", &e.version),
            ("kind", &e.kind),
            ("namespace", &e.namespace),
            ("name", &e.name),
        ] {
            bounded(&format!("errors[{i}].{field}"), value, MAX_NAME_BYTES)?;
        }
        bounded(&format!("errors[{i}].source"), &e.source, MAX_SOURCE_BYTES)?;
        bounded(&format!("errors[{i}].message"), &e.message, MAX_MESSAGE_BYTES)?;
        if !matches!(e.operation.as_str(), "apply" | "prune") {
            return invalid(format!("errors[{i}].operation \"{}\" is not apply or prune", e.operation.escape_debug()));
        }
    }
    Ok(())
}

impl StatusService {
    async fn report(&self, request: Request<SyncReport>) -> Result<(), Status> {
        let agent = self.auth.authenticate(&request).await?;
        let report = request.into_inner();
        validate(&report)?;
        let document = self.state.configurations.document(&agent).await?;
        let configured = configured(&document);
        let key = ManifestProjectKey::of(&report);
        if !configured.contains(&key) {
            return Err(KasError::NotFound(format!(
                "agent {}'s configuration has no manifest project \"{}\" with ref \"{}\" (gitops.manifest_projects)",
                agent.agent_id, key.project_id, key.git_ref
            ))
            .into());
        }
        let sync = GitopsSync {
            report: Some(report),
            received_at: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
            kas_instance_id: self.state.registry.instance().instance_id.clone(),
        };
        self.state
            .registry
            .put_gitops_sync(agent.agent_id, sync, &configured, self.state.config.status_ttl)
            .await
            .map_err(|e| {
                super::metrics::sync_report("failed");
                KasError::from(e)
            })?;
        super::metrics::sync_report("stored");
        Ok(())
    }
}

#[tonic::async_trait]
impl GitopsStatus for StatusService {
    async fn report_sync(&self, request: Request<SyncReport>) -> Result<Response<ReportSyncResponse>, Status> {
        match self.report(request).await {
            Ok(()) => Ok(Response::new(ReportSyncResponse {})),
            Err(e) => {
                if matches!(e.code(), tonic::Code::InvalidArgument | tonic::Code::NotFound) {
                    super::metrics::sync_report("refused");
                }
                Err(e)
            }
        }
    }
}

/// The last sync of each manifest project of the agent (see the module docs for which).
pub async fn status(state: &GitopsState, agent_id: AgentId) -> Result<GetGitopsStatusResponse, KasError> {
    let record = state.registry.gitops_status(agent_id).await?;
    let mut projects_from = ProjectsSource::LastReport;
    let mut projects = record.configured.clone();
    if let Some(agents) = &state.static_agents {
        let agent = agents.identity(agent_id).ok_or_else(|| {
            KasError::NotFound(format!("agent {agent_id} is not in kas's static agents file (agents.static_file)"))
        })?;
        match state.configurations.document(agent).await {
            Ok(document) => {
                projects = configured(&document);
                projects_from = ProjectsSource::Configuration;
            }
            // The configuration cannot be read now (Git unreachable, a broken file): answer with
            // the list as of the last report, and say so.
            Err(e) => tracing::warn!(%agent_id, error = %e, "GitOps status: reading the agent configuration failed"),
        }
    }
    let manifest_projects = projects
        .into_iter()
        .map(|key| ManifestProjectStatus {
            last_sync: record.sync(&key).cloned(),
            project_id: key.project_id,
            r#ref: key.git_ref,
        })
        .collect();
    Ok(GetGitopsStatusResponse { manifest_projects, projects_from: projects_from as i32 })
}

#[cfg(test)]
mod tests {
    use kas_proto::gitops::ObjectError;

    use super::*;

    fn report() -> SyncReport {
        SyncReport {
            project_id: "group/manifests".into(),
            commit_id: "0123456789abcdef0123456789abcdef01234567".into(),
            dry_run_strategy: "none".into(),
            failed: 1,
            errors: vec![ObjectError {
                kind: "ConfigMap".into(),
                name: "x".into(),
                operation: "apply".into(),
                message: "admission webhook denied".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn reports_are_bounded_and_mistakes_name_the_field() {
        validate(&report()).unwrap();
        type Edit = Box<dyn Fn(&mut SyncReport)>;
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|r| r.commit_id = "abc".into()), "SyncReport.commit_id \"abc\" is not a commit id"),
            (Box::new(|r| r.dry_run_strategy = "maybe".into()), "dry_run_strategy \"maybe\""),
            (Box::new(|r| r.dry_run_strategy = String::new()), "dry_run_strategy \"\""),
            (Box::new(|r| r.started_at_unix_ms = -1), "started_at_unix_ms must not be negative"),
            (
                Box::new(|r| {
                    r.errors = vec![r.errors[0].clone(); MAX_OBJECT_ERRORS + 1];
                    r.failed = 1000;
                }),
                "errors has 101 entries, more than the limit of 100",
            ),
            (Box::new(|r| r.failed = 0), "failed (0) is less than the number of errors (1)"),
            (Box::new(|r| r.pod_name = "p".repeat(254)), "pod_name has 254 bytes, more than the limit of 253"),
            (Box::new(|r| r.error = "e".repeat(5000)), "SyncReport.error has 5000 bytes"),
            (Box::new(|r| r.errors[0].name = "n".repeat(300)), "errors[0].name has 300 bytes"),
            (Box::new(|r| r.errors[0].message = "m".repeat(5000)), "errors[0].message has 5000 bytes"),
            (Box::new(|r| r.errors[0].operation = "delete".into()), "errors[0].operation \"delete\""),
        ];
        for (edit, expected) in cases {
            let mut r = report();
            edit(&mut r);
            let e = validate(&r).unwrap_err();
            assert_eq!(e.grpc_code(), tonic::Code::InvalidArgument);
            assert!(e.to_string().contains(expected), "{e} lacks {expected}");
        }
        // A sync that failed before resolving a commit has none; SHA-256 repositories have 64.
        let mut r = report();
        r.commit_id = String::new();
        validate(&r).unwrap();
        r.commit_id = "a".repeat(64);
        validate(&r).unwrap();
    }
}
