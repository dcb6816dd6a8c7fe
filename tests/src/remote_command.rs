//! The fake API server's remote-command endpoints (`pods/exec`, `pods/attach`) over WebSocket, as
//! the API server speaks them to kubectl ≥ 1.30 (1.29 with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=true`):
//! subprotocols `v5.channel.k8s.io` (adds the close signal: `[255, channel]` ends that channel's
//! input) and `v4.channel.k8s.io`; every binary message starts with its channel: 0 stdin, 1 stdout,
//! 2 stderr, 3 error (a `Status`, the exit status), 4 resize (`{"Width":..,"Height":..}`).
//! Reference: k8s.io/apimachinery/pkg/util/remotecommand/constants.go and
//! k8s.io/client-go/tools/remotecommand/websocket.go.
//!
//! Each pod has a directory standing for its container's filesystem; commands run there:
//! `echo`, `cat` (stdin back on stdout), `test`, and the real `tar` with absolute paths taken inside that
//! directory (what `kubectl cp` runs). `attach` joins the container's main process, which echoes
//! stdin like `cat` and ends when stdin closes (a `stdinOnce` container).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const ERROR: u8 = 3;
pub const RESIZE: u8 = 4;
/// v5 only: `[CLOSE, channel]` closes that channel.
pub const CLOSE: u8 = 255;

/// The pods' filesystems and what the remote-command sessions saw.
pub struct Containers {
    root: tempfile::TempDir,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    protocols: Vec<String>,
    /// (pod filesystem, size)
    resizes: Vec<(PathBuf, Value)>,
}

impl Default for Containers {
    fn default() -> Self {
        Self { root: tempfile::tempdir().expect("temp dir for pod filesystems"), seen: Mutex::default() }
    }
}

impl Containers {
    /// The directory standing for `/` in the pod's container (created on first use).
    pub fn filesystem(&self, namespace: &str, pod: &str) -> PathBuf {
        let dir = self.root.path().join(namespace).join(pod);
        std::fs::create_dir_all(dir.join("tmp")).expect("pod filesystem");
        dir
    }

    /// The WebSocket subprotocols negotiated so far, in order.
    pub fn protocols(&self) -> Vec<String> {
        self.lock().protocols.clone()
    }

    /// Terminal sizes received on the resize channel of the pod's sessions.
    pub fn resizes(&self, namespace: &str, pod: &str) -> Vec<Value> {
        let dir = self.filesystem(namespace, pod);
        self.lock().resizes.iter().filter(|(d, _)| *d == dir).map(|(_, size)| size.clone()).collect()
    }

    pub(crate) fn record_resize(&self, dir: &Path, size: Value) {
        self.lock().resizes.push((dir.to_owned(), size));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What the session runs.
pub enum Session {
    /// `pods/exec` with the `command` query parameters.
    Exec(Vec<String>),
    /// `pods/attach`: the container's main process.
    Attach,
}

/// Programs the fake container has; anything else fails the way a missing executable does.
pub(crate) const PROGRAMS: [&str; 4] = ["echo", "cat", "tar", "test"];

/// Answers the upgrade and runs the session in the pod's filesystem. `stdin`: the request's
/// `stdin=true` (kubectl sends input only then).
pub fn serve(
    containers: std::sync::Arc<Containers>,
    ws: WebSocketUpgrade,
    namespace: String,
    pod: String,
    session: Session,
    stdin: bool,
    tty: bool,
) -> Response {
    ws.protocols(["v5.channel.k8s.io", "v4.channel.k8s.io"]).on_upgrade(move |socket| async move {
        let protocol = socket.protocol().and_then(|p| p.to_str().ok()).unwrap_or_default().to_owned();
        containers.lock().protocols.push(protocol);
        let dir = containers.filesystem(&namespace, &pod);
        let command = match session {
            Session::Exec(command) => command,
            Session::Attach => vec!["cat".to_owned()],
        };
        run(socket, &containers, &dir, &command, stdin, tty).await;
    })
}

/// An absolute path in the container is that path relative to the container's directory (the
/// program's working directory), so `tar c` stores the names the real container's tar would.
pub(crate) fn in_container(arg: &str) -> &str {
    match arg.strip_prefix('/') {
        Some("") => ".",
        Some(rest) => rest,
        None => arg,
    }
}

pub(crate) fn exit_status(code: Option<i32>) -> Value {
    match code {
        Some(0) => json!({"metadata": {}, "status": "Success"}),
        code => {
            let code = code.unwrap_or(137);
            json!({
                "metadata": {}, "status": "Failure",
                "message": format!("command terminated with non-zero exit code: exit status {code}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
            })
        }
    }
}

fn framed(channel: u8, data: &[u8]) -> Message {
    let mut frame = Vec::with_capacity(data.len() + 1);
    frame.push(channel);
    frame.extend_from_slice(data);
    Message::Binary(frame.into())
}

type Sink = futures::stream::SplitSink<WebSocket, Message>;

/// The exit status on the error channel, then a normal closure (1000), as the API server sends.
async fn finish(sink: &mut Sink, status: Value) {
    use futures::SinkExt;
    let _ = sink.send(framed(ERROR, status.to_string().as_bytes())).await;
    let _ = sink.send(Message::Close(Some(CloseFrame { code: close_code::NORMAL, reason: "".into() }))).await;
}

pub(crate) fn failure(message: String) -> Value {
    json!({"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError"})
}

/// With a terminal, ^D (EOT) is the end of input, as the terminal's line discipline makes it.
pub(crate) const END_OF_TRANSMISSION: u8 = 0x04;

/// Runs `program` with `args` as the container would: in the pod's directory, with piped output
/// (and piped input when the caller sends stdin).
pub(crate) fn spawn_in_container(
    program: &str,
    args: &[String],
    dir: &Path,
    stdin: bool,
) -> std::io::Result<tokio::process::Child> {
    tokio::process::Command::new(program)
        .args(args.iter().map(|a| in_container(a)))
        .current_dir(dir)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
}

async fn run(socket: WebSocket, containers: &Containers, dir: &Path, command: &[String], stdin: bool, tty: bool) {
    use futures::{SinkExt, StreamExt};
    let (mut sink, mut incoming) = socket.split();
    let Some((program, args)) = command.split_first().filter(|(p, _)| PROGRAMS.contains(&p.as_str())) else {
        let name = command.first().map(String::as_str).unwrap_or_default();
        let message = format!("failed to exec in container: exec: \"{name}\": executable file not found in $PATH");
        return finish(&mut sink, failure(message)).await;
    };
    let spawned = spawn_in_container(program, args, dir, stdin);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return finish(&mut sink, failure(e.to_string())).await,
    };
    let mut child_stdin = child.stdin.take();
    let input = async move {
        while let Some(Ok(message)) = incoming.next().await {
            let Message::Binary(data) = message else { continue };
            match data.split_first() {
                Some((&STDIN, bytes)) => {
                    let eot = bytes.iter().position(|b| tty && *b == END_OF_TRANSMISSION);
                    if let Some(w) = child_stdin.as_mut()
                        && w.write_all(&bytes[..eot.unwrap_or(bytes.len())]).await.is_err()
                    {
                        child_stdin = None;
                    }
                    if eot.is_some() {
                        child_stdin = None;
                    }
                }
                Some((&RESIZE, size)) => {
                    if let Ok(size) = serde_json::from_slice(size) {
                        containers.record_resize(dir, size);
                    }
                }
                Some((&CLOSE, [STDIN])) => child_stdin = None,
                _ => {}
            }
        }
        // The client went away: the program's input ends with it.
    };
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Message>(16);
    let pump = |reader: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>, channel: u8| {
        let out_tx = out_tx.clone();
        async move {
            let Some(mut reader) = reader else { return };
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n @ 1..) = reader.read(&mut buf).await {
                if out_tx.send(framed(channel, &buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    };
    let stdout = pump(child.stdout.take().map(|r| Box::new(r) as _), STDOUT);
    let stderr = pump(child.stderr.take().map(|r| Box::new(r) as _), STDERR);
    drop(out_tx);
    let status = {
        let forward = async {
            while let Some(message) = out_rx.recv().await {
                if sink.send(message).await.is_err() {
                    break;
                }
            }
        };
        let work = async {
            let ((), (), ()) = futures::join!(stdout, stderr, forward);
            child.wait().await
        };
        tokio::pin!(work, input);
        // Input may end first (stdin closed) while the program still writes: keep going.
        let mut input_done = false;
        loop {
            tokio::select! {
                status = &mut work => break status,
                () = &mut input, if !input_done => input_done = true,
            }
        }
    };
    let status = match status {
        Ok(status) => exit_status(status.code()),
        Err(e) => failure(e.to_string()),
    };
    finish(&mut sink, status).await;
}
