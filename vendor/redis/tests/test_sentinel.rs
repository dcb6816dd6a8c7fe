#![cfg(feature = "sentinel")]
mod support;

use std::collections::HashMap;
use std::time::Duration;

use crate::support::*;
use assert_matches::assert_matches;
use redis::sentinel::SentinelClientBuilder;
use redis::{
    Client, Connection, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, Role,
    sentinel::{Sentinel, SentinelClient, SentinelNodeConnectionInfo},
};
use redis_test::server::use_protocol;

fn log_connection_error(
    context: &TestSentinelContext,
    sentinel: &ConnectionInfo,
    error: &RedisError,
) {
    println!("Connection error: {error:?}");
    if let ConnectionAddr::Tcp(_, port) = sentinel.addr() {
        context.cluster.log_redis_state_via_cli(*port);
    }
}

fn parse_replication_info(value: &str) -> HashMap<&str, &str> {
    let info_map: std::collections::HashMap<&str, &str> = value
        .split("\r\n")
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| line.split_once(':'))
        .collect();
    info_map
}

fn assert_is_master_role(replication_info: String) {
    let info_map = parse_replication_info(&replication_info);
    assert_eq!(info_map.get("role"), Some(&"master"));
}

fn assert_replica_role_and_master_addr(replication_info: String, expected_master: &ConnectionInfo) {
    let info_map = parse_replication_info(&replication_info);

    assert_eq!(info_map.get("role"), Some(&"slave"));

    let (master_host, master_port) = match expected_master.addr() {
        ConnectionAddr::Tcp(host, port)
        | ConnectionAddr::TcpTls {
            host,
            port,
            insecure: _,
            tls_params: _,
        } => (host, port),
        ConnectionAddr::Unix(..) => panic!("Unexpected master connection type"),
        _ => panic!("Unknown address type"),
    };

    assert_eq!(info_map.get("master_host"), Some(&master_host.as_str()));
    assert_eq!(
        info_map.get("master_port"),
        Some(&master_port.to_string().as_str())
    );
}

fn assert_is_connection_to_master(conn: &mut Connection) {
    let info: String = redis::cmd("INFO").arg("REPLICATION").query(conn).unwrap();
    assert_is_master_role(info);
}

fn assert_connection_is_replica_of_correct_master(conn: &mut Connection, master_client: &Client) {
    let info: String = redis::cmd("INFO").arg("REPLICATION").query(conn).unwrap();
    assert_replica_role_and_master_addr(info, master_client.get_connection_info());
}

/// Get replica clients from the sentinel in a rotating fashion, asserting that they are
/// indeed replicas of the given master, and returning a list of their addresses.
fn connect_to_all_replicas(
    sentinel: &mut Sentinel,
    master_name: &str,
    master_client: &Client,
    node_conn_info: &SentinelNodeConnectionInfo,
    number_of_replicas: u16,
) -> Vec<ConnectionAddr> {
    let mut replica_conn_info = vec![];

    for _ in 0..number_of_replicas {
        let replica_client = sentinel
            .replica_rotate_for(master_name, Some(node_conn_info))
            .unwrap();
        let mut replica_con = replica_client.get_connection().unwrap();

        assert!(!replica_conn_info.contains(replica_client.get_connection_info().addr()));
        replica_conn_info.push(replica_client.get_connection_info().addr().clone());

        assert_connection_is_replica_of_correct_master(&mut replica_con, master_client);
    }

    replica_conn_info
}

fn assert_connect_to_known_replicas(
    sentinel: &mut Sentinel,
    replica_conn_info: &[ConnectionAddr],
    master_name: &str,
    master_client: &Client,
    node_conn_info: &SentinelNodeConnectionInfo,
    number_of_connections: u32,
) {
    for _ in 0..number_of_connections {
        let replica_client = sentinel
            .replica_rotate_for(master_name, Some(node_conn_info))
            .unwrap();
        let mut replica_con = replica_client.get_connection().unwrap();

        assert!(replica_conn_info.contains(replica_client.get_connection_info().addr()));

        assert_connection_is_replica_of_correct_master(&mut replica_con, master_client);
    }
}

#[test]
fn test_get_replica_clients_success() {
    let number_of_replicas = 3;
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, number_of_replicas, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    let sentinel = context.sentinel_mut();
    let replicas = sentinel
        .get_replica_clients(master_name, Some(&node_conn_info))
        .unwrap();

    assert_eq!(replicas.len(), number_of_replicas as usize);
}

#[test]
fn test_get_replica_clients_invalid_master_name() {
    let mut context = TestSentinelContext::new(2, 2, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    let sentinel = context.sentinel_mut();

    let err = sentinel
        .get_replica_clients("invalid_master_name", Some(&node_conn_info))
        .unwrap_err();
    // sometimes we get unexplained connection refused errors.
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Server(redis::ServerErrorKind::ResponseError) | ErrorKind::Io
        ),
        "{err}"
    );
}

#[test]
fn test_get_replica_clients_report_correct_master() {
    let number_of_replicas = 3;
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, number_of_replicas, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    let sentinel = context.sentinel_mut();
    let master_client = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();

    let replicas = sentinel
        .get_replica_clients(master_name, Some(&node_conn_info))
        .unwrap();

    for replica_client in replicas {
        let mut con = replica_client.get_connection().unwrap();
        assert_connection_is_replica_of_correct_master(&mut con, &master_client);
    }
}

#[test]
fn test_get_replica_clients_with_one_replica_down() {
    let number_of_replicas = 3;
    let master_name = "master0";

    let mut context = TestSentinelContext::new(2, number_of_replicas, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    let sentinel_conn_info = context.sentinels_connection_info()[0].clone();
    let mut conn = Client::open(sentinel_conn_info.clone())
        .inspect_err(|e| log_connection_error(&context, &sentinel_conn_info, e))
        .unwrap()
        .get_connection()
        .inspect_err(|e| log_connection_error(&context, &sentinel_conn_info, e))
        .unwrap();

    redis::cmd("SENTINEL")
        .arg("set")
        .arg(master_name)
        .arg("down-after-milliseconds")
        .arg("500")
        .query::<()>(&mut conn)
        .unwrap();

    context.cluster.servers[1].stop();

    std::thread::sleep(std::time::Duration::from_millis(800));

    let sentinel = context.sentinel_mut();
    let replicas = sentinel
        .get_replica_clients(master_name, Some(&node_conn_info))
        .expect("Failed to get replicas");

    assert_eq!(
        replicas.len(),
        (number_of_replicas - 1) as usize,
        "Unexpected num of replicas total"
    );
}

#[test]
fn test_sentinel_role_no_permission() {
    let number_of_replicas = 3;
    let master_name = "master1";
    let mut cluster = TestSentinelContext::new(2, number_of_replicas, 3);
    let node_conn_info = cluster.sentinel_node_connection_info();
    let sentinel = cluster.sentinel_mut();

    let master_client = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();
    let mut master_con = master_client.get_connection().unwrap();

    let user: String = redis::cmd("ACL")
        .arg("whoami")
        .query(&mut master_con)
        .unwrap();
    //Remove ROLE permission for the given user on master
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("-role")
        .query(&mut master_con)
        .unwrap();

    //Remove ROLE permission for the given user on replicas
    for _ in 0..number_of_replicas {
        let replica_client = sentinel
            .replica_rotate_for(master_name, Some(&node_conn_info))
            .unwrap();
        let mut replica_con = replica_client.get_connection().unwrap();
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&user)
            .arg("-role")
            .query(&mut replica_con)
            .unwrap();
    }

    let master_client = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();
    let mut master_con = master_client.get_connection().unwrap();

    assert_is_connection_to_master(&mut master_con);
}

#[test]
fn test_sentinel_no_role_or_info_permission() {
    let number_of_replicas = 3;
    let master_name = "master1";
    let mut cluster = TestSentinelContext::new(2, number_of_replicas, 3);
    let node_conn_info = cluster.sentinel_node_connection_info();
    let sentinel = cluster.sentinel_mut();

    let master_client = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();
    let mut master_con = master_client.get_connection().unwrap();

    let user: String = redis::cmd("ACL")
        .arg("whoami")
        .query(&mut master_con)
        .unwrap();
    //Remove both commands used to detect master
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("-role")
        .arg("-info")
        .query(&mut master_con)
        .unwrap();

    let err = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap_err();
    assert_eq!(err.code(), Some("NOPERM"));
    // Ensure we get the error returned by role command
    assert!(err.detail().unwrap().contains("role"));
}

#[test]
fn test_sentinel_connect_to_random_replica() {
    let number_of_replicas = 3;
    let master_name = "master1";
    let mut cluster = TestSentinelContext::new(2, number_of_replicas, 3);
    let node_conn_info = cluster.sentinel_node_connection_info();
    let sentinel = cluster.sentinel_mut();

    let master_client = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();
    let mut master_con = master_client.get_connection().unwrap();

    assert_is_connection_to_master(&mut master_con);

    let mut replica_con = sentinel
        .replica_for(master_name, Some(&node_conn_info))
        .unwrap()
        .get_connection()
        .unwrap();

    assert_connection_is_replica_of_correct_master(&mut replica_con, &master_client);
}

#[test]
fn test_sentinel_connect_to_multiple_replicas() {
    let number_of_replicas = 3;
    let master_name = "master1";
    let mut cluster = TestSentinelContext::new(2, number_of_replicas, 3);
    let node_conn_info = cluster.sentinel_node_connection_info();
    let sentinel = cluster.sentinel_mut();

    let master_client = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();
    let mut master_con = master_client.get_connection().unwrap();

    assert_is_connection_to_master(&mut master_con);

    let replica_conn_info = connect_to_all_replicas(
        sentinel,
        master_name,
        &master_client,
        &node_conn_info,
        number_of_replicas,
    );

    assert_connect_to_known_replicas(
        sentinel,
        &replica_conn_info,
        master_name,
        &master_client,
        &node_conn_info,
        10,
    );
}

fn connect_to_sentinel(context: &TestSentinelContext, index: usize) -> Connection {
    let sentinel = context.sentinels_connection_info()[index].clone();
    Client::open(sentinel).unwrap().get_connection().unwrap()
}

/// Sends `SENTINEL <args>` to the sentinel at `index` and asserts that it replied OK.
fn sentinel_command_ok(context: &TestSentinelContext, index: usize, args: &[&str]) {
    let reply: String = redis::cmd("SENTINEL")
        .arg(args)
        .query(&mut connect_to_sentinel(context, index))
        .unwrap();
    assert_eq!(reply, "OK");
}

/// Makes the sentinel at `index` stop monitoring `master_name`, so it has no master for the
/// name: the "null reply" of the Sentinel client specification.
fn forget_master(context: &TestSentinelContext, index: usize, master_name: &str) {
    sentinel_command_ok(context, index, &["REMOVE", master_name]);
}

/// Makes the sentinel at `index` monitor `master_name` at an address nothing listens on,
/// and waits until it flags that master `s_down`. The other sentinels keep the real master.
fn flag_master_down(context: &TestSentinelContext, index: usize, master_name: &str) {
    // A sentinel whose timer runs late (a loaded test machine) enters TILT mode and flags
    // nothing down for 30 s. Leave TILT and do not re-enter it. `SENTINEL DEBUG` exists
    // since Redis 7.0; an older server rejects it as an unknown subcommand and keeps its
    // defaults. Any other reply is a failure.
    let reply: redis::RedisResult<String> = redis::cmd("SENTINEL")
        .arg(&["DEBUG", "tilt-period", "1", "tilt-trigger", "60000"])
        .query(&mut connect_to_sentinel(context, index));
    match reply {
        Ok(reply) => assert_eq!(reply, "OK"),
        Err(err) => assert!(
            err.code() == Some("ERR")
                && err
                    .detail()
                    .is_some_and(|detail| detail.starts_with("Unknown subcommand")),
            "unexpected reply to SENTINEL DEBUG: {err}"
        ),
    }
    forget_master(context, index, master_name);
    let dead_port = redis_test::utils::get_random_available_port().to_string();
    sentinel_command_ok(
        context,
        index,
        &["MONITOR", master_name, "127.0.0.1", &dead_port, "1"],
    );
    sentinel_command_ok(
        context,
        index,
        &["SET", master_name, "down-after-milliseconds", "100"],
    );
    let mut con = connect_to_sentinel(context, index);
    for _ in 0..100 {
        let master: HashMap<String, String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(master_name)
            .query(&mut con)
            .unwrap();
        if master["flags"].contains("s_down") {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("sentinel {index} never flagged {master_name} as s_down");
}

/// Asks the sentinel at `index` directly for the address of `master_name`, so a test can
/// capture the real master before it breaks anything and compare the lookup against it.
fn master_addr_from_sentinel(
    context: &TestSentinelContext,
    index: usize,
    master_name: &str,
) -> (String, u16) {
    redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(master_name)
        .query(&mut connect_to_sentinel(context, index))
        .unwrap()
}

fn host_and_port_of(connection_info: &ConnectionInfo) -> (String, u16) {
    match connection_info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            (host.clone(), *port)
        }
        ConnectionAddr::Unix(..) => panic!("Unexpected master connection type"),
        _ => panic!("Unknown address type"),
    }
}

/// Asserts that `master_client` points at `expected` and that the server there is a master.
/// Checking the address matters: the context has two masters, and a role check alone would
/// also pass for the wrong one.
fn assert_is_client_of_master(master_client: &Client, expected: &(String, u16)) {
    assert_eq!(
        &host_and_port_of(master_client.get_connection_info()),
        expected
    );
    assert_is_connection_to_master(&mut master_client.get_connection().unwrap());
}

/// Denies `ROLE` and `INFO` on the master, so a client reaches it but cannot verify its role.
/// The master is found by asking a sentinel directly, not through the lookup under test.
fn deny_role_check_on_master(context: &TestSentinelContext, master_name: &str) {
    let (_, master_port) = master_addr_from_sentinel(context, 0, master_name);
    let master = context
        .cluster
        .servers
        .iter()
        .find(|server| server.host_and_port().map(|(_, port)| port) == Some(master_port))
        .unwrap();
    let mut master_con = Client::open(master.connection_info())
        .unwrap()
        .get_connection()
        .unwrap();
    let user: String = redis::cmd("ACL")
        .arg("whoami")
        .query(&mut master_con)
        .unwrap();
    let reply: String = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("-role")
        .arg("-info")
        .query(&mut master_con)
        .unwrap();
    assert_eq!(reply, "OK");
}

/// Stops the server the sentinels name as `master_name`'s master. No sentinel flags it down
/// for a while: the harness keeps Sentinel's default `down-after-milliseconds` (30 s).
fn stop_master(context: &mut TestSentinelContext, master_name: &str) {
    let (_, master_port) = master_addr_from_sentinel(context, 0, master_name);
    context
        .cluster
        .servers
        .iter_mut()
        .find(|server| server.host_and_port().map(|(_, port)| port) == Some(master_port))
        .unwrap()
        .stop();
}

#[test]
fn test_sentinel_master_for_skips_a_sentinel_that_does_not_know_the_master() {
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, 2, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    let expected = master_addr_from_sentinel(&context, 1, master_name);
    forget_master(&context, 0, master_name);

    let master_client = context
        .sentinel_mut()
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();
    assert_is_client_of_master(&master_client, &expected);
}

#[test]
fn test_sentinel_master_for_skips_a_sentinel_that_flags_the_master_down() {
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, 2, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    let expected = master_addr_from_sentinel(&context, 1, master_name);
    flag_master_down(&context, 0, master_name);

    let master_client = context
        .sentinel_mut()
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();
    assert_is_client_of_master(&master_client, &expected);
}

#[test]
fn test_sentinel_master_for_skips_an_unreachable_sentinel() {
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, 2, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    let expected = master_addr_from_sentinel(&context, 1, master_name);
    context.cluster.sentinel_servers[0].stop();

    let master_client = context
        .sentinel_mut()
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();
    assert_is_client_of_master(&master_client, &expected);
}

/// The first sentinel does not know the master and the middle one flags it down, so only
/// the last one yields it.
#[test]
fn test_sentinel_master_for_asks_every_sentinel_in_turn() {
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, 2, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    let expected = master_addr_from_sentinel(&context, 2, master_name);
    forget_master(&context, 0, master_name);
    flag_master_down(&context, 1, master_name);

    let master_client = context
        .sentinel_mut()
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();
    assert_is_client_of_master(&master_client, &expected);
}

#[test]
fn test_sentinel_master_for_reports_not_found_when_no_sentinel_knows_the_master() {
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, 2, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    for index in 0..context.sentinels_connection_info().len() {
        forget_master(&context, index, master_name);
    }

    let err = context
        .sentinel_mut()
        .master_for(master_name, Some(&node_conn_info))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MasterNameNotFoundBySentinel);
}

/// The master refuses the role check, and the last sentinel asked does not know the master.
/// The master's error must reach the caller, not that sentinel's "not found".
#[test]
fn test_sentinel_master_for_reports_the_master_error_over_not_found() {
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, 2, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    let last = context.sentinels_connection_info().len() - 1;
    forget_master(&context, last, master_name);
    deny_role_check_on_master(&context, master_name);

    let err = context
        .sentinel_mut()
        .master_for(master_name, Some(&node_conn_info))
        .unwrap_err();
    assert_eq!(err.code(), Some("NOPERM"));
}

/// Every sentinel still names the master, but it is stopped: the lookup must fail with the
/// refused connection from dialling it rather than return a client for it.
#[test]
fn test_sentinel_master_for_reports_an_error_when_the_master_is_down() {
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, 2, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    stop_master(&mut context, master_name);

    let err = context
        .sentinel_mut()
        .master_for(master_name, Some(&node_conn_info))
        .unwrap_err();
    assert!(err.is_connection_refusal(), "{err}");
}

#[test]
fn test_sentinel_server_down() {
    let number_of_replicas = 3;
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, number_of_replicas, 3);
    let node_conn_info = context.sentinel_node_connection_info();
    let sentinel = context.sentinel_mut();

    let master_client = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();
    let mut master_con = master_client.get_connection().unwrap();

    assert_is_connection_to_master(&mut master_con);

    context.cluster.sentinel_servers[0].stop();
    std::thread::sleep(Duration::from_millis(25));

    let sentinel = context.sentinel_mut();

    let replica_conn_info = connect_to_all_replicas(
        sentinel,
        master_name,
        &master_client,
        &node_conn_info,
        number_of_replicas,
    );

    assert_connect_to_known_replicas(
        sentinel,
        &replica_conn_info,
        master_name,
        &master_client,
        &node_conn_info,
        10,
    );
}

#[test]
fn test_sentinel_redis_client() {
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, 3, 3);
    for sentinel in context.sentinels_connection_info() {
        let mut conn = Client::open(sentinel.clone())
            .inspect_err(|e| log_connection_error(&context, sentinel, e))
            .unwrap()
            .get_connection()
            .inspect_err(|e| log_connection_error(&context, sentinel, e))
            .unwrap();
        let role: Role = redis::cmd("ROLE").query(&mut conn).unwrap();
        assert_matches!(role, Role::Sentinel { .. });
    }

    let mut master_client = SentinelClient::build(
        context.sentinels_connection_info().clone(),
        String::from(master_name),
        Some(context.sentinel_node_connection_info()),
        redis::sentinel::SentinelServerType::Master,
    )
    .unwrap();

    let mut replica_client = SentinelClient::build(
        context.sentinels_connection_info().clone(),
        String::from(master_name),
        Some(context.sentinel_node_connection_info()),
        redis::sentinel::SentinelServerType::Replica,
    )
    .unwrap();

    let mut master_con = master_client.get_connection().unwrap();
    let role: Role = redis::cmd("ROLE").query(&mut master_con).unwrap();
    assert_matches!(role, Role::Primary { .. });

    assert_is_connection_to_master(&mut master_con);

    let node_conn_info = context.sentinel_node_connection_info();
    let sentinel = context.sentinel_mut();
    let master_client = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();

    for _ in 0..20 {
        let mut replica_con = replica_client.get_connection().unwrap();
        let role = redis::cmd("ROLE").query(&mut replica_con).unwrap();
        assert_matches!(role, Role::Replica { .. });

        assert_connection_is_replica_of_correct_master(&mut replica_con, &master_client);
    }
}

#[test]
fn test_sentinel_client() {
    let master_name = "master1";
    let context = TestSentinelContext::new(2, 3, 3);
    let mut master_client = SentinelClient::build(
        context.sentinels_connection_info().clone(),
        String::from(master_name),
        Some(context.sentinel_node_connection_info()),
        redis::sentinel::SentinelServerType::Master,
    )
    .unwrap();

    let mut replica_client = SentinelClient::build(
        context.sentinels_connection_info().clone(),
        String::from(master_name),
        Some(context.sentinel_node_connection_info()),
        redis::sentinel::SentinelServerType::Replica,
    )
    .unwrap();

    let sentinel_client_1 = master_client.get_sentinel_client().unwrap();
    let sentinel_client_2 = replica_client.get_sentinel_client().unwrap();
    let first_configured_sentinel = context.sentinels_connection_info.first().unwrap();

    assert_eq!(
        sentinel_client_1.get_connection_info().addr(),
        sentinel_client_2.get_connection_info().addr()
    );

    assert_eq!(
        first_configured_sentinel.addr(),
        sentinel_client_2.get_connection_info().addr()
    );
}

#[test]
fn test_sentinel_non_sentinel_address_error() {
    let master_name = "master1";
    let context = TestSentinelContext::new(2, 3, 3);
    // Build a Sentinel using regular Redis node addresses instead of sentinel addresses
    let mut sentinel = Sentinel::build(
        context
            .cluster
            .servers
            .iter()
            .map(|s| s.connection_info())
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let node_conn_info = context.sentinel_node_connection_info();
    let err = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidClientConfig);
    assert!(
        err.to_string()
            .contains("Address does not point to a sentinel node"),
        "{err}"
    );
}

#[test]
fn test_sentinel_client_io_error() {
    let master_name = "master1";

    let mut master_client = SentinelClient::build(
        vec!["redis://test:6379"],
        String::from(master_name),
        None,
        redis::sentinel::SentinelServerType::Master,
    )
    .unwrap();

    let sentinel_client = master_client.get_sentinel_client();
    let err = sentinel_client.expect_err("Expected an error");
    assert!(err.is_io_error());
}

#[test]
fn test_sentinel_client_not_sentinel_error() {
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, 3, 3);
    // Change the context with incorrect sentinel servers
    context.sentinels_connection_info = context
        .cluster
        .servers
        .iter()
        .map(|redis_server| redis_server.connection_info())
        .collect::<Vec<_>>();
    let mut master_client = SentinelClient::build(
        context.sentinels_connection_info().clone(),
        String::from(master_name),
        None,
        redis::sentinel::SentinelServerType::Master,
    )
    .unwrap();

    let sentinel_client = master_client.get_sentinel_client();
    let err = sentinel_client.expect_err("Expected an error");
    assert_eq!(
        err,
        RedisError::from((
            ErrorKind::InvalidClientConfig,
            "Couldn't open connection to a sentinel node."
        ))
    );
}

#[test]
fn test_sentinel_client_builder() {
    let master_name = "master1";
    let mut context = TestSentinelContext::new(2, 3, 3);
    for sentinel in context.sentinels_connection_info() {
        let mut conn = Client::open(sentinel.clone())
            .inspect_err(|e| log_connection_error(&context, sentinel, e))
            .unwrap()
            .get_connection()
            .inspect_err(|e| log_connection_error(&context, sentinel, e))
            .unwrap();
        let role: Role = redis::cmd("ROLE").query(&mut conn).unwrap();
        assert_matches!(role, Role::Sentinel { .. });
    }

    let mut master_client_builder = SentinelClientBuilder::new(
        context
            .sentinels_connection_info
            .iter()
            .map(|sentinel| sentinel.addr().clone()),
        String::from(master_name),
        redis::sentinel::SentinelServerType::Master,
    )
    .unwrap();

    let mut replica_client_builder = SentinelClientBuilder::new(
        context
            .sentinels_connection_info
            .iter()
            .map(|sentinel| sentinel.addr().clone()),
        String::from(master_name),
        redis::sentinel::SentinelServerType::Replica,
    )
    .unwrap();

    master_client_builder = master_client_builder.set_client_to_sentinel_protocol(use_protocol());

    if let Some(tls_mode) = context.tls_mode() {
        master_client_builder = master_client_builder.set_client_to_redis_tls_mode(tls_mode);
        replica_client_builder = replica_client_builder.set_client_to_redis_tls_mode(tls_mode);
    }

    let mut master_client = master_client_builder.build().unwrap();
    let mut replica_client = replica_client_builder.build().unwrap();

    let mut master_con = master_client.get_connection().unwrap();
    let role: Role = redis::cmd("ROLE").query(&mut master_con).unwrap();
    assert_matches!(role, Role::Primary { .. });

    assert_is_connection_to_master(&mut master_con);

    let node_conn_info = context.sentinel_node_connection_info();
    let sentinel = context.sentinel_mut();
    let master_client = sentinel
        .master_for(master_name, Some(&node_conn_info))
        .unwrap();

    for _ in 0..20 {
        let mut replica_con = replica_client.get_connection().unwrap();
        let role = redis::cmd("ROLE").query(&mut replica_con).unwrap();
        assert_matches!(role, Role::Replica { .. });

        assert_connection_is_replica_of_correct_master(&mut replica_con, &master_client);
    }
}

#[cfg(feature = "aio")]
pub mod async_tests {
    use super::*;
    use redis::{AsyncConnectionConfig, aio::MultiplexedConnection};
    use test_macros::async_test;

    use crate::{assert_is_master_role, assert_replica_role_and_master_addr};

    async fn async_assert_is_connection_to_master(conn: &mut MultiplexedConnection) {
        let info: String = redis::cmd("INFO")
            .arg("REPLICATION")
            .query_async(conn)
            .await
            .unwrap();

        assert_is_master_role(info);
    }

    async fn async_assert_connection_is_replica_of_correct_master(
        conn: &mut MultiplexedConnection,
        master_client: &Client,
    ) {
        let info: String = redis::cmd("INFO")
            .arg("REPLICATION")
            .query_async(conn)
            .await
            .unwrap();

        assert_replica_role_and_master_addr(info, master_client.get_connection_info());
    }

    /// Async version of connect_to_all_replicas
    async fn async_connect_to_all_replicas(
        sentinel: &mut Sentinel,
        master_name: &str,
        master_client: &Client,
        node_conn_info: &SentinelNodeConnectionInfo,
        number_of_replicas: u16,
    ) -> Vec<ConnectionAddr> {
        let mut replica_conn_info = vec![];

        for _ in 0..number_of_replicas {
            let replica_client = sentinel
                .async_replica_rotate_for(master_name, Some(node_conn_info))
                .await
                .unwrap();
            let mut replica_con = replica_client
                .get_multiplexed_async_connection()
                .await
                .unwrap();

            assert!(
                !replica_conn_info.contains(replica_client.get_connection_info().addr()),
                "pushing {:?} into {:?}",
                replica_client.get_connection_info().addr(),
                replica_conn_info
            );
            replica_conn_info.push(replica_client.get_connection_info().addr().clone());

            async_assert_connection_is_replica_of_correct_master(&mut replica_con, master_client)
                .await;
        }

        replica_conn_info
    }

    async fn async_assert_connect_to_known_replicas(
        sentinel: &mut Sentinel,
        replica_conn_info: &[ConnectionAddr],
        master_name: &str,
        master_client: &Client,
        node_conn_info: &SentinelNodeConnectionInfo,
        number_of_connections: u32,
    ) {
        for _ in 0..number_of_connections {
            let replica_client = sentinel
                .async_replica_rotate_for(master_name, Some(node_conn_info))
                .await
                .unwrap();
            let mut replica_con = replica_client
                .get_multiplexed_async_connection()
                .await
                .unwrap();

            assert!(replica_conn_info.contains(replica_client.get_connection_info().addr()));

            async_assert_connection_is_replica_of_correct_master(&mut replica_con, master_client)
                .await;
        }
    }

    #[async_test]
    async fn test_sentinel_connect_to_random_replica_async() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 3, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        let sentinel = context.sentinel_mut();

        let master_client = sentinel
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();
        let mut master_con = master_client
            .get_multiplexed_async_connection()
            .await
            .unwrap();

        let mut replica_con = sentinel
            .async_replica_for(master_name, Some(&node_conn_info))
            .await
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();

        async_assert_is_connection_to_master(&mut master_con).await;
        async_assert_connection_is_replica_of_correct_master(&mut replica_con, &master_client)
            .await;
    }

    #[async_test]
    async fn test_sentinel_connect_to_multiple_replicas_async() {
        let number_of_replicas = 3;
        let master_name = "master1";
        let mut cluster = TestSentinelContext::new(2, number_of_replicas, 3);
        let node_conn_info = cluster.sentinel_node_connection_info();
        let sentinel = cluster.sentinel_mut();

        let master_client = sentinel
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();
        let mut master_con = master_client
            .get_multiplexed_async_connection()
            .await
            .unwrap();

        async_assert_is_connection_to_master(&mut master_con).await;

        let replica_conn_info = async_connect_to_all_replicas(
            sentinel,
            master_name,
            &master_client,
            &node_conn_info,
            number_of_replicas,
        )
        .await;

        async_assert_connect_to_known_replicas(
            sentinel,
            &replica_conn_info,
            master_name,
            &master_client,
            &node_conn_info,
            10,
        )
        .await;
    }

    async fn async_assert_is_client_of_master(master_client: &Client, expected: &(String, u16)) {
        assert_eq!(
            &host_and_port_of(master_client.get_connection_info()),
            expected
        );
        let mut master_con = master_client
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        async_assert_is_connection_to_master(&mut master_con).await;
    }

    #[async_test]
    async fn test_sentinel_master_for_skips_a_sentinel_that_does_not_know_the_master_async() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 2, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        let expected = master_addr_from_sentinel(&context, 1, master_name);
        forget_master(&context, 0, master_name);

        let master_client = context
            .sentinel_mut()
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();
        async_assert_is_client_of_master(&master_client, &expected).await;
    }

    #[async_test]
    async fn test_sentinel_master_for_skips_a_sentinel_that_flags_the_master_down_async() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 2, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        let expected = master_addr_from_sentinel(&context, 1, master_name);
        flag_master_down(&context, 0, master_name);

        let master_client = context
            .sentinel_mut()
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();
        async_assert_is_client_of_master(&master_client, &expected).await;
    }

    #[async_test]
    async fn test_sentinel_master_for_skips_an_unreachable_sentinel_async() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 2, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        let expected = master_addr_from_sentinel(&context, 1, master_name);
        context.cluster.sentinel_servers[0].stop();

        let master_client = context
            .sentinel_mut()
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();
        async_assert_is_client_of_master(&master_client, &expected).await;
    }

    /// See the sync variant: only the last sentinel yields the master.
    #[async_test]
    async fn test_sentinel_master_for_asks_every_sentinel_in_turn_async() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 2, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        let expected = master_addr_from_sentinel(&context, 2, master_name);
        forget_master(&context, 0, master_name);
        flag_master_down(&context, 1, master_name);

        let master_client = context
            .sentinel_mut()
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();
        async_assert_is_client_of_master(&master_client, &expected).await;
    }

    #[async_test]
    async fn test_sentinel_master_for_reports_not_found_when_no_sentinel_knows_the_master_async() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 2, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        for index in 0..context.sentinels_connection_info().len() {
            forget_master(&context, index, master_name);
        }

        let err = context
            .sentinel_mut()
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MasterNameNotFoundBySentinel);
    }

    #[async_test]
    async fn test_sentinel_master_for_reports_the_master_error_over_not_found_async() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 2, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        let last = context.sentinels_connection_info().len() - 1;
        forget_master(&context, last, master_name);
        deny_role_check_on_master(&context, master_name);

        let err = context
            .sentinel_mut()
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("NOPERM"));
    }

    #[async_test]
    async fn test_sentinel_master_for_reports_an_error_when_the_master_is_down_async() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 2, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        stop_master(&mut context, master_name);

        let err = context
            .sentinel_mut()
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap_err();
        assert!(err.is_connection_refusal(), "{err}");
    }

    #[async_test]
    async fn test_sentinel_server_down_async() {
        let number_of_replicas = 3;
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, number_of_replicas, 3);
        let node_conn_info = context.sentinel_node_connection_info();

        let sentinel = context.sentinel_mut();

        let master_client = sentinel
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();
        let mut master_con = master_client
            .get_multiplexed_async_connection()
            .await
            .unwrap();

        async_assert_is_connection_to_master(&mut master_con).await;

        context.cluster.sentinel_servers[0].stop();
        std::thread::sleep(Duration::from_millis(25));

        let sentinel = context.sentinel_mut();

        let replica_conn_info = async_connect_to_all_replicas(
            sentinel,
            master_name,
            &master_client,
            &node_conn_info,
            number_of_replicas,
        )
        .await;

        async_assert_connect_to_known_replicas(
            sentinel,
            &replica_conn_info,
            master_name,
            &master_client,
            &node_conn_info,
            10,
        )
        .await;
    }

    #[async_test]
    async fn test_sentinel_redis_client_async() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 3, 3);
        let mut master_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap();

        let mut replica_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Replica,
        )
        .unwrap();

        let mut master_con = master_client.get_async_connection().await.unwrap();

        async_assert_is_connection_to_master(&mut master_con).await;

        let node_conn_info = context.sentinel_node_connection_info();
        let sentinel = context.sentinel_mut();
        let master_client = sentinel
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();

        // Read commands to the replica node
        for _ in 0..20 {
            let mut replica_con = replica_client.get_async_connection().await.unwrap();

            async_assert_connection_is_replica_of_correct_master(&mut replica_con, &master_client)
                .await;
        }
    }

    #[async_test]
    async fn test_sentinel_client_async() {
        let master_name = "master1";
        let context = TestSentinelContext::new(2, 3, 3);
        let mut master_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap();

        let mut replica_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Replica,
        )
        .unwrap();

        let sentinel_client_1 = master_client.async_get_sentinel_client().await.unwrap();
        let sentinel_client_2 = replica_client.async_get_sentinel_client().await.unwrap();
        let first_configured_sentinel = context.sentinels_connection_info.first().unwrap();

        assert_eq!(
            sentinel_client_1.get_connection_info().addr(),
            sentinel_client_2.get_connection_info().addr()
        );

        assert_eq!(
            first_configured_sentinel.addr(),
            sentinel_client_2.get_connection_info().addr()
        );
    }

    #[async_test]
    async fn test_sentinel_non_sentinel_address_error_async() {
        let master_name = "master1";
        let context = TestSentinelContext::new(2, 3, 3);
        // Build a Sentinel using regular Redis node addresses instead of sentinel addresses
        let mut sentinel = Sentinel::build(
            context
                .cluster
                .servers
                .iter()
                .map(|s| s.connection_info())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let node_conn_info = context.sentinel_node_connection_info();
        let err = sentinel
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidClientConfig);
        assert!(
            err.to_string()
                .contains("Address does not point to a sentinel node"),
            "{err}"
        );
    }

    #[async_test]
    async fn test_sentinel_client_async_not_sentinel_error() {
        let master_name = "master1";

        let mut context = TestSentinelContext::new(2, 3, 3);
        // Change the context with incorrect sentinel servers
        context.sentinels_connection_info = context
            .cluster
            .servers
            .iter()
            .map(|redis_server| redis_server.connection_info())
            .collect::<Vec<_>>();
        let mut master_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap();

        let sentinel_client = master_client.async_get_sentinel_client().await;
        let err = sentinel_client.expect_err("Expected an error");
        assert_eq!(
            err,
            RedisError::from((
                ErrorKind::InvalidClientConfig,
                "Couldn't open connection to a sentinel node."
            ))
        );
    }

    #[async_test]
    async fn test_sentinel_client_async_io_error() {
        let master_name = "master1";

        let mut master_client = SentinelClient::build(
            vec!["redis://test:6379"],
            String::from(master_name),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap();

        let sentinel_client = master_client.async_get_sentinel_client().await;
        let err = sentinel_client.expect_err("Expected an error");
        assert!(err.is_io_error());
    }

    #[async_test]
    async fn test_sentinel_client_async_with_connection_timeout() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 3, 3);
        let mut master_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap();

        let mut replica_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Replica,
        )
        .unwrap();

        let connection_options =
            AsyncConnectionConfig::new().set_connection_timeout(Some(Duration::from_secs(1)));

        let mut master_con = master_client
            .get_async_connection_with_config(&connection_options)
            .await
            .unwrap();

        async_assert_is_connection_to_master(&mut master_con).await;

        let node_conn_info = context.sentinel_node_connection_info();
        let sentinel = context.sentinel_mut();
        let master_client = sentinel
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();

        // Read commands to the replica node
        for _ in 0..20 {
            let mut replica_con = replica_client
                .get_async_connection_with_config(&connection_options)
                .await
                .unwrap();

            async_assert_connection_is_replica_of_correct_master(&mut replica_con, &master_client)
                .await;
        }
    }

    #[async_test]
    async fn test_sentinel_client_async_with_response_timeout() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 3, 3);
        let mut master_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap();

        let mut replica_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Replica,
        )
        .unwrap();

        let connection_options = AsyncConnectionConfig::new();

        let mut master_con = master_client
            .get_async_connection_with_config(&connection_options)
            .await
            .unwrap();

        async_assert_is_connection_to_master(&mut master_con).await;

        let node_conn_info = context.sentinel_node_connection_info();
        let sentinel = context.sentinel_mut();
        let master_client = sentinel
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();

        // Read commands to the replica node
        for _ in 0..20 {
            let mut replica_con = replica_client
                .get_async_connection_with_config(&connection_options)
                .await
                .unwrap();

            async_assert_connection_is_replica_of_correct_master(&mut replica_con, &master_client)
                .await;
        }
    }

    #[async_test]
    async fn test_sentinel_client_async_with_timeouts() {
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, 3, 3);
        let mut master_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap();

        let mut replica_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Replica,
        )
        .unwrap();

        let connection_options = AsyncConnectionConfig::new();

        let mut master_con = master_client
            .get_async_connection_with_config(&connection_options)
            .await
            .unwrap();

        async_assert_is_connection_to_master(&mut master_con).await;

        let node_conn_info = context.sentinel_node_connection_info();
        let sentinel = context.sentinel_mut();
        let master_client = sentinel
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();

        // Read commands to the replica node
        for _ in 0..20 {
            let mut replica_con = replica_client
                .get_async_connection_with_config(&connection_options)
                .await
                .unwrap();

            async_assert_connection_is_replica_of_correct_master(&mut replica_con, &master_client)
                .await;
        }
    }

    #[async_test]
    async fn test_get_replica_clients_success_async() {
        let number_of_replicas = 3;
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, number_of_replicas, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        let sentinel = context.sentinel_mut();

        let replicas = sentinel
            .async_get_replica_clients(master_name, Some(&node_conn_info))
            .await
            .unwrap();
        assert_eq!(replicas.len(), number_of_replicas as usize);
    }

    #[async_test]
    async fn test_get_replica_clients_invalid_master_name_async() {
        let mut context = TestSentinelContext::new(2, 2, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        let sentinel = context.sentinel_mut();

        let err = sentinel
            .async_get_replica_clients("invalid_master_name", Some(&node_conn_info))
            .await
            .unwrap_err();
        // sometimes we get unexplained connection refused errors.
        assert!(
            matches!(
                err.kind(),
                ErrorKind::Server(redis::ServerErrorKind::ResponseError) | ErrorKind::Io
            ),
            "{err}"
        );
    }

    #[async_test]
    async fn test_get_replica_clients_report_correct_master_async() {
        let number_of_replicas = 3;
        let master_name = "master1";
        let mut context = TestSentinelContext::new(2, number_of_replicas, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        let sentinel = context.sentinel_mut();

        let master_client = sentinel
            .async_master_for(master_name, Some(&node_conn_info))
            .await
            .unwrap();
        let replicas = sentinel
            .async_get_replica_clients(master_name, Some(&node_conn_info))
            .await
            .unwrap();

        for replica_client in replicas {
            let mut con = replica_client
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            async_assert_connection_is_replica_of_correct_master(&mut con, &master_client).await;
        }
    }

    #[async_test]
    async fn test_get_replica_clients_with_one_replica_down_async() {
        let number_of_replicas = 3;
        let master_name = "master0";
        let mut context = TestSentinelContext::new(2, number_of_replicas, 3);
        let node_conn_info = context.sentinel_node_connection_info();
        let sentinel_conn_info = context.sentinels_connection_info()[0].clone();

        let mut conn = Client::open(sentinel_conn_info.clone())
            .inspect_err(|e| log_connection_error(&context, &sentinel_conn_info, e))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .inspect_err(|e| log_connection_error(&context, &sentinel_conn_info, e))
            .unwrap();

        redis::cmd("SENTINEL")
            .arg("set")
            .arg(master_name)
            .arg("down-after-milliseconds")
            .arg("500")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();

        context.cluster.servers[1].stop();
        std::thread::sleep(std::time::Duration::from_millis(800));

        let sentinel = context.sentinel_mut();
        let replicas = sentinel
            .async_get_replica_clients(master_name, Some(&node_conn_info))
            .await
            .expect("Failed to get replicas");

        assert_eq!(
            replicas.len(),
            (number_of_replicas - 1) as usize,
            "Unexpected num of replicas total"
        );
    }
}

#[cfg(feature = "r2d2")]
pub mod pool_tests {
    use std::{collections::HashSet, ops::DerefMut};

    use super::*;
    use r2d2::Pool;
    use redis::sentinel::LockedSentinelClient;

    fn parse_client_info(value: &str) -> HashMap<&str, &str> {
        let info_map: std::collections::HashMap<&str, &str> = value
            .split(" ")
            .filter_map(|line| line.split_once('='))
            .collect();
        info_map
    }

    #[test]
    fn test_sentinel_client() {
        let master_name = "master1";
        let context = TestSentinelContext::new(2, 3, 3);
        let master_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap();

        let pool = Pool::builder()
            .max_size(5)
            .build(LockedSentinelClient::new(master_client))
            .unwrap();

        let mut conns = Vec::new();
        for _ in 0..5 {
            let conn = pool.get().unwrap();

            conns.push(conn);
        }

        // since max_size is 5 and we haven't freed any connection this try should fail
        let try_conn = pool.try_get();
        assert!(try_conn.is_none());

        let mut client_id_set = HashSet::new();

        for mut conn in conns {
            let client_info_str: String = redis::cmd("CLIENT")
                .arg("INFO")
                .query(conn.deref_mut())
                .unwrap();

            let client_info_parsed = parse_client_info(client_info_str.as_str());

            // assert if all connections have different IDs
            assert!(client_id_set.insert(client_info_parsed.get("id").unwrap().to_string()));

            assert_is_connection_to_master(conn.deref_mut());
        }

        // since previous connections are freed, this should work
        let try_conn = pool.try_get();
        assert!(try_conn.is_some());
    }
}

#[cfg(all(feature = "tokio-comp", feature = "bb8"))]
pub mod bb8_pool_tests {
    use super::*;
    use bb8::Pool;
    use redis::sentinel::AsyncLockedSentinelClient;
    use std::collections::HashSet;

    fn parse_client_info(value: &str) -> HashMap<&str, &str> {
        let info_map: std::collections::HashMap<&str, &str> = value
            .split(" ")
            .filter_map(|line| line.split_once('='))
            .collect();
        info_map
    }

    #[tokio::test]
    async fn test_sentinel_client() {
        let master_name = "master1";
        let context = TestSentinelContext::new(2, 3, 3);
        let master_client = SentinelClient::build(
            context.sentinels_connection_info().clone(),
            String::from(master_name),
            Some(context.sentinel_node_connection_info()),
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap();

        let pool = Pool::builder()
            .max_size(5)
            .connection_timeout(Duration::from_secs(3))
            .build(AsyncLockedSentinelClient::new(master_client))
            .await
            .unwrap();

        let mut conns = Vec::new();
        for i in 0..5 {
            let conn = pool.get().await.unwrap();
            assert_eq!(pool.state().connections, i + 1);
            conns.push(conn);
        }

        // since max_size is 5 and we haven't freed any connection this try should fail
        let try_conn = pool.get().await;
        assert!(
            matches!(&try_conn, Err(bb8::RunError::TimedOut)),
            "expected the pool to time out, got {try_conn:?}"
        );

        let mut client_id_set = HashSet::new();

        for mut conn in conns {
            let client_info_str: String = redis::cmd("CLIENT")
                .arg("INFO")
                .query_async(&mut *conn)
                .await
                .unwrap();

            let client_info_parsed = parse_client_info(client_info_str.as_str());

            // assert if all connections have different IDs
            assert!(client_id_set.insert(client_info_parsed.get("id").unwrap().to_string()));

            let info: String = redis::cmd("INFO")
                .arg("REPLICATION")
                .query_async(&mut *conn)
                .await
                .unwrap();
            assert_is_master_role(info);
        }

        // since previous connections are freed, this should work
        let try_conn = pool.get().await;
        try_conn.unwrap();
    }
}
