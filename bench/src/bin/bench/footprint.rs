//! Footprint: the agents' RSS and CPU at idle and under a 1k rps probe load, beside a Sentinel
//! and a `valkey-server` measured in the same windows.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use valkey_sidecar_bench::sentinel::{SentinelOptions, Sentinels};
use valkey_sidecar_testkit::{
    Agent, AgentOptions, ClusterOptions, ReplicationSet, ServerOptions, ValkeyCluster,
};

/// Clock ticks per second of `/proc/<pid>/stat`'s utime and stime (USER_HZ on Linux).
const HZ: f64 = 100.0;

/// RSS at the end of a window and the share of one core used in it.
struct Usage {
    rss_mib: f64,
    cpu_pct: f64,
}

/// Measures `pids` over `window` while `during` runs (it should take about `window`).
fn measure(pids: &[u32], window: Duration, during: impl FnOnce()) -> Result<Vec<Usage>> {
    let before = pids
        .iter()
        .map(|p| crate::proc_stats(*p))
        .collect::<Result<Vec<_>>>()?;
    let started = std::time::Instant::now();
    during();
    std::thread::sleep(window.saturating_sub(started.elapsed()));
    let secs = started.elapsed().as_secs_f64();
    pids.iter()
        .zip(before)
        .map(|(p, (_, ticks))| {
            let (rss, now) = crate::proc_stats(*p)?;
            let cpu_pct = now.saturating_sub(ticks) as f64 / HZ / secs * 100.0;
            Ok(Usage {
                rss_mib: rss as f64 / 1024.0,
                cpu_pct,
            })
        })
        .collect()
}

fn row(process: &str, idle: &Usage, loaded: Option<&Usage>) -> String {
    let load = loaded.map_or_else(
        || "– | –".to_string(),
        |u| format!("{:.1} | {:.2}", u.rss_mib, u.cpu_pct),
    );
    format!(
        "| {process} | {:.1} | {:.2} | {load} |",
        idle.rss_mib, idle.cpu_pct
    )
}

/// The processes: 6 agents beside a 3 × (1 + 1) cluster, and a Sentinel deployment (1 primary +
/// 2 replicas, 3 sentinels) on the same binary, all idle in one window; then agent #0 under the
/// probe load in a second window.
pub fn run(bin: &Path) -> Result<()> {
    const WINDOW: Duration = Duration::from_secs(30);
    const LOADED: Duration = Duration::from_secs(10);
    let cluster = ValkeyCluster::start(3, 1, ClusterOptions::default())?;
    let agents = start_agents(bin, &cluster)?;
    let set = ReplicationSet::start(2, ServerOptions::default())?;
    let sentinels = Sentinels::monitor(&set, SentinelOptions::default())?;
    std::thread::sleep(Duration::from_secs(2));
    let mut pids: Vec<u32> = agents.iter().map(Agent::pid).collect();
    pids.push(cluster.nodes()[0].pid());
    pids.extend(sentinels.pids().first());
    let idle = measure(&pids, WINDOW, || {})?;
    let probe = agents[0].probe_addr();
    let paths = ["/livez", "/readyz", "/startupz", "/status"];
    let loaded_pids = [agents[0].pid(), cluster.nodes()[0].pid()];
    let mut served = 0;
    let loaded = measure(&loaded_pids, LOADED, || {
        served = crate::load(probe, 1000, LOADED, &paths).len();
    })?;
    print(bin, &idle, &loaded, served, WINDOW)?;
    drop(agents);
    drop(cluster);
    let sentinel = sentinels.pids().first().copied();
    let deployed = crate::runtime()?.block_on(deployed(bin, sentinel, WINDOW))?;
    print_deployed(&deployed, WINDOW);
    Ok(())
}

/// The agents as the chart deploys them: a 3 × 2 cluster install on the local control plane
/// (each agent with its Kubernetes client, pod watch, Lease, labels and heartbeats), settled,
/// then every agent and `sentinel` (still running) measured idle in one window. The sentinel's
/// usage comes last.
async fn deployed(bin: &Path, sentinel: Option<u32>, window: Duration) -> Result<Vec<Usage>> {
    let mut o = valkey_sidecar_testkit::k8s::StageOptions::cluster("valkey", 3, 1);
    o.kubelet = o.kubelet.sidecar_bin(bin);
    let s = valkey_sidecar_testkit::k8s::Stage::start(o).await?;
    s.wait_coordinator(Duration::from_secs(60)).await?;
    // Past start-up: the first Lease rounds, label writes and watches' initial lists.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut pids: Vec<u32> = s
        .pods
        .iter()
        .filter_map(|p| s.kubelet.container_pid(&s.namespace, p, "valkey-sidecar"))
        .collect();
    anyhow::ensure!(pids.len() == s.pods.len(), "an agent has no process");
    pids.extend(sentinel);
    tokio::task::spawn_blocking(move || measure(&pids, window, || {})).await?
}

fn print_deployed(usage: &[Usage], window: Duration) {
    let (agents, sentinel) = match usage.split_last() {
        Some((s, agents)) => (agents, s),
        None => return,
    };
    println!(
        "### Footprint of the agents as the chart deploys them (3 shards × 2, cluster mode)
"
    );
    println!(
        "Command: `target/release/bench footprint` (its second part). A chart install with its defaults on the local control plane: each agent runs its Kubernetes client, the pod watch of its shard, the coordinator Lease (one holds it, the others follow), its labels and the peer heartbeats. Measured idle in one {} s window once settled, beside the same sentinel as above in the same window.\n",
        window.as_secs()
    );
    println!("| process | idle RSS MiB | idle CPU % of one core |");
    println!("|---|---|---|");
    for (i, u) in agents.iter().enumerate() {
        println!(
            "| valkey-sidecar as deployed #{i} | {:.1} | {:.2} |",
            u.rss_mib, u.cpu_pct
        );
    }
    println!(
        "| valkey-server --sentinel (one of 3) | {:.1} | {:.2} |\n",
        sentinel.rss_mib, sentinel.cpu_pct
    );
    summarize(agents, sentinel, window, Kind::Deployed);
}

fn start_agents(bin: &Path, cluster: &ValkeyCluster) -> Result<Vec<Agent>> {
    let agents: Vec<Agent> = cluster
        .nodes()
        .iter()
        .map(|n| Agent::start(AgentOptions::new(bin, n.addr(), "cluster")))
        .collect::<Result<_>>()?;
    for a in &agents {
        a.wait_code("/readyz", 200, Duration::from_secs(10))?;
    }
    Ok(agents)
}

/// Which agents a footprint row measures.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// As the chart deploys them, with their Kubernetes client.
    Deployed,
    /// The agent without Kubernetes (no API server to talk to).
    Bare,
}

/// A summary footprint row: the largest idle RSS and CPU of the agents against one sentinel.
fn summarize(agents: &[Usage], sentinel: &Usage, window: Duration, kind: Kind) {
    use crate::summary::{Part, Row, Side, record};
    let parts = |rss: f64, cpu: f64| {
        vec![
            Part {
                name: "RSS".into(),
                value: rss,
                unit: "MiB".into(),
            },
            Part {
                name: "CPU".into(),
                value: cpu,
                unit: "%".into(),
            },
        ]
    };
    let most = |f: fn(&Usage) -> f64| agents.iter().map(f).fold(0.0, f64::max);
    let (key, measure, config) = match kind {
        Kind::Deployed => (
            "idle",
            "idle footprint of one process (RSS, CPU % of one core), the agent as the chart deploys it",
            "chart defaults, cluster mode 3 × 2: Kubernetes client, pod watch, Lease, labels, heartbeats",
        ),
        Kind::Bare => (
            "idle-bare",
            "idle footprint of one process (RSS, CPU % of one core), the bare agent (no Kubernetes API)",
            "poll 250 ms, cluster mode, no Kubernetes API",
        ),
    };
    record(&Row {
        key: key.into(),
        measure: measure.into(),
        ours: Side {
            who: format!("agent (the largest of {})", agents.len()),
            config: config.into(),
            parts: parts(most(|u| u.rss_mib), most(|u| u.cpu_pct)),
            lost: None,
        },
        theirs: Some(Side {
            who: "one sentinel".into(),
            config: "one of 3 sentinels, Sentinel's defaults, monitoring 1 primary + 2 replicas".into(),
            parts: parts(sentinel.rss_mib, sentinel.cpu_pct),
            lost: None,
        }),
        runs: format!("one {} s window", window.as_secs()),
        why: "the agent is one program with a Kubernetes client, TLS, an HTTP server for the probes and a Valkey client polling every 250 ms (on a single-threaded runtime), measured as the image ships it (static, musl); a sentinel is one single-threaded C process pinging once a second. One agent runs beside every Valkey, 3 sentinels beside a whole deployment".into(),
    });
}

fn print(
    bin: &Path,
    idle: &[Usage],
    loaded: &[Usage],
    served: usize,
    window: Duration,
) -> Result<()> {
    let agents = idle.len().saturating_sub(2);
    println!(
        "### Footprint beside a 3-shard × 1-replica cluster and a Sentinel deployment (poll 250 ms)\n"
    );
    println!(
        "Command: `target/release/bench footprint`. Idle: every process in one {}s window. Probe load: agent #0 served {served} probe requests at 1000 requests/s (new connection each, `/livez` `/readyz` `/startupz` `/status` in turn) in a second 10 s window, its own Valkey measured in the same window. Sentinel: one of 3 sentinels (the same valkey-server binary with `--sentinel`) monitoring 1 primary + 2 replicas with its defaults. RSS from `VmRSS`, CPU from utime + stime in `/proc/<pid>/stat`.\n",
        window.as_secs()
    );
    println!(
        "| process | idle RSS MiB | idle CPU % of one core | 1k rps probes RSS MiB | 1k rps probes CPU % |"
    );
    println!("|---|---|---|---|---|");
    for (i, u) in idle.iter().take(agents).enumerate() {
        let under = (i == 0).then(|| loaded.first()).flatten();
        println!("{}", row(&format!("valkey-sidecar #{i}"), u, under));
    }
    let valkey = idle.get(agents);
    if let Some(v) = valkey {
        println!(
            "{}",
            row("valkey-server (a primary, for scale)", v, loaded.get(1))
        );
    }
    if let Some(s) = idle.get(agents + 1) {
        println!("{}", row("valkey-server --sentinel (one of 3)", s, None));
        summarize(
            idle.get(..agents).unwrap_or_default(),
            s,
            window,
            Kind::Bare,
        );
    }
    let size = std::fs::metadata(bin)?.len();
    println!(
        "\nAgent binary measured: {} (stripped, LTO, opt-level s): {:.2} MiB ({size} bytes).\n",
        binary_kind(bin),
        size as f64 / 1048576.0
    );
    Ok(())
}

/// Which build `bin` is: the image's static musl binary (`scripts/static-build.sh`) or a host build.
fn binary_kind(bin: &Path) -> &'static str {
    if bin.to_string_lossy().contains("-linux-musl/") {
        "the image's static musl binary (`scripts/static-build.sh`)"
    } else {
        "a host (glibc) release build, not the image's binary"
    }
}
