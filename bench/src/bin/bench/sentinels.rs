//! The Sentinel baseline of replication mode: two deployments, each under two faults.
//!
//! - *Sentinel tuned for speed, with the chart's Valkey settings*: `down-after-milliseconds 1000`,
//!   `failover-timeout 10000`, and on every Valkey the `min-replicas-to-write 1` /
//!   `min-replicas-max-lag 10` the agent's pods run: the fair comparison, the main rows;
//! - *Sentinel's and Valkey's defaults*: what an untuned deployment does.
//!
//! The faults are the agent's: the primary's Valkey killed and restarted at once (a crashed
//! container under a kubelet), and its node cut (powered off, back after the failover).

use std::time::Duration;

use anyhow::{Context, Result};
use valkey_sidecar_bench::sentinel::{
    SentinelFault, SentinelOptions, Sentinels, UnplannedFailover,
};
use valkey_sidecar_testkit::{ReplicationSet, ServerOptions};

use crate::failover::MIN_REPLICAS;
use crate::report::{count_row, duration_row};
use crate::{env_count, faults, settings};

/// One Sentinel deployment: its name in the report, the sentinels' and the Valkeys' settings.
pub struct Setup {
    pub name: &'static str,
    pub sentinel: SentinelOptions,
    pub valkey: &'static [(&'static str, &'static str)],
}

impl Setup {
    /// The configuration printed beside its rows.
    pub fn config(&self) -> String {
        settings::sentinel(&self.sentinel, self.valkey)
    }
}

/// Sentinel as commonly tuned for speed, its Valkeys fenced as the chart fences ours: a 1 s
/// detection (with the 180 s default failover-timeout a split vote would be retried only after
/// 6 minutes; tuned deployments lower both).
pub fn fair() -> Setup {
    Setup {
        name: "Sentinel, `down-after-milliseconds 1000`, `min-replicas-to-write 1`",
        sentinel: SentinelOptions::default()
            .down_after(Duration::from_millis(1000))
            .failover_timeout(Duration::from_millis(10_000)),
        valkey: &MIN_REPLICAS,
    }
}

/// Sentinel and Valkey as they come.
pub fn defaults() -> Setup {
    Setup {
        name: "Sentinel and Valkey defaults (`down-after-milliseconds 30000`, no `min-replicas-to-write`)",
        sentinel: SentinelOptions::default(),
        valkey: &[],
    }
}

/// A deployment's runs under each fault.
pub struct Measured {
    pub setup: Setup,
    pub crash: Vec<UnplannedFailover>,
    pub power_off: Vec<UnplannedFailover>,
}

impl Measured {
    /// (row name, fault in words, runs) for each fault measured.
    pub fn faults(&self) -> Vec<(String, &'static str, &[UnplannedFailover])> {
        [(CRASH, &self.crash), (POWER_OFF, &self.power_off)]
            .into_iter()
            .filter(|(_, runs)| !runs.is_empty())
            .map(|(fault, runs)| {
                (
                    format!("{}: {fault}", self.setup.name),
                    fault,
                    runs.as_slice(),
                )
            })
            .collect()
    }
}

/// The faults in the rows' names (the agent's rows use the same words).
pub const CRASH: &str = "primary's Valkey killed";
pub const POWER_OFF: &str = "primary's node cut";

/// Both deployments: the fair one `BENCH_SENTINEL_RUNS` times per fault (default 20), the
/// defaults `BENCH_SENTINEL_DEFAULT_RUNS` times (default 10: each node cut waits out the 30 s
/// detection); 0 runs skips a deployment.
pub fn measure_all() -> Result<Vec<Measured>> {
    Ok(vec![
        measure(fair(), env_count("BENCH_SENTINEL_RUNS", 20))?,
        measure(defaults(), env_count("BENCH_SENTINEL_DEFAULT_RUNS", 10))?,
    ])
}

/// `runs` crashes, then `runs` node cuts, of one primary + 2 replicas under 3 sentinels.
fn measure(setup: Setup, runs: usize) -> Result<Measured> {
    if runs == 0 {
        return Ok(Measured {
            setup,
            crash: Vec::new(),
            power_off: Vec::new(),
        });
    }
    let opts = setup
        .valkey
        .iter()
        .fold(ServerOptions::default(), |o, (k, v)| o.arg(*k, *v));
    let set = ReplicationSet::start(2, opts)?;
    let sentinels = Sentinels::monitor(&set, setup.sentinel.clone())?;
    let crash = runs_of(&setup, &sentinels, &set, SentinelFault::Crash, runs)?;
    let power_off = runs_of(&setup, &sentinels, &set, SentinelFault::PowerOff, runs)?;
    Ok(Measured {
        setup,
        crash,
        power_off,
    })
}

fn runs_of(
    setup: &Setup,
    sentinels: &Sentinels,
    set: &ReplicationSet,
    fault: SentinelFault,
    runs: usize,
) -> Result<Vec<UnplannedFailover>> {
    let budget = setup.sentinel.failover_budget();
    let mut out = Vec::new();
    for i in 0..runs {
        let r = sentinels
            .unplanned(set, fault, budget)
            .with_context(|| format!("{} {fault:?} {}/{runs}", setup.name, i + 1))?;
        eprintln!(
            "sentinel {fault:?} {}/{runs} ({}): writable after {:?}, agreed after {:?}, {:?}, {} acked, {} lost, {} by a deposed primary, kept primary {}",
            i + 1,
            setup.name,
            r.writable_after,
            r.agreed_after,
            r.events,
            r.acked,
            r.lost,
            r.deposed,
            r.kept_primary()
        );
        out.push(r);
    }
    Ok(out)
}

/// `bench sentinel`: the baseline alone (no agent, no Kubernetes).
pub fn baseline() -> Result<()> {
    let measured = measure_all()?;
    report(&measured);
    log(&measured);
    Ok(())
}

/// The runs as rows of the fault table.
pub fn log(measured: &[Measured]) {
    for m in measured {
        for (name, _, runs) in m.faults() {
            faults::record_runs(
                "failover",
                faults::Runs {
                    scenario: &name,
                    acked: Some(runs.iter().map(|r| r.acked).sum()),
                    lost: runs.iter().map(|r| r.lost).sum(),
                    deposed: Some(runs.iter().map(|r| r.deposed).sum()),
                    recovery: runs.iter().map(|r| r.writable_after).collect(),
                    what: "fault → some node accepts writes",
                },
            );
        }
    }
}

/// The baseline in detail: each deployment's configuration, its runs per fault, and what
/// Sentinel did in them.
pub fn report(measured: &[Measured]) {
    let runs = |i: usize| measured.get(i).map_or(0, |m| m.crash.len());
    println!(
        "### Unplanned failover under Sentinel (the same valkey-server binary with `--sentinel`, 3 sentinels, quorum 2, 1 primary + 2 replicas on loopback)\n"
    );
    println!(
        "Command: `BENCH_SENTINEL_RUNS={} BENCH_SENTINEL_DEFAULT_RUNS={} target/release/bench failover` (also `bench sentinel` alone). {METHOD} With at most 50 runs p99 is the maximum. The deployments:\n",
        runs(0),
        runs(1)
    );
    for m in measured.iter().filter(|m| !m.faults().is_empty()) {
        println!("- {}: {}.", m.setup.name, m.setup.config());
    }
    println!();
    println!("| deployment and fault | measure | runs | p50 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    for m in measured {
        for (name, _, runs) in m.faults() {
            table_rows(&name, runs);
        }
    }
    println!("\n{SECOND_FAILOVER}\n");
    for m in measured {
        for (name, fault, runs) in m.faults() {
            println!("{}\n", what_happened(&name, fault, runs));
        }
    }
}

fn table_rows(name: &str, runs: &[UnplannedFailover]) {
    let times = |f: fn(&UnplannedFailover) -> Duration| runs.iter().map(f).collect();
    let counts = |f: fn(&UnplannedFailover) -> usize| runs.iter().map(f).collect();
    println!(
        "{}",
        duration_row(
            name,
            "fault → some node accepts writes (ms)",
            times(|r| r.writable_after)
        )
    );
    let agreed = times(|r| r.agreed_after);
    println!(
        "{}",
        duration_row("", "fault → every sentinel settled (ms)", agreed)
    );
    println!(
        "{}",
        count_row("", "acknowledged writes lost", counts(|r| r.lost))
    );
    let deposed = counts(|r| r.deposed);
    println!(
        "{}",
        count_row("", "acknowledged by a deposed primary", deposed)
    );
}

/// A run's counts in words: losses, and what the sentinels did.
fn what_happened(name: &str, fault: &str, runs: &[UnplannedFailover]) -> String {
    let acked: usize = runs.iter().map(|r| r.acked).sum();
    let lost: usize = runs.iter().map(|r| r.lost).sum();
    let kept = runs.iter().filter(|r| r.kept_primary()).count();
    let again = runs.iter().filter(|r| r.events.switches > 1).count();
    let aborted = runs.iter().filter(|r| r.events.aborts > 0).count();
    let rebooted = runs.iter().filter(|r| r.events.reboots > 0).count();
    let kept_words = match fault {
        CRASH => {
            "the restarted node was the primary again at the end (nobody failed over: it came back empty within `down-after-milliseconds` and its replicas resynced from it)"
        }
        _ => "the node cut was the primary again at the end",
    };
    format!(
        "{name}: {acked} acknowledged writes over {} runs, {lost} lost. Runs in which {kept_words}: {kept}; in which a sentinel logged `+reboot` (it saw the primary's new run id): {rebooted}; in which the sentinels failed over a second time before settling: {again}; with an aborted failover attempt (retried only after 2 × `failover-timeout`): {aborted}.",
        runs.len()
    )
}

/// How the runs go, for the report.
const METHOD: &str = "Each run starts a writer (one `SET` at a time, unique keys, 1 s timeouts, to whichever node \
accepts them) and takes the primary down half a second later. *Valkey killed*: SIGKILL, and the process restarted at \
once, as a kubelet restarts a crashed container: same port, dir and arguments, so empty (no persistence). *Node cut*: \
the process frozen (SIGSTOP) as on a powered-off node, its address silent and clients hanging until their timeouts; \
once the sentinels have settled it is killed and restarted empty, the node back on. Either way the restarted node takes \
the role the sentinels name at that moment, as the start scripts of Sentinel deployments do: primary if they still name \
it. From the fault on every node is offered a `SET` every 5 ms (after a crash the restarted node too; `READONLY` and \
`NOREPLICAS` count as not yet): *fault → some node accepts writes*. *Every sentinel settled*: from the fault until \
every sentinel monitors the primary it settles on, healthy with no failover in progress, for good (3 s unchanged). Once \
the set is steady again (every replica synced, every sentinel seeing it so) the writer stops and every acknowledged key \
is read back from the primary: *lost*; *acknowledged by a deposed primary*: writes another node acknowledged after that \
primary's first.";

/// Why a run can lose writes even after a clean failover.
const SECOND_FAILOVER: &str = "Two Sentinel behaviours show in these rows. A crashed primary that is back at once may \
never be seen down (Sentinel's `primary-reboot-down-after-period`, off by default, exists to treat a rebooted primary \
as down): then it stays the primary, empty, and its replicas resync from it, so the data is gone, as with Valkey \
Cluster alone; the runs that ended so are counted below. And a sentinel that switches to a new primary reconnects to it at most once a second (its link last \
tried the dead primary), so with `down-after-milliseconds` near 1 s it can flag the new primary down, and the other \
sentinels' \"primary down\" votes from the first failover still count toward the quorum: it fails over again, to a \
replica that lacks what the first new primary acknowledged. A run counts its failovers by the sentinels' \
`+switch-master` events.";
