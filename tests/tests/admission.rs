//! Admission control of new agent connections (`limits.agent_connection_accept_rate`): a kas at
//! its accept rate sheds new presence streams with UNAVAILABLE and a retry pushback, agentk waits
//! at least that long before it tries again, and a shed attempt is never counted against the
//! agent's own `limits.agent_connections_per_minute`, so agents failing over to a busy kas are not
//! refused for it.

use std::time::Duration;

use kas::config::AcceptRateConfig;
use kas_e2e::cluster::Cluster;
use kas_e2e::{authorized, eventually};
use kas_proto::tunnel::pb::agent_tunnel_client::AgentTunnelClient;
use kas_proto::tunnel::pb::{ConfigurationRequest, ConfigurationResponse};
use tokio::time::Instant;
use tonic::Code;

/// One new connection a second, one at once.
const SLOW: AcceptRateConfig = AcceptRateConfig { per_second: 1, burst: 1 };

/// Opens a presence stream of the agent holding `token` on an agent listener, as agentk does.
async fn presence(
    address: std::net::SocketAddr,
    token: &str,
) -> Result<tonic::Streaming<ConfigurationResponse>, tonic::Status> {
    let mut client = AgentTunnelClient::new(kas_e2e::cluster::channel(address));
    let request = ConfigurationRequest { connection_id: i64::from(rand::random::<u32>()) + 1, ..Default::default() };
    client.get_configuration(authorized(request, token)).await.map(tonic::Response::into_inner)
}

#[tokio::test]
async fn a_kas_at_its_accept_rate_sheds_with_a_pushback_and_agentk_waits_it_out() {
    let c = Cluster::builder()
        .agents(&[(1, 10), (2, 20)])
        .configure(|config, _| {
            config.limits.agent_connection_accept_rate = SLOW;
            // An agent admitted once in the minute: a shed attempt counted too would refuse it.
            config.limits.agent_connections_per_minute = 1;
        })
        .start()
        .await;
    let _admitted = c.open_configuration(1, "").await.expect("the burst admits one");
    let sent = Instant::now();
    let shed = c.open_configuration(1, "").await.expect_err("beyond the burst: shed");
    assert_eq!(shed.code(), Code::Unavailable, "{shed:?}");
    assert!(shed.message().contains("limits.agent_connection_accept_rate"), "{}", shed.message());
    let pushback = kas_proto::metadata::retry_pushback(&shed).expect("a shed says when to come back");
    assert!(pushback > Duration::ZERO && pushback <= Duration::from_secs(1), "{pushback:?}");

    // agentk arrives now: kas gives it the next slot, a second after the one above.
    let agentk = c.start_agentk(2, 0, "agentk-2").await;
    let connected = Instant::now();
    assert!(
        connected >= sent + pushback + Duration::from_secs(1),
        "agentk connected {:?} after the first shed, before its slot ({:?})",
        connected - sent,
        pushback + Duration::from_secs(1)
    );
    assert_eq!(*agentk.status.failed_attempts.borrow(), 1, "one shed, then admitted at its slot");
    c.assert_metrics(
        0,
        &[
            "kas_agent_connection_admissions_total{outcome=\"shed\"}",
            "kas_agent_connection_admissions_total{outcome=\"admitted\"}",
        ],
    )
    .await;
}

#[tokio::test]
async fn agents_failing_over_to_a_busy_kas_are_shed_not_counted_against_their_connection_limit() {
    let mut c = Cluster::builder()
        .kas(2)
        .agents(&[(1, 10), (2, 20)])
        .configure(|config, _| {
            config.limits.agent_connection_accept_rate = SLOW;
            config.limits.agent_connections_per_minute = 2;
        })
        .start()
        .await;
    let (token, other) = (c.agent(1).token.clone(), c.agent(2).token.clone());
    // Agent 1 on kas A (its first connection of the minute), until kas A goes away.
    let mut on_a = presence(c.kas[0].addresses.agent, &token).await.expect("agent 1 on kas A");
    c.kas.remove(0).stop().await;
    while let Ok(Some(_)) = on_a.message().await {}
    // Another agent takes kas B's burst: agent 1 arrives at a busy kas.
    let b = c.kas[0].addresses.agent;
    let _other = presence(b, &other).await.expect("agent 2 on kas B");
    let (mut shed, mut admitted) = (0, None);
    eventually!(
        match presence(b, &token).await {
            Ok(stream) => {
                admitted = Some(stream);
                true
            }
            Err(s) if s.code() == Code::Unavailable && kas_proto::metadata::retry_pushback(&s).is_some() => {
                shed += 1;
                false
            }
            Err(s) => panic!("agent 1 refused after {shed} sheds: {s:?}"),
        },
        "agent 1 admitted on kas B"
    );
    // Without the bound on what is counted, the second shed would already have been refused.
    assert!(shed >= 2, "kas B was busy: agent 1 was shed {shed} times");
    let connections = c.connections(0, 1).await;
    assert_eq!(connections.len(), 1, "{connections:?}");
    assert_eq!(connections[0].kas_instance_id, c.kas[0].instance_id());
    drop(admitted);
}
