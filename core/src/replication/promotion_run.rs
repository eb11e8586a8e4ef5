//! A decided [`Promotion`] carried out as a sans-IO step machine ([`PromotionRun`]): the order,
//! the retries and the read-back of an unanswered record write are decided here; the executor
//! only sends each [`PromotionCommand`] and reports what it saw ([`PromotionAnswer`]).
//!
//! The order ([`Promotion`] documents why): the record, then `CLIENT PAUSE` on every other
//! master, the target's consent (its agent renews the record that names it), `REPLICAOF NO ONE`
//! on the target, `REPLICAOF` on the others (a fenced master unpaused once it follows).
//!
//! The consent is what makes a member's heartbeat promise binding (`crate::heartbeat`): an old
//! primary that the coordinator cannot reach may still be taking writes on its members'
//! promises (an apiserver outage on its side only); the target's agent renews only once its
//! promise has run out, by when the old primary, which lost the target's vouch as soon as the
//! target saw the new record, has fenced itself. Its agent renews within milliseconds otherwise. Two steps are tried again when their answer does not come, for at most
//! [`RETRY_FOR_MS`] after their first try — inside the shortest renew deadline the timings allow
//! (more than 1.2 retry periods of at least a second), so the target still holds the record when
//! its promotion lands:
//! - a record write whose answer was lost may have landed: it is read back; landed, the promotion
//!   goes on as after an answered write (else the target's agent would wait out its renew
//!   deadline for a `REPLICAOF NO ONE` that never comes, release, and the shard would fail over a
//!   second time); not landed, or still unknown, nothing follows;
//! - `REPLICAOF NO ONE` on the target (idempotent: a master answers OK), whose agent releases the
//!   record at its renew deadline if the command never comes.

use std::collections::VecDeque;

use super::promotion::Promotion;
use crate::time::Millis;

/// Pause between tries of a step whose answer did not come.
pub const RETRY_MS: u64 = 200;
/// Pause between reads while the target's consent is awaited.
pub const CONSENT_POLL_MS: u64 = 10;
/// Tries of a step after its first.
pub const RETRIES: u32 = 4;
/// How long after a step's first try another may start.
pub const RETRY_FOR_MS: u64 = 1_000;

/// One command of a promotion, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromotionCommand {
    /// Write [`Promotion::record`], carrying the decision's `resourceVersion`.
    WriteRecord,
    /// Read the record back: does it hold this promotion's claim?
    ReadRecord,
    /// `CLIENT PAUSE <ms> WRITE` on an old master.
    Fence { pod: String, ms: u64 },
    /// Read the record: has the target's agent renewed it since this promotion wrote it?
    AwaitConsent { pod: String },
    /// `REPLICAOF NO ONE` on the target.
    PromoteTarget { pod: String },
    /// `REPLICAOF <target>` on another member, best effort: its own agent is the backstop.
    Repoint { pod: String },
    /// `CLIENT UNPAUSE` on a fenced master that now follows the target.
    Unpause { pod: String },
}

impl PromotionCommand {
    /// Why the command is sent, for logs.
    pub fn reason(&self) -> String {
        match self {
            PromotionCommand::WriteRecord => {
                "the record names the new primary first: the old one's agent fences itself on it"
                    .into()
            }
            PromotionCommand::ReadRecord => {
                "the record write got no answer: only a read tells whether it landed".into()
            }
            PromotionCommand::Fence { pod, .. } => {
                format!("{pod} is an old master: writes it would still take could be lost")
            }
            PromotionCommand::AwaitConsent { pod } => format!(
                "{pod}'s agent takes the record first: it may have promised the old primary to take part in no promotion for a while"
            ),
            PromotionCommand::PromoteTarget { pod } => {
                format!("{pod} holds the record: it takes the shard's writes")
            }
            PromotionCommand::Repoint { pod } => format!("{pod} follows the new primary"),
            PromotionCommand::Unpause { pod } => {
                format!("{pod} follows the new primary now: the fence is no longer needed")
            }
        }
    }
}

/// What a command needs of the cluster Lease, checked right before it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithoutLease {
    /// Nothing more may be done: the promotion ends as "no lease".
    Stop,
    /// The promotion has landed; the agents follow the record: it ends as done.
    Finish,
    /// Harmless without the Lease (a read, lifting a pause this run set).
    Send,
}

impl PromotionCommand {
    /// What happens to this command once the Lease is lost.
    pub fn without_lease(&self) -> WithoutLease {
        match self {
            PromotionCommand::WriteRecord
            | PromotionCommand::Fence { .. }
            | PromotionCommand::PromoteTarget { .. } => WithoutLease::Stop,
            PromotionCommand::Repoint { .. } => WithoutLease::Finish,
            PromotionCommand::ReadRecord
            | PromotionCommand::AwaitConsent { .. }
            | PromotionCommand::Unpause { .. } => WithoutLease::Send,
        }
    }
}

/// What the executor saw of the last command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromotionAnswer {
    /// Nothing sent yet.
    Start,
    Ok,
    /// Refused: nothing was applied (`conflict`: the record changed since the decision, a 409).
    Refused {
        conflict: bool,
        error: String,
    },
    /// No answer (a timeout, a lost connection, a 5xx): it may have been applied.
    Unknown {
        error: String,
    },
    /// [`PromotionCommand::ReadRecord`]: whether the record holds this promotion's claim.
    Read {
        ours: bool,
    },
    /// [`PromotionCommand::AwaitConsent`]: the record holds this promotion's claim, renewed by
    /// the target since (`given`) or not yet.
    Consent {
        given: bool,
    },
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromotionStep {
    /// Send this command.
    Send(PromotionCommand),
    /// Wait, then send this command again.
    Retry {
        after_ms: u64,
        command: PromotionCommand,
    },
    /// The target is primary (and the others were asked to follow it).
    Done,
    /// Stopped: nothing more is sent.
    Stopped(PromotionStop),
}

/// Why a promotion stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromotionStop {
    /// The record is not this promotion's: someone renewed or wrote it since the decision.
    Conflict(String),
    Failed(String),
}

/// A promotion under way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromotionRun {
    promotion: Promotion,
    fence_ms: u64,
    /// How long the target's consent is awaited (its promise, plus a margin for its agent).
    consent_ms: u64,
    /// The command last sent, and when its first try went out and how many more followed.
    sent: Option<(PromotionCommand, Millis, u32)>,
    /// After the record: fences, the promotion, repoints.
    queue: VecDeque<PromotionCommand>,
    /// The record write's error while it is read back.
    write_error: String,
}

impl PromotionRun {
    /// `fence_ms`: how long the pause on an old master holds; `consent_ms`: how long the target's
    /// consent is awaited.
    pub fn new(promotion: Promotion, fence_ms: u64, consent_ms: u64) -> PromotionRun {
        PromotionRun {
            promotion,
            fence_ms,
            consent_ms,
            sent: None,
            queue: VecDeque::new(),
            write_error: String::new(),
        }
    }

    /// The next step, given the answer to the last command.
    pub fn next(&mut self, answer: PromotionAnswer, now: Millis) -> PromotionStep {
        let Some((last, _, _)) = self.sent.clone() else {
            return self.send(PromotionCommand::WriteRecord, now);
        };
        match last {
            PromotionCommand::WriteRecord => self.written(answer, now),
            PromotionCommand::ReadRecord => self.read_back(answer, now),
            PromotionCommand::AwaitConsent { .. } => self.consented(answer, now),
            PromotionCommand::PromoteTarget { .. } => self.promoted(answer, now),
            PromotionCommand::Repoint { pod } => self.repointed(&pod, &answer, now),
            // Best effort: a fence or an unpause that failed is logged by the executor.
            PromotionCommand::Fence { .. } | PromotionCommand::Unpause { .. } => self.go_on(now),
        }
    }

    fn written(&mut self, answer: PromotionAnswer, now: Millis) -> PromotionStep {
        match answer {
            PromotionAnswer::Ok => self.recorded(now),
            PromotionAnswer::Refused { conflict: true, .. } => {
                conflict("the record changed since the decision".into())
            }
            PromotionAnswer::Refused { error, .. } => {
                failed(format!("writing the record: {error}"))
            }
            PromotionAnswer::Unknown { error } => {
                self.write_error = error;
                self.send(PromotionCommand::ReadRecord, now)
            }
            other => failed(format!("writing the record: unexpected answer {other:?}")),
        }
    }

    fn read_back(&mut self, answer: PromotionAnswer, now: Millis) -> PromotionStep {
        let error = &self.write_error;
        match answer {
            PromotionAnswer::Read { ours: true } => self.recorded(now),
            PromotionAnswer::Read { ours: false } => {
                conflict(format!("writing the record: {error}; it did not land"))
            }
            PromotionAnswer::Refused { error: e, .. } | PromotionAnswer::Unknown { error: e } => {
                let why = format!("writing the record: {error}; reading it back: {e}");
                self.again(now).unwrap_or_else(|| failed(why))
            }
            other => failed(format!(
                "reading the record back: unexpected answer {other:?}"
            )),
        }
    }

    /// Polled every [`CONSENT_POLL_MS`] until the target renews, for at most `consent_ms`.
    fn consented(&mut self, answer: PromotionAnswer, now: Millis) -> PromotionStep {
        let target = self.promotion.target.clone();
        match answer {
            PromotionAnswer::Consent { given: true } => self.go_on(now),
            PromotionAnswer::Read { ours: false } => conflict(format!(
                "the record moved on while waiting for {target}'s agent"
            )),
            _ => self.poll_again(now).unwrap_or_else(|| {
                failed(format!(
                    "{target}'s agent did not take the record within {} ms",
                    self.consent_ms
                ))
            }),
        }
    }

    fn poll_again(&mut self, now: Millis) -> Option<PromotionStep> {
        let (command, first, _) = self.sent.as_ref()?;
        (now.since(*first) < self.consent_ms).then(|| PromotionStep::Retry {
            after_ms: CONSENT_POLL_MS,
            command: command.clone(),
        })
    }

    fn promoted(&mut self, answer: PromotionAnswer, now: Millis) -> PromotionStep {
        match answer {
            PromotionAnswer::Ok => self.go_on(now),
            PromotionAnswer::Refused { error, .. } | PromotionAnswer::Unknown { error } => {
                let why = format!("REPLICAOF NO ONE on {error}");
                self.again(now).unwrap_or_else(|| failed(why))
            }
            other => failed(format!("REPLICAOF NO ONE: unexpected answer {other:?}")),
        }
    }

    /// A fenced master that follows the target now refuses writes anyway: its pause is lifted, so
    /// none is left behind to block writes after a later promotion. One that is still a master
    /// keeps it.
    fn repointed(&mut self, pod: &str, answer: &PromotionAnswer, now: Millis) -> PromotionStep {
        let fenced = self.promotion.fence.iter().any(|f| f == pod);
        if fenced && *answer == PromotionAnswer::Ok {
            let pod = pod.to_owned();
            return self.send(PromotionCommand::Unpause { pod }, now);
        }
        self.go_on(now)
    }

    /// The record names the target: the rest in order.
    fn recorded(&mut self, now: Millis) -> PromotionStep {
        let p = &self.promotion;
        let ms = self.fence_ms;
        let fences = p.fence.iter().map(|pod| PromotionCommand::Fence {
            pod: pod.clone(),
            ms,
        });
        let consent = PromotionCommand::AwaitConsent {
            pod: p.target.clone(),
        };
        let target = PromotionCommand::PromoteTarget {
            pod: p.target.clone(),
        };
        let repoints = p
            .repoint
            .iter()
            .map(|pod| PromotionCommand::Repoint { pod: pod.clone() });
        self.queue = fences.chain([consent, target]).chain(repoints).collect();
        self.go_on(now)
    }

    fn go_on(&mut self, now: Millis) -> PromotionStep {
        match self.queue.pop_front() {
            Some(command) => self.send(command, now),
            None => PromotionStep::Done,
        }
    }

    fn send(&mut self, command: PromotionCommand, now: Millis) -> PromotionStep {
        self.sent = Some((command.clone(), now, 0));
        PromotionStep::Send(command)
    }

    /// The last command once more, if a try is left.
    fn again(&mut self, now: Millis) -> Option<PromotionStep> {
        let (command, first, tries) = self.sent.as_mut()?;
        if now.since(*first) >= RETRY_FOR_MS || *tries >= RETRIES {
            return None;
        }
        *tries += 1;
        let command = command.clone();
        Some(PromotionStep::Retry {
            after_ms: RETRY_MS,
            command,
        })
    }
}

fn conflict(why: String) -> PromotionStep {
    PromotionStep::Stopped(PromotionStop::Conflict(why))
}

fn failed(why: String) -> PromotionStep {
    PromotionStep::Stopped(PromotionStop::Failed(why))
}
