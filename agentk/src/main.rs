//! The `agentk` binary: parse flags, set up logging, run the library `App`.

use std::io::IsTerminal;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use tokio::signal::unix;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::prelude::*;
use tracing_subscriber::{EnvFilter, reload};

/// jemalloc, as in kas: glibc's malloc was ~9 % of agentk's CPU on the proxied request path
/// (issue 14's profile), and jemalloc's background threads give freed memory back.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = agentk::Args::parse();
    let (filter, reload_handle) = reload::Layer::new(EnvFilter::try_new(&args.log).context("invalid --log filter")?);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    if std::io::stderr().is_terminal() {
        registry.with(fmt).init()
    } else {
        registry.with(fmt.json()).init()
    }

    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(error = %e, "cannot start jemalloc's background purging; freed memory stays with agentk");
    }

    let config = agentk::AgentConfig::from_args(&args)?;
    let default_log = args.log.clone();
    // The agent configuration may change the log level at run time; empty restores the flag.
    let observer = Arc::new(move |c: &kas_proto::tunnel::pb::AgentConfiguration| {
        let level =
            c.observability.as_ref().and_then(|o| o.logging.as_ref()).map(|l| l.level.clone()).unwrap_or_default();
        let wanted = if level.is_empty() { default_log.clone() } else { level };
        match EnvFilter::try_new(&wanted) {
            Ok(f) => {
                if reload_handle.reload(f).is_ok() {
                    tracing::info!(level = %wanted, "log level applied from agent configuration");
                }
            }
            Err(e) => tracing::warn!(level = %wanted, error = %e, "ignoring invalid log level in agent configuration"),
        }
    });
    let app = agentk::App::new(config).await?.with_configuration_observer(observer);
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    // Installed before the task is spawned: a SIGTERM that arrives before the task first runs
    // must drain, not kill agentk (the default action).
    let mut term = unix::signal(unix::SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut interrupt = unix::signal(unix::SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        signal.cancel();
    });
    app.run(shutdown).await;
    Ok(())
}
