//! Cluster mode: a move of a shard's primary to one of its replicas as a sans-IO step machine
//! ([`HandoverRun`]), the way [`PromotionRun`](crate::replication::PromotionRun) carries out a
//! promotion. The executor only sends each [`HandoverCommand`] and reports what it saw
//! ([`HandoverAnswer`]); the order, the waits and when to give up are decided here.
//!
//! A planned hand-over ([`HandoverRun::coordinated`]) first waits, at most
//! [`PEERS_KNOW_WITHIN_MS`], until every reachable member of the shard lists the target in its
//! `CLUSTER SHARDS`: a replica that does not know the target cannot follow it when it takes over;
//! it goes on replicating the old primary, and once that pod is gone it runs an election of its
//! own, which every voter grants (the old primary's slots are gone from its view) — two primaries
//! in one shard, seen when a pod was replaced and handed over to within a second. A member that
//! does not answer is not waited for. Then, in both kinds:
//! - the target's `ROLE`: gossip can lag the planner, and a target already primary is done;
//! - the failover command (`CLUSTER FAILOVER`, coordinated: the target catches up with the paused
//!   primary first, so nothing is lost; `FORCE` for a crash, [`HandoverRun::forced`]), the Lease
//!   checked right before by the executor;
//! - the target's `ROLE` until it reports itself primary, up to the move's limit; the failover
//!   command again every [`RESEND_AFTER_MS`], once Valkey has given up on the last one.

use crate::time::Millis;

/// How long a hand-over waits for the target's shard peers to learn of it (a replaced pod's
/// Valkey joins through gossip in about a second) before it gives up and the coordinator plans
/// again.
pub const PEERS_KNOW_WITHIN_MS: u64 = 5_000;
/// Between two rounds of asking the peers that do not know the target yet.
pub const PEER_POLL_MS: u64 = 20;
/// Between two reads of the target's role while it takes over.
pub const ROLE_POLL_MS: u64 = 10;
/// After this long without the target taking over, the failover command is sent again: Valkey
/// gives a manual failover 5 s (`CLUSTER_MF_TIMEOUT`) and then forgets it, so a lost election
/// (two shards' elections at once, votes late under load) is never retried by Valkey itself.
/// Seen on Valkey 8.0.1: one of six hand-overs at once never landed within its 10 s.
pub const RESEND_AFTER_MS: u64 = 5_500;

/// One command of a hand-over, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoverCommand {
    /// Does peer `index` (of the peers the run was given) list the target in `CLUSTER SHARDS`?
    AskPeer { index: usize },
    /// The target's `ROLE`.
    AskRole,
    /// The failover command, on the target (the Lease checked right before it is sent).
    Failover,
}

/// What the executor saw of the last command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoverAnswer {
    /// Nothing sent yet.
    Start,
    /// [`HandoverCommand::AskPeer`]: whether it lists the target; `None`: it did not answer.
    Knows(Option<bool>),
    /// [`HandoverCommand::AskRole`]: whether the target reports itself primary (`false` also
    /// when its reply is not a role).
    Primary(bool),
    /// [`HandoverCommand::Failover`] was accepted.
    Sent,
    /// The command could not be sent (the target unreachable) or was refused.
    Refused(String),
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoverStep {
    Send(HandoverCommand),
    /// Wait, then send this command.
    Retry {
        after_ms: u64,
        command: HandoverCommand,
    },
    /// The target is primary.
    Done,
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Stage {
    /// Asking each peer in `pending` (by index) in turn; `unsure` have said no this round.
    Peers {
        pending: Vec<usize>,
        unsure: Vec<usize>,
    },
    /// The target's role before the command.
    Before,
    Sending,
    /// The target's role after the command, until it is primary.
    After,
}

/// A hand-over under way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoverRun {
    target: String,
    /// The peers' names, for the reason when they do not learn the target in time.
    peers: Vec<String>,
    stage: Stage,
    peers_until: Millis,
    until: Millis,
    /// When the failover command was last accepted.
    sent_at: Option<Millis>,
}

impl HandoverRun {
    /// A planned hand-over to `target` (node id), started at `now`, given up `limit_ms` later;
    /// `peers`: the shard's other members (by name), which must know the target first.
    pub fn coordinated(
        target: &str,
        peers: Vec<String>,
        now: Millis,
        limit_ms: u64,
    ) -> HandoverRun {
        let pending = (0..peers.len()).collect();
        HandoverRun {
            target: target.to_owned(),
            peers,
            stage: Stage::Peers {
                pending,
                unsure: Vec::new(),
            },
            peers_until: now.plus(PEERS_KNOW_WITHIN_MS.min(limit_ms)),
            until: now.plus(limit_ms),
            sent_at: None,
        }
    }

    /// A crash failover to `target`: no peer to wait for (the primary is gone).
    pub fn forced(target: &str, now: Millis, limit_ms: u64) -> HandoverRun {
        HandoverRun {
            stage: Stage::Before,
            ..HandoverRun::coordinated(target, Vec::new(), now, limit_ms)
        }
    }

    /// The next step, given the answer to the last command.
    pub fn next(&mut self, answer: HandoverAnswer, now: Millis) -> HandoverStep {
        match (self.stage.clone(), answer) {
            (Stage::Peers { pending, unsure }, answer) => self.peers(pending, unsure, answer, now),
            (Stage::Before, HandoverAnswer::Start) => HandoverStep::Send(HandoverCommand::AskRole),
            (Stage::Before, HandoverAnswer::Primary(true)) => HandoverStep::Done,
            (Stage::Before, HandoverAnswer::Refused(e)) => {
                HandoverStep::Failed(format!("cannot reach {}: {e}", self.target))
            }
            (Stage::Before, _) => {
                self.stage = Stage::Sending;
                HandoverStep::Send(HandoverCommand::Failover)
            }
            (Stage::Sending, HandoverAnswer::Sent) => {
                self.stage = Stage::After;
                self.sent_at = Some(now);
                HandoverStep::Send(HandoverCommand::AskRole)
            }
            // A command sent again may meet a target that took over meanwhile ("send it to a
            // replica"): its role decides. A refusal counts as a send, so that a target refusing
            // every time is asked once per period, not in a loop.
            (Stage::Sending, HandoverAnswer::Refused(_)) if self.sent_at.is_some() => {
                self.stage = Stage::After;
                self.sent_at = Some(now);
                HandoverStep::Send(HandoverCommand::AskRole)
            }
            (Stage::Sending, HandoverAnswer::Refused(e)) => {
                HandoverStep::Failed(format!("the failover was refused by {}: {e}", self.target))
            }
            (Stage::Sending, other) => {
                HandoverStep::Failed(format!("the failover: unexpected answer {other:?}"))
            }
            (Stage::After, HandoverAnswer::Primary(true)) => HandoverStep::Done,
            (Stage::After, _) if now >= self.until => {
                HandoverStep::Failed("the target did not become primary in time".into())
            }
            (Stage::After, _)
                if self
                    .sent_at
                    .is_some_and(|at| now.since(at) >= RESEND_AFTER_MS) =>
            {
                self.stage = Stage::Sending;
                HandoverStep::Send(HandoverCommand::Failover)
            }
            (Stage::After, _) => HandoverStep::Retry {
                after_ms: ROLE_POLL_MS,
                command: HandoverCommand::AskRole,
            },
        }
    }

    /// Asks each pending peer in turn; a peer that says no is asked again next round, one that
    /// does not answer is not waited for.
    fn peers(
        &mut self,
        mut pending: Vec<usize>,
        mut unsure: Vec<usize>,
        answer: HandoverAnswer,
        now: Millis,
    ) -> HandoverStep {
        if answer != HandoverAnswer::Start && !pending.is_empty() {
            let asked = pending.remove(0);
            if answer == HandoverAnswer::Knows(Some(false)) {
                unsure.push(asked);
            }
        }
        if let Some(&index) = pending.first() {
            self.stage = Stage::Peers { pending, unsure };
            return HandoverStep::Send(HandoverCommand::AskPeer { index });
        }
        if unsure.is_empty() {
            self.stage = Stage::Before;
            return HandoverStep::Send(HandoverCommand::AskRole);
        }
        if now >= self.peers_until {
            let names: Vec<&str> = unsure.iter().map(|i| self.peers[*i].as_str()).collect();
            return HandoverStep::Failed(format!(
                "{} is not yet known to {}",
                self.target,
                names.join(", ")
            ));
        }
        let index = unsure[0];
        self.stage = Stage::Peers {
            pending: unsure,
            unsure: Vec::new(),
        };
        HandoverStep::Retry {
            after_ms: PEER_POLL_MS,
            command: HandoverCommand::AskPeer { index },
        }
    }
}
