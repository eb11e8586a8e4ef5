//! Which pods a formation round reads in full.
//!
//! A pod's whole map (`CLUSTER SHARDS`, `CLUSTER NODES`) lists every node of the cluster: reading
//! every pod's in a round costs pods × nodes (1,000 shards × 3: 3,000 maps of 3,000 nodes, every
//! 30 s while nothing changes). So a round first asks every pod short, constant-size questions
//! ([`QUESTIONS`]): a [`Glance`].
//! Where the answers agree with the coordinator's own map ([`LocalMap::vouch`]) — the pod is the
//! node that map lists at its address, not failed, in the same role, shard and (a replica) of the
//! same primary, knowing as many nodes — the round takes that map for the pod's. Only the others
//! are read in full: pods that are new, moved, replaced, or know a different number of nodes.
//!
//! What equal answers cannot show (as many nodes known, but not the same ones; a peer listed at an
//! old address) Valkey's gossip mends by itself (a node flagged failing takes a peer's newer
//! address for it), and [`audited`] reads [`AUDIT`] more pods in full each round, in turn, so that
//! no pod's own view goes unread for long. A round then reads O(pods) short answers and
//! O(nodes) map entries per disagreeing or audited pod, not pods × nodes.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::{ClusterNode, Listing, forgettable};
use crate::info::Info;
use crate::observation::{Role, role_reply};
use crate::reply::Reply;
use crate::shards::{NodeHealth, Shard};

/// Pods read in full each round whatever their answers, in turn ([`audited`]).
pub const AUDIT: usize = 2;

/// The short questions, in the order [`Glance::answered`] reads their answers: `ROLE`, `INFO
/// persistence` (whether it is loading), `CLUSTER INFO`, `CLUSTER MYID`, `CLUSTER MYSHARDID`. Not
/// the observer's whole `INFO`: parsing its five sections was most of a round's CPU (~27 µs a pod).
pub const QUESTIONS: [&[&str]; 5] = [
    &["ROLE"],
    &["INFO", "persistence"],
    &["CLUSTER", "INFO"],
    &["CLUSTER", "MYID"],
    &["CLUSTER", "MYSHARDID"],
];

/// A pod's answers to the short questions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glance {
    pub id: String,
    /// `CLUSTER MYSHARDID`, where the Valkey has it.
    pub shard_id: Option<String>,
    pub role: Role,
    /// A replica's primary, by the address it replicates from (`ROLE`).
    pub primary_ip: Option<String>,
    /// `cluster_known_nodes` of `CLUSTER INFO`: itself included.
    pub known_nodes: usize,
}

impl Glance {
    /// From the answers to [`QUESTIONS`], in order; `None` for a node that is loading, not in
    /// cluster mode (`CLUSTER INFO` is an error), or whose role, id or node count is missing.
    pub fn answered(replies: &[Reply]) -> Option<Glance> {
        let [role, persistence, cluster_info, my_id, shard_id] = replies else {
            return None;
        };
        if Info::field(persistence.as_text()?, "loading")? != "0" {
            return None;
        }
        let known_nodes = Info::field(cluster_info.as_text()?, "cluster_known_nodes")?;
        let role_now = role_reply(role)?;
        let from = || role.as_array()?.get(1)?.as_text().map(str::to_owned);
        Some(Glance {
            id: my_id.as_text()?.to_owned(),
            shard_id: shard_id.as_text().map(str::to_owned),
            role: role_now,
            primary_ip: (role_now == Role::Replica).then(from).flatten(),
            known_nodes: known_nodes.parse().ok()?,
        })
    }
}

/// One node as the local map lists it.
#[derive(Debug, Clone)]
struct Listed {
    ip: String,
    role: Role,
    shard: String,
    failed: bool,
    /// A primary of a shard that serves slots.
    serving: bool,
    /// Its shard's primary (id, IP), other than itself.
    primary: Option<(String, String)>,
}

/// The coordinator's own node's map, prepared once a round to vouch for the pods that agree with
/// it. Every vouched pod shares its listings: a round holds them once.
#[derive(Debug, Clone, Default)]
pub struct LocalMap {
    nodes: HashMap<String, Listed>,
    knows: Arc<BTreeSet<String>>,
    addrs: Arc<Listing>,
    failed: BTreeSet<String>,
}

impl LocalMap {
    /// From the local node's `CLUSTER SHARDS`.
    pub fn new(shards: &[Shard]) -> LocalMap {
        let nodes: HashMap<String, Listed> = shards
            .iter()
            .flat_map(|s| s.nodes.iter().map(move |n| (n.id.clone(), listed(s, n))))
            .collect();
        let all = || shards.iter().flat_map(|s| &s.nodes);
        LocalMap {
            knows: Arc::new(nodes.keys().cloned().collect()),
            addrs: Arc::new(all().map(|n| (n.id.clone(), n.ip.clone())).collect()),
            failed: forgettable(shards).collect(),
            nodes,
        }
    }

    /// The node of the pod at `ip` as this map has it, if the pod's own answers agree with the
    /// map (see the module); `None`: read its whole map.
    pub fn vouch(&self, glance: &Glance, ip: &str) -> Option<ClusterNode> {
        let listed = self.nodes.get(&glance.id)?;
        let primary = listed.primary.as_ref();
        let same_primary =
            glance.role != Role::Replica || primary.map(|(_, at)| at) == glance.primary_ip.as_ref();
        let agrees = listed.ip == ip
            && !listed.failed
            && listed.role == glance.role
            && glance.known_nodes == self.nodes.len()
            && glance.shard_id.as_ref().is_none_or(|s| *s == listed.shard)
            && same_primary;
        agrees.then(|| ClusterNode {
            id: glance.id.clone(),
            role: glance.role,
            owns_slots: listed.serving,
            primary: primary
                .filter(|_| glance.role == Role::Replica)
                .map(|(id, _)| id.clone()),
            knows: Arc::clone(&self.knows),
            failed: self.failed.clone(),
            addrs: Arc::clone(&self.addrs),
        })
    }
}

fn listed(shard: &Shard, node: &crate::shards::ShardNode) -> Listed {
    let primary = shard.primary().filter(|p| p.id != node.id);
    Listed {
        ip: node.ip.clone(),
        role: node.role,
        shard: shard.id.clone(),
        failed: node.health == NodeHealth::Failed,
        serving: node.role == Role::Primary && !shard.slots.is_empty(),
        primary: primary.map(|p| (p.id.clone(), p.ip.clone())),
    }
}

/// Whether the pod at `position` (of `pods`, in name order) is read in full in formation round
/// `round` whatever its answers: [`AUDIT`] pods a round, in turn, so that every pod's whole map
/// is read at least once every `ceil(pods / AUDIT)` rounds.
pub fn audited(position: usize, pods: usize, round: u64) -> bool {
    let turns = u64::try_from(pods.div_ceil(AUDIT))
        .unwrap_or(u64::MAX)
        .max(1);
    let turn = usize::try_from(round % turns).unwrap_or(0);
    position / AUDIT == turn
}
