//! The coordinator end to end on the chart's pods: deleting a primary's pod makes the Lease holder
//! hand the primary over (coordinated `CLUSTER FAILOVER`) while the pod's preStop hook waits, with
//! a writer recording every acknowledged write.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use valkey_sidecar_testkit::faults::{self, Outcome, show};
use valkey_sidecar_testkit::k8s::chart::{label, node_of};
use valkey_sidecar_testkit::k8s::slow_api::ApiDelay;
use valkey_sidecar_testkit::k8s::writer::{Writer, Written, missing};
use valkey_sidecar_testkit::k8s::{
    FakeNodesOptions, ROLE_LABEL, Stage, StageOptions, holder_pod, poll_until,
};

const SECOND: Duration = Duration::from_secs(1);

/// The chart's 3 × 2 cluster with `env` for the agents; returns it once settled and some agent
/// holds the coordinator Lease.
async fn coordinated_stage(namespace: &str, env: &[(&str, &str)]) -> (Stage, String) {
    coordinated(StageOptions::cluster(namespace, 3, 1), env).await
}

/// [`coordinated_stage`] with other chart values.
async fn coordinated(mut o: StageOptions, env: &[(&str, &str)]) -> (Stage, String) {
    for (k, v) in env {
        o = o.env(k, v);
    }
    let s = Stage::start(o).await.unwrap();
    let holder = s.wait_coordinator(30 * SECOND).await.unwrap();
    (s, holder)
}

/// The Lease's holder now.
async fn lease_holder(s: &Stage) -> Option<String> {
    s.coordinator_holder().await.unwrap()
}

/// A writer on shard `shard`, trying all its members.
fn shard_writer(s: &Stage, shard: usize) -> Writer {
    s.shard_writer(shard).unwrap()
}

/// What all writers saw together: acknowledged, lost, the longest pause of any.
#[derive(Default)]
struct Totals {
    acked: usize,
    lost: usize,
    longest_pause: Duration,
}

/// Stops the writers (shard, writer) and checks every acknowledged write against each shard's
/// primary now; the totals are for the fault table.
fn check_writers(s: &Stage, writers: Vec<(usize, Writer)>) -> Totals {
    let mut totals = Totals::default();
    for (shard, w) in writers {
        let tag = w.tag.clone();
        let written = w.stop().unwrap();
        let (primary, _) = s.primary_and_replicas(shard).unwrap();
        print!("shard {shard} (primary {primary}) ");
        let missing = s.lost(&primary, &tag, &written.acked).unwrap();
        report(&written, missing);
        totals.acked += written.acked.len();
        totals.lost += missing;
        totals.longest_pause = totals.longest_pause.max(written.longest_pause);
    }
    totals
}

/// A planned move's row: its writer's count and, as the recovery, its longest write pause (the
/// shard stays up; the pause is how long it was not writable).
fn handover_outcome(scenario: &str, w: &Written, missing: usize, note: String) -> Outcome {
    Outcome::new(module_path!(), scenario)
        .writes(w.acked.len(), missing)
        .recovery(w.longest_pause)
        .note(format!("recovery: the longest write pause; {note}"))
}

/// Every preStop hook ran to HTTP 200: each waited for its hand-over, none timed out.
fn assert_prestops_finished(s: &Stage) {
    let hooks: Vec<_> = s
        .kubelet
        .hook_runs()
        .into_iter()
        .filter(|h| h.hook == "preStop")
        .collect();
    for h in &hooks {
        println!("preStop {}: {:?} after {:?}", h.pod, h.result, h.took);
        assert_eq!(h.result.as_deref(), Ok("HTTP 200"), "{}", h.pod);
        assert!(h.took < 15 * SECOND, "{} waited {:?}", h.pod, h.took);
    }
    assert!(!hooks.is_empty(), "no preStop hook ran");
}

/// `kubectl drain` (the Eviction API, the chart's budgets).
async fn drain(s: &Stage, node: &str) -> Duration {
    let t = Instant::now();
    let out = s
        .plane
        .kubectl(&[
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=90s",
        ])
        .await
        .unwrap();
    println!("{out}");
    t.elapsed()
}

/// Runs a writer against shard `shard` while `disrupt` runs; returns what it saw, its tag, the
/// pods (primary, replica) as they were before, and what `disrupt` measured.
async fn with_writer<F, Fut>(
    s: &Stage,
    shard: usize,
    disrupt: F,
) -> (Written, String, String, String, Duration)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    let (primary, replica) = s.primary_and_replica(shard).unwrap();
    let writes = s.shard_writer(shard).unwrap();
    let tag = writes.tag.clone();
    tokio::time::sleep(SECOND).await;
    let took = disrupt(primary.clone()).await;
    tokio::time::sleep(SECOND).await;
    (writes.stop().unwrap(), tag, primary, replica, took)
}

fn report(w: &Written, missing: usize) {
    println!(
        "writer: {} acknowledged writes, {missing} lost, longest pause {:?}, {} errors while switching",
        w.acked.len(),
        w.longest_pause,
        w.errors
    );
    assert!(w.acked.len() > 100, "the writer made progress");
    assert_eq!(
        missing, 0,
        "acknowledged writes lost in a planned hand-over"
    );
}

async fn assert_clean_events(s: &Stage) {
    let events = s.events().await.unwrap();
    println!("{events}");
    assert!(
        events.contains("HandoverStarted") && events.contains("HandoverSucceeded"),
        "{events}"
    );
    assert!(
        !events.contains("HandoverFailed"),
        "a stale view planned the move again: {events}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_primary_pod_hands_over_first_and_loses_no_write() {
    let (s, holder) = coordinated_stage("coord-delete", &[]).await;
    // A reference the disruption closure can take along.
    let s = &s;
    let (w, tag, primary, replica, gone) = with_writer(s, 0, |primary| async move {
        let deleted = Instant::now();
        s.api().delete(&primary, &Default::default()).await.unwrap();
        s.wait_gone(&primary, 40 * SECOND).await.unwrap();
        deleted.elapsed()
    })
    .await;
    assert_eq!(
        s.role(&replica).as_deref(),
        Some("master"),
        "the replica took over"
    );
    let hook = s
        .kubelet
        .hook_runs()
        .into_iter()
        .find(|h| h.pod == primary && h.hook == "preStop")
        .unwrap();
    println!(
        "lease holder {holder}; {primary} deleted → gone in {gone:?}; its preStop {:?} after {:?}",
        hook.result, hook.took
    );
    let missing = s.lost(&replica, &tag, &w.acked).unwrap();
    faults::record(&handover_outcome(
        "primary pod deleted (cluster hand-over)",
        &w,
        missing,
        format!(
            "pod gone {} after the delete, its preStop returned after {}; writer errors while switching: {}",
            show(gone),
            show(hook.took),
            w.errors
        ),
    ));
    assert_eq!(
        hook.result.as_deref(),
        Ok("HTTP 200"),
        "preStop returned because the hand-over finished, not on timeout"
    );
    report(&w, missing);
    assert_clean_events(s).await;
}

/// Cordons the node of shard 1's primary under a writer and waits (up to `within`) until that
/// primary is a replica; [`with_writer`]'s results.
async fn cordon_under_writer(
    s: &Stage,
    within: Duration,
) -> (Written, String, String, String, Duration) {
    with_writer(s, 1, |primary| async move {
        let node = s.node_of(&primary).await.unwrap();
        let cordoned = Instant::now();
        s.plane.kubectl(&["cordon", &node]).await.unwrap();
        poll_until(
            "the primary left the cordoned node",
            within,
            Duration::from_millis(10),
            || async { Ok(s.role(&primary).as_deref() == Some("slave")) },
        )
        .await
        .unwrap();
        cordoned.elapsed()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordoning_a_primarys_node_hands_the_primary_over() {
    let (s, holder) = coordinated_stage("coord-cordon", &[]).await;
    let s = &s;
    let (w, tag, primary, replica, moved) = cordon_under_writer(s, 20 * SECOND).await;
    println!("lease holder {holder}; cordon → {primary} demoted after {moved:?}");
    let missing = s.lost(&replica, &tag, &w.acked).unwrap();
    faults::record(&handover_outcome(
        "primary's node cordoned (cluster hand-over)",
        &w,
        missing,
        format!(
            "cordon → the old primary demoted {}; writer errors while switching: {}",
            show(moved),
            w.errors
        ),
    ));
    assert_eq!(s.role(&replica).as_deref(), Some("master"));
    report(&w, missing);
    assert_clean_events(s).await;
}

/// How many agents report `valkey_sidecar_coordinator_leader 1`.
async fn coordinator_count(s: &Stage) -> u64 {
    let mut n = 0;
    for p in &s.pods {
        n += s
            .agent_counter(p, "valkey_sidecar_coordinator_leader")
            .await
            .unwrap();
    }
    n
}

/// Waits until exactly `n` agents lead.
async fn wait_coordinators(s: &Stage, n: u64, what: &str, timeout: Duration) {
    poll_until(what, timeout, Duration::from_millis(50), || async {
        Ok(coordinator_count(s).await == n)
    })
    .await
    .unwrap();
}

/// The sum of one drift gauge over all agents (only the coordinator reports drift).
async fn drift_total(s: &Stage) -> u64 {
    let mut n = 0;
    for p in &s.pods {
        n += s
            .agent_counter(
                p,
                "valkey_sidecar_placement_drift{reason=\"FailoverDrift\"}",
            )
            .await
            .unwrap();
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_apiserver_stopped_for_30s_nothing_acts_and_everything_resumes() {
    let env = [
        ("SIDECAR_LEASE_DURATION", "6s"),
        ("SIDECAR_LEASE_RENEW_DEADLINE", "4s"),
        ("SIDECAR_LEASE_RETRY_PERIOD", "1s"),
        ("SIDECAR_FAILBACK", "true"),
        ("SIDECAR_QUIET_PERIOD", "3s"),
        ("SIDECAR_MOVE_COOLDOWN", "1s"),
    ];
    let (s, _) = coordinated_stage("coord-stepdown", &env).await;
    let (intended, other) = ("valkey-0-0", "valkey-0-1");
    // The gauge follows the Lease within a round (250 ms).
    wait_coordinators(&s, 1, "exactly one coordinator", 5 * SECOND).await;
    s.signal_apiserver("STOP").unwrap();
    let frozen = Instant::now();
    // The holder cannot renew: within its renew deadline (4 s) it must stop acting.
    wait_coordinators(&s, 0, "the holder steps down", 8 * SECOND).await;
    let stepped_down = frozen.elapsed();
    // A move becomes due: shard 0's primary leaves its preferred zone. With fail-back on and a
    // 3 s quiet period the coordinator would move it back — but nobody holds a valid lease.
    s.cmd(other, &["CLUSTER", "FAILOVER"]).unwrap();
    poll_until(
        "the failover finished",
        5 * SECOND,
        Duration::from_millis(5),
        || async { Ok(s.role(intended).as_deref() == Some("slave")) },
    )
    .await
    .unwrap();
    while frozen.elapsed() < 30 * SECOND {
        assert_eq!(
            coordinator_count(&s).await,
            0,
            "a coordinator without a renewable lease"
        );
        assert_ne!(
            s.role(intended).as_deref(),
            Some("master"),
            "an action without a valid lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    s.signal_apiserver("CONT").unwrap();
    let thawed = Instant::now();
    wait_coordinators(&s, 1, "a coordinator returns", 30 * SECOND).await;
    let leading = thawed.elapsed();
    poll_until(
        "the fail-back that was due happens",
        20 * SECOND,
        Duration::from_millis(20),
        || async { Ok(s.role(intended).as_deref() == Some("master")) },
    )
    .await
    .unwrap();
    let failed_back = thawed.elapsed();
    poll_until(
        "labels match Valkey again",
        20 * SECOND,
        Duration::from_millis(50),
        || async {
            let a = s.labels(intended).await?.get(ROLE_LABEL).cloned();
            let b = s.labels(other).await?.get(ROLE_LABEL).cloned();
            Ok(a.as_deref() == Some("primary") && b.as_deref() == Some("replica"))
        },
    )
    .await
    .unwrap();
    let labels_true = thawed.elapsed();
    println!(
        "apiserver stopped 30 s: holder stepped down after {stepped_down:?} (renew deadline 4 s); after it resumed: a coordinator again in {leading:?}, the due fail-back done in {failed_back:?}, labels true in {labels_true:?}"
    );
    faults::record(
        &Outcome::new(module_path!(), "apiserver stopped for 30 s (cluster coordinator)")
            .recovery(labels_true)
            .note(format!(
                "recovery: apiserver resumed → a coordinator again {}, the fail-back that fell due meanwhile done {}, labels true again; the holder stepped down {} after the stop (renew deadline 4 s), nothing acted while it was down",
                show(leading),
                show(failed_back),
                show(stepped_down)
            )),
    );
    assert!(
        stepped_down <= Duration::from_millis(4_500),
        "stepped down late: {stepped_down:?}"
    );
}

/// A loaded apiserver answers slowly, not never. With every request the agents send held 3 s
/// (`testkit::k8s::slow_api`, a relay in front of the apiserver) — longer than the 2 s retry
/// period that used to bound each call — the holder keeps the Lease past its renew deadline (a
/// renewal may take a renew deadline), and still hands a primary over on cordon without losing
/// a write. Seen in the 50-shard scale bench: at a load average of 134 the holder lost the Lease
/// with 7 hand-overs under way.
///
/// Then every request is held 7 s, longer than what is left of a term when its next renewal goes
/// out: the renewal is answered after the old term ended and starts a term of its own (counted
/// from its send), so the holder keeps the Lease and coordinates again between answers. An agent
/// that cut each renewal at its old term's end (as before 2026-12-07) cuts every renewal after
/// the first at 2–3 s here, so it cannot start a term again; its renewals, applied after it
/// stopped waiting, make the next ones 409 (the 50-shard drains: the Lease changed hands every
/// 30–90 s). Without keeping its watches while the Lease names it, the holder failed this too:
/// each new 3 s term went to listing pods and Nodes again through the slow relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_api_request_taking_3s_the_holder_keeps_the_lease_and_hands_over() {
    let delay = ApiDelay::default();
    let mut o = StageOptions::cluster("coord-slow-api", 3, 1);
    o.kubelet = o.kubelet.api_delay(delay.clone());
    let (s, holder) = coordinated(o, &[]).await;
    wait_coordinators(&s, 1, "exactly one coordinator", 5 * SECOND).await;
    delay.set(3 * SECOND);
    let slowed = Instant::now();
    // Longer than the renew deadline (10 s) with every renewal taking 3 s.
    while slowed.elapsed() < 15 * SECOND {
        let n = coordinator_count(&s).await;
        assert_eq!(
            n,
            1,
            "coordinators {:?} after the slowdown",
            slowed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let s = &s;
    let (w, tag, primary, replica, moved) = cordon_under_writer(s, 30 * SECOND).await;
    println!(
        "every agent request held 3 s: {holder} kept the Lease for {:?}; cordon → {primary} demoted after {moved:?}",
        slowed.elapsed()
    );
    assert_eq!(lease_holder(s).await.as_deref(), Some(holder.as_str()));
    assert_eq!(coordinator_count(s).await, 1);
    assert_eq!(s.role(&replica).as_deref(), Some("master"));
    let missing = s.lost(&replica, &tag, &w.acked).unwrap();
    report(&w, missing);
    delay.set(7 * SECOND);
    let slower = Instant::now();
    // The first renewal held 7 s goes out within a retry period; its term ends 10 s after that:
    // from 13 s on, only a renewal answered after its old term ended can make a coordinator.
    let mut again = None;
    while slower.elapsed() < 26 * SECOND {
        assert_eq!(lease_holder(s).await.as_deref(), Some(holder.as_str()));
        if slower.elapsed() > 13 * SECOND && coordinator_count(s).await == 1 {
            again.get_or_insert(slower.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "every agent request held 7 s: {holder} kept the Lease and coordinated again at {again:?}"
    );
    assert!(again.is_some(), "{holder} never coordinated again");
    delay.set(Duration::ZERO);
    wait_coordinators(s, 1, "one coordinator once requests are quick", 20 * SECOND).await;
    assert_eq!(lease_holder(s).await.as_deref(), Some(holder.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_fails_back_to_its_preferred_zone_after_the_quiet_period() {
    let failback = [
        ("SIDECAR_FAILBACK", "true"),
        ("SIDECAR_QUIET_PERIOD", "3s"),
        ("SIDECAR_MOVE_COOLDOWN", "1s"),
    ];
    let (s, holder) = coordinated_stage("coord-failback", &failback).await;
    // The status as a user reads it with kubectl: the holder and the placement condition, which
    // the holder writes as annotations in its renewals (every 2 s).
    let lease = |path: &'static str| {
        let s = &s;
        async move {
            let args = [
                "get",
                "lease",
                "valkey-coordinator",
                "-n",
                &s.namespace,
                "-o",
                path,
            ];
            s.plane.kubectl(&args).await.unwrap()
        }
    };
    let placement = "jsonpath={.spec.holderIdentity} {.metadata.annotations.status\\.valkey\\.io/PrimaryPlacementAligned}";
    let shows = |want: &'static str| {
        let lease = &lease;
        let holder = &holder;
        async move {
            let out = lease(placement).await;
            let (who, status) = out.split_once(' ').unwrap_or_default();
            Ok(holder_pod(who) == holder.as_str() && status.starts_with(want))
        }
    };
    let every = Duration::from_millis(100);
    poll_until("the lease shows aligned", 10 * SECOND, every, || {
        shows("True Aligned")
    })
    .await
    .unwrap();
    // valkey-0-0 (node-index 0) is the intended primary: its zone is the shard's preferred zone.
    let (intended, other) = ("valkey-0-0".to_string(), "valkey-0-1".to_string());
    assert_eq!(s.role(&intended).as_deref(), Some("master"));
    s.cmd(&other, &["CLUSTER", "FAILOVER"]).unwrap();
    let drifted = Instant::now();
    poll_until(
        "the failover happened",
        5 * SECOND,
        Duration::from_millis(5),
        || async { Ok(s.role(&other).as_deref() == Some("master")) },
    )
    .await
    .unwrap();
    // The drift is visible while it lasts…
    poll_until(
        "drift reported",
        5 * SECOND,
        Duration::from_millis(50),
        || async { Ok(drift_total(&s).await >= 1) },
    )
    .await
    .unwrap();
    // …on the Lease too, within a renewal (the fail-back waits the 3 s quiet period)…
    poll_until("the lease shows the drift", 3 * SECOND, every, || {
        shows("False FailoverDrift: shard ")
    })
    .await
    .unwrap();
    println!("while drifted, kubectl shows: {}", lease(placement).await);
    println!(
        "annotations: {}",
        lease("jsonpath={.metadata.annotations}").await
    );
    // …and after the quiet period the coordinator moves the primary back.
    poll_until(
        "failed back",
        20 * SECOND,
        Duration::from_millis(20),
        || async { Ok(s.role(&intended).as_deref() == Some("master")) },
    )
    .await
    .unwrap();
    let back = drifted.elapsed();
    println!("fail-back {back:?} after the drift (quiet period 3 s)");
    assert!(
        back >= 3 * SECOND,
        "fail-back inside the quiet period: {back:?}"
    );
    let events = s.events().await.unwrap();
    assert!(
        events.contains("FailBackStarted") && events.contains("FailBackSucceeded"),
        "{events}"
    );
    poll_until(
        "drift cleared",
        5 * SECOND,
        Duration::from_millis(50),
        || async { Ok(drift_total(&s).await == 0) },
    )
    .await
    .unwrap();
    poll_until("the lease shows aligned again", 5 * SECOND, every, || {
        shows("True Aligned")
    })
    .await
    .unwrap();
    let decision = "jsonpath={.metadata.annotations.status\\.valkey\\.io/last-decision}";
    poll_until(
        "the lease shows the fail-back",
        5 * SECOND,
        every,
        || async { Ok(lease(decision).await.starts_with("FailBack of shard ")) },
    )
    .await
    .unwrap();
    println!("after fail-back, kubectl shows: {}", lease(placement).await);
    println!(
        "annotations: {}",
        lease("jsonpath={.metadata.annotations}").await
    );
    let described = lease("yaml").await;
    println!("kubectl get lease -o yaml:\n{described}");
}

/// A node the scheduler gave two pods of different shards, and those pods: with
/// `CLUSTER FAILOVER` where needed it carries two primaries, as after an unlucky recovery.
async fn shared_node(s: &Stage) -> (String, Vec<String>) {
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in s.pod_objects().await.unwrap() {
        let node = node_of(&p).unwrap().to_owned();
        by_node
            .entry(node)
            .or_default()
            .push(p.metadata.name.clone().unwrap());
    }
    let (node, pods) = by_node
        .into_iter()
        .find(|(_, pods)| pods.len() >= 2)
        .expect("more pods than nodes: some node has two");
    (node, pods.into_iter().take(2).collect())
}

/// Makes `pod` its shard's primary (coordinated `CLUSTER FAILOVER` from its replica seat).
async fn promote(s: &Stage, pod: &str) {
    if s.role(pod).as_deref() == Some("master") {
        return;
    }
    s.cmd(pod, &["CLUSTER", "FAILOVER"]).unwrap();
    poll_until(
        &format!("{pod} primary"),
        10 * SECOND,
        Duration::from_millis(10),
        || async { Ok(s.role(pod).as_deref() == Some("master")) },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_a_node_with_two_primaries_then_another_node_loses_no_write() {
    // 3 shards × 3 pods on 6 nodes: some node carries two pods of different shards; both are
    // made primaries. Balance would move one of them away before the drain.
    let o = StageOptions::cluster("coord-drain", 3, 2);
    let (s, holder) = coordinated(o, &[("SIDECAR_BALANCE", "false")]).await;
    let (crowded, pair) = shared_node(&s).await;
    for p in &pair {
        promote(&s, p).await;
    }
    println!("{crowded} carries the primaries {pair:?}");
    let writers: Vec<_> = (0..3).map(|k| (k, shard_writer(&s, k))).collect();
    tokio::time::sleep(SECOND).await;
    s.plane.kubectl(&["cordon", &crowded]).await.unwrap();
    let first = drain(&s, &crowded).await;
    let (p0, _) = s.primary_and_replicas(0).unwrap();
    let second_node = s.node_of(&p0).await.unwrap();
    let second = drain(&s, &second_node).await;
    tokio::time::sleep(SECOND).await;
    println!(
        "lease holder {holder}; drained {crowded} (2 primaries) in {first:?}, then {second_node} (primary {p0}) in {second:?}"
    );
    for k in 0..3 {
        let (p, _) = s.primary_and_replicas(k).unwrap();
        let node = s.node_of(&p).await.unwrap();
        assert!(
            node != crowded && node != second_node,
            "shard {k}: {p} on {node}"
        );
    }
    let totals = check_writers(&s, writers);
    faults::record(
        &Outcome::new(
            module_path!(),
            "node with two primaries drained, then the node of another",
        )
        .writes(totals.acked, totals.lost)
        .recovery(totals.longest_pause)
        .note(format!(
            "recovery: the longest write pause of 3 shards' writers; drains took {} and {}",
            show(first),
            show(second)
        )),
    );
    assert_prestops_finished(&s);
    assert_clean_events(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_coordinator_dies_a_successor_does_the_hand_over() {
    let lease = [
        ("SIDECAR_LEASE_DURATION", "4s"),
        ("SIDECAR_LEASE_RENEW_DEADLINE", "3s"),
        ("SIDECAR_LEASE_RETRY_PERIOD", "1s"),
    ];
    let (s, holder) = coordinated_stage("coord-successor", &lease).await;
    let holder_node = s.node_of(&holder).await.unwrap();
    // A shard with no pod on the coordinator's node: its replica must live to take over (CI once
    // picked a shard whose replica shared that node, and read nothing back from it).
    let mut shard = None;
    for k in 0..3 {
        let mut nodes = Vec::new();
        for p in s.shard_pods(k) {
            nodes.push(s.node_of(p).await.unwrap());
        }
        if shard.is_none() && !nodes.contains(&holder_node) {
            shard = Some(k);
        }
    }
    let shard = shard.expect("a shard off the coordinator's node");
    // The holder names who takes over first: pods on nodes of their own, none on its node.
    let named = s.coordinator_successors().await.unwrap();
    let mut named_nodes = Vec::new();
    for p in &named {
        named_nodes.push(s.node_of(p).await.unwrap());
    }
    println!("successors named {named:?} on {named_nodes:?}; the holder is on {holder_node}");
    assert!(!named.is_empty(), "the Lease names successors");
    assert!(!named_nodes.contains(&holder_node), "{named_nodes:?}");
    // Every version of the Lease in turn, from a watch (polling once missed a successor that held
    // it for a moment). The list the dead holder wrote last is the one that counts: it may change
    // after the one read above (a named pod briefly not Ready is replaced by the next).
    let (watch, watching) = s.watch_coordinator_holders();
    let s = &s;
    let (w, tag, primary, replica, gone) = with_writer(s, shard, |primary| async move {
        // The coordinator's node loses power (its pods silent, no restart), and at once a primary
        // elsewhere must be handed over: only a successor can do it.
        s.kubelet.power_off(&holder_node).unwrap();
        let t = Instant::now();
        s.api().delete(&primary, &Default::default()).await.unwrap();
        s.wait_gone(&primary, 40 * SECOND).await.unwrap();
        t.elapsed()
    })
    .await;
    watching.abort();
    let holders = watch.holders();
    let (first, named) = watch
        .successor_of(&holder)
        .map_or((None, named), |(first, named)| (Some(first), named));
    let successor = lease_holder(s).await;
    println!(
        "coordinator {holder} died with its node; {primary} deleted → gone after {gone:?}; holders in turn {holders:?}; lease now held by {successor:?}"
    );
    let missing = s.lost(&replica, &tag, &w.acked).unwrap();
    faults::record(&handover_outcome(
        "coordinator's node cut, at once a primary pod deleted elsewhere",
        &w,
        missing,
        format!(
            "a successor coordinator handed the primary over; pod gone {} after the delete",
            show(gone)
        ),
    ));
    assert!(successor.is_some() && successor.as_deref() != Some(holder.as_str()));
    // Only the named successors contended at once: the first to take over is one of those the
    // dead holder named last (the pod deleted may be one: it may take over, hand its own primary
    // over and release on its way out). A list it emptied (no pod usable) lets everyone contend.
    let among = first
        .as_ref()
        .is_some_and(|p| named.is_empty() || named.contains(p));
    assert!(
        among,
        "{first:?} (of {holders:?}) not among {named:?}, the successors the dead holder named last; \
         the agents' Lease lines (more with RUST_LOG=info,valkey_sidecar::k8s::lease=trace):\n{}",
        s.agent_lines(&["lease", "coordinat"])
    );
    assert_eq!(s.role(&replica).as_deref(), Some("master"));
    assert_prestops_finished(s);
    report(&w, missing);
    assert_clean_events(s).await;
}

/// How many primaries (by Valkey's word) each node carries.
async fn primaries_per_node(s: &Stage) -> BTreeMap<String, usize> {
    let mut count = BTreeMap::new();
    for p in s.pod_objects().await.unwrap() {
        let name = p.metadata.name.clone().unwrap();
        if s.role(&name).as_deref() == Some("master") {
            *count.entry(node_of(&p).unwrap().to_owned()).or_default() += 1;
        }
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_two_primaries_is_rebalanced() {
    // 6 pods on 4 nodes: two nodes carry two pods each (of different shards).
    let nodes = FakeNodesOptions {
        count: 4,
        ..FakeNodesOptions::default()
    };
    let o = StageOptions::cluster("coord-balance", 3, 1).nodes(nodes);
    let quiet = [
        ("SIDECAR_QUIET_PERIOD", "3s"),
        ("SIDECAR_MOVE_COOLDOWN", "1s"),
    ];
    let (s, _) = coordinated(o, &quiet).await;
    let (crowded, pair) = shared_node(&s).await;
    let moved = pair
        .iter()
        .find(|p| s.role(p).as_deref() != Some("master"))
        .unwrap_or(&pair[1]);
    // Pods are named <cluster>-<shard>-<index>.
    let shard: usize = moved.split('-').nth(1).unwrap().parse().unwrap();
    let writer = shard_writer(&s, shard);
    // Valkey fails the shard over to the pod beside another primary (a recovery, say): the node
    // now carries two primaries, over the cap of ⌈3 / 4⌉ = 1.
    // Each shard's quiet period starts at its own promotion: when each began is kept.
    let mut promoted_at = Vec::new();
    for p in &pair {
        promoted_at.push((p.clone(), Instant::now()));
        promote(&s, p).await;
    }
    let crowded_at = Instant::now();
    println!("{crowded} carries the primaries {pair:?}");
    poll_until(
        "rebalanced",
        30 * SECOND,
        Duration::from_millis(20),
        || async { Ok(primaries_per_node(&s).await.values().all(|n| *n <= 1)) },
    )
    .await
    .unwrap();
    let took = crowded_at.elapsed();
    println!("rebalanced {took:?} after {crowded} got its second primary (quiet period 3 s)");
    // The pod of the pair that is no longer primary is the shard that moved.
    let (moved_pod, its_promotion) = promoted_at
        .iter()
        .find(|(p, _)| s.role(p).as_deref() != Some("master"))
        .expect("one of the pair was moved away");
    let since = its_promotion.elapsed();
    assert!(
        since >= 3 * SECOND,
        "{moved_pod}'s shard moved inside its quiet period: {since:?} after its promotion began"
    );
    check_writers(&s, vec![(shard, writer)]);
    let events = s.events().await.unwrap();
    assert!(
        events.contains("RebalanceStarted") && events.contains("RebalanceSucceeded"),
        "{events}"
    );
    assert!(!events.contains("RebalanceFailed"), "{events}");
    // Labels follow: one pod per shard labelled primary.
    poll_until(
        "one primary label per shard",
        5 * SECOND,
        Duration::from_millis(50),
        || async {
            let pods = s.pod_objects().await?;
            let labelled = pods
                .iter()
                .filter(|p| label(p, ROLE_LABEL) == Some("primary"));
            Ok(labelled.count() == 3)
        },
    )
    .await
    .unwrap();
}

/// Issue 17, items 1 and 2: a primary's Valkey killed while its agent lives; the kubelet restarts
/// the container at once, empty (no persistence). The coordinator sees the socket close and refuse,
/// fails the shard over to its replica with `CLUSTER FAILOVER FORCE` (no waiting out
/// `cluster-node-timeout`), and the restart is held (`valkey-sidecar await`) until then, so the
/// empty node comes back as the new primary's replica instead of wiping it. Lost: at most the
/// writes acknowledged in the last moments before the kill, which the replica had not received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_primary_is_failed_over_at_once_and_its_empty_restart_rejoins_as_a_replica() {
    let o = StageOptions::cluster("coord-crash", 3, 1);
    crashed_primary(
        o,
        "cluster: primary's Valkey killed, restarted at once (no persistence)",
    )
    .await;
}

/// The same with persistence: the restarted node loads its append-only file, which lacks the last
/// writes its replica has; held until the failover, it too rejoins as a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_persistence_a_crashed_primary_is_failed_over_and_its_restart_rejoins_as_a_replica() {
    let o = StageOptions::cluster("coord-crash-pv", 3, 1).persistent();
    crashed_primary(
        o,
        "cluster: primary's Valkey killed, restarted at once (persistence)",
    )
    .await;
}

/// The crash while the replica is frozen (SIGSTOP of its Valkey) for 3 s, as on an overloaded
/// node: the restart guard's questions time out (300 ms each). A timeout is not a dead replica:
/// the empty restart is held until the thawed replica takes over, where one unanswered question
/// once let it start and become the sync source of its replica, wiping the shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_primary_whose_replica_is_frozen_is_held_until_the_replica_takes_over() {
    let o = StageOptions::cluster("coord-crash-slow", 3, 1);
    let scenario = "cluster: primary's Valkey killed, restarted at once, its replica frozen 3 s";
    crashed_primary_frozen(o, scenario, Some(3 * SECOND)).await;
}

async fn crashed_primary(o: StageOptions, scenario: &str) {
    crashed_primary_frozen(o, scenario, None).await;
}

async fn crashed_primary_frozen(o: StageOptions, scenario: &str, freeze: Option<Duration>) {
    const TAIL: Duration = Duration::from_millis(500);
    let (s, holder) = coordinated(o, &[("SIDECAR_BALANCE", "false")]).await;
    // With the replica frozen longer than `SIDECAR_STALE_AFTER` (2 s), a coordinator on the
    // crashed pod has no fresh view of the cluster by the time the replica can answer (its own
    // Valkey is down) and the shard falls back to Valkey's own election (docs/operations.md,
    // "Crashes"): the frozen run crashes a shard the coordinator is not part of. Otherwise shard
    // 0, wherever the coordinator is (on the crashed pod, its view is still fresh).
    let off_coordinator = (0..3).find(|k| !s.shard_pods(*k).contains(&holder));
    let shard = match freeze {
        Some(_) => off_coordinator.expect("a shard without the coordinator"),
        None => 0,
    };
    let (old, replica) = s.primary_and_replica(shard).unwrap();
    let writer = s.shard_writer(shard).unwrap();
    let tag = writer.tag.clone();
    tokio::time::sleep(SECOND).await;
    if freeze.is_some() {
        s.signal_container(&replica, "valkey", "STOP").unwrap();
    }
    let killed = Instant::now();
    s.kubelet
        .crash_container(&s.namespace, &old, "valkey")
        .unwrap();
    if let Some(d) = freeze {
        tokio::time::sleep(d).await;
        s.signal_container(&replica, "valkey", "CONT").unwrap();
    }
    let promoted = poll_until(
        "another member primary",
        20 * SECOND,
        Duration::from_millis(5),
        || async { Ok(s.primary_and_replica(shard).is_ok_and(|(p, _)| p != old)) },
    )
    .await;
    let writable = killed.elapsed();
    assert!(promoted.is_ok(), "{promoted:?}\n{}", s.describe().await);
    let (new, _) = s.primary_and_replica(shard).unwrap();
    poll_until(
        "labelled: the new primary, the old one a replica",
        60 * SECOND,
        Duration::from_millis(20),
        || async {
            let new_label = s.labels(&new).await?.get(ROLE_LABEL).cloned();
            let old_label = s.labels(&old).await?.get(ROLE_LABEL).cloned();
            Ok(new_label.as_deref() == Some("primary") && old_label.as_deref() == Some("replica"))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        s.role(&old).as_deref(),
        Some("slave"),
        "the restarted node follows"
    );
    tokio::time::sleep(SECOND).await;
    let w = writer.stop().unwrap();
    let lost = missing(s.valkey(&new).unwrap(), &s.client(), &tag, &w.acked).unwrap();
    w.only_tail_lost(&lost, killed, TAIL).unwrap();
    let events = s.events().await.unwrap();
    assert!(
        events.contains("CrashFailoverStarted") && events.contains("CrashFailoverSucceeded"),
        "the coordinator did not fail the shard over itself:\n{events}"
    );
    println!(
        "crash of {old}: {new} writable after {writable:?}; {} acknowledged, {} lost (all within {TAIL:?} before the kill)",
        w.acked.len(),
        lost.len()
    );
    faults::record(
        &Outcome::new(module_path!(), scenario)
            .writes(w.acked.len(), lost.len())
            .recovery(writable)
            .note(format!(
                "recovery: kill → a replica primary (CLUSTER FAILOVER FORCE by the coordinator); the restart held until then, back as a replica; loss allowed only within {} before the kill",
                show(TAIL)
            )),
    );
}
