//! Benchmarks of the agent against real Valkey; prints Markdown for `docs/benchmarks.md`.
//!
//! `bench [probes|footprint|labels|api|handover|sentinel|all]` — run through `scripts/bench.sh`,
//! which builds the release binary and regenerates the report. Needs `VALKEY_SIDECAR_BIN` (the
//! agent; not for `sentinel`) and a valkey-server (see `scripts/valkey-bin.sh`); `labels`, `api`
//! and `handover` also need the Kubernetes binaries and helm (`scripts/k8s-bins.sh`,
//! `scripts/helm-bin.sh`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use valkey_sidecar_testkit::k8s::audit::{AuditLog, Usage, pod_identity};
use valkey_sidecar_testkit::k8s::writer::{Writer, lost, tag_for};
use valkey_sidecar_testkit::k8s::{ROLE_LABEL, Stage, StageOptions, poll_until};
use valkey_sidecar_testkit::sentinel::{SentinelOptions, Sentinels, UnplannedFailover};
use valkey_sidecar_testkit::{
    ClusterOptions, ReplicationSet, ServerOptions, Sidecar, SidecarOptions, ValkeyCluster,
    ValkeyServer, http_get, redis,
};

mod failover;

fn main() -> Result<()> {
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    if what == "sentinel" {
        // The baseline runs no agent, so it needs no VALKEY_SIDECAR_BIN.
        return sentinel_baseline();
    }
    let bin = PathBuf::from(
        std::env::var("VALKEY_SIDECAR_BIN")
            .context("set VALKEY_SIDECAR_BIN to the release agent binary")?,
    );
    let all = what == "all";
    if what == "probes" || all {
        probes(&bin)?;
    }
    if what == "footprint" || all {
        footprint(&bin)?;
    }
    if what == "labels" || all {
        runtime()?.block_on(labels(&bin, env_count("BENCH_FLIPS", 50)))?;
    }
    if what == "api" || all {
        runtime()?.block_on(api(&bin))?;
    }
    if what == "handover" || all {
        runtime()?.block_on(handovers(&bin, env_count("BENCH_HANDOVERS", 20)))?;
    }
    if what == "failover" || all {
        runtime()?.block_on(failovers(&bin, env_count("BENCH_FAILOVERS", 20)))?;
    }
    if all {
        sentinel_baseline()?;
    }
    Ok(())
}

/// Replication mode, unplanned: the agent's failover after kill -9 of the primary's Valkey.
async fn failovers(bin: &Path, runs: usize) -> Result<()> {
    let stage = failover::stage(bin).await?;
    let mut results = Vec::new();
    for i in 0..runs {
        let r = failover::run(&stage).await?;
        eprintln!(
            "failover {i}: writable {:?}, labelled {:?}, lost {}",
            r.writable, r.labelled, r.lost
        );
        results.push(r);
    }
    println!("## Unplanned failover: the agent (replication mode)\n");
    println!(
        "kill -9 of the primary's Valkey (its agent stays, the kubelet restarts Valkey empty), one shard of 3 pods on the local control plane, lease 15 s / renew 10 s / retry 2 s, poll 250 ms, `repl-diskless-sync-delay 2`; a writer on all pods. Command: `BENCH_FAILOVERS={runs} target/release/bench failover`.\n"
    );
    println!("| config | measure | runs | p50 | p99 | max |\n|---|---|---|---|---|---|");
    let pick = |f: fn(&failover::Run) -> Duration| results.iter().map(f).collect::<Vec<_>>();
    println!(
        "{}",
        duration_row(
            "agent",
            "kill -9 → a replica accepts writes (ms)",
            pick(|r| r.writable)
        )
    );
    println!(
        "{}",
        duration_row(
            "agent",
            "… and carries the primary label (ms)",
            pick(|r| r.labelled)
        )
    );
    println!(
        "{}",
        count_row(
            "agent",
            "acknowledged writes lost",
            results.iter().map(|r| r.lost).collect()
        )
    );
    println!();
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// A count from the environment, else `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Role-label convergence over `flips` coordinated failovers on the real control plane: from the
/// moment Valkey reports the new role (ROLE polled every millisecond) to the label arriving
/// through a watch, for the promoted and the demoted pod, and the label writes per flip.
async fn labels(bin: &Path, flips: usize) -> Result<()> {
    use valkey_sidecar_testkit::k8s::RoleWatch;
    use valkey_sidecar_testkit::k8s::valkey::cmd;
    const WRITES: &str = "valkey_sidecar_label_writes_total{result=\"ok\"}";
    let mut opts = StageOptions::default();
    opts.kubelet = opts.kubelet.sidecar_bin(bin);
    opts.template.sidecar_env = vec![("SIDECAR_COORDINATOR".into(), "false".into())];
    let stage = Stage::start(opts).await?;
    let (seen, task) = RoleWatch::start(stage.api(), ROLE_LABEL);
    let (mut up, mut down, mut writes) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..flips {
        let (primary, replica) = stage.primary_and_replica(0)?;
        tokio::time::sleep(Duration::from_millis(700)).await; // let the previous flip settle
        let before = stage.agent_counter(&primary, WRITES).await?
            + stage.agent_counter(&replica, WRITES).await?;
        cmd(stage.valkey(&replica)?, &["CLUSTER", "FAILOVER"])?;
        let mut flipped = Instant::now();
        while stage.role(&replica).as_deref() != Some("master") {
            tokio::time::sleep(Duration::from_millis(1)).await;
            flipped = Instant::now();
        }
        up.push(
            seen.wait(&replica, Some("primary"), flipped, Duration::from_secs(10))
                .await?
                .saturating_duration_since(flipped),
        );
        down.push(
            seen.wait(&primary, Some("replica"), flipped, Duration::from_secs(10))
                .await?
                .saturating_duration_since(flipped),
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
        writes.push(
            stage.agent_counter(&primary, WRITES).await?
                + stage.agent_counter(&replica, WRITES).await?
                - before,
        );
    }
    task.abort();
    up.sort();
    down.sort();
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1000.0);
    let row = |label: &str, v: &[Duration]| {
        format!(
            "| {label} | {} | {} | {} | {} |",
            v.len(),
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99)),
            ms(*v.last().unwrap_or(&Duration::ZERO))
        )
    };
    println!(
        "### Role-label convergence after `CLUSTER FAILOVER` (real kube-apiserver v1.37.2, poll 250 ms)\n"
    );
    println!(
        "From Valkey reporting the new role (`ROLE` polled every 1 ms) to the label arriving through a watch.\n"
    );
    println!("| pod | flips | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    println!("{}", row("promoted (label → primary)", &up));
    println!("{}", row("demoted (label → replica)", &down));
    let rss: Vec<String> = stage
        .pods
        .iter()
        .filter_map(|p| stage.kubelet.container_pid(&stage.namespace, p, "sidecar"))
        .filter_map(|pid| proc_stats(pid).ok())
        .map(|(kib, _)| format!("{:.1}", kib as f64 / 1024.0))
        .collect();
    println!(
        "Agent RSS (MiB) in this stage, labeler and its pod watch running, after the flips: {}.\n",
        rss.join(", ")
    );
    let total: u64 = writes.iter().sum();
    println!(
        "\nLabel writes (server-side applies) per flip, both pods together: {:.2} on average over {} flips (min {}, max {}); the target is 2, one per pod whose role changed.\n",
        total as f64 / writes.len().max(1) as f64,
        writes.len(),
        writes.iter().min().unwrap_or(&0),
        writes.iter().max().unwrap_or(&0)
    );
    Ok(())
}

/// Open-loop probe load: one request every `1/rate` seconds, each on a new connection (as kubelet
/// does), latency measured from the scheduled send time so a stalled server cannot hide queueing.
fn load(
    addr: std::net::SocketAddr,
    rate: u32,
    duration: Duration,
    paths: &[&str],
) -> Vec<(Duration, u16)> {
    let workers = 4;
    let interval = Duration::from_secs(1) / rate;
    let start = Instant::now() + Duration::from_millis(20);
    let total = (duration.as_secs_f64() * f64::from(rate)) as u32;
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let mut i = w;
                while i < total {
                    let due = start + interval * i;
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let code =
                        http_get(addr, &paths[i as usize % paths.len()]).map_or(0, |(c, _)| c);
                    out.push((due.elapsed(), code));
                    i += workers;
                }
                out
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap_or_default())
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn summarize(label: &str, samples: &[(Duration, u16)]) -> String {
    let mut lat: Vec<Duration> = samples.iter().map(|(d, _)| *d).collect();
    lat.sort();
    let errors = samples.iter().filter(|(_, c)| *c == 0).count();
    let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1000.0);
    format!(
        "| {label} | {} | {} | {} | {} | {} | {errors} |",
        samples.len(),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(percentile(&lat, 0.999)),
        ms(*lat.last().unwrap_or(&Duration::ZERO)),
    )
}

fn probes(bin: &PathBuf) -> Result<()> {
    let server = ValkeyServer::start(ServerOptions::default())?;
    let agent = Sidecar::start(SidecarOptions::new(bin, server.addr(), "replication"))?;
    agent.wait_code("/readyz", 200, Duration::from_secs(5))?;
    let paths = ["/livez", "/readyz", "/startupz", "/status"];
    let idle = load(agent.probe_addr(), 1000, Duration::from_secs(4), &paths);
    let addr = server.addr();
    let sleeper = std::thread::spawn(move || -> Result<()> {
        let mut c = redis::Client::open(format!("redis://{addr}"))?.get_connection()?;
        redis::cmd("DEBUG").arg("SLEEP").arg(5).exec(&mut c)?;
        Ok(())
    });
    std::thread::sleep(Duration::from_millis(100));
    let blocked = load(agent.probe_addr(), 1000, Duration::from_secs(4), &paths);
    sleeper
        .join()
        .map_err(|_| anyhow::anyhow!("sleeper panicked"))??;
    println!(
        "### Probe latency (1000 requests/s, new TCP connection each, `/livez` `/readyz` `/startupz` `/status` in turn)\n"
    );
    println!("| Valkey | requests | p50 ms | p99 ms | p99.9 ms | max ms | failed |");
    println!("|---|---|---|---|---|---|---|");
    println!("{}", summarize("answering", &idle));
    println!("{}", summarize("blocked in `DEBUG SLEEP 5`", &blocked));
    println!(
        "\nLatency is measured from each request's scheduled send time (open loop), client on the same 2-core machine.\n"
    );
    Ok(())
}

/// RSS (KiB) and cumulative CPU ticks of a process, from /proc.
fn proc_stats(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .context("stat")?;
    let ticks = fields
        .get(11)
        .and_then(|u| u.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
    Ok((rss, ticks))
}

fn footprint(bin: &PathBuf) -> Result<()> {
    let cluster = ValkeyCluster::start(3, 1, ClusterOptions::default())?;
    let agents: Vec<Sidecar> = cluster
        .nodes()
        .iter()
        .map(|n| Sidecar::start(SidecarOptions::new(bin, n.addr(), "cluster")))
        .collect::<Result<_>>()?;
    for a in &agents {
        a.wait_code("/readyz", 200, Duration::from_secs(10))?;
    }
    std::thread::sleep(Duration::from_secs(2));
    let window = Duration::from_secs(30);
    let before: Vec<_> = agents
        .iter()
        .map(|a| proc_stats(a.pid()))
        .collect::<Result<_>>()?;
    let valkey_before = proc_stats(cluster.nodes()[0].pid())?;
    std::thread::sleep(window);
    let after: Vec<_> = agents
        .iter()
        .map(|a| proc_stats(a.pid()))
        .collect::<Result<_>>()?;
    let valkey_after = proc_stats(cluster.nodes()[0].pid())?;
    let hz = 100.0;
    let cpu = |b: u64, a: u64| (a - b) as f64 / hz / window.as_secs_f64() * 100.0;
    let size = std::fs::metadata(bin)?.len();
    println!(
        "### Footprint at idle beside a 3-shard × 1-replica cluster (poll 250 ms, {}s window)\n",
        window.as_secs()
    );
    println!("| process | RSS MiB | CPU % of one core |");
    println!("|---|---|---|");
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        println!(
            "| valkey-sidecar #{i} | {:.1} | {:.2} |",
            a.0 as f64 / 1024.0,
            cpu(b.1, a.1)
        );
    }
    println!(
        "| valkey-server (a primary, for scale) | {:.1} | {:.2} |",
        valkey_after.0 as f64 / 1024.0,
        cpu(valkey_before.1, valkey_after.1)
    );
    println!(
        "\nRelease binary (`target/release/valkey-sidecar`, glibc, stripped, LTO, opt-level s): {:.2} MiB ({size} bytes).\n",
        size as f64 / 1048576.0
    );
    Ok(())
}

/// A stage whose agents run the coordinator (`SIDECAR_CLUSTER_NAME` set, plus `env`); returns it
/// and the Lease holder once some agent holds the Lease and every pod carries its role label.
async fn coordinated_stage(
    bin: &Path,
    env: &[(&str, &str)],
    audit: bool,
) -> Result<(Stage, String)> {
    let mut opts = StageOptions::default();
    opts.kubelet = opts.kubelet.sidecar_bin(bin);
    opts.plane.audit = audit;
    let env = [("SIDECAR_CLUSTER_NAME", "valkey")].iter().chain(env);
    opts.template.sidecar_env = env.map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let stage = Stage::start(opts).await?;
    let poll = Duration::from_millis(100);
    poll_until(
        "a coordinator holds the lease",
        Duration::from_secs(30),
        poll,
        || async { Ok(holder(&stage).await?.is_some()) },
    )
    .await?;
    poll_until(
        "every pod labelled",
        Duration::from_secs(30),
        poll,
        || async {
            for p in &stage.pods {
                if !stage.labels(p).await?.contains_key(ROLE_LABEL) {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await?;
    let leader = holder(&stage).await?.context("the lease lost its holder")?;
    Ok((stage, leader))
}

/// The coordinator Lease's holder now.
async fn holder(stage: &Stage) -> Result<Option<String>> {
    let leases: kube::Api<Lease> = kube::Api::namespaced(stage.plane.client(), &stage.namespace);
    let lease = leases.get_opt("valkey-coordinator").await?;
    Ok(lease
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// The requests the apiserver received from `from` until `from + window` (sleeps until then).
async fn usage_until(log: &AuditLog, from: SystemTime, window: Duration) -> Result<Usage> {
    let left = (from + window)
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(left).await;
    // Each request is logged as it completes: give the last ones time to reach the file.
    tokio::time::sleep(Duration::from_secs(1)).await;
    log.usage(from, from + window)
}

/// API requests per agent per minute by verb, from the apiserver's audit log: a steady-state
/// window, then a window from the cordon of a primary's node (the coordinator hands over).
async fn api(bin: &Path) -> Result<()> {
    const STEADY: Duration = Duration::from_secs(60);
    const HANDOVER: Duration = Duration::from_secs(30);
    let (stage, leader) = coordinated_stage(bin, &[], true).await?;
    let log = stage.plane.audit_log().context("the audit log is off")?;
    // The agents' start-up requests (lists, label writes) are behind them.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let steady = usage_until(&log, SystemTime::now(), STEADY).await?;
    let (primary, replica) = stage.primary_and_replica(1)?;
    let node = stage.node_of(&primary).await?;
    let cordoned = SystemTime::now();
    cordon(&stage, &node, true).await?;
    let moving = usage_until(&log, cordoned, HANDOVER).await?;
    cordon(&stage, &node, false).await?;
    if holder(&stage).await?.as_deref() != Some(leader.as_str()) {
        bail!("the Lease changed hands during the measurement");
    }
    let agents = |moved: bool| -> Vec<(String, String)> {
        let role = |p: &String| {
            let base = if *p == leader { "leader" } else { "follower" };
            match p {
                p if moved && *p == primary => format!("{base}, old primary"),
                p if moved && *p == replica => format!("{base}, new primary"),
                _ => base.to_owned(),
            }
        };
        let who = |p: &String| pod_identity(&stage.namespace, p);
        stage
            .pods
            .iter()
            .map(|p| (format!("{p} ({})", role(p)), who(p)))
            .collect()
    };
    println!("### API requests per agent (real kube-apiserver v1.37.2, from its audit log)\n");
    println!(
        "Requests per minute by verb, 3 shards × 2 members, coordinator on with the default Lease timings (retry period 2 s). Agents are told apart by the pod their bound ServiceAccount token names (`user.extra[\"authentication.kubernetes.io/pod-name\"]` of each audit event); they also send `User-Agent: valkey-sidecar/<version>`. Command: `target/release/bench api`.\n"
    );
    println!("#### Steady state ({} s window)\n", STEADY.as_secs());
    println!("{}", steady.verb_table(&agents(false)));
    let followers = stage.pods.iter().filter(|p| **p != leader);
    let follower_writes = followers
        .map(|p| steady.writes(&pod_identity(&stage.namespace, p)))
        .max()
        .unwrap_or(0);
    let me = pod_identity(&stage.namespace, &leader);
    println!(
        "Writes per minute: leader {:.1}, of which Lease renewals (`update leases`) {:.1}; followers at most {:.1}. The whole apiserver served {:.0} requests per minute in the window (the harness kubelet, node heartbeats, scheduler and controller-manager included).\n",
        steady.per_minute(steady.writes(&me)),
        steady.per_minute(steady.get(&me, "update", "leases")),
        steady.per_minute(follower_writes),
        steady.per_minute(all_requests(&steady)),
    );
    println!(
        "#### During a hand-over ({} s window from cordoning the node of a primary)\n",
        HANDOVER.as_secs()
    );
    println!("{}", moving.verb_table(&agents(true)));
    println!("By resource, requests in the window:\n");
    println!("{}", moving.detail_table(&agents(true)));
    Ok(())
}

fn all_requests(usage: &Usage) -> u64 {
    usage.by_client.values().flat_map(|c| c.values()).sum()
}

/// What one hand-over looked like.
struct Handover {
    /// The writer's longest pause between two acknowledged writes.
    pause: Duration,
    /// From the cordon to the old primary answering `ROLE` as a replica.
    demoted: Duration,
    acked: usize,
    lost: usize,
    /// The coordinator counted the move as succeeded.
    succeeded: bool,
}

/// `runs` hand-overs on one stage: each cordons the node of a shard's primary (shards in turn)
/// with a writer on that shard, waits for the old primary to be demoted, then uncordons and
/// lets the shard settle. Balance is off so that nothing else moves between runs.
async fn handovers(bin: &Path, runs: usize) -> Result<()> {
    let (stage, leader) = coordinated_stage(bin, &[("SIDECAR_BALANCE", "false")], false).await?;
    let mut results = Vec::new();
    for i in 0..runs {
        let r = handover(&stage, i % 3).await?;
        eprintln!(
            "hand-over {}/{runs}: pause {:?}, demoted after {:?}, {} acked, {} lost",
            i + 1,
            r.pause,
            r.demoted,
            r.acked,
            r.lost
        );
        results.push(r);
    }
    let mut pauses: Vec<Duration> = results.iter().map(|r| r.pause).collect();
    let mut demoted: Vec<Duration> = results.iter().map(|r| r.demoted).collect();
    pauses.sort();
    demoted.sort();
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1000.0);
    let row = |label: &str, v: &[Duration]| {
        format!(
            "| {label} | {} | {} | {} | {} |",
            v.len(),
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99)),
            ms(*v.last().unwrap_or(&Duration::ZERO))
        )
    };
    println!(
        "### Hand-over when a primary's node is cordoned (real kube-apiserver v1.37.2, {runs} hand-overs)\n"
    );
    println!(
        "Command: `BENCH_HANDOVERS={runs} target/release/bench handover`. One coordinated stage (3 shards × 2 members, Lease holder {leader}, `SIDECAR_BALANCE=false`); each run starts a writer (one `SET` at a time, unique keys) on the next shard, cordons the node of its primary, waits until the old primary is a replica, stops the writer a second later, reads every acknowledged key back from the new primary, uncordons and waits for the shard to settle. The pause is the longest gap between two acknowledged writes in the run, as the client sees it (target: p99 ≤ 250 ms). With {runs} runs p99 is the maximum.\n"
    );
    println!("| measure | hand-overs | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    println!("{}", row("longest write pause", &pauses));
    println!("{}", row("cordon → old primary demoted", &demoted));
    let acked: usize = results.iter().map(|r| r.acked).sum();
    let lost: usize = results.iter().map(|r| r.lost).sum();
    let succeeded = results.iter().filter(|r| r.succeeded).count();
    println!(
        "\nAcknowledged writes: {acked}, lost: {lost}. Hand-overs the coordinator counted as succeeded: {succeeded} of {runs}.\n"
    );
    Ok(())
}

/// One hand-over of `shard`'s primary by cordoning its node.
async fn handover(stage: &Stage, shard: usize) -> Result<Handover> {
    let (primary, replica) = stage.primary_and_replica(shard)?;
    let (paddr, raddr) = (stage.valkey(&primary)?, stage.valkey(&replica)?);
    let before = handovers_ok(stage).await?;
    let writer = Writer::start(vec![paddr, raddr], tag_for(paddr)?);
    let tag = writer.tag.clone();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let node = stage.node_of(&primary).await?;
    let cordoned = Instant::now();
    cordon(stage, &node, true).await?;
    poll_until(
        "the old primary is demoted",
        Duration::from_secs(20),
        Duration::from_millis(5),
        || async { Ok(stage.role(&primary).as_deref() == Some("slave")) },
    )
    .await?;
    let demoted = cordoned.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = writer.stop()?;
    let missing = lost(raddr, &tag, &written.acked)?;
    cordon(stage, &node, false).await?;
    let succeeded = settle(stage, &primary, before).await?;
    Ok(Handover {
        pause: written.longest_pause,
        demoted,
        acked: written.acked.len(),
        lost: missing,
        succeeded,
    })
}

/// Marks the node (un)schedulable, as `kubectl cordon` does, with one API call (timed from here).
async fn cordon(stage: &Stage, node: &str, on: bool) -> Result<()> {
    let nodes: kube::Api<Node> = kube::Api::all(stage.plane.client());
    let patch = serde_json::json!({ "spec": { "unschedulable": on } });
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Successful hand-overs as the agents count them (only a leader counts; the sum survives a
/// change of leader).
async fn handovers_ok(stage: &Stage) -> Result<u64> {
    const OK: &str = "valkey_sidecar_coordinator_actions_total{kind=\"Handover\",result=\"ok\"}";
    let mut n = 0;
    for p in &stage.pods {
        n += stage.agent_counter(p, OK).await?;
    }
    Ok(n)
}

/// Waits until the coordinator counts one more successful hand-over than `before` (so the next run
/// does not meet this one's move) and the old primary's pod is Ready again (a synced replica, a
/// candidate for the next hand-over of its shard); whether the count went up.
async fn settle(stage: &Stage, old_primary: &str, before: u64) -> Result<bool> {
    let counted = poll_until(
        "the coordinator counts the hand-over",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async { Ok(handovers_ok(stage).await? > before) },
    )
    .await
    .is_ok();
    stage
        .kubelet
        .wait_ready(&stage.namespace, old_primary, Duration::from_secs(30))
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(counted)
}

/// `bench sentinel`: the unplanned-failover baseline. Sentinel as commonly tuned for speed
/// (`BENCH_SENTINEL_RUNS` runs, default 20) and with its defaults (`BENCH_SENTINEL_DEFAULT_RUNS`,
/// default 3: each run waits the 30 s `down-after-milliseconds`); 0 runs skips a configuration.
fn sentinel_baseline() -> Result<()> {
    let fast_runs = env_count("BENCH_SENTINEL_RUNS", 20);
    let default_runs = env_count("BENCH_SENTINEL_DEFAULT_RUNS", 3);
    // A 1 s detection with the 180 s default failover-timeout would retry a split vote only after
    // 6 minutes; tuned deployments lower both.
    let fast = SentinelOptions::default()
        .down_after(Duration::from_millis(1000))
        .failover_timeout(Duration::from_millis(10_000));
    let mut measured = Vec::new();
    let mut version = String::new();
    for (opts, runs) in [
        (fast, fast_runs),
        (SentinelOptions::default(), default_runs),
    ] {
        if runs > 0 {
            let (v, results) = sentinel_runs(&opts, runs)?;
            version = v;
            measured.push((opts, results));
        }
    }
    print_sentinel_baseline(&version, fast_runs, default_runs, &measured);
    Ok(())
}

/// `runs` unplanned failovers of one primary + 2 replicas under 3 sentinels configured by `opts`;
/// also the Valkey version measured.
fn sentinel_runs(opts: &SentinelOptions, runs: usize) -> Result<(String, Vec<UnplannedFailover>)> {
    let set = ReplicationSet::start(2, ServerOptions::default())?;
    let version = set.primary().info_field("server", "valkey_version")?;
    let sentinels = Sentinels::monitor(&set, opts.clone())?;
    let mut results = Vec::new();
    for i in 0..runs {
        let r = sentinels
            .unplanned_failover(&set, opts.failover_budget())
            .with_context(|| format!("failover {}/{runs} ({})", i + 1, sentinel_config(opts)))?;
        eprintln!(
            "sentinel failover {}/{runs} ({}): writable after {:?}, sentinels agree after {:?}, {:?}, {} acked, {} lost",
            i + 1,
            sentinel_config(opts),
            r.writable_after,
            r.agreed_after,
            r.events,
            r.acked,
            r.lost
        );
        results.push(r);
    }
    Ok((version, results))
}

fn sentinel_config(opts: &SentinelOptions) -> String {
    format!(
        "`down-after-milliseconds {}`, `failover-timeout {}`, `parallel-syncs {}`",
        opts.down_after.as_millis(),
        opts.failover_timeout.as_millis(),
        opts.parallel_syncs
    )
}

fn print_sentinel_baseline(
    version: &str,
    fast_runs: usize,
    default_runs: usize,
    measured: &[(SentinelOptions, Vec<UnplannedFailover>)],
) {
    println!(
        "### Unplanned failover under Sentinel (valkey-server {version} `--sentinel`, 3 sentinels, quorum 2, 1 primary + 2 replicas on loopback)\n"
    );
    println!(
        "Command: `BENCH_SENTINEL_RUNS={fast_runs} BENCH_SENTINEL_DEFAULT_RUNS={default_runs} target/release/bench sentinel` ({fast_runs} runs with `down-after-milliseconds 1000`, {default_runs} with Sentinel's defaults, where each run waits out the 30 s detection). Each run starts a writer (one `SET` at a time, unique keys, to whichever node accepts them), kills the primary with SIGKILL half a second later, and polls every surviving node with `SET` every 5 ms (`READONLY` counts as not yet) until one accepts: that is *fault → new primary accepts writes*. The writer goes on until the sentinels have settled (all monitor the same primary, no failover in progress, nothing flagged down, unchanged for 3 s), then every acknowledged key is read back from that primary; the killed node is then restarted empty as a replica of that primary, and the next run starts when all sentinels see every replica synced. The fast configuration also lowers `failover-timeout` to 10 s: with the default 180 s an aborted attempt is retried only after 6 minutes. On loopback a replica trails the primary by microseconds, so one clean failover after a SIGKILL loses next to nothing; across a network the writes in flight are at risk (asynchronous replication). With at most 50 runs p99 is the maximum.\n"
    );
    println!("| Sentinel config | measure | runs | p50 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    for (opts, results) in measured {
        let config = sentinel_config(opts);
        let writable = results.iter().map(|r| r.writable_after).collect();
        let agreed = results.iter().map(|r| r.agreed_after).collect();
        let lost = results.iter().map(|r| r.lost).collect();
        println!(
            "{}",
            duration_row(&config, "kill -9 → a replica accepts writes (ms)", writable)
        );
        println!(
            "{}",
            duration_row("", "kill -9 → every sentinel names it (ms)", agreed)
        );
        println!("{}", count_row("", "acknowledged writes lost", lost));
    }
    println!(
        "\nA second failover comes from Sentinel itself: a sentinel that switches to the new primary reconnects to it at most once a second (its link last tried the dead primary), so with `down-after-milliseconds` near 1 s it can flag the new primary down, and the other sentinels' \"primary down\" votes from the first failover still count toward the quorum: it fails over again, to a replica that lacks what the first new primary acknowledged. A run counts its failovers by the sentinels' `+switch-master` events, and its losses against the primary they settle on.\n"
    );
    for (opts, results) in measured {
        let acked: usize = results.iter().map(|r| r.acked).sum();
        let lost: usize = results.iter().map(|r| r.lost).sum();
        let again = results.iter().filter(|r| r.events.switches > 1).count();
        let retried = results.iter().filter(|r| r.events.aborts > 0).count();
        println!(
            "{}: {acked} acknowledged writes over {} runs, {lost} lost. Runs in which the sentinels failed over a second time before settling: {again}; runs with an aborted failover attempt (retried only after 2 × `failover-timeout`): {retried}.\n",
            sentinel_config(opts),
            results.len()
        );
    }
}

fn duration_row(config: &str, measure: &str, mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1000.0);
    format!(
        "| {config} | {measure} | {} | {} | {} | {} |",
        v.len(),
        ms(percentile(&v, 0.5)),
        ms(percentile(&v, 0.99)),
        ms(v.last().copied().unwrap_or_default())
    )
}

fn count_row(config: &str, measure: &str, mut v: Vec<usize>) -> String {
    v.sort_unstable();
    let at = |p: f64| {
        let idx = ((v.len().max(1) - 1) as f64 * p).round() as usize;
        v.get(idx).copied().unwrap_or_default()
    };
    format!(
        "| {config} | {measure} | {} | {} | {} | {} |",
        v.len(),
        at(0.5),
        at(0.99),
        v.last().copied().unwrap_or_default()
    )
}
