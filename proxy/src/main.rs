//! The `kas` binary: parse flags, set up logging, run the library `App`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kas::auth::agent_token::{StaticAgent, StaticAgentsFile, generate_agent_token, token_sha256_hex};
use kas::auth::static_users::{StaticUser, StaticUsersFile, generate_user_token};
use kas::auth::{Secret, mint_jwt};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "kas", version, about = "kas: routes requests to Kubernetes agents (agentk) over reverse tunnels")]
struct Cli {
    /// YAML config file. Without it kas runs standalone with generated dev secrets.
    #[arg(long, env = "KAS_CONFIG")]
    config: Option<PathBuf>,
    /// Where standalone mode keeps its generated secrets and agents file.
    #[arg(long, env = "KAS_DEV_DIR", default_value = ".kas-dev")]
    dev_dir: PathBuf,
    /// Overrides listeners.agent.address (e.g. 0.0.0.0:8150; port 0 picks a free port).
    #[arg(long, env = "KAS_AGENT_ADDRESS")]
    agent_address: Option<String>,
    /// Overrides listeners.api.address.
    #[arg(long, env = "KAS_API_ADDRESS")]
    api_address: Option<String>,
    /// Overrides listeners.internal.address.
    #[arg(long, env = "KAS_INTERNAL_ADDRESS")]
    internal_address: Option<String>,
    /// Overrides listeners.rest.address (the REST gateway).
    #[arg(long, env = "KAS_REST_ADDRESS")]
    rest_address: Option<String>,
    /// Overrides listeners.observability.address (/metrics, /livez, /readyz).
    #[arg(long, env = "KAS_OBSERVABILITY_ADDRESS")]
    observability_address: Option<String>,
    /// Use Redis as the registry (many replicas): redis://, rediss:// or unix:// URL of one Redis
    /// server. Overrides registry.redis.url and replaces registry.redis.cluster_nodes (other Redis
    /// settings keep their config values or defaults).
    #[arg(long, env = "KAS_REDIS_URL")]
    redis_url: Option<String>,
    /// Log filter, e.g. `info` or `kas=debug`.
    #[arg(long, env = "KAS_LOG", default_value = "info")]
    log: String,
    /// Log format: `json` or `text` (default: text on a terminal, json otherwise).
    #[arg(long, env = "KAS_LOG_FORMAT")]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[derive(Subcommand)]
enum Command {
    /// Print a JWT signed with a secret file (GitLab-style by default), for curl/grpcurl.
    MintJwt {
        #[arg(long)]
        secret_file: PathBuf,
        #[arg(long, default_value = "gitlab")]
        issuer: String,
        #[arg(long, default_value = "gitlab-kas")]
        audience: String,
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// Add an agent to a static agents file and print (or write) its new token.
    AddAgent {
        #[arg(long)]
        agents_file: PathBuf,
        #[arg(long)]
        id: i64,
        #[arg(long)]
        name: String,
        #[arg(long)]
        project_id: i64,
        /// Write the token to this file (0600) instead of printing it.
        #[arg(long)]
        token_file: Option<PathBuf>,
    },
    /// Add a user to a users file (auth.users_file) and print (or write) their new token, for
    /// kubectl through the Kubernetes API proxy without GitLab.
    AddUser {
        #[arg(long)]
        users_file: PathBuf,
        #[arg(long)]
        name: String,
        /// A group the user is a member of (full path; repeat for more).
        #[arg(long = "group")]
        groups: Vec<String>,
        /// A project the user is a member of (full path; repeat for more).
        #[arg(long = "project")]
        projects: Vec<String>,
        /// Write the token to this file (0600) instead of printing it.
        #[arg(long)]
        token_file: Option<PathBuf>,
    },
    /// Print the REST gateway's OpenAPI document (what `openapi/openapi.json` must contain).
    Openapi,
}

fn init_logging(filter: &str, format: Option<LogFormat>) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).context("invalid --log filter")?;
    let json = match format {
        Some(LogFormat::Json) => true,
        Some(LogFormat::Text) => false,
        None => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().fmt_fields(kas::log_format::JsonSpanFields).init()
    } else {
        builder.init()
    }
    Ok(())
}

/// jemalloc, purging from its background threads: memory freed when agents leave goes back to
/// the system within seconds (glibc's per-thread arenas kept a kas's peak RSS: issue 18).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::MintJwt { secret_file, issuer, audience, ttl }) => {
            let secret = Secret::from_file(&secret_file)?;
            println!("{}", mint_jwt(&secret, &issuer, &audience, ttl)?);
            Ok(())
        }
        Some(Command::AddAgent { agents_file, id, name, project_id, token_file }) => {
            add_agent(agents_file, id, name, project_id, token_file)
        }
        Some(Command::AddUser { users_file, name, groups, projects, token_file }) => {
            add_user(users_file, StaticUser { name, token_sha256: String::new(), groups, projects }, token_file)
        }
        Some(Command::Openapi) => {
            print!("{}", kas::server::rest::openapi_json());
            Ok(())
        }
        None => {
            init_logging(&cli.log, cli.log_format)?;
            // Without background threads jemalloc purges only while it allocates: an idle kas
            // would keep what agents that left had used.
            if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
                tracing::warn!(error = %e, "cannot start jemalloc's background purging; freed memory stays with kas");
            }
            let overrides =
                [cli.agent_address, cli.api_address, cli.internal_address, cli.rest_address, cli.observability_address];
            run(cli.config, cli.dev_dir, overrides, cli.redis_url).await
        }
    }
}

async fn run(
    config: Option<PathBuf>,
    dev_dir: PathBuf,
    overrides: [Option<String>; 5],
    redis_url: Option<String>,
) -> anyhow::Result<()> {
    let (mut config, dev) = match config {
        Some(path) => (kas::Config::load(&path)?, None),
        None => {
            let dev = kas::standalone::ensure_dev_setup(&dev_dir)?;
            (dev.config.clone(), Some(dev))
        }
    };
    // Same order as ListenersConfig::all_mut: agent, api, internal, rest, observability.
    for ((_, listener), value) in config.listeners.all_mut().into_iter().zip(overrides) {
        if let Some(v) = value {
            listener.address = v;
        }
    }
    // Installed here, not in the spawned task: a SIGTERM right after "kas listening" must drain,
    // not kill kas (the default action) because the task has not run yet.
    let term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(term, interrupt, shutdown.clone()));
    if let Some(url) = redis_url {
        match &mut config.registry.redis {
            Some(redis) => {
                redis.url = Some(url);
                redis.cluster_nodes.clear();
            }
            None => config.registry.redis = Some(kas::registry::redis::RedisConfig::new(url)),
        }
    }
    let redis = config.registry.redis.is_some();
    // Before binding: the default per-listener connection caps follow this limit.
    let open_files = kas::server::listen::raise_fd_limit();
    tracing::info!(open_files, "open file limit");
    let bound = kas::App::new(config).bind().await?;
    if let Some(dev) = dev {
        let a = bound.addresses();
        eprintln!("\n{}", dev.instructions(redis, &a.agent.to_string(), &a.api.to_string(), &a.rest.to_string()));
    }
    bound.serve(shutdown).await?;
    Ok(())
}

async fn signal_shutdown(mut term: Signal, mut interrupt: Signal, token: CancellationToken) {
    tokio::select! {
        _ = term.recv() => {}
        _ = interrupt.recv() => {}
    }
    token.cancel();
}

fn add_agent(
    agents_file: PathBuf,
    id: i64,
    name: String,
    project_id: i64,
    token_file: Option<PathBuf>,
) -> anyhow::Result<()> {
    let token = generate_agent_token();
    let agent = StaticAgent {
        id,
        name,
        project_id,
        token_sha256: token_sha256_hex(&token),
        configuration: None,
        configuration_repository: None,
        configuration_branch: None,
    };
    // Validate first (nothing written on a bad request), then store the token, then register the
    // agent: an agent registered without a saved token would be unusable.
    let updated = StaticAgentsFile::with_added(&agents_file, agent)?;
    store_token(&token, token_file.as_deref())?;
    updated.save(&agents_file)?;
    announce(&format!("agent {id} added"), &token, token_file.as_deref());
    Ok(())
}

fn add_user(users_file: PathBuf, mut user: StaticUser, token_file: Option<PathBuf>) -> anyhow::Result<()> {
    let token = generate_user_token();
    user.token_sha256 = token_sha256_hex(&token);
    let name = user.name.clone();
    // The same order as add-agent: a user registered without a saved token would be unusable.
    let updated = StaticUsersFile::with_added(&users_file, user)?;
    store_token(&token, token_file.as_deref())?;
    updated.save(&users_file)?;
    announce(&format!("user {name} added"), &token, token_file.as_deref());
    Ok(())
}

fn store_token(token: &str, token_file: Option<&std::path::Path>) -> anyhow::Result<()> {
    if let Some(path) = token_file {
        kas::tools::private_file::write(path, format!("{token}\n").as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The token on stdout (for `$(...)`), or where it was written on stderr.
fn announce(what: &str, token: &str, token_file: Option<&std::path::Path>) {
    match token_file {
        Some(path) => eprintln!("{what}; token written to {}; restart kas to load it", path.display()),
        None => {
            eprintln!("{what}; restart kas to load it");
            println!("{token}")
        }
    }
}
