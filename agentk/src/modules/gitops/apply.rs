//! One sync of a manifest project: apply a commit's objects and prune what left the manifests.
//!
//! 1. Discovery resolves each object's kind and scope (kinds whose CRD is in the same commit are
//!    resolved from that CRD); namespaced objects without a namespace get `default_namespace`.
//! 2. The inventory is read; each object that already exists is checked against
//!    `inventory_policy` (an object agentk may not take over fails and is left alone).
//! 3. The inventory is written with what was recorded plus what is about to be applied, before
//!    anything is applied: an apply cut short (a crash, a newer commit) leaves nothing agentk
//!    created unrecorded. (When `default_namespace` is created by the commit itself, this
//!    happens right after the Namespaces.)
//! 4. Objects are applied in [`objects::Stage`] order with server-side apply (field manager
//!    `agentk`, force: agentk's manifests win conflicts), annotated with the owning inventory; a
//!    custom resource whose CRD is in the commit waits until discovery serves its kind (at most
//!    `CRD_WAIT`, a minute; at once a failure if the CRD failed). Steps 1 to 4 are bounded by
//!    `reconcile_timeout`.
//! 5. With `prune`, objects of the inventory that are no longer in the manifests are deleted in
//!    reverse order with `prune_propagation_policy` (and a UID precondition), and waited for until
//!    they are gone; all of it within `prune_timeout`. Objects another inventory owns now, or that
//!    `inventory_policy` must_match does not let agentk delete, are dropped from the inventory,
//!    never deleted.
//! 6. The inventory is written with what is agentk's now.
//!
//! Dry runs write nothing (no inventory either): `server` sends every apply and delete with
//! `dryRun=All`, `client` sends only reads. Objects that fail are counted and described; the
//! others go on. agentk does not wait for workloads to become ready.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kas_proto::gitops::ObjectError;
use kas_proto::tunnel::pb::ManifestProjectConfiguration;
use kas_proto::tunnel::pb::manifest_project_configuration::{DryRunStrategy, PropagationPolicy as Propagation};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::discovery::ApiResource;
use serde_json::Value;
use tokio::time::Instant;

use super::discovery::Resolver;
use super::inventory::{self, Inventory, OWNING_INVENTORY};
use super::objects::{self, Desired, ObjectId, Served, SourceObject, Stage};

/// The field manager of every write agentk makes.
pub const FIELD_MANAGER: &str = "agentk";
/// Per-object errors a report carries at most (the count covers all).
pub const MAX_ERRORS: usize = 100;
/// How long a custom resource waits for the kind its CRD (applied in the same sync) defines to be
/// served: the API server serves an Established CRD within a second or two; one whose names
/// were not accepted is never served, and should not hold the sync for `reconcile_timeout`.
const CRD_WAIT: Duration = Duration::from_secs(60);
/// Pauses while waiting for pruned objects to be gone.
const GONE_FIRST: Duration = Duration::from_millis(50);
const GONE_CAP: Duration = Duration::from_secs(1);

/// A commit as kas sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    pub id: String,
    pub objects: Vec<SourceObject>,
}

/// What a sync did so far (kept when it is cancelled).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    pub applied: u32,
    pub unchanged: u32,
    pub pruned: u32,
    pub failed: u32,
    pub errors: Vec<ObjectError>,
}

impl Progress {
    fn fail(&mut self, error: ObjectError) {
        self.failed += 1;
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(error);
        }
    }

    fn fail_object(&mut self, id: &ObjectId, version: &str, source: &str, operation: &str, message: String) {
        tracing::warn!(object = %id, %operation, error = %message, "GitOps: object failed");
        self.fail(ObjectError {
            group: id.group.clone(),
            version: version.to_owned(),
            kind: id.kind.clone(),
            namespace: id.namespace.clone(),
            name: id.name.clone(),
            source: source.to_owned(),
            operation: operation.to_owned(),
            message,
        });
    }
}

/// An API error as the API server words it; other errors as kube-rs does.
pub fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn to_value(o: &DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or_default()
}

/// What the apply leaves for prune and the last inventory write.
struct Applied {
    resolver: Resolver,
    old: Inventory,
    /// What the inventory records now (old and applied).
    record: Inventory,
    /// What the inventory ConfigMap holds (None: it does not exist).
    written: Option<Inventory>,
    /// The commit's objects, and those it has that could not be resolved (group, kind, name):
    /// neither is pruned.
    in_commit: HashSet<ObjectId>,
    unresolved: HashSet<(String, String, String)>,
}

/// A pruned object that was deleted and may still be there (finalizers, foreground deletion).
struct Deleted {
    id: ObjectId,
    version: String,
    api: Api<DynamicObject>,
    uid: String,
}

/// An object that passed the checks, to apply.
struct Planned {
    desired: Desired,
    /// As it was before this sync (None: it does not exist).
    live: Option<Value>,
    resource: Option<ApiResource>,
}

pub struct Syncer {
    client: kube::Client,
    agent_id: i64,
}

impl Syncer {
    pub fn new(client: kube::Client, agent_id: i64) -> Self {
        Self { client, agent_id }
    }

    fn api(&self, resource: &ApiResource, namespace: &str) -> Api<DynamicObject> {
        if namespace.is_empty() {
            Api::all_with(self.client.clone(), resource)
        } else {
            Api::namespaced_with(self.client.clone(), namespace, resource)
        }
    }

    /// Applies `commit` for `project`, recording per-object results in `progress`. `Err` is a
    /// failure of the sync as a whole (nothing or not everything was attempted).
    pub async fn sync(
        &self,
        project: &ManifestProjectConfiguration,
        commit: &Commit,
        progress: &mut Progress,
    ) -> Result<(), String> {
        let name = inventory::inventory_name(self.agent_id, &project.id, &project.r#ref);
        let namespace = project.default_namespace.as_str();
        let writes = project.dry_run_strategy() == DryRunStrategy::DryRunNone;
        let inventories: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let reconcile_timeout = Duration::from_millis(project.reconcile_timeout_ms);
        let deadline = Instant::now() + reconcile_timeout;
        let applied = self.apply(project, commit, &name, &inventories, deadline, progress);
        let Applied { resolver, old, mut record, mut written, in_commit, unresolved } =
            match tokio::time::timeout_at(deadline, applied).await {
                Ok(result) => result?,
                Err(_) => {
                    return Err(format!("the apply did not finish within reconcile_timeout ({reconcile_timeout:?})"));
                }
            };

        let mut pruning_error = None;
        if project.prune {
            let mut candidates: Vec<(ObjectId, String)> = old
                .objects
                .iter()
                .filter(|(id, _)| {
                    !in_commit.contains(id)
                        && !unresolved.contains(&(id.group.clone(), id.kind.clone(), id.name.clone()))
                })
                .map(|(id, v)| (id.clone(), v.clone()))
                .collect();
            candidates.sort_by_key(|(id, _)| {
                std::cmp::Reverse(objects::stage(&id.group, &id.kind, !id.namespace.is_empty()))
            });
            let deadline = Instant::now() + Duration::from_millis(project.prune_timeout_ms);
            let mut waiting = Vec::new();
            let prune = self.prune(&candidates, &resolver, project, &name, &mut record, &mut waiting, progress);
            if tokio::time::timeout_at(deadline, prune).await.is_err() {
                let timeout = Duration::from_millis(project.prune_timeout_ms);
                for d in &waiting {
                    let message = format!("deleted, but still there after prune_timeout ({timeout:?}): finalizers?");
                    progress.fail_object(&d.id, &d.version, "", "prune", message);
                }
                pruning_error = Some(format!("pruning did not finish within prune_timeout ({timeout:?})"));
            }
        }

        if writes {
            self.write_inventory(&inventories, &name, project, &record, &mut written)
                .await
                .map_err(|e| format!("writing the inventory ConfigMap {namespace}/{name}: {}", describe(&e)))?;
        }
        pruning_error.map_or(Ok(()), Err)
    }

    /// Steps 1 to 4 (see the module): what prune and the last inventory write need.
    async fn apply(
        &self,
        project: &ManifestProjectConfiguration,
        commit: &Commit,
        name: &str,
        inventories: &Api<ConfigMap>,
        deadline: Instant,
        progress: &mut Progress,
    ) -> Result<Applied, String> {
        let namespace = project.default_namespace.as_str();
        let dry_run = project.dry_run_strategy();
        let policy = project.inventory_policy();
        let writes = dry_run == DryRunStrategy::DryRunNone;

        let mut resolver =
            Resolver::new(self.client.clone()).await.map_err(|e| format!("API discovery failed: {}", describe(&e)))?;
        let commit_kinds = objects::kinds_defined(&commit.objects);
        let mut desired = Vec::new();
        // Objects of the commit that could not be resolved (group, kind, name): never pruned.
        let mut unresolved: HashSet<(String, String, String)> = HashSet::new();
        for source in &commit.objects {
            let served = |g: &str, v: &str, k: &str| resolver.resolve(g, v, k).map(|(_, namespaced)| namespaced);
            match objects::resolve(source, namespace, served, &commit_kinds) {
                Ok(d) => desired.push(d),
                Err(message) => {
                    let o = &source.object;
                    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                    let (group, version) = objects::split_api_version(o["apiVersion"].as_str().unwrap_or_default());
                    let id = ObjectId {
                        group: group.to_owned(),
                        kind: text(&o["kind"]),
                        namespace: text(&o["metadata"]["namespace"]),
                        name: text(&o["metadata"]["name"]),
                    };
                    unresolved.insert((id.group.clone(), id.kind.clone(), id.name.clone()));
                    progress.fail_object(&id, version, &source.source, "apply", message);
                }
            }
        }
        objects::order(&mut desired);
        let in_commit: HashSet<ObjectId> = desired.iter().map(|d| d.id.clone()).collect();

        let (old, exists) = match inventories.get_opt(name).await {
            Ok(Some(cm)) => {
                let value = serde_json::to_value(&cm).unwrap_or_default();
                (Inventory::from_config_map(&value, &project.id, &project.r#ref)?, true)
            }
            Ok(None) => (Inventory::default(), false),
            Err(e) => return Err(format!("reading the inventory ConfigMap {namespace}/{name}: {}", describe(&e))),
        };

        let mut planned = Vec::new();
        for d in desired {
            if d.id.group.is_empty() && d.id.kind == "ConfigMap" && d.id.namespace == namespace && d.id.name == *name {
                let message = "a manifest may not replace the inventory ConfigMap of its own project".to_owned();
                progress.fail_object(&d.id, &d.version, &d.source, "apply", message);
                continue;
            }
            let resource = match d.served {
                Served::Yes { .. } => resolver.resolve(&d.id.group, &d.version, &d.id.kind).map(|(ar, _)| ar),
                Served::AfterItsCrd { .. } => None,
            };
            let live = match &resource {
                Some(ar) => match self.api(ar, &d.id.namespace).get_opt(&d.id.name).await {
                    Ok(found) => found.as_ref().map(to_value),
                    Err(e) => {
                        progress.fail_object(&d.id, &d.version, &d.source, "apply", describe(&e));
                        continue;
                    }
                },
                // Its kind is not served yet, so it cannot exist.
                None => None,
            };
            if let Some(live) = &live {
                let owner = live["metadata"]["annotations"][OWNING_INVENTORY].as_str();
                let ownership = inventory::ownership(owner, old.objects.contains_key(&d.id), name);
                if let Err(message) = inventory::may_apply(policy, &ownership) {
                    progress.fail_object(&d.id, &d.version, &d.source, "apply", message);
                    continue;
                }
            }
            planned.push(Planned { desired: d, live, resource });
        }

        let mut record = old.clone();
        for p in &planned {
            record.objects.insert(p.desired.id.clone(), p.desired.version.clone());
        }
        let mut written = exists.then(|| old.clone());
        let creates_namespace = planned.iter().any(|p| {
            p.desired.id.group.is_empty() && p.desired.id.kind == "Namespace" && p.desired.id.name == namespace
        });
        let mut deferred = false;
        if writes {
            match self.write_inventory(inventories, name, project, &record, &mut written).await {
                Ok(()) => {}
                // The namespace comes with the commit: record right after the Namespaces.
                Err(e) if creates_namespace && is_not_found(&e) => deferred = true,
                Err(e) => {
                    return Err(format!(
                        "writing the inventory ConfigMap {namespace}/{name} (nothing was applied): {}",
                        describe(&e)
                    ));
                }
            }
        }

        // The kinds (group, kind) whose CRD this sync applied.
        let mut defined = HashSet::new();
        for p in &planned {
            if deferred && p.desired.stage > Stage::Namespaces {
                deferred = false;
                self.write_inventory(inventories, name, project, &record, &mut written)
                    .await
                    .map_err(|e| format!("writing the inventory ConfigMap {namespace}/{name}: {}", describe(&e)))?;
            }
            let d = &p.desired;
            if matches!(d.served, Served::AfterItsCrd { .. })
                && !defined.contains(&(d.id.group.clone(), d.id.kind.clone()))
            {
                let message = "its CustomResourceDefinition (in this commit) was not applied".to_owned();
                progress.fail_object(&d.id, &d.version, &d.source, "apply", message);
                continue;
            }
            let applied = self.apply_one(p, &mut resolver, dry_run, name, deadline, progress).await;
            if applied && d.stage == Stage::CustomResourceDefinitions {
                let spec = &d.object["spec"];
                let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                defined.insert((text(&spec["group"]), text(&spec["names"]["kind"])));
            }
        }
        Ok(Applied { resolver, old, record, written, in_commit, unresolved })
    }

    /// Writes the inventory unless it is already as `written` says (and not empty and absent).
    async fn write_inventory(
        &self,
        api: &Api<ConfigMap>,
        name: &str,
        project: &ManifestProjectConfiguration,
        record: &Inventory,
        written: &mut Option<Inventory>,
    ) -> Result<(), kube::Error> {
        let unchanged = match written {
            Some(w) => w == record,
            None => record.objects.is_empty(),
        };
        if unchanged {
            return Ok(());
        }
        let config_map = record.to_config_map(name, &project.default_namespace, &project.id, &project.r#ref);
        api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&config_map)).await?;
        *written = Some(record.clone());
        Ok(())
    }

    /// Applies one object; true when it was applied (or is unchanged).
    async fn apply_one(
        &self,
        p: &Planned,
        resolver: &mut Resolver,
        dry_run: DryRunStrategy,
        inventory_name: &str,
        deadline: Instant,
        progress: &mut Progress,
    ) -> bool {
        let d = &p.desired;
        let resource = match &p.resource {
            Some(ar) => ar.clone(),
            None if dry_run != DryRunStrategy::DryRunNone => {
                let message =
                    "its kind is defined by a CustomResourceDefinition of this commit, which a dry run does not create";
                progress.fail_object(&d.id, &d.version, &d.source, "apply", message.into());
                return false;
            }
            None => match resolver
                .wait_for(&d.id.group, &d.version, &d.id.kind, deadline.min(Instant::now() + CRD_WAIT))
                .await
            {
                Some((ar, _)) => ar,
                None => {
                    let message = format!(
                        "its CustomResourceDefinition was applied but the API server did not serve the kind within {CRD_WAIT:?}"
                    );
                    progress.fail_object(&d.id, &d.version, &d.source, "apply", message);
                    return false;
                }
            },
        };
        if dry_run == DryRunStrategy::DryRunClient {
            progress.applied += 1;
            return true;
        }
        let mut body = d.object.clone();
        body["metadata"]["annotations"][OWNING_INVENTORY] = Value::String(inventory_name.to_owned());
        let params = PatchParams {
            dry_run: dry_run == DryRunStrategy::DryRunServer,
            force: true,
            field_manager: Some(FIELD_MANAGER.to_owned()),
            field_validation: None,
        };
        match self.api(&resource, &d.id.namespace).patch(&d.id.name, &params, &Patch::Apply(&body)).await {
            // A no-op apply leaves the object exactly as it was.
            Ok(applied) if p.live.as_ref() == Some(&to_value(&applied)) => progress.unchanged += 1,
            Ok(_) => {
                tracing::debug!(object = %d.id, "GitOps: applied");
                progress.applied += 1;
            }
            Err(e) => {
                progress.fail_object(&d.id, &d.version, &d.source, "apply", describe(&e));
                return false;
            }
        }
        true
    }

    /// Deletes the candidates this inventory may delete and waits for them to be gone;
    /// `waiting` holds those deleted but still there.
    #[allow(clippy::too_many_arguments)]
    async fn prune(
        &self,
        candidates: &[(ObjectId, String)],
        resolver: &Resolver,
        project: &ManifestProjectConfiguration,
        inventory_name: &str,
        record: &mut Inventory,
        waiting: &mut Vec<Deleted>,
        progress: &mut Progress,
    ) {
        let dry_run = project.dry_run_strategy();
        let policy = project.inventory_policy();
        let propagation = match project.prune_propagation_policy() {
            Propagation::PropagationForeground => PropagationPolicy::Foreground,
            Propagation::PropagationBackground => PropagationPolicy::Background,
            Propagation::PropagationOrphan => PropagationPolicy::Orphan,
        };
        for (id, version) in candidates {
            let Some((resource, _)) = resolver.resolve_any_version(&id.group, version, &id.kind) else {
                // Its kind is not served (the CRD is gone): neither is the object.
                record.objects.remove(id);
                continue;
            };
            if id.group.is_empty() && id.kind == "Namespace" && id.name == project.default_namespace {
                let message = "not pruned: it holds the project's inventory (default_namespace)".to_owned();
                progress.fail_object(id, version, "", "prune", message);
                continue;
            }
            let api = self.api(&resource, &id.namespace);
            let live = match api.get_opt(&id.name).await {
                Ok(Some(live)) => live,
                Ok(None) => {
                    record.objects.remove(id);
                    continue;
                }
                Err(e) => {
                    progress.fail_object(id, version, "", "prune", describe(&e));
                    continue;
                }
            };
            let owner = live.metadata.annotations.as_ref().and_then(|a| a.get(OWNING_INVENTORY)).map(String::as_str);
            let ownership = inventory::ownership(owner, true, inventory_name);
            if !inventory::may_prune(policy, &ownership) {
                tracing::info!(object = %id, ?ownership, "GitOps: not pruning an object this inventory does not own; dropping it from the inventory");
                record.objects.remove(id);
                continue;
            }
            if dry_run == DryRunStrategy::DryRunClient {
                progress.pruned += 1;
                continue;
            }
            let uid = live.metadata.uid.clone().unwrap_or_default();
            let params = DeleteParams {
                dry_run: dry_run == DryRunStrategy::DryRunServer,
                propagation_policy: Some(propagation.clone()),
                // The object read above, not one recreated since under the same name.
                preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
                ..Default::default()
            };
            match api.delete(&id.name, &params).await {
                Ok(_) if dry_run == DryRunStrategy::DryRunServer => progress.pruned += 1,
                Ok(_) => waiting.push(Deleted { id: id.clone(), version: version.clone(), api, uid }),
                Err(e) if is_not_found(&e) => {
                    record.objects.remove(id);
                }
                Err(e) => progress.fail_object(id, version, "", "prune", describe(&e)),
            }
        }
        // Gone: not found, or replaced by another object of the same name.
        let mut pause = GONE_FIRST;
        while !waiting.is_empty() {
            let mut still = Vec::new();
            for d in waiting.drain(..) {
                match d.api.get_opt(&d.id.name).await {
                    Ok(Some(o)) if o.metadata.uid.as_deref() == Some(d.uid.as_str()) => still.push(d),
                    Ok(_) => {
                        tracing::debug!(object = %d.id, "GitOps: pruned");
                        record.objects.remove(&d.id);
                        progress.pruned += 1;
                    }
                    Err(e) => {
                        tracing::debug!(object = %d.id, error = %describe(&e), "GitOps: checking a pruned object failed");
                        still.push(d);
                    }
                }
            }
            *waiting = still;
            if waiting.is_empty() {
                break;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(GONE_CAP);
        }
    }
}
