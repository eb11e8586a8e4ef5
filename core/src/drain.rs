//! `valkey-sidecar drain-check`: whether a node can be drained now, and why not — which shard
//! would lose what. Read-only: the adapter gathers the pods, their shards and a server-side
//! dry-run eviction of each (the apiserver's own PodDisruptionBudget verdict); these rules add what
//! a budget cannot see.

use std::collections::BTreeMap;

use crate::observation::Role;

/// What a dry-run eviction of a pod said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    Allowed,
    /// 429 (a budget would be violated) or another refusal, with the apiserver's message.
    Refused(String),
}

/// A pod of the deployment, on the node to drain or elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardCopy {
    pub pod: String,
    /// The shard (`valkey.io/shard-index`, else Valkey's shard id label).
    pub shard: String,
    /// The live role label.
    pub role: Option<Role>,
    /// Ready: for a replica, in sync (the agent's readiness).
    pub ready: bool,
    pub node: String,
    /// Its node is usable (Ready, not cordoned) — where a hand-over may go.
    pub usable_node: bool,
}

/// Everything the check looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainView {
    pub node: String,
    /// Every pod of the deployment, this node's included.
    pub copies: Vec<ShardCopy>,
    /// The dry-run eviction of each pod on the node.
    pub evictions: BTreeMap<String, Eviction>,
}

/// The answer for one pod on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodVerdict {
    pub pod: String,
    pub shard: String,
    /// It can be evicted now.
    pub now: bool,
    pub reason: String,
}

/// The answer for the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeVerdict {
    /// Every pod on the node can be evicted now (a drain would not wait).
    pub now: bool,
    pub pods: Vec<PodVerdict>,
    /// Facts about the node as a whole (several copies of a shard on it, …).
    pub notes: Vec<String>,
}

/// Judges every pod of the deployment on `view.node`.
pub fn decide(view: &DrainView) -> NodeVerdict {
    let pods: Vec<PodVerdict> = on_node(view).map(|c| pod(view, c)).collect();
    NodeVerdict {
        now: pods.iter().all(|p| p.now),
        notes: crowded(view),
        pods,
    }
}

fn on_node(view: &DrainView) -> impl Iterator<Item = &ShardCopy> {
    view.copies.iter().filter(move |c| c.node == view.node)
}

fn verdict(c: &ShardCopy, now: bool, reason: String) -> PodVerdict {
    PodVerdict {
        pod: c.pod.clone(),
        shard: c.shard.clone(),
        now,
        reason,
    }
}

fn pod(view: &DrainView, c: &ShardCopy) -> PodVerdict {
    if let Some(Eviction::Refused(why)) = view.evictions.get(&c.pod) {
        return verdict(c, false, format!("the eviction would be refused: {why}"));
    }
    match c.role {
        Some(Role::Primary) => primary(view, c),
        _ => verdict(c, true, "a replica: the shard keeps its primary".into()),
    }
}

/// Other copies of `c`'s shard, off the node being drained.
fn elsewhere<'a>(view: &'a DrainView, c: &'a ShardCopy) -> impl Iterator<Item = &'a ShardCopy> {
    view.copies
        .iter()
        .filter(move |o| o.shard == c.shard && o.pod != c.pod && o.node != view.node)
}

fn primary(view: &DrainView, c: &ShardCopy) -> PodVerdict {
    let takes_over = |o: &&ShardCopy| o.ready && o.usable_node && o.role == Some(Role::Replica);
    if let Some(t) = elsewhere(view, c).find(takes_over) {
        let reason = format!(
            "the primary: hands over to {} (in sync, on {}) before it stops",
            t.pod, t.node
        );
        return verdict(c, true, reason);
    }
    if elsewhere(view, c).next().is_none() && !same_node_peers(view, c) {
        let reason = "the shard's only pod: it stops as primary and, without persistence, its data goes with it";
        return verdict(c, true, reason.into());
    }
    let reason = format!(
        "the primary of shard {}, and no replica elsewhere is in sync on a usable node: it would stop without a hand-over",
        c.shard
    );
    verdict(c, false, reason)
}

fn same_node_peers(view: &DrainView, c: &ShardCopy) -> bool {
    on_node(view).any(|o| o.shard == c.shard && o.pod != c.pod)
}

/// Shards with more than one copy on the node: a drain takes them one at a time (the budget
/// allows one disruption per shard), and meanwhile the shard runs short.
fn crowded(view: &DrainView) -> Vec<String> {
    let mut by_shard: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in on_node(view) {
        by_shard
            .entry(c.shard.as_str())
            .or_default()
            .push(c.pod.as_str());
    }
    by_shard
        .into_iter()
        .filter(|(_, pods)| pods.len() > 1)
        .map(|(shard, pods)| {
            format!(
                "shard {shard} has {} copies on this node ({}): evicted one at a time",
                pods.len(),
                pods.join(", ")
            )
        })
        .collect()
}
