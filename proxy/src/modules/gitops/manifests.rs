//! The manifests of a manifest project at one commit: the files its `paths` globs match, read
//! from the repository with gitoxide within the limits, and the Kubernetes objects they hold
//! (multi-document YAML, JSON, `v1/List`), checked for what would make an apply ambiguous.
//! Every problem is the user's to fix, so it is `FAILED_PRECONDITION` naming the file.

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use serde::Deserialize;

use crate::agent::gitops::{ManifestProjectDocument, ManifestRef};
use crate::error::KasError;
use crate::modules::configuration::git::describe;

/// Bounds on what one commit of a manifest project may hold (the issue's and the reference's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestLimits {
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
    pub max_files: usize,
}

impl ManifestLimits {
    /// 5 MiB per file, 20 MiB per commit, 1,000 files.
    pub const DEFAULT: Self = Self { max_file_bytes: 5 << 20, max_total_bytes: 20 << 20, max_files: 1000 };
}

/// One manifest file at the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestFile {
    /// Relative to the repository root, `/`-separated.
    pub path: String,
    pub data: Bytes,
}

/// Which object a manifest describes: what two manifests must not both describe.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The API group (`""` for the core group), without the version: `apps/v1` and
    /// `apps/v1beta1` name the same object.
    pub group: String,
    pub kind: String,
    /// As written, else the project's `default_namespace` (agentk drops it for cluster-scoped
    /// kinds, which it learns from discovery).
    pub namespace: String,
    pub name: String,
}

/// An object of a manifest file.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestObject {
    pub key: ObjectKey,
    pub api_version: String,
    /// The file it came from.
    pub path: String,
    pub object: serde_json::Value,
}

/// Opens a repository with none of the machine's or user's Git configuration.
fn open(repository: &Path) -> Result<gix::Repository, KasError> {
    gix::open_opts(repository, gix::open::Options::isolated()).map_err(|e| unavailable(repository, "cannot open", &e))
}

/// The repository could not be read (transient: the next poll tries again).
fn unavailable(repository: &Path, what: &str, e: &(dyn std::error::Error + 'static)) -> KasError {
    KasError::GitUnavailable(format!("manifest repository {}: {what}: {}", repository.display(), describe(e)))
}

fn invalid(project: &str, commit: &str, problem: String) -> KasError {
    KasError::InvalidAgentConfiguration(format!("manifest project {project} at commit {commit}: {problem}"))
}

/// The commit a manifest project's ref points to in a repository on this machine (kas's mirror
/// of a remote one, or a local one): a branch, a tag (annotated tags peeled), a commit that must
/// exist, or the default branch (`HEAD`). Blocking.
pub fn resolve_ref(repository: &Path, manifest_ref: &ManifestRef) -> Result<String, KasError> {
    let repo = open(repository)?;
    let name = match manifest_ref {
        ManifestRef::DefaultBranch => "HEAD".to_owned(),
        ManifestRef::Branch(b) => format!("refs/heads/{b}"),
        ManifestRef::Tag(t) => format!("refs/tags/{t}"),
        ManifestRef::Commit(c) => {
            let id = gix::ObjectId::from_hex(c.as_bytes()).map_err(|e| unavailable(repository, "bad commit id", &e))?;
            let found =
                repo.find_commit(id).map_err(|e| unavailable(repository, &format!("cannot find commit {c}"), &e))?;
            return Ok(found.id.to_string());
        }
    };
    let mut reference =
        repo.find_reference(name.as_str()).map_err(|e| unavailable(repository, &format!("cannot find {name}"), &e))?;
    let commit =
        reference.peel_to_commit().map_err(|e| unavailable(repository, &format!("cannot resolve {name}"), &e))?;
    Ok(commit.id.to_string())
}

/// The files of `project` at `commit` (40 hex digits) that its globs match, in path order.
/// Blocking.
pub fn collect(
    repository: &Path,
    commit: &str,
    project: &ManifestProjectDocument,
    limits: ManifestLimits,
) -> Result<Vec<ManifestFile>, KasError> {
    let globs = project.glob_set().map_err(|e| invalid(&project.id, commit, e))?;
    let repo = open(repository)?;
    let id = gix::ObjectId::from_hex(commit.as_bytes()).map_err(|e| unavailable(repository, "bad commit id", &e))?;
    let tree = repo
        .find_commit(id)
        .map_err(|e| unavailable(repository, "cannot read the commit", &e))?
        .tree()
        .map_err(|e| unavailable(repository, "cannot read the commit's tree", &e))?;
    let mut recorder = gix::traverse::tree::Recorder::default();
    tree.traverse().breadthfirst(&mut recorder).map_err(|e| unavailable(repository, "cannot list the tree", &e))?;
    let mut matched: Vec<(String, gix::ObjectId)> = recorder
        .records
        .into_iter()
        .filter(|entry| entry.mode.is_blob())
        .filter_map(|entry| {
            let path = String::from_utf8(entry.filepath.to_vec()).ok()?;
            globs.is_match(&path).then_some((path, entry.oid))
        })
        .collect();
    matched.sort();
    if matched.len() > limits.max_files {
        return Err(invalid(
            &project.id,
            commit,
            format!("{} files match its paths, more than the limit of {}", matched.len(), limits.max_files),
        ));
    }
    let mut total = 0u64;
    let mut files = Vec::with_capacity(matched.len());
    for (path, oid) in matched {
        let size = repo.find_header(oid).map_err(|e| unavailable(repository, "cannot read a file", &e))?.size();
        if size > limits.max_file_bytes {
            return Err(invalid(
                &project.id,
                commit,
                format!("{path} is {size} bytes, more than the limit of {} bytes per file", limits.max_file_bytes),
            ));
        }
        total += size;
        if total > limits.max_total_bytes {
            return Err(invalid(
                &project.id,
                commit,
                format!(
                    "the matched files reach {total} bytes at {path}, more than the limit of {} bytes per commit",
                    limits.max_total_bytes
                ),
            ));
        }
        let object = repo.find_object(oid).map_err(|e| unavailable(repository, "cannot read a file", &e))?;
        files.push(ManifestFile { path, data: Bytes::from(object.detach().data) });
    }
    Ok(files)
}

/// The objects of the files, in file order; a file that is not manifests, an object without
/// `apiVersion`, `kind` or `metadata.name`, or two manifests of one object are errors naming
/// the files.
pub fn objects(
    files: &[ManifestFile],
    project: &ManifestProjectDocument,
    commit: &str,
) -> Result<Vec<ManifestObject>, KasError> {
    let mut objects = Vec::new();
    let mut seen: HashMap<ObjectKey, String> = HashMap::new();
    for file in files {
        let text = std::str::from_utf8(&file.data)
            .map_err(|_| invalid(&project.id, commit, format!("{} is not UTF-8 text", file.path)))?;
        for (n, value) in
            documents(&file.path, text).map_err(|e| invalid(&project.id, commit, e))?.into_iter().enumerate()
        {
            for object in list_items(value) {
                let at = format!("{} (document {})", file.path, n + 1);
                let key = object_key(&object, &project.default_namespace)
                    .map_err(|e| invalid(&project.id, commit, format!("{at}: {e}")))?;
                if let Some(first) = seen.insert(key.clone(), file.path.clone()) {
                    return Err(invalid(
                        &project.id,
                        commit,
                        format!(
                            "{} {}/{} (namespace {}) is in both {first} and {}",
                            key.kind,
                            if key.group.is_empty() { "core" } else { &key.group },
                            key.name,
                            key.namespace,
                            file.path
                        ),
                    ));
                }
                let api_version = object["apiVersion"].as_str().unwrap_or_default().to_owned();
                objects.push(ManifestObject { key, api_version, path: file.path.clone(), object });
            }
        }
    }
    Ok(objects)
}

/// The non-empty documents of a YAML (multi-document) or JSON file.
fn documents(path: &str, text: &str) -> Result<Vec<serde_json::Value>, String> {
    if path.ends_with(".json") {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("{path}: {e}"))?;
        return Ok(vec![value]);
    }
    let mut out = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(document).map_err(|e| format!("{path}: {e}"))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

/// A `v1/List` (what `kubectl get -o yaml` writes) stands for its items.
fn list_items(value: serde_json::Value) -> Vec<serde_json::Value> {
    let is_list = value["apiVersion"] == "v1" && value["kind"] == "List";
    match value {
        serde_json::Value::Object(mut map) if is_list => match map.remove("items") {
            Some(serde_json::Value::Array(items)) => items,
            _ => Vec::new(),
        },
        other => vec![other],
    }
}

fn object_key(object: &serde_json::Value, default_namespace: &str) -> Result<ObjectKey, String> {
    if !object.is_object() {
        return Err("is not a Kubernetes object (a mapping with apiVersion, kind and metadata)".into());
    }
    let text = |pointer: &str| object.pointer(pointer).and_then(serde_json::Value::as_str).filter(|s| !s.is_empty());
    let api_version = text("/apiVersion").ok_or("has no apiVersion")?;
    let kind = text("/kind").ok_or("has no kind")?;
    let name = text("/metadata/name")
        .ok_or_else(|| format!("{kind} has no metadata.name (generateName cannot be applied)"))?;
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    let namespace = text("/metadata/namespace").unwrap_or(default_namespace);
    Ok(ObjectKey {
        group: group.to_owned(),
        kind: kind.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentConfigDocument;
    use crate::modules::configuration::git::tests::TestRepo;

    fn project(yaml: &str) -> ManifestProjectDocument {
        let d = AgentConfigDocument::parse(&format!("gitops: {{manifest_projects: [{yaml}]}}")).unwrap();
        d.gitops.unwrap().manifest_projects.remove(0)
    }

    const DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {replicas: 1}\n";

    #[test]
    fn matched_files_are_read_in_path_order_and_others_left_alone() {
        let repo = TestRepo::new();
        repo.commit("deploy/web.yaml", DEPLOYMENT.as_bytes());
        repo.commit("deploy/sub/cm.yml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm, namespace: other}\n");
        repo.commit("deploy/svc.json", br#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}}"#);
        repo.commit("deploy/notes.txt", b"not a manifest");
        let commit = repo.commit("README.md", b"# manifests\n");
        let p = project("{id: g/m, paths: [{glob: 'deploy/**/*.{yaml,yml,json}'}], default_namespace: prod}");
        let files = collect(&repo.bare, &commit, &p, ManifestLimits::DEFAULT).unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["deploy/sub/cm.yml", "deploy/svc.json", "deploy/web.yaml"]);
        assert_eq!(files[2].data, DEPLOYMENT.as_bytes());
        let objects = objects(&files, &p, &commit).unwrap();
        let keys: Vec<(&str, &str, &str, &str)> = objects
            .iter()
            .map(|o| (o.key.group.as_str(), o.key.kind.as_str(), o.key.namespace.as_str(), o.key.name.as_str()))
            .collect();
        assert_eq!(
            keys,
            [("", "ConfigMap", "other", "cm"), ("", "Service", "prod", "web"), ("apps", "Deployment", "prod", "web")]
        );
        assert_eq!(objects[2].object["spec"]["replicas"], 1);
    }

    #[test]
    fn refs_resolve_to_their_commits() {
        let repo = TestRepo::new();
        let first = repo.commit("a.yaml", DEPLOYMENT.as_bytes());
        repo.tag("v1", true);
        repo.tag("light", false);
        let second = repo.commit("a.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n");
        for (r, expected) in [
            (ManifestRef::DefaultBranch, &second),
            (ManifestRef::Branch("main".into()), &second),
            (ManifestRef::Tag("v1".into()), &first),
            (ManifestRef::Tag("light".into()), &first),
            (ManifestRef::Commit(first.clone()), &first),
        ] {
            assert_eq!(&resolve_ref(&repo.bare, &r).unwrap(), expected, "{r:?}");
        }
        for r in [
            ManifestRef::Branch("nope".into()),
            ManifestRef::Tag("v9".into()),
            ManifestRef::Commit("0123456789abcdef0123456789abcdef01234567".into()),
        ] {
            let e = resolve_ref(&repo.bare, &r).unwrap_err();
            assert_eq!(e.grpc_code(), tonic::Code::Unavailable, "{r:?}: {e}");
        }
    }

    #[test]
    fn limits_are_errors_naming_the_file() {
        let repo = TestRepo::new();
        repo.commit("a.yaml", DEPLOYMENT.as_bytes());
        let commit = repo.commit("b.yaml", "x: 1\n".repeat(100).as_bytes());
        let p = project("{id: g/m}");
        let limits = |f, t, n| ManifestLimits { max_file_bytes: f, max_total_bytes: t, max_files: n };
        for (limits, expected) in [
            (limits(100, 10_000, 10), "b.yaml is 500 bytes, more than the limit of 100 bytes per file"),
            (limits(1000, 500, 10), "reach 579 bytes at b.yaml, more than the limit of 500"),
            (limits(1000, 10_000, 1), "2 files match its paths, more than the limit of 1"),
        ] {
            let e = collect(&repo.bare, &commit, &p, limits).unwrap_err();
            assert_eq!(e.grpc_code(), tonic::Code::FailedPrecondition);
            let m = e.to_string();
            assert!(m.contains(expected) && m.contains("manifest project g/m at commit"), "{m}");
        }
        // 579 = 79 + 500 bytes: exactly at a limit is fine.
        assert_eq!(collect(&repo.bare, &commit, &p, limits(500, 579, 2)).unwrap().len(), 2);
    }

    #[test]
    fn documents_lists_and_mistakes() {
        let p = project("{id: g/m}");
        let file = |path: &str, text: &str| ManifestFile { path: path.into(), data: Bytes::from(text.to_owned()) };
        let multi = file(
            "all.yaml",
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n# only a comment\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}\n- {apiVersion: v1, kind: Secret, metadata: {name: b}}\n",
        );
        let names: Vec<String> = objects(std::slice::from_ref(&multi), &p, "c")
            .unwrap()
            .iter()
            .map(|o| format!("{}/{}", o.key.kind, o.key.name))
            .collect();
        assert_eq!(names, ["ConfigMap/a", "ConfigMap/b", "Secret/b"]);
        for (files, expected) in [
            (vec![file("x.yaml", "kind: ConfigMap\nmetadata: {name: a}\n")], "x.yaml (document 1): has no apiVersion"),
            (
                vec![file("x.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {generateName: p-}\n")],
                "Pod has no metadata.name",
            ),
            (vec![file("x.yaml", "- just\n- a list\n")], "is not a Kubernetes object"),
            (vec![file("x.yaml", "a: [\n")], "x.yaml: "),
            (vec![file("x.json", "{")], "x.json: "),
            (vec![file("x.yaml", "\u{0}\u{159}")], "x.yaml"),
            (
                vec![
                    multi.clone(),
                    file("z.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b, namespace: default}\n"),
                ],
                "ConfigMap core/b (namespace default) is in both all.yaml and z.yaml",
            ),
            (
                vec![file("a.yaml", DEPLOYMENT), file("b.yaml", &DEPLOYMENT.replace("apps/v1", "apps/v1beta1"))],
                "Deployment apps/web (namespace default) is in both a.yaml and b.yaml",
            ),
        ] {
            let e = objects(&files, &p, "c").unwrap_err().to_string();
            assert!(e.contains(expected), "{expected}: {e}");
        }
        let invalid_utf8 = ManifestFile { path: "bin.yaml".into(), data: Bytes::from_static(&[0xff, 0xfe]) };
        assert!(objects(&[invalid_utf8], &p, "c").unwrap_err().to_string().contains("bin.yaml is not UTF-8 text"));
    }
}
