//! The coordinator's choice of a new primary when a shard's primary is lost ([`decide`]): the
//! only place an unplanned failover picks an epoch.

use std::cmp::Reverse;

use super::record::{SeenRecord, ShardRecord};
use crate::lease::judged_lease_ms;
use crate::observation::{Observation, Role};
use crate::time::Millis;

/// One pod of the shard as the coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardMember {
    pub pod: String,
    /// `None`: no fresh observation (Valkey not answering, or the pod is unreachable).
    pub valkey: Option<MemberValkey>,
    pub zone: Option<String>,
    /// `deletionTimestamp` is set.
    pub terminating: bool,
    pub node_ready: bool,
    pub node_schedulable: bool,
}

/// A member's Valkey, from a fresh observation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberValkey {
    /// `Unknown` while loading: such a node is never promoted.
    pub role: Role,
    /// Replication offset (`slave_repl_offset` for a replica).
    pub offset: u64,
    pub link_up: bool,
    /// No data and never completed a sync: promoting it would replace the shard's data by nothing.
    pub fresh: bool,
    /// Keys in its dataset.
    pub keys: u64,
}

impl MemberValkey {
    /// A member's Valkey as one observation shows it. `fresh` is [`Observation::unsynced`]: a
    /// replica that synced an empty primary holds all there was and may be promoted (calling it
    /// fresh would leave the shard without a candidate), while one whose link never came up holds
    /// nothing of the shard's.
    pub fn of(obs: &Observation) -> MemberValkey {
        // A loading node reports `role:master` even as a replica: it counts as unknown.
        let role = if obs.loading { Role::Unknown } else { obs.role };
        let offset = match (&obs.link, role) {
            (Some(link), Role::Replica) => link.offset,
            _ => obs.repl_offset,
        };
        MemberValkey {
            role,
            offset,
            link_up: obs.link.as_ref().is_some_and(|l| l.up),
            fresh: obs.unsynced(),
            keys: obs.keys,
        }
    }
}

/// Everything the coordinator looks at to decide on a failover of one shard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardView {
    pub now: Millis,
    /// Whether this agent holds the cluster Lease *now* (before its acting deadline).
    pub coordinating: bool,
    /// `None`: not read yet.
    pub record: Option<SeenRecord>,
    /// The shard Lease's duration.
    pub lease_ms: u64,
    pub members: Vec<ShardMember>,
    pub preferred_zone: Option<String>,
}

/// Failover knobs, from configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverPolicy {
    /// Promote a replica when the primary is lost; off: only planned switchovers move it.
    pub automatic: bool,
}

impl Default for FailoverPolicy {
    fn default() -> Self {
        FailoverPolicy { automatic: true }
    }
}

/// Make `target` the primary at `epoch`.
///
/// Carried out by [`PromotionRun`](super::PromotionRun), the cluster Lease checked before each
/// command, in this order:
/// 1. write [`Promotion::record`] carrying `version` — a 409 means the holder renewed (or someone
///    else wrote) since the decision: stop. The record moves first so that no Valkey is ever
///    made primary before the record names it; if the executor dies after this step, the
///    target's agent renews, then releases when no promotion follows, and the next decision runs;
/// 2. `CLIENT PAUSE <ms> WRITE` on every pod in `fence` (other masters that still answer), so an
///    old primary whose agent is gone stops taking writes before the new one starts;
/// 3. `REPLICAOF NO ONE` on `target`;
/// 4. `REPLICAOF <target>` on every pod in `repoint`, best effort — each agent's own
///    [`LocalAction::Demote`](super::LocalAction::Demote) / [`LocalAction::Repoint`](super::LocalAction::Repoint) is the backstop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promotion {
    pub target: String,
    /// `record.epoch + 1`.
    pub epoch: u64,
    /// The `resourceVersion` the decision was based on.
    pub version: String,
    pub fence: Vec<String>,
    pub repoint: Vec<String>,
    pub reason: String,
    /// No member that answered holds a key: whatever the shard held is gone (every member came
    /// back without its data, e.g. a full restart without persistence). Said in an Event.
    pub empty: bool,
}

impl Promotion {
    /// The record to write: held by the target at the new epoch, based on the decided version.
    pub fn record(&self) -> ShardRecord {
        ShardRecord {
            lease_ms: None,
            holder: Some(self.target.clone()),
            primary: Some(self.target.clone()),
            epoch: self.epoch,
            version: self.version.clone(),
        }
    }
}

/// Why there is no promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    /// Automatic failover is off.
    Disabled,
    /// This agent is not the coordinator.
    NotCoordinator,
    /// The record has not been read, or does not exist (the shard is not bootstrapped).
    NoRecord,
    /// The record is held and was seen changing within the lease: its holder may still act.
    Held,
    /// A promotion is due, but no member can take over — worth surfacing to the user.
    NoCandidate,
}

/// No promotion now, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub kind: HoldKind,
    pub reason: String,
}

fn hold(kind: HoldKind, reason: impl Into<String>) -> Hold {
    Hold {
        kind,
        reason: reason.into(),
    }
}

/// Decides whether to promote a replica of the shard now.
pub fn decide(view: &ShardView, policy: &FailoverPolicy) -> Result<Promotion, Hold> {
    if !policy.automatic {
        return Err(hold(HoldKind::Disabled, "automatic failover is off"));
    }
    if !view.coordinating {
        return Err(hold(HoldKind::NotCoordinator, "not the coordinator"));
    }
    let Some(seen) = &view.record else {
        return Err(hold(HoldKind::NoRecord, "the record has not been read"));
    };
    let Some(record) = &seen.record else {
        return vanished(view, seen);
    };
    let why = vacancy(view, seen, record)?;
    choose(view, record, why)
}

/// No record, in a shard that had one (this agent saw its epoch, as coordinator or as keeper)
/// or whose members hold data: it was deleted — by hand, by the garbage collector, by a forged owner — and its holder
/// did not re-create it (its renewal had lapsed, or its agent restarted). Left alone, the
/// primary stays fenced for good. Once the record has been seen absent for a full lease (any
/// holder's renew deadline has passed: it fenced itself), it is re-created one epoch above the
/// last seen, naming the member whose data is the shard's: the one master with data if exactly
/// one answers (the primary whose record vanished), else the replica with the highest offset.
fn vanished(view: &ShardView, seen: &SeenRecord) -> Result<Promotion, Hold> {
    let had_data = view.members.iter().any(has_data);
    if seen.last_epoch.is_none() && !had_data {
        return Err(hold(
            HoldKind::NoRecord,
            "no record: the shard is not bootstrapped",
        ));
    }
    let until = seen.changed_at.plus(view.lease_ms);
    if view.now < until {
        let left = until.since(view.now);
        let reason = format!("no record: its last holder may re-create it ({left} ms left)");
        return Err(hold(HoldKind::Held, reason));
    }
    let last = seen.last_epoch.unwrap_or(0);
    let ghost = ShardRecord {
        lease_ms: None,
        holder: None,
        primary: None,
        epoch: last,
        version: String::new(),
    };
    let why = format!(
        "the record vanished (last epoch {last}) and nobody re-created it for {} ms",
        view.lease_ms
    );
    match sole_master_with_data(view) {
        Some(m) => {
            let reason = format!("{why}; {} is the one master with data", m.pod);
            let epoch = last.checked_add(1).ok_or_else(exhausted)?;
            Ok(promotion(view, &ghost, m, epoch, reason))
        }
        None => choose(view, &ghost, why),
    }
}

fn has_data(m: &ShardMember) -> bool {
    m.valkey.as_ref().is_some_and(|v| !v.fresh)
}

/// The only member answering as master with data, on a usable node.
fn sole_master_with_data(view: &ShardView) -> Option<&ShardMember> {
    let usable = |m: &&ShardMember| !m.terminating && m.node_ready && m.node_schedulable;
    let mut masters = view
        .members
        .iter()
        .filter(|m| answers_as_primary(m) && has_data(m))
        .filter(usable);
    let first = masters.next()?;
    masters.next().is_none().then_some(first)
}

fn exhausted() -> Hold {
    hold(
        HoldKind::NoCandidate,
        "the epoch cannot increase any further",
    )
}

/// Why the record may be taken: released, or unchanged for a full lease (its holder's renew
/// deadline, shorter than the lease, has passed, so it has fenced itself).
fn vacancy(view: &ShardView, seen: &SeenRecord, record: &ShardRecord) -> Result<String, Hold> {
    let Some(holder) = record.holder() else {
        return Ok("the record was released".into());
    };
    let lease_ms = judged_lease_ms(view.lease_ms, record.lease_ms);
    let expires = seen.changed_at.plus(lease_ms);
    if view.now < expires {
        let left = expires.since(view.now);
        return Err(hold(
            HoldKind::Held,
            format!("{holder} holds the record ({left} ms left)"),
        ));
    }
    Ok(format!(
        "{holder} did not renew the record for {lease_ms} ms"
    ))
}

fn choose(view: &ShardView, record: &ShardRecord, why: String) -> Result<Promotion, Hold> {
    let Some(epoch) = record.epoch.checked_add(1) else {
        return Err(exhausted());
    };
    if let Some(best) = candidates(view, record).first() {
        let offset = best.valkey.as_ref().map_or(0, |v| v.offset);
        let reason = format!("{why}; {} has the highest offset ({offset})", best.pod);
        return Ok(promotion(view, record, best, epoch, reason));
    }
    match last_primary_back(view, record) {
        Some(last) => {
            let reason = format!(
                "{why}; no replica holds the data and {}, the last primary, answers as primary: it takes the record back",
                last.pod
            );
            Ok(promotion(view, record, last, epoch, reason))
        }
        None => Err(hold(
            HoldKind::NoCandidate,
            no_candidate(view, record, &why),
        )),
    }
}

/// The recorded primary, back after a restart with its data, when no other member can hold the
/// shard's data: it wrote last under the record, so it holds everything the record ever covered
/// (a shard of one pod with persistence, after a rolling update). Never while another member
/// does not answer or has synced (that one may hold data the last primary lost), and never
/// when it came back empty: its keeper would release such a claim again, as it cannot tell it
/// from a stale one (a shard of one pod without persistence stays fenced — issue 17).
fn last_primary_back<'a>(view: &'a ShardView, record: &ShardRecord) -> Option<&'a ShardMember> {
    let last = record.recorded_primary()?;
    let back = view.members.iter().find(|m| m.pod == last)?;
    let has_data = back.valkey.as_ref().is_some_and(|v| !v.fresh);
    let usable = has_data && !back.terminating && back.node_ready && back.node_schedulable;
    let others_empty = view
        .members
        .iter()
        .filter(|m| m.pod != last)
        .all(|m| m.valkey.as_ref().is_some_and(|v| v.fresh));
    (usable && answers_as_primary(back) && others_empty).then_some(back)
}

fn promotion(
    view: &ShardView,
    record: &ShardRecord,
    best: &ShardMember,
    epoch: u64,
    reason: String,
) -> Promotion {
    let others = || view.members.iter().filter(|m| m.pod != best.pod);
    let mut answering = view.members.iter().filter_map(|m| m.valkey.as_ref());
    let empty = answering.all(|v| v.keys == 0);
    Promotion {
        empty,
        target: best.pod.clone(),
        epoch,
        version: record.version.clone(),
        fence: others()
            .filter(|m| answers_as_primary(m))
            .map(|m| m.pod.clone())
            .collect(),
        repoint: others().map(|m| m.pod.clone()).collect(),
        reason,
    }
}

fn answers_as_primary(m: &ShardMember) -> bool {
    m.valkey.as_ref().is_some_and(|v| v.role == Role::Primary)
}

/// Members that may become primary, best first: highest offset, then a master (naming it moves
/// no data), then the preferred zone, then the pod name (a fixed tie-break, so repeated decisions
/// agree).
pub fn candidates<'a>(view: &'a ShardView, record: &ShardRecord) -> Vec<&'a ShardMember> {
    let mut c: Vec<&ShardMember> = view
        .members
        .iter()
        .filter(|m| ineligible(view, m, record).is_none())
        .collect();
    let preferred =
        |m: &ShardMember| view.preferred_zone.is_some() && m.zone == view.preferred_zone;
    c.sort_by_key(|m| {
        let offset = m.valkey.as_ref().map_or(0, |v| v.offset);
        let master = answers_as_primary(m);
        (
            Reverse(offset),
            Reverse(master),
            Reverse(preferred(m)),
            m.pod.as_str(),
        )
    });
    c
}

/// Why a member may not be promoted, if it may not.
fn ineligible(view: &ShardView, m: &ShardMember, record: &ShardRecord) -> Option<&'static str> {
    let recorded = [record.holder(), record.primary.as_deref()];
    if recorded.contains(&Some(m.pod.as_str())) {
        return Some("is the recorded primary");
    }
    if m.terminating {
        return Some("is terminating");
    }
    if !(m.node_ready && m.node_schedulable) {
        return Some("is on a node that is not ready or cordoned");
    }
    let Some(v) = &m.valkey else {
        return Some("does not answer");
    };
    valkey_ineligible(v, named_never_promoted(view, record))
}

/// Whether the record names a member that answers as a replica: a promotion that never landed
/// (its coordinator gone mid-way) or a record no coordinator wrote. The shard's data is then
/// where it was, on the master, which may be named again. Not when the named member is gone or
/// master: a master then may be an old primary whose stream the shard has since moved past.
fn named_never_promoted(view: &ShardView, record: &ShardRecord) -> bool {
    let Some(named) = record.recorded_primary() else {
        return false;
    };
    let replica = |m: &&ShardMember| m.valkey.as_ref().is_some_and(|v| v.role == Role::Replica);
    view.members.iter().filter(replica).any(|m| m.pod == named)
}

/// A synced replica may be promoted; so may a master with data while the record names a replica
/// that was never promoted (`masters`): it holds the shard's data in fact, and naming it again
/// moves nothing.
fn valkey_ineligible(v: &MemberValkey, masters: bool) -> Option<&'static str> {
    let usable = v.role == Role::Replica || (masters && v.role == Role::Primary);
    if !usable {
        return Some("is not a replica");
    }
    // A member that never synced holds nothing: promoting it would make every other node
    // (the old primary included, once back) resync the empty dataset. Sentinel skips it too.
    v.fresh.then_some("never synced")
}

fn no_candidate(view: &ShardView, record: &ShardRecord, why: &str) -> String {
    let each: Vec<String> = view
        .members
        .iter()
        .filter_map(|m| ineligible(view, m, record).map(|r| format!("{} {r}", m.pod)))
        .collect();
    format!("{why}, but no member can take over: {}", each.join(", "))
}

// ---------------------------------------------------------------------------------------------
// The coordinator: planned switchover.
// ---------------------------------------------------------------------------------------------
