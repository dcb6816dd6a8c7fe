//! The failover scenario: every agent connected and idle (round-robin over the kas), requests
//! flowing if `--rate` is given; then kas-0 is killed with SIGKILL and its agents reconnect as
//! agentk does (`agent.rs`: backoff, retry pushback) to a live kas picked at random (a load
//! balancer that knows at once which kas are gone). Measured until every agent that was on kas-0
//! is registered on a survivor (its `Connected` event, published with the record) and served (a
//! request for it through a random survivor answered 200, sent once it is registered and
//! repeated every 50 ms until one is):
//!
//! - the time from the kill until all are registered and until all are served, and per agent;
//! - what each survivor admitted per second, and what it shed (UNAVAILABLE with a retry
//!   pushback); every other refusal by kind, RESOURCE_EXHAUSTED above all (a rate limit held
//!   against an agent that did nothing but lose its kas: must be 0);
//! - Redis commands/s and CPU (`INFO stats cpu` every 200 ms) and kas CPU before and during it;
//! - what becomes of the killed kas's registry entries: its heartbeat key expires (readers skip
//!   its records from then on), its connection records stay until their TTL.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kas_proto::kas::ConnectedAgentInfo;
use kas_proto::registry::ExpiringValue;
use prost::Message;
use tokio_util::sync::CancellationToken;

use crate::agent::Outcome;
use crate::load::{self, Load};
use crate::{
    Args, KEY_PREFIX, REQUESTS_HEADER, RedisSample, SimError, home, kas_sample, percentile, proc_stats, redis_sample,
    requests_line, run_line, start,
};

/// How long the moved agents get to be registered and served.
const FAILOVER_WITHIN: Duration = Duration::from_secs(120);
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// A probe that failed is repeated after this.
const PROBE_PAUSE: Duration = Duration::from_millis(50);
/// Requests keep flowing this long after every agent was served (the "after" window).
const AFTER: Duration = Duration::from_secs(5);
/// The killed kas.
const VICTIM: usize = 0;

/// agent_info requests the fake GitLab received so far (GitLab mode).
fn sim_gitlab_requests(gitlab: Option<&kas_e2e::FakeGitlab>) -> Option<usize> {
    gitlab.map(kas_e2e::FakeGitlab::requests)
}

fn seconds(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

/// p50 / p99 / max of durations, in seconds.
fn spread(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "{} / {} / {}",
        seconds(percentile(&v, 0.5)),
        seconds(percentile(&v, 0.99)),
        seconds(v.last().copied().unwrap_or_default())
    )
}

pub async fn run(args: &Args) -> Result<String, SimError> {
    let mut sim = start(args).await?;
    let gitlab_after_ramp = sim_gitlab_requests(sim.gitlab.as_ref());
    let victim_instance = sim.kas[VICTIM].instance_id.clone();
    let moved: Vec<i64> = (0..args.agents).filter(|&i| home(args, i) == VICTIM).map(|i| i as i64 + 1).collect();
    let moved_set: HashSet<i64> = moved.iter().copied().collect();

    let load = Arc::new(Load::default());
    let stop_load = CancellationToken::new();
    let load_task = (args.rate > 0.0)
        .then(|| tokio::spawn(load.clone().run(sim.gateway.clone(), args.rate, args.agents, stop_load.clone())));

    // Samplers: Redis INFO and each kas's CPU every 200 ms, from the settle window on.
    let sampling = CancellationToken::new();
    let redis_samples: Arc<Mutex<Vec<RedisSample>>> = Arc::default();
    let redis_task = {
        let (mut conn, samples, stop) = (sim.conn.clone(), redis_samples.clone(), sampling.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                match redis_sample(&mut conn).await {
                    Ok(s) => samples.lock().unwrap_or_else(PoisonError::into_inner).push(s),
                    Err(e) => eprintln!("redis INFO failed: {e}"),
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        })
    };
    let pids: Vec<u32> = sim.kas.iter().map(|k| k.pid()).collect();
    let settle_start = Instant::now();
    let cpu_settle: Vec<u64> = pids.iter().map(|p| proc_stats::cpu_ticks(*p).unwrap_or(0)).collect();
    let sim_cpu_settle = proc_stats::cpu_ticks(std::process::id()).unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;

    // The kill.
    let cpu_kill: Vec<u64> = pids.iter().map(|p| proc_stats::cpu_ticks(*p).unwrap_or(0)).collect();
    let sim_cpu_kill = proc_stats::cpu_ticks(std::process::id()).unwrap_or(0);
    let counters = sim.shared.counters.clone();
    let requests_served_at_kill = counters.requests_served.load(Ordering::Relaxed);
    let journal_at_kill = sim.shared.journal.snapshot().len();
    // The load balancer stops sending to it at once; what was in flight on it is lost.
    sim.fleet.alive[VICTIM].store(false, Ordering::Relaxed);
    let tcp_at_kill = (proc_stats::tcp_ext("ListenOverflows"), proc_stats::tcp_ext("TCPSynRetrans"));
    let metrics_client = reqwest::Client::new();
    let survivors: Vec<usize> = (0..sim.kas.len()).filter(|i| *i != VICTIM).collect();
    let mut metrics_at_kill = Vec::new();
    for &i in &survivors {
        metrics_at_kill.push(scrape(&metrics_client, &sim.kas[i].observability_address).await);
    }
    let gitlab_at_kill = sim_gitlab_requests(sim.gitlab.as_ref());
    let kill_at = Instant::now();
    sim.kas[VICTIM].kill();

    // The heartbeat key of the killed kas: when it expires, readers skip its records.
    let heartbeat_key = format!("{KEY_PREFIX}:kas:{victim_instance}");
    let heartbeat_task = {
        let mut conn = sim.conn.clone();
        let key = heartbeat_key.clone();
        tokio::spawn(async move {
            let ttl_ms: Option<i64> = redis::cmd("PTTL").arg(&key).query_async(&mut conn).await.ok();
            loop {
                let exists: bool = redis::cmd("EXISTS").arg(&key).query_async(&mut conn).await.unwrap_or(true);
                if !exists || kill_at.elapsed() > FAILOVER_WITHIN {
                    return (ttl_ms, (!exists).then(|| kill_at.elapsed()));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // Registered on a survivor → probed until served.
    let served: Arc<Mutex<HashMap<i64, (Instant, u32)>>> = Arc::default();
    let mut registered: HashMap<i64, Instant> = HashMap::new();
    let deadline = kill_at + FAILOVER_WITHIN;
    let mut timed_out = false;
    let all_served = Arc::new(tokio::sync::Notify::new());
    loop {
        let event = tokio::select! {
            e = sim.registered.recv() => e,
            () = all_served.notified() => None,
            () = tokio::time::sleep_until(deadline.into()) => {
                timed_out = true;
                None
            }
        };
        let Some((id, at, instance)) = event else {
            if !timed_out && served.lock().unwrap_or_else(PoisonError::into_inner).len() < moved.len() {
                // The events channel closed: nothing more will come.
                timed_out = true;
            }
            break;
        };
        // Registrations before the kill, of agents that stayed, and repeats are not news.
        if at <= kill_at || instance == victim_instance || !moved_set.contains(&id) || registered.contains_key(&id) {
            continue;
        }
        {
            registered.insert(id, at);
            let total = moved.len();
            let all_served = all_served.clone();
            let (gateway, served) = (sim.gateway.clone(), served.clone());
            tokio::spawn(async move {
                let mut tries = 0;
                loop {
                    tries += 1;
                    let s = gateway.request(id, None).await;
                    if s.status == 200 {
                        let mut served = served.lock().unwrap_or_else(PoisonError::into_inner);
                        served.insert(id, (s.sent + s.took, tries));
                        if served.len() >= total {
                            all_served.notify_one();
                        }
                        return;
                    }
                    if kill_at.elapsed() > FAILOVER_WITHIN {
                        return;
                    }
                    tokio::time::sleep(PROBE_PAUSE).await;
                }
            });
        }
    }
    let storm_end = Instant::now();
    let gitlab_at_storm_end = sim_gitlab_requests(sim.gitlab.as_ref());
    let tcp_at_end = (proc_stats::tcp_ext("ListenOverflows"), proc_stats::tcp_ext("TCPSynRetrans"));
    let mut metrics_at_end = Vec::new();
    for &i in &survivors {
        metrics_at_end.push(scrape(&metrics_client, &sim.kas[i].observability_address).await);
    }
    let cpu_storm_end: Vec<u64> = pids.iter().map(|p| proc_stats::cpu_ticks(*p).unwrap_or(0)).collect();
    let sim_cpu_storm_end = proc_stats::cpu_ticks(std::process::id()).unwrap_or(0);
    tokio::time::sleep(AFTER).await;
    let after_end = Instant::now();
    stop_load.cancel();
    if let Some(t) = load_task {
        let _ = t.await;
    }
    sampling.cancel();
    let _ = redis_task.await;
    let (heartbeat_ttl_at_kill, heartbeat_gone) = heartbeat_task.await.unwrap_or((None, None));
    let dead_records = records_of(&mut sim.conn, &victim_instance).await;

    let journal = sim.shared.journal.snapshot();
    let after_kill = &journal[journal_at_kill.min(journal.len())..];
    let served = served.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let requests_served_in_storm = counters.requests_served.load(Ordering::Relaxed) - requests_served_at_kill;
    sim.shared.stop.cancel();
    for t in std::mem::take(&mut sim.tasks) {
        let _ = t.await;
    }
    sim.events.abort();

    // The report.
    let ticks = proc_stats::clock_ticks_per_second();
    let settle = kill_at.duration_since(settle_start).as_secs_f64();
    let storm = storm_end.duration_since(kill_at).as_secs_f64();
    let mut r = String::new();
    let _ = writeln!(
        r,
        "### Failover: {} agents on {} kas, kas-{VICTIM} killed{}\n\n{}",
        args.agents,
        args.kas,
        if args.rate > 0.0 { format!(", {} requests/s", args.rate) } else { String::new() },
        run_line(args)
    );
    let accept = &kas::Config::default().limits.agent_connection_accept_rate;
    let _ = writeln!(
        r,
        "Ramp: {} agents started in {:.1} s, all registered {:.1} s after the first started, {} of {} idle tunnels open; then {settle:.1} s of rest before the kill. Accept rate of each kas: {}/s, burst {}.{}\n",
        args.agents,
        sim.ramp.as_secs_f64(),
        sim.all_registered.as_secs_f64(),
        sim.tunnels_at_start,
        args.agents * args.idle_tunnels,
        args.accept_rate.unwrap_or(accept.per_second),
        args.accept_burst.unwrap_or(accept.burst),
        if timed_out { format!(" **Timed out after {FAILOVER_WITHIN:?}.**") } else { String::new() },
    );

    // Registration and service of the moved agents.
    let registration: Vec<Duration> = registered.values().map(|at| at.duration_since(kill_at)).collect();
    let service: Vec<Duration> = served.values().map(|(at, _)| at.saturating_duration_since(kill_at)).collect();
    let probes: u32 = served.values().map(|(_, tries)| tries).sum();
    let attempts: HashMap<i64, usize> = after_kill.iter().fold(HashMap::new(), |mut m, a| {
        *m.entry(a.agent).or_insert(0) += 1;
        m
    });
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for a in after_kill {
        let kind = match a.outcome {
            Outcome::Admitted => continue,
            Outcome::Shed => "shed: UNAVAILABLE with a retry pushback".to_owned(),
            Outcome::ResourceExhausted => "RESOURCE_EXHAUSTED (a rate limit held against the agent)".to_owned(),
            Outcome::Refused(code) => format!("refused: {code:?}"),
            Outcome::ConnectFailed => "connection failed".to_owned(),
        };
        *outcomes.entry(kind).or_insert(0) += 1;
    }
    let exhausted = after_kill.iter().filter(|a| a.outcome == Outcome::ResourceExhausted).count();
    let stayed_but_reconnected = after_kill
        .iter()
        .filter(|a| a.outcome == Outcome::Admitted && !moved_set.contains(&a.agent))
        .map(|a| a.agent)
        .collect::<HashSet<_>>()
        .len();
    let _ = writeln!(r, "| failover | value |\n| --- | --- |");
    let _ = writeln!(r, "| agents on the killed kas | {} |", moved.len());
    let _ = writeln!(
        r,
        "| kill → all registered on a survivor (s) | {} |",
        if registration.len() == moved.len() {
            seconds(registration.iter().max().copied().unwrap_or_default())
        } else {
            format!("{} of {} registered", registration.len(), moved.len())
        }
    );
    let _ = writeln!(r, "| kill → registered, per agent: p50 / p99 / max (s) | {} |", spread(registration));
    let _ = writeln!(
        r,
        "| kill → all served: a request through each answered 200 (s) | {} |",
        if service.len() == moved.len() {
            seconds(service.iter().max().copied().unwrap_or_default())
        } else {
            format!("{} of {} served", service.len(), moved.len())
        }
    );
    let _ = writeln!(r, "| kill → served, per agent: p50 / p99 / max (s) | {} |", spread(service));
    let _ = writeln!(
        r,
        "| probe requests until served (one per agent when the first succeeds) | {probes} for {} agents |",
        served.len()
    );
    let _ = writeln!(
        r,
        "| attempts per moved agent (GetConfiguration calls and failed connects): mean / max | {:.2} / {} |",
        moved.iter().map(|id| attempts.get(id).copied().unwrap_or(0)).sum::<usize>() as f64 / moved.len().max(1) as f64,
        moved.iter().map(|id| attempts.get(id).copied().unwrap_or(0)).max().unwrap_or(0)
    );
    let lost: Vec<Duration> = sim
        .shared
        .journal
        .losses()
        .iter()
        .filter(|(agent, at)| *at >= kill_at && moved_set.contains(agent))
        .map(|(_, at)| at.duration_since(kill_at))
        .collect();
    let _ = writeln!(
        r,
        "| kill → the agent saw its connection fail (the simulator's own pace: agentk, one per cluster, sees it at once), p50 / p99 / max (s) | {} |",
        spread(lost)
    );
    let admitted: Vec<_> = after_kill.iter().filter(|a| a.outcome == Outcome::Admitted).collect();
    let _ = writeln!(
        r,
        "| admitted attempts: kill → attempt began (backoff and pushbacks), p50 / p99 / max (s) | {} |",
        spread(admitted.iter().map(|a| a.began.saturating_duration_since(kill_at)).collect())
    );
    let _ = writeln!(
        r,
        "| admitted attempts: TCP + HTTP/2 connect, p50 / p99 / max (s) | {} |",
        spread(admitted.iter().map(|a| a.called.duration_since(a.began)).collect())
    );
    let _ = writeln!(
        r,
        "| admitted attempts: GetConfiguration until kas answered, p50 / p99 / max (s) | {} |",
        spread(admitted.iter().map(|a| a.at.duration_since(a.called)).collect())
    );
    for (kind, n) in &outcomes {
        let _ = writeln!(r, "| {kind} | {n} |");
    }
    if exhausted == 0 {
        let _ = writeln!(r, "| RESOURCE_EXHAUSTED (a rate limit held against the agent) | 0 |");
    }
    let _ = writeln!(r, "| agents of the survivors that reconnected | {stayed_but_reconnected} |");
    if let (Some(ramp), Some(kill), Some(end)) = (gitlab_after_ramp, gitlab_at_kill, gitlab_at_storm_end) {
        let ttl = args.gitlab_ttl.unwrap_or(kas::config::DEFAULT_AGENT_INFO_TTL);
        let _ = writeln!(
            r,
            "| GitLab mode ({}, agent_info ttl {}): agent_info requests during the ramp / the rest / kill → all served | {ramp} / {} / {} |",
            match args.gitlab {
                crate::GitlabMode::Shared => "cache shared between kas",
                _ => "cache per kas",
            },
            humantime::format_duration(ttl),
            kill - ramp,
            end - kill
        );
    }
    let delta = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => b.saturating_sub(a).to_string(),
        _ => "-".to_owned(),
    };
    let _ = writeln!(
        r,
        "| kernel, kill → all served: listen queue overflows / SYN retransmits (whole machine) | {} / {} |",
        delta(tcp_at_kill.0, tcp_at_end.0),
        delta(tcp_at_kill.1, tcp_at_end.1)
    );
    let _ = writeln!(r);

    // Per survivor.
    let _ = writeln!(
        r,
        "| kas | admitted after the kill | peak admitted in one second | shed | admitted per second after the kill | CPU during the storm (% of one core) | CPU at rest before (% of one core) |\n| --- | --- | --- | --- | --- | --- | --- |"
    );
    for (i, _) in sim.kas.iter().enumerate().filter(|(i, _)| *i != VICTIM) {
        let mine: Vec<_> = after_kill.iter().filter(|a| a.kas == i).collect();
        let mut per_second: BTreeMap<u64, usize> = BTreeMap::new();
        for a in mine.iter().filter(|a| a.outcome == Outcome::Admitted) {
            *per_second.entry(a.at.duration_since(kill_at).as_secs()).or_insert(0) += 1;
        }
        let last = per_second.keys().max().copied().unwrap_or(0);
        let timeline: Vec<String> = (0..=last).map(|s| per_second.get(&s).copied().unwrap_or(0).to_string()).collect();
        let cpu = |a: &[u64], b: &[u64], secs: f64| b[i].saturating_sub(a[i]) as f64 / ticks / secs.max(0.001) * 100.0;
        let _ = writeln!(
            r,
            "| kas-{i} | {} | {} | {} | {} | {:.0} | {:.0} |",
            mine.iter().filter(|a| a.outcome == Outcome::Admitted).count(),
            per_second.values().max().copied().unwrap_or(0),
            mine.iter().filter(|a| a.outcome == Outcome::Shed).count(),
            timeline.join(", "),
            cpu(&cpu_kill, &cpu_storm_end, storm),
            cpu(&cpu_settle, &cpu_kill, settle),
        );
    }
    let sim_cpu = |a: u64, b: u64, secs: f64| b.saturating_sub(a) as f64 / ticks / secs.max(0.001) * 100.0;
    let _ = writeln!(
        r,
        "\nThe simulator itself (all agents, the callers, the probes): {:.0}% of one core at rest, {:.0}% during the storm.\n",
        sim_cpu(sim_cpu_settle, sim_cpu_kill, settle),
        sim_cpu(sim_cpu_kill, sim_cpu_storm_end, storm),
    );

    // What the survivors say about the storm (their /metrics at the kill and at the end).
    let _ = writeln!(
        r,
        "| kas (its /metrics, kill → all served) | admissions: admitted / shed | Kubernetes API requests routed, by outcome | routing time p50 / p99 (histogram bucket bounds, s) | forwards to other kas that failed, by reason |\n| --- | --- | --- | --- | --- |"
    );
    for (n, &i) in survivors.iter().enumerate() {
        let d = |series: &str| {
            metrics_at_end[n].get(series).copied().unwrap_or(0.0)
                - metrics_at_kill[n].get(series).copied().unwrap_or(0.0)
        };
        let by_label = |prefix: &str| -> String {
            let mut parts: Vec<String> = metrics_at_end[n]
                .keys()
                .filter(|k| k.starts_with(prefix))
                .filter_map(|k| {
                    let v = d(k);
                    let label = k.rsplit_once("=\"")?.1.trim_end_matches("\"}");
                    (v > 0.0).then(|| format!("{label} {v:.0}"))
                })
                .collect();
            parts.sort();
            if parts.is_empty() { "none".into() } else { parts.join(", ") }
        };
        let admissions = format!(
            "{:.0} / {:.0}",
            d("kas_agent_connection_admissions_total{outcome=\"admitted\"}"),
            d("kas_agent_connection_admissions_total{outcome=\"shed\"}")
        );
        let quantiles = histogram_quantiles(
            &metrics_at_kill[n],
            &metrics_at_end[n],
            "kas_route_duration_seconds_bucket{method=\"kubernetes_api\"",
            &[0.5, 0.99],
        );
        let _ = writeln!(
            r,
            "| kas-{i} | {admissions} | {} | {} | {} |",
            by_label("kas_routed_requests_total{method=\"kubernetes_api\",outcome="),
            quantiles
                .iter()
                .map(|q| q.as_ref().map_or_else(|| "-".to_owned(), |b| format!("≤ {b}")))
                .collect::<Vec<_>>()
                .join(" / "),
            by_label("kas_peer_forward_errors_total{reason="),
        );
    }
    let _ = writeln!(r);

    // Redis.
    let samples = redis_samples.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let window = |from: Instant, to: Instant| -> Vec<RedisSample> {
        samples.iter().filter(|s| s.at >= from && s.at <= to).copied().collect()
    };
    let stats = |w: &[RedisSample]| -> (f64, f64, f64, f64) {
        let (Some(first), Some(last)) = (w.first(), w.last()) else { return (0.0, 0.0, 0.0, 0.0) };
        let secs = (last.server_time - first.server_time).max(0.001);
        let mean_cmds = (last.commands - first.commands) / secs;
        let mean_cpu = (last.cpu_seconds - first.cpu_seconds) / secs * 100.0;
        let (mut peak_cmds, mut peak_cpu) = (0.0f64, 0.0f64);
        for pair in w.windows(2) {
            let dt = (pair[1].server_time - pair[0].server_time).max(0.001);
            peak_cmds = peak_cmds.max((pair[1].commands - pair[0].commands) / dt);
            peak_cpu = peak_cpu.max((pair[1].cpu_seconds - pair[0].cpu_seconds) / dt * 100.0);
        }
        (mean_cmds, peak_cmds, mean_cpu, peak_cpu)
    };
    let rest = stats(&window(settle_start, kill_at));
    let during = stats(&window(kill_at, storm_end + SAMPLE_EVERY));
    let _ = writeln!(
        r,
        "| Redis (INFO every 200 ms; the sampling adds 5 commands/s) | at rest before the kill | kill → all served |\n| --- | --- | --- |"
    );
    let _ = writeln!(r, "| commands/s, mean | {:.0} | {:.0} |", rest.0, during.0);
    let _ = writeln!(r, "| commands/s, highest 200 ms interval | {:.0} | {:.0} |", rest.1, during.1);
    let _ = writeln!(r, "| CPU, % of one core, mean | {:.1} | {:.1} |", rest.2, during.2);
    let _ = writeln!(r, "| CPU, % of one core, highest 200 ms interval | {:.1} | {:.1} |", rest.3, during.3);
    let _ = writeln!(r);

    // The killed kas's registry entries.
    let _ = writeln!(r, "| the killed kas in the registry | value |\n| --- | --- |");
    let _ = writeln!(
        r,
        "| its heartbeat key's remaining TTL at the kill (ms) | {} |",
        match heartbeat_ttl_at_kill {
            Some(ms) if ms >= 0 => ms.to_string(),
            Some(_) => "no key".into(),
            None => "not read (the simulator's Redis call timed out)".into(),
        }
    );
    let _ = writeln!(
        r,
        "| its heartbeat key gone after (s; from then on readers ignore its records) | {} |",
        heartbeat_gone.map_or_else(|| "still there".to_owned(), seconds)
    );
    let _ = writeln!(
        r,
        "| its connection records still in Redis at the end | {} (expiring in {} s; GC of the survivors that rewrote the agent's hash, or a reader, deletes them after that) |",
        dead_records.0,
        dead_records.1.map_or_else(|| "-".to_owned(), |d| format!("{:.0}", d.as_secs_f64()))
    );
    let _ = writeln!(r);

    // Requests.
    if args.rate > 0.0 {
        let before = load::summarize(&load.between(settle_start, kill_at));
        let during = load::summarize(&load.between(kill_at, storm_end));
        let after = load::summarize(&load.between(storm_end, after_end));
        let _ = writeln!(
            r,
            "Requests at {} per second over random agents through random live kas (`GET /api/v1/agents/<id>/kubernetes/...`, a 200 with a small JSON body from the agent's tunnel); the storm's include requests for moved agents sent before they were back (the router waits for them, `routing.max_wait`). {requests_served_in_storm} requests answered by agents from the kill until the end. Requests sent to the killed kas that failed (in flight on it when it died): {}.\n",
            args.rate,
            load.failed_on(VICTIM),
        );
        let _ = writeln!(r, "{REQUESTS_HEADER}");
        let _ = writeln!(r, "{}", requests_line("at rest before the kill", &before, settle));
        let _ = writeln!(r, "{}", requests_line("kill → all served", &during, storm));
        let _ = writeln!(r, "{}\n", requests_line("after", &after, AFTER.as_secs_f64()));
    }
    let _ = sim_kas_rss(&sim, &mut r);
    Ok(r)
}

/// RSS of each kas at the end (the survivors hold the moved agents now).
fn sim_kas_rss(sim: &crate::Sim, r: &mut String) -> std::fmt::Result {
    let list: Vec<String> = sim
        .kas
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != VICTIM)
        .map(|(i, k)| format!("kas-{i} {:.0} MiB", kas_sample(k.pid()).rss_kib as f64 / 1024.0))
        .collect();
    writeln!(r, "Survivors' RSS at the end: {}.\n", list.join(", "))
}

/// Connection records in Redis naming `instance`, and how long until the first of them expires.
async fn records_of(conn: &mut redis::aio::MultiplexedConnection, instance: &str) -> (usize, Option<Duration>) {
    let keys: Vec<String> =
        redis::cmd("KEYS").arg(format!("{KEY_PREFIX}:agent:*")).query_async(conn).await.unwrap_or_default();
    let mut pipe = redis::pipe();
    for k in &keys {
        pipe.hgetall(k);
    }
    let hashes: Vec<HashMap<String, Vec<u8>>> = pipe.query_async(conn).await.unwrap_or_default();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default();
    let mut count = 0;
    let mut first_expiry: Option<i64> = None;
    for value in hashes.iter().flat_map(HashMap::values) {
        let Ok(expiring) = ExpiringValue::decode(value.as_slice()) else { continue };
        let Ok(info) = ConnectedAgentInfo::decode(expiring.value) else { continue };
        if info.kas_instance_id == instance {
            count += 1;
            first_expiry =
                Some(first_expiry.map_or(expiring.expires_at_unix_ms, |e| e.min(expiring.expires_at_unix_ms)));
        }
    }
    (count, first_expiry.map(|e| Duration::from_millis(u64::try_from(e - now_ms).unwrap_or(0))))
}

/// A kas's `/metrics` as series (name with labels, as written) → value.
async fn scrape(client: &reqwest::Client, address: &str) -> HashMap<String, f64> {
    let Ok(response) = client.get(format!("http://{address}/metrics")).send().await else { return HashMap::new() };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(series, value)| value.parse::<f64>().ok().map(|v| (series.to_owned(), v)))
        .collect()
}

/// The upper bounds of the buckets holding the quantiles `qs` of the observations a histogram got
/// between two scrapes (`prefix`: the bucket series up to its `le` label, e.g.
/// `name_bucket{method="x"`).
fn histogram_quantiles(
    before: &HashMap<String, f64>,
    after: &HashMap<String, f64>,
    prefix: &str,
    qs: &[f64],
) -> Vec<Option<String>> {
    let mut buckets: Vec<(f64, String, f64)> = after
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .filter_map(|(k, v)| {
            let le = k.rsplit_once("le=\"")?.1.trim_end_matches("\"}").to_owned();
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((bound, le, v - before.get(k).copied().unwrap_or(0.0)))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.2);
    qs.iter()
        .map(|q| {
            if total <= 0.0 {
                return None;
            }
            buckets.iter().find(|b| b.2 >= q * total).map(|b| b.1.clone())
        })
        .collect()
}
