//! The Kubernetes API proxy side by side: the same upstream (the fake API server) reached
//! directly, through kas+agentk, through kas→kas+agentk, and through nginx when installed.
//! kas and agentk run as real release processes, so their peak RSS is their own.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kas_e2e::{FakeKube, RedisServer};

use crate::{ms, percentile};

const SMALL_PATH: &str = "/api/v1/namespaces/default/pods/web-1";
const BIG_PATH: &str = "/api/v1/namespaces/default/pods/big/log";
const BIG_SIZE: u64 = 200 * 1024 * 1024;

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn peak_rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }
}

/// The kas/agentk binaries next to this benchmark (target/release/).
fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("bench path");
    let path = exe.parent().expect("dir").join(name);
    assert!(path.is_file(), "{} missing: build with `cargo build --release --bins` first", path.display());
    path
}

/// Starts kas with a config file; returns the process and its rest and agent addresses.
fn start_kas(config: &kas::Config, dir: &Path, n: usize) -> (Proc, String, String) {
    let path = dir.join(format!("kas-{n}.yaml"));
    std::fs::write(&path, serde_norway::to_string(config).expect("yaml")).expect("write config");
    let mut kas = Proc(
        Command::new(binary("kas"))
            .arg("--config")
            .arg(&path)
            .args(["--log-format", "json", "--log", "warn,kas=info"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kas"),
    );
    let stderr = kas.0.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    loop {
        let line = lines.next().expect("kas exited").expect("read");
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if v["fields"]["message"] == "kas listening" {
            let rest = v["fields"]["rest"].as_str().expect("rest").to_owned();
            let agent = v["fields"]["agent"].as_str().expect("agent").to_owned();
            // Keep draining stderr so kas never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return (kas, rest, agent);
        }
    }
}

struct Target {
    name: &'static str,
    base: String,
    token: String,
}

struct SmallResult {
    rps: f64,
    p50: Duration,
    p99: Duration,
}

async fn small_gets(client: &reqwest::Client, t: &Target, concurrency: usize, total: usize) -> SmallResult {
    let url = format!("{}{SMALL_PATH}", t.base);
    // Warm-up (connections, tunnels).
    for _ in 0..50 {
        let r = client.get(&url).bearer_auth(&t.token).send().await.expect("warm-up");
        assert!(r.status().is_success(), "{}: {}", t.name, r.status());
        let _ = r.bytes().await;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, url, token, next) = (client.clone(), url.clone(), t.token.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let t0 = Instant::now();
                let r = client.get(&url).bearer_auth(&token).send().await.expect("request");
                assert!(r.status().is_success());
                let _ = r.bytes().await.expect("body");
                latencies.push(t0.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::with_capacity(total);
    for w in workers {
        all.extend(w.await.expect("worker"));
    }
    let elapsed = started.elapsed();
    all.sort();
    SmallResult {
        rps: all.len() as f64 / elapsed.as_secs_f64(),
        p50: percentile(&all, 0.5),
        p99: percentile(&all, 0.99),
    }
}

async fn big_body(client: &reqwest::Client, t: &Target) -> f64 {
    let url = format!("{}{BIG_PATH}", t.base);
    let started = Instant::now();
    let mut r = client.get(&url).bearer_auth(&t.token).send().await.expect("request");
    assert!(r.status().is_success(), "{}: {}", t.name, r.status());
    let mut total = 0u64;
    while let Some(chunk) = r.chunk().await.expect("chunk") {
        total += chunk.len() as u64;
    }
    assert_eq!(total, BIG_SIZE, "{}: body size", t.name);
    total as f64 / (1024.0 * 1024.0) / started.elapsed().as_secs_f64()
}

fn start_nginx(dir: &Path, upstream: &str) -> Option<(Proc, String)> {
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"].into_iter().find(|p| Path::new(p).is_file())?;
    // A benchmark program, not a test: a free port picked by binding 0 and releasing it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nworker_processes 1;\npid {dir}/nginx.pid;\nerror_log {dir}/nginx-error.log;\n\
             events {{ worker_connections 1024; }}\n\
             http {{ access_log off; client_body_temp_path {dir}; proxy_temp_path {dir};\n\
             upstream up {{ server {upstream}; keepalive 32; }}\n\
             server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://up; proxy_http_version 1.1;\n\
             proxy_set_header Connection \"\"; proxy_buffering off; }} }} }}\n",
            dir = dir.display()
        ),
    )
    .ok()?;
    let child = Command::new(nginx).arg("-c").arg(&conf).stdout(Stdio::null()).stderr(Stdio::null()).spawn().ok()?;
    Some((Proc(child), format!("http://127.0.0.1:{port}")))
}

pub async fn run(report: &mut String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let dev = kas::standalone::ensure_dev_setup(&dir.path().join("dev")).expect("dev setup");
    let redis = RedisServer::start().await;
    let fake = FakeKube::start().await;
    fake.add_pod("default", "web-1");
    fake.add_pod("default", "big");
    fake.add_big_log("default", "big", BIG_SIZE);
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).expect("kubeconfig");

    let mut config = dev.config.clone().with_ephemeral_ports();
    config.registry.redis = Some(kas::registry::redis::RedisConfig::new(redis.url()));
    let (kas_a, rest_a, agent_a) = start_kas(&config, dir.path(), 0);
    let (kas_b, rest_b, _) = start_kas(&config, dir.path(), 1);
    let agentk = Proc(
        Command::new(binary("agentk"))
            .arg(format!("--kas-address=grpc://{agent_a}"))
            .arg(format!("--token-file={}", dev.agent_token_file.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--observability-address=127.0.0.1:0", "--log=warn"])
            .args(
                std::env::var("BENCH_AGENTK_ARGS")
                    .map(|a| a.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                    .unwrap_or_default(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn agentk"),
    );
    let secret = kas::auth::Secret::from_file(&dev.gitlab_secret_file).expect("secret");
    let jwt = kas::auth::mint_jwt(&secret, "gitlab", "gitlab-kas", Duration::from_secs(3600)).expect("jwt");
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("client");
    let via = |rest: &str| format!("http://{rest}/api/v1/agents/1/kubernetes");
    // Wait until the agent serves through both kas.
    for base in [via(&rest_a), via(&rest_b)] {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = client
                .get(format!("{base}{SMALL_PATH}"))
                .bearer_auth(&jwt)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "agent not reachable through {base}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut targets = vec![
        Target { name: "direct", base: fake.url(), token: fake.token().to_owned() },
        Target { name: "kas + agentk", base: via(&rest_a), token: jwt.clone() },
        Target { name: "kas → kas + agentk", base: via(&rest_b), token: jwt.clone() },
    ];
    let nginx = start_nginx(dir.path(), fake.url().trim_start_matches("http://"));
    if let Some((_, base)) = &nginx {
        // nginx needs a moment to bind; the first request retries until it answers.
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.get(format!("{base}{SMALL_PATH}")).bearer_auth(fake.token()).send().await.is_err() {
            assert!(Instant::now() < deadline, "nginx did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        targets.push(Target { name: "nginx reverse proxy", base: base.clone(), token: fake.token().to_owned() });
    }

    const CONCURRENCY: usize = 16;
    const REQUESTS: usize = 5000;
    let mut rows = Vec::new();
    for t in &targets {
        let small = small_gets(&client, t, CONCURRENCY, REQUESTS).await;
        let mbps = big_body(&client, t).await;
        rows.push((t.name, small, mbps));
    }
    let (direct_rps, direct_p50, direct_p99, direct_mbps) =
        (rows[0].1.rps, rows[0].1.p50.as_secs_f64(), rows[0].1.p99.as_secs_f64(), rows[0].2);
    let _ = writeln!(report, "## Kubernetes API proxy (issue 4)\n");
    let _ = writeln!(
        report,
        "Same upstream (the fake API server, in the benchmark process) for every path. kas (two \
         replicas on one Redis) and agentk are release processes on loopback, plain HTTP on the rest \
         listener. Small GETs: {REQUESTS} requests of a ~400-byte pod object at concurrency \
         {CONCURRENCY} (reqwest, keep-alive). Large body: one {} MiB response, streamed. \
         bore/rathole were not installed and are not measured.\n",
        BIG_SIZE / 1024 / 1024
    );
    let _ = writeln!(
        report,
        "| path | req/s | ratio | p50 (ms) | ratio | p99 (ms) | ratio | large body MB/s | ratio |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (name, s, mbps) in &rows {
        let _ = writeln!(
            report,
            "| {name} | {:.0} | {:.2} | {} | {:.2} | {} | {:.2} | {:.0} | {:.2} |",
            s.rps,
            s.rps / direct_rps,
            ms(s.p50),
            s.p50.as_secs_f64() / direct_p50,
            ms(s.p99),
            s.p99.as_secs_f64() / direct_p99,
            mbps,
            mbps / direct_mbps
        );
    }
    let _ = writeln!(
        report,
        "\nPeak RSS (VmHWM) after all runs, including the {} MiB bodies: kas A {:.1} MiB, kas B {:.1} MiB, agentk \
         {:.1} MiB.\n",
        BIG_SIZE / 1024 / 1024,
        kas_a.peak_rss_mib(),
        kas_b.peak_rss_mib(),
        agentk.peak_rss_mib()
    );
    drop((kas_a, kas_b, agentk, nginx, redis));
}
