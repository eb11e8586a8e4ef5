//! Whether a Valkey that stopped may start again (cluster mode).
//!
//! A primary that served slots and crashed comes back empty without persistence (or with an
//! older snapshot with it) and, with its `nodes.conf`, still as the slots' owner: back within
//! `cluster-node-timeout` it is never failed over, takes writes again, and its replicas resync
//! from it — every acknowledged write of the shard is gone. So its restart is held (the chart
//! runs `valkey-sidecar await` in front of `valkey-server`) until a replica has taken its slots
//! over; then it rejoins as that replica's replica. It is not held when nobody could take over:
//! no replica, no replica running (every one refuses), none answering for [`SILENT_GO_MS`], or
//! too few primaries left to elect one.

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
    // Every other member of the shard may hold its data: a replica, and also a node still shown
    // as a master right after handing the primary to this one (gossip lags its demotion by a
    // moment; a restart then would make the empty node its sync source). Only a master the
    // cluster marked failed is left out.
    let replicas: Vec<ShardNode> = shard
        .nodes
        .iter()
        .filter(|n| n.id != my_id && (n.role == Role::Replica || n.health != NodeHealth::Failed))
        .cloned()
        .collect();
    if replicas.is_empty() {
        return Err("no replica to take over: the shard starts with what this node has".into());
    }
    Ok(Takeover { my_id, replicas })
}

/// How long every replica may leave the question unanswered (timeouts, not refusals) before the
/// start goes on without them. A replica that does not answer in time may only be slow: on an
/// overloaded node a live replica can miss the guard's 300 ms limit, and an empty primary
/// started then becomes its replica's sync source: the shard's writes are gone. A live replica
/// takes the slots over by itself within about `cluster-node-timeout` (5 s in the chart) of the
/// primary's death; 30 s of silence is six of those, and the start waits longer only up to the
/// `await` timeout (`valkey.awaitStartTimeout`). A start held longer costs the shard's
/// availability; a start too early costs its data.
pub const SILENT_GO_MS: u64 = 30_000;

/// What the replicas answered when asked how they see the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replies {
    /// `CLUSTER SHARDS` of each replica that answered.
    pub views: Vec<Vec<Shard>>,
    /// Replicas whose Valkey refused the connection: nothing listens there, so it cannot take
    /// over (a node that is gone or cut off is silent instead).
    pub refused: usize,
    /// Replicas asked.
    pub asked: usize,
    /// For how long no replica has answered, on the asker's monotonic clock (0 when one did).
    pub silent_for_ms: u64,
}

/// The permit, from the last observation and what the replicas answered (`None`: not asked
/// yet).
pub fn decide(last: Option<&Observation>, replies: Option<&Replies>) -> Permit {
    let t = match takeover(last) {
        Ok(t) => t,
        Err(why) => return Permit::Go(why),
    };
    let Some(replies) = replies else {
        return Permit::Hold(format!(
            "{} served slots: a restart waits for a replica to take over",
            t.my_id
        ));
    };
    let views = &replies.views;
    if views.is_empty() {
        return unanswered(replies);
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

/// No replica answered: go when none runs (every one refused) or all have been silent for
/// [`SILENT_GO_MS`]; a silent replica may be alive and about to take over.
fn unanswered(replies: &Replies) -> Permit {
    if replies.refused >= replies.asked {
        return Permit::Go("no replica runs (every one refused): none can take over".into());
    }
    if replies.silent_for_ms >= SILENT_GO_MS {
        return Permit::Go(format!(
            "no replica answered for {} s: none can take over",
            SILENT_GO_MS / 1000
        ));
    }
    // No running count in the words: the permit is logged each time they change.
    Permit::Hold(format!(
        "no replica answers yet: a slow one may still take over (the start goes after {} s of silence)",
        SILENT_GO_MS / 1000
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
