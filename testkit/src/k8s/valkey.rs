//! Valkey on the harness's Kubernetes: the pod manifest a chart would render (valkey + the agent),
//! the agent's RBAC, and forming a Valkey Cluster across pod IPs, for the demo and end-to-end tests.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::util::poll_until;
use crate::Result;
use crate::info_field;

/// The agent's container port (probes, status, metrics).
pub const SIDECAR_PORT: u16 = 9736;

/// Valkey's port in the pods.
pub const VALKEY_PORT: u16 = 6379;

/// Labels valkey-operator sets (the harness sets them the same way; the agent reads them).
pub const CLUSTER_LABEL: &str = "valkey.io/cluster";
pub const SHARD_INDEX_LABEL: &str = "valkey.io/shard-index";
pub const NODE_INDEX_LABEL: &str = "valkey.io/node-index";

/// How [`valkey_pod`] writes a pod.
#[derive(Clone, Debug)]
pub struct ValkeyPodTemplate {
    /// Value of `valkey.io/cluster`; pods are named `<cluster>-<shard>-<member>`.
    pub cluster: String,
    pub service_account: String,
    /// `cluster` (Valkey Cluster, `--cluster-enabled yes`) or `replication`.
    pub mode: String,
    /// `--cluster-node-timeout` in ms.
    pub cluster_node_timeout_ms: u64,
    /// Extra environment of the agent.
    pub sidecar_env: Vec<(String, String)>,
    pub termination_grace_seconds: i64,
    /// Pod name → node: pins a pod with a `kubernetes.io/hostname` nodeSelector (the scheduler
    /// still binds it), for scenarios that need e.g. two primaries on one node.
    pub pinned: BTreeMap<String, String>,
    /// Extra `valkey-server` arguments, e.g. `["--repl-diskless-sync-delay", "2"]`.
    pub valkey_args: Vec<String>,
}

impl Default for ValkeyPodTemplate {
    fn default() -> Self {
        Self {
            cluster: "valkey".into(),
            service_account: "valkey".into(),
            mode: "cluster".into(),
            cluster_node_timeout_ms: 2000,
            sidecar_env: Vec::new(),
            termination_grace_seconds: 30,
            pinned: BTreeMap::new(),
            valkey_args: Vec::new(),
        }
    }
}

impl ValkeyPodTemplate {
    /// `<cluster>-<shard>-<member>`.
    pub fn pod_name(&self, shard: usize, member: usize) -> String {
        format!("{}-{shard}-{member}", self.cluster)
    }
}

/// Pod `member` of shard `shard`: a `valkey` container and the agent beside it with the
/// downward-API environment, startup/liveness/readiness probes on the agent, and a preStop hook.
/// Placement is the scheduler's: a shard's members prefer different zones and nodes.
pub fn valkey_pod(t: &ValkeyPodTemplate, shard: usize, member: usize) -> Result<Pod> {
    let field = |path: &str| json!({ "fieldRef": { "fieldPath": path } });
    let mut env = vec![
        json!({ "name": "POD_NAME", "valueFrom": field("metadata.name") }),
        json!({ "name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace") }),
        json!({ "name": "NODE_NAME", "valueFrom": field("spec.nodeName") }),
        json!({ "name": "POD_IP", "valueFrom": field("status.podIP") }),
        json!({ "name": "VALKEY_ADDR", "value": format!("127.0.0.1:{VALKEY_PORT}") }),
        json!({ "name": "SIDECAR_MODE", "value": t.mode }),
    ];
    env.extend(
        t.sidecar_env
            .iter()
            .map(|(k, v)| json!({ "name": k, "value": v })),
    );
    let mut args = vec!["--port".to_string(), VALKEY_PORT.to_string()];
    if t.mode == "cluster" {
        args.extend(["--cluster-enabled".into(), "yes".into()]);
        args.extend([
            "--cluster-node-timeout".into(),
            t.cluster_node_timeout_ms.to_string(),
        ]);
    }
    args.extend(t.valkey_args.iter().cloned());
    let shard_s = shard.to_string();
    let same_shard =
        json!({ "matchLabels": { CLUSTER_LABEL: t.cluster, SHARD_INDEX_LABEL: shard_s } });
    let same_cluster = json!({ "matchLabels": { CLUSTER_LABEL: t.cluster } });
    // The agent answers probes from its cached state, so probing every second is cheap and
    // keeps readiness close to the truth (the API would default periodSeconds to 10).
    let http =
        |path: &str| json!({ "httpGet": { "path": path, "port": "probe" }, "periodSeconds": 1 });
    // A restart costs the cluster a failover: liveness is lenient.
    let prestop = json!({ "preStop": { "httpGet": {
        "path": "/prestop?timeout=20s", "port": SIDECAR_PORT } } });
    let mut liveness = http("/livez");
    liveness["failureThreshold"] = json!(10);
    let mut pod = json!({
        "metadata": {
            "name": t.pod_name(shard, member),
            "labels": {
                "app.kubernetes.io/name": "valkey",
                "app.kubernetes.io/instance": t.cluster,
                CLUSTER_LABEL: t.cluster,
                SHARD_INDEX_LABEL: shard_s,
                NODE_INDEX_LABEL: member.to_string(),
            },
        },
        "spec": {
            "serviceAccountName": t.service_account,
            "terminationGracePeriodSeconds": t.termination_grace_seconds,
            "affinity": { "podAntiAffinity": { "preferredDuringSchedulingIgnoredDuringExecution": [
                { "weight": 100, "podAffinityTerm": {
                    "labelSelector": same_shard, "topologyKey": "topology.kubernetes.io/zone" } },
                { "weight": 50, "podAffinityTerm": {
                    "labelSelector": same_cluster, "topologyKey": "kubernetes.io/hostname" } },
            ]}},
            "containers": [
                {
                    "name": "valkey",
                    "image": "valkey/valkey:9.1.2",
                    "args": args,
                    "ports": [
                        { "name": "valkey", "containerPort": VALKEY_PORT },
                        { "name": "bus", "containerPort": VALKEY_PORT + 10000 },
                    ],
                    // Valkey must outlive the hand-over: the kubelet sends it SIGTERM only after
                    // this hook returns, i.e. once the agent says it is no longer primary.
                    "lifecycle": prestop.clone(),
                },
                {
                    "name": "sidecar",
                    "image": "ghcr.io/valkey-sidecar/valkey-sidecar:dev",
                    "ports": [{ "name": "probe", "containerPort": SIDECAR_PORT }],
                    "env": env,
                    "startupProbe": http("/startupz"),
                    "livenessProbe": liveness,
                    "readinessProbe": http("/readyz"),
                    // A classic sidecar gets SIGTERM when the pod is deleted, at the same moment as
                    // Valkey's hook starts: the same wait keeps it serving until the hand-over.
                    "lifecycle": prestop,
                },
            ],
        },
    });
    if let Some(node) = t.pinned.get(&t.pod_name(shard, member)) {
        pod["spec"]["nodeSelector"] = json!({ "kubernetes.io/hostname": node });
    }
    serde_json::from_value(pod).context("building a valkey pod")
}

/// The namespace, the agent's ServiceAccount and the RBAC the chart grants it (own pod labels,
/// Events, Leases; reading Nodes). Server-side apply, so it can be repeated.
pub async fn apply_agent_rbac(client: &Client, namespace: &str, account: &str) -> Result<()> {
    let node_role = format!("{namespace}-{account}-nodes");
    let objects = [
        json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": namespace } }),
        json!({ "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": { "name": account, "namespace": namespace } }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": { "name": account, "namespace": namespace },
                "rules": [
                    { "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"] },
                    { "apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"] },
                    { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "verbs": ["get", "list", "watch", "create", "update", "patch"] },
                    { "apiGroups": [""], "resources": ["serviceaccounts"],
                      "resourceNames": [account], "verbs": ["get"] },
                ] }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": { "name": account, "namespace": namespace },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account },
                "subjects": [{ "kind": "ServiceAccount", "name": account, "namespace": namespace }] }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": { "name": node_role },
                "rules": [{ "apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"] }] }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": { "name": node_role },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": node_role },
                "subjects": [{ "kind": "ServiceAccount", "name": account, "namespace": namespace }] }),
    ];
    for object in objects {
        apply(client, object).await?;
    }
    Ok(())
}

/// Server-side apply of one object given as JSON (`apiVersion`, `kind`, `metadata.name`).
pub async fn apply(client: &Client, object: Value) -> Result<()> {
    let (group, version) = match object["apiVersion"]
        .as_str()
        .unwrap_or("v1")
        .split_once('/')
    {
        Some((g, v)) => (g.to_owned(), v.to_owned()),
        None => (String::new(), "v1".to_owned()),
    };
    let kind = object["kind"].as_str().context("object without kind")?;
    let name = object["metadata"]["name"]
        .as_str()
        .context("object without name")?;
    let gvk = kube::api::GroupVersionKind::gvk(&group, &version, kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {kind}"))?;
    let api: Api<kube::api::DynamicObject> =
        match (caps.scope, object["metadata"]["namespace"].as_str()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        };
    let params = PatchParams::apply("valkey-testkit").force();
    api.patch(name, &params, &Patch::Apply(&object))
        .await
        .with_context(|| format!("applying {kind} {name}"))?;
    Ok(())
}

/// Forms a Valkey Cluster from `shards` (each: primary first, then replicas, as `ip:port`),
/// the way `ValkeyCluster` does it for plain servers: distinct config epochs, even slot ranges on
/// the primaries, `CLUSTER MEET` from the first node, `CLUSTER REPLICATE` once the replicas know
/// their primaries. Returns once every node reports `cluster_state:ok`.
pub async fn form_cluster(shards: Vec<Vec<SocketAddr>>, timeout: Duration) -> Result<()> {
    tokio::task::spawn_blocking(move || form_cluster_blocking(&shards, timeout)).await?
}

fn form_cluster_blocking(shards: &[Vec<SocketAddr>], timeout: Duration) -> Result<()> {
    let all: Vec<SocketAddr> = shards.iter().flatten().copied().collect();
    let first = *all.first().context("no nodes")?;
    for (k, addr) in all.iter().enumerate() {
        cmd(
            *addr,
            &["CLUSTER", "SET-CONFIG-EPOCH", &(k + 1).to_string()],
        )?;
    }
    let total = usize::from(crate::CLUSTER_SLOTS);
    for (s, shard) in shards.iter().enumerate() {
        let primary = *shard.first().context("empty shard")?;
        let (lo, hi) = (s * total / shards.len(), (s + 1) * total / shards.len() - 1);
        cmd(
            primary,
            &["CLUSTER", "ADDSLOTSRANGE", &lo.to_string(), &hi.to_string()],
        )?;
    }
    for addr in &all[1..] {
        cmd(
            first,
            &[
                "CLUSTER",
                "MEET",
                &addr.ip().to_string(),
                &addr.port().to_string(),
            ],
        )?;
    }
    for shard in shards {
        let primary_id = text(cmd(shard[0], &["CLUSTER", "MYID"])?)?;
        for replica in &shard[1..] {
            crate::wait_for(
                "a replica to learn its primary",
                timeout,
                Duration::from_millis(50),
                || Ok(text(cmd(*replica, &["CLUSTER", "NODES"])?)?.contains(&primary_id)),
            )?;
            cmd(*replica, &["CLUSTER", "REPLICATE", &primary_id])?;
        }
    }
    crate::wait_for(
        "cluster_state:ok everywhere",
        timeout,
        Duration::from_millis(50),
        || {
            for addr in &all {
                let info = text(cmd(*addr, &["CLUSTER", "INFO"])?)?;
                if info_field(&info, "cluster_state") != Some("ok") {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
}

/// One command on a fresh connection (the pods are few and the formation short).
pub fn cmd(addr: SocketAddr, args: &[&str]) -> Result<redis::Value> {
    cmd_as(addr, None, args)
}

/// [`cmd`] as the default user with `password` (if any).
pub fn cmd_as(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> Result<redis::Value> {
    let (name, rest) = args.split_first().context("empty command")?;
    let url = match password {
        Some(p) => format!("redis://:{}@{addr}", percent_encode(p)),
        None => format!("redis://{addr}"),
    };
    let client = redis::Client::open(url)?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .with_context(|| format!("connecting to {addr}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut c = redis::cmd(name);
    for a in rest {
        c.arg(*a);
    }
    c.query(&mut conn)
        .with_context(|| format!("{name} on {addr}"))
}

fn text(v: redis::Value) -> Result<String> {
    match v {
        redis::Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => Ok(s),
        other => bail!("expected text, got {other:?}"),
    }
}

/// Waits until every pod in `names` has a pod IP and its Valkey answers `PING`; returns the
/// Valkey addresses in the same order.
pub async fn wait_valkey_up(
    pods: &Api<Pod>,
    names: &[String],
    timeout: Duration,
) -> Result<Vec<SocketAddr>> {
    let mut addrs = Vec::new();
    for name in names {
        let what = format!("valkey of {name} up");
        poll_until(&what, timeout, Duration::from_millis(100), || async {
            let Some(addr) = valkey_addr(&pods.get(name).await?) else {
                return Ok(false);
            };
            Ok(tokio::task::spawn_blocking(move || cmd(addr, &["PING"]).is_ok()).await?)
        })
        .await?;
        let pod = pods.get(name).await?;
        addrs.push(valkey_addr(&pod).context("pod lost its IP")?);
    }
    Ok(addrs)
}

/// `podIP:6379`, once the pod has an IP.
pub fn valkey_addr(pod: &Pod) -> Option<SocketAddr> {
    let ip = pod.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
    Some(SocketAddr::new(ip, VALKEY_PORT))
}

pub(crate) fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
