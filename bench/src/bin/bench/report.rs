//! Markdown for `docs/benchmarks.md`: rows of percentiles, and the replication-mode comparisons
//! (the agent against Sentinel, the agent's switchover against `FAILOVER TO`) with their ratios.

use std::time::Duration;

use crate::plot::Bar;

use valkey_sidecar_bench::sentinel::UnplannedFailover;

use crate::failover::{Move, Run};
use crate::sentinels::{self, Measured};
use crate::settings;

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort();
    v
}

/// p50 and p99 of `v`, sorted.
pub fn p50_p99(v: Vec<Duration>) -> (Duration, Duration) {
    let v = sorted(v);
    (percentile(&v, 0.5), percentile(&v, 0.99))
}

/// `them / us`, as "12.3×" (how many times faster we are; below 1: slower).
pub fn ratio(them: Duration, us: Duration) -> String {
    if us.is_zero() || them.is_zero() {
        return "–".into();
    }
    format!("{:.1}×", them.as_secs_f64() / us.as_secs_f64())
}

/// One row of the unplanned-failover table.
struct Line {
    who: String,
    config: String,
    /// [`sentinels::CRASH`] or [`sentinels::POWER_OFF`]: ratios compare like with like.
    fault: &'static str,
    writable: Vec<Duration>,
    /// The agent only: writable *and* labelled primary.
    labelled: Option<Vec<Duration>>,
    acked: usize,
    lost: Vec<usize>,
    deposed: usize,
}

impl Line {
    fn agent(who: String, config: String, fault: &'static str, runs: &[Run]) -> Line {
        Line {
            who,
            config,
            fault,
            writable: runs.iter().map(|r| r.writable).collect(),
            labelled: Some(runs.iter().map(|r| r.labelled).collect()),
            acked: runs.iter().map(|r| r.acked).sum(),
            lost: runs.iter().map(|r| r.lost).collect(),
            deposed: runs.iter().map(|r| r.deposed).sum(),
        }
    }

    fn sentinel(
        who: String,
        config: String,
        fault: &'static str,
        runs: &[UnplannedFailover],
    ) -> Line {
        Line {
            who,
            config,
            fault,
            writable: runs.iter().map(|r| r.writable_after).collect(),
            labelled: None,
            acked: runs.iter().map(|r| r.acked).sum(),
            lost: runs.iter().map(|r| r.lost).collect(),
            deposed: runs.iter().map(|r| r.deposed).sum(),
        }
    }

    fn runs(&self) -> usize {
        self.writable.len()
    }

    /// What counts as "failed over": for the agent writable and labelled, for Sentinel writable.
    fn done(&self) -> &[Duration] {
        self.labelled.as_deref().unwrap_or(&self.writable)
    }

    fn print(&self) {
        let pair = |v: &[Duration]| {
            let (a, b) = p50_p99(v.to_vec());
            format!("{:.0} / {:.0}", ms(a), ms(b))
        };
        let labelled = self.labelled.as_deref().map_or("–".into(), pair);
        let lost: usize = self.lost.iter().sum();
        let in_runs = self.lost.iter().filter(|l| **l > 0).count();
        println!(
            "| {} | {} | {} | {} | {labelled} | {lost} of {} in {in_runs} of {} runs | {} |",
            self.who,
            self.config,
            self.runs(),
            pair(&self.writable),
            self.acked,
            self.runs(),
            self.deposed
        );
    }
}

/// The agent's runs of one node-cut configuration: its lease label and settings.
pub struct Cut {
    pub lease: &'static str,
    pub env: &'static [(&'static str, &'static str)],
    pub runs: Vec<Run>,
}

/// The agent's rows: Valkey killed (default lease), then each node-cut lease.
fn agent_lines(killed: &[Run], cuts: &[Cut]) -> Vec<Line> {
    let chart = settings::chart_replication();
    let mut out = vec![Line::agent(
        "agent: primary's Valkey killed (agent alive), lease 15 s".into(),
        format!("{chart}; {}", settings::lease(&[])),
        sentinels::CRASH,
        killed,
    )];
    for c in cuts {
        out.push(Line::agent(
            format!(
                "agent: primary's node cut (agent gone too), lease {}",
                c.lease
            ),
            format!("{chart}; {}", settings::lease(c.env)),
            sentinels::POWER_OFF,
            &c.runs,
        ));
    }
    out
}

fn sentinel_lines(measured: &[Measured]) -> Vec<Line> {
    let mut out = Vec::new();
    for m in measured {
        for (name, fault, runs) in m.faults() {
            out.push(Line::sentinel(name, m.setup.config(), fault, runs));
        }
    }
    out
}

/// The unplanned-failover comparison: the agent (Valkey killed; node cut) against Sentinel
/// under the same faults.
pub fn failover(killed: &[Run], cuts: &[Cut], measured: &[Measured]) {
    let agents = agent_lines(killed, cuts);
    let sentinels = sentinel_lines(measured);
    let lines: Vec<&Line> = agents
        .iter()
        .chain(&sentinels)
        .filter(|l| l.runs() > 0)
        .collect();
    let runs = |i: usize| measured.get(i).map_or(0, |m| m.crash.len());
    println!("### Unplanned failover: the agent against Sentinel, measured in one run\n");
    println!(
        "Command: `BENCH_FAILOVERS={} BENCH_POD_CUTS={} BENCH_SENTINEL_RUNS={} BENCH_SENTINEL_DEFAULT_RUNS={} target/release/bench failover`. Every run of the agents starts from an empty dataset (`FLUSHALL` on the primaries, which the replicas follow), so the chart's default `maxmemory` (768 MiB of the `small` preset's 1Gi) is never reached over the runs. {FAILOVER_METHOD} With at most 50 runs p99 is the maximum.\n",
        killed.len(),
        cuts.first().map_or(0, |c| c.runs.len()),
        runs(0),
        runs(1)
    );
    println!(
        "| configuration | settings | runs | writable p50 / p99 ms | writable + labelled p50 / p99 ms | acknowledged writes lost | acknowledged by a deposed primary |"
    );
    println!("|---|---|---|---|---|---|---|");
    for l in &lines {
        l.print();
    }
    ratios(&agents, &sentinels);
    println!("\n{WHERE_WE_LOSE}\n");
    let bars: Vec<Bar> = lines
        .iter()
        .map(|l| {
            let (p50, p99) = p50_p99(l.done().to_vec());
            Bar::new(l.who.replace('`', ""), p50, p99)
        })
        .collect();
    let title = "Replication mode, unplanned: fault → new primary writable (agent: and labelled)";
    show_plot(crate::plot::bars("failover", title, "ms", &bars));
}

/// Sentinel's time to writable ÷ the agent's to writable and labelled, under the same fault.
fn ratios(agents: &[Line], sentinels: &[Line]) {
    println!(
        "\nRatios (Sentinel's time to writable ÷ the agent's time to writable *and* labelled, under the same fault; above 1 the agent is faster):\n"
    );
    println!("| agent | against | p50 | p99 |");
    println!("|---|---|---|---|");
    let present = |l: &&Line| l.runs() > 0;
    for agent in agents.iter().filter(present) {
        for sentinel in sentinels
            .iter()
            .filter(present)
            .filter(|s| s.fault == agent.fault)
        {
            let (a, s) = (
                p50_p99(agent.done().to_vec()),
                p50_p99(sentinel.done().to_vec()),
            );
            println!(
                "| {} | {} | {} | {} |",
                agent.who,
                sentinel.who,
                ratio(s.0, a.0),
                ratio(s.1, a.1)
            );
        }
    }
}

/// The summary's two replication-mode rows: the agent against the fair Sentinel deployment
/// (the first measured), Valkey killed and node cut (the first lease).
pub fn failover_summary(killed: &[Run], cuts: &[Cut], measured: &[Measured]) {
    let agents = agent_lines(killed, cuts);
    let Some(fair) = measured.first() else {
        return;
    };
    let theirs = sentinel_lines(std::slice::from_ref(fair));
    let rows = [
        ("replication-kill", sentinels::CRASH, KILL_WHY),
        ("replication-power-off", sentinels::POWER_OFF, POWER_OFF_WHY),
    ];
    for (key, fault, why) in rows {
        let ours = agents.iter().find(|l| l.fault == fault && l.runs() > 0);
        let alt = theirs.iter().find(|l| l.fault == fault && l.runs() > 0);
        if let (Some(ours), Some(alt)) = (ours, alt) {
            crate::summary::record(&failover_row(key, ours, alt, why));
        }
    }
}

fn failover_row(key: &str, ours: &Line, alt: &Line, why: &str) -> crate::summary::Row {
    use crate::summary::{Row, Side};
    let measure = format!(
        "replication mode, {} → writes accepted again (agent: by another pod, labelled primary; {})",
        alt.fault,
        ours.who.rsplit(", ").next().unwrap_or_default()
    );
    let lost = |l: &Line| l.lost.iter().sum::<usize>();
    Row {
        key: key.into(),
        measure,
        ours: Side::timing("agent", &ours.config, ours.done()).lost(lost(ours), Some(ours.acked)),
        theirs: Some(
            Side::timing("Sentinel", &alt.config, alt.done()).lost(lost(alt), Some(alt.acked)),
        ),
        runs: format!("{} + {}", ours.runs(), alt.runs()),
        why: why.into(),
    }
}

/// How the failover runs go, for the report.
const FAILOVER_METHOD: &str = "The agent: one shard of 3 pods of the chart on the local control plane (real \
kube-apiserver, process-backed pods, 3 zones), settings in the table; a writer (one `SET` at a time, unique keys, 1 s \
timeouts, to whichever pod accepts) runs through each fault. *Valkey killed*: SIGKILL of the primary's Valkey \
container, which the kubelet restarts at once, empty (no persistence); every run is a container's first crash, as a \
crash in production is (the pod crashed in the run before is deleted and recreated by its StatefulSet first: a \
container that crashed before restarts only after the kubelet's crash-loop back-off). *Node cut*: the primary's node \
powered off, its \
agent with it, its address silent; powered on after the failover. *Writable*: the first `SET` another pod accepts \
(polled every 5 ms); *labelled*: that pod also carries `valkey.io/role=primary` — the issue's measure. Acknowledged \
writes are read back once the faulted pod is back and the shard steady. Sentinel: the same two faults on a loopback \
deployment, where *writable* counts any node, the restarted one included (details in the next section).";

/// Why the agent can be slower when a whole node is gone.
const WHERE_WE_LOSE: &str = "Where the agent loses: when the whole primary pod is gone (its agent too), nobody can \
release the shard's Lease, and the agent promotes only after the record has stood unchanged for a full lease duration — \
the guarantee that the old primary fenced itself first, whatever the partition. Sentinel at `down-after-milliseconds \
1000` does not wait for that and can be faster there (ratio below 1); what it lost, and what a deposed primary \
acknowledged, is in its row. A shorter lease buys speed against apiserver load (one renewal per retry period per \
shard). Every loss, the agent's included, is in the table: an agent row that lost writes is a finding to explain, not \
noise.";

/// Why the agent can be slower when a whole node is gone, in the summary's words.
const POWER_OFF_WHY: &str = "with the whole pod gone nobody can release the shard's Lease, so the agent promotes \
only once the record has stood unchanged for a full lease duration, the guarantee that the old primary fenced itself \
first whatever the partition; a shorter lease is faster at the cost of more apiserver requests";

/// Why the agent can be slower after a crash.
const KILL_WHY: &str = "after a crash Sentinel's figure is the first node to take writes, which can be the crashed \
primary itself, back at once and empty, before anyone failed over; the agent's is another pod, labelled primary, after \
the restarted one has been fenced. The lost columns show what each way cost.";

/// Prints a plot's Markdown, or why it is missing: a plot failing must not lose the run's numbers.
fn show_plot(plot: anyhow::Result<String>) {
    match plot {
        Ok(md) => println!("{md}"),
        Err(e) => println!("(plot not drawn: {e:#})\n"),
    }
}

/// `FAILOVER TO`'s deployment, printed beside its row.
const FAILOVER_TO_CONFIG: &str = "`FAILOVER TO <replica> TIMEOUT 5000` on 1 primary + 2 replicas on loopback, Valkey's defaults (no `min-replicas-to-write`), `repl-diskless-sync-delay 0`, no persistence";

/// The planned-switchover comparison: the agents' switchover against `FAILOVER TO`.
pub fn switchover(ours: &[Move], theirs: &[Move]) {
    let agent_config = format!(
        "{}; {}",
        settings::chart_replication(),
        settings::lease(&[])
    );
    println!("### Planned switchover in replication mode: the agent against `FAILOVER TO`\n");
    println!(
        "Command: `BENCH_SWITCHOVERS={} target/release/bench switchover`. The agent: one shard of 3 pods of the chart on the local control plane; each run cordons the primary's node and the coordinator switches over (pause writes on the old primary, wait until the target has its offset, move the record, promote, repoint, unpause), the old primary's node is uncordoned afterwards. `FAILOVER TO`: Valkey's own on a plain primary + 2 replicas, each run to the next node. The same writer in both (1 s timeouts); the pause is the longest gap between two acknowledged writes (target p99 ≤ 250 ms), the losses are counted by reading every acknowledged key back from the new primary.\n",
        ours.len()
    );
    println!(
        "| move | settings | runs | longest write pause p50 / p99 ms | max ms | acknowledged | lost |"
    );
    println!("|---|---|---|---|---|---|---|");
    let a = move_row("agent switchover (node cordoned)", &agent_config, ours);
    let f = move_row("`FAILOVER TO` (Valkey)", FAILOVER_TO_CONFIG, theirs);
    println!(
        "\nRatio (`FAILOVER TO` pause ÷ the agent's): p50 {}, p99 {}.\n",
        ratio(f.0, a.0),
        ratio(f.1, a.1)
    );
    let bars = [
        Bar::new("agent switchover (node cordoned)", a.0, a.1),
        Bar::new("FAILOVER TO (Valkey)", f.0, f.1),
    ];
    let title = "Replication mode, planned: longest write pause";
    show_plot(crate::plot::bars("switchover", title, "ms", &bars));
    if !ours.is_empty() && !theirs.is_empty() {
        crate::summary::record(&switchover_summary(&agent_config, ours, theirs));
    }
}

/// One row of the switchover table; its p50 and p99.
fn move_row(who: &str, config: &str, m: &[Move]) -> (Duration, Duration) {
    let pauses = sorted(m.iter().map(|m| m.pause).collect());
    let (p50, p99) = (percentile(&pauses, 0.5), percentile(&pauses, 0.99));
    let max = pauses.last().copied().unwrap_or_default();
    let acked: usize = m.iter().map(|m| m.acked).sum();
    let lost: usize = m.iter().map(|m| m.lost).sum();
    println!(
        "| {who} | {config} | {} | {:.0} / {:.0} | {:.0} | {acked} | {lost} |",
        m.len(),
        ms(p50),
        ms(p99),
        ms(max)
    );
    (p50, p99)
}

fn switchover_summary(agent_config: &str, ours: &[Move], theirs: &[Move]) -> crate::summary::Row {
    use crate::summary::{Row, Side};
    let side = |who: &str, config: &str, m: &[Move]| {
        let pauses: Vec<Duration> = m.iter().map(|m| m.pause).collect();
        let (acked, lost) = (
            m.iter().map(|m| m.acked).sum(),
            m.iter().map(|m| m.lost).sum(),
        );
        Side::timing(who, config, &pauses).lost(lost, Some(acked))
    };
    Row {
        key: "switchover".into(),
        measure: "replication mode, planned switchover: longest write pause".into(),
        ours: side("agent (node cordoned)", agent_config, ours),
        theirs: Some(side("`FAILOVER TO`", FAILOVER_TO_CONFIG, theirs)),
        runs: format!("{} + {}", ours.len(), theirs.len()),
        why: "`FAILOVER TO` paused writes for less in this run; both move only once the target has every write, and the agent adds its record's move and the label".into(),
    }
}

/// `| label | runs | p50 | p99 | max |` in whole milliseconds.
pub fn summary_row(label: &str, v: &[Duration]) -> String {
    let v = sorted(v.to_vec());
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1000.0);
    let max = v.last().copied().unwrap_or_default();
    let (p50, p99) = (percentile(&v, 0.5), percentile(&v, 0.99));
    format!(
        "| {label} | {} | {} | {} | {} |",
        v.len(),
        ms(p50),
        ms(p99),
        ms(max)
    )
}

pub fn duration_row(config: &str, measure: &str, mut v: Vec<Duration>) -> String {
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

pub fn count_row(config: &str, measure: &str, mut v: Vec<usize>) -> String {
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

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}
