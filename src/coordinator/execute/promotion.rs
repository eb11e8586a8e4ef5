//! Replication mode's unplanned failover: the executor of `core::replication::PromotionRun`,
//! which decides the order, the retries and the read-back; this file sends each command, with the
//! cluster Lease checked right before, and reports what it saw.

use std::time::Duration;

use tokio::time::Instant;
use valkey_sidecar_core::replication::{
    Promotion, PromotionAnswer, PromotionCommand, PromotionRun, PromotionStep, PromotionStop,
    WithoutLease,
};

use super::{Links, MoveOutcome, not_applied, replicaof_no_one, repoint, unpause};
use crate::k8s::record::RecordClient;
use crate::runtime::clock::Clock;

/// Where a promotion's commands go: the shard's members and its record.
pub(super) trait Target {
    async fn send(&mut self, command: &PromotionCommand) -> PromotionAnswer;
}

/// The real one: the members' Valkeys and the record on the apiserver.
struct Shard<'a> {
    promotion: &'a Promotion,
    links: Links,
    record: &'a RecordClient,
    /// The record's `resourceVersion` as this promotion wrote it: a later one with the same
    /// claim is the target's agent renewing it, its consent.
    written: Option<String>,
}

/// How long the pause on an old master holds, and how long the target's consent is awaited.
#[derive(Debug, Clone, Copy)]
pub struct Waits {
    pub fence_ms: u64,
    pub consent_ms: u64,
}

/// Makes `p.target` the primary (`core::replication::PromotionRun`).
pub async fn run_promotion(
    p: &Promotion,
    links: Links,
    record: &RecordClient,
    waits: Waits,
    clock: Clock,
    may_act: impl Fn() -> bool,
) -> MoveOutcome {
    let shard = Shard {
        promotion: p,
        links,
        record,
        written: None,
    };
    run(
        PromotionRun::new(p.clone(), waits.fence_ms, waits.consent_ms),
        shard,
        clock,
        may_act,
    )
    .await
}

/// Steps the run to its end.
pub(super) async fn run(
    mut run: PromotionRun,
    mut target: impl Target,
    clock: Clock,
    may_act: impl Fn() -> bool,
) -> MoveOutcome {
    let started = Instant::now();
    let mut answer = PromotionAnswer::Start;
    loop {
        let command = match run.next(answer, clock.now()) {
            PromotionStep::Send(command) => command,
            PromotionStep::Retry { after_ms, command } => {
                tracing::warn!(?command, "failover: no answer; trying again");
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                command
            }
            PromotionStep::Done => return done(started),
            PromotionStep::Stopped(PromotionStop::Conflict(why)) => {
                return MoveOutcome::Conflict(why);
            }
            PromotionStep::Stopped(PromotionStop::Failed(why)) => return MoveOutcome::Failed(why),
        };
        tracing::debug!(?command, reason = %command.reason(), "failover");
        if !may_act() {
            match command.without_lease() {
                WithoutLease::Stop => return MoveOutcome::NoLease,
                WithoutLease::Finish => {
                    tracing::info!("lease lost while repointing: the agents follow the record");
                    return done(started);
                }
                WithoutLease::Send => {}
            }
        }
        answer = target.send(&command).await;
    }
}

fn done(started: Instant) -> MoveOutcome {
    MoveOutcome::Done {
        took: started.elapsed(),
    }
}

impl Target for Shard<'_> {
    async fn send(&mut self, command: &PromotionCommand) -> PromotionAnswer {
        match command {
            PromotionCommand::WriteRecord => self.write().await,
            PromotionCommand::ReadRecord => self.read().await,
            PromotionCommand::AwaitConsent { .. } => self.consent().await,
            PromotionCommand::Fence { pod, ms } => fence(&mut self.links, pod, *ms).await,
            PromotionCommand::PromoteTarget { pod } => promote_target(&mut self.links, pod).await,
            PromotionCommand::Repoint { pod } => self.repoint(pod).await,
            PromotionCommand::Unpause { pod } => {
                unpause(&mut self.links, pod).await;
                PromotionAnswer::Ok
            }
        }
    }
}

impl Shard<'_> {
    async fn write(&mut self) -> PromotionAnswer {
        match self.record.write(&self.promotion.record()).await {
            Ok(written) => {
                self.written = Some(written.version);
                PromotionAnswer::Ok
            }
            Err(e) if e.kind() == "conflict" || not_applied(&e) => PromotionAnswer::Refused {
                conflict: e.kind() == "conflict",
                error: e.to_string(),
            },
            Err(e) => {
                tracing::warn!(error = %e, "failover: the record write's outcome is unknown; reading it back");
                PromotionAnswer::Unknown {
                    error: e.to_string(),
                }
            }
        }
    }

    async fn read(&mut self) -> PromotionAnswer {
        match self.record.read().await {
            Ok(record) => {
                let ours = record.filter(|r| r.same_claim(&self.promotion.record()));
                let answer = PromotionAnswer::Read {
                    ours: ours.is_some(),
                };
                self.written = ours.map(|r| r.version);
                answer
            }
            Err(e) => PromotionAnswer::Unknown {
                error: e.to_string(),
            },
        }
    }

    /// The record still holds this promotion's claim, written again since (by the target's
    /// agent: only the holder renews it).
    async fn consent(&self) -> PromotionAnswer {
        match self.record.read().await {
            Ok(Some(r)) if r.same_claim(&self.promotion.record()) => PromotionAnswer::Consent {
                given: self.written.as_deref() != Some(r.version.as_str()),
            },
            Ok(_) => PromotionAnswer::Read { ours: false },
            Err(e) => unknown(e.to_string()),
        }
    }

    async fn repoint(&mut self, pod: &str) -> PromotionAnswer {
        let Some(to) = self.links.addr(&self.promotion.target) else {
            return unknown(format!("{} has no address", self.promotion.target));
        };
        match repoint(&mut self.links, pod, &to).await {
            true => PromotionAnswer::Ok,
            false => unknown(format!("REPLICAOF on {pod} failed")),
        }
    }
}

fn unknown(error: String) -> PromotionAnswer {
    PromotionAnswer::Unknown { error }
}

async fn fence(links: &mut Links, pod: &str, ms: u64) -> PromotionAnswer {
    let cmd = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .clone();
    match links.command(pod, &cmd).await {
        Ok(_) => PromotionAnswer::Ok,
        Err(e) => {
            tracing::warn!(error = %e, "fencing an old master failed");
            unknown(e)
        }
    }
}

async fn promote_target(links: &mut Links, pod: &str) -> PromotionAnswer {
    match links.command(pod, &replicaof_no_one()).await {
        Ok(_) => PromotionAnswer::Ok,
        Err(e) => unknown(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;
    use std::net::SocketAddr;

    use valkey_sidecar_testkit::{ServerOptions, ValkeyServer};

    use super::*;
    use crate::valkey::Connector;

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

    fn links_to(pod: &str, addr: SocketAddr) -> Links {
        let connector = Connector {
            host: addr.ip().to_string(),
            port: addr.port(),
            username: None,
            password: None,
            tls: None,
            timeout: Duration::from_millis(150),
        };
        Links::new(BTreeMap::from([(pod.to_owned(), connector)]))
    }

    /// Real Valkeys for the members; the record's writes answered as written.
    struct Members(Links);

    impl Target for Members {
        async fn send(&mut self, command: &PromotionCommand) -> PromotionAnswer {
            match command {
                PromotionCommand::PromoteTarget { pod } => promote_target(&mut self.0, pod).await,
                PromotionCommand::AwaitConsent { .. } => PromotionAnswer::Consent { given: true },
                _ => PromotionAnswer::Ok,
            }
        }
    }

    /// A real replica, frozen (SIGSTOP) when the promotion starts and thawed 400 ms later: the
    /// first `REPLICAOF NO ONE` goes unanswered, a later try promotes it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unanswered_replicaof_no_one_is_tried_again() {
        let primary = ValkeyServer::start(ServerOptions::default()).unwrap();
        let replica =
            ValkeyServer::start(ServerOptions::default().replica_of(primary.addr())).unwrap();
        let members = Members(links_to("b", replica.addr()));
        replica.pause().unwrap();
        let out = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(400));
                replica.resume().unwrap();
            });
            tokio::task::block_in_place(|| {
                let promoting = PromotionRun::new(promotion("b"), 1000, 1000);
                let run = run(promoting, members, Clock::start(), || true);
                tokio::runtime::Handle::current().block_on(run)
            })
        });
        assert!(matches!(out, MoveOutcome::Done { .. }), "{out:?}");
        assert!(replica.is_primary().unwrap());
    }

    #[tokio::test]
    async fn no_replicaof_no_one_without_the_lease() {
        let replica = ValkeyServer::start(ServerOptions::default()).unwrap();
        replica.cmd(&["REPLICAOF", "127.0.0.1", "1"]).unwrap();
        let members = Members(links_to("b", replica.addr()));
        let promoting = PromotionRun::new(promotion("b"), 1000, 1000);
        let out = run(promoting, members, Clock::start(), || false).await;
        assert!(matches!(out, MoveOutcome::NoLease), "{out:?}");
        assert!(!replica.is_primary().unwrap());
    }
}
