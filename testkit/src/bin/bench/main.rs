//! Benchmarks of the agent against real Valkey; prints Markdown for `docs/benchmarks.md`.
//!
//! `bench [probes|footprint|labels|api|handover|failover|switchover|sentinel|planner|all]` — run through `scripts/bench.sh`,
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
use report::percentile;
use valkey_sidecar_testkit::k8s::audit::{AuditLog, Usage, pod_identity};
use valkey_sidecar_testkit::k8s::writer::{Writer, lost, tag_for};
use valkey_sidecar_testkit::k8s::{ROLE_LABEL, Stage, StageOptions, poll_until};
use valkey_sidecar_testkit::sentinel::{SentinelOptions, Sentinels, UnplannedFailover};
use valkey_sidecar_testkit::{
    ClusterOptions, ReplicationSet, ServerOptions, Sidecar, SidecarOptions, ValkeyCluster,
    ValkeyServer, http_get, redis,
};

mod failover;
mod planner;
mod report;

fn main() -> Result<()> {
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    if what == "sentinel" {
        // The baseline runs no agent, so it needs no VALKEY_SIDECAR_BIN.
        return sentinel_baseline();
    }
    if what == "planner" {
        planner::run();
        return Ok(());
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
        runtime()?.block_on(failovers(&bin))?;
    }
    if what == "switchover" || all {
        runtime()?.block_on(switchovers(&bin, env_count("BENCH_SWITCHOVERS", 20)))?;
    }
    if all {
        planner::run();
    }
    Ok(())
}

/// Replication mode, unplanned, in one run: the agent after kill -9 of the primary's Valkey and
/// after its whole node is cut, then Sentinel (3 sentinels on the same binary) after kill -9 of
/// the primary with `down-after-milliseconds` 1000 and with its default; ratios against both.
async fn failovers(bin: &Path) -> Result<()> {
    let kills = env_count("BENCH_FAILOVERS", 20);
    let cuts = env_count("BENCH_POD_CUTS", 20);
    let killed = agent_runs(bin, &[], failover::Fault::KillValkey, kills).await?;
    let mut cut = Vec::new();
    for (lease, env) in &failover::SHORT_LEASES {
        let runs = agent_runs(bin, env, failover::Fault::CutNode, cuts).await?;
        cut.push((*lease, runs));
    }
    let (fast, default) = tokio::task::spawn_blocking(sentinel_both).await??;
    report::failover(&killed, &cut, &fast, &default);
    let measured = [
        (fast_sentinel(), fast),
        (SentinelOptions::default(), default),
    ];
    report::sentinel(&measured);
    Ok(())
}

async fn agent_runs(
    bin: &Path,
    env: &[(&str, &str)],
    fault: failover::Fault,
    runs: usize,
) -> Result<Vec<failover::Run>> {
    let stage = failover::stage(bin, env).await?;
    let mut results = Vec::new();
    for i in 0..runs {
        let r = failover::run(&stage, fault).await?;
        eprintln!(
            "agent failover {}/{runs}: writable {:?}, labelled {:?}, lost {}",
            i + 1,
            r.writable,
            r.labelled,
            r.lost
        );
        results.push(r);
    }
    Ok(results)
}

/// Planned moves in replication mode: the agents' switchover (node cordoned) against Valkey's
/// own `FAILOVER TO`, `runs` each.
async fn switchovers(bin: &Path, runs: usize) -> Result<()> {
    let stage = failover::stage(bin, &[]).await?;
    let mut ours = Vec::new();
    for i in 0..runs {
        let m = failover::switchover(&stage).await?;
        eprintln!(
            "switchover {}/{runs}: pause {:?}, {} lost",
            i + 1,
            m.pause,
            m.lost
        );
        ours.push(m);
    }
    drop(stage);
    let theirs = tokio::task::spawn_blocking(move || failover::failover_to_runs(runs)).await??;
    report::switchover(&ours, &theirs);
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
    let (fast, default) = sentinel_both()?;
    let measured = [
        (fast_sentinel(), fast),
        (SentinelOptions::default(), default),
    ];
    report::sentinel(&measured);
    Ok(())
}

/// Sentinel as commonly tuned for speed: a 1 s detection (with the 180 s default failover-timeout
/// a split vote would be retried only after 6 minutes; tuned deployments lower both).
fn fast_sentinel() -> SentinelOptions {
    SentinelOptions::default()
        .down_after(Duration::from_millis(1000))
        .failover_timeout(Duration::from_millis(10_000))
}

/// The runs of Sentinel tuned for speed (`BENCH_SENTINEL_RUNS`, default 20) and with its defaults
/// (`BENCH_SENTINEL_DEFAULT_RUNS`, default 20: each run waits the 30 s `down-after-milliseconds`).
fn sentinel_both() -> Result<(Vec<UnplannedFailover>, Vec<UnplannedFailover>)> {
    let fast = sentinel_runs(&fast_sentinel(), env_count("BENCH_SENTINEL_RUNS", 20))?;
    let default_runs = env_count("BENCH_SENTINEL_DEFAULT_RUNS", 20);
    let default = sentinel_runs(&SentinelOptions::default(), default_runs)?;
    Ok((fast, default))
}

/// `runs` unplanned failovers of one primary + 2 replicas under 3 sentinels configured by `opts`;
/// also the Valkey version measured.
fn sentinel_runs(opts: &SentinelOptions, runs: usize) -> Result<Vec<UnplannedFailover>> {
    if runs == 0 {
        return Ok(Vec::new());
    }
    let set = ReplicationSet::start(2, ServerOptions::default())?;
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
    Ok(results)
}

pub fn sentinel_config(opts: &SentinelOptions) -> String {
    format!(
        "`down-after-milliseconds {}`, `failover-timeout {}`, `parallel-syncs {}`",
        opts.down_after.as_millis(),
        opts.failover_timeout.as_millis(),
        opts.parallel_syncs
    )
}
