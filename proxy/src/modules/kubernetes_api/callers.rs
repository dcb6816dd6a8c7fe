//! Who calls the Kubernetes API proxy on the rest listener, and who agentk acts as for them.
//!
//! `Authorization: Bearer <credential>`, where the credential is one of:
//! - `ci:<agent_id>:<CI job token>`: a CI job (GitLab mode); GitLab says which agents the job's
//!   project may use (the agent's `ci_access`) and how (`access_as`);
//! - `pat:<agent_id>:<personal access token>`: a person (GitLab mode; the agent's `user_access`);
//! - `kasu_...`: a static user token (`kas add-user`; the agent's `user_access`);
//! - anything else: GitLab's JWT, as on the other routes (agentk acts as itself).
//!
//! The agent id inside a `ci:` or `pat:` credential must be the one in the path: a token meant
//! for one agent is never used for another.

use std::collections::BTreeMap;
use std::sync::Arc;

use kas_proto::AgentId;
use kas_proto::impersonation::Impersonation;

use crate::agent::AgentIdentity;
use crate::agent::access::UserAccessAs as StaticUserAccessAs;
use crate::auth::JwtVerifier;
use crate::auth::StaticAgents;
use crate::auth::gitlab::caller_access::{
    AllowedAgent, AllowedAgentsForJob, AuthorizeProxyUserResponse, CallerAccess, CiAccessAs, ProxyUserAccessType,
    UserAccessAs,
};
use crate::auth::static_users::{STATIC_USER_TOKEN_PREFIX, StaticUser, StaticUsers};
use crate::error::KasError;
use crate::modules::configuration::ConfigurationSource;

/// What verifies callers other than GitLab's JWT (each `None` when this kas cannot).
#[derive(Clone, Default)]
pub struct CallerVerifiers {
    /// GitLab mode: CI job tokens and personal access tokens, asked of GitLab (cached).
    pub gitlab: Option<Arc<CallerAccess>>,
    /// Static mode with `auth.users_file`: kas's own user tokens.
    pub users: Option<Arc<StaticCallers>>,
}

/// Static users, and what decides which agents they may use: the static agents and their
/// configurations (`user_access`).
pub struct StaticCallers {
    pub users: StaticUsers,
    pub agents: Arc<StaticAgents>,
    pub configurations: Arc<dyn ConfigurationSource>,
}

/// A caller's credential, parsed but not verified.
#[derive(Debug, PartialEq, Eq)]
pub enum Credential<'a> {
    Jwt(&'a str),
    CiJob { agent_id: AgentId, token: &'a str },
    PersonalAccessToken { agent_id: AgentId, token: &'a str },
    StaticUser(&'a str),
}

impl<'a> Credential<'a> {
    /// Parses `Authorization`; errors are 401s whose message says what is wrong (never the token).
    pub fn parse(authorization: Option<&'a str>) -> Result<Self, KasError> {
        let Some(value) = authorization else {
            return Err(KasError::Unauthenticated(
                "no credentials: send Authorization: Bearer <token> (a CI job's ci:<agent_id>:<job token>, \
                 pat:<agent_id>:<personal access token>, a kas user token, or GitLab's JWT)"
                    .into(),
            ));
        };
        let token = kas_proto::metadata::bearer_token(Some(value))
            .ok_or_else(|| KasError::Unauthenticated("the Authorization header is not \"Bearer <token>\"".into()))?;
        let prefixed = |kind: &str, rest: &'a str| -> Result<(AgentId, &'a str), KasError> {
            let (id, token) = rest.split_once(':').ok_or_else(|| {
                KasError::Unauthenticated(format!("a {kind} credential is {kind}:<agent_id>:<token>"))
            })?;
            let agent_id = AgentId::parse("agent_id", id)
                .map_err(|e| KasError::Unauthenticated(format!("the agent id of the {kind} credential: {e}")))?;
            if token.is_empty() {
                return Err(KasError::Unauthenticated(format!("the {kind} credential has no token")));
            }
            Ok((agent_id, token))
        };
        if let Some(rest) = token.strip_prefix("ci:") {
            let (agent_id, token) = prefixed("ci", rest)?;
            return Ok(Self::CiJob { agent_id, token });
        }
        if let Some(rest) = token.strip_prefix("pat:") {
            let (agent_id, token) = prefixed("pat", rest)?;
            return Ok(Self::PersonalAccessToken { agent_id, token });
        }
        if token.starts_with(STATIC_USER_TOKEN_PREFIX) {
            return Ok(Self::StaticUser(token));
        }
        Ok(Self::Jwt(token))
    }

    /// The agent a `ci:` / `pat:` credential is for.
    fn agent_id(&self) -> Option<AgentId> {
        match self {
            Self::CiJob { agent_id, .. } | Self::PersonalAccessToken { agent_id, .. } => Some(*agent_id),
            Self::Jwt(_) | Self::StaticUser(_) => None,
        }
    }
}

/// Authenticates the caller of a request for `agent_id` and decides who agentk acts as: `None`
/// is agentk's own service account.
pub async fn authorize(
    jwt: &JwtVerifier,
    verifiers: &CallerVerifiers,
    authorization: Option<&str>,
    agent_id: AgentId,
) -> Result<Option<Impersonation>, KasError> {
    let credential = Credential::parse(authorization)?;
    if let Some(for_agent) = credential.agent_id().filter(|id| *id != agent_id) {
        return Err(KasError::PermissionDenied(format!(
            "the credential is for agent {for_agent}, but the request is for agent {agent_id}"
        )));
    }
    match credential {
        Credential::Jwt(token) => {
            jwt.verify_authorization(Some(&format!("Bearer {token}")))?;
            Ok(None)
        }
        Credential::CiJob { token, .. } => {
            let gitlab = verifiers.gitlab.as_ref().ok_or_else(|| {
                KasError::Unauthenticated(
                    "CI job tokens need kas in GitLab mode (gitlab.address): only GitLab can verify them".into(),
                )
            })?;
            let job = gitlab.allowed_agents_for_job(token).await?;
            ci_job_access(&job, agent_id)
        }
        Credential::PersonalAccessToken { token, .. } => {
            let gitlab = verifiers.gitlab.as_ref().ok_or_else(|| {
                KasError::Unauthenticated(
                    "personal access tokens need kas in GitLab mode (gitlab.address): only GitLab can verify them"
                        .into(),
                )
            })?;
            let user = gitlab.authorize_proxy_user(agent_id, ProxyUserAccessType::PersonalAccessToken, token).await?;
            user_access(&user, ProxyUserAccessType::PersonalAccessToken)
        }
        Credential::StaticUser(token) => {
            let callers = verifiers.users.as_ref().ok_or_else(|| {
                KasError::Unauthenticated(
                    "this kas has no users file (auth.users_file): kas user tokens are not accepted".into(),
                )
            })?;
            static_user_access(callers, token, agent_id).await
        }
    }
}

/// A static user may use the agent if they are a member of a project or group its
/// `user_access` lists (read from the agent's current configuration, as GitLab would).
async fn static_user_access(
    callers: &StaticCallers,
    token: &str,
    agent_id: AgentId,
) -> Result<Option<Impersonation>, KasError> {
    let user = callers.users.verify(token)?;
    let agent = callers
        .agents
        .identity(agent_id)
        .ok_or_else(|| KasError::PermissionDenied(format!("agent {agent_id} is not in this kas's agents file")))?;
    let document = callers.configurations.document(agent).await?;
    let access = document.user_access.as_ref().ok_or_else(|| {
        KasError::PermissionDenied(format!(
            "agent {agent_id} has no user_access in its configuration: no user may use it"
        ))
    })?;
    let member = access.projects.iter().chain(&access.groups).any(|entry| user.is_member_of(&entry.id));
    if !member {
        return Err(KasError::PermissionDenied(format!(
            "user {} is not a member of any project or group in agent {agent_id}'s user_access",
            user.name
        )));
    }
    match access.access_as.mode() {
        Ok(StaticUserAccessAs::Agent) => Ok(None),
        Ok(StaticUserAccessAs::User) => Ok(Some(static_user_identity(user, agent))),
        Err(problem) => {
            Err(KasError::InvalidAgentConfiguration(format!("agent {agent_id}'s user_access.access_as {problem}")))
        }
    }
}

/// `gitlab:user:<name>` in groups naming each of the user's groups and projects (by full path:
/// static users have no GitLab ids or roles).
fn static_user_identity(user: &StaticUser, agent: &AgentIdentity) -> Impersonation {
    let mut groups = vec!["gitlab:user".to_owned()];
    groups.extend(user.groups.iter().map(|g| format!("gitlab:group:{g}")));
    groups.extend(user.projects.iter().map(|p| format!("gitlab:project:{p}")));
    let extra = BTreeMap::from([
        (EXTRA_AGENT_ID.to_owned(), vec![agent.agent_id.to_string()]),
        (EXTRA_USERNAME.to_owned(), vec![user.name.clone()]),
        (EXTRA_CONFIG_PROJECT_ID.to_owned(), vec![agent.project_id.to_string()]),
        (EXTRA_ACCESS_TYPE.to_owned(), vec![STATIC_USER_ACCESS_TYPE.to_owned()]),
    ]);
    Impersonation { user: format!("gitlab:user:{}", user.name), uid: None, groups, extra }
}

/// Extra keys kas sets on impersonated requests (the reference's names), so admission webhooks
/// and audit logs can tell where a request came from.
const EXTRA_AGENT_ID: &str = "agent.gitlab.com/id";
const EXTRA_CONFIG_PROJECT_ID: &str = "agent.gitlab.com/config_project_id";
const EXTRA_PROJECT_ID: &str = "agent.gitlab.com/project_id";
const EXTRA_PIPELINE_ID: &str = "agent.gitlab.com/ci_pipeline_id";
const EXTRA_JOB_ID: &str = "agent.gitlab.com/ci_job_id";
const EXTRA_USERNAME: &str = "agent.gitlab.com/username";
const EXTRA_ENVIRONMENT_SLUG: &str = "agent.gitlab.com/environment_slug";
const EXTRA_ENVIRONMENT_TIER: &str = "agent.gitlab.com/environment_tier";
const EXTRA_ACCESS_TYPE: &str = "agent.gitlab.com/access_type";
/// `agent.gitlab.com/access_type` of static users (GitLab's are `personal_access_token`, ...).
const STATIC_USER_ACCESS_TYPE: &str = "static_user";

/// A CI job may use the agent if GitLab lists it among the job's allowed agents (the agent's
/// `ci_access` shares it with the job's project or one of its groups); `access_as` decides who
/// agentk acts as.
fn ci_job_access(job: &AllowedAgentsForJob, agent_id: AgentId) -> Result<Option<Impersonation>, KasError> {
    let agent = job.agent(agent_id).ok_or_else(|| {
        KasError::PermissionDenied(format!(
            "agent {agent_id} is not shared with project {} of CI job {} (the agent's ci_access names neither \
             the project nor one of its groups)",
            job.project.id, job.job.id
        ))
    })?;
    match &agent.configuration.access_as {
        CiAccessAs::Agent => Ok(None),
        CiAccessAs::Impersonate(i) => {
            if i.username.is_empty() {
                return Err(KasError::PermissionDenied(format!(
                    "agent {agent_id}'s ci_access impersonates no user (access_as.impersonate.username is empty)"
                )));
            }
            let mut extra = BTreeMap::new();
            for kv in &i.extra {
                extra.entry(kv.key.clone()).or_insert_with(Vec::new).extend(kv.val.iter().cloned());
            }
            Ok(Some(Impersonation {
                user: i.username.clone(),
                uid: (!i.uid.is_empty()).then(|| i.uid.clone()),
                groups: i.groups.clone(),
                extra,
            }))
        }
        CiAccessAs::CiJob => Ok(Some(ci_job_identity(job, agent))),
        CiAccessAs::Unsupported(mode) => Err(KasError::PermissionDenied(format!(
            "agent {agent_id}'s ci_access uses access_as {mode:?}, which this kas does not support"
        ))),
    }
}

/// `gitlab:ci_job:<job id>`, in groups naming the job, its project, the project's groups and its
/// environment, so RBAC can bind any of them.
fn ci_job_identity(job: &AllowedAgentsForJob, agent: &AllowedAgent) -> Impersonation {
    let project = job.project.id;
    let mut groups = vec!["gitlab:ci_job".to_owned()];
    groups.extend(job.project.groups.iter().map(|g| format!("gitlab:group:{}", g.id)));
    if let Some(env) = &job.environment {
        groups.extend(job.project.groups.iter().map(|g| format!("gitlab:group_env_tier:{}:{}", g.id, env.tier)));
    }
    groups.push(format!("gitlab:project:{project}"));
    if let Some(env) = &job.environment {
        groups.push(format!("gitlab:project_env:{project}:{}", env.slug));
        groups.push(format!("gitlab:project_env_tier:{project}:{}", env.tier));
    }
    let mut extra = BTreeMap::from([
        (EXTRA_AGENT_ID.to_owned(), vec![agent.id.to_string()]),
        (EXTRA_CONFIG_PROJECT_ID.to_owned(), vec![agent.config_project.id.to_string()]),
        (EXTRA_PROJECT_ID.to_owned(), vec![project.to_string()]),
        (EXTRA_PIPELINE_ID.to_owned(), vec![job.pipeline.id.to_string()]),
        (EXTRA_JOB_ID.to_owned(), vec![job.job.id.to_string()]),
        (EXTRA_USERNAME.to_owned(), vec![job.user.username.clone()]),
    ]);
    if let Some(env) = &job.environment {
        extra.insert(EXTRA_ENVIRONMENT_SLUG.to_owned(), vec![env.slug.clone()]);
        extra.insert(EXTRA_ENVIRONMENT_TIER.to_owned(), vec![env.tier.clone()]);
    }
    Impersonation { user: format!("gitlab:ci_job:{}", job.job.id), uid: None, groups, extra }
}

/// A person GitLab authorized for the agent (`user_access`): as the agent, or as
/// `gitlab:user:<username>` in groups naming their role in each project and group.
fn user_access(
    answer: &AuthorizeProxyUserResponse,
    access_type: ProxyUserAccessType,
) -> Result<Option<Impersonation>, KasError> {
    match &answer.access_as {
        UserAccessAs::Agent => Ok(None),
        UserAccessAs::User(access) => {
            let mut groups = vec!["gitlab:user".to_owned()];
            for p in &access.projects {
                groups.extend(p.roles.iter().map(|role| format!("gitlab:project_role:{}:{role}", p.id)));
            }
            for g in &access.groups {
                groups.extend(g.roles.iter().map(|role| format!("gitlab:group_role:{}:{role}", g.id)));
            }
            let extra = BTreeMap::from([
                (EXTRA_AGENT_ID.to_owned(), vec![answer.agent.id.to_string()]),
                (EXTRA_USERNAME.to_owned(), vec![answer.user.username.clone()]),
                (EXTRA_CONFIG_PROJECT_ID.to_owned(), vec![answer.agent.config_project.id.to_string()]),
                (EXTRA_ACCESS_TYPE.to_owned(), vec![access_type.as_str().to_owned()]),
            ]);
            Ok(Some(Impersonation { user: format!("gitlab:user:{}", answer.user.username), uid: None, groups, extra }))
        }
        UserAccessAs::Unsupported(mode) => Err(KasError::PermissionDenied(format!(
            "agent {}'s user_access uses access_as {mode:?}, which this kas does not support",
            answer.agent.id
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_told_apart() {
        assert_eq!(
            Credential::parse(Some("Bearer ci:5:job-token")).unwrap(),
            Credential::CiJob { agent_id: AgentId(5), token: "job-token" }
        );
        assert_eq!(
            Credential::parse(Some("bearer pat:7:glpat-x:y")).unwrap(),
            Credential::PersonalAccessToken { agent_id: AgentId(7), token: "glpat-x:y" }
        );
        assert_eq!(Credential::parse(Some("Bearer kasu_abc")).unwrap(), Credential::StaticUser("kasu_abc"));
        assert_eq!(Credential::parse(Some("Bearer a.b.c")).unwrap(), Credential::Jwt("a.b.c"));
        for (bad, expected) in [
            (None, "no credentials"),
            (Some("Basic dXNlcjpwYXNz"), "not \"Bearer <token>\""),
            (Some("Bearer ci:5"), "ci:<agent_id>:<token>"),
            (Some("Bearer ci:x:t"), "agent id of the ci credential"),
            (Some("Bearer pat:0:t"), "agent id of the pat credential"),
            (Some("Bearer pat:3:"), "has no token"),
        ] {
            let e = Credential::parse(bad).unwrap_err();
            assert!(matches!(e, KasError::Unauthenticated(_)), "{bad:?}: {e:?}");
            assert!(e.to_string().contains(expected), "{bad:?}: {e}");
        }
        let e = Credential::parse(Some("Bearer ci:x:secret-token")).unwrap_err();
        assert!(!e.to_string().contains("secret-token"), "the token is never in a message: {e}");
    }
}
