//! The `agentk` binary and its flags as users (and Kubernetes manifests) pass them.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use agentk::{AgentConfig, Args, KubeSource};
use clap::Parser;

const AGENTK: &str = env!("CARGO_BIN_EXE_agentk");

/// Environment the binary reads; cleared so the caller's shell cannot change what runs.
const ENV: &[&str] = &[
    "AGENTK_KAS_ADDRESS",
    "AGENTK_TOKEN_FILE",
    "AGENTK_CA_CERT_FILE",
    "AGENTK_LOG",
    "KUBECONFIG",
    "POD_NAME",
    "POD_NAMESPACE",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
];

async fn run(args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(AGENTK);
    for var in ENV {
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
    for flag in
        ["--kas-address", "--token-file", "--ca-cert-file", "--kubeconfig", "--min-idle-tunnels", "--max-tunnels"]
    {
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
