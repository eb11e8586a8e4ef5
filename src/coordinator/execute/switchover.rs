//! Replication mode's planned move, driven by `core::replication::step`: pause the old primary,
//! wait for the target to catch up, move the record, promote, repoint, unpause (or unpause and
//! leave everything as it was).

use std::time::Duration;

use tokio::time::Instant;
use valkey_sidecar_core::replication::{
    Command, Phase, Switchover, SwitchoverEnd, SwitchoverObservation, SwitchoverPlan, WriteOutcome,
    step,
};
use valkey_sidecar_core::time::Millis;

use super::{
    Links, MoveOutcome, info_replication, info_u64, not_applied, replicaof_no_one, repoint, unpause,
};
use crate::k8s::shard_lease::ShardLeaseClient;
use crate::runtime::clock::Clock;

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
) -> MoveOutcome {
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
    ) -> Option<MoveOutcome> {
        let (next, commands) = step(&self.s, &self.obs, clock.now());
        self.s = next;
        for command in &commands {
            if !may_act() {
                return Some(MoveOutcome::NoLease);
            }
            self.execute(command).await;
        }
        let end = self.s.end(&self.failures)?;
        Some(match end {
            SwitchoverEnd::Done => MoveOutcome::Done {
                took: started.elapsed(),
            },
            SwitchoverEnd::Failed(why) => MoveOutcome::Failed(why),
            SwitchoverEnd::RolledBack(why) => MoveOutcome::RolledBack(why),
        })
    }

    async fn execute(&mut self, command: &Command) {
        tracing::debug!(?command, reason = %command.reason(), "switchover");
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
        if self.s.keeps_paused(pod, &self.not_demoted) {
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
        Some(WriteOutcome::read_back(record.as_ref(), holder, epoch))
    }

    /// What the next step needs, with the wait `core` asks for: the target's offset while
    /// catching up (no wait once it has), the write's outcome (the same write again, after the
    /// retry pause) while it is unknown.
    async fn observe(&mut self, may_act: &impl Fn() -> bool) {
        match self.s.phase {
            Phase::Pausing | Phase::CatchingUp { .. } => {
                let to = self.s.plan.to.clone();
                let info = self.links.command(&to, &info_replication()).await;
                self.obs.target_offset = info.ok().as_ref().and_then(info_u64("slave_repl_offset"));
                // Caught up: step at once (a zero sleep would still wait for the timer's tick).
                let wait = self.s.wait_ms(&self.obs);
                if wait > 0 {
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
            }
            Phase::Writing if self.obs.write.is_none() => {
                let wait = self.s.wait_ms(&self.obs);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                if may_act() {
                    self.obs.write = self.try_write().await;
                }
            }
            _ => {}
        }
    }
}
