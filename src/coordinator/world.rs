//! Assembles the planner's [`World`] from Valkey's view of the shards and the Kubernetes objects.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use valkey_sidecar_core::placement::ZONE_LABEL;
use valkey_sidecar_core::plan::{Member, NodeInfo, PodInfo};
use valkey_sidecar_core::shards::Shard;

/// The operator's "intended primary" label (node-index 0).
const NODE_INDEX_LABEL: &str = "valkey.io/node-index";

/// Valkey nodes matched to their pods by IP (one Valkey per pod, so the pod IP is unique).
pub fn members(shards: &[Shard], pods: &[Arc<Pod>]) -> Vec<Member> {
    let by_ip: BTreeMap<&str, &Pod> = pods
        .iter()
        .filter_map(|p| Some((pod_ip(p)?, p.as_ref())))
        .collect();
    shards
        .iter()
        .flat_map(|shard| shard.nodes.iter().map(move |n| (shard, n)))
        .map(|(shard, n)| Member {
            id: n.id.clone(),
            shard: shard.id.clone(),
            role: n.role,
            offset: n.replication_offset,
            health: n.health,
            pod: by_ip.get(n.ip.as_str()).map(|p| pod_info(p)),
        })
        .collect()
}

fn pod_ip(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.pod_ip.as_deref()
}

/// The pod facts the planner uses.
pub fn pod_info(p: &Pod) -> PodInfo {
    let labels = p.metadata.labels.as_ref();
    PodInfo {
        name: p.metadata.name.clone().unwrap_or_default(),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        ready: ready(p),
        terminating: p.metadata.deletion_timestamp.is_some(),
        node_index: labels
            .and_then(|l| l.get(NODE_INDEX_LABEL))
            .and_then(|v| v.parse().ok()),
    }
}

fn ready(p: &Pod) -> bool {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Nodes by name with the facts the planner uses.
pub fn nodes(nodes: &[Arc<Node>]) -> BTreeMap<String, NodeInfo> {
    nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, node_info(n))))
        .collect()
}

fn node_info(n: &Node) -> NodeInfo {
    let conditions = n.status.as_ref().and_then(|s| s.conditions.as_ref());
    NodeInfo {
        zone: n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ZONE_LABEL).cloned()),
        ready: conditions
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        unschedulable: n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
    }
}
