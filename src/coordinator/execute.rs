//! Carries out one move.
//!
//! - Cluster mode, [`failover`]: once every reachable member of the shard knows the target
//!   (gossip), a coordinated `CLUSTER FAILOVER` sent to the target replica, then a wait until the
//!   target reports itself primary. Never `FORCE` or `TAKEOVER`: a planned move must lose
//!   nothing, and a coordinated failover makes the target catch up with the primary (which
//!   pauses its clients) before it switches.
//! - Replication mode, [`switchover`]: a planned move, driven by `core::replication::step` —
//!   pause the old primary, wait for the target to catch up, move the record, promote, repoint,
//!   unpause (or unpause and leave everything as it was).
//! - Replication mode, [`promote`]: an unplanned failover (`core::replication::Promotion`) in its
//!   documented order: record first, then fence, promote, repoint.
//!
//! Every command that changes anything is preceded by a check of the cluster Lease's acting
//! deadline (`may_act`); past it the executor stops and sends nothing more. A switchover stopped
//! that way leaves its pause on the old primary to expire by itself (at most twice the hand-over
//! timeout): lifting it without the Lease could undo the pause of a successor coordinator's own
//! switchover, and every agent's keeper resolves the rest from the record.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;
use valkey_sidecar_core::info::Info;
use valkey_sidecar_core::plan::Action;
use valkey_sidecar_core::replication::{
    Command, Phase, Promotion, ShardRecord, Switchover, SwitchoverObservation, SwitchoverPlan,
    WriteOutcome, step,
};
use valkey_sidecar_core::shards::parse_shards;
use valkey_sidecar_core::time::Millis;

use crate::clock::Clock;
use crate::kube::KubeError;
use crate::kube::shard_lease::ShardLeaseClient;
use crate::valkey::{Connector, Session, observe};

/// How one move ended.
#[derive(Debug)]
pub enum Outcome {
    Done {
        took: Duration,
    },
    /// The acting deadline passed before a command could be sent: nothing more was done.
    NoLease,
    /// The switchover was undone: writes resumed on the old primary, the record is unchanged.
    RolledBack(String),
    /// The record changed since the decision (a 409): nothing was done.
    Conflict(String),
    Failed(String),
}

impl Outcome {
    /// The `result` label of metrics and of the last decision.
    pub fn result(&self) -> &'static str {
        match self {
            Outcome::Done { .. } => "ok",
            Outcome::NoLease => "no_lease",
            Outcome::RolledBack(_) => "rolled_back",
            Outcome::Conflict(_) => "conflict",
            Outcome::Failed(_) => "failed",
        }
    }
}

/// How long a hand-over waits for the target's shard peers to learn of it (a replaced pod's
/// Valkey joins through gossip in about a second) before it gives up and the coordinator plans
/// again.
const PEERS_KNOW_WITHIN: Duration = Duration::from_secs(5);

/// Sends the failover to `target` (the replica's address) and waits for its role to flip;
/// `peers`: the shard's other members, which must know the target first.
pub async fn failover(
    action: &Action,
    target: Connector,
    peers: Vec<Connector>,
    may_act: impl Fn() -> bool,
    limit: Duration,
) -> Outcome {
    let started = Instant::now();
    let known_by = (started + PEERS_KNOW_WITHIN).min(started + limit);
    if let Err(e) = known_by_peers(&action.to, peers, known_by).await {
        return Outcome::Failed(e);
    }
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("FAILOVER");
    fail_over_to(target, &cmd, may_act, started, started + limit).await
}

/// Sends `cmd` (a `CLUSTER FAILOVER` variant) to the replica `target`, its Lease checked right
/// before, and waits until `deadline` for it to report itself primary; `started` times the move.
pub(crate) async fn fail_over_to(
    target: Connector,
    cmd: &redis::Cmd,
    may_act: impl Fn() -> bool,
    started: Instant,
    deadline: Instant,
) -> Outcome {
    let addr = format!("{}:{}", target.host, target.port);
    let mut session = Session::new(target);
    // Connect first, so the lease check sits right before the command itself.
    if let Err(e) = session.connection().await {
        return Outcome::Failed(format!("cannot reach {addr}: {e}"));
    }
    // The planner works from gossip, which can lag: a target that is already primary is done.
    if is_primary(&mut session).await {
        return Outcome::Done {
            took: started.elapsed(),
        };
    }
    if !may_act() {
        return Outcome::NoLease;
    }
    if let Err(e) = session.command(cmd).await {
        return Outcome::Failed(format!("CLUSTER FAILOVER refused by {addr}: {e}"));
    }
    match wait_primary(&mut session, deadline).await {
        Ok(()) => Outcome::Done {
            took: started.elapsed(),
        },
        Err(e) => Outcome::Failed(e),
    }
}

/// Waits until every reachable peer lists `target` in its `CLUSTER SHARDS`.
///
/// A replica that does not know the target cannot follow it when it takes over: it goes on
/// replicating the old primary, and once that pod is gone it runs an election of its own. With
/// the old primary's slots already gone from its view every voter grants it, and the shard ends
/// up with two primaries (seen when a pod was replaced and handed over to within a second). A
/// peer that does not answer is not waited for.
async fn known_by_peers(
    target: &str,
    peers: Vec<Connector>,
    deadline: Instant,
) -> Result<(), String> {
    let mut pending: Vec<(String, Session)> = peers
        .into_iter()
        .map(|c| (c.host.clone(), Session::new(c)))
        .collect();
    loop {
        let mut still = Vec::new();
        for (host, mut session) in pending {
            if knows(&mut session, target).await == Some(false) {
                still.push((host, session));
            }
        }
        if still.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let hosts: Vec<&str> = still.iter().map(|(h, _)| h.as_str()).collect();
            return Err(format!("{target} is not yet known to {}", hosts.join(", ")));
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(20)).await;
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

async fn is_primary(session: &mut Session) -> bool {
    matches!(session.command(&redis::cmd("ROLE")).await, Ok(redis::Value::Array(items)) if is_master(items.first()))
}

async fn wait_primary(session: &mut Session, deadline: Instant) -> Result<(), String> {
    loop {
        if is_primary(session).await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err("the target did not become primary in time".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn is_master(v: Option<&redis::Value>) -> bool {
    match v {
        Some(redis::Value::BulkString(b)) => b == b"master",
        Some(redis::Value::SimpleString(s)) => s == "master",
        _ => false,
    }
}

/// Connections to one shard's members for one move, each opened on first use.
pub struct Links {
    connectors: BTreeMap<String, Connector>,
    sessions: BTreeMap<String, Session>,
}

impl Links {
    /// `connectors`: pod name → how to reach its Valkey.
    pub fn new(connectors: BTreeMap<String, Connector>) -> Links {
        Links {
            connectors,
            sessions: BTreeMap::new(),
        }
    }

    /// `host port` of a member, as `REPLICAOF` takes it.
    pub fn addr(&self, pod: &str) -> Option<String> {
        let c = self.connectors.get(pod)?;
        Some(format!("{} {}", c.host, c.port))
    }

    fn session(&mut self, pod: &str) -> Result<&mut Session, String> {
        let connector = self
            .connectors
            .get(pod)
            .ok_or_else(|| format!("{pod} has no address"))?;
        let session = self.sessions.entry(pod.to_owned());
        Ok(session.or_insert_with(|| Session::new(connector.clone())))
    }

    async fn command(&mut self, pod: &str, cmd: &redis::Cmd) -> Result<redis::Value, String> {
        let session = self.session(pod)?;
        session
            .command(cmd)
            .await
            .map_err(|e| format!("{pod}: {e}"))
    }

    async fn query(
        &mut self,
        pod: &str,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<redis::Value>, String> {
        let session = self.session(pod)?;
        session.query(pipe).await.map_err(|e| format!("{pod}: {e}"))
    }
}

/// How often a running switchover looks at the target's offset: the catch-up usually takes well
/// under a millisecond, and every poll is one `INFO` on one replica.
const CATCH_UP_POLL: Duration = Duration::from_millis(2);

/// Pause between attempts of a record write whose outcome was unknown.
const WRITE_RETRY: Duration = Duration::from_millis(100);

/// One switchover in progress.
struct Run {
    s: Switchover,
    obs: SwitchoverObservation,
    links: Links,
    record: ShardLeaseClient,
    /// The record write, kept to try again while its outcome is unknown.
    write: Option<Command>,
    /// Commands of the commit that failed (repoints are best effort and only logged).
    failures: Vec<String>,
    /// Pods whose `REPLICAOF` failed in the commit.
    not_demoted: Vec<String>,
}

/// Runs a planned switchover to its end: `step` decides, this function sends, observes, steps again.
pub async fn switchover(
    plan: SwitchoverPlan,
    links: Links,
    record: ShardLeaseClient,
    clock: Clock,
    may_act: impl Fn() -> bool,
) -> Outcome {
    let started = Instant::now();
    let mut run = Run::new(plan, links, record, clock.now());
    loop {
        if let Some(end) = run.advance(clock, &may_act, started).await {
            return end;
        }
        run.observe(&may_act).await;
    }
}

impl Run {
    fn new(plan: SwitchoverPlan, links: Links, record: ShardLeaseClient, now: Millis) -> Run {
        Run {
            s: Switchover::new(plan, now),
            obs: SwitchoverObservation::default(),
            links,
            record,
            write: None,
            failures: Vec::new(),
            not_demoted: Vec::new(),
        }
    }

    /// One step: its commands sent in order (each only while the Lease allows), and the
    /// outcome once the switchover is over.
    async fn advance(
        &mut self,
        clock: Clock,
        may_act: &impl Fn() -> bool,
        started: Instant,
    ) -> Option<Outcome> {
        let (next, commands) = step(&self.s, &self.obs, clock.now());
        self.s = next;
        for command in &commands {
            if !may_act() {
                return Some(Outcome::NoLease);
            }
            self.execute(command).await;
        }
        let unknown = "the record write's outcome stayed unknown: the old primary stays paused until its pause expires";
        let given_up = || {
            self.given_up(clock)
                .then(|| Outcome::Failed(unknown.into()))
        };
        self.outcome(started).or_else(given_up)
    }

    async fn execute(&mut self, command: &Command) {
        match command {
            Command::Pause { pod, ms } => self.pause(pod, *ms).await,
            Command::WriteRecord { .. } => {
                self.write = Some(command.clone());
                self.obs.write = self.try_write().await;
            }
            Command::PromoteNoOne { pod } => {
                if let Err(e) = self.links.command(pod, &replicaof_no_one()).await {
                    self.failures.push(format!("REPLICAOF NO ONE on {e}"));
                }
            }
            Command::ReplicaOf { pod, to } => {
                if !repoint(&mut self.links, pod, to).await {
                    self.not_demoted.push(pod.clone());
                }
            }
            Command::Unpause { pod } => self.unpause(pod).await,
        }
    }

    /// After a commit, a pod that could not be made a replica keeps its pause (until it expires,
    /// or its agent demotes it): unpaused, it would take writes while the record names another.
    async fn unpause(&mut self, pod: &str) {
        if self.s.phase == Phase::Done && self.not_demoted.iter().any(|p| p == pod) {
            tracing::warn!(pod, "left paused: it could not be made a replica");
            return;
        }
        unpause(&mut self.links, pod).await;
    }

    /// `MULTI; CLIENT PAUSE <ms> WRITE; INFO replication; EXEC`: the offset is read under the
    /// pause, so every write the old primary acknowledged is at or below it.
    async fn pause(&mut self, pod: &str, ms: u64) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.cmd("CLIENT").arg("PAUSE").arg(ms).arg("WRITE");
        pipe.cmd("INFO").arg("replication");
        match self.links.query(pod, &pipe).await {
            Ok(values) => {
                let offset = values.get(1).and_then(info_u64("master_repl_offset"));
                self.obs.paused_offset = self.obs.paused_offset.or(offset);
            }
            // No offset: the step machine rolls back at its deadline.
            Err(e) => tracing::warn!(error = %e, "switchover: pause failed"),
        }
    }

    /// The record write's outcome: `None` while unknown (a timeout may still have landed).
    async fn try_write(&self) -> Option<WriteOutcome> {
        let Some(Command::WriteRecord {
            holder,
            epoch,
            expect_holder,
            expect_epoch,
        }) = &self.write
        else {
            return None;
        };
        let moved = self
            .record
            .move_to(expect_holder, *expect_epoch, holder, *epoch)
            .await;
        match moved {
            Ok(true) => Some(WriteOutcome::Written),
            // An earlier attempt whose answer was lost may be what moved it.
            Ok(false) => self.landed(holder, *epoch).await,
            Err(e) => {
                tracing::warn!(error = %e, "switchover: record write failed");
                not_applied(&e).then_some(WriteOutcome::Refused)
            }
        }
    }

    async fn landed(&self, holder: &str, epoch: u64) -> Option<WriteOutcome> {
        let record = self.record.read().await.ok()?;
        let ours = record.is_some_and(|r| r.holder() == Some(holder) && r.epoch == epoch);
        Some(if ours {
            WriteOutcome::Written
        } else {
            WriteOutcome::Refused
        })
    }

    fn outcome(&self, started: Instant) -> Option<Outcome> {
        match &self.s.phase {
            Phase::Done if self.failures.is_empty() => Some(Outcome::Done {
                took: started.elapsed(),
            }),
            Phase::Done => Some(Outcome::Failed(self.failures.join("; "))),
            Phase::RolledBack { reason } => Some(Outcome::RolledBack(reason.clone())),
            _ => None,
        }
    }

    /// A write whose outcome stays unknown is given up once the first pause would have run out:
    /// without an answer from the apiserver nothing better can be done than letting it expire.
    fn given_up(&self, clock: Clock) -> bool {
        let writing = self.s.phase == Phase::Writing && self.obs.write.is_none();
        writing && clock.now() >= self.s.started.plus(self.s.pause_ms())
    }

    /// What the next step needs: the target's offset while catching up, the write's outcome while
    /// it is unknown.
    async fn observe(&mut self, may_act: &impl Fn() -> bool) {
        match self.s.phase {
            Phase::Pausing | Phase::CatchingUp { .. } => {
                let to = self.s.plan.to.clone();
                let info = self.links.command(&to, &info_replication()).await;
                self.obs.target_offset = info.ok().as_ref().and_then(info_u64("slave_repl_offset"));
                // Caught up: step at once, the old primary is paused meanwhile.
                let (target, paused) = (self.obs.target_offset, self.obs.paused_offset);
                if !matches!((target, paused), (Some(t), Some(p)) if t >= p) {
                    tokio::time::sleep(CATCH_UP_POLL).await;
                }
            }
            Phase::Writing if self.obs.write.is_none() => {
                tokio::time::sleep(WRITE_RETRY).await;
                if may_act() {
                    self.obs.write = self.try_write().await;
                }
            }
            _ => {}
        }
    }
}

/// Errors that say the write was not applied (as opposed to timeouts, whose write may land).
fn not_applied(e: &KubeError) -> bool {
    matches!(
        e.kind(),
        "forbidden" | "invalid" | "throttled" | "credentials"
    )
}

fn info_replication() -> redis::Cmd {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("replication");
    cmd
}

fn replicaof_no_one() -> redis::Cmd {
    let mut cmd = redis::cmd("REPLICAOF");
    cmd.arg("NO").arg("ONE");
    cmd
}

/// A numeric INFO field of a reply.
fn info_u64(key: &'static str) -> impl Fn(&redis::Value) -> Option<u64> {
    move |v| match crate::valkey::observe::reply(v.clone()) {
        valkey_sidecar_core::reply::Reply::Text(text) => Info::parse(&text).u64(key),
        _ => None,
    }
}

/// `REPLICAOF <to>` (`to` = `host port`), best effort: each agent's keeper is the backstop.
/// Whether it was accepted.
async fn repoint(links: &mut Links, pod: &str, to: &str) -> bool {
    let mut cmd = redis::cmd("REPLICAOF");
    cmd.arg(to.split_whitespace().collect::<Vec<_>>());
    let result = links.command(pod, &cmd).await;
    if let Err(e) = &result {
        tracing::warn!(error = %e, "repoint failed; the pod's own agent follows the record");
    }
    result.is_ok()
}

async fn unpause(links: &mut Links, pod: &str) {
    if let Err(e) = links
        .command(pod, &redis::cmd("CLIENT").arg("UNPAUSE").clone())
        .await
    {
        tracing::warn!(error = %e, "CLIENT UNPAUSE failed");
    }
}

/// Makes `p.target` the primary, in the order `core::replication::Promotion` documents: the record
/// (a 409 stops everything), then `CLIENT PAUSE` on the other masters, `REPLICAOF NO ONE` on the
/// target, and `REPLICAOF` on the others, best effort. `fence_ms` is how long the pause holds.
pub async fn promote(
    p: &Promotion,
    mut links: Links,
    record: &ShardLeaseClient,
    fence_ms: u64,
    may_act: impl Fn() -> bool,
) -> Outcome {
    let started = Instant::now();
    match promotion(p, &mut links, record, fence_ms, &may_act).await {
        Ok(()) => Outcome::Done {
            took: started.elapsed(),
        },
        Err(stopped) => stopped,
    }
}

async fn promotion(
    p: &Promotion,
    links: &mut Links,
    record: &ShardLeaseClient,
    fence_ms: u64,
    may_act: &impl Fn() -> bool,
) -> Result<(), Outcome> {
    leading(may_act)?;
    write_promotion(p, record).await?;
    for pod in &p.fence {
        leading(may_act)?;
        fence(links, pod, fence_ms).await;
    }
    promote_target(links, p, may_act).await?;
    repoint_all(links, p, may_act).await;
    Ok(())
}

/// Pause between tries of a promotion step whose answer did not come.
const PROMOTION_RETRY: Duration = Duration::from_millis(200);

/// Tries of a promotion step after the first, and how long after the first try another may
/// start: a second, inside the shortest renew deadline the timings allow (more than 1.2 retry
/// periods of at least a second), so the target still holds the record when its promotion lands.
const PROMOTION_RETRIES: usize = 4;
const PROMOTION_RETRY_FOR: Duration = Duration::from_secs(1);

/// The pause before another try of a promotion step, if one is left.
fn next_try(delays: &mut backon::ConstantBackoff, first: Instant) -> Option<Duration> {
    (first.elapsed() < PROMOTION_RETRY_FOR)
        .then(|| delays.next())
        .flatten()
}

/// `REPLICAOF NO ONE` on the target, tried again while it fails: the record already names the
/// target, whose agent waits for this command only until its renew deadline and then releases —
/// one lost answer on a loaded machine would cost the shard a second failover. Idempotent: a
/// master answers OK.
async fn promote_target(
    links: &mut Links,
    p: &Promotion,
    may_act: &impl Fn() -> bool,
) -> Result<(), Outcome> {
    let (mut delays, first) = (
        crate::retry::few(PROMOTION_RETRY, PROMOTION_RETRIES),
        Instant::now(),
    );
    loop {
        leading(may_act)?;
        let e = match links.command(&p.target, &replicaof_no_one()).await {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let Some(delay) = next_try(&mut delays, first) else {
            return Err(Outcome::Failed(format!("REPLICAOF NO ONE on {e}")));
        };
        tracing::warn!(error = %e, "failover: REPLICAOF NO ONE failed; trying again");
        tokio::time::sleep(delay).await;
    }
}

fn leading(may_act: &impl Fn() -> bool) -> Result<(), Outcome> {
    if may_act() {
        Ok(())
    } else {
        Err(Outcome::NoLease)
    }
}

/// The record first, carrying the decision's `resourceVersion`: a 409 means the holder renewed
/// (or someone else wrote) since, and nothing may follow. A refused write stops the promotion;
/// one whose answer was lost (timeout, 5xx) may have landed and is read back
/// ([`landed_promotion`]).
async fn write_promotion(p: &Promotion, record: &ShardLeaseClient) -> Result<(), Outcome> {
    match record.write(&p.record()).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == "conflict" => Err(Outcome::Conflict(
            "the record changed since the decision".into(),
        )),
        Err(e) if not_applied(&e) => Err(Outcome::Failed(format!("writing the record: {e}"))),
        Err(e) => {
            tracing::warn!(error = %e, "failover: the record write's outcome is unknown; reading it back");
            let read = || record.read();
            landed_promotion(p, read, &e.to_string()).await
        }
    }
}

/// Whether a record write of unknown outcome landed, by reading the record back (tried again
/// while the reads fail too). Landed: the promotion goes on, as after an answered write — else
/// the target's agent would wait out its renew deadline for a `REPLICAOF NO ONE` that never
/// comes, release, and the shard would fail over a second time. Not landed, or still unknown:
/// nothing follows, and the target's agent releases a record that may name it.
async fn landed_promotion<F, Fut>(p: &Promotion, mut read: F, error: &str) -> Result<(), Outcome>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<ShardRecord>, KubeError>>,
{
    let (mut delays, first) = (
        crate::retry::few(PROMOTION_RETRY, PROMOTION_RETRIES),
        Instant::now(),
    );
    loop {
        match read().await {
            Ok(Some(r)) if r.same_claim(&p.record()) => return Ok(()),
            Ok(_) => {
                let why = format!("writing the record: {error}; it did not land");
                return Err(Outcome::Conflict(why));
            }
            Err(e) => {
                let Some(delay) = next_try(&mut delays, first) else {
                    let why = format!("writing the record: {error}; reading it back: {e}");
                    return Err(Outcome::Failed(why));
                };
                tokio::time::sleep(delay).await;
            }
        }
    }
}

async fn fence(links: &mut Links, pod: &str, ms: u64) {
    let cmd = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .clone();
    if let Err(e) = links.command(pod, &cmd).await {
        tracing::warn!(error = %e, "fencing an old master failed");
    }
}

/// The others follow the new primary. A fenced master is unpaused once it is a replica (which
/// refuses writes anyway), so no pause is left behind to block writes after a later promotion.
async fn repoint_all(links: &mut Links, p: &Promotion, may_act: &impl Fn() -> bool) {
    let Some(to) = links.addr(&p.target) else {
        return;
    };
    for pod in &p.repoint {
        if !may_act() {
            tracing::info!("lease lost while repointing: the agents follow the record");
            return;
        }
        // A fenced master that is still a master keeps its pause.
        if repoint(links, pod, &to).await && p.fence.contains(pod) {
            unpause(links, pod).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::cell::Cell;
    use std::net::SocketAddr;

    use valkey_sidecar_testkit::{ServerOptions, ValkeyServer};

    use super::*;

    fn promotion(target: &str) -> Promotion {
        Promotion {
            target: target.into(),
            epoch: 2,
            version: "7".into(),
            fence: Vec::new(),
            repoint: Vec::new(),
            reason: "test".into(),
            empty: false,
        }
    }

    fn held_by(holder: &str, epoch: u64) -> ShardRecord {
        ShardRecord {
            lease_ms: None,
            holder: Some(holder.into()),
            primary: Some(holder.into()),
            epoch,
            version: "8".into(),
        }
    }

    fn timed_out() -> KubeError {
        KubeError::Timeout(Duration::from_millis(1))
    }

    /// Answers each read with the next of `answers`, counting the reads.
    fn reads(
        answers: Vec<Result<Option<ShardRecord>, KubeError>>,
        count: &Cell<usize>,
    ) -> impl FnMut() -> std::future::Ready<Result<Option<ShardRecord>, KubeError>> + '_ {
        let mut answers = answers.into_iter();
        move || {
            count.set(count.get() + 1);
            std::future::ready(answers.next().unwrap_or_else(|| Err(timed_out())))
        }
    }

    #[tokio::test]
    async fn an_unanswered_record_write_that_landed_lets_the_promotion_go_on() {
        let count = Cell::new(0);
        let answers = vec![Err(timed_out()), Ok(Some(held_by("b", 2)))];
        let out = landed_promotion(&promotion("b"), reads(answers, &count), "timeout").await;
        assert!(out.is_ok(), "{out:?}");
        assert_eq!(count.get(), 2, "read again after a failed read");
    }

    #[tokio::test]
    async fn an_unanswered_record_write_that_did_not_land_stops_the_promotion() {
        for seen in [Some(held_by("a", 1)), Some(held_by("c", 2)), None] {
            let count = Cell::new(0);
            let out = landed_promotion(&promotion("b"), reads(vec![Ok(seen)], &count), "t").await;
            assert!(matches!(out, Err(Outcome::Conflict(_))), "{out:?}");
        }
    }

    #[tokio::test]
    async fn a_record_that_cannot_be_read_back_stops_the_promotion_after_a_few_reads() {
        let count = Cell::new(0);
        let out = landed_promotion(&promotion("b"), reads(Vec::new(), &count), "t").await;
        assert!(matches!(out, Err(Outcome::Failed(_))), "{out:?}");
        // Every retry, unless a slow machine ran out of the retry window first.
        assert!(
            (2..=1 + PROMOTION_RETRIES).contains(&count.get()),
            "{}",
            count.get()
        );
    }

    fn links_to(pod: &str, addr: SocketAddr) -> Links {
        let connector = Connector {
            host: addr.ip().to_string(),
            port: addr.port(),
            username: None,
            password_file: None,
            tls: None,
            timeout: Duration::from_millis(150),
        };
        Links::new(BTreeMap::from([(pod.to_owned(), connector)]))
    }

    /// A real replica, frozen (SIGSTOP) when the promotion starts and thawed 400 ms later: the
    /// first `REPLICAOF NO ONE` goes unanswered, a later try promotes it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unanswered_replicaof_no_one_is_tried_again() {
        let primary = ValkeyServer::start(ServerOptions::default()).unwrap();
        let replica =
            ValkeyServer::start(ServerOptions::default().replica_of(primary.addr())).unwrap();
        let mut links = links_to("b", replica.addr());
        replica.pause().unwrap();
        let thaw = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(400));
                replica.resume().unwrap();
            });
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(promote_target(
                    &mut links,
                    &promotion("b"),
                    &|| true,
                ))
            })
        });
        assert!(thaw.is_ok(), "{thaw:?}");
        assert!(replica.is_primary().unwrap());
    }

    #[tokio::test]
    async fn no_replicaof_no_one_without_the_lease() {
        let replica = ValkeyServer::start(ServerOptions::default()).unwrap();
        replica.cmd(&["REPLICAOF", "127.0.0.1", "1"]).unwrap();
        let mut links = links_to("b", replica.addr());
        let out = promote_target(&mut links, &promotion("b"), &|| false).await;
        assert!(matches!(out, Err(Outcome::NoLease)), "{out:?}");
        assert!(!replica.is_primary().unwrap());
    }
}
