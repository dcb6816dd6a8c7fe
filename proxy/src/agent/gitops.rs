//! The agent configuration's `gitops` section: the manifest projects kas polls for the agent and
//! how agentk applies and prunes what they hold. Parsed strictly; what YAML's shape cannot say
//! (globs, refs, namespaces, limits, duplicates) is checked by [`GitopsDocument::validate`], with
//! the key named.

use std::collections::HashSet;
use std::time::Duration;

use kas_proto::tunnel::pb;
use serde::{Deserialize, Serialize};

use super::RepositoryLocation;
use super::access::{check_full_path, check_namespace};

/// At most this many `paths` per manifest project (as the reference).
pub const MAX_PATHS: usize = 100;
/// At most this many manifest projects per agent.
pub const MAX_MANIFEST_PROJECTS: usize = 100;
/// The glob of a manifest project without `paths`: every YAML and JSON file.
pub const DEFAULT_GLOB: &str = "**/*.{yaml,yml,json}";

/// `gitops`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitopsDocument {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifest_projects: Vec<ManifestProjectDocument>,
}

/// One manifest project: where the manifests are and how agentk treats them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestProjectDocument {
    /// A project's full path (GitLab mode), or with static agents a repository: a local path or
    /// an `http(s)://` URL, as for `configuration_repository`.
    pub id: String,
    /// The branch, tag or commit to apply; default: the repository's default branch.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<GitRefDocument>,
    /// The namespace of namespaced objects that name none.
    #[serde(default = "default_namespace")]
    pub default_namespace: String,
    /// Which files hold manifests (globs relative to the repository root).
    #[serde(default = "default_paths")]
    pub paths: Vec<PathDocument>,
    /// How long one apply may take before it counts as failed.
    #[serde(default = "one_hour", with = "humantime_serde")]
    pub reconcile_timeout: Duration,
    #[serde(default)]
    pub dry_run_strategy: DryRunStrategy,
    /// Delete objects that left the manifests (only those in agentk's inventory).
    #[serde(default = "yes")]
    pub prune: bool,
    #[serde(default = "one_hour", with = "humantime_serde")]
    pub prune_timeout: Duration,
    #[serde(default)]
    pub prune_propagation_policy: PropagationPolicy,
    #[serde(default)]
    pub inventory_policy: InventoryPolicy,
}

fn default_namespace() -> String {
    "default".into()
}

fn default_paths() -> Vec<PathDocument> {
    vec![PathDocument { glob: DEFAULT_GLOB.into() }]
}

fn one_hour() -> Duration {
    Duration::from_secs(3600)
}

fn yes() -> bool {
    true
}

/// `ref`: exactly one of its keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitRefDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// A full (40 hex digits) commit id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// `paths[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathDocument {
    /// `*` and `?` stay within a directory, `**` crosses directories, `{a,b}` alternates.
    pub glob: String,
}

/// Whether agentk validates before applying: not at all, client-side, or with the API server
/// (`dryRun=All`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DryRunStrategy {
    #[default]
    None,
    Client,
    Server,
}

/// `propagationPolicy` of prune deletions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PropagationPolicy {
    #[default]
    Foreground,
    Background,
    Orphan,
}

/// Which existing objects agentk may take over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InventoryPolicy {
    /// Only objects of this inventory.
    #[default]
    MustMatch,
    /// Also objects that belong to no inventory.
    AdoptIfNoInventory,
    /// Any object, even one of another inventory.
    AdoptAll,
}

/// A ref as kas resolves it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ManifestRef {
    DefaultBranch,
    Branch(String),
    Tag(String),
    Commit(String),
}

impl ManifestRef {
    /// The ref as the wire names it (`ObjectsToSynchronizeRequest.ref`,
    /// `ManifestProjectConfiguration.ref`): "" for the default branch, `branch:<name>`,
    /// `tag:<name>`, `commit:<id>`.
    pub fn wire_name(&self) -> String {
        match self {
            Self::DefaultBranch => String::new(),
            Self::Branch(b) => format!("branch:{b}"),
            Self::Tag(t) => format!("tag:{t}"),
            Self::Commit(c) => format!("commit:{c}"),
        }
    }
}

impl GitopsDocument {
    /// What agentk needs of the section (`kas.tunnel.v1.GitopsConfiguration`); `paths` stay
    /// with kas, which reads the files.
    pub fn to_proto(&self) -> pb::GitopsConfiguration {
        use pb::manifest_project_configuration::{
            DryRunStrategy as WireDryRun, InventoryPolicy as WireInventory, PropagationPolicy as WirePropagation,
        };
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let manifest_projects = self
            .manifest_projects
            .iter()
            .map(|p| pb::ManifestProjectConfiguration {
                id: p.id.clone(),
                r#ref: p.manifest_ref().wire_name(),
                default_namespace: p.default_namespace.clone(),
                reconcile_timeout_ms: millis(p.reconcile_timeout),
                dry_run_strategy: match p.dry_run_strategy {
                    DryRunStrategy::None => WireDryRun::DryRunNone,
                    DryRunStrategy::Client => WireDryRun::DryRunClient,
                    DryRunStrategy::Server => WireDryRun::DryRunServer,
                } as i32,
                prune: p.prune,
                prune_timeout_ms: millis(p.prune_timeout),
                prune_propagation_policy: match p.prune_propagation_policy {
                    PropagationPolicy::Foreground => WirePropagation::PropagationForeground,
                    PropagationPolicy::Background => WirePropagation::PropagationBackground,
                    PropagationPolicy::Orphan => WirePropagation::PropagationOrphan,
                } as i32,
                inventory_policy: match p.inventory_policy {
                    InventoryPolicy::MustMatch => WireInventory::InventoryMustMatch,
                    InventoryPolicy::AdoptIfNoInventory => WireInventory::InventoryAdoptIfNoInventory,
                    InventoryPolicy::AdoptAll => WireInventory::InventoryAdoptAll,
                } as i32,
            })
            .collect();
        pb::GitopsConfiguration { manifest_projects }
    }
}

impl ManifestProjectDocument {
    /// The ref to poll (call after [`GitopsDocument::validate`]; an invalid one is the default
    /// branch).
    pub fn manifest_ref(&self) -> ManifestRef {
        match &self.git_ref {
            None => ManifestRef::DefaultBranch,
            Some(GitRefDocument { branch: Some(b), .. }) => ManifestRef::Branch(b.clone()),
            Some(GitRefDocument { tag: Some(t), .. }) => ManifestRef::Tag(t.clone()),
            Some(GitRefDocument { commit: Some(c), .. }) => ManifestRef::Commit(c.to_ascii_lowercase()),
            Some(_) => ManifestRef::DefaultBranch,
        }
    }

    /// The compiled `paths`.
    pub fn glob_set(&self) -> Result<globset::GlobSet, String> {
        let mut set = globset::GlobSetBuilder::new();
        for (i, p) in self.paths.iter().enumerate() {
            set.add(compile_glob(&p.glob).map_err(|e| format!("paths[{i}].glob {e}"))?);
        }
        set.build().map_err(|e| e.to_string())
    }

    fn validate(&self, at: &str) -> Result<(), String> {
        if check_full_path(&self.id).is_err() {
            RepositoryLocation::parse(&self.id).map_err(|e| format!("{at}.id {e}"))?;
        }
        if let Some(r) = &self.git_ref {
            r.validate(&format!("{at}.ref"))?;
        }
        check_namespace(&self.default_namespace).map_err(|e| format!("{at}.default_namespace {e}"))?;
        if self.paths.is_empty() {
            return Err(format!("{at}.paths is empty: list at least one glob (or leave paths out for {DEFAULT_GLOB})"));
        }
        if self.paths.len() > MAX_PATHS {
            return Err(format!("{at}.paths has {} entries, more than the limit of {MAX_PATHS}", self.paths.len()));
        }
        let mut seen = HashSet::new();
        for (i, p) in self.paths.iter().enumerate() {
            compile_glob(&p.glob).map_err(|e| format!("{at}.paths[{i}].glob {e}"))?;
            if !seen.insert(p.glob.as_str()) {
                return Err(format!("{at}.paths[{i}].glob \"{}\" is listed twice", p.glob));
            }
        }
        for (key, d) in [("reconcile_timeout", self.reconcile_timeout), ("prune_timeout", self.prune_timeout)] {
            if d.is_zero() {
                return Err(format!("{at}.{key} must be greater than zero"));
            }
        }
        Ok(())
    }
}

/// A glob of `paths`: relative to the repository root, `*` within one directory.
fn compile_glob(glob: &str) -> Result<globset::Glob, String> {
    if glob.trim().is_empty() {
        return Err("is empty".into());
    }
    if glob.starts_with('/') {
        return Err(format!("\"{glob}\" must be relative to the repository root (no leading /)"));
    }
    if glob.split('/').any(|segment| segment == "..") {
        return Err(format!("\"{glob}\" must not contain .."));
    }
    globset::GlobBuilder::new(glob)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| format!("\"{glob}\" is not a valid glob: {}", e.kind()))
}

impl GitRefDocument {
    fn validate(&self, at: &str) -> Result<(), String> {
        let set = [self.branch.is_some(), self.tag.is_some(), self.commit.is_some()].iter().filter(|s| **s).count();
        if set != 1 {
            return Err(format!("{at} must set exactly one of branch, tag, commit"));
        }
        for (key, name) in [("branch", &self.branch), ("tag", &self.tag)] {
            if let Some(name) = name {
                let valid =
                    !name.starts_with("refs/") && gix::validate::reference::name_partial(name.as_str().into()).is_ok();
                if !valid {
                    return Err(format!("{at}.{key} \"{name}\" is not a {key} name"));
                }
            }
        }
        if let Some(commit) = &self.commit
            && (commit.len() != 40 || !commit.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(format!("{at}.commit \"{commit}\" is not a full commit id (40 hex digits)"));
        }
        Ok(())
    }
}

impl GitopsDocument {
    pub fn validate(&self) -> Result<(), String> {
        if self.manifest_projects.len() > MAX_MANIFEST_PROJECTS {
            return Err(format!(
                "gitops.manifest_projects has {} entries, more than the limit of {MAX_MANIFEST_PROJECTS}",
                self.manifest_projects.len()
            ));
        }
        let mut seen = HashSet::new();
        for (i, p) in self.manifest_projects.iter().enumerate() {
            let at = format!("gitops.manifest_projects[{i}]");
            p.validate(&at)?;
            // Two entries for one project and ref would apply the same objects twice, each
            // pruning what the other applied.
            if !seen.insert((p.id.as_str(), p.manifest_ref())) {
                return Err(format!("{at}: project \"{}\" with this ref is listed twice", p.id));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::AgentConfigDocument;
    use super::*;

    fn parse(text: &str) -> Result<AgentConfigDocument, String> {
        AgentConfigDocument::parse(text)
    }

    #[test]
    fn the_issue_example_parses_with_its_values() {
        let d = parse(
            "gitops:\n  manifest_projects:\n    - id: platform/manifests\n      ref: {branch: main}\n      \
             default_namespace: default\n      paths: [{glob: \"deploy/**/*.{yaml,yml,json}\"}]\n      \
             reconcile_timeout: 1h\n      dry_run_strategy: none\n      prune: true\n      prune_timeout: 1h\n      \
             prune_propagation_policy: foreground\n      inventory_policy: must_match\n",
        )
        .unwrap();
        let p = &d.gitops.unwrap().manifest_projects[0];
        assert_eq!(p.manifest_ref(), ManifestRef::Branch("main".into()));
        assert_eq!((p.dry_run_strategy, p.prune_propagation_policy, p.inventory_policy), Default::default());
        let globs = p.glob_set().unwrap();
        for (path, matches) in [
            ("deploy/app.yaml", true),
            ("deploy/a/b/c.json", true),
            ("deploy/x.yml", true),
            ("deploy/x.txt", false),
            ("other/deploy/x.yaml", false),
            ("deployx/y.yaml", false),
        ] {
            assert_eq!(globs.is_match(path), matches, "{path}");
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let d = parse("gitops: {manifest_projects: [{id: group/manifests}]}").unwrap();
        let p = &d.gitops.unwrap().manifest_projects[0];
        assert_eq!(p.manifest_ref(), ManifestRef::DefaultBranch);
        assert_eq!(p.default_namespace, "default");
        assert_eq!(p.paths, [PathDocument { glob: DEFAULT_GLOB.into() }]);
        assert_eq!((p.reconcile_timeout, p.prune_timeout, p.prune), (one_hour(), one_hour(), true));
        let globs = p.glob_set().unwrap();
        assert!(globs.is_match("a.yaml") && globs.is_match("x/y/z.json") && !globs.is_match("README.md"));
        let d = parse(
            "gitops: {manifest_projects: [{id: /srv/git/m.git, ref: {commit: 0123456789ABCDEF0123456789abcdef01234567}, \
             dry_run_strategy: server, prune_propagation_policy: orphan, inventory_policy: adopt_if_no_inventory}]}",
        )
        .unwrap();
        let p = &d.gitops.unwrap().manifest_projects[0];
        assert_eq!(p.manifest_ref(), ManifestRef::Commit("0123456789abcdef0123456789abcdef01234567".into()));
        assert_eq!(p.dry_run_strategy, DryRunStrategy::Server);
        assert_eq!(p.prune_propagation_policy, PropagationPolicy::Orphan);
        assert_eq!(p.inventory_policy, InventoryPolicy::AdoptIfNoInventory);
    }

    #[test]
    fn agentk_receives_each_project_with_its_wire_ref_and_settings() {
        use pb::manifest_project_configuration::{DryRunStrategy as D, InventoryPolicy as I, PropagationPolicy as P};
        let d = parse(
            "gitops: {manifest_projects: [{id: g/m}, {id: g/m, ref: {tag: v1}, default_namespace: apps, \
             reconcile_timeout: 1500ms, dry_run_strategy: server, prune: false, prune_timeout: 2s, \
             prune_propagation_policy: orphan, inventory_policy: adopt_all}, {id: g/m, ref: {branch: b}}, \
             {id: g/m, ref: {commit: 0123456789ABCDEF0123456789abcdef01234567}}]}",
        )
        .unwrap();
        let wire = d.to_proto().gitops.unwrap().manifest_projects;
        let refs: Vec<&str> = wire.iter().map(|p| p.r#ref.as_str()).collect();
        assert_eq!(refs, ["", "tag:v1", "branch:b", "commit:0123456789abcdef0123456789abcdef01234567"]);
        let (first, second) = (&wire[0], &wire[1]);
        assert_eq!((first.id.as_str(), first.default_namespace.as_str(), first.prune), ("g/m", "default", true));
        assert_eq!((first.reconcile_timeout_ms, first.prune_timeout_ms), (3_600_000, 3_600_000));
        assert_eq!(
            (first.dry_run_strategy(), first.prune_propagation_policy(), first.inventory_policy()),
            (D::DryRunNone, P::PropagationForeground, I::InventoryMustMatch)
        );
        assert_eq!((second.default_namespace.as_str(), second.prune), ("apps", false));
        assert_eq!((second.reconcile_timeout_ms, second.prune_timeout_ms), (1500, 2000));
        assert_eq!(
            (second.dry_run_strategy(), second.prune_propagation_policy(), second.inventory_policy()),
            (D::DryRunServer, P::PropagationOrphan, I::InventoryAdoptAll)
        );
    }

    #[test]
    fn mistakes_are_refused_naming_the_key() {
        let many: String = (0..=MAX_PATHS).map(|i| format!("{{glob: 'd{i}/*.yaml'}},")).collect();
        let many = format!("gitops: {{manifest_projects: [{{id: g/m, paths: [{many}]}}]}}");
        for (text, expected) in [
            ("gitops: {manifest_projects: [{id: g/m, pathz: []}]}", "unknown field `pathz`"),
            ("gitops: {manifest_projects: [{id: g/m, dry_run_strategy: maybe}]}", "unknown variant `maybe`"),
            ("gitops: {manifest_projects: [{id: g/m, inventory_policy: adopt}]}", "unknown variant `adopt`"),
            (
                "gitops: {manifest_projects: [{id: g/m, ref: {branch: main, tag: v1}}]}",
                "gitops.manifest_projects[0].ref must set exactly one",
            ),
            ("gitops: {manifest_projects: [{id: g/m, ref: {}}]}", "must set exactly one of branch, tag, commit"),
            (
                "gitops: {manifest_projects: [{id: g/m, ref: {branch: 'a..b'}}]}",
                "ref.branch \"a..b\" is not a branch name",
            ),
            (
                "gitops: {manifest_projects: [{id: g/m, ref: {commit: abc}}]}",
                "ref.commit \"abc\" is not a full commit id",
            ),
            ("gitops: {manifest_projects: [{id: g/m, paths: []}]}", "gitops.manifest_projects[0].paths is empty"),
            (
                "gitops: {manifest_projects: [{id: g/m, paths: [{glob: 'a/{b'}]}]}",
                "paths[0].glob \"a/{b\" is not a valid glob",
            ),
            (
                "gitops: {manifest_projects: [{id: g/m, paths: [{glob: /etc/*.yaml}]}]}",
                "must be relative to the repository root",
            ),
            ("gitops: {manifest_projects: [{id: g/m, paths: [{glob: '../x/*.yaml'}]}]}", "must not contain .."),
            (
                "gitops: {manifest_projects: [{id: g/m, paths: [{glob: a.yaml}, {glob: a.yaml}]}]}",
                "paths[1].glob \"a.yaml\" is listed twice",
            ),
            ("gitops: {manifest_projects: [{id: g/m, default_namespace: Prod}]}", "default_namespace \"Prod\""),
            (
                "gitops: {manifest_projects: [{id: g/m, reconcile_timeout: 0s}]}",
                "reconcile_timeout must be greater than zero",
            ),
            ("gitops: {manifest_projects: [{id: g/m, prune_timeout: soon}]}", "prune_timeout"),
            ("gitops: {manifest_projects: [{id: 'ssh://h/r.git'}]}", "gitops.manifest_projects[0].id"),
            (
                "gitops: {manifest_projects: [{id: g/m}, {id: g/m}]}",
                "gitops.manifest_projects[1]: project \"g/m\" with this ref is listed twice",
            ),
            (many.as_str(), "paths has 101 entries, more than the limit of 100"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(expected), "{text}: {e}");
        }
        // The same project at two refs is fine (e.g. two branches).
        parse("gitops: {manifest_projects: [{id: g/m, ref: {branch: a}}, {id: g/m, ref: {branch: b}}]}").unwrap();
    }
}
