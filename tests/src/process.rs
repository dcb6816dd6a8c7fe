//! The real `kas` and `agentk` binaries as child processes: locate them, start them, read their
//! JSON logs, stop them. Children are killed when their handle is dropped (SIGKILL), so a failed
//! test leaves no process behind; [`Process::terminate`] is the graceful (SIGTERM) path.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// How long a process gets to print an expected log line (cold start on a loaded machine).
pub const LOG_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a process gets to exit after SIGTERM.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// Removes the environment variables kas and agentk read from a child's environment, so the
/// caller's shell cannot change what a test runs.
fn clear_product_environment(cmd: &mut Command) {
    for var in kas::ENVIRONMENT_VARIABLES.iter().chain(agentk::ENVIRONMENT_VARIABLES) {
        cmd.env_remove(var);
    }
}

/// A workspace binary (`kas`, `agentk`) built next to the running test executable.
///
/// `CARGO_BIN_EXE_*` only exists for binaries of the test's own package; the test executable is
/// `target/<profile>/deps/<test>-<hash>` and the binaries are in `target/<profile>/`.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("path of the running test executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("unexpected test executable location {}", exe.display()));
    let path = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "binary `{name}` not found at {}: run `cargo test --workspace` (it builds the kas and agentk \
         binaries, whose packages have integration tests), or `cargo build --workspace` first",
        path.display()
    );
    assert_not_stale(name, &path);
    path
}

/// `cargo test -p kas-e2e` rebuilds the kas and agentk libraries but not their binaries; a test
/// against an old binary fails in confusing ways, so say so plainly instead.
fn assert_not_stale(name: &str, binary: &Path) {
    let built = std::fs::metadata(binary).and_then(|m| m.modified()).expect("binary mtime");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let package = match name {
        "kas" => "proxy",
        other => other,
    };
    for crate_dir in [package, "proto"] {
        for input in ["src", "proto", "build.rs", "Cargo.toml"] {
            let newest = newest_file(&workspace.join(crate_dir).join(input));
            if let Some((path, _)) = newest.filter(|(_, modified)| *modified > built) {
                panic!(
                    "binary `{name}` ({}) is older than {}: run `cargo test --workspace` or `cargo build \
                     --workspace` (`cargo test -p kas-e2e` does not rebuild the binaries)",
                    binary.display(),
                    path.display()
                );
            }
        }
    }
}

/// The most recently modified source file (`.rs`, `.proto`, `.toml`) at or under `root`.
fn newest_file(root: &Path) -> Option<(PathBuf, std::time::SystemTime)> {
    let mut newest: Option<(PathBuf, std::time::SystemTime)> = None;
    let mut stack = vec![root.to_owned()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        } else if path.extension().is_some_and(|e| e == "rs" || e == "proto" || e == "toml")
            && let Ok(modified) = meta.modified()
            && newest.as_ref().is_none_or(|(_, t)| modified > *t)
        {
            newest = Some((path, modified));
        }
    }
    newest
}

/// A `Command` for a workspace binary with the product's environment variables cleared.
pub fn command(name: &str) -> Command {
    let mut cmd = Command::new(workspace_binary(name));
    clear_product_environment(&mut cmd);
    cmd.kill_on_drop(true);
    cmd
}

/// The message of a tracing-subscriber JSON log line (`{"fields": {"message": ...}, ...}`).
pub fn log_message(line: &Value) -> Option<&str> {
    line["fields"]["message"].as_str()
}

/// A running child process whose stderr is read line by line into memory.
pub struct Process {
    name: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// Number of lines read so far; the sender is dropped at end of stderr.
    read: watch::Receiver<usize>,
    /// How far `wait_for_log` has looked.
    cursor: usize,
}

impl Process {
    /// Spawns `cmd` (stdin and stdout null, stderr captured).
    pub fn spawn(name: &str, mut cmd: Command) -> Self {
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stderr = child.stderr.take().expect("piped stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (count, read) = watch::channel(0);
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let n = {
                    let mut l = sink.lock().unwrap();
                    l.push(line);
                    l.len()
                };
                count.send_replace(n);
            }
        });
        Self { name: name.to_owned(), child, lines, read, cursor: 0 }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("process still running")
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Waits for the next JSON log line (after those already returned) that satisfies `matches`.
    /// Panics with the process's output if it does not come within [`LOG_TIMEOUT`] or stderr ends.
    pub async fn wait_for_log(&mut self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + LOG_TIMEOUT;
        loop {
            let found = {
                let lines = self.lines.lock().unwrap();
                let mut found = None;
                while self.cursor < lines.len() {
                    let line = &lines[self.cursor];
                    self.cursor += 1;
                    if let Ok(v) = serde_json::from_str::<Value>(line)
                        && matches(&v)
                    {
                        found = Some(v);
                        break;
                    }
                }
                found
            };
            if let Some(v) = found {
                return v;
            }
            match tokio::time::timeout_at(deadline, self.read.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    // stderr ended: the process exited (or closed stderr) without the line.
                    let status = tokio::time::timeout(EXIT_TIMEOUT, self.child.wait()).await;
                    panic!(
                        "{} ended its output without logging {what} (exit: {status:?}); stderr:\n{}",
                        self.name,
                        self.stderr()
                    );
                }
                Err(_) => panic!("{} did not log {what} within {LOG_TIMEOUT:?}; stderr:\n{}", self.name, self.stderr()),
            }
        }
    }

    /// Waits for a JSON log line whose message is `message`.
    pub async fn wait_for_message(&mut self, message: &str) -> Value {
        self.wait_for_log(&format!("\"{message}\""), |v| log_message(v) == Some(message)).await
    }

    /// Kills the process with SIGKILL (a crash: no cleanup of any kind) and waits for it.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL");
        let _ = tokio::time::timeout(EXIT_TIMEOUT, self.child.wait()).await;
    }

    /// Sends SIGTERM and waits (at most [`EXIT_TIMEOUT`]) for the process to exit.
    pub async fn terminate(mut self) -> ExitStatus {
        let pid = self.pid();
        let kill = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("run kill(1)");
        assert!(kill.success(), "kill -TERM {pid} failed: {kill}");
        match tokio::time::timeout(EXIT_TIMEOUT, self.child.wait()).await {
            Ok(status) => status.expect("wait for child"),
            Err(_) => {
                panic!("{} did not exit within {EXIT_TIMEOUT:?} of SIGTERM; stderr:\n{}", self.name, self.stderr())
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // A failing test shows what the process said; the child is killed by kill_on_drop.
        if std::thread::panicking() {
            eprintln!("----- {} stderr -----\n{}\n----- end of {} stderr -----", self.name, self.stderr(), self.name);
        }
    }
}

/// `kas` in standalone mode (no config file): generated dev secrets, ephemeral loopback ports.
pub struct KasProcess {
    pub process: Process,
    pub addresses: kas::Addresses,
    /// The dev directory: `gitlab-secret`, `internal-secret`, `agents.yaml`, `agent-token`.
    pub dev_dir: PathBuf,
    /// The non-JSON text kas printed before it started listening (the standalone instructions).
    pub instructions: String,
    /// The "kas listening" line's `tls` field: the listeners serving TLS, or "none".
    pub tls_listeners: String,
}

impl KasProcess {
    pub fn gitlab_secret_file(&self) -> PathBuf {
        self.dev_dir.join("gitlab-secret")
    }

    /// The token of the standalone agent (agent id 1, project 1).
    pub fn agent_token_file(&self) -> PathBuf {
        self.dev_dir.join("agent-token")
    }
}

/// The bound addresses from kas's "kas listening" log line.
fn listening_addresses(line: &Value) -> kas::Addresses {
    kas::Addresses {
        agent: address(line, "agent"),
        api: address(line, "api"),
        internal: address(line, "internal"),
        rest: address(line, "rest"),
        observability: address(line, "observability"),
    }
}

fn address(line: &Value, field: &str) -> SocketAddr {
    let text = line["fields"][field].as_str().unwrap_or_else(|| panic!("no `{field}` in {line}"));
    text.parse().unwrap_or_else(|e| panic!("`{field}` = {text:?} is not an address: {e}"))
}

/// Starts `kas` standalone with its working directory `work_dir`, dev dir `work_dir/dev`, every
/// listener on `127.0.0.1:0` and JSON logs; returns once kas logged "kas listening".
pub async fn start_kas_standalone(work_dir: &Path) -> KasProcess {
    let dev_dir = work_dir.join("dev");
    let mut cmd = command("kas");
    cmd.current_dir(work_dir)
        .arg("--dev-dir")
        .arg(&dev_dir)
        .args(["--agent-address", "127.0.0.1:0"])
        .args(["--api-address", "127.0.0.1:0"])
        .args(["--internal-address", "127.0.0.1:0"])
        .args(["--rest-address", "127.0.0.1:0"])
        .args(["--observability-address", "127.0.0.1:0"])
        .args(["--log-format", "json", "--log", "info"]);
    let mut process = Process::spawn("kas", cmd);
    let listening = process.wait_for_message("kas listening").await;
    let addresses = listening_addresses(&listening);
    let instructions = {
        let lines = process.lines.lock().unwrap();
        lines.iter().filter(|l| serde_json::from_str::<Value>(l).is_err()).cloned().collect::<Vec<_>>().join("\n")
    };
    let tls_listeners = listening["fields"]["tls"].as_str().unwrap_or_default().to_owned();
    KasProcess { process, addresses, dev_dir, instructions, tls_listeners }
}

/// `kas` started from a config file.
pub struct ConfiguredKas {
    pub process: Process,
    pub addresses: kas::Addresses,
    /// The instance id kas logged (what its registry records name).
    pub instance_id: String,
}

/// Starts `kas --config <file>` with `config` written as YAML into `work_dir`; returns once kas
/// logged "kas listening".
pub async fn start_kas_with_config(config: &kas::Config, work_dir: &Path) -> ConfiguredKas {
    start_configured_kas(command("kas"), config, work_dir).await
}

/// [`start_kas_with_config`] with kas's open file limit set to `soft` and `hard` (through the
/// shell's `ulimit`; the hard limit can only be lowered): file descriptor exhaustion without
/// tens of thousands of connections.
pub async fn start_kas_with_config_and_fd_limit(
    config: &kas::Config,
    work_dir: &Path,
    soft: u64,
    hard: u64,
) -> ConfiguredKas {
    let mut cmd = Command::new("sh");
    clear_product_environment(&mut cmd);
    cmd.arg("-c")
        .arg(format!("ulimit -Sn {soft} && ulimit -Hn {hard} && exec \"$0\" \"$@\""))
        .arg(workspace_binary("kas"));
    start_configured_kas(cmd, config, work_dir).await
}

async fn start_configured_kas(mut cmd: Command, config: &kas::Config, work_dir: &Path) -> ConfiguredKas {
    let path = work_dir.join(format!("kas-{}.yaml", rand::random::<u32>()));
    std::fs::write(&path, serde_norway::to_string(config).expect("config as YAML")).expect("write config");
    cmd.current_dir(work_dir).arg("--config").arg(&path).args(["--log-format", "json", "--log", "info"]);
    let mut process = Process::spawn("kas", cmd);
    let listening = process.wait_for_message("kas listening").await;
    let addresses = listening_addresses(&listening);
    let instance_id = listening["fields"]["kas"].as_str().expect("kas instance id in the log").to_owned();
    ConfiguredKas { process, addresses, instance_id }
}

/// Starts `agentk` against a kas agent listener (JSON logs: stderr is not a terminal).
pub fn start_agentk(
    kas_agent: SocketAddr,
    token_file: &Path,
    kubeconfig: &Path,
    pod_name: &str,
    pod_namespace: &str,
) -> Process {
    start_agentk_with_args(kas_agent, token_file, kubeconfig, pod_name, pod_namespace, &[])
}

/// [`start_agentk`] with extra flags (e.g. `--max-tunnels`).
pub fn start_agentk_with_args(
    kas_agent: SocketAddr,
    token_file: &Path,
    kubeconfig: &Path,
    pod_name: &str,
    pod_namespace: &str,
    extra: &[&str],
) -> Process {
    let mut cmd = command("agentk");
    cmd.args(extra);
    cmd.arg("--kas-address")
        .arg(format!("grpc://{kas_agent}"))
        .arg("--token-file")
        .arg(token_file)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--log", "info"])
        // The binary's default is 0.0.0.0:8080 (for the kubelet); tests never take a fixed port.
        .args(["--observability-address", "127.0.0.1:0"])
        .env("POD_NAME", pod_name)
        .env("POD_NAMESPACE", pod_namespace);
    Process::spawn("agentk", cmd)
}

/// Runs `kas mint-jwt --secret-file <file> [extra...]` and returns the printed token.
pub async fn mint_jwt_with_cli(secret_file: &Path, extra: &[&str]) -> String {
    let out = command("kas")
        .arg("mint-jwt")
        .arg("--secret-file")
        .arg(secret_file)
        .args(extra)
        .output()
        .await
        .expect("run kas mint-jwt");
    assert!(out.status.success(), "kas mint-jwt failed: {}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).expect("utf-8 token").trim().to_owned();
    assert_eq!(token.split('.').count(), 3, "not a JWT: {token:?}");
    token
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// Each binary's list is every variable its `--help` names plus those its libraries read:
    /// a flag given a variable (or losing one) without the list changing fails here.
    #[tokio::test]
    async fn the_environment_lists_are_the_variables_of_the_flags_and_libraries() {
        let kubernetes_service = ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"];
        let cases = [
            ("kas", kas::ENVIRONMENT_VARIABLES, &[][..]),
            ("agentk", agentk::ENVIRONMENT_VARIABLES, &kubernetes_service[..]),
        ];
        for (name, list, libraries) in cases {
            let out = super::command(name).arg("--help").output().await.unwrap();
            assert!(out.status.success(), "{name} --help: {}", String::from_utf8_lossy(&out.stderr));
            let help = String::from_utf8_lossy(&out.stdout);
            // clap prints `[env: NAME=]` after the help of a flag read from the environment.
            let mut expected: BTreeSet<&str> =
                help.split("[env: ").skip(1).filter_map(|s| s.split('=').next()).collect();
            expected.extend(["RUST_BACKTRACE", "RUST_LIB_BACKTRACE"]);
            expected.extend(libraries);
            assert_eq!(list.iter().copied().collect::<BTreeSet<_>>(), expected, "{name}:\n{help}");
        }
    }
}
