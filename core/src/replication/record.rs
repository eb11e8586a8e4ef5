//! The per-shard primary record on a Lease, and how long it has been seen unchanged.

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
    /// Expiry is judged by the longer of it and the judge's own (see [`judged_lease_ms`](crate::lease::judged_lease_ms)).
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
    /// The highest epoch this agent has read on the record, kept while it is absent: a record
    /// that vanishes is re-created above it (`promotion::decide`).
    pub last_epoch: Option<u64>,
    /// When the apiserver last told this agent about the record: the last read's send, or the
    /// receipt of the last change a watch delivered ([`SeenRecord::after_event`]). The gap rule
    /// of [`SeenRecord::after_continuous_read`] measures from it.
    pub heard_at: Millis,
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
        let epochs = [
            prev.and_then(|p| p.last_epoch),
            record.as_ref().map(|r| r.epoch),
        ];
        SeenRecord {
            last_epoch: epochs.into_iter().flatten().max(),
            record,
            read_at: sent,
            changed_at,
            heard_at: sent,
        }
    }

    /// The record as a watch delivered it at `received`, when it makes the same claim as the one
    /// read (a renewal): its new `resourceVersion` counts as changed at the receipt — after the
    /// write it shows, so an expiry judged from it is never early — but `read_at` stays the last
    /// quorum read's, which is what the keeper's decisions rest on. `None`: the claim moved (or
    /// nothing was read yet), which calls for a read instead.
    pub fn after_event(&self, record: ShardRecord, received: Millis) -> Option<SeenRecord> {
        let same = self.record.as_ref().is_some_and(|r| r.same_claim(&record));
        if !same {
            return None;
        }
        let changed = self
            .record
            .as_ref()
            .is_none_or(|r| r.version != record.version);
        Some(SeenRecord {
            changed_at: if changed { received } else { self.changed_at },
            last_epoch: self.last_epoch.max(Some(record.epoch)),
            record: Some(record),
            heard_at: received,
            ..self.clone()
        })
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
        if prev.is_some_and(|p| sent.since(p.heard_at.max(p.read_at)) > gap_ms) {
            seen.changed_at = received;
        }
        seen
    }
}

// ---------------------------------------------------------------------------------------------
// Every agent: what to do about its own Valkey.
// ---------------------------------------------------------------------------------------------

/// When the coordinator reads a shard's record next (its replication round): once per retry
/// period while the shard is [`calm`], else at the next round (`Millis(0)`). Reading a calm shard
/// less often can only make `changed_at` later — a failover of a primary that dies silently up to
/// one retry period slower, never earlier.
pub fn next_read(seen: Option<&SeenRecord>, calm: bool, now: Millis, retry_ms: u64) -> Millis {
    match calm {
        true => seen.map_or(now, |s| s.read_at).plus(retry_ms),
        false => Millis(0),
    }
}

/// Nothing can be about to fail over: no move `busy`, and either no record yet (bootstrap is the
/// keepers' business) or a holder whose Valkey answers as primary with every replica's link up (a
/// primary that restarted drops its replicas' links, and its keeper releases the record moments
/// later: it is read every round then). `members`: each answering member's role and link.
pub fn calm<'a>(
    seen: Option<&SeenRecord>,
    mut members: impl Iterator<Item = (&'a str, Role, bool)> + Clone,
    busy: bool,
) -> bool {
    let Some(seen) = seen else {
        return false;
    };
    let Some(record) = &seen.record else {
        return !busy;
    };
    let replicas = members
        .clone()
        .filter(|(_, role, _)| *role == Role::Replica);
    let linked = replicas.clone().all(|(_, _, link_up)| link_up);
    let serving = |h: &str| members.any(|(pod, role, _)| pod == h && role == Role::Primary);
    !busy && linked && record.holder().is_some_and(serving)
}

/// Renewals a watch may miss before its keeper reads the record every retry period again: one
/// late event is no news, two are.
pub const QUIET_PERIODS: u64 = 2;

/// Whether an agent's keeper reads its record now: at its first read, after a refused write or a
/// watched change of the claim (`forced`), at once when its Valkey's role changed after the last
/// read (`role_since`), and once per retry period — unless its watch of the record is live.
///
/// Live: the watch delivered a change (`last_event`) within the last [`QUIET_PERIODS`] retry
/// periods. While a holder renews, each renewal is a change, so a live watch hears one every
/// retry period; a follower then reads only when something moved, and costs the apiserver
/// nothing. A watch quiet for longer — broken, stalled, or a holder that stopped renewing —
/// brings the reads back well before the holder's lease runs out, so an agent that comes to
/// judge its expiry (a new coordinator, seeded from its keeper) has heard from the apiserver all
/// along and judges from the last renewal: a lease after it, not a lease after its own first
/// read ([`SeenRecord::after_continuous_read`]'s gap rule).
pub fn keeper_read_due(
    seen: Option<&SeenRecord>,
    forced: bool,
    role_since: Option<Millis>,
    now: Millis,
    retry_ms: u64,
    last_event: Option<Millis>,
) -> bool {
    let Some(s) = seen else {
        return true;
    };
    if forced || role_since.is_some_and(|t| t > s.read_at) {
        return true;
    }
    let live = last_event.is_some_and(|t| now.since(t) < QUIET_PERIODS * retry_ms);
    !live && now.since(s.read_at) >= retry_ms
}
