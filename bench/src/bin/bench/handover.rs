//! Cluster mode, planned and unplanned: the agents' hand-over when a primary's node is cordoned
//! and a crash of a primary's Valkey, against Valkey on its own (`alone`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use valkey_sidecar_testkit::k8s::{ROLE_LABEL, Stage, poll_until};

use crate::report::{percentile, sorted, summary_row as row};
use crate::{coordinated_stage, cordon};

/// What one hand-over looked like.
struct Handover {
    /// The writer's longest pause between two acknowledged writes.
    pause: Duration,
    /// From the cordon to the old primary answering `ROLE` as a replica.
    demoted: Duration,
    acked: usize,
    lost: usize,
    /// The coordinator counted the move as succeeded.
    succeeded: bool,
}

/// The node timeout of the agents' stage (the chart's default), used for Valkey alone too.
const NODE_TIMEOUT_MS: u64 = 5000;

/// `bench handover`: `runs` hand-overs and `runs` crashes of a primary's Valkey on one
/// coordinated stage, then the same moves by Valkey on its own, and the comparison.
pub async fn run(bin: &Path, runs: usize) -> Result<()> {
    let (stage, coordinator) =
        coordinated_stage(bin, &[("SIDECAR_BALANCE", "false")], false).await?;
    let moves = handovers(&stage, runs).await?;
    let crashes = crashes(&stage, runs).await?;
    drop(stage);
    let wait = Duration::from_secs(10);
    let alone =
        tokio::task::spawn_blocking(move || crate::alone::measure(runs, NODE_TIMEOUT_MS, wait))
            .await??;
    print_handovers(&moves, &coordinator);
    print_crashes(&crashes, &alone);
    let pauses: Vec<Duration> = moves.iter().map(|m| m.pause).collect();
    crate::alone::report(
        &alone,
        &pauses,
        &agent_config(),
        &format!("BENCH_HANDOVERS={runs} target/release/bench handover"),
    );
    println!("{}", plot(&moves, &crashes, &alone)?);
    log_runs(&moves, &crashes, &alone);
    summarize(&moves, &crashes, &alone);
    Ok(())
}

/// The agents' settings on this stage: the chart's, the Lease's, balance off.
fn agent_config() -> String {
    format!(
        "{}; {}; `SIDECAR_BALANCE=false`",
        crate::settings::chart_cluster(),
        crate::settings::lease(&[])
    )
}

/// The summary's two cluster rows: the hand-over against Valkey's own, the crash against Valkey
/// alone.
fn summarize(moves: &[Handover], crashes: &[Crash], alone: &crate::alone::Baselines) {
    use crate::alone::{Stop, Stopped, shutdown_setting};
    use crate::settings::valkey_alone;
    use crate::summary::{Row, Side, record};
    let lost = |s: &[Stopped]| s.iter().map(|s| s.moved.lost).sum();
    let acked = |s: &[Stopped]| Some(s.iter().map(|s| s.moved.acked).sum());
    let config = |how| valkey_alone(alone.node_timeout_ms, shutdown_setting(how));
    if !moves.is_empty() && !alone.failover.is_empty() {
        let pauses: Vec<Duration> = moves.iter().map(|m| m.pause).collect();
        let theirs: Vec<Duration> = alone.failover.iter().map(|s| s.moved.pause).collect();
        record(&Row {
            key: "handover".into(),
            measure: "cluster mode, planned hand-over: longest write pause".into(),
            ours: Side::timing("agent (node cordoned)", &agent_config(), &pauses).lost(
                moves.iter().map(|m| m.lost).sum(),
                Some(moves.iter().map(|m| m.acked).sum()),
            ),
            theirs: Some(
                Side::timing("Valkey, then SIGTERM", &config(Stop::SigtermFailover), &theirs)
                    .lost(lost(&alone.failover), acked(&alone.failover)),
            ),
            runs: format!("{} + {}", moves.len(), alone.failover.len()),
            why: "Valkey's own hand-over paused writes for less in this run: it hands over from inside the primary as it stops, the agent only once it has seen the cordon through the Kubernetes API".into(),
        });
    }
    if !crashes.is_empty() && !alone.crash.is_empty() {
        let labelled: Vec<Duration> = crashes.iter().map(|c| c.labelled).collect();
        let theirs: Vec<Duration> = alone.crash.iter().map(|s| s.writable).collect();
        record(&Row {
            key: "cluster-crash".into(),
            measure: "cluster mode, a primary's Valkey killed and restarted at once → the shard writable again (agent: and labelled)".into(),
            ours: Side::timing("agents", &agent_config(), &labelled).lost(
                crashes.iter().map(|c| c.lost).sum(),
                Some(crashes.iter().map(|c| c.acked).sum()),
            ),
            theirs: Some(
                Side::timing(
                    "Valkey alone (restarts empty, no failover: not like for like)",
                    &config(Stop::Sigkill),
                    &theirs,
                )
                    .lost(lost(&alone.crash), acked(&alone.crash)),
            ),
            runs: format!("{} + {}", crashes.len(), alone.crash.len()),
            why: CRASH_WHY.into(),
        });
    }
}

/// The acknowledged and lost cells of a Valkey-alone row.
fn acked_lost(runs: &[crate::alone::Stopped]) -> String {
    let acked: usize = runs.iter().map(|s| s.moved.acked).sum();
    let lost: usize = runs.iter().map(|s| s.moved.lost).sum();
    format!("{acked} | {lost} |")
}

/// Why the agents can be slower after a crash in cluster mode.
const CRASH_WHY: &str = "the agents' figure includes the label and a failover, while Valkey alone counts its restarted \
node taking writes again, empty, about 2 s after the crash (a restarted primary refuses writes that long before it \
rejoins as writable), without any failover: the lost columns show what that cost";

/// The runs as rows of the fault table.
fn log_runs(moves: &[Handover], crashes: &[Crash], alone: &crate::alone::Baselines) {
    use crate::faults::{Runs, record_runs};
    record_runs(
        "handover",
        Runs {
            scenario: "cluster: hand-over on cordon (agent)",
            acked: Some(moves.iter().map(|m| m.acked).sum()),
            lost: moves.iter().map(|m| m.lost).sum(),
            deposed: None,
            recovery: moves.iter().map(|m| m.pause).collect(),
            what: "the longest write pause",
        },
    );
    record_runs(
        "handover",
        Runs {
            scenario: "cluster: primary's Valkey killed (agents alive)",
            acked: Some(crashes.iter().map(|c| c.acked).sum()),
            lost: crashes.iter().map(|c| c.lost).sum(),
            deposed: None,
            recovery: crashes.iter().map(|c| c.labelled).collect(),
            what: "kill -9 → the replica writable and labelled primary",
        },
    );
    for (scenario, runs) in [
        (
            "cluster, no agent: `shutdown-on-sigterm failover` + SIGTERM",
            &alone.failover,
        ),
        ("cluster, no agent: plain pod kill (SIGTERM)", &alone.plain),
        (
            "cluster, no agent: SIGKILL, restarted at once",
            &alone.crash,
        ),
        (
            "cluster, no agent, 2 s node timeout: SIGKILL, restarted at once",
            &alone.crash_fast,
        ),
    ] {
        let moves: Vec<crate::failover::Move> = runs.iter().map(|s| s.moved.clone()).collect();
        record_runs("handover", crate::failover::as_runs(scenario, &moves));
    }
}

/// `runs` hand-overs on one stage: each cordons the node of a shard's primary (shards in turn)
/// with a writer on that shard, waits for the old primary to be demoted, then uncordons and
/// lets the shard settle. Balance is off so that nothing else moves between runs.
async fn handovers(stage: &Stage, runs: usize) -> Result<Vec<Handover>> {
    let mut results = Vec::new();
    for i in 0..runs {
        let r = handover(stage, i % 3).await?;
        eprintln!(
            "hand-over {}/{runs}: pause {:?}, demoted after {:?}, {} acked, {} lost",
            i + 1,
            r.pause,
            r.demoted,
            r.acked,
            r.lost
        );
        results.push(r);
    }
    Ok(results)
}

fn print_handovers(results: &[Handover], coordinator: &str) {
    let runs = results.len();
    let pauses = sorted(results.iter().map(|r| r.pause).collect());
    let demoted = sorted(results.iter().map(|r| r.demoted).collect());
    println!(
        "### Hand-over when a primary's node is cordoned (real kube-apiserver v1.37.2, {runs} hand-overs)\n"
    );
    println!(
        "Command: `BENCH_HANDOVERS={runs} target/release/bench handover`. Every run of the agents starts from an empty dataset (`FLUSHALL` on the primaries, which the replicas follow), so the chart's default `maxmemory` (768 MiB of the `small` preset's 1Gi) is never reached over the runs. One coordinated stage of the chart's pods (3 shards × 2 members, Lease holder {coordinator}; settings: {}); each run starts a writer (one `SET` at a time, unique keys) on the next shard, cordons the node of its primary, waits until the old primary is a replica, stops the writer a second later, reads every acknowledged key back from the new primary, uncordons and waits for the shard to settle. The pause is the longest gap between two acknowledged writes in the run, as the client sees it (target: p99 ≤ 250 ms). With {runs} runs p99 is the maximum.\n",
        agent_config()
    );
    println!("| measure | hand-overs | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    println!("{}", row("longest write pause", &pauses));
    println!("{}", row("cordon → old primary demoted", &demoted));
    let acked: usize = results.iter().map(|r| r.acked).sum();
    let lost: usize = results.iter().map(|r| r.lost).sum();
    let succeeded = results.iter().filter(|r| r.succeeded).count();
    println!(
        "\nAcknowledged writes: {acked}, lost: {lost}. Hand-overs the coordinator counted as succeeded: {succeeded} of {runs}.\n"
    );
}

/// What one crash of a primary's Valkey looked like, its agent alive.
struct Crash {
    /// From the SIGKILL to the shard's replica accepting a `SET`.
    writable: Duration,
    /// ... and carrying `valkey.io/role=primary`.
    labelled: Duration,
    acked: usize,
    lost: usize,
    /// Of `lost`, those acknowledged outside the [`TAIL`] before the kill (earlier, or after it):
    /// what an empty restart's resync would wipe, unlike the stream a replica had not received.
    lost_outside_tail: usize,
}

/// The end of the replication stream a replica may not have received when its primary died.
const TAIL: Duration = Duration::from_millis(500);

/// `runs` crashes, shards in turn: SIGKILL of the primary's Valkey container (the kubelet
/// restarts it; it rejoins as a replica), Valkey Cluster fails over by itself after the node
/// timeout, the agents relabel.
async fn crashes(stage: &Stage, runs: usize) -> Result<Vec<Crash>> {
    let mut out = Vec::new();
    for i in 0..runs {
        let c = crash(stage, i % 3).await?;
        eprintln!(
            "crash {}/{runs}: writable {:?}, labelled {:?}, {} lost",
            i + 1,
            c.writable,
            c.labelled,
            c.lost
        );
        out.push(c);
    }
    Ok(out)
}

/// One crash of `shard`'s primary Valkey: the kubelet restarts it at once (as a real one does),
/// empty without persistence. *writable*: some member of the shard takes a write again;
/// *labelled*: that member carries the primary label; writes lost are read back once the crashed
/// pod is back and the shard whole.
async fn crash(stage: &Stage, shard: usize) -> Result<Crash> {
    stage.flush_primaries()?;
    let (primary, _) = stage.primary_and_replica(shard)?;
    let writer = stage.shard_writer(shard)?;
    let probe = format!("{{{}}}:probe", writer.tag);
    let members = stage.shard_pods(shard).to_vec();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at = Instant::now();
    stage
        .kubelet
        .crash_container(&stage.namespace, &primary, "valkey")?;
    let taker = first_writable(stage, &members, &probe).await?;
    let writable = at.elapsed();
    labelled_primary(stage, &taker).await?;
    let labelled = at.elapsed();
    rejoined(stage, &members).await?;
    let tag = writer.tag.clone();
    let written = writer.stop()?;
    let (now_primary, _) = stage.primary_and_replica(shard)?;
    let missing = valkey_sidecar_testkit::k8s::writer::missing(
        stage.valkey(&now_primary)?,
        &stage.client(),
        &tag,
        &written.acked,
    )?;
    let lost_outside_tail = written.lost_outside_tail(&missing, at, TAIL).len();
    // The next crash must be a first crash too (restarted at once, as in production), not one
    // the kubelet holds back in crash-loop back-off: a fresh pod, back in its shard.
    stage.recycle(&primary, Duration::from_secs(120)).await?;
    rejoined(stage, &members).await?;
    Ok(Crash {
        writable,
        labelled,
        acked: written.acked.len(),
        lost: missing.len(),
        lost_outside_tail,
    })
}

/// The first member that takes a write of `probe` (offered every 5 ms, for up to 30 s).
async fn first_writable(stage: &Stage, members: &[String], probe: &str) -> Result<String> {
    let taker = std::sync::Mutex::new(None);
    poll_until(
        "a member of the shard takes writes",
        Duration::from_secs(30),
        Duration::from_millis(5),
        || async {
            let writable = members
                .iter()
                .find(|p| stage.cmd(p, &["SET", probe, "1"]).is_ok());
            *crate::lock(&taker) = writable.cloned();
            Ok(writable.is_some())
        },
    )
    .await?;
    let taker = crate::lock(&taker).clone();
    taker.context("no member took the write")
}

/// Waits (polling every 5 ms, up to 30 s) until `pod` carries the primary label.
async fn labelled_primary(stage: &Stage, pod: &str) -> Result<()> {
    poll_until(
        "the writable member is labelled primary",
        Duration::from_secs(30),
        Duration::from_millis(5),
        || async {
            let labels = stage.labels(pod).await?;
            Ok(labels.get(ROLE_LABEL).map(String::as_str) == Some("primary"))
        },
    )
    .await
    .map(|_| ())
}

/// The shard is whole again: every member Ready, one labelled primary and the others replica —
/// the next run finds a whole shard, and the read-back sees what survived the restart.
async fn rejoined(stage: &Stage, members: &[String]) -> Result<()> {
    let ready = Duration::from_secs(90);
    for pod in members {
        stage
            .kubelet
            .wait_ready(&stage.namespace, pod, ready)
            .await?;
    }
    poll_until(
        "one primary and replicas labelled",
        ready,
        Duration::from_millis(50),
        || async {
            let mut roles = Vec::new();
            for pod in members {
                roles.push(stage.labels(pod).await?.get(ROLE_LABEL).cloned());
            }
            let primaries = roles.iter().filter(|r| r.as_deref() == Some("primary"));
            let replicas = roles.iter().filter(|r| r.as_deref() == Some("replica"));
            Ok(primaries.count() == 1 && replicas.count() == members.len() - 1)
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

fn print_crashes(ours: &[Crash], baselines: &crate::alone::Baselines) {
    use crate::alone::{FAST_NODE_TIMEOUT_MS, Stop, shutdown_setting};
    let alone = &baselines.crash;
    use crate::report::duration_row;
    print_crash_method(ours.len());
    println!("| measure | settings | runs | p50 ms | p99 ms | max ms | acknowledged | lost |");
    println!("|---|---|---|---|---|---|---|---|");
    let writable = ours.iter().map(|c| c.writable).collect();
    let labelled: Vec<Duration> = ours.iter().map(|c| c.labelled).collect();
    let theirs: Vec<Duration> = alone.iter().map(|s| s.writable).collect();
    let acked: usize = ours.iter().map(|c| c.acked).sum();
    let lost: usize = ours.iter().map(|c| c.lost).sum();
    let config = agent_config();
    let row = duration_row(
        "with the agents: kill -9 → a member writable",
        &config,
        writable,
    );
    println!("{row} {acked} | {lost} |");
    let row = duration_row(
        "with the agents: kill -9 → writable and labelled",
        "",
        labelled.clone(),
    );
    println!("{row} | |");
    let node_timeout = NODE_TIMEOUT_MS;
    let alone_config = crate::settings::valkey_alone(node_timeout, shutdown_setting(Stop::Sigkill));
    let row = duration_row(
        "Valkey alone: kill -9, restarted at once → a member writable",
        &alone_config,
        theirs.clone(),
    );
    println!("{row} {}", acked_lost(alone));
    let fast = &baselines.crash_fast;
    let fast_times: Vec<Duration> = fast.iter().map(|s| s.writable).collect();
    let fast_config =
        crate::settings::valkey_alone(FAST_NODE_TIMEOUT_MS, shutdown_setting(Stop::Sigkill));
    let row = duration_row(
        "Valkey alone, 2 s node timeout: kill -9, restarted at once → a member writable",
        &fast_config,
        fast_times.clone(),
    );
    println!("{row} {}", acked_lost(fast));
    let labelled = sorted(labelled);
    let outside: usize = ours.iter().map(|c| c.lost_outside_tail).sum();
    println!(
        "\nThe agents' lost writes: {lost}, of them {outside} acknowledged outside the {} ms before the kill (the stream a replica may not have received when its primary died is lost by asynchronous replication; anything older would be what an empty restart wiped).\n",
        TAIL.as_millis()
    );
    print_crash_ratios(alone, theirs, fast_times, &labelled);
}

/// How the crash rows are measured (the section's text).
fn print_crash_method(runs: usize) {
    println!(
        "### Cluster mode, unplanned: a primary's Valkey crashes, with the agents and on its own\n"
    );
    println!(
        "Command: `BENCH_HANDOVERS={runs} target/release/bench handover`. With the agents: the stage above, SIGKILL of the primary's Valkey container (its agent lives; the kubelet restarts Valkey at once, empty), shards in turn, a writer on the shard; *writable*: a member of the shard accepts a `SET` again (offered every 5 ms, the restarted one included), *labelled*: it also carries `{ROLE_LABEL}=primary`; acknowledged writes are read back once the crashed pod is back and the shard whole. Every run is a container's first crash, as a crash in production is: the pod crashed in the run before is deleted and recreated by its StatefulSet first (a container that crashed before restarts only after the kubelet's crash-loop back-off, by which time Valkey Cluster has failed over). Valkey alone: the loopback cluster of the next section, SIGKILL of a primary and a restart at once, at the chart's node timeout and again at 2 s (a setting users pick to fail over sooner without an agent). The agents: the coordinator holds an idle connection to every primary; it sees this one close and refuse a new dial, reads each replica's offset from the replica and sends the highest `CLUSTER FAILOVER FORCE` (Valkey's election among the primaries still runs; never `TAKEOVER`); the restarted container's `valkey-sidecar await` holds `valkey-server` until a replica has taken over, so the empty node rejoins as its replica. Valkey alone elects a replica only after `cluster-node-timeout`, and a node restarted before that keeps its slots. With at most 50 runs p99 is the maximum.\n"
    );
}

/// Valkey alone's times over the agents' (writable and labelled), at p50 and p99; and why, where
/// the agent does not win.
fn print_crash_ratios(
    alone: &[crate::alone::Stopped],
    theirs: Vec<Duration>,
    fast_times: Vec<Duration>,
    labelled: &[Duration],
) {
    for (name, theirs) in [
        ("Valkey alone", theirs),
        ("Valkey alone at a 2 s node timeout", fast_times),
    ] {
        let theirs = sorted(theirs);
        let r = |p: f64| crate::report::ratio(percentile(&theirs, p), percentile(labelled, p));
        println!(
            "Ratio ({name} to writable ÷ the agents' to writable and labelled; above 1 the agent is faster): p50 {}, p99 {}.\n",
            r(0.5),
            r(0.99)
        );
    }
    let theirs: Vec<Duration> = sorted(alone.iter().map(|s| s.writable).collect());
    if percentile(&theirs, 0.5) < percentile(labelled, 0.5) {
        println!("Where the agent does not win on time: {CRASH_WHY}.\n");
    }
}

fn plot(moves: &[Handover], crashes: &[Crash], alone: &crate::alone::Baselines) -> Result<String> {
    use crate::plot::Bar;
    let bar = |label: &str, v: Vec<Duration>| {
        let v = sorted(v);
        Bar::new(label, percentile(&v, 0.5), percentile(&v, 0.99))
    };
    let pause = |s: &[crate::alone::Stopped]| s.iter().map(|s| s.moved.pause).collect();
    let bars = [
        bar(
            "agent hand-over (cordon): write pause",
            moves.iter().map(|m| m.pause).collect(),
        ),
        bar(
            "Valkey shutdown-on-sigterm failover: pause",
            pause(&alone.failover),
        ),
        bar(
            "plain pod kill (SIGTERM), no sidecar: pause",
            pause(&alone.plain),
        ),
        bar(
            "crash, agents: writable + labelled",
            crashes.iter().map(|c| c.labelled).collect(),
        ),
        bar(
            "crash, Valkey alone: writable",
            alone.crash.iter().map(|s| s.writable).collect(),
        ),
    ];
    crate::plot::bars(
        "cluster",
        "Cluster mode: planned and unplanned moves",
        "ms",
        &bars,
    )
}

/// One hand-over of `shard`'s primary by cordoning its node.
async fn handover(stage: &Stage, shard: usize) -> Result<Handover> {
    stage.flush_primaries()?;
    let (primary, replica) = stage.primary_and_replica(shard)?;
    let before = handovers_ok(stage).await?;
    let writer = stage.shard_writer(shard)?;
    let tag = writer.tag.clone();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let node = stage.node_of(&primary).await?;
    let cordoned = Instant::now();
    cordon(stage, &node, true).await?;
    poll_until(
        "the old primary is demoted",
        Duration::from_secs(20),
        Duration::from_millis(5),
        || async { Ok(stage.role(&primary).as_deref() == Some("slave")) },
    )
    .await?;
    let demoted = cordoned.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = writer.stop()?;
    let missing = stage.lost(&replica, &tag, &written.acked)?;
    cordon(stage, &node, false).await?;
    let succeeded = settle(stage, &primary, before).await?;
    Ok(Handover {
        pause: written.longest_pause,
        demoted,
        acked: written.acked.len(),
        lost: missing,
        succeeded,
    })
}

/// Successful hand-overs as the agents count them (only a coordinator counts; the sum survives a
/// change of coordinator).
async fn handovers_ok(stage: &Stage) -> Result<u64> {
    const OK: &str = "valkey_sidecar_coordinator_actions_total{kind=\"Handover\",result=\"ok\"}";
    stage.agents_counter(OK).await
}

/// Waits until the coordinator counts one more successful hand-over than `before` (so the next run
/// does not meet this one's move) and the old primary's pod is Ready again (a synced replica, a
/// candidate for the next hand-over of its shard); whether the count went up.
async fn settle(stage: &Stage, old_primary: &str, before: u64) -> Result<bool> {
    let counted = poll_until(
        "the coordinator counts the hand-over",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async { Ok(handovers_ok(stage).await? > before) },
    )
    .await
    .is_ok();
    stage
        .kubelet
        .wait_ready(&stage.namespace, old_primary, Duration::from_secs(30))
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(counted)
}
