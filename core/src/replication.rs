//! Replication mode (Valkey without Cluster): the rules that replace Sentinel, as pure functions.
//!
//! Each shard is one primary and N replicas joined by plain `REPLICAOF`. Who may be primary is
//! written on a per-shard Lease, the [`ShardRecord`] (`<cluster>-<shard>-primary`): *whoever holds
//! it may be primary* (CloudNativePG 1.30). Three parties read it:
//!
//! - **every agent**, about its own Valkey: [`local`] — renew the record, fence writes when the
//!   record can no longer be renewed, release it when Valkey is gone, follow the recorded primary,
//!   bootstrap the very first record;
//! - **the coordinator** (holder of the cluster Lease), when a primary is lost: [`promote`] — the
//!   only place a new epoch is chosen for an unplanned failover;
//! - **the coordinator**, for a planned move (pod deletion, drain, fail-back, balance): the
//!   [`Switchover`] step machine — pause, catch up, write the record, promote, repoint, unpause.
//!
//! # Why it is safe
//! - *Never two writable primaries past the fencing deadline.* A holder counts its renew deadline
//!   from the moment it *sent* its last successful renewal; the coordinator promotes only after
//!   seeing the record unchanged for a full lease duration on its own monotonic clock, and the
//!   change it saw cannot predate that send. `lease > renew deadline`, so a holder that cannot
//!   renew reaches its deadline — and pauses its writes ([`LocalAction::Fence`]) — strictly
//!   before anyone may promote. The gap (`lease − renew deadline`, 5 s by default) is the time the
//!   `CLIENT PAUSE` has to land in; the adapter wakes at the deadline rather than at its next tick.
//! - More generally, a Valkey that is master accepts writes only while its agent holds a valid
//!   renewal of a record naming it ([`Holding`]); every other master is fenced or demoted.
//! - *No acknowledged write lost in a switchover.* The old primary's writes are paused before its
//!   offset is read, and the record moves only once the target has replicated up to that offset.
//! - *Only the coordinator promotes.* No local action makes a Valkey primary: agents renew what
//!   the record already says, and create the record only when none exists
//!   ([`LocalAction::Bootstrap`]).
//! - Every interval is judged on the local monotonic clock ([`Millis`]); `renewTime` is never read.

use std::cmp::Reverse;

use crate::lease::LeaseTimings;
pub use crate::lease::{MAX_LEASE_MS, judged_lease_ms};
use crate::observation::Role;
use crate::time::Millis;

/// The per-shard primary Lease: `holderIdentity` plus two annotations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardRecord {
    /// The pod that may be primary (`holderIdentity`); `None` or empty: released.
    pub holder: Option<String>,
    /// The pod promoted at `epoch` ([`ShardRecord::PRIMARY_ANNOTATION`]). Unlike the holder it
    /// survives a release, so the shard still knows whom its replicas follow and whom not to
    /// promote again.
    pub primary: Option<String>,
    /// Bumped by every promotion ([`ShardRecord::EPOCH_ANNOTATION`]); 1 after bootstrap.
    pub epoch: u64,
    /// `resourceVersion`: every write changes it, so it tells a renewal from a stale read.
    pub version: String,
    /// The lease duration its last writer set (`leaseDurationSeconds`, in ms): the holder's own.
    /// Expiry is judged by the longer of it and the judge's own (see [`judged_lease_ms`]).
    pub lease_ms: Option<u64>,
}

impl ShardRecord {
    /// Annotation carrying [`ShardRecord::epoch`].
    pub const EPOCH_ANNOTATION: &'static str = "valkey.io/epoch";
    /// Annotation carrying [`ShardRecord::primary`].
    pub const PRIMARY_ANNOTATION: &'static str = "valkey.io/primary";

    /// Label naming the Valkey cluster on every shard record.
    pub const CLUSTER_LABEL: &'static str = "valkey.io/cluster";
    /// Label telling shard records from other Leases (`shard-primary`).
    pub const KIND_LABEL: &'static str = "valkey.io/record";
    /// The value of [`ShardRecord::KIND_LABEL`].
    pub const KIND: &'static str = "shard-primary";

    /// The Lease's name for a shard of a cluster.
    pub fn lease_name(cluster: &str, shard: &str) -> String {
        format!("{cluster}-{shard}-primary")
    }

    /// The shard a record's Lease name belongs to, if it is one of `cluster`'s.
    pub fn shard_of<'a>(cluster: &str, lease: &'a str) -> Option<&'a str> {
        let shard = lease.strip_prefix(cluster)?.strip_prefix('-')?;
        shard.strip_suffix("-primary").filter(|s| !s.is_empty())
    }

    /// The label selector of `cluster`'s shard records.
    pub fn selector(cluster: &str) -> String {
        format!(
            "{}={},{}={cluster}",
            ShardRecord::KIND_LABEL,
            ShardRecord::KIND,
            ShardRecord::CLUSTER_LABEL
        )
    }

    /// The record the first primary creates: it holds it at epoch 1.
    pub fn bootstrap(pod: &str) -> ShardRecord {
        ShardRecord {
            lease_ms: None,
            holder: Some(pod.to_owned()),
            primary: Some(pod.to_owned()),
            epoch: 1,
            version: String::new(),
        }
    }

    /// Who holds the record, if anyone (an empty holder counts as released).
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }

    /// Whether `pod` holds the record: only the holder may release it (a release by anyone else —
    /// an old primary stopping after a switchover moved the record on — would void the new
    /// holder's claim and start a needless failover).
    pub fn held_by(&self, pod: &str) -> bool {
        self.holder() == Some(pod)
    }

    /// The pod the record names as primary: the holder, else the last promoted pod.
    pub fn recorded_primary(&self) -> Option<&str> {
        self.holder()
            .or(self.primary.as_deref().filter(|p| !p.is_empty()))
    }

    /// Whether `other` names the same holder and primary at the same epoch (a renewal, which
    /// only changes the version, leaves the claim the same).
    pub fn same_claim(&self, other: &ShardRecord) -> bool {
        (self.holder(), self.primary.as_deref(), self.epoch)
            == (other.holder(), other.primary.as_deref(), other.epoch)
    }

    /// This record with the holder cleared (a release keeps the epoch and the last primary).
    pub fn released(&self) -> ShardRecord {
        ShardRecord {
            holder: None,
            ..self.clone()
        }
    }
}

/// A record as one agent last read it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SeenRecord {
    /// `None`: the read said the Lease does not exist.
    pub record: Option<ShardRecord>,
    /// When the read that returned it was *sent* (or our own write that produced it). Reads must
    /// be quorum reads (a plain GET), so anything written before this instant is reflected.
    pub read_at: Millis,
    /// When this agent first saw the record in this form (same `resourceVersion`).
    pub changed_at: Millis,
}

impl SeenRecord {
    /// The record as seen after a read sent at `sent` and answered at `received` (or our own
    /// write sent at `sent` and acknowledged at `received`). A new `resourceVersion` counts as
    /// changed when the answer arrived — the write it shows was sent before that, so an expiry
    /// judged from it is never early —; the same one keeps the instant it was first seen.
    pub fn after_read(
        prev: Option<&SeenRecord>,
        record: Option<ShardRecord>,
        sent: Millis,
        received: Millis,
    ) -> SeenRecord {
        let version = |r: Option<&ShardRecord>| r.map(|r| r.version.clone());
        let changed_at = match prev {
            Some(p) if version(p.record.as_ref()) == version(record.as_ref()) => p.changed_at,
            _ => received,
        };
        SeenRecord {
            record,
            read_at: sent,
            changed_at,
        }
    }

    /// [`SeenRecord::after_read`], for a judge of expiry: a read after a gap of more than `gap_ms`
    /// since the previous one restarts the clock. Whatever kept this agent from reading (an
    /// apiserver outage) may have kept the holder from renewing too; a record judged stale across
    /// that gap would fail over a primary that only fenced itself because nobody could write.
    /// Judged from here on, the holder gets a full lease to renew once the apiserver answers.
    pub fn after_continuous_read(
        prev: Option<&SeenRecord>,
        record: Option<ShardRecord>,
        sent: Millis,
        received: Millis,
        gap_ms: u64,
    ) -> SeenRecord {
        let mut seen = SeenRecord::after_read(prev, record, sent, received);
        if prev.is_some_and(|p| sent.since(p.read_at) > gap_ms) {
            seen.changed_at = received;
        }
        seen
    }
}

// ---------------------------------------------------------------------------------------------
// Every agent: what to do about its own Valkey.
// ---------------------------------------------------------------------------------------------

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
pub fn local(view: &LocalView) -> LocalAction {
    match &view.valkey {
        None => not_answering(view),
        Some(v) => match &v.role {
            LocalRole::Primary => as_primary(view, v),
            LocalRole::Replica { of } => as_replica(view, v, of),
        },
    }
}

/// Whether the labels and `/primary` may advertise the local Valkey as primary *once it is
/// master*: this agent holds a valid renewal of the record naming it (this epoch, this Valkey
/// run, before the deadline) and has not fenced it. A named replica may already hold it, so the
/// moment its promotion lands it is labelled primary directly. Everything else — a fenced,
/// superseded or unrecorded master — is advertised as unknown, so a Service never routes writes
/// to it. (The consumers check the role itself: a replica is never advertised as primary.)
pub fn may_advertise(view: &LocalView) -> bool {
    let held = view.valkey.as_ref().is_some_and(|v| holds(view, v));
    held && view.fenced_until.is_none()
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
    let Some(record) = &seen.record else {
        return unrecorded_primary(view, v);
    };
    if named(view) {
        return lapsed_primary(view, v);
    }
    match record.recorded_primary() {
        Some(p) if p != view.me => superseded_primary(view, v, p),
        Some(_) => fence_or_wait(view, "I released the record: no writes until a successor"),
        None => fence_or_wait(view, "the record names no primary"),
    }
}

/// We hold a valid renewal: lift our fence if one is left, else renew when due.
fn steady_primary(view: &LocalView, v: &LocalValkey) -> LocalAction {
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
    let reason = format!("{successor} is primary on record: demoting before accepting writes");
    LocalAction::Demote { to, reason }
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
fn named_replica(view: &LocalView, v: &LocalValkey) -> LocalAction {
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

/// Everything the coordinator looks at to decide on a failover of one shard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardView {
    pub now: Millis,
    /// Whether this agent holds the cluster Lease *now* (before its acting deadline).
    pub leader: bool,
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
/// The executor, checking its cluster-Lease acting deadline first, runs in this order:
/// 1. write [`Promotion::record`] carrying `version` — a 409 means the holder renewed (or someone
///    else wrote) since the decision: stop. The record moves first so that no Valkey is ever
///    made primary before the record names it; if the executor dies after this step, the
///    target's agent renews, then releases when no promotion follows, and the next decision runs;
/// 2. `CLIENT PAUSE <ms> WRITE` on every pod in `fence` (other masters that still answer), so an
///    old primary whose agent is gone stops taking writes before the new one starts;
/// 3. `REPLICAOF NO ONE` on `target`;
/// 4. `REPLICAOF <target>` on every pod in `repoint`, best effort — each agent's own
///    [`LocalAction::Demote`] / [`LocalAction::Repoint`] is the backstop.
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
    NotLeader,
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
pub fn promote(view: &ShardView, policy: &FailoverPolicy) -> Result<Promotion, Hold> {
    if !policy.automatic {
        return Err(hold(HoldKind::Disabled, "automatic failover is off"));
    }
    if !view.leader {
        return Err(hold(HoldKind::NotLeader, "not the coordinator"));
    }
    let Some(seen) = &view.record else {
        return Err(hold(HoldKind::NoRecord, "the record has not been read"));
    };
    let Some(record) = &seen.record else {
        return Err(hold(
            HoldKind::NoRecord,
            "no record: the shard is not bootstrapped",
        ));
    };
    let why = vacancy(view, seen, record)?;
    choose(view, record, why)
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
        let reason = "the epoch cannot increase any further";
        return Err(hold(HoldKind::NoCandidate, reason));
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
    let answering = view.members.iter().filter_map(|m| m.valkey.as_ref());
    let empty = answering.map(|v| v.keys).sum::<u64>() == 0;
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

/// Members that may become primary, best first: highest offset, then the preferred zone, then
/// the pod name (a fixed tie-break, so repeated decisions agree).
pub fn candidates<'a>(view: &'a ShardView, record: &ShardRecord) -> Vec<&'a ShardMember> {
    let mut c: Vec<&ShardMember> = view
        .members
        .iter()
        .filter(|m| ineligible(m, record).is_none())
        .collect();
    let preferred =
        |m: &ShardMember| view.preferred_zone.is_some() && m.zone == view.preferred_zone;
    c.sort_by_key(|m| {
        let offset = m.valkey.as_ref().map_or(0, |v| v.offset);
        (Reverse(offset), Reverse(preferred(m)), m.pod.as_str())
    });
    c
}

/// Why a member may not be promoted, if it may not.
fn ineligible(m: &ShardMember, record: &ShardRecord) -> Option<&'static str> {
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
    replica_ineligible(v)
}

fn replica_ineligible(v: &MemberValkey) -> Option<&'static str> {
    if v.role != Role::Replica {
        return Some("is not a replica");
    }
    // A replica that never synced holds nothing: promoting it would make every other node
    // (the old primary included, once back) resync the empty dataset. Sentinel skips it too.
    v.fresh.then_some("never synced")
}

fn no_candidate(view: &ShardView, record: &ShardRecord, why: &str) -> String {
    let each: Vec<String> = view
        .members
        .iter()
        .filter_map(|m| ineligible(m, record).map(|r| format!("{} {r}", m.pod)))
        .collect();
    format!("{why}, but no member can take over: {}", each.join(", "))
}

// ---------------------------------------------------------------------------------------------
// The coordinator: planned switchover.
// ---------------------------------------------------------------------------------------------

/// A command for the switchover's executor, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `MULTI; CLIENT PAUSE <ms> WRITE; INFO replication; EXEC` on `pod`: the offset in that
    /// reply is read under the pause, so every acknowledged write is at or below it.
    Pause { pod: String, ms: u64 },
    /// Write the record: holder and primary = `holder`, at `epoch`, but only if it still shows
    /// `expect_holder` at `expect_epoch`. The old holder keeps renewing meanwhile, so the
    /// executor reads the record, compares, and writes carrying that read's `resourceVersion`,
    /// retrying on 409. It reports [`WriteOutcome`]; an unknown result (timeout) is resolved by
    /// reading the record again, never by guessing.
    WriteRecord {
        holder: String,
        epoch: u64,
        expect_holder: String,
        expect_epoch: u64,
    },
    /// `REPLICAOF NO ONE` on `pod`.
    PromoteNoOne { pod: String },
    /// `REPLICAOF <to>` on `pod` (`to` is `host port` as the executor spells it).
    ReplicaOf { pod: String, to: String },
    /// `CLIENT UNPAUSE` on `pod`.
    Unpause { pod: String },
}

/// The outcome of [`Command::WriteRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Written,
    /// The record no longer showed the expected holder and epoch: someone else moved it.
    Refused,
}

/// What a switchover is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchoverPlan {
    /// The current primary (the record's holder).
    pub from: String,
    pub to: String,
    /// The target's address for `REPLICAOF`.
    pub to_addr: String,
    /// The other replicas, repointed to the target at the end.
    pub others: Vec<String>,
    /// The record's epoch when the switchover was planned; the target gets `epoch + 1`.
    pub epoch: u64,
    /// How long the old primary may stay paused waiting for the target to catch up.
    pub timeout_ms: u64,
}

/// Where a switchover is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Nothing sent yet.
    Start,
    /// The pause is sent; waiting for the old primary's offset under the pause.
    Pausing,
    /// Writes are paused at `offset`; waiting for the target to reach it.
    CatchingUp { offset: u64 },
    /// The record write is out; its outcome decides between commit and rollback. No timeout
    /// applies here: the write may have landed, so the pause is kept (and refreshed) until the
    /// outcome is known.
    Writing,
    /// The target is primary on record and the commands to move Valkey there were issued.
    Done,
    /// Writes resumed on the old primary; the record was not changed by this switchover.
    RolledBack { reason: String },
}

/// A planned switchover: pause the old primary, wait for the target to catch up, move the
/// record, promote, repoint, unpause — or unpause and leave everything as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switchover {
    pub plan: SwitchoverPlan,
    pub started: Millis,
    pub phase: Phase,
    /// When the last pause was sent (refreshed while the record write is out).
    pub paused_at: Option<Millis>,
}

/// What the executor learned since the last step.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SwitchoverObservation {
    /// The old primary's `master_repl_offset` read under the pause, once known.
    pub paused_offset: Option<u64>,
    /// The target's replication offset, if it answered.
    pub target_offset: Option<u64>,
    /// The record write's outcome, once known.
    pub write: Option<WriteOutcome>,
}

impl Switchover {
    /// A switchover that has not started yet.
    pub fn new(plan: SwitchoverPlan, now: Millis) -> Switchover {
        Switchover {
            plan,
            started: now,
            phase: Phase::Start,
            paused_at: None,
        }
    }

    /// Length of each pause: twice the timeout, so the first pause outlasts the catch-up and
    /// leaves as long again for the record write (refreshed beyond that).
    pub fn pause_ms(&self) -> u64 {
        self.plan.timeout_ms.saturating_mul(2)
    }

    /// Past this instant the target may no longer be given the record.
    pub fn deadline(&self) -> Millis {
        self.started.plus(self.plan.timeout_ms)
    }

    /// Whether the switchover is over (done or rolled back).
    pub fn finished(&self) -> bool {
        matches!(self.phase, Phase::Done | Phase::RolledBack { .. })
    }

    fn with(&self, phase: Phase) -> Switchover {
        Switchover {
            phase,
            ..self.clone()
        }
    }
}

/// Advances a switchover by one step at `now`, returning its next state and the commands to run,
/// in order.
pub fn step(
    s: &Switchover,
    obs: &SwitchoverObservation,
    now: Millis,
) -> (Switchover, Vec<Command>) {
    match &s.phase {
        Phase::Start => pause(s, now),
        Phase::Pausing => pausing(s, obs, now),
        Phase::CatchingUp { offset } => catching_up(s, obs, *offset, now),
        Phase::Writing => writing(s, obs, now),
        Phase::Done | Phase::RolledBack { .. } => (s.clone(), Vec::new()),
    }
}

fn pause(s: &Switchover, now: Millis) -> (Switchover, Vec<Command>) {
    paused(s, Phase::Pausing, now)
}

/// Sends (or refreshes) the pause on the old primary and moves to `phase`.
fn paused(s: &Switchover, phase: Phase, now: Millis) -> (Switchover, Vec<Command>) {
    let mut next = s.with(phase);
    next.paused_at = Some(now);
    let cmd = Command::Pause {
        pod: s.plan.from.clone(),
        ms: s.pause_ms(),
    };
    (next, vec![cmd])
}

fn pausing(s: &Switchover, obs: &SwitchoverObservation, now: Millis) -> (Switchover, Vec<Command>) {
    if now >= s.deadline() {
        return rollback(
            s,
            "the old primary did not report its offset under the pause in time",
        );
    }
    match obs.paused_offset {
        Some(offset) => catching_up(&s.with(Phase::CatchingUp { offset }), obs, offset, now),
        None => (s.clone(), Vec::new()),
    }
}

fn catching_up(
    s: &Switchover,
    obs: &SwitchoverObservation,
    offset: u64,
    now: Millis,
) -> (Switchover, Vec<Command>) {
    if now >= s.deadline() {
        let at = obs
            .target_offset
            .map_or("unknown".into(), |o| o.to_string());
        let reason = format!("{} reached offset {at}, not {offset}, in time", s.plan.to);
        return rollback(s, &reason);
    }
    if obs.target_offset.is_none_or(|t| t < offset) {
        return (s.clone(), Vec::new());
    }
    write_record(s)
}

/// The target has every acknowledged write: hand it the record at the next epoch.
fn write_record(s: &Switchover) -> (Switchover, Vec<Command>) {
    let Some(epoch) = s.plan.epoch.checked_add(1) else {
        return rollback(s, "the epoch cannot increase any further");
    };
    let cmd = Command::WriteRecord {
        holder: s.plan.to.clone(),
        epoch,
        expect_holder: s.plan.from.clone(),
        expect_epoch: s.plan.epoch,
    };
    (s.with(Phase::Writing), vec![cmd])
}

fn writing(s: &Switchover, obs: &SwitchoverObservation, now: Millis) -> (Switchover, Vec<Command>) {
    match obs.write {
        Some(WriteOutcome::Written) => commit(s),
        Some(WriteOutcome::Refused) => rollback(s, "the record moved under the switchover"),
        None => keep_paused(s, now),
    }
}

/// Refreshes the pause while the write's outcome is unknown: it may have landed, and the old
/// primary must not take writes the new one will never see.
fn keep_paused(s: &Switchover, now: Millis) -> (Switchover, Vec<Command>) {
    let half = s.pause_ms() / 2;
    if s.paused_at.is_some_and(|at| now < at.plus(half)) {
        return (s.clone(), Vec::new());
    }
    paused(s, Phase::Writing, now)
}

fn commit(s: &Switchover) -> (Switchover, Vec<Command>) {
    let p = &s.plan;
    let to = p.to_addr.clone();
    let mut cmds = vec![Command::PromoteNoOne { pod: p.to.clone() }];
    let others = p.others.iter().filter(|o| **o != p.to && **o != p.from);
    let followers = std::iter::once(&p.from).chain(others);
    cmds.extend(followers.map(|pod| Command::ReplicaOf {
        pod: pod.clone(),
        to: to.clone(),
    }));
    cmds.push(Command::Unpause {
        pod: p.from.clone(),
    });
    (s.with(Phase::Done), cmds)
}

fn rollback(s: &Switchover, reason: &str) -> (Switchover, Vec<Command>) {
    let next = s.with(Phase::RolledBack {
        reason: reason.to_owned(),
    });
    let cmd = Command::Unpause {
        pod: s.plan.from.clone(),
    };
    (next, vec![cmd])
}
