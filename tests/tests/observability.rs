//! agentk's probe endpoints (what the Helm chart's liveness and readiness probes call), over real
//! HTTP against an agentk connected to a real kas.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use agentk::{LIVEZ_PATH, READYZ_PATH};
use kas_e2e::{Cluster, eventually, http_get};

#[tokio::test]
async fn readyz_follows_the_kas_connection_and_livez_stays_ok() {
    let mut c = Cluster::builder().start().await;
    let a = c.start_agentk(1, 0, "agentk-0").await;
    let address = a.status.observability_address;
    assert!(address.ip().is_loopback() && address.port() != 0, "embedded agentk uses a free loopback port: {address}");

    assert_eq!(http_get(&format!("http://{address}{LIVEZ_PATH}")).await, (200, "ok\n".to_owned()));
    assert_eq!(http_get(&format!("http://{address}{READYZ_PATH}")).await, (200, "ok\n".to_owned()));

    // kas goes away: agentk is no longer ready (a rollout would wait), but it is alive.
    c.kas.remove(0).stop().await;
    let mut last: (u16, String);
    eventually!(
        {
            last = http_get(&format!("http://{address}{READYZ_PATH}")).await;
            last.0 == 503
        },
        "/readyz answers 503 after kas stopped (last answer: {last:?})"
    );
    assert!(last.1.contains("not connected to kas"), "{last:?}");
    assert_eq!(http_get(&format!("http://{address}{LIVEZ_PATH}")).await, (200, "ok\n".to_owned()));

    // Stopped agentk: nothing listens any more.
    a.stop().await;
    assert!(tokio::net::TcpStream::connect(address).await.is_err(), "observability listener closed on stop");
}

#[tokio::test]
async fn agentk_with_a_rejected_token_is_alive_but_never_ready() {
    let c = Cluster::builder().start().await;
    let mut config = c.agentk_config(1, 0, "bad-token");
    let bad_token = c.dir.path().join("bad-token");
    std::fs::write(&bad_token, "wrong").unwrap();
    config.token_file = bad_token;
    let a = c.start_agentk_with(config).await;
    a.status.failed_attempts.clone().wait_for(|n| *n >= 2).await.unwrap();

    let address = a.status.observability_address;
    let (code, body) = http_get(&format!("http://{address}{READYZ_PATH}")).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("not connected to kas"), "{body}");
    assert_eq!(http_get(&format!("http://{address}{LIVEZ_PATH}")).await, (200, "ok\n".to_owned()));
}

#[tokio::test]
async fn two_embedded_agentk_get_distinct_observability_ports() {
    let c = Cluster::builder().start().await;
    let a0 = c.start_agentk(1, 0, "agentk-0").await;
    let a1 = c.start_agentk(1, 0, "agentk-1").await;
    assert_ne!(a0.status.observability_address, a1.status.observability_address);
    assert_eq!(http_get(&format!("http://{}{READYZ_PATH}", a0.status.observability_address)).await.0, 200);
    assert_eq!(http_get(&format!("http://{}{READYZ_PATH}", a1.status.observability_address)).await.0, 200);
}
