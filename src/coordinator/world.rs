//! Assembles the planner's [`World`](valkey_sidecar_core::plan::World) from the Kubernetes
//! objects and Valkey's view: `CLUSTER SHARDS` in cluster mode; in replication mode the shards
//! are the pods grouped by `valkey.io/shard-index` and each member's own observation.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::core::DynamicObject;
use valkey_sidecar_core::operator::{OperatorCondition, settled};
use valkey_sidecar_core::placement::ZONE_LABEL;
use valkey_sidecar_core::plan::{Member, NodeInfo, Pending, PodInfo};
use valkey_sidecar_core::replication::{MemberValkey, ShardMember, ShardRecord};
use valkey_sidecar_core::shards::Shard;

use crate::k8s::pods::{
    DEFAULT_SHARD, SHARD_INDEX_LABEL, cordoned, is_ready, node_index, node_ready, pod_ip,
};

/// Whether the operator's resource is settled (`core::operator::settled`), read from its
/// `metadata.generation` and `status.conditions` as any Kubernetes resource spells them.
pub fn operator_settled(o: &DynamicObject) -> bool {
    let conditions = o.data["status"]["conditions"].as_array();
    let conditions: Vec<OperatorCondition> = conditions
        .into_iter()
        .flatten()
        .map(|c| OperatorCondition {
            type_: c["type"].as_str().unwrap_or_default().to_owned(),
            status: c["status"].as_str().unwrap_or_default().to_owned(),
            observed_generation: c["observedGeneration"].as_i64(),
        })
        .collect();
    settled(o.metadata.generation, &conditions)
}

/// The StatefulSet controller's label naming the revision a pod was created from.
const REVISION_LABEL: &str = "controller-revision-hash";

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

/// The pod facts the planner uses.
pub fn pod_info(p: &Pod) -> PodInfo {
    let labels = p.metadata.labels.as_ref();
    PodInfo {
        name: p.metadata.name.clone().unwrap_or_default(),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        ready: is_ready(p),
        terminating: p.metadata.deletion_timestamp.is_some(),
        node_index: labels.and_then(node_index),
        zone: labels.and_then(|l| l.get(ZONE_LABEL).cloned()),
        // Filled in from the StatefulSets by [`revisions`] where the roll needs it.
        updated: None,
    }
}

/// Per pod name: whether it runs its StatefulSet's update revision. Pods of a set whose
/// controller has not caught up with its spec (`observedGeneration` behind) are left out: their
/// revision is not known yet.
pub fn revisions(pods: &[Arc<Pod>], sets: &[Arc<StatefulSet>]) -> BTreeMap<String, bool> {
    let targets: BTreeMap<&str, &str> = sets.iter().filter_map(|s| update_revision(s)).collect();
    pods.iter()
        .filter_map(|p| {
            let set = p
                .metadata
                .owner_references
                .as_ref()?
                .iter()
                .find(|o| o.controller == Some(true) && o.kind == "StatefulSet")?;
            let target = targets.get(set.name.as_str())?;
            let labels = p.metadata.labels.as_ref()?;
            let revision = labels.get(REVISION_LABEL)?;
            Some((p.metadata.name.clone()?, revision == target))
        })
        .collect()
}

/// The set's name and update revision, once its controller has observed its current spec.
fn update_revision(s: &StatefulSet) -> Option<(&str, &str)> {
    let status = s.status.as_ref()?;
    let observed = status.observed_generation?;
    if Some(observed) != s.metadata.generation {
        return None;
    }
    Some((
        s.metadata.name.as_deref()?,
        status.update_revision.as_deref()?,
    ))
}

/// The node facts of the deployment's pods where Nodes may not be read
/// (`core::plan::unseen_nodes`).
pub fn unseen_nodes(pods: &[Arc<Pod>]) -> BTreeMap<String, NodeInfo> {
    let infos: Vec<PodInfo> = pods.iter().map(|p| pod_info(p)).collect();
    valkey_sidecar_core::plan::unseen_nodes(&infos)
}

/// Nodes by name with the facts the planner uses.
pub fn nodes(nodes: &[Arc<Node>]) -> BTreeMap<String, NodeInfo> {
    nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, node_info(n))))
        .collect()
}

fn node_info(n: &Node) -> NodeInfo {
    NodeInfo {
        zone: n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ZONE_LABEL).cloned()),
        ready: node_ready(n),
        unschedulable: cordoned(n),
    }
}

/// The deployment's pods the scheduler could not place (`PodScheduled=False`, no node yet).
pub fn pending(pods: &[Arc<Pod>]) -> Vec<Pending> {
    pods.iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
        .filter_map(|p| {
            let c = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
            Some(Pending {
                pod: p.metadata.name.clone()?,
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
            })
        })
        .collect()
}

/// The replication shard a pod belongs to (spelled as the keepers spell it: the label's value, or
/// [`DEFAULT_SHARD`] without it), which names the shard's record.
pub fn shard_of(p: &Pod) -> String {
    let labels = p.metadata.labels.as_ref();
    labels
        .and_then(|l| l.get(SHARD_INDEX_LABEL))
        .map_or_else(|| DEFAULT_SHARD.to_owned(), String::clone)
}

/// The cluster's pods by shard; within a shard by name, so logs and repoint orders are stable.
pub fn group(pods: &[Arc<Pod>]) -> BTreeMap<String, Vec<Arc<Pod>>> {
    let mut shards: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
    for p in pods.iter().filter(|p| p.metadata.name.is_some()) {
        shards.entry(shard_of(p)).or_default().push(p.clone());
    }
    for members in shards.values_mut() {
        members.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }
    shards
}

/// A pod of a shard as `core::replication::promote` sees it; node facts from the watched nodes.
pub fn shard_member(
    p: &Pod,
    valkey: Option<&MemberValkey>,
    nodes: &BTreeMap<String, NodeInfo>,
) -> ShardMember {
    let info = pod_info(p);
    let node = info.node.as_ref().and_then(|n| nodes.get(n));
    ShardMember {
        valkey: valkey.cloned(),
        zone: node.and_then(|n| n.zone.clone()),
        terminating: info.terminating,
        node_ready: node.is_some_and(|n| n.ready),
        node_schedulable: node.is_some_and(|n| !n.unschedulable),
        pod: info.name,
    }
}

/// A pod of a shard as the planner sees it (`core::plan::Member::replicated`).
pub fn plan_member(
    shard: &str,
    p: &Pod,
    valkey: Option<&MemberValkey>,
    record: Option<&ShardRecord>,
) -> Member {
    let info = pod_info(p);
    let recorded = record.and_then(ShardRecord::recorded_primary) == Some(info.name.as_str());
    Member::replicated(shard, info, valkey, recorded)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use kube::api::ObjectMeta;

    use super::*;
    use valkey_sidecar_core::observation::Role;

    fn pod(name: &str, shard: Option<&str>, node: &str) -> Arc<Pod> {
        let labels = shard.map(|s| BTreeMap::from([(SHARD_INDEX_LABEL.to_owned(), s.to_owned())]));
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels,
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus::default()),
        })
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<&str> {
        pods.iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect()
    }

    #[test]
    fn pods_are_grouped_by_shard_index_and_unlabelled_pods_are_shard_0() {
        let pods = [
            pod("v-1-1", Some("1"), "n"),
            pod("v-0-1", None, "n"),
            pod("v-1-0", Some("1"), "n"),
            pod("v-0-0", Some("0"), "n"),
        ];
        let shards = group(&pods);
        assert_eq!(shards.keys().collect::<Vec<_>>(), ["0", "1"]);
        assert_eq!(names(&shards["0"]), ["v-0-0", "v-0-1"]);
        assert_eq!(names(&shards["1"]), ["v-1-0", "v-1-1"]);
    }

    #[test]
    fn a_shard_member_carries_its_node_facts() {
        let nodes = BTreeMap::from([(
            "n1".to_owned(),
            NodeInfo {
                zone: Some("zone-a".into()),
                ready: true,
                unschedulable: true,
            },
        )]);
        let v = MemberValkey {
            role: Role::Replica,
            offset: 7,
            link_up: true,
            ..MemberValkey::default()
        };
        let m = shard_member(&pod("v-0-1", None, "n1"), Some(&v), &nodes);
        assert_eq!(m.pod, "v-0-1");
        assert_eq!(m.zone.as_deref(), Some("zone-a"));
        assert!(m.node_ready && !m.node_schedulable && !m.terminating);
        assert_eq!(m.valkey, Some(v));
        let lost = shard_member(&pod("v-0-2", None, "gone"), None, &nodes);
        assert!(!lost.node_ready && !lost.node_schedulable && lost.zone.is_none());
    }
}
