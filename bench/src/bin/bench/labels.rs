//! Role-label convergence: the agent against a 5 s polling loop (what operators do today), both
//! measured on the same flips of the same pods.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use valkey_sidecar_testkit::k8s::valkey::cmd_as;
use valkey_sidecar_testkit::k8s::{ROLE_LABEL, RoleWatch, Stage, StageOptions};

use crate::plot::Bar;
use crate::report::{duration_row, p50_p99, ratio};

/// The label the baseline poller writes, beside the agent's own.
const POLLED_LABEL: &str = "bench.valkey.io/polled-role";
/// How often the baseline looks: a common reconcile period for operators that poll Valkey.
const POLL_EVERY: Duration = Duration::from_secs(5);
const WRITES: &str = "valkey_sidecar_label_writes_total{result=\"ok\"}";

/// The baseline: every 5 s it asks each pod's Valkey for `ROLE` (with the deployment's password)
/// and patches the pod's label when it changed, as an operator's reconcile loop does.
fn poller(
    api: Api<Pod>,
    pods: Vec<(String, SocketAddr)>,
    password: Option<String>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut written: BTreeMap<String, &str> = BTreeMap::new();
        let mut tick = tokio::time::interval(POLL_EVERY);
        loop {
            tick.tick().await;
            for (pod, addr) in &pods {
                poll_one(&api, pod, (*addr, password.as_deref()), &mut written).await;
            }
        }
    })
}

async fn poll_one(
    api: &Api<Pod>,
    pod: &str,
    (addr, password): (SocketAddr, Option<&str>),
    written: &mut BTreeMap<String, &'static str>,
) {
    let Some(role) = role_of(addr, password) else {
        return;
    };
    if written.get(pod) == Some(&role) {
        return;
    }
    let patch = serde_json::json!({ "metadata": { "labels": { POLLED_LABEL: role } } });
    if api
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .is_ok()
    {
        written.insert(pod.to_owned(), role);
    }
}

fn role_of(addr: SocketAddr, password: Option<&str>) -> Option<&'static str> {
    let redis::Value::Array(items) = cmd_as(addr, password, &["ROLE"]).ok()? else {
        return None;
    };
    match items.first()? {
        redis::Value::BulkString(b) if b == b"master" => Some("primary"),
        redis::Value::BulkString(b) if b == b"slave" => Some("replica"),
        _ => None,
    }
}

/// A pause in [0, `POLL_EVERY`) that differs from flip to flip, so the flips fall at every phase
/// of the poller's period instead of a fixed offset from its last tick.
fn jitter(i: usize) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let spread = u64::from(nanos)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(i as u64 * 7919);
    Duration::from_millis(spread % POLL_EVERY.as_millis() as u64)
}

/// What the flips measured: label latency of the promoted and demoted pod, for the agent and the
/// poller, and the agent's label writes per flip.
#[derive(Default)]
struct Flips {
    up: Vec<Duration>,
    down: Vec<Duration>,
    polled_up: Vec<Duration>,
    polled_down: Vec<Duration>,
    writes: Vec<u64>,
}

struct Watches {
    agent: RoleWatch,
    polled: RoleWatch,
}

/// Role-label convergence over `flips` `CLUSTER FAILOVER`s on the real control plane: from the
/// moment Valkey reports the new role (ROLE polled every millisecond) to the label arriving
/// through a watch, for the promoted and the demoted pod, the agent's label and the poller's.
pub async fn run(bin: &Path, flips: usize) -> Result<()> {
    // The coordinator forms the cluster; without balance nothing but the flips moves a primary.
    let mut opts = StageOptions::cluster("valkey", 3, 1).env("SIDECAR_BALANCE", "false");
    opts.kubelet = opts.kubelet.sidecar_bin(bin);
    let stage = Stage::start(opts).await?;
    let pods = stage
        .pods
        .iter()
        .map(|p| Ok((p.clone(), stage.valkey(p)?)))
        .collect::<Result<Vec<_>>>()?;
    let poll = poller(stage.api(), pods, stage.password.clone());
    let (agent, a) = RoleWatch::start(stage.api(), ROLE_LABEL);
    let (polled, b) = RoleWatch::start(stage.api(), POLLED_LABEL);
    let watches = Watches { agent, polled };
    let mut seen = Flips::default();
    for i in 0..flips {
        flip(&stage, &watches, &mut seen, i).await?;
        eprintln!("flip {}/{flips}", i + 1);
    }
    for t in [poll, a, b] {
        t.abort();
    }
    report(&stage, &seen, flips)
}

/// One flip of shard 0: the replica takes over, both pods' labels are awaited.
async fn flip(stage: &Stage, w: &Watches, seen: &mut Flips, i: usize) -> Result<()> {
    let (primary, replica) = stage.primary_and_replica(0)?;
    tokio::time::sleep(Duration::from_millis(700) + jitter(i)).await;
    let before = writes(stage, &primary, &replica).await?;
    stage.cmd(&replica, &["CLUSTER", "FAILOVER"])?;
    let mut flipped = Instant::now();
    while stage.role(&replica).as_deref() != Some("master") {
        tokio::time::sleep(Duration::from_millis(1)).await;
        flipped = Instant::now();
    }
    let after = |watch: &RoleWatch, pod: &str, role: &'static str| {
        let (watch, pod) = (watch.clone(), pod.to_owned());
        async move {
            let at = watch.wait(&pod, Some(role), flipped, Duration::from_secs(15));
            Ok::<_, anyhow::Error>(at.await?.saturating_duration_since(flipped))
        }
    };
    seen.up.push(after(&w.agent, &replica, "primary").await?);
    seen.down.push(after(&w.agent, &primary, "replica").await?);
    seen.polled_up
        .push(after(&w.polled, &replica, "primary").await?);
    seen.polled_down
        .push(after(&w.polled, &primary, "replica").await?);
    tokio::time::sleep(Duration::from_millis(700)).await;
    seen.writes
        .push(writes(stage, &primary, &replica).await? - before);
    Ok(())
}

/// The agents' successful label writes on both pods so far.
async fn writes(stage: &Stage, a: &str, b: &str) -> Result<u64> {
    Ok(stage.agent_counter(a, WRITES).await? + stage.agent_counter(b, WRITES).await?)
}

const ROWS: [&str; 4] = [
    "agent: promoted (label → primary)",
    "agent: demoted (label → replica)",
    "5 s poller: promoted",
    "5 s poller: demoted",
];

fn report(stage: &Stage, f: &Flips, flips: usize) -> Result<()> {
    println!(
        "### Role-label convergence after `CLUSTER FAILOVER`: the agent against a 5 s polling loop (real kube-apiserver v1.37.2)\n"
    );
    println!(
        "Command: `BENCH_FLIPS={flips} target/release/bench labels`. Shard 0 of a cluster of 3 shards × (1 primary + 1 replica) is flipped {flips} times with `CLUSTER FAILOVER` on its replica, each after a random pause of 0–5 s so the flips fall at every phase of the poller's period. Measured from Valkey reporting the new role (`ROLE` polled every 1 ms) to the label arriving through a watch. The agent polls its Valkey every 250 ms and writes `{ROLE_LABEL}`; the baseline, running beside it on the same flips, asks every pod's Valkey for `ROLE` every 5 s and patches `{POLLED_LABEL}` when it changed (an operator's reconcile loop). With at most 50 flips p99 is the maximum.\n"
    );
    println!("| label | settings | flips | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|");
    let series = [&f.up, &f.down, &f.polled_up, &f.polled_down];
    let settings = [
        agent_config(),
        String::new(),
        POLLER_CONFIG.into(),
        String::new(),
    ];
    for ((label, v), config) in ROWS.iter().zip(series).zip(&settings) {
        println!("{}", duration_row(label, config, v.to_vec()));
    }
    ratios(f);
    summarize(f, flips);
    println!("{}", plot(f)?);
    footnotes(stage, f);
    Ok(())
}

/// The agents' settings on this stage.
fn agent_config() -> String {
    let poll =
        crate::settings::agent_default("SIDECAR_POLL_INTERVAL").unwrap_or_else(|| "?".into());
    format!(
        "poll {poll}, coordinator off; {}",
        crate::settings::chart_cluster()
    )
}

/// The baseline's settings.
const POLLER_CONFIG: &str = "`ROLE` of every pod every 5 s, the label patched when it changed";

/// The summary's row: the promoted pod's label, the agent against the poller.
fn summarize(f: &Flips, flips: usize) {
    use crate::summary::{Row, Side, record};
    if f.up.is_empty() {
        return;
    }
    record(&Row {
        key: "labels".into(),
        measure: "role label `primary` on the promoted pod after `CLUSTER FAILOVER`".into(),
        ours: Side::timing("agent", &agent_config(), &f.up),
        theirs: Some(Side::timing("5 s polling loop", POLLER_CONFIG, &f.polled_up)),
        runs: flips.to_string(),
        why: "the poller happened to look right after the flips in this run; it sees a flip only at its next 5 s tick, the agent within its 250 ms poll".into(),
    });
}

fn ratios(f: &Flips) {
    println!("\nRatios (the poller's latency ÷ the agent's; above 1 the agent is faster):\n");
    println!("| pod | p50 | p99 |");
    println!("|---|---|---|");
    for (pod, ours, theirs) in [
        ("promoted", &f.up, &f.polled_up),
        ("demoted", &f.down, &f.polled_down),
    ] {
        let (a, b) = (p50_p99(ours.to_vec()), p50_p99(theirs.to_vec()));
        println!("| {pod} | {} | {} |", ratio(b.0, a.0), ratio(b.1, a.1));
    }
    println!();
}

fn plot(f: &Flips) -> Result<String> {
    let series = [&f.up, &f.down, &f.polled_up, &f.polled_down];
    let bars: Vec<Bar> = ROWS
        .iter()
        .zip(series)
        .map(|(label, v)| {
            let (p50, p99) = p50_p99(v.to_vec());
            Bar::new(*label, p50, p99)
        })
        .collect();
    crate::plot::bars("labels", "Role label after a role flip", "ms", &bars)
}

fn footnotes(stage: &Stage, f: &Flips) {
    let rss: Vec<String> = stage
        .pods
        .iter()
        .filter_map(|p| {
            let agent = "valkey-sidecar";
            stage.kubelet.container_pid(&stage.namespace, p, agent)
        })
        .filter_map(|pid| crate::proc_stats(pid).ok())
        .map(|(kib, _)| format!("{:.1}", kib as f64 / 1024.0))
        .collect();
    println!(
        "Agent RSS (MiB) in this stage, labeler and its pod watch running, after the flips: {}.\n",
        rss.join(", ")
    );
    let total: u64 = f.writes.iter().sum();
    println!(
        "Label writes (server-side applies) per flip, both pods together: {:.2} on average over {} flips (min {}, max {}); the target is 2, one per pod whose role changed.\n",
        total as f64 / f.writes.len().max(1) as f64,
        f.writes.len(),
        f.writes.iter().min().unwrap_or(&0),
        f.writes.iter().max().unwrap_or(&0)
    );
}
