//! Many releases side by side (issue 33): two in one namespace and one, of the same release name
//! as the first, in another, on one control plane and the same six nodes. Each has its own
//! coordinator Lease, records, Services and disruption budgets, and a drain of a node they share
//! moves each one's primaries without touching the others' — under a writer per release, nothing
//! lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::ListParams;
use valkey_sidecar_testkit::k8s::follow::{Addresses, Watcher, stop_writers, writers};
use valkey_sidecar_testkit::k8s::shard::record;
use valkey_sidecar_testkit::k8s::{Stage, StageOptions};

const SECOND: Duration = Duration::from_secs(1);

/// Release `release` of `namespace`, replication mode, one shard of `replicas + 1` pods.
fn replication(namespace: &str, release: &str, replicas: usize) -> StageOptions {
    let mut o = StageOptions::replication(namespace, replicas);
    o.release = release.into();
    o
}

/// The node carrying pods of the most releases (ties: the most pods).
async fn shared_node(stages: &[&Stage]) -> String {
    let mut count: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    for s in stages {
        let mut seen = BTreeSet::new();
        for p in &s.pods {
            let node = s.node_of(p).await.unwrap();
            let c = count.entry(node.clone()).or_default();
            c.1 += 1;
            if seen.insert(node) {
                c.0 += 1;
            }
        }
    }
    count.into_iter().max_by_key(|(_, c)| *c).unwrap().0
}

/// The names of `T`s in `s`'s namespace whose `valkey.io/cluster` label is `s`'s.
async fn owned<T>(s: &Stage) -> BTreeSet<String>
where
    T: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    T::DynamicType: Default,
{
    let api: Api<T> = Api::namespaced(s.plane.client(), &s.namespace);
    let selector = format!("valkey.io/cluster={}", s.cluster);
    let list = api.list(&ListParams::default().labels(&selector)).await;
    list.unwrap()
        .items
        .iter()
        .filter_map(|o| o.meta().name.clone())
        .collect()
}

/// Each of `s`'s budgets selects only `s`'s pods.
async fn budgets_select_only_their_own(s: &Stage) {
    let api: Api<PodDisruptionBudget> = Api::namespaced(s.plane.client(), &s.namespace);
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(s.plane.client(), &s.namespace);
    let budgets = owned::<PodDisruptionBudget>(s).await;
    assert!(!budgets.is_empty(), "{} has no budget", s.cluster);
    for name in budgets {
        let pdb = api.get(&name).await.unwrap();
        let labels = pdb.spec.and_then(|p| p.selector?.match_labels).unwrap();
        let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let selected = pods
            .list(&ListParams::default().labels(&selector.join(",")))
            .await
            .unwrap();
        assert!(!selected.items.is_empty(), "budget {name} selects nothing");
        for p in selected.items {
            let name = p.metadata.name.unwrap_or_default();
            assert!(
                s.pods.contains(&name),
                "budget {name} of {} selects {name}",
                s.cluster
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_side_by_side_keep_to_themselves_through_a_shared_drain() {
    // a: the chart's cluster mode, 3 × 2, release `valkey` in team-a; b: replication mode beside
    // it in team-a (release `cache`); c: release `valkey` again, replication mode, in team-b.
    let a = Stage::start(StageOptions::cluster("team-a", 3, 1))
        .await
        .unwrap();
    let b = a
        .install_beside(replication("team-a", "cache", 2))
        .await
        .unwrap();
    let c = a
        .install_beside(replication("team-b", "valkey", 1))
        .await
        .unwrap();
    for s in [&b, &c] {
        s.wait_settled(s.pods.len(), 1, 180 * SECOND).await.unwrap();
        s.wait_synced(60 * SECOND).await.unwrap();
    }
    let stages = [&a, &b, &c];
    // Separate names: Services, budgets, Leases; each coordinator a pod of its own release.
    let mut services = BTreeSet::new();
    for s in stages {
        let owned_services = owned::<Service>(s).await;
        assert!(
            owned_services.len() >= 2,
            "{}: {owned_services:?}",
            s.cluster
        );
        for name in owned_services {
            assert!(
                services.insert((s.namespace.clone(), name.clone())),
                "{name} twice"
            );
        }
        budgets_select_only_their_own(s).await;
        let holder = s.wait_coordinator(30 * SECOND).await.unwrap();
        assert!(
            s.pods.contains(&holder),
            "{} is coordinated by {holder}",
            s.cluster
        );
    }
    for s in [&b, &c] {
        let r = record(s, "0").await.expect("a record");
        assert!(
            s.pods.contains(&r.holder.unwrap()),
            "{}'s record",
            s.cluster
        );
    }
    // A drain of the node they share most, a writer per shard of each, following its pods to
    // their new addresses.
    let node = shared_node(&stages).await;
    let mut apps = Vec::new();
    for (s, cluster) in stages.iter().zip([true, false, false]) {
        let pods = s.pod_objects().await.unwrap();
        let addresses = Addresses::new(&pods);
        let watcher = Watcher::start(s, addresses.clone());
        apps.push((watcher, writers(s, &pods, &addresses, cluster).unwrap()));
    }
    tokio::time::sleep(SECOND).await;
    let drained = a.drain(&node, 300 * SECOND).await;
    assert!(drained.is_ok(), "kubectl drain {node}: {drained:?}");
    a.plane.kubectl(&["uncordon", &node]).await.unwrap();
    for s in stages {
        let shards = s.pods.len() / s.members.max(1);
        s.wait_settled(s.pods.len(), shards, 300 * SECOND)
            .await
            .unwrap();
        s.wait_synced(120 * SECOND).await.unwrap();
    }
    for (s, (watcher, app)) in stages.iter().zip(apps) {
        drop(watcher.stop());
        for w in stop_writers(s, app).await.unwrap() {
            println!("{}/{} shard {}: {w:?}", s.namespace, s.cluster, w.shard);
            assert!(w.acked > 0, "{}: nothing acknowledged", s.cluster);
            assert_eq!(w.lost, 0, "{}/{} lost writes", s.namespace, s.cluster);
            // Its connections went to its own release's pods only (another's password fails).
            assert_eq!(
                w.auth_failures, 0,
                "{}/{} reached another release",
                s.namespace, s.cluster
            );
        }
        let holder = s.coordinator_holder().await.unwrap().unwrap();
        assert!(
            s.pods.contains(&holder),
            "{} is coordinated by {holder}",
            s.cluster
        );
    }
}
