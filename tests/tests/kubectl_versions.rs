//! Every kubectl the machine ships (`kubectl.1.27` … in the Google Cloud SDK's bin folder) ×
//! the streaming verbs, `apply --server-side` and `rollout status`, through kas: kubectl → kas's
//! Kubernetes proxy → agentk → the fake API server. One cluster for the whole matrix; the
//! versions run concurrently, each in its own namespace.
//!
//! `apply` runs with kubectl's default `--validate=strict`: every version asks the fake's
//! OpenAPI v3 whether Deployment PATCH takes `fieldValidation` (1.27 and 1.28 also parse
//! `/openapi/v2`), then sends `fieldValidation=Strict` and leaves the check to the server.
//! `rollout status` lists and watches the deployment by field selector; the test moves the fake's
//! deployment controller one step at a time and sees kubectl wait at each.
//!
//! Which transport each kubectl uses (looked up in the binaries' feature gates, see
//! k8s.io/kubectl/pkg/cmd/util/env_flags.go / features): remote command (exec, attach, cp) over
//! WebSocket from 1.30 on by default (`KUBECTL_REMOTE_COMMAND_WEBSOCKETS`, present from 1.29 where
//! it is off by default), SPDY/3.1 before; port-forward over WebSocket from 1.31 on by default
//! (`KUBECTL_PORT_FORWARD_WEBSOCKETS`), and that WebSocket carries SPDY frames
//! (`SPDY/3.1+portforward.k8s.io` tunnelling). 1.29 runs twice: with its default (SPDY) and
//! opted in to WebSocket. The fake API server speaks all of it: WebSocket remote command (v5, v4;
//! `kas_e2e::remote_command`), SPDY/3.1 remote command (v4; `kas_e2e::spdy_remote_command`) and
//! SPDY/3.1 port-forward (`kas_e2e::spdy`), raw or tunnelled in WebSocket. Each row also checks
//! which transport its kubectl used.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use kas_e2e::Cluster;
use kas_e2e::kubectl::KubectlTarget;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

const SDK_BIN: &str = "/usr/lib/google-cloud-sdk/bin";

/// The versioned kubectl binaries, oldest first, as (minor version, path).
fn versioned_kubectls() -> Vec<(u32, PathBuf)> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(SDK_BIN)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let minor = name.strip_prefix("kubectl.1.")?.parse().ok()?;
            Some((minor, entry.path()))
        })
        .collect();
    found.sort();
    // A debugging aid: `KUBECTL_MINORS=27,33` runs those rows only.
    if let Ok(only) = std::env::var("KUBECTL_MINORS") {
        let only: Vec<u32> = only.split(',').filter_map(|m| m.trim().parse().ok()).collect();
        found.retain(|(minor, _)| only.contains(minor));
    }
    if found.is_empty() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no versioned kubectl (kubectl.1.NN) in {SDK_BIN}: the matrix cannot run in CI without them"
        );
        eprintln!("no versioned kubectl in {SDK_BIN}: the version matrix has nothing to run here");
    }
    found
}

struct Kubectl {
    binary: PathBuf,
    minor: u32,
    /// Run with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=true` (the 1.29 row that opts in).
    websocket_gate: bool,
    target: KubectlTarget,
}

impl Kubectl {
    fn new(c: &Cluster, minor: u32, binary: PathBuf) -> Self {
        Self { binary, minor, websocket_gate: false, target: KubectlTarget::new(c, 0) }
    }

    /// Whether this kubectl speaks remote command over WebSocket (on by default from 1.30; 1.29
    /// has the gate, off by default).
    fn remote_command_over_websocket(&self) -> bool {
        self.minor >= 30 || self.websocket_gate
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.target.command(&self.binary, args);
        if self.websocket_gate {
            cmd.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "true");
        }
        cmd
    }

    /// Runs to the end with `input` on stdin; returns stdout, failing on a non-zero exit.
    ///
    /// Run once more, and only once, when kubectl itself dropped what it received: client-go's
    /// WebSocket executor starts reading the connection in one goroutine while another creates
    /// its streams (`remotecommand/websocket.go`), so a command whose output and exit status
    /// arrive first has them discarded ("Unknown stream id ..., discarding message") and fails
    /// with "closed all streams". The fake's `tar` answers within a millisecond of the upgrade;
    /// under a loaded CI machine kubectl's goroutines can lose that race.
    async fn run_with_input(&self, args: &[&str], input: &[u8]) -> Vec<u8> {
        match self.try_run_with_input(args, input).await {
            Ok(stdout) => stdout,
            Err(stderr) if stderr.contains("Unknown stream id") && stderr.contains("closed all streams") => {
                eprintln!("kubectl 1.{} {args:?} lost client-go's stream race; once more:\n{stderr}", self.minor);
                self.try_run_with_input(args, input).await.unwrap_or_else(|stderr| {
                    panic!("kubectl 1.{} {args:?} failed twice:\nstderr: {stderr}", self.minor)
                })
            }
            Err(stderr) => panic!("kubectl 1.{} {args:?} failed:\nstderr: {stderr}", self.minor),
        }
    }

    /// Runs to the end with `input` on stdin: stdout, or stderr (with the exit status) when
    /// kubectl failed.
    async fn try_run_with_input(&self, args: &[&str], input: &[u8]) -> Result<Vec<u8>, String> {
        let mut child =
            self.command(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        let writer = tokio::spawn(async move {
            let _ = stdin.write_all(&input).await;
            // Dropping stdin is the end of input kubectl passes on (v5 close signal).
        });
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kubectl 1.{} {args:?} timed out", self.minor))
            .unwrap();
        writer.await.unwrap();
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(format!("({}) {}", out.status, String::from_utf8_lossy(&out.stderr)))
        }
    }

    async fn run(&self, args: &[&str]) -> Vec<u8> {
        self.run_with_input(args, b"").await
    }

    fn spawn(&self, args: &[&str]) -> (Child, tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) {
        let log = std::fs::File::create(self.target.home().join(format!("stderr-{}.log", args[0]))).unwrap();
        let mut child = self.command(args).stdout(Stdio::piped()).stderr(log).spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        (child, lines)
    }
}

async fn next_line_containing(
    minor: u32,
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    what: &str,
) {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = lines.next_line().await.unwrap();
            let line = line.unwrap_or_else(|| panic!("kubectl 1.{minor} ended before {what:?}"));
            if line.contains(what) {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("kubectl 1.{minor}: no line containing {what:?} within 30s"))
}

/// Bytes of every value, in an order that is not a repetition of 256: a changed, lost or
/// reordered byte shows.
fn binary_payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(7) ^ (i >> 8)) as u8).collect()
}

/// The whole matrix row for one kubectl.
async fn verbs(c: &Cluster, k: Kubectl) {
    let v = k.minor;
    let ns = format!("v1-{v}{}", if k.websocket_gate { "-ws" } else { "" });
    let ns = ns.as_str();
    c.kube.add_pod(ns, "web");

    // get -w: a pod added after the watch started is seen.
    let (mut watch, mut lines) = k.spawn(&["get", "pods", "-w", "-n", ns]);
    next_line_containing(v, &mut lines, "web").await;
    c.kube.add_pod(ns, "added-later");
    next_line_containing(v, &mut lines, "added-later").await;
    watch.kill().await.unwrap();

    // logs -f: a line appended after the start is seen.
    c.kube.append_log(ns, "web", &format!("first line of 1.{v}"));
    let (mut logs, mut lines) = k.spawn(&["logs", "-f", "web", "-n", ns]);
    next_line_containing(v, &mut lines, &format!("first line of 1.{v}")).await;
    c.kube.append_log(ns, "web", &format!("later line of 1.{v}"));
    next_line_containing(v, &mut lines, &format!("later line of 1.{v}")).await;
    logs.kill().await.unwrap();

    // port-forward: several connections at once, bytes both ways (the pod's port echoes).
    port_forward(&k, ns).await;

    // exec -i: binary stdin in, the same bytes out (cat), the end of stdin ends the command.
    let input = binary_payload(200 * 1024);
    let out = k.run_with_input(&["exec", "-i", "web", "-n", ns, "--", "cat"], &input).await;
    assert!(out == input, "kubectl 1.{v} exec -i cat: {} bytes out for {} in, or changed", out.len(), input.len());

    // exec: a non-zero exit status is kubectl's exit status.
    let status = k.command(&["exec", "web", "-n", ns, "--", "cat", "/no/such/file"]).status().await.unwrap();
    assert_eq!(status.code(), Some(1), "kubectl 1.{v}: cat's exit status 1 passed on");

    // attach -i: the container's main process echoes stdin.
    let out = k.run_with_input(&["attach", "-i", "web", "-n", ns], b"hello attach\n").await;
    assert_eq!(String::from_utf8_lossy(&out), "hello attach\n", "kubectl 1.{v} attach -i");

    // exec -it under a terminal: script(1) gives kubectl a pty sized 91x37; the size arrives on
    // the resize channel, and ^D ends the input as a terminal would.
    exec_with_terminal(c, &k).await;

    // cp to the pod (tar x in the container) and back (tar c).
    let local = k.target.home().join("upload.bin");
    let content = binary_payload(64 * 1024 + 17);
    std::fs::write(&local, &content).unwrap();
    k.run(&["cp", local.to_str().unwrap(), &format!("{ns}/web:/tmp/upload.bin")]).await;
    let in_pod = c.kube.containers().filesystem(ns, "web").join("tmp/upload.bin");
    assert!(std::fs::read(&in_pod).unwrap() == content, "kubectl 1.{v} cp into the pod changed the file");

    let from_pod = c.kube.containers().filesystem(ns, "web").join("tmp/download.txt");
    std::fs::write(&from_pod, format!("from the pod, for 1.{v}\n")).unwrap();
    let downloaded = k.target.home().join("download.txt");
    k.run(&["cp", &format!("{ns}/web:/tmp/download.txt"), downloaded.to_str().unwrap()]).await;
    assert_eq!(std::fs::read_to_string(&downloaded).unwrap(), format!("from the pod, for 1.{v}\n"));

    // Each remote command used the transport this kubectl version is documented to use.
    let expected = if k.remote_command_over_websocket() { "websocket" } else { "SPDY/3.1" };
    let prefix = format!("/api/v1/namespaces/{ns}/pods/web/");
    let upgrades: Vec<String> = c
        .kube
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with(&prefix) && (r.path.ends_with("/exec") || r.path.ends_with("/attach")))
        .map(|r| r.headers.get("upgrade").and_then(|h| h.to_str().ok()).unwrap_or_default().to_owned())
        .collect();
    assert!(upgrades.len() >= 5, "kubectl 1.{v}: {upgrades:?}");
    assert!(
        upgrades.iter().all(|u| u.eq_ignore_ascii_case(expected)),
        "kubectl 1.{v} (expected {expected}): {upgrades:?}"
    );

    // apply --server-side (validated by the server), then rollout status waiting for the
    // deployment controller.
    apply_and_roll_out(c, &k, ns).await;
}

fn deployment_manifest(replicas: u32, image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  labels:\n    app: web\nspec:\n  \
         replicas: {replicas}\n  selector:\n    matchLabels:\n      app: web\n  template:\n    metadata:\n      \
         labels:\n        app: web\n    spec:\n      containers:\n      - name: main\n        image: {image}\n"
    )
}

/// `kubectl apply --server-side` with kubectl's default validation (`--validate=strict`: kubectl
/// finds in the fake's OpenAPI v3 that Deployment PATCH takes `fieldValidation` and leaves the
/// check to the server), twice, then `kubectl rollout status` through the controller's steps.
async fn apply_and_roll_out(c: &Cluster, k: &Kubectl, ns: &str) {
    let v = k.minor;
    let manifest = k.target.home().join("deployment.yaml");
    let file = manifest.to_str().unwrap();
    std::fs::write(&manifest, deployment_manifest(1, "busybox:1.36")).unwrap();
    let out = k.run(&["apply", "--server-side", "-f", file, "-n", ns]).await;
    assert_eq!(String::from_utf8_lossy(&out).trim(), "deployment.apps/web serverside-applied", "kubectl 1.{v}");

    let stored = c.kube.deployment(ns, "web").unwrap_or_else(|| panic!("kubectl 1.{v}: no deployment stored"));
    let managed = stored["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
    assert!(
        managed.iter().any(|m| m["manager"] == "kubectl" && m["operation"] == "Apply"),
        "kubectl 1.{v}: {managed:?}"
    );
    assert_eq!(stored["metadata"]["generation"], 1, "kubectl 1.{v}: {stored}");
    assert_eq!(stored["spec"]["template"]["spec"]["containers"][0]["image"], "busybox:1.36");

    // It reached the API server as an apply patch by the field manager kubectl, with the
    // server's strict field validation asked for.
    let path = format!("/apis/apps/v1/namespaces/{ns}/deployments/web");
    let applies: Vec<_> = c.kube.requests().into_iter().filter(|r| r.method == "PATCH" && r.path == path).collect();
    assert_eq!(applies.len(), 1, "kubectl 1.{v}: {applies:?}");
    let apply = &applies[0];
    let content_type = apply.headers.get("content-type").and_then(|h| h.to_str().ok()).unwrap_or_default();
    assert_eq!(content_type, "application/apply-patch+yaml", "kubectl 1.{v}");
    let query: Vec<&str> = apply.query.split('&').collect();
    assert!(query.contains(&"fieldManager=kubectl"), "kubectl 1.{v}: {query:?}");
    assert!(query.contains(&"fieldValidation=Strict"), "kubectl 1.{v}: {query:?}");

    // A changed manifest: a new generation.
    std::fs::write(&manifest, deployment_manifest(3, "busybox:1.37")).unwrap();
    let out = k.run(&["apply", "--server-side", "-f", file, "-n", ns]).await;
    assert_eq!(String::from_utf8_lossy(&out).trim(), "deployment.apps/web serverside-applied", "kubectl 1.{v}");
    let stored = c.kube.deployment(ns, "web").unwrap();
    assert_eq!(stored["metadata"]["generation"], 2, "kubectl 1.{v}: {stored}");
    assert_eq!(stored["spec"]["replicas"], 3, "kubectl 1.{v}: {stored}");

    // A field the Deployment schema does not have: kubectl left the check to the server, which
    // refuses the apply as structured-merge-diff does.
    let unknown = deployment_manifest(3, "busybox:1.37").replace("spec:\n  replicas", "spec:\n  foo: bar\n  replicas");
    std::fs::write(&manifest, unknown).unwrap();
    let out = k.command(&["apply", "--server-side", "-f", file, "-n", ns]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "kubectl 1.{v} applied an unknown field");
    assert!(
        stderr.contains(&format!("failed to create typed patch object ({ns}/web; apps/v1, Kind=Deployment): .spec.foo: field not declared in schema")),
        "kubectl 1.{v}: {stderr}"
    );
    assert_eq!(c.kube.deployment(ns, "web").unwrap()["metadata"]["generation"], 2, "kubectl 1.{v}");

    // rollout status waits for the controller to see the new spec, then for the new replicas,
    // and ends once they are all available.
    let (mut rollout, mut lines) = k.spawn(&["rollout", "status", "deployment/web", "-n", ns]);
    next_line_containing(v, &mut lines, "Waiting for deployment spec update to be observed").await;
    c.kube.observe_deployment(ns, "web");
    next_line_containing(v, &mut lines, "Waiting for deployment \"web\" rollout to finish: 0 out of 3 new replicas")
        .await;
    c.kube.roll_out(ns, "web");
    next_line_containing(v, &mut lines, "deployment \"web\" successfully rolled out").await;
    let exit = tokio::time::timeout(Duration::from_secs(30), rollout.wait())
        .await
        .unwrap_or_else(|_| panic!("kubectl 1.{v} rollout status did not end after the rollout"))
        .unwrap();
    assert!(exit.success(), "kubectl 1.{v} rollout status: {exit}");
}

/// Single-quoted for sh.
fn quoted(arg: &std::ffi::OsStr) -> String {
    format!("'{}'", arg.to_string_lossy().replace('\'', "'\\''"))
}

async fn exec_with_terminal(c: &Cluster, k: &Kubectl) {
    let v = k.minor;
    let ns = format!("v1-{v}{}", if k.websocket_gate { "-ws" } else { "" });
    let kubectl = k.command(&["exec", "-it", "web", "-n", &ns, "--", "cat"]);
    let std = kubectl.as_std();
    let line = std::iter::once(std.get_program()).chain(std.get_args()).map(quoted).collect::<Vec<_>>().join(" ");
    let mut script = Command::new("script");
    script.args(["-qec", &format!("stty cols 91 rows 37; exec {line}"), "/dev/null"]);
    for (key, value) in std.get_envs() {
        if let Some(value) = value {
            script.env(key, value);
        }
    }
    let mut child =
        script.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"hello tty\n\x04").await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl 1.{v} exec -it under script timed out"))
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl 1.{v} exec -it: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let resizes = c.kube.containers().resizes(&ns, "web");
    assert!(
        resizes.iter().any(|size| size["Width"] == 91 && size["Height"] == 37),
        "kubectl 1.{v}: no 91x37 on the resize channel: {resizes:?}"
    );
}

async fn port_forward(k: &Kubectl, ns: &str) {
    let v = k.minor;
    let (mut forward, mut lines) = k.spawn(&["port-forward", "pod/web", "-n", ns, "--address=127.0.0.1", ":8080"]);
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("kubectl 1.{v} port-forward: no \"Forwarding from\" line within 30s"))
        .unwrap()
        .unwrap_or_else(|| panic!("kubectl 1.{v} port-forward ended"));
    // "Forwarding from 127.0.0.1:40123 -> 8080"
    let local: std::net::SocketAddr = line
        .strip_prefix("Forwarding from ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("kubectl 1.{v} port-forward printed {line:?}"));
    let connections = (0..3).map(|n| async move {
        let mut stream = tokio::net::TcpStream::connect(local).await.unwrap();
        let payload = binary_payload(100 * 1024 + n * 13);
        let (mut reader, mut writer) = stream.split();
        let mut echoed = vec![0u8; payload.len()];
        let (written, read) = tokio::join!(writer.write_all(&payload), async {
            tokio::time::timeout(Duration::from_secs(30), reader.read_exact(&mut echoed)).await
        });
        written.unwrap();
        read.unwrap_or_else(|_| panic!("kubectl 1.{v} port-forward connection {n}: no echo within 30s")).unwrap();
        assert!(echoed == payload, "kubectl 1.{v} port-forward connection {n}: bytes changed");
    });
    futures::future::join_all(connections).await;
    forward.kill().await.unwrap();
}

#[tokio::test]
async fn every_kubectl_version_runs_the_streaming_verbs_through_kas() {
    let kubectls = versioned_kubectls();
    if kubectls.is_empty() {
        return;
    }
    let c = Cluster::builder().rest_tls().start().await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let mut rows: Vec<Kubectl> = kubectls.into_iter().map(|(minor, binary)| Kubectl::new(&c, minor, binary)).collect();
    // 1.29 once more, opted in to WebSocket remote command.
    if let Some(k129) = rows.iter().find(|k| k.minor == 29) {
        let mut gated = Kubectl::new(&c, 29, k129.binary.clone());
        gated.websocket_gate = true;
        rows.push(gated);
    }
    let websocket_rows = rows.iter().filter(|k| k.remote_command_over_websocket()).count();
    let websocket = rows.iter().filter(|k| k.minor >= 31).count();
    let spdy = rows.len() - websocket;
    let rows = rows.into_iter().map(|k| verbs(&c, k));
    futures::future::join_all(rows).await;
    // Port-forward: SPDY/3.1 before 1.31, SPDY tunnelled in WebSocket from 1.31 on; each session
    // saw its three connections' error and data streams, and ended once kubectl was gone (kas and
    // agentk closed the upstream connection).
    let kube = c.kube.clone();
    kas_e2e::eventually!(kube.port_forwards().len() == spdy + websocket, "{:?}", kube.port_forwards());
    let sessions = c.kube.port_forwards();
    assert_eq!(sessions.iter().filter(|(t, _)| *t == "spdy").count(), spdy, "{sessions:?}");
    let open = || kube.port_forwards().iter().filter(|(_, seen)| !seen.ended).count();
    kas_e2e::eventually!(open() == 0, "port-forward sessions still open upstream after kubectl stopped: {}", open());
    for (_, seen) in &sessions {
        let data: Vec<_> = seen.streams.iter().filter(|(kind, port, _)| kind == "data" && port == "8080").collect();
        assert_eq!(data.len(), 3, "{seen:?}");
        assert!(seen.streams.iter().filter(|(kind, ..)| kind == "error").count() == 3, "{seen:?}");
    }
    // v5 (with the close signal) is what every WebSocket kubectl here negotiates.
    let protocols = c.kube.containers().protocols();
    assert!(protocols.iter().all(|p| p == "v5.channel.k8s.io"), "{protocols:?}");
    // Five WebSocket sessions per row (exec -i, exec, attach, two cp; cp into the pod may add a
    // check) came from the WebSocket rows only.
    assert!(protocols.len() >= 5 * websocket_rows, "{} sessions for {websocket_rows} rows", protocols.len());
}

/// NOT a SPDY test: a byte-for-byte check that a SPDY/3.1 upgrade passes through kas and agentk
/// unchanged. The fake API server answers `101 Switching Protocols` with `Upgrade: SPDY/3.1` and
/// then echoes raw bytes (see `kas_e2e::spdy_passthrough`); the client sends every byte value
/// (including sequences that look like SPDY control frames and HTTP) and must get exactly them
/// back, over several connections at once.
#[tokio::test]
async fn spdy_upgrade_passes_through_kas_byte_for_byte() {
    let c = Cluster::builder().start().await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    c.kube.add_pod("default", "web");
    let rest = c.rest_url(0);
    let addr = rest.strip_prefix("http://").unwrap().to_owned();
    let jwt = c.gitlab_jwt();
    let connections = (0..4).map(|n| {
        let (addr, jwt) = (addr.clone(), jwt.clone());
        async move {
            let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let head = format!(
                "POST /api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods/web/portforward HTTP/1.1\r\n\
                 Host: {addr}\r\nAuthorization: Bearer {jwt}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
                 X-Stream-Protocol-Version: byte-echo.kas-e2e.test\r\nContent-Length: 0\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut response = Vec::new();
            while !response.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "connection closed in the response head");
                response.push(byte[0]);
            }
            let response = String::from_utf8_lossy(&response).to_lowercase();
            assert!(response.starts_with("http/1.1 101"), "{response}");
            assert!(response.contains("upgrade: spdy/3.1"), "{response}");
            // A SPDY SYN_STREAM-looking control frame, then every byte value, then bulk.
            let mut payload = vec![0x80, 0x03, 0x00, 0x01, 0x01, 0x00, 0x00, 0x0a];
            payload.extend(0..=255u8);
            payload.extend(b"HTTP/1.1 200 OK\r\n\r\n");
            payload.extend(binary_payload(256 * 1024 + n));
            let (mut reader, mut writer) = stream.into_split();
            let sent = payload.clone();
            let write = tokio::spawn(async move { writer.write_all(&sent).await.unwrap() });
            let mut echoed = vec![0u8; payload.len()];
            tokio::time::timeout(Duration::from_secs(30), reader.read_exact(&mut echoed))
                .await
                .expect("echo within 30s")
                .unwrap();
            write.await.unwrap();
            assert!(echoed == payload, "connection {n}: bytes changed on the way");
        }
    });
    futures::future::join_all(connections).await;
}
