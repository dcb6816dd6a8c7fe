//! GitOps, agentk's half (issue 16; kas's half is kas's `modules::gitops`): apply the manifests
//! of the agent configuration's manifest projects to the cluster and keep them applied.
//!
//! - **One applier per agent** ([`lease`]): every replica competes for the Lease
//!   `agentk-gitops-<agent id>` in its own namespace; only the holder runs the workers, and
//!   another replica takes over when the holder stops renewing. Election runs only while the
//!   configuration lists manifest projects.
//! - **One worker per manifest project** ([`worker`]), started and stopped as the agent
//!   configuration changes: it holds kas's `GetObjectsToSynchronize` stream (resumed from the
//!   last commit applied, reconnecting with backoff), applies each commit ([`apply`]), applies it
//!   again every `--gitops-reapply-period` (drift correction) or with backoff after a failure,
//!   cancels an apply in progress when a newer commit arrives, and reports every sync to kas
//!   (`GitopsStatus.ReportSync`).
//! - **What is applied and pruned** is recorded in an inventory ConfigMap per project
//!   ([`inventory`]); objects that are not in it are never touched, and objects agentk did not
//!   create are taken over only as `inventory_policy` allows.

pub mod apply;
pub mod discovery;
pub mod inventory;
pub mod lease;
pub mod objects;
pub mod worker;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use kas_proto::tunnel::pb::{ConfigurationResponse, ManifestProjectConfiguration};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use inventory::inventory_name;

use super::{ModuleContext, RunContext};
use crate::status::GitopsState;

/// Default of `--gitops-reapply-period`: drift is corrected within five minutes (the reference
/// applied on a similar period), at a cost of one GET and one no-op apply per object.
pub const DEFAULT_REAPPLY_PERIOD: Duration = Duration::from_secs(300);
/// Defaults of the Lease timings: client-go's leader election defaults.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_LEASE_RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const DEFAULT_LEASE_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The `--gitops-*` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GitopsSettings {
    pub reapply_period: Duration,
    pub lease_duration: Duration,
    pub lease_renew_deadline: Duration,
    pub lease_retry_period: Duration,
}

impl Default for GitopsSettings {
    fn default() -> Self {
        Self {
            reapply_period: DEFAULT_REAPPLY_PERIOD,
            lease_duration: DEFAULT_LEASE_DURATION,
            lease_renew_deadline: DEFAULT_LEASE_RENEW_DEADLINE,
            lease_retry_period: DEFAULT_LEASE_RETRY_PERIOD,
        }
    }
}

/// The Lease of an agent's GitOps leader.
pub fn lease_name(agent_id: i64) -> String {
    format!("agentk-gitops-{agent_id}")
}

/// The module: built with everything but kas's channels, which `run` gets.
pub struct Gitops {
    client: kube::Client,
    configuration: watch::Receiver<Option<ConfigurationResponse>>,
    settings: GitopsSettings,
    /// Where the Lease lives: the pod's namespace (else the kubeconfig's).
    namespace: String,
    /// The Lease holder's identity: the pod name (unique among replicas), else a random one.
    identity: String,
    pod_name: String,
    state: watch::Sender<GitopsState>,
}

impl Gitops {
    pub fn new(client: kube::Client, context: &ModuleContext) -> Self {
        let (namespace, identity) = (context.lease_namespace(), context.lease_identity());
        Self {
            client,
            configuration: context.configuration.subscribe(),
            settings: context.gitops,
            namespace,
            identity,
            pod_name: context.pod_name.to_owned(),
            state: context.gitops_state.clone(),
        }
    }
}

/// The leader election in progress (while the configuration lists manifest projects).
struct Election {
    agent_id: i64,
    leader: watch::Receiver<bool>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Election {
    async fn end(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// One manifest project's worker.
struct Running {
    project: ManifestProjectConfiguration,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

type ProjectKey = (String, String);

fn key(p: &ManifestProjectConfiguration) -> ProjectKey {
    (p.id.clone(), p.r#ref.clone())
}

/// What the configuration asks for: the agent id and its manifest projects.
fn wanted(configuration: &Option<ConfigurationResponse>) -> (i64, Vec<ManifestProjectConfiguration>) {
    let c = configuration.as_ref().and_then(|r| r.configuration.as_ref());
    let agent_id = c.map_or(0, |c| c.agent_id);
    let projects = c.and_then(|c| c.gitops.as_ref()).map(|g| g.manifest_projects.clone()).unwrap_or_default();
    (agent_id, projects)
}

/// Resolves when the election's leadership changes (never without an election).
async fn leadership_changed(election: &mut Option<Election>) {
    let Some(e) = election else { return std::future::pending().await };
    if e.leader.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn stop_workers(workers: &mut BTreeMap<ProjectKey, Running>, state: &watch::Sender<GitopsState>) {
    for (_, running) in std::mem::take(workers) {
        running.stop.cancel();
        let _ = running.task.await;
    }
    state.send_modify(|s| s.projects.clear());
}

#[async_trait]
impl super::Module for Gitops {
    async fn run(self: Arc<Self>, context: RunContext, shutdown: CancellationToken) {
        let mut configuration = self.configuration.clone();
        let mut election: Option<Election> = None;
        let mut workers: BTreeMap<ProjectKey, Running> = BTreeMap::new();
        let mut warned_agent_id = false;
        loop {
            let (agent_id, projects) = wanted(&configuration.borrow_and_update());
            if agent_id == 0 && !projects.is_empty() && !warned_agent_id {
                warned_agent_id = true;
                tracing::warn!("kas did not send the agent id: GitOps needs a newer kas; no manifests are applied");
            }
            let elect = agent_id != 0 && !projects.is_empty();
            if election.as_ref().is_some_and(|e| !elect || e.agent_id != agent_id) {
                stop_workers(&mut workers, &self.state).await;
                if let Some(e) = election.take() {
                    e.end().await;
                }
            }
            if elect && election.is_none() {
                election = Some(self.elect(agent_id));
            }
            let leader = election.as_ref().is_some_and(|e| *e.leader.borrow());
            self.state.send_modify(|s| s.leader = leader);
            if leader {
                self.reconcile_workers(&mut workers, &projects, agent_id, &context).await;
            } else if !workers.is_empty() {
                stop_workers(&mut workers, &self.state).await;
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                changed = configuration.changed() => if changed.is_err() { break },
                () = leadership_changed(&mut election) => {}
            }
        }
        // Workers first: nothing is applied once the Lease is released.
        stop_workers(&mut workers, &self.state).await;
        if let Some(e) = election.take() {
            e.end().await;
        }
        self.state.send_modify(|s| s.leader = false);
    }
}

impl Gitops {
    fn elect(&self, agent_id: i64) -> Election {
        let (tx, leader) = watch::channel(false);
        let stop = CancellationToken::new();
        let election = lease::Elector {
            api: kube::Api::<Lease>::namespaced(self.client.clone(), &self.namespace),
            name: lease_name(agent_id),
            identity: self.identity.clone(),
            settings: self.settings,
            report: crate::metrics::gitops_leader,
        };
        tracing::info!(lease = %election.name, namespace = %self.namespace, identity = %self.identity, "competing for the GitOps lease");
        let task = tokio::spawn(election.run(tx, stop.clone()));
        Election { agent_id, leader, stop, task }
    }

    /// Starts workers for new projects, stops those of removed ones, restarts changed ones.
    async fn reconcile_workers(
        &self,
        workers: &mut BTreeMap<ProjectKey, Running>,
        projects: &[ManifestProjectConfiguration],
        agent_id: i64,
        context: &RunContext,
    ) {
        let wanted: BTreeMap<ProjectKey, &ManifestProjectConfiguration> =
            projects.iter().map(|p| (key(p), p)).collect();
        let stale: Vec<ProjectKey> = workers
            .iter()
            .filter(|(k, r)| wanted.get(*k).is_none_or(|p| **p != r.project))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if let Some(running) = workers.remove(&k) {
                tracing::info!(project = %k.0, r#ref = %k.1, "stopping the GitOps worker");
                running.stop.cancel();
                let _ = running.task.await;
                self.state.send_modify(|s| {
                    s.projects.remove(&k);
                });
            }
        }
        for (k, project) in wanted {
            if workers.contains_key(&k) {
                continue;
            }
            tracing::info!(project = %k.0, r#ref = %k.1, "starting the GitOps worker");
            let stop = CancellationToken::new();
            let worker = worker::Worker {
                project: project.clone(),
                agent_id,
                syncer: apply::Syncer::new(self.client.clone(), agent_id),
                kas: context.clone(),
                pod_name: self.pod_name.clone(),
                reapply_period: self.settings.reapply_period,
                state: self.state.clone(),
            };
            self.state.send_modify(|s| {
                s.projects.insert(k.clone(), Default::default());
            });
            let task = tokio::spawn(worker.run(stop.clone()));
            workers.insert(k, Running { project: project.clone(), stop, task });
        }
    }
}
