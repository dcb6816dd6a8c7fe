//! agentk -> kas over TLS (`grpcs://` with `--ca-cert-file`), and the failures that prove the
//! certificate is actually checked.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kas_e2e::Cluster;
use kas_e2e::certificates::{CertificateFiles, TestCa, localhost_tls};
use kas_proto::kas::GetPodsRequest;

#[tokio::test]
async fn agentk_connects_over_tls_with_a_private_ca() {
    let c = Cluster::builder()
        .configure(|config, dir| config.listeners.agent.tls = Some(localhost_tls(dir, "agent")))
        .start()
        .await;
    let ca = c.dir.path().join("agent.crt");
    let port = c.kas[0].addresses.agent.port();

    // Trusting the private CA: connects and serves.
    let mut config = c.agentk_config(1, 0, "tls");
    config.kas_address = format!("grpcs://localhost:{port}");
    config.ca_cert_file = Some(ca);
    let a = c.start_agentk_with(config).await;
    a.ready().await;
    c.kube.add_pod("default", "over-tls");
    let resp = c.api(0).get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap().into_inner();
    assert_eq!(resp.pods.len(), 1);

    // Without the CA (system roots only), the certificate is not trusted: never connects.
    let mut untrusting = c.agentk_config(1, 0, "no-ca");
    untrusting.kas_address = format!("grpcs://localhost:{port}");
    let b = c.start_agentk_with(untrusting).await;
    b.status.failed_attempts.clone().wait_for(|n| *n >= 2).await.unwrap();
    assert!(!b.status.is_ready());

    // Plaintext against the TLS listener fails too.
    let plain = c.start_agentk_with(c.agentk_config(1, 0, "plain")).await;
    plain.status.failed_attempts.clone().wait_for(|n| *n >= 2).await.unwrap();
    assert!(!plain.status.is_ready());
}

#[tokio::test]
async fn ca_cert_file_requires_grpcs() {
    let c = Cluster::builder().start().await;
    let mut config = c.agentk_config(1, 0, "x");
    config.ca_cert_file = Some(c.dir.path().join("whatever.pem"));
    let err = agentk::App::new(config).await.err().expect("rejected");
    assert!(err.to_string().contains("--ca-cert-file needs a grpcs:// address"), "{err}");
}

#[tokio::test]
async fn bad_tls_files_fail_startup_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let setup = kas::standalone::ensure_dev_setup(&dir.path().join("dev")).unwrap();
    let mut config = setup.config.with_ephemeral_ports();
    config.listeners.api.tls = Some(kas::config::TlsConfig {
        certificate_file: dir.path().join("missing.crt"),
        key_file: dir.path().join("missing.key"),
    });
    let err = kas::App::new(config).bind().await.err().expect("bind fails");
    let msg = err.to_string();
    assert!(msg.contains("TLS of the api listener") && msg.contains("missing.crt"), "{msg}");
}

/// A CA only kas trust, and one certificate from it for `kas-internal` (server and client use).
fn kas_ca(dir: &std::path::Path) -> kas::config::InternalTlsConfig {
    let ca = TestCa::new();
    let ca_file = dir.join("kas-ca.crt");
    ca.write(&ca_file);
    let CertificateFiles { certificate_file, key_file } = ca.issue(&["kas-internal"]).write(dir, "kas");
    kas::config::InternalTlsConfig {
        certificate_file,
        key_file,
        ca_file,
        server_name: "kas-internal".into(),
        require_client_certificates: true,
    }
}

#[tokio::test]
async fn kas_to_kas_traffic_uses_mutual_tls() {
    let c = Cluster::builder()
        .redis()
        .kas(2)
        .configure(|config, dir| config.kas_internal.tls = Some(kas_ca(dir)))
        .start()
        .await;
    c.kube.add_pod("default", "p");
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    // kas 1 has no tunnel: it forwards to kas 0 over mutual TLS.
    let pods = c.api(1).get_pods(GetPodsRequest { agent_id: 1, connection_id: 0 }).await.unwrap().into_inner().pods;
    assert_eq!(pods.len(), 1);

    let tls = c.config.kas_internal.tls.clone().unwrap();
    let internal = c.kas[0].addresses.internal;
    let call = |channel: tonic::transport::Channel| {
        let token = c.internal_jwt();
        async move {
            let mut client = kas_proto::kas::kas_internal_client::KasInternalClient::new(channel);
            let mut req = tonic::Request::new(GetPodsRequest { agent_id: 1, connection_id: 1 });
            req.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
            client.get_pods(req).await
        }
    };
    // Trusting the CA but without a client certificate: refused in the handshake.
    let no_client_cert = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(std::fs::read(&tls.ca_file).unwrap()))
        .domain_name("kas-internal");
    let channel = tonic::transport::Channel::from_shared(format!("https://{internal}"))
        .unwrap()
        .tls_config(no_client_cert)
        .unwrap()
        .connect_lazy();
    let err = call(channel).await.unwrap_err();
    // The handshake itself fails: kas's TLS alert names the missing certificate.
    assert!(
        format!("{err:?}").contains("CertificateRequired"),
        "not refused for lack of a client certificate: {err:?}"
    );
    // Plaintext: kas's TLS listener ends the connection before any gRPC exchange (the client
    // may first read kas's TLS alert, which is no HTTP/2 frame: an h2 protocol error).
    let err = call(kas_e2e::cluster::channel(internal)).await.unwrap_err();
    let chain = format!("{err:?}");
    assert!(
        err.code() != tonic::Code::NotFound
            && ["broken pipe", "connection reset", "closed", "frame_size_error"]
                .iter()
                .any(|s| chain.to_lowercase().contains(s)),
        "plaintext was not refused at the transport: {err:?}"
    );
}

#[tokio::test]
async fn the_observability_listener_serves_tls_when_configured() {
    let c = Cluster::builder()
        .configure(|config, dir| config.listeners.observability.tls = Some(localhost_tls(dir, "agent")))
        .start()
        .await;
    let port = c.kas[0].addresses.observability.port();
    let ca = c.dir.path().join("agent.crt");
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--cacert"])
        .arg(&ca)
        .arg(format!("https://localhost:{port}/livez"))
        .output()
        .await
        .expect("curl is required");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    let out = tokio::process::Command::new("curl")
        .args(["-sS", &format!("http://localhost:{port}/livez")])
        .output()
        .await
        .unwrap();
    // Plaintext is refused: the connection ends without any HTTP answer (curl exits non-zero).
    assert!(!out.status.success(), "plaintext got an answer: {}", String::from_utf8_lossy(&out.stdout));
    assert!(out.stdout.is_empty(), "plaintext got an answer: {}", String::from_utf8_lossy(&out.stdout));
}
