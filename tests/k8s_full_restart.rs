//! Issue 17 item 4: every pod of a cluster deleted at once (a node-pool replacement, a restore):
//! every pod comes back with a new IP. With persistence each Valkey loads its `nodes.conf`, which
//! names its peers at their old addresses, so no node can reach another until someone introduces
//! them again: the coordinator meets every node at its pod's new address (formation's
//! `readdress`). Without persistence every node comes back empty: the agents form a fresh cluster
//! and say in an Event that the data is gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use valkey_sidecar_testkit::faults::{self, Outcome};
use valkey_sidecar_testkit::k8s::chart::text;
use valkey_sidecar_testkit::k8s::writer::{Written, missing};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, poll_until};

const SECOND: Duration = Duration::from_secs(1);
const SHARDS: usize = 3;

/// Every pod's name.
fn every_pod(s: &Stage) -> Vec<String> {
    (0..s.shape().0)
        .flat_map(|i| s.shard_pods(i).to_vec())
        .collect()
}

/// Cluster mode (else replication mode).
fn is_cluster(s: &Stage) -> bool {
    every_pod(s)
        .iter()
        .any(|p| s.cmd(p, &["CLUSTER", "INFO"]).is_ok())
}

/// A writer on every shard for a couple of seconds: (tag, what it acknowledged) per shard.
async fn write_every_shard(s: &Stage) -> Vec<(String, Written)> {
    let writers: Vec<_> = if is_cluster(s) {
        (0..s.shape().0)
            .map(|i| s.shard_writer(i).unwrap())
            .collect()
    } else {
        let addrs = every_pod(s).iter().map(|p| s.valkey(p).unwrap()).collect();
        vec![s.writer(addrs, "w")]
    };
    tokio::time::sleep(2 * SECOND).await;
    writers
        .into_iter()
        .map(|w| (w.tag.clone(), w.stop().unwrap()))
        .collect()
}

/// Every pod's IP now.
fn pod_ips(s: &Stage) -> Vec<String> {
    let ip = |p: &String| s.valkey(p).unwrap().ip().to_string();
    every_pod(s).iter().map(ip).collect()
}

/// Deletes every pod at once (the kubelet stops them gracefully, as a drain of every node does)
/// and waits until the StatefulSet's replacements are Ready: (the old pod IPs, when the deletes
/// went out).
async fn delete_every_pod(s: &Stage) -> (Vec<String>, Instant) {
    let (names, before) = (every_pod(s), pod_ips(s));
    let uids: Vec<String> = s
        .pod_objects()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    let at = Instant::now();
    let (api, params) = (s.api(), Default::default());
    join_all(names.iter().map(|p| api.delete(p, &params)))
        .await
        .into_iter()
        .for_each(|r| {
            r.unwrap();
        });
    let replaced = poll_until("every pod replaced", 120 * SECOND, SECOND / 10, || async {
        let now = s.pod_objects().await?;
        Ok(now.len() == names.len()
            && now
                .iter()
                .all(|p| !uids.contains(&p.metadata.uid.clone().unwrap_or_default())))
    })
    .await;
    assert!(replaced.is_ok(), "{replaced:?}\n{}", s.describe().await);
    for p in &names {
        let ready = s.kubelet.wait_ready(&s.namespace, p, 180 * SECOND).await;
        if ready.is_err() {
            println!("{}", s.diagnose_unsettled().await);
        }
        assert!(ready.is_ok(), "{ready:?}\n{}", s.stops_report());
        let ip = s.valkey(p).unwrap().ip().to_string();
        assert!(
            !before.contains(&ip),
            "{p} came back on an old address {ip}"
        );
    }
    (before, at)
}

/// Scales every shard's StatefulSet to 0, waits until no pod is left, and back to 2 (a restore,
/// or every node replaced: nothing of the old cluster is running when the pods come back); waits
/// until they are Ready: (the old pod IPs, when the scale-down went out).
async fn restart_everything(s: &Stage) -> (Vec<String>, Instant) {
    let (names, before) = (every_pod(s), pod_ips(s));
    let sets: Api<StatefulSet> = Api::namespaced(s.plane.client(), &s.namespace);
    let scale = |n: i32| {
        let sets = sets.clone();
        async move {
            for i in 0..s.shape().0 {
                let patch = serde_json::json!({ "spec": { "replicas": n } });
                sets.patch(
                    &format!("valkey-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .unwrap();
            }
        }
    };
    let at = Instant::now();
    scale(0).await;
    let empty = poll_until("no pod left", 180 * SECOND, SECOND / 10, || async {
        Ok(s.pod_objects().await?.is_empty())
    })
    .await;
    assert!(empty.is_ok(), "{empty:?}\n{}", s.describe().await);
    scale(i32::try_from(s.shape().1).unwrap()).await;
    for p in &names {
        s.kubelet
            .wait_ready(&s.namespace, p, 180 * SECOND)
            .await
            .unwrap();
    }
    (before, at)
}

/// Every node says `cluster_state:ok` and lists no peer at an address that is no pod's any more.
async fn healed(s: &Stage, old: &[String], within: Duration) {
    let names = every_pod(s);
    let ok = poll_until(
        "every node ok, no old address",
        within,
        SECOND / 10,
        || async {
            Ok(names.iter().all(|p| {
                let info = s
                    .cmd(p, &["CLUSTER", "INFO"])
                    .ok()
                    .and_then(|v| text(v).ok());
                let nodes = s
                    .cmd(p, &["CLUSTER", "NODES"])
                    .ok()
                    .and_then(|v| text(v).ok());
                info.is_some_and(|i| i.contains("cluster_state:ok"))
                    && nodes.is_some_and(|n| !old.iter().any(|ip| n.contains(&format!("{ip}:"))))
            }))
        },
    )
    .await;
    if ok.is_err() {
        for p in &names {
            let nodes = s
                .cmd(p, &["CLUSTER", "NODES"])
                .ok()
                .and_then(|v| text(v).ok());
            println!("{p} CLUSTER NODES:\n{}", nodes.unwrap_or_default());
        }
    }
    assert!(
        ok.is_ok(),
        "{ok:?} (old addresses {old:?})\n{}",
        s.describe().await
    );
}

/// A `SET` on every shard's primary succeeds (keys tagged as its writer's were).
fn every_shard_writable(s: &Stage, written: &[(String, Written)]) {
    for (i, (tag, _)) in written.iter().enumerate() {
        let (primary, _) = s.primary_and_replicas(i).unwrap();
        s.cmd(&primary, &["SET", &format!("{{{tag}}}:after"), "1"])
            .unwrap();
    }
}

/// Reads every shard's writes back from its primary now: (acknowledged, lost).
fn read_back(s: &Stage, written: &[(String, Written)]) -> (usize, usize) {
    let (mut acked, mut lost) = (0, 0);
    for (i, (tag, w)) in written.iter().enumerate() {
        let (primary, _) = s.primary_and_replicas(i).unwrap();
        let gone = missing(s.valkey(&primary).unwrap(), &s.client(), tag, &w.acked).unwrap();
        acked += w.acked.len();
        lost += gone.len();
    }
    (acked, lost)
}

/// The cluster whole again after a full restart: pods Ready and labelled, every node ok with no
/// old address; how long that took from `at`.
async fn whole_again(s: &Stage, (old, at): (Vec<String>, Instant)) -> Duration {
    let (shards, members) = s.shape();
    let settled = s.wait_settled(shards * members, shards, 120 * SECOND).await;
    if let Err(e) = settled {
        for pod in &s.pods {
            let log = s
                .kubelet
                .container_log(&s.namespace, pod, "valkey-sidecar", 25);
            println!("--- {pod} agent log\n{log}");
        }
        panic!("{e:#}\n{}", s.events().await.unwrap_or_default());
    }
    if is_cluster(s) {
        healed(s, &old, 120 * SECOND).await;
    }
    at.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_persistence_a_full_restart_comes_back_whole_with_its_data() {
    let s = Stage::start(StageOptions::cluster("full-restart-pv", SHARDS, 1).persistent())
        .await
        .unwrap();
    s.wait_coordinator(30 * SECOND).await.unwrap();
    for (how, restart) in [
        ("every pod deleted at once", false),
        ("scaled to 0 and back", true),
    ] {
        let written = write_every_shard(&s).await;
        let restarted = if restart {
            restart_everything(&s).await
        } else {
            delete_every_pod(&s).await
        };
        let recovered = whole_again(&s, restarted).await;
        every_shard_writable(&s, &written);
        let (acked, lost) = read_back(&s, &written);
        assert_eq!(lost, 0, "{how}: {lost} of {acked} acknowledged writes lost");
        println!(
            "{how}, persistence: whole again after {recovered:?}; {acked} acknowledged before, 0 lost"
        );
        faults::record(
            &Outcome::new(module_path!(), &format!("cluster mode, persistence: {how}, new pod IPs"))
                .writes(acked, lost)
                .recovery(recovered)
                .note(
                    "recovery: the restart → every pod Ready and labelled, every node cluster_state:ok listing no old address; writes acknowledged before the clean shutdown, read back after",
                ),
        );
    }
}

/// A preStop wait of 50 s (the chart's default is 20 s) for a deployment without persistence whose
/// pods are all deleted at once: each primary waits for a replacement replica to start, sync and
/// take over, which on a loaded CI machine (the apiserver answering in seconds) took longer than
/// 20 s. A primary that stops first leaves its shard to a replica of a primary gone for good,
/// which no election can promote (docs/operations.md, "Full restarts"). With persistence the
/// primary's replacement comes back with its data, so that test keeps the chart's default.
fn at_once(o: StageOptions) -> StageOptions {
    o.set("terminationGracePeriodSeconds=60")
}

/// The coordinator Lease's `valkey.io/cluster-formed` marker, if any.
async fn formed_marker(s: &Stage) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    let lease = leases.get("valkey-coordinator").await.ok()?;
    lease
        .metadata
        .annotations?
        .get("valkey.io/cluster-formed")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_persistence_pods_deleted_at_once_keep_the_data_and_a_full_restart_says_it_is_gone()
{
    let s = Stage::start(at_once(StageOptions::cluster(
        "full-restart-empty",
        SHARDS,
        1,
    )))
    .await
    .unwrap();
    s.wait_coordinator(30 * SECOND).await.unwrap();
    let marked = poll_until(
        "the Lease marks the cluster formed",
        30 * SECOND,
        SECOND / 10,
        || async { Ok(formed_marker(&s).await.is_some()) },
    )
    .await;
    assert!(marked.is_ok(), "{marked:?}");
    // Deleted at once, the pods still stop one by one: each primary's preStop wait holds it until
    // a replica (a replacement that synced from it, if need be) took over, so nothing is lost.
    let written = write_every_shard(&s).await;
    let restarted = delete_every_pod(&s).await;
    let recovered = whole_again(&s, restarted).await;
    every_shard_writable(&s, &written);
    let (acked, lost) = read_back(&s, &written);
    assert_eq!(lost, 0, "{lost} of {acked} acknowledged writes lost");
    let events = s.events().await.unwrap();
    assert!(!events.contains("ClusterDataLost"), "{events}");
    println!(
        "every pod deleted at once, no persistence: whole again after {recovered:?}; {acked} acknowledged before, 0 lost"
    );
    faults::record(
        &Outcome::new(module_path!(), "cluster mode, no persistence: every pod deleted at once, new pod IPs")
            .writes(acked, lost)
            .recovery(recovered)
            .note(
                "recovery: the deletes → every pod Ready and labelled, every node cluster_state:ok listing no old address; each primary handed over to a synced replica (a replacement, if need be) before it stopped",
            ),
    );
    // Nothing runs when the pods come back: nothing can survive, and the agents say so.
    let written = write_every_shard(&s).await;
    let restarted = restart_everything(&s).await;
    let recovered = whole_again(&s, restarted).await;
    every_shard_writable(&s, &written);
    let (acked, lost) = read_back(&s, &written);
    assert_eq!(
        lost, acked,
        "nothing could have survived: {lost} of {acked} lost"
    );
    let events = s.events().await.unwrap();
    assert!(
        events.contains("ClusterDataLost"),
        "the agents did not say that the data is gone:\n{events}"
    );
    assert!(
        formed_marker(&s).await.is_some(),
        "the marker outlived the restart"
    );
    println!(
        "scaled to 0 and back, no persistence: a fresh cluster after {recovered:?}; {acked} acknowledged before, all lost"
    );
    faults::record(
        &Outcome::new(module_path!(), "cluster mode, no persistence: scaled to 0 and back, new pod IPs")
            .writes(acked, lost)
            .recovery(recovered)
            .note(
                "recovery: the restart → a fresh cluster formed by the agents, every pod Ready and labelled, every node cluster_state:ok; all data lost by design (no persistence), said by a ClusterDataLost Event",
            ),
    );
}

/// The shard record's (holder, epoch).
async fn record(s: &Stage) -> (Option<String>, u64) {
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    let lease = leases.get("valkey-0-primary").await.unwrap();
    let epoch = lease.metadata.annotations.unwrap_or_default()["valkey.io/epoch"]
        .parse()
        .unwrap();
    (lease.spec.unwrap().holder_identity, epoch)
}

/// Replication mode, one shard of 3 pods scaled to 0 and back: the record's epoch carries on
/// (the next primary takes it one up, holding it under its new pod), and the writes acknowledged
/// before come back with persistence; without it every member is empty and an Event says so.
async fn replication_restart(persistent: bool) -> (usize, usize, Duration, String) {
    let name = if persistent {
        "full-restart-repl-pv"
    } else {
        "full-restart-repl"
    };
    let o = StageOptions::replication(name, 2);
    let s = Stage::start(if persistent { o.persistent() } else { o })
        .await
        .unwrap();
    s.wait_settled(3, 1, 60 * SECOND).await.unwrap();
    let (_, epoch) = record(&s).await;
    let written = write_every_shard(&s).await;
    let restarted = restart_everything(&s).await;
    let recovered = whole_again(&s, restarted).await;
    every_shard_writable(&s, &written);
    let (acked, lost) = read_back(&s, &written);
    let (holder, now) = record(&s).await;
    let (primary, _) = s.primary_and_replicas(0).unwrap();
    assert_eq!(
        holder.as_deref(),
        Some(primary.as_str()),
        "the record names the primary"
    );
    assert!(now > epoch, "the epoch went on from {epoch}: {now}");
    println!(
        "replication, persistent {persistent}: whole again after {recovered:?}; {acked} acknowledged, {lost} lost; epoch {epoch} → {now}"
    );
    (acked, lost, recovered, s.events().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_mode_with_persistence_a_full_restart_keeps_the_data_and_the_epoch_goes_on() {
    let (acked, lost, recovered, events) = replication_restart(true).await;
    assert_eq!(lost, 0, "{lost} of {acked} acknowledged writes lost");
    assert!(!events.contains("ShardDataLost"), "{events}");
    faults::record(
        &Outcome::new(module_path!(), "replication mode, persistence: scaled to 0 and back, new pod IPs")
            .writes(acked, lost)
            .recovery(recovered)
            .note("recovery: the restart → 3 pods Ready, one labelled primary and holding the record one epoch up, writable; writes acknowledged before the clean shutdown, read back after"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_mode_without_persistence_a_full_restart_says_the_data_is_gone() {
    let (acked, lost, recovered, events) = replication_restart(false).await;
    assert_eq!(
        lost, acked,
        "nothing could have survived: {lost} of {acked}"
    );
    assert!(
        events.contains("ShardDataLost"),
        "the agents did not say that the data is gone:\n{events}"
    );
    faults::record(
        &Outcome::new(module_path!(), "replication mode, no persistence: scaled to 0 and back, new pod IPs")
            .writes(acked, lost)
            .recovery(recovered)
            .note("recovery: the restart → 3 pods Ready, one labelled primary and holding the record one epoch up, writable; all data lost by design (no persistence), said by a ShardDataLost Event"),
    );
}
