//! A stolen agent token turned against the coordination state (issue 30), on the chart's pods in
//! replication mode: each test plays the attacker with a pod's own token, within what the
//! admission policy lets through (the shipped default) or with it off, and asserts what a user
//! cares about — no acknowledged write lost, failover still working, the forgery without effect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use valkey_sidecar_testkit::k8s::shard::{
    Record, follows, new_primary, record, wait_steady, writable,
};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, poll_until};

const SECOND: Duration = Duration::from_secs(1);

/// One shard of `pods` pods, the short lease of the other replication tests (4 s, renew deadline
/// 3 s, retry 1 s), the admission policy as the chart ships it unless `extra` turns it off.
async fn stage(namespace: &str, pods: usize, extra: &[&str]) -> Stage {
    let mut o = StageOptions::replication(namespace, pods - 1).lease("4s", "3s", "1s");
    for v in extra {
        o = o.set(v);
    }
    let s = Stage::start(o).await.unwrap();
    wait_steady(&s, 60 * SECOND).await.unwrap();
    s
}

fn addrs(s: &Stage) -> Vec<std::net::SocketAddr> {
    s.pods.iter().map(|p| s.valkey(p).unwrap()).collect()
}

/// Shard 0's record as `pod`'s token can read and write it.
async fn records_as(s: &Stage, pod: &str) -> Api<Lease> {
    Api::namespaced(s.client_as_pod(pod).await.unwrap(), &s.namespace)
}

/// `lease` rewritten to name `holder` at `epoch` for `seconds`.
fn forged(mut lease: Lease, holder: &str, epoch: u64, seconds: i32) -> Lease {
    let annotations = lease.metadata.annotations.get_or_insert_default();
    annotations.insert("valkey.io/epoch".into(), epoch.to_string());
    annotations.insert("valkey.io/primary".into(), holder.into());
    let spec = lease.spec.get_or_insert_default();
    spec.holder_identity = Some(holder.into());
    spec.lease_duration_seconds = Some(seconds);
    lease
}

/// Whether `pod`'s Valkey answers `ROLE` as master.
fn is_master(s: &Stage, pod: &str) -> bool {
    s.role(pod).as_deref() == Some("master")
}

/// Waits until some pod takes writes and returns it.
async fn writes_again(s: &Stage, within: Duration) -> (String, Duration) {
    let t = Instant::now();
    poll_until("a pod takes writes", within, SECOND / 20, || async {
        Ok(!writable(s).is_empty())
    })
    .await
    .unwrap();
    (writable(s)[0].clone(), t.elapsed())
}

/// Finding 1: any agent's token may, within the policy, name its own pod the primary one epoch
/// up (the coordinator's own kind of write). The old primary used to `REPLICAOF` it at once —
/// a replica, lagging — and resync from it. Now it follows only a master that continues its data:
/// it stays fenced, says so, and the shard gets a primary back with every acknowledged write;
/// a crash failover afterwards takes its usual time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_promotion_within_the_policy_loses_no_write_and_failover_still_works() {
    let s = stage("token-promote", 3, &[]).await;
    let primary = record(&s, "0").await.unwrap().holder.unwrap();
    let thief = s.pods.iter().find(|p| **p != primary).unwrap().clone();
    let writer = s.writer(addrs(&s), "w");
    tokio::time::sleep(2 * SECOND).await;
    let records = records_as(&s, &thief).await;
    let before = record(&s, "0").await.unwrap();
    let lease = records.get("valkey-0-primary").await.unwrap();
    let forgery = forged(lease, &thief, before.epoch + 1, 4);
    records
        .replace("valkey-0-primary", &PostParams::default(), &forgery)
        .await
        .expect("the policy lets an agent name itself one epoch up");
    let t = Instant::now();
    // The old primary never follows the thief's pod while it is no master.
    while t.elapsed() < 12 * SECOND {
        let followed = follows(&s, &primary, &thief) && !is_master(&s, &thief);
        assert!(
            !followed,
            "{primary} follows {thief}, a replica named by a forged record"
        );
        tokio::time::sleep(SECOND / 20).await;
    }
    let (serving, after) = writes_again(&s, 30 * SECOND).await;
    let steady = wait_steady(&s, 30 * SECOND).await.unwrap();
    let w = writer.stop().unwrap();
    let lost = s.lost(&steady, "w", &w.acked).unwrap();
    println!(
        "forged record naming {thief} at epoch {}: {serving} takes writes after {after:?} \
         (steady under {steady}, record {:?}); {} acknowledged, {lost} lost, longest pause {:?}",
        before.epoch + 1,
        record(&s, "0").await,
        w.acked.len(),
        w.longest_pause
    );
    assert_eq!(lost, 0, "acknowledged writes lost to a forged record");
    assert!(w.acked.len() > 100, "the writer wrote");
    let events = s.events().await.unwrap();
    assert!(events.contains("ShardRecordNotFollowed"), "{events}");

    // Failover is intact: the primary's Valkey killed, a replica takes over as usual.
    let killed = Instant::now();
    s.kubelet
        .crash_container(&s.namespace, &steady, "valkey")
        .unwrap();
    let promoted = new_primary(&s, &steady, 20 * SECOND).await.unwrap();
    println!(
        "then a crash: {promoted} primary after {:?}",
        killed.elapsed()
    );
}

/// Finding 5: the record deleted (by hand, by the garbage collector, through a forged owner)
/// while its holder cannot re-create it — its agent hung past its renew deadline — and its
/// primary is not node-index 0 (which would bootstrap anew). It used to stay fenced for good, the
/// coordinator waiting on "no record". Now the coordinator re-creates it after a lease, one epoch
/// above the last it (or its keeper) saw, naming the master with the data, and writes resume
/// with nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_record_is_recreated_above_its_epoch_and_nothing_is_lost() {
    let s = stage("token-vanish", 2, &[]).await;
    // Move the primary off node-index 0 first.
    let first = record(&s, "0").await.unwrap().holder.unwrap();
    s.kubelet
        .crash_container(&s.namespace, &first, "valkey")
        .unwrap();
    let primary = new_primary(&s, &first, 20 * SECOND).await.unwrap();
    assert_ne!(primary, "valkey-0-0");
    wait_steady(&s, 60 * SECOND).await.unwrap();
    let Record { epoch, .. } = record(&s, "0").await.unwrap();
    let writer = s.writer(addrs(&s), "w");
    tokio::time::sleep(2 * SECOND).await;
    // Its agent hangs past its renew deadline (3 s) while the record goes.
    s.signal_container(&primary, "valkey-sidecar", "STOP")
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    leases
        .delete("valkey-0-primary", &DeleteParams::default())
        .await
        .unwrap();
    let gone = Instant::now();
    tokio::time::sleep(3500 * Duration::from_millis(1)).await;
    s.signal_container(&primary, "valkey-sidecar", "CONT")
        .unwrap();
    let back = poll_until(
        "the record re-created",
        40 * SECOND,
        SECOND / 10,
        || async { Ok(record(&s, "0").await.is_some_and(|r| r.holder.is_some())) },
    )
    .await;
    let now = record(&s, "0").await;
    back.unwrap_or_else(|e| panic!("{e:#}; record {now:?}"));
    let now = now.unwrap();
    let steady = wait_steady(&s, 30 * SECOND).await.unwrap();
    let w = writer.stop().unwrap();
    let lost = s.lost(&steady, "w", &w.acked).unwrap();
    println!(
        "record deleted at epoch {epoch}: re-created after {:?} as {now:?}; steady under \
         {steady}; {} acknowledged, {lost} lost, longest pause {:?}",
        gone.elapsed(),
        w.acked.len(),
        w.longest_pause
    );
    assert_eq!(now.epoch, epoch + 1, "re-created one epoch up");
    assert_eq!(steady, primary, "the master with the data is named again");
    assert_eq!(lost, 0);
}

/// Findings 2 and 4, with the admission policy off (acknowledged): a record naming a pod that
/// does not exist and a coordinator Lease held by a made-up holder, both for an hour. The agents
/// honour at most twice their own lease, so the shard fails over and writes resume within
/// seconds, not an hour, with nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_policy_an_hour_long_forgery_freezes_nothing_for_long() {
    let off = [
        "sidecar.admissionPolicy=false",
        "sidecar.acknowledgeNoAdmissionPolicy=true",
    ];
    let s = stage("token-hour", 3, &off).await;
    let primary = record(&s, "0").await.unwrap().holder.unwrap();
    let thief = s.pods.iter().find(|p| **p != primary).unwrap().clone();
    let writer = s.writer(addrs(&s), "w");
    tokio::time::sleep(2 * SECOND).await;
    let leases = records_as(&s, &thief).await;
    let mut ghost = leases.get("valkey-coordinator").await.unwrap();
    let spec = ghost.spec.get_or_insert_default();
    spec.holder_identity = Some("valkey-9-9_ghost".into());
    spec.lease_duration_seconds = Some(3600);
    let pp = PostParams::default();
    leases
        .replace("valkey-coordinator", &pp, &ghost)
        .await
        .unwrap();
    let before = record(&s, "0").await.unwrap();
    let lease = leases.get("valkey-0-primary").await.unwrap();
    let absent = forged(lease, "valkey-0-99", before.epoch + 1, 3600);
    leases
        .replace("valkey-0-primary", &pp, &absent)
        .await
        .unwrap();
    let t = Instant::now();
    let recovered = poll_until(
        "a primary recorded again",
        60 * SECOND,
        SECOND / 10,
        || async {
            Ok(record(&s, "0")
                .await
                .and_then(|r| r.holder)
                .is_some_and(|h| s.pods.contains(&h)))
        },
    )
    .await;
    let now = record(&s, "0").await;
    recovered.unwrap_or_else(|e| panic!("{e:#}; record {now:?}"));
    let took = t.elapsed();
    let steady = wait_steady(&s, 30 * SECOND).await.unwrap();
    let w = writer.stop().unwrap();
    let lost = s.lost(&steady, "w", &w.acked).unwrap();
    println!(
        "an hour-long forged record and coordinator: recorded again after {took:?} ({now:?}), \
         steady under {steady}; {} acknowledged, {lost} lost, longest pause {:?}",
        w.acked.len(),
        w.longest_pause
    );
    assert_eq!(lost, 0);
    // Two leases of 4 s for the coordinator, two for the record, plus the rounds between.
    assert!(took < 40 * SECOND, "{took:?}");
}
