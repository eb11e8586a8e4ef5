//! One home for what the agent reads off pods and nodes: the static labels the chart (and
//! valkey-operator) put on every pod, the pod's IP and the `Ready` conditions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};

/// The deployment's label: the agents' pod selector (`valkey.io/cluster=<name>`).
pub const CLUSTER_LABEL: &str = "valkey.io/cluster";
/// The static shard label: replication mode groups the pods into shards by it, formation gives
/// each shard its slots by it.
pub const SHARD_INDEX_LABEL: &str = "valkey.io/shard-index";
/// valkey-operator's node index (0 = the shard's intended primary).
pub const NODE_INDEX_LABEL: &str = "valkey.io/node-index";
/// The StatefulSet controller's pod index label (Kubernetes ≥ 1.28).
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// The shard of a pod without [`SHARD_INDEX_LABEL`], so a single-shard deployment need not set it.
pub const DEFAULT_SHARD: &str = "0";

/// `valkey.io/node-index`, else the StatefulSet's own pod index, so a chart-made pod 0 is the
/// intended primary.
pub fn node_index(labels: &BTreeMap<String, String>) -> Option<u32> {
    labels
        .get(NODE_INDEX_LABEL)
        .or_else(|| labels.get(POD_INDEX_LABEL))
        .and_then(|v| v.parse().ok())
}

/// The pod's IP, once it has one.
pub fn pod_ip(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.pod_ip.as_deref()
}

/// The pod's `Ready` condition is `True` (the agent's readiness: for a replica, in sync).
pub fn is_ready(p: &Pod) -> bool {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The node's `Ready` condition is `True`.
pub fn node_ready(n: &Node) -> bool {
    let conditions = n.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The node is cordoned (`spec.unschedulable`).
pub fn cordoned(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}
