//! A stolen agent token: what a pod's own token may change at all (its pod's labels, the Leases;
//! on the chart's pods in cluster mode), and, turned against the coordination state within what
//! the admission policy lets through (the shipped default) or with it off, on the chart's pods in
//! replication mode: what a user cares about — no acknowledged write lost, failover still
//! working, the forgery without effect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use valkey_sidecar_testkit::k8s::shard::{
    Record, follows, new_primary, record, replace_fresh, wait_steady, writable,
};
use valkey_sidecar_testkit::k8s::{ROLE_LABEL as ROLE, Stage, StageOptions, poll_until};

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
    let forgery = |lease| forged(lease, &thief, before.epoch + 1, 4);
    replace_fresh(&records, "valkey-0-primary", forgery)
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
    let ghost = |mut lease: Lease| {
        let spec = lease.spec.get_or_insert_default();
        spec.holder_identity = Some("valkey-9-9_ghost".into());
        spec.lease_duration_seconds = Some(3600);
        lease
    };
    replace_fresh(&leases, "valkey-coordinator", ghost)
        .await
        .unwrap();
    let before = record(&s, "0").await.unwrap();
    let absent = |lease| forged(lease, "valkey-0-99", before.epoch + 1, 3600);
    replace_fresh(&leases, "valkey-0-primary", absent)
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

// ------------------------------------------------------------------------------------------
// What a pod's own token may change at all: RBAC and the admission policies, cluster mode.
// ------------------------------------------------------------------------------------------

fn cluster_options() -> StageOptions {
    StageOptions::cluster("token-rights", 3, 1).env("SIDECAR_BALANCE", "false")
}

/// The HTTP status of an API call: 200 when it went through, the apiserver's code when refused.
fn code<T>(r: Result<T, kube::Error>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_own_token_may_change_only_its_own_valkey_labels() {
    let s = Stage::start(cluster_options()).await.unwrap();
    s.wait_labels_true(20 * SECOND).await.unwrap();
    let (me, other) = ("valkey-2-0", "valkey-2-1");
    let api: Api<Pod> = Api::namespaced(s.client_as_pod(me).await.unwrap(), &s.namespace);
    let pp = PatchParams::default();
    let cases = [
        (
            "claim primary on another pod",
            other,
            serde_json::json!({"metadata": {"labels": {ROLE: "primary"}}}),
        ),
        (
            "change a non-valkey.io label",
            me,
            serde_json::json!({"metadata": {"labels": {"app.kubernetes.io/name": "other"}}}),
        ),
        (
            "change the operator's shard index",
            me,
            serde_json::json!({"metadata": {"labels": {"valkey.io/shard-index": "7"}}}),
        ),
        (
            "add an annotation",
            me,
            serde_json::json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        (
            "touch spec",
            me,
            serde_json::json!({"spec": {"activeDeadlineSeconds": 3600}}),
        ),
        (
            "make another pod owned by something the garbage collector deletes, with the allowed role removal",
            other,
            serde_json::json!({"metadata": {"labels": {ROLE: null}, "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "6f1c7d3e-0000-4000-8000-000000000001"}
            ]}}),
        ),
        (
            "pin another pod in Terminating with a finalizer, with the allowed role removal",
            other,
            serde_json::json!({"metadata": {"labels": {ROLE: null}, "finalizers": ["example.com/pin"]}}),
        ),
        (
            "add a finalizer to its own pod",
            me,
            serde_json::json!({"metadata": {"finalizers": ["example.com/pin"]}}),
        ),
    ];
    for (what, pod, body) in cases {
        let c = code(api.patch(pod, &pp, &Patch::Merge(body)).await);
        println!("{what}: HTTP {c}");
        assert!(c == 403 || c == 422, "{what} was allowed (HTTP {c})");
    }
    // Allowed: its own valkey.io labels, and removing another pod's role label (dead pods).
    assert_eq!(
        code(
            api.patch(
                me,
                &pp,
                &Patch::Merge(
                    serde_json::json!({"metadata": {"labels": {"valkey.io/extra": "x"}}})
                )
            )
            .await
        ),
        200
    );
    assert_eq!(
        code(
            api.patch(
                other,
                &pp,
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {ROLE: null}}}))
            )
            .await
        ),
        200
    );
    // RBAC itself grants no deletes.
    let del = api.delete(other, &Default::default()).await;
    assert!(
        matches!(del, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{del:?}"
    );
}

/// With an agent's token, Leases: the admission policies let it create only its cluster's
/// coordinator Lease and shard records of its shards, naming pods their StatefulSet runs, at an
/// epoch below 10^9, for at most twice the agents' lease, owned by the chart's ConfigMap by its
/// uid, in a record format the agents know; and name only itself as the coordinator, never
/// writing an operator's request (pause, switchover). (The stage is in cluster mode: shard 2's record
/// is unused, and RBAC grants no update of it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_token_cannot_forge_a_shard_record() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::ConfigMap;
    let s = Stage::start(cluster_options()).await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(s.plane.client(), &s.namespace);
    let owner_uid = maps
        .get("valkey-leases")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let me = "valkey-2-0";
    let api: Api<Lease> = Api::namespaced(s.client_as_pod(me).await.unwrap(), &s.namespace);
    let owned = |uid: &str| serde_json::json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "valkey-leases", "uid": uid}]);
    let lease_with = |name: &str, holder: &str, epoch: &str, seconds: i32, owners| {
        serde_json::from_value::<Lease>(serde_json::json!({
            "metadata": {"name": name,
                "labels": {"valkey.io/record": "shard-primary", "valkey.io/cluster": "valkey"},
                "annotations": {"valkey.io/epoch": epoch, "valkey.io/primary": holder},
                "ownerReferences": owners},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds}
        }))
        .unwrap()
    };
    let record = |name: &str, holder: &str, epoch: &str, seconds: i32| {
        lease_with(name, holder, epoch, seconds, owned(&owner_uid))
    };
    let sa_owned = serde_json::json!([{"apiVersion": "v1", "kind": "ServiceAccount",
        "name": "valkey-sidecar", "uid": "6f1c7d3e-0000-4000-8000-000000000001"}]);
    let pp = PostParams::default();
    let refused = [
        (
            "a Lease outside the cluster's names",
            record("other-lease", "valkey-2-0", "1", 15),
        ),
        (
            "a record naming a pod of another shard",
            record("valkey-2-primary", "valkey-0-0", "1", 15),
        ),
        (
            "a record naming a pod of another cluster",
            record("valkey-2-primary", "other-2-0", "1", 15),
        ),
        (
            "a record naming a pod the StatefulSet does not run (ordinal 99)",
            record("valkey-2-primary", "valkey-2-99", "1", 15),
        ),
        (
            "a record of a shard the release does not have",
            record("valkey-7-primary", "valkey-7-0", "1", 15),
        ),
        (
            "an epoch of 2^64-1",
            record("valkey-2-primary", "valkey-2-0", "18446744073709551615", 15),
        ),
        (
            "a record created at epoch 10^9 (no room left for failovers)",
            record("valkey-2-primary", "valkey-2-0", "1000000000", 15),
        ),
        (
            "a lease of 31 s (the agents' is 15 s)",
            record("valkey-2-primary", "valkey-2-0", "1", 31),
        ),
        (
            "an owner with a made-up uid (the garbage collector would delete the record)",
            lease_with(
                "valkey-2-primary",
                "valkey-2-0",
                "1",
                15,
                owned("6f1c7d3e-0000-4000-8000-000000000002"),
            ),
        ),
        (
            "an owner other than the chart's ConfigMap",
            lease_with("valkey-2-primary", "valkey-2-0", "1", 15, sa_owned),
        ),
        (
            "a record of a future format (the agents would take no action on it)",
            {
                let mut r = record("valkey-2-primary", "valkey-2-0", "1", 15);
                let a = r.metadata.annotations.as_mut().unwrap();
                a.insert("valkey.io/format".into(), "2".into());
                r
            },
        ),
        (
            "no owner",
            lease_with(
                "valkey-2-primary",
                "valkey-2-0",
                "1",
                15,
                serde_json::Value::Null,
            ),
        ),
    ];
    for (what, lease) in refused {
        let c = code(api.create(&pp, &lease).await);
        println!("{what}: HTTP {c}");
        assert!(c == 403 || c == 422, "{what} was allowed (HTTP {c})");
    }
    let created = api
        .create(&pp, &record("valkey-2-primary", "valkey-2-0", "1", 30))
        .await;
    assert!(
        created.is_ok(),
        "a record as an agent creates one: {created:?}"
    );
    // RBAC: no update of Leases outside the release's own names (cluster mode has no records).
    let mut moved = created.unwrap();
    moved.spec.as_mut().unwrap().holder_identity = Some("valkey-2-1".into());
    let c = code(api.replace("valkey-2-primary", &pp, &moved).await);
    assert_eq!(c, 403, "an update of a Lease RBAC does not name");
    // The coordinator Lease: only the writing agent may name itself holder.
    poll_until(
        "the coordinator Lease",
        30 * SECOND,
        SECOND / 10,
        || async { Ok(api.get_opt("valkey-coordinator").await?.is_some()) },
    )
    .await
    .unwrap();
    let held_by = |holder: String| {
        move |mut lease: Lease| {
            lease.spec.get_or_insert_default().holder_identity = Some(holder.clone());
            lease
        }
    };
    let made_up = held_by("valkey-9-9_made-up".into());
    let c = code(replace_fresh(&api, "valkey-coordinator", made_up).await);
    assert!(
        c == 403 || c == 422,
        "a made-up coordinator was allowed (HTTP {c})"
    );
    let pods: Api<Pod> = Api::namespaced(s.plane.client(), &s.namespace);
    let uid = pods.get(me).await.unwrap().metadata.uid.unwrap();
    let itself = held_by(format!("{me}_{uid}"));
    let c = code(replace_fresh(&api, "valkey-coordinator", itself).await);
    assert_eq!(
        c, 200,
        "an agent naming itself coordinator (as after a takeover)"
    );
    // An operator's requests are never an agent's to write: no pause, no switchover, and no
    // record format newer than the agents' own.
    for (key, value) in [
        ("valkey.io/paused", "since now by a thief"),
        ("valkey.io/switchover", "id=x shard=0 to=valkey-0-1"),
        ("valkey.io/format", "2"),
    ] {
        let c = code(replace_fresh(&api, "valkey-coordinator", annotated(key, value)).await);
        println!("coordinator Lease with {key}={value}: HTTP {c}");
        assert!(c == 403 || c == 422, "{key}={value} was allowed (HTTP {c})");
    }
}

/// The coordinator Lease with one more annotation.
fn annotated(key: &'static str, value: &'static str) -> impl Fn(Lease) -> Lease {
    move |mut lease| {
        let a = lease.metadata.annotations.get_or_insert_default();
        a.insert(key.into(), value.into());
        lease
    }
}
