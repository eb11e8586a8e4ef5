//! Benchmarks of the agent against real Valkey; prints Markdown for `docs/benchmarks.md`.
//!
//! `bench [probes|footprint|all]` — run through `scripts/bench.sh`, which builds the release binary
//! and regenerates the report. Needs `VALKEY_SIDECAR_BIN` (the agent) and a valkey-server (see
//! `scripts/valkey-bin.sh`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use valkey_sidecar_testkit::{
    ClusterOptions, ServerOptions, Sidecar, SidecarOptions, ValkeyCluster, ValkeyServer, http_get,
    redis,
};

fn main() -> Result<()> {
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let bin = PathBuf::from(
        std::env::var("VALKEY_SIDECAR_BIN")
            .context("set VALKEY_SIDECAR_BIN to the release agent binary")?,
    );
    if what == "probes" || what == "all" {
        probes(&bin)?;
    }
    if what == "footprint" || what == "all" {
        footprint(&bin)?;
    }
    if what == "labels" || what == "all" {
        let flips = std::env::var("BENCH_FLIPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50);
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
            .block_on(labels(&bin, flips))?;
    }
    Ok(())
}

/// Role-label convergence over `flips` coordinated failovers on the real control plane: from the
/// moment Valkey reports the new role (ROLE polled every millisecond) to the label arriving
/// through a watch, for the promoted and the demoted pod, and the label writes per flip.
async fn labels(bin: &std::path::Path, flips: usize) -> Result<()> {
    use valkey_sidecar_testkit::k8s::valkey::cmd;
    use valkey_sidecar_testkit::k8s::{ROLE_LABEL, RoleWatch, Stage, StageOptions};
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
