//! A planned move of a shard's primary as a sans-IO step machine ([`RecordHandoverRun`]), in
//! [`PromotionRun`](super::PromotionRun)'s style: pause, catch up, write the record, promote,
//! repoint, unpause — or unpause and leave everything as it was. The executor sends each
//! [`RecordHandoverCommand`] and reports what it saw ([`RecordHandoverAnswer`]); the order, the polling,
//! the retries and the read-back of an unanswered record write, which pause to keep and how the
//! move ends are decided here.

use std::collections::VecDeque;

use super::record::ShardRecord;
use crate::time::Millis;

/// Pause between tries of a record write whose outcome is unknown (the same write is sent again:
/// it is a compare-and-swap, so a try that landed earlier makes the next one read back).
pub const WRITE_RETRY_MS: u64 = 100;

/// How often a hand-over looks at the target's offset while it catches up: usually well under
/// a millisecond, and every look is one `INFO` on one replica.
pub const CATCH_UP_POLL_MS: u64 = 2;

/// Why a hand-over rolls back when the record's epoch is at its maximum.
const EPOCH_EXHAUSTED: &str = "the epoch cannot increase any further";

/// One command of a hand-over, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordHandoverCommand {
    /// `MULTI; CLIENT PAUSE <ms> WRITE; INFO replication; EXEC` on `pod`: the offset in that
    /// reply is read under the pause, so every acknowledged write is at or below it.
    Pause { pod: String, ms: u64 },
    /// `INFO replication` on the target: how far it has replicated.
    ReadTarget { pod: String },
    /// Write the record: holder and primary = `holder`, at `epoch`, but only if it still shows
    /// `expect_holder` at `expect_epoch`. The old holder keeps renewing meanwhile, so the
    /// executor reads the record, compares, and writes carrying that read's `resourceVersion`,
    /// retrying on 409.
    WriteRecord {
        holder: String,
        epoch: u64,
        expect_holder: String,
        expect_epoch: u64,
    },
    /// Read the record back: did a write whose answer was lost land?
    ReadRecord,
    /// `REPLICAOF NO ONE` on `pod`.
    PromoteNoOne { pod: String },
    /// `REPLICAOF <to>` on `pod` (`to` is `host port` as the executor spells it).
    ReplicaOf { pod: String, to: String },
    /// `CLIENT UNPAUSE` on `pod`.
    Unpause { pod: String },
}

impl RecordHandoverCommand {
    /// Why the command is sent, for logs.
    pub fn reason(&self) -> String {
        match self {
            RecordHandoverCommand::Pause { pod, .. } => format!(
                "{pod} stops taking writes, so its offset under the pause bounds every acknowledged write"
            ),
            RecordHandoverCommand::ReadTarget { pod } => {
                format!("{pod} takes the record only once it has that offset")
            }
            RecordHandoverCommand::WriteRecord { holder, epoch, .. } => format!(
                "the record names {holder} at epoch {epoch} before it takes a write, so the old primary's agent fences it"
            ),
            RecordHandoverCommand::ReadRecord => {
                "the record write was refused or unanswered: only a read tells whether an earlier try landed".into()
            }
            RecordHandoverCommand::PromoteNoOne { pod } => {
                format!("{pod} holds the record and has every write the old primary acknowledged")
            }
            RecordHandoverCommand::ReplicaOf { pod, to } => {
                format!("{pod} follows the shard's primary at {to}")
            }
            RecordHandoverCommand::Unpause { pod } => {
                format!("{pod} no longer needs the pause: the move landed or was rolled back")
            }
        }
    }

    /// Whether the command may be sent only while the coordinator Lease is held: everything but
    /// the reads.
    pub fn needs_lease(&self) -> bool {
        !matches!(
            self,
            RecordHandoverCommand::ReadTarget { .. } | RecordHandoverCommand::ReadRecord
        )
    }
}

/// What the executor saw of the last command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordHandoverAnswer {
    /// Nothing sent yet.
    Start,
    /// Done (`REPLICAOF`, `CLIENT UNPAUSE`).
    Ok,
    /// A Valkey command that failed.
    Failed { error: String },
    /// [`RecordHandoverCommand::Pause`]: the offset read under the pause (`None`: no reply).
    Paused { offset: Option<u64> },
    /// [`RecordHandoverCommand::ReadTarget`]: the target's offset (`None`: it did not answer).
    TargetAt { offset: Option<u64> },
    /// [`RecordHandoverCommand::WriteRecord`] landed.
    Written,
    /// The compare-and-swap found another holder or epoch: someone else moved the record, or an
    /// earlier try whose answer was lost did.
    Moved,
    /// Refused with nothing applied (a 4xx other than a conflict).
    Refused { error: String },
    /// No answer (a timeout, a lost connection, a 5xx): it may have been applied.
    Unknown { error: String },
    /// [`RecordHandoverCommand::ReadRecord`]: the record as read.
    Record(Option<ShardRecord>),
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordHandoverStep {
    /// Send this command.
    Send(RecordHandoverCommand),
    /// Wait, then send this command.
    Wait {
        ms: u64,
        command: RecordHandoverCommand,
    },
    /// Over: nothing more is sent.
    End(RecordHandoverEnd),
}

/// The outcome of a record write, once known.
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

/// How a hand-over ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordHandoverEnd {
    Done,
    /// Over, but not as planned (the reason says what failed or was given up).
    Failed(String),
    /// Writes resumed on the old primary; the record was not changed by this hand-over.
    RolledBack(String),
}

/// What a hand-over is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHandoverPlan {
    /// The current primary (the record's holder).
    pub from: String,
    pub to: String,
    /// The target's address for `REPLICAOF`.
    pub to_addr: String,
    /// The other replicas, repointed to the target at the end.
    pub others: Vec<String>,
    /// The record's epoch when the hand-over was planned; the target gets `epoch + 1`.
    pub epoch: u64,
    /// How long the old primary may stay paused waiting for the target to catch up.
    pub timeout_ms: u64,
}

/// Where a hand-over is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Nothing sent yet.
    Start,
    /// The pause is sent; no offset under the pause is known (the target is polled meanwhile,
    /// until the deadline).
    Pausing,
    /// Writes are paused at `offset`; waiting for the target to reach it.
    CatchingUp { offset: u64 },
    /// The record write is out; its outcome decides between commit and rollback. No timeout
    /// applies here: the write may have landed, so the pause is kept (and refreshed) until the
    /// outcome is known.
    Writing,
    /// The target holds the record: promote, repoint, unpause.
    Committing,
    /// Writes resume on the old primary; the record was not changed by this hand-over.
    RollingBack { reason: String },
    /// Over (see [`RecordHandoverEnd`]).
    Ended(RecordHandoverEnd),
}

/// A planned hand-over under way: pause the old primary, wait for the target to catch up, move
/// the record, promote, repoint, unpause — or unpause and leave everything as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHandoverRun {
    plan: RecordHandoverPlan,
    started: Millis,
    phase: Phase,
    /// When the last pause was sent (refreshed while the record write's outcome is unknown).
    paused_at: Option<Millis>,
    /// The command last sent.
    sent: Option<RecordHandoverCommand>,
    /// What is left of the commit or the rollback, in order.
    queue: VecDeque<RecordHandoverCommand>,
    /// What failed in the commit (promoting the target), which makes it a failed hand-over.
    failures: Vec<String>,
    /// Pods whose `REPLICAOF` failed in the commit: each keeps its pause (unpaused, it would take
    /// writes while the record names another) until it expires or its agent demotes it.
    not_demoted: Vec<String>,
}

impl RecordHandoverRun {
    /// A hand-over that has not started yet.
    pub fn new(plan: RecordHandoverPlan, now: Millis) -> RecordHandoverRun {
        RecordHandoverRun {
            plan,
            started: now,
            phase: Phase::Start,
            paused_at: None,
            sent: None,
            queue: VecDeque::new(),
            failures: Vec::new(),
            not_demoted: Vec::new(),
        }
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    pub fn started(&self) -> Millis {
        self.started
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

    /// The old primary, when the commit left it paused because it could not be made a replica.
    pub fn left_paused(&self) -> Option<&str> {
        let from = self.plan.from.as_str();
        self.not_demoted.iter().any(|p| p == from).then_some(from)
    }

    /// The next step, given the answer to the last command.
    pub fn next(&mut self, answer: RecordHandoverAnswer, now: Millis) -> RecordHandoverStep {
        if let Phase::Ended(end) = &self.phase {
            return RecordHandoverStep::End(end.clone());
        }
        let Some(last) = self.sent.take() else {
            return self.pause(Phase::Pausing, now);
        };
        match last {
            RecordHandoverCommand::Pause { .. } => self.paused(answer, now),
            RecordHandoverCommand::ReadTarget { .. } => self.target_at(answer, now),
            RecordHandoverCommand::WriteRecord { .. } => self.written(answer, now),
            RecordHandoverCommand::ReadRecord => self.read_back(answer, now),
            RecordHandoverCommand::PromoteNoOne { pod } => self.promoted(&pod, answer),
            RecordHandoverCommand::ReplicaOf { pod, .. } => self.repointed(pod, &answer),
            // Best effort: an unpause that failed is logged by the executor.
            RecordHandoverCommand::Unpause { .. } => self.go_on(),
        }
    }

    /// Sends (or refreshes) the pause on the old primary and moves to `phase`.
    fn pause(&mut self, phase: Phase, now: Millis) -> RecordHandoverStep {
        self.phase = phase;
        self.paused_at = Some(now);
        let ms = self.pause_ms();
        self.send(RecordHandoverCommand::Pause {
            pod: self.plan.from.clone(),
            ms,
        })
    }

    /// The first pause's offset starts the catch-up; a refreshed pause's answer does not matter
    /// (the offset that bounds the acknowledged writes was read under the first one).
    fn paused(&mut self, answer: RecordHandoverAnswer, now: Millis) -> RecordHandoverStep {
        if self.phase == Phase::Writing {
            return self.retry_write();
        }
        if let RecordHandoverAnswer::Paused { offset: Some(o) } = answer {
            self.phase = Phase::CatchingUp { offset: o };
            return self.read_target(now, 0);
        }
        self.read_target(now, CATCH_UP_POLL_MS)
    }

    /// Looks at the target again (after `wait_ms`), unless the deadline has passed.
    fn read_target(&mut self, now: Millis, wait_ms: u64) -> RecordHandoverStep {
        if now >= self.deadline() {
            let reason = match self.phase {
                Phase::CatchingUp { offset } => {
                    format!("{} did not reach offset {offset} in time", self.plan.to)
                }
                _ => "the old primary did not report its offset under the pause in time".into(),
            };
            return self.roll_back(reason);
        }
        let command = RecordHandoverCommand::ReadTarget {
            pod: self.plan.to.clone(),
        };
        self.wait(wait_ms, command)
    }

    fn target_at(&mut self, answer: RecordHandoverAnswer, now: Millis) -> RecordHandoverStep {
        let target = match answer {
            RecordHandoverAnswer::TargetAt { offset } => offset,
            _ => None,
        };
        let Phase::CatchingUp { offset } = self.phase else {
            return self.read_target(now, CATCH_UP_POLL_MS);
        };
        if now >= self.deadline() {
            let at = target.map_or("unknown".into(), |o| o.to_string());
            let reason = format!(
                "{} reached offset {at}, not {offset}, in time",
                self.plan.to
            );
            return self.roll_back(reason);
        }
        if target.is_some_and(|t| t >= offset) {
            return self.write_record();
        }
        self.read_target(now, CATCH_UP_POLL_MS)
    }

    /// The target has every acknowledged write: hand it the record at the next epoch.
    fn write_record(&mut self) -> RecordHandoverStep {
        let Some(command) = self.record_write() else {
            return self.roll_back(EPOCH_EXHAUSTED.into());
        };
        self.phase = Phase::Writing;
        self.send(command)
    }

    fn record_write(&self) -> Option<RecordHandoverCommand> {
        Some(RecordHandoverCommand::WriteRecord {
            holder: self.plan.to.clone(),
            epoch: self.plan.epoch.checked_add(1)?,
            expect_holder: self.plan.from.clone(),
            expect_epoch: self.plan.epoch,
        })
    }

    fn written(&mut self, answer: RecordHandoverAnswer, now: Millis) -> RecordHandoverStep {
        match answer {
            RecordHandoverAnswer::Written => self.commit(),
            RecordHandoverAnswer::Moved => self.send(RecordHandoverCommand::ReadRecord),
            RecordHandoverAnswer::Refused { error } => {
                self.roll_back(format!("writing the record was refused: {error}"))
            }
            _ => self.unresolved(now),
        }
    }

    fn read_back(&mut self, answer: RecordHandoverAnswer, now: Millis) -> RecordHandoverStep {
        let RecordHandoverAnswer::Record(record) = answer else {
            return self.unresolved(now);
        };
        let epoch = self.plan.epoch.saturating_add(1);
        match WriteOutcome::read_back(record.as_ref(), &self.plan.to, epoch) {
            WriteOutcome::Written => self.commit(),
            WriteOutcome::Refused => self.roll_back("the record moved under the hand-over".into()),
        }
    }

    /// The write's outcome is unknown. Once the first pause would have run out it is given up:
    /// the last pause (refreshed at most half a pause ago) is left to expire, so the old primary
    /// takes writes again only if its agent does not fence it on a record that did move. Before
    /// that the pause is refreshed every half pause — the write may have landed, and the old
    /// primary must not take writes the new one will never see — and the write tried again.
    fn unresolved(&mut self, now: Millis) -> RecordHandoverStep {
        if now >= self.started.plus(self.pause_ms()) {
            let reason = "the record write's outcome stayed unknown: the old primary stays paused until its pause expires";
            return self.end(RecordHandoverEnd::Failed(reason.into()));
        }
        let half = self.pause_ms() / 2;
        if self.paused_at.is_some_and(|at| now < at.plus(half)) {
            return self.retry_write();
        }
        self.pause(Phase::Writing, now)
    }

    fn retry_write(&mut self) -> RecordHandoverStep {
        match self.record_write() {
            Some(command) => self.wait(WRITE_RETRY_MS, command),
            None => self.roll_back(EPOCH_EXHAUSTED.into()),
        }
    }

    /// The record names the target: promote it, repoint the others, unpause the old primary.
    fn commit(&mut self) -> RecordHandoverStep {
        let p = &self.plan;
        let to = p.to_addr.clone();
        let others = p.others.iter().filter(|o| **o != p.to && **o != p.from);
        let followers = std::iter::once(&p.from).chain(others);
        let repoints = followers.map(|pod| RecordHandoverCommand::ReplicaOf {
            pod: pod.clone(),
            to: to.clone(),
        });
        let promote = RecordHandoverCommand::PromoteNoOne { pod: p.to.clone() };
        let unpause = RecordHandoverCommand::Unpause {
            pod: p.from.clone(),
        };
        self.queue = std::iter::once(promote)
            .chain(repoints)
            .chain([unpause])
            .collect();
        self.phase = Phase::Committing;
        self.go_on()
    }

    fn promoted(&mut self, pod: &str, answer: RecordHandoverAnswer) -> RecordHandoverStep {
        if let RecordHandoverAnswer::Failed { error } = answer {
            self.failures
                .push(format!("REPLICAOF NO ONE on {pod}: {error}"));
        }
        self.go_on()
    }

    fn repointed(&mut self, pod: String, answer: &RecordHandoverAnswer) -> RecordHandoverStep {
        if matches!(answer, RecordHandoverAnswer::Failed { .. }) {
            self.not_demoted.push(pod);
        }
        self.go_on()
    }

    fn roll_back(&mut self, reason: String) -> RecordHandoverStep {
        self.queue = VecDeque::from([RecordHandoverCommand::Unpause {
            pod: self.plan.from.clone(),
        }]);
        self.phase = Phase::RollingBack { reason };
        self.go_on()
    }

    /// The next queued command; a pod that could not be made a replica is not unpaused.
    fn go_on(&mut self) -> RecordHandoverStep {
        while let Some(command) = self.queue.pop_front() {
            let kept = matches!(&command, RecordHandoverCommand::Unpause { pod } if self.not_demoted.contains(pod));
            if !kept {
                return self.send(command);
            }
        }
        let end = match &self.phase {
            Phase::RollingBack { reason } => RecordHandoverEnd::RolledBack(reason.clone()),
            _ if self.failures.is_empty() => RecordHandoverEnd::Done,
            _ => RecordHandoverEnd::Failed(self.failures.join("; ")),
        };
        self.end(end)
    }

    fn end(&mut self, end: RecordHandoverEnd) -> RecordHandoverStep {
        self.phase = Phase::Ended(end.clone());
        RecordHandoverStep::End(end)
    }

    fn send(&mut self, command: RecordHandoverCommand) -> RecordHandoverStep {
        self.sent = Some(command.clone());
        RecordHandoverStep::Send(command)
    }

    fn wait(&mut self, ms: u64, command: RecordHandoverCommand) -> RecordHandoverStep {
        self.sent = Some(command.clone());
        if ms == 0 {
            return RecordHandoverStep::Send(command);
        }
        RecordHandoverStep::Wait { ms, command }
    }
}
