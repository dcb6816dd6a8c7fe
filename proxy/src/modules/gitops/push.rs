//! Push notifications: GitLab tells kas that a project was pushed to (`KasApi.GitPushEvent`, or
//! `POST /api/v1/git_push_events`), as it tells the reference kas (`Notifications.GitPushEvent`).
//! kas publishes the event through the registry (Redis pub/sub: every kas; memory: this process),
//! and every GitOps stream polling that project polls at once (see `objects::next_push`), so a
//! push reaches agentk in about a second instead of a poll period. Polling stays as the safety
//! net for lost events.
//!
//! A stream matches a push by the project's full path as its manifest project id is written
//! (static agents: the repository path or URL), or in GitLab mode by GitLab's numeric project id.

use kas_proto::kas::git_push_event::Project;

use super::state::GitopsState;
use crate::error::KasError;

/// Longest full path accepted (GitLab's paths are far shorter; URLs of static repositories too).
pub const MAX_FULL_PATH_BYTES: usize = 1024;

/// Checks a pushed project (INVALID_ARGUMENT naming the field otherwise).
pub fn validate(project: Option<&Project>) -> Result<&Project, KasError> {
    let project = project.ok_or_else(|| KasError::InvalidArgument("GitPushEvent.project is required".into()))?;
    if project.id < 0 {
        return Err(KasError::InvalidArgument(format!(
            "GitPushEvent.project.id must be a positive integer, or 0 when unknown (got {})",
            project.id
        )));
    }
    if project.full_path.is_empty() {
        return Err(KasError::InvalidArgument("GitPushEvent.project.full_path is required".into()));
    }
    if project.full_path.len() > MAX_FULL_PATH_BYTES {
        return Err(KasError::InvalidArgument(format!(
            "GitPushEvent.project.full_path has {} bytes, more than the limit of {MAX_FULL_PATH_BYTES}",
            project.full_path.len()
        )));
    }
    Ok(project)
}

/// Publishes a push to every kas.
pub async fn publish(state: &GitopsState, project: Option<&Project>) -> Result<(), KasError> {
    let project = validate(project)?.clone();
    let full_path = project.full_path.clone();
    let published = state.registry.publish_git_push(project).await;
    super::metrics::push_event(published.is_ok());
    published?;
    tracing::debug!(project = %full_path, "git push event published");
    Ok(())
}
