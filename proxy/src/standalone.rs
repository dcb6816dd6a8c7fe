//! Standalone mode: `kas` with no config file. Generates dev secrets, a static agents file with
//! one agent and its token into a local directory (0700, files 0600), and returns a config using
//! them with loopback listeners and the in-memory registry.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::agent::AgentConfigDocument;
use crate::agent::access::{UserAccessAsDocument, UserAccessDocument, UserAccessEntry};
use crate::auth::Secret;
use crate::auth::agent_token::{StaticAgent, StaticAgentsFile, generate_agent_token, token_sha256_hex};
use crate::config::Config;

/// The agent the standalone setup creates.
pub const DEV_AGENT_ID: i64 = 1;
pub const DEV_AGENT_NAME: &str = "dev-agent";
pub const DEV_PROJECT_ID: i64 = 1;

#[derive(Debug)]
pub struct DevSetup {
    pub dir: PathBuf,
    pub config: Config,
    pub gitlab_secret_file: PathBuf,
    pub agent_token_file: PathBuf,
    /// False when everything already existed and was reused.
    pub created: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DevSetupError {
    #[error("cannot prepare dev directory {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error(transparent)]
    Agents(#[from] crate::auth::agent_token::StaticAgentsError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DevSetupError + '_ {
    move |source| DevSetupError::Io { path: path.display().to_string(), source }
}

/// Writes `contents` to a new 0600 file; returns false if the file already existed.
fn write_new_private(path: &Path, contents: &str) -> Result<bool, DevSetupError> {
    crate::tools::private_file::create_new(path, contents.as_bytes()).map_err(io_err(path))
}

/// The group whose members (`kas add-user --group dev`) may use the dev agent with kubectl.
pub const DEV_USER_GROUP: &str = "dev";

/// The dev agent's configuration: members of group `dev` may use it, as themselves.
fn dev_agent_configuration() -> AgentConfigDocument {
    AgentConfigDocument {
        user_access: Some(UserAccessDocument {
            access_as: UserAccessAsDocument::USER,
            projects: Vec::new(),
            groups: vec![UserAccessEntry { id: DEV_USER_GROUP.into() }],
        }),
        ..AgentConfigDocument::default()
    }
}

pub fn ensure_dev_setup(dir: &Path) -> Result<DevSetup, DevSetupError> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err(dir))?;
    // An existing directory may have looser permissions; secrets live here.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io_err(dir))?;
    let gitlab_secret_file = dir.join("gitlab-secret");
    let internal_secret_file = dir.join("internal-secret");
    let agents_file = dir.join("agents.yaml");
    let agent_token_file = dir.join("agent-token");
    let users_file = dir.join("users.yaml");

    let mut created = write_new_private(&gitlab_secret_file, &Secret::generate().to_file_text())?;
    created |= write_new_private(&internal_secret_file, &Secret::generate().to_file_text())?;
    if !agents_file.exists() {
        let token = generate_agent_token();
        let file = StaticAgentsFile {
            agents: vec![StaticAgent {
                id: DEV_AGENT_ID,
                name: DEV_AGENT_NAME.into(),
                project_id: DEV_PROJECT_ID,
                token_sha256: token_sha256_hex(&token),
                configuration: Some(dev_agent_configuration()),
                configuration_repository: None,
                configuration_branch: None,
            }],
        };
        // Token first: an agents file without its token would lock the dev agent out.
        std::fs::remove_file(&agent_token_file).ok();
        write_new_private(&agent_token_file, &format!("{token}\n"))?;
        file.save(&agents_file)?;
        created = true;
    }
    // Empty until `kas add-user` adds someone.
    created |= write_new_private(&users_file, "users: []\n")?;
    let mut config = Config::default();
    config.auth.users_file = Some(users_file);
    config.gitlab.authentication_secret_file = Some(gitlab_secret_file.clone());
    config.kas_internal.authentication_secret_file = Some(internal_secret_file);
    config.agents.static_file = Some(agents_file);
    Ok(DevSetup { dir: dir.to_owned(), config, gitlab_secret_file, agent_token_file, created })
}

impl DevSetup {
    /// What to tell the user; paths only, never secret values (not even the Redis URL, which
    /// may hold a password).
    pub fn instructions(&self, redis: bool, agent_address: &str, api_address: &str, rest_address: &str) -> String {
        let d = self.dir.display();
        let registry = if redis { "Redis registry (--redis-url)" } else { "in-memory registry" };
        format!(
            "kas is running in standalone mode ({registry}, loopback listeners).\n\
             Dev secrets are in {d} ({}).\n\
             \n\
             Connect an agent (agent id {DEV_AGENT_ID}, project {DEV_PROJECT_ID}):\n\
             \x20 agentk --kas-address grpc://{agent_address} --token-file {} --kubeconfig ~/.kube/config\n\
             \n\
             Call the API with a GitLab-style JWT:\n\
             \x20 TOKEN=$(kas mint-jwt --secret-file {})\n\
             \x20 grpcurl -plaintext -H \"authorization: Bearer $TOKEN\" -import-path proto/proto -proto kas/v1/kas.proto \\\n\
             \x20   -d '{{\"agent_id\": {DEV_AGENT_ID}}}' {api_address} kas.v1.KasApi/GetPods\n\
             \n\
             Or the REST gateway (Swagger UI: http://{rest_address}/swagger-ui):\n\
             \x20 curl -H \"Authorization: Bearer $TOKEN\" http://{rest_address}/api/v1/agents/{DEV_AGENT_ID}/pods\n\
             \n\
             Add another agent:  kas add-agent --agents-file {d}/agents.yaml --id 2 --name other --project-id 1\n\
             Add a kubectl user (group {DEV_USER_GROUP} may use agent {DEV_AGENT_ID}):  kas add-user --users-file {d}/users.yaml --name alice --group {DEV_USER_GROUP}\n",
            if self.created { "created now" } else { "reused" },
            self.agent_token_file.display(),
            self.gitlab_secret_file.display(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_private_files_once_and_reuses_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dev");
        let first = ensure_dev_setup(&dir).unwrap();
        assert!(first.created);
        first.config.validate().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        for f in ["gitlab-secret", "internal-secret", "agents.yaml", "agent-token", "users.yaml"] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
        }
        let token = std::fs::read_to_string(&first.agent_token_file).unwrap();
        let agents = StaticAgentsFile::load(first.config.agents.static_file.as_ref().unwrap()).unwrap();
        assert_eq!(agents.agents[0].token_sha256, token_sha256_hex(token.trim()));
        assert!(!agents.agents[0].token_sha256.contains(token.trim()));
        Secret::from_file(&first.gitlab_secret_file).unwrap();

        let second = ensure_dev_setup(&dir).unwrap();
        assert!(!second.created);
        assert_eq!(std::fs::read_to_string(&second.agent_token_file).unwrap(), token);
        assert!(!second.instructions(false, "a", "b", "c").contains(token.trim()));
        assert!(second.instructions(false, "a", "b", "c").contains("(in-memory registry, "));
        assert!(second.instructions(true, "a", "b", "c").contains("(Redis registry (--redis-url), "));
    }
}
