//! `pods/exec` and `pods/attach` over SPDY/3.1, as the API server speaks them to kubectl ≤ 1.28
//! (and 1.29 without `KUBECTL_REMOTE_COMMAND_WEBSOCKETS`): the client offers
//! `X-Stream-Protocol-Version`s (v4.channel.k8s.io first), the server answers with the one it
//! picked, then the client opens one SPDY stream per channel (header `streamType`: `error`,
//! `stdin`, `stdout`, `stderr`, `resize`), each answered with SYN_REPLY. Once all the expected
//! streams exist the program runs: stdin's FIN is the end of input, stdout/stderr end with FIN,
//! and the error stream carries the v4 exit `Status` (k8s.io/apimachinery remotecommand, kubelet's
//! cri/streaming/remotecommand). Programs and filesystems are those of [`crate::remote_command`].

use std::collections::HashMap;
use std::path::PathBuf;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::remote_command::{END_OF_TRANSMISSION, PROGRAMS, exit_status, failure, spawn_in_container};
use crate::spdy::{
    FLAG_FIN, Frame, GOAWAY, HeaderCodec, PING, SYN_STREAM, SpdyError, control_frame, data_frame, read_frame,
    syn_reply, syn_stream,
};

pub const PROTOCOL: &str = "v4.channel.k8s.io";

/// Which channels the request asked for (query `stdin`, `stdout`, `stderr`, `tty`).
pub struct Channels {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl Channels {
    fn expected(&self) -> usize {
        1 + usize::from(self.stdin)
            + usize::from(self.stdout)
            + usize::from(self.stderr && !self.tty)
            + usize::from(self.tty)
    }
}

/// Answers the SPDY upgrade with v4 and runs `command` in `dir` over the session.
pub fn serve(
    mut req: Request,
    containers: std::sync::Arc<crate::remote_command::Containers>,
    dir: PathBuf,
    command: Vec<String>,
    channels: Channels,
) -> Response {
    let offered =
        req.headers().get_all("X-Stream-Protocol-Version").iter().any(|v| v.as_bytes() == PROTOCOL.as_bytes());
    if !offered {
        let mut response = Response::new(Body::from(format!("protocol {PROTOCOL} not offered")));
        *response.status_mut() = StatusCode::FORBIDDEN;
        return response;
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else { return };
        let _ = session(TokioIo::new(upgraded), &containers, dir, command, channels).await;
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    headers.insert("X-Stream-Protocol-Version", HeaderValue::from_static(PROTOCOL));
    response
}

async fn session(
    io: impl AsyncRead + AsyncWrite + Send + Unpin + 'static,
    containers: &crate::remote_command::Containers,
    dir: PathBuf,
    command: Vec<String>,
    channels: Channels,
) -> Result<(), SpdyError> {
    let (mut reader, mut writer) = tokio::io::split(io);
    let (frames, mut outgoing) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let write_task = tokio::spawn(async move {
        while let Some(frame) = outgoing.recv().await {
            if writer.write_all(&frame).await.is_err() {
                return;
            }
        }
        let _ = writer.shutdown().await;
    });
    let mut codec = HeaderCodec::new();
    // streamType -> stream id
    let mut streams: HashMap<String, u32> = HashMap::new();
    let mut child_stdin: Option<tokio::process::ChildStdin> = None;
    let mut program: Option<tokio::task::JoinHandle<()>> = None;
    while let Ok(Some(frame)) = read_frame(&mut reader).await {
        match frame {
            Frame::Data { stream, fin, payload } => {
                if streams.get("stdin") == Some(&stream) {
                    let eot = payload.iter().position(|b| channels.tty && *b == END_OF_TRANSMISSION);
                    if let Some(w) = child_stdin.as_mut()
                        && w.write_all(&payload[..eot.unwrap_or(payload.len())]).await.is_err()
                    {
                        child_stdin = None;
                    }
                    if fin || eot.is_some() {
                        child_stdin = None;
                    }
                } else if streams.get("resize") == Some(&stream) {
                    // One JSON TerminalSize per message, possibly several per frame.
                    for size in
                        serde_json::Deserializer::from_slice(&payload).into_iter::<serde_json::Value>().flatten()
                    {
                        containers.record_resize(&dir, size);
                    }
                }
            }
            Frame::Control { kind: SYN_STREAM, payload } => {
                let Some((stream, headers)) = syn_stream(&payload, &mut codec)? else { continue };
                let kind = headers.get("streamtype").cloned().unwrap_or_default();
                let _ = frames.send(syn_reply(stream, &mut codec)?).await;
                streams.insert(kind, stream);
                if streams.len() == channels.expected() && program.is_none() {
                    let (task, stdin) = start(&dir, &command, &channels, &streams, frames.clone());
                    child_stdin = stdin;
                    program = Some(task);
                }
            }
            Frame::Control { kind: PING, payload } => {
                let _ = frames.send(control_frame(PING, 0, &payload)).await;
            }
            Frame::Control { kind: GOAWAY, .. } => break,
            Frame::Control { .. } => {}
        }
    }
    // The client left: the program's input ends; its output has nowhere to go.
    drop(child_stdin);
    if let Some(program) = program {
        program.abort();
    }
    drop(frames);
    let _ = write_task.await;
    Ok(())
}

/// Starts the program; its output goes out as DATA frames, then the exit status on `error`.
fn start(
    dir: &std::path::Path,
    command: &[String],
    channels: &Channels,
    streams: &HashMap<String, u32>,
    frames: tokio::sync::mpsc::Sender<Vec<u8>>,
) -> (tokio::task::JoinHandle<()>, Option<tokio::process::ChildStdin>) {
    let error_stream = streams.get("error").copied().unwrap_or(0);
    let outputs: Vec<u32> = ["stdout", "stderr"].iter().filter_map(|k| streams.get(*k).copied()).collect();
    // Without a program the output streams end at once (the client waits for them to close).
    let finish = move |frames: tokio::sync::mpsc::Sender<Vec<u8>>, status: serde_json::Value| async move {
        let _ = frames.send(data_frame(error_stream, FLAG_FIN, status.to_string().as_bytes())).await;
    };
    let fail = move |frames: tokio::sync::mpsc::Sender<Vec<u8>>, status: serde_json::Value| async move {
        for stream in outputs {
            let _ = frames.send(data_frame(stream, FLAG_FIN, &[])).await;
        }
        finish(frames, status).await;
    };
    let Some((program, args)) = command.split_first().filter(|(p, _)| PROGRAMS.contains(&p.as_str())) else {
        let name = command.first().cloned().unwrap_or_default();
        let message = format!("failed to exec in container: exec: \"{name}\": executable file not found in $PATH");
        return (tokio::spawn(fail(frames, failure(message))), None);
    };
    let spawned = spawn_in_container(program, args, dir, channels.stdin);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return (tokio::spawn(fail(frames, failure(e.to_string()))), None),
    };
    let stdin = child.stdin.take();
    let pump = |reader: Option<Box<dyn AsyncRead + Unpin + Send>>, stream: Option<u32>| {
        let frames = frames.clone();
        async move {
            let Some(mut reader) = reader else { return };
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n @ 1..) = reader.read(&mut buf).await {
                if let Some(stream) = stream
                    && frames.send(data_frame(stream, 0, &buf[..n])).await.is_err()
                {
                    return;
                }
            }
            if let Some(stream) = stream {
                let _ = frames.send(data_frame(stream, FLAG_FIN, &[])).await;
            }
        }
    };
    let stdout = pump(child.stdout.take().map(|r| Box::new(r) as _), streams.get("stdout").copied());
    let stderr = pump(child.stderr.take().map(|r| Box::new(r) as _), streams.get("stderr").copied());
    let task = tokio::spawn(async move {
        futures::join!(stdout, stderr);
        let status = match child.wait().await {
            Ok(status) => exit_status(status.code()),
            Err(e) => failure(e.to_string()),
        };
        finish(frames, status).await;
    });
    (task, stdin)
}
