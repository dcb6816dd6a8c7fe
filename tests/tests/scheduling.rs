//! How Linux schedules the data plane threads of the real binaries (issue 14): `SCHED_BATCH` by
//! default (kas's `connections.data_plane_scheduling`, agentk's `--data-plane-scheduling`),
//! only those threads, and as started with `normal`. Read from `/proc`, as `ps -T -o cls`
//! shows it.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::Path;

use kas_e2e::FakeKube;
use kas_e2e::process::{self, start_agentk_with_args, start_kas_standalone, start_kas_with_config};
use kas_proto::runtime_thread::{RuntimeThread, Scheduling};

/// `SCHED_OTHER` and `SCHED_BATCH` in `/proc/<pid>/task/<tid>/stat` (field 41).
const SCHED_OTHER: u32 = 0;
const SCHED_BATCH: u32 = 3;

/// The scheduling policy in a thread's `/proc` `stat` (field 41).
fn policy_in(stat: &str) -> u32 {
    // The fields after the command (in parentheses, which may hold spaces) start at 3.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(41 - 3).unwrap().parse().unwrap()
}

/// The scheduling policy of each of `pid`'s threads, by thread name (the names' policies, in
/// order: a name several threads share, such as tokio's workers, lists each).
fn policies(pid: u32) -> BTreeMap<String, Vec<u32>> {
    let mut by_name: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        // A thread that ended between the listing and the reads is skipped.
        let (Ok(comm), Ok(stat)) =
            (std::fs::read_to_string(dir.join("comm")), std::fs::read_to_string(dir.join("stat")))
        else {
            continue;
        };
        by_name.entry(comm.trim().to_owned()).or_default().push(policy_in(&stat));
    }
    by_name
}

/// The policy of the one thread called `name`, and of every other thread.
fn split(policies: &BTreeMap<String, Vec<u32>>, name: &str) -> (u32, Vec<u32>) {
    let own = policies.get(name).unwrap_or_else(|| panic!("no thread {name}: {policies:?}"));
    assert_eq!(own.len(), 1, "one thread {name}: {policies:?}");
    let others = policies.iter().filter(|(n, _)| *n != name).flat_map(|(_, p)| p.iter().copied()).collect();
    (own[0], others)
}

fn kubeconfig_for(kube: &FakeKube, dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(&path, kube.kubeconfig()).unwrap();
    path
}

/// `RuntimeThread` itself, in this process: the thread sets its policy before it hands out its
/// runtime; `normal` keeps the policy of the thread that started it.
#[test]
fn a_batch_runtime_thread_is_sched_batch_and_a_normal_one_keeps_its_starters_policy() {
    let batch = RuntimeThread::start("rt-test-batch".to_owned(), Scheduling::Batch).unwrap();
    let normal = RuntimeThread::start("rt-test-normal".to_owned(), Scheduling::Normal).unwrap();
    let here = policies(std::process::id());
    assert_eq!(here["rt-test-batch"], [SCHED_BATCH]);
    // The thread that started it: the test's, as the process was started.
    let own = policy_in(&std::fs::read_to_string("/proc/thread-self/stat").unwrap());
    assert_ne!(own, SCHED_BATCH, "run the tests under SCHED_OTHER");
    assert_eq!(here["rt-test-normal"], [own]);
    // Tasks spawned on it run there, under that policy.
    let spawned = batch.handle().spawn(async { std::thread::current().name().map(str::to_owned) });
    let name = futures::executor::block_on(spawned).unwrap();
    assert_eq!(name.as_deref(), Some("rt-test-batch"));
    drop((batch, normal));
}

#[tokio::test]
async fn data_plane_threads_of_kas_and_agentk_are_sched_batch_by_default_and_only_they() {
    let dir = tempfile::tempdir().unwrap();
    let kas = start_kas_standalone(dir.path()).await;
    let kube = FakeKube::start().await;
    let kubeconfig = kubeconfig_for(&kube, dir.path());
    let mut agentk =
        start_agentk_with_args(kas.addresses.agent, &kas.agent_token_file(), &kubeconfig, "agentk-0", "agentk", &[]);
    agentk.wait_for_message("connected to kas").await;

    let (data_plane, others) = split(&policies(kas.process.pid()), "kas-data-0");
    assert_eq!(data_plane, SCHED_BATCH, "kas's data plane thread");
    assert!(!others.is_empty() && others.iter().all(|p| *p == SCHED_OTHER), "kas's other threads: {others:?}");
    let (data_plane, others) = split(&policies(agentk.pid()), "agentk-tunnels");
    assert_eq!(data_plane, SCHED_BATCH, "agentk's data plane thread");
    assert!(!others.is_empty() && others.iter().all(|p| *p == SCHED_OTHER), "agentk's other threads: {others:?}");
    // Nothing about it was worth a warning.
    for (name, output) in [("kas", kas.process.stderr()), ("agentk", agentk.stderr())] {
        assert!(!output.contains("scheduling policy"), "{name} warned: {output}");
    }
}

#[tokio::test]
async fn normal_leaves_the_data_plane_threads_as_the_process_started() {
    let dir = tempfile::tempdir().unwrap();
    let dev = kas::standalone::ensure_dev_setup(&dir.path().join("dev")).unwrap();
    let mut config = dev.config.clone().with_ephemeral_ports();
    config.connections.data_plane_scheduling = Scheduling::Normal;
    let kas = start_kas_with_config(&config, dir.path()).await;
    let kube = FakeKube::start().await;
    let kubeconfig = kubeconfig_for(&kube, dir.path());
    let mut agentk = start_agentk_with_args(
        kas.addresses.agent,
        &dev.agent_token_file,
        &kubeconfig,
        "agentk-0",
        "agentk",
        &["--data-plane-scheduling", "normal"],
    );
    agentk.wait_for_message("connected to kas").await;

    for (name, pid, thread) in [("kas", kas.process.pid(), "kas-data-0"), ("agentk", agentk.pid(), "agentk-tunnels")] {
        let (data_plane, others) = split(&policies(pid), thread);
        assert_eq!(data_plane, SCHED_OTHER, "{name}'s data plane thread");
        assert!(others.iter().all(|p| *p == SCHED_OTHER), "{name}'s other threads: {others:?}");
    }
}

#[tokio::test]
async fn agentk_refuses_an_unknown_scheduling_with_the_names_it_takes() {
    let out = process::command("agentk")
        .args(["--kas-address", "grpc://127.0.0.1:1", "--token-file", "/nonexistent"])
        .args(["--data-plane-scheduling", "fifo"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--data-plane-scheduling") && stderr.contains("\"fifo\"") && stderr.contains("batch or normal"),
        "{stderr}"
    );
}
