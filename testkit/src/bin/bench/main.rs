//! Benchmarks of the agent against real Valkey; prints Markdown for `docs/benchmarks.md` and
//! writes its plots (`$BENCH_PLOTS_DIR`, default `docs/plots`).
//!
//! `bench [probes|footprint|labels|api|handover|restart|failover|switchover|sentinel|planner|all]`
//! and `bench faults <log>` — run through `scripts/bench.sh`, which builds the release binary,
//! runs every section and the chaos tests, and regenerates the report. Needs
//! `VALKEY_SIDECAR_BIN` (the agent; not for `sentinel`, `planner`, `restart` or `faults`) and a
//! valkey-server (see `scripts/valkey-bin.sh`); `labels`, `api`, `handover`, `failover` and
//! `switchover` also need the Kubernetes binaries and helm (`scripts/k8s-bins.sh`,
//! `scripts/helm-bin.sh`). With `VALKEY_TESTKIT_FAULT_LOG` set, each configuration's runs are
//! also logged as rows of the fault table.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use report::percentile;
use valkey_sidecar_testkit::k8s::{Stage, StageOptions};
use valkey_sidecar_testkit::sentinel::{SentinelOptions, Sentinels, UnplannedFailover};
use valkey_sidecar_testkit::{
    ReplicationSet, ServerOptions, Sidecar, SidecarOptions, ValkeyServer, http_get, redis,
};

mod alone;
mod api;
mod failover;
mod faults;
mod footprint;
mod handover;
mod labels;
mod planner;
mod plot;
mod report;
mod restart;

/// The sections `bench` knows (`faults` takes a log path too).
const SECTIONS: [&str; 12] = [
    "probes",
    "footprint",
    "labels",
    "api",
    "handover",
    "restart",
    "failover",
    "switchover",
    "sentinel",
    "planner",
    "faults",
    "all",
];

fn main() -> Result<()> {
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    if !SECTIONS.contains(&what.as_str()) {
        bail!("unknown section {what:?}: one of {}", SECTIONS.join(", "));
    }
    if what == "sentinel" {
        // The baseline runs no agent, so it needs no VALKEY_SIDECAR_BIN.
        return sentinel_baseline();
    }
    if what == "faults" {
        let log = std::env::args()
            .nth(2)
            .context("usage: bench faults <log>")?;
        return faults::run(Path::new(&log));
    }
    if what == "restart" {
        return restart::run(env_count("BENCH_RESTARTS", 10));
    }
    if what == "planner" {
        return planner::run();
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
        footprint::run(&bin)?;
    }
    if what == "labels" || all {
        runtime()?.block_on(labels::run(&bin, env_count("BENCH_FLIPS", 30)))?;
    }
    if what == "api" || all {
        runtime()?.block_on(api::run(&bin))?;
    }
    if what == "handover" || all {
        runtime()?.block_on(handover::run(&bin, env_count("BENCH_HANDOVERS", 20)))?;
    }
    if what == "failover" || all {
        runtime()?.block_on(failovers(&bin))?;
    }
    if what == "switchover" || all {
        runtime()?.block_on(switchovers(&bin, env_count("BENCH_SWITCHOVERS", 20)))?;
    }
    if all {
        restart::run(env_count("BENCH_RESTARTS", 10))?;
        planner::run()?;
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
    log_failovers(
        &killed,
        &cut,
        &[(FAST_SENTINEL, &fast), (DEFAULT_SENTINEL, &default)],
    );
    let measured = [
        (fast_sentinel(), fast),
        (SentinelOptions::default(), default),
    ];
    report::sentinel(&measured);
    Ok(())
}

const FAST_SENTINEL: &str = "Sentinel (`down-after-milliseconds 1000`): primary killed";
const DEFAULT_SENTINEL: &str = "Sentinel (defaults): primary killed";

fn agent_row<'a>(scenario: &'a str, runs: &[failover::Run]) -> faults::Runs<'a> {
    faults::Runs {
        scenario,
        acked: None,
        lost: runs.iter().map(|r| r.lost).sum(),
        recovery: runs.iter().map(|r| r.labelled).collect(),
        what: "fault → another pod writable and labelled primary",
    }
}

/// The failover runs as rows of the fault table.
fn log_failovers(
    killed: &[failover::Run],
    cut: &[(&str, Vec<failover::Run>)],
    sentinel: &[(&str, &Vec<UnplannedFailover>)],
) {
    faults::record_runs(
        "failover",
        agent_row("replication: primary's Valkey killed (agent alive)", killed),
    );
    for (lease, runs) in cut {
        let scenario = format!("replication: primary's node cut, lease {lease}");
        faults::record_runs("failover", agent_row(&scenario, runs));
    }
    for (scenario, runs) in sentinel {
        faults::record_runs(
            "failover",
            faults::Runs {
                scenario,
                acked: Some(runs.iter().map(|r| r.acked).sum()),
                lost: runs.iter().map(|r| r.lost).sum(),
                recovery: runs.iter().map(|r| r.writable_after).collect(),
                what: "kill -9 → a replica accepts writes",
            },
        );
    }
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
    for (scenario, moves) in [
        ("replication: switchover on cordon (agent)", &ours),
        ("replication: `FAILOVER TO` (Valkey, no agent)", &theirs),
    ] {
        faults::record_runs("switchover", failover::as_runs(scenario, moves));
    }
    Ok(())
}

/// A mutex's value, poisoned or not (a panicked holder only ever wrote whole values here).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// The chart's 3 × 2 cluster with `env` for the agents (and the apiserver's audit log if
/// `audit`); returns it and the Lease holder once settled and some agent holds the Lease.
async fn coordinated_stage(
    bin: &Path,
    env: &[(&str, &str)],
    audit: bool,
) -> Result<(Stage, String)> {
    let mut opts = StageOptions::cluster("valkey", 3, 1);
    opts.kubelet = opts.kubelet.sidecar_bin(bin);
    opts.plane.audit = audit;
    for (k, v) in env {
        opts = opts.env(k, v);
    }
    let stage = Stage::start(opts).await?;
    let leader = stage.wait_coordinator(Duration::from_secs(30)).await?;
    Ok((stage, leader))
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
