//! The registry conformance suite against a real redis-server, and Redis-specific properties.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;

use kas::registry::redis::{RedisConfig, RedisRegistry};
use kas::registry::{AgentRegistry, RegistryTiming};
use kas_e2e::fault_proxy::ProxyTarget;
use kas_e2e::registry_conformance::{self as conformance, Backend};
use kas_e2e::{FaultProxy, RedisServer, eventually};

struct Redis {
    url: String,
    prefix: String,
}

fn registry(url: &str, prefix: &str, timing: RegistryTiming) -> RedisRegistry {
    let mut config = RedisConfig::new(url);
    config.key_prefix = prefix.to_owned();
    RedisRegistry::new(&config, conformance::instance_info(), timing).unwrap()
}

impl Backend for Redis {
    async fn instance(&self, timing: RegistryTiming) -> Arc<dyn AgentRegistry> {
        let r = registry(&self.url, &self.prefix, timing);
        r.heartbeat().await.unwrap();
        Arc::new(r)
    }

    async fn isolated(&self, timing: RegistryTiming) -> Arc<dyn AgentRegistry> {
        let r = registry(&self.url, &format!("isolated-{}", rand::random::<u32>()), timing);
        r.heartbeat().await.unwrap();
        Arc::new(r)
    }
}

#[tokio::test]
async fn conformance_against_real_redis() {
    let server = RedisServer::start().await;
    conformance::run_all(&Redis { url: server.url(), prefix: "conformance".into() }).await;
}

#[tokio::test]
async fn a_refresh_is_one_round_trip_whatever_the_number_of_connections() {
    let server = RedisServer::start().await;
    let timing =
        RegistryTiming { ttl: std::time::Duration::from_secs(60), heartbeat_ttl: std::time::Duration::from_secs(60) };
    for n in [1, 100, 2000] {
        let r = registry(&server.url(), &format!("rt-{n}"), timing);
        for i in 0..n {
            r.register(conformance::record(1 + i % 7, 10, 1000 + i)).await.unwrap();
        }
        let before = r.round_trips();
        let started = std::time::Instant::now();
        r.refresh().await.unwrap();
        eprintln!("refresh of {n} connections on one server: {:?}", started.elapsed());
        assert_eq!(r.round_trips() - before, 1, "{n} connections");
    }
}

#[tokio::test]
async fn kas_starts_and_serves_while_redis_is_down_then_catches_up() {
    let mut server = RedisServer::start().await;
    let url = server.url();
    server.stop().await;
    // Constructing the registry does not need Redis; operations fail with a clear error.
    let timing =
        RegistryTiming { ttl: std::time::Duration::from_secs(60), heartbeat_ttl: std::time::Duration::from_secs(60) };
    let r = registry(&url, "down", timing);
    let err = r.register(conformance::record(1, 10, 100)).await.unwrap_err();
    assert!(err.to_string().starts_with("redis"), "{err}");
    assert!(r.ping().await.is_err());
    // When Redis is back, a refresh writes what failed while it was down.
    server.start_again().await;
    eventually!(r.refresh().await.is_ok(), "refresh succeeds once Redis is back");
    r.heartbeat().await.unwrap();
    assert_eq!(r.connections_by_agent_id(kas_proto::AgentId(1)).await.unwrap().len(), 1);
}

#[tokio::test]
async fn password_from_a_file_authenticates_and_a_wrong_one_is_a_clear_error() {
    let server = RedisServer::start_with_password(Some("s3cret-pass")).await;
    let dir = tempfile::tempdir().unwrap();
    let timing =
        RegistryTiming { ttl: std::time::Duration::from_secs(60), heartbeat_ttl: std::time::Duration::from_secs(60) };
    let with_password = |password: &str| {
        let file = dir.path().join(format!("password-{}", password.len()));
        std::fs::write(&file, format!("{password}\n")).unwrap();
        let mut config = RedisConfig::new(server.url());
        config.password_file = Some(file);
        RedisRegistry::new(&config, conformance::instance_info(), timing).unwrap()
    };
    let good = with_password("s3cret-pass");
    good.register(conformance::record(1, 10, 100)).await.unwrap();
    good.heartbeat().await.unwrap();
    assert_eq!(good.connections_by_agent_id(kas_proto::AgentId(1)).await.unwrap().len(), 1);

    let bad = with_password("wrong");
    let err = bad.ping().await.unwrap_err().to_string();
    assert!(err.contains("redis"), "{err}");
    assert!(!err.contains("wrong"), "the password must not appear in errors: {err}");
    // Without a password at all.
    let none = registry(&server.url(), "none", timing);
    assert!(none.ping().await.is_err());
    // A missing password file fails at startup, naming the file.
    let mut config = RedisConfig::new(server.url());
    config.password_file = Some(dir.path().join("missing"));
    let err = RedisRegistry::new(&config, conformance::instance_info(), timing).unwrap_err().to_string();
    assert!(err.contains("redis password file") && err.contains("missing"), "{err}");
}

#[tokio::test]
async fn rediss_with_a_private_ca() {
    let (server, port, ca) = RedisServer::start_tls().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca).unwrap();
    let timing =
        RegistryTiming { ttl: std::time::Duration::from_secs(60), heartbeat_ttl: std::time::Duration::from_secs(60) };
    let url = format!("rediss://localhost:{port}");
    let mut config = RedisConfig::new(&url);
    config.ca_cert_file = Some(ca_file);
    let r = RedisRegistry::new(&config, conformance::instance_info(), timing).unwrap();
    r.ping().await.expect("TLS to Redis with the private CA");
    r.heartbeat().await.unwrap();
    r.register(conformance::record(1, 10, 100)).await.unwrap();
    assert_eq!(r.connections_by_agent_id(kas_proto::AgentId(1)).await.unwrap().len(), 1);
    // Without the CA the certificate is not trusted.
    let untrusting = RedisRegistry::new(&RedisConfig::new(&url), conformance::instance_info(), timing).unwrap();
    assert!(untrusting.ping().await.is_err());
    drop(server);
}

/// A failover behind Sentinel or a managed Redis: the old primary stays up as a replica, keeps
/// kas's connection and refuses its writes (READONLY); the address kas uses now leads to the new
/// primary (here a proxy re-targeted, as a DNS name or Service would be). kas connects again and
/// rewrites its records on the new primary, which did not have them.
#[tokio::test]
async fn after_a_failover_kas_leaves_the_demoted_primary_for_the_new_one() {
    let old = RedisServer::start().await;
    let new = RedisServer::start().await;
    let address = FaultProxy::start_unix(old.socket()).await;
    let timing =
        RegistryTiming { ttl: std::time::Duration::from_secs(60), heartbeat_ttl: std::time::Duration::from_secs(60) };
    let r = registry(&format!("redis://{}", address.address()), "failover", timing);
    r.heartbeat().await.unwrap();
    r.register(conformance::record(1, 10, 100)).await.unwrap();

    // The old primary becomes a replica (of a primary it cannot reach, so it keeps its data and
    // refuses writes); new connections reach the new primary.
    let unreachable = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let reply: String = old.query(redis::cmd("REPLICAOF").arg("127.0.0.1").arg(unreachable)).await;
    assert_eq!(reply, "OK");
    address.set_target(ProxyTarget::Unix(new.socket()));
    let err = r.register(conformance::record(2, 20, 200)).await.unwrap_err();
    assert!(err.to_string().starts_with("redis register"), "{err}");

    // The refused write alone sends kas to the new primary and rewrites everything there (no
    // further call from this kas, no refresh).
    let reader = registry(&new.url(), "failover", timing);
    eventually!(
        reader.connections_by_agent_id(kas_proto::AgentId(1)).await.is_ok_and(|c| c.len() == 1)
            && reader.connections_by_agent_id(kas_proto::AgentId(2)).await.is_ok_and(|c| c.len() == 1),
        "the records written again on the new primary"
    );
}
