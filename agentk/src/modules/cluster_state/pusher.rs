//! The pusher: one task that owns agentk's view cache and keeps kas's copy equal to it over
//! `ClusterStateAgent.Push`.
//!
//! Informers' observations update the cache at once and mark what kas has not been told yet:
//! per object only its latest state (an upsert or a delete), so when kas reads slowly (the
//! stream's one-message buffer is full) changes to the same object coalesce instead of queueing,
//! and memory stays bounded by the cluster's size. After every (re)connect kas gets the resource
//! list and a full listing of each resource; after an informer relists, a full listing of that
//! resource.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use kas_proto::cluster_state::cluster_state_agent_client::ClusterStateAgentClient;
use kas_proto::cluster_state::resource_update::Phase;
use kas_proto::cluster_state::{ObjectRef, ObjectView, PushRequest, ResourceKey, ResourceUpdate};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::informer::Observation;
use crate::backoff::Backoff;
use crate::modules::RunContext;

/// Views per message: a message stays far below kas's 4 MiB limit (a view is a few hundred bytes).
const VIEWS_PER_MESSAGE: usize = 500;
/// Reconnecting to kas: as the presence stream.
const RECONNECT_BASE: Duration = Duration::from_millis(500);
const RECONNECT_CAP: Duration = Duration::from_secs(30);
/// A stream that lasted this long was healthy: the next failure starts backoff afresh.
const HEALTHY_AFTER: Duration = Duration::from_secs(30);
/// How long a stopping pusher waits for kas to take what it already sent (see [`run`]).
const END_TIMEOUT: Duration = Duration::from_secs(2);

type ResourceId = (String, String);
type ObjectKey = (String, String);

fn id(key: &ResourceKey) -> ResourceId {
    (key.group.clone(), key.resource.clone())
}

#[derive(Debug, Default)]
struct CachedResource {
    key: ResourceKey,
    kind: String,
    namespaced: bool,
    objects: BTreeMap<ObjectKey, ObjectView>,
    /// A listing ended at least once: kas may be sent one.
    listed: bool,
}

/// What kas has not been told yet.
#[derive(Debug, Default)]
struct Pending {
    /// The resource list (a new stream, or the configuration changed).
    resources: bool,
    /// Resources whose full listing kas needs.
    listings: BTreeSet<ResourceId>,
    /// Per object, its latest state: `Some` upsert, `None` delete.
    changes: BTreeMap<(ResourceId, ObjectKey), Option<ObjectView>>,
    /// Resources whose informer fails, with why.
    failing: BTreeMap<ResourceId, String>,
    /// Resources the configuration stopped naming.
    removed: Vec<ResourceKey>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        !self.resources
            && self.listings.is_empty()
            && self.changes.is_empty()
            && self.failing.is_empty()
            && self.removed.is_empty()
    }
}

/// The cache and what kas still needs to hear.
#[derive(Debug, Default)]
pub struct Cache {
    resources: BTreeMap<ResourceId, CachedResource>,
    /// The configuration's resources, in its order.
    observed: Vec<ResourceKey>,
    pending: Pending,
    /// Messages of a listing being sent (kept in order ahead of later changes).
    outbox: VecDeque<PushRequest>,
}

impl Cache {
    /// The configuration now names `observed`: the cache forgets the others.
    pub fn set_observed(&mut self, observed: Vec<ResourceKey>) {
        let ids: BTreeSet<ResourceId> = observed.iter().map(id).collect();
        let removed = self.observed.iter().filter(|k| !ids.contains(&id(k))).cloned();
        self.pending.removed.extend(removed);
        self.resources.retain(|k, _| ids.contains(k));
        self.pending.listings.retain(|k| ids.contains(k));
        self.pending.changes.retain(|(k, _), _| ids.contains(k));
        self.pending.failing.retain(|k, _| ids.contains(k));
        self.observed = observed;
        self.pending.resources = true;
    }

    /// kas has nothing (a new stream): the resource list and every listing.
    pub fn reset(&mut self) {
        self.outbox.clear();
        self.pending = Pending {
            resources: true,
            listings: self.resources.iter().filter(|(_, r)| r.listed).map(|(k, _)| k.clone()).collect(),
            changes: BTreeMap::new(),
            failing: BTreeMap::new(),
            removed: Vec::new(),
        };
    }

    pub fn observe(&mut self, observation: Observation) {
        match observation {
            Observation::Listed { key, kind, namespaced, namespace, objects } => {
                let rid = id(&key);
                let r = self.resources.entry(rid.clone()).or_default();
                r.key = key;
                r.kind = kind;
                r.namespaced = namespaced;
                // A listing of one namespace replaces only that namespace's objects.
                r.objects.retain(|(ns, _), _| namespace.as_ref().is_some_and(|n| n != ns));
                for o in objects {
                    r.objects.insert((o.namespace.clone(), o.name.clone()), o);
                }
                r.listed = true;
                // The listing carries every change of the resource so far.
                self.pending.changes.retain(|(k, _), _| *k != rid);
                self.pending.failing.remove(&rid);
                self.pending.listings.insert(rid);
            }
            Observation::Upsert { key, object } => {
                let rid = id(&key);
                let Some(r) = self.resources.get_mut(&rid) else { return };
                let k = (object.namespace.clone(), object.name.clone());
                r.objects.insert(k.clone(), object.clone());
                if r.listed && !self.pending.listings.contains(&rid) {
                    coalesce(self.pending.changes.insert((rid, k), Some(object)));
                }
            }
            Observation::Delete { key, namespace, name } => {
                let rid = id(&key);
                let Some(r) = self.resources.get_mut(&rid) else { return };
                let k = (namespace, name);
                r.objects.remove(&k);
                if r.listed && !self.pending.listings.contains(&rid) {
                    coalesce(self.pending.changes.insert((rid, k), None));
                }
            }
            Observation::Failing { key, error } => {
                let rid = id(&key);
                if self.observed.iter().any(|k| id(k) == rid) {
                    self.pending.failing.insert(rid, error);
                }
            }
        }
    }

    /// Whether a message is ready to go.
    pub fn has_next(&self) -> bool {
        !self.outbox.is_empty() || !self.pending.is_empty()
    }

    /// The next message for kas: a listing's next part first, then the resource list, failures,
    /// listings, and changes (at most [`VIEWS_PER_MESSAGE`] per message).
    pub fn next_message(&mut self) -> Option<PushRequest> {
        if let Some(m) = self.outbox.pop_front() {
            return Some(m);
        }
        let mut message = PushRequest::default();
        if std::mem::take(&mut self.pending.resources) {
            message.resources.clone_from(&self.observed);
        }
        for key in std::mem::take(&mut self.pending.removed) {
            message.updates.push(ResourceUpdate {
                resource: Some(key),
                phase: Phase::Removed as i32,
                ..Default::default()
            });
        }
        for (rid, error) in std::mem::take(&mut self.pending.failing) {
            let key = self.observed.iter().find(|k| id(k) == rid).cloned().unwrap_or_default();
            message.updates.push(ResourceUpdate {
                resource: Some(key),
                phase: Phase::Failing as i32,
                error,
                ..Default::default()
            });
        }
        if let Some(rid) = self.pending.listings.pop_first()
            && let Some(r) = self.resources.get(&rid)
        {
            let mut parts: VecDeque<PushRequest> = listing(r).into();
            if let Some(first) = parts.pop_front() {
                message.updates.extend(first.updates);
            }
            self.outbox = parts;
            return Some(message);
        }
        let mut by_resource: BTreeMap<ResourceId, ResourceUpdate> = BTreeMap::new();
        let mut taken = 0;
        while taken < VIEWS_PER_MESSAGE
            && let Some(((rid, (namespace, name)), change)) = self.pending.changes.pop_first()
        {
            taken += 1;
            let Some(r) = self.resources.get(&rid) else { continue };
            let update = by_resource.entry(rid).or_insert_with(|| ResourceUpdate {
                resource: Some(r.key.clone()),
                phase: Phase::Changes as i32,
                ..Default::default()
            });
            match change {
                Some(view) => update.upserts.push(view),
                None => update.deletes.push(ObjectRef { namespace, name }),
            }
        }
        message.updates.extend(by_resource.into_values());
        (!message.updates.is_empty() || !message.resources.is_empty()).then_some(message)
    }
}

/// A change replaced one kas had not been told yet.
fn coalesce<T>(replaced: Option<T>) {
    if replaced.is_some() {
        crate::metrics::cluster_state_coalesced();
    }
}

/// A resource's full listing: SNAPSHOT_BEGIN (with its kind and scope), parts, SNAPSHOT_END.
fn listing(r: &CachedResource) -> Vec<PushRequest> {
    let views: Vec<&ObjectView> = r.objects.values().collect();
    let mut chunks: Vec<Vec<ObjectView>> =
        views.chunks(VIEWS_PER_MESSAGE).map(|c| c.iter().map(|v| (*v).clone()).collect()).collect();
    if chunks.is_empty() {
        chunks.push(Vec::new());
    }
    let last = chunks.len() - 1;
    let mut messages: Vec<PushRequest> = chunks
        .into_iter()
        .enumerate()
        .map(|(i, upserts)| {
            let phase = if i == 0 { Phase::SnapshotBegin } else { Phase::Changes };
            PushRequest {
                updates: vec![ResourceUpdate {
                    resource: Some(r.key.clone()),
                    phase: phase as i32,
                    upserts,
                    kind: r.kind.clone(),
                    namespaced: r.namespaced,
                    ..Default::default()
                }],
                resources: vec![],
            }
        })
        .collect();
    messages[last].updates.push(ResourceUpdate {
        resource: Some(r.key.clone()),
        phase: Phase::SnapshotEnd as i32,
        ..Default::default()
    });
    messages
}

/// Keeps kas's copy equal to the cache until `stop`, reconnecting with backoff (to the kas
/// addresses in `--kas-address` order, the next one after each failure).
/// `told` says, after every step, whether kas has been told everything of the configuration's
/// current resources: (how many resources it names, nothing left to send). On `stop` the stream
/// is ended, not dropped: kas reads what was sent before it answers (within [`END_TIMEOUT`]);
/// a dropped stream is reset, and kas may see the reset before the last message.
pub async fn run(
    kas: RunContext,
    mut observed: watch::Receiver<Vec<ResourceKey>>,
    mut observations: mpsc::Receiver<Observation>,
    told: watch::Sender<(usize, bool)>,
    stop: CancellationToken,
) {
    let mut cache = Cache::default();
    cache.set_observed(observed.borrow_and_update().clone());
    let publish = |cache: &Cache| {
        let now = (cache.observed.len(), !cache.has_next());
        told.send_if_modified(|v| std::mem::replace(v, now) != now);
    };
    let mut backoff = Backoff::new(RECONNECT_BASE, RECONNECT_CAP);
    for attempt in 0usize.. {
        let Some((address, channel)) = kas.kas.get(attempt % kas.kas.len().max(1)) else { return };
        let started = Instant::now();
        cache.reset();
        // One message in flight: kas's pace is the stream's pace; the rest coalesces in `cache`.
        let (tx, rx) = mpsc::channel::<PushRequest>(1);
        let mut client = ClusterStateAgentClient::new(channel.clone());
        let call = client.push(kas.authorized(tokio_stream::wrappers::ReceiverStream::new(rx)));
        tokio::pin!(call);
        let ended = loop {
            publish(&cache);
            tokio::select! {
                () = stop.cancelled() => break None,
                result = &mut call => break Some(result.map(|_| ())),
                changed = observed.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    cache.set_observed(observed.borrow_and_update().clone());
                }
                observation = observations.recv() => match observation {
                    Some(o) => cache.observe(o),
                    None => return,
                },
                permit = tx.reserve(), if cache.has_next() => match permit {
                    Ok(permit) => {
                        if let Some(message) = cache.next_message() {
                            crate::metrics::cluster_state_pushed();
                            permit.send(message);
                        }
                    }
                    Err(_) => break Some(Ok(())),
                },
            }
        };
        let Some(ended) = ended else {
            drop(tx);
            if tokio::time::timeout(END_TIMEOUT, &mut call).await.is_err() {
                tracing::debug!(kas = %address, "kas did not end the cluster state stream in time");
            }
            return;
        };
        match ended {
            Ok(()) => tracing::debug!(kas = %address, "kas ended the cluster state stream; reconnecting"),
            Err(status) => {
                tracing::warn!(kas = %address, code = ?status.code(), error = %status.message(), "cluster state stream failed");
            }
        }
        if started.elapsed() >= HEALTHY_AFTER {
            backoff.reset();
        }
        let delay = backoff.next_delay();
        // Observations keep the cache current while waiting.
        let wait = tokio::time::sleep(delay);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = &mut wait => break,
                observation = observations.recv() => match observation {
                    Some(o) => cache.observe(o),
                    None => return,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> ResourceKey {
        ResourceKey { group: String::new(), version: "v1".into(), resource: "pods".into() }
    }

    fn pod(name: &str, rv: &str) -> ObjectView {
        ObjectView { namespace: "ns".into(), name: name.into(), resource_version: rv.into(), ..Default::default() }
    }

    fn drain(cache: &mut Cache) -> Vec<PushRequest> {
        std::iter::from_fn(|| cache.next_message()).collect()
    }

    fn phases(messages: &[PushRequest]) -> Vec<(i32, usize, usize)> {
        messages.iter().flat_map(|m| m.updates.iter().map(|u| (u.phase, u.upserts.len(), u.deletes.len()))).collect()
    }

    #[test]
    fn a_new_stream_gets_the_resource_list_and_full_listings_in_parts() {
        let mut cache = Cache::default();
        cache.set_observed(vec![pods()]);
        let objects = (0..1200).map(|i| pod(&format!("p{i:04}"), "1")).collect();
        cache.observe(Observation::Listed {
            key: pods(),
            kind: "Pod".into(),
            namespaced: true,
            namespace: None,
            objects,
        });
        cache.reset();
        let messages = drain(&mut cache);
        assert_eq!(messages[0].resources, [pods()]);
        let b = Phase::SnapshotBegin as i32;
        let c = Phase::Changes as i32;
        let e = Phase::SnapshotEnd as i32;
        assert_eq!(phases(&messages), [(b, 500, 0), (c, 500, 0), (c, 200, 0), (e, 0, 0)]);
    }

    #[test]
    fn changes_kas_has_not_taken_yet_coalesce_to_the_latest_per_object() {
        let mut cache = Cache::default();
        cache.set_observed(vec![pods()]);
        cache.observe(Observation::Listed {
            key: pods(),
            kind: "Pod".into(),
            namespaced: true,
            namespace: None,
            objects: vec![pod("a", "1")],
        });
        drain(&mut cache);
        for rv in 2..100 {
            cache.observe(Observation::Upsert { key: pods(), object: pod("a", &rv.to_string()) });
        }
        cache.observe(Observation::Upsert { key: pods(), object: pod("b", "100") });
        cache.observe(Observation::Delete { key: pods(), namespace: "ns".into(), name: "b".into() });
        let messages = drain(&mut cache);
        assert_eq!(messages.len(), 1);
        let update = &messages[0].updates[0];
        assert_eq!(update.upserts.iter().map(|v| v.resource_version.as_str()).collect::<Vec<_>>(), ["99"]);
        assert_eq!(update.deletes, [ObjectRef { namespace: "ns".into(), name: "b".into() }]);
    }

    #[test]
    fn a_namespace_listing_replaces_only_that_namespace_and_removed_resources_are_forgotten() {
        let mut cache = Cache::default();
        cache.set_observed(vec![pods()]);
        let in_ns = |ns: &str, name: &str| ObjectView { namespace: ns.into(), name: name.into(), ..Default::default() };
        cache.observe(Observation::Listed {
            key: pods(),
            kind: "Pod".into(),
            namespaced: true,
            namespace: Some("a".into()),
            objects: vec![in_ns("a", "1")],
        });
        cache.observe(Observation::Listed {
            key: pods(),
            kind: "Pod".into(),
            namespaced: true,
            namespace: Some("b".into()),
            objects: vec![in_ns("b", "1")],
        });
        cache.observe(Observation::Listed {
            key: pods(),
            kind: "Pod".into(),
            namespaced: true,
            namespace: Some("a".into()),
            objects: vec![in_ns("a", "2")],
        });
        let names: Vec<_> = cache.resources[&id(&pods())].objects.keys().cloned().collect();
        assert_eq!(names, [("a".into(), "2".into()), ("b".into(), "1".into())]);
        drain(&mut cache);
        cache.set_observed(vec![]);
        assert!(cache.resources.is_empty());
        let messages = drain(&mut cache);
        assert_eq!(messages.len(), 1);
        assert_eq!(phases(&messages), [(Phase::Removed as i32, 0, 0)]);
    }
}
