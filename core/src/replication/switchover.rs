//! A planned move of a shard's primary as a step machine ([`Switchover`]): pause, catch up, write
//! the record, promote, repoint, unpause. The executor sends the commands and reports what it
//! saw; when to give up on an unanswered record write, how to read an answer back, which pause
//! to keep and what the move's end is are decided here.

use super::record::ShardRecord;
use crate::time::Millis;

/// Pause between tries of a record write whose outcome is unknown (the same write is sent again:
/// it is a compare-and-swap, so a try that landed earlier makes the next one read back).
pub const WRITE_RETRY_MS: u64 = 100;

/// How often a switchover looks at the target's offset while it catches up: usually well under
/// a millisecond, and every look is one `INFO` on one replica.
pub const CATCH_UP_POLL_MS: u64 = 2;

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

impl Command {
    /// Why the command is sent, for logs.
    pub fn reason(&self) -> String {
        match self {
            Command::Pause { pod, .. } => format!(
                "{pod} stops taking writes, so its offset under the pause bounds every acknowledged write"
            ),
            Command::WriteRecord { holder, epoch, .. } => format!(
                "the record names {holder} at epoch {epoch} before it takes a write, so the old primary's agent fences it"
            ),
            Command::PromoteNoOne { pod } => {
                format!("{pod} holds the record and has every write the old primary acknowledged")
            }
            Command::ReplicaOf { pod, to } => format!("{pod} follows the shard's primary at {to}"),
            Command::Unpause { pod } => {
                format!("{pod} no longer needs the pause: the move landed or was rolled back")
            }
        }
    }
}

/// The outcome of [`Command::WriteRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Written,
    /// The record no longer showed the expected holder and epoch: someone else moved it.
    Refused,
}

impl WriteOutcome {
    /// A refused compare-and-swap, read back: an earlier try whose answer was lost may be what
    /// moved the record. Written when the record names `holder` at `epoch`.
    pub fn read_back(record: Option<&ShardRecord>, holder: &str, epoch: u64) -> WriteOutcome {
        let ours = record.is_some_and(|r| r.holder() == Some(holder) && r.epoch == epoch);
        if ours {
            WriteOutcome::Written
        } else {
            WriteOutcome::Refused
        }
    }
}

/// How a switchover ended ([`Switchover::end`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwitchoverEnd {
    Done,
    /// Over, but not as planned (the reason says what failed or was given up).
    Failed(String),
    /// Writes resumed on the old primary; the record was not changed by this switchover.
    RolledBack(String),
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
    /// The record write's outcome stayed unknown past the first pause's length: nothing better
    /// can be done without an answer from the apiserver than to let the last pause expire.
    GaveUp { reason: String },
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

    /// Whether the switchover is over (done, rolled back or given up).
    pub fn finished(&self) -> bool {
        matches!(
            self.phase,
            Phase::Done | Phase::RolledBack { .. } | Phase::GaveUp { .. }
        )
    }

    /// How it ended, once it has; `failures`: what the executor could not do in the commit
    /// (promoting the target), which makes a done switchover a failed one.
    pub fn end(&self, failures: &[String]) -> Option<SwitchoverEnd> {
        match &self.phase {
            Phase::Done if failures.is_empty() => Some(SwitchoverEnd::Done),
            Phase::Done => Some(SwitchoverEnd::Failed(failures.join("; "))),
            Phase::RolledBack { reason } => Some(SwitchoverEnd::RolledBack(reason.clone())),
            Phase::GaveUp { reason } => Some(SwitchoverEnd::Failed(reason.clone())),
            _ => None,
        }
    }

    /// Whether `pod` keeps its pause instead of the commit's unpause: after a commit, a pod that
    /// could not be made a replica (`not_demoted`) would take writes while the record names
    /// another; it stays paused until the pause expires or its agent demotes it.
    pub fn keeps_paused(&self, pod: &str, not_demoted: &[String]) -> bool {
        self.phase == Phase::Done && not_demoted.iter().any(|p| p == pod)
    }

    /// How long the executor waits before the next step, given what it saw: none once the
    /// target has caught up (the old primary is paused meanwhile), a short poll while it
    /// catches up, the retry pause while the record write's outcome is unknown.
    pub fn wait_ms(&self, obs: &SwitchoverObservation) -> u64 {
        match self.phase {
            Phase::Pausing | Phase::CatchingUp { .. } => {
                let caught_up =
                    matches!((obs.target_offset, obs.paused_offset), (Some(t), Some(p)) if t >= p);
                if caught_up { 0 } else { CATCH_UP_POLL_MS }
            }
            Phase::Writing if obs.write.is_none() => WRITE_RETRY_MS,
            _ => 0,
        }
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
        Phase::Done | Phase::RolledBack { .. } | Phase::GaveUp { .. } => (s.clone(), Vec::new()),
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
        None if now >= s.started.plus(s.pause_ms()) => give_up(s),
        None => keep_paused(s, now),
    }
}

/// The write's outcome is still unknown once the first pause would have run out: the last pause
/// (refreshed at most half a pause ago) is left to expire, so the old primary takes writes again
/// only if its agent does not fence it on a record that did move.
fn give_up(s: &Switchover) -> (Switchover, Vec<Command>) {
    let reason = "the record write's outcome stayed unknown: the old primary stays paused until its pause expires";
    let next = s.with(Phase::GaveUp {
        reason: reason.to_owned(),
    });
    (next, Vec::new())
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
