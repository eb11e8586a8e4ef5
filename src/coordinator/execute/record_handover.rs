//! Replication mode's hand-over: the executor of `core::replication::RecordHandoverRun`, which
//! decides the order, the polling, the retries and the read-back; this file sends each command,
//! with the cluster Lease checked right before, and reports what it saw.

use std::time::Duration;

use tokio::time::Instant;
use valkey_sidecar_core::replication::{
    RecordHandoverAnswer, RecordHandoverCommand, RecordHandoverEnd, RecordHandoverPlan,
    RecordHandoverRun, RecordHandoverStep,
};

use super::{
    Links, MoveOutcome, info_replication, info_u64, not_applied, replicaof_no_one, repoint, unpause,
};
use crate::k8s::record::RecordClient;
use crate::runtime::clock::Clock;

/// Runs a planned hand-over to its end: `RecordHandoverRun` decides, this function sends and
/// reports each answer back.
pub async fn record_handover(
    plan: RecordHandoverPlan,
    mut links: Links,
    record: RecordClient,
    clock: Clock,
    may_act: impl Fn() -> bool,
) -> MoveOutcome {
    let started = Instant::now();
    let mut run = RecordHandoverRun::new(plan, clock.now());
    let mut answer = RecordHandoverAnswer::Start;
    loop {
        let command = match run.next(answer, clock.now()) {
            RecordHandoverStep::Send(command) => command,
            RecordHandoverStep::Wait { ms, command } => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                command
            }
            RecordHandoverStep::End(end) => return ended(end, &run, started),
        };
        if command.needs_lease() && !may_act() {
            return MoveOutcome::NoLease;
        }
        tracing::debug!(?command, reason = %command.reason(), "record hand-over");
        answer = send(&command, &mut links, &record).await;
    }
}

fn ended(end: RecordHandoverEnd, run: &RecordHandoverRun, started: Instant) -> MoveOutcome {
    if let Some(pod) = run.left_paused() {
        tracing::warn!(pod, "left paused: it could not be made a replica");
    }
    match end {
        RecordHandoverEnd::Done => MoveOutcome::Done {
            took: started.elapsed(),
        },
        RecordHandoverEnd::Failed(why) => MoveOutcome::Failed(why),
        RecordHandoverEnd::RolledBack(why) => MoveOutcome::RolledBack(why),
    }
}

async fn send(
    command: &RecordHandoverCommand,
    links: &mut Links,
    record: &RecordClient,
) -> RecordHandoverAnswer {
    match command {
        RecordHandoverCommand::Pause { pod, ms } => pause(links, pod, *ms).await,
        RecordHandoverCommand::ReadTarget { pod } => {
            let info = links.command(pod, &info_replication()).await;
            let offset = info.ok().as_ref().and_then(info_u64("slave_repl_offset"));
            RecordHandoverAnswer::TargetAt { offset }
        }
        RecordHandoverCommand::WriteRecord {
            holder,
            epoch,
            expect_holder,
            expect_epoch,
        } => write(record, (expect_holder, *expect_epoch), (holder, *epoch)).await,
        RecordHandoverCommand::ReadRecord => match record.read().await {
            Ok(read) => RecordHandoverAnswer::Record(read),
            Err(e) => RecordHandoverAnswer::Unknown {
                error: e.to_string(),
            },
        },
        RecordHandoverCommand::PromoteNoOne { pod } => {
            match links.command(pod, &replicaof_no_one()).await {
                Ok(_) => RecordHandoverAnswer::Ok,
                Err(e) => RecordHandoverAnswer::Failed {
                    error: e.to_string(),
                },
            }
        }
        RecordHandoverCommand::ReplicaOf { pod, to } => {
            if repoint(links, pod, to).await {
                RecordHandoverAnswer::Ok
            } else {
                RecordHandoverAnswer::Failed {
                    error: "REPLICAOF failed".into(),
                }
            }
        }
        RecordHandoverCommand::Unpause { pod } => {
            unpause(links, pod).await;
            RecordHandoverAnswer::Ok
        }
    }
}

/// `MULTI; CLIENT PAUSE <ms> WRITE; INFO replication; EXEC`: the offset is read under the
/// pause, so every write the old primary acknowledged is at or below it.
async fn pause(links: &mut Links, pod: &str, ms: u64) -> RecordHandoverAnswer {
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd("CLIENT").arg("PAUSE").arg(ms).arg("WRITE");
    pipe.cmd("INFO").arg("replication");
    let offset = match links.query(pod, &pipe).await {
        Ok(values) => values.get(1).and_then(info_u64("master_repl_offset")),
        Err(e) => {
            tracing::warn!(error = %e, "hand-over: pause failed");
            None
        }
    };
    RecordHandoverAnswer::Paused { offset }
}

/// The record's compare-and-swap from `(holder, epoch)` to the target's.
async fn write(
    record: &RecordClient,
    (expect_holder, expect_epoch): (&str, u64),
    (holder, epoch): (&str, u64),
) -> RecordHandoverAnswer {
    match record
        .move_to(expect_holder, expect_epoch, holder, epoch)
        .await
    {
        Ok(true) => RecordHandoverAnswer::Written,
        Ok(false) => RecordHandoverAnswer::Moved,
        Err(e) if not_applied(&e) => RecordHandoverAnswer::Refused {
            error: e.to_string(),
        },
        Err(e) => {
            tracing::warn!(error = %e, "hand-over: record write failed");
            RecordHandoverAnswer::Unknown {
                error: e.to_string(),
            }
        }
    }
}
