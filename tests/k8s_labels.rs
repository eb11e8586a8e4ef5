//! Live pod labels end to end: the real control plane (kube-apiserver v1.37.2 with RBAC and the
//! chart's ValidatingAdmissionPolicy), the chart's pods placed by the real scheduler, the Valkey
//! Cluster the agents formed across them, and the agent beside each Valkey.
//!
//! Durations are printed, not asserted tightly; `scripts/bench.sh` measures distributions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use valkey_sidecar_testkit::faults::{self, Outcome, show};
use valkey_sidecar_testkit::k8s::{
    ControlPlaneOptions, ROLE_LABEL as ROLE, RoleWatch, Stage, StageOptions, poll_until,
};

const SHARD: &str = "valkey.io/shard-id";
const ZONE: &str = "valkey.io/zone";
const WRITES: &str = "valkey_sidecar_label_writes_total{result=\"ok\"}";
const SECOND: Duration = Duration::from_secs(1);

/// The chart's 3 × 2 cluster (the agents' coordinator forms it); no balance, so that nothing but
/// the tests' own role flips moves a primary.
fn options() -> StageOptions {
    StageOptions::cluster("labels", 3, 1).env("SIDECAR_BALANCE", "false")
}

fn node_zone(node: &str) -> String {
    // Fake nodes are named node-<zone letter><n>.
    format!("zone-{}", &node[5..6])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_follow_valkey_within_a_poll_and_write_once_per_change() {
    let s = Stage::start(options()).await.unwrap();
    s.wait_labels_true(20 * SECOND).await.unwrap();
    for p in &s.pods {
        let labels = s.labels(p).await.unwrap();
        let shard_id: String =
            redis::from_redis_value(s.cmd(p, &["CLUSTER", "MYSHARDID"]).unwrap()).unwrap();
        assert_eq!(Some(&shard_id), labels.get(SHARD));
        let node = s.node_of(p).await.unwrap();
        assert_eq!(labels.get(ZONE), Some(&node_zone(&node)), "{p} on {node}");
        let az: Vec<String> =
            redis::from_redis_value(s.cmd(p, &["CONFIG", "GET", "availability-zone"]).unwrap())
                .unwrap();
        assert_eq!(az[1], node_zone(&node));
        assert_eq!(
            labels.get("valkey.io/cluster").map(String::as_str),
            Some("valkey"),
            "operator labels untouched"
        );
    }
    println!(
        "{}",
        s.plane
            .kubectl(&[
                "get",
                "pods",
                "-n",
                &s.namespace,
                "-o",
                "wide",
                "-L",
                "valkey.io/role,valkey.io/shard-id,valkey.io/zone"
            ])
            .await
            .unwrap()
    );

    let (seen, watch) = RoleWatch::start(s.api(), ROLE);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for flip in 0..2 {
        let (primary, replica) = s.primary_and_replica(0).unwrap();
        let writes_before = s.agent_counter(&primary, WRITES).await.unwrap()
            + s.agent_counter(&replica, WRITES).await.unwrap();
        s.cmd(&replica, &["CLUSTER", "FAILOVER"]).unwrap();
        let mut valkey_flip = Instant::now();
        while s.role(&replica).as_deref() != Some("master") {
            valkey_flip = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let promoted = seen
            .wait(&replica, Some("primary"), valkey_flip, 5 * SECOND)
            .await
            .unwrap();
        let demoted = seen
            .wait(&primary, Some("replica"), valkey_flip, 5 * SECOND)
            .await
            .unwrap();
        tokio::time::sleep(SECOND).await;
        let writes = s.agent_counter(&primary, WRITES).await.unwrap()
            + s.agent_counter(&replica, WRITES).await.unwrap()
            - writes_before;
        println!(
            "flip {flip}: label primary on {replica} {:?} and replica on {primary} {:?} after Valkey reported the new role; {writes} label writes",
            promoted.duration_since(valkey_flip),
            demoted.duration_since(valkey_flip)
        );
        assert_eq!(writes, 2, "one write per pod whose role changed");
        assert!(promoted.duration_since(valkey_flip) < 3 * SECOND);
    }
    watch.abort();
    let events = s.events().await.unwrap();
    println!("{events}");
    assert!(
        events.contains("Promoted") && events.contains("Demoted"),
        "{events}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_loses_its_label_and_the_promoted_replica_gains_it() {
    let s = Stage::start(options()).await.unwrap();
    s.wait_labels_true(20 * SECOND).await.unwrap();
    let (primary, replica) = s.primary_and_replica(1).unwrap();
    let (seen, watch) = RoleWatch::start(s.api(), ROLE);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The primary's Valkey hangs (its agent runs on): longer than the chart's node timeout (5 s),
    // so Valkey Cluster promotes the replica; shorter than the liveness window (30 s), so the
    // kubelet does not restart it.
    let hung = Instant::now();
    s.signal_container(&primary, "valkey", "STOP").unwrap();
    let mut valkey_promoted = Instant::now();
    while s.role(&replica).as_deref() != Some("master") {
        assert!(
            hung.elapsed() < 20 * SECOND,
            "Valkey never promoted {replica}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        valkey_promoted = Instant::now();
    }
    let promoted = seen
        .wait(&replica, Some("primary"), hung, 20 * SECOND)
        .await
        .unwrap();
    let unlabelled = seen.wait(&primary, None, hung, 20 * SECOND).await.unwrap();
    println!(
        "primary hung: Valkey promoted {replica} after {:?} (node timeout 5 s), its label read primary {:?} later; {primary}'s role label removed after {:?}",
        valkey_promoted.duration_since(hung),
        promoted.saturating_duration_since(valkey_promoted),
        unlabelled.duration_since(hung)
    );
    assert!(promoted.saturating_duration_since(valkey_promoted) < 2 * SECOND);
    assert!(
        unlabelled < promoted,
        "the hung primary kept its label until another pod claimed it"
    );
    faults::record(
        &Outcome::new(module_path!(), "primary's Valkey hung (cluster mode, labels)")
            .recovery(promoted.duration_since(hung))
            .note(format!(
                "recovery: SIGSTOP of the primary's Valkey → the promoted replica labelled primary; Valkey Cluster promoted it after {} (node timeout 5 s), the label {} later; the hung pod's role label removed after {}; no writer",
                show(valkey_promoted.duration_since(hung)),
                show(promoted.saturating_duration_since(valkey_promoted)),
                show(unlabelled.duration_since(hung))
            )),
    );
    // Valkey wakes, learns of the newer epoch, rejoins as a replica, and the label says so.
    s.signal_container(&primary, "valkey", "CONT").unwrap();
    let rejoined = seen
        .wait(&primary, Some("replica"), unlabelled, 30 * SECOND)
        .await
        .unwrap();
    println!(
        "{primary} labelled replica again {:?} after the freeze began",
        rejoined.duration_since(hung)
    );
    assert_eq!(s.role(&primary).as_deref(), Some("slave"));
    watch.abort();
}

/// One standalone Valkey pod in replication mode: its labels once role, shard and zone are set,
/// the zone of its node, Valkey's `availability-zone`, and whether the pod carries topology labels.
async fn single_pod_zone(
    apiserver_args: Vec<String>,
    read_nodes: bool,
) -> (BTreeMap<String, String>, String, String, bool) {
    // The chart's one-pod shape (`examples/tiny.yaml`): replication mode, no replica. Without
    // `get nodes` the coordinator cannot run (values.yaml, `sidecar.readNodes`).
    let mut o = StageOptions::example("labels-zone", "tiny")
        .set(&format!("sidecar.readNodes={read_nodes}"))
        .env("SIDECAR_COORDINATOR", &read_nodes.to_string());
    o.plane = ControlPlaneOptions {
        apiserver_args,
        ..ControlPlaneOptions::default()
    };
    let s = Stage::start(o).await.unwrap();
    let name = s.pods[0].clone();
    poll_until("labels", 20 * SECOND, Duration::from_millis(50), || async {
        let l = s.labels(&name).await?;
        Ok(l.get(ROLE).map(String::as_str) == Some("primary")
            && l.contains_key(ZONE)
            && l.contains_key(SHARD))
    })
    .await
    .unwrap();
    let pod = s.api().get(&name).await.unwrap();
    let labels = pod.metadata.labels.unwrap();
    // The label and the push into Valkey come from the same placement, but from two tasks: the
    // observer pushes on its next tick, which may come after the label is written.
    let az = || -> Vec<String> {
        redis::from_redis_value(
            s.cmd(&name, &["CONFIG", "GET", "availability-zone"])
                .unwrap(),
        )
        .unwrap()
    };
    poll_until(
        "zone pushed",
        5 * SECOND,
        Duration::from_millis(20),
        || async { Ok(!az()[1].is_empty()) },
    )
    .await
    .unwrap();
    let az = az();
    let has_topology = labels.contains_key("topology.kubernetes.io/zone");
    (
        labels,
        node_zone(&pod.spec.unwrap().node_name.unwrap()),
        az[1].clone(),
        has_topology,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_from_the_pods_topology_labels_without_node_access() {
    // kube-apiserver copies the node's topology labels onto the pod (PodTopologyLabelsAdmission,
    // beta and on by default from 1.35); the agent needs no permission on Nodes then. Before 1.35
    // there is nothing to test: the plugin is absent (< 1.33), or an alpha that copies
    // `topology.k8s.io/*` keys, which no node carries (1.33, 1.34: its source says so).
    let minor = kubernetes_minor();
    if minor < 35 {
        println!("skipped: Kubernetes 1.{minor} copies no topology.kubernetes.io label onto pods");
        return;
    }
    let (labels, node_zone, valkey_zone, has_topology) = single_pod_zone(vec![], false).await;
    assert!(has_topology);
    assert_eq!(labels.get(ZONE), Some(&node_zone));
    assert_eq!(labels.get(SHARD).map(String::as_str), Some("valkey-0"));
    assert_eq!(valkey_zone, node_zone);
}

/// The minor of the Kubernetes the tests run (`kube-apiserver --version`: `Kubernetes v1.37.2`).
fn kubernetes_minor() -> u32 {
    let bin = valkey_sidecar_testkit::k8s::k8s_bin_dir()
        .unwrap()
        .join("kube-apiserver");
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split('.').nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_from_the_node_object() {
    // The gate exists from 1.33: off there by default.
    let gates = match kubernetes_minor() {
        33.. => vec!["--feature-gates=PodTopologyLabelsAdmission=false".to_string()],
        _ => vec![],
    };
    let (labels, node_zone, valkey_zone, has_topology) = single_pod_zone(gates, true).await;
    assert!(
        !has_topology,
        "the pod must not carry topology labels in this test"
    );
    assert_eq!(labels.get(ZONE), Some(&node_zone));
    assert_eq!(
        labels.get("valkey.io/region").map(String::as_str),
        Some("region-1")
    );
    assert_eq!(valkey_zone, node_zone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_apiserver_never_stalls_probes_and_labels_catch_up() {
    let s = Stage::start(options()).await.unwrap();
    s.wait_labels_true(20 * SECOND).await.unwrap();
    s.signal_apiserver("STOP").unwrap();
    // Valkey changes while the apiserver cannot answer.
    let (primary, replica) = s.primary_and_replica(2).unwrap();
    s.cmd(&replica, &["CLUSTER", "FAILOVER"]).unwrap();
    // Probes answer from the agent's cache: quickly, whatever the apiserver does. (The demoted
    // node resyncs, so its readiness may dip briefly; that is Valkey, not the apiserver.)
    let mut slowest = Duration::ZERO;
    let mut last = [0u16; 2];
    let start = Instant::now();
    while start.elapsed() < 3 * SECOND {
        for (i, pod) in [&primary, &replica].into_iter().enumerate() {
            let t = Instant::now();
            let (code, _) =
                valkey_sidecar_testkit::k8s::http_get(s.agent(pod).unwrap(), "/readyz", SECOND)
                    .await
                    .unwrap();
            slowest = slowest.max(t.elapsed());
            last[i] = code;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        last,
        [200, 200],
        "both pods ready again while the apiserver is still frozen"
    );
    let (_, status) =
        valkey_sidecar_testkit::k8s::http_get(s.agent(&replica).unwrap(), "/status", SECOND)
            .await
            .unwrap();
    assert!(status.contains("\"role\": \"primary\""), "{status}");
    println!("apiserver frozen 3 s: slowest /readyz {slowest:?}; /status already says primary");
    s.signal_apiserver("CONT").unwrap();
    let thawed = Instant::now();
    s.wait_labels_true(20 * SECOND).await.unwrap();
    println!(
        "labels true again {:?} after the apiserver resumed",
        thawed.elapsed()
    );
    assert!(slowest < SECOND);
}
