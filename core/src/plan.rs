//! The coordinator's rules: `decide(&World, &Policy) -> Plan`.
//!
//! Only the Lease holder acts on a plan. The planner is pure: the adapter gathers the [`World`]
//! (Valkey's view of the shards, the pods and nodes from Kubernetes, what is already in flight,
//! the local time) and executes the returned actions. Every action carries its reason, so Events
//! and logs say why.
//!
//! Precedence, highest first (so the policies never fight):
//! 1. **Hand-over** of a primary whose pod or node is going away (terminating pod, cordoned or
//!    NotReady node) — safety, no quiet period, no cooldown.
//! 2. **Fail-back** of a primary to its shard's preferred zone (off by default) — only after the
//!    shard has been steady for the quiet period.
//! 3. **Balance** of primaries across nodes — never moves a primary out of its preferred zone, never
//!    onto a node that would then exceed the cap, one move at a time with a cooldown.

use std::collections::{BTreeMap, BTreeSet};

use crate::observation::Role;
use crate::replication::MemberValkey;
use crate::roll::{self, RollPod, RollPolicy, RollShard, RollStep};
use crate::shards::NodeHealth;
use crate::time::Millis;

/// A pod as the coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    pub name: String,
    pub node: Option<String>,
    pub ready: bool,
    /// `deletionTimestamp` is set: the pod is going away.
    pub terminating: bool,
    /// valkey-operator's `valkey.io/node-index` (0 = the intended primary).
    pub node_index: Option<u32>,
    /// The pod's own `topology.kubernetes.io/zone` label (Kubernetes >= 1.35 copies it from the
    /// Node), for when Nodes may not be read ([`unseen_nodes`]).
    pub zone: Option<String>,
    /// Whether the pod runs its StatefulSet's update revision; `None` where not known (the
    /// supervised roll waits for it, [`crate::roll`]).
    pub updated: Option<bool>,
}

/// A Kubernetes node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    pub zone: Option<String>,
    pub ready: bool,
    pub unschedulable: bool,
}

impl NodeInfo {
    /// A node that can keep carrying Valkey.
    pub fn usable(&self) -> bool {
        self.ready && !self.unschedulable
    }
}

/// Node facts where Nodes may not be read (RBAC without them: the chart's `namespace` profile):
/// each node a pod runs on counts as ready and schedulable, in the zone its pod is labelled with.
/// A node going away then shows only through its pods' eviction or deletion, which still starts a
/// hand-over (the pod is terminating); a cordon or a NotReady node goes unseen. Without this no
/// replica would ever be a candidate: every member's node would be unknown.
pub fn unseen_nodes<'a>(pods: impl IntoIterator<Item = &'a PodInfo>) -> BTreeMap<String, NodeInfo> {
    let mut nodes = BTreeMap::new();
    for pod in pods {
        let Some(node) = &pod.node else { continue };
        let info: &mut NodeInfo = nodes.entry(node.clone()).or_insert_with(|| NodeInfo {
            zone: None,
            ready: true,
            unschedulable: false,
        });
        info.zone = info.zone.take().or_else(|| pod.zone.clone());
    }
    nodes
}

/// One Valkey node, matched to its pod by address.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Member {
    pub id: String,
    pub shard: String,
    pub role: Role,
    pub offset: u64,
    pub health: NodeHealth,
    pub pod: Option<PodInfo>,
}

impl Member {
    /// A replication-mode pod as the planner sees it (id = pod name); `recorded`: the shard
    /// record names it primary.
    ///
    /// Only the recorded primary counts as primary: any other master is one the keepers are about
    /// to demote or fence, never a primary to hand over from or to balance. Online: a primary
    /// that answers, or a replica whose link is up (it is down during a full sync too).
    pub fn replicated(
        shard: &str,
        pod: PodInfo,
        valkey: Option<&MemberValkey>,
        recorded: bool,
    ) -> Member {
        let role = match valkey.map(|v| v.role) {
            Some(Role::Primary) if !recorded => Role::Unknown,
            Some(role) => role,
            None => Role::Unknown,
        };
        let online = match role {
            Role::Primary => true,
            Role::Replica => valkey.is_some_and(|v| v.link_up),
            Role::Unknown => false,
        };
        Member {
            id: pod.name.clone(),
            shard: shard.to_owned(),
            role,
            offset: valkey.map_or(0, |v| v.offset),
            health: if online {
                NodeHealth::Online
            } else {
                NodeHealth::Unknown
            },
            pod: Some(pod),
        }
    }

    /// A primary Valkey does not mark failed: the one a shard's rules act on.
    pub fn is_live_primary(&self) -> bool {
        self.role == Role::Primary && self.health != NodeHealth::Failed
    }

    /// A replica in sync with its primary: linked, and its pod Ready — the agent beside it judged
    /// its own offset against its primary's, which is the one exact comparison to be had.
    ///
    /// Offsets from two Valkeys are not comparable: in cluster mode the view holds each remote
    /// node's offset as of its last gossip packet, up to half a node timeout old, so under a steady
    /// 0.5 MB/s of writes a replica in sync looked a megabyte behind and the shard never became
    /// steady. Offsets only rank the synced replicas.
    pub fn is_synced_replica(&self) -> bool {
        let ready = self.pod.as_ref().is_some_and(|p| p.ready);
        self.role == Role::Replica && self.health == NodeHealth::Online && ready
    }
}

/// An action the coordinator started and has not seen finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub shard: String,
    pub started: Millis,
}

/// Everything the planner looks at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct World {
    pub now: Millis,
    /// Whether this agent holds the coordinator Lease *now* (before its renew deadline).
    pub coordinating: bool,
    pub members: Vec<Member>,
    pub nodes: BTreeMap<String, NodeInfo>,
    /// Per shard: since when it has been steady (same primary, all replicas synced).
    pub steady_since: BTreeMap<String, Millis>,
    /// Per shard: since when it has had its current primary.
    pub primary_since: BTreeMap<String, Millis>,
    pub in_flight: Vec<InFlight>,
    /// When the last fail-back or balance move started (for the cooldown).
    pub last_move: Option<Millis>,
    /// Pods of the deployment the scheduler could not place.
    pub pending: Vec<Pending>,
    /// Shards with a pod the supervised roll deleted and whose successor has not appeared yet:
    /// the roll leaves them alone (other moves do not, a deletion is not a move).
    pub replacing: BTreeSet<String>,
    /// The coordinator is paused (`valkey-sidecar pause`): it still hands over a primary whose
    /// pod or node is going away now, and answers a switchover asked for; nothing else.
    pub paused: bool,
    /// With `coordination: operator`, while the operator is not settled (its resource not
    /// Ready): no fail-back, no balance — the operator may be moving primaries itself.
    pub operator_busy: bool,
    /// A switchover an operator asked for (`valkey-sidecar switchover`).
    pub switchover: Option<Ask>,
}

/// A switchover asked for, with the pods of the shard it names (`valkey.io/shard-index`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ask {
    pub id: String,
    /// The shard as asked for (its index).
    pub shard: String,
    pub pods: BTreeSet<String>,
    /// The pod that should become primary; `None`: the best synced replica.
    pub to: Option<String>,
}

/// A pod the scheduler could not place (`PodScheduled=False`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pending {
    pub pod: String,
    /// The scheduler's reason (`Unschedulable`) and message (which rule it could not satisfy).
    pub reason: String,
    pub message: String,
}

/// Knobs, from configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub failback: bool,
    pub quiet_period_ms: u64,
    pub balance: bool,
    pub cooldown_ms: u64,
    /// Moves at once for fail-back, balance and the roll, counting the moves in flight and the
    /// safety hand-overs planned beside them (those have their own limit below).
    pub max_concurrent: usize,
    /// Safety hand-overs at once (primaries whose pod or node is going away), each on its own
    /// shard: a drained node may carry many primaries, and each pod's `preStop` waits for its
    /// own. The executor still runs their elections one at a time (`coordinator::execute`).
    /// A switchover asked for is outside both limits.
    pub max_handovers: usize,
    /// Configured preferred zone per shard id; otherwise the zone of the shard's node-index-0 pod.
    pub preferred_zones: BTreeMap<String, String>,
    /// The supervised rolling update (`SIDECAR_ROLL`), when the StatefulSets leave it to the
    /// coordinator (`updateStrategy: OnDelete`).
    pub roll: Option<RollPolicy>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            failback: false,
            quiet_period_ms: 60_000,
            balance: true,
            cooldown_ms: 30_000,
            max_concurrent: 1,
            max_handovers: 8,
            preferred_zones: BTreeMap::new(),
            roll: None,
        }
    }
}

/// What a move is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Handover,
    FailBack,
    Rebalance,
    /// The supervised rolling update hands an outdated primary over to an updated replica.
    Roll,
    /// An operator asked for it (`valkey-sidecar switchover`).
    Switchover,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Handover => "Handover",
            Kind::FailBack => "FailBack",
            Kind::Rebalance => "Rebalance",
            Kind::Roll => "Roll",
            Kind::Switchover => "Switchover",
        }
    }
}

/// Make `to` the primary of `shard` with a coordinated (lossless) failover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    pub kind: Kind,
    pub shard: String,
    pub from: String,
    pub to: String,
    pub reason: String,
}

/// A placement fact the user should see (status conditions, Events, metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    pub shard: String,
    pub reason: &'static str,
    pub message: String,
    /// The pod it is about, if one (the Event's object).
    pub pod: Option<String>,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    pub actions: Vec<Action>,
    /// Why something that should happen cannot (no candidate, concurrency limit, …).
    pub blocked: Vec<String>,
    pub drift: Vec<Drift>,
    /// Pods the supervised roll replaces now (evicted; their StatefulSet re-creates them updated).
    pub replacements: Vec<Replacement>,
    /// Pods the supervised roll has left to replace (not at their update revision).
    pub roll_outdated: usize,
    /// Why the supervised roll waits, while it has pods left to replace.
    pub roll_waiting: Option<String>,
    /// A switchover asked for that will not be made, and why (its id, the reason).
    pub refused: Option<(String, String)>,
}

/// Replace a pod (the coordinator evicts it) so its StatefulSet re-creates it at the update
/// revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    pub shard: String,
    pub pod: String,
    pub reason: String,
}

/// The world's members grouped by shard, built once per call so that a per-shard rule costs
/// the shard's size, not the world's (filtering the whole world per shard made a round over
/// 10,000 shards take 6 s).
pub struct Shards<'a> {
    pub world: &'a World,
    by_shard: BTreeMap<&'a str, Vec<&'a Member>>,
}

impl<'a> Shards<'a> {
    pub fn new(world: &'a World) -> Self {
        Shards {
            world,
            by_shard: by_shard(&world.members),
        }
    }

    /// The shard names, in order.
    pub fn names(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.by_shard.keys().copied()
    }

    /// The members of one shard.
    pub fn members(&self, shard: &str) -> impl Iterator<Item = &'a Member> + '_ {
        self.by_shard.get(shard).into_iter().flatten().copied()
    }

    /// The shard's live primary.
    pub fn primary(&self, shard: &str) -> Option<&'a Member> {
        self.members(shard).find(|m| m.is_live_primary())
    }
}

/// Members grouped by shard, in shard order.
fn by_shard(members: &[Member]) -> BTreeMap<&str, Vec<&Member>> {
    let mut out: BTreeMap<&str, Vec<&Member>> = BTreeMap::new();
    for m in members {
        out.entry(m.shard.as_str()).or_default().push(m);
    }
    out
}

/// Decides what to do now.
pub fn decide(world: &World, policy: &Policy) -> Plan {
    let s = Shards::new(world);
    let mut plan = Plan {
        drift: drift(&s, policy),
        ..Plan::default()
    };
    if !world.coordinating {
        return plan;
    }
    let mut busy: BTreeSet<&str> = world.in_flight.iter().map(|f| f.shard.as_str()).collect();
    let budget = policy.max_concurrent.saturating_sub(world.in_flight.len());
    handovers(&s, policy, &mut busy, &mut plan);
    asked(&s, policy, &mut busy, &mut plan);
    let rolling = supervise_roll(&s, policy, (&busy, budget), &mut plan);
    let idle = plan.actions.is_empty() && world.in_flight.is_empty();
    let free = !world.paused && !world.operator_busy;
    if idle && !rolling && free && cooled_down(world, policy) {
        let moved = failback(&s, policy).or_else(|| rebalance(&s, policy));
        plan.actions.extend(moved);
    }
    plan
}

/// Plans the safety hand-overs, shard by shard, up to `max_handovers` moves at once (the
/// larger of the two limits: a hand-over is never held back further than any other move).
fn handovers<'a>(s: &Shards<'a>, policy: &Policy, busy: &mut BTreeSet<&'a str>, plan: &mut Plan) {
    let limit = policy.max_handovers.max(policy.max_concurrent);
    let budget = limit.saturating_sub(s.world.in_flight.len());
    for shard in s.names() {
        if plan.actions.len() >= budget {
            break;
        }
        if busy.contains(shard) {
            continue;
        }
        if let Some(action) = handover(s, policy, shard, &mut plan.blocked) {
            busy.insert(shard);
            plan.actions.push(action);
        }
    }
}

/// Answers a switchover asked for: a move (the shard is no longer busy after it), a refusal,
/// or nothing yet while its shard is busy. Outside the move budget: someone asked for it.
fn asked<'a>(s: &Shards<'a>, policy: &Policy, busy: &mut BTreeSet<&'a str>, plan: &mut Plan) {
    let Some(ask) = &s.world.switchover else {
        return;
    };
    match crate::requests::answer(s, policy, ask, busy) {
        Ok(Some(action)) => {
            if let Some(shard) = s.names().find(|n| *n == action.shard) {
                busy.insert(shard);
            }
            plan.actions.push(action);
        }
        Ok(None) => {}
        Err(reason) => plan.refused = Some((ask.id.clone(), reason)),
    }
}

/// Adds the supervised roll's steps to the plan (hand-overs within the move budget); whether a
/// roll is under way, which holds fail-back and balance: they would move primaries the roll is
/// about to move anyway.
fn supervise_roll(
    s: &Shards<'_>,
    policy: &Policy,
    (busy, budget): (&BTreeSet<&str>, usize),
    plan: &mut Plan,
) -> bool {
    let Some(rp) = &policy.roll else {
        return false;
    };
    let (shards, unknown) = roll_view(s, policy, busy);
    let mut rolled = roll::decide(&shards, &unknown, rp);
    plan.roll_outdated = rolled.outdated;
    plan.roll_waiting = rolled.waiting;
    if s.world.paused && rolled.outdated > 0 {
        plan.roll_waiting = Some("the coordinator is paused".into());
        rolled.steps.clear();
    }
    for step in rolled.steps {
        match step {
            RollStep::Replace { shard, pod, reason } => {
                plan.replacements.push(Replacement { shard, pod, reason })
            }
            RollStep::Handover { .. } if plan.actions.len() >= budget => {}
            RollStep::Handover {
                shard,
                from,
                to,
                reason,
            } => plan.actions.push(Action {
                kind: Kind::Roll,
                shard,
                from,
                to,
                reason,
            }),
        }
    }
    plan.roll_outdated > 0
}

/// The shards as the roll sees them, and the pods whose revision is not known. Members without a
/// pod (a node Valkey still lists after its pod went) are not pods to replace.
fn roll_view(
    s: &Shards<'_>,
    policy: &Policy,
    busy: &BTreeSet<&str>,
) -> (Vec<RollShard>, Vec<String>) {
    let mut unknown = Vec::new();
    let mut shards = Vec::new();
    for shard in s.names() {
        let zone = preferred_zone(s, policy, shard);
        let mut pods = Vec::new();
        for m in s.members(shard) {
            let Some(pod) = &m.pod else { continue };
            if pod.updated.is_none() {
                unknown.push(pod.name.clone());
            }
            pods.push(roll_pod(s.world, m, pod, zone));
        }
        let busy = busy.contains(shard) || s.world.replacing.contains(shard);
        let since = s.world.primary_since.get(shard);
        let settled = since.is_some_and(|t| s.world.now.since(*t) >= roll::SETTLE_MS);
        shards.push(RollShard {
            name: shard.into(),
            pods,
            busy,
            settled,
        });
    }
    (shards, unknown)
}

fn roll_pod(world: &World, m: &Member, pod: &PodInfo, zone: Option<&str>) -> RollPod {
    let healthy = match m.role {
        Role::Primary => m.is_live_primary() && pod.ready,
        Role::Replica => m.is_synced_replica(),
        Role::Unknown => false,
    };
    RollPod {
        name: pod.name.clone(),
        id: m.id.clone(),
        ordinal: pod.node_index.unwrap_or(0),
        updated: pod.updated.unwrap_or(true),
        role: if m.role == Role::Primary && !m.is_live_primary() {
            Role::Unknown
        } else {
            m.role
        },
        healthy: healthy && !pod.terminating,
        offset: m.offset,
        preferred_zone: zone.is_some() && zone_of(world, m) == zone,
        node_usable: node_of(world, m).is_some_and(NodeInfo::usable),
    }
}

fn node_of<'a>(world: &'a World, m: &Member) -> Option<&'a NodeInfo> {
    world.nodes.get(m.pod.as_ref()?.node.as_ref()?)
}

/// The zone a member runs in (its node's zone).
pub fn zone_of<'a>(world: &'a World, m: &Member) -> Option<&'a str> {
    node_of(world, m)?.zone.as_deref()
}

/// Why the primary must leave its pod, if it must.
fn at_risk(world: &World, m: &Member) -> Option<String> {
    let pod = m.pod.as_ref()?;
    if pod.terminating {
        return Some(format!("pod {} is terminating", pod.name));
    }
    let name = pod.node.as_deref()?;
    let node = world.nodes.get(name)?;
    // A cordon only announces maintenance: a paused coordinator leaves it to the eviction.
    if node.unschedulable && !world.paused {
        return Some(format!("node {name} is cordoned"));
    }
    if !node.ready {
        return Some(format!("node {name} is not ready"));
    }
    None
}

/// Replicas that may become primary: synced (Ready), on a usable node, not going away.
/// Best first: highest offset, then the preferred zone, then the node id (a fixed tie-break).
pub fn candidates<'a>(s: &Shards<'a>, shard: &str, zone: Option<&str>) -> Vec<&'a Member> {
    let world = s.world;
    if s.primary(shard).is_none() {
        return Vec::new();
    }
    let mut c: Vec<&Member> = s.members(shard).filter(|m| eligible(world, m)).collect();
    c.sort_by(|a, b| {
        let pref = |m: &Member| zone.is_some() && zone_of(world, m) == zone;
        b.offset
            .cmp(&a.offset)
            .then(pref(b).cmp(&pref(a)))
            .then(a.id.cmp(&b.id))
    });
    c
}

pub(crate) fn eligible(world: &World, m: &Member) -> bool {
    let staying = m.pod.as_ref().is_some_and(|p| !p.terminating);
    let node_ok = node_of(world, m).is_some_and(NodeInfo::usable);
    m.is_synced_replica() && staying && node_ok
}

/// The preferred zone of a shard: configured, else the zone of its node-index-0 pod.
pub fn preferred_zone<'a>(s: &Shards<'a>, policy: &'a Policy, shard: &str) -> Option<&'a str> {
    if let Some(z) = policy.preferred_zones.get(shard) {
        return Some(z);
    }
    let intended = s
        .members(shard)
        .find(|m| m.pod.as_ref().is_some_and(|p| p.node_index == Some(0)))?;
    zone_of(s.world, intended)
}

fn handover(
    s: &Shards<'_>,
    policy: &Policy,
    shard: &str,
    blocked: &mut Vec<String>,
) -> Option<Action> {
    let p = s.primary(shard)?;
    let why = at_risk(s.world, p)?;
    let zone = preferred_zone(s, policy, shard).or_else(|| zone_of(s.world, p));
    let Some(to) = candidates(s, shard, zone).into_iter().next() else {
        blocked.push(format!(
            "shard {shard}: {why}, but no synced replica can take over"
        ));
        return None;
    };
    Some(Action {
        kind: Kind::Handover,
        shard: shard.into(),
        from: p.id.clone(),
        to: to.id.clone(),
        reason: why,
    })
}

fn cooled_down(world: &World, policy: &Policy) -> bool {
    world
        .last_move
        .is_none_or(|t| world.now.since(t) >= policy.cooldown_ms)
}

fn steady(world: &World, policy: &Policy, shard: &str) -> bool {
    world
        .steady_since
        .get(shard)
        .is_some_and(|t| world.now.since(*t) >= policy.quiet_period_ms)
}

fn failback(s: &Shards<'_>, policy: &Policy) -> Option<Action> {
    if !policy.failback {
        return None;
    }
    let world = s.world;
    s.names().find_map(|shard| {
        let zone = preferred_zone(s, policy, shard)?;
        let p = s.primary(shard)?;
        if zone_of(world, p) == Some(zone) || !steady(world, policy, shard) {
            return None;
        }
        let to = candidates(s, shard, Some(zone))
            .into_iter()
            .find(|m| zone_of(world, m) == Some(zone))?;
        let reason = format!(
            "primary is in zone {}, the shard prefers {zone}",
            zone_of(world, p).unwrap_or("unknown")
        );
        Some(Action {
            kind: Kind::FailBack,
            shard: shard.into(),
            from: p.id.clone(),
            to: to.id.clone(),
            reason,
        })
    })
}

/// Primaries per node, over the nodes that can carry Valkey.
fn primaries_per_node(world: &World) -> BTreeMap<&str, usize> {
    let mut count: BTreeMap<&str, usize> = world
        .nodes
        .iter()
        .filter(|(_, n)| n.usable())
        .map(|(k, _)| (k.as_str(), 0))
        .collect();
    for m in world.members.iter().filter(|m| m.is_live_primary()) {
        if let Some(node) = m.pod.as_ref().and_then(|p| p.node.as_deref()) {
            *count.entry(node).or_default() += 1;
        }
    }
    count
}

/// No node carries more than ⌈primaries / usable nodes⌉.
pub fn primary_cap(world: &World) -> usize {
    let count = primaries_per_node(world);
    let usable = world.nodes.values().filter(|n| n.usable()).count().max(1);
    count.values().sum::<usize>().div_ceil(usable)
}

fn rebalance(s: &Shards<'_>, policy: &Policy) -> Option<Action> {
    if !policy.balance {
        return None;
    }
    let world = s.world;
    let count = primaries_per_node(world);
    let cap = primary_cap(world);
    let crowded: BTreeSet<&str> = count
        .iter()
        .filter(|(_, c)| **c > cap)
        .map(|(n, _)| *n)
        .collect();
    s.names().find_map(|shard| {
        let p = s.primary(shard)?;
        let node = p.pod.as_ref()?.node.as_deref()?;
        if !crowded.contains(node) || !steady(world, policy, shard) {
            return None;
        }
        let to = balance_target(s, policy, shard, (&count, cap))?;
        let reason = format!(
            "node {node} carries {} primaries, more than the cap of {cap}",
            count.get(node).copied().unwrap_or(0)
        );
        Some(Action {
            kind: Kind::Rebalance,
            shard: shard.into(),
            from: p.id.clone(),
            to: to.id.clone(),
            reason,
        })
    })
}

/// Where balance may move `shard`'s primary: a candidate on a node under the cap, never out of
/// the shard's preferred zone (fail-back would only move it back).
fn balance_target<'a>(
    s: &Shards<'a>,
    policy: &Policy,
    shard: &str,
    (count, cap): (&BTreeMap<&str, usize>, usize),
) -> Option<&'a Member> {
    let world = s.world;
    let p = s.primary(shard)?;
    let zone = preferred_zone(s, policy, shard);
    let keep_zone =
        |m: &&Member| zone.is_none() || zone_of(world, p) != zone || zone_of(world, m) == zone;
    let has_room = |m: &&Member| {
        m.pod
            .as_ref()
            .and_then(|p| p.node.as_deref())
            .is_some_and(|n| count.get(n).is_some_and(|c| *c < cap))
    };
    candidates(s, shard, zone)
        .into_iter()
        .filter(keep_zone)
        .find(has_room)
}

/// Whether some primary on `node` could be moved by balance (its shard's quiet period aside).
fn movable_from(
    s: &Shards<'_>,
    policy: &Policy,
    node: &str,
    (count, cap): (&BTreeMap<&str, usize>, usize),
) -> bool {
    s.names().any(|shard| {
        let on_node = s
            .primary(shard)
            .and_then(|p| p.pod.as_ref()?.node.as_deref())
            == Some(node);
        on_node && balance_target(s, policy, shard, (count, cap)).is_some()
    })
}

/// What the coordinator remembers of a shard between observations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMemory {
    pub primary: Option<String>,
    pub steady_since: Millis,
    /// Since when the shard has had its current primary (the supervised roll lets its replicas
    /// re-point before the next step, [`crate::roll::SETTLE_MS`]).
    pub primary_since: Millis,
}

/// Folds one observation into the per-shard memory: a shard is steady since its primary last
/// changed or a replica was last out of sync ([`Member::is_synced_replica`]). The quiet period of
/// fail-back and balance counts from there, which is what keeps them from flapping.
pub fn track(
    prev: &BTreeMap<String, ShardMemory>,
    members: &[Member],
    now: Millis,
) -> BTreeMap<String, ShardMemory> {
    let mut next = BTreeMap::new();
    for (shard, members) in by_shard(members) {
        let p = members.iter().find(|m| m.is_live_primary());
        let replicas = || members.iter().filter(|m| m.role == Role::Replica);
        let synced = p.is_some() && replicas().all(|r| r.is_synced_replica());
        let primary = p.map(|p| p.id.clone());
        let old = prev.get(shard).filter(|old| old.primary == primary);
        let steady_since = old.filter(|_| synced).map_or(now, |old| old.steady_since);
        let primary_since = old.map_or(now, |old| old.primary_since);
        next.insert(
            shard.to_owned(),
            ShardMemory {
                primary,
                steady_since,
                primary_since,
            },
        );
    }
    next
}

/// Placement facts: primaries outside their preferred zone, nodes over the primary cap, shards
/// whose members share a node or a zone, pods the scheduler could not place.
fn drift(s: &Shards<'_>, policy: &Policy) -> Vec<Drift> {
    let mut out = zone_drift(s, policy);
    out.extend(balance_drift(s, policy));
    for shard in s.names() {
        out.extend(sharing(s, shard));
    }
    out.extend(s.world.pending.iter().map(unschedulable));
    out
}

fn zone_drift(s: &Shards<'_>, policy: &Policy) -> Vec<Drift> {
    let world = s.world;
    let mut out = Vec::new();
    for shard in s.names() {
        let (Some(p), Some(zone)) = (s.primary(shard), preferred_zone(s, policy, shard)) else {
            continue;
        };
        if zone_of(world, p).is_some_and(|z| z != zone) {
            let message = format!(
                "primary {} runs in zone {}, preferred {zone}",
                p.id,
                zone_of(world, p).unwrap_or("?")
            );
            out.push(Drift {
                shard: shard.into(),
                reason: "FailoverDrift",
                message,
                pod: p.pod.as_ref().map(|p| p.name.clone()),
            });
        }
    }
    out
}

/// Nodes over the primary cap. Balance moves primaries among a shard's pods, not the pods: when
/// none of a crowded node's shards has a synced replica in its preferred zone on a node with
/// room (after consecutive drains the scheduler may have packed a zone's pods onto one node),
/// the message says so, so nobody waits for a move that cannot come.
fn balance_drift(s: &Shards<'_>, policy: &Policy) -> Vec<Drift> {
    let world = s.world;
    let cap = primary_cap(world);
    let count = primaries_per_node(world);
    let crowded = count.iter().filter(|(_, c)| **c > cap);
    crowded
        .map(|(node, c)| {
            let stuck = match movable_from(s, policy, node, (&count, cap)) {
                true => "",
                false => ": no replica in its shards' preferred zones on a node with room, so balance cannot lower it (it moves primaries, not pods: reschedule the pods, e.g. with a descheduler)",
            };
            Drift {
                shard: String::new(),
                reason: "PrimaryImbalance",
                message: format!("node {node} carries {c} primaries (cap {cap}){stuck}"),
                pod: None,
            }
        })
        .collect()
}

/// Members of one shard that share a node (`ShardSharesNode`) or a zone (`ShardSharesZone`):
/// one failure there takes more than one copy of the shard.
fn sharing(s: &Shards<'_>, shard: &str) -> Vec<Drift> {
    let placed: Vec<(&str, &str, Option<&str>)> = s
        .members(shard)
        .filter_map(|m| {
            let pod = m.pod.as_ref()?;
            let node = pod.node.as_deref()?;
            Some((pod.name.as_str(), node, zone_of(s.world, m)))
        })
        .collect();
    let by_node = crowded(placed.iter().map(|(p, n, _)| (*n, *p)));
    let by_zone = crowded(placed.iter().filter_map(|(p, _, z)| Some(((*z)?, *p))));
    let drift = |reason: &'static str, what: &str, (domain, pods): (&str, Vec<&str>)| Drift {
        shard: shard.into(),
        reason,
        message: format!("pods {} share {what} {domain}", pods.join(", ")),
        pod: pods.first().map(|p| (*p).to_owned()),
    };
    let nodes = by_node
        .into_iter()
        .map(|d| drift("ShardSharesNode", "node", d));
    let zones = by_zone
        .into_iter()
        .map(|d| drift("ShardSharesZone", "zone", d));
    nodes.chain(zones).collect()
}

/// Domains holding more than one of the given pods, with those pods.
fn crowded<'a>(placed: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<(&'a str, Vec<&'a str>)> {
    let mut by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (domain, pod) in placed {
        by.entry(domain).or_default().push(pod);
    }
    by.into_iter().filter(|(_, pods)| pods.len() > 1).collect()
}

fn unschedulable(p: &Pending) -> Drift {
    Drift {
        shard: String::new(),
        reason: "Unschedulable",
        message: format!(
            "pod {} is not scheduled ({}): {}",
            p.pod, p.reason, p.message
        ),
        pod: Some(p.pod.clone()),
    }
}
