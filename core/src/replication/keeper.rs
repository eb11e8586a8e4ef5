//! Each agent's rules for its own Valkey and its shard's record: renew, fence, release, follow,
//! bootstrap ([`decide`]).

use super::record::{SeenRecord, ShardRecord};
use crate::heartbeat::{PeerSight, Promise};
use crate::lease::LeaseTimings;
use crate::observation::{History, Observation, Role};
use crate::time::Millis;

/// The role of the local Valkey.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalRole {
    /// `role:master`.
    Primary,
    /// `role:slave`, replicating from `of` (`master_host:master_port`).
    Replica { of: String },
}

/// The local Valkey as the last fresh observation showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalValkey {
    pub role: LocalRole,
    /// No data and never completed a sync (empty keyspace, offset 0): nothing on it anyone wrote.
    pub fresh: bool,
    /// INFO `run_id`: a restart changes it and voids the [`Holding`] made with the old process.
    pub run_id: String,
    /// When this agent first saw the current role (and, for a replica, its primary) in this run.
    pub since: Millis,
    /// When the observation this is made of was taken (it may be a poll older than `now`).
    pub observed_at: Millis,
    /// Its replication stream, compared with a successor's before following it.
    pub history: History,
    /// A replica whose link to its primary is up (`master_link_status:up`): proof that the
    /// primary still answers at `of`.
    pub linked: bool,
}

/// What the keeper remembers of its Valkey from one observation to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValkeyMemory {
    /// The role and run as last observed, and since when.
    role: Option<(LocalRole, String, Millis)>,
    /// The current run and whether its data is trusted ([`RunTrust`]). A restart with
    /// persistence costs a failover; that is the safe side.
    run: Option<RunTrust>,
}

impl ValkeyMemory {
    /// After run `run_id` held the record: its data is the shard's ([`RunTrust::held`]).
    pub fn held(&mut self, run_id: &str) {
        if let Some(t) = self.run.as_mut().filter(|t| t.run_id == run_id) {
            *t = t.held();
        }
    }
}

impl LocalRole {
    /// The role an observation shows; `None` while unknown, or for a replica without a primary.
    pub fn of(obs: &Observation) -> Option<LocalRole> {
        match obs.role {
            Role::Primary => Some(LocalRole::Primary),
            Role::Replica => {
                let link = obs.link.as_ref()?;
                Some(LocalRole::Replica {
                    of: format!("{}:{}", link.host, link.port),
                })
            }
            Role::Unknown => None,
        }
    }
}

impl LocalValkey {
    /// The local Valkey as a fresh observation taken at `observed_at` shows it at `now`; `None`
    /// while it loads or its role is unknown. Tracks in `memory` since when its role (and
    /// primary) and run have been what they are, and whether its run's data is trusted.
    pub fn read(
        obs: &Observation,
        observed_at: Millis,
        now: Millis,
        memory: &mut ValkeyMemory,
    ) -> Option<LocalValkey> {
        if obs.loading {
            return None;
        }
        let role = LocalRole::of(obs)?;
        let run_id = obs.run_id.clone().unwrap_or_default();
        let since = match &memory.role {
            Some((r, id, since)) if *r == role && *id == run_id => *since,
            _ => now,
        };
        memory.role = Some((role.clone(), run_id.clone(), since));
        let synced = obs.link.as_ref().is_some_and(|l| l.ever_up);
        let trust = RunTrust::observe(memory.run.as_ref(), &run_id, &role, obs.fresh(), synced);
        // Only a master is judged by how its run started; a replica that synced is not empty.
        let fresh = obs.fresh() || (role == LocalRole::Primary && trust.untrusted);
        memory.run = Some(trust);
        Some(LocalValkey {
            role,
            fresh,
            run_id,
            since,
            observed_at,
            history: obs.history.clone(),
            linked: obs.link.as_ref().is_some_and(|l| l.up),
        })
    }
}

/// How long a looked-up address of the recorded primary is used without proof that it holds.
pub const ADDR_REFRESH_MS: u64 = 10_000;
/// How long a proven address is used: only the check that its pod is a member of the shard is
/// repeated, so a follower in steady state asks the API once in this period, not six times a
/// minute (followers cost ~nothing).
pub const ADDR_RECHECK_MS: u64 = 300_000;

/// Whether the recorded primary's address `addr`, looked up `age_ms` ago, is still good: for
/// [`ADDR_REFRESH_MS`], and for [`ADDR_RECHECK_MS`] when proven — it is this pod's own (`own`: a
/// pod's IP is fixed for its life, which is the agent's) or the local replica's link is up to it
/// (a recreated primary, at a new IP, breaks the link, and the next step looks again).
pub fn address_fresh(addr: &str, age_ms: u64, own: bool, valkey: Option<&LocalValkey>) -> bool {
    let linked = valkey
        .is_some_and(|v| v.linked && matches!(&v.role, LocalRole::Replica { of } if of == addr));
    age_ms < ADDR_REFRESH_MS || ((own || linked) && age_ms < ADDR_RECHECK_MS)
}

/// The recorded primary's Valkey as this agent saw it, asked directly just before deciding
/// whether its own master, holding data, may follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Successor {
    /// It answers as master.
    pub primary: bool,
    pub history: History,
}

impl Successor {
    /// The recorded primary's Valkey as one observation of it shows it.
    pub fn of(obs: &Observation) -> Successor {
        Successor {
            primary: obs.role == Role::Primary,
            history: obs.history.clone(),
        }
    }
}

/// Whether the data of the local Valkey's current run can be trusted, as the keeper tracks it
/// from one observation to the next.
///
/// Untrusted: the run started empty, or started while this agent watched (a restart: whatever it
/// holds came after, e.g. client writes to an empty primary). Without persistence a restarted
/// primary takes writes and gains replicas within a second (they full-sync from it), after which
/// it no longer *looks* empty — but it is not the primary whose data the shard has, so it must
/// never renew. Trusted again once the run completes a sync as a replica (its data is then the
/// shard's), or is promoted from replica to master within the run: only the coordinator sends
/// `REPLICAOF NO ONE`, and only to a replica that synced; or once it held the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunTrust {
    pub run_id: String,
    pub untrusted: bool,
    /// The role in the last observation of this run.
    pub role: LocalRole,
}

impl RunTrust {
    /// The trust after an observation of run `run_id` in `role`; `fresh`: it holds nothing
    /// (`Observation::fresh`), `synced`: a link to a primary has been up in this run.
    pub fn observe(
        prev: Option<&RunTrust>,
        run_id: &str,
        role: &LocalRole,
        fresh: bool,
        synced: bool,
    ) -> RunTrust {
        let untrusted = match prev {
            Some(p) if p.run_id == run_id => p.untrusted && !p.promoted_to(role),
            // Restarted under this agent: whatever it holds now came after the restart.
            Some(_) => true,
            None => fresh,
        };
        RunTrust {
            run_id: run_id.to_owned(),
            untrusted: untrusted && !synced,
            role: role.clone(),
        }
    }

    /// After this run held the record (bootstrapped or renewed it): it is the shard's primary,
    /// so its data is the shard's, however empty it started.
    pub fn held(&self) -> RunTrust {
        RunTrust {
            untrusted: false,
            ..self.clone()
        }
    }

    fn promoted_to(&self, role: &LocalRole) -> bool {
        matches!(self.role, LocalRole::Replica { .. }) && *role == LocalRole::Primary
    }
}

/// This agent's own claim on the record: when it last renewed it, and for which Valkey run.
///
/// The adapter sets it after every successful renewal or bootstrap (to the *send* time of the
/// write) and drops it when it releases. It counts only for the epoch and Valkey run it was made
/// in, so a stale claim cannot outlive a promotion or a Valkey restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub epoch: u64,
    pub renewed_at: Millis,
    pub run_id: String,
}

impl Holding {
    /// The acting deadline: past it, the holder must no longer accept writes unfenced.
    pub fn deadline(&self, timings: &LeaseTimings) -> Millis {
        self.renewed_at.plus(timings.renew_deadline_ms)
    }
}

/// Everything an agent knows when it decides about its own Valkey.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalView {
    pub now: Millis,
    /// This pod's name (the identity written as holder).
    pub me: String,
    /// valkey-operator's `valkey.io/node-index` (0 = the intended primary at bootstrap).
    pub node_index: Option<u32>,
    /// The shard Lease's timings (validated: lease > renew deadline > 1.2 × retry).
    pub timings: LeaseTimings,
    /// `None`: Valkey does not answer, or is loading (it serves nothing either way).
    pub valkey: Option<LocalValkey>,
    /// `None`: the record has not been read yet.
    pub record: Option<SeenRecord>,
    /// This agent's own claim on the record, kept by the adapter across ticks.
    pub holding: Option<Holding>,
    /// Until when this agent's own fence (`CLIENT PAUSE ... WRITE`) holds; `None`: none set. Only
    /// the agent's own fence is lifted here — a pause set by a switchover is not ours to lift.
    pub fenced_until: Option<Millis>,
    /// `host:port` of the record's primary, resolved by the adapter (the same spelling it uses
    /// with `REPLICAOF`, so it compares equal to a replica's `master_host:master_port`).
    pub primary_addr: Option<String>,
    /// Another pod of this shard is known to run a master that holds data.
    pub other_master: bool,
    /// What the peer heartbeats say (`crate::heartbeat`); `None`: heartbeats are off.
    pub peers: Option<PeerSight>,
    /// This member's promise to a holder not to take part in a promotion before it runs out.
    pub promise: Option<Promise>,
    /// The recorded primary's Valkey, looked at when [`successor_wanted`]; `None`: not looked
    /// at, or it did not answer.
    pub successor: Option<Successor>,
}

/// What an agent should do about its own Valkey; each carries the reason for logs and Events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalAction {
    /// Renew the record (carrying its `resourceVersion`, so a record that moved meanwhile is not
    /// overwritten), then keep a [`Holding`] for the record's epoch, the Valkey's `run_id` and
    /// the write's send time. The adapter paces failed attempts at the retry period.
    Renew { reason: String },
    /// `CLIENT PAUSE <until − now> WRITE`. Pausing comes first because it is local, instant and
    /// reversible: it stops writes before anyone may promote, yet a holder that renews late can
    /// [`LocalAction::Unfence`] without losing its role. Demotion waits for a recorded successor,
    /// because demoting with no successor would leave the shard with no primary at all.
    Fence { until: Millis, reason: String },
    /// `CLIENT UNPAUSE`: our own fence, now that we hold a valid renewal again.
    Unfence { reason: String },
    /// Clear the holder on the record (CAS), so failover does not wait for expiry.
    Release { reason: String },
    /// `REPLICAOF <to>` then `CLIENT UNPAUSE`: my Valkey has data but a successor is recorded.
    /// Unpausing after the switch is safe (a replica refuses writes) and needed (a pause left
    /// behind would block writes after a later promotion).
    Demote { to: String, reason: String },
    /// `REPLICAOF <to>` then `CLIENT UNPAUSE`: my Valkey came up as an empty master.
    Rejoin { to: String, reason: String },
    /// `REPLICAOF <to>`: my replica follows the wrong primary.
    Repoint { to: String, reason: String },
    /// Create the record naming me at `epoch` (create fails if it exists): 1 for a new shard
    /// ([`ShardRecord::bootstrap`]), or above the epoch I held when the record vanished under me.
    Bootstrap { epoch: u64, reason: String },
    /// Waiting on someone else, or on a fresher read of the record (read it soon).
    Wait { reason: String },
    /// All is as it should be.
    Nothing { reason: String },
}

impl LocalAction {
    /// A short stable name, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            LocalAction::Renew { .. } => "renew",
            LocalAction::Fence { .. } => "fence",
            LocalAction::Unfence { .. } => "unfence",
            LocalAction::Release { .. } => "release",
            LocalAction::Demote { .. } => "demote",
            LocalAction::Rejoin { .. } => "rejoin",
            LocalAction::Repoint { .. } => "repoint",
            LocalAction::Bootstrap { .. } => "bootstrap",
            LocalAction::Wait { .. } => "wait",
            LocalAction::Nothing { .. } => "nothing",
        }
    }

    /// Why the action was chosen.
    pub fn reason(&self) -> &str {
        match self {
            LocalAction::Renew { reason }
            | LocalAction::Fence { reason, .. }
            | LocalAction::Unfence { reason }
            | LocalAction::Release { reason }
            | LocalAction::Demote { reason, .. }
            | LocalAction::Rejoin { reason, .. }
            | LocalAction::Repoint { reason, .. }
            | LocalAction::Bootstrap { reason, .. }
            | LocalAction::Wait { reason }
            | LocalAction::Nothing { reason } => reason,
        }
    }
}

/// Decides what this agent does about its own Valkey now.
///
/// The adapter may call it again right after acting (e.g. fence, then renew, then unfence), and
/// must also call it at the holding's deadline, not only on its next tick.
pub fn decide(view: &LocalView) -> LocalAction {
    match &view.valkey {
        None => not_answering(view),
        Some(v) => match &v.role {
            LocalRole::Primary => as_primary(view, v),
            LocalRole::Replica { of } => as_replica(view, v, of),
        },
    }
}

/// What a holder does before reading the record, so that it never waits on the apiserver for
/// it: fence when due, or lift its fence while its renewal is still valid or every member of its
/// shard vouches for it with a promise (the failsafe). Neither rests on the record being current:
/// while either holds nobody can be promoted in its place, and a read that fails (the apiserver
/// out of reach) would leave the same cached record to decide on. Anything else — a renewal
/// above all — waits for the read. `None` for an agent that holds nothing.
pub fn before_read(view: &LocalView) -> Option<LocalAction> {
    view.holding.as_ref()?;
    match decide(view) {
        action @ (LocalAction::Fence { .. } | LocalAction::Unfence { .. }) => Some(action),
        _ => None,
    }
}

/// Whether the labels and `/primary` may advertise the local Valkey as primary *once it is
/// master*: this agent holds a valid renewal of the record naming it (this epoch, this Valkey
/// run, before the deadline) and has not fenced it. A named replica may already hold it, so the
/// moment its promotion lands it is labelled primary directly. Everything else — a fenced,
/// superseded or unrecorded master — is advertised as unknown, so a Service never routes writes
/// to it. (The consumers check the role itself: a replica is never advertised as primary.)
pub fn may_advertise(view: &LocalView) -> bool {
    let held = view
        .valkey
        .as_ref()
        .is_some_and(|v| holds(view, v) || failsafe(view, v));
    held && view.fenced_until.is_none()
}

/// What this agent's heartbeats claim (`crate::heartbeat`): the epoch it holds, and from when
/// its pings ask the shard's members for promises — once a renewal is overdue by a retry
/// period, so that the promises are in place when the renew deadline passes. Timed, not
/// flagged, because a renewal overdue is one that hangs, and the keeper with it. `None`: it
/// holds nothing, and pings nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub epoch: u64,
    pub promises_from: Millis,
}

pub fn claim(view: &LocalView) -> Option<Claim> {
    let v = view.valkey.as_ref()?;
    let h = current_holding(view, v)?;
    let promises_from = h.renewed_at.plus(view.timings.retry_ms.saturating_mul(2));
    (v.role == LocalRole::Primary).then_some(Claim {
        epoch: h.epoch,
        promises_from,
    })
}

/// A holder past its renew deadline (the apiserver out of reach) whose every shard member
/// vouches for it with a promise not to take part in a promotion: it may go on taking writes
/// (`crate::heartbeat`, failsafe).
fn failsafe(view: &LocalView, v: &LocalValkey) -> bool {
    let promised = view
        .peers
        .as_ref()
        .is_some_and(|p| p.all_promised(view.now));
    promised && current_holding(view, v).is_some()
}

/// A holder that no member of its shard vouches for within the window: it may be cut off, and
/// the other side may promote once the record expires; every write it takes now may be lost.
pub fn unvouched(view: &LocalView) -> bool {
    view.peers.as_ref().is_some_and(|p| p.silent(view.now))
}

/// Whether the adapter should ask the recorded primary's Valkey for [`LocalView::successor`]:
/// my Valkey is a master with data and the record names another primary I could follow.
pub fn successor_wanted(view: &LocalView) -> bool {
    let master_with_data = view
        .valkey
        .as_ref()
        .is_some_and(|v| v.role == LocalRole::Primary && !v.fresh);
    let other = existing(view)
        .and_then(ShardRecord::recorded_primary)
        .is_some_and(|p| p != view.me);
    master_with_data && other && view.primary_addr.is_some()
}

/// Whether the record names this agent while its Valkey is still a replica: the coordinator's
/// `REPLICAOF NO ONE` is due any moment (or, for an empty replica, a fresh look decides whether
/// to release), so it is worth observing Valkey more often until then.
pub fn awaiting_promotion(view: &LocalView) -> bool {
    let replica = |v: &&LocalValkey| matches!(v.role, LocalRole::Replica { .. });
    named(view) && view.valkey.as_ref().filter(replica).is_some()
}

fn wait(reason: impl Into<String>) -> LocalAction {
    LocalAction::Wait {
        reason: reason.into(),
    }
}

fn nothing(reason: impl Into<String>) -> LocalAction {
    LocalAction::Nothing {
        reason: reason.into(),
    }
}

/// The record, if it has been read and exists.
fn existing(view: &LocalView) -> Option<&ShardRecord> {
    view.record.as_ref()?.record.as_ref()
}

fn named(view: &LocalView) -> bool {
    existing(view).and_then(ShardRecord::holder) == Some(view.me.as_str())
}

/// Our holding, if it was made for the record's current epoch and this Valkey run.
fn current_holding<'a>(view: &'a LocalView, v: &LocalValkey) -> Option<&'a Holding> {
    let epoch = existing(view)?.epoch;
    let h = view.holding.as_ref()?;
    (named(view) && h.epoch == epoch && h.run_id == v.run_id).then_some(h)
}

fn holds(view: &LocalView, v: &LocalValkey) -> bool {
    current_holding(view, v).is_some_and(|h| view.now < h.deadline(&view.timings))
}

/// Whether the record was read after the local Valkey took its current role: only then does the
/// record reflect every promotion that happened before (the coordinator writes the record first).
fn read_since_role_change(view: &LocalView, v: &LocalValkey) -> bool {
    view.record.as_ref().is_some_and(|s| s.read_at >= v.since)
}

fn not_answering(view: &LocalView) -> LocalAction {
    if named(view) {
        return LocalAction::Release {
            reason: "my Valkey does not answer: releasing so failover need not wait for expiry"
                .into(),
        };
    }
    wait("waiting for my Valkey to answer")
}

/// Pauses writes unless our fence still has at least half its length to run.
fn fence_or(view: &LocalView, reason: &str, otherwise: LocalAction) -> LocalAction {
    let fence_ms = view.timings.lease_ms;
    let lasts = |until: &Millis| until.since(view.now) >= fence_ms / 2;
    if view.fenced_until.as_ref().is_some_and(lasts) {
        return otherwise;
    }
    LocalAction::Fence {
        until: view.now.plus(fence_ms),
        reason: reason.into(),
    }
}

fn fence_or_wait(view: &LocalView, reason: &str) -> LocalAction {
    fence_or(view, reason, wait(format!("fenced: {reason}")))
}

fn as_primary(view: &LocalView, v: &LocalValkey) -> LocalAction {
    if holds(view, v) {
        return steady_primary(view, v);
    }
    let Some(seen) = &view.record else {
        return fence_or_wait(
            view,
            "the record has not been read: cannot confirm I may be primary",
        );
    };
    let promised = promised_elsewhere(view);
    let Some(record) = &seen.record else {
        return match promised {
            Some(why) => fence_or_wait(view, &why),
            None => unrecorded_primary(view, v),
        };
    };
    if named(view) {
        return match promised {
            Some(why) => fence_or_wait(view, &why),
            None => lapsed_primary(view, v),
        };
    }
    match record.recorded_primary() {
        Some(p) if p != view.me => superseded_primary(view, v, p),
        Some(_) => fence_or_wait(view, "I released the record: no writes until a successor"),
        None => fence_or_wait(view, "the record names no primary"),
    }
}

/// We hold a valid renewal: lift our fence if one is left, else renew when due.
fn steady_primary(view: &LocalView, v: &LocalValkey) -> LocalAction {
    if unvouched(view) {
        let reason = "no member of my shard vouches for me: I may be cut off";
        return fence_or(view, reason, renew_or_wait(view, v, reason));
    }
    if view.fenced_until.is_some() {
        return LocalAction::Unfence {
            reason: "renewed the record: writes may resume".into(),
        };
    }
    let Some(h) = current_holding(view, v) else {
        return nothing("primary on record");
    };
    let due = h.renewed_at.plus(view.timings.retry_ms);
    if view.now >= due {
        LocalAction::Renew {
            reason: "primary on record: renewing".into(),
        }
    } else {
        nothing("primary on record, renewed recently")
    }
}

/// No record exists: its last holder re-creates it above its epoch; otherwise only the intended
/// primary creates it, and only if no one else has data.
/// While fenced for want of a vouch: renew when due (the record must not lapse meanwhile).
fn renew_or_wait(view: &LocalView, v: &LocalValkey, reason: &str) -> LocalAction {
    let due = current_holding(view, v)
        .is_some_and(|h| view.now >= h.renewed_at.plus(view.timings.retry_ms));
    match due {
        true => LocalAction::Renew {
            reason: format!("fenced ({reason}): renewing"),
        },
        false => wait(format!("fenced: {reason}")),
    }
}

fn unrecorded_primary(view: &LocalView, v: &LocalValkey) -> LocalAction {
    if let Some(epoch) = recreate_epoch(view, v) {
        let reason = format!(
            "the record vanished while I held it at epoch {}: re-creating it at epoch {epoch}",
            epoch - 1
        );
        return LocalAction::Bootstrap { epoch, reason };
    }
    if view.other_master {
        return fence_or_wait(view, "no record, and another pod runs a master with data");
    }
    if view.node_index == Some(0) {
        return LocalAction::Bootstrap {
            epoch: 1,
            reason: "no record exists and I am node-index 0: creating it at epoch 1".into(),
        };
    }
    fence_or_wait(
        view,
        "no record yet: the node-index 0 pod bootstraps the shard",
    )
}

/// The epoch at which the holder re-creates a deleted record: one above the epoch it holds, if
/// its holding is still valid (before its renew deadline) for this Valkey run, with its data.
/// While it is valid nobody can have been promoted (the coordinator waits a full lease after the
/// last renewal it saw, longer than the renew deadline), and the create fails if anyone else
/// re-created the record first; so the pod the shard trusts stays primary, with no failover. A
/// holder that learns of the deletion only after its deadline has fenced itself and waits.
fn recreate_epoch(view: &LocalView, v: &LocalValkey) -> Option<u64> {
    let h = view.holding.as_ref()?;
    let valid = view.now < h.deadline(&view.timings);
    let ours = h.run_id == v.run_id && !v.fresh;
    (valid && ours).then(|| h.epoch.checked_add(1)).flatten()
}

/// The record names us, but our renewal lapsed (or was made for another epoch or Valkey run).
fn lapsed_primary(view: &LocalView, v: &LocalValkey) -> LocalAction {
    // Empty under our own claim is legitimate (a bootstrapped primary before its first write);
    // empty in another run means Valkey restarted without its data, and continuing as primary
    // would have every replica resync nothing.
    let same_run = view.holding.as_ref().is_some_and(|h| h.run_id == v.run_id);
    if v.fresh && !same_run {
        return LocalAction::Release {
            reason: "my Valkey came back empty: its data is gone, a replica has the shard's".into(),
        };
    }
    if failsafe(view, v) {
        return failsafe_primary(view);
    }
    let renew = LocalAction::Renew {
        reason: "fenced: renewing late; writes resume if nobody took over".into(),
    };
    fence_or(
        view,
        "could not renew the record before my renew deadline",
        renew,
    )
}

/// My Valkey is master, but the record names another pod.
fn failsafe_primary(view: &LocalView) -> LocalAction {
    const WHY: &str = "every member of my shard vouches for me with a promise";
    match view.fenced_until {
        Some(_) => LocalAction::Unfence {
            reason: format!("past my renew deadline, but {WHY}: writes resume (failsafe)"),
        },
        None => LocalAction::Renew {
            reason: format!("past my renew deadline, {WHY}: writing on, renewing (failsafe)"),
        },
    }
}

fn superseded_primary(view: &LocalView, v: &LocalValkey, successor: &str) -> LocalAction {
    if !read_since_role_change(view, v) {
        return fence_or_wait(
            view,
            "my Valkey became master after my last read of the record",
        );
    }
    let Some(to) = view.primary_addr.clone() else {
        return fence_or_wait(
            view,
            &format!("{successor} is primary but its address is unknown"),
        );
    };
    if v.fresh {
        let reason = format!("my Valkey came up as an empty master; {successor} is primary");
        return LocalAction::Rejoin { to, reason };
    }
    match may_follow(view, v, successor) {
        Ok(how) => LocalAction::Demote {
            to,
            reason: format!("{successor} is primary on record and {how}: demoting"),
        },
        Err(why) => fence_or_wait(view, &why),
    }
}

/// The start of every reason `may_follow` gives for not following (the adapter raises an
/// Event on it).
pub const NOT_FOLLOWING: &str = "not following the record";

/// Whether my Valkey, a master with data, may follow the recorded successor (`REPLICAOF`
/// discards whatever the successor's stream does not hold), and how it stands to mine. Only if
/// the successor answers as master — only the coordinator promotes, and only once my lease ran
/// out or while my data stays where it is — and its stream is mine: it continues every byte of
/// mine (Valkey's partial-resync rule), or it was promoted from my stream (the bytes of mine past
/// its promotion are writes I acknowledged while cut off, lost to the failover either way, as
/// pg_rewind discards them in Patroni), or it is a promoted stream already past my offset (later
/// failovers). A record forged to name a lagging replica, a pod that is not there, or an empty
/// master never makes a primary throw its data away: it stays fenced and says why, until a real
/// promotion or its own record returns.
fn may_follow(view: &LocalView, v: &LocalValkey, successor: &str) -> Result<String, String> {
    let Some(s) = &view.successor else {
        return Err(format!(
            "{NOT_FOLLOWING}: {successor} is named primary but its Valkey does not answer me"
        ));
    };
    if !s.primary {
        return Err(format!(
            "{NOT_FOLLOWING}: {successor} is named primary but its Valkey is no master \
             (a record no promotion carried out)"
        ));
    }
    let mine = &v.history;
    if s.history.continues(mine) {
        return Ok("continues all my data".into());
    }
    if s.history.replid2.as_deref() == Some(mine.replid.as_str()) {
        let end = s.history.second_offset.unwrap_or(0).saturating_sub(1);
        let past = mine.offset.saturating_sub(end);
        return Ok(format!(
            "was promoted from my stream at offset {end}; the {past} bytes of mine past it \
             were taken while I was cut off and are discarded"
        ));
    }
    if s.history.replid2.is_some() && s.history.offset >= mine.offset {
        return Ok("is a promoted stream past my offset".into());
    }
    restarted_alike(&s.history, mine).ok_or_else(|| {
        format!(
            "{NOT_FOLLOWING}: {successor}'s Valkey does not continue my data (offset {} of {}, \
             mine {} of {}): following it would discard my writes",
            s.history.offset, s.history.replid, mine.offset, mine.replid
        )
    })
}

/// After a full restart from disk every Valkey starts a stream of its own: from an RDB, each
/// promoted from the stream it last held (`replid2`, at its own offset); from an AOF, at offset 0
/// with no past at all. Streams then say only how far each got in the old one, or nothing, and
/// the keys are what is left to compare: follow a successor that got at least as far, or, with
/// no position of mine, one never promoted since its start that holds at least as many keys.
/// What I wrote since my own restart is discarded (named); a forged record naming a master with
/// less data is still refused.
fn restarted_alike(s: &History, mine: &History) -> Option<String> {
    // One current stream is no restart: its offsets alone compare (`continues`), and a successor
    // behind mine on it would discard my writes (found by the property test).
    if s.replid == mine.replid {
        return None;
    }
    if let (Some(theirs), Some(ours)) = (&s.replid2, &mine.replid2)
        && theirs == ours
        && s.second_offset >= mine.second_offset
    {
        let shared_end = mine.second_offset.unwrap_or(1).saturating_sub(1);
        return Some(format!(
            "restarted from stream {ours} at least as far as I did; the {} bytes I took \
             since are discarded",
            mine.offset.saturating_sub(shared_end)
        ));
    }
    let positionless = mine.offset == 0 && mine.replid2.is_none();
    (positionless && s.replid2.is_none() && s.keys >= mine.keys).then(|| {
        format!(
            "neither restart kept a replication position; it holds {} keys, I {}",
            s.keys, mine.keys
        )
    })
}

fn as_replica(view: &LocalView, v: &LocalValkey, of: &str) -> LocalAction {
    let Some(seen) = &view.record else {
        return wait("the record has not been read yet");
    };
    let Some(record) = &seen.record else {
        return nothing(format!("no record yet; replicating from {of}"));
    };
    if named(view) {
        return named_replica(view, v);
    }
    match record.recorded_primary() {
        Some(p) if p != view.me => follow(view, v, p, of),
        _ => wait("the record names no other primary: waiting for the coordinator"),
    }
}

/// The record names us while our Valkey is still a replica: a promotion is under way.
///
/// One renewal anchors our deadline before the coordinator's `REPLICAOF NO ONE` arrives, so the
/// new primary is writable at once. Only one: if the promotion does not come by that deadline
/// the coordinator stalled, and we release so it can choose again.
/// A binding promise to another pod, as the reason to wait it out: no claim on the record (a
/// renewal, a bootstrap) while it binds.
fn promised_elsewhere(view: &LocalView) -> Option<String> {
    let p = view
        .promise
        .as_ref()
        .filter(|p| p.binds(view.now) && p.to != view.me)?;
    Some(format!(
        "named primary, but I promised {} to take part in no promotion for {} ms more",
        p.to,
        p.until.since(view.now)
    ))
}

fn named_replica(view: &LocalView, v: &LocalValkey) -> LocalAction {
    // Its renewal is the consent a promotion waits for (`PromotionCommand::AwaitConsent`).
    if let Some(why) = promised_elsewhere(view) {
        return wait(why);
    }
    if v.fresh {
        // An observation older than the read that named us may predate a sync that completed
        // since (the coordinator, which observed it later, saw the data): look again first, or
        // the shard ping-pongs between replicas the coordinator picks and their agents release.
        if view
            .record
            .as_ref()
            .is_some_and(|s| v.observed_at < s.read_at)
        {
            return wait("named primary: observing my Valkey again before deciding");
        }
        // The coordinator never picks a replica that never synced: the record is about an
        // earlier incarnation of this pod, whose data is gone.
        return LocalAction::Release {
            reason: "named primary, but my Valkey never synced: releasing".into(),
        };
    }
    match current_holding(view, v) {
        None => LocalAction::Renew {
            reason: "named primary: renewing before my Valkey is promoted".into(),
        },
        Some(_) if holds(view, v) => wait("named primary: waiting to be promoted"),
        Some(_) => LocalAction::Release {
            reason: "named primary, but my Valkey was not promoted before my renew deadline".into(),
        },
    }
}

fn follow(view: &LocalView, v: &LocalValkey, primary: &str, of: &str) -> LocalAction {
    let Some(to) = view.primary_addr.clone() else {
        return wait(format!("{primary} is primary but its address is unknown"));
    };
    if to == of {
        return nothing(format!("replicating from the recorded primary {primary}"));
    }
    if !read_since_role_change(view, v) {
        return wait("my Valkey changed primary after my last read of the record");
    }
    let reason = format!("replicating from {of}, but {primary} is primary on record");
    LocalAction::Repoint { to, reason }
}

// ---------------------------------------------------------------------------------------------
// The coordinator: unplanned failover.
// ---------------------------------------------------------------------------------------------
