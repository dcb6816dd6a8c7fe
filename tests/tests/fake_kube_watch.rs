//! The fake API server's lists and watches behave as the real API server's, for pods and for
//! the kinds of the generic store alike (what an informer built on `kube::runtime::watcher`
//! relies on): the initial state of a watch without a resourceVersion, 410 Gone once the
//! history is compacted, bookmarks, `timeoutSeconds`, DELETED events with their own
//! resourceVersion, selectors, pagination; and `kube::runtime::watcher` itself against the fake.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use kas_e2e::{FakeKube, eventually};
use serde_json::{Value, json};

/// Raw HTTP to the fake, with its token.
struct Http {
    client: reqwest::Client,
    base: String,
    token: String,
}

impl Http {
    fn new(fake: &FakeKube) -> Self {
        Self { client: reqwest::Client::new(), base: fake.url(), token: fake.token().to_owned() }
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let code = response.status().as_u16();
        let text = response.text().await.unwrap();
        (code, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}")))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    /// A successful GET.
    async fn ok(&self, path: &str) -> Value {
        let (code, body) = self.get(path).await;
        assert_eq!(code, 200, "GET {path}: {body}");
        body
    }

    async fn watch(&self, path: &str) -> Watch {
        let response = self.client.get(format!("{}{path}", self.base)).bearer_auth(&self.token).send().await.unwrap();
        assert_eq!(response.status(), 200, "GET {path}");
        Watch { response, buffer: Vec::new() }
    }
}

/// A watch response read event by event.
struct Watch {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Watch {
    /// The next event, or None once the response ended; fails after 10 s without one.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.response.chunk()).await;
            match chunk.expect("a watch event within 10s").unwrap() {
                Some(bytes) => self.buffer.extend_from_slice(&bytes),
                None => {
                    assert!(self.buffer.is_empty(), "a partial event at the end");
                    return None;
                }
            }
        }
    }

    /// The next event that is not a bookmark.
    async fn change(&mut self) -> Value {
        loop {
            let event = self.next().await.expect("the watch ended");
            if event["type"] != "BOOKMARK" {
                return event;
            }
        }
    }
}

/// (type, name) of an event.
fn summary(event: &Value) -> (String, String) {
    (
        event["type"].as_str().unwrap_or_default().to_owned(),
        event["object"]["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
    )
}

fn typed(kind: &str, name: &str) -> (String, String) {
    (kind.to_owned(), name.to_owned())
}

fn rv_of(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
}

fn names(list: &Value) -> Vec<String> {
    list["items"].as_array().unwrap().iter().map(|o| o["metadata"]["name"].as_str().unwrap().to_owned()).collect()
}

/// A kind the fake serves, driven through the fake's own methods (as a controller or kubelet
/// would change it).
#[derive(Clone, Copy, Debug)]
enum Kind {
    Pods,
    ConfigMaps,
}

const KINDS: [Kind; 2] = [Kind::Pods, Kind::ConfigMaps];

impl Kind {
    fn path(self, ns: Option<&str>) -> String {
        let plural = match self {
            Kind::Pods => "pods",
            Kind::ConfigMaps => "configmaps",
        };
        match ns {
            Some(ns) => format!("/api/v1/namespaces/{ns}/{plural}"),
            None => format!("/api/v1/{plural}"),
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Kind::Pods => "Pod",
            Kind::ConfigMaps => "ConfigMap",
        }
    }

    /// Creates or updates the object with these labels; returns its resourceVersion.
    fn put(self, fake: &FakeKube, ns: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self {
            Kind::Pods => rv_of(&fake.put_pod(ns, name, "Running", true, labels)),
            Kind::ConfigMaps => {
                fake.add_namespace(ns);
                let labels: serde_json::Map<String, Value> =
                    labels.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
                let object =
                    json!({"metadata": {"name": name, "namespace": ns, "labels": labels}, "data": {"k": name}});
                rv_of(&fake.put_object("v1/configmaps", object).unwrap())
            }
        }
    }

    fn delete(self, fake: &FakeKube, ns: &str, name: &str) {
        let deleted = match self {
            Kind::Pods => fake.delete_pod(ns, name),
            Kind::ConfigMaps => fake.delete_object("v1/configmaps", ns, name),
        };
        assert!(deleted, "{self:?} {ns}/{name} existed");
    }
}

#[tokio::test]
async fn a_watch_without_a_resource_version_starts_with_the_selected_state() {
    let fake = FakeKube::start().await;
    let http = Http::new(&fake);
    for kind in KINDS {
        kind.put(&fake, "team", "web-1", &[("app", "web")]);
        kind.put(&fake, "team", "db-1", &[("app", "db")]);
        kind.put(&fake, "other", "web-2", &[("app", "web")]);
        for start in ["", "&resourceVersion=0"] {
            let path = format!("{}?watch=true&labelSelector=app%3Dweb{start}", kind.path(Some("team")));
            let mut watch = http.watch(&path).await;
            let first = watch.next().await.unwrap();
            assert_eq!(summary(&first), typed("ADDED", "web-1"), "{kind:?} {start}: the state first: {first}");
            assert_eq!(first["object"]["kind"], kind.kind());
            assert_eq!(first["object"]["apiVersion"], "v1");
            // Then the changes, and only those selected.
            kind.put(&fake, "team", "db-2", &[("app", "db")]);
            kind.put(&fake, "other", "web-3", &[("app", "web")]);
            let rv = kind.put(&fake, "team", "web-4", &[("app", "web")]);
            let next = watch.next().await.unwrap();
            assert_eq!(summary(&next), typed("ADDED", "web-4"), "{kind:?} {start}");
            assert_eq!(rv_of(&next["object"]), rv);
            kind.delete(&fake, "team", "web-4");
        }
        // Across namespaces, every selected object, in (namespace, name) order.
        let mut watch = http.watch(&format!("{}?watch=1&labelSelector=app%3Dweb", kind.path(None))).await;
        let (a, b) = (watch.next().await.unwrap(), watch.next().await.unwrap());
        assert_eq!([summary(&a), summary(&b)], [typed("ADDED", "web-2"), typed("ADDED", "web-3")]);
        let c = watch.next().await.unwrap();
        assert_eq!(summary(&c), typed("ADDED", "web-1"));
    }
}

#[tokio::test]
async fn a_watch_from_a_resource_version_gets_every_change_after_it() {
    let fake = FakeKube::start().await;
    let http = Http::new(&fake);
    for kind in KINDS {
        kind.put(&fake, "team", "before", &[]);
        let list = http.ok(&kind.path(Some("team"))).await;
        let rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
        kind.put(&fake, "team", "after", &[]);
        kind.put(&fake, "team", "before", &[("changed", "yes")]);
        kind.delete(&fake, "team", "after");
        let mut watch = http.watch(&format!("{}?watch=true&resourceVersion={rv}", kind.path(Some("team")))).await;
        let mut seen = Vec::new();
        let mut last = rv.parse::<u64>().unwrap();
        for _ in 0..3 {
            let event = watch.next().await.unwrap();
            let event_rv = rv_of(&event["object"]);
            assert!(event_rv > last, "{kind:?}: resourceVersions go up: {event}");
            last = event_rv;
            seen.push(summary(&event));
        }
        assert_eq!(seen, [typed("ADDED", "after"), typed("MODIFIED", "before"), typed("DELETED", "after")]);
        assert_eq!(last, fake.resource_version());
    }
}

#[tokio::test]
async fn a_watch_from_a_forgotten_resource_version_is_410_expired_and_ends() {
    let fake = FakeKube::start().await;
    let http = Http::new(&fake);
    for kind in KINDS {
        let old = kind.put(&fake, "team", "a", &[]);
        kind.put(&fake, "team", "b", &[]);
        fake.compact_history();
        let now = fake.resource_version();
        let mut watch = http.watch(&format!("{}?watch=true&resourceVersion={old}", kind.path(Some("team")))).await;
        let error = watch.next().await.unwrap();
        assert_eq!(error["type"], "ERROR", "{error}");
        let status = &error["object"];
        assert_eq!((status["kind"].as_str(), status["status"].as_str()), (Some("Status"), Some("Failure")));
        assert_eq!((status["code"].as_u64(), status["reason"].as_str()), (Some(410), Some("Expired")));
        assert_eq!(status["message"], format!("too old resource version: {old} ({now})"));
        assert!(watch.next().await.is_none(), "the stream ends after the error");

        // From the compaction's resourceVersion on, nothing is missing: the watch works.
        let mut watch = http.watch(&format!("{}?watch=true&resourceVersion={now}", kind.path(Some("team")))).await;
        kind.put(&fake, "team", "c", &[]);
        assert_eq!(summary(&watch.next().await.unwrap()), typed("ADDED", "c"));
    }
    // The cap: beyond it the oldest changes are forgotten.
    fake.set_history_limit(3);
    let first = Kind::Pods.put(&fake, "team", "x", &[]);
    for i in 0..3 {
        Kind::Pods.put(&fake, "team", "x", &[("i", &i.to_string())]);
    }
    let mut watch = http.watch(&format!("/api/v1/pods?watch=true&resourceVersion={}", first - 1)).await;
    let error = watch.next().await.unwrap();
    assert_eq!(error["object"]["code"], 410, "{error}");
    assert_eq!(error["object"]["message"], format!("too old resource version: {} ({first})", first - 1));
    // The three last changes are kept: a watch from just before them sees them all.
    let mut watch = http.watch(&format!("/api/v1/pods?watch=true&resourceVersion={first}")).await;
    for _ in 0..3 {
        assert_eq!(summary(&watch.next().await.unwrap()), typed("MODIFIED", "x"));
    }
}

#[tokio::test]
async fn bookmarks_carry_the_current_resource_version_and_only_come_when_allowed() {
    let fake = FakeKube::start().await;
    fake.set_bookmark_interval(Duration::from_millis(50));
    let http = Http::new(&fake);
    for kind in KINDS {
        kind.put(&fake, "team", "a", &[]);
        let path = kind.path(Some("team"));
        let mut plain = http.watch(&format!("{path}?watch=true&resourceVersion={}", fake.resource_version())).await;
        let mut with = http
            .watch(&format!("{path}?watch=true&allowWatchBookmarks=true&resourceVersion={}", fake.resource_version()))
            .await;
        // A change elsewhere moves the resourceVersion; the bookmark says so.
        Kind::ConfigMaps.put(&fake, "elsewhere", "unrelated", &[("n", &format!("{kind:?}"))]);
        let now = fake.resource_version();
        let mut bookmarks = 0;
        while bookmarks < 3 {
            let event = with.next().await.unwrap();
            assert_eq!(event["type"], "BOOKMARK", "{kind:?}: nothing else happened here: {event}");
            let object = &event["object"];
            assert_eq!((object["kind"].as_str(), object["apiVersion"].as_str()), (Some(kind.kind()), Some("v1")));
            assert_eq!(object["metadata"].as_object().unwrap().keys().collect::<Vec<_>>(), ["resourceVersion"]);
            let rv = rv_of(object);
            assert!(rv <= now, "{kind:?}: never ahead of the fake");
            if rv == now {
                bookmarks += 1;
            }
        }
        // Meanwhile (three bookmark periods at least), the watch without the parameter got
        // nothing: its next event is the next change.
        kind.put(&fake, "team", "b", &[]);
        assert_eq!(summary(&plain.next().await.unwrap()), typed("ADDED", "b"));
        assert_eq!(summary(&with.change().await), typed("ADDED", "b"));
    }
}

#[tokio::test]
async fn a_streaming_list_ends_its_initial_state_with_an_annotated_bookmark() {
    let fake = FakeKube::start().await;
    let http = Http::new(&fake);
    for kind in KINDS {
        kind.put(&fake, "team", "a", &[]);
        let path = kind.path(Some("team"));
        let streaming = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
        let mut watch = http.watch(&format!("{path}?{streaming}")).await;
        assert_eq!(summary(&watch.next().await.unwrap()), typed("ADDED", "a"));
        let end = watch.next().await.unwrap();
        assert_eq!(end["type"], "BOOKMARK", "{end}");
        assert_eq!(end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
        assert_eq!(rv_of(&end["object"]), fake.resource_version());
        kind.put(&fake, "team", "b", &[]);
        assert_eq!(summary(&watch.change().await), typed("ADDED", "b"));

        let (code, status) = http.get(&format!("{path}?watch=true&sendInitialEvents=true")).await;
        assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")), "{status}");
        assert_eq!(
            status["message"],
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires \
             setting resourceVersionMatch to NotOlderThan"
        );
    }
}

#[tokio::test]
async fn timeout_seconds_ends_the_watch_cleanly_after_a_last_bookmark() {
    let fake = FakeKube::start().await;
    // Periodic bookmarks out of the way: the one before the timeout still comes.
    fake.set_bookmark_interval(Duration::from_secs(3600));
    let http = Http::new(&fake);
    for kind in KINDS {
        kind.put(&fake, "team", "a", &[]);
        let started = tokio::time::Instant::now();
        let path = format!("{}?watch=true&timeoutSeconds=1&allowWatchBookmarks=true", kind.path(Some("team")));
        let mut watch = http.watch(&path).await;
        assert_eq!(summary(&watch.next().await.unwrap()), typed("ADDED", "a"));
        let bookmark = watch.next().await.unwrap();
        assert_eq!(bookmark["type"], "BOOKMARK", "{bookmark}");
        assert_eq!(rv_of(&bookmark["object"]), fake.resource_version());
        assert!(watch.next().await.is_none(), "{kind:?}: the watch ended");
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(5), "{elapsed:?}");
    }
}

#[tokio::test]
async fn ending_watches_ends_the_open_ones_cleanly() {
    let fake = FakeKube::start().await;
    let http = Http::new(&fake);
    let mut pods = http.watch("/api/v1/pods?watch=true&resourceVersion=1").await;
    let mut configmaps = http.watch("/api/v1/configmaps?watch=true&resourceVersion=1").await;
    fake.end_watches();
    assert!(pods.next().await.is_none());
    assert!(configmaps.next().await.is_none());
    // New watches are not affected.
    let mut again = http.watch(&format!("/api/v1/pods?watch=true&resourceVersion={}", fake.resource_version())).await;
    fake.add_pod("default", "p");
    assert_eq!(summary(&again.next().await.unwrap()), typed("ADDED", "p"));
}

/// Every DELETED event from a watch started at `rv`, with the resourceVersions strictly going up
/// across all events and every DELETED one new (after `rv`).
async fn deletions_after(watch: &mut Watch, rv: u64, count: usize) -> Vec<(String, u64)> {
    let mut deleted = Vec::new();
    let mut last = rv;
    while deleted.len() < count {
        let event = watch.change().await;
        let event_rv = rv_of(&event["object"]);
        assert!(event_rv > last, "resourceVersions go up: {event}");
        last = event_rv;
        if event["type"] == "DELETED" {
            deleted.push((event["object"]["metadata"]["name"].as_str().unwrap().to_owned(), event_rv));
        }
    }
    deleted
}

#[tokio::test]
async fn deletions_get_their_own_resource_version_and_a_watch_from_before_them_sees_them() {
    let fake = FakeKube::start().await;
    let http = Http::new(&fake);
    fake.add_namespace("team");
    // Pods: by the fake (as the kubelet), by a DELETE, and by deleting their namespace.
    for name in ["p1", "p2", "p3"] {
        fake.add_pod("team", name);
    }
    let list = http.ok("/api/v1/namespaces/team/pods").await;
    let listed: u64 = list["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    fake.delete_pod("team", "p1");
    let (code, answer) = http.send(reqwest::Method::DELETE, "/api/v1/namespaces/team/pods/p2", None).await;
    assert_eq!(code, 200);
    assert!(rv_of(&answer) > listed, "the DELETE answers the deletion's resourceVersion: {answer}");
    // Store objects: a DELETE, the garbage collector's (an owned configmap), deletecollection.
    let create = |name: &str, owner: Option<&Value>| {
        let mut object = json!({"metadata": {"name": name, "namespace": "team", "labels": {"set": "x"}}});
        if let Some(owner) = owner {
            object["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            }]);
            object["metadata"]["labels"] = json!({});
        }
        fake.put_object("v1/configmaps", object).unwrap()
    };
    let owner = create("owner", None);
    create("owned", Some(&owner));
    create("c1", None);
    create("c2", None);
    let list = http.ok("/api/v1/namespaces/team/configmaps").await;
    let configmaps_listed: u64 = list["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    let (code, _) = http.send(reqwest::Method::DELETE, "/api/v1/namespaces/team/configmaps/owner", None).await;
    assert_eq!(code, 200);
    let (code, _) =
        http.send(reqwest::Method::DELETE, "/api/v1/namespaces/team/configmaps?labelSelector=set%3Dx", None).await;
    assert_eq!(code, 200);
    // What is left goes with the namespace.
    create("c3", None);
    let (code, _) = http.send(reqwest::Method::DELETE, "/api/v1/namespaces/team", None).await;
    assert_eq!(code, 200);

    let mut pods = http.watch(&format!("/api/v1/namespaces/team/pods?watch=true&resourceVersion={listed}")).await;
    let deleted = deletions_after(&mut pods, listed, 3).await;
    assert_eq!(deleted.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["p1", "p2", "p3"]);
    let mut configmaps =
        http.watch(&format!("/api/v1/namespaces/team/configmaps?watch=true&resourceVersion={configmaps_listed}")).await;
    let deleted = deletions_after(&mut configmaps, configmaps_listed, 5).await;
    assert_eq!(
        deleted.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["owner", "owned", "c1", "c2", "c3"],
        "a DELETE, the garbage collector, deletecollection, the namespace"
    );
    let (_, last) = deleted.last().unwrap();
    let namespace_gone = fake.resource_version();
    assert!(*last < namespace_gone, "the namespace itself went last");
}

#[tokio::test]
async fn selectors_apply_to_lists_and_watches_and_an_object_leaving_them_is_deleted_for_the_watch() {
    let fake = FakeKube::start().await;
    let http = Http::new(&fake);
    for kind in KINDS {
        kind.put(&fake, "team", "web-1", &[("app", "web"), ("tier", "front")]);
        kind.put(&fake, "team", "web-2", &[("app", "web")]);
        kind.put(&fake, "team", "db-1", &[("app", "db")]);
        let path = kind.path(Some("team"));
        let list = http.ok(&format!("{path}?labelSelector=app%3Dweb,tier")).await;
        assert_eq!(names(&list), ["web-1"], "{kind:?}");
        let list = http.ok(&format!("{path}?labelSelector=app%20in%20(web,db),!tier")).await;
        assert_eq!(names(&list), ["db-1", "web-2"], "{kind:?}");
        let list = http.ok(&format!("{path}?fieldSelector=metadata.name%3Dweb-2")).await;
        assert_eq!(names(&list), ["web-2"], "{kind:?}");
        let list = http.ok(&format!("{}?fieldSelector=metadata.namespace!%3Dteam", kind.path(None))).await;
        assert!(names(&list).is_empty(), "{kind:?}: {list}");

        let (code, status) = http.get(&format!("{path}?fieldSelector=spec.color%3Dred")).await;
        assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")), "{status}");
        assert!(status["message"].as_str().unwrap().ends_with("field label not supported: spec.color"), "{status}");

        // A watch sees an object come into its selection as ADDED, change as MODIFIED, leave as
        // DELETED (at the change's resourceVersion).
        let mut watch = http.watch(&format!("{path}?watch=true&labelSelector=app%3Dweb")).await;
        let mut state = vec![summary(&watch.next().await.unwrap()), summary(&watch.next().await.unwrap())];
        state.sort();
        assert_eq!(state, [typed("ADDED", "web-1"), typed("ADDED", "web-2")]);
        kind.put(&fake, "team", "db-1", &[("app", "web")]);
        assert_eq!(summary(&watch.next().await.unwrap()), typed("ADDED", "db-1"));
        kind.put(&fake, "team", "db-1", &[("app", "web"), ("x", "y")]);
        assert_eq!(summary(&watch.next().await.unwrap()), typed("MODIFIED", "db-1"));
        let left = kind.put(&fake, "team", "web-2", &[("app", "api")]);
        let gone = watch.next().await.unwrap();
        assert_eq!(summary(&gone), typed("DELETED", "web-2"));
        assert_eq!(rv_of(&gone["object"]), left);
        assert_eq!(gone["object"]["metadata"]["labels"]["app"], "web", "as the watch last saw it");
    }

    // Pods' own fields: status.phase, spec.nodeName; in lists and watches.
    let (code, _) = http
        .send(
            reqwest::Method::POST,
            "/api/v1/namespaces/team/pods",
            Some(json!({"metadata": {"name": "scheduled"}, "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]}})),
        )
        .await;
    assert_eq!(code, 201);
    let list = http.ok("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1").await;
    assert_eq!(names(&list), ["scheduled"]);
    let list = http.ok("/api/v1/pods?fieldSelector=spec.nodeName%3D,status.phase%3DRunning").await;
    assert_eq!(names(&list), ["db-1", "web-1", "web-2"], "unscheduled and running");
    let list = http.ok("/api/v1/pods?fieldSelector=status.phase!%3DRunning").await;
    assert_eq!(names(&list), ["scheduled"], "Pending");
    let mut running = http.watch("/api/v1/namespaces/team/pods?watch=true&fieldSelector=status.phase%3DRunning").await;
    for _ in 0..3 {
        running.next().await.unwrap();
    }
    fake.put_pod("team", "web-1", "Succeeded", false, &[("app", "web")]);
    assert_eq!(summary(&running.next().await.unwrap()), typed("DELETED", "web-1"));
    fake.put_pod("team", "scheduled", "Running", true, &[]);
    assert_eq!(summary(&running.next().await.unwrap()), typed("ADDED", "scheduled"));
    // A field pods have is not one configmaps or namespaces have; metadata.namespace is not a
    // cluster-scoped kind's.
    let (code, _) = http.get("/api/v1/configmaps?fieldSelector=status.phase%3DRunning").await;
    assert_eq!(code, 400);
    let (code, _) = http.get("/api/v1/namespaces?fieldSelector=metadata.namespace%3Dx").await;
    assert_eq!(code, 400);
    let list = http.ok("/api/v1/namespaces?fieldSelector=status.phase%3DActive,metadata.name%3Dteam").await;
    assert_eq!(names(&list), ["team"]);
}

/// Every page of a paginated list: (items' names, each page's metadata).
async fn pages(http: &Http, path: &str, limit: usize, between: impl Fn(usize)) -> (Vec<String>, Vec<Value>) {
    let separator = if path.contains('?') { '&' } else { '?' };
    let mut all = Vec::new();
    let mut metadata = Vec::new();
    let mut token: Option<String> = None;
    for page in 0.. {
        let path = match &token {
            None => format!("{path}{separator}limit={limit}"),
            Some(t) => format!("{path}{separator}limit={limit}&continue={t}"),
        };
        let list = http.ok(&path).await;
        let items = names(&list);
        assert!(items.len() <= limit, "{list}");
        all.extend(items);
        metadata.push(list["metadata"].clone());
        between(page);
        match list["metadata"]["continue"].as_str() {
            Some(t) => token = Some(t.to_owned()),
            None => break,
        }
    }
    (all, metadata)
}

#[tokio::test]
async fn lists_paginate_at_the_first_pages_resource_version_in_namespace_and_name_order() {
    let fake = FakeKube::start().await;
    let http = Http::new(&fake);
    for kind in KINDS {
        for (ns, name) in [("b", "x"), ("a", "z"), ("a", "y"), ("b", "w"), ("a", "x")] {
            kind.put(&fake, ns, name, &[("n", name)]);
        }
        let before = fake.resource_version();
        // Between pages, objects come, change and go: the later pages still show the state the
        // first one was read at.
        let (all, metadata) = pages(&http, &kind.path(None), 2, |page| {
            if page == 0 {
                kind.delete(&fake, "b", "w");
                kind.put(&fake, "a", "zz", &[]);
                kind.put(&fake, "b", "x", &[("n", "changed")]);
            }
        })
        .await;
        assert_eq!(all, ["x", "y", "z", "w", "x"], "{kind:?}: (namespace, name) order, as at the first page");
        assert_eq!(metadata.len(), 3);
        for m in &metadata {
            assert_eq!(m["resourceVersion"], before.to_string(), "{kind:?}: every page at the first one's");
        }
        assert_eq!(metadata[0]["remainingItemCount"], 3);
        assert_eq!(metadata[1]["remainingItemCount"], 1);
        assert!(metadata[2].get("continue").is_none() && metadata[2].get("remainingItemCount").is_none());
        // The last page's items as they were: b/x unchanged.
        let list = http
            .ok(&format!("{}?limit=1&continue={}", kind.path(None), metadata[1]["continue"].as_str().unwrap()))
            .await;
        assert_eq!(list["items"][0]["metadata"]["labels"]["n"], "x", "{list}");
        assert!(list["items"][0].get("kind").is_none(), "typed list items carry no kind");

        // With a selector: at most `limit` selected items per page, no remainingItemCount.
        let (all, metadata) = pages(&http, &format!("{}?labelSelector=n", kind.path(Some("a"))), 1, |_| {}).await;
        assert_eq!(all, ["x", "y", "z"]);
        assert!(metadata.iter().all(|m| m.get("remainingItemCount").is_none()));
    }
}

#[tokio::test]
async fn a_list_continue_token_and_resource_versions_are_checked_as_the_api_server_checks_them() {
    let fake = FakeKube::start().await;
    let http = Http::new(&fake);
    for name in ["a", "b", "c"] {
        fake.add_pod("default", name);
    }
    let first = http.ok("/api/v1/pods?limit=1").await;
    let token = first["metadata"]["continue"].as_str().unwrap().to_owned();

    let (code, status) = http.get(&format!("/api/v1/pods?limit=1&continue={token}&resourceVersion=2")).await;
    assert_eq!(
        (code, status["message"].as_str()),
        (400, Some("specifying resource version is not allowed when using continue"))
    );
    let (code, status) = http.get("/api/v1/pods?limit=1&continue=garbage").await;
    assert_eq!(code, 400, "{status}");
    assert!(status["message"].as_str().unwrap().starts_with("continue key is not valid"), "{status}");
    let (code, status) = http.get("/api/v1/pods?resourceVersionMatch=Exact").await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")), "{status}");

    // Exact reads: the state at a resourceVersion the history reaches.
    let at = fake.resource_version();
    fake.delete_pod("default", "a");
    let list = http.ok(&format!("/api/v1/pods?resourceVersion={at}&resourceVersionMatch=Exact")).await;
    assert_eq!(names(&list), ["a", "b", "c"]);
    assert_eq!(list["metadata"]["resourceVersion"], at.to_string());
    let list = http.ok(&format!("/api/v1/pods?resourceVersion={at}&resourceVersionMatch=NotOlderThan")).await;
    assert_eq!(names(&list), ["b", "c"], "not older than: the current state");
    let (code, status) = http.get(&format!("/api/v1/pods?resourceVersion={}", at + 100)).await;
    assert_eq!((code, status["reason"].as_str()), (504, Some("Timeout")), "{status}");

    // Once compacted, the first page's resourceVersion is gone: 410 Expired, with a token for
    // the rest at the current state.
    fake.compact_history();
    let (code, status) = http.get(&format!("/api/v1/pods?limit=1&continue={token}")).await;
    assert_eq!((code, status["reason"].as_str()), (410, Some("Expired")), "{status}");
    assert!(status["message"].as_str().unwrap().starts_with("The provided continue parameter is too old"));
    let inconsistent = status["metadata"]["continue"].as_str().unwrap();
    let rest = http.ok(&format!("/api/v1/pods?limit=5&continue={inconsistent}")).await;
    assert_eq!(names(&rest), ["b", "c"], "after the first page's last item, as things are now");
    assert_eq!(rest["metadata"]["resourceVersion"], fake.resource_version().to_string());
    let (code, status) = http.get(&format!("/api/v1/pods?resourceVersion={at}&resourceVersionMatch=Exact")).await;
    assert_eq!((code, status["reason"].as_str()), (410, Some("Expired")), "{status}");
}

#[tokio::test]
async fn nodes_deployments_and_pods_with_a_status_for_the_informers_tests() {
    let fake = FakeKube::start().await;
    let http = Http::new(&fake);
    fake.put_node("node-1", true, &[("node-role.kubernetes.io/control-plane", "")]);
    fake.put_node("node-2", false, &[]);
    let nodes = http.ok("/api/v1/nodes").await;
    assert_eq!(nodes["kind"], "NodeList");
    assert_eq!(names(&nodes), ["node-1", "node-2"]);
    let ready = |node: &Value| {
        node["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap()["status"]
            .clone()
    };
    assert_eq!([ready(&nodes["items"][0]), ready(&nodes["items"][1])], [json!("True"), json!("False")]);
    let (_, node) = http.get("/api/v1/namespaces/default/nodes/node-1").await;
    assert_eq!(node["code"], 404, "nodes are cluster-scoped: {node}");

    let mut watch = http.watch(&format!("/api/v1/nodes?watch=true&resourceVersion={}", fake.resource_version())).await;
    fake.put_node("node-2", true, &[]);
    let event = watch.next().await.unwrap();
    assert_eq!(summary(&event), typed("MODIFIED", "node-2"));
    assert_eq!(ready(&event["object"]), "True");
    assert!(fake.delete_node("node-2"));
    assert_eq!(summary(&watch.next().await.unwrap()), typed("DELETED", "node-2"));

    fake.put_deployment("team", "web", 3, 1, &[("app", "web")]).unwrap();
    let deployment = http.ok("/apis/apps/v1/namespaces/team/deployments/web").await;
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(deployment["status"]["readyReplicas"], 1);
    fake.put_deployment("team", "web", 2, 0, &[("app", "web")]).unwrap();
    let deployment = http.ok("/apis/apps/v1/namespaces/team/deployments/web").await;
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert!(deployment["status"].get("readyReplicas").is_none(), "zero is left out: {}", deployment["status"]);
    assert!(fake.delete_deployment("team", "web"));

    let pod = fake.put_pod("team", "p", "Pending", false, &[("app", "web")]);
    assert_eq!(pod["status"]["phase"], "Pending");
    let pod = fake.put_pod("team", "p", "Running", true, &[("app", "web")]);
    let conditions = pod["status"]["conditions"].as_array().unwrap();
    assert!(conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"), "{pod}");
    let listed = http.ok("/api/v1/namespaces/team/pods?labelSelector=app%3Dweb").await;
    assert_eq!(listed["items"][0]["status"]["phase"], "Running");
}

mod runtime_watcher {
    //! `kube::runtime::watcher` (default config: pages of 500, bookmarks, a 290 s timeout)
    //! against the fake, reflected into a store as the informer cache will be.
    use super::*;
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::Api;
    use kube::runtime::reflector::{self, Store};
    use kube::runtime::{WatchStreamExt, watcher};
    use tokio::sync::mpsc;

    async fn client(fake: &FakeKube) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&fake.kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// What the watcher yields, in short.
    #[derive(Debug, PartialEq, Clone)]
    enum Seen {
        Init,
        InitApply(String),
        InitDone,
        Apply(String, String),
        Delete(String, u64),
        Error(u16),
        Other(String),
    }

    fn seen(event: Result<watcher::Event<Pod>, watcher::Error>) -> Seen {
        let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        match event {
            Ok(watcher::Event::Init) => Seen::Init,
            Ok(watcher::Event::InitApply(p)) => Seen::InitApply(name(&p)),
            Ok(watcher::Event::InitDone) => Seen::InitDone,
            Ok(watcher::Event::Apply(p)) => {
                let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                Seen::Apply(name(&p), phase)
            }
            Ok(watcher::Event::Delete(p)) => {
                let rv = p.metadata.resource_version.as_deref().unwrap_or_default().parse().unwrap_or(0);
                Seen::Delete(name(&p), rv)
            }
            Err(watcher::Error::WatchError(status)) => Seen::Error(status.code),
            Err(other) => Seen::Other(other.to_string()),
        }
    }

    async fn next(events: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
        tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("a watcher event within 10s")
            .expect("the watcher stopped")
    }

    fn cached(store: &Store<Pod>) -> Vec<String> {
        let mut names: Vec<String> =
            store.state().iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect();
        names.sort();
        names
    }

    /// Watch requests for pods the fake received so far.
    fn pod_watches(fake: &FakeKube) -> usize {
        fake.requests()
            .iter()
            .filter(|r| r.path == "/api/v1/namespaces/default/pods" && r.query.contains("watch=true"))
            .count()
    }

    #[tokio::test]
    async fn lists_then_watches_sees_a_delete_between_them_and_relists_after_410() {
        let fake = FakeKube::start().await;
        fake.set_bookmark_interval(Duration::from_millis(100));
        fake.put_pod("default", "a", "Running", true, &[]);
        let api: Api<Pod> = Api::namespaced(client(&fake).await, "default");
        let (store, writer) = reflector::store::<Pod>();
        let (tx, mut events) = mpsc::unbounded_channel();
        // The first watch waits until the test has deleted a pod after the list.
        fake.hold_watches(true);
        let stream = watcher(api, watcher::Config::default()).default_backoff().reflect(writer);
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if tx.send(seen(event)).is_err() {
                    return;
                }
            }
        });

        for expected in [Seen::Init, Seen::InitApply("a".into()), Seen::InitDone] {
            assert_eq!(next(&mut events).await, expected);
        }
        let list = fake.requests().into_iter().find(|r| r.path == "/api/v1/namespaces/default/pods").unwrap();
        assert!(list.query.contains("limit=500") && !list.query.contains("watch"), "a paginated list: {}", list.query);
        let listed = fake.resource_version();
        eventually!(pod_watches(&fake) == 1, "the watch from the list's resourceVersion is asked for");
        let watch = fake.requests().into_iter().rfind(|r| r.query.contains("watch=true")).unwrap();
        assert!(watch.query.contains(&format!("resourceVersion={listed}")), "{}", watch.query);
        assert!(watch.query.contains("allowWatchBookmarks=true") && watch.query.contains("timeoutSeconds=290"));
        // Between the list and the watch: a deletion and an addition.
        fake.delete_pod("default", "a");
        fake.put_pod("default", "b", "Pending", false, &[]);
        fake.hold_watches(false);
        let Seen::Delete(name, rv) = next(&mut events).await else { panic!("not the deletion") };
        assert_eq!(name, "a");
        assert!(rv > listed, "the deletion's own resourceVersion");
        assert_eq!(next(&mut events).await, Seen::Apply("b".into(), "Pending".into()));
        // A change.
        fake.put_pod("default", "b", "Running", true, &[]);
        assert_eq!(next(&mut events).await, Seen::Apply("b".into(), "Running".into()));
        assert_eq!(cached(&store), ["b"]);

        // The watch ends (an API server restart); while the next one waits, changes happen and
        // the history is compacted: the next watch is 410 Gone, and the watcher lists again.
        fake.hold_watches(true);
        fake.end_watches();
        eventually!(pod_watches(&fake) == 2, "the watcher watches again");
        let lists_before = fake.requests().iter().filter(|r| !r.query.contains("watch")).count();
        fake.delete_pod("default", "b");
        fake.put_pod("default", "c", "Running", true, &[]);
        fake.compact_history();
        fake.hold_watches(false);
        assert_eq!(next(&mut events).await, Seen::Error(410));
        for expected in [Seen::Init, Seen::InitApply("c".into()), Seen::InitDone] {
            assert_eq!(next(&mut events).await, expected);
        }
        assert!(fake.requests().iter().filter(|r| !r.query.contains("watch")).count() > lists_before, "a new list");
        assert_eq!(cached(&store), ["c"], "the relist replaced the cache: b is gone");

        // And it watches on.
        fake.put_pod("default", "d", "Running", true, &[]);
        assert_eq!(next(&mut events).await, Seen::Apply("d".into(), "Running".into()));
        assert_eq!(cached(&store), ["c", "d"]);
        task.abort();
    }
}
