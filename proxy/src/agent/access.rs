//! The agent configuration's `ci_access` and `user_access` sections: which CI jobs and which
//! people may use the agent through the Kubernetes API proxy, and as whom agentk acts for them.
//! kas reads them (GitLab reads them too, in GitLab mode); agentk never sees them.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

/// `ci_access`: the projects and groups whose CI jobs may use the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CiAccessDocument {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<CiAccessEntry>,
    /// Every project under these groups (and their subgroups).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<CiAccessEntry>,
}

/// One project or group of `ci_access`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CiAccessEntry {
    /// The project's or group's full path, e.g. `group/subgroup/app`.
    pub id: String,
    /// The namespace kubectl uses when the job's kubeconfig context names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_namespace: Option<String>,
    /// Who agentk acts as for these jobs (default: the agent itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_as: Option<CiAccessAsDocument>,
    /// Only jobs deploying to these environments (names; `*` wildcards as GitLab allows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environments: Vec<String>,
}

/// `access_as` of a `ci_access` entry: exactly one of its keys. (A struct, not an enum: the
/// YAML library maps enums to tags, and `config.yaml` is written with keys.)
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CiAccessAsDocument {
    /// agentk's own service account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Empty>,
    /// A fixed identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impersonate: Option<ImpersonateDocument>,
    /// The job itself (`gitlab:ci_job:<id>` in groups naming its project, groups, environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_job: Option<Empty>,
}

/// A key whose presence is the setting (`agent: {}`); it takes no fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// Who agentk acts as for a CI job, as `access_as` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CiAccessAs<'a> {
    Agent,
    Impersonate(&'a ImpersonateDocument),
    CiJob,
}

impl CiAccessAsDocument {
    /// The one mode set, or an error naming the keys.
    pub fn mode(&self) -> Result<CiAccessAs<'_>, String> {
        match (&self.agent, &self.impersonate, &self.ci_job) {
            (Some(_), None, None) => Ok(CiAccessAs::Agent),
            (None, Some(i), None) => Ok(CiAccessAs::Impersonate(i)),
            (None, None, Some(_)) => Ok(CiAccessAs::CiJob),
            _ => Err("must set exactly one of agent, impersonate, ci_job".into()),
        }
    }
}

/// `access_as: {impersonate: ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImpersonateDocument {
    pub username: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<ExtraDocument>,
}

/// One `Impersonate-Extra-<key>` and its values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraDocument {
    pub key: String,
    #[serde(default)]
    pub val: Vec<String>,
}

/// `user_access`: the people (members of these projects and groups) who may use the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserAccessDocument {
    /// Required, as in the reference: there is no safe default between the two.
    pub access_as: UserAccessAsDocument,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<UserAccessEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<UserAccessEntry>,
}

/// `user_access.access_as`: exactly one of its keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserAccessAsDocument {
    /// agentk's own service account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Empty>,
    /// The person (`gitlab:user:<username>` with their membership groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<Empty>,
}

/// Who agentk acts as for a person, as `user_access.access_as` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserAccessAs {
    Agent,
    User,
}

impl UserAccessAsDocument {
    pub const USER: Self = Self { agent: None, user: Some(Empty {}) };

    /// The one mode set, or an error naming the keys.
    pub fn mode(&self) -> Result<UserAccessAs, String> {
        match (&self.agent, &self.user) {
            (Some(_), None) => Ok(UserAccessAs::Agent),
            (None, Some(_)) => Ok(UserAccessAs::User),
            _ => Err("must set exactly one of agent, user".into()),
        }
    }
}

/// One project or group of `user_access`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserAccessEntry {
    /// The project's or group's full path.
    pub id: String,
}

/// Checks a GitLab full path (`group/subgroup/project`): non-empty segments of letters, digits,
/// `_`, `-` and `.`, not starting with `-` or `.`.
pub fn check_full_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("is empty".into());
    }
    for segment in path.split('/') {
        let valid = !segment.is_empty()
            && !segment.starts_with(['-', '.'])
            && segment.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !valid {
            return Err(format!(
                "\"{path}\" is not a project or group path (segments of letters, digits, '_', '-' and '.', separated by '/')"
            ));
        }
    }
    Ok(())
}

/// A Kubernetes namespace name (an RFC 1123 label).
pub(crate) fn check_namespace(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid { Ok(()) } else { Err(format!("\"{name}\" is not a namespace name (lower-case RFC 1123 label)")) }
}

/// Full paths of a list, each valid and listed once.
fn check_ids<'a>(at: &str, ids: impl Iterator<Item = &'a str>) -> Result<(), String> {
    let mut seen = HashSet::new();
    for (i, id) in ids.enumerate() {
        check_full_path(id).map_err(|e| format!("{at}[{i}].id {e}"))?;
        if !seen.insert(id) {
            return Err(format!("{at}[{i}].id \"{id}\" is listed twice"));
        }
    }
    Ok(())
}

impl CiAccessDocument {
    pub fn validate(&self) -> Result<(), String> {
        for (at, entries) in [("ci_access.projects", &self.projects), ("ci_access.groups", &self.groups)] {
            check_ids(at, entries.iter().map(|e| e.id.as_str()))?;
            for (i, e) in entries.iter().enumerate() {
                let at = format!("{at}[{i}]");
                if let Some(ns) = &e.default_namespace {
                    check_namespace(ns).map_err(|m| format!("{at}.default_namespace {m}"))?;
                }
                if let Some(j) = e.environments.iter().position(|env| env.trim().is_empty()) {
                    return Err(format!("{at}.environments[{j}] is empty"));
                }
                if let Some(access_as) = &e.access_as {
                    let mode = access_as.mode().map_err(|m| format!("{at}.access_as {m}"))?;
                    if let CiAccessAs::Impersonate(imp) = mode {
                        imp.validate(&format!("{at}.access_as.impersonate"))?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl ImpersonateDocument {
    fn validate(&self, at: &str) -> Result<(), String> {
        if self.username.trim().is_empty() {
            return Err(format!("{at}.username must not be empty (Kubernetes cannot impersonate no one)"));
        }
        if self.uid.as_deref().is_some_and(|u| u.trim().is_empty()) {
            return Err(format!("{at}.uid must not be empty when set"));
        }
        if let Some(i) = self.groups.iter().position(|g| g.trim().is_empty()) {
            return Err(format!("{at}.groups[{i}] is empty"));
        }
        if let Some(i) = self.extra.iter().position(|e| e.key.trim().is_empty()) {
            return Err(format!("{at}.extra[{i}].key is empty"));
        }
        Ok(())
    }
}

impl UserAccessDocument {
    pub fn validate(&self) -> Result<(), String> {
        self.access_as.mode().map_err(|m| format!("user_access.access_as {m}"))?;
        check_ids("user_access.projects", self.projects.iter().map(|e| e.id.as_str()))?;
        check_ids("user_access.groups", self.groups.iter().map(|e| e.id.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::AgentConfigDocument;

    fn parse(text: &str) -> Result<AgentConfigDocument, String> {
        AgentConfigDocument::parse(text)
    }

    #[test]
    fn the_issue_example_parses() {
        let d = parse(
            "ci_access:\n  projects: [{id: group/app, default_namespace: app, access_as: {agent: {}}, environments: [production]}]\n  \
             groups:   [{id: group, access_as: {ci_job: {}}}]\n\
             user_access:\n  access_as: {user: {}}\n  projects: [{id: group/app}]\n  groups:   [{id: group}]\n",
        )
        .unwrap();
        let ci = d.ci_access.unwrap();
        assert_eq!(ci.projects[0].access_as.as_ref().unwrap().mode(), Ok(super::CiAccessAs::Agent));
        assert_eq!(ci.projects[0].environments, ["production"]);
        assert_eq!(ci.groups[0].access_as.as_ref().unwrap().mode(), Ok(super::CiAccessAs::CiJob));
        let users = d.user_access.unwrap();
        assert_eq!(users.access_as.mode(), Ok(super::UserAccessAs::User));
        assert_eq!((users.projects[0].id.as_str(), users.groups[0].id.as_str()), ("group/app", "group"));

        let d = parse(
            "ci_access:\n  projects:\n    - id: g/p\n      access_as:\n        impersonate:\n          username: deployer\n          \
             groups: [ops]\n          extra: [{key: reason, val: [ci]}]\n",
        )
        .unwrap();
        let ci = d.ci_access.unwrap();
        let Ok(super::CiAccessAs::Impersonate(i)) = ci.projects[0].access_as.as_ref().unwrap().mode() else {
            panic!("impersonate expected")
        };
        assert_eq!(
            (i.username.as_str(), i.groups.as_slice(), i.extra[0].key.as_str()),
            ("deployer", &["ops".to_owned()][..], "reason")
        );
    }

    #[test]
    fn mistakes_are_refused_naming_the_key() {
        for (text, expected) in [
            ("ci_access: {projects: [{id: g/p, acess_as: {agent: {}}}]}", "unknown field `acess_as`"),
            ("ci_access: {projects: [{id: g/p, access_as: {robot: {}}}]}", "unknown field `robot`"),
            (
                "ci_access: {projects: [{id: g/p, access_as: {agent: {}, ci_job: {}}}]}",
                "ci_access.projects[0].access_as must set exactly one of agent, impersonate, ci_job",
            ),
            ("ci_access: {projects: [{id: g/p, access_as: {agent: {x: 1}}}]}", "unknown field `x`"),
            (
                "ci_access: {projects: [{id: g/p, access_as: {}}]}",
                "ci_access.projects[0].access_as must set exactly one",
            ),
            ("ci_access: {projects: [{default_namespace: x}]}", "missing field `id`"),
            (
                "ci_access: {projects: [{id: 'g//p'}]}",
                "ci_access.projects[0].id \"g//p\" is not a project or group path",
            ),
            ("ci_access: {groups: [{id: g}, {id: g}]}", "ci_access.groups[1].id \"g\" is listed twice"),
            (
                "ci_access: {projects: [{id: g/p, default_namespace: Not_A_Namespace}]}",
                "ci_access.projects[0].default_namespace",
            ),
            (
                "ci_access: {projects: [{id: g/p, environments: ['']}]}",
                "ci_access.projects[0].environments[0] is empty",
            ),
            (
                "ci_access: {projects: [{id: g/p, access_as: {impersonate: {username: ''}}}]}",
                "ci_access.projects[0].access_as.impersonate.username must not be empty",
            ),
            ("user_access: {projects: [{id: g/p}]}", "missing field `access_as`"),
            ("user_access: {access_as: {ci_job: {}}}", "unknown field `ci_job`"),
            ("user_access: {access_as: {}}", "user_access.access_as must set exactly one of agent, user"),
            ("user_access: {access_as: {user: {}}, groups: [{id: '/g'}]}", "user_access.groups[0].id"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(expected), "{text}: {e}");
        }
    }
}
