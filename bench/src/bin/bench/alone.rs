//! Baselines without the sidecar: what Valkey does on its own when a primary is stopped, on real
//! valkey-server processes on loopback.
//!
//! - cluster, planned by Valkey itself: `shutdown-on-sigterm failover`, then SIGTERM (what the
//!   kubelet sends on pod deletion);
//! - cluster, a plain pod kill: SIGTERM with the default `shutdown-on-sigterm`, so the replica
//!   waits out `cluster-node-timeout` and elects itself;
//! - cluster, a crash: SIGKILL, the node restarted at once as a kubelet restarts a crashed
//!   container (with its `nodes.conf`, without its data);
//! - replication mode: SIGTERM on a primary + 2 replicas, with `shutdown-on-sigterm failover` and
//!   without (a plain pod kill).
//!
//! Each cluster run puts a writer on one shard (shards in turn), stops its primary, waits until
//! a member of the shard takes writes, restarts the stopped node (it keeps `nodes.conf`; a
//! crashed one is restarted at once instead), waits until the cluster is healthy again and only
//! then reads every acknowledged key back from the shard's primary.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use std::net::Ipv4Addr;

use valkey_sidecar_bench::sentinel::{Partitioned, v4};
use valkey_sidecar_testkit::k8s::netfault::AddrPartition;
use valkey_sidecar_testkit::k8s::writer::{
    Writer, WriterOptions, lost, tag_for, tag_named, targets,
};
use valkey_sidecar_testkit::resp::ClientOptions;
use valkey_sidecar_testkit::{
    ClusterOptions, ReplicationSet, ServerOptions, ValkeyCluster, ValkeyServer,
};

use crate::failover::Move;
use crate::report::{duration_row, p50_p99, ratio};

const SHARDS: usize = 3;
/// One replica per shard, as the sidecar's stage has (3 shards × 2 members).
const REPLICAS: usize = 1;
/// How often the shard's other members are offered a `SET` after the signal.
const POLL: Duration = Duration::from_millis(5);
/// Longest a cluster run waits for a replica to take writes.
const TAKE_OVER: Duration = Duration::from_secs(30);
/// The writer runs this long before the signal and after the take-over.
const AROUND: Duration = Duration::from_millis(500);
const AFTER: Duration = Duration::from_secs(1);

/// A node timeout users pick to fail over sooner without the agents (false failovers on a busy
/// node grow below it).
pub const FAST_NODE_TIMEOUT_MS: u64 = 2000;

/// How the primary is stopped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// `CONFIG SET shutdown-on-sigterm failover`, then SIGTERM.
    SigtermFailover,
    /// SIGTERM with the default `shutdown-on-sigterm`.
    Sigterm,
    /// SIGKILL.
    Sigkill,
}

/// One stop of a shard's primary.
pub struct Stopped {
    /// The writer's longest pause and the acknowledged writes lost.
    pub moved: Move,
    /// From the signal to another member of the shard accepting a `SET`.
    pub writable: Duration,
    /// From the signal to the process having exited.
    pub exited: Duration,
    /// The stopped primary logged that it sent its replica `CLUSTER FAILOVER FORCE` (only
    /// `shutdown-on-sigterm failover` does; without it the replica waits out the node timeout).
    pub handed_over: bool,
    /// The stopped node was the shard's primary again at the end (nobody failed over).
    pub same_primary: bool,
}

/// What Valkey logs when `shutdown-on-sigterm failover` found a caught-up replica to hand to.
const HANDED_OVER: &str = "Perform auto failover to replica";

/// Replication mode: a stop of the primary of 1 + 2.
pub struct Standalone {
    /// `SigtermFailover` or a plain `Sigterm` (a pod kill with no sidecar).
    pub how: Stop,
    /// From the signal to a replica accepting a `SET`; `None`: none did within `wait`.
    pub writable: Option<Duration>,
    pub wait: Duration,
    pub exited: Duration,
    pub acked: usize,
    /// Acknowledged keys missing on the replica that took writes, else on the first replica.
    pub lost: usize,
}

/// Everything [`report`] prints.
pub struct Baselines {
    pub node_timeout_ms: u64,
    pub failover: Vec<Stopped>,
    pub plain: Vec<Stopped>,
    pub crash: Vec<Stopped>,
    /// The crash again at [`FAST_NODE_TIMEOUT_MS`]: Valkey alone tuned for speed.
    pub crash_fast: Vec<Stopped>,
    pub replication: Vec<Standalone>,
}

/// All baselines: `runs` of each cluster move (`cluster-node-timeout` `node_timeout_ms`), and the
/// replication-mode SIGTERM once with `shutdown-on-sigterm failover` and once without, waiting up
/// to `wait` for a writable replica.
pub fn measure(runs: usize, node_timeout_ms: u64, wait: Duration) -> Result<Baselines> {
    Ok(Baselines {
        node_timeout_ms,
        failover: cluster_sigterm_failover_runs(runs, node_timeout_ms)?,
        plain: cluster_plain_kill_runs(runs, node_timeout_ms)?,
        crash: cluster_unplanned_kill_runs(runs, node_timeout_ms)?,
        crash_fast: cluster_unplanned_kill_runs(runs, FAST_NODE_TIMEOUT_MS)?,
        replication: vec![
            replication_stop(Stop::SigtermFailover, wait)?,
            replication_stop(Stop::Sigterm, wait)?,
        ],
    })
}

/// A planned hand-over done by Valkey itself: `shutdown-on-sigterm failover`, then SIGTERM.
pub fn cluster_sigterm_failover_runs(runs: usize, node_timeout_ms: u64) -> Result<Vec<Stopped>> {
    cluster_runs(Stop::SigtermFailover, runs, node_timeout_ms)
}

/// A plain pod kill with no sidecar: SIGTERM with the default `shutdown-on-sigterm`.
pub fn cluster_plain_kill_runs(runs: usize, node_timeout_ms: u64) -> Result<Vec<Stopped>> {
    cluster_runs(Stop::Sigterm, runs, node_timeout_ms)
}

/// A crash: SIGKILL of the primary.
pub fn cluster_unplanned_kill_runs(runs: usize, node_timeout_ms: u64) -> Result<Vec<Stopped>> {
    cluster_runs(Stop::Sigkill, runs, node_timeout_ms)
}

/// `runs` stops of a primary (`how`), one shard after the other, on one cluster.
pub fn cluster_runs(how: Stop, runs: usize, node_timeout_ms: u64) -> Result<Vec<Stopped>> {
    let opts = ClusterOptions::default().node_timeout_ms(node_timeout_ms);
    let cluster = ValkeyCluster::start(SHARDS, REPLICAS, opts)?;
    relink_replicas(&cluster)?;
    let mut out = Vec::new();
    for i in 0..runs {
        let r = cluster_run(&cluster, i % SHARDS, how)
            .with_context(|| format!("{how:?} run {}/{runs}", i + 1))?;
        eprintln!(
            "alone {how:?} {}/{runs}: pause {:?}, writable {:?}, exited {:?}, handed over {}, {} acked, {} lost",
            i + 1,
            r.moved.pause,
            r.writable,
            r.exited,
            r.handed_over,
            r.moved.acked,
            r.moved.lost
        );
        out.push(r);
    }
    Ok(out)
}

/// One run on `shard`: writer, stop, take-over, restart, healthy again, read-back.
fn cluster_run(cluster: &ValkeyCluster, shard: usize, how: Stop) -> Result<Stopped> {
    let members = cluster.shard(shard);
    let old = current_primary(members)?;
    // A crashed node is back at once and may take writes itself; a stopped one is not.
    let candidates: Vec<&ValkeyServer> = match how {
        Stop::Sigkill => members.iter().collect(),
        Stop::Sigterm | Stop::SigtermFailover => {
            members.iter().filter(|n| n.addr() != old.addr()).collect()
        }
    };
    let addrs = members.iter().map(|n| n.addr()).collect();
    let writer = Writer::start(addrs, tag_for(old.addr())?);
    std::thread::sleep(AROUND);
    let logged = std::fs::metadata(old.log_path())?.len();
    let (exited, took) = stop_and_poll(old, &candidates, &writer.tag, how, TAKE_OVER)?;
    let (_, writable) = took.context("no member of the shard took writes")?;
    let handed_over = logged_since(old, logged)?.contains(HANDED_OVER);
    if how != Stop::Sigkill {
        old.restart()?;
    }
    // Read back only once the node is back and synced: an empty node that kept its slots costs
    // writes only when its replica resyncs from it.
    cluster.wait_healthy(Duration::from_secs(60))?;
    let now = current_primary(members)?;
    Ok(Stopped {
        moved: finish(writer, now)?,
        writable,
        exited,
        handed_over,
        same_primary: now.addr() == old.addr(),
    })
}

/// What `node` logged after its log was `from` bytes long.
fn logged_since(node: &ValkeyServer, from: u64) -> Result<String> {
    let log = std::fs::read(node.log_path())?;
    let from = usize::try_from(from).unwrap_or(usize::MAX);
    Ok(String::from_utf8_lossy(log.get(from..).unwrap_or_default()).into_owned())
}

/// Makes every replica reconnect to its primary. A replica names itself on its replication link
/// (`REPLCONF SET-CLUSTER-NODE-ID`), and the primary hands over on shutdown only to a replica it
/// knows by name; in a cluster formed within a second the replica's first link can come before
/// the primary has met it ("Unknown node"), and that link would stay nameless. A replica that
/// rejoins later (as the stopped nodes do) is known by then.
fn relink_replicas(cluster: &ValkeyCluster) -> Result<()> {
    for p in cluster.primaries() {
        p.cmd(&["CLIENT", "KILL", "TYPE", "replica"])?;
    }
    // Long enough for each replica to see its link drop, so the health check sees the new one.
    std::thread::sleep(Duration::from_millis(200));
    cluster.wait_healthy(Duration::from_secs(30))
}

/// The member of `members` that is primary now (the roles swap from run to run).
pub fn current_primary(members: &[ValkeyServer]) -> Result<&ValkeyServer> {
    for n in members {
        if n.is_primary()? {
            return Ok(n);
        }
    }
    Err(anyhow!("the shard has no primary"))
}

/// Lets the writer go on against `new` for a moment, stops it, reads its keys back from `new`.
pub fn finish(writer: Writer, new: &ValkeyServer) -> Result<Move> {
    std::thread::sleep(AFTER);
    let tag = writer.tag.clone();
    let written = writer.stop()?;
    Ok(Move {
        pause: written.longest_pause,
        acked: written.acked.len(),
        lost: lost(new.addr(), &tag, &written.acked)?,
    })
}

/// Stops `old` (`how`) on its own thread, since SIGTERM blocks until the process exits, while
/// `others` are offered a `SET` every 5 ms for up to `within`: (signal → exit, the first member
/// to accept and when). A SIGKILLed node is restarted at once ([`kill_and_poll`]).
fn stop_and_poll<'a>(
    old: &ValkeyServer,
    others: &[&'a ValkeyServer],
    tag: &str,
    how: Stop,
    within: Duration,
) -> Result<(Duration, Option<(&'a ValkeyServer, Duration)>)> {
    if how == Stop::SigtermFailover {
        old.cmd(&["CONFIG", "SET", "shutdown-on-sigterm", "failover"])?;
    }
    let at = Instant::now();
    if how == Stop::Sigkill {
        return kill_and_poll(old, others, tag, (at, within));
    }
    std::thread::scope(|s| {
        let stopper = s.spawn(|| {
            stop(old, how)?;
            Ok::<_, anyhow::Error>(at.elapsed())
        });
        let took = first_writable(others, tag, at, within);
        let exited = stopper
            .join()
            .map_err(|_| anyhow!("the stopping thread panicked"))??;
        Ok((exited, took))
    })
}

/// SIGKILL, then the restart on its own thread while `others` are polled. The kill has landed
/// (the process reaped) before the first probe: a probe racing the signal would be answered by
/// the dying process and count as the shard writable again within microseconds.
fn kill_and_poll<'a>(
    old: &ValkeyServer,
    others: &[&'a ValkeyServer],
    tag: &str,
    (at, within): (Instant, Duration),
) -> Result<(Duration, Option<(&'a ValkeyServer, Duration)>)> {
    old.kill()?;
    let exited = at.elapsed();
    std::thread::scope(|s| {
        let restarter = s.spawn(|| old.restart());
        let took = first_writable(others, tag, at, within);
        restarter
            .join()
            .map_err(|_| anyhow!("the restarting thread panicked"))??;
        Ok((exited, took))
    })
}

fn stop(node: &ValkeyServer, how: Stop) -> Result<()> {
    match how {
        Stop::Sigkill => node.kill(),
        Stop::Sigterm | Stop::SigtermFailover => node.terminate(),
    }
}

/// The first of `nodes` to accept a `SET` (MOVED, CLUSTERDOWN, READONLY: not yet), polled every
/// 5 ms until `within` after `at`.
fn first_writable<'a>(
    nodes: &[&'a ValkeyServer],
    tag: &str,
    at: Instant,
    within: Duration,
) -> Option<(&'a ValkeyServer, Duration)> {
    let key = format!("{{{tag}}}:probe");
    while at.elapsed() < within {
        if let Some(n) = nodes.iter().find(|n| n.cmd(&["SET", &key, "1"]).is_ok()) {
            return Some((n, at.elapsed()));
        }
        std::thread::sleep(POLL);
    }
    None
}

/// Replication mode (no cluster), once: a primary + 2 replicas, the primary stopped `how`
/// (SIGTERM, with `shutdown-on-sigterm failover` or without) under a writer; does a replica take
/// writes within `wait`?
pub fn replication_stop(how: Stop, wait: Duration) -> Result<Standalone> {
    let set = ReplicationSet::start(2, ServerOptions::default())?;
    let addrs = set.nodes().iter().map(|n| n.addr()).collect();
    let writer = Writer::start(addrs, format!("alone{}", crate::rand_tag()));
    std::thread::sleep(AROUND);
    let replicas: Vec<&ValkeyServer> = set.replicas().iter().collect();
    let (exited, took) = stop_and_poll(set.primary(), &replicas, &writer.tag, how, wait)?;
    // Replicas serve reads, so the keys can be counted even where none took writes.
    let reader = took.map_or(replicas.first().copied(), |(n, _)| Some(n));
    let moved = finish(writer, reader.context("no replica")?)?;
    eprintln!(
        "alone replication {how:?}: writable {:?}, exited {exited:?}, {} acked, {} lost",
        took.map(|t| t.1),
        moved.acked,
        moved.lost
    );
    Ok(Standalone {
        how,
        writable: took.map(|t| t.1),
        wait,
        exited,
        acked: moved.acked,
        lost: moved.lost,
    })
}

/// Where the partitioned side's client connects from (no server binds it).
pub const SIDE_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 97, 1);
/// The first address of the partition baselines' nodes (`127.0.0.60` on): each node binds its
/// own, which the address partition needs.
const PARTITION_FIRST_IP: u8 = 60;

/// `runs` partitions of a shard's primary (shards in turn) in a Valkey Cluster on its own
/// (`cluster-node-timeout` `node_timeout_ms`): the primary's address and a client writing to it
/// cut from everything else, held for `hold` (and 2 s past the replica's first write), healed,
/// read back once the cluster is healthy.
pub fn cluster_partition_runs(
    runs: usize,
    node_timeout_ms: u64,
    hold: Duration,
) -> Result<Vec<Partitioned>> {
    let mut opts = ClusterOptions::default().node_timeout_ms(node_timeout_ms);
    opts.first_ip = Some(PARTITION_FIRST_IP);
    let cluster = ValkeyCluster::start(SHARDS, REPLICAS, opts)?;
    relink_replicas(&cluster)?;
    let mut out = Vec::new();
    for i in 0..runs {
        let r = cluster_partition(&cluster, i % SHARDS, hold)
            .with_context(|| format!("partition run {}/{runs}", i + 1))?;
        crate::partition::progress("alone", i, runs, &r);
        out.push(r);
    }
    Ok(out)
}

/// One partition of `shard`'s primary (see [`cluster_partition_runs`]).
fn cluster_partition(cluster: &ValkeyCluster, shard: usize, hold: Duration) -> Result<Partitioned> {
    let members = cluster.shard(shard);
    let old = current_primary(members)?;
    let others: Vec<&ValkeyServer> = members.iter().filter(|n| n.addr() != old.addr()).collect();
    let opts = ClientOptions::default();
    let run = crate::rand_tag();
    let main = Writer::start(
        members.iter().map(|n| n.addr()).collect(),
        tag_named(old.addr(), &opts, &format!("m{run}x"))?,
    );
    let mut side_opts = WriterOptions::new(tag_named(old.addr(), &opts, &format!("s{run}x"))?);
    side_opts.client.source = Some(SIDE_CLIENT_IP);
    let side = Writer::start_with(targets(vec![old.addr()]), side_opts);
    std::thread::sleep(AROUND);
    let cut = AddrPartition::cut(&[v4(old.addr())?, SIDE_CLIENT_IP])?;
    let at = Instant::now();
    let (_, writable) = first_writable(&others, &main.tag, at, TAKE_OVER)
        .context("no member of the shard took writes")?;
    let until = (at + hold).max(at + writable + Duration::from_secs(2));
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    drop(cut);
    cluster.wait_healthy(Duration::from_secs(60))?;
    let now = current_primary(members)?;
    let (main_tag, side_tag) = (main.tag.clone(), side.tag.clone());
    let (main, side) = (main.stop()?, side.stop()?);
    let lost =
        lost(now.addr(), &main_tag, &main.acked)? + lost(now.addr(), &side_tag, &side.acked)?;
    Ok(Partitioned::measured(
        old.addr(),
        (at, writable),
        (&main, &side),
        lost,
        now.addr(),
    ))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One baseline row: who, how it was stopped, its runs.
struct Line<'a> {
    who: &'a str,
    how: Stop,
    config: String,
    runs: &'a [Stopped],
}

impl Line<'_> {
    fn pauses(&self) -> Vec<Duration> {
        self.runs.iter().map(|r| r.moved.pause).collect()
    }

    fn acked(&self) -> usize {
        self.runs.iter().map(|r| r.moved.acked).sum()
    }

    fn lost(&self) -> usize {
        self.runs.iter().map(|r| r.moved.lost).sum()
    }

    /// The table's rows: the writer's pause with the counts, then the two timings.
    fn print(&self) {
        let (acked, lost) = (self.acked(), self.lost());
        let first = row(self.who, &self.config, "longest write pause", self.pauses());
        println!("{first} {acked} | {lost} |");
        let writable = self.runs.iter().map(|r| r.writable).collect();
        let measure = match self.how {
            Stop::Sigkill => "signal → a member accepts `SET` again (the restarted node included)",
            Stop::Sigterm | Stop::SigtermFailover => "signal → a replica accepts `SET`",
        };
        println!("{} | |", row("", "", measure, writable));
        let exited = self.runs.iter().map(|r| r.exited).collect();
        println!("{} | |", row("", "", "signal → process exited", exited));
    }
}

/// `| who | settings | measure | runs | p50 | p99 | max |`.
fn row(who: &str, settings: &str, measure: &str, v: Vec<Duration>) -> String {
    duration_row(who, &format!("{settings} | {measure}"), v)
}

/// The Markdown section: Valkey's own moves beside the agent's hand-over pauses `ours` (the
/// `bench handover` runs, with the agent's settings `ours_config`). `command` is the command
/// line that produced `b`.
pub fn report(b: &Baselines, ours: &[Duration], ours_config: &str, command: &str) {
    let line = |who, how, runs| Line {
        who,
        how,
        config: crate::settings::valkey_alone(b.node_timeout_ms, shutdown_setting(how)),
        runs,
    };
    let lines = [
        line(
            "cluster, `shutdown-on-sigterm failover` + SIGTERM (Valkey's own hand-over)",
            Stop::SigtermFailover,
            &b.failover,
        ),
        line(
            "cluster, SIGTERM with the default `shutdown-on-sigterm` (a plain pod kill)",
            Stop::Sigterm,
            &b.plain,
        ),
        line("cluster, SIGKILL (a crash)", Stop::Sigkill, &b.crash),
    ];
    heading(b, command);
    table(b, &lines, ours, ours_config);
    handed_over(&b.failover);
    crashed(&b.crash);
    ratios(&lines, ours);
    for r in &b.replication {
        replication(r);
    }
}

/// The `shutdown-on-sigterm` a stop runs with.
pub fn shutdown_setting(how: Stop) -> &'static str {
    match how {
        Stop::SigtermFailover => "failover",
        Stop::Sigterm | Stop::Sigkill => "default",
    }
}

fn heading(b: &Baselines, command: &str) {
    println!(
        "### Valkey on its own, no sidecar: a primary stopped by SIGTERM or SIGKILL (valkey-server on loopback, `cluster-node-timeout` {} ms)\n",
        b.node_timeout_ms
    );
    println!("Command: `{command}`. {METHOD} With at most 50 runs p99 is the maximum.\n");
}

/// How the baselines are measured, for the report.
const METHOD: &str = "A cluster of 3 shards × 1 replica (testkit's `ValkeyCluster`, no agent), settings in the \
table. Each run puts the same writer as the agent's benchmarks (one `SET` at a time, unique keys, 1 s timeouts, to \
whichever member of the shard accepts) on the next shard, signals its primary half a second later and meanwhile offers \
the shard's other members a `SET` every 5 ms (MOVED, CLUSTERDOWN and READONLY count as not yet). The stopped node is then \
restarted with its `nodes.conf` (no persistence: empty), and once the cluster is healthy and every replica synced the \
writer stops a second later and every acknowledged key is read back from the shard's primary. *Valkey's own \
hand-over*: `CONFIG SET shutdown-on-sigterm failover` on the primary, then SIGTERM, as the kubelet sends on pod \
deletion: Valkey pauses writes, waits until a replica has acknowledged its whole replication stream, sends that replica \
`CLUSTER FAILOVER FORCE` and exits. It hands over only to a replica that named itself on its replication link, and in a \
cluster formed within a second a replica's first link can precede its primary meeting it (\"Unknown node\"; the shard \
then falls back to the node timeout, as seen in a trial): every replica reconnects once before the first run. *A plain \
pod kill*: SIGTERM with the default setting, which pauses writes and waits (up to `shutdown-timeout`) for the replicas \
too but does not fail over, so the replica waits out `cluster-node-timeout` and elects itself. *A crash*: SIGKILL, and \
the node restarted at once, as a kubelet restarts a crashed container (the chart keeps `nodes.conf` in the pod's data \
volume, an emptyDir without persistence, which survives container restarts): the restarted node itself counts as \
taking writes again. The pause is the longest gap between two acknowledged writes; the agent's row is its hand-over \
(node cordoned, `bench handover`), its writes acknowledged and lost are in that table. Replication mode: a primary + 2 \
replicas (`ReplicationSet`), SIGTERM with `shutdown-on-sigterm failover` and, once more, without it (a plain pod kill) \
under the same writer, every replica offered a `SET` every 5 ms.";

fn table(b: &Baselines, lines: &[Line], ours: &[Duration], ours_config: &str) {
    println!(
        "| move | settings | measure | runs | p50 ms | p99 ms | max ms | acknowledged | lost |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let agent = row(
        "the agent's hand-over (node cordoned)",
        ours_config,
        "longest write pause",
        ours.to_vec(),
    );
    println!("{agent} – | – |");
    for l in lines.iter().filter(|l| !l.runs.is_empty()) {
        l.print();
    }
    let config = |how| {
        format!(
            "Valkey's defaults, `shutdown-on-sigterm {}`, `repl-diskless-sync-delay 0`, no persistence",
            shutdown_setting(how)
        )
    };
    for r in &b.replication {
        let writable = r.writable.map_or(
            format!("no replica accepted a write within {} s", r.wait.as_secs()),
            |w| format!("{:.0} ms", ms(w)),
        );
        println!(
            "| replication mode (1 primary + 2 replicas), {} | {} | signal → a replica accepts `SET` | 1 | {writable} | | | {} | {} |",
            stop_name(r.how),
            config(r.how),
            r.acked,
            r.lost
        );
    }
}

/// After a crash with an immediate restart: how often the node came back as the primary, and
/// what that cost.
fn crashed(runs: &[Stopped]) {
    if runs.is_empty() {
        return;
    }
    let kept = runs.iter().filter(|r| r.same_primary).count();
    let acked: usize = runs.iter().map(|r| r.moved.acked).sum();
    let lost: usize = runs.iter().map(|r| r.moved.lost).sum();
    println!(
        "\nAfter a crash the node restarted at once was the shard's primary again at the end in {kept} of {} runs: back within `cluster-node-timeout`, it is never flagged failed, keeps its slots, takes writes again empty, and its replica resyncs from it. {lost} of {acked} acknowledged writes were lost in these runs. This is Valkey's known rule (persistence off means no automatic restart of a primary).",
        runs.len()
    );
}

/// How a replication-mode stop is named in the report.
fn stop_name(how: Stop) -> &'static str {
    match how {
        Stop::SigtermFailover => "`shutdown-on-sigterm failover` + SIGTERM",
        Stop::Sigterm => "plain pod kill (SIGTERM, no sidecar, no Sentinel)",
        Stop::Sigkill => "SIGKILL (no sidecar, no Sentinel)",
    }
}

/// How often `shutdown-on-sigterm failover` found a replica to hand to.
fn handed_over(runs: &[Stopped]) {
    if runs.is_empty() {
        return;
    }
    let n = runs.iter().filter(|r| r.handed_over).count();
    println!(
        "\nWith `shutdown-on-sigterm failover` the primary sent its replica `CLUSTER FAILOVER FORCE` (its log: \"{HANDED_OVER}\") in {n} of {} runs; in any other the replica waited out `cluster-node-timeout` as after a plain kill.",
        runs.len()
    );
}

/// Their pause ÷ ours at p50 and p99, and plainly where a baseline loses nothing and is faster.
fn ratios(lines: &[Line], ours: &[Duration]) {
    let us = p50_p99(ours.to_vec());
    println!(
        "\nRatios (Valkey's longest write pause ÷ the agent's hand-over pause; above 1 the agent is faster):\n"
    );
    println!("| move | p50 | p99 |");
    println!("|---|---|---|");
    let present: Vec<&Line> = lines.iter().filter(|l| !l.runs.is_empty()).collect();
    for l in &present {
        let them = p50_p99(l.pauses());
        println!(
            "| {} | {} | {} |",
            l.who,
            ratio(them.0, us.0),
            ratio(them.1, us.1)
        );
    }
    println!();
    for l in &present {
        if let Some(s) = verdict(l, us) {
            println!("{s}\n");
        }
    }
}

/// A plain sentence when a baseline pauses less than the agent somewhere.
fn verdict(l: &Line, us: (Duration, Duration)) -> Option<String> {
    let them = p50_p99(l.pauses());
    let faster: Vec<&str> = [("p50", them.0 < us.0), ("p99", them.1 < us.1)]
        .iter()
        .filter(|(_, f)| *f)
        .map(|(p, _)| *p)
        .collect();
    if faster.is_empty() {
        return None;
    }
    let lost = match l.lost() {
        0 => "lost no acknowledged write".to_string(),
        n => format!("lost {n} acknowledged writes"),
    };
    Some(format!(
        "Where the agent is slower: {} pauses writes for less than the agent's hand-over at {} and {lost} over {} runs.",
        l.who,
        faster.join(" and "),
        l.runs.len()
    ))
}

fn replication(r: &Standalone) {
    let took = match r.writable {
        Some(w) => format!("a replica accepted writes {:.0} ms after the signal", ms(w)),
        None => format!(
            "no replica accepted a write within {} s (standalone Valkey does not promote a replica on its own)",
            r.wait.as_secs()
        ),
    };
    println!(
        "Replication mode, {}: the primary exited {:.0} ms after the signal and {took}; of {} acknowledged writes, {} were missing on the replica read back.\n",
        stop_name(r.how),
        ms(r.exited),
        r.acked,
        r.lost
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped(pause_ms: u64, lost: usize) -> Stopped {
        Stopped {
            moved: Move {
                pause: Duration::from_millis(pause_ms),
                acked: 100,
                lost,
            },
            writable: Duration::from_millis(pause_ms),
            exited: Duration::ZERO,
            handed_over: true,
            same_primary: false,
        }
    }

    #[test]
    fn says_plainly_where_a_lossless_baseline_pauses_less() {
        let ours = [46, 50, 250].map(Duration::from_millis);
        let ours = p50_p99(ours.to_vec());
        let runs = [stopped(30, 0), stopped(30, 0), stopped(300, 0)];
        let l = Line {
            who: "x",
            how: Stop::Sigterm,
            config: String::new(),
            runs: &runs,
        };
        let said = verdict(&l, ours).unwrap();
        assert!(
            said.contains("at p50 and lost no acknowledged write"),
            "{said}"
        );
        let slow = [stopped(300, 2)];
        let l = Line {
            who: "y",
            how: Stop::Sigterm,
            config: String::new(),
            runs: &slow,
        };
        assert!(verdict(&l, ours).is_none());
        assert_eq!(
            ratio(Duration::from_millis(460), Duration::from_millis(46)),
            "10.0×"
        );
    }

    /// A trial of every baseline, 2 runs each (`ALONE_RUNS` for more): `VALKEY_SERVER=$(scripts/valkey-bin.sh) cargo test
    /// --release -p valkey-sidecar-bench --bin bench alone -- --ignored --nocapture`.
    #[test]
    #[ignore = "starts real valkey-server clusters (about a minute)"]
    fn baselines_trial() {
        let runs = std::env::var("ALONE_RUNS").map_or(2, |v| v.parse().unwrap());
        let b = measure(runs, 2000, Duration::from_secs(10)).unwrap();
        let ours = [Duration::from_millis(46), Duration::from_millis(60)];
        report(
            &b,
            &ours,
            "trial",
            "cargo test --bin bench alone -- --ignored",
        );
    }
}
