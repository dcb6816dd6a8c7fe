//! Rolling restarts: a kas that stops gracefully hands its agents to another replica (agentk
//! moves to its next address) and no request fails; connections that reach their maximum age
//! reconnect without failing requests either.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kas_e2e::{Cluster, eventually};
use kas_proto::kas::GetPodsRequest;

/// A steady GetPods load through kas number `kas` until stopped: (successes, failures).
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Load {
    fn start(c: &Cluster, kas: usize) -> Self {
        let (stop, ok) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let mut api = c.api(kas);
        let (s, o) = (stop.clone(), ok.clone());
        let task = tokio::spawn(async move {
            let mut errors = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match api.get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await {
                    Ok(_) => {
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => errors.push(format!("{:?}: {}", e.code(), e.message())),
                }
            }
            errors
        });
        Self { stop, ok, task }
    }

    fn ok(&self) -> usize {
        self.ok.load(Ordering::Relaxed)
    }

    async fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let errors = self.task.await.unwrap();
        (self.ok.load(Ordering::Relaxed), errors)
    }
}

#[tokio::test]
async fn a_graceful_restart_hands_agents_to_another_kas_without_failed_requests() {
    let mut c = Cluster::builder().redis().kas(2).start().await;
    c.kube.add_pod("default", "p");
    // agentk knows both replicas and starts with kas 1.
    let mut config = c.agentk_config(1, 1, "agentk-0");
    config.kas_address = format!("grpc://{},grpc://{}", c.kas[1].addresses.agent, c.kas[0].addresses.agent);
    let a = c.start_agentk_with(config).await;
    a.ready().await;
    let on_kas_1 = c.kas[1].instance_id().to_owned();
    let on_kas_0 = c.kas[0].instance_id().to_owned();
    let holder = |agents: &[kas_proto::kas::ConnectedAgentInfo]| agents.first().map(|i| i.kas_instance_id.clone());
    assert_eq!(holder(&c.connections(0, 1).await), Some(on_kas_1));

    // Steady load through kas 0, which forwards to kas 1 for now.
    let load = Load::start(&c, 0);
    eventually!(load.ok() >= 20, "load running through kas 1");
    // Roll kas 1: it drains, tells the agent to move, removes its records, exits.
    c.kas.remove(1).stop().await;
    eventually!(holder(&c.connections(0, 1).await) == Some(on_kas_0.clone()), "the agent moved to kas 0");
    let after_move = load.ok();
    eventually!(load.ok() >= after_move + 20, "requests served by the agent on kas 0");
    // A new kas 1 joins (the "restarted" replica); traffic goes on.
    let k = c.start_kas().await;
    c.kas.push(k);
    let (ok, errors) = load.finish().await;
    assert!(errors.is_empty(), "{} of {} requests failed: {errors:?}", errors.len(), ok + errors.len());
}

#[tokio::test]
async fn connections_reaching_their_maximum_age_reconnect_without_failed_requests() {
    let c = Cluster::builder()
        .configure(|config, _| config.agent_connections.max_age = Duration::from_millis(400))
        .start()
        .await;
    c.kube.add_pod("default", "p");
    let a = c.start_agentk(1, 0, "agentk-0").await;
    let first = a.connection_id().unwrap();
    let load = Load::start(&c, 0);
    // Several reconnections happen under load.
    let mut seen = std::collections::HashSet::from([first]);
    eventually!(
        {
            if let Some(id) = a.connection_id() {
                seen.insert(id);
            }
            seen.len() >= 3
        },
        "agentk reconnected at least twice"
    );
    let (ok, errors) = load.finish().await;
    assert!(ok > 0);
    assert!(errors.is_empty(), "{} of {} requests failed: {errors:?}", errors.len(), ok + errors.len());
}
