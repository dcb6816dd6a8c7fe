//! The agent configuration's `cluster_state` section: the resources agentk watches with informers
//! and whose compact views it pushes to kas (issue 17). Parsed strictly; what YAML's shape cannot
//! say (names, duplicates, limits) is checked by [`ClusterStateDocument::validate`], with the key
//! named.

use std::collections::HashSet;

use kas_proto::tunnel::pb;
use serde::{Deserialize, Serialize};

use super::access::check_namespace;

/// At most this many resources: each is one informer (a list and a watch) in agentk.
pub const MAX_RESOURCES: usize = 50;
/// At most this many namespaces per resource (one watch each).
pub const MAX_NAMESPACES: usize = 50;

/// `cluster_state`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterStateDocument {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ObservedResourceDocument>,
}

/// One resource to observe, as in the API path: `{group: apps, version: v1, resource: deployments}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservedResourceDocument {
    /// The API group; `""` for the core group (pods, nodes).
    #[serde(default)]
    pub group: String,
    pub version: String,
    /// The plural name (`pods`, `deployments`).
    pub resource: String,
    /// Only these namespaces; all when absent or empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
}

/// A DNS subdomain (RFC 1123) as API groups are named, or `""`.
fn check_group(group: &str) -> bool {
    group.is_empty()
        || (group.len() <= 253
            && group.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            }))
}

/// A version (`v1`, `v1beta1`) or a resource's plural name: a lower-case RFC 1123 label.
fn check_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

impl ClusterStateDocument {
    pub fn validate(&self) -> Result<(), String> {
        if self.resources.len() > MAX_RESOURCES {
            return Err(format!(
                "cluster_state.resources lists {} resources; at most {MAX_RESOURCES}",
                self.resources.len()
            ));
        }
        let mut seen = HashSet::new();
        for (i, r) in self.resources.iter().enumerate() {
            let at = format!("cluster_state.resources[{i}]");
            if !check_group(&r.group) {
                return Err(format!("{at}.group \"{}\" is not an API group name", r.group));
            }
            if !check_label(&r.version) {
                return Err(format!("{at}.version \"{}\" is not an API version (such as v1)", r.version));
            }
            if !check_label(&r.resource) {
                return Err(format!("{at}.resource \"{}\" is not a resource's plural name (such as pods)", r.resource));
            }
            if !seen.insert((r.group.as_str(), r.resource.as_str())) {
                return Err(format!(
                    "{at} observes {} a second time (one entry per group and resource)",
                    resource_name(&r.group, &r.resource)
                ));
            }
            if r.namespaces.len() > MAX_NAMESPACES {
                return Err(format!(
                    "{at}.namespaces lists {} namespaces; at most {MAX_NAMESPACES}",
                    r.namespaces.len()
                ));
            }
            let mut namespaces = HashSet::new();
            for (j, ns) in r.namespaces.iter().enumerate() {
                check_namespace(ns).map_err(|e| format!("{at}.namespaces[{j}] {e}"))?;
                if !namespaces.insert(ns) {
                    return Err(format!("{at}.namespaces[{j}] \"{ns}\" is listed twice"));
                }
            }
        }
        Ok(())
    }

    pub fn to_proto(&self) -> pb::ClusterStateConfiguration {
        pb::ClusterStateConfiguration {
            resources: self
                .resources
                .iter()
                .map(|r| pb::ObservedResource {
                    group: r.group.clone(),
                    version: r.version.clone(),
                    resource: r.resource.clone(),
                    namespaces: r.namespaces.clone(),
                })
                .collect(),
        }
    }
}

/// `pods`, `deployments.apps`: a resource as kubectl (and kas's cluster state routes) name it.
pub fn resource_name(group: &str, resource: &str) -> String {
    if group.is_empty() { resource.to_owned() } else { format!("{resource}.{group}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentConfigDocument;

    fn parse(yaml: &str) -> Result<AgentConfigDocument, String> {
        AgentConfigDocument::parse(yaml)
    }

    #[test]
    fn the_issue_example_parses_and_reaches_agentk() {
        let d = parse(
            "cluster_state:\n  resources:\n    - {group: \"\", version: v1, resource: pods}\n    - {group: apps, version: v1, resource: deployments, namespaces: [prod]}\n    - {version: v1, resource: nodes}\n",
        )
        .unwrap();
        let c = d.to_proto().cluster_state.unwrap();
        assert_eq!(c.resources.len(), 3);
        assert_eq!(
            (c.resources[1].group.as_str(), c.resources[1].resource.as_str(), c.resources[1].namespaces.clone()),
            ("apps", "deployments", vec!["prod".to_owned()])
        );
        assert_eq!(c.resources[2].group, "", "group defaults to the core group");
    }

    #[test]
    fn bad_entries_are_refused_naming_the_key() {
        let cases = [
            ("cluster_state: {resources: [{version: v1, resource: pods, watch: true}]}", "unknown field `watch`"),
            ("cluster_state: {resources: [{version: v1}]}", "missing field `resource`"),
            (
                "cluster_state: {resources: [{version: v1, resource: Pods}]}",
                "cluster_state.resources[0].resource \"Pods\"",
            ),
            (
                "cluster_state: {resources: [{group: Apps, version: v1, resource: x}]}",
                "cluster_state.resources[0].group",
            ),
            ("cluster_state: {resources: [{version: '', resource: pods}]}", "cluster_state.resources[0].version"),
            (
                "cluster_state: {resources: [{version: v1, resource: pods}, {version: v1beta1, resource: pods}]}",
                "cluster_state.resources[1] observes pods a second time",
            ),
            (
                "cluster_state: {resources: [{version: v1, resource: pods, namespaces: [Prod]}]}",
                "cluster_state.resources[0].namespaces[0] \"Prod\" is not a namespace name",
            ),
            (
                "cluster_state: {resources: [{version: v1, resource: pods, namespaces: [a, a]}]}",
                "namespaces[1] \"a\" is listed twice",
            ),
        ];
        for (yaml, want) in cases {
            let e = parse(yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        }
        let many: Vec<String> = (0..=MAX_RESOURCES).map(|i| format!("{{version: v1, resource: r{i}}}")).collect();
        let e = parse(&format!("cluster_state: {{resources: [{}]}}", many.join(","))).unwrap_err();
        assert!(e.contains("at most 50"), "{e}");
    }
}
