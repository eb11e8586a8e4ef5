//! Cluster mode: carries out a hand-over (`core::handover::HandoverRun`) — a planned one's
//! coordinated `CLUSTER FAILOVER` once the shard's peers know the target, or a crash's
//! `CLUSTER FAILOVER FORCE` — by sending each command the step machine asks for and feeding back
//! what it saw. The order, the waits and when to give up are the step machine's.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use valkey_sidecar_core::handover::{HandoverAnswer, HandoverCommand, HandoverRun, HandoverStep};
use valkey_sidecar_core::observation::{Role, role_reply};
use valkey_sidecar_core::plan::Action;
use valkey_sidecar_core::shards::parse_shards;

use super::MoveOutcome;
use crate::runtime::clock::{Clock, millis};
use crate::valkey::{Connector, Session, observe};

/// How long one election keeps the others waiting: an election that has not ended by then has
/// most likely failed, and the next shard's need not wait for Valkey's own 5 s manual-failover
/// timeout (it may then collide with a late vote; Valkey retries, nothing is unsafe).
const ELECTION_HOLD: Duration = Duration::from_secs(2);

/// One cluster's failover elections, run one at a time. A replica's election asks every primary
/// for its vote, and a primary votes once per epoch: replicas of different shards electing at
/// once split the votes ("already voted for epoch"), and a losing election waits for Valkey's
/// retry. Measured on a 25-shard loopback cluster, 8 `CLUSTER FAILOVER`s sent at once: on 8.0.1
/// only 5 to 7 of the 8 landed within 30 s (the rest "Manual failover timed out"); one after
/// another, all 8 in ~210 ms (9.1.2 recovers from split votes, in 0.3 to 2.6 s). Taking turns
/// leaves the rest of each hand-over (the peers' check, the catch-up, the settling) overlapped.
#[derive(Debug, Clone)]
pub struct Elections(Arc<Semaphore>);

impl Default for Elections {
    fn default() -> Self {
        Elections(Arc::new(Semaphore::new(1)))
    }
}

/// This move's turn to elect, and when it began.
struct Turn {
    _permit: OwnedSemaphorePermit,
    since: Instant,
}

impl Elections {
    /// Waits for this move's turn; `None` only if the semaphore were closed (it never is).
    async fn turn(&self) -> Option<Turn> {
        let permit = self.0.clone().acquire_owned().await.ok()?;
        Some(Turn {
            _permit: permit,
            since: Instant::now(),
        })
    }
}

/// A planned hand-over to `action.to` at `target` (the replica's address); `peers`: the shard's
/// other members, which must know the target first. Given up after `limit`.
pub async fn handover(
    action: &Action,
    (target, peers): (Connector, Vec<Connector>),
    elections: &Elections,
    may_act: impl Fn() -> bool,
    limit: Duration,
) -> MoveOutcome {
    let names = peers.iter().map(|c| c.host.clone()).collect();
    let clock = Clock::start();
    let run = HandoverRun::coordinated(&action.to, names, clock.now(), millis(limit));
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("FAILOVER");
    let links = Links::new(&action.to, target, peers);
    drive(run, (links, elections), &cmd, may_act, clock).await
}

/// A crash failover to `to` at `target`: `CLUSTER FAILOVER FORCE`, no peer to wait for.
pub async fn force(
    to: &str,
    target: Connector,
    elections: &Elections,
    may_act: impl Fn() -> bool,
    limit: Duration,
) -> MoveOutcome {
    let clock = Clock::start();
    let run = HandoverRun::forced(to, clock.now(), millis(limit));
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("FAILOVER").arg("FORCE");
    let links = Links::new(to, target, Vec::new());
    drive(run, (links, elections), &cmd, may_act, clock).await
}

/// The sessions a hand-over talks through: the target's, and one per peer.
struct Links {
    id: String,
    target: Session,
    addr: String,
    peers: Vec<Session>,
}

impl Links {
    fn new(id: &str, target: Connector, peers: Vec<Connector>) -> Links {
        Links {
            id: id.to_owned(),
            addr: format!("{}:{}", target.host, target.port),
            target: Session::new(target),
            peers: peers.into_iter().map(Session::new).collect(),
        }
    }
}

/// Sends what the step machine asks for until it ends; the failover command, the one that
/// changes anything, waits for its election's turn (kept until the move ends or for
/// [`ELECTION_HOLD`]), and the Lease is checked right before it is sent.
async fn drive(
    mut run: HandoverRun,
    (mut links, elections): (Links, &Elections),
    failover: &redis::Cmd,
    may_act: impl Fn() -> bool,
    clock: Clock,
) -> MoveOutcome {
    let started = Instant::now();
    let mut answer = HandoverAnswer::Start;
    let mut turn: Option<Turn> = None;
    loop {
        if turn
            .as_ref()
            .is_some_and(|t| t.since.elapsed() > ELECTION_HOLD)
        {
            turn = None;
        }
        let command = match run.next(answer, clock.now()) {
            HandoverStep::Send(command) => command,
            HandoverStep::Retry { after_ms, command } => {
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                command
            }
            HandoverStep::Done => {
                return MoveOutcome::Done {
                    took: started.elapsed(),
                };
            }
            HandoverStep::Failed(why) => return MoveOutcome::Failed(why),
        };
        if command == HandoverCommand::Failover {
            if turn.is_none() {
                turn = elections.turn().await;
            }
            if !may_act() {
                return MoveOutcome::NoLease;
            }
        }
        answer = send(&mut links, &command, failover).await;
    }
}

async fn send(
    links: &mut Links,
    command: &HandoverCommand,
    failover: &redis::Cmd,
) -> HandoverAnswer {
    match command {
        HandoverCommand::AskPeer { index } => match links.peers.get_mut(*index) {
            Some(peer) => HandoverAnswer::Knows(knows(peer, &links.id).await),
            None => HandoverAnswer::Knows(None),
        },
        HandoverCommand::AskRole => role(&mut links.target, &links.addr).await,
        HandoverCommand::Failover => match links.target.command(failover).await {
            Ok(_) => HandoverAnswer::Sent,
            Err(e) => HandoverAnswer::Refused(format!("{} ({e})", links.addr)),
        },
    }
}

/// Whether the peer's `CLUSTER SHARDS` lists `id`; `None` when it does not answer.
async fn knows(session: &mut Session, id: &str) -> Option<bool> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SHARDS");
    let value = session.command(&cmd).await.ok()?;
    let shards = parse_shards(&observe::reply(value));
    Some(shards.iter().any(|s| s.contains(id)))
}

/// The target's role: refused only when it cannot be reached at all (a reply that is no role,
/// an error included, reads as not primary).
async fn role(session: &mut Session, addr: &str) -> HandoverAnswer {
    if let Err(e) = session.connection().await {
        return HandoverAnswer::Refused(format!("{addr} ({e})"));
    }
    let Ok(value) = session.command(&redis::cmd("ROLE")).await else {
        return HandoverAnswer::Primary(false);
    };
    HandoverAnswer::Primary(role_reply(&observe::reply(value)) == Some(Role::Primary))
}
