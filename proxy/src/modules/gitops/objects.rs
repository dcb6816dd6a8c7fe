//! `GitopsAgent.GetObjectsToSynchronize`: one stream per manifest project an agentk replica
//! applies. Each stream re-reads the agent's document, locates the project
//! ([`super::repository`]), resolves its ref (local repositories: `manifests::resolve_ref`;
//! remote ones on a branch through `AgentConfigurations::resolve_since`, so mirrors, shared polls
//! and the token bucket are the configuration's) every `gitops.poll_period` (all streams of a
//! project at the same instants: [`until_next_poll`]), and at once when a push to the project
//! arrives (from any kas, through the registry). On a new commit it sends a header, the objects
//! as JSON in ≤ 1 MiB pieces, and a trailer.

use std::sync::Arc;

use kas_proto::gitops::gitops_agent_server::GitopsAgent;
use kas_proto::gitops::objects_to_synchronize_response::{Header, Message, Object, Trailer};
use kas_proto::gitops::{ObjectsToSynchronizeRequest, ObjectsToSynchronizeResponse};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::manifests::{self, ManifestLimits, ManifestObject};
use super::repository::Located;
use super::state::GitopsState;
use crate::agent::gitops::{ManifestProjectDocument, ManifestRef};
use crate::agent::{AgentIdentity, GitRepository, RepositoryLocation};
use crate::auth::agent_auth::AgentAuthenticator;
use crate::error::KasError;
use crate::registry::{GitPush, next_git_push};

/// Object JSON per message at most (the gRPC message limit is larger).
const OBJECT_CHUNK: usize = 1024 * 1024;

#[derive(Clone)]
pub struct ObjectsService {
    pub auth: Arc<AgentAuthenticator>,
    pub state: Arc<GitopsState>,
}

/// The agent's manifest project `id` at ref `r`, from its current configuration (NOT_FOUND when
/// the configuration does not list it).
pub async fn configured_project(
    state: &GitopsState,
    agent: &AgentIdentity,
    id: &str,
    r: &str,
) -> Result<ManifestProjectDocument, KasError> {
    let document = state.configurations.document(agent).await?;
    let projects = document.gitops.map(|g| g.manifest_projects).unwrap_or_default();
    projects.into_iter().find(|p| p.id == id && p.manifest_ref().wire_name() == r).ok_or_else(|| {
        KasError::NotFound(format!(
            "agent {}'s configuration has no manifest project \"{id}\" with ref \"{r}\" (gitops.manifest_projects)",
            agent.agent_id
        ))
    })
}

/// What one poll found.
struct Commit {
    id: String,
    objects: Vec<ManifestObject>,
}

/// Which pushes concern a stream: its project as configured, and (GitLab mode) GitLab's id of it.
#[derive(Debug)]
struct PushMatch {
    full_path: String,
    gitlab_project_id: Option<i64>,
}

impl PushMatch {
    fn matches(&self, push: &GitPush) -> bool {
        push.project.full_path == self.full_path
            || (push.project.id > 0 && self.gitlab_project_id == Some(push.project.id))
    }
}

impl ObjectsService {
    /// The project's commit now, and its objects when it is not `last`. `since`: a push arrived
    /// then, so a shared read begun earlier does not answer.
    async fn poll(
        &self,
        project: &ManifestProjectDocument,
        located: &Located,
        last: &str,
        since: Option<Instant>,
    ) -> Result<Option<Commit>, KasError> {
        let manifest_ref = match project.manifest_ref() {
            ManifestRef::DefaultBranch => match &located.default_branch {
                Some(branch) => ManifestRef::Branch(branch.clone()),
                None => ManifestRef::DefaultBranch,
            },
            r => r,
        };
        let (dir, commit) = match (&located.location, &manifest_ref) {
            (RepositoryLocation::Local(path), r) => {
                let (dir, r) = (path.clone(), r.clone());
                let commit = blocking(move || manifests::resolve_ref(&dir, &r)).await?;
                (path.clone(), commit)
            }
            (RepositoryLocation::Remote(_), ManifestRef::DefaultBranch | ManifestRef::Branch(_)) => {
                let branch = match &manifest_ref {
                    ManifestRef::Branch(b) => Some(b.clone()),
                    _ => None,
                };
                self.state
                    .git
                    .resolve_since(&GitRepository { location: located.location.clone(), branch }, since)
                    .await?
            }
            (RepositoryLocation::Remote(_), _) => {
                return Err(KasError::InvalidAgentConfiguration(format!(
                    "manifest project \"{}\": tags and commits of remote repositories are not supported yet; use a branch",
                    project.id
                )));
            }
        };
        if commit == last {
            return Ok(None);
        }
        let (project, id) = (project.clone(), commit.clone());
        let objects = blocking(move || {
            let files = manifests::collect(&dir, &id, &project, ManifestLimits::DEFAULT)?;
            manifests::objects(&files, &project, &id)
        })
        .await?;
        Ok(Some(Commit { id: commit, objects }))
    }
}

/// Runs blocking Git work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, KasError> + Send + 'static) -> Result<T, KasError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| KasError::Internal(format!("reading manifests: {e}")))?
}

/// The messages of one commit: header, objects (in chunks), trailer.
fn messages(project_id: &str, commit: &Commit) -> Vec<ObjectsToSynchronizeResponse> {
    let message = |m| ObjectsToSynchronizeResponse { message: Some(m) };
    let mut out =
        vec![message(Message::Header(Header { commit_id: commit.id.clone(), project_id: project_id.to_owned() }))];
    for object in &commit.objects {
        let json = serde_json::to_vec(&object.object).unwrap_or_default();
        let mut chunks = json.chunks(OBJECT_CHUNK).peekable();
        while let Some(chunk) = chunks.next() {
            out.push(message(Message::Object(Object {
                source: object.path.clone(),
                data: bytes::Bytes::copy_from_slice(chunk),
                more: chunks.peek().is_some(),
            })));
        }
    }
    out.push(message(Message::Trailer(Trailer {})));
    out
}

/// A user's mistake (fix the configuration or the manifests) or a refusal (GitLab: the agent may
/// not read the project, or its token is no longer valid) ends the stream; anything else is
/// tried again at the next poll.
fn permanent(e: &KasError) -> bool {
    matches!(
        e.grpc_code(),
        tonic::Code::FailedPrecondition
            | tonic::Code::NotFound
            | tonic::Code::InvalidArgument
            | tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
    )
}

#[tonic::async_trait]
impl GitopsAgent for ObjectsService {
    type GetObjectsToSynchronizeStream = ReceiverStream<Result<ObjectsToSynchronizeResponse, Status>>;

    async fn get_objects_to_synchronize(
        &self,
        request: Request<ObjectsToSynchronizeRequest>,
    ) -> Result<Response<Self::GetObjectsToSynchronizeStream>, Status> {
        let agent = self.auth.authenticate(&request).await?;
        // GitLab mode asks GitLab about manifest projects with the agent's own token.
        let authorization = request.metadata().get(kas_proto::metadata::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let token = kas_proto::metadata::bearer_token(authorization).unwrap_or_default().to_owned();
        let request = request.into_inner();
        // Checked before the stream starts: a wrong project or ref is the caller's error.
        let mut project = Some(configured_project(&self.state, &agent, &request.project_id, &request.r#ref).await?);
        let service = self.clone();
        // Subscribed before the first poll: a push during it is not lost.
        let mut pushes = self.state.registry.subscribe_git_pushes();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut last = request.commit_id.clone();
            let mut matching = PushMatch { full_path: request.project_id.clone(), gitlab_project_id: None };
            let mut since = None;
            // Every stream of this project and ref polls at the same instants, so their polls share one
            // read however many agents apply it.
            let schedule = format!("{}\n{}", request.project_id, request.r#ref);
            loop {
                // The configuration is read again for every later poll (it may have changed).
                let project = match project.take() {
                    Some(project) => Ok(project),
                    None => configured_project(&service.state, &agent, &request.project_id, &request.r#ref).await,
                };
                let polled = match project {
                    Ok(project) => match service.state.repositories.locate(&token, &project.id).await {
                        Ok(located) => {
                            matching.gitlab_project_id = located.gitlab_project_id;
                            service.poll(&project, &located, &last, since).await
                        }
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                match polled {
                    Ok(Some(commit)) => {
                        for message in messages(&request.project_id, &commit) {
                            if tx.send(Ok(message)).await.is_err() {
                                return;
                            }
                        }
                        last = commit.id;
                    }
                    Ok(None) => {}
                    Err(e) if permanent(&e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(agent_id = %agent.agent_id, project = %request.project_id, error = %e, "manifest project poll failed")
                    }
                }
                let wait = until_next_poll(&schedule, service.state.config.poll_period, std::time::SystemTime::now());
                since = tokio::select! {
                    () = tokio::time::sleep(wait) => None,
                    pushed = next_git_push(&mut pushes, |push| matching.matches(push)) => {
                        super::metrics::push_poll();
                        tracing::debug!(agent_id = %agent.agent_id, project = %request.project_id, "manifest project pushed to; polling");
                        Some(pushed)
                    }
                    () = tx.closed() => return,
                    // The stream ends cleanly; agentk asks another kas, from its last commit.
                    () = service.state.shutdown.cancelled() => return,
                };
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// How long until the next scheduled poll of a project: a project's polls fall at the instants
/// `phase + k * period` of the wall clock, its phase taken from a hash of `schedule` (its id and
/// ref). So the streams of every agent applying one project poll together and share one read
/// (`AgentConfigurations`), on every kas replica, while different projects are spread over the
/// period as random jitter would spread them.
fn until_next_poll(schedule: &str, period: std::time::Duration, now: std::time::SystemTime) -> std::time::Duration {
    use sha2::Digest as _;
    let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
    let digest = sha2::Sha256::digest(schedule.as_bytes());
    let phase = u64::from_be_bytes(digest[..8].try_into().unwrap_or_default()) % period_ms;
    let now_ms = u64::try_from(now.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(0);
    let into_period = (now_ms % period_ms + period_ms - phase) % period_ms;
    std::time::Duration::from_millis(period_ms - into_period)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::until_next_poll;

    /// Streams of one project poll at the same instants wherever they started; the wait is never
    /// longer than a period; another project gets another phase.
    #[test]
    fn polls_of_one_project_fall_on_the_same_instants() {
        let period = Duration::from_secs(300);
        let next = |schedule: &str, at_ms: u64| {
            let now = UNIX_EPOCH + Duration::from_millis(at_ms);
            let wait = until_next_poll(schedule, period, now);
            assert!(wait > Duration::ZERO && wait <= period, "{wait:?}");
            (now + wait).duration_since(UNIX_EPOCH).unwrap().as_millis()
        };
        let start = 1_795_000_000_000;
        let a = next("group/manifests\nbranch:main", start);
        for offset in [1, 17_000, 123_456, 299_999] {
            assert_eq!(next("group/manifests\nbranch:main", start + offset).abs_diff(a) % 300_000, 0);
        }
        assert_eq!(next("group/manifests\nbranch:main", start + 1), a, "same period, same instant");
        let phases: std::collections::HashSet<u128> =
            (0..20).map(|i| next(&format!("group/project-{i}\n"), start) % 300_000).collect();
        assert!(phases.len() > 15, "projects are spread over the period: {phases:?}");
    }
}
