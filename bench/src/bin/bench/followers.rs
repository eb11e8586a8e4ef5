//! Followers: a watch on each Lease they follow (the default) against a read of it every retry
//! period (`SIDECAR_LEASE_WATCH=false`, what every follower did before the watch), in one run on
//! the same build: the API requests each costs in steady state, the holders' Lease writes, and
//! the time to take over after a holder's node loses power — in cluster mode the coordinator
//! Lease (the new holder coordinating), in replication mode the shard record (another pod taking
//! writes). Chart installs with the chart's Lease timings.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use valkey_sidecar_testkit::k8s::audit::{Usage, pod_identity};
use valkey_sidecar_testkit::k8s::shard;
use valkey_sidecar_testkit::k8s::{Stage, poll_until};

use crate::api::all_requests;
use crate::failover::{self, Fault};
use crate::report::{ms, percentile};

/// The two ways a follower learns of the Lease, as the agent's settings.
const WAYS: [(&str, &[(&str, &str)]); 2] = [
    ("watch (default)", &[]),
    (
        "read every retry period",
        &[("SIDECAR_LEASE_WATCH", "false")],
    ),
];

/// The steady-state window counted from the audit log.
const STEADY: Duration = Duration::from_secs(60);

/// What one install measured.
struct Measured {
    mode: &'static str,
    way: &'static str,
    steady: Steady,
    /// Per holder loss: the cut → another pod holds the Lease, → it acts (cluster mode: it
    /// coordinates; replication mode: it takes writes), → it carries the `primary` label
    /// (replication mode only).
    runs: Vec<Takeover>,
}

/// One holder loss.
struct Takeover {
    held: Duration,
    acting: Duration,
    labelled: Option<Duration>,
    /// Acknowledged writes lost (replication mode, which runs a writer).
    lost: Option<usize>,
}

/// Requests per minute in the steady window.
struct Steady {
    /// Each follower's (an agent holding no Lease) reads of the Leases (get, list, watch), per
    /// minute.
    follower_reads: Vec<f64>,
    /// The most requests of any kind a follower sent, per minute.
    follower_all: f64,
    /// Every agent's Lease writes (the holders' renewals), per minute.
    lease_writes: f64,
    /// Everyone's requests (kubelet, controllers), per minute.
    apiserver: f64,
}

/// Both modes, both ways, `runs` holder losses each; prints the report's section.
pub async fn run(bin: &Path, runs: usize) -> Result<()> {
    let mut measured = Vec::new();
    for (way, env) in WAYS {
        measured.push(cluster(bin, way, env, runs).await?);
        measured.push(replication(bin, way, env, runs).await?);
    }
    print(&measured, runs);
    Ok(())
}

/// Cluster mode, 3 shards × 2: the coordinator's node powered off `runs` times.
async fn cluster(
    bin: &Path,
    way: &'static str,
    env: &[(&str, &str)],
    runs: usize,
) -> Result<Measured> {
    let (stage, holder) = crate::coordinated_stage(bin, env, true).await?;
    stage.wait_settled(6, 3, Duration::from_secs(180)).await?;
    let steady = steady(&stage, &holder).await?;
    let mut taken = Vec::new();
    for i in 0..runs {
        let t = coordinator_loss(&stage).await?;
        eprintln!(
            "followers: cluster, {way}, {}/{runs}: held after {:?}, coordinating after {:?}",
            i + 1,
            t.held,
            t.acting
        );
        taken.push(t);
    }
    Ok(Measured {
        mode: "cluster, 3 shards × 2",
        way,
        steady,
        runs: taken,
    })
}

/// The coordinator's node powered off: the time until another pod holds the Lease (as a watch
/// on it delivers) and until that pod's agent reports coordinating; then power is back and the
/// install settles again.
async fn coordinator_loss(s: &Stage) -> Result<Takeover> {
    s.wait_settled(6, 3, Duration::from_secs(240)).await?;
    let old = s.wait_coordinator(Duration::from_secs(30)).await?;
    let node = s.node_of(&old).await?;
    let (watch, watching) = s.watch_coordinator_holders();
    // A few renewals seen, so the cut falls at any phase of the retry period.
    tokio::time::sleep(Duration::from_millis(
        2500 + (crate::rand_tag() % 2000) as u64,
    ))
    .await;
    let at = Instant::now();
    s.kubelet.power_off(&node)?;
    let what = format!("another holder of the Lease after {old}'s node lost power");
    let waited = poll_until(
        &what,
        Duration::from_secs(120),
        Duration::from_millis(10),
        || async { Ok(watch.taken_over(&old).is_some()) },
    )
    .await;
    watching.abort();
    waited?;
    let (new, seen) = watch.taken_over(&old).context("the new holder")?;
    let acting = coordinating(s, &new, at).await?;
    s.kubelet.power_on(&node)?;
    Ok(Takeover {
        held: seen.duration_since(at),
        acting,
        labelled: None,
        lost: None,
    })
}

/// Polls `pod`'s `/metrics` until it reports coordinating; the time since `at`.
async fn coordinating(s: &Stage, pod: &str, at: Instant) -> Result<Duration> {
    let what = format!("{pod}, holding the Lease, reporting coordinating");
    poll_until(
        &what,
        Duration::from_secs(120),
        Duration::from_millis(10),
        || async {
            let leader = s.agent_counter(pod, "valkey_sidecar_coordinator_leader");
            Ok(leader.await.is_ok_and(|v| v == 1))
        },
    )
    .await?;
    Ok(at.elapsed())
}

/// Replication mode, one shard of 3: the primary's node powered off `runs` times (the failover
/// benchmark's run, at the chart's Lease timings).
async fn replication(
    bin: &Path,
    way: &'static str,
    env: &[(&str, &str)],
    runs: usize,
) -> Result<Measured> {
    let stage = failover::stage(bin, env, true).await?;
    let holder = stage.wait_coordinator(Duration::from_secs(30)).await?;
    shard::wait_steady(&stage, Duration::from_secs(90)).await?;
    let steady = steady(&stage, &holder).await?;
    let mut taken = Vec::new();
    for i in 0..runs {
        stage.flush_primaries()?;
        let r = failover::run(&stage, Fault::CutNode).await?;
        eprintln!(
            "followers: replication, {way}, {}/{runs}: record held after {:?}, writable {:?}, labelled {:?}, {} lost",
            i + 1,
            r.held,
            r.writable,
            r.labelled,
            r.lost
        );
        taken.push(Takeover {
            held: r.held.context("the record's new holder was not seen")?,
            acting: r.writable,
            labelled: Some(r.labelled),
            lost: Some(r.lost),
        });
    }
    Ok(Measured {
        mode: "replication, 1 shard × 3",
        way,
        steady,
        runs: taken,
    })
}

/// The audit log's steady window: what each follower (an agent holding no Lease) costs, and the
/// Lease writes of all (in replication mode the primary's agent renews the shard record too).
async fn steady(s: &Stage, holder: &str) -> Result<Steady> {
    let log = s.plane.audit_log().context("the audit log is off")?;
    // The agents' start-up requests are behind them.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let from = SystemTime::now();
    tokio::time::sleep(STEADY).await;
    // Each request is logged as it completes: give the last ones time to reach the file.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let usage = log.usage(from, from + STEADY)?;
    if s.coordinator_holder().await?.as_deref() != Some(holder) {
        bail!("the coordinator Lease changed hands during the steady window");
    }
    // In replication mode the primary's agent holds its shard's record: it renews, not follows.
    let record_holder = shard::record(s, "0").await.and_then(|r| r.holder);
    let who = |p: &str| pod_identity(&s.namespace, p);
    let holds = |p: &str| p == holder || record_holder.as_deref() == Some(p);
    let followers: Vec<&String> = s.pods.iter().filter(|p| !holds(p)).collect();
    let reads = |p: &str| lease_reads(&usage, &who(p));
    let lease_writes: u64 = s
        .pods
        .iter()
        .map(|p| usage.get(&who(p), "update", "leases") + usage.get(&who(p), "create", "leases"))
        .sum();
    Ok(Steady {
        follower_reads: followers
            .iter()
            .map(|p| usage.per_minute(reads(p)))
            .collect(),
        follower_all: followers
            .iter()
            .map(|p| usage.per_minute(usage.total(&who(p))))
            .fold(0.0, f64::max),
        lease_writes: usage.per_minute(lease_writes),
        apiserver: usage.per_minute(all_requests(&usage)),
    })
}

fn lease_reads(usage: &Usage, who: &str) -> u64 {
    ["get", "list", "watch"]
        .iter()
        .map(|verb| usage.get(who, verb, "leases"))
        .sum()
}

fn print(measured: &[Measured], runs: usize) {
    println!(
        "Command: `BENCH_TAKEOVERS={runs} target/release/bench followers`. The same build installed four times by the chart (real kube-apiserver v1.37.2, kube-scheduler and kube-controller-manager, process-backed pods on 6 nodes in 3 zones, the apiserver's audit log on), identical but for `SIDECAR_LEASE_WATCH`: followers learn of the Leases they follow from a watch on each (the default), or read each every retry period (`false`, what every follower did before the watch). The chart's Lease timings: duration 15 s, renew deadline 10 s, retry period 2 s. Cluster mode: 3 shards × 2; a follower (an agent holding no Lease) follows the coordinator Lease. Replication mode: one shard of 3; a follower follows the coordinator Lease and its shard's record (held by the primary's agent, which is then no follower).\n"
    );
    print_steady(measured);
    print_takeovers(measured);
}

fn print_steady(measured: &[Measured]) {
    println!(
        "### Steady state ({} s window, from the apiserver's audit log)\n",
        STEADY.as_secs()
    );
    println!(
        "A follower's Lease reads count get, list and watch requests on `leases` (a watch is counted when it ends: the apiserver ends each after 200–290 s, the agent's `k8s::watch_config`). Lease writes are every agent's `update` and `create` on `leases`: the holders' renewals.\n"
    );
    println!(
        "| mode | followers learn by | a follower's Lease reads / min (mean, max) | a follower's requests / min, all (max) | Lease writes / min, all agents | apiserver requests / min, everyone |"
    );
    println!("|---|---|---|---|---|---|");
    for m in measured {
        let s = &m.steady;
        let mean = s.follower_reads.iter().sum::<f64>() / s.follower_reads.len().max(1) as f64;
        let max = s.follower_reads.iter().copied().fold(0.0, f64::max);
        println!(
            "| {} | {} | {mean:.1}, {max:.1} | {:.1} | {:.1} | {:.0} |",
            m.mode, m.way, s.follower_all, s.lease_writes, s.apiserver
        );
    }
    println!();
}

fn print_takeovers(measured: &[Measured]) {
    println!("### Take-over after the holder's node loses power\n");
    println!(
        "Cluster mode: the coordinator's node powered off (its agent and Valkey silent, no restart), from a steady install, at a random phase of the retry period; *holds the Lease*: a watch on the Lease delivers a version naming another holder; *acts*: that agent's `/metrics` (polled every 10 ms) reports `valkey_sidecar_coordinator_leader 1`, set at the start of each round it may act in. Then power is back and the install settles before the next run. Replication mode: the primary's node powered off under a writer (the failover benchmark's run); *holds the Lease*: a watch on the shard record delivers another holder; *acts*: another pod accepts a `SET`; *labelled*: it also carries `valkey.io/role=primary`. p50 / p99 (with at most 50 runs p99 is the maximum).\n"
    );
    println!(
        "| mode | followers learn by | runs | cut → another holds the Lease | cut → it acts | cut → labelled primary | writes lost |"
    );
    println!("|---|---|---|---|---|---|---|");
    for m in measured {
        let pick = |f: fn(&Takeover) -> Option<Duration>| -> Vec<Duration> {
            let mut v: Vec<Duration> = m.runs.iter().filter_map(f).collect();
            v.sort();
            v
        };
        let held = pick(|t| Some(t.held));
        let acting = pick(|t| Some(t.acting));
        let labelled = pick(|t| t.labelled);
        let lost: Option<usize> = m.runs.iter().map(|t| t.lost).sum();
        let labelled = match labelled.is_empty() {
            true => "–".to_owned(),
            false => p50_p99(&labelled),
        };
        let lost = lost.map_or_else(|| "–".to_owned(), |n| n.to_string());
        println!(
            "| {} | {} | {} | {} | {} | {labelled} | {lost} |",
            m.mode,
            m.way,
            m.runs.len(),
            p50_p99(&held),
            p50_p99(&acting)
        );
    }
    println!();
}

fn p50_p99(sorted: &[Duration]) -> String {
    format!(
        "{:.0} / {:.0} ms",
        ms(percentile(sorted, 0.5)),
        ms(percentile(sorted, 0.99))
    )
}
