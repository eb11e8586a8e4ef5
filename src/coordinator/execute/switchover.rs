//! Replication mode's planned move: the executor of `core::replication::SwitchoverRun`, which
//! decides the order, the polling, the retries and the read-back; this file sends each command,
//! with the cluster Lease checked right before, and reports what it saw.

use std::time::Duration;

use tokio::time::Instant;
use valkey_sidecar_core::replication::{
    SwitchoverAnswer, SwitchoverCommand, SwitchoverEnd, SwitchoverPlan, SwitchoverRun,
    SwitchoverStep,
};

use super::{
    Links, MoveOutcome, info_replication, info_u64, not_applied, replicaof_no_one, repoint, unpause,
};
use crate::k8s::shard_lease::ShardLeaseClient;
use crate::runtime::clock::Clock;

/// Runs a planned switchover to its end: `SwitchoverRun` decides, this function sends and
/// reports each answer back.
pub async fn switchover(
    plan: SwitchoverPlan,
    mut links: Links,
    record: ShardLeaseClient,
    clock: Clock,
    may_act: impl Fn() -> bool,
) -> MoveOutcome {
    let started = Instant::now();
    let mut run = SwitchoverRun::new(plan, clock.now());
    let mut answer = SwitchoverAnswer::Start;
    loop {
        let command = match run.next(answer, clock.now()) {
            SwitchoverStep::Send(command) => command,
            SwitchoverStep::Wait { ms, command } => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                command
            }
            SwitchoverStep::End(end) => return ended(end, &run, started),
        };
        if command.needs_lease() && !may_act() {
            return MoveOutcome::NoLease;
        }
        tracing::debug!(?command, reason = %command.reason(), "switchover");
        answer = send(&command, &mut links, &record).await;
    }
}

fn ended(end: SwitchoverEnd, run: &SwitchoverRun, started: Instant) -> MoveOutcome {
    if let Some(pod) = run.left_paused() {
        tracing::warn!(pod, "left paused: it could not be made a replica");
    }
    match end {
        SwitchoverEnd::Done => MoveOutcome::Done {
            took: started.elapsed(),
        },
        SwitchoverEnd::Failed(why) => MoveOutcome::Failed(why),
        SwitchoverEnd::RolledBack(why) => MoveOutcome::RolledBack(why),
    }
}

async fn send(
    command: &SwitchoverCommand,
    links: &mut Links,
    record: &ShardLeaseClient,
) -> SwitchoverAnswer {
    match command {
        SwitchoverCommand::Pause { pod, ms } => pause(links, pod, *ms).await,
        SwitchoverCommand::ReadTarget { pod } => {
            let info = links.command(pod, &info_replication()).await;
            let offset = info.ok().as_ref().and_then(info_u64("slave_repl_offset"));
            SwitchoverAnswer::TargetAt { offset }
        }
        SwitchoverCommand::WriteRecord {
            holder,
            epoch,
            expect_holder,
            expect_epoch,
        } => write(record, (expect_holder, *expect_epoch), (holder, *epoch)).await,
        SwitchoverCommand::ReadRecord => match record.read().await {
            Ok(read) => SwitchoverAnswer::Record(read),
            Err(e) => SwitchoverAnswer::Unknown {
                error: e.to_string(),
            },
        },
        SwitchoverCommand::PromoteNoOne { pod } => {
            match links.command(pod, &replicaof_no_one()).await {
                Ok(_) => SwitchoverAnswer::Ok,
                Err(e) => SwitchoverAnswer::Failed {
                    error: e.to_string(),
                },
            }
        }
        SwitchoverCommand::ReplicaOf { pod, to } => {
            if repoint(links, pod, to).await {
                SwitchoverAnswer::Ok
            } else {
                SwitchoverAnswer::Failed {
                    error: "REPLICAOF failed".into(),
                }
            }
        }
        SwitchoverCommand::Unpause { pod } => {
            unpause(links, pod).await;
            SwitchoverAnswer::Ok
        }
    }
}

/// `MULTI; CLIENT PAUSE <ms> WRITE; INFO replication; EXEC`: the offset is read under the
/// pause, so every write the old primary acknowledged is at or below it.
async fn pause(links: &mut Links, pod: &str, ms: u64) -> SwitchoverAnswer {
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd("CLIENT").arg("PAUSE").arg(ms).arg("WRITE");
    pipe.cmd("INFO").arg("replication");
    let offset = match links.query(pod, &pipe).await {
        Ok(values) => values.get(1).and_then(info_u64("master_repl_offset")),
        Err(e) => {
            tracing::warn!(error = %e, "switchover: pause failed");
            None
        }
    };
    SwitchoverAnswer::Paused { offset }
}

/// The record's compare-and-swap from `(holder, epoch)` to the target's.
async fn write(
    record: &ShardLeaseClient,
    (expect_holder, expect_epoch): (&str, u64),
    (holder, epoch): (&str, u64),
) -> SwitchoverAnswer {
    match record
        .move_to(expect_holder, expect_epoch, holder, epoch)
        .await
    {
        Ok(true) => SwitchoverAnswer::Written,
        Ok(false) => SwitchoverAnswer::Moved,
        Err(e) if not_applied(&e) => SwitchoverAnswer::Refused {
            error: e.to_string(),
        },
        Err(e) => {
            tracing::warn!(error = %e, "switchover: record write failed");
            SwitchoverAnswer::Unknown {
                error: e.to_string(),
            }
        }
    }
}
