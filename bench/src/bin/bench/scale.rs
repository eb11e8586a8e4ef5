//! Scale (issue 33): chart installs of 10, 25 and 50 shards × 2 pods on the real control plane,
//! the agents' release binary, one run per size: how long the install takes to be formed,
//! labelled, Ready and synced; the coordinator's round time and memory; every agent's memory;
//! apiserver requests per minute by agent class from the audit log; one hand-over on cordon under
//! a writer; a `kubectl drain` of every node in turn under a writer per 5 shards. Each figure is
//! plotted against the size, its growth stated, and its value at 1,000 pods predicted from it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use valkey_sidecar_testkit::k8s::audit::{Usage, pod_identity};
use valkey_sidecar_testkit::k8s::follow::{Addresses, Watcher};
use valkey_sidecar_testkit::k8s::writer::{Ack, Writer, missing, tag_for_with};
use valkey_sidecar_testkit::k8s::{ROLE_LABEL, Stage, StageOptions, poll_until};

use crate::machine::{Snapshot, TICKS_PER_S, describe};
use crate::plot::{Line, growth};
use crate::{cordon, proc_stats};

/// How long an install of the largest size may take to settle.
const SETTLE: Duration = Duration::from_secs(900);
/// kube-controller-manager's `--node-monitor-grace-period`: Kubernetes' default.
const NODE_GRACE: Duration = Duration::from_secs(50);
/// The steady-state window the request rates come from.
const STEADY: Duration = Duration::from_secs(60);
/// Shards per writer during the drains.
const SHARDS_PER_WRITER: usize = 5;

/// One size's figures.
#[derive(Debug, Clone, Default)]
struct Row {
    shards: usize,
    pods: usize,
    settled: Duration,
    round_mean: Duration,
    round_p99: Duration,
    /// The rounds' mean CPU time: the mean less the waits for a CPU on a busy machine.
    round_cpu_mean: Duration,
    /// Pods the coordinator's formation rounds observed from the steady window's start to the
    /// hand-over's end, by how: vouched, disagreed, audit, silent (`FORMATION_READS`).
    formation_reads: [f64; 4],
    coordinator_rss_kib: u64,
    agent_rss_median_kib: u64,
    agent_rss_max_kib: u64,
    /// Each agent's CPU over the steady window, in % of one core: the median and the busiest.
    agent_cpu_median_pct: f64,
    agent_cpu_max_pct: f64,
    /// The same for each pod's `valkey-settings` container and Valkey.
    settings_cpu_median_pct: f64,
    valkey_cpu_median_pct: f64,
    /// The `valkey-settings` containers' resident memory: the largest.
    settings_rss_max_kib: u64,
    /// The whole machine's CPU over the steady window, by kind of process.
    machine: String,
    /// UDP datagrams sent per second on the machine over the steady window: the agents' peer
    /// heartbeats (Valkey's cluster bus is TCP), every primary pinging every other primary.
    udp_out_per_s: f64,
    /// Quorum fences every agent raised over the steady window: each stops a healthy primary's
    /// writes for nothing, so anything but 0 is a defect.
    steady_fences: u64,
    /// Requests per minute: the coordinator, the busiest follower, the whole apiserver.
    coordinator_rpm: f64,
    follower_rpm: f64,
    /// The followers' mean: a busiest follower in a one-minute window is one whose watches were
    /// re-established in it (each every few minutes).
    follower_mean_rpm: f64,
    apiserver_rpm: f64,
    /// The machine's 1-minute load average at the end of the steady window, and the highest at
    /// the end of a drain: on 2 cores, past ~2 everything waits for CPU.
    load_steady: f64,
    load_drains: f64,
    /// What the busiest follower sent over the window: its pod, then verb and resource counts.
    follower_requests: String,
    handover_pause: Duration,
    handover_lost: usize,
    drains: usize,
    drain_longest: Duration,
    drain_pause: Duration,
    drain_acked: usize,
    drain_lost: usize,
    /// Drains run again after `kubectl drain` gave up (an apiserver timeout, a refused eviction
    /// past its own timeout): node and kubectl's last words, as an operator would retry them.
    drain_retries: Vec<String>,
    /// After each drain, once settled: the most and the fewest primaries on one node, then the
    /// most and the fewest pods.
    balance: Vec<Spread>,
    /// From the end of the last drain until no node carries more than ⌈shards / nodes⌉
    /// primaries (the coordinator's balance, one move per cooldown after a quiet period), or
    /// until the coordinator says no move can get there; `None`: not timed.
    balanced_after: Option<Balance>,
    /// Why this size stopped before its last phase (what was measured until then stays).
    failed: Option<String>,
}

/// The sizes to run (`BENCH_SCALE_SHARDS`, default `10 25 50`).
fn sizes() -> Result<Vec<usize>> {
    let text = std::env::var("BENCH_SCALE_SHARDS").unwrap_or_else(|_| "10 25 50".into());
    let sizes: Vec<usize> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("BENCH_SCALE_SHARDS={text:?}"))?;
    if sizes.is_empty() {
        bail!("BENCH_SCALE_SHARDS names no size");
    }
    Ok(sizes)
}

/// Runs every size, then prints the table, the plots and the growth of each figure.
pub async fn run(bin: &Path) -> Result<()> {
    let mut rows = Vec::new();
    for shards in sizes()? {
        let row = one(bin, shards).await;
        eprintln!("scale {shards} shards: {row:?}");
        rows.push(row);
    }
    print_table(&rows);
    // A size that did not settle has no figure to grow from.
    let settled: Vec<Row> = rows.into_iter().filter(|r| !r.settled.is_zero()).collect();
    print_growth(&settled);
    print_plots(&settled)
}

/// One install of `shards` × 2 pods, measured, then torn down. A phase that fails ends the size:
/// the figures measured before it stay in the report, beside the failure.
async fn one(bin: &Path, shards: usize) -> Row {
    let mut row = Row {
        shards,
        pods: shards * 2,
        ..Row::default()
    };
    if let Err(e) = measure(bin, &mut row).await {
        let why = format!("{e:#}");
        eprintln!("scale {shards} shards failed: {why}");
        let first = why.lines().next().unwrap_or_default();
        let last = last_words(&why);
        row.failed = Some(match first == last {
            true => last,
            false => format!("{first} … {last}"),
        });
    }
    row
}

async fn measure(bin: &Path, row: &mut Row) -> Result<()> {
    let shards = row.shards;
    let mut opts = StageOptions::cluster(&format!("scale-{shards}"), shards, 1);
    opts.kubelet = opts.kubelet.sidecar_bin(bin);
    opts.plane.audit = true;
    // Kubernetes' default, not the tests' 10 s (there, for node faults in seconds): the harness's
    // kubelets share the 2 cores with 100 Valkeys, and with 10 s the node controller evicted 59
    // pods of nodes whose heartbeats were only late.
    opts.plane.node_monitor_grace_period = NODE_GRACE;
    // As on a real node, the pods together weigh what the machine has (`kubepods`), so the
    // control plane and the kubelets, on machines of their own or outside `kubepods` in real
    // life, are not starved by 200 busy processes (at 50 shards the apiserver answered 504s).
    opts.kubelet.pods_cpu_shares = Some(pods_cpu_shares());
    let t = Instant::now();
    let stage = Stage::install(opts).await?;
    stage.wait_settled(shards * 2, shards, SETTLE).await?;
    stage.wait_synced(SETTLE).await?;
    row.settled = t.elapsed();
    let coordinator = stage.wait_coordinator(Duration::from_secs(60)).await?;
    let reads = formation_reads(&stage, &coordinator).await?;
    steady(&stage, &coordinator, row).await?;
    memory(&stage, &coordinator, row)?;
    handover(&stage, row).await?;
    let reads_after = formation_reads(&stage, &coordinator).await?;
    row.formation_reads = std::array::from_fn(|k| reads_after[k] - reads[k]);
    eprintln!("scale {shards} shards, up to the hand-over: {row:?}");
    // The drains restart the coordinator's pod (its histogram with it): its rounds so far first,
    // then whoever coordinates after the last drain.
    let before = round_time(&stage, &coordinator).await?;
    (row.round_mean, row.round_p99, row.round_cpu_mean) = before.merged(None);
    // The drains' rounds carry moves and re-created pods: the rounds before them, apart.
    eprintln!(
        "scale {shards} shards, rounds up to the drains: {} rounds, mean {:?}, CPU mean {:?}",
        before.count, row.round_mean, row.round_cpu_mean
    );
    drains(&stage, row).await?;
    let now = stage.wait_coordinator(Duration::from_secs(60)).await?;
    let after = round_time(&stage, &now).await.ok();
    (row.round_mean, row.round_p99, row.round_cpu_mean) = before.merged(after);
    Ok(())
}

/// A coordinator's round histograms: the sum and count of its rounds, their p99 bucket bound,
/// and the sum of their CPU times.
#[derive(Debug, Clone, Copy, Default)]
struct Rounds {
    sum: f64,
    count: f64,
    p99: f64,
    cpu_sum: f64,
}

impl Rounds {
    /// The mean over both coordinators' rounds, the larger p99 (a bucket bound, not mergeable)
    /// and the mean CPU time.
    fn merged(self, other: Option<Rounds>) -> (Duration, Duration, Duration) {
        let o = other.unwrap_or_default();
        let count = self.count + o.count;
        (
            Duration::from_secs_f64((self.sum + o.sum) / count),
            Duration::from_secs_f64(self.p99.max(o.p99)),
            Duration::from_secs_f64((self.cpu_sum + o.cpu_sum) / count),
        )
    }
}

/// A minute of steady state from the audit log: the coordinator, the busiest follower, all.
async fn steady(stage: &Stage, coordinator: &str, row: &mut Row) -> Result<()> {
    let log = stage.plane.audit_log().context("the audit log is off")?;
    // The agents' start-up requests (lists, label writes) are behind them.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let from = SystemTime::now();
    let (ticks, udp) = (Ticks::take(stage)?, udp_out()?);
    let machine = Snapshot::take();
    let fenced = fences(stage).await?;
    tokio::time::sleep(STEADY + Duration::from_secs(1)).await;
    let (ticks_after, udp_after) = (Ticks::take(stage)?, udp_out()?);
    row.steady_fences = fences(stage).await?.saturating_sub(fenced);
    let window = (STEADY + Duration::from_secs(1)).as_secs_f64();
    row.machine = describe(&machine.usage(&Snapshot::take(), window));
    row.udp_out_per_s = udp_after.saturating_sub(udp) as f64 / window;
    let agents = cpu_pct(&ticks.agent, &ticks_after.agent, window);
    row.agent_cpu_median_pct = median(&agents);
    row.agent_cpu_max_pct = agents.last().copied().unwrap_or(0.0);
    row.settings_cpu_median_pct = median(&cpu_pct(&ticks.settings, &ticks_after.settings, window));
    row.valkey_cpu_median_pct = median(&cpu_pct(&ticks.valkey, &ticks_after.valkey, window));
    let usage = log.usage(from, from + STEADY)?;
    let rate = |pod: &str| usage.per_minute(usage.total(&pod_identity(&stage.namespace, pod)));
    row.coordinator_rpm = rate(coordinator);
    let followers: Vec<(&String, f64)> = stage
        .pods
        .iter()
        .filter(|p| p.as_str() != coordinator)
        .map(|p| (p, rate(p)))
        .collect();
    let busiest = followers.iter().max_by(|a, b| a.1.total_cmp(&b.1));
    row.follower_rpm = busiest.map_or(0.0, |(_, r)| *r);
    let total: f64 = followers.iter().map(|(_, r)| r).sum();
    row.follower_mean_rpm = total / followers.len().max(1) as f64;
    row.load_steady = load_average()?;
    row.follower_requests = busiest.map_or_else(String::new, |(p, _)| {
        requests_of(&usage, p, &pod_identity(&stage.namespace, p))
    });
    row.apiserver_rpm = usage.per_minute(crate::api::all_requests(&usage));
    Ok(())
}

/// `cpu.shares` of the pods' cgroup: 1024 per core of this machine, what a kubelet gives
/// `kubepods` on a node with nothing reserved.
fn pods_cpu_shares() -> u64 {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    1024 * u64::try_from(cores).unwrap_or(1)
}

/// The machine's 1-minute load average (`/proc/loadavg`).
fn load_average() -> Result<f64> {
    let text = std::fs::read_to_string("/proc/loadavg")?;
    let first = text.split_whitespace().next().unwrap_or_default();
    first
        .parse()
        .with_context(|| format!("/proc/loadavg: {text:?}"))
}

/// `pod: verb resource n, …` over the window, or `pod: none`.
fn requests_of(usage: &Usage, pod: &str, who: &str) -> String {
    let counts = usage.by_client.get(who).into_iter().flatten();
    let listed: Vec<String> = counts
        .map(|((verb, res), n)| format!("{verb} {res} {n}"))
        .collect();
    match listed.is_empty() {
        true => format!("{pod}: none"),
        false => format!("{pod}: {}", listed.join(", ")),
    }
}

/// Each pod's containers' CPU time so far, in clock ticks, in pod order.
struct Ticks {
    agent: Vec<u64>,
    settings: Vec<u64>,
    valkey: Vec<u64>,
}

impl Ticks {
    fn take(stage: &Stage) -> Result<Ticks> {
        Ok(Ticks {
            agent: container_stats(stage, "valkey-sidecar")?
                .into_iter()
                .map(|s| s.1)
                .collect(),
            settings: container_stats(stage, "valkey-settings")?
                .into_iter()
                .map(|s| s.1)
                .collect(),
            valkey: container_stats(stage, "valkey")?
                .into_iter()
                .map(|s| s.1)
                .collect(),
        })
    }
}

/// Every pod's `container`: resident KiB and CPU ticks, in pod order.
fn container_stats(stage: &Stage, container: &str) -> Result<Vec<(u64, u64)>> {
    stage
        .pods
        .iter()
        .map(|pod| {
            let pid = stage
                .kubelet
                .container_pid(&stage.namespace, pod, container)
                .with_context(|| format!("no {container} process in {pod}"))?;
            proc_stats(pid)
        })
        .collect()
}

/// % of one core per process between two tick counts `secs` apart, sorted.
fn cpu_pct(before: &[u64], after: &[u64], secs: f64) -> Vec<f64> {
    let mut cpu: Vec<f64> = after
        .iter()
        .zip(before)
        .map(|(b, a)| b.saturating_sub(*a) as f64 / TICKS_PER_S / secs * 100.0)
        .collect();
    cpu.sort_by(f64::total_cmp);
    cpu
}

fn median(sorted: &[f64]) -> f64 {
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// UDP datagrams this machine has sent (`OutDatagrams` of `/proc/net/snmp`).
fn udp_out() -> Result<u64> {
    let snmp = std::fs::read_to_string("/proc/net/snmp")?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next(), udp.next());
    let (Some(names), Some(values)) = (names, values) else {
        bail!("no Udp lines in /proc/net/snmp");
    };
    let at = names
        .split_whitespace()
        .position(|n| n == "OutDatagrams")
        .context("no OutDatagrams")?;
    let value = values.split_whitespace().nth(at).context("OutDatagrams")?;
    Ok(value.parse()?)
}

/// The agents' resident memory, the coordinator's apart, and the settings containers'.
fn memory(stage: &Stage, coordinator: &str, row: &mut Row) -> Result<()> {
    let stats = container_stats(stage, "valkey-sidecar")?;
    let mut agents: Vec<u64> = stats.iter().map(|s| s.0).collect();
    if let Some(at) = stage.pods.iter().position(|p| p == coordinator) {
        row.coordinator_rss_kib = agents.get(at).copied().unwrap_or(0);
    }
    agents.sort_unstable();
    row.agent_rss_median_kib = agents.get(agents.len() / 2).copied().unwrap_or(0);
    row.agent_rss_max_kib = agents.last().copied().unwrap_or(0);
    let settings = container_stats(stage, "valkey-settings")?;
    row.settings_rss_max_kib = settings.iter().map(|s| s.0).max().unwrap_or(0);
    Ok(())
}

/// The quorum fences every agent has raised so far (cluster mode: those for want of heartbeat
/// vouches are among them).
async fn fences(stage: &Stage) -> Result<u64> {
    let sample = "valkey_sidecar_keeper_actions_total{kind=\"quorum_fence\"}";
    stage.agents_counter(sample).await
}

/// The kinds of `valkey_sidecar_formation_reads_total`, in `Row::formation_reads`' order.
const FORMATION_READS: [&str; 4] = ["vouched", "disagreed", "audit", "silent"];

/// The coordinator's `/metrics` text.
async fn metrics(stage: &Stage, coordinator: &str) -> Result<String> {
    let agent = stage.agent(coordinator)?;
    let timeout = Duration::from_secs(5);
    let (code, text) = valkey_sidecar_testkit::k8s::http_get(agent, "/metrics", timeout).await?;
    if code != 200 {
        bail!("{coordinator}: /metrics answered {code}");
    }
    Ok(text)
}

/// The value of the sample named exactly `name` (labels included), 0 when absent.
fn sample(text: &str, name: &str) -> f64 {
    let prefix = format!("{name} ");
    let line = text.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
    line.and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
}

/// The pods the coordinator's formation rounds observed so far, by [`FORMATION_READS`].
async fn formation_reads(stage: &Stage, coordinator: &str) -> Result<[f64; 4]> {
    let text = metrics(stage, coordinator).await?;
    let of = |kind: &str| {
        let name = format!("valkey_sidecar_formation_reads_total{{kind=\"{kind}\"}}");
        sample(&text, &name)
    };
    Ok(FORMATION_READS.map(of))
}

/// The coordinator's round time from its histogram: the mean, and the upper bound of the bucket
/// that holds the 99th percentile.
async fn round_time(stage: &Stage, coordinator: &str) -> Result<Rounds> {
    let metric = "valkey_sidecar_coordinator_round_duration_seconds";
    let text = metrics(stage, coordinator).await?;
    let value = |name: &str| sample(&text, name);
    let count = value(&format!("{metric}_count"));
    if count == 0.0 {
        bail!("{coordinator} counted no coordinator round");
    }
    let sum = value(&format!("{metric}_sum"));
    let p99 = bucket_quantile(&text, metric, count, 0.99);
    let cpu_sum = value("valkey_sidecar_coordinator_round_cpu_seconds_sum");
    Ok(Rounds {
        sum,
        count,
        p99,
        cpu_sum,
    })
}

/// The upper bound of the first bucket of `metric` holding the `q` quantile of `count` samples.
fn bucket_quantile(text: &str, metric: &str, count: f64, q: f64) -> f64 {
    let prefix = format!("{metric}_bucket{{le=\"");
    let buckets = text.lines().filter_map(|l| {
        let rest = l.strip_prefix(prefix.as_str())?;
        let (le, n) = rest.split_once("\"} ")?;
        Some((
            le.parse::<f64>().unwrap_or(f64::INFINITY),
            n.trim().parse::<f64>().ok()?,
        ))
    });
    buckets
        .filter(|(_, n)| *n >= count * q)
        .map(|(le, _)| le)
        .fold(f64::INFINITY, f64::min)
}

/// One hand-over under a writer: the node of shard 1's primary cordoned.
async fn handover(stage: &Stage, row: &mut Row) -> Result<()> {
    let shard = 1.min(row.shards - 1);
    let (primary, _) = stage.primary_and_replicas(shard)?;
    let node = stage.node_of(&primary).await?;
    let writer = stage.shard_writer(shard)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    cordon(stage, &node, true).await?;
    let moved = poll_until(
        "the primary handed over",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async {
            Ok(stage
                .labels(&primary)
                .await?
                .get(ROLE_LABEL)
                .map(String::as_str)
                == Some("replica"))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tag = writer.tag.clone();
    let written = writer.stop()?;
    cordon(stage, &node, false).await?;
    moved?;
    let (now_primary, _) = stage.primary_and_replicas(shard)?;
    row.handover_lost = stage.lost(&now_primary, &tag, &written.acked)?;
    row.handover_pause = written.longest_pause;
    Ok(())
}

/// `kubectl drain` of every node in turn under a writer per [`SHARDS_PER_WRITER`] shards; each
/// drain waits for the deployment to settle again before the next.
async fn drains(stage: &Stage, row: &mut Row) -> Result<()> {
    // A drained pod comes back with a new IP: the writers follow it, as a client follows a
    // Service's endpoints (a fixed list left a writer waiting minutes for a pod it could not
    // reach). Listed every 500 ms, not the tests' 50 ms: 100 pods listed 20 times a second
    // would be much of what this apiserver serves.
    let addresses = Addresses::new(&stage.pod_objects().await?);
    let watcher = Watcher::start_every(stage, addresses.clone(), Duration::from_millis(500));
    let writers: Vec<(usize, Writer)> = (0..row.shards)
        .step_by(SHARDS_PER_WRITER)
        .map(|k| Ok((k, following_writer(stage, &addresses, k)?)))
        .collect::<Result<_>>()?;
    for node in stage.nodes.names() {
        let t = Instant::now();
        drain(stage, &node, row).await?;
        stage.plane.kubectl(&["uncordon", &node]).await?;
        stage.wait_settled(row.pods, row.shards, SETTLE).await?;
        stage.wait_synced(SETTLE).await?;
        row.balance.push(per_node(stage).await?);
        row.drain_longest = row.drain_longest.max(t.elapsed());
        row.load_drains = row.load_drains.max(load_average()?);
        row.drains += 1;
    }
    row.balanced_after = Some(balanced(stage, row.shards).await?);
    for (shard, writer) in writers {
        let tag = writer.tag.clone();
        let written = writer.stop()?;
        let (primary, _) = stage.primary_and_replicas(shard)?;
        let lost = missing(
            stage.valkey(&primary)?,
            &stage.client(),
            &tag,
            &written.acked,
        )?;
        tell_lost(shard, &primary, &lost, &written.acks);
        row.drain_lost += lost.len();
        row.drain_acked += written.acked.len();
        row.drain_pause = row.drain_pause.max(written.longest_pause);
        tell_longest_gap(shard, &written.acks);
    }
    watcher.stop();
    Ok(())
}

/// The most and the fewest primaries on one node (by the pods' role labels), and the same for
/// pods (nodes with none count): how evenly consecutive drains leave them.
#[derive(Debug, Clone, Copy)]
struct Spread {
    primaries: (usize, usize),
    pods: (usize, usize),
}

async fn per_node(stage: &Stage) -> Result<Spread> {
    let zero: BTreeMap<String, usize> = stage.nodes.names().into_iter().map(|n| (n, 0)).collect();
    let (mut primaries, mut pods) = (zero.clone(), zero);
    for pod in stage.pod_objects().await? {
        let labels = pod.metadata.labels.unwrap_or_default();
        let Some(node) = pod.spec.and_then(|s| s.node_name) else {
            continue;
        };
        if labels.get(ROLE_LABEL).map(String::as_str) == Some("primary") {
            *primaries.entry(node.clone()).or_default() += 1;
        }
        *pods.entry(node).or_default() += 1;
    }
    let most_fewest = |m: &BTreeMap<String, usize>| {
        let max = m.values().max().copied().unwrap_or(0);
        (max, m.values().min().copied().unwrap_or(0))
    };
    Ok(Spread {
        primaries: most_fewest(&primaries),
        pods: most_fewest(&pods),
    })
}

/// How long the balance may take after the drains before the bench moves on.
const BALANCED_WITHIN: Duration = Duration::from_secs(600);

/// How the primaries ended up after the drains.
#[derive(Debug, Clone)]
enum Balance {
    /// No node over its even share, this long after the last drain.
    Even(Duration),
    /// The coordinator's `PrimariesBalanced` condition said, for [`STUCK_FOR`] on end, that
    /// no move can get there (this long after the last drain): its words.
    Stuck(Duration, String),
    /// Neither within [`BALANCED_WITHIN`].
    NotEven,
}

/// How long the coordinator must say a crowding cannot be lowered before the bench believes it.
const STUCK_FOR: Duration = Duration::from_secs(30);

/// Waits until no node carries more than its even share of primaries, or the coordinator says
/// that cannot happen.
async fn balanced(stage: &Stage, shards: usize) -> Result<Balance> {
    let cap = shards.div_ceil(stage.nodes.names().len().max(1));
    let t = Instant::now();
    let mut stuck_since: Option<Instant> = None;
    while t.elapsed() < BALANCED_WITHIN {
        if per_node(stage).await?.primaries.0 <= cap {
            return Ok(Balance::Even(t.elapsed()));
        }
        let said = stage
            .condition("PrimariesBalanced")
            .await?
            .unwrap_or_default();
        match said.contains("cannot lower") {
            true if stuck_since.is_some_and(|s| s.elapsed() >= STUCK_FOR) => {
                return Ok(Balance::Stuck(t.elapsed(), said));
            }
            true => stuck_since = stuck_since.or(Some(Instant::now())),
            false => stuck_since = None,
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok(Balance::NotEven)
}

/// Times `kubectl drain` is run on one node before the size gives up.
const DRAIN_ATTEMPTS: usize = 3;

/// `kubectl drain` of `node`, run again when it gives up, as an operator would: it aborts on an
/// apiserver timeout, and on an eviction still refused after its `--timeout`. Each retry is kept
/// for the report with kubectl's last words.
async fn drain(stage: &Stage, node: &str, row: &mut Row) -> Result<()> {
    let args = [
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=300s",
    ];
    for attempt in 1..=DRAIN_ATTEMPTS {
        let Err(e) = stage.plane.kubectl(&args).await else {
            return Ok(());
        };
        let why = last_words(&format!("{e:#}"));
        eprintln!("bench scale: drain of {node}, attempt {attempt}, failed: {e:#}");
        if attempt == DRAIN_ATTEMPTS {
            bail!("kubectl drain {node} failed {DRAIN_ATTEMPTS} times, last: {why}");
        }
        row.drain_retries.push(format!("{node}: {why}"));
    }
    Ok(())
}

/// The last non-empty line of a command's error (kubectl's own verdict; its first lines are
/// often client-side throttling notices).
fn last_words(error: &str) -> String {
    let line = error.lines().rev().map(str::trim).find(|l| !l.is_empty());
    line.unwrap_or_default().to_owned()
}

/// A writer on a key shard `k`'s primary serves, over the shard's pods' current addresses.
fn following_writer(stage: &Stage, addresses: &Addresses, k: usize) -> Result<Writer> {
    let (primary, _) = stage.primary_and_replicas(k)?;
    let tag = tag_for_with(stage.valkey(&primary)?, &stage.client())?;
    let targets = addresses.by_shard.get(&k.to_string());
    let targets = targets.with_context(|| format!("no pods of shard {k}"))?;
    Ok(stage.writer_with(targets.clone(), &tag, stage.client()))
}

/// Prints which nodes acknowledged a writer's lost writes, and when (Unix time, to find in the
/// pods' logs kept with `VALKEY_TESTKIT_KEEP_DIRS=1`): a loss is traced, not only counted.
fn tell_lost(shard: usize, primary: &str, lost: &[u64], acks: &[Ack]) {
    if lost.is_empty() {
        return;
    }
    let lost: std::collections::BTreeSet<u64> = lost.iter().copied().collect();
    let mut by_node: BTreeMap<String, (usize, f64, f64, u64, u64)> = BTreeMap::new();
    for a in acks.iter().filter(|a| lost.contains(&a.n)) {
        let t = unix(a.at);
        let e = by_node
            .entry(a.node.to_string())
            .or_insert((0, t, t, a.n, a.n));
        *e = (e.0 + 1, e.1.min(t), e.2.max(t), e.3.min(a.n), e.4.max(a.n));
    }
    for (node, (count, from, to, first, last)) in by_node {
        eprintln!(
            "bench scale: writer of shard {shard} (read back from {primary}): {count} lost writes acknowledged by {node} from {from:.3} to {to:.3} (n {first}..={last})"
        );
    }
}

/// An instant of this process as Unix time.
fn unix(at: Instant) -> f64 {
    let ago = Instant::now().saturating_duration_since(at);
    let now = SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.unwrap_or_default().saturating_sub(ago).as_secs_f64()
}

/// Prints when a writer's longest gap between acknowledgements began and ended (Unix time, to
/// find in the pods' logs) and which nodes acknowledged on either side.
fn tell_longest_gap(shard: usize, acks: &[Ack]) {
    let Some(pair) = acks.windows(2).max_by_key(|w| w[1].at - w[0].at) else {
        return;
    };
    eprintln!(
        "bench scale: writer of shard {shard}: longest gap {:?} from {:.3} ({}) to {:.3} ({})",
        pair[1].at - pair[0].at,
        unix(pair[0].at),
        pair[0].node,
        unix(pair[1].at),
        pair[1].node
    );
}

fn print_table(rows: &[Row]) {
    println!("### Scale: chart installs of N shards × 2 pods\n");
    println!(
        "Command: `BENCH_SCALE_SHARDS=\"10 25 50\" target/release/bench scale`. Each size is one chart install with the chart's defaults (cluster mode, 1 replica per shard) on 6 fake nodes in 3 zones, the agents' release binary, real kube-apiserver, scheduler and controller-manager on this 2-core machine; the controller-manager at Kubernetes' default node-monitor grace period ({} s), the harness's kubelets renewing each node's Lease every 2 s, each node on its own; every container in one `cpu` cgroup weighing 1024 per core (`cpu.shares`, as a kubelet's `kubepods`), so the pods together weigh as much as the machine's cores against each thread of the control plane and the harness, which real clusters run on machines of their own or outside `kubepods` (without it, the 50-shard install's apiserver timed out at a load of 170). Settled: `helm install` until every pod is Ready, labelled and every replica synced. Round: the coordinator's `valkey_sidecar_coordinator_round_duration_seconds` over the whole run — the first coordinator's rounds up to the drains, and those of whoever coordinates after the last drain (the drains restart the first one's pod): the mean over both, and the larger bucket bound holding a p99; CPU: the mean of `valkey_sidecar_coordinator_round_cpu_seconds` over the same rounds (the round's thread's time on a CPU, its CPU clock `CLOCK_THREAD_CPUTIME_ID`: the duration less its waits for a CPU). Formation reads: the pods the coordinator's formation rounds observed from the steady window's start to the hand-over's end (`valkey_sidecar_formation_reads_total`): vouched for by their short answers / read in full (disagreed + in turn) / silent. Requests: the audit log over a {} s steady window; each agent's, `valkey-settings` container's and Valkey's CPU (`/proc/<pid>/stat`), the whole machine's CPU by kind of process (every process in `/proc`) and its UDP datagrams sent (`/proc/net/snmp`: the agents' peer heartbeats) over the same window; fences: the quorum fences every agent raised in it (`keeper_actions_total{{kind=\"quorum_fence\"}}`; each pauses a healthy primary's writes, so 0 is the only right figure); memory is resident memory (`VmRSS`) after it. Hand-over: shard 1's primary node cordoned under a writer. Drains: `kubectl drain` of each node in turn (run again, up to 3 times, when it gives up, as an operator would), the deployment settled again before the next, under a writer per {SHARDS_PER_WRITER} shards (1 s timeouts, over its shard's pods' addresses as listed every 500 ms: a drained pod comes back with a new IP). Load: the machine's 1-minute load average at the end of the steady window, and the highest at the end of a drain (2 cores: past ~2, every process waits for CPU, and every figure of that size includes the wait).\n",
        NODE_GRACE.as_secs(),
        STEADY.as_secs()
    );
    println!(
        "| shards | pods | settled | round mean / p99, CPU mean | formation reads: vouched / in full / silent | coordinator RSS | agent RSS median / max | agent CPU median / max | settings container RSS max, CPU median | Valkey CPU median | heartbeat datagrams/s | fences in the steady window | requests/min coordinator / follower mean / busiest follower / apiserver | load steady / drains | hand-over pause, lost | drains: longest, longest write pause, acked, lost |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.1} s | {:.2} / {:.2} ms, {:.2} ms | {:.0} / {:.0} / {:.0} | {} MiB | {} / {} MiB | {:.1} / {:.1} % | {:.1} MiB, {:.2} % | {:.1} % | {:.0} | {} | {:.1} / {:.2} / {:.1} / {:.0} | {:.1} / {:.1} | {} ms, {} | {} nodes: {:.1} s, {} ms, {}, {} |",
            r.shards,
            r.pods,
            r.settled.as_secs_f64(),
            r.round_mean.as_secs_f64() * 1e3,
            r.round_p99.as_secs_f64() * 1e3,
            r.round_cpu_mean.as_secs_f64() * 1e3,
            r.formation_reads[0],
            r.formation_reads[1] + r.formation_reads[2],
            r.formation_reads[3],
            r.coordinator_rss_kib / 1024,
            r.agent_rss_median_kib / 1024,
            r.agent_rss_max_kib / 1024,
            r.agent_cpu_median_pct,
            r.agent_cpu_max_pct,
            r.settings_rss_max_kib as f64 / 1024.0,
            r.settings_cpu_median_pct,
            r.valkey_cpu_median_pct,
            r.udp_out_per_s,
            r.steady_fences,
            r.coordinator_rpm,
            r.follower_mean_rpm,
            r.follower_rpm,
            r.apiserver_rpm,
            r.load_steady,
            r.load_drains,
            r.handover_pause.as_millis(),
            r.handover_lost,
            r.drains,
            r.drain_longest.as_secs_f64(),
            r.drain_pause.as_millis(),
            r.drain_acked,
            r.drain_lost,
        );
    }
    println!();
    print_notes(rows);
}

/// What the table cannot hold: sizes that stopped early, the machine's CPU, drains run again,
/// the busiest follower's requests.
fn print_notes(rows: &[Row]) {
    for r in rows {
        if let Some(why) = &r.failed {
            println!(
                "**{} shards stopped early**: {why}. The figures measured before it are kept; the drains column counts the nodes drained before it.\n",
                r.shards
            );
        }
    }
    println!(
        "The machine's CPU over the steady window, by kind of process (2 cores: 200 % is all of it):\n"
    );
    for r in rows {
        println!("- {} shards: {}", r.shards, r.machine);
    }
    println!();
    println!(
        "Primaries per node after each drain, once settled (most / fewest on one of the 6 nodes; even would be ⌈shards / 6⌉ / ⌊shards / 6⌋), and in brackets pods (even: ⌈pods / 6⌉ / ⌊pods / 6⌋). The balance moves primaries among a shard's pods, never out of the shard's preferred zone, and never moves pods:\n"
    );
    for r in rows {
        let after: Vec<String> = r
            .balance
            .iter()
            .map(|s| {
                let ((a, b), (c, d)) = (s.primaries, s.pods);
                format!("{a}/{b} [{c}/{d}]")
            })
            .collect();
        let balanced = match &r.balanced_after {
            Some(Balance::Even(d)) => format!("even {:.0} s after the last drain", d.as_secs_f64()),
            Some(Balance::Stuck(d, said)) => format!(
                "not even; {:.0} s after the last drain the coordinator said (for {} s on end) that no move can even it out: `{said}`",
                d.as_secs_f64(),
                STUCK_FOR.as_secs()
            ),
            None => "stopped before the balance was timed".to_owned(),
            Some(Balance::NotEven) => format!(
                "not even {} s after the last drain",
                BALANCED_WITHIN.as_secs()
            ),
        };
        println!("- {} shards: {}; {balanced}", r.shards, after.join(", "));
    }
    println!();
    let retried: Vec<&Row> = rows
        .iter()
        .filter(|r| !r.drain_retries.is_empty())
        .collect();
    if !retried.is_empty() {
        println!("Drains run again after `kubectl drain` gave up (kubectl's last words):\n");
        for r in retried {
            println!("- {} shards: {}", r.shards, r.drain_retries.join("; "));
        }
        println!();
    }
    println!("The busiest follower's requests over the steady window:\n");
    for r in rows {
        println!("- {} shards: {}", r.shards, r.follower_requests);
    }
    println!();
}

/// The figures whose growth is stated, as (name, value per row).
fn figures(rows: &[Row]) -> Vec<(&'static str, Vec<f64>)> {
    let secs = |d: Duration| d.as_secs_f64();
    let of = |f: &dyn Fn(&Row) -> f64| rows.iter().map(f).collect::<Vec<f64>>();
    vec![
        ("settle time (s)", of(&|r| secs(r.settled))),
        (
            "coordinator round, mean (ms)",
            of(&|r| secs(r.round_mean) * 1e3),
        ),
        (
            "coordinator round CPU, mean (ms)",
            of(&|r| secs(r.round_cpu_mean) * 1e3),
        ),
        (
            "coordinator RSS (MiB)",
            of(&|r| r.coordinator_rss_kib as f64 / 1024.0),
        ),
        (
            "agent RSS, median (MiB)",
            of(&|r| r.agent_rss_median_kib as f64 / 1024.0),
        ),
        (
            "agent CPU, median (% of a core)",
            of(&|r| r.agent_cpu_median_pct),
        ),
        (
            "valkey-settings RSS, max (MiB)",
            of(&|r| r.settings_rss_max_kib as f64 / 1024.0),
        ),
        (
            "Valkey CPU, median (% of a core)",
            of(&|r| r.valkey_cpu_median_pct),
        ),
        ("heartbeat datagrams/s", of(&|r| r.udp_out_per_s)),
        ("requests/min, coordinator", of(&|r| r.coordinator_rpm)),
        ("requests/min, follower mean", of(&|r| r.follower_mean_rpm)),
        ("requests/min, busiest follower", of(&|r| r.follower_rpm)),
        ("requests/min, apiserver", of(&|r| r.apiserver_rpm)),
        (
            "hand-over write pause (ms)",
            of(&|r| secs(r.handover_pause) * 1e3),
        ),
    ]
}

/// Each figure's growth between the smallest and the largest size, as the exponent `k` of
/// `figure ∝ pods^k`, and its value at 1,000 pods from that power law.
fn print_growth(rows: &[Row]) {
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return;
    };
    if last.pods <= first.pods {
        return;
    }
    println!(
        "| figure | growth (k in figure ∝ pods^k) | at {} pods | predicted at 1,000 pods |",
        last.pods
    );
    println!("|---|---|---|---|");
    let span = (last.pods as f64 / first.pods as f64).ln();
    for (name, values) in figures(rows) {
        let (a, b) = (values[0], values[values.len() - 1]);
        // From zero there is no power law: any k fits, and a prediction would be made up.
        if a <= 0.0 || b <= 0.0 {
            println!(
                "| {name} | none: 0 at {} pods | {b:.2} | — |",
                if a <= 0.0 { first.pods } else { last.pods }
            );
            continue;
        }
        let k = (b / a).ln() / span;
        let predicted = b * (1000.0 / last.pods as f64).powf(k);
        println!(
            "| {name} | {} ({k:.2}) | {b:.1} | {predicted:.1} |",
            shape(k)
        );
    }
    println!();
}

/// A word for an exponent of growth.
fn shape(k: f64) -> &'static str {
    match k {
        k if k < 0.25 => "flat",
        k if k < 0.75 => "sub-linear",
        k if k < 1.25 => "linear",
        k if k < 1.75 => "super-linear",
        _ => "quadratic or worse",
    }
}

fn print_plots(rows: &[Row]) -> Result<()> {
    let line = |label: &str, f: &dyn Fn(&Row) -> Duration| {
        let mut l = Line::new(label);
        // A phase a size did not reach has no point (not a zero).
        for r in rows.iter().filter(|r| !f(r).is_zero()) {
            l.push(r.pods, f(r));
        }
        l
    };
    let times = [
        line("settled", &|r| r.settled),
        line("drain, longest", &|r| r.drain_longest),
        line("hand-over write pause", &|r| r.handover_pause),
        line("coordinator round, mean", &|r| r.round_mean),
    ];
    let title = "Scale: times against the number of pods";
    println!("{}", growth("scale", title, "pods", "ms", &times)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_bucket_is_the_first_whose_count_reaches_it() {
        let text = "m_bucket{le=\"0.001\"} 50\nm_bucket{le=\"0.002\"} 99\nm_bucket{le=\"0.004\"} 100\nm_bucket{le=\"+Inf\"} 100\n";
        assert_eq!(bucket_quantile(text, "m", 100.0, 0.99), 0.002);
        assert_eq!(bucket_quantile(text, "m", 100.0, 1.0), 0.004);
    }

    #[test]
    fn growth_words() {
        assert_eq!(shape(0.1), "flat");
        assert_eq!(shape(1.0), "linear");
        assert_eq!(shape(2.0), "quadratic or worse");
    }
}
