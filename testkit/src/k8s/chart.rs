//! The production chart (`charts/valkey-sidecar`) on the harness: rendered by the real `helm` with
//! given values, applied with `kubectl`, and run the way a cluster runs it — kube-controller-manager
//! creates the pods from the StatefulSets, kube-scheduler binds them to the six fake nodes, the
//! process kubelet runs Valkey and the agent in them.
//!
//! [`ChartStage`] is the chart's counterpart of [`super::Stage`] (which creates its pods itself
//! and uses the chart only for RBAC). The apply order differs from `helm install` in one way: the
//! admission policies go first, and the node-index policy is in force (checked with a dry-run pod)
//! before the StatefulSets exist, so every pod is created with `valkey.io/node-index`.
//!
//! Harness limits that shape the tests: pod IPs are loopback addresses, which EndpointSlices may
//! not hold, so the EndpointSlice controller's *attempted* endpoints are read from its events
//! ([`ChartStage::attempted_endpoints`]); PersistentVolumeClaims are never bound (keep
//! `persistence.enabled=false`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod, Secret, Service};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};

use super::util::poll_until;
use super::valkey::{CLUSTER_LABEL, NODE_INDEX_LABEL, SHARD_INDEX_LABEL, apply, valkey_addr};
use super::{
    ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions,
    ROLE_LABEL, helm_bin,
};
use crate::Result;

/// The chart's directory in this repository.
pub fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/valkey-sidecar")
}

/// `helm template <release> <chart> --namespace <namespace> -f <values>... --set <sets>...`: the
/// rendered manifests.
pub fn render(
    release: &str,
    namespace: &str,
    values: &[PathBuf],
    sets: &[String],
) -> Result<String> {
    let mut args: Vec<String> = vec![
        "template".into(),
        release.into(),
        chart_dir().display().to_string(),
        "--namespace".into(),
        namespace.into(),
    ];
    for v in values {
        args.extend(["--values".into(), v.display().to_string()]);
    }
    for s in sets {
        args.extend(["--set".into(), s.clone()]);
    }
    helm(&args)
}

/// `helm lint --strict` of the chart with `values`; its output.
pub fn lint(values: &[PathBuf]) -> Result<String> {
    let mut args: Vec<String> = vec![
        "lint".into(),
        "--strict".into(),
        chart_dir().display().to_string(),
    ];
    for v in values {
        args.extend(["--values".into(), v.display().to_string()]);
    }
    helm(&args)
}

fn helm(args: &[String]) -> Result<String> {
    let out = std::process::Command::new(helm_bin()?)
        .args(args)
        .output()
        .context("running helm")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "helm {} failed: {}{}",
            args.first().map_or("", String::as_str),
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// The documents of a rendered stream, without empty ones.
pub fn documents(rendered: &str) -> Vec<&str> {
    rendered
        .split("\n---")
        .map(|d| d.trim_start_matches("---").trim())
        .filter(|d| d.lines().any(|l| l.starts_with("kind:")))
        .collect()
}

/// The `kind:` of a rendered document.
pub fn kind_of(document: &str) -> Option<&str> {
    document
        .lines()
        .find_map(|l| l.strip_prefix("kind:"))
        .map(str::trim)
}

/// How to build a [`ChartStage`].
#[derive(Clone, Debug)]
pub struct ChartStageOptions {
    pub namespace: String,
    pub release: String,
    /// Values files, in order (`-f`).
    pub values: Vec<PathBuf>,
    /// `--set` arguments, after the files.
    pub sets: Vec<String>,
    /// Objects applied before the chart, e.g. the Secret of `auth.existingSecret` (server-side
    /// apply; a namespaced one without a namespace gets [`ChartStageOptions::namespace`]).
    pub objects: Vec<Value>,
    pub plane: ControlPlaneOptions,
    pub kubelet: KubeletOptions,
    /// The fake nodes (six over three zones by default).
    pub nodes: FakeNodesOptions,
    /// Install with `helm install` (a release helm can upgrade and uninstall) instead of rendering
    /// and applying the manifests (policies first, which `helm install` cannot order).
    pub helm_install: bool,
}

impl Default for ChartStageOptions {
    fn default() -> Self {
        Self {
            namespace: "valkey".into(),
            release: "valkey".into(),
            values: Vec::new(),
            sets: Vec::new(),
            objects: Vec::new(),
            plane: ControlPlaneOptions::default(),
            kubelet: KubeletOptions::default(),
            helm_install: false,
            nodes: FakeNodesOptions::default(),
        }
    }
}

impl ChartStageOptions {
    /// The chart installed into `namespace` with the values file `example` and `sets` on top, its
    /// pods' agent the binary `agent` (probes as the chart sets them).
    pub fn example(namespace: &str, example: PathBuf, sets: &[&str], agent: &Path) -> Self {
        ChartStageOptions {
            namespace: namespace.into(),
            values: vec![example],
            sets: sets.iter().map(|s| s.to_string()).collect(),
            kubelet: KubeletOptions::default().sidecar_bin(agent),
            ..ChartStageOptions::default()
        }
    }
}

/// A running chart install; fields drop in declaration order: pods' processes, nodes, control
/// plane.
pub struct ChartStage {
    pub kubelet: Kubelet,
    pub nodes: FakeNodes,
    pub plane: ControlPlane,
    pub namespace: String,
    /// The Helm release.
    pub release: String,
    /// The Valkey deployment's name (`valkey.io/cluster`).
    pub cluster: String,
    /// The rendered manifests as applied.
    pub manifest: PathBuf,
}

impl ChartStage {
    /// Starts the control plane, six nodes and the kubelet, then renders and applies the chart.
    /// Returns once everything is applied; the pods come up on their own (see
    /// [`ChartStage::wait_ready`]).
    pub async fn start(opts: ChartStageOptions) -> Result<ChartStage> {
        let plane = ControlPlane::start(opts.plane.clone()).await?;
        let nodes = FakeNodes::start(plane.client(), opts.nodes.clone()).await?;
        nodes.wait_ready(Duration::from_secs(30)).await?;
        let kubelet = Kubelet::start(&plane, &nodes, opts.kubelet.clone()).await?;
        plane
            .kubectl(&["create", "namespace", &opts.namespace])
            .await?;
        for mut object in opts.objects.clone() {
            if object["metadata"]["namespace"].is_null() && object["kind"] != "Namespace" {
                object["metadata"]["namespace"] = json!(opts.namespace);
            }
            apply(&plane.client(), object).await?;
        }
        let (cluster, manifest) = match opts.helm_install {
            true => helm_install(&plane, &opts)?,
            false => install(&plane, &opts).await?,
        };
        Ok(ChartStage {
            kubelet,
            nodes,
            plane,
            namespace: opts.namespace,
            release: opts.release,
            cluster,
            manifest,
        })
    }

    /// `helm uninstall` of a release made with [`ChartStageOptions::helm_install`], waiting until
    /// its objects are gone.
    pub fn uninstall(&self) -> Result<String> {
        let kubeconfig = self.plane.kubeconfig_path().display().to_string();
        let args = ["uninstall", &self.release, "--namespace", &self.namespace];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.extend(["--wait".into(), "--kubeconfig".into(), kubeconfig]);
        helm(&args)
    }

    /// A status condition the coordinator writes on its Lease (`status.valkey.io/<type>`):
    /// `"<True|False> <Reason>: <message>"`, if present.
    pub async fn condition(&self, type_: &str) -> Result<Option<String>> {
        let annotations = self
            .coordinator_lease()
            .await?
            .and_then(|l| l.metadata.annotations)
            .unwrap_or_default();
        Ok(annotations
            .get(&format!("status.valkey.io/{type_}"))
            .cloned())
    }

    /// The coordinator Lease (`<cluster>-coordinator`), if it exists.
    pub async fn coordinator_lease(&self) -> Result<Option<Lease>> {
        let leases: Api<Lease> = Api::namespaced(self.plane.client(), &self.namespace);
        let name = format!("{}-coordinator", self.cluster);
        Ok(leases.get_opt(&name).await?)
    }

    /// Who holds the coordinator Lease now.
    pub async fn coordinator_holder(&self) -> Result<Option<String>> {
        let lease = self.coordinator_lease().await?;
        Ok(lease
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty()))
    }

    /// Every object left in the namespace (`kind/name`), but what every namespace has (the
    /// `default` ServiceAccount, the `kube-root-ca.crt` ConfigMap) and Events, which expire.
    pub async fn leftovers(&self) -> Result<Vec<String>> {
        let kinds = self
            .plane
            .kubectl(&[
                "api-resources",
                "--verbs=list",
                "--namespaced",
                "-o",
                "name",
            ])
            .await?;
        let kinds: Vec<&str> = kinds.lines().filter(|k| !k.starts_with("events")).collect();
        let listed = self
            .plane
            .kubectl(&["get", &kinds.join(","), "-n", &self.namespace, "-o", "name"])
            .await?;
        let expected = ["serviceaccount/default", "configmap/kube-root-ca.crt"];
        let mut left: Vec<String> = listed
            .lines()
            .filter(|l| !l.is_empty() && !expected.contains(l))
            .map(str::to_owned)
            .collect();
        let cluster_wide = "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings,mutatingadmissionpolicies,mutatingadmissionpolicybindings";
        let selector = format!("app.kubernetes.io/instance={}", self.release);
        let global = self
            .plane
            .kubectl(&["get", cluster_wide, "-l", &selector, "-o", "name"])
            .await?;
        left.extend(global.lines().filter(|l| !l.is_empty()).map(str::to_owned));
        Ok(left)
    }

    pub fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.plane.client(), &self.namespace)
    }

    /// The Valkey deployment's pods, by name.
    pub async fn pods(&self) -> Result<Vec<Pod>> {
        let selector = format!("{CLUSTER_LABEL}={}", self.cluster);
        let mut pods = self
            .pods_api()
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }

    /// Waits until `count` pods of the deployment exist and every one has an IP and a Valkey
    /// that answers `PING` (with `password`, if any); returns them by name.
    pub async fn wait_valkey_up(
        &self,
        count: usize,
        password: Option<&str>,
        timeout: Duration,
    ) -> Result<Vec<Pod>> {
        let what = format!("{count} pods with Valkey up");
        poll_until(&what, timeout, Duration::from_millis(200), || async {
            let pods = self.pods().await?;
            if pods.len() != count {
                return Ok(false);
            }
            for pod in &pods {
                let Some(addr) = valkey_addr(pod) else {
                    return Ok(false);
                };
                let password = password.map(str::to_owned);
                let up = tokio::task::spawn_blocking(move || {
                    cmd(addr, password.as_deref(), &["PING"]).is_ok()
                })
                .await?;
                if !up {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await?;
        self.pods().await
    }

    /// Waits until `count` pods of the deployment exist and all are Ready; returns them by name.
    pub async fn wait_ready(&self, count: usize, timeout: Duration) -> Result<Vec<Pod>> {
        let what = format!("{count} pods Ready");
        let waited = poll_until(&what, timeout, Duration::from_millis(200), || async {
            let pods = self.pods().await?;
            Ok(pods.len() == count && pods.iter().all(super::pod_is_ready))
        })
        .await;
        if let Err(e) = waited {
            bail!("{e:#}\n{}", self.describe().await);
        }
        self.pods().await
    }

    /// Waits until `count` pods exist, all Ready, none terminating, each with a role label, and
    /// `primaries` of them labelled primary: the deployment settled. Returns them by name.
    pub async fn wait_settled(
        &self,
        count: usize,
        primaries: usize,
        timeout: Duration,
    ) -> Result<Vec<Pod>> {
        let what = format!("{count} pods Ready, {primaries} primaries");
        let waited = poll_until(&what, timeout, Duration::from_millis(200), || async {
            let pods = self.pods().await?;
            let settled = |p: &Pod| {
                super::pod_is_ready(p)
                    && p.metadata.deletion_timestamp.is_none()
                    && label(p, ROLE_LABEL).is_some()
            };
            let led = pods
                .iter()
                .filter(|p| label(p, ROLE_LABEL) == Some("primary"))
                .count();
            Ok(pods.len() == count && pods.iter().all(settled) && led == primaries)
        })
        .await;
        if let Err(e) = waited {
            bail!("{e:#}\n{}", self.describe().await);
        }
        self.pods().await
    }

    /// Pods with their node, readiness and valkey.io labels, for failure messages.
    pub async fn describe(&self) -> String {
        let Ok(pods) = self.pods().await else {
            return "(pods cannot be listed)".into();
        };
        pods.iter()
            .map(|p| {
                let labels: Vec<String> = p
                    .metadata
                    .labels
                    .iter()
                    .flatten()
                    .filter(|(k, _)| k.starts_with("valkey.io/"))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!(
                    "{} node={} ready={} {}",
                    p.metadata.name.as_deref().unwrap_or("?"),
                    node_of(p).unwrap_or("-"),
                    super::pod_is_ready(p),
                    labels.join(",")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A key of a Secret in the namespace, as text.
    pub async fn secret(&self, name: &str, key: &str) -> Result<String> {
        let api: Api<Secret> = Api::namespaced(self.plane.client(), &self.namespace);
        let secret = api.get(name).await?;
        let value = secret
            .data
            .and_then(|d| d.get(key).cloned())
            .with_context(|| format!("secret {name} has no key {key}"))?;
        Ok(String::from_utf8(value.0)?)
    }

    /// The pods a Service's selector picks, by name: what its EndpointSlices should hold.
    pub async fn service_pods(&self, service: &str) -> Result<Vec<Pod>> {
        let api: Api<Service> = Api::namespaced(self.plane.client(), &self.namespace);
        let selector = api
            .get(service)
            .await?
            .spec
            .and_then(|s| s.selector)
            .with_context(|| format!("service {service} has no selector"))?;
        let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut pods = self
            .pods_api()
            .list(&ListParams::default().labels(&labels.join(",")))
            .await?
            .items;
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }

    /// The endpoint IPs kube-controller-manager's EndpointSlice controller last tried to write
    /// for `service`. The harness's pod IPs are loopback addresses, which the apiserver refuses
    /// in EndpointSlices; the controller reports the refused addresses in a
    /// `FailedToUpdateEndpointSlices` event, so that event shows the endpoints it computed.
    /// `None` before any such event.
    pub async fn attempted_endpoints(&self, service: &str) -> Result<Option<BTreeSet<String>>> {
        let api: Api<Event> = Api::namespaced(self.plane.client(), &self.namespace);
        let events = api.list(&ListParams::default()).await?.items;
        let latest = events
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("FailedToUpdateEndpointSlices")
                    && e.involved_object.kind.as_deref() == Some("Service")
                    && e.involved_object.name.as_deref() == Some(service)
            })
            .max_by_key(|e| {
                let at = e.last_timestamp.as_ref().map(|t| t.0);
                (at, e.count.unwrap_or(0))
            });
        Ok(latest.map(|e| quoted_ips(e.message.as_deref().unwrap_or(""))))
    }
}

/// `"a.b.c.d"` values in an event message.
fn quoted_ips(message: &str) -> BTreeSet<String> {
    message
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_owned)
        .collect()
}

/// The pod's node, once scheduled.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// A label of the pod.
pub fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The pods grouped by `valkey.io/shard-index`, each shard ordered by `valkey.io/node-index`
/// (pod 0, the intended primary, first).
pub fn shards(pods: &[Pod]) -> BTreeMap<String, Vec<Pod>> {
    let mut shards: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for pod in pods {
        let shard = label(pod, SHARD_INDEX_LABEL).unwrap_or("?").to_owned();
        shards.entry(shard).or_default().push(pod.clone());
    }
    for members in shards.values_mut() {
        // As the agent reads it: node-index, else the StatefulSet's pod index (on a first
        // `helm install` the StatefulSets may create pods before the node-index policy is in force).
        members.sort_by_key(|p| {
            label(p, NODE_INDEX_LABEL)
                .or_else(|| label(p, "apps.kubernetes.io/pod-index"))
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(u32::MAX)
        });
    }
    shards
}

/// Renders and applies the chart: admission policies first (and the node-index policy checked in
/// force), then the rest. Returns the cluster name and the manifest file.
async fn install(plane: &ControlPlane, opts: &ChartStageOptions) -> Result<(String, PathBuf)> {
    let rendered = render(&opts.release, &opts.namespace, &opts.values, &opts.sets)?;
    let docs = documents(&rendered);
    let is_policy = |d: &&str| {
        kind_of(d).is_some_and(|k| {
            k.ends_with("AdmissionPolicy") || k.ends_with("AdmissionPolicyBinding")
        })
    };
    let (policies, rest): (Vec<&str>, Vec<&str>) = docs.into_iter().partition(is_policy);
    let cluster = cluster_of(&rendered)?;
    let dir = plane.dir();
    let manifest = dir.join(format!("chart-{}.yaml", opts.namespace));
    std::fs::write(&manifest, &rendered)?;
    if !policies.is_empty() {
        let file = dir.join(format!("chart-{}-policies.yaml", opts.namespace));
        kubectl_apply(plane, &file, &policies).await?;
    }
    let mutating = policies
        .iter()
        .filter(|d| kind_of(d) == Some("MutatingAdmissionPolicy"));
    let zones = mutating.clone().any(|d| d.contains("placement.zones"));
    if mutating.count() > 0 {
        wait_mutating_policies(plane, &opts.namespace, &cluster, zones).await?;
    }
    let file = dir.join(format!("chart-{}-objects.yaml", opts.namespace));
    kubectl_apply(plane, &file, &rest).await?;
    Ok((cluster, manifest))
}

/// `helm install` into the plane (no `--wait`: the pods come up on their own).
fn helm_install(plane: &ControlPlane, opts: &ChartStageOptions) -> Result<(String, PathBuf)> {
    let rendered = render(&opts.release, &opts.namespace, &opts.values, &opts.sets)?;
    let cluster = cluster_of(&rendered)?;
    let manifest = plane.dir().join(format!("chart-{}.yaml", opts.namespace));
    std::fs::write(&manifest, &rendered)?;
    let mut args: Vec<String> = vec![
        "install".into(),
        opts.release.clone(),
        chart_dir().display().to_string(),
        "--namespace".into(),
        opts.namespace.clone(),
        "--kubeconfig".into(),
        plane.kubeconfig_path().display().to_string(),
    ];
    for v in &opts.values {
        args.extend(["--values".into(), v.display().to_string()]);
    }
    for s in &opts.sets {
        args.extend(["--set".into(), s.clone()]);
    }
    helm(&args)?;
    Ok((cluster, manifest))
}

fn cluster_of(rendered: &str) -> Result<String> {
    rendered
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{CLUSTER_LABEL}:")))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .context("the rendered chart names no valkey.io/cluster")
}

async fn kubectl_apply(plane: &ControlPlane, file: &Path, docs: &[&str]) -> Result<()> {
    std::fs::write(file, docs.join("\n---\n"))?;
    plane
        .kubectl(&["apply", "--server-side", "-f", &file.display().to_string()])
        .await?;
    Ok(())
}

/// Waits until a pod created like the StatefulSet controller creates one comes back with
/// `valkey.io/node-index` (and, with `zones`, a node affinity): a server-side dry run.
async fn wait_mutating_policies(
    plane: &ControlPlane,
    namespace: &str,
    cluster: &str,
    zones: bool,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(plane.client(), namespace);
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "node-index-probe",
            "labels": {
                CLUSTER_LABEL: cluster,
                "apps.kubernetes.io/pod-index": "7",
                SHARD_INDEX_LABEL: "0",
            },
        },
        "spec": { "containers": [{ "name": "c", "image": "registry.k8s.io/pause:3.10" }] },
    }))?;
    let pinned = |p: &Pod| {
        let affinity = p.spec.as_ref().and_then(|s| s.affinity.as_ref());
        !zones || affinity.is_some_and(|a| a.node_affinity.is_some())
    };
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    poll_until(
        "the mutating admission policies in force",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let created = api.create(&params, &probe).await?;
            Ok(label(&created, NODE_INDEX_LABEL) == Some("7") && pinned(&created))
        },
    )
    .await
}

/// One command on a fresh connection, as the default user with `password` (if any).
pub fn cmd(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> Result<redis::Value> {
    super::valkey::cmd_as(addr, password, args)
}

/// Text of a bulk or simple string reply.
pub fn text(v: redis::Value) -> Result<String> {
    match v {
        redis::Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => Ok(s),
        other => bail!("expected text, got {other:?}"),
    }
}

/// `master` / `slave` as Valkey's `ROLE` says.
pub fn role(addr: SocketAddr, password: Option<&str>) -> Result<String> {
    match cmd(addr, password, &["ROLE"])? {
        redis::Value::Array(items) => text(items.into_iter().next().context("empty ROLE")?),
        other => bail!("ROLE answered {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_split_on_separators_and_keep_kinds() {
        let stream = "---\n# Source: a\nkind: A\nx: 1\n---\n# only a comment\n---\nkind: B\n";
        let docs = documents(stream);
        assert_eq!(docs.len(), 2);
        assert_eq!(
            docs.iter().map(|d| kind_of(d)).collect::<Vec<_>>(),
            [Some("A"), Some("B")]
        );
    }

    #[test]
    fn ips_are_read_from_quoted_values() {
        let msg = r#"[endpoints[0].addresses[0]: Invalid value: "127.1.0.4": may not be in the loopback range (127.0.0.0/8, ::1/128), endpoints[1].addresses[0]: Invalid value: "127.1.0.9": x] "exp-7j99r""#;
        let ips: Vec<String> = quoted_ips(msg).into_iter().collect();
        assert_eq!(ips, ["127.1.0.4", "127.1.0.9"]);
    }

    #[test]
    fn passwords_are_percent_encoded() {
        use crate::k8s::valkey::percent_encode;
        assert_eq!(percent_encode("aZ9-_"), "aZ9-_");
        assert_eq!(percent_encode("a b@/"), "a%20b%40%2F");
    }
}
