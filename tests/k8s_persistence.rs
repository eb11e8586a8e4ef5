//! The chart's `persistence.enabled` path end to end: each pod's claim bound by kube-scheduler and
//! the PV controller to a local PersistentVolume of its node (`k8s::storage`), mounted by the
//! harness kubelet. A deleted pod comes back on the same node, with the same volume and the data
//! and cluster identity it left there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use valkey_sidecar_testkit::k8s::chart::{node_of, text};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions};

const SECOND: Duration = Duration::from_secs(1);
const KEYS: usize = 500;

/// The PersistentVolume `pod`'s claim is bound to.
async fn volume_of(s: &Stage, pod: &str) -> String {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(s.plane.client(), &s.namespace);
    let claim = claims.get(&format!("data-{pod}")).await.unwrap();
    claim.spec.unwrap().volume_name.unwrap()
}

async fn pod(s: &Stage, name: &str) -> Pod {
    s.api().get(name).await.unwrap()
}

fn write_keys(s: &Stage, pod: &str) {
    for i in 0..KEYS {
        let (k, v) = (format!("k{i}"), format!("v{i}"));
        s.cmd(pod, &["SET", &k, &v]).unwrap();
    }
}

fn count_keys(s: &Stage, pod: &str) -> usize {
    (0..KEYS)
        .filter(|i| {
            let got = s.cmd(pod, &["GET", &format!("k{i}")]).ok();
            got.and_then(|v| text(v).ok()) == Some(format!("v{i}"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_comes_back_on_its_node_with_its_volume_and_data() {
    // One pod, no replica: whatever it serves after the restart came from its disk.
    let s = Stage::start(StageOptions::replication("persist-repl", 0).persistent())
        .await
        .unwrap();
    let name = "valkey-0-0";
    let (node, volume) = (
        node_of(&pod(&s, name).await).unwrap().to_owned(),
        volume_of(&s, name).await,
    );
    assert!(
        volume.starts_with(&format!("local-{node}-")),
        "{volume} on {node}"
    );
    write_keys(&s, name);
    s.recycle(name, 120 * SECOND).await.unwrap();
    let back = pod(&s, name).await;
    assert_eq!(node_of(&back), Some(node.as_str()));
    assert_eq!(volume_of(&s, name).await, volume);
    assert_eq!(count_keys(&s, name), KEYS);
    s.wait_settled(1, 1, 60 * SECOND).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_cluster_node_comes_back_with_its_node_id() {
    // nodes.conf lives on the volume: the pod's Valkey is the same cluster node after its pod
    // was deleted and created again (with a new IP), and the cluster takes it back.
    let s = Stage::start(StageOptions::cluster("persist-cluster", 3, 1).persistent())
        .await
        .unwrap();
    let (_, replica) = s.primary_and_replica(0).unwrap();
    let id = |s: &Stage| text(s.cmd(&replica, &["CLUSTER", "MYID"]).unwrap()).unwrap();
    let before = id(&s);
    let node = node_of(&pod(&s, &replica).await).unwrap().to_owned();
    let ip_before = s.valkey(&replica).unwrap();
    s.recycle(&replica, 120 * SECOND).await.unwrap();
    assert_eq!(node_of(&pod(&s, &replica).await), Some(node.as_str()));
    assert_ne!(s.valkey(&replica).unwrap(), ip_before, "a new pod IP");
    assert_eq!(id(&s), before);
    s.wait_settled(6, 3, 120 * SECOND).await.unwrap();
    let info = text(s.cmd(&replica, &["CLUSTER", "INFO"]).unwrap()).unwrap();
    assert!(info.contains("cluster_state:ok"), "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_pod_shard_without_persistence_needs_its_record_removed_after_a_restart() {
    // The documented gap (docs/operations.md, "A shard of one pod"): the pod comes back empty, its
    // agent will not take back a claim made by an earlier run, and nobody else can. Its empty
    // master is not on record, so it is neither labelled nor Ready (no Service sends it clients,
    // no budget counts it). The documented way out works: remove the record and the pod
    // bootstraps a new one.
    let s = Stage::start(StageOptions::replication("one-pod-empty", 0))
        .await
        .unwrap();
    let name = "valkey-0-0";
    s.api().delete(name, &Default::default()).await.unwrap();
    s.wait_gone(name, 60 * SECOND).await.unwrap();
    s.wait_valkey_up(1, 120 * SECOND).await.unwrap();
    tokio::time::sleep(5 * SECOND).await;
    let pods = s.pod_objects().await.unwrap();
    assert!(
        !pods.iter().any(valkey_sidecar_testkit::k8s::pod_is_ready),
        "an empty master not on record is Ready"
    );
    let labels = s.labels(name).await.unwrap();
    assert_eq!(labels.get("valkey.io/role"), None, "{labels:?}");
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    leases
        .delete("valkey-0-primary", &Default::default())
        .await
        .unwrap();
    s.wait_settled(1, 1, 60 * SECOND).await.unwrap();
    s.cmd(name, &["SET", "after", "restart"]).unwrap();
}
