//! The README's shell examples that need no cluster, run as written: standalone kas, minting a
//! JWT, the REST curl calls, a second replica on Redis, and kas with a TLS rest listener. The
//! README uses fixed ports (8150-8156, 9150-9156, Redis on 6379), so each scenario runs in its own
//! network namespace (`unshare --net`, a private loopback): nothing on the machine is touched and
//! scenarios cannot collide. `cargo run --bin X --` in the examples runs the binary this test
//! run built (a shell function named `cargo`), in a fresh working directory.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::time::Duration;

use kas_e2e::process::workspace_binary;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap()
}

/// The text of the README's ```sh block that is `needle`, or else the one that contains it.
fn block(needle: &str) -> String {
    let readme = readme();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        let trimmed = line.trim_start();
        match &mut current {
            None if trimmed == "```sh" => current = Some(String::new()),
            Some(text) if trimmed == "```" => {
                blocks.push(std::mem::take(text));
                current = None;
            }
            Some(text) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    if let Some(exact) = blocks.iter().find(|b| *b == needle) {
        return exact.clone();
    }
    let found: Vec<&String> = blocks.iter().filter(|b| b.contains(needle)).collect();
    assert_eq!(found.len(), 1, "README must have exactly one sh block containing {needle:?}");
    found[0].clone()
}

/// Shell commands of a block: backslash-continued lines joined, blank lines dropped.
fn commands(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            continue;
        }
        current.push_str(line);
        if !current.trim().is_empty() {
            out.push(std::mem::take(&mut current));
        }
        current.clear();
    }
    out
}

/// The prelude of every scenario: a private loopback, `cargo run` mapped to the built binaries,
/// background jobs killed on exit, and `wait_live PORT` for a kas observability port.
fn prelude(bin_dir: &Path) -> String {
    format!(
        r#"set -eu
ip link set lo up
KAS_BIN_DIR='{}'
cargo() {{
  [ "$1" = run ] || {{ echo "the README test maps only 'cargo run': cargo $*" >&2; return 2; }}
  shift
  local bin=
  while [ $# -gt 0 ]; do
    case "$1" in
      -q) shift ;;
      --bin) bin=$2; shift 2 ;;
      --) shift; break ;;
      *) echo "unexpected cargo argument $1" >&2; return 2 ;;
    esac
  done
  exec "$KAS_BIN_DIR/$bin" "$@"
}}
trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT
wait_live() {{
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$1/livez" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "nothing live on port $1" >&2
  return 1
}}
"#,
        bin_dir.display()
    )
}

/// Runs a scenario script in its own network namespace, in `dir`; returns stdout, panics with
/// everything on failure.
async fn run_isolated(dir: &Path, script: &str) -> String {
    let path = dir.join("scenario.sh");
    std::fs::write(&path, script).unwrap();
    let out = tokio::process::Command::new("unshare")
        .args(["--net", "bash"])
        .arg(&path)
        .current_dir(dir)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("scenario finishes within 120 s")
        .expect("unshare is part of util-linux");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logs: String = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| format!("--- {}\n{}\n", e.path().display(), std::fs::read_to_string(e.path()).unwrap_or_default()))
        .collect();
    assert!(
        out.status.success(),
        "scenario failed ({}):\n{script}\nstdout:\n{stdout}\nstderr:\n{stderr}\n{logs}",
        out.status
    );
    stdout
}

fn bin_dir() -> PathBuf {
    workspace_binary("kas").parent().unwrap().to_owned()
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// "The two commands" (standalone kas), "Call the API" (mint a JWT) and the REST gateway's curl
/// calls, then "kubectl through kas"'s TLS config, each block as the README writes it.
#[tokio::test]
async fn readme_standalone_rest_and_tls_examples_work_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let run = block("cargo run --bin kas\n");
    assert_eq!(commands(&run), vec!["cargo run --bin kas"]);
    let mint = block("TOKEN=$(cargo run -q --bin kas -- mint-jwt --secret-file .kas-dev/gitlab-secret)\n");
    let curls = block("/api/v1/projects/1/agents");
    let gitops = block("/api/v1/agents/1/gitops");
    let tls = block("kas-tls.yaml");
    let add_user = block("add-user --users-file .kas-dev/users.yaml");
    let kubectl_user = block("--token \"$(cat .kas-dev/alice-token)\"");

    let mut script = prelude(&bin_dir());
    // Standalone kas in the background (its default observability port is 8151).
    script.push_str(&format!("( {} ) > standalone.log 2>&1 &\nwait_live 8151\n", run.trim()));
    script.push_str(&mint);
    script.push_str("test -n \"$TOKEN\"\n");
    // The curl calls run side by side (two of them wait routing.max_wait for the absent agent).
    let mut n = 0;
    for command in commands(&curls) {
        if command.starts_with("curl ") {
            n += 1;
            script.push_str(&format!("{command} > curl-{n}.out 2> curl-{n}.err &\n"));
        } else {
            script.push_str(&format!("{command}\n"));
        }
    }
    script.push_str("wait %2 %3 %4 %5\n");
    // "GitOps status and push events": the status of agent 1 (no manifest projects) and a push.
    let mut g = 0;
    for command in commands(&gitops) {
        if command.starts_with("curl ") {
            g += 1;
            script.push_str(&format!("{command} > gitops-{g}.out\n"));
        } else {
            script.push_str(&format!("{command}\n"));
        }
    }
    script.push_str("kill %1; wait %1 || true\n");
    // "kubectl for a person", without GitLab: a user added while kas is stopped, loaded by the
    // TLS kas below.
    // (In a subshell: the prelude's `cargo` execs the binary.)
    script.push_str(&format!("( {} )\n", add_user.trim()));
    // The TLS example: everything but its last command (kas itself), which runs in the background.
    let (setup, serve) = tls.trim_end().rsplit_once('\n').unwrap();
    assert!(serve.starts_with("cargo run --bin kas -- --config kas-tls.yaml"), "{serve}");
    script.push_str(setup);
    script.push_str(&format!(
        "\n( {serve} ) > tls.log 2>&1 &\nwait_live 8151\n\
         curl -sS --cacert .kas-dev/rest.crt -H \"Authorization: Bearer $TOKEN\" \
         https://127.0.0.1:8154/api/v1/agents/1/connections > tls.out\n"
    ));
    // alice's kubectl, as written (HOME here: kubectl's cache stays in the scenario).
    script.push_str(&format!(
        "export HOME=\"$PWD\"\n( {} ) > kubectl-user.out 2> kubectl-user.err || true\n",
        kubectl_user.trim()
    ));
    script.push_str(
        "kubectl --server https://127.0.0.1:8154/api/v1/agents/1/kubernetes --certificate-authority .kas-dev/rest.crt \
         --token kasu_not-a-user get pods > kubectl-stranger.out 2> kubectl-stranger.err || true\n",
    );
    run_isolated(dir.path(), &script).await;

    assert_eq!(n, 4, "the README's REST block has four curl calls");
    let pods = read(dir.path(), "curl-1.out");
    assert!(pods.contains("agent 1 is not connected (waited 20s for it to connect)"), "{pods}");
    let named = read(dir.path(), "curl-2.out");
    assert!(named.contains("connection 4711 of agent 1 is not connected"), "{named}");
    assert_eq!(read(dir.path(), "curl-3.out"), r#"{"connections":[]}"#);
    assert_eq!(read(dir.path(), "curl-4.out"), r#"{"connections":[]}"#);
    assert_eq!(
        read(dir.path(), "gitops-1.out"),
        r#"{"agent_id":"1","projects_from":"configuration","manifest_projects":[]}"#
    );
    assert_eq!(read(dir.path(), "gitops-2.out"), "", "the push is a 204 without a body");
    let standalone = read(dir.path(), "standalone.log");
    assert!(standalone.contains("standalone mode (in-memory registry"), "{standalone}");
    assert_eq!(read(dir.path(), "tls.out"), r#"{"connections":[]}"#);
    // alice's token was accepted (agent 1 admits group dev); no agentk is connected here.
    let token = read(dir.path(), ".kas-dev/alice-token");
    assert!(token.starts_with("kasu_"), "{token}");
    let users = read(dir.path(), ".kas-dev/users.yaml");
    assert!(users.contains("name: alice") && users.contains("- dev") && !users.contains(token.trim()), "{users}");
    let alice = read(dir.path(), "kubectl-user.err");
    assert!(alice.contains("Warning: agent 1 is not connected"), "{alice}");
    let stranger = read(dir.path(), "kubectl-stranger.err");
    assert!(stranger.contains("Warning: invalid kas user token"), "{stranger}");
    let tls_log = read(dir.path(), "tls.log");
    assert!(tls_log.contains(r#""tls":"rest""#) || tls_log.contains("tls=rest"), "{tls_log}");
}

/// "Many kas replicas": two standalone kas on the Redis at 127.0.0.1:6379, as written.
#[tokio::test]
async fn readme_second_replica_example_works_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let replicas = commands(&block("--redis-url redis://127.0.0.1:6379"));
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    let mut script = prelude(&bin_dir());
    // "the Redis on 127.0.0.1:6379" of the README, private to this namespace.
    script.push_str(
        "redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no > redis.log 2>&1 &\n\
         for _ in $(seq 100); do redis-cli -p 6379 ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done\n",
    );
    // Two terminals: the first replica is up before the second starts (they share .kas-dev/).
    script.push_str(&format!("( {} ) > replica-1.log 2>&1 &\nwait_live 8151\n", replicas[0]));
    script.push_str(&format!("( {} ) > replica-2.log 2>&1 &\nwait_live 9156\n", replicas[1]));
    script.push_str(&block("TOKEN=$(cargo run -q --bin kas -- mint-jwt --secret-file .kas-dev/gitlab-secret)\n"));
    for port in [8154, 9154] {
        script.push_str(&format!(
            "curl -sS -H \"Authorization: Bearer $TOKEN\" http://127.0.0.1:{port}/api/v1/agents/1/connections \
             > connections-{port}.out\n"
        ));
    }
    run_isolated(dir.path(), &script).await;
    for replica in ["replica-1.log", "replica-2.log"] {
        let log = read(dir.path(), replica);
        assert!(log.contains("standalone mode (Redis registry"), "{replica}: {log}");
    }
    for port in [8154, 9154] {
        assert_eq!(read(dir.path(), &format!("connections-{port}.out")), r#"{"connections":[]}"#);
    }
}
