//! The `kas` binary as users run it: `--help`, `mint-jwt`, `add-agent`, a bad config file, and
//! standalone mode (start, print instructions, serve, stop on SIGTERM).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use kas::auth::{JwtVerifier, Secret, StaticAgents, TokenVerifier};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

const KAS: &str = env!("CARGO_BIN_EXE_kas");
/// How long kas gets to start listening, and to exit after SIGTERM.
const TIMEOUT: Duration = Duration::from_secs(20);

fn kas(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(KAS);
    for var in kas::ENVIRONMENT_VARIABLES {
        cmd.env_remove(var);
    }
    cmd.args(args).stdin(Stdio::null());
    cmd
}

fn run(args: &[&str]) -> Output {
    kas(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn help_lists_the_subcommands() {
    let out = run(&["--help"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let help = text(&out.stdout);
    for word in ["mint-jwt", "add-agent", "--config", "--dev-dir", "--log-format"] {
        assert!(help.contains(word), "`kas --help` does not mention {word}:\n{help}");
    }
}

#[test]
fn mint_jwt_signs_tokens_for_the_chosen_listener() {
    let dir = tempfile::tempdir().unwrap();
    let secret = Secret::generate();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, secret.to_file_text()).unwrap();

    // Default: a GitLab token, for the api listener only.
    let out = run(&["mint-jwt", "--secret-file", path_str(&secret_file)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let token = text(&out.stdout).trim().to_owned();
    JwtVerifier::gitlab(&secret).verify(&token).expect("GitLab verifier accepts the default token");
    assert!(JwtVerifier::internal(&secret).verify(&token).is_err(), "internal verifier accepts a GitLab token");
    assert!(JwtVerifier::gitlab(&Secret::generate()).verify(&token).is_err(), "another secret accepts the token");

    // --issuer gitlab-kas: a kas -> kas token, for the internal listener only.
    let out = run(&["mint-jwt", "--secret-file", path_str(&secret_file), "--issuer", "gitlab-kas"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let token = text(&out.stdout).trim().to_owned();
    let err = JwtVerifier::gitlab(&secret).verify(&token).unwrap_err();
    assert!(err.to_string().contains("wrong issuer"), "{err}");
    JwtVerifier::internal(&secret).verify(&token).expect("internal verifier accepts a gitlab-kas token");

    // A secret that is not 32 bytes is refused with the reason.
    let short = dir.path().join("short");
    std::fs::write(&short, "YWJj\n").unwrap();
    let out = run(&["mint-jwt", "--secret-file", path_str(&short)]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "printed something despite the error: {}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("must decode to 32 bytes"), "{stderr}");
    assert!(stderr.contains(path_str(&short)), "the message should name the file: {stderr}");
}

#[tokio::test]
async fn add_agent_creates_and_extends_the_agents_file() {
    let dir = tempfile::tempdir().unwrap();
    let agents_file = dir.path().join("agents.yaml");
    let token_file = dir.path().join("agent-2-token");
    let agents = path_str(&agents_file);

    // A new file, token written to a private file (not printed).
    let out = run(&[
        "add-agent",
        "--agents-file",
        agents,
        "--id",
        "2",
        "--name",
        "x",
        "--project-id",
        "3",
        "--token-file",
        path_str(&token_file),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(mode(&token_file), 0o600);
    let token2 = std::fs::read_to_string(&token_file).unwrap().trim().to_owned();
    assert!(!token2.is_empty());
    assert!(!text(&out.stdout).contains(&token2) && !text(&out.stderr).contains(&token2), "token printed");
    assert!(!std::fs::read_to_string(&agents_file).unwrap().contains(&token2), "token stored in the agents file");
    let identity = StaticAgents::from_file(&agents_file).unwrap().verify(&token2).await.expect("token verifies");
    assert_eq!((identity.agent_id.0, identity.project_id.0, identity.name.as_str()), (2, 3, "x"));

    // A second agent extends the file; without --token-file the token goes to stdout.
    let out = run(&["add-agent", "--agents-file", agents, "--id", "4", "--name", "y", "--project-id", "3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let token4 = text(&out.stdout).trim().to_owned();
    let verifier = StaticAgents::from_file(&agents_file).unwrap();
    assert_eq!(verifier.verify(&token4).await.unwrap().agent_id.0, 4);
    assert_eq!(verifier.verify(&token2).await.unwrap().agent_id.0, 2, "the first agent is still there");

    // The same id again: refused, and nothing changes.
    let before = std::fs::read_to_string(&agents_file).unwrap();
    let out = run(&[
        "add-agent",
        "--agents-file",
        agents,
        "--id",
        "2",
        "--name",
        "again",
        "--project-id",
        "3",
        "--token-file",
        path_str(&token_file),
    ]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("agent id 2 is already in the file"), "{stderr}");
    assert!(stderr.contains(agents), "the message should name the file: {stderr}");
    assert_eq!(std::fs::read_to_string(&agents_file).unwrap(), before);
    assert_eq!(std::fs::read_to_string(&token_file).unwrap().trim(), token2, "token file overwritten");
}

#[test]
fn config_with_an_unknown_key_is_rejected_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(&config, "listeners:\n  api:\n    adress: x\n").unwrap();
    let out = run(&["--config", path_str(&config), "--log-format", "json"]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("unknown field `adress`"), "{stderr}");
    assert!(stderr.contains(path_str(&config)), "the message should name the file: {stderr}");
}

/// A running standalone kas whose stderr is read line by line.
struct Standalone {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    /// Everything read so far (for failure messages).
    seen: Vec<String>,
}

impl Standalone {
    fn start(work_dir: &Path, dev_dir: &Path) -> Self {
        let mut cmd = tokio::process::Command::new(KAS);
        for var in kas::ENVIRONMENT_VARIABLES {
            cmd.env_remove(var);
        }
        let mut child = cmd
            .current_dir(work_dir)
            .args(["--dev-dir", path_str(dev_dir)])
            .args(["--agent-address", "127.0.0.1:0", "--api-address", "127.0.0.1:0"])
            .args(["--internal-address", "127.0.0.1:0", "--log-format", "json"])
            .args(["--rest-address", "127.0.0.1:0", "--observability-address", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        Self { child, lines, seen: Vec::new() }
    }

    /// Reads stderr until the JSON log line with `message`; returns it.
    async fn wait_for(&mut self, message: &str) -> Value {
        let read = async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                self.seen.push(line.clone());
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && v["fields"]["message"] == message
                {
                    return Some(v);
                }
            }
            None
        };
        match tokio::time::timeout(TIMEOUT, read).await {
            Ok(Some(v)) => v,
            Ok(None) => panic!("kas exited without logging {message:?}; stderr:\n{}", self.seen.join("\n")),
            Err(_) => panic!("kas did not log {message:?} within {TIMEOUT:?}; stderr:\n{}", self.seen.join("\n")),
        }
    }

    /// Lines that are not JSON log lines (the standalone instructions).
    fn plain_text(&self) -> String {
        self.seen.iter().filter(|l| serde_json::from_str::<Value>(l).is_err()).cloned().collect::<Vec<_>>().join("\n")
    }

    /// SIGTERM, then the exit status (bounded wait) and the rest of stderr.
    async fn terminate(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let pid = self.child.id().unwrap().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let rest = async {
            let mut rest = Vec::new();
            while let Some(line) = self.lines.next_line().await.unwrap() {
                rest.push(line);
            }
            (self.child.wait().await.unwrap(), rest)
        };
        tokio::time::timeout(TIMEOUT, rest).await.expect("kas exits within 20 s of SIGTERM")
    }
}

fn address(line: &Value, field: &str) -> std::net::SocketAddr {
    line["fields"][field].as_str().unwrap_or_else(|| panic!("no {field} in {line}")).parse().unwrap()
}

#[tokio::test]
async fn standalone_mode_serves_with_private_dev_secrets_and_stops_on_sigterm() {
    let work = tempfile::tempdir().unwrap();
    let dev = work.path().join("dev");
    let mut kas = Standalone::start(work.path(), &dev);
    let listening = kas.wait_for("kas listening").await;
    let (agent, api, internal) =
        (address(&listening, "agent"), address(&listening, "api"), address(&listening, "internal"));
    for a in [agent, api, internal] {
        assert!(a.ip().is_loopback() && a.port() != 0, "{a}");
    }
    tokio::net::TcpStream::connect(api).await.expect("api listener accepts connections");

    // The dev dir is private; the instructions point at files, never at their contents.
    assert_eq!(mode(&dev), 0o700);
    for f in ["gitlab-secret", "internal-secret", "agents.yaml", "agent-token"] {
        assert_eq!(mode(&dev.join(f)), 0o600, "{f}");
    }
    let token = std::fs::read_to_string(dev.join("agent-token")).unwrap().trim().to_owned();
    let secret = std::fs::read_to_string(dev.join("gitlab-secret")).unwrap().trim().to_owned();
    let instructions = kas.plain_text();
    assert!(instructions.contains("created now"), "{instructions}");
    assert!(instructions.contains(path_str(&dev.join("agent-token"))), "{instructions}");
    assert!(instructions.contains(&format!("grpc://{agent}")), "{instructions}");
    assert!(instructions.contains(&api.to_string()), "{instructions}");
    let everything = kas.seen.join("\n");
    assert!(!everything.contains(&token), "the agent token was printed");
    assert!(!everything.contains(&secret), "the GitLab secret was printed");
    assert!(!work.path().join(".kas-dev").exists(), "--dev-dir ignored");

    let (status, rest) = kas.terminate().await;
    assert!(status.success(), "kas exit after SIGTERM: {status}; stderr:\n{}", rest.join("\n"));
    assert!(rest.iter().any(|l| l.contains("\"kas stopped\"")), "{}", rest.join("\n"));

    // A restart reuses the dev secrets: the agent keeps its token.
    let mut again = Standalone::start(work.path(), &dev);
    again.wait_for("kas listening").await;
    assert!(again.plain_text().contains("reused"), "{}", again.plain_text());
    assert_eq!(std::fs::read_to_string(dev.join("agent-token")).unwrap().trim(), token);
    let (status, _) = again.terminate().await;
    assert!(status.success(), "{status}");
}
