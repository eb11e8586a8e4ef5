//! Lease election with client-go semantics, as a pure state machine.
//!
//! The adapter reads the Lease, feeds the record to [`Candidate::observe`] with the local monotonic
//! time, asks [`Candidate::next`] what to do, performs the write (carrying the record's
//! `resourceVersion`, so a concurrent writer gets 409) and reports back with
//! [`Candidate::written`] or [`Candidate::write_failed`].
//!
//! Safety rests on three rules, each tested here:
//! - a candidate takes over only after it has seen the record *unchanged* for a full lease
//!   duration on its own monotonic clock — `renewTime` is never compared with a wall clock, so
//!   clock skew between pods cannot shorten a lease;
//! - a holder counts its renew deadline from the moment it *sent* its last successful write (the
//!   server applied it no earlier), and stops acting the instant the deadline passes;
//! - `lease > renew deadline`, so the old holder has stopped acting before anyone can take over.

use crate::time::Millis;

/// Durations of the election; see [`LeaseTimings::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    pub lease_ms: u64,
    pub renew_deadline_ms: u64,
    pub retry_ms: u64,
}

impl Default for LeaseTimings {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    fn default() -> Self {
        LeaseTimings {
            lease_ms: 15_000,
            renew_deadline_ms: 10_000,
            retry_ms: 2_000,
        }
    }
}

impl LeaseTimings {
    /// How long one Kubernetes call may take: a call must finish well inside the renew deadline
    /// to be of any use, so it gets one retry period (at least half a second).
    pub fn call_limit_ms(&self) -> u64 {
        self.retry_ms.max(500)
    }

    /// client-go's invariant: `lease > renew deadline > 1.2 × retry`.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.lease_ms <= self.renew_deadline_ms {
            return Err("lease duration must be longer than the renew deadline");
        }
        if self.renew_deadline_ms * 5 <= self.retry_ms * 6 {
            return Err("renew deadline must be longer than 1.2 × the retry period");
        }
        if self.retry_ms == 0 {
            return Err("retry period must be positive");
        }
        Ok(())
    }
}

/// The parts of a Lease the election reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// `None` or empty: released.
    pub holder: Option<String>,
    pub lease_ms: u64,
    pub transitions: u32,
    /// `resourceVersion`: any write changes it, so it tells a renewal from a stale read.
    pub version: String,
    /// The pods the holder named to take over first ([`successors`]); the others wait one lease
    /// longer ([`Candidate::next`]). Empty: every candidate contends at once.
    pub successors: Vec<String>,
}

impl LeaseRecord {
    fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }
}

/// What the adapter should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAction {
    /// Read the Lease (nothing known yet, or time to look again).
    Read,
    /// Create or take over the Lease (carrying the observed `resourceVersion`).
    Acquire,
    /// Renew our own Lease.
    Renew,
    /// Nothing to do before `until`.
    Wait { until: Millis },
}

/// One candidate's view of the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub identity: String,
    pub timings: LeaseTimings,
    /// The last record read or written, and when (local time) it was first seen in that form.
    seen: Option<(LeaseRecord, Millis)>,
    /// Whether the Lease object exists at all (create vs update).
    exists: bool,
    /// Send time of our last successful acquire/renew, while we hold the lease.
    renewed_at: Option<Millis>,
    /// When we last tried a write, and last read: each is paced by the retry period.
    last_write: Option<Millis>,
    last_read: Option<Millis>,
    /// A watch on the Lease delivers its changes ([`Candidate::set_watching`]): a follower then
    /// reads nothing while another holds it and judges expiry from the last change delivered.
    watching: bool,
    /// Reads that failed in a row: a follower backs off ([`FOLLOWER_BACKOFF_MAX`]).
    failed_reads: u32,
}

/// A follower whose reads keep failing (an apiserver too busy to answer) waits up to this many
/// retry periods between reads and acquire attempts, doubling from one: every follower polling
/// every retry period is what a busy apiserver least needs (the scale benchmark's 100 agents
/// timed out every 2 s). The holder's renewals are never slowed.
pub const FOLLOWER_BACKOFF_MAX: u64 = 4;

impl Candidate {
    pub fn new(identity: impl Into<String>, timings: LeaseTimings) -> Candidate {
        Candidate {
            identity: identity.into(),
            timings,
            seen: None,
            exists: false,
            renewed_at: None,
            last_write: None,
            last_read: None,
            watching: false,
            failed_reads: 0,
        }
    }

    /// Whether a watch on the Lease is established (its initial list done) and delivering every
    /// change to [`Candidate::observe`]. While it is, a follower stops polling: the holder's
    /// renewals arrive as changes, and expiry is judged from the last one on the local clock as
    /// before. A watch that stalls without breaking only makes a follower try to acquire with a
    /// stale `resourceVersion`, which the apiserver refuses (409); the read that follows shows the
    /// renewals it missed. A broken watch (`false`) falls back to a read every retry period.
    pub fn set_watching(&mut self, watching: bool) {
        self.watching = watching;
    }

    /// Whether changes should be fed from a watch now: only a follower's view needs them (a
    /// holder knows its own writes, and a late event of an older renewal would only cost it a
    /// conflict).
    pub fn wants_changes(&self) -> bool {
        self.renewed_at.is_none()
    }

    /// Records a read of the Lease (`None`: it does not exist).
    pub fn observe(&mut self, record: Option<LeaseRecord>, now: Millis) {
        self.last_read = Some(now);
        self.failed_reads = 0;
        self.exists = record.is_some();
        let record = record.unwrap_or_default();
        if record.holder() != Some(self.identity.as_str()) {
            self.renewed_at = None;
        }
        self.remember(record, now);
    }

    fn remember(&mut self, record: LeaseRecord, now: Millis) {
        let unchanged = self.seen.as_ref().is_some_and(|(r, _)| *r == record);
        if !unchanged {
            self.seen = Some((record, now));
        }
    }

    /// A write we sent at `sent_at` succeeded and produced `record`.
    pub fn written(&mut self, record: LeaseRecord, sent_at: Millis) {
        self.exists = true;
        self.last_write = Some(sent_at);
        if record.holder() == Some(self.identity.as_str()) {
            self.renewed_at = Some(sent_at);
        }
        self.remember(record, sent_at);
    }

    /// A write failed (conflict, timeout, server error). The holder keeps its old `renewed_at`, so
    /// the renew deadline runs on; a conflict means the record moved, so it is read again.
    pub fn write_failed(&mut self, at: Millis) {
        self.last_write = Some(at);
        self.last_read = None;
    }

    /// A read failed: try again after the retry period, longer after several (and keep the last
    /// known record).
    pub fn read_failed(&mut self, at: Millis) {
        self.last_read = Some(at);
        self.failed_reads = self.failed_reads.saturating_add(1);
    }

    /// A follower's pace: the retry period, doubled for each read that failed since the last one
    /// that worked, up to [`FOLLOWER_BACKOFF_MAX`] periods.
    fn follower_pace(&self) -> u64 {
        let doublings = self.failed_reads.saturating_sub(1).min(2);
        let periods = (1u64 << doublings).min(FOLLOWER_BACKOFF_MAX);
        self.timings.retry_ms.saturating_mul(periods)
    }

    /// We released the Lease on shutdown.
    pub fn released(&mut self) {
        self.renewed_at = None;
    }

    /// Whether we hold the Lease and may act now. False from the moment the renew deadline passes.
    pub fn is_coordinator(&self, now: Millis) -> bool {
        self.renewed_at
            .is_some_and(|at| now.since(at) < self.timings.renew_deadline_ms)
    }

    /// How long the write [`Candidate::next`] asks for may take. A holder's renewal, and
    /// a named successor's acquire, may take a renew deadline: a renewal answered after the term it
    /// extends has ended still starts a term of its own, counted from when it was *sent*
    /// ([`Candidate::written`]), so cutting it short at the old term's end (as this did) only
    /// threw away renewals the apiserver was about to apply. In the 50-shard bench's drains the
    /// apiserver answered renewals in 1.5 s median and 4.4 s p90; the holder's renewals sent in the
    /// last 2 s of its term were cut at 2 s, its term ended, and the Lease changed hands every
    /// 30–90 s. Any other candidate's acquire gets one call ([`LeaseTimings::call_limit_ms`]):
    /// there, each of 94 late candidates' acquires held an apiserver seat for 10 s (504) while the
    /// holder's renewals queued behind them. Safety does not rest on these bounds: a term counts
    /// from the send, however late the answer, and ends on the local clock.
    pub fn write_limit_ms(&self) -> u64 {
        match self.renewed_at.is_some() || self.first_in_line() {
            true => self.timings.renew_deadline_ms,
            false => self.timings.call_limit_ms(),
        }
    }

    /// Whether the last record seen lets this candidate contend as soon as the Lease is free.
    fn first_in_line(&self) -> bool {
        self.seen
            .as_ref()
            .is_none_or(|(record, _)| self.named_successor(record))
    }

    /// The latest time at which this holder may still issue an action, if it leads.
    pub fn acting_deadline(&self) -> Option<Millis> {
        self.renewed_at
            .map(|at| at.plus(self.timings.renew_deadline_ms))
    }

    /// Who holds the Lease as far as we know.
    pub fn holder(&self) -> Option<&str> {
        self.seen.as_ref().and_then(|(r, _)| r.holder())
    }

    /// The next step and why (for the log).
    pub fn next(&self, now: Millis) -> (LeaseAction, &'static str) {
        let Some((record, seen_at)) = &self.seen else {
            return (LeaseAction::Read, "nothing read yet");
        };
        let (retry, pace) = (self.timings.retry_ms, self.follower_pace());
        let write_at = self.last_write.map_or(now, |t| t.plus(retry));
        let read_at = self.last_read.map_or(now, |t| t.plus(pace));
        let acquire_at = self.last_write.map_or(now, |t| t.plus(pace));
        let acquire = || at_or_wait(LeaseAction::Acquire, now, acquire_at);
        if self.renewed_at.is_some() {
            let renew = at_or_wait(LeaseAction::Renew, now, write_at);
            return (renew, "held: renewed every retry period");
        }
        let lease = judged_lease_ms(self.timings.lease_ms, Some(record.lease_ms));
        // A candidate the holder did not name to succeed it waits longer: a release or a lapse
        // then does not send every agent of a large cluster at the apiserver at once (in the
        // 50-shard bench, 100 agents' attempts starved the holder's renewals). Nor do the others
        // all come at one moment: each waits between one and two leases, by its pod's name.
        let later = match self.named_successor(record) {
            true => 0,
            false => lease + stable_hash(identity_pod(&self.identity)) % lease.max(1),
        };
        let waiting = |until: Millis, why: &'static str| match self.watching {
            true => (LeaseAction::Wait { until }, why),
            false => (at_or_wait(LeaseAction::Read, now, read_at.min(until)), why),
        };
        match record.holder() {
            None if now >= seen_at.plus(later) => (acquire(), "released or missing"),
            None => waiting(
                seen_at.plus(later),
                "released: the named successors go first",
            ),
            // Ours from a previous life of this pod's agent (the identity carries the pod's UID:
            // a pod recreated under the same name waits like anyone else).
            Some(h) if h == self.identity => (acquire(), "held under our own identity"),
            // Someone else's: take over only after a full lease duration without change.
            Some(_) => {
                let expires = seen_at.plus(lease);
                if now >= expires.plus(later) {
                    (acquire(), "another's, unchanged for a lease duration")
                } else if now >= expires {
                    waiting(
                        expires.plus(later),
                        "another's, expired: the named successors go first",
                    )
                } else {
                    waiting(expires, "another's, renewed within the lease")
                }
            }
        }
    }

    /// Whether this candidate may contend as soon as the Lease is free: the record names no
    /// successors, or names this candidate's pod.
    fn named_successor(&self, record: &LeaseRecord) -> bool {
        let pod = identity_pod(&self.identity);
        record.successors.is_empty() || record.successors.iter().any(|s| s == pod)
    }

    /// The record to write for an acquire or renew at `now`: holder = us, transitions bumped when
    /// the holder changes.
    pub fn record_to_write(&self) -> LeaseRecord {
        let (current, _) = self.seen.clone().unwrap_or_default();
        let changes_hands = current.holder() != Some(self.identity.as_str());
        LeaseRecord {
            holder: Some(self.identity.clone()),
            lease_ms: self.timings.lease_ms,
            transitions: current.transitions
                + u32::from(changes_hands && current.holder().is_some()),
            version: current.version,
            successors: current.successors,
        }
    }

    /// Whether the Lease exists (the adapter creates it otherwise).
    pub fn exists(&self) -> bool {
        self.exists
    }
}

fn at_or_wait(action: LeaseAction, now: Millis, at: Millis) -> LeaseAction {
    if now >= at {
        action
    } else {
        LeaseAction::Wait { until: at }
    }
}

/// An agent's identity in the election: `<pod>_<uid>`, like client-go's `<host>_<uuid>`. A pod
/// force-deleted from a silent node and recreated under the same name has a new UID, so it waits
/// out the old holder's lease instead of taking it over as its own while the old process may still
/// act. Without a UID, the pod name.
pub fn election_identity(pod: &str, uid: Option<&str>) -> String {
    match uid.filter(|u| !u.is_empty()) {
        Some(uid) => format!("{pod}_{uid}"),
        None => pod.to_owned(),
    }
}

/// FNV-1a: the same for a name on every agent and in every version (the standard library's
/// hasher is seeded per process).
fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The pod an [`election_identity`] names (a pod's name has no `_`).
pub fn identity_pod(identity: &str) -> &str {
    identity.split('_').next().unwrap_or(identity)
}

/// The longest lease a record may claim: the agent's own maximum (`SIDECAR_LEASE_DURATION`).
pub const MAX_LEASE_MS: u64 = 3_600_000;

/// How many times its own lease a judge honours a longer lease claimed on a record.
pub const HONOURED_LEASE_FACTOR: u64 = 2;

/// How long someone else's Lease stays held without renewal: the holder's lease if longer than
/// the judge's own — during a rolling change of lease settings, a holder on the old, longer lease
/// acts until its own renew deadline, so judging by the shorter one could take over while it still
/// acts — but never more than [`HONOURED_LEASE_FACTOR`] times the judge's own (nor
/// [`MAX_LEASE_MS`]): a forged duration, written with a stolen token, freezes a takeover for at
/// most one more lease, not an hour. A rolling change of lease settings therefore at most doubles
/// the lease per step (a holder's renew deadline stays below twice any judge's lease).
pub fn judged_lease_ms(own_ms: u64, recorded_ms: Option<u64>) -> u64 {
    let cap = own_ms
        .saturating_mul(HONOURED_LEASE_FACTOR)
        .min(MAX_LEASE_MS);
    recorded_ms.unwrap_or(0).min(cap).max(own_ms)
}

/// How many pods a holder names to take over after it ([`successors`]).
pub const SUCCESSORS: usize = 3;

/// A pod as the holder sees it when naming its successors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuccessorSeat {
    pub pod: String,
    pub node: Option<String>,
    /// Ready, not being deleted, on a node that is ready and schedulable.
    pub usable: bool,
}

/// The pods a holder names to take over first: up to [`SUCCESSORS`] usable pods, each on a
/// node of its own and none on the holder's (a drain of that node takes the holder with it), in
/// name order so the list changes only when the pods do. Empty when none qualifies: then every
/// candidate contends at once, as without a list.
pub fn successors(seats: &[SuccessorSeat], holder_pod: &str) -> Vec<String> {
    let holder_node = seats
        .iter()
        .find(|s| s.pod == holder_pod)
        .and_then(|s| s.node.as_deref());
    let mut usable: Vec<&SuccessorSeat> = seats
        .iter()
        .filter(|s| s.usable && s.pod != holder_pod)
        .filter(|s| holder_node.is_none() || s.node.as_deref() != holder_node)
        .collect();
    usable.sort_by(|a, b| a.pod.cmp(&b.pod));
    let mut nodes = std::collections::BTreeSet::new();
    usable
        .into_iter()
        .filter(|s| s.node.as_ref().is_none_or(|n| nodes.insert(n.clone())))
        .take(SUCCESSORS)
        .map(|s| s.pod.clone())
        .collect()
}
