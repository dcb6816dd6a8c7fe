//! The cluster state this kas holds: per agent, the object views agentk pushed, the changes
//! numbered in order for subscribers, and whether agentk's stream is open.
//!
//! Each agent's state is behind its own lock, held only to apply one push message or to take a
//! snapshot (never across an await); subscribing takes the snapshot and the broadcast receiver
//! under that lock, so a subscriber sees every change after its snapshot exactly once.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use kas_proto::AgentId;
use kas_proto::cluster_state::resource_update::Phase;
use kas_proto::cluster_state::{
    Event, Freshness, ObjectChange, ObjectView, PushRequest, ResourceKey, ResourceObjects, ResourceSummary,
    ResourceUpdate, Snapshot, event,
};
use tokio::sync::broadcast;

/// Changes kept per agent for subscribers that resume (`Last-Event-ID`); older ones get a snapshot.
const RECENT_EVENTS: usize = 1024;
/// Changes a subscriber may fall behind by before it gets a fresh snapshot instead (the bound on
/// what a slow subscriber costs kas: the broadcast ring, shared by all subscribers).
const SUBSCRIBER_BUFFER: usize = 1024;

/// A resource as kas keys it: group and plural name (the version is what agentk watches).
type ResourceId = (String, String);

/// An object as kas keys it within a resource: namespace and name.
type ObjectKey = (String, String);

fn resource_id(key: &ResourceKey) -> ResourceId {
    (key.group.clone(), key.resource.clone())
}

/// One resource's views.
#[derive(Debug, Default)]
struct Resource {
    key: ResourceKey,
    kind: String,
    namespaced: bool,
    objects: BTreeMap<ObjectKey, Arc<ObjectView>>,
    /// A full listing in progress: replaces `objects` when it ends.
    listing: Option<BTreeMap<ObjectKey, Arc<ObjectView>>>,
    synced: bool,
    error: String,
}

impl Resource {
    fn summary(&self) -> ResourceSummary {
        let mut by_status: HashMap<String, u32> = HashMap::new();
        let mut ready = 0;
        for view in self.objects.values() {
            if !view.status.is_empty() {
                *by_status.entry(view.status.clone()).or_default() += 1;
            }
            ready += u32::from(view.ready);
        }
        ResourceSummary {
            resource: Some(self.key.clone()),
            kind: self.kind.clone(),
            namespaced: self.namespaced,
            count: u32::try_from(self.objects.len()).unwrap_or(u32::MAX),
            by_status,
            ready,
            error: self.error.clone(),
            synced: self.synced,
        }
    }

    fn objects(&self, namespace: Option<&str>) -> Vec<ObjectView> {
        self.objects
            .iter()
            .filter(|((ns, _), _)| namespace.is_none_or(|n| n == ns))
            .map(|(_, v)| ObjectView::clone(v))
            .collect()
    }
}

#[derive(Debug)]
struct Inner {
    resources: BTreeMap<ResourceId, Resource>,
    /// Push streams of agentk open now (two overlap briefly when the Lease changes hands).
    streams: usize,
    /// When kas last heard from agentk (a message, or its stream ending).
    observed_at: SystemTime,
    /// The last change's sequence number.
    seq: u64,
    recent: VecDeque<Arc<Event>>,
}

/// One agent's state on this kas.
#[derive(Debug)]
pub struct AgentState {
    /// Random per state: event ids of another state (another kas, or after a restart) never
    /// resume here.
    epoch: u64,
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Event>>,
}

/// What a subscriber gets first: a snapshot, or the changes it missed.
pub struct Subscription {
    pub initial: Vec<Arc<Event>>,
    pub changes: broadcast::Receiver<Arc<Event>>,
}

/// What applying a push message did (for metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub events: usize,
}

impl AgentState {
    fn new() -> Self {
        Self {
            epoch: rand::random::<u64>() >> 12,
            inner: Mutex::new(Inner {
                resources: BTreeMap::new(),
                streams: 0,
                observed_at: SystemTime::now(),
                seq: 0,
                recent: VecDeque::new(),
            }),
            events: broadcast::channel(SUBSCRIBER_BUFFER).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn event_id(&self, seq: u64) -> String {
        format!("{:x}-{seq}", self.epoch)
    }

    /// Numbers the event, keeps it for resuming subscribers and sends it to the subscribers.
    fn emit(&self, inner: &mut Inner, event: event::Event) {
        inner.seq += 1;
        let event = Arc::new(Event { id: self.event_id(inner.seq), event: Some(event) });
        if inner.recent.len() == RECENT_EVENTS {
            inner.recent.pop_front();
        }
        inner.recent.push_back(event.clone());
        let _ = self.events.send(event);
    }

    fn freshness_of(inner: &Inner) -> Freshness {
        let live = inner.streams > 0;
        let at = if live { SystemTime::now() } else { inner.observed_at };
        Freshness { live, observed_at_unix_ms: unix_ms(at) }
    }

    pub fn freshness(&self) -> Freshness {
        Self::freshness_of(&self.lock())
    }

    /// agentk's stream opened: the state is live (subscribers hear it if it was not).
    pub fn stream_opened(&self) {
        let mut inner = self.lock();
        inner.streams += 1;
        inner.observed_at = SystemTime::now();
        if inner.streams == 1 {
            let f = Self::freshness_of(&inner);
            self.emit(&mut inner, event::Event::Freshness(f));
        }
    }

    /// agentk's stream ended: the views stay, marked with when kas last heard from agentk.
    pub fn stream_closed(&self) {
        let mut inner = self.lock();
        inner.streams = inner.streams.saturating_sub(1);
        inner.observed_at = SystemTime::now();
        if inner.streams == 0 {
            let f = Self::freshness_of(&inner);
            self.emit(&mut inner, event::Event::Freshness(f));
        }
    }

    /// Resources held.
    pub fn resource_count(&self) -> usize {
        self.lock().resources.len()
    }

    /// Views held, listings in progress included (the bound `cluster_state.max_objects_per_agent`).
    pub fn object_count(&self) -> usize {
        let inner = self.lock();
        inner.resources.values().map(|r| r.objects.len() + r.listing.as_ref().map_or(0, BTreeMap::len)).sum()
    }

    pub fn is_live(&self) -> bool {
        self.lock().streams > 0
    }

    /// When the state stopped being live (`None` while live).
    pub fn ended_at(&self) -> Option<SystemTime> {
        let inner = self.lock();
        (inner.streams == 0).then_some(inner.observed_at)
    }

    /// Applies one message of agentk's stream; changes to the views become events.
    pub fn apply(&self, message: PushRequest) -> Applied {
        let mut inner = self.lock();
        inner.observed_at = SystemTime::now();
        let before = inner.seq;
        if !message.resources.is_empty() {
            let observed: BTreeSet<ResourceId> = message.resources.iter().map(resource_id).collect();
            let gone: Vec<ResourceId> = inner.resources.keys().filter(|id| !observed.contains(*id)).cloned().collect();
            for id in gone {
                if let Some(r) = inner.resources.remove(&id) {
                    self.emit(&mut inner, event::Event::ResourceRemoved(r.key));
                }
            }
        }
        for update in message.updates {
            self.apply_update(&mut inner, update);
        }
        Applied { events: usize::try_from(inner.seq - before).unwrap_or(usize::MAX) }
    }

    fn apply_update(&self, inner: &mut Inner, update: ResourceUpdate) {
        let Some(key) = update.resource.clone() else { return };
        let id = resource_id(&key);
        let phase = update.phase();
        if phase == Phase::Removed {
            if inner.resources.remove(&id).is_some() {
                self.emit(inner, event::Event::ResourceRemoved(key));
            }
            return;
        }
        let resource =
            inner.resources.entry(id.clone()).or_insert_with(|| Resource { key: key.clone(), ..Default::default() });
        resource.key = key.clone();
        if phase == Phase::SnapshotBegin {
            resource.kind = update.kind.clone();
            resource.namespaced = update.namespaced;
            resource.listing = Some(BTreeMap::new());
        }
        if phase == Phase::Failing {
            resource.error = update.error;
            return;
        }
        let mut changes = Vec::new();
        if let Some(listing) = &mut resource.listing {
            for view in update.upserts {
                listing.insert((view.namespace.clone(), view.name.clone()), Arc::new(view));
            }
            for gone in update.deletes {
                listing.remove(&(gone.namespace, gone.name));
            }
        } else {
            for view in update.upserts {
                let k = (view.namespace.clone(), view.name.clone());
                let view = Arc::new(view);
                if resource.objects.get(&k).is_none_or(|old| **old != *view) {
                    resource.objects.insert(k, view.clone());
                    changes.push(event::Event::Upsert(ObjectChange {
                        resource: Some(key.clone()),
                        object: Some(ObjectView::clone(&view)),
                    }));
                }
            }
            for gone in update.deletes {
                if let Some(old) = resource.objects.remove(&(gone.namespace, gone.name)) {
                    changes.push(event::Event::Delete(ObjectChange {
                        resource: Some(key.clone()),
                        object: Some(ObjectView::clone(&old)),
                    }));
                }
            }
        }
        if phase == Phase::SnapshotEnd
            && let Some(listing) = resource.listing.take()
        {
            // What subscribers must do to go from the old views to the listing's.
            for (k, old) in &resource.objects {
                if !listing.contains_key(k) {
                    changes.push(event::Event::Delete(ObjectChange {
                        resource: Some(key.clone()),
                        object: Some(ObjectView::clone(old)),
                    }));
                }
            }
            for (k, view) in &listing {
                if resource.objects.get(k).is_none_or(|old| old != view) {
                    changes.push(event::Event::Upsert(ObjectChange {
                        resource: Some(key.clone()),
                        object: Some(ObjectView::clone(view)),
                    }));
                }
            }
            resource.objects = listing;
            resource.synced = true;
            resource.error.clear();
        }
        for change in changes {
            self.emit(inner, change);
        }
    }

    pub fn summaries(&self) -> (Freshness, Vec<ResourceSummary>) {
        let inner = self.lock();
        (Self::freshness_of(&inner), inner.resources.values().map(Resource::summary).collect())
    }

    /// The views of the resource named `pods` or `deployments.apps` (kubectl's
    /// `<resource>.<group>`), optionally of one namespace.
    pub fn objects(
        &self,
        resource: &str,
        namespace: Option<&str>,
    ) -> Option<(Freshness, ResourceSummary, Vec<ObjectView>)> {
        let inner = self.lock();
        let (name, group) = resource.split_once('.').unwrap_or((resource, ""));
        let r = inner.resources.get(&(group.to_owned(), name.to_owned()))?;
        Some((Self::freshness_of(&inner), r.summary(), r.objects(namespace)))
    }

    fn snapshot_of(&self, inner: &Inner) -> Arc<Event> {
        let resources = inner
            .resources
            .values()
            .map(|r| ResourceObjects { summary: Some(r.summary()), objects: r.objects(None) })
            .collect();
        Arc::new(Event {
            id: self.event_id(inner.seq),
            event: Some(event::Event::Snapshot(Snapshot { freshness: Some(Self::freshness_of(inner)), resources })),
        })
    }

    /// The state now and every change after it. With the id of the last event a subscriber got
    /// from this state, it gets only what it missed, if this kas still has all of it.
    pub fn subscribe(&self, last_event_id: &str) -> Subscription {
        let inner = self.lock();
        let changes = self.events.subscribe();
        let missed = self.missed_since(&inner, last_event_id);
        let initial = missed.unwrap_or_else(|| vec![self.snapshot_of(&inner)]);
        Subscription { initial, changes }
    }

    fn missed_since(&self, inner: &Inner, last_event_id: &str) -> Option<Vec<Arc<Event>>> {
        let (epoch, seq) = last_event_id.split_once('-')?;
        if u64::from_str_radix(epoch, 16).ok()? != self.epoch {
            return None;
        }
        let seq: u64 = seq.parse().ok()?;
        if seq > inner.seq {
            return None;
        }
        let oldest = inner.seq - inner.recent.len() as u64;
        if seq < oldest {
            return None;
        }
        let skip = usize::try_from(seq - oldest).ok()?;
        Some(inner.recent.iter().skip(skip).cloned().collect())
    }
}

pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Every agent's state on this kas. States of agents whose stream ended are kept for
/// `retention` (reads say how old they are), then dropped.
pub struct ClusterStates {
    agents: Mutex<HashMap<AgentId, Arc<AgentState>>>,
    retention: Duration,
}

impl ClusterStates {
    pub fn new(retention: Duration) -> Self {
        Self { agents: Mutex::default(), retention }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<AgentId, Arc<AgentState>>> {
        self.agents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The agent's state, made if there is none (agentk opened its stream).
    pub fn get_or_create(&self, agent_id: AgentId) -> Arc<AgentState> {
        let mut agents = self.lock();
        self.sweep(&mut agents);
        agents.entry(agent_id).or_insert_with(|| Arc::new(AgentState::new())).clone()
    }

    pub fn get(&self, agent_id: AgentId) -> Option<Arc<AgentState>> {
        let mut agents = self.lock();
        self.sweep(&mut agents);
        agents.get(&agent_id).cloned()
    }

    /// Drops states that ended more than `retention` ago.
    fn sweep(&self, agents: &mut HashMap<AgentId, Arc<AgentState>>) {
        let now = SystemTime::now();
        agents.retain(|_, s| s.ended_at().is_none_or(|at| now.duration_since(at).unwrap_or_default() < self.retention));
    }

    /// Agents whose agentk stream is open here.
    pub fn live_agents(&self) -> Vec<AgentId> {
        self.lock().iter().filter(|(_, s)| s.is_live()).map(|(id, _)| *id).collect()
    }

    /// Agents with a state here (for metrics).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Object views held over all agents (for metrics).
    pub fn views(&self) -> usize {
        let states: Vec<Arc<AgentState>> = self.lock().values().cloned().collect();
        states.iter().map(|s| s.lock().resources.values().map(|r| r.objects.len()).sum::<usize>()).sum()
    }
}

#[cfg(test)]
mod tests {
    use kas_proto::cluster_state::ObjectRef;

    use super::*;

    fn pods() -> ResourceKey {
        ResourceKey { group: String::new(), version: "v1".into(), resource: "pods".into() }
    }

    fn pod(name: &str, rv: u32, phase: &str) -> ObjectView {
        ObjectView {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: rv.to_string(),
            status: phase.into(),
            ready: phase == "Running",
            ..Default::default()
        }
    }

    fn update(phase: Phase, upserts: Vec<ObjectView>, deletes: &[&str]) -> PushRequest {
        PushRequest {
            resources: vec![],
            updates: vec![ResourceUpdate {
                resource: Some(pods()),
                phase: phase as i32,
                upserts,
                deletes: deletes.iter().map(|n| ObjectRef { namespace: "default".into(), name: (*n).into() }).collect(),
                kind: "Pod".into(),
                namespaced: true,
                error: String::new(),
            }],
        }
    }

    /// (kind, name, rv) of each event.
    fn describe(events: &[Arc<Event>]) -> Vec<(String, String)> {
        events
            .iter()
            .map(|e| match e.event.as_ref().unwrap() {
                event::Event::Snapshot(s) => {
                    let names: Vec<String> =
                        s.resources.iter().flat_map(|r| r.objects.iter().map(|o| o.name.clone())).collect();
                    ("snapshot".into(), names.join(","))
                }
                event::Event::Upsert(c) => {
                    let o = c.object.as_ref().unwrap();
                    ("upsert".into(), format!("{}@{}", o.name, o.resource_version))
                }
                event::Event::Delete(c) => ("delete".into(), c.object.as_ref().unwrap().name.clone()),
                event::Event::ResourceRemoved(r) => ("removed".into(), r.resource.clone()),
                event::Event::Freshness(f) => ("freshness".into(), f.live.to_string()),
            })
            .collect()
    }

    fn drain(rx: &mut broadcast::Receiver<Arc<Event>>) -> Vec<Arc<Event>> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[test]
    fn a_listing_replaces_the_views_and_subscribers_see_only_the_difference() {
        let state = AgentState::new();
        state.stream_opened();
        state.apply(update(Phase::SnapshotBegin, vec![pod("a", 1, "Running"), pod("b", 1, "Pending")], &[]));
        state.apply(update(Phase::SnapshotEnd, vec![], &[]));
        let mut sub = state.subscribe("");
        assert_eq!(describe(&sub.initial), [("snapshot".into(), "a,b".into())]);
        // A relist (agentk reconnected): b changed, a is gone, c is new; a unchanged object is
        // not an event.
        state.apply(update(Phase::SnapshotBegin, vec![pod("b", 2, "Running")], &[]));
        state.apply(update(Phase::Changes, vec![pod("c", 3, "Pending")], &[]));
        assert!(drain(&mut sub.changes).is_empty(), "nothing until the listing ends");
        state.apply(update(Phase::SnapshotEnd, vec![], &[]));
        assert_eq!(
            describe(&drain(&mut sub.changes)),
            [("delete".into(), "a".into()), ("upsert".into(), "b@2".into()), ("upsert".into(), "c@3".into())]
        );
        state.apply(update(Phase::Changes, vec![pod("c", 3, "Pending")], &["b"]));
        assert_eq!(describe(&drain(&mut sub.changes)), [("delete".into(), "b".into())], "c unchanged");
        let (_, summaries) = state.summaries();
        assert_eq!((summaries[0].count, summaries[0].synced), (1, true));
        assert_eq!(summaries[0].by_status.get("Pending"), Some(&1));
    }

    #[test]
    fn a_subscriber_resumes_with_what_it_missed_or_gets_a_snapshot() {
        let state = AgentState::new();
        state.apply(update(Phase::SnapshotBegin, vec![pod("a", 1, "Running")], &[]));
        state.apply(update(Phase::SnapshotEnd, vec![], &[]));
        let first = state.subscribe("");
        let last_id = first.initial[0].id.clone();
        state.apply(update(Phase::Changes, vec![pod("a", 2, "Running"), pod("b", 3, "Running")], &[]));
        let resumed = state.subscribe(&last_id);
        assert_eq!(describe(&resumed.initial), [("upsert".into(), "a@2".into()), ("upsert".into(), "b@3".into())]);
        let other = AgentState::new();
        assert_eq!(describe(&other.subscribe(&last_id).initial)[0].0, "snapshot", "another state's id");
        assert_eq!(describe(&state.subscribe("garbage").initial)[0].0, "snapshot");
        assert_eq!(describe(&state.subscribe(&format!("{:x}-999", state.epoch)).initial)[0].0, "snapshot");
        // Changes older than the kept ones: a snapshot.
        for i in 0..RECENT_EVENTS as u32 + 5 {
            state.apply(update(Phase::Changes, vec![pod("a", 10 + i, "Running")], &[]));
        }
        assert_eq!(describe(&state.subscribe(&last_id).initial)[0].0, "snapshot");
    }

    #[test]
    fn freshness_follows_the_stream_and_resources_leave_with_the_configuration() {
        let state = AgentState::new();
        let mut sub = state.subscribe("");
        state.stream_opened();
        assert!(state.freshness().live);
        state.apply(update(Phase::SnapshotBegin, vec![pod("a", 1, "Running")], &[]));
        state.apply(update(Phase::SnapshotEnd, vec![], &[]));
        state.stream_closed();
        let f = state.freshness();
        assert!(!f.live && f.observed_at_unix_ms > 0);
        state.apply(PushRequest {
            resources: vec![ResourceKey { group: "apps".into(), version: "v1".into(), resource: "deployments".into() }],
            updates: vec![],
        });
        assert_eq!(
            describe(&drain(&mut sub.changes)),
            [
                ("freshness".into(), "true".into()),
                ("upsert".into(), "a@1".into()),
                ("freshness".into(), "false".into()),
                ("removed".into(), "pods".into())
            ]
        );
        assert!(state.objects("pods", None).is_none());
    }

    #[test]
    fn ended_states_are_dropped_after_the_retention() {
        let states = ClusterStates::new(Duration::ZERO);
        let s = states.get_or_create(AgentId(1));
        s.stream_opened();
        assert!(states.get(AgentId(1)).is_some(), "live states stay");
        s.stream_closed();
        assert!(states.get(AgentId(1)).is_none());
    }
}
