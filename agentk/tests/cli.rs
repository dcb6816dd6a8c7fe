//! The `agentk` binary and its flags as users (and Kubernetes manifests) pass them.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use agentk::{AgentConfig, Args, KubeSource};
use clap::Parser;

const AGENTK: &str = env!("CARGO_BIN_EXE_agentk");

async fn run(args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(AGENTK);
    for var in agentk::ENVIRONMENT_VARIABLES {
        cmd.env_remove(var);
    }
    let out = cmd.args(args).stdin(Stdio::null()).kill_on_drop(true).output();
    tokio::time::timeout(Duration::from_secs(20), out).await.expect("agentk exits within 20 s").unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn help_lists_the_flags() {
    let out = run(&["--help"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let help = text(&out.stdout);
    for flag in [
        "--kas-address",
        "--token-file",
        "--ca-cert-file",
        "--kubeconfig",
        "--min-idle-tunnels",
        "--max-tunnels",
        "--observability-address",
        "--kube-api-connect-timeout",
        "--kube-api-response-header-timeout",
    ] {
        assert!(help.contains(flag), "`agentk --help` does not mention {flag}:\n{help}");
    }
}

fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
    let mut argv = vec!["agentk", "--kas-address", "grpcs://kas.example.com:443", "--token-file", "/var/run/token"];
    argv.extend_from_slice(extra);
    Args::try_parse_from(argv)
}

#[test]
fn typical_flags_parse_into_a_valid_config() {
    let args = parse(&[
        "--ca-cert-file",
        "/etc/kas/ca.pem",
        "--kubeconfig",
        "/home/dev/.kube/config",
        "--min-idle-tunnels",
        "3",
        "--max-tunnels",
        "50",
        "--grace-period",
        "15s",
        "--pod-name",
        "agentk-0",
        "--pod-namespace",
        "gitlab-agent",
    ])
    .unwrap();
    assert_eq!(args.kas_address, "grpcs://kas.example.com:443");
    assert_eq!(args.token_file, PathBuf::from("/var/run/token"));
    assert_eq!(args.ca_cert_file, Some(PathBuf::from("/etc/kas/ca.pem")));
    assert_eq!((args.min_idle_tunnels, args.max_tunnels), (3, 50));
    assert_eq!(args.grace_period, Duration::from_secs(15));
    // Defaults of the Kubernetes API timeouts are the documented constants.
    assert_eq!(args.kube_api_connect_timeout, agentk::config::DEFAULT_KUBE_API_CONNECT_TIMEOUT);
    assert_eq!(args.kube_api_response_header_timeout, agentk::config::DEFAULT_KUBE_API_RESPONSE_HEADER_TIMEOUT);

    let config = AgentConfig::from_args(&args).unwrap();
    assert!(matches!(&config.kube, KubeSource::Kubeconfig(p) if p == &PathBuf::from("/home/dev/.kube/config")));
    assert_eq!((config.pod_name.as_str(), config.pod_namespace.as_str()), ("agentk-0", "gitlab-agent"));
    assert_eq!(config.grace_period, Duration::from_secs(15));

    // Required flags are required (unless the environment provides them).
    if std::env::var_os("AGENTK_KAS_ADDRESS").is_none() {
        let err = Args::try_parse_from(["agentk", "--token-file", "/t"]).unwrap_err();
        assert!(err.to_string().contains("--kas-address"), "{err}");
    }
}

#[test]
fn invalid_flag_values_are_rejected_with_clear_messages() {
    let mut args = parse(&[]).unwrap();
    args.kas_address = "http://x".into();
    let err = AgentConfig::from_args(&args).unwrap_err().to_string();
    assert!(err.contains("grpc://") && err.contains("http://x"), "{err}");

    let args = parse(&["--min-idle-tunnels", "0"]).unwrap();
    let err = AgentConfig::from_args(&args).unwrap_err().to_string();
    assert!(err.contains("--min-idle-tunnels (0) must be at least 1"), "{err}");

    let args = parse(&["--min-idle-tunnels", "10", "--max-tunnels", "5"]).unwrap();
    let err = AgentConfig::from_args(&args).unwrap_err().to_string();
    assert!(err.contains("at most --max-tunnels (5)"), "{err}");

    let args = parse(&["--kube-api-response-header-timeout", "0s"]).unwrap();
    let err = AgentConfig::from_args(&args).unwrap_err().to_string();
    assert!(err.contains("--kube-api-response-header-timeout must be above zero"), "{err}");

    let err = parse(&["--grace-period", "soon"]).unwrap_err().to_string();
    assert!(err.contains("--grace-period"), "{err}");
}

#[tokio::test]
async fn missing_token_file_is_a_startup_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("no-such-token");
    let kubeconfig = dir.path().join("kubeconfig");
    let out = run(&[
        "--kas-address",
        "grpc://127.0.0.1:1",
        "--token-file",
        token_file.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ])
    .await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("token file") && stderr.contains(token_file.to_str().unwrap()), "{stderr}");
}

#[tokio::test]
async fn invalid_kas_address_is_a_startup_error() {
    let out = run(&["--kas-address", "kas.example.com:443", "--token-file", "/nonexistent"]).await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--kas-address must start with grpc:// or grpcs://"), "{stderr}");
}

#[test]
fn observability_address_defaults_to_all_interfaces_on_8080_for_the_binary_only() {
    if std::env::var_os("AGENTK_OBSERVABILITY_ADDRESS").is_none() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.observability_address, "0.0.0.0:8080".parse::<SocketAddr>().unwrap());
        assert_eq!(agentk::config::DEFAULT_OBSERVABILITY_ADDRESS, "0.0.0.0:8080");
    }
    let args = parse(&["--observability-address", "127.0.0.1:9090"]).unwrap();
    let config = AgentConfig::from_args(&args).unwrap();
    assert_eq!(config.observability_address, "127.0.0.1:9090".parse::<SocketAddr>().unwrap());

    // Embedded agentk (tests) never takes a fixed port.
    let embedded = AgentConfig::new("grpc://127.0.0.1:1", "/t", KubeSource::InCluster);
    assert_eq!(embedded.observability_address, "127.0.0.1:0".parse::<SocketAddr>().unwrap());

    let err = parse(&["--observability-address", "localhost"]).unwrap_err().to_string();
    assert!(err.contains("--observability-address"), "{err}");
}

/// README: every flag can also be set by environment. Each flag of `agentk --help` names its
/// variable, and a bad value there is refused like a bad flag, not ignored.
#[tokio::test]
async fn every_flag_has_an_environment_variable_and_bad_values_there_are_refused() {
    use clap::CommandFactory;
    for arg in Args::command().get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "help" | "version") {
            continue;
        }
        assert!(arg.get_env().is_some(), "--{} has no environment variable", arg.get_long().unwrap_or(id));
    }
    for (var, flag) in [
        ("AGENTK_MAX_TUNNELS", "--max-tunnels"),
        ("AGENTK_MIN_IDLE_TUNNELS", "--min-idle-tunnels"),
        ("AGENTK_GRACE_PERIOD", "--grace-period"),
    ] {
        let mut cmd = tokio::process::Command::new(AGENTK);
        for v in agentk::ENVIRONMENT_VARIABLES {
            cmd.env_remove(v);
        }
        cmd.env(var, "abc").args(["--kas-address", "grpc://127.0.0.1:1", "--token-file", "/nonexistent"]);
        let out =
            tokio::time::timeout(Duration::from_secs(20), cmd.stdin(Stdio::null()).output()).await.unwrap().unwrap();
        assert!(!out.status.success(), "{var}=abc was accepted");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(flag) && stderr.contains("abc"), "{var}=abc: {stderr}");
    }
}

/// Outside a cluster without --kubeconfig, the error says what to do.
#[tokio::test]
async fn outside_a_cluster_without_kubeconfig_the_error_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t").unwrap();
    let out = run(&["--kas-address", "grpc://127.0.0.1:1", "--token-file", token_file.to_str().unwrap()]).await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("not running in a Kubernetes pod") && stderr.contains("--kubeconfig"), "{stderr}");
}

/// A kubeconfig kube-rs accepts without contacting the (absent) API server.
fn write_kubeconfig(dir: &Path) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
         clusters: [{name: test, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
         users: [{name: test, user: {token: not-used}}]\n\
         contexts: [{name: test, context: {cluster: test, user: test}}]\n",
    )
    .unwrap();
    path
}

#[tokio::test]
async fn busy_observability_address_is_a_startup_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t").unwrap();
    let kubeconfig = write_kubeconfig(dir.path());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let out = run(&[
        "--kas-address",
        "grpc://127.0.0.1:1",
        "--token-file",
        token_file.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--observability-address",
        &address,
    ])
    .await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&format!("cannot listen on --observability-address {address}")), "{stderr}");
}

/// One HTTP GET: (status code, body).
async fn http_get(address: SocketAddr, path: &str) -> (u16, String) {
    let response = reqwest::get(format!("http://{address}{path}")).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// The binary serves the probes the Helm chart configures: alive, and not ready while kas is
/// unreachable; SIGTERM still stops it cleanly.
#[tokio::test]
async fn binary_serves_livez_and_readyz() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t").unwrap();
    let kubeconfig = write_kubeconfig(dir.path());
    // Nothing listens on this port: bound, then closed.
    let no_kas = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut cmd = tokio::process::Command::new(AGENTK);
    for var in agentk::ENVIRONMENT_VARIABLES {
        cmd.env_remove(var);
    }
    cmd.args(["--kas-address", &format!("grpc://{no_kas}"), "--token-file"])
        .arg(&token_file)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--observability-address", "127.0.0.1:0", "--log", "info"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let address: SocketAddr = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = lines.next_line().await.unwrap().unwrap_or_else(|| panic!("agentk exited:\n{seen:?}"));
            if line.contains("observability listening")
                && let Some(a) = line.split("\"address\":\"").nth(1).and_then(|r| r.split('"').next())
            {
                break a.parse().unwrap();
            }
            seen.push(line);
        }
    })
    .await
    .expect("agentk logs its observability address within 30 s");
    assert_eq!(address.ip().to_string(), "127.0.0.1");
    assert_ne!(address.port(), 0);

    assert_eq!(http_get(address, agentk::LIVEZ_PATH).await, (200, "ok\n".to_owned()));
    let (code, body) = http_get(address, agentk::READYZ_PATH).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("not connected to kas"), "{body}");

    let pid = child.id().unwrap().to_string();
    let kill = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(kill.success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("exits on SIGTERM").unwrap();
    assert!(status.success(), "{status}");
}
