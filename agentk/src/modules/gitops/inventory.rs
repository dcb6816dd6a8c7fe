//! The inventory: which objects a manifest project's applies created or took over, so that
//! prune deletes exactly those and nothing else, and the rules (`inventory_policy`) for objects
//! that exist before agentk applies them.
//!
//! - One ConfigMap per agent, manifest project and ref, in the project's `default_namespace`,
//!   named by [`inventory_name`]: `inventory-<agent id>-<project, as a name>-<hash>` (the reference
//!   named it `inventory-<agent id>-<project id>`; a project here may be a path or a URL, and one
//!   project may be listed at two refs, so the readable part is sanitised and a hash of the
//!   project id and ref keeps names unique). It is labelled `app.kubernetes.io/managed-by:
//!   agentk` and annotated with the project and ref it belongs to; a ConfigMap of that name
//!   without them is someone else's and makes the sync fail rather than be overwritten.
//! - Its data key `objects` is a JSON array of `{group, version, kind, namespace, name}`, sorted.
//! - Every object agentk applies is annotated `config.k8s.io/owning-inventory: <inventory name>`
//!   (cli-utils' annotation, as the reference used), which says which inventory owns it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::objects::ObjectId;
use kas_proto::tunnel::pb::manifest_project_configuration::InventoryPolicy;

/// The annotation naming the inventory that owns an object.
pub const OWNING_INVENTORY: &str = "config.k8s.io/owning-inventory";
/// Label and annotations of the inventory ConfigMap.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "agentk";
pub const PROJECT_ANNOTATION: &str = "agentk/manifest-project";
pub const REF_ANNOTATION: &str = "agentk/ref";
/// The data key holding the objects.
pub const OBJECTS_KEY: &str = "objects";

/// The readable part of the name: at most this many characters.
const SLUG_MAX: usize = 40;

/// The inventory ConfigMap's name for an agent's manifest project at a ref (as kas names refs).
pub fn inventory_name(agent_id: i64, project_id: &str, git_ref: &str) -> String {
    let mut slug = String::new();
    for c in project_id.chars().map(|c| c.to_ascii_lowercase()) {
        if c.is_ascii_alphanumeric() {
            slug.push(c);
        } else if !slug.ends_with('-') && !slug.is_empty() {
            slug.push('-');
        }
    }
    // The last part of a path or URL says most (`platform/manifests`, `.../deploy.git`).
    if slug.len() > SLUG_MAX {
        slug = slug[slug.len() - SLUG_MAX..].trim_start_matches('-').to_owned();
    }
    let slug = slug.trim_end_matches('-');
    let digest = Sha256::digest(format!("{project_id}\n{git_ref}"));
    let hash = hex::encode(&digest[..5]);
    if slug.is_empty() { format!("inventory-{agent_id}-{hash}") } else { format!("inventory-{agent_id}-{slug}-{hash}") }
}

/// One recorded object: its identity and the version it was applied at.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Entry {
    group: String,
    version: String,
    kind: String,
    namespace: String,
    name: String,
}

/// What an inventory holds: object → version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub objects: BTreeMap<ObjectId, String>,
}

impl Inventory {
    /// Reads an existing inventory ConfigMap; `Err` when it is not this project's inventory or
    /// cannot be read (then nothing may be pruned).
    pub fn from_config_map(config_map: &Value, project_id: &str, git_ref: &str) -> Result<Self, String> {
        let metadata = &config_map["metadata"];
        let name = metadata["name"].as_str().unwrap_or_default();
        let namespace = metadata["namespace"].as_str().unwrap_or_default();
        let ours = metadata["labels"][MANAGED_BY_LABEL] == MANAGED_BY
            && metadata["annotations"][PROJECT_ANNOTATION] == project_id
            && metadata["annotations"][REF_ANNOTATION] == git_ref;
        if !ours {
            return Err(format!(
                "ConfigMap {namespace}/{name} exists and is not agentk's inventory of manifest project \"{project_id}\" \
                 (label {MANAGED_BY_LABEL}={MANAGED_BY}, annotations {PROJECT_ANNOTATION} and {REF_ANNOTATION}); \
                 agentk does not overwrite it: remove or rename it"
            ));
        }
        let text = config_map["data"][OBJECTS_KEY].as_str().unwrap_or("[]");
        let entries: Vec<Entry> = serde_json::from_str(text).map_err(|e| {
            format!("inventory ConfigMap {namespace}/{name}: data.{OBJECTS_KEY} is not an object list: {e}")
        })?;
        let objects = entries
            .into_iter()
            .map(|e| (ObjectId { group: e.group, kind: e.kind, namespace: e.namespace, name: e.name }, e.version))
            .collect();
        Ok(Self { objects })
    }

    /// The ConfigMap to apply (server-side) for this inventory.
    pub fn to_config_map(&self, name: &str, namespace: &str, project_id: &str, git_ref: &str) -> Value {
        let entries: Vec<Entry> = self
            .objects
            .iter()
            .map(|(id, version)| Entry {
                group: id.group.clone(),
                version: version.clone(),
                kind: id.kind.clone(),
                namespace: id.namespace.clone(),
                name: id.name.clone(),
            })
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {MANAGED_BY_LABEL: MANAGED_BY},
                "annotations": {PROJECT_ANNOTATION: project_id, REF_ANNOTATION: git_ref},
            },
            "data": {OBJECTS_KEY: serde_json::to_string(&entries).unwrap_or_else(|_| "[]".into())},
        })
    }
}

/// Whose an existing object is, as far as this inventory is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Annotated with this inventory, or recorded in it without an owner annotation.
    Ours,
    /// No inventory owns it (created by someone else, or by hand).
    Nobody,
    /// Annotated with another inventory.
    Other(String),
}

/// `owner` is the object's owning-inventory annotation, `recorded` whether this inventory lists it.
pub fn ownership(owner: Option<&str>, recorded: bool, ours: &str) -> Ownership {
    match owner.filter(|o| !o.is_empty()) {
        Some(o) if o == ours => Ownership::Ours,
        Some(o) => Ownership::Other(o.to_owned()),
        None if recorded => Ownership::Ours,
        None => Ownership::Nobody,
    }
}

/// May agentk apply (and so take over) an existing object? `Err` is the reason it may not.
pub fn may_apply(policy: InventoryPolicy, ownership: &Ownership) -> Result<(), String> {
    match (ownership, policy) {
        (Ownership::Ours, _) | (Ownership::Nobody | Ownership::Other(_), InventoryPolicy::InventoryAdoptAll) => Ok(()),
        (Ownership::Nobody, InventoryPolicy::InventoryAdoptIfNoInventory) => Ok(()),
        (Ownership::Nobody, InventoryPolicy::InventoryMustMatch) => {
            Err("the object exists and agentk did not create it; inventory_policy must_match does not take it over \
             (adopt_if_no_inventory or adopt_all would)"
                .to_owned())
        }
        (Ownership::Other(other), _) => Err(format!(
            "the object belongs to inventory {other} ({OWNING_INVENTORY}); inventory_policy {} does not take it \
             over (adopt_all would)",
            policy_name(policy)
        )),
    }
}

/// May prune delete an object of this inventory that left the manifests? An object another
/// inventory took over is never deleted (it is dropped from this inventory instead).
pub fn may_prune(policy: InventoryPolicy, ownership: &Ownership) -> bool {
    match ownership {
        Ownership::Ours => true,
        Ownership::Nobody => policy != InventoryPolicy::InventoryMustMatch,
        Ownership::Other(_) => false,
    }
}

pub fn policy_name(policy: InventoryPolicy) -> &'static str {
    match policy {
        InventoryPolicy::InventoryMustMatch => "must_match",
        InventoryPolicy::InventoryAdoptIfNoInventory => "adopt_if_no_inventory",
        InventoryPolicy::InventoryAdoptAll => "adopt_all",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(kind: &str, namespace: &str, name: &str) -> ObjectId {
        ObjectId { group: String::new(), kind: kind.into(), namespace: namespace.into(), name: name.into() }
    }

    /// A valid ConfigMap name: a DNS subdomain of at most 253 characters.
    fn valid_name(name: &str) -> bool {
        name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn names_are_valid_readable_and_distinct_per_agent_project_and_ref() {
        let name = inventory_name(7, "platform/manifests", "");
        assert!(name.starts_with("inventory-7-platform-manifests-"), "{name}");
        for (project, r) in [
            ("platform/manifests", "branch:main"),
            ("/srv/git/Deploy_Stuff.git", ""),
            ("https://git.example.com/a/very/long/path/to/some/repository/with/many/parts.git", "tag:v1.2.0"),
            ("///", ""),
            ("x", "commit:0123456789abcdef0123456789abcdef01234567"),
        ] {
            let n = inventory_name(123456789, project, r);
            assert!(valid_name(&n) && n.len() <= 100, "{n}");
        }
        assert!(
            inventory_name(1, "/srv/git/Deploy_Stuff.git", "").starts_with("inventory-1-srv-git-deploy-stuff-git-")
        );
        assert!(
            inventory_name(1, "https://git.example.com/a/very/long/path/to/some/repository/with/many/parts.git", "")
                .contains("many-parts-git")
        );
        let all = [
            inventory_name(1, "g/m", ""),
            inventory_name(2, "g/m", ""),
            inventory_name(1, "g/m", "branch:b"),
            inventory_name(1, "g-m", ""),
        ];
        let unique: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len(), "{all:?}");
        assert_eq!(inventory_name(1, "g/m", ""), inventory_name(1, "g/m", ""));
        // The README's example.
        assert_eq!(inventory_name(1, "platform/manifests", "branch:main"), "inventory-1-platform-manifests-21aacad85c");
    }

    #[test]
    fn inventory_round_trips_through_its_config_map_and_refuses_foreign_ones() {
        let mut inventory = Inventory::default();
        inventory.objects.insert(id("ConfigMap", "apps", "a"), "v1".into());
        let deployment =
            ObjectId { group: "apps".into(), kind: "Deployment".into(), namespace: "apps".into(), name: "d".into() };
        inventory.objects.insert(deployment, "v1".into());
        inventory.objects.insert(id("Namespace", "", "apps"), "v1".into());
        let cm = inventory.to_config_map("inventory-1-x", "default", "g/m", "branch:main");
        assert_eq!(cm["metadata"]["labels"][MANAGED_BY_LABEL], "agentk");
        let text = cm["data"][OBJECTS_KEY].as_str().unwrap();
        assert!(
            text.contains(r#"{"group":"apps","version":"v1","kind":"Deployment","namespace":"apps","name":"d"}"#),
            "{text}"
        );
        assert_eq!(Inventory::from_config_map(&cm, "g/m", "branch:main").unwrap(), inventory);

        let e = Inventory::from_config_map(&cm, "g/m", "").unwrap_err();
        assert!(e.contains("ConfigMap default/inventory-1-x exists and is not agentk's inventory"), "{e}");
        let mut foreign = cm.clone();
        foreign["metadata"]["labels"] = json!({});
        assert!(Inventory::from_config_map(&foreign, "g/m", "branch:main").is_err());
        let mut broken = cm;
        broken["data"][OBJECTS_KEY] = json!("{not json");
        let e = Inventory::from_config_map(&broken, "g/m", "branch:main").unwrap_err();
        assert!(e.contains("is not an object list"), "{e}");
    }

    #[test]
    fn policies_decide_what_is_taken_over_and_pruned() {
        use InventoryPolicy::*;
        let ours = "inventory-1-a";
        assert_eq!(ownership(Some(ours), false, ours), Ownership::Ours);
        assert_eq!(ownership(None, true, ours), Ownership::Ours);
        assert_eq!(ownership(Some(""), false, ours), Ownership::Nobody);
        assert_eq!(ownership(None, false, ours), Ownership::Nobody);
        // Recorded here, but another inventory took it over since: it is theirs.
        assert_eq!(ownership(Some("inventory-2-b"), true, ours), Ownership::Other("inventory-2-b".into()));

        let other = Ownership::Other("inventory-2-b".into());
        // (ownership, policy) -> may apply, may prune
        for (o, policy, apply, prune) in [
            (&Ownership::Ours, InventoryMustMatch, true, true),
            (&Ownership::Ours, InventoryAdoptAll, true, true),
            (&Ownership::Nobody, InventoryMustMatch, false, false),
            (&Ownership::Nobody, InventoryAdoptIfNoInventory, true, true),
            (&Ownership::Nobody, InventoryAdoptAll, true, true),
            (&other, InventoryMustMatch, false, false),
            (&other, InventoryAdoptIfNoInventory, false, false),
            (&other, InventoryAdoptAll, true, false),
        ] {
            assert_eq!(may_apply(policy, o).is_ok(), apply, "{o:?} {policy:?}");
            assert_eq!(may_prune(policy, o), prune, "{o:?} {policy:?}");
        }
        let e = may_apply(InventoryMustMatch, &Ownership::Nobody).unwrap_err();
        assert!(e.contains("inventory_policy must_match"), "{e}");
        let e = may_apply(InventoryAdoptIfNoInventory, &other).unwrap_err();
        assert!(e.contains("belongs to inventory inventory-2-b") && e.contains("adopt_if_no_inventory"), "{e}");
    }
}
