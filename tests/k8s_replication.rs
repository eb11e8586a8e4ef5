//! Replication mode end to end on the chart's pods (Valkey without Cluster): the agents bootstrap a
//! shard's primary record, point the replicas at the recorded primary, and a primary whose agent
//! cannot renew the record fences its own Valkey before anyone could take over. Node faults
//! (power-off, partition, freeze) are in `k8s_node_faults.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use valkey_sidecar_testkit::faults::{self, Outcome, show};
use valkey_sidecar_testkit::k8s::shard::{
    Record, follows, new_primary, record, role_label, writable, write_acked,
};
use valkey_sidecar_testkit::k8s::writer::missing;
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, http_get, poll_until};

const SECOND: Duration = Duration::from_secs(1);
/// The writes a replica may not have received when its primary died: asynchronous replication on
/// loopback trails by milliseconds; the bound leaves room for a loaded 2-core machine.
const TAIL: Duration = Duration::from_millis(500);

/// The record of shard 0 held by `holder` at `epoch`.
fn held(holder: &str, epoch: u64) -> Option<Record> {
    Some(Record {
        holder: Some(holder.into()),
        epoch,
    })
}

/// The chart's replication mode, one shard of three pods, `env` for the agents.
async fn replication_stage(namespace: &str, env: &[(&str, &str)]) -> Stage {
    let mut o = StageOptions::replication(namespace, 2);
    for (k, v) in env {
        o = o.env(k, v);
    }
    Stage::start(o).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_intended_primary_bootstraps_the_record_and_the_others_follow_it() {
    let s = replication_stage("repl-bootstrap", &[]).await;
    poll_until(
        "valkey-0-0 holds the record at epoch 1",
        20 * SECOND,
        Duration::from_millis(50),
        || async { Ok(record(&s, "0").await == held("valkey-0-0", 1)) },
    )
    .await
    .unwrap();
    poll_until(
        "the others replicate from valkey-0-0",
        30 * SECOND,
        Duration::from_millis(50),
        || async {
            Ok(follows(&s, "valkey-0-1", "valkey-0-0") && follows(&s, "valkey-0-2", "valkey-0-0"))
        },
    )
    .await
    .unwrap();
    poll_until(
        "labels say so",
        10 * SECOND,
        Duration::from_millis(50),
        || async {
            Ok(
                role_label(&s, "valkey-0-0").await.as_deref() == Some("primary")
                    && role_label(&s, "valkey-0-1").await.as_deref() == Some("replica")
                    && role_label(&s, "valkey-0-2").await.as_deref() == Some("replica"),
            )
        },
    )
    .await
    .unwrap();
    // What each keeper did is counted.
    let bootstrap = "valkey_sidecar_keeper_actions_total{kind=\"bootstrap\"}";
    assert_eq!(s.agent_counter("valkey-0-0", bootstrap).await.unwrap(), 1);
    let rejoin = "valkey_sidecar_keeper_actions_total{kind=\"rejoin\"}";
    assert!(s.agent_counter("valkey-0-1", rejoin).await.unwrap() >= 1);
    // The primary takes writes; nobody else is a writable master.
    s.cmd("valkey-0-0", &["SET", "k", "v"]).unwrap();
    assert!(s.cmd("valkey-0-1", &["SET", "k", "v"]).is_err());
}

/// With heartbeats off there is no failsafe (`tests/k8s_split_brain.rs` has the outage with it):
/// the renew deadline is the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_heartbeats_a_primary_that_cannot_renew_fences_itself_before_the_record_expires() {
    let o = StageOptions::replication("repl-fence", 2)
        .env("SIDECAR_LEASE_DURATION", "6s")
        .env("SIDECAR_LEASE_RENEW_DEADLINE", "4s")
        .env("SIDECAR_LEASE_RETRY_PERIOD", "1s")
        .set("sidecar.heartbeat.fenceAfter=off");
    let s = Stage::start(o).await.unwrap();
    poll_until(
        "bootstrapped and writable",
        30 * SECOND,
        Duration::from_millis(100),
        || async { Ok(write_acked(&s, "valkey-0-0", SECOND)) },
    )
    .await
    .unwrap();
    s.signal_apiserver("STOP").unwrap();
    let frozen = Instant::now();
    // Writes go on until the renew deadline (≤ 4 s after the last renewal), then stop.
    let mut last_ack = frozen;
    while frozen.elapsed() < 7 * SECOND {
        if write_acked(&s, "valkey-0-0", Duration::from_millis(200)) {
            last_ack = Instant::now();
        }
    }
    let fenced_after = last_ack - frozen;
    // Fenced, the agent no longer vouches for its primary: load balancers drop it too.
    let (code, body) = http_get(s.agent("valkey-0-0").unwrap(), "/primary", SECOND)
        .await
        .unwrap();
    assert_eq!(code, 503, "{body}");
    s.signal_apiserver("CONT").unwrap();
    let thawed = Instant::now();
    poll_until(
        "writes resume after a late renewal",
        20 * SECOND,
        Duration::from_millis(100),
        || async { Ok(write_acked(&s, "valkey-0-0", SECOND)) },
    )
    .await
    .unwrap();
    let writable_again = thawed.elapsed();
    println!(
        "apiserver frozen: last acknowledged write {fenced_after:?} after the freeze (renew deadline 4 s, lease 6 s); writable again {writable_again:?} after it resumed"
    );
    faults::record(
        &Outcome::new(
            module_path!(),
            "apiserver frozen for 7 s, heartbeats off: the primary fences itself",
        )
            .recovery(writable_again)
            .note(format!(
                "recovery: apiserver resumed → the primary acknowledges writes again; its last write before fencing was acknowledged {} after the freeze (renew deadline 4 s, lease 6 s)",
                show(fenced_after)
            )),
    );
    assert!(
        fenced_after < 4 * SECOND + Duration::from_millis(300),
        "the primary took writes past its renew deadline: {fenced_after:?}"
    );
}

/// When the record was released and when it named a new holder, after `since` (polled).
async fn record_phases(leases: Api<Lease>, since: Instant) -> String {
    let (mut released, mut moved) = (None, None);
    while since.elapsed() < 20 * SECOND && moved.is_none() {
        let lease = leases.get_opt("valkey-0-primary").await.ok().flatten();
        let holder = lease
            .and_then(|l| l.spec?.holder_identity)
            .unwrap_or_default();
        if holder.is_empty() && released.is_none() {
            released = Some(since.elapsed());
        }
        if !holder.is_empty() && holder != "valkey-0-0" {
            moved = Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    format!("released after {released:?}, new holder after {moved:?}")
}

/// Waits until the shard is bootstrapped: valkey-0-0 primary on record, the others following it.
async fn bootstrapped(s: &Stage) {
    poll_until(
        "bootstrapped: the others follow valkey-0-0",
        30 * SECOND,
        Duration::from_millis(50),
        || async {
            Ok(record(s, "0").await == held("valkey-0-0", 1)
                && follows(s, "valkey-0-1", "valkey-0-0")
                && follows(s, "valkey-0-2", "valkey-0-0"))
        },
    )
    .await
    .unwrap();
}

fn addrs(s: &Stage) -> Vec<std::net::SocketAddr> {
    s.pods.iter().map(|p| s.valkey(p).unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_and_rejoins_as_a_replica() {
    let s = replication_stage("repl-kill", &[]).await;
    killed_primary(s, "primary's Valkey killed (agent alive)").await;
}

/// The same with persistence: the restarted run loads its append-only file, which lacks the last
/// writes its replicas have; it must not serve as the primary either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_persistence_a_killed_primary_is_replaced_and_rejoins_as_a_replica() {
    let o = StageOptions::replication("repl-kill-pv", 2).persistent();
    let s = Stage::start(o).await.unwrap();
    killed_primary(
        s,
        "primary's Valkey killed (agent alive), restarted at once with persistence",
    )
    .await;
}

/// The primary's Valkey killed; the kubelet restarts the container at once.
async fn killed_primary(s: Stage, scenario: &str) {
    bootstrapped(&s).await;
    let writer = s.writer(addrs(&s), "w");
    tokio::time::sleep(SECOND).await;
    let killed = Instant::now();
    // The kubelet restarts the container at once, empty (no persistence): the keeper must not
    // let that run renew, the coordinator promotes a replica, the empty run rejoins it.
    s.kubelet
        .crash_container(&s.namespace, "valkey-0-0", "valkey")
        .unwrap();
    let phases = tokio::spawn(record_phases(
        Api::namespaced(s.plane.client(), &s.namespace),
        killed,
    ));
    let promoted = new_primary(&s, "valkey-0-0", 20 * SECOND).await.unwrap();
    let took = killed.elapsed();
    println!("record: {}", phases.await.unwrap());
    poll_until(
        "the old primary rejoins as a replica of the new one",
        30 * SECOND,
        Duration::from_millis(50),
        || async {
            Ok(follows(&s, "valkey-0-0", &promoted)
                && role_label(&s, "valkey-0-0").await.as_deref() == Some("replica"))
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(SECOND).await;
    let w = writer.stop().unwrap();
    let lost = missing(s.valkey(&promoted).unwrap(), &s.client(), "w", &w.acked).unwrap();
    let missing = lost.len();
    // Issue 17, item 5: the empty run never became the source anyone resynced from. What is lost
    // is only the tail the replicas had not received when the primary died — acknowledged in the
    // last moments before the kill, none after it (the empty run refused writes: no replica) and
    // none earlier (a resync from the empty run would have wiped them all).
    w.only_tail_lost(&lost, killed, TAIL).unwrap();
    faults::record(
        &Outcome::new(module_path!(), scenario)
            .writes(w.acked.len(), missing)
            .recovery(took)
            .note(format!(
                "recovery: kill → a replica writable and labelled primary; loss allowed (asynchronous replication); longest write pause {}",
                show(w.longest_pause)
            )),
    );
    println!(
        "{scenario}: {promoted} writable and labelled primary after {took:?}; writer: {} acknowledged, {missing} lost (async replication), longest pause {:?}; record {:?}",
        w.acked.len(),
        w.longest_pause,
        record(&s, "0").await
    );
    assert_eq!(
        writable(&s),
        vec![promoted.clone()],
        "exactly one writable primary"
    );
    assert_eq!(record(&s, "0").await, held(&promoted, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_primary_pod_switches_over_without_losing_a_write() {
    let s = replication_stage("repl-switch", &[]).await;
    bootstrapped(&s).await;
    let writer = s.writer(addrs(&s), "w");
    tokio::time::sleep(SECOND).await;
    // Taken before the deletion: by the time the new primary is seen, the StatefulSet may have
    // created the next valkey-0-0 already.
    let uid = s.pod_uid("valkey-0-0").await.unwrap().unwrap();
    let deleted = Instant::now();
    s.api()
        .delete("valkey-0-0", &Default::default())
        .await
        .unwrap();
    let promoted = new_primary(&s, "valkey-0-0", 20 * SECOND).await.unwrap();
    let took = deleted.elapsed();
    s.wait_uid_gone("valkey-0-0", &uid, 40 * SECOND)
        .await
        .unwrap();
    tokio::time::sleep(SECOND).await;
    let w = writer.stop().unwrap();
    let missing = s.lost(&promoted, "w", &w.acked).unwrap();
    let hooks: Vec<_> = s
        .kubelet
        .hook_runs()
        .into_iter()
        .filter(|h| h.pod == "valkey-0-0")
        .map(|h| (h.container, h.result, h.took))
        .collect();
    println!(
        "primary pod deleted: {promoted} writable and labelled after {took:?}; preStop {hooks:?}; writer: {} acknowledged, {missing} lost, longest pause {:?}",
        w.acked.len(),
        w.longest_pause
    );
    faults::record(
        &Outcome::new(module_path!(), "primary pod deleted (replication switchover)")
            .writes(w.acked.len(), missing)
            .recovery(w.longest_pause)
            .note(format!(
                "recovery: the longest write pause (a planned move: the shard stays up); delete → a replica writable and labelled primary {}",
                show(took)
            )),
    );
    assert_eq!(missing, 0, "a planned switchover lost acknowledged writes");
    assert!(w.acked.len() > 100);
    assert!(hooks.iter().all(|(_, r, _)| r.as_deref() == Ok("HTTP 200")));
    // One move: the old primary's agent, stopping after the switchover, leaves the new holder's
    // record alone (it once released it, which started a needless failover).
    tokio::time::sleep(2 * SECOND).await;
    assert_eq!(record(&s, "0").await, held(&promoted, 2));
}

/// A shard record deleted (by hand, or by the garbage collector) while a pod other than pod 0 is
/// primary: its holder re-creates it one epoch up, and nothing fails over — before, nobody could
/// (pod 0 bootstraps only when no other master has data), and the shard stayed without writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_deleted_under_a_later_primary_is_re_created_above_its_epoch() {
    let s = replication_stage("repl-deleted", &[]).await;
    bootstrapped(&s).await;
    s.kubelet
        .crash_container(&s.namespace, "valkey-0-0", "valkey")
        .unwrap();
    let promoted = new_primary(&s, "valkey-0-0", 20 * SECOND).await.unwrap();
    poll_until(
        "valkey-0-0 rejoins as a replica",
        30 * SECOND,
        Duration::from_millis(50),
        || async { Ok(follows(&s, "valkey-0-0", &promoted)) },
    )
    .await
    .unwrap();
    assert_eq!(record(&s, "0").await, held(&promoted, 2));
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    leases
        .delete(&format!("{}-0-primary", s.cluster), &Default::default())
        .await
        .unwrap();
    let deleted = Instant::now();
    poll_until(
        "the holder re-creates the record one epoch up",
        20 * SECOND,
        Duration::from_millis(20),
        || async { Ok(record(&s, "0").await == held(&promoted, 3)) },
    )
    .await
    .unwrap();
    println!(
        "record re-created by {promoted} at epoch 3 after {:?}",
        deleted.elapsed()
    );
    // No failover: the same primary, writable, labelled; the others still follow it.
    tokio::time::sleep(2 * SECOND).await;
    assert_eq!(writable(&s), vec![promoted.clone()]);
    assert_eq!(record(&s, "0").await, held(&promoted, 3));
    assert_eq!(role_label(&s, &promoted).await.as_deref(), Some("primary"));
    for pod in s.pods.iter().filter(|p| **p != promoted) {
        assert!(
            follows(&s, pod, &promoted),
            "{pod} does not follow {promoted}"
        );
    }
    s.cmd(&promoted, &["SET", "after-recreate", "v"]).unwrap();
}
