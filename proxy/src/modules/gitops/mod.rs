//! GitOps, kas's half (issue 16): agentk asks for the objects of one of its manifest projects
//! (`kas.gitops.v1.GitopsAgent/GetObjectsToSynchronize`, on the agent listener) and kas polls
//! the project, streaming the objects of every new commit ([`manifests`] reads them).
//!
//! So far: static agents whose manifest projects are repositories (a local path, or an
//! `http(s)://` URL on a branch, fetched through the configuration's mirrors, shared polls and
//! token bucket), polled every `agents.configuration_poll_period`. Not yet: GitLab mode
//! (`project_info`), push notifications, agentk's half.

pub mod manifests;

use std::sync::Arc;
use std::time::Duration;

use kas_proto::gitops::gitops_agent_server::{GitopsAgent, GitopsAgentServer};
use kas_proto::gitops::objects_to_synchronize_response::{Header, Message, Object, Trailer};
use kas_proto::gitops::{ObjectsToSynchronizeRequest, ObjectsToSynchronizeResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::agent::gitops::{ManifestProjectDocument, ManifestRef};
use crate::agent::{AgentIdentity, GitRepository, RepositoryLocation};
use crate::auth::agent_auth::AgentAuthenticator;
use crate::error::KasError;
use crate::modules::configuration::{AgentConfigurations, ConfigurationSource};
use manifests::{ManifestLimits, ManifestObject};

/// Object JSON per message at most (the gRPC message limit is larger).
const OBJECT_CHUNK: usize = 1024 * 1024;

/// The feature's registration (see [`crate::modules::Module`]).
pub struct Gitops;

impl super::Module for Gitops {
    fn name(&self) -> &'static str {
        "gitops"
    }

    fn grpc_services(&self, context: &super::ModuleContext, services: &mut super::GrpcServices) {
        let service = GitopsService {
            auth: context.agent_auth.clone(),
            configurations: context.configurations.clone(),
            git: context.git.clone(),
            poll_period: context.poll_period,
            gitlab_mode: context.gitlab_mode,
            shutdown: context.shutdown.clone(),
        };
        services.agent.add_service(GitopsAgentServer::new(service));
    }
}

#[derive(Clone)]
struct GitopsService {
    auth: Arc<AgentAuthenticator>,
    configurations: Arc<dyn ConfigurationSource>,
    git: Arc<AgentConfigurations>,
    poll_period: Duration,
    gitlab_mode: bool,
    shutdown: CancellationToken,
}

/// The ref of a manifest project as the request names it.
fn ref_name(r: &ManifestRef) -> String {
    match r {
        ManifestRef::DefaultBranch => String::new(),
        ManifestRef::Branch(b) => format!("branch:{b}"),
        ManifestRef::Tag(t) => format!("tag:{t}"),
        ManifestRef::Commit(c) => format!("commit:{c}"),
    }
}

/// What one poll found.
struct Commit {
    id: String,
    objects: Vec<ManifestObject>,
}

impl GitopsService {
    /// The agent's manifest project the request names, from its current configuration.
    async fn project(&self, agent: &AgentIdentity, id: &str, r: &str) -> Result<ManifestProjectDocument, KasError> {
        let document = self.configurations.document(agent).await?;
        let projects = document.gitops.map(|g| g.manifest_projects).unwrap_or_default();
        projects.into_iter().find(|p| p.id == id && ref_name(&p.manifest_ref()) == r).ok_or_else(|| {
            KasError::NotFound(format!(
                "agent {}'s configuration has no manifest project \"{id}\" with ref \"{r}\" (gitops.manifest_projects)",
                agent.agent_id
            ))
        })
    }

    /// The project's commit now, and its objects when it is not `last`.
    async fn poll(&self, project: &ManifestProjectDocument, last: &str) -> Result<Option<Commit>, KasError> {
        if self.gitlab_mode {
            return Err(KasError::InvalidAgentConfiguration(
                "manifest projects in GitLab mode need GitLab's project_info, which this kas does not use yet".into(),
            ));
        }
        let location = RepositoryLocation::parse(&project.id)
            .map_err(|e| KasError::InvalidAgentConfiguration(format!("manifest project \"{}\": {e}", project.id)))?;
        let manifest_ref = project.manifest_ref();
        let (dir, commit) = match (&location, &manifest_ref) {
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
                self.git.resolve(&GitRepository { location: location.clone(), branch }).await?
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

/// A user's mistake (fix the configuration or the manifests) ends the stream; anything else is
/// tried again at the next poll.
fn permanent(e: &KasError) -> bool {
    matches!(e.grpc_code(), tonic::Code::FailedPrecondition | tonic::Code::NotFound | tonic::Code::InvalidArgument)
}

#[tonic::async_trait]
impl GitopsAgent for GitopsService {
    type GetObjectsToSynchronizeStream = ReceiverStream<Result<ObjectsToSynchronizeResponse, Status>>;

    async fn get_objects_to_synchronize(
        &self,
        request: Request<ObjectsToSynchronizeRequest>,
    ) -> Result<Response<Self::GetObjectsToSynchronizeStream>, Status> {
        let agent = self.auth.authenticate(&request).await?;
        let request = request.into_inner();
        // Checked before the stream starts: a wrong project or ref is the caller's error.
        let mut project = Some(self.project(&agent, &request.project_id, &request.r#ref).await?);
        let service = self.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut last = request.commit_id.clone();
            loop {
                // The configuration is read again for every later poll (it may have changed).
                let project = match project.take() {
                    Some(project) => Ok(project),
                    None => service.project(&agent, &request.project_id, &request.r#ref).await,
                };
                let polled = match project {
                    Ok(project) => service.poll(&project, &last).await,
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
                // ±10 % jitter, as configuration polls.
                let jitter = service.poll_period.mul_f64(rand::random_range(0.9..1.1));
                tokio::select! {
                    () = tokio::time::sleep(jitter) => {}
                    () = tx.closed() => return,
                    // The stream ends cleanly; agentk asks another kas, from its last commit.
                    () = service.shutdown.cancelled() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
