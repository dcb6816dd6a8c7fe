//! `gitlab.repository_url`: where an agent's configuration project is fetched from, rendered
//! from GitLab's agent_info answer.

use super::GitalyRepository;
use crate::agent::{GitRepository, RepositoryLocation};

/// `gitlab.repository_url`: the configuration project's location, from GitLab's agent_info.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositoryUrlTemplate(String);

/// The placeholders of [`RepositoryUrlTemplate`].
const TEMPLATE_PLACEHOLDERS: [&str; 5] = ["gitlab", "project_path", "relative_path", "storage_name", "gl_repository"];

impl RepositoryUrlTemplate {
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut rest = template;
        while let Some(start) = rest.find('{') {
            let Some(len) = rest[start..].find('}') else {
                return Err(format!("\"{template}\" has an unclosed '{{'"));
            };
            let name = &rest[start + 1..start + len];
            if !TEMPLATE_PLACEHOLDERS.contains(&name) {
                return Err(format!(
                    "\"{template}\": unknown placeholder {{{name}}} (known: {})",
                    TEMPLATE_PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
                ));
            }
            rest = &rest[start + len + 1..];
        }
        if template.trim().is_empty() {
            return Err("is empty".into());
        }
        Ok(Self(template.to_owned()))
    }

    /// The agent's configuration repository (its default branch) from agent_info's fields.
    pub fn render(
        &self,
        gitlab: &str,
        repository: &GitalyRepository,
        default_branch: &str,
    ) -> Result<GitRepository, String> {
        let values = [
            ("gitlab", gitlab.trim_end_matches('/')),
            ("project_path", repository.gl_project_path.as_str()),
            ("relative_path", repository.relative_path.as_str()),
            ("storage_name", repository.storage_name.as_str()),
            ("gl_repository", repository.gl_repository.as_str()),
        ];
        let mut out = self.0.clone();
        for (name, value) in values {
            let placeholder = format!("{{{name}}}");
            if out.contains(&placeholder) {
                // Values come from GitLab; refuse ones that could leave the intended location.
                if value.is_empty() || value.split('/').any(|s| s == "..") || value.contains(['?', '#']) {
                    return Err(format!("agent_info's {name} \"{value}\" cannot be used in gitlab.repository_url"));
                }
                out = out.replace(&placeholder, value);
            }
        }
        let location =
            RepositoryLocation::parse(&out).map_err(|e| format!("gitlab.repository_url gives {out}: {e}"))?;
        let branch = (!default_branch.is_empty()).then(|| default_branch.to_owned());
        Ok(GitRepository { location, branch })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_url_template() {
        let repo = GitalyRepository {
            storage_name: "default".into(),
            relative_path: "@hashed/aa/bb.git".into(),
            gl_repository: "project-7".into(),
            gl_project_path: "group/agents".into(),
        };
        let t = RepositoryUrlTemplate::parse(super::super::config::DEFAULT_GITLAB_REPOSITORY_URL).unwrap();
        let r = t.render("https://gitlab.example.com/", &repo, "main").unwrap();
        assert_eq!(r.location, RepositoryLocation::Remote("https://gitlab.example.com/group/agents.git".into()));
        assert_eq!(r.branch.as_deref(), Some("main"));
        let t = RepositoryUrlTemplate::parse("/var/opt/gitlab/git-data/repositories/{relative_path}").unwrap();
        let r = t.render("https://gitlab.example.com", &repo, "").unwrap();
        assert_eq!(
            r.location,
            RepositoryLocation::Local("/var/opt/gitlab/git-data/repositories/@hashed/aa/bb.git".into())
        );
        assert_eq!(r.branch, None);

        assert!(
            RepositoryUrlTemplate::parse("{gitlab}/{project}.git")
                .unwrap_err()
                .contains("unknown placeholder {project}")
        );
        assert!(RepositoryUrlTemplate::parse("{gitlab/x").unwrap_err().contains("unclosed"));
        let escaping = GitalyRepository { gl_project_path: "../../etc".into(), ..repo };
        let t = RepositoryUrlTemplate::parse("{gitlab}/{project_path}.git").unwrap();
        assert!(t.render("https://g", &escaping, "main").unwrap_err().contains("cannot be used"));
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    fn gitaly() -> impl Strategy<Value = GitalyRepository> {
        let part =
            prop_oneof![Just("..".to_owned()), Just("a/../b".to_owned()), Just(String::new()), "[a-z?#/.@:-]{0,12}"];
        (part.clone(), part.clone(), part.clone(), part).prop_map(
            |(storage_name, relative_path, gl_repository, gl_project_path)| GitalyRepository {
                storage_name,
                relative_path,
                gl_repository,
                gl_project_path,
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// `gitlab.repository_url` templates and GitLab's values: never a panic; only known
        /// placeholders are accepted, and a value that could leave the intended location (empty,
        /// `..`, `?`, `#`) is refused whenever its placeholder is used.
        #[test]
        fn arbitrary_repository_url_templates(
            template in prop_oneof![
                "[a-z:/{}._]{0,30}",
                "(https://g/|/srv/)?(\\{(gitlab|project_path|relative_path|storage_name|gl_repository)\\}/?){0,3}(\\.git)?",
            ],
            repo in gitaly(),
            gitlab in prop_oneof![Just("https://gitlab.example.com/".to_owned()), "[a-z:/.]{0,16}"],
            branch in "[a-z/]{0,8}",
        ) {
            let Ok(t) = RepositoryUrlTemplate::parse(&template) else { return Ok(()) };
            let mut rest = template.as_str();
            while let Some(start) = rest.find('{') {
                let end = start + rest[start..].find('}').unwrap();
                prop_assert!(TEMPLATE_PLACEHOLDERS.contains(&&rest[start + 1..end]));
                rest = &rest[end + 1..];
            }
            let values = [
                ("gitlab", gitlab.trim_end_matches('/')),
                ("project_path", repo.gl_project_path.as_str()),
                ("relative_path", repo.relative_path.as_str()),
                ("storage_name", repo.storage_name.as_str()),
                ("gl_repository", repo.gl_repository.as_str()),
            ];
            let unsafe_value = values.iter().any(|(name, v)| {
                template.contains(&format!("{{{name}}}"))
                    && (v.is_empty() || v.split('/').any(|s| s == "..") || v.contains(['?', '#']))
            });
            match t.render(&gitlab, &repo, &branch) {
                Ok(r) => {
                    prop_assert!(!unsafe_value, "{template} rendered with {values:?}: {r:?}");
                    prop_assert_eq!(r.branch.is_none(), branch.is_empty());
                }
                Err(e) => prop_assert!(!e.is_empty()),
            }
        }
    }
}
