//! GitLab mode with a Redis registry: GitLab's agent_info answers are shared between kas, so an
//! agent verified by one kas is not verified with GitLab again by another (a failover, a second
//! replica), within `gitlab.agent_info_cache.ttl` after GitLab's yes, and not after it.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use kas_e2e::{Cluster, ClusterBuilder, FakeGitlab, eventually};
use sha2::{Digest, Sha256};
use tonic::Code;

/// Long enough for the steps before the expiry, short enough to wait for.
const TTL: Duration = Duration::from_secs(4);

fn gitlab(c: &Cluster) -> &FakeGitlab {
    c.gitlab.as_ref().unwrap()
}

fn two_kas(builder: ClusterBuilder) -> ClusterBuilder {
    builder.kas(2).gitlab().configure(|config, _| {
        config.gitlab.agent_info_cache.ttl = TTL;
        config.gitlab.agent_info_cache.error_ttl = Duration::from_millis(200);
        // The tests open a presence stream after another until an entry expires.
        config.limits.agent_connections_per_minute = 100_000;
    })
}

/// The agent opens its presence stream on kas 0, then on kas 1 (each must be accepted).
async fn open_on_both(c: &Cluster, token: &str) {
    c.open_configuration_on(0, token, "").await.unwrap();
    c.open_configuration_on(1, token, "").await.unwrap();
}

fn prefix(c: &Cluster) -> String {
    c.config.registry.redis.as_ref().unwrap().key_prefix.clone()
}

#[tokio::test]
async fn an_agent_verified_by_one_kas_is_not_verified_again_by_another_within_the_ttl() {
    let c = two_kas(Cluster::builder().redis()).start().await;
    let token = c.agent(1).token.clone();
    let a = c.start_agentk(1, 0, "agentk-a").await;
    a.ready().await;
    assert_eq!(gitlab(&c).requests(), 1);

    // The same agent on the other kas (a replica, or the agent moving there): its presence and
    // tunnels are verified from the shared entry.
    let b = c.start_agentk(1, 1, "agentk-b").await;
    b.ready().await;
    c.open_configuration_on(1, &token, "").await.unwrap();
    assert_eq!(gitlab(&c).requests(), 1, "kas 1 used kas 0's answer");
    c.assert_metrics(1, &[r#"kas_agent_info_shared_cache_total{outcome="hit"}"#]).await;
    c.assert_metrics(0, &[r#"kas_agent_info_shared_cache_total{outcome="stored"}"#]).await;

    // One entry, named by an HMAC: neither the token nor its plain SHA-256 appears in Redis.
    let redis = c.redis.as_ref().unwrap();
    let keys: Vec<String> = redis.query(redis::cmd("KEYS").arg(format!("{}:agent_info:*", prefix(&c)))).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let plain = hex::encode(Sha256::digest(token.as_bytes()));
    assert!(!keys[0].contains(&plain) && !keys[0].contains(&token), "{keys:?}");
    let value: Vec<u8> = redis.query(redis::cmd("GET").arg(&keys[0])).await;
    let value = String::from_utf8_lossy(&value);
    assert!(!value.contains(&token), "{value}");
    assert!(value.contains(r#""agent_id":1"#), "sealed JSON of the agent info: {value}");
    let memory: i64 = redis.query(redis::cmd("MEMORY").arg("USAGE").arg(&keys[0])).await;
    assert!(memory < 1024, "an entry costs Redis {memory} B (536 B measured; docs/scale.md)");
    let left: i64 = redis.query(redis::cmd("PTTL").arg(&keys[0])).await;
    assert!(left > 0 && left <= TTL.as_millis() as i64, "expires within the ttl: {left} ms");

    // After the ttl GitLab is asked again, once for both kas (the agents stopped: they would
    // race the test to it).
    a.stop().await;
    b.stop().await;
    let entry = keys[0].clone();
    eventually!(redis.query::<i64>(redis::cmd("EXISTS").arg(&entry)).await == 0, "the shared entry expires");
    eventually!(
        {
            c.open_configuration_on(1, &token, "").await.unwrap();
            gitlab(&c).requests() == 2
        },
        "kas 1 asks GitLab once the shared entry expired"
    );
    c.open_configuration_on(0, &token, "").await.unwrap();
    assert_eq!(gitlab(&c).requests(), 2, "kas 0 used kas 1's new answer");
}

#[tokio::test]
async fn a_revoked_token_stops_working_on_every_kas_after_the_ttl() {
    let c = two_kas(Cluster::builder().redis()).start().await;
    let token = c.agent(1).token.clone();
    open_on_both(&c, &token).await;
    assert_eq!(gitlab(&c).requests(), 1);
    gitlab(&c).revoke(&token);
    // Until the ttl both kas still accept it (GitLab's yes holds that long), then neither does:
    // kas 1 does not keep the shared yes beyond its life in Redis.
    for kas in [0, 1] {
        eventually!(
            c.open_configuration_on(kas, &token, "").await.is_err_and(|e| e.code() == Code::Unauthenticated),
            "kas {kas} rejects the revoked token"
        );
    }
    // The yes, then per kas at most one renewal attempt in the answer's last quarter (refused:
    // not repeated) and one request once the answer expired.
    let asked = gitlab(&c).requests();
    assert!((3..=5).contains(&asked), "each kas asked GitLab once the entry expired, renewing at most once: {asked}");
    // The refusal is not shared: there is no entry for the token any more.
    let redis = c.redis.as_ref().unwrap();
    let keys: Vec<String> = redis.query(redis::cmd("KEYS").arg(format!("{}:agent_info:*", prefix(&c)))).await;
    assert!(keys.is_empty(), "{keys:?}");
}

#[tokio::test]
async fn with_redis_down_each_kas_asks_gitlab() {
    let (logs, _guard) = kas_e2e::CapturedLogs::on_this_thread();
    let mut c = two_kas(Cluster::builder().agents(&[(1, 10), (2, 10)]).redis()).start().await;
    c.redis.as_mut().unwrap().stop().await;
    let token = c.agent(1).token.clone();
    open_on_both(&c, &token).await;
    assert_eq!(gitlab(&c).requests(), 2, "no sharing, but every verification works");
    c.assert_metrics(0, &[r#"kas_agent_info_shared_cache_total{outcome="error"}"#]).await;
    let warnings = logs.lines_with("shared agent_info cache failed");
    assert!(!warnings.is_empty(), "{}", logs.text());
    assert!(!logs.text().contains(&token), "the token is never logged");

    // Redis back: sharing resumes.
    c.redis.as_mut().unwrap().start_again().await;
    for kas in [0, 1] {
        eventually!(c.kas[kas].registry.ping().await.is_ok(), "kas {kas} reaches Redis again");
    }
    let token = c.agent(2).token.clone();
    c.open_configuration_on(0, &token, "").await.unwrap();
    let asked = gitlab(&c).requests();
    c.open_configuration_on(1, &token, "").await.unwrap();
    assert_eq!(gitlab(&c).requests(), asked, "kas 1 used kas 0's answer");
}

#[tokio::test]
async fn sharing_can_be_turned_off() {
    let c = two_kas(Cluster::builder().redis())
        .configure(|config, _| config.gitlab.agent_info_cache.shared = false)
        .start()
        .await;
    let token = c.agent(1).token.clone();
    open_on_both(&c, &token).await;
    assert_eq!(gitlab(&c).requests(), 2);
}

#[tokio::test]
async fn the_shared_cache_works_on_a_redis_cluster() {
    let c = two_kas(Cluster::builder().redis_cluster()).start().await;
    let token = c.agent(1).token.clone();
    open_on_both(&c, &token).await;
    assert_eq!(gitlab(&c).requests(), 1, "kas 1 used kas 0's answer");
    // The entry's digest is its hash tag.
    let cluster = c.redis_cluster.as_ref().unwrap();
    let mut keys = Vec::new();
    for node in 0..kas_e2e::redis_server::CLUSTER_MASTERS {
        keys.extend(cluster.node_keys(node, &format!("{}:agent_info:*", prefix(&c))).await);
    }
    assert_eq!(keys.len(), 1, "{keys:?}");
    let tag = keys[0].split_once(":agent_info:").unwrap().1;
    assert!(tag.starts_with('{') && tag.ends_with('}') && tag.len() == 66, "{keys:?}");
}

#[tokio::test]
async fn an_entry_changed_in_redis_is_not_believed() {
    let c = two_kas(Cluster::builder().redis()).start().await;
    let token = c.agent(1).token.clone();
    c.open_configuration_on(0, &token, "").await.unwrap();
    // Someone with write access to Redis makes the token another agent's, for longer.
    let redis = c.redis.as_ref().unwrap();
    let keys: Vec<String> = redis.query(redis::cmd("KEYS").arg(format!("{}:agent_info:*", prefix(&c)))).await;
    let value: Vec<u8> = redis.query(redis::cmd("GET").arg(&keys[0])).await;
    // The seal (32 bytes) kept, the JSON after it changed.
    let (seal, json) = value.split_at(32);
    let json = String::from_utf8(json.to_vec()).unwrap().replace(r#""agent_id":1"#, r#""agent_id":2"#);
    let forged = [seal, json.as_bytes()].concat();
    assert_ne!(forged, value);
    let _: () = redis.query(redis::cmd("SET").arg(&keys[0]).arg(forged).arg("EX").arg(3600)).await;
    // kas 1 asks GitLab instead (and shares its answer again).
    c.open_configuration_on(1, &token, "").await.unwrap();
    assert_eq!(gitlab(&c).requests(), 2);
    assert!(c.connections(1, 2).await.is_empty(), "no connection of agent 2");
    let value_now: Vec<u8> = redis.query(redis::cmd("GET").arg(&keys[0])).await;
    assert!(String::from_utf8_lossy(&value_now).contains(r#""agent_id":1"#));
}
