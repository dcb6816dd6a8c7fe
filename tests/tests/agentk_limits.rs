//! agentk's limits toward the Kubernetes API server (a server that never answers or never
//! accepts costs a 504 Kubernetes `Status`, not a tunnel held forever; a caller that leaves frees
//! its tunnel at once) and kas's request body limit on the proxy path.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kas_e2e::{Cluster, Unconnectable, eventually};
use kas_proto::kas::KubernetesRequest;
use kas_proto::kubernetes_api::{HttpFrame, HttpRequestHead};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// An "API server" that completes TCP handshakes (the kernel's backlog does) but never accepts
/// a connection, so nothing is ever read or answered. Keep it alive for the test.
async fn silent_api_server() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

fn kube_config(url: &str) -> agentk::KubeSource {
    agentk::KubeSource::Config(Box::new(kube::Config::new(url.parse().unwrap())))
}

async fn agentk_against(c: &Cluster, url: &str, edit: impl FnOnce(&mut agentk::AgentConfig)) -> kas_e2e::AgentkHandle {
    let mut config = c.agentk_config(1, 0, "agentk-limits");
    config.kube = kube_config(url);
    edit(&mut config);
    let a = c.start_agentk_with(config).await;
    a.ready().await;
    a
}

fn proxy_url(c: &Cluster, path: &str) -> String {
    format!("{}/api/v1/agents/1/kubernetes{path}", c.rest_url(0))
}

/// The response of a proxied request, which must be a Kubernetes `Status`.
async fn status_body(resp: reqwest::Response) -> serde_json::Value {
    let ct = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    assert!(ct.starts_with("application/json"), "content type {ct}");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["kind"], "Status", "{body}");
    body
}

/// A proxied GET answered by agentk itself with a 504 `Timeout` Status whose message names
/// `what` timed out, well before the client would give up.
async fn proxied_get_is_a_504_timeout(c: &Cluster, what: &str) {
    let started = std::time::Instant::now();
    let resp = reqwest::Client::new()
        .get(proxy_url(c, "/api/v1/namespaces/default/pods"))
        .bearer_auth(c.gitlab_jwt())
        .timeout(Duration::from_secs(15))
        .send()
        .await
        .expect("an answer before the client gives up");
    assert_eq!(resp.status(), 504);
    let body = status_body(resp).await;
    assert_eq!(body["code"], 504);
    assert_eq!(body["reason"], "Timeout");
    assert!(body["message"].as_str().unwrap().contains(what), "{body}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn an_api_server_that_never_answers_costs_a_504_status_after_the_response_header_timeout() {
    let c = Cluster::builder().start().await;
    let (_server, url) = silent_api_server().await;
    let a = agentk_against(&c, &url, |config| config.kube_api_response_header_timeout = Duration::from_secs(1)).await;
    proxied_get_is_a_504_timeout(&c, "response").await;
    eventually!(a.status.pool.borrow().in_use == 0, "the tunnel is free again");
}

#[tokio::test]
async fn an_api_server_that_never_accepts_costs_a_504_status_after_the_connect_timeout() {
    let c = Cluster::builder().start().await;
    let unconnectable = Unconnectable::bind().await;
    let url = format!("http://{}", unconnectable.address());
    let a = agentk_against(&c, &url, |config| config.kube_api_connect_timeout = Duration::from_millis(500)).await;
    proxied_get_is_a_504_timeout(&c, "connect").await;
    eventually!(a.status.pool.borrow().in_use == 0, "the tunnel is free again");
}

/// Opens a proxied request through KasApi.MakeKubernetesRequest; a spawned task streams a body
/// of `size` bytes (as far as anything takes it), then half-closes, counting the chunks sent.
fn open_grpc_upload(c: &Cluster, path: &str, size: usize) -> (Upload, tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    const CHUNK: usize = 64 * 1024;
    let (tx, rx) = mpsc::channel(1);
    let head = HttpRequestHead { method: "POST".into(), path: path.into(), headers: Default::default() };
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let writer = tokio::spawn(async move {
        let first = KubernetesRequest { agent_id: 1, connection_id: 0, frame: Some(HttpFrame::request_head(head)) };
        if tx.send(first).await.is_err() {
            return;
        }
        let chunk = Bytes::from(vec![b'x'; CHUNK]);
        for _ in 0..size.div_ceil(CHUNK) {
            let frame = Some(HttpFrame::body(chunk.clone()));
            if tx.send(KubernetesRequest { agent_id: 0, connection_id: 0, frame }).await.is_err() {
                return;
            }
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    let mut api = c.api(0);
    let call =
        tokio::spawn(async move { Ok(api.make_kubernetes_request(ReceiverStream::new(rx)).await?.into_inner()) });
    (call, writer, sent)
}

type Upload = tokio::task::JoinHandle<Result<tonic::Streaming<HttpFrame>, tonic::Status>>;

#[tokio::test]
async fn callers_that_leave_free_their_tunnels_while_agentk_waits_for_the_api_server() {
    let c = Cluster::builder().start().await;
    let (_server, url) = silent_api_server().await;
    // The default timeouts (70 s): only the callers leaving can free these tunnels in time.
    let a = agentk_against(&c, &url, |_| {}).await;
    let client = reqwest::Client::new();
    // GETs waiting for a response head that never comes (REST callers).
    let mut gets = Vec::new();
    for _ in 0..3 {
        let request = client.get(proxy_url(&c, "/api/v1/pods?watch=1")).bearer_auth(c.gitlab_jwt()).send();
        gets.push(tokio::spawn(request));
    }
    // Uploads whose body the API server never reads (gRPC callers). 6 MiB is more than the
    // buffers between agentk and the API server take (its body channel and a loopback socket,
    // about 4.5 MiB), so agentk stops reading the tunnel, and less than those plus agentk's
    // read-ahead (4 MiB), so agentk sees the body's end and then the tunnel's.
    let mut uploads = Vec::new();
    for _ in 0..3 {
        uploads.push(open_grpc_upload(&c, "/api/v1/namespaces/default/pods", 6 << 20));
    }
    eventually!(a.status.pool.borrow().in_use == 6, "six tunnels in use: {:?}", *a.status.pool.borrow());
    // Every buffer on the way is full (agentk is stuck handing the body on): the bodies stopped
    // moving. A check that passed too early would let the test pass, never fail wrongly.
    for (_, _, sent) in &uploads {
        let mut last = 0;
        eventually!(
            {
                let now = sent.load(Ordering::Relaxed);
                let stalled = now > 0 && now == last;
                last = now;
                tokio::time::sleep(Duration::from_millis(300)).await;
                stalled
            },
            "upload stalled"
        );
    }
    for g in gets {
        g.abort();
    }
    for (call, writer, _) in uploads {
        call.abort();
        writer.abort();
    }
    let left = std::time::Instant::now();
    eventually!(a.status.pool.borrow().in_use == 0, "tunnels freed: {:?}", *a.status.pool.borrow());
    assert!(left.elapsed() < Duration::from_secs(5), "tunnels freed only after {:?}", left.elapsed());
}

/// Sends a POST with a chunked body (no Content-Length) over HTTP/1.1 to the proxy path and
/// returns the status and body of the answer.
async fn post_chunked(c: &Cluster, path: &str, chunks: Vec<Bytes>) -> (http::StatusCode, Bytes) {
    use http_body_util::BodyExt;
    let stream = TcpStream::connect(c.kas[0].addresses.rest).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let frames = futures::stream::iter(
        chunks.into_iter().map(|b| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b))),
    );
    let request = http::Request::post(format!("/api/v1/agents/1/kubernetes{path}"))
        .header("host", c.kas[0].addresses.rest.to_string())
        .header("authorization", format!("Bearer {}", c.gitlab_jwt()))
        .header("content-type", "application/json")
        .body(http_body_util::StreamBody::new(frames))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    (status, response.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_and_no_byte_of_it_reaches_the_api_server() {
    let c = Cluster::builder().start().await;
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let limit = kas::config::DEFAULT_REST_MAX_REQUEST_BODY_BYTES;
    let path = "/api/v1/namespaces/default/pods";

    // Chunked, of unknown length: refused once it passes the limit.
    let chunks = vec![Bytes::from(vec![b' '; 64 * 1024]); (limit + (1 << 20)) / (64 * 1024)];
    let (status, body) = post_chunked(&c, path, chunks).await;
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["reason"], "RequestEntityTooLarge", "{body}");
    assert_eq!(body["code"], 413);

    // With a Content-Length over the limit: refused at once, also as a Status.
    let resp = reqwest::Client::new()
        .post(proxy_url(&c, path))
        .bearer_auth(c.gitlab_jwt())
        .header("content-type", "application/json")
        .body(vec![b' '; limit + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(status_body(resp).await["code"], 413);

    assert!(
        c.kube.requests().iter().all(|r| r.path != path),
        "the API server saw {:?}",
        c.kube.requests().iter().map(|r| format!("{} {}", r.method, r.path)).collect::<Vec<_>>()
    );

    // A chunked body within the limit goes through whole.
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chunked"}}).to_string();
    let (first, second) = pod.as_bytes().split_at(pod.len() / 2);
    let (status, body) =
        post_chunked(&c, path, vec![Bytes::copy_from_slice(first), Bytes::copy_from_slice(second)]).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let bodies = c.kube.bodies();
    assert_eq!(bodies.last().unwrap().body, pod.as_bytes());
}

#[tokio::test]
async fn idle_tunnels_shrink_back_to_the_target_after_a_burst() {
    let c = Cluster::builder()
        .configure(|config, _| config.agent_connections.idle_tunnel_timeout = Duration::from_millis(400))
        .start()
        .await;
    let mut config = c.agentk_config(1, 0, "agentk-burst");
    config.idle_quiet_period = Duration::from_millis(300);
    let a = c.start_agentk_with(config).await;
    a.ready().await;
    let min_idle = agentk::config::DEFAULT_MIN_IDLE_TUNNELS;

    // A burst of 16 concurrent streams: the idle target follows it, 16 idle tunnels open.
    let mut watches = Vec::new();
    for _ in 0..16 {
        watches.push(c.open_watch(1).await.1);
    }
    eventually!(a.status.pool.borrow().idle >= 16, "idle tunnels grew: {:?}", *a.status.pool.borrow());
    drop(watches);
    eventually!(a.status.pool.borrow().in_use == 0, "the burst is over");

    // Quiet: the extra tunnels are closed (by kas) and not opened again.
    eventually!(
        {
            let stats = c.kas[0].handle.tunnel_stats().await.unwrap();
            *a.status.pool.borrow() == agentk::pool::PoolStats { idle: min_idle, in_use: 0 }
                && stats.idle_tunnels == min_idle
        },
        "idle tunnels back to {min_idle}: agentk {:?}, kas {:?}",
        *a.status.pool.borrow(),
        c.kas[0].handle.tunnel_stats().await
    );
}
