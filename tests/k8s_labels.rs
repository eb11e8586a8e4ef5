//! Live pod labels end to end: the real control plane (kube-apiserver v1.37.2 with RBAC and the
//! chart's ValidatingAdmissionPolicy), process-backed pods placed by the real scheduler, a real
//! Valkey Cluster across them, and the agent beside each Valkey.
//!
//! Durations are printed, not asserted tightly; `scripts/bench.sh` measures distributions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use valkey_sidecar_testkit::k8s::valkey::{
    SIDECAR_PORT, ValkeyPodTemplate, cmd, form_cluster, valkey_pod, wait_valkey_up,
};
use valkey_sidecar_testkit::k8s::{
    ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions,
    http_get, poll_until,
};

const NS: &str = "labels";
const SA: &str = "valkey";
const CLUSTER: &str = "valkey";
const ROLE: &str = "valkey.io/role";
const SHARD: &str = "valkey.io/shard-id";
const ZONE: &str = "valkey.io/zone";
const SECOND: Duration = Duration::from_secs(1);

/// A running stage: control plane, six nodes over three zones, the kubelet, and 3 shards × 2
/// pods forming a Valkey Cluster. Dropped in reverse order of creation.
struct Stage {
    kubelet: Kubelet,
    _nodes: FakeNodes,
    plane: ControlPlane,
    pods: Vec<String>,
}

fn helm() -> String {
    std::env::var("HELM_BIN").unwrap_or_else(|_| {
        let out =
            std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/helm-bin.sh"))
                .output()
                .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
}

/// RBAC and the admission policy exactly as the chart renders them.
async fn install_chart_rbac(plane: &ControlPlane, read_nodes: bool) {
    plane.kubectl(&["create", "namespace", NS]).await.unwrap();
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/valkey-sidecar");
    let out = std::process::Command::new(helm())
        .args([
            "template",
            CLUSTER,
            chart,
            "--namespace",
            NS,
            "--set",
            &format!("sidecar.serviceAccount.name={SA}"),
            "--set",
            &format!("sidecar.readNodes={read_nodes}"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = plane.dir().join(format!("chart-{read_nodes}.yaml"));
    std::fs::write(&file, &out.stdout).unwrap();
    plane
        .kubectl(&["apply", "--server-side", "-f", file.to_str().unwrap()])
        .await
        .unwrap();
}

fn template() -> ValkeyPodTemplate {
    ValkeyPodTemplate {
        cluster: CLUSTER.into(),
        service_account: SA.into(),
        // Labels only: the coordinator is tested on its own.
        sidecar_env: vec![("SIDECAR_COORDINATOR".into(), "false".into())],
        ..ValkeyPodTemplate::default()
    }
}

async fn stage(kubelet_opts: KubeletOptions) -> Stage {
    let plane = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .unwrap();
    let nodes = FakeNodes::start(plane.client(), FakeNodesOptions::default())
        .await
        .unwrap();
    nodes.wait_ready(30 * SECOND).await.unwrap();
    let opts = kubelet_opts
        .sidecar_bin(env!("CARGO_BIN_EXE_valkey-sidecar"))
        .probe_period(Duration::from_millis(200));
    let kubelet = Kubelet::start(&plane, &nodes, opts).await.unwrap();
    install_chart_rbac(&plane, true).await;
    let api: Api<Pod> = Api::namespaced(plane.client(), NS);
    let t = template();
    let mut pods = Vec::new();
    for shard in 0..3 {
        for member in 0..2 {
            let pod = valkey_pod(&t, shard, member).unwrap();
            pods.push(
                api.create(&PostParams::default(), &pod)
                    .await
                    .unwrap()
                    .metadata
                    .name
                    .unwrap(),
            );
        }
    }
    let addrs = wait_valkey_up(&api, &pods, 60 * SECOND).await.unwrap();
    form_cluster(addrs.chunks(2).map(<[_]>::to_vec).collect(), 30 * SECOND)
        .await
        .unwrap();
    for p in &pods {
        kubelet.wait_ready(NS, p, 60 * SECOND).await.unwrap();
    }
    Stage {
        kubelet,
        _nodes: nodes,
        plane,
        pods,
    }
}

impl Stage {
    fn api(&self) -> Api<Pod> {
        Api::namespaced(self.plane.client(), NS)
    }

    fn valkey(&self, pod: &str) -> SocketAddr {
        SocketAddr::new(self.kubelet.pod_ip(NS, pod).unwrap().into(), 6379)
    }

    fn role(&self, pod: &str) -> Option<String> {
        let v = cmd(self.valkey(pod), &["ROLE"]).ok()?;
        let redis::Value::Array(items) = v else {
            return None;
        };
        match items.first()? {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    async fn labels(&self, pod: &str) -> BTreeMap<String, String> {
        self.api()
            .get(pod)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default()
    }

    /// `valkey_sidecar_label_writes_total{result="ok"}` of one pod's agent.
    async fn label_writes(&self, pod: &str) -> u64 {
        let addr = SocketAddr::new(self.kubelet.pod_ip(NS, pod).unwrap().into(), SIDECAR_PORT);
        let (code, metrics) = http_get(addr, "/metrics", 2 * SECOND).await.unwrap();
        assert_eq!(code, 200, "{metrics}");
        let line = metrics
            .lines()
            .find_map(|l| l.strip_prefix("valkey_sidecar_label_writes_total{result=\"ok\"} "));
        line.unwrap_or_else(|| panic!("no label write counter in:\n{metrics}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// Waits until every pod's role label equals what its Valkey says and shard/zone are set.
    async fn wait_labels_true(&self, timeout: Duration) {
        poll_until(
            "labels match valkey",
            timeout,
            Duration::from_millis(50),
            || async {
                for p in &self.pods {
                    let want = match self.role(p).as_deref() {
                        Some("master") => "primary",
                        Some("slave") => "replica",
                        _ => return Ok(false),
                    };
                    let labels = self.labels(p).await;
                    if labels.get(ROLE).map(String::as_str) != Some(want)
                        || !labels.contains_key(SHARD)
                        || !labels.contains_key(ZONE)
                    {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
        .await
        .unwrap();
    }
}

/// Role-label values seen through a watch, with arrival time, per pod.
type Seen = Arc<Mutex<Vec<(Instant, String, Option<String>)>>>;

fn watch_roles(api: Api<Pod>) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(pod)) = stream.next().await {
            let role = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ROLE).cloned());
            sink.lock().unwrap().push((
                Instant::now(),
                pod.metadata.name.unwrap_or_default(),
                role,
            ));
        }
    });
    (seen, task)
}

/// When the watch first showed `pod` with role `want` at or after `since`.
fn seen_at(seen: &Seen, pod: &str, want: Option<&str>, since: Instant) -> Option<Instant> {
    seen.lock()
        .unwrap()
        .iter()
        .find(|(t, p, r)| *t >= since && p == pod && r.as_deref() == want)
        .map(|(t, _, _)| *t)
}

async fn wait_seen(
    seen: &Seen,
    pod: &str,
    want: Option<&str>,
    since: Instant,
    timeout: Duration,
) -> Instant {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(t) = seen_at(seen, pod, want, since) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{pod} never showed role {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_follow_valkey_within_a_poll_and_write_once_per_change() {
    let s = stage(KubeletOptions::default()).await;
    s.wait_labels_true(20 * SECOND).await;
    // Shard ids are Valkey's, zones the Node's, and Valkey got its zone.
    for p in &s.pods {
        let labels = s.labels(p).await;
        let shard_id = cmd(s.valkey(p), &["CLUSTER", "MYSHARDID"]).unwrap();
        assert_eq!(
            Some(&redis::from_redis_value::<String>(shard_id).unwrap()),
            labels.get(SHARD)
        );
        let pod = s.api().get(p).await.unwrap();
        let node = pod.spec.unwrap().node_name.unwrap();
        let zone = format!("zone-{}", &node[5..6]);
        assert_eq!(labels.get(ZONE), Some(&zone), "{p} on {node}");
        let az: Vec<String> = redis::from_redis_value(
            cmd(s.valkey(p), &["CONFIG", "GET", "availability-zone"]).unwrap(),
        )
        .unwrap();
        assert_eq!(az, vec!["availability-zone".to_string(), zone]);
        // The operator's labels are untouched.
        assert_eq!(
            labels.get("valkey.io/cluster").map(String::as_str),
            Some(CLUSTER)
        );
    }
    println!(
        "{}",
        s.plane
            .kubectl(&[
                "get",
                "pods",
                "-n",
                NS,
                "-o",
                "wide",
                "-L",
                "valkey.io/role,valkey.io/shard-id,valkey.io/zone"
            ])
            .await
            .unwrap()
    );

    let (seen, watch) = watch_roles(s.api());
    tokio::time::sleep(Duration::from_millis(500)).await;
    for flip in 0..2 {
        let (primary, replica) = if s.role("valkey-0-0").as_deref() == Some("master") {
            ("valkey-0-0", "valkey-0-1")
        } else {
            ("valkey-0-1", "valkey-0-0")
        };
        let writes_before = s.label_writes(primary).await + s.label_writes(replica).await;
        cmd(s.valkey(replica), &["CLUSTER", "FAILOVER"]).unwrap();
        let mut valkey_flip = Instant::now();
        while s.role(replica).as_deref() != Some("master") {
            valkey_flip = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let promoted = wait_seen(&seen, replica, Some("primary"), valkey_flip, 5 * SECOND).await;
        let demoted = wait_seen(&seen, primary, Some("replica"), valkey_flip, 5 * SECOND).await;
        tokio::time::sleep(SECOND).await;
        let writes = s.label_writes(primary).await + s.label_writes(replica).await - writes_before;
        println!(
            "flip {flip}: label primary on {replica} {:?} and replica on {primary} {:?} after Valkey reported the new role; {writes} label writes",
            promoted.duration_since(valkey_flip),
            demoted.duration_since(valkey_flip)
        );
        assert_eq!(writes, 2, "one write per pod whose role changed");
        assert!(promoted.duration_since(valkey_flip) < 3 * SECOND);
    }
    watch.abort();
    let events = s
        .plane
        .kubectl(&[
            "get",
            "events.events.k8s.io",
            "-n",
            NS,
            "-o",
            "custom-columns=REASON:.reason,POD:.regarding.name,NOTE:.note",
        ])
        .await
        .unwrap();
    println!("{events}");
    assert!(
        events.contains("Promoted") && events.contains("Demoted"),
        "{events}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_loses_its_label_and_the_promoted_replica_gains_it() {
    // A long restart back-off so Valkey's own failover (node timeout 2 s) happens first.
    let s = stage(KubeletOptions {
        restart_backoff: 12 * SECOND,
        ..KubeletOptions::default()
    })
    .await;
    s.wait_labels_true(20 * SECOND).await;
    let (primary, replica) = if s.role("valkey-1-0").as_deref() == Some("master") {
        ("valkey-1-0", "valkey-1-1")
    } else {
        ("valkey-1-1", "valkey-1-0")
    };
    let (seen, watch) = watch_roles(s.api());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    s.kubelet.crash_container(NS, primary, "valkey").unwrap();
    let promoted = wait_seen(&seen, replica, Some("primary"), killed, 15 * SECOND).await;
    let unlabelled = wait_seen(&seen, primary, None, killed, 15 * SECOND).await;
    println!(
        "primary killed: {replica} labelled primary after {:?} (node timeout 2 s); {primary}'s role label removed after {:?}",
        promoted.duration_since(killed),
        unlabelled.duration_since(killed)
    );
    // Valkey restarts (kubelet back-off), rejoins as a replica, and the label says so.
    let rejoined = wait_seen(&seen, primary, Some("replica"), unlabelled, 30 * SECOND).await;
    println!(
        "{primary} labelled replica again {:?} after the kill",
        rejoined.duration_since(killed)
    );
    assert_eq!(s.role(primary).as_deref(), Some("slave"));
    watch.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_own_token_may_change_only_its_own_valkey_labels() {
    let s = stage(KubeletOptions::default()).await;
    s.wait_labels_true(20 * SECOND).await;
    let me = "valkey-2-0";
    let other = "valkey-2-1";
    // The kubelet keeps the pod's bound token next to its kubeconfig.
    let kubeconfig = s.kubelet.pod_kubeconfig(NS, me).unwrap();
    let token = std::fs::read_to_string(kubeconfig.with_file_name("token")).unwrap();
    let client = s.plane.client_for_token(token.trim()).await.unwrap();
    let api: Api<Pod> = Api::namespaced(client, NS);
    let merge = |v: serde_json::Value| Patch::Merge(v);
    let code = |r: Result<Pod, kube::Error>| match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("{e}"),
    };
    let pp = PatchParams::default();
    let cases = [
        (
            "claim primary on another pod",
            other,
            serde_json::json!({"metadata": {"labels": {ROLE: "primary"}}}),
        ),
        (
            "change a non-valkey.io label",
            me,
            serde_json::json!({"metadata": {"labels": {"app.kubernetes.io/name": "other"}}}),
        ),
        (
            "change the operator's shard index",
            me,
            serde_json::json!({"metadata": {"labels": {"valkey.io/shard-index": "7"}}}),
        ),
        (
            "add an annotation",
            me,
            serde_json::json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        (
            "touch spec",
            me,
            serde_json::json!({"spec": {"activeDeadlineSeconds": 3600}}),
        ),
    ];
    for (what, pod, body) in cases {
        let c = code(api.patch(pod, &pp, &merge(body)).await);
        println!("{what}: HTTP {c}");
        assert!(c == 403 || c == 422, "{what} was allowed (HTTP {c})");
    }
    // Allowed: its own valkey.io labels, and removing another pod's role label (dead pods).
    assert_eq!(
        code(
            api.patch(
                me,
                &pp,
                &merge(serde_json::json!({"metadata": {"labels": {"valkey.io/extra": "x"}}}))
            )
            .await
        ),
        200
    );
    assert_eq!(
        code(
            api.patch(
                other,
                &pp,
                &merge(serde_json::json!({"metadata": {"labels": {ROLE: null}}}))
            )
            .await
        ),
        200
    );
    // Without the policy's exception RBAC would allow it: prove RBAC is what stops deleting pods.
    let del = api.delete(other, &Default::default()).await;
    assert!(
        matches!(del, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{del:?}"
    );
}

/// One standalone Valkey pod in replication mode; returns its labels once role, shard and zone
/// are set, with the zone of the node it landed on and Valkey's `availability-zone`.
async fn single_pod_zone(
    apiserver_args: Vec<String>,
    read_nodes: bool,
) -> (BTreeMap<String, String>, String, String, bool) {
    let opts = ControlPlaneOptions {
        apiserver_args,
        ..ControlPlaneOptions::default()
    };
    let plane = ControlPlane::start(opts).await.unwrap();
    let nodes = FakeNodes::start(plane.client(), FakeNodesOptions::default())
        .await
        .unwrap();
    nodes.wait_ready(30 * SECOND).await.unwrap();
    let kopts = KubeletOptions::default()
        .sidecar_bin(env!("CARGO_BIN_EXE_valkey-sidecar"))
        .probe_period(Duration::from_millis(200));
    let kubelet = Kubelet::start(&plane, &nodes, kopts).await.unwrap();
    install_chart_rbac(&plane, read_nodes).await;
    let t = ValkeyPodTemplate {
        mode: "replication".into(),
        sidecar_env: vec![("SIDECAR_SHARD_NAME".into(), "shard-a".into())],
        ..template()
    };
    let api: Api<Pod> = Api::namespaced(plane.client(), NS);
    let pod = api
        .create(&PostParams::default(), &valkey_pod(&t, 0, 0).unwrap())
        .await
        .unwrap();
    let name = pod.metadata.name.unwrap();
    kubelet.wait_ready(NS, &name, 60 * SECOND).await.unwrap();
    poll_until("labels", 20 * SECOND, Duration::from_millis(50), || async {
        let l = api.get(&name).await?.metadata.labels.unwrap_or_default();
        Ok(l.get(ROLE).map(String::as_str) == Some("primary")
            && l.contains_key(ZONE)
            && l.contains_key(SHARD))
    })
    .await
    .unwrap();
    let pod = api.get(&name).await.unwrap();
    let pod_has_topology = pod
        .metadata
        .labels
        .as_ref()
        .unwrap()
        .contains_key("topology.kubernetes.io/zone");
    let node = pod.spec.unwrap().node_name.unwrap();
    let addr = SocketAddr::new(kubelet.pod_ip(NS, &name).unwrap().into(), 6379);
    let az: Vec<String> =
        redis::from_redis_value(cmd(addr, &["CONFIG", "GET", "availability-zone"]).unwrap())
            .unwrap();
    let labels = pod.metadata.labels.unwrap();
    drop(kubelet);
    (
        labels,
        format!("zone-{}", &node[5..6]),
        az[1].clone(),
        pod_has_topology,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_from_the_pods_topology_labels_without_node_access() {
    // kube-apiserver 1.37 copies the node's topology labels onto the pod (PodTopologyLabelsAdmission,
    // beta, on by default); the agent needs no permission on Nodes then.
    let (labels, node_zone, valkey_zone, pod_has_topology) = single_pod_zone(vec![], false).await;
    assert!(pod_has_topology);
    assert_eq!(labels.get(ZONE), Some(&node_zone));
    assert_eq!(labels.get(SHARD).map(String::as_str), Some("shard-a"));
    assert_eq!(valkey_zone, node_zone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_from_the_node_object() {
    let gates = vec!["--feature-gates=PodTopologyLabelsAdmission=false".to_string()];
    let (labels, node_zone, valkey_zone, pod_has_topology) = single_pod_zone(gates, true).await;
    assert!(
        !pod_has_topology,
        "the pod must not carry topology labels in this test"
    );
    assert_eq!(labels.get(ZONE), Some(&node_zone));
    assert_eq!(
        labels.get("valkey.io/region").map(String::as_str),
        Some("region-1")
    );
    assert_eq!(valkey_zone, node_zone);
}
