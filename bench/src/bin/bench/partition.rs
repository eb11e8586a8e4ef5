//! Partitions and apiserver outages, the agent on the chart's pods against Valkey on its own and
//! Sentinel, in one run:
//!
//! - a **partition** of the node of shard 0's primary: the node keeps running, cut from the other
//!   nodes and the apiserver, while a client on its side keeps writing to the old primary and a
//!   writer on the majority side writes to whichever member accepts. Measured: the cut → the old
//!   primary's last acknowledgement to its side's client (what its fence bounds), the cut → the
//!   first write the majority side accepted, and the acknowledged writes lost once the partition
//!   healed (read back from the final primary). Replication mode at the chart's defaults (lease
//!   15 s, `min-replicas-to-write 1`, `min-replicas-max-lag 10`) against Sentinel with the same
//!   Valkey settings and with `min-replicas-max-lag 1`; cluster mode at the chart's defaults
//!   (3 × 2, `cluster-node-timeout 5000`) against Valkey Cluster alone with the same timeout;
//! - **healthy windows**: the same stages under a writer with no fault, every agent's fences
//!   counted (a fence there is a false positive that stops writes for nothing);
//! - the **apiserver stopped** (SIGSTOP) for minutes under a writer (replication mode, where the
//!   shard's record lives in the apiserver): the longest write pause and the fences.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use valkey_sidecar_bench::sentinel::{Partitioned, SentinelOptions, Sentinels};
use valkey_sidecar_testkit::k8s::writer::{tag_named, targets};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, poll_until, shard};
use valkey_sidecar_testkit::{ReplicationOptions, ReplicationSet, ServerOptions};

use crate::failover::MIN_REPLICAS;
use crate::report::{ms, p50_p99};
use crate::{env_count, faults, settings};

/// Which of the chart's modes a stage runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Replication,
    Cluster,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Replication => "replication",
            Mode::Cluster => "cluster",
        }
    }

    /// The agent's configuration as the rows print it: the chart's defaults, read from the
    /// chart.
    fn config(self) -> String {
        let value = |path: &[&str]| settings::chart_value(path).unwrap_or_else(|| "?".into());
        let heartbeats = format!(
            "heartbeats every {}, isolation fence after {}",
            value(&["sidecar", "heartbeat", "interval"]),
            value(&["sidecar", "heartbeat", "fenceAfter"])
        );
        match self {
            Mode::Replication => format!(
                "1 × 3, {}; {}; {heartbeats}",
                settings::chart_replication(),
                settings::lease(&[])
            ),
            Mode::Cluster => format!("3 × 2, {}; {heartbeats}", settings::chart_cluster()),
        }
    }

    /// The agent's counters of the fences it raises in this mode (summed).
    fn fence_samples(self) -> [&'static str; 2] {
        let keeper = match self {
            Mode::Replication => "valkey_sidecar_keeper_actions_total{kind=\"fence\"}",
            Mode::Cluster => "valkey_sidecar_keeper_actions_total{kind=\"quorum_fence\"}",
        };
        [
            keeper,
            "valkey_sidecar_heartbeats_total{kind=\"isolation_fence\"}",
        ]
    }

    async fn stage(self, bin: &Path) -> Result<Stage> {
        let mut o = match self {
            Mode::Replication => StageOptions::replication("valkey", 2),
            Mode::Cluster => StageOptions::cluster("valkey", 3, 1),
        };
        o.kubelet = o.kubelet.sidecar_bin(bin);
        Stage::start(o).await
    }
}

/// One agent partition: what the clients saw, and how often the old primary's agent fenced it.
pub struct AgentCut {
    pub seen: Partitioned,
    pub fences: u64,
}

/// A healthy window: every agent's fences, and the writer's longest pause.
pub struct Healthy {
    pub fences: u64,
    pub pause: Duration,
    pub acked: usize,
}

/// The apiserver stopped for `length` under a writer.
pub struct Outage {
    pub length: Duration,
    pub pause: Duration,
    pub acked: usize,
    pub lost: usize,
    pub fences: u64,
}

/// Everything one mode's stage measured.
pub struct AgentMeasured {
    pub mode: Mode,
    pub cuts: Vec<AgentCut>,
    pub healthy: Vec<Healthy>,
    pub outage: Option<Outage>,
}

/// A baseline's partitions, with its name and configuration.
pub struct Baseline {
    pub name: String,
    pub config: String,
    pub runs: Vec<Partitioned>,
}

/// How long a healthy window lasts.
const WINDOW: Duration = Duration::from_secs(10);
/// Longest wait for a new primary after a cut.
const TAKE_OVER: Duration = Duration::from_secs(90);

/// The section: `BENCH_PARTITIONS` partitions per configuration (default 20),
/// `BENCH_HEALTHY_WINDOWS` healthy windows of 10 s per mode (default 20), the apiserver stopped
/// for `BENCH_OUTAGE_SECONDS` (default 300; 0 skips it).
pub async fn run(bin: &Path) -> Result<()> {
    let runs = env_count("BENCH_PARTITIONS", 20);
    let windows = env_count("BENCH_HEALTHY_WINDOWS", 20);
    let outage = Duration::from_secs(env_count("BENCH_OUTAGE_SECONDS", 300) as u64);
    let mut agents = Vec::new();
    for mode in [Mode::Replication, Mode::Cluster] {
        let s = mode.stage(bin).await?;
        let cuts = agent_cuts(&s, mode, runs).await?;
        let healthy = healthy_windows(&s, mode, windows).await?;
        let outage = match mode == Mode::Replication && !outage.is_zero() {
            true => Some(apiserver_outage(&s, outage).await?),
            false => None,
        };
        agents.push(AgentMeasured {
            mode,
            cuts,
            healthy,
            outage,
        });
    }
    let baselines = tokio::task::spawn_blocking(move || baselines(runs)).await??;
    report(&agents, &baselines);
    summary(&agents, &baselines);
    log(&agents, &baselines);
    Ok(())
}

async fn agent_cuts(s: &Stage, mode: Mode, runs: usize) -> Result<Vec<AgentCut>> {
    let mut out = Vec::new();
    for i in 0..runs {
        let cut = agent_cut(s, mode, i)
            .await
            .with_context(|| format!("{} partition {}/{runs}", mode.name(), i + 1))?;
        eprintln!(
            "agent {} partition {}/{runs}: writable {:?}, last ack on the cut side {:?} ({} after the cut), {} acked, {} lost, {} deposed, {} fences",
            mode.name(),
            i + 1,
            cut.seen.writable_after,
            cut.seen.last_ack,
            cut.seen.side_after,
            cut.seen.acked,
            cut.seen.lost,
            cut.seen.deposed,
            cut.fences
        );
        out.push(cut);
    }
    Ok(out)
}

/// Shard 0 at rest: its primary (by Valkey's word, labelled so), every other member replicating
/// from it with the link up. Returns the primary.
async fn steady(s: &Stage, mode: Mode) -> Result<String> {
    if mode == Mode::Replication {
        return shard::wait_steady(s, TAKE_OVER).await;
    }
    let found = std::sync::Mutex::new(None);
    poll_until(
        "shard 0 at rest",
        TAKE_OVER,
        Duration::from_millis(50),
        || async {
            let Ok((primary, others)) = s.primary_and_replicas(0) else {
                return Ok(false);
            };
            let linked = others.iter().all(|p| shard::follows(s, p, &primary));
            let labelled = shard::role_label(s, &primary).await.as_deref() == Some("primary");
            let done = linked && labelled;
            if done {
                *crate::lock(&found) = Some(primary);
            }
            Ok(done)
        },
    )
    .await?;
    found
        .into_inner()
        .ok()
        .flatten()
        .context("no primary recorded")
}

/// The writers' key tags for one run: the shard's slots in cluster mode, unique per run.
fn tags(s: &Stage, mode: Mode, old: &str, i: usize) -> Result<(String, String)> {
    let run = crate::rand_tag();
    let (main, side) = (format!("pm{run}x{i}"), format!("ps{run}x{i}"));
    match mode {
        Mode::Replication => Ok((main, side)),
        Mode::Cluster => {
            let addr = s.valkey(old)?;
            Ok((
                tag_named(addr, &s.client(), &main)?,
                tag_named(addr, &s.client(), &side)?,
            ))
        }
    }
}

/// The agent's fences on `pod` so far (both counters of the mode).
async fn fences(s: &Stage, pod: &str, mode: Mode) -> Result<u64> {
    let mut sum = 0;
    for sample in mode.fence_samples() {
        sum += s.agent_counter(pod, sample).await?;
    }
    Ok(sum)
}

/// One partition of the node of shard 0's primary (see the module docs).
async fn agent_cut(s: &Stage, mode: Mode, i: usize) -> Result<AgentCut> {
    s.flush_primaries()?;
    let old = steady(s, mode).await?;
    let members = s.shard_pods(0).to_vec();
    let node = s.node_of(&old).await?;
    let fenced_before = fences(s, &old, mode).await?;
    let (main_tag, side_tag) = tags(s, mode, &old, i)?;
    let addrs = members
        .iter()
        .map(|p| s.valkey(p))
        .collect::<Result<Vec<_>>>()?;
    let old_addr = s.valkey(&old)?;
    let main = s.writer(addrs, &main_tag);
    let side = s.writer_with(targets(vec![old_addr]), &side_tag, s.client_on(&node)?);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at = Instant::now();
    s.kubelet.partition_node(&node)?;
    let promoted = new_primary(s, &members, &old, &main_tag).await;
    let writable_after = at.elapsed();
    // The cut holds a moment past the promotion, as a partition outlasts the failover.
    tokio::time::sleep(Duration::from_secs(1)).await;
    s.kubelet.heal_node(&node)?;
    let promoted = promoted?;
    steady(s, mode).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (main, side) = (main.stop()?, side.stop()?);
    let new_addr = s.valkey(&promoted)?;
    let lost =
        s.lost(&promoted, &main_tag, &main.acked)? + s.lost(&promoted, &side_tag, &side.acked)?;
    let seen = Partitioned::measured(
        old_addr,
        (at, writable_after),
        (&main, &side),
        lost,
        new_addr,
    );
    let fences = fences(s, &old, mode).await?.saturating_sub(fenced_before);
    Ok(AgentCut { seen, fences })
}

/// Waits until a member other than `old` takes a write of a key of the shard and carries the
/// primary label; returns it.
async fn new_primary(s: &Stage, members: &[String], old: &str, tag: &str) -> Result<String> {
    let found = std::sync::Mutex::new(None);
    let key = format!("{{{tag}}}:probe");
    poll_until(
        "another member writable and labelled primary",
        TAKE_OVER,
        Duration::from_millis(5),
        || async {
            for p in members.iter().filter(|p| *p != old) {
                let writes = s.cmd(p, &["SET", &key, "1"]).is_ok();
                let labelled = shard::role_label(s, p).await.as_deref() == Some("primary");
                if writes && labelled {
                    *crate::lock(&found) = Some(p.clone());
                    return Ok(true);
                }
            }
            Ok(false)
        },
    )
    .await?;
    found
        .into_inner()
        .ok()
        .flatten()
        .context("no member recorded")
}

/// Every agent's fences so far, summed.
async fn all_fences(s: &Stage, mode: Mode) -> Result<u64> {
    let mut sum = 0;
    for pod in &s.pods {
        sum += fences(s, pod, mode).await?;
    }
    Ok(sum)
}

/// Every pod's Valkey address: a writer over them finds whichever accepts.
fn every_pod(s: &Stage) -> Result<Vec<std::net::SocketAddr>> {
    s.pods.iter().map(|p| s.valkey(p)).collect()
}

/// `windows` windows of [`WINDOW`] under a writer on every member, no fault.
async fn healthy_windows(s: &Stage, mode: Mode, windows: usize) -> Result<Vec<Healthy>> {
    let mut out = Vec::new();
    for i in 0..windows {
        s.flush_primaries()?;
        steady(s, mode).await?;
        let before = all_fences(s, mode).await?;
        let addrs = every_pod(s)?;
        let tag = match mode {
            Mode::Replication => format!("h{}", crate::rand_tag()),
            Mode::Cluster => tag_named(addrs[0], &s.client(), &format!("h{}x", crate::rand_tag()))?,
        };
        let writer = s.writer(addrs, &tag);
        tokio::time::sleep(WINDOW).await;
        let w = writer.stop()?;
        let fences = all_fences(s, mode).await?.saturating_sub(before);
        eprintln!(
            "agent {} healthy window {}/{windows}: {fences} fences, longest pause {:?}, {} acked",
            mode.name(),
            i + 1,
            w.longest_pause,
            w.acked.len()
        );
        out.push(Healthy {
            fences,
            pause: w.longest_pause,
            acked: w.acked.len(),
        });
    }
    Ok(out)
}

/// The apiserver stopped (SIGSTOP) for `length` under a writer, then continued.
async fn apiserver_outage(s: &Stage, length: Duration) -> Result<Outage> {
    s.flush_primaries()?;
    let primary = steady(s, Mode::Replication).await?;
    let before = all_fences(s, Mode::Replication).await?;
    let writer = s.writer(every_pod(s)?, &format!("o{}", crate::rand_tag()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.signal_apiserver("STOP")?;
    tokio::time::sleep(length).await;
    s.signal_apiserver("CONT")?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let tag = writer.tag.clone();
    let w = writer.stop()?;
    let now = steady(s, Mode::Replication).await?;
    let outage = Outage {
        length,
        pause: w.longest_pause,
        acked: w.acked.len(),
        lost: s.lost(&now, &tag, &w.acked)?,
        fences: all_fences(s, Mode::Replication)
            .await?
            .saturating_sub(before),
    };
    eprintln!(
        "apiserver stopped {length:?} ({primary} primary before, {now} after): longest pause {:?}, {} acked, {} lost, {} fences",
        outage.pause, outage.acked, outage.lost, outage.fences
    );
    Ok(outage)
}

/// The same partition without the agent: Valkey Cluster alone at the chart's node timeout, and
/// Sentinel (a sentinel beside each Valkey) with the chart's Valkey settings and with
/// `min-replicas-max-lag 1`.
fn baselines(runs: usize) -> Result<Vec<Baseline>> {
    let node_timeout = 5000;
    let cluster = crate::alone::cluster_partition_runs(runs, node_timeout, HOLD_CLUSTER)?;
    let mut out = vec![Baseline {
        name: "Valkey Cluster alone".into(),
        config: settings::valkey_alone(node_timeout, "default"),
        runs: cluster,
    }];
    for lag in ["10", "1"] {
        out.push(sentinel(runs, lag)?);
    }
    Ok(out)
}

/// How long a baseline's partition holds at least: past the moment the cut-off primary stops
/// taking writes (Valkey Cluster: the node timeout and a margin; Sentinel: the replica lag).
const HOLD_CLUSTER: Duration = Duration::from_secs(12);

/// Sentinel tuned as in the failover rows (`down-after-milliseconds 1000`), its Valkeys with
/// `min-replicas-to-write 1` and `min-replicas-max-lag <lag>`, a sentinel beside each.
fn sentinel(runs: usize, lag: &str) -> Result<Baseline> {
    let valkey = [(MIN_REPLICAS[0].0, "1"), ("min-replicas-max-lag", lag)];
    let server = valkey
        .iter()
        .fold(ServerOptions::default(), |o, (k, v)| o.arg(*k, *v));
    let mut opts = ReplicationOptions::from(server);
    opts.first_ip = Some(70);
    let set = ReplicationSet::start(2, opts)?;
    let binds = (73..76)
        .map(|i| std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, i)))
        .collect();
    let sentinel = SentinelOptions::default()
        .down_after(Duration::from_millis(1000))
        .failover_timeout(Duration::from_millis(10_000))
        .binds(binds);
    let budget = sentinel.failover_budget();
    let sentinels = Sentinels::monitor(&set, sentinel.clone())?;
    let hold = Duration::from_secs(lag.parse::<u64>().unwrap_or(10) + 4);
    let mut out = Vec::new();
    for i in 0..runs {
        let r = sentinels
            .partitioned(&set, crate::alone::SIDE_CLIENT_IP, hold, budget)
            .with_context(|| format!("Sentinel partition {}/{runs}", i + 1))?;
        progress(&format!("sentinel (lag {lag})"), i, runs, &r);
        out.push(r);
    }
    Ok(Baseline {
        name: format!("Sentinel, `min-replicas-max-lag {lag}`"),
        config: settings::sentinel(&sentinel, &valkey),
        runs: out,
    })
}

/// The rows' figures of one configuration's partitions.
struct Figures {
    last: (Duration, Duration),
    max_last: Duration,
    writable: (Duration, Duration),
    side_after: usize,
    acked: usize,
    lost: usize,
    deposed: usize,
}

fn figures(runs: &[&Partitioned]) -> Figures {
    let last: Vec<Duration> = runs.iter().map(|r| r.last_ack).collect();
    Figures {
        last: p50_p99(last.clone()),
        max_last: last.iter().copied().max().unwrap_or_default(),
        writable: p50_p99(runs.iter().map(|r| r.writable_after).collect()),
        side_after: runs.iter().map(|r| r.side_after).sum(),
        acked: runs.iter().map(|r| r.acked).sum(),
        lost: runs.iter().map(|r| r.lost).sum(),
        deposed: runs.iter().map(|r| r.deposed).sum(),
    }
}

fn row(who: &str, config: &str, runs: &[&Partitioned], fences: Option<u64>) -> String {
    let f = figures(runs);
    format!(
        "| {who} | {} | {} | {:.0} / {:.0} | {:.0} | {} | {:.0} / {:.0} | {} | {} | {} | {} |",
        faults::cell(config),
        runs.len(),
        ms(f.last.0),
        ms(f.last.1),
        ms(f.max_last),
        f.side_after,
        ms(f.writable.0),
        ms(f.writable.1),
        f.acked,
        f.lost,
        f.deposed,
        fences.map_or("–".into(), |n| n.to_string()),
    )
}

fn agent_runs(a: &AgentMeasured) -> Vec<&Partitioned> {
    a.cuts.iter().map(|c| &c.seen).collect()
}

fn report(agents: &[AgentMeasured], baselines: &[Baseline]) {
    println!(
        "### A primary's node partitioned, a client on its side still writing (real kube-apiserver; baselines on loopback, cut by address)\n"
    );
    println!(
        "Command: `BENCH_PARTITIONS={} target/release/bench partition`. Every run of the agents starts from an empty dataset (`FLUSHALL` on the primaries, which the replicas follow), so the chart's default `maxmemory` (768 MiB of the `small` preset's 1Gi) is never reached over the runs. Each run cuts the node of shard 0's primary from the other nodes and the apiserver (its processes run on) while a client bound to the node's address writes to the old primary and a writer on the majority side writes to whichever member accepts (clients with 1 s timeouts). *Last ack on the cut side*: the cut → the old primary's last acknowledgement to its side's client (0 when none came after the cut); what that side acknowledged is lost once the partition heals. *Writable*: the cut → the first write the majority side's new primary accepted (agent: also labelled primary). *Deposed*: writes another member acknowledged after the final primary's first. Baselines: the same valkey-server binary on loopback, every node on its own address, a sentinel beside each Valkey; the partition drops every packet between the cut side's addresses and the rest.\n",
        agents.first().map_or(0, |a| a.cuts.len())
    );
    println!(
        "| who | configuration | runs | last ack on the cut side p50 / p99 ms | max ms | acknowledged on the cut side after the cut | writable p50 / p99 ms | acknowledged | lost | deposed | old primary's fences |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for a in agents {
        let fences = a.cuts.iter().map(|c| c.fences).sum();
        let who = format!("agent, {} mode", a.mode.name());
        println!(
            "{}",
            row(&who, &a.mode.config(), &agent_runs(a), Some(fences))
        );
    }
    for b in baselines {
        let runs: Vec<&Partitioned> = b.runs.iter().collect();
        println!("{}", row(&b.name, &b.config, &runs, None));
    }
    println!();
    healthy_report(agents);
    outage_report(agents);
}

fn healthy_report(agents: &[AgentMeasured]) {
    println!("### Healthy shards under load: fences that should not happen\n");
    println!(
        "Each window writes to every pod for {} s with no fault; the fences are every agent's (`keeper_actions_total` fence or quorum fence, and `heartbeats_total{{kind=\"isolation_fence\"}}`), counted from their `/metrics` before and after.\n",
        WINDOW.as_secs()
    );
    println!("| stage | windows | fences | longest write pause p50 / max ms | acknowledged |");
    println!("|---|---|---|---|---|");
    for a in agents {
        let pauses: Vec<Duration> = a.healthy.iter().map(|h| h.pause).collect();
        let (p50, _) = p50_p99(pauses.clone());
        println!(
            "| {} | {} | {} | {:.0} / {:.0} | {} |",
            faults::cell(&a.mode.config()),
            a.healthy.len(),
            a.healthy.iter().map(|h| h.fences).sum::<u64>(),
            ms(p50),
            ms(pauses.iter().copied().max().unwrap_or_default()),
            a.healthy.iter().map(|h| h.acked).sum::<usize>()
        );
    }
    println!();
}

fn outage_report(agents: &[AgentMeasured]) {
    let Some((a, o)) = agents
        .iter()
        .find_map(|a| a.outage.as_ref().map(|o| (a, o)))
    else {
        return;
    };
    println!("### The apiserver stopped (replication mode)\n");
    println!(
        "The kube-apiserver process is stopped (SIGSTOP: connections hang, as in an etcd or control-plane outage) for {} s under a writer on every pod, then continued. The shard's record lives in the apiserver; the primary keeps writing while its peers vouch for it.\n",
        o.length.as_secs()
    );
    println!("| stage | outage s | longest write pause ms | acknowledged | lost | fences |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.0} | {} | {} | {} |\n",
        faults::cell(&a.mode.config()),
        o.length.as_secs(),
        ms(o.pause),
        o.acked,
        o.lost,
        o.fences
    );
}

/// The summary's partition rows: cluster mode against Valkey alone, replication mode against
/// Sentinel at both lags.
fn summary(agents: &[AgentMeasured], baselines: &[Baseline]) {
    let pairs = [
        (Mode::Cluster, 0, "cluster-partition"),
        (Mode::Replication, 1, "replication-partition"),
        (Mode::Replication, 2, "replication-partition-lag1"),
    ];
    for (mode, b, key) in pairs {
        let (Some(a), Some(b)) = (agents.iter().find(|a| a.mode == mode), baselines.get(b)) else {
            continue;
        };
        crate::summary::record(&summary_row(key, a, b));
    }
}

fn summary_row(key: &str, a: &AgentMeasured, b: &Baseline) -> crate::summary::Row {
    use crate::summary::{Row, Side};
    let side = |who: &str, config: &str, runs: &[&Partitioned]| {
        let last: Vec<Duration> = runs.iter().map(|r| r.last_ack).collect();
        let f = figures(runs);
        Side::timing(who, config, &last).lost(f.lost, Some(f.acked))
    };
    let theirs: Vec<&Partitioned> = b.runs.iter().collect();
    Row {
        key: key.into(),
        measure: format!(
            "{} mode, primary's node partitioned, a client on its side → its last acknowledged write after the cut (agent: chart defaults)",
            a.mode.name()
        ),
        ours: side("agent", &a.mode.config(), &agent_runs(a)),
        theirs: Some(side(&b.name, &b.config, &theirs)),
        runs: format!("{} + {}", a.cuts.len(), b.runs.len()),
        why: "a cut-off primary acknowledges its side's writes until it fences (the agent: no peer vouched for it within the isolation window), and every one of them is lost when the partition heals".into(),
    }
}

fn as_runs<'a>(scenario: &'a str, runs: &[&Partitioned]) -> faults::Runs<'a> {
    faults::Runs {
        scenario,
        acked: Some(runs.iter().map(|r| r.acked).sum()),
        lost: runs.iter().map(|r| r.lost).sum(),
        deposed: Some(runs.iter().map(|r| r.deposed).sum()),
        recovery: runs.iter().map(|r| r.last_ack).collect(),
        what: "cut → the cut-off primary's last acknowledged write",
    }
}

/// The partitions as rows of the fault table.
fn log(agents: &[AgentMeasured], baselines: &[Baseline]) {
    for a in agents {
        let scenario = format!("{}: primary's node partitioned (agent)", a.mode.name());
        faults::record_runs("partition", as_runs(&scenario, &agent_runs(a)));
    }
    for b in baselines {
        let scenario = format!("primary's node partitioned ({})", b.name);
        let runs: Vec<&Partitioned> = b.runs.iter().collect();
        faults::record_runs("partition", as_runs(&scenario, &runs));
    }
}

/// One run's line on stderr, as the runs go.
pub fn progress(who: &str, i: usize, runs: usize, r: &Partitioned) {
    eprintln!(
        "{who} partition {}/{runs}: writable {:?}, last ack on the cut side {:?} ({} after the cut), {} acked, {} lost, {} deposed",
        i + 1,
        r.writable_after,
        r.last_ack,
        r.side_after,
        r.acked,
        r.lost,
        r.deposed
    );
}
