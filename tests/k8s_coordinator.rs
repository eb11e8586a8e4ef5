//! The coordinator end to end: deleting a primary's pod makes the Lease holder hand the primary
//! over (coordinated `CLUSTER FAILOVER`) while the pod's preStop hook waits, with a writer
//! recording every acknowledged write.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use valkey_sidecar_testkit::k8s::valkey::cmd;
use valkey_sidecar_testkit::k8s::writer::{Writer, Written, lost, tag_for};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, poll_until};

const SECOND: Duration = Duration::from_secs(1);

/// A stage whose agents run the coordinator; returns it once some agent holds the Lease.
async fn coordinated_stage(namespace: &str, env: &[(&str, &str)]) -> (Stage, String) {
    let mut o = StageOptions::default();
    o.namespace = namespace.into();
    o.kubelet = o.kubelet.sidecar_bin(env!("CARGO_BIN_EXE_valkey-sidecar"));
    let env = [("SIDECAR_CLUSTER_NAME", "valkey")].iter().chain(env);
    o.template.sidecar_env = env.map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let s = Stage::start(o).await.unwrap();
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    let holder = || async {
        let lease = leases.get_opt("valkey-coordinator").await.ok().flatten();
        lease
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    };
    poll_until(
        "a coordinator holds the lease",
        30 * SECOND,
        Duration::from_millis(100),
        || async { Ok(holder().await.is_some()) },
    )
    .await
    .unwrap();
    let h = holder().await.unwrap();
    (s, h)
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
    let (paddr, raddr) = (s.valkey(&primary).unwrap(), s.valkey(&replica).unwrap());
    let writes = Writer::start(vec![paddr, raddr], tag_for(paddr).unwrap());
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
        poll_until(
            "the deleted pod is gone",
            40 * SECOND,
            Duration::from_millis(20),
            || async { Ok(s.api().get_opt(&primary).await?.is_none()) },
        )
        .await
        .unwrap();
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
    assert_eq!(
        hook.result.as_deref(),
        Ok("HTTP 200"),
        "preStop returned because the hand-over finished, not on timeout"
    );
    report(
        &w,
        lost(s.valkey(&replica).unwrap(), &tag, &w.acked).unwrap(),
    );
    assert_clean_events(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordoning_a_primarys_node_hands_the_primary_over() {
    let (s, holder) = coordinated_stage("coord-cordon", &[]).await;
    // A reference the disruption closure can take along.
    let s = &s;
    let (w, tag, primary, replica, moved) = with_writer(s, 1, |primary| async move {
        let node = s.node_of(&primary).await.unwrap();
        let cordoned = Instant::now();
        s.plane.kubectl(&["cordon", &node]).await.unwrap();
        poll_until(
            "the primary left the cordoned node",
            20 * SECOND,
            Duration::from_millis(10),
            || async { Ok(s.role(&primary).as_deref() == Some("slave")) },
        )
        .await
        .unwrap();
        cordoned.elapsed()
    })
    .await;
    println!("lease holder {holder}; cordon → {primary} demoted after {moved:?}");
    assert_eq!(s.role(&replica).as_deref(), Some("master"));
    report(
        &w,
        lost(s.valkey(&replica).unwrap(), &tag, &w.acked).unwrap(),
    );
    assert_clean_events(s).await;
}

/// How many agents report `valkey_sidecar_coordinator_leader 1`.
async fn leader_count(s: &Stage) -> u64 {
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
async fn wait_leaders(s: &Stage, n: u64, what: &str, timeout: Duration) {
    poll_until(what, timeout, Duration::from_millis(50), || async {
        Ok(leader_count(s).await == n)
    })
    .await
    .unwrap();
}

/// The sum of one drift gauge over all agents (only the leader reports drift).
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
async fn the_holder_stops_acting_when_it_cannot_renew_and_leadership_returns() {
    let lease = [
        ("SIDECAR_LEASE_DURATION", "6s"),
        ("SIDECAR_LEASE_RENEW_DEADLINE", "4s"),
        ("SIDECAR_LEASE_RETRY_PERIOD", "1s"),
    ];
    let (s, _) = coordinated_stage("coord-stepdown", &lease).await;
    // The gauge follows the Lease within a round (250 ms).
    wait_leaders(&s, 1, "exactly one leader", 5 * SECOND).await;
    s.signal_apiserver("STOP").unwrap();
    let frozen = Instant::now();
    // The holder cannot renew: within its renew deadline (4 s) it must stop acting.
    wait_leaders(&s, 0, "the holder steps down", 8 * SECOND).await;
    let stepped_down = frozen.elapsed();
    // Nobody may lead while the Lease cannot be written.
    tokio::time::sleep(3 * SECOND).await;
    assert_eq!(
        leader_count(&s).await,
        0,
        "a leader without a renewable lease"
    );
    s.signal_apiserver("CONT").unwrap();
    let thawed = Instant::now();
    wait_leaders(&s, 1, "leadership returns", 30 * SECOND).await;
    println!(
        "apiserver frozen: holder stepped down after {stepped_down:?} (renew deadline 4 s); a leader again {:?} after the apiserver resumed",
        thawed.elapsed()
    );
    assert!(
        stepped_down <= Duration::from_millis(4_500),
        "stepped down late: {stepped_down:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_fails_back_to_its_preferred_zone_after_the_quiet_period() {
    let failback = [
        ("SIDECAR_FAILBACK", "true"),
        ("SIDECAR_QUIET_PERIOD", "3s"),
        ("SIDECAR_MOVE_COOLDOWN", "1s"),
    ];
    let (s, _) = coordinated_stage("coord-failback", &failback).await;
    // valkey-0-0 (node-index 0) is the intended primary: its zone is the shard's preferred zone.
    let (intended, other) = ("valkey-0-0".to_string(), "valkey-0-1".to_string());
    assert_eq!(s.role(&intended).as_deref(), Some("master"));
    cmd(s.valkey(&other).unwrap(), &["CLUSTER", "FAILOVER"]).unwrap();
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
}
