//! Fake nodes: Node objects with topology labels, a Ready condition and allocatable resources,
//! kept alive by a heartbeat the way a kubelet keeps its node alive.
//!
//! The node-lifecycle controller (kube-controller-manager) judges a node by the last change of
//! its Lease in `kube-node-lease` or of its Ready condition's `lastHeartbeatTime`; after
//! `--node-monitor-grace-period` without either it sets the conditions to Unknown and taints the
//! node. The heartbeat task renews each Lease every [`FakeNodesOptions::heartbeat`] and refreshes
//! the Ready condition every [`FakeNodesOptions::status_every`], so the controller leaves the nodes
//! alone until a test stops a heartbeat on purpose.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::util::poll_until;
use crate::Result;
use crate::net::lock;

/// Label keys the nodes carry.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

const LEASE_NAMESPACE: &str = "kube-node-lease";

/// How to create [`FakeNodes`]. `Default`: 6 nodes over `zone-a|b|c` in `region-1`.
#[derive(Clone, Debug)]
pub struct FakeNodesOptions {
    pub count: usize,
    /// Node `i` goes to `zones[i % zones.len()]`; its name is `node-<zone suffix><n>` (zone
    /// `zone-a` → `node-a1`, `node-a2`, ...).
    pub zones: Vec<String>,
    pub region: String,
    /// Allocatable (= capacity) resources of every node.
    pub cpu: String,
    pub memory: String,
    pub pods: String,
    /// Lease renewal period.
    pub heartbeat: Duration,
    /// Ready-condition refresh period (a kubelet with leases reports status rarely).
    pub status_every: Duration,
    /// `leaseDurationSeconds` of the node Leases.
    pub lease_duration_seconds: i32,
}

impl Default for FakeNodesOptions {
    fn default() -> Self {
        Self {
            count: 6,
            zones: ["zone-a", "zone-b", "zone-c"].map(String::from).to_vec(),
            region: "region-1".into(),
            cpu: "8".into(),
            memory: "32Gi".into(),
            pods: "110".into(),
            heartbeat: Duration::from_secs(2),
            status_every: Duration::from_secs(6),
            lease_duration_seconds: 40,
        }
    }
}

/// One fake node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeNode {
    pub name: String,
    pub zone: String,
    pub region: String,
    /// Reported as the node's `InternalIP` (and as pods' `hostIP`); nothing listens on it.
    pub internal_ip: IpAddr,
}

/// What the heartbeat reports for one node.
#[derive(Debug)]
struct NodeState {
    /// Heartbeats (Lease and Ready condition) are sent.
    beating: bool,
    /// The Ready condition's status when beating.
    ready: bool,
    /// `lastTransitionTime` of the Ready condition.
    since: Timestamp,
}

pub(crate) struct NodesShared {
    client: Client,
    /// What the Node objects report as kubelet version (the control plane's release).
    kubelet_version: String,
    nodes: Vec<FakeNode>,
    state: Mutex<HashMap<String, NodeState>>,
    opts: FakeNodesOptions,
    /// One Ready report at a time: a heartbeat that read `ready` before a test's `set_ready` must
    /// not land its stale report after the test's (a node made NotReady stayed Ready for good).
    reporting: tokio::sync::Mutex<()>,
}

/// The fake nodes and their heartbeat task. Dropping it stops the heartbeat (the objects stay:
/// they go with the control plane).
pub struct FakeNodes {
    shared: Arc<NodesShared>,
    task: JoinHandle<()>,
}

impl Drop for FakeNodes {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeNodes {
    /// Creates the Node objects (Ready, with Leases) and starts the heartbeat. Does not wait for
    /// the controllers: see [`Self::wait_ready`].
    pub async fn start(client: Client, opts: FakeNodesOptions) -> Result<Self> {
        if opts.zones.is_empty() {
            bail!("fake nodes need at least one zone");
        }
        let nodes = layout(&opts);
        let now = Timestamp::now();
        let state = nodes
            .iter()
            .map(|n| {
                let s = NodeState {
                    beating: true,
                    ready: true,
                    since: now,
                };
                (n.name.clone(), s)
            })
            .collect();
        // The kubelet version the nodes report: the control plane's own release, as after an
        // upgrade of the whole cluster.
        let kubelet_version = client.apiserver_version().await?.git_version;
        let shared = Arc::new(NodesShared {
            client,
            kubelet_version,
            nodes,
            state: Mutex::new(state),
            opts,
            reporting: tokio::sync::Mutex::new(()),
        });
        for node in &shared.nodes {
            shared.create(node).await?;
        }
        let task = tokio::spawn(heartbeat(Arc::clone(&shared)));
        Ok(Self { shared, task })
    }

    /// All nodes, in creation order.
    pub fn nodes(&self) -> &[FakeNode] {
        &self.shared.nodes
    }

    pub fn names(&self) -> Vec<String> {
        self.shared.nodes.iter().map(|n| n.name.clone()).collect()
    }

    pub fn get(&self, name: &str) -> Option<&FakeNode> {
        self.shared.nodes.iter().find(|n| n.name == name)
    }

    pub(crate) fn shared(&self) -> Arc<NodesShared> {
        Arc::clone(&self.shared)
    }

    /// Waits until every node is Ready and carries no `not-ready`/`unreachable` taint (the
    /// node-lifecycle controller may taint a node for a moment after it is created).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let api: Api<Node> = Api::all(self.shared.client.clone());
        poll_until(
            "fake nodes Ready",
            timeout,
            Duration::from_millis(100),
            || async {
                for node in &self.shared.nodes {
                    if !node_schedulable(&api.get(&node.name).await?) {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
        .await
    }

    /// `false`: the node reports `Ready=False` (reason `KubeletNotReady`) right away and its
    /// heartbeat stops, as when a kubelet's runtime fails. `true`: Ready again, heartbeat back.
    pub async fn set_ready(&self, node: &str, ready: bool) -> Result<()> {
        let _one = self.shared.reporting.lock().await;
        self.shared.update(node, |s| {
            if s.ready != ready {
                s.since = Timestamp::now();
            }
            s.ready = ready;
            s.beating = ready;
        })?;
        self.shared.report_status(node, ready).await
    }

    /// Stops the heartbeat silently, as when a node dies: its conditions turn Unknown after the
    /// controller-manager's grace period.
    pub fn stop_heartbeat(&self, node: &str) -> Result<()> {
        self.shared.set_beating(node, false)
    }

    /// Resumes the heartbeat stopped by [`Self::stop_heartbeat`] (Ready again on the next beat).
    pub fn resume_heartbeat(&self, node: &str) -> Result<()> {
        self.shared.set_beating(node, true)
    }
}

impl NodesShared {
    pub(crate) fn set_beating(&self, node: &str, beating: bool) -> Result<()> {
        self.update(node, |s| s.beating = beating)
    }

    fn update(&self, node: &str, f: impl FnOnce(&mut NodeState)) -> Result<()> {
        let mut state = lock(&self.state);
        let s = state
            .get_mut(node)
            .with_context(|| format!("{node} is not a fake node"))?;
        f(s);
        Ok(())
    }

    async fn create(&self, node: &FakeNode) -> Result<()> {
        let api: Api<Node> = Api::all(self.client.clone());
        let object: Node = serde_json::from_value(json!({
            "metadata": {
                "name": node.name,
                "labels": {
                    ZONE_LABEL: node.zone,
                    REGION_LABEL: node.region,
                    HOSTNAME_LABEL: node.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node.kubernetes.io/instance-type": "valkey-testkit",
                },
            },
        }))?;
        let created = api
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("creating node {}", node.name))?;
        let status = self.full_status(node);
        api.patch_status(&node.name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .with_context(|| format!("setting the status of node {}", node.name))?;
        self.renew_lease(node, created.metadata.uid.as_deref())
            .await
    }

    /// The whole status a kubelet registers with.
    fn full_status(&self, node: &FakeNode) -> Value {
        let o = &self.opts;
        let resources = json!({
            "cpu": o.cpu, "memory": o.memory, "pods": o.pods, "ephemeral-storage": "100Gi",
        });
        let now = time(Timestamp::now());
        let quiet = |kind: &str, reason: &str| {
            json!({
                "type": kind, "status": "False", "reason": reason,
                "message": "valkey-testkit fake node",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            })
        };
        json!({ "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                quiet("MemoryPressure", "KubeletHasSufficientMemory"),
                quiet("DiskPressure", "KubeletHasNoDiskPressure"),
                quiet("PIDPressure", "KubeletHasSufficientPID"),
                self.ready_condition(&node.name, true),
            ],
            "addresses": [
                { "type": "InternalIP", "address": node.internal_ip.to_string() },
                { "type": "Hostname", "address": node.name },
            ],
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
            "nodeInfo": {
                "machineID": node.name, "systemUUID": node.name, "bootID": node.name,
                "kernelVersion": "valkey-testkit", "osImage": "valkey-testkit process pods",
                "containerRuntimeVersion": "valkey-testkit://0.1",
                "kubeletVersion": self.kubelet_version, "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64",
            },
        }})
    }

    fn ready_condition(&self, node: &str, ready: bool) -> Value {
        let since = lock(&self.state)
            .get(node)
            .map_or_else(Timestamp::now, |s| s.since);
        let (status, reason, message) = if ready {
            ("True", "KubeletReady", "kubelet is posting ready status")
        } else {
            ("False", "KubeletNotReady", "made NotReady by the test")
        };
        json!({
            "type": "Ready", "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": time(Timestamp::now()), "lastTransitionTime": time(since),
        })
    }

    /// The heartbeat's Ready report, with the state as it is now (under the report lock).
    async fn report_if_beating(&self, node: &str) -> Result<()> {
        let _one = self.reporting.lock().await;
        let ready = lock(&self.state)
            .get(node)
            .and_then(|s| s.beating.then_some(s.ready));
        match ready {
            Some(ready) => self.report_status(node, ready).await,
            None => Ok(()),
        }
    }

    /// Patches the Ready condition (strategic merge: the other conditions stay).
    async fn report_status(&self, node: &str, ready: bool) -> Result<()> {
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({ "status": { "conditions": [self.ready_condition(node, ready)] } });
        api.patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .with_context(|| format!("reporting the status of node {node}"))?;
        Ok(())
    }

    /// Renews the node's Lease, creating it (owned by the Node, like a kubelet's) if missing.
    async fn renew_lease(&self, node: &FakeNode, node_uid: Option<&str>) -> Result<()> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        let spec = json!({
            "holderIdentity": node.name,
            "leaseDurationSeconds": self.opts.lease_duration_seconds,
            "renewTime": MicroTime(Timestamp::now()),
        });
        let patch = json!({ "spec": spec });
        match api
            .patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(e).with_context(|| format!("renewing the lease of {}", node.name));
            }
        }
        let mut metadata = json!({ "name": node.name });
        if let Some(uid) = node_uid {
            metadata["ownerReferences"] =
                json!([{ "apiVersion": "v1", "kind": "Node", "name": node.name, "uid": uid }]);
        }
        let lease: Lease = serde_json::from_value(json!({ "metadata": metadata, "spec": spec }))?;
        api.create(&PostParams::default(), &lease)
            .await
            .with_context(|| format!("creating the lease of {}", node.name))?;
        Ok(())
    }

    /// Whether `node`'s heartbeat runs.
    fn beats(&self, node: &str) -> bool {
        lock(&self.state).get(node).is_some_and(|s| s.beating)
    }
}

/// Every node's heartbeat, each on its own pace: under load one node's slow answers must not
/// delay the others' (in the 50-shard bench, beats taken in turn with the apiserver answering in
/// seconds left every node's Lease stale past the grace period, and the node controller evicted
/// 59 pods).
async fn heartbeat(shared: Arc<NodesShared>) {
    let beats = shared.nodes.iter().map(|node| beat(&shared, node));
    futures::future::join_all(beats).await;
}

/// One node's heartbeat: its Lease every beat, its Ready condition every `status_every`.
async fn beat(shared: &NodesShared, node: &FakeNode) {
    let mut tick = tokio::time::interval(shared.opts.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let status_every = shared.opts.status_every.as_millis().max(1);
    let beat_ms = shared.opts.heartbeat.as_millis().max(1);
    let mut since_status = 0u128;
    loop {
        tick.tick().await;
        since_status += beat_ms;
        let with_status = since_status >= status_every;
        if with_status {
            since_status = 0;
        }
        if !shared.beats(&node.name) {
            continue;
        }
        // A failed beat is retried on the next tick; the grace period spans several ticks.
        if let Err(e) = shared.renew_lease(node, None).await {
            eprintln!("valkey-testkit: node heartbeat: {e:#}");
        }
        if with_status && let Err(e) = shared.report_if_beating(&node.name).await {
            eprintln!("valkey-testkit: node heartbeat: {e:#}");
        }
    }
}

/// Ready and free of the taints the node-lifecycle controller puts on unhealthy nodes.
fn node_schedulable(node: &Node) -> bool {
    let status = node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter().any(|t| {
                t.key == "node.kubernetes.io/not-ready" || t.key == "node.kubernetes.io/unreachable"
            })
        });
    ready && !tainted
}

/// The third octet of the next node set's addresses, `127.0.<100..=249>.x`: loopback, never
/// bound, outside the pod ranges (`127.<1..=200>.x.y`) and the observer's `127.0.99.1`. Tests
/// run side by side, in one process and in several, each with its own nodes; node faults drop
/// packets by address, so two sets sharing addresses would cut each other's clients (a power-off
/// of one test's `node-a1` silenced another's client on its `node-a1`). Hence a claim across
/// processes, one block per node set.
fn node_block() -> u8 {
    let k = crate::net::claim_block("nodes", 150);
    u8::try_from(100 + k).unwrap_or(100)
}

/// Names, zones and addresses: zones round-robin, so every zone gets nodes early.
fn layout(opts: &FakeNodesOptions) -> Vec<FakeNode> {
    let block = node_block();
    let mut per_zone: HashMap<&str, usize> = HashMap::new();
    (0..opts.count)
        .map(|i| {
            let zone = &opts.zones[i % opts.zones.len()];
            let n = per_zone.entry(zone.as_str()).or_default();
            *n += 1;
            let suffix = zone.rsplit('-').next().unwrap_or(zone);
            let host = u8::try_from(i % 250 + 1).unwrap_or(1);
            FakeNode {
                name: format!("node-{suffix}{n}"),
                zone: zone.clone(),
                region: opts.region.clone(),
                internal_ip: IpAddr::V4(Ipv4Addr::new(127, 0, block, host)),
            }
        })
        .collect()
}

fn time(t: Timestamp) -> Value {
    serde_json::to_value(Time(t)).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_spreads_six_nodes_over_three_zones() {
        let nodes = layout(&FakeNodesOptions::default());
        let names: Vec<_> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "node-a1", "node-b1", "node-c1", "node-a2", "node-b2", "node-c2"
            ]
        );
        assert_eq!(nodes[4].zone, "zone-b");
        assert_eq!(nodes[5].region, "region-1");
    }
}
