//! The process-backed kubelet's chaos helpers against a real control plane: crash and restart,
//! pause and resume, a cut node going Unknown and coming back, a node made NotReady, and an exec
//! preStop hook. Pods are bound directly (`nodeName`, no scheduler).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use valkey_sidecar_testkit::k8s::{
    ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions,
    pod_condition, poll_until, process_alive,
};

const NS: &str = "default";
const SECOND: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(50);

fn valkey_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                { "name": "valkey", "image": "valkey/valkey:9.1.2" },
                {
                    "name": "sidecar",
                    "image": "valkey-sidecar:dev",
                    "env": [
                        { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                        { "name": "VALKEY_ADDR", "value": "localhost:6379" },
                        { "name": "SIDECAR_MODE", "value": "replication" },
                        { "name": "SIDECAR_POLL_INTERVAL", "value": "100ms" },
                    ],
                    "readinessProbe": { "httpGet": { "path": "/readyz", "port": 9736 } },
                },
            ],
        },
    }))
    .unwrap()
}

async fn wait_pod(pods: &Api<Pod>, what: &str, cond: impl Fn(&Pod) -> bool) -> Duration {
    let start = Instant::now();
    poll_until(what, 20 * SECOND, POLL, || async {
        Ok(cond(&pods.get("chaos").await?))
    })
    .await
    .unwrap();
    start.elapsed()
}

async fn wait_node(nodes: &Api<Node>, name: &str, status: &str) -> Duration {
    let start = Instant::now();
    poll_until(
        &format!("{name} Ready={status}"),
        30 * SECOND,
        POLL,
        || async {
            let node = nodes.get(name).await?;
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready").map(|c| c.status));
            Ok(ready.as_deref() == Some(status))
        },
    )
    .await
    .unwrap();
    start.elapsed()
}

fn ready(pod: &Pod) -> bool {
    pod_condition(pod, "Ready") == Some(true)
}

fn restarts(pod: &Pod, container: &str) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == container))
        .map_or(-1, |c| c.restart_count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_pause_cut_node_and_exec_hooks() {
    let opts = ControlPlaneOptions {
        scheduler: false,
        node_monitor_grace_period: 5 * SECOND,
        ..ControlPlaneOptions::default()
    };
    let plane = ControlPlane::start(opts).await.unwrap();
    let node_opts = FakeNodesOptions {
        heartbeat: Duration::from_millis(500),
        ..FakeNodesOptions::default()
    };
    let nodes = FakeNodes::start(plane.client(), node_opts).await.unwrap();
    nodes.wait_ready(30 * SECOND).await.unwrap();
    let kubelet_opts = KubeletOptions {
        restart_backoff: Duration::from_millis(300),
        ..KubeletOptions::default().probe_period(Duration::from_millis(100))
    };
    let kubelet = Kubelet::start(&plane, &nodes, kubelet_opts).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(plane.client(), NS);
    let node_api: Api<Node> = Api::all(plane.client());
    pods.create(&PostParams::default(), &valkey_pod("chaos", "node-a1"))
        .await
        .unwrap();
    kubelet.wait_ready(NS, "chaos", 20 * SECOND).await.unwrap();

    // Crash: valkey dies behind Kubernetes' back; the kubelet restarts it.
    let old = kubelet.container_pid(NS, "chaos", "valkey").unwrap();
    kubelet.crash_container(NS, "chaos", "valkey").unwrap();
    let unready = wait_pod(&pods, "unready after crash", |p| !ready(p)).await;
    let back = wait_pod(&pods, "ready after restart", |p| {
        ready(p) && restarts(p, "valkey") == 1
    })
    .await;
    println!("crash: unready after {unready:?}, restarted and Ready {back:?} later");
    let new = kubelet.container_pid(NS, "chaos", "valkey").unwrap();
    assert_ne!(old, new);
    assert!(!process_alive(old));

    // Pause: probes time out.
    kubelet.pause(NS, "chaos").unwrap();
    let unready = wait_pod(&pods, "unready while paused", |p| !ready(p)).await;
    kubelet.resume(NS, "chaos").unwrap();
    let back = wait_pod(&pods, "ready after resume", ready).await;
    println!("pause: unready after {unready:?}; resume: Ready after {back:?}");

    // Cut node: processes gone, the node-lifecycle controller marks the node Unknown, the pod
    // object stays. Restored: heartbeat back, containers restarted.
    let pids = kubelet.pids(NS, "chaos");
    kubelet.cut_node("node-a1").unwrap();
    assert!(pids.iter().all(|p| !process_alive(*p)));
    let unknown = wait_node(&node_api, "node-a1", "Unknown").await;
    println!("cut node-a1: Ready=Unknown after {unknown:?} (grace 5 s)");
    // The node-lifecycle controller marks the pods of a dead node NotReady.
    wait_pod(&pods, "pod marked NotReady on the dead node", |p| !ready(p)).await;
    assert!(pods.get_opt("chaos").await.unwrap().is_some());
    kubelet.restore_node("node-a1").unwrap();
    let node_back = wait_node(&node_api, "node-a1", "True").await;
    let pod_back = wait_pod(&pods, "ready after restore", ready).await;
    println!("restore: node Ready after {node_back:?}, pod Ready {pod_back:?} later");

    // A node made NotReady on purpose, and back.
    nodes.set_ready("node-b1", false).await.unwrap();
    wait_node(&node_api, "node-b1", "False").await;
    nodes.set_ready("node-b1", true).await.unwrap();
    wait_node(&node_api, "node-b1", "True").await;

    // Set-up errors are reported and retried: a pod whose Secret does not exist yet.
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": { "name": "orphan" },
        "spec": {
            "nodeName": "node-c2",
            "containers": [{
                "name": "pause", "image": "registry.k8s.io/pause:3.10",
                "env": [{ "name": "PASSWORD",
                          "valueFrom": { "secretKeyRef": { "name": "late", "key": "password" } } }],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &orphan).await.unwrap();
    poll_until("set-up error reported", 20 * SECOND, POLL, || async {
        let pod = pods.get("orphan").await?;
        Ok(pod.status.and_then(|s| s.reason).as_deref() == Some("CreateContainerConfigError"))
    })
    .await
    .unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "late" }, "stringData": { "password": "pw" },
    }))
    .unwrap();
    Api::<Secret>::namespaced(plane.client(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let orphan = kubelet.wait_ready(NS, "orphan", 20 * SECOND).await.unwrap();
    assert_eq!(orphan.status.unwrap().reason, None, "the error is cleared");

    // A placeholder pod with an exec preStop hook.
    let placeholder: Pod = serde_json::from_value(json!({
        "metadata": { "name": "placeholder" },
        "spec": {
            "nodeName": "node-c1",
            "containers": [{
                "name": "pause", "image": "registry.k8s.io/pause:3.10",
                "env": [{ "name": "GREETING", "value": "bye" }],
                "lifecycle": { "preStop": { "exec": { "command": ["sh", "-c", "echo $GREETING"] } } },
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &placeholder)
        .await
        .unwrap();
    kubelet
        .wait_ready(NS, "placeholder", 20 * SECOND)
        .await
        .unwrap();
    pods.delete("placeholder", &DeleteParams::default())
        .await
        .unwrap();
    poll_until("placeholder removed", 20 * SECOND, POLL, || async {
        Ok(pods.get_opt("placeholder").await?.is_none())
    })
    .await
    .unwrap();
    let hook = kubelet
        .hook_runs()
        .into_iter()
        .find(|h| h.pod == "placeholder")
        .unwrap();
    assert_eq!(hook.result, Ok("exit 0 bye".to_string()), "{hook:?}");
}
