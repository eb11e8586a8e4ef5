//! Whether a Valkey that stopped may start again (cluster mode).
//!
//! A primary that served slots and crashed comes back empty without persistence (or with an
//! older snapshot with it) and, with its `nodes.conf`, still as the slots' owner: back within
//! `cluster-node-timeout` it is never failed over, takes writes again, and its replicas resync
//! from it — every acknowledged write of the shard is gone. So its restart is held (the chart
//! runs `valkey-sidecar await` in front of `valkey-server`) until a replica has taken its slots
//! over; then it rejoins as that replica's replica. It is not held when nobody could take over:
//! no replica, no replica answering, or too few primaries left to elect one.

use crate::health::Verdict;
use crate::observation::{Observation, Role};
use crate::shards::{NodeHealth, Shard, ShardNode};

/// The answer to a waiting start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permit {
    /// Start Valkey now.
    Go(String),
    /// Not yet: a replica is expected to take over first.
    Hold(String),
}

impl Permit {
    pub fn go(&self) -> bool {
        matches!(self, Permit::Go(_))
    }

    pub fn reason(&self) -> &str {
        match self {
            Permit::Go(r) | Permit::Hold(r) => r,
        }
    }
}

/// A primary whose restart waits for a takeover: its id and the replicas that could take over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Takeover {
    pub my_id: String,
    pub replicas: Vec<ShardNode>,
}

/// Whether the node, as last observed, is a primary serving slots with a replica: the only case
/// whose restart is held. `Err` says why not.
pub fn takeover(last: Option<&Observation>) -> Result<Takeover, String> {
    let Some(last) = last else {
        return Err("nothing observed before: a first start".into());
    };
    let Some(my_id) = last.cluster.as_ref().and_then(|c| c.my_id.clone()) else {
        return Err("not a cluster node when last seen".into());
    };
    let shard = last.my_shard().filter(|s| !s.slots.is_empty());
    let Some(shard) = shard.filter(|_| last.role == Role::Primary) else {
        return Err("not a primary serving slots when last seen".into());
    };
    let replicas: Vec<ShardNode> = shard
        .nodes
        .iter()
        .filter(|n| n.id != my_id && n.role == Role::Replica)
        .cloned()
        .collect();
    if replicas.is_empty() {
        return Err("no replica to take over: the shard starts with what this node has".into());
    }
    Ok(Takeover { my_id, replicas })
}

/// The permit, from the last observation and the cluster as the replicas that answered see it
/// (`None`: not asked yet).
pub fn decide(last: Option<&Observation>, views: Option<&[Vec<Shard>]>) -> Permit {
    let t = match takeover(last) {
        Ok(t) => t,
        Err(why) => return Permit::Go(why),
    };
    let Some(views) = views else {
        return Permit::Hold(format!(
            "{} served slots: a restart waits for a replica to take over",
            t.my_id
        ));
    };
    if views.is_empty() {
        return Permit::Go("no replica answers: none can take over".into());
    }
    if let Some(new) = views.iter().find_map(|v| taken_over(v, &t.my_id)) {
        return Permit::Go(format!("{new} took over the slots of {}", t.my_id));
    }
    if views.iter().all(|v| !electable(v, &t.my_id)) {
        return Permit::Go("too few primaries online to elect a replica".into());
    }
    Permit::Hold(format!(
        "waiting for a replica to take over the slots of {}",
        t.my_id
    ))
}

/// In `view`, the node that now serves the slots of `my_id` (or `"nobody"` if `my_id` is no
/// longer a primary with slots there), if the takeover happened.
fn taken_over(view: &[Shard], my_id: &str) -> Option<String> {
    let Some(shard) = view.iter().find(|s| s.contains(my_id)) else {
        return Some("nobody (the node is forgotten)".into());
    };
    // A dead primary stays in its shard's entry (a master without slots, failed) beside the
    // replica that took over, so the test is "another primary", not "the first primary".
    let other = shard
        .nodes
        .iter()
        .find(|n| n.id != my_id && n.role == Role::Primary);
    let me = shard.nodes.iter().find(|n| n.id == my_id);
    match (other, me) {
        (Some(p), _) => Some(p.id.clone()),
        (None, Some(n)) if n.role == Role::Primary && !shard.slots.is_empty() => None,
        (None, _) => Some("nobody".into()),
    }
}

/// Whether enough primaries besides `my_id` are online to vote a replica in: a majority of the
/// primaries serving slots (Valkey's failover quorum).
fn electable(view: &[Shard], my_id: &str) -> bool {
    let serving: Vec<&ShardNode> = view
        .iter()
        .filter(|s| !s.slots.is_empty())
        .filter_map(Shard::primary)
        .collect();
    let voters = serving
        .iter()
        .filter(|p| p.id != my_id && p.health == NodeHealth::Online)
        .count();
    voters > serving.len() / 2
}

/// Liveness while a start is held: Valkey is meant not to run, so its silence is no reason to
/// restart its container — a restart would change nothing but the count, and repeated, the
/// kubelet's crash-loop back-off would delay the start once it goes.
pub fn liveness(verdict: Verdict, valkey_down: bool, permit: &Permit) -> Verdict {
    match permit {
        Permit::Hold(why) if valkey_down && !verdict.ok => Verdict {
            ok: true,
            reason: format!("valkey's start is held: {why}"),
        },
        _ => verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observation::Role;

    fn primary(shard: &str, id: &str, health: NodeHealth) -> Shard {
        Shard {
            id: shard.into(),
            slots: vec![(0, 100)],
            nodes: vec![ShardNode {
                id: id.into(),
                role: Role::Primary,
                health,
                ..ShardNode::default()
            }],
        }
    }

    #[test]
    fn one_other_primary_of_three_is_no_majority_two_of_three_are() {
        let mut view = vec![
            primary("s1", "a", NodeHealth::Online),
            primary("s2", "b", NodeHealth::Online),
            primary("s3", "c", NodeHealth::Online),
        ];
        assert!(electable(&view, "a"));
        view[2].nodes[0].health = NodeHealth::Failed;
        assert!(!electable(&view, "a"));
    }
}
