//! The process-backed kubelet against a real control plane: crash and restart, pause and resume,
//! a cut node going Unknown and coming back, a node made NotReady, and an exec preStop hook; and
//! the pod shape a Helm chart renders: init containers, the agent as a native sidecar, volumes
//! (a Secret's file reaching the agent through its environment), ordered termination. Pods are
//! bound directly (`nodeName`, no scheduler).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use valkey_sidecar_testkit::k8s::{
    ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions,
    http_get, pod_condition, poll_until, process_alive,
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

const SIDECAR_IMAGE: &str = "ghcr.io/valkey-sidecar/valkey-sidecar:dev";

/// A pod as a chart renders it with the agent as a native sidecar: a set-up init container the
/// harness cannot run (`busybox`), one it runs to completion (the agent's `--version`), the agent
/// (`restartPolicy: Always`) reading Valkey's password from a Secret volume, and Valkey taking the
/// same password from a `secretKeyRef`.
fn native_sidecar_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "app": "valkey" } },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 10,
            "volumes": [
                { "name": "auth", "secret": { "secretName": "valkey-auth",
                    "items": [{ "key": "password", "path": "password", "mode": 0o400 }] } },
                { "name": "podinfo", "downwardAPI": { "items": [
                    { "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } } ] } },
                { "name": "data", "emptyDir": {} },
            ],
            "initContainers": [
                {
                    "name": "chown", "image": "busybox:1.37",
                    "command": ["sh", "-c", "chown -R 999 /data"],
                    "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                },
                { "name": "version", "image": SIDECAR_IMAGE,
                  "command": ["valkey-sidecar"], "args": ["--version"] },
                {
                    "name": "agent",
                    "image": SIDECAR_IMAGE,
                    "restartPolicy": "Always",
                    "env": [
                        { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                        { "name": "VALKEY_ADDR", "value": "localhost:6379" },
                        { "name": "VALKEY_PASSWORD_FILE", "value": "/etc/valkey-auth/password" },
                        { "name": "SIDECAR_MODE", "value": "replication" },
                        { "name": "SIDECAR_POLL_INTERVAL", "value": "100ms" },
                    ],
                    "volumeMounts": [
                        { "name": "auth", "mountPath": "/etc/valkey-auth", "readOnly": true },
                        { "name": "podinfo", "mountPath": "/etc/podinfo" },
                    ],
                    // The main container waits for this: the agent listens (not /startupz, which
                    // needs Valkey, which is not started before the agent is).
                    "startupProbe": { "tcpSocket": { "port": 9736 }, "initialDelaySeconds": 1 },
                    "readinessProbe": { "httpGet": { "path": "/readyz", "port": 9736 } },
                    // Runs at deletion, beside Valkey's; the agent's SIGTERM waits for Valkey.
                    "lifecycle": { "preStop": { "httpGet": { "path": "/livez", "port": 9736 } } },
                },
            ],
            "containers": [{
                "name": "valkey",
                "image": "valkey/valkey:9.1.2",
                "env": [{ "name": "VALKEY_PASSWORD",
                          "valueFrom": { "secretKeyRef": { "name": "valkey-auth", "key": "password" } } }],
                "args": ["--requirepass", "$(VALKEY_PASSWORD)"],
                "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                "lifecycle": { "preStop": { "sleep": { "seconds": 1 } } },
            }],
        },
    }))
    .unwrap()
}

fn init_status(pod: &Pod, container: &str) -> k8s_openapi::api::core::v1::ContainerStatus {
    pod.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == container).cloned())
        .unwrap_or_else(|| panic!("no init container status {container}: {:?}", pod.status))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_sidecar_volumes_and_ordered_termination() {
    let opts = ControlPlaneOptions {
        scheduler: false,
        ..ControlPlaneOptions::default()
    };
    let plane = ControlPlane::start(opts).await.unwrap();
    let nodes = FakeNodes::start(plane.client(), FakeNodesOptions::default())
        .await
        .unwrap();
    nodes.wait_ready(30 * SECOND).await.unwrap();
    let kubelet_opts = KubeletOptions {
        restart_backoff: Duration::from_millis(300),
        volume_refresh: Duration::from_millis(300),
        ..KubeletOptions::default().probe_period(Duration::from_millis(100))
    };
    let kubelet = Kubelet::start(&plane, &nodes, kubelet_opts).await.unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "valkey-auth" }, "stringData": { "password": "s3cret-pw" },
    }))
    .unwrap();
    Api::<Secret>::namespaced(plane.client(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(plane.client(), NS);
    pods.create(
        &PostParams::default(),
        &native_sidecar_pod("native", "node-b1"),
    )
    .await
    .unwrap();
    let pod = kubelet.wait_ready(NS, "native", 30 * SECOND).await.unwrap();

    // Init order: `chown` skipped as completed, `version` ran to completion, then the agent, and
    // Valkey only once the agent's startup probe passed (1 s initial delay).
    let chown = init_status(&pod, "chown");
    let skipped = chown.state.unwrap().terminated.unwrap();
    assert_eq!(skipped.exit_code, 0);
    assert!(skipped.message.unwrap().contains("busybox"));
    let version = init_status(&pod, "version")
        .state
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (version.exit_code, version.reason.as_deref()),
        (0, Some("Completed"))
    );
    let agent = init_status(&pod, "agent");
    assert!(agent.ready && agent.started == Some(true), "{agent:?}");
    assert_eq!(pod_condition(&pod, "Initialized"), Some(true));
    let started = |c: &str| {
        let starts = kubelet.starts();
        let at = starts
            .iter()
            .filter(|s| s.pod == "native" && s.container == c);
        at.map(|s| s.at).collect::<Vec<_>>()
    };
    assert!(started("chown").is_empty(), "busybox is not run");
    let (version_at, agent_at, valkey_at) = (
        started("version")[0],
        started("agent")[0],
        started("valkey")[0],
    );
    assert!(version_at < agent_at && agent_at < valkey_at);
    let waited = valkey_at - agent_at;
    assert!(
        waited >= SECOND,
        "Valkey started {waited:?} after the agent"
    );
    println!("init: agent started, Valkey {waited:?} later (the agent's startup probe)");

    // The Secret reached the agent as a file through its environment: Ready means it observed
    // Valkey, which refuses every command without the password.
    let ip = kubelet.pod_ip(NS, "native").unwrap();
    let (code, body) = http_get((ip, 9736).into(), "/status", SECOND)
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"primary\""), "{body}");
    let auth = kubelet.volume_dir(NS, "native", "auth").unwrap();
    assert_eq!(
        std::fs::read_to_string(auth.join("password")).unwrap(),
        "s3cret-pw"
    );
    let podinfo = kubelet.volume_dir(NS, "native", "podinfo").unwrap();
    let labels = std::fs::read_to_string(podinfo.join("labels")).unwrap();
    assert!(labels.lines().any(|l| l == "app=\"valkey\""), "{labels}");
    // Volumes follow their sources: a new label reaches the downward-API file.
    let label = json!({ "metadata": { "labels": { "tier": "cache" } } });
    pods.patch("native", &PatchParams::default(), &Patch::Merge(label))
        .await
        .unwrap();
    poll_until(
        "label in the downward-API file",
        10 * SECOND,
        POLL,
        || async {
            let labels = std::fs::read_to_string(podinfo.join("labels"))?;
            Ok(labels.lines().any(|l| l == "tier=\"cache\""))
        },
    )
    .await
    .unwrap();
    // The ServiceAccount admission plugin's projected volume: token, CA and namespace.
    let volumes = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap();
    let api_access = volumes
        .iter()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .unwrap();
    let dir = kubelet.volume_dir(NS, "native", &api_access.name).unwrap();
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    assert_eq!(token.split('.').count(), 3, "a JWT");
    let ca = std::fs::read_to_string(dir.join("ca.crt")).unwrap();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(std::fs::read_to_string(dir.join("namespace")).unwrap(), NS);

    // A crashed native sidecar is restarted; the main container is left alone.
    let valkey_pid = kubelet.container_pid(NS, "native", "valkey").unwrap();
    kubelet.crash_container(NS, "native", "agent").unwrap();
    poll_until(
        "agent restarted and the pod Ready",
        20 * SECOND,
        POLL,
        || async {
            let pod = pods.get("native").await?;
            Ok(ready(&pod) && init_status(&pod, "agent").restart_count == 1)
        },
    )
    .await
    .unwrap();
    assert_eq!(started("agent").len(), 2);
    assert_eq!(
        kubelet.container_pid(NS, "native", "valkey"),
        Some(valkey_pid)
    );

    // Deletion: both preStop hooks start at once; Valkey gets SIGTERM after its own hook, the
    // agent only after Valkey has exited.
    let pids = kubelet.pids(NS, "native");
    pods.delete("native", &DeleteParams::default())
        .await
        .unwrap();
    poll_until("native removed", 20 * SECOND, POLL, || async {
        Ok(pods.get_opt("native").await?.is_none())
    })
    .await
    .unwrap();
    assert!(pids.iter().all(|p| !process_alive(*p)));
    let hooks = kubelet.hook_runs();
    let hook = |c: &str| {
        let found = hooks.iter().find(|h| h.pod == "native" && h.container == c);
        found.cloned().unwrap()
    };
    let (valkey_hook, agent_hook) = (hook("valkey"), hook("agent"));
    assert_eq!(
        agent_hook.result.as_deref(),
        Ok("HTTP 200"),
        "{agent_hook:?}"
    );
    let stops = kubelet.stops();
    let stop = |c: &str| {
        let found = stops.iter().find(|s| s.pod == "native" && s.container == c);
        found.cloned().unwrap()
    };
    let (valkey_stop, agent_stop) = (stop("valkey"), stop("agent"));
    assert!(valkey_stop.graceful && agent_stop.graceful, "{stops:?}");
    assert!(
        valkey_hook.at + valkey_hook.took <= valkey_stop.at,
        "hook, then SIGTERM"
    );
    assert!(
        agent_hook.at < valkey_stop.at,
        "the sidecar's hook runs at deletion"
    );
    let valkey_exit = valkey_stop.at + valkey_stop.took;
    assert!(
        valkey_exit <= agent_stop.at,
        "the sidecar's SIGTERM waits for Valkey"
    );
    println!(
        "termination: Valkey preStop {:?}, SIGTERM to exit {:?}; agent SIGTERM {:?} after Valkey exited",
        valkey_hook.took,
        valkey_stop.took,
        agent_stop.at - valkey_exit
    );
}
