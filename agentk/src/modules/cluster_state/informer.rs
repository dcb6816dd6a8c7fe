//! One informer per resource and namespace: kube-rs's watcher (a list, then a watch from its
//! resourceVersion, resumed after a dropped connection, a new list after 410 Gone, backoff on
//! errors), turned into views for the pusher.

use std::time::Duration;

use futures::StreamExt;
use kas_proto::cluster_state::{ObjectView, ResourceKey};
use kas_proto::tunnel::pb::ObservedResource;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::view::view;
use crate::backoff::Backoff;

/// What informers tell the pusher.
#[derive(Debug)]
pub enum Observation {
    /// A full listing of the resource in `namespace` (all namespaces when `None`) ended: it
    /// replaces what was known there.
    Listed {
        key: ResourceKey,
        kind: String,
        namespaced: bool,
        namespace: Option<String>,
        objects: Vec<ObjectView>,
    },
    Upsert {
        key: ResourceKey,
        object: ObjectView,
    },
    Delete {
        key: ResourceKey,
        namespace: String,
        name: String,
    },
    /// The resource cannot be resolved, listed or watched now.
    Failing {
        key: ResourceKey,
        error: String,
    },
}

/// Discovery is retried this often while a resource is not served (a CRD not installed yet).
const DISCOVERY_RETRY_BASE: Duration = Duration::from_secs(1);
const DISCOVERY_RETRY_CAP: Duration = Duration::from_secs(60);

pub fn key(r: &ObservedResource) -> ResourceKey {
    ResourceKey { group: r.group.clone(), version: r.version.clone(), resource: r.resource.clone() }
}

/// How the API server serves the resource: its kind and scope, from the group version's
/// APIResourceList.
async fn resolve(client: &kube::Client, r: &ObservedResource) -> Result<(ApiResource, bool), String> {
    let list = if r.group.is_empty() {
        client.list_core_api_resources(&r.version).await
    } else {
        client.list_api_group_resources(&format!("{}/{}", r.group, r.version)).await
    };
    let list =
        list.map_err(|e| format!("discovery of {}: {}", describe(r), crate::modules::gitops::apply::describe(&e)))?;
    let found = list
        .resources
        .iter()
        .find(|a| a.name == r.resource)
        .ok_or_else(|| format!("the API server does not serve {}", describe(r)))?;
    let api_version = if r.group.is_empty() { r.version.clone() } else { format!("{}/{}", r.group, r.version) };
    let ar = ApiResource {
        group: r.group.clone(),
        version: r.version.clone(),
        api_version,
        kind: found.kind.clone(),
        plural: r.resource.clone(),
    };
    Ok((ar, found.namespaced))
}

/// `pods`, `deployments.apps/v1`.
fn describe(r: &ObservedResource) -> String {
    if r.group.is_empty() {
        format!("{}/{}", r.resource, r.version)
    } else {
        format!("{}.{}/{}", r.resource, r.group, r.version)
    }
}

/// Runs the informers of one resource (one per listed namespace, or one for all) until `stop`.
pub async fn run(
    client: kube::Client,
    resource: ObservedResource,
    to_pusher: mpsc::Sender<Observation>,
    stop: CancellationToken,
) {
    let key = key(&resource);
    let mut backoff = Backoff::new(DISCOVERY_RETRY_BASE, DISCOVERY_RETRY_CAP);
    let (ar, namespaced) = loop {
        match resolve(&client, &resource).await {
            Ok(found) => break found,
            Err(error) => {
                tracing::warn!(resource = %describe(&resource), %error, "cannot observe the resource; retrying");
                if to_pusher.send(Observation::Failing { key: key.clone(), error }).await.is_err() {
                    return;
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff.next_delay().max(DISCOVERY_RETRY_BASE)) => {}
        }
    };
    if !namespaced && !resource.namespaces.is_empty() {
        let error = format!("{} is cluster-scoped: namespaces do not apply", describe(&resource));
        let _ = to_pusher.send(Observation::Failing { key, error }).await;
        return;
    }
    let namespaces: Vec<Option<String>> = if resource.namespaces.is_empty() {
        vec![None]
    } else {
        resource.namespaces.iter().cloned().map(Some).collect()
    };
    let informers = namespaces.into_iter().map(|namespace| {
        let api = match &namespace {
            Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar),
            None => Api::<DynamicObject>::all_with(client.clone(), &ar),
        };
        inform(api, key.clone(), ar.kind.clone(), namespaced, namespace, to_pusher.clone())
    });
    tokio::select! {
        () = stop.cancelled() => {}
        _ = futures::future::join_all(informers) => {}
    }
}

/// One watcher: its events as observations, until the pusher goes away.
async fn inform(
    api: Api<DynamicObject>,
    key: ResourceKey,
    kind: String,
    namespaced: bool,
    namespace: Option<String>,
    to_pusher: mpsc::Sender<Observation>,
) {
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    tokio::pin!(stream);
    let mut listing: Vec<ObjectView> = Vec::new();
    let mut last_error = String::new();
    while let Some(event) = stream.next().await {
        let observation = match event {
            Ok(watcher::Event::Init) => {
                listing.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(object)) => {
                listing.push(view(&kind, &object));
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                last_error.clear();
                Observation::Listed {
                    key: key.clone(),
                    kind: kind.clone(),
                    namespaced,
                    namespace: namespace.clone(),
                    objects: std::mem::take(&mut listing),
                }
            }
            Ok(watcher::Event::Apply(object)) => Observation::Upsert { key: key.clone(), object: view(&kind, &object) },
            Ok(watcher::Event::Delete(object)) => Observation::Delete {
                key: key.clone(),
                namespace: object.metadata.namespace.clone().unwrap_or_default(),
                name: object.metadata.name.clone().unwrap_or_default(),
            },
            Err(e) => {
                let error = e.to_string();
                if error == last_error {
                    tracing::debug!(resource = %key.resource, %error, "informer failing");
                    continue;
                }
                tracing::warn!(resource = %key.resource, %error, "informer failing; retrying with backoff");
                last_error.clone_from(&error);
                Observation::Failing { key: key.clone(), error }
            }
        };
        if to_pusher.send(observation).await.is_err() {
            return;
        }
    }
}
