//! The Kubernetes harness end to end: a real control plane (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager v1.37.2), fake nodes, and a pod of real `valkey-server` and
//! `valkey-sidecar` processes scheduled by the real scheduler.
//!
//! Needs the control-plane binaries (`scripts/k8s-bins.sh`, built on first use) and the agent
//! binary (`cargo test --workspace` builds it; see `k8s::sidecar_bin`). Durations are printed (run
//! with `--nocapture`), not asserted tightly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use valkey_sidecar_testkit::k8s::{
    ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions,
    LIMITED_USER, ZONE_LABEL, http_get, pod_is_ready, poll_until, process_alive,
};

const NS: &str = "default";
const SECOND: Duration = Duration::from_secs(1);

/// A Valkey pod as a chart would write it: valkey + the agent, probes and a preStop hook on the
/// agent. No `nodeName`: the scheduler places it.
fn valkey_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "app.kubernetes.io/name": "valkey" } },
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "containers": [
                {
                    "name": "valkey",
                    "image": "valkey/valkey:9.1.2",
                    "args": ["--port", "6379"],
                    "ports": [{ "name": "valkey", "containerPort": 6379 }],
                },
                {
                    "name": "sidecar",
                    "image": "ghcr.io/valkey-sidecar/valkey-sidecar:dev",
                    "ports": [{ "name": "probe", "containerPort": 9736 }],
                    "env": [
                        { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                        { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                        { "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } },
                        { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                        { "name": "VALKEY_ADDR", "value": "127.0.0.1:6379" },
                        { "name": "SIDECAR_MODE", "value": "replication" },
                        { "name": "SIDECAR_POLL_INTERVAL", "value": "100ms" },
                    ],
                    "readinessProbe": { "httpGet": { "path": "/readyz", "port": "probe" }, "periodSeconds": 1 },
                    "livenessProbe": { "httpGet": { "path": "/livez", "port": 9736 }, "failureThreshold": 10 },
                    "lifecycle": { "preStop": { "httpGet": { "path": "/livez", "port": 9736 } } },
                },
            ],
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_is_scheduled_runs_becomes_ready_and_stops_gracefully() {
    let t0 = Instant::now();
    let plane = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .unwrap();
    println!("control plane up: {:?}", plane.timings());
    let nodes = FakeNodes::start(plane.client(), FakeNodesOptions::default())
        .await
        .unwrap();
    nodes.wait_ready(30 * SECOND).await.unwrap();
    println!("6 nodes Ready after {:?}", t0.elapsed());
    let listed = Api::<Node>::all(plane.client())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 6);
    let mut zones: Vec<_> = listed
        .items
        .iter()
        .map(|n| n.metadata.labels.as_ref().unwrap()[ZONE_LABEL].clone())
        .collect();
    zones.sort();
    zones.dedup();
    assert_eq!(zones, ["zone-a", "zone-b", "zone-c"]);

    let kubelet = Kubelet::start(&plane, &nodes, KubeletOptions::default())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(plane.client(), NS);
    let created = Instant::now();
    pods.create(&PostParams::default(), &valkey_pod("smoke"))
        .await
        .unwrap();
    let pod = kubelet.wait_ready(NS, "smoke", 30 * SECOND).await;
    let pod = pod.unwrap_or_else(|e| {
        panic!(
            "{e:#}\n{}\n{}",
            kubelet.container_log(NS, "smoke", "sidecar", 30),
            kubelet.container_log(NS, "smoke", "valkey", 30)
        )
    });
    println!(
        "pod created -> Ready (scheduled, started, /readyz 200): {:?}",
        created.elapsed()
    );

    // The real scheduler bound it to a fake node; the kubelet reported it like a kubelet.
    let spec = pod.spec.as_ref().unwrap();
    let node = spec.node_name.clone().expect("scheduled");
    assert!(nodes.get(&node).is_some(), "{node} is a fake node");
    let status = pod.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let ip = kubelet.pod_ip(NS, "smoke").unwrap();
    assert_eq!(status.pod_ip.as_deref(), Some(ip.to_string().as_str()));
    let containers = status.container_statuses.as_ref().unwrap();
    assert_eq!(containers.len(), 2);
    assert!(
        containers
            .iter()
            .all(|c| c.ready && c.started == Some(true))
    );
    assert!(pod_is_ready(&pod));

    // The agent got the downward-API environment and answers on the pod IP.
    let probe: SocketAddr = (ip, 9736).into();
    let (code, body) = http_get(probe, "/status", SECOND).await.unwrap();
    assert_eq!(code, 200);
    let agent: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(agent["pod"], "smoke");
    assert_eq!(agent["namespace"], NS);
    assert_eq!(agent["node"], node.as_str());
    assert_eq!(agent["role"], "primary");

    // Its kubeconfig carries a real ServiceAccount token bound to this pod.
    let kubeconfig = kubelet.pod_kubeconfig(NS, "smoke").unwrap();
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&text).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let as_pod = kube::Client::try_from(config).unwrap();
    let review: SelfSubjectReview = Api::all(as_pod)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({})).unwrap(),
        )
        .await
        .unwrap();
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:default")
    );
    let bound_pod = &user.extra.unwrap()["authentication.kubernetes.io/pod-name"];
    assert_eq!(bound_pod, &["smoke".to_string()]);

    // Deletion: preStop hook, SIGTERM, the object goes away.
    let pids = kubelet.pids(NS, "smoke");
    assert_eq!(pids.len(), 2);
    let deleting = Instant::now();
    pods.delete("smoke", &DeleteParams::default())
        .await
        .unwrap();
    poll_until(
        "pod object removed",
        20 * SECOND,
        Duration::from_millis(50),
        || async { Ok(pods.get_opt("smoke").await?.is_none()) },
    )
    .await
    .unwrap();
    println!(
        "delete -> object gone (preStop + SIGTERM): {:?}",
        deleting.elapsed()
    );
    let hooks = kubelet.hook_runs();
    let pre_stop = hooks
        .iter()
        .find(|h| h.pod == "smoke" && h.hook == "preStop")
        .expect("preStop ran");
    assert_eq!(pre_stop.container, "sidecar");
    assert_eq!(pre_stop.result.as_deref(), Ok("HTTP 200"), "{pre_stop:?}");
    assert!(
        pre_stop.action.ends_with(&format!("{ip}:9736/livez")),
        "{pre_stop:?}"
    );
    let stops = kubelet.stops();
    assert_eq!(stops.len(), 2, "{stops:?}");
    assert!(
        stops.iter().all(|s| s.graceful),
        "SIGTERM sufficed: {stops:?}"
    );
    println!("stops: {stops:?}");
    assert!(pids.iter().all(|p| !process_alive(*p)));

    // Teardown leaves no process behind.
    let mut all = plane.pids();
    all.extend(kubelet.all_pids());
    drop(kubelet);
    drop(nodes);
    drop(plane);
    assert!(
        all.iter().all(|p| !process_alive(*p)),
        "leaked: {:?}",
        all.iter()
            .filter(|p| process_alive(**p))
            .collect::<Vec<_>>()
    );
    println!("whole test: {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_refuses_an_identity_without_patch_pods() {
    let plane = ControlPlane::start(ControlPlaneOptions::apiserver_only())
        .await
        .unwrap();
    let admin = plane.client();
    // Without the controller-manager nobody creates the `default` ServiceAccount that pod
    // admission requires.
    let account: ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": "default" } })).unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin, NS);
    pods.create(&PostParams::default(), &valkey_pod("target"))
        .await
        .unwrap();
    let patch = Patch::Merge(json!({ "metadata": { "labels": { "valkey.io/role": "primary" } } }));

    let limited = plane
        .client_for_token(plane.token(LIMITED_USER).unwrap())
        .await
        .unwrap();
    let refused = Api::<Pod>::namespaced(limited, NS)
        .patch("target", &PatchParams::default(), &patch)
        .await;
    match refused {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
    let patched = pods
        .patch("target", &PatchParams::default(), &patch)
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.labels.unwrap()["valkey.io/role"],
        "primary"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_reports_the_pinned_release() {
    let plane = ControlPlane::start(ControlPlaneOptions::apiserver_only())
        .await
        .unwrap();
    println!("etcd + apiserver up: {:?}", plane.timings());
    let version = plane.client().apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.37.2");
    let kubectl = plane.kubectl(&["version", "-o", "json"]).await.unwrap();
    let kubectl: serde_json::Value = serde_json::from_str(&kubectl).unwrap();
    assert_eq!(kubectl["serverVersion"]["gitVersion"], "v1.37.2");
    assert_eq!(kubectl["clientVersion"]["gitVersion"], "v1.37.2");
}
