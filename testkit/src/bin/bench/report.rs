//! Markdown for `docs/benchmarks.md`: rows of percentiles, and the replication-mode comparisons
//! (the agent against Sentinel, the agent's switchover against `FAILOVER TO`) with their ratios.

use std::time::Duration;

use crate::plot::Bar;

use valkey_sidecar_testkit::sentinel::{SentinelOptions, UnplannedFailover};

use crate::failover::{Move, Run};
use crate::sentinel_config;

fn ms(d: Duration) -> f64 {
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

fn lost_summary(lost: impl Iterator<Item = usize>) -> String {
    let v: Vec<usize> = lost.collect();
    let runs = v.iter().filter(|l| **l > 0).count();
    format!("{} in {runs} of {} runs", v.iter().sum::<usize>(), v.len())
}

/// One row of the unplanned-failover table.
struct Line {
    who: String,
    runs: usize,
    writable: (Duration, Duration),
    /// The agent only: writable *and* labelled primary.
    labelled: Option<(Duration, Duration)>,
    lost: String,
}

impl Line {
    fn agent(who: &str, runs: &[Run]) -> Line {
        Line {
            who: who.into(),
            runs: runs.len(),
            writable: p50_p99(runs.iter().map(|r| r.writable).collect()),
            labelled: Some(p50_p99(runs.iter().map(|r| r.labelled).collect())),
            lost: lost_summary(runs.iter().map(|r| r.lost)),
        }
    }

    fn sentinel(who: &str, runs: &[UnplannedFailover]) -> Line {
        Line {
            who: who.into(),
            runs: runs.len(),
            writable: p50_p99(runs.iter().map(|r| r.writable_after).collect()),
            labelled: None,
            lost: lost_summary(runs.iter().map(|r| r.lost)),
        }
    }

    /// What counts as "failed over": for the agent writable and labelled, for Sentinel writable.
    fn done(&self) -> (Duration, Duration) {
        self.labelled.unwrap_or(self.writable)
    }

    fn print(&self) {
        let pair = |(a, b): (Duration, Duration)| format!("{:.0} / {:.0}", ms(a), ms(b));
        let labelled = self.labelled.map_or("–".into(), pair);
        println!(
            "| {} | {} | {} | {labelled} | {} |",
            self.who,
            self.runs,
            pair(self.writable),
            self.lost
        );
    }
}

/// The unplanned-failover comparison: the agent (Valkey killed; node cut) against Sentinel.
pub fn failover(
    killed: &[Run],
    cuts: &[(&str, Vec<Run>)],
    fast: &[UnplannedFailover],
    default: &[UnplannedFailover],
) {
    let mut agents = vec![Line::agent(
        "agent: primary's Valkey killed (agent alive), lease 15 s",
        killed,
    )];
    for (lease, runs) in cuts {
        let who = format!("agent: primary's node cut (agent gone too), lease {lease}");
        agents.push(Line::agent(&who, runs));
    }
    let sentinels = [
        Line::sentinel("Sentinel, `down-after-milliseconds 1000`", fast),
        Line::sentinel(
            "Sentinel, defaults (`down-after-milliseconds 30000`)",
            default,
        ),
    ];
    let lines: Vec<&Line> = agents
        .iter()
        .chain(&sentinels)
        .filter(|l| l.runs > 0)
        .collect();
    println!("### Unplanned failover: the agent against Sentinel, measured in one run\n");
    println!(
        "Command: `BENCH_FAILOVERS={} BENCH_POD_CUTS={} BENCH_SENTINEL_RUNS={} BENCH_SENTINEL_DEFAULT_RUNS={} target/release/bench failover`. The agent: one shard of 3 pods on the local control plane (real kube-apiserver, process-backed pods, 3 zones), the chart's Valkey settings (`min-replicas-to-write 1`, `min-replicas-max-lag 10`), poll 250 ms; a writer (one `SET` at a time, unique keys, to whichever pod accepts) runs through each fault. *Writable*: the first `SET` another pod accepts (polled every 5 ms); *labelled*: that pod also carries `valkey.io/role=primary` — the issue's measure. Sentinel: 3 sentinels on the same valkey-server binary, kill -9 of the primary (details below). With at most 50 runs p99 is the maximum.\n",
        killed.len(),
        cuts.first().map_or(0, |(_, r)| r.len()),
        fast.len(),
        default.len()
    );
    println!(
        "| configuration | runs | writable p50 / p99 ms | writable + labelled p50 / p99 ms | acknowledged writes lost |"
    );
    println!("|---|---|---|---|---|");
    for l in &lines {
        l.print();
    }
    let present = |l: &&Line| l.runs > 0;
    println!(
        "\nRatios (Sentinel's time to writable ÷ the agent's time to writable *and* labelled; above 1 the agent is faster):\n"
    );
    println!("| agent | against | p50 | p99 |");
    println!("|---|---|---|---|");
    for agent in agents.iter().filter(present) {
        for sentinel in sentinels.iter().filter(present) {
            let (a, s) = (agent.done(), sentinel.done());
            println!(
                "| {} | {} | {} | {} |",
                agent.who,
                sentinel.who,
                ratio(s.0, a.0),
                ratio(s.1, a.1)
            );
        }
    }
    println!("\n{WHERE_WE_LOSE}\n");
    let bars: Vec<Bar> = lines
        .iter()
        .map(|l| {
            let (p50, p99) = l.done();
            Bar::new(l.who.replace('`', ""), p50, p99)
        })
        .collect();
    let title = "Replication mode, unplanned: fault → new primary writable (agent: and labelled)";
    show_plot(crate::plot::bars("failover", title, "ms", &bars));
}

/// Prints a plot's Markdown, or why it is missing: a plot failing must not lose the run's numbers.
fn show_plot(plot: anyhow::Result<String>) {
    match plot {
        Ok(md) => println!("{md}"),
        Err(e) => println!("(plot not drawn: {e:#})\n"),
    }
}

/// Said with every failover report: the ratio table shows it, the reason belongs beside it.
const WHERE_WE_LOSE: &str = "Where the agent loses: when the whole primary pod is gone (its agent too), nobody can release \
the shard's Lease, and the agent promotes only after the record has stood unchanged for a full lease duration — the \
guarantee that the old primary fenced itself first, whatever the partition. Sentinel at `down-after-milliseconds 1000` \
does not wait for that and is faster there (ratio below 1), at the price the table shows: acknowledged writes lost in the \
runs where its sentinels failed over twice. A shorter lease buys speed against apiserver load (one renewal per retry \
period per shard). Every loss, the agent's included, is in the table's last column: an agent row that lost writes is a \
finding to explain, not noise.";

/// The planned-switchover comparison: the agents' switchover against `FAILOVER TO`.
pub fn switchover(ours: &[Move], theirs: &[Move]) {
    println!("### Planned switchover in replication mode: the agent against `FAILOVER TO`\n");
    println!(
        "Command: `BENCH_SWITCHOVERS={} target/release/bench switchover`. The agent: one shard of 3 pods on the local control plane; each run cordons the primary's node and the coordinator switches over (pause writes on the old primary, wait until the target has its offset, move the record, promote, repoint, unpause), the old primary's node is uncordoned afterwards. `FAILOVER TO`: Valkey's own (`FAILOVER TO <replica> TIMEOUT 5000`) on a plain primary + 2 replicas, each run to the next node. The same writer in both; the pause is the longest gap between two acknowledged writes (target p99 ≤ 250 ms), the losses are counted by reading every acknowledged key back from the new primary.\n",
        ours.len()
    );
    println!("| move | runs | longest write pause p50 / p99 ms | max ms | acknowledged | lost |");
    println!("|---|---|---|---|---|---|");
    let row = |who: &str, m: &[Move]| {
        let pauses = sorted(m.iter().map(|m| m.pause).collect());
        let (p50, p99) = (percentile(&pauses, 0.5), percentile(&pauses, 0.99));
        let max = pauses.last().copied().unwrap_or_default();
        let acked: usize = m.iter().map(|m| m.acked).sum();
        let lost: usize = m.iter().map(|m| m.lost).sum();
        println!(
            "| {who} | {} | {:.0} / {:.0} | {:.0} | {acked} | {lost} |",
            m.len(),
            ms(p50),
            ms(p99),
            ms(max)
        );
        (p50, p99)
    };
    let a = row("agent switchover (node cordoned)", ours);
    let f = row("`FAILOVER TO` (Valkey)", theirs);
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
}

/// The Sentinel baseline in detail: each configuration's runs, and its second failovers.
pub fn sentinel(measured: &[(SentinelOptions, Vec<UnplannedFailover>)]) {
    let runs = |i: usize| measured.get(i).map_or(0, |(_, r)| r.len());
    let (fast_runs, default_runs) = (runs(0), runs(1));
    println!(
        "### Unplanned failover under Sentinel (the same valkey-server binary with `--sentinel`, 3 sentinels, quorum 2, 1 primary + 2 replicas on loopback)\n"
    );
    println!(
        "Command: `BENCH_SENTINEL_RUNS={fast_runs} BENCH_SENTINEL_DEFAULT_RUNS={default_runs} target/release/bench failover` (also `bench sentinel` alone; {fast_runs} runs with `down-after-milliseconds 1000`, {default_runs} with Sentinel's defaults, where each run waits out the 30 s detection). Each run starts a writer (one `SET` at a time, unique keys, to whichever node accepts them), kills the primary with SIGKILL half a second later, and polls every surviving node with `SET` every 5 ms (`READONLY` counts as not yet) until one accepts: that is *fault → new primary accepts writes*. The writer goes on until the sentinels have settled (all monitor the same primary, no failover in progress, nothing flagged down, unchanged for 3 s), then every acknowledged key is read back from that primary; the killed node is then restarted empty as a replica of that primary, and the next run starts when all sentinels see every replica synced. The fast configuration also lowers `failover-timeout` to 10 s: with the default 180 s an aborted attempt is retried only after 6 minutes. On loopback a replica trails the primary by microseconds, so one clean failover after a SIGKILL loses next to nothing; across a network the writes in flight are at risk (asynchronous replication). With at most 50 runs p99 is the maximum.\n"
    );
    println!("| Sentinel config | measure | runs | p50 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    for (opts, results) in measured {
        let config = sentinel_config(opts);
        let writable = results.iter().map(|r| r.writable_after).collect();
        let agreed = results.iter().map(|r| r.agreed_after).collect();
        let lost = results.iter().map(|r| r.lost).collect();
        println!(
            "{}",
            duration_row(&config, "kill -9 → a replica accepts writes (ms)", writable)
        );
        println!(
            "{}",
            duration_row("", "kill -9 → every sentinel names it (ms)", agreed)
        );
        println!("{}", count_row("", "acknowledged writes lost", lost));
    }
    println!(
        "\nA second failover comes from Sentinel itself: a sentinel that switches to the new primary reconnects to it at most once a second (its link last tried the dead primary), so with `down-after-milliseconds` near 1 s it can flag the new primary down, and the other sentinels' \"primary down\" votes from the first failover still count toward the quorum: it fails over again, to a replica that lacks what the first new primary acknowledged. A run counts its failovers by the sentinels' `+switch-master` events, and its losses against the primary they settle on.\n"
    );
    for (opts, results) in measured {
        let acked: usize = results.iter().map(|r| r.acked).sum();
        let lost: usize = results.iter().map(|r| r.lost).sum();
        let again = results.iter().filter(|r| r.events.switches > 1).count();
        let retried = results.iter().filter(|r| r.events.aborts > 0).count();
        println!(
            "{}: {acked} acknowledged writes over {} runs, {lost} lost. Runs in which the sentinels failed over a second time before settling: {again}; runs with an aborted failover attempt (retried only after 2 × `failover-timeout`): {retried}.\n",
            sentinel_config(opts),
            results.len()
        );
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
