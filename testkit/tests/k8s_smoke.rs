//! The Kubernetes harness end to end: a real control plane (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager v1.37.2), fake nodes, and the chart's one-pod shape
//! (`examples/tiny.yaml`): the StatefulSet controller creates the pod, the real scheduler places
//! it, the kubelet runs its `valkey-server` and `valkey-sidecar` processes.
//!
//! Needs the control-plane binaries (`scripts/k8s-bins.sh`, built on first use), helm and the agent
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
    ControlPlane, ControlPlaneOptions, LIMITED_USER, Stage, StageOptions, ZONE_LABEL, http_get,
    pod_is_ready, process_alive,
};

const NS: &str = "smoke";
/// The rbac test's namespace.
const DEFAULT_NS: &str = "default";
const POD: &str = "valkey-0-0";
const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_pod_is_scheduled_runs_becomes_ready_and_stops_gracefully() {
    let t0 = Instant::now();
    let stage = Stage::install(StageOptions::example(NS, "tiny"))
        .await
        .unwrap();
    println!("control plane up: {:?}", stage.plane.timings());
    let listed = Api::<Node>::all(stage.plane.client())
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
    let kubelet = &stage.kubelet;
    let pod = stage.wait_ready(1, 60 * SECOND).await;
    let pod = pod.unwrap_or_else(|e| {
        panic!(
            "{e:#}\n{}\n{}",
            kubelet.container_log(NS, POD, "valkey-sidecar", 30),
            kubelet.container_log(NS, POD, "valkey", 30)
        )
    });
    let pod = pod.into_iter().next().unwrap();
    println!(
        "chart applied -> pod Ready (created, scheduled, started, /readyz 200): {:?}",
        t0.elapsed()
    );

    // The real scheduler bound it to a fake node; the kubelet reported it like a kubelet: the
    // agent and valkey-settings as started native sidecars (init containers), Valkey as the main
    // container.
    let spec = pod.spec.as_ref().unwrap();
    let node = spec.node_name.clone().expect("scheduled");
    assert!(stage.nodes.get(&node).is_some(), "{node} is a fake node");
    let status = pod.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let ip = kubelet.pod_ip(NS, POD).unwrap();
    assert_eq!(status.pod_ip.as_deref(), Some(ip.to_string().as_str()));
    let containers = status.container_statuses.as_ref().unwrap();
    let inits = status.init_container_statuses.as_ref().unwrap();
    assert_eq!((containers.len(), inits.len()), (1, 3));
    // valkey-config wrote the file Valkey includes and exited 0; the agent and valkey-settings run
    // beside Valkey.
    let (done, sidecars): (Vec<_>, Vec<_>) = inits.iter().partition(|c| c.name == "valkey-config");
    let exit = done[0].state.as_ref().and_then(|s| s.terminated.as_ref());
    assert_eq!(exit.map(|t| t.exit_code), Some(0), "{done:?}");
    assert!(
        containers
            .iter()
            .chain(sidecars)
            .all(|c| c.ready && c.started == Some(true))
    );
    assert!(pod_is_ready(&pod));

    // The agent got the downward-API environment and answers on the pod IP.
    let probe: SocketAddr = (ip, 9736).into();
    let (code, body) = http_get(probe, "/status", SECOND).await.unwrap();
    assert_eq!(code, 200);
    let agent: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(agent["pod"], POD);
    assert_eq!(agent["namespace"], NS);
    assert_eq!(agent["node"], node.as_str());
    assert_eq!(agent["role"], "primary");

    // Its kubeconfig carries a real token of the chart's ServiceAccount, bound to this pod.
    let kubeconfig = kubelet.pod_kubeconfig(NS, POD).unwrap();
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
        Some("system:serviceaccount:smoke:valkey-sidecar")
    );
    let bound_pod = &user.extra.unwrap()["authentication.kubernetes.io/pod-name"];
    assert_eq!(bound_pod, &[POD.to_string()]);

    // Deletion: Valkey's preStop wait (a primary nothing can take over from: it ends at once),
    // SIGTERM to Valkey, then to the native sidecars, and the object goes away.
    let pids = kubelet.pids(NS, POD);
    assert_eq!(pids.len(), 3, "Valkey, the agent, valkey-settings");
    let deleting = Instant::now();
    stage
        .api()
        .delete(POD, &DeleteParams::default())
        .await
        .unwrap();
    stage.wait_gone(POD, 30 * SECOND).await.unwrap();
    println!(
        "delete -> object gone (preStop + SIGTERM): {:?}",
        deleting.elapsed()
    );
    let hooks = kubelet.hook_runs();
    let pre_stop = hooks
        .iter()
        .find(|h| h.pod == POD && h.hook == "preStop")
        .expect("preStop ran");
    assert_eq!(pre_stop.container, "valkey");
    assert_eq!(pre_stop.result.as_deref(), Ok("HTTP 200"), "{pre_stop:?}");
    assert!(
        pre_stop.action.contains(&format!("{ip}:9736/prestop")),
        "{pre_stop:?}"
    );
    let stops: Vec<_> = kubelet
        .stops()
        .into_iter()
        .filter(|s| s.pod == POD)
        .collect();
    assert_eq!(stops.len(), 3, "{stops:?}");
    assert!(
        stops.iter().all(|s| s.graceful),
        "SIGTERM sufficed: {stops:?}"
    );
    assert_eq!(
        stops[0].container, "valkey",
        "Valkey stops first: {stops:?}"
    );
    println!("stops: {stops:?}");
    assert!(pids.iter().all(|p| !process_alive(*p)));

    // Teardown leaves no process behind.
    let mut all = stage.plane.pids();
    all.extend(kubelet.all_pids());
    drop(stage);
    assert!(
        all.iter().all(|p| !process_alive(*p)),
        "leaked: {:?}",
        all.iter()
            .filter(|p| process_alive(**p))
            .collect::<Vec<_>>()
    );
    println!("whole test: {:?}", t0.elapsed());
}

/// A pod to patch: nothing runs it (no kubelet), only its labels matter.
fn placeholder_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "containers": [{ "name": "c", "image": "registry.k8s.io/pause:3.10" }] },
    }))
    .unwrap()
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
    Api::<ServiceAccount>::namespaced(admin.clone(), DEFAULT_NS)
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin, DEFAULT_NS);
    pods.create(&PostParams::default(), &placeholder_pod("target"))
        .await
        .unwrap();
    let patch = Patch::Merge(json!({ "metadata": { "labels": { "valkey.io/role": "primary" } } }));

    let limited = plane
        .client_for_token(plane.token(LIMITED_USER).unwrap())
        .await
        .unwrap();
    let refused = Api::<Pod>::namespaced(limited, DEFAULT_NS)
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
    // The release scripts/k8s-bins.sh pinned (v1.37.2 unless K8S_VERSION chose another), as the
    // binary itself says: `Kubernetes v1.37.2`.
    let bin = valkey_sidecar_testkit::k8s::k8s_bin_dir()
        .unwrap()
        .join("kube-apiserver");
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .unwrap();
    let pinned = String::from_utf8_lossy(&out.stdout)
        .trim()
        .replace("Kubernetes ", "");
    if std::env::var_os("K8S_VERSION").is_none() {
        assert_eq!(pinned, "v1.37.2", "the default release");
    }
    let version = plane.client().apiserver_version().await.unwrap();
    assert_eq!(version.git_version, pinned);
    let kubectl = plane.kubectl(&["version", "-o", "json"]).await.unwrap();
    let kubectl: serde_json::Value = serde_json::from_str(&kubectl).unwrap();
    assert_eq!(kubectl["serverVersion"]["gitVersion"], pinned.as_str());
    assert_eq!(kubectl["clientVersion"]["gitVersion"], pinned.as_str());
}
