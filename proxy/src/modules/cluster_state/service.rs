//! Callers' reads of an agent's cluster state, from any kas: summaries, object views, and a watch
//! (the state, then every change). The same gRPC service serves the api listener (routed: the
//! registry says which kas holds the state) and the internal listener (local state only); the
//! REST gateway uses the same functions.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kas_proto::AgentId;
use kas_proto::cluster_state::cluster_state_server::ClusterState;
use kas_proto::cluster_state::{
    ClusterStateSummary, Event, Freshness, GetClusterStateRequest, ListObjectsRequest, ObjectList, WatchRequest, event,
};
use tokio::sync::{broadcast, mpsc};
use tonic::{Request, Response, Status};

use super::hub::{ClusterStateHub, Location, Scope, from_peer};
use super::store::{AgentState, unix_ms};
use crate::error::KasError;

pub struct ClusterStateService {
    pub hub: Arc<ClusterStateHub>,
    pub scope: Scope,
}

/// Events queued towards one subscriber: the watch task waits when the subscriber does not
/// read, and falls behind on the state's broadcast instead (then it sends a fresh snapshot).
const SUBSCRIBER_QUEUE: usize = 16;
/// While the state is not live, how often a watch asks the registry whether another kas holds a
/// newer one (agentk reconnected elsewhere); and how long it waits before looking again for a
/// state that is nowhere.
const RELOCATE_PERIOD: Duration = Duration::from_secs(1);

/// `pods`, or `deployments.apps`: the resource as kubectl names it.
fn check_resource(resource: &str) -> Result<(), KasError> {
    let valid = !resource.is_empty()
        && resource.len() <= 253
        && resource.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if valid {
        Ok(())
    } else {
        Err(KasError::InvalidArgument(format!(
            "resource \"{}\" is not a resource name such as pods or deployments.apps",
            resource.escape_debug()
        )))
    }
}

fn check_namespace(namespace: &str) -> Result<(), KasError> {
    if namespace.is_empty() || crate::agent::access::check_namespace(namespace).is_ok() {
        Ok(())
    } else {
        Err(KasError::InvalidArgument(format!("namespace \"{}\" is not a namespace name", namespace.escape_debug())))
    }
}

impl ClusterStateHub {
    /// Summaries per resource.
    pub async fn summary(&self, agent_id: AgentId, scope: Scope) -> Result<ClusterStateSummary, KasError> {
        let local = |state: &AgentState| {
            let (freshness, resources) = state.summaries();
            ClusterStateSummary { agent_id: agent_id.0, freshness: Some(freshness), resources }
        };
        match self.locate(agent_id, scope).await? {
            Location::Local(state) => Ok(local(&state)),
            Location::Peer(kas) => {
                let (mut client, bearer) = self.peer_client(&kas)?;
                let request = Self::peer_request(GetClusterStateRequest { agent_id: agent_id.0 }, &bearer);
                match client.get_cluster_state(request).await {
                    Ok(response) => Ok(response.into_inner()),
                    // What this kas still holds (older, and saying so) beats no answer.
                    Err(status) => self.states.get(agent_id).map(|s| local(&s)).ok_or_else(|| from_peer(&kas, &status)),
                }
            }
        }
    }

    /// Object views of one resource, optionally of one namespace.
    pub async fn objects(
        &self,
        agent_id: AgentId,
        resource: &str,
        namespace: &str,
        scope: Scope,
    ) -> Result<ObjectList, KasError> {
        check_resource(resource)?;
        check_namespace(namespace)?;
        let local = |state: &AgentState| {
            let namespace = (!namespace.is_empty()).then_some(namespace);
            let Some((freshness, summary, objects)) = state.objects(resource, namespace) else {
                let (_, resources) = state.summaries();
                let observed: Vec<String> = resources
                    .iter()
                    .filter_map(|r| r.resource.as_ref())
                    .map(|k| crate::agent::cluster_state::resource_name(&k.group, &k.resource))
                    .collect();
                return Err(KasError::NotFound(format!(
                    "agent {agent_id} does not observe \"{resource}\" (cluster_state.resources: {})",
                    if observed.is_empty() { "none".to_owned() } else { observed.join(", ") }
                )));
            };
            Ok(ObjectList { agent_id: agent_id.0, freshness: Some(freshness), summary: Some(summary), objects })
        };
        match self.locate(agent_id, scope).await? {
            Location::Local(state) => local(&state),
            Location::Peer(kas) => {
                let (mut client, bearer) = self.peer_client(&kas)?;
                let request = Self::peer_request(
                    ListObjectsRequest {
                        agent_id: agent_id.0,
                        resource: resource.to_owned(),
                        namespace: namespace.to_owned(),
                    },
                    &bearer,
                );
                match client.list_objects(request).await {
                    Ok(response) => Ok(response.into_inner()),
                    Err(status)
                        if status.code() == tonic::Code::NotFound || status.code() == tonic::Code::InvalidArgument =>
                    {
                        Err(from_peer(&kas, &status))
                    }
                    Err(status) => {
                        self.states.get(agent_id).map_or_else(|| Err(from_peer(&kas, &status)), |s| local(&s))
                    }
                }
            }
        }
    }

    /// The state, then its changes, for as long as the caller reads. NOT_FOUND at once when no
    /// kas holds a state of the agent; after that the watch follows the state wherever it goes
    /// (agentk reconnecting to another kas, the holder restarting), saying `live: false` while it
    /// cannot be current, and a fresh snapshot when it can be again.
    pub async fn watch(
        self: &Arc<Self>,
        agent_id: AgentId,
        last_event_id: String,
        scope: Scope,
    ) -> Result<mpsc::Receiver<Arc<Event>>, KasError> {
        let location = self.locate(agent_id, scope).await?;
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        let hub = self.clone();
        tokio::spawn(async move {
            super::metrics::subscribers(1.0);
            let mut follower = Follower { hub, agent_id, scope, last_event_id, live: None, tx };
            follower.run(location).await;
            super::metrics::subscribers(-1.0);
        });
        Ok(rx)
    }
}

/// One watch: forwards events from wherever the state is.
struct Follower {
    hub: Arc<ClusterStateHub>,
    agent_id: AgentId,
    scope: Scope,
    last_event_id: String,
    /// Whether the subscriber was last told the state is live.
    live: Option<bool>,
    tx: mpsc::Sender<Arc<Event>>,
}

/// Why forwarding from one place stopped.
enum Stop {
    /// The subscriber went away (or kas is stopping): the watch ends.
    Done,
    /// Look for the state again.
    Relocate,
}

impl Follower {
    async fn run(&mut self, mut location: Location) {
        loop {
            let stop = match location {
                Location::Local(state) => self.local(state).await,
                Location::Peer(kas) => self.peer(kas).await,
            };
            if matches!(stop, Stop::Done) {
                return;
            }
            // Wherever the state went: wait a little between looks, ending with the subscriber.
            location = loop {
                match self.hub.locate(self.agent_id, self.scope).await {
                    Ok(location) => break location,
                    Err(e) => {
                        tracing::debug!(agent_id = %self.agent_id, error = %e, "cluster state not found; looking again")
                    }
                }
                if self.scope == Scope::LocalOnly {
                    return;
                }
                tokio::select! {
                    () = self.tx.closed() => return,
                    () = self.hub.shutdown.cancelled() => return,
                    () = tokio::time::sleep(RELOCATE_PERIOD) => {}
                }
            };
        }
    }

    /// Sends one event; false when the subscriber went away.
    async fn send(&mut self, event: Arc<Event>) -> bool {
        match &event.event {
            Some(event::Event::Freshness(f)) => self.live = Some(f.live),
            Some(event::Event::Snapshot(s)) => self.live = s.freshness.as_ref().map(|f| f.live),
            _ => {}
        }
        if !event.id.is_empty() {
            self.last_event_id.clone_from(&event.id);
        }
        self.tx.send(event).await.is_ok()
    }

    /// Tells the subscriber the state cannot be current now (the holder is unreachable), once.
    async fn not_live(&mut self) -> bool {
        if self.live == Some(false) {
            return true;
        }
        let freshness = Freshness { live: false, observed_at_unix_ms: unix_ms(std::time::SystemTime::now()) };
        let id = self.last_event_id.clone();
        self.send(Arc::new(Event { id, event: Some(event::Event::Freshness(freshness)) })).await
    }

    /// Whether the registry now names another kas than this one as the holder (only asked while
    /// the state followed is not live).
    async fn moved(&self, from_self: bool, from: Option<&str>) -> bool {
        if self.scope == Scope::LocalOnly || self.live != Some(false) {
            return false;
        }
        match self.hub.registry.cluster_state_holder(self.agent_id).await {
            Ok(Some(kas)) if from_self => !self.hub.is_self(&kas),
            Ok(Some(kas)) => from.is_some_and(|f| f != kas.instance_id),
            _ => false,
        }
    }

    async fn local(&mut self, state: Arc<AgentState>) -> Stop {
        let subscription = state.subscribe(&self.last_event_id);
        for event in subscription.initial {
            if !self.send(event).await {
                return Stop::Done;
            }
        }
        let mut changes = subscription.changes;
        let mut check = tokio::time::interval(RELOCATE_PERIOD);
        loop {
            tokio::select! {
                () = self.hub.shutdown.cancelled() => return Stop::Done,
                () = self.tx.closed() => return Stop::Done,
                _ = check.tick() => {
                    let dropped = self.hub.states.get(self.agent_id).is_none_or(|s| !Arc::ptr_eq(&s, &state));
                    if dropped || self.moved(true, None).await {
                        return Stop::Relocate;
                    }
                }
                change = changes.recv() => match change {
                    Ok(event) => if !self.send(event).await { return Stop::Done },
                    // Too slow: the current state instead of what it missed (the missed changes
                    // may still be kept for resuming; else a snapshot).
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        super::metrics::resnapshot();
                        let resubscribed = state.subscribe(&self.last_event_id);
                        for event in resubscribed.initial {
                            if !self.send(event).await {
                                return Stop::Done;
                            }
                        }
                        changes = resubscribed.changes;
                    }
                    Err(broadcast::error::RecvError::Closed) => return Stop::Relocate,
                },
            }
        }
    }

    async fn peer(&mut self, kas: kas_proto::kas::KasInstanceInfo) -> Stop {
        let opened = match self.hub.peer_client(&kas) {
            Ok((mut client, bearer)) => {
                let request = ClusterStateHub::peer_request(
                    WatchRequest { agent_id: self.agent_id.0, last_event_id: self.last_event_id.clone() },
                    &bearer,
                );
                client.watch(request).await.map(Response::into_inner).map_err(|s| s.message().to_owned())
            }
            Err(e) => Err(e.to_string()),
        };
        let mut events = match opened {
            Ok(events) => events,
            Err(e) => {
                tracing::debug!(agent_id = %self.agent_id, kas = %kas.instance_id, error = %e, "cannot watch the cluster state on its kas");
                return if self.not_live().await { self.pause().await } else { Stop::Done };
            }
        };
        let mut check = tokio::time::interval(RELOCATE_PERIOD);
        loop {
            tokio::select! {
                () = self.hub.shutdown.cancelled() => return Stop::Done,
                () = self.tx.closed() => return Stop::Done,
                _ = check.tick() => if self.moved(false, Some(&kas.instance_id)).await { return Stop::Relocate },
                event = events.message() => match event {
                    Ok(Some(event)) => if !self.send(Arc::new(event)).await { return Stop::Done },
                    Ok(None) | Err(_) => {
                        // The holder went away (restart, crash) or dropped the state.
                        return if self.not_live().await { self.pause().await } else { Stop::Done };
                    }
                },
            }
        }
    }

    /// Waits before looking for the state again (a kas that just failed is not asked at once).
    async fn pause(&self) -> Stop {
        tokio::select! {
            () = self.tx.closed() => Stop::Done,
            () = self.hub.shutdown.cancelled() => Stop::Done,
            () = tokio::time::sleep(RELOCATE_PERIOD / 4) => Stop::Relocate,
        }
    }
}

fn agent(id: i64) -> Result<AgentId, Status> {
    AgentId::from_wire("agent_id", id).map_err(|e| KasError::from(e).into())
}

#[tonic::async_trait]
impl ClusterState for ClusterStateService {
    type WatchStream = futures::stream::BoxStream<'static, Result<Event, Status>>;

    async fn get_cluster_state(
        &self,
        request: Request<GetClusterStateRequest>,
    ) -> Result<Response<ClusterStateSummary>, Status> {
        let agent_id = agent(request.get_ref().agent_id)?;
        Ok(Response::new(self.hub.summary(agent_id, self.scope).await?))
    }

    async fn list_objects(&self, request: Request<ListObjectsRequest>) -> Result<Response<ObjectList>, Status> {
        let r = request.into_inner();
        let agent_id = agent(r.agent_id)?;
        Ok(Response::new(self.hub.objects(agent_id, &r.resource, &r.namespace, self.scope).await?))
    }

    async fn watch(&self, request: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let r = request.into_inner();
        let agent_id = agent(r.agent_id)?;
        let rx = self.hub.watch(agent_id, r.last_event_id, self.scope).await?;
        let events = tokio_stream::wrappers::ReceiverStream::new(rx).map(|e| Ok(Event::clone(&e)));
        Ok(Response::new(events.boxed()))
    }
}

#[cfg(test)]
mod tests {
    use kas_proto::cluster_state::resource_update::Phase;
    use kas_proto::cluster_state::{ObjectView, PushRequest, ResourceKey, ResourceUpdate};
    use kas_proto::kas::KasInstanceInfo;

    use super::*;
    use crate::auth::Secret;
    use crate::registry::{MemoryRegistry, RegistryTiming};
    use crate::router::peers::Peers;

    fn hub() -> Arc<ClusterStateHub> {
        let instance = KasInstanceInfo { instance_id: "kas-test".into(), ..Default::default() };
        let timing = RegistryTiming { ttl: Duration::from_secs(60), heartbeat_ttl: Duration::from_secs(60) };
        ClusterStateHub::new(
            Default::default(),
            Arc::new(MemoryRegistry::new(instance, timing)),
            Arc::new(Peers::new(Secret::generate())),
            tokio_util::sync::CancellationToken::new(),
        )
    }

    fn changes(phase: Phase, names: impl Iterator<Item = String>, rv: usize) -> PushRequest {
        let key = ResourceKey { group: String::new(), version: "v1".into(), resource: "pods".into() };
        let upserts =
            names.map(|name| ObjectView { name, resource_version: rv.to_string(), ..Default::default() }).collect();
        PushRequest {
            resources: vec![],
            updates: vec![ResourceUpdate {
                resource: Some(key),
                phase: phase as i32,
                upserts,
                kind: "Pod".into(),
                namespaced: true,
                ..Default::default()
            }],
        }
    }

    /// A subscriber that stops reading costs a bounded queue: the changes it missed are not kept
    /// for it; when it reads again it gets the current state as a snapshot, not every change.
    #[tokio::test]
    async fn a_subscriber_that_stops_reading_gets_a_snapshot_instead_of_everything_it_missed() {
        let hub = hub();
        let state = hub.states.get_or_create(AgentId(1));
        state.stream_opened();
        state.apply(changes(Phase::SnapshotBegin, (0..10).map(|i| format!("p{i}")), 0));
        state.apply(changes(Phase::SnapshotEnd, std::iter::empty(), 0));
        let mut rx = hub.watch(AgentId(1), String::new(), Scope::Routed).await.unwrap();
        let first = rx.recv().await.unwrap();
        assert!(matches!(first.event, Some(event::Event::Snapshot(_))));
        // 20,000 changes while the subscriber reads nothing.
        const ROUNDS: usize = 2_000;
        for rv in 1..=ROUNDS {
            state.apply(changes(Phase::Changes, (0..10).map(|i| format!("p{i}")), rv));
        }
        tokio::task::yield_now().await;
        let mut received = 0;
        let mut snapshots = 0;
        let mut latest = std::collections::BTreeMap::new();
        while latest.len() < 10 || latest.values().any(|rv: &String| rv != &ROUNDS.to_string()) {
            let e = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("events").unwrap();
            received += 1;
            match e.event.as_ref().unwrap() {
                event::Event::Snapshot(s) => {
                    snapshots += 1;
                    latest =
                        s.resources[0].objects.iter().map(|o| (o.name.clone(), o.resource_version.clone())).collect();
                }
                event::Event::Upsert(c) => {
                    let o = c.object.as_ref().unwrap();
                    latest.insert(o.name.clone(), o.resource_version.clone());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(snapshots >= 1, "the slow subscriber was given the current state");
        assert!(received < ROUNDS * 10 / 4, "{received} events for {} changes: not coalesced", ROUNDS * 10);
    }
}
