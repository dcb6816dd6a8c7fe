//! The fake's change history, as etcd's revisions and the API server's watch cache keep it: every
//! change with its resourceVersion and the object before it, so a watch from a resourceVersion
//! replays what it missed, a watch with a selector sees an object leave the selection (as a
//! DELETED), and a list can read the objects as they were at an earlier resourceVersion (the
//! pages after the first of a paginated list, `resourceVersionMatch=Exact`).
//!
//! The history is bounded as the real one is: a cap on the changes kept (the oldest go first) and
//! compaction ([`FakeKube::compact_history`], etcd's). What was forgotten cannot be read or
//! replayed: a watch or a list from a resourceVersion before it is `410 Gone` (`Expired`).
//!
//! Open watches are not cut by compaction (the real watch cache keeps serving its watchers); a
//! watcher that stops reading for longer than its queue lasts is closed, as the real one closes
//! an unresponsive watcher, and resumes from its last resourceVersion or relists.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use super::store::Key;
use super::{FakeKube, Inner};

/// Changes kept by default (the real watch cache keeps up to 100k per resource, etcd five
/// minutes' worth; a test needs far fewer, and a small cap is cheap to reach on purpose).
pub(super) const DEFAULT_LIMIT: usize = 10_000;

/// Changes a watcher may have queued and not yet sent before the fake closes it.
const WATCHER_QUEUE: usize = 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One change: the object as it became (for a deletion, as it was, with the deletion's
/// resourceVersion) and as it was before.
pub(super) struct Change {
    pub rv: u64,
    pub kind: ChangeKind,
    pub key: Key,
    pub object: Value,
    pub prev: Option<Value>,
}

/// What a list or a watch covers: one resource, in one namespace or all.
#[derive(Clone, Debug)]
pub(super) struct Target {
    pub group: String,
    pub resource: String,
    pub namespace: Option<String>,
}

impl Target {
    pub(super) fn covers(&self, key: &Key) -> bool {
        key.0 == self.group && key.1 == self.resource && self.namespace.as_ref().is_none_or(|ns| *ns == key.2)
    }

    fn is_pods(&self) -> bool {
        self.group.is_empty() && self.resource == "pods"
    }
}

/// An open watch's queue of the changes it covers.
struct Watcher {
    target: Target,
    changes: mpsc::Sender<Arc<Change>>,
}

pub(super) struct History {
    changes: VecDeque<Arc<Change>>,
    /// The resourceVersion up to which changes are forgotten (0: none is).
    floor: u64,
    limit: usize,
    watchers: Vec<Watcher>,
}

impl Default for History {
    fn default() -> Self {
        Self { changes: VecDeque::new(), floor: 0, limit: DEFAULT_LIMIT, watchers: Vec::new() }
    }
}

/// A resourceVersion older than what the history keeps: (the one asked for, the floor).
#[derive(Debug, Clone, Copy)]
pub(super) struct TooOld(pub u64, pub u64);

impl History {
    /// Keeps the change and queues it for the watchers it concerns. A watcher whose queue is full
    /// (its client stopped reading) is dropped: its stream ends once it sent what it has.
    fn record(&mut self, change: Change) {
        let change = Arc::new(change);
        self.watchers.retain(|w| !w.target.covers(&change.key) || w.changes.try_send(change.clone()).is_ok());
        self.changes.push_back(change);
        self.trim();
    }

    fn trim(&mut self) {
        while self.changes.len() > self.limit {
            if let Some(oldest) = self.changes.pop_front() {
                self.floor = self.floor.max(oldest.rv);
            }
        }
    }

    /// The changes after `rv`, oldest first.
    pub(super) fn since(&self, rv: u64) -> Result<impl Iterator<Item = &Arc<Change>>, TooOld> {
        if rv < self.floor {
            return Err(TooOld(rv, self.floor));
        }
        let first = self.changes.partition_point(|c| c.rv <= rv);
        Ok(self.changes.range(first..))
    }

    /// Starts queueing the changes `target` covers for a new watch (under the same lock as its
    /// replay, so it neither misses nor repeats one).
    pub(super) fn subscribe(&mut self, target: Target) -> mpsc::Receiver<Arc<Change>> {
        let (changes, receiver) = mpsc::channel(WATCHER_QUEUE);
        self.watchers.retain(|w| !w.changes.is_closed());
        self.watchers.push(Watcher { target, changes });
        receiver
    }
}

fn object_rv(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

impl Inner {
    /// Records a change made under this lock; `object` already carries the change's
    /// resourceVersion.
    pub(super) fn record(&mut self, kind: ChangeKind, key: Key, object: &Value, prev: Option<Value>) {
        let rv = object_rv(object);
        self.history.record(Change { rv, kind, key, object: object.clone(), prev });
    }

    /// The objects `target` covers now, in (namespace, name) order.
    pub(super) fn current(&self, target: &Target) -> BTreeMap<Key, Value> {
        if target.is_pods() {
            return self
                .pods
                .iter()
                .filter(|((ns, _), _)| target.namespace.as_ref().is_none_or(|n| n == ns))
                .map(|((ns, name), pod)| ((String::new(), "pods".to_owned(), ns.clone(), name.clone()), pod.clone()))
                .collect();
        }
        let from: Key = (target.group.clone(), target.resource.clone(), String::new(), String::new());
        self.objects
            .range(from..)
            .take_while(|((g, r, _, _), _)| *g == target.group && *r == target.resource)
            .filter(|(key, _)| target.covers(key))
            .map(|(key, object)| (key.clone(), object.clone()))
            .collect()
    }

    /// The objects `target` covered at resourceVersion `rv` (no later than now): the current ones
    /// with every later change undone, newest first.
    pub(super) fn at(&self, target: &Target, rv: u64) -> Result<BTreeMap<Key, Value>, TooOld> {
        let mut objects = self.current(target);
        let later: Vec<&Arc<Change>> = self.history.since(rv)?.filter(|c| target.covers(&c.key)).collect();
        for change in later.into_iter().rev() {
            match (&change.kind, &change.prev) {
                (ChangeKind::Added, _) | (_, None) => objects.remove(&change.key),
                (_, Some(prev)) => objects.insert(change.key.clone(), prev.clone()),
            };
        }
        Ok(objects)
    }
}

impl FakeKube {
    /// Forgets every change up to the current resourceVersion, as etcd's compaction does: a watch
    /// or a paginated list from an older resourceVersion is then `410 Gone` (`Expired`), and the
    /// client has to list again. Open watches go on.
    pub fn compact_history(&self) {
        let mut inner = self.lock();
        let now = inner.resource_version;
        let history = &mut inner.history;
        history.changes.clear();
        history.floor = history.floor.max(now);
    }

    /// How many changes the history keeps (10,000 unless set); beyond that the oldest are
    /// forgotten, as if compacted.
    pub fn set_history_limit(&self, limit: usize) {
        let mut inner = self.lock();
        inner.history.limit = limit;
        inner.history.trim();
    }

    /// The resourceVersion of the last change (the one a list answers now).
    pub fn resource_version(&self) -> u64 {
        self.lock().resource_version
    }
}
