//! The supervised rolling update: which pod to replace next, so that every primary moves once.
//!
//! The chart's StatefulSets use `updateStrategy: OnDelete`; the coordinator replaces the pods not
//! at their set's update revision itself, one step at a time ([`decide`]):
//! 1. Replicas first, one per shard at a time: an out-of-sync or unready one first (replacing it
//!    costs nothing), else the highest ordinal — and only while every *other* pod of the shard is
//!    Ready, in sync and staying, with a live primary among them.
//! 2. Then the primary is handed over to the best updated, synced replica (highest offset, then
//!    the preferred zone, then the name) — a lossless coordinated failover — and once it serves as
//!    a replica it is replaced as in 1. Replicas go first so the new primary is never replaced
//!    again: one primary move per shard.
//! 3. At most `max_shards_rolling` shards roll at once (the first ones by name that have an
//!    outdated pod); while any other shard is short of its full count of healthy pods the roll
//!    waits and says why, so an upgrade never takes a second copy of anything at risk.
//!
//! StatefulSet's own `RollingUpdate` restarts every shard at once, highest ordinal first, blind to
//! which pod is primary and to replication sync: a primary could be moved twice or restarted
//! before its replicas were back in sync. PodDisruptionBudgets do not limit a rollout.

use crate::observation::Role;

/// One pod of a shard as the roll sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RollPod {
    pub name: String,
    /// Valkey's id for the node (the pod name in replication mode): what a hand-over names.
    pub id: String,
    /// The pod's index in its shard (`valkey.io/node-index`, else the StatefulSet ordinal): among
    /// healthy replicas the highest goes first, as StatefulSet's own rolling update would.
    pub ordinal: u32,
    /// The pod runs its set's update revision.
    pub updated: bool,
    pub role: Role,
    /// A primary: live. A replica: linked and its pod Ready (in sync). Never while terminating.
    pub healthy: bool,
    pub offset: u64,
    /// The pod runs in its shard's preferred zone.
    pub preferred_zone: bool,
    /// Its node can keep carrying Valkey (Ready, not cordoned): a hand-over target must.
    pub node_usable: bool,
}

/// One shard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RollShard {
    pub name: String,
    pub pods: Vec<RollPod>,
    /// A move or a replacement of this shard has not landed yet.
    pub busy: bool,
    /// Its primary has been the same for [`SETTLE_MS`].
    pub settled: bool,
}

/// How long a shard keeps its primary before the roll's next step there. After a hand-over the
/// other replicas re-point to the new primary, and a pod's Ready condition lags its Valkey by up to
/// a probe period: replacing the old primary at once could take the shard's last in-sync replica
/// with it (seen: one Ready pod left and a 2.8 s write pause, `NOREPLICAS`).
pub const SETTLE_MS: u64 = 5_000;

/// Knobs (`SIDECAR_ROLL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollPolicy {
    /// How many shards may roll at once.
    pub max_shards_rolling: usize,
    /// A whole shard's pod count (1 primary + replicas).
    pub pods_per_shard: usize,
}

/// One step of the roll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollStep {
    /// Replace the pod (the coordinator evicts it): its StatefulSet re-creates it at the update
    /// revision.
    Replace {
        shard: String,
        pod: String,
        reason: String,
    },
    /// Hand the primary `from` over to the updated replica `to` (ids).
    Handover {
        shard: String,
        from: String,
        to: String,
        reason: String,
    },
}

/// The roll's answer for one round.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RollPlan {
    pub steps: Vec<RollStep>,
    /// Pods not at their update revision yet: the roll is under way while any is left.
    pub outdated: usize,
    /// Why the roll cannot go on now, when it has pods left to replace and takes no step.
    pub waiting: Option<String>,
}

/// What to do next. `unknown` names the pods whose revision is not known (a set not seen yet, a
/// pod without its revision label): the roll takes no step until it knows, since it cannot tell
/// which pods it would leave behind.
pub fn decide(shards: &[RollShard], unknown: &[String], policy: &RollPolicy) -> RollPlan {
    let outdated: Vec<&RollShard> = shards.iter().filter(|s| has_outdated(s)).collect();
    if outdated.is_empty() {
        return RollPlan::default();
    }
    let count = shards
        .iter()
        .flat_map(|s| &s.pods)
        .filter(|p| !p.updated)
        .count();
    if let Some(pod) = unknown.first() {
        return waiting(count, format!("the revision of pod {pod} is not known"));
    }
    let rolling = &outdated[..policy.max_shards_rolling.max(1).min(outdated.len())];
    let rolls = |s: &RollShard| rolling.iter().any(|r| r.name == s.name);
    if let Some(short) = shards.iter().find(|s| !rolls(s) && !whole(s, policy)) {
        return waiting(count, shortfall(short, policy));
    }
    let mut plan = RollPlan {
        outdated: count,
        ..RollPlan::default()
    };
    let mut reasons = Vec::new();
    for shard in rolling.iter().filter(|s| !s.busy) {
        match step(shard, policy) {
            Ok(step) => plan.steps.push(step),
            Err(why) => reasons.push(why),
        }
    }
    if plan.steps.is_empty() && !reasons.is_empty() {
        plan.waiting = Some(reasons.join("; "));
    }
    plan
}

fn waiting(outdated: usize, reason: String) -> RollPlan {
    RollPlan {
        steps: Vec::new(),
        outdated,
        waiting: Some(reason),
    }
}

fn has_outdated(s: &RollShard) -> bool {
    s.pods.iter().any(|p| !p.updated)
}

fn healthy_count<'a>(pods: impl Iterator<Item = &'a RollPod>) -> usize {
    pods.filter(|p| p.healthy).count()
}

/// The shard has its full count of healthy pods, one of them a live primary.
fn whole(s: &RollShard, policy: &RollPolicy) -> bool {
    let primary = s.pods.iter().any(|p| p.healthy && p.role == Role::Primary);
    primary && healthy_count(s.pods.iter()) >= policy.pods_per_shard
}

fn shortfall(s: &RollShard, policy: &RollPolicy) -> String {
    let healthy = healthy_count(s.pods.iter());
    let want = policy.pods_per_shard;
    format!(
        "shard {} has {healthy} of {want} pods healthy (Ready, in sync, with a live primary)",
        s.name
    )
}

/// The next step of one rolling shard, or why it has none.
fn step(s: &RollShard, policy: &RollPolicy) -> Result<RollStep, String> {
    // A view that shows two primaries in one shard has not settled after a move: acting on it
    // could move the shard's primary a second time.
    let primaries = s.pods.iter().filter(|p| p.role == Role::Primary).count();
    if primaries > 1 {
        let name = &s.name;
        return Err(format!(
            "shard {name}: the view shows {primaries} primaries; waiting for it to settle"
        ));
    }
    if !s.settled {
        let name = &s.name;
        return Err(format!(
            "shard {name}: a new primary; its replicas re-point first"
        ));
    }
    if let Some(pod) = replica_to_replace(s) {
        return replace(s, pod, policy);
    }
    let primary = s
        .pods
        .iter()
        .find(|p| !p.updated && p.role == Role::Primary);
    let Some(primary) = primary else {
        return Err(format!("shard {}: no live primary", s.name));
    };
    if !whole(s, policy) {
        return Err(shortfall(s, policy));
    }
    let Some(to) = successor(s) else {
        let name = &s.name;
        return Err(format!(
            "shard {name}: no updated replica in sync to hand over to"
        ));
    };
    Ok(RollStep::Handover {
        shard: s.name.clone(),
        from: primary.id.clone(),
        to: to.id.clone(),
        reason: format!(
            "rolling update: pod {} is not at its update revision",
            primary.name
        ),
    })
}

/// The outdated pod that is not the primary to replace first: an unhealthy one, else the
/// highest ordinal.
fn replica_to_replace(s: &RollShard) -> Option<&RollPod> {
    let mut outdated: Vec<&RollPod> = s
        .pods
        .iter()
        .filter(|p| !p.updated && p.role != Role::Primary)
        .collect();
    outdated.sort_by(|a, b| a.healthy.cmp(&b.healthy).then(b.ordinal.cmp(&a.ordinal)));
    outdated.first().copied()
}

/// Replaces `pod` if the rest of its shard is whole without it.
fn replace(s: &RollShard, pod: &RollPod, policy: &RollPolicy) -> Result<RollStep, String> {
    let rest = s.pods.iter().filter(|p| p.name != pod.name);
    let primary = s.pods.iter().any(|p| p.healthy && p.role == Role::Primary);
    let need = policy.pods_per_shard.saturating_sub(1);
    let have = healthy_count(rest);
    if !primary || have < need {
        return Err(format!(
            "shard {}: {have} of the {need} other pods healthy, pod {} waits",
            s.name, pod.name
        ));
    }
    Ok(RollStep::Replace {
        shard: s.name.clone(),
        pod: pod.name.clone(),
        reason: format!(
            "rolling update: pod {} is not at its update revision",
            pod.name
        ),
    })
}

/// The best updated replica in sync on a usable node: highest offset, then the preferred zone,
/// then the name.
fn successor(s: &RollShard) -> Option<&RollPod> {
    let mut c: Vec<&RollPod> = s
        .pods
        .iter()
        .filter(|p| p.updated && p.role == Role::Replica && p.healthy && p.node_usable)
        .collect();
    c.sort_by(|a, b| {
        b.offset
            .cmp(&a.offset)
            .then(b.preferred_zone.cmp(&a.preferred_zone))
            .then(a.name.cmp(&b.name))
    });
    c.first().copied()
}
