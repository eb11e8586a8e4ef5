//! Benchmarks of the agent against real Valkey; prints Markdown for `docs/benchmarks.md` and
//! writes its plots (`$BENCH_PLOTS_DIR`, default `docs/plots`).
//!
//! `bench [probes|footprint|labels|api|handover|failover|switchover|partition|sentinel|planner|scale|followers|all]` runs
//! sections; `bench faults <log>` prints the fault table, `bench summary <log>` the headline block,
//! `bench summary-readme <log>` its README shape (seven rows), `bench readme <block> <readme>`
//! copies a block into the README, and
//! `bench compare <previous> <new>` lists the figures that got worse. All run through
//! `scripts/bench.sh`, which builds the release binary, runs every section and the chaos tests,
//! and regenerates the report. Needs `VALKEY_SIDECAR_BIN` (the agent; not for `sentinel`,
//! `planner` or the report commands) and a valkey-server (see `scripts/valkey-bin.sh`);
//! `footprint`, `labels`, `api`, `handover`, `failover`, `switchover`, `partition`, `scale` and `followers` also need the Kubernetes binaries
//! and helm (`scripts/k8s-bins.sh`, `scripts/helm-bin.sh`). With `VALKEY_TESTKIT_FAULT_LOG` set,
//! each configuration's runs are also logged as rows of the fault table; with
//! `BENCH_SUMMARY_LOG` set, the headline figures as rows of the summary.
// Testkit and bench are read and changed as often as the agent: the same length limit.
#![warn(clippy::too_many_lines)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use report::percentile;
use summary::Shape;
use valkey_sidecar_testkit::k8s::{Stage, StageOptions};
use valkey_sidecar_testkit::{Agent, AgentOptions, ServerOptions, ValkeyServer, http_get, redis};

mod alone;
mod api;
mod compare;
mod failover;
mod faults;
mod followers;
mod footprint;
mod handover;
mod labels;
mod machine;
mod partition;
mod planner;
mod plot;
mod report;
mod scale;
mod sentinels;
mod settings;
mod stall;
mod summary;

/// The sections `bench` knows (`faults`, `summary`, `summary-readme`, `readme` and `compare` take
/// paths too).
const SECTIONS: [&str; 18] = [
    "probes",
    "footprint",
    "labels",
    "api",
    "handover",
    "failover",
    "switchover",
    "partition",
    "sentinel",
    "planner",
    "scale",
    "followers",
    "faults",
    "summary",
    "summary-readme",
    "readme",
    "compare",
    "all",
];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let what = args.first().map_or("all", String::as_str);
    if !SECTIONS.contains(&what) {
        bail!("unknown section {what:?}: one of {}", SECTIONS.join(", "));
    }
    if let Some(done) = without_agent(what, args.get(1..).unwrap_or_default()) {
        return done;
    }
    let bin = PathBuf::from(
        std::env::var("VALKEY_SIDECAR_BIN")
            .context("set VALKEY_SIDECAR_BIN to the release agent binary")?,
    );
    with_agent(what, &bin)
}

/// The commands that need no agent binary; `None` for the others.
fn without_agent(what: &str, rest: &[String]) -> Option<Result<()>> {
    let path = |i: usize, usage: &str| -> Result<&Path> {
        rest.get(i)
            .map(Path::new)
            .with_context(|| format!("usage: {usage}"))
    };
    Some(match what {
        // The baseline runs no agent.
        "sentinel" => sentinels::baseline(),
        "planner" => planner::run(),
        "faults" => path(0, "bench faults <log>").and_then(faults::run),
        "summary" => path(0, "bench summary <log>").and_then(|l| summary::run(l, Shape::Report)),
        "summary-readme" => {
            path(0, "bench summary-readme <log>").and_then(|l| summary::run(l, Shape::Readme))
        }
        "readme" => {
            let usage = "bench readme <block> <readme>";
            path(0, usage).and_then(|block| summary::readme(block, path(1, usage)?))
        }
        "compare" => {
            let usage = "bench compare <previous report> <new report>";
            path(0, usage).and_then(|old| compare::run(old, path(1, usage)?))
        }
        _ => return None,
    })
}

/// The sections that run the agent (`all`: every section).
fn with_agent(what: &str, bin: &Path) -> Result<()> {
    let all = what == "all";
    if what == "probes" || all {
        probes(bin)?;
    }
    if what == "footprint" || all {
        footprint::run(bin)?;
    }
    if what == "labels" || all {
        runtime()?.block_on(labels::run(bin, env_count("BENCH_FLIPS", 30)))?;
    }
    if what == "api" || all {
        runtime()?.block_on(api::run(bin))?;
    }
    if what == "handover" || all {
        runtime()?.block_on(handover::run(bin, env_count("BENCH_HANDOVERS", 20)))?;
    }
    if what == "failover" || all {
        runtime()?.block_on(failovers(bin))?;
    }
    if what == "switchover" || all {
        runtime()?.block_on(switchovers(bin, env_count("BENCH_SWITCHOVERS", 20)))?;
    }
    if what == "partition" || all {
        runtime()?.block_on(partition::run(bin))?;
    }
    // Not in `all`: three installs of up to 100 pods, its own section of the benchmark command.
    if what == "scale" {
        runtime()?.block_on(scale::run(bin))?;
    }
    // Not in `all` either: four installs, each holder's node cut 10 times (about 40 minutes).
    if what == "followers" {
        let runs = env_count("BENCH_TAKEOVERS", 10);
        runtime()?.block_on(followers::run(bin, runs))?;
    }
    if all {
        planner::run()?;
    }
    Ok(())
}

/// Replication mode, unplanned, in one run: the agent after kill -9 of the primary's Valkey and
/// after its whole node is cut, then Sentinel under the same two faults (the fair deployment and
/// the defaults); ratios between like faults.
async fn failovers(bin: &Path) -> Result<()> {
    let kills = env_count("BENCH_FAILOVERS", 20);
    let cuts = env_count("BENCH_POD_CUTS", 20);
    let killed = agent_runs(bin, &[], failover::Fault::KillValkey, kills).await?;
    let mut cut = Vec::new();
    for (lease, env) in &failover::SHORT_LEASES {
        let runs = agent_runs(bin, env, failover::Fault::CutNode, cuts).await?;
        cut.push(report::Cut { lease, env, runs });
    }
    let measured = tokio::task::spawn_blocking(sentinels::measure_all).await??;
    report::failover(&killed, &cut, &measured);
    report::failover_summary(&killed, &cut, &measured);
    log_failovers(&killed, &cut);
    sentinels::log(&measured);
    sentinels::report(&measured);
    Ok(())
}

fn agent_row<'a>(scenario: &'a str, runs: &[failover::Run]) -> faults::Runs<'a> {
    faults::Runs {
        scenario,
        acked: Some(runs.iter().map(|r| r.acked).sum()),
        lost: runs.iter().map(|r| r.lost).sum(),
        deposed: Some(runs.iter().map(|r| r.deposed).sum()),
        recovery: runs.iter().map(|r| r.labelled).collect(),
        what: "fault → another pod writable and labelled primary",
    }
}

/// The agent's failover runs as rows of the fault table.
fn log_failovers(killed: &[failover::Run], cut: &[report::Cut]) {
    faults::record_runs(
        "failover",
        agent_row("replication: primary's Valkey killed (agent alive)", killed),
    );
    for c in cut {
        let scenario = format!("replication: primary's node cut, lease {}", c.lease);
        faults::record_runs("failover", agent_row(&scenario, &c.runs));
    }
}

async fn agent_runs(
    bin: &Path,
    env: &[(&str, &str)],
    fault: failover::Fault,
    runs: usize,
) -> Result<Vec<failover::Run>> {
    let stage = failover::stage(bin, env, false).await?;
    let mut results = Vec::new();
    for i in 0..runs {
        stage.flush_primaries()?;
        let r = failover::run(&stage, fault).await?;
        eprintln!(
            "agent failover {}/{runs}: writable {:?}, labelled {:?}, {} acked, {} lost, {} by a deposed primary",
            i + 1,
            r.writable,
            r.labelled,
            r.acked,
            r.lost,
            r.deposed
        );
        results.push(r);
    }
    Ok(results)
}

/// Planned moves in replication mode: the agents' switchover (node cordoned) against Valkey's
/// own `FAILOVER TO`, `runs` each.
async fn switchovers(bin: &Path, runs: usize) -> Result<()> {
    let stage = failover::stage(bin, &[], false).await?;
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

/// A key tag unique to this moment, so runs on one data set never share keys.
fn rand_tag() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
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

fn probes(bin: &Path) -> Result<()> {
    let server = ValkeyServer::start(ServerOptions::default())?;
    let agent = Agent::start(AgentOptions::new(bin, server.addr(), "replication"))?;
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
    let (_, ticks) = machine::parse_stat(&stat).context("stat")?;
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
    let coordinator = stage.wait_coordinator(Duration::from_secs(30)).await?;
    Ok((stage, coordinator))
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

#[cfg(test)]
mod tests {
    use super::SECTIONS;

    /// Every `target/release/bench <section>` that `scripts/bench.sh` runs is one `bench` knows:
    /// a name missing here fails only at the end of a 100-minute run.
    #[test]
    fn the_benchmark_command_runs_only_known_sections() {
        let script = include_str!("../../../../scripts/bench.sh");
        let used: Vec<&str> = script
            .split("target/release/bench ")
            .skip(1)
            .filter_map(|rest| rest.split_whitespace().next())
            .collect();
        assert!(used.len() >= 10, "{used:?}");
        for section in used {
            assert!(
                SECTIONS.contains(&section),
                "bench.sh runs unknown section {section:?}"
            );
        }
    }
}
