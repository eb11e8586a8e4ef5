//! The chart installed the ways platform teams install it, each followed by the same smoke
//! (`testkit::k8s::smoke`: `helm test`, a hand-over on cordon where the agents read Nodes, a
//! `kubectl drain` of a primary's node under a writer, nothing lost):
//! - on the oldest supported Kubernetes, 1.30 (kube-apiserver, scheduler and controller-manager
//!   built from Go modules like the default 1.37), in cluster mode 3×2 and replication mode 1×3,
//!   with `helm install` learning the API by discovery: no MutatingAdmissionPolicy there, so the
//!   chart leaves the node-index policy out and its notes say so;
//! - the `namespace` profile, installed by a user who holds only the built-in `admin` role in the
//!   namespace (impersonated; real RBAC on the apiserver), which the `cluster` profile's
//!   cluster-scoped objects would need more than;
//! - the `restricted` profile (no fixed user, group or fsGroup) in a namespace where Pod Security
//!   Admission enforces `restricted`, also installed by a namespace admin.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use serde_json::json;
use valkey_sidecar_testkit::k8s::chart::{self, CLUSTER_SCOPED_KINDS, documents, kind_of};
use valkey_sidecar_testkit::k8s::smoke::{self, SmokeReport};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, holder_pod, http_get, poll_until};

const SECOND: Duration = Duration::from_secs(1);
const ADMIN: &str = "ns-admin";

fn helm_installed(mut opts: StageOptions) -> StageOptions {
    opts.helm_install = true;
    opts
}

fn check(what: &str, report: &SmokeReport) {
    println!("{what}: {report:#?}");
    let moves = report.cordon.iter().chain([&report.drain]);
    for m in moves {
        assert!(m.acked > 50, "{what}: only {} writes acknowledged", m.acked);
        assert_eq!(m.lost, 0, "{what}: {m:?} lost acknowledged writes");
    }
    // The evicted primary's preStop returned because the hand-over was done, not on timeout.
    let prestop = report.drain.prestop.clone();
    assert_eq!(
        prestop,
        Some(Ok("HTTP 200".into())),
        "{what}: the drain's hand-over"
    );
    assert!(
        report.helm_test.contains("Succeeded"),
        "{}",
        report.helm_test
    );
}

/// The kinds of what the release rendered (`helm get manifest`).
fn release_kinds(stage: &Stage) -> Vec<String> {
    let kubeconfig = stage.plane.kubeconfig_path().display().to_string();
    let args = [
        "get",
        "manifest",
        &stage.release,
        "-n",
        &stage.namespace,
        "--kubeconfig",
        &kubeconfig,
    ];
    let manifest = chart::helm(&args.map(String::from)).unwrap();
    documents(&manifest)
        .iter()
        .filter_map(|d| kind_of(d).map(str::to_owned))
        .collect()
}

async fn apiserver_version(stage: &Stage) -> String {
    stage
        .plane
        .client()
        .apiserver_version()
        .await
        .unwrap()
        .git_version
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kubernetes_1_30_a_cluster_installs_hands_over_and_drains() {
    let opts = StageOptions::cluster("k130-cluster", 3, 2).kubernetes("1.30");
    let stage = Stage::start(helm_installed(opts)).await.unwrap();
    assert_eq!(apiserver_version(&stage).await, "v1.30.14");
    let kinds = release_kinds(&stage);
    assert!(
        !kinds.iter().any(|k| k == "MutatingAdmissionPolicy"),
        "{kinds:?}"
    );
    assert!(
        kinds.iter().any(|k| k == "ValidatingAdmissionPolicy"),
        "{kinds:?}"
    );
    let notes = stage.notes().unwrap();
    assert!(
        notes.contains("MutatingAdmissionPolicy v1 needs Kubernetes >= 1.36"),
        "{notes}"
    );
    let report = smoke::run(&stage, true).await.unwrap();
    check("1.30, cluster 3x2", &report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kubernetes_1_30_a_replicated_shard_installs_hands_over_and_drains() {
    let opts = StageOptions::replication("k130-repl", 2).kubernetes("1.30");
    let stage = Stage::start(helm_installed(opts)).await.unwrap();
    assert_eq!(apiserver_version(&stage).await, "v1.30.14");
    let report = smoke::run(&stage, true).await.unwrap();
    check("1.30, replication 1x3", &report);
}

/// What the agent in `pod` says is off (`/status`).
async fn off(stage: &Stage, pod: &str) -> String {
    let (code, body) = http_get(stage.agent(pod).unwrap(), "/status", 5 * SECOND)
        .await
        .unwrap();
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    status["off"].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_profile_installs_as_a_namespace_admin_and_hands_over_on_drain() {
    let opts = StageOptions::cluster("ns-profile", 3, 2)
        .set("profile=namespace")
        .as_namespace_admin(ADMIN);
    let stage = Stage::start(helm_installed(opts)).await.unwrap();
    let kinds = release_kinds(&stage);
    assert!(
        !kinds
            .iter()
            .any(|k| CLUSTER_SCOPED_KINDS.contains(&k.as_str())),
        "cluster-scoped objects in the namespace profile: {kinds:?}"
    );
    // Every agent said, and shows, that it runs without Nodes.
    poll_until(
        "the agents found Nodes unreadable",
        30 * SECOND,
        SECOND / 5,
        || async {
            let mut all = true;
            for pod in &stage.pods {
                all &= off(&stage, pod).await.contains("reading Nodes");
            }
            Ok(all)
        },
    )
    .await
    .unwrap();
    // Zones without Nodes: Kubernetes >= 1.35 copies the node's topology labels onto the pod at
    // binding, and the agents label their pods from them (scripts/test-k8s-version.sh runs this
    // on older releases too, which do not).
    let version = stage.plane.client().apiserver_version().await.unwrap();
    if version.minor.parse::<u32>().unwrap() >= 35 {
        let labelled = |pods: &[Pod]| {
            pods.iter()
                .all(|p| chart::label(p, "valkey.io/zone").is_some())
        };
        poll_until(
            "every pod's zone labelled",
            30 * SECOND,
            SECOND / 5,
            || async { Ok(labelled(&stage.pod_objects().await?)) },
        )
        .await
        .unwrap();
    }
    // The same user could not have installed the cluster profile: RBAC is real here.
    let refused = dry_run_as_admin(&stage, &[]).await;
    assert!(refused.contains("forbidden"), "{refused}");

    let report = smoke::run(&stage, false).await.unwrap();
    check("namespace profile, cluster 3x2", &report);
    helm_test_names_the_unready_shard(&stage).await;
}

/// The chart's default (`cluster`) profile rendered as another release and applied as the
/// namespace admin, server side and dry run: what the apiserver says.
async fn dry_run_as_admin(stage: &Stage, sets: &[String]) -> String {
    let rendered = chart::render("other", &stage.namespace, &[], sets).unwrap();
    let file = stage.plane.dir().join("cluster-profile.yaml");
    std::fs::write(&file, rendered).unwrap();
    let file = file.display().to_string();
    let args = [
        "apply",
        "--server-side",
        "--dry-run=server",
        "--as",
        ADMIN,
        "-f",
        &file,
    ];
    match stage.plane.kubectl(&args).await {
        Ok(out) => out,
        Err(e) => format!("{e:#}"),
    }
}

/// A replica that stops answering (SIGSTOP of its pod) turns `helm test` red, naming its shard.
async fn helm_test_names_the_unready_shard(stage: &Stage) {
    let holder = stage.coordinator_holder().await.unwrap().unwrap();
    let (_, replicas) = stage.primary_and_replicas(1).unwrap();
    let replica = replicas
        .into_iter()
        .find(|p| p != holder_pod(&holder))
        .unwrap();
    stage.kubelet.pause(&stage.namespace, &replica).unwrap();
    let unready = poll_until(
        "the paused replica unready",
        20 * SECOND,
        SECOND / 5,
        || async {
            let p: Pod = stage.api().get(&replica).await?;
            Ok(!valkey_sidecar_testkit::k8s::pod_is_ready(&p))
        },
    )
    .await;
    let tested = stage.helm_test().await;
    stage.kubelet.resume(&stage.namespace, &replica).unwrap();
    unready.unwrap();
    let said = format!(
        "{:#}",
        tested.expect_err("helm test passed with a paused replica")
    );
    println!("helm test with {replica} paused: {said}");
    assert!(
        said.contains(&format!("shard 1: not Ready: {replica}")),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restricted_profile_runs_under_pod_security_restricted() {
    let opts = StageOptions::replication("restricted", 2)
        .set("profile=restricted")
        .pod_security("restricted")
        .as_namespace_admin(ADMIN);
    let stage = Stage::start(helm_installed(opts)).await.unwrap();
    // Admission enforces the profile here: a pod that fails it is refused.
    let refused = create_unrestricted_pod(&stage).await;
    assert!(
        refused.contains("violates PodSecurity \"restricted"),
        "{refused}"
    );
    // Nothing in the release fixes a user, group or fsGroup.
    let manifest = std::fs::read_to_string(&stage.manifest).unwrap();
    for key in ["runAsUser", "runAsGroup", "fsGroup:"] {
        assert!(!manifest.contains(key), "{key} in the restricted profile");
    }
    let report = smoke::run(&stage, false).await.unwrap();
    check("restricted profile, replication 1x3", &report);
}

/// Creates (dry run) a pod without the restricted profile's settings; the apiserver's answer.
async fn create_unrestricted_pod(stage: &Stage) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "unrestricted" },
        "spec": { "containers": [{ "name": "c", "image": "pause:3.10" }] },
    }))
    .unwrap();
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match stage.api().create(&params, &pod).await {
        Ok(_) => "admitted".into(),
        Err(e) => e.to_string(),
    }
}
