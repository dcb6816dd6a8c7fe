//! redis-rs's cluster client as kas uses it for a Redis Cluster registry, against a fake cluster
//! node that speaks just enough RESP to steer it (vendor/redis/KAS-PATCH.md): a client left
//! without any node connection must come back once a node answers, instead of retrying its slot
//! refresh forever. A real cluster cannot be made to drop every connection on cue; the fake
//! answers as a cluster does (CLUSTER SLOTS, MOVED), with addresses of its choosing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use kas_e2e::eventually;
use redis::AsyncCommands;
use redis::cluster::ClusterClientBuilder;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What the fake node says about the cluster.
const SERVING: u8 = 0;
/// Every slot moved to a node that refuses connections.
const MOVED_AWAY: u8 = 1;

/// Reads one command (an array of bulk strings); `None` at the end of the stream.
async fn read_command(reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Option<Vec<String>> {
    let mut line = String::new();
    reader.read_line(&mut line).await.ok().filter(|n| *n > 0)?;
    let count: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        line.clear();
        reader.read_line(&mut line).await.ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut arg = vec![0; len + 2];
        reader.read_exact(&mut arg).await.ok()?;
        arg.truncate(len);
        args.push(String::from_utf8(arg).ok()?);
    }
    Some(args)
}

/// CLUSTER SLOTS: every slot served by `port` on 127.0.0.1.
fn slots_at(port: u16) -> String {
    let id = "0".repeat(40);
    format!("*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:{port}\r\n$40\r\n{id}\r\n")
}

async fn serve(stream: TcpStream, own_port: u16, gone_port: u16, state: Arc<AtomicU8>) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    while let Some(command) = read_command(&mut reader).await {
        let moved_away = state.load(Ordering::SeqCst) == MOVED_AWAY;
        let name = command.first().map(|c| c.to_ascii_uppercase()).unwrap_or_default();
        let sub = command.get(1).map(|c| c.to_ascii_uppercase()).unwrap_or_default();
        let reply = match (name.as_str(), sub.as_str()) {
            ("PING", _) => "+PONG\r\n".to_owned(),
            ("CLUSTER", "SLOTS") => slots_at(if moved_away { gone_port } else { own_port }),
            ("GET", _) if moved_away => format!("-MOVED 0 127.0.0.1:{gone_port}\r\n"),
            ("GET", _) => "$5\r\nvalue\r\n".to_owned(),
            _ => "+OK\r\n".to_owned(),
        };
        if write.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// The fake node: its port and the switch of what it says.
async fn fake_node() -> (u16, Arc<AtomicU8>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake node");
    let own_port = listener.local_addr().expect("the fake node's address").port();
    // A port nothing listens on: connections to it are refused.
    let gone = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
    let gone_port = gone.local_addr().expect("its address").port();
    drop(gone);
    let state = Arc::new(AtomicU8::new(SERVING));
    let node_state = state.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, own_port, gone_port, node_state.clone()));
        }
    });
    (own_port, state)
}

/// The node answering this client's commands moves every slot to a node that is gone: the slot
/// refresh succeeds and leaves the client without a single connection. Once the node serves the
/// slots again, the client must serve again (redis-rs 1.8.1 without kas's patch retried the
/// refresh at once, forever, with nobody to ask).
#[tokio::test]
async fn a_cluster_client_left_without_connections_serves_again_once_a_node_answers() {
    kas_e2e::init_test_logging();
    let (port, state) = fake_node().await;
    // As kas's registry builds it (proxy/src/registry/redis.rs), with RESP2 for the fake.
    let client = ClusterClientBuilder::new(vec![format!("redis://127.0.0.1:{port}")])
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(1))
        .retries(3)
        .min_retry_wait(50)
        .max_retry_wait(500)
        .build()
        .unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let value: Option<String> = conn.get("key").await.unwrap();
    assert_eq!(value.as_deref(), Some("value"));

    state.store(MOVED_AWAY, Ordering::SeqCst);
    let moved: Result<Option<String>, _> = tokio::time::timeout(Duration::from_secs(10), conn.get("key"))
        .await
        .expect("a GET whose slot moved to a node that is gone ends (with an error)");
    assert!(moved.is_err(), "the slot's node is gone: {moved:?}");

    state.store(SERVING, Ordering::SeqCst);
    eventually!(
        matches!(
            tokio::time::timeout(Duration::from_secs(2), conn.get::<_, Option<String>>("key")).await,
            Ok(Ok(Some(ref v))) if v == "value"
        ),
        "the client serves again once a node serves the slots"
    );
}
