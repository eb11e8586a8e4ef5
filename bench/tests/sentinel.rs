//! Sentinel, the failover baseline: one unplanned failover measured end to end.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use valkey_sidecar_bench::sentinel::{SentinelOptions, Sentinels};
use valkey_sidecar_testkit::{ReplicationSet, ServerOptions};

#[test]
fn sentinels_fail_over_a_killed_primary() -> Result<()> {
    let started = Instant::now();
    let set = ReplicationSet::start(2, ServerOptions::default())?;
    let opts = SentinelOptions::default()
        .down_after(Duration::from_millis(1000))
        .failover_timeout(Duration::from_secs(10));
    let budget = opts.failover_budget();
    let sentinels = Sentinels::monitor(&set, opts)?;
    eprintln!("set and sentinels steady after {:?}", started.elapsed());
    ensure!(sentinels.primary()? == set.primary().addr());

    let run = sentinels.unplanned_failover(&set, budget)?;
    eprintln!("{run:?}");
    ensure!(run.old_primary == set.primary().addr());
    ensure!(
        set.replicas().iter().any(|r| r.addr() == run.new_primary),
        "{} was not a replica",
        run.new_primary
    );
    // Sentinel cannot notice the fault before down-after-milliseconds: a faster time would mean
    // the measurement is broken, not that Sentinel is fast.
    ensure!(
        (Duration::from_secs(1)..Duration::from_secs(15)).contains(&run.writable_after),
        "writable after {:?}",
        run.writable_after
    );
    ensure!(run.agreed_after >= run.writable_after);
    ensure!(run.acked > 0, "the writer got no write acknowledged");
    // With down-after 1 s Sentinel sometimes fails over a second time right after the first
    // (see `SETTLE_WINDOW`); either way the sentinels must end up agreeing.
    ensure!(run.events.switches >= 1, "{:?}", run.events);
    ensure!(sentinels.primaries()? == vec![run.final_primary; 3]);
    // The killed node is back, as a replica of the new primary.
    ensure!(set.primary().is_running() && !set.primary().is_primary()?);
    Ok(())
}
