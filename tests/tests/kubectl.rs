//! The real `kubectl` against kas: the cluster behind the tunnel works as if it were local, through
//! one kas and through a second kas.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::Stdio;
use std::time::Duration;

use kas::agent::AgentConfigDocument;
use kas_e2e::kubectl::KubectlTarget;
use kas_e2e::{Cluster, eventually};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// kubectl is part of the machine image; a missing one fails the test (never skips).
fn kubectl_binary() -> &'static str {
    let ok =
        std::process::Command::new("kubectl").args(["version", "--client"]).output().is_ok_and(|o| o.status.success());
    assert!(ok, "kubectl is required: install it (e.g. the Debian/Kubernetes apt package `kubectl`)");
    "kubectl"
}

struct Kubectl {
    target: KubectlTarget,
}

impl Kubectl {
    /// kubectl pointed at agent 1 through kas number `kas`, with a GitLab-style JWT.
    fn new(c: &Cluster, kas: usize) -> Self {
        Self { target: KubectlTarget::new(c, kas) }
    }

    fn command(&self, args: &[&str]) -> Command {
        self.target.command(kubectl_binary(), args)
    }

    async fn run(&self, args: &[&str]) -> String {
        let out = tokio::time::timeout(Duration::from_secs(60), self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A long-running kubectl (watch, logs -f) whose stdout is read line by line.
    fn spawn(&self, args: &[&str]) -> (Child, tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) {
        let log = std::fs::File::create(self.target.home().join("kubectl-stderr.log")).unwrap();
        let mut child = self.command(args).stdout(Stdio::piped()).stderr(log).spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        (child, lines)
    }
}

async fn next_line_containing(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    what: &str,
) -> String {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = lines.next_line().await.unwrap().unwrap_or_else(|| panic!("kubectl ended before {what:?}"));
            if line.contains(what) {
                return line;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no line containing {what:?} within 30s"))
}

/// Every scenario, through kas number `via` (the agent is connected to kas 0).
async fn scenarios(c: &Cluster, via: usize) {
    let k = Kubectl::new(c, via);
    c.kube.add_pod("default", "web-1");
    c.kube.add_pod("kube-system", "dns-1");

    // get pods -A
    let out = k.run(&["get", "pods", "-A"]).await;
    assert!(out.contains("web-1") && out.contains("dns-1") && out.contains("kube-system"), "{out}");

    // get pods -w: an event after a change on the server arrives while the watch runs.
    let (mut watch, mut lines) = k.spawn(&["get", "pods", "-w", "-n", "default"]);
    next_line_containing(&mut lines, "web-1").await;
    c.kube.add_pod("default", "added-later");
    next_line_containing(&mut lines, "added-later").await;
    watch.kill().await.unwrap();

    // logs -f: lines appended on the server appear as they come; stopping kubectl stops the
    // API server's stream (cancellation goes all the way).
    c.kube.append_log("default", "web-1", "line one");
    let (mut logs, mut lines) = k.spawn(&["logs", "-f", "web-1", "-n", "default"]);
    next_line_containing(&mut lines, "line one").await;
    c.kube.append_log("default", "web-1", "line two");
    next_line_containing(&mut lines, "line two").await;
    logs.kill().await.unwrap();
    let kube = c.kube.clone();
    eventually!(kube.log_followers() == 0, "the API server's log stream ended after kubectl stopped");

    // exec through a protocol upgrade (WebSocket remote command).
    let out = k.run(&["exec", "web-1", "-n", "default", "--", "echo", "hi", "there"]).await;
    assert_eq!(out, "hi there\n");

    // apply -f: POST then PATCH, bodies intact.
    let manifest = k.target.home().join("pod.yaml");
    let pod = |label: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: applied\n  namespace: default\n  labels:\n    tier: {label}\nspec:\n  containers:\n  - name: c\n    image: busybox\n"
        )
    };
    std::fs::write(&manifest, pod("one")).unwrap();
    let before = c.kube.bodies().len();
    k.run(&["apply", "--validate=false", "-f", manifest.to_str().unwrap()]).await;
    std::fs::write(&manifest, pod("two")).unwrap();
    k.run(&["apply", "--validate=false", "-f", manifest.to_str().unwrap()]).await;
    let bodies = c.kube.bodies()[before..].to_vec();
    let post = bodies.iter().find(|b| b.method == "POST").expect("create");
    let created: serde_json::Value = serde_json::from_slice(&post.body).unwrap();
    assert_eq!(created["metadata"]["name"], "applied");
    assert_eq!(created["metadata"]["labels"]["tier"], "one");
    let patch = bodies.iter().find(|b| b.method == "PATCH").expect("patch");
    assert!(patch.content_type.contains("patch"), "{}", patch.content_type);
    let patch_body: serde_json::Value = serde_json::from_slice(&patch.body).unwrap();
    assert_eq!(patch_body["metadata"]["labels"]["tier"], "two", "{patch_body}");
    assert_eq!(c.kube.pod("default", "applied").unwrap()["metadata"]["labels"]["tier"], "two");
}

async fn big_response_arrives_intact(c: &Cluster, via: usize) {
    const SIZE: u64 = 50 * 1024 * 1024;
    c.kube.add_pod("default", "big");
    c.kube.add_big_log("default", "big", SIZE);
    let k = Kubectl::new(c, via);
    let mut child = k.command(&["logs", "big", "-n", "default"]).stdout(Stdio::piped()).spawn().unwrap();
    // Hashed while reading: the test holds none of it either.
    let (total, digest) = kas_e2e::fake_kube::length_and_sha256(child.stdout.take().unwrap()).await;
    assert!(child.wait().await.unwrap().success());
    assert_eq!(total, SIZE);
    assert_eq!(digest, kas_e2e::fake_kube::big_log_sha256(SIZE), "50 MiB body changed on the way");
}

#[tokio::test]
async fn kubectl_through_one_kas() {
    let c = Cluster::builder().rest_tls().start().await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    scenarios(&c, 0).await;
    big_response_arrives_intact(&c, 0).await;
}

#[tokio::test]
async fn kubectl_through_a_second_kas() {
    let c = Cluster::builder().redis().rest_tls().kas(2).start().await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    scenarios(&c, 1).await;
    big_response_arrives_intact(&c, 1).await;
}

/// kubectl's stderr for `get pods` (discovery first, as a user runs it) and how long it took.
async fn failed_get_pods(target: &KubectlTarget) -> (String, Duration) {
    let started = std::time::Instant::now();
    let out = target.command(kubectl_binary(), &["get", "pods"]).output().await.unwrap();
    assert!(!out.status.success(), "kubectl succeeded: {}", String::from_utf8_lossy(&out.stdout));
    (String::from_utf8_lossy(&out.stderr).into_owned(), started.elapsed())
}

/// kas's own errors reach the person at the terminal word for word, although client-go prints
/// a fixed text for errors of discovery requests (kas repeats its message in a `Warning`), and
/// an agent that is not connected (and was not recently) fails at once instead of after
/// kubectl's five discovery retries of routing.max_wait each.
#[tokio::test]
async fn kubectl_prints_kas_errors_word_for_word() {
    let c = Cluster::builder().rest_tls().start().await;

    let (stderr, took) = failed_get_pods(&KubectlTarget::new(&c, 0)).await;
    assert!(
        stderr
            .contains("Warning: agent 1 is not connected to kas, and no kas has seen it connected within registry.ttl"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?} (routing.max_wait is 20 s)");

    let (stderr, _) = failed_get_pods(&KubectlTarget::new(&c, 0).with_token("not-a-jwt")).await;
    assert!(stderr.contains("error: You must be logged in to the server"), "{stderr}");
    assert!(stderr.contains("Warning: invalid JWT"), "kas's reason: {stderr}");

    let (stderr, _) = failed_get_pods(&KubectlTarget::new(&c, 0).with_agent("web")).await;
    assert!(stderr.contains("Warning: agent_id must be a positive integer (decimal digits), got \"web\""), "{stderr}");

    let (stderr, _) = failed_get_pods(&KubectlTarget::new(&c, 0).with_token("ci:2:job-token")).await;
    assert!(stderr.contains("Warning: the credential is for agent 2, but the request is for agent 1"), "{stderr}");

    // A request that is not discovery shows the Status itself (and no duplicate warning).
    let out = KubectlTarget::new(&c, 0)
        .command(kubectl_binary(), &["get", "--raw", "/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Error from server (ServiceUnavailable): agent 1 is not connected to kas"), "{stderr}");
    assert!(!stderr.contains("Warning:"), "{stderr}");
}

/// An agent that was connected a moment ago is probably reconnecting: kas waits for it
/// (routing.max_wait) instead of failing at once.
#[tokio::test]
async fn kubectl_waits_for_an_agent_seen_recently() {
    let c = Cluster::builder().rest_tls().max_wait(Duration::from_millis(1500)).start().await;
    c.start_agentk(1, 0, "agentk-0").await.stop().await;
    let (stderr, took) = failed_get_pods(&KubectlTarget::new(&c, 0)).await;
    assert!(stderr.contains("Warning: agent 1 is not connected (waited 1.5s for it to connect)"), "{stderr}");
    assert!(took >= Duration::from_millis(1500), "did not wait: {took:?}");
}

/// The agent configuration's `kubernetes_api.read_only` (delivered by kas, applied by agentk):
/// reads work, writes and exec are refused the way an RBAC denial is.
#[tokio::test]
async fn read_only_agent_configuration_refuses_writes_like_rbac() {
    let doc: AgentConfigDocument = serde_norway::from_str("kubernetes_api:\n  read_only: true\n").unwrap();
    let c = Cluster::builder().rest_tls().agent_configuration(1, doc).start().await;
    c.kube.add_pod("default", "web-1");
    let a = c.start_agentk(1, 0, "agentk-0").await;
    assert!(a.status.configuration.borrow().as_ref().unwrap().configuration.as_ref().unwrap().kubernetes_api.is_some());
    let k = Kubectl::new(&c, 0);
    assert!(k.run(&["get", "pods", "-n", "default"]).await.contains("web-1"));

    for args in [&["delete", "pod", "web-1", "-n", "default"][..], &["exec", "web-1", "-n", "default", "--", "echo"]] {
        let out = k.command(args).output().await.unwrap();
        assert!(!out.status.success(), "kubectl {args:?} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("Forbidden") && stderr.contains("read-only"), "kubectl {args:?}: {stderr}");
    }
    assert!(k.run(&["get", "pods", "-n", "default"]).await.contains("web-1"), "the pod was not deleted");
}
