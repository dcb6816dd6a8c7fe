//! Real-time cluster state, agentk's half (issue 17; kas's half is kas's
//! `modules::cluster_state`): informers on the resources the configuration's
//! `cluster_state.resources` names, and their compact views pushed to kas.
//!
//! - **One pusher per agent**: replicas compete for the Lease `agentk-cluster-state-<agent id>`
//!   (the GitOps Lease's election and timings, see `gitops::lease`); only the holder runs
//!   informers and pushes, so the API server is watched once per agent and kas hears one voice.
//! - **One informer per resource** ([`informer`]: list, watch, relist on 410 Gone, backoff),
//!   started and stopped as the configuration changes, without restarting agentk.
//! - **The pusher** ([`pusher`]) owns the view cache ([`view`]: identity, labels, a status
//!   projection) and keeps kas's copy equal to it, coalescing changes while kas reads slowly.

pub mod informer;
pub mod pusher;
pub mod view;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use kas_proto::cluster_state::ResourceKey;
use kas_proto::tunnel::pb::{ConfigurationResponse, ObservedResource};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::gitops::{GitopsSettings, lease};
use super::{ModuleContext, RunContext};

/// Observations queued towards the pusher (it takes them at once; this only smooths bursts).
const OBSERVATION_QUEUE: usize = 1024;

/// The Lease of an agent's cluster state pusher.
pub fn lease_name(agent_id: i64) -> String {
    format!("agentk-cluster-state-{agent_id}")
}

pub struct ClusterState {
    client: kube::Client,
    configuration: watch::Receiver<Option<ConfigurationResponse>>,
    settings: GitopsSettings,
    namespace: String,
    identity: String,
}

impl ClusterState {
    pub fn new(client: kube::Client, context: &ModuleContext) -> Self {
        let (namespace, identity) = (context.lease_namespace(), context.lease_identity());
        Self { client, configuration: context.configuration.subscribe(), settings: context.gitops, namespace, identity }
    }
}

/// What the configuration asks for: the agent id and the resources to observe.
fn wanted(configuration: &Option<ConfigurationResponse>) -> (i64, Vec<ObservedResource>) {
    let c = configuration.as_ref().and_then(|r| r.configuration.as_ref());
    let agent_id = c.map_or(0, |c| c.agent_id);
    let resources = c.and_then(|c| c.cluster_state.as_ref()).map(|s| s.resources.clone()).unwrap_or_default();
    (agent_id, resources)
}

/// A running task and how to stop it.
struct Task {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Task {
    fn spawn<F: Future<Output = ()> + Send + 'static>(run: impl FnOnce(CancellationToken) -> F) -> Self {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(run(stop.clone()));
        Self { stop, handle }
    }

    async fn end(self) {
        self.stop.cancel();
        let _ = self.handle.await;
    }
}

/// How long a replica that stops observing (the configuration dropped `cluster_state`, or it
/// lost the Lease) waits for kas to be told the resources are gone.
const RETIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// What runs while this replica leads: the pusher and one informer per resource.
struct Leading {
    pusher: Task,
    /// The pusher's (resources observed, all told to kas).
    told: watch::Receiver<(usize, bool)>,
    observed: watch::Sender<Vec<ResourceKey>>,
    to_pusher: mpsc::Sender<informer::Observation>,
    informers: BTreeMap<(String, String), (ObservedResource, Task)>,
}

impl Leading {
    fn start(kas: &RunContext) -> Self {
        let (observed, observed_rx) = watch::channel(Vec::new());
        let (to_pusher, observations) = mpsc::channel(OBSERVATION_QUEUE);
        let (told_tx, told) = watch::channel((0, true));
        let kas = kas.clone();
        let pusher = Task::spawn(move |stop| pusher::run(kas, observed_rx, observations, told_tx, stop));
        Self { pusher, told, observed, to_pusher, informers: BTreeMap::new() }
    }

    /// Informers for new resources, none for removed ones, new ones for changed ones.
    async fn reconcile(&mut self, client: &kube::Client, resources: &[ObservedResource]) {
        let wanted: BTreeMap<(String, String), &ObservedResource> =
            resources.iter().map(|r| ((r.group.clone(), r.resource.clone()), r)).collect();
        let stale: Vec<(String, String)> = self
            .informers
            .iter()
            .filter(|(k, (r, _))| wanted.get(*k).is_none_or(|w| **w != *r))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if let Some((r, task)) = self.informers.remove(&k) {
                tracing::info!(group = %r.group, resource = %r.resource, "stopping the informer");
                task.end().await;
            }
        }
        // The pusher forgets removed resources before new informers report.
        self.observed.send_replace(resources.iter().map(informer::key).collect());
        for (k, r) in wanted {
            if self.informers.contains_key(&k) {
                continue;
            }
            tracing::info!(group = %r.group, version = %r.version, resource = %r.resource, namespaces = ?r.namespaces, "starting the informer");
            let (client, resource, to_pusher) = (client.clone(), r.clone(), self.to_pusher.clone());
            let task = Task::spawn(move |stop| informer::run(client, resource, to_pusher, stop));
            self.informers.insert(k, (r.clone(), task));
        }
    }

    /// Stops the informers and the pusher. With `retire` (the configuration no longer names any
    /// resource) kas is told first (within [`RETIRE_TIMEOUT`]) that nothing is observed any more,
    /// so it does not keep the last views as if they were only stale; on shutdown or a lost Lease
    /// the views stay, stale, until agentk (or the new leader) pushes again.
    async fn end(mut self, retire: bool) {
        for (_, (_, task)) in std::mem::take(&mut self.informers) {
            task.end().await;
        }
        if !retire {
            self.pusher.end().await;
            return;
        }
        self.observed.send_replace(Vec::new());
        let told = self.told.wait_for(|(resources, idle)| *resources == 0 && *idle);
        if tokio::time::timeout(RETIRE_TIMEOUT, told).await.is_err() {
            tracing::debug!("kas was not told in time that no resource is observed any more");
        }
        self.pusher.end().await;
    }
}

/// The leader election in progress (while the configuration names resources).
struct Election {
    agent_id: i64,
    leader: watch::Receiver<bool>,
    task: Task,
}

async fn leadership_changed(election: &mut Option<Election>) {
    let Some(e) = election else { return std::future::pending().await };
    if e.leader.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[async_trait]
impl super::Module for ClusterState {
    async fn run(self: Arc<Self>, context: RunContext, shutdown: CancellationToken) {
        let mut configuration = self.configuration.clone();
        let mut election: Option<Election> = None;
        let mut leading: Option<Leading> = None;
        loop {
            let (agent_id, resources) = wanted(&configuration.borrow_and_update());
            let elect = agent_id != 0 && !resources.is_empty();
            if election.as_ref().is_some_and(|e| !elect || e.agent_id != agent_id) {
                let retire = election.as_ref().is_some_and(|e| e.agent_id == agent_id);
                if let Some(l) = leading.take() {
                    l.end(retire).await;
                }
                if let Some(e) = election.take() {
                    e.task.end().await;
                }
            }
            if elect && election.is_none() {
                election = Some(self.elect(agent_id));
            }
            let leader = election.as_ref().is_some_and(|e| *e.leader.borrow());
            if leader {
                let l = leading.get_or_insert_with(|| Leading::start(&context));
                l.reconcile(&self.client, &resources).await;
            } else if let Some(l) = leading.take() {
                l.end(false).await;
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                changed = configuration.changed() => if changed.is_err() { break },
                () = leadership_changed(&mut election) => {}
            }
        }
        if let Some(l) = leading.take() {
            l.end(false).await;
        }
        if let Some(e) = election.take() {
            e.task.end().await;
        }
    }
}

impl ClusterState {
    fn elect(&self, agent_id: i64) -> Election {
        let (tx, leader) = watch::channel(false);
        let elector = lease::Elector {
            api: kube::Api::<Lease>::namespaced(self.client.clone(), &self.namespace),
            name: lease_name(agent_id),
            identity: self.identity.clone(),
            settings: self.settings,
            report: crate::metrics::cluster_state_leader,
        };
        tracing::info!(lease = %elector.name, namespace = %self.namespace, identity = %self.identity, "competing for the cluster state lease");
        let task = Task::spawn(move |stop| elector.run(tx, stop));
        Election { agent_id, leader, task }
    }
}
