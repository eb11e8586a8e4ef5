//! Cluster mode: failing over a primary whose Valkey died, without waiting for
//! `cluster-node-timeout`.
//!
//! Dead means its socket refuses connections (the process is gone, or held at its restart by
//! `valkey-sidecar await`): a slow, blocked or loading Valkey still accepts them and is left to
//! Valkey's own failure detection. The coordinator then asks the replica with the highest offset,
//! read from each replica itself, to take over with `CLUSTER FAILOVER FORCE`: no handshake with
//! the dead primary, but still Valkey's election among the primaries, so config epochs keep it
//! safe (`TAKEOVER`, which skips the election, is never used).

use crate::moves::Ledger;
use crate::observation::{Observation, Role};
use crate::shards::{NodeHealth, Shard, ShardNode};
use crate::time::Millis;

/// A primary that died is failed over once; the same node dying again is acted on only after
/// this long (its socket keeps refusing while the failover runs, and a view that still shows it
/// serving slots lags the failover just sent).
pub const CRASH_REPEAT_MS: u64 = 10_000;

/// What the coordinator knows when a primary's socket says it died.
#[derive(Debug, Clone, Copy)]
pub struct Death<'a> {
    pub now: Millis,
    /// The dead node's id.
    pub node: &'a str,
    /// The coordinator's view of the cluster (`CLUSTER SHARDS`, fresh).
    pub shards: &'a [Shard],
    /// When a death of this node was last acted on (or left to a hand-over).
    pub last_handled: Option<Millis>,
    /// Its pod is being deleted (`deletionTimestamp` set).
    pub terminating: bool,
}

/// What a primary's death calls for ([`decide`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeathVerdict<'a> {
    /// The view shows it serving no slots as primary: already failed over, or never a primary.
    NotServing,
    /// A death of this node was handled less than [`CRASH_REPEAT_MS`] ago.
    Repeated,
    /// Its pod is going away: the planned hand-over's (its preStop holds Valkey until then);
    /// after it the view can lag, and forcing a replica then could depose the primary the
    /// hand-over just made.
    LeftToHandover,
    /// A move of its shard is running or settling.
    Busy,
    /// Read the offsets of these replicas (from each replica itself), then [`target`].
    ReadOffsets {
        shard: &'a Shard,
        candidates: Vec<&'a ShardNode>,
    },
}

impl DeathVerdict<'_> {
    /// Whether the death counts as handled now (the repeat window starts); after
    /// [`DeathVerdict::ReadOffsets`], [`handled_after_reading`] says.
    pub fn handled(&self) -> bool {
        matches!(self, DeathVerdict::LeftToHandover)
    }
}

/// Whether a death counts as handled once the replicas' offsets were read: a failover was sent,
/// or some replica answered (it is not waiting on one). When none answered (a frozen or
/// overloaded replica, 300 ms each), the next report of the death — every 250 ms while its
/// socket refuses — asks again, so the shard is failed over once the replica can answer rather
/// than only after `cluster-node-timeout` by Valkey itself.
pub fn handled_after_reading(offsets: &[ReplicaOffset], sent: bool) -> bool {
    sent || offsets.iter().any(|o| o.offset.is_some())
}

/// The one entry point for a primary's death: whether to fail its shard over, before any offset
/// is read. In this order: not serving, repeated, its pod terminating, its shard busy.
pub fn decide<'a>(death: &Death<'a>, moves: &Ledger) -> DeathVerdict<'a> {
    let Some(shard) = crashed_shard(death.shards, death.node) else {
        return DeathVerdict::NotServing;
    };
    let repeated = death
        .last_handled
        .is_some_and(|at| death.now.since(at) < CRASH_REPEAT_MS);
    if repeated {
        return DeathVerdict::Repeated;
    }
    if death.terminating {
        return DeathVerdict::LeftToHandover;
    }
    if moves.is_busy(&shard.id) {
        return DeathVerdict::Busy;
    }
    let candidates = candidates(shard, death.node).collect();
    DeathVerdict::ReadOffsets { shard, candidates }
}

/// A replica as read from the replica itself (`offset` `None`: it did not answer).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaOffset {
    pub id: String,
    pub offset: Option<u64>,
    /// The primary it follows (`master_host`, `master_port`).
    pub primary: Option<(String, u16)>,
    /// `master_link_status:up`.
    pub link_up: bool,
}

impl ReplicaOffset {
    /// What `id`'s own observation says (`None`: it did not answer in time).
    pub fn read(id: &str, seen: Option<&Observation>) -> ReplicaOffset {
        let link = seen.and_then(|o| o.link.as_ref());
        ReplicaOffset {
            id: id.to_owned(),
            offset: seen.map(|o| o.repl_offset),
            primary: link.map(|l| (l.host.clone(), l.port)),
            link_up: link.is_some_and(|l| l.up),
        }
    }

    /// It still follows `dead` and has lost the link: the coordinator's view (gossip) can lag a
    /// planned hand-over, and a replica that already follows a live new primary must never be
    /// forced to take over from it.
    fn orphan_of(&self, dead: &ShardNode) -> bool {
        let follows = self
            .primary
            .as_ref()
            .is_some_and(|(h, p)| *h == dead.ip && *p == dead.port);
        follows && !self.link_up
    }
}

/// The failover to send, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashFailover {
    pub shard: String,
    pub dead: String,
    pub to: String,
    pub reason: String,
}

/// The shard `dead` serves slots of as primary in `shards` (the coordinator's view); `None` once
/// it does not (already failed over, or never a primary).
pub fn crashed_shard<'a>(shards: &'a [Shard], dead: &str) -> Option<&'a Shard> {
    shards
        .iter()
        .filter(|s| !s.slots.is_empty())
        .find(|s| s.primary().is_some_and(|p| p.id == dead))
}

/// The replicas that could take over: the shard's other nodes not marked failed.
pub fn candidates<'a>(shard: &'a Shard, dead: &'a str) -> impl Iterator<Item = &'a ShardNode> {
    shard
        .nodes
        .iter()
        .filter(move |n| n.id != dead && n.role == Role::Replica && n.health != NodeHealth::Failed)
}

/// The replica to promote: the highest offset among those that answered; on a tie the one in the
/// dead primary's zone (clients there keep their latency), then the lowest id (deterministic).
pub fn target(
    shard: &Shard,
    dead: &str,
    offsets: &[ReplicaOffset],
) -> Result<CrashFailover, String> {
    let Some(dead_node) = shard.nodes.iter().find(|n| n.id == dead) else {
        return Err(format!("shard {}: {dead} is not a member", shard.id));
    };
    let zone = dead_node.availability_zone.as_deref();
    let answered = candidates(shard, dead).filter_map(|n| {
        let read = offsets.iter().find(|o| o.id == n.id)?;
        Some((n, read.offset.filter(|_| read.orphan_of(dead_node))?))
    });
    let best = answered.max_by(|(a, ao), (b, bo)| {
        let same_zone = |n: &ShardNode| zone.is_some() && n.availability_zone.as_deref() == zone;
        ao.cmp(bo)
            .then(same_zone(a).cmp(&same_zone(b)))
            .then(b.id.cmp(&a.id))
    });
    let Some((node, offset)) = best else {
        return Err(format!(
            "shard {}: no replica answered that still follows {dead} with its link down",
            shard.id
        ));
    };
    Ok(CrashFailover {
        shard: shard.id.clone(),
        dead: dead.to_owned(),
        to: node.id.clone(),
        reason: format!(
            "{dead}'s Valkey refuses connections (it died); {} has the highest offset ({offset}) of the replicas that answered",
            node.id
        ),
    })
}
