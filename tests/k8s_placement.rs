//! Shard-aware placement with the real kube-scheduler: the chart renders the rules (`spread.*`,
//! `placement.zones`), the scheduler enforces them on fake nodes, and the coordinator reports what
//! it sees (`SchedulingSatisfied` on its Lease, `Unschedulable` with the scheduler's own message).
//! Replication mode throughout (placement does not depend on the mode, and it needs no Cluster).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use valkey_sidecar_testkit::k8s::chart::{label, node_of, shards};
use valkey_sidecar_testkit::k8s::{FakeNodesOptions, Stage, StageOptions, poll_until};

const SECOND: Duration = Duration::from_secs(1);

/// Replication mode with a generated Secret, `sets` on top, on `nodes`.
fn options(namespace: &str, sets: &[&str], nodes: FakeNodesOptions) -> StageOptions {
    let mut o = StageOptions::example(namespace, "replication-1x2")
        .generated_auth()
        .nodes(nodes);
    for set in sets {
        o = o.set(set);
    }
    o
}

fn nodes(count: usize, zones: &[&str]) -> FakeNodesOptions {
    FakeNodesOptions {
        count,
        zones: zones.iter().map(|z| z.to_string()).collect(),
        ..FakeNodesOptions::default()
    }
}

/// Node name → zone.
async fn zones(stage: &Stage) -> BTreeMap<String, String> {
    let api: Api<Node> = Api::all(stage.plane.client());
    let list = api.list(&Default::default()).await.unwrap().items;
    list.into_iter()
        .map(|n| {
            let zone = n.metadata.labels.unwrap()["topology.kubernetes.io/zone"].clone();
            (n.metadata.name.unwrap(), zone)
        })
        .collect()
}

/// Per shard: its pods' (name, node, zone), pods without a node left out.
async fn placement(stage: &Stage, pods: &[Pod]) -> BTreeMap<String, Vec<(String, String, String)>> {
    let zone_of = zones(stage).await;
    shards(pods)
        .into_iter()
        .map(|(shard, members)| {
            let placed = members
                .iter()
                .filter_map(|p| {
                    let node = node_of(p)?.to_owned();
                    let name = p.metadata.name.clone()?;
                    Some((name, node.clone(), zone_of[&node].clone()))
                })
                .collect();
            (shard, placed)
        })
        .collect()
}

/// Waits until the coordinator's `SchedulingSatisfied` condition starts with `want`; returns it.
async fn condition(stage: &Stage, want: &str) -> String {
    let what = format!("SchedulingSatisfied to be {want}");
    let waited = poll_until(&what, 60 * SECOND, Duration::from_millis(200), || async {
        Ok(stage
            .condition("SchedulingSatisfied")
            .await?
            .is_some_and(|c| c.starts_with(want)))
    })
    .await;
    if let Err(e) = waited {
        panic!(
            "{e:#}: {:?}\n{}",
            stage.condition("SchedulingSatisfied").await,
            stage.describe().await
        );
    }
    stage
        .condition("SchedulingSatisfied")
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_two_nodes_in_one_zone_preferred_spread_schedules_everything_and_says_what_is_shared() {
    let sets = ["shards=3", "replicas=2"];
    let stage = Stage::install(options("place-pref", &sets, nodes(2, &["zone-a"])))
        .await
        .unwrap();
    let pods = stage.wait_ready(9, 120 * SECOND).await.unwrap();
    let placed = placement(&stage, &pods).await;
    println!("3 shards x 3 pods on 2 nodes in 1 zone, spread Preferred: {placed:?}");
    for (shard, members) in &placed {
        let nodes: BTreeSet<&String> = members.iter().map(|(_, n, _)| n).collect();
        assert_eq!(members.len(), 3, "shard {shard}: every pod scheduled");
        assert_eq!(
            nodes.len(),
            2,
            "shard {shard}: both nodes used before one is shared"
        );
    }
    let c = condition(&stage, "False ShardSharesNode").await;
    println!("SchedulingSatisfied: {c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_two_nodes_required_node_spread_leaves_the_surplus_pending_and_the_status_says_why() {
    let sets = ["shards=3", "replicas=2", "spread.node.mode=Required"];
    let stage = Stage::install(options("place-req", &sets, nodes(2, &["zone-a"])))
        .await
        .unwrap();
    let pending = poll_until(
        "one pod per shard Pending",
        120 * SECOND,
        SECOND,
        || async {
            let pods = stage.pod_objects().await?;
            let unplaced = pods.iter().filter(|p| node_of(p).is_none()).count();
            Ok(pods.len() == 9 && unplaced == 3)
        },
    )
    .await;
    assert!(pending.is_ok(), "{pending:?}\n{}", stage.describe().await);
    let pods = stage.pod_objects().await.unwrap();
    let unplaced: Vec<String> = pods
        .iter()
        .filter(|p| node_of(p).is_none())
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    // The three that wait are each shard's third pod: two fit, one per node.
    for (shard, members) in shards(&pods) {
        assert_eq!(
            members.iter().filter(|p| node_of(p).is_some()).count(),
            2,
            "shard {shard}"
        );
    }
    let c = condition(&stage, "False Unschedulable").await;
    println!("pending {unplaced:?}; SchedulingSatisfied: {c}");
    for pod in &unplaced {
        assert!(c.contains(pod.as_str()), "{c}");
    }
    // The scheduler's own words: what could not be satisfied.
    assert!(c.contains("anti-affinity"), "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_two_pods_of_a_shard_per_zone_with_five_pods_over_three_zones() {
    let sets = [
        "replicas=4",
        "spread.zone.mode=Required",
        "spread.zone.maxPerDomain=2",
    ];
    let stage = Stage::install(options("place-cap", &sets, FakeNodesOptions::default()))
        .await
        .unwrap();
    let pods = stage.wait_ready(5, 120 * SECOND).await.unwrap();
    let placed = placement(&stage, &pods).await;
    println!("1 shard x 5 pods over 3 zones, at most 2 per zone: {placed:?}");
    let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, _, zone) in placed.values().flatten() {
        *per_zone.entry(zone.as_str()).or_default() += 1;
    }
    assert_eq!(per_zone.values().sum::<usize>(), 5);
    assert!(per_zone.values().all(|n| *n <= 2), "{per_zone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_zones_put_each_shards_intended_primary_in_its_own_zone() {
    let sets = [
        "shards=2",
        "replicas=2",
        "placement.zones={zone-a,zone-b,zone-c}",
        "placement.zonePinning=Required",
    ];
    let stage = Stage::install(options("place-pin", &sets, FakeNodesOptions::default()))
        .await
        .unwrap();
    let pods = stage.wait_ready(6, 120 * SECOND).await.unwrap();
    // Pinning is a MutatingAdmissionPolicy (v1 from Kubernetes 1.36): on an older apiserver
    // (scripts/test-k8s-version.sh) the chart leaves it out, and says so.
    let version = stage.plane.client().apiserver_version().await.unwrap();
    if version.minor.parse::<u32>().unwrap() < 36 {
        let manifest = std::fs::read_to_string(&stage.manifest).unwrap();
        assert!(
            !manifest.contains("kind: MutatingAdmissionPolicy"),
            "{manifest}"
        );
        println!(
            "Kubernetes {}: no zone pinning to test",
            version.git_version
        );
        return;
    }
    let placed = placement(&stage, &pods).await;
    println!("2 shards x 3 pods pinned to zones[(shard + index) % 3]: {placed:?}");
    let order = ["zone-a", "zone-b", "zone-c"];
    for p in &pods {
        let shard: usize = label(p, "valkey.io/shard-index").unwrap().parse().unwrap();
        let index: usize = label(p, "apps.kubernetes.io/pod-index")
            .unwrap()
            .parse()
            .unwrap();
        let (_, _, zone) = placed[&shard.to_string()]
            .iter()
            .find(|(n, _, _)| Some(n) == p.metadata.name.as_ref())
            .unwrap();
        assert_eq!(zone, order[(shard + index) % 3], "{:?}", p.metadata.name);
    }
    // The intended primaries start out primary, in their shard's zone: no drift to report.
    let aligned = poll_until(
        "placement aligned",
        60 * SECOND,
        Duration::from_millis(200),
        || async {
            let c = stage.condition("PrimaryPlacementAligned").await?;
            Ok(c.is_some_and(|c| c.starts_with("True")))
        },
    )
    .await;
    assert!(
        aligned.is_ok(),
        "{:?}",
        stage.condition("PrimaryPlacementAligned").await
    );
    let c = condition(&stage, "True").await;
    println!("SchedulingSatisfied: {c}");
}
