//! What the GitOps feature's services and routes share (kept apart from `mod.rs`, which
//! registers the routes, so that the REST gateway's state can hold it without a cycle).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::config::GitopsConfig;
use super::repository::ManifestRepositories;
use crate::auth::StaticAgents;
use crate::modules::configuration::{AgentConfigurations, ConfigurationSource};
use crate::registry::AgentRegistry;

/// What the feature's services and routes share (built once per kas in `app.rs`).
pub struct GitopsState {
    pub config: GitopsConfig,
    /// Where reports are kept and pushes are published (shared by every kas).
    pub registry: Arc<dyn AgentRegistry>,
    /// Agents' current configuration documents (their `gitops` sections).
    pub configurations: Arc<dyn ConfigurationSource>,
    /// Git repositories read as configurations are (mirrors, shared polls, token bucket).
    pub git: Arc<AgentConfigurations>,
    /// Where manifest projects are (static, or GitLab's project_info).
    pub repositories: ManifestRepositories,
    /// The agents of the static agents file, whose configuration kas can read by agent id
    /// (`None` in GitLab mode: GitLab answers only with the agent's own token).
    pub static_agents: Option<Arc<StaticAgents>>,
    /// kas is shutting down: streams end at once (agentk reconnects to another kas).
    pub shutdown: CancellationToken,
}
