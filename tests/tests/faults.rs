//! Network faults between the components, injected with `FaultProxy`: a hung kas (paused, its
//! sockets open), a dead peer (connections reset), and how routing and agentk get past them.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use kas_e2e::{Cluster, FaultProxy, ProxyTarget, eventually};
use kas_proto::kas::GetPodsRequest;

fn get_pods(agent_id: i64, connection_id: i64) -> GetPodsRequest {
    GetPodsRequest { agent_id, connection_id }
}

/// Starts another kas whose internal listener is advertised (in the registry) at a fault proxy
/// in front of it, so every peer reaches it through the proxy. Appended to `c.kas`.
async fn start_kas_behind_proxy(c: &mut Cluster) -> FaultProxy {
    let proxy = FaultProxy::bind().await;
    let mut config = c.config.clone();
    config.kas_internal.advertise_port = Some(proxy.address().port());
    let kas = c.start_kas_with(config).await;
    proxy.set_target(ProxyTarget::Tcp(kas.addresses.internal));
    c.kas.push(kas);
    proxy
}

#[tokio::test]
async fn a_hung_kas_holding_one_of_two_connections_delays_requests_through_a_third_kas_by_at_most_5_s() {
    let mut c = Cluster::builder().redis().kas(1).start().await;
    c.kube.add_pod("default", "p");
    let to_kas1_internal = start_kas_behind_proxy(&mut c).await;
    let kas2 = c.start_kas().await;
    c.kas.push(kas2);
    // Replica A on kas 0; replica B on kas 1 through a proxy (its next address is kas 0).
    let to_kas1_agent = FaultProxy::start(c.kas[1].addresses.agent).await;
    let _a = c.start_agentk(1, 0, "replica-a").await;
    let mut config = c.agentk_config(1, 1, "replica-b");
    config.kas_address = format!("grpc://{},grpc://{}", to_kas1_agent.address(), c.kas[0].addresses.agent);
    let b = c.start_agentk_with(config).await;
    b.ready().await;
    eventually!(c.connections(2, 1).await.len() == 2, "kas 2 sees both connections");

    let api = c.api(2);
    // kas 2's connection to kas 1 is open (through the proxy) before kas 1 hangs.
    api.clone().get_pods(get_pods(1, b.connection_id().unwrap())).await.expect("replica B through kas 1");
    let mut baseline = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        api.clone().get_pods(get_pods(1, 0)).await.expect("before the fault");
        baseline = baseline.max(t.elapsed());
    }

    // kas 1 hangs: it answers neither its peers nor its agent, and its sockets stay open.
    to_kas1_internal.pause();
    to_kas1_agent.pause();
    let hung_at = Instant::now();
    let mut loops = Vec::new();
    for _ in 0..4 {
        let mut api = api.clone();
        loops.push(tokio::spawn(async move {
            let mut results = Vec::new();
            while hung_at.elapsed() < Duration::from_secs(8) {
                let t = Instant::now();
                let r = tokio::time::timeout(Duration::from_secs(30), api.get_pods(get_pods(1, 0))).await;
                let r = match r {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
                    Err(_) => Err("no answer within 30 s".to_owned()),
                };
                results.push((t.elapsed(), r));
            }
            results
        }));
    }
    let mut results = Vec::new();
    for l in loops {
        results.extend(l.await.unwrap());
    }
    let worst = results.iter().map(|(d, _)| *d).max().unwrap();
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    eprintln!("hung kas: {} requests, slowest {worst:?} (without the fault: {baseline:?})", results.len());
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        results.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(
        worst <= baseline + Duration::from_secs(5),
        "slowest of {} requests took {worst:?} (without the fault: {baseline:?})",
        results.len()
    );
}

#[tokio::test]
async fn agentk_moves_off_a_hung_kas_within_10_s() {
    let c = Cluster::builder().kas(2).start().await;
    c.kube.add_pod("default", "p");
    let proxy = FaultProxy::start(c.kas[0].addresses.agent).await;
    let mut config = c.agentk_config(1, 0, "agentk");
    config.kas_address = format!("grpc://{},grpc://{}", proxy.address(), c.kas[1].addresses.agent);
    let a = c.start_agentk_with(config).await;
    a.ready().await;
    let first = a.connection_id().unwrap();
    assert_eq!(c.kas[1].handle.tunnel_stats().await.unwrap().connections, 0);

    proxy.pause();
    let paused = Instant::now();
    // Polled (not slept): the first moment agentk is connected to kas 1 with a tunnel there.
    let moved = loop {
        let on_kas1 = c.kas[1].handle.tunnel_stats().await.is_some_and(|s| s.connections == 1 && s.idle_tunnels > 0);
        if on_kas1 && a.status.is_ready() {
            break paused.elapsed();
        }
        assert!(paused.elapsed() < Duration::from_secs(45), "agentk not on kas 1 45 s after kas 0 hung");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("agentk moved off the hung kas after {moved:?}");
    assert_ne!(a.connection_id(), Some(first));
    assert!(moved < Duration::from_secs(10), "agentk moved to its other kas after {moved:?}");
    c.api(1).get_pods(get_pods(1, 0)).await.expect("served on kas 1");
}

#[tokio::test]
async fn a_dead_peer_is_dialed_a_few_times_per_second_and_logged_once_per_state_change() {
    let (logs, _guard) = kas_e2e::CapturedLogs::on_this_thread();
    let mut c = Cluster::builder().redis().kas(1).start().await;
    c.kube.add_pod("default", "p");
    let to_kas1 = start_kas_behind_proxy(&mut c).await;
    let kas2 = c.start_kas().await;
    c.kas.push(kas2);
    let _a = c.start_agentk(1, 0, "replica-a").await;
    let b = c.start_agentk(1, 1, "replica-b").await;
    eventually!(c.connections(2, 1).await.len() == 2, "kas 2 sees both connections");
    let mut api = c.api(2);
    api.get_pods(get_pods(1, b.connection_id().unwrap())).await.expect("replica B through kas 1");

    // kas 1 dies for its peers (connections reset, new ones refused) while its records and
    // heartbeat live on: the window before the heartbeat expires, at full request rate.
    to_kas1.refuse();
    let dials_before = to_kas1.accepted();
    let started = Instant::now();
    let mut loops = Vec::new();
    for _ in 0..4 {
        let mut api = api.clone();
        loops.push(tokio::spawn(async move {
            let mut requests = 0u32;
            while started.elapsed() < Duration::from_secs(3) {
                api.get_pods(get_pods(1, 0)).await.expect("served by replica A through kas 0");
                requests += 1;
            }
            requests
        }));
    }
    let mut requests = 0;
    for l in loops {
        requests += l.await.unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    let dials = to_kas1.accepted() - dials_before;
    let peer = to_kas1.address().to_string();
    let lines = logs.lines_with(&peer);
    eprintln!("dead peer: {dials} dials in {seconds:.1} s ({requests} requests, {} log lines)", lines.len());
    assert!(
        (dials as f64) <= 4.0 * seconds + 2.0,
        "kas 2 dialed the dead kas {dials} times in {seconds:.1} s ({requests} requests, {} log lines)",
        lines.len()
    );
    assert_eq!(
        lines.len(),
        1,
        "{} log lines name the dead peer, first ones: {:#?}",
        lines.len(),
        &lines[..lines.len().min(3)]
    );
    assert!(lines[0].contains("WARN") && lines[0].contains("down"), "{}", lines[0]);

    // kas 1 is back: one more line, and kas 2 routes to it again.
    to_kas1.resume();
    eventually!(logs.lines_with(&peer).len() == 2, "a line for the peer coming back");
    let lines = logs.lines_with(&peer);
    assert!(lines[1].contains("INFO") && lines[1].contains("up"), "{}", lines[1]);
    api.get_pods(get_pods(1, b.connection_id().unwrap())).await.expect("replica B through kas 1 again");
}
