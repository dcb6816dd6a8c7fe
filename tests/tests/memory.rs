//! kas and agentk stream large bodies without holding them: kubectl reads a 50 MiB response
//! through real kas and agentk processes, and neither process's peak RSS grows by the body size.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::Stdio;
use std::time::Duration;

use kas_e2e::FakeKube;
use kas_e2e::process::{start_agentk, start_kas_with_config};

const SIZE: u64 = 50 * 1024 * 1024;
/// Below the body size: a process that buffered the body would exceed it (50 MiB on top of its
/// own ~20 MiB). Measured here with debug builds: agentk 20-30 MiB; kas 45.4 MiB in one CI run
/// since kas allocates with jemalloc, which keeps freed pages about 10 s before purging them.
const PEAK_RSS_LIMIT_MIB: f64 = 55.0;

fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap())
        .unwrap();
    kb / 1024.0
}

#[tokio::test]
async fn a_50_mib_response_streams_through_kas_and_agentk_processes_with_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let dev = kas::standalone::ensure_dev_setup(&dir.path().join("dev")).unwrap();
    let tls = kas_e2e::certificates::localhost_tls(dir.path(), "rest");
    let certificate_file = tls.certificate_file.clone();
    let mut config = dev.config.clone().with_ephemeral_ports();
    config.listeners.rest.tls = Some(tls);
    let kas = start_kas_with_config(&config, dir.path()).await;

    let kube = FakeKube::start().await;
    kube.add_pod("default", "big");
    kube.add_big_log("default", "big", SIZE);
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let mut agentk = start_agentk(kas.addresses.agent, &dev.agent_token_file, &kubeconfig, "agentk-0", "agentk");
    agentk.wait_for_message("connected to kas").await;

    let secret = kas::auth::Secret::from_file(&dev.gitlab_secret_file).unwrap();
    let jwt = kas::auth::mint_jwt(&secret, "gitlab", "gitlab-kas", Duration::from_secs(600)).unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config"), "apiVersion: v1\nkind: Config\n").unwrap();
    let mut kubectl = tokio::process::Command::new("kubectl")
        .env("KUBECONFIG", home.path().join("config"))
        .env("HOME", home.path())
        .arg(format!("--server=https://localhost:{}/api/v1/agents/1/kubernetes", kas.addresses.rest.port()))
        .arg(format!("--token={jwt}"))
        .arg(format!("--certificate-authority={}", certificate_file.display()))
        .args(["logs", "big", "-n", "default"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl is required (part of the machine image)");
    let (total, digest) = kas_e2e::fake_kube::length_and_sha256(kubectl.stdout.take().unwrap()).await;
    assert!(kubectl.wait().await.unwrap().success());
    assert_eq!(total, SIZE);
    assert_eq!(digest, kas_e2e::fake_kube::big_log_sha256(SIZE), "the body changed on the way");

    let (kas_peak, agentk_peak) = (peak_rss_mib(kas.process.pid()), peak_rss_mib(agentk.pid()));
    eprintln!("peak RSS after 50 MiB: kas {kas_peak:.1} MiB, agentk {agentk_peak:.1} MiB");
    assert!(kas_peak < PEAK_RSS_LIMIT_MIB, "kas peak RSS {kas_peak:.1} MiB");
    assert!(agentk_peak < PEAK_RSS_LIMIT_MIB, "agentk peak RSS {agentk_peak:.1} MiB");
}
