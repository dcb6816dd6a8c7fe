//! The interoperability proof: the real `kas` and `agentk` binaries as processes, and a gRPC
//! client that is not ours (Python, stubs generated from the .proto by grpcio-tools) calling
//! `kas.v1.KasApi/GetPods` through them.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use kas_e2e::FakeKube;
use kas_e2e::process;
use serde_json::{Value, json};
use tokio::process::Command;

const INSTALL_HINT: &str = "pip install grpcio grpcio-tools";

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether `python3` with grpcio and grpcio-tools is available. In CI a missing tool fails the
/// test; elsewhere the test is skipped loudly (never silently).
async fn python_grpc_available() -> bool {
    let probe = Command::new("python3").args(["-c", "import grpc, grpc_tools"]).output().await;
    let problem = match probe {
        Ok(out) if out.status.success() => return true,
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        Err(e) => format!("cannot run python3: {e}"),
    };
    kas_e2e::missing_tool(
        "python_client_gets_pods_through_real_kas_and_agentk_processes",
        &format!("needs python3 with grpcio and grpcio-tools ({INSTALL_HINT}): {problem}"),
    );
    false
}

/// Generates the Python stubs for kas/v1/kas.proto (and the tunnel messages it imports) into `out` (`out/kas/v1/kas_pb2*.py`).
async fn generate_python_stubs(out: &Path) {
    let proto_root = crate_dir().join("../proto/proto");
    let gen_out = Command::new("python3")
        .args(["-m", "grpc_tools.protoc"])
        .arg(format!("-I{}", proto_root.display()))
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()))
        .args([
            "kas/v1/kas.proto",
            "kas/tunnel/v1/tunnel.proto",
            "kas/kubernetes_api/v1/kubernetes_api.proto",
            "kas/gitops/v1/gitops.proto",
        ])
        .output()
        .await
        .expect("run grpc_tools.protoc");
    assert!(gen_out.status.success(), "protoc failed: {}", String::from_utf8_lossy(&gen_out.stderr));
    assert!(out.join("kas/v1/kas_pb2_grpc.py").is_file(), "stubs not where expected");
}

#[tokio::test]
async fn python_client_gets_pods_through_real_kas_and_agentk_processes() {
    if !python_grpc_available().await {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();

    // The cluster: a fake Kubernetes API server, in-process.
    let kube = FakeKube::start().await;
    kube.add_pod("default", "web-1");
    kube.add_pod("kube-system", "dns-1");
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();

    // kas, standalone, as a process.
    let kas_dir = tmp.path().join("kas");
    std::fs::create_dir(&kas_dir).unwrap();
    let kas = process::start_kas_standalone(&kas_dir).await;
    assert_eq!(kas.tls_listeners, "none", "the listening line says which listeners serve TLS");

    // agentk, as a process, with the dev agent's token (agent id 1, project 1).
    let mut agentk = process::start_agentk(
        kas.addresses.agent,
        &kas.agent_token_file(),
        &kubeconfig,
        "agentk-7d9f-abcde",
        "gitlab-agent",
    );
    let connected = agentk.wait_for_message("connected to kas").await;
    let connection_id: i64 = connected["fields"]["connection_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no connection_id in {connected}"));

    // A GitLab-style JWT, minted by the CLI from the dev secret.
    let jwt = process::mint_jwt_with_cli(&kas.gitlab_secret_file(), &[]).await;

    // The foreign client.
    let stubs = tmp.path().join("stubs");
    std::fs::create_dir(&stubs).unwrap();
    generate_python_stubs(&stubs).await;
    let out = Command::new("python3")
        .arg(crate_dir().join("python/get_pods_client.py"))
        .arg(kas.addresses.api.to_string())
        .arg(&jwt)
        .arg("1")
        .env("PYTHONPATH", &stubs)
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "Python client failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));

    let mut pods = result["pods"].as_array().expect("pods array").clone();
    pods.sort_by_key(|p| (p["namespace"].to_string(), p["name"].to_string()));
    let expected: Vec<Value> =
        kube.pod_names().into_iter().map(|(namespace, name)| json!({"namespace": namespace, "name": name})).collect();
    assert_eq!(expected.len(), 2);
    assert_eq!(pods, expected);

    let agents = result["connected_agents"].as_array().expect("connected_agents array");
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert_eq!(agents[0]["id"], 1);
    assert_eq!(agents[0]["project_id"], 1);
    assert_eq!(agents[0]["connection_id"], connection_id);
    assert_eq!(agents[0]["pod_name"], "agentk-7d9f-abcde");
    assert_eq!(agents[0]["pod_namespace"], "gitlab-agent");

    // agentk listed pods with its own credentials, never the caller's JWT.
    let reqs = kube.requests();
    let list = reqs.iter().find(|r| r.path == "/api/v1/pods").expect("a pods list reached the API server");
    let auth = list.headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert_eq!(auth, format!("Bearer {}", kube.token()));

    // Both stop cleanly on SIGTERM: agentk first (it disconnects), then kas.
    let status = agentk.terminate().await;
    assert!(status.success(), "agentk exit: {status}");
    let stopped = kas.process.terminate().await;
    assert!(stopped.success(), "kas exit: {stopped}");
}

/// The standalone flow without GitLab, as a user tries it: the dev agent's configuration comes
/// from a local repository (`configuration_repository` in the agents file), and the real agentk
/// applies the log level it receives at run time.
#[tokio::test]
async fn standalone_agent_configuration_from_a_repository_sets_agentk_log_level() {
    let tmp = tempfile::tempdir().unwrap();
    let kube = FakeKube::start().await;
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let repo = kas_e2e::GitRepo::new();
    repo.commit(".gitlab/agents/dev-agent/config.yaml", b"observability:\n  logging:\n    level: debug\n");

    // First start generates the dev directory; point the dev agent at the repository, restart.
    let kas_dir = tmp.path().join("kas");
    std::fs::create_dir(&kas_dir).unwrap();
    let kas = process::start_kas_standalone(&kas_dir).await;
    let agents_file = kas.dev_dir.join("agents.yaml");
    assert!(kas.process.terminate().await.success());
    let mut agents = kas::auth::agent_token::StaticAgentsFile::load(&agents_file).unwrap();
    // As the README says: the repository replaces the inline configuration standalone wrote.
    assert!(agents.agents[0].configuration.as_ref().is_some_and(|c| c.user_access.is_some()));
    agents.agents[0].configuration = None;
    agents.agents[0].configuration_repository = Some(repo.bare.display().to_string());
    agents.save(&agents_file).unwrap();
    let kas = process::start_kas_standalone(&kas_dir).await;

    let mut agentk =
        process::start_agentk(kas.addresses.agent, &kas.agent_token_file(), &kubeconfig, "agentk-0", "default");
    let applied = agentk.wait_for_message("log level applied from agent configuration").await;
    assert_eq!(applied["fields"]["level"], "debug", "{applied}");
    // agentk started with --log info; debug lines now appear.
    agentk.wait_for_log("a DEBUG line", |v| v["level"] == "DEBUG").await;
    let status = agentk.terminate().await;
    assert!(status.success(), "agentk did not stop cleanly on SIGTERM: {status}");
}
