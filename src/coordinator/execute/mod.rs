//! Carries out one move, one protocol a file: [`mod@handover`] (cluster mode's coordinated
//! `CLUSTER FAILOVER`, and a crash's forced one), [`mod@record_handover`] (replication mode's planned
//! move), [`promotion`] (replication mode's unplanned failover). This file holds what they share:
//! the [`MoveOutcome`], the [`Links`] to a shard's members, and the commands more than one of
//! them sends.
//!
//! - Cluster mode, [`mod@handover`]: driven by `core::handover::HandoverRun` — once every
//!   reachable member of the shard knows the target (gossip), a coordinated `CLUSTER FAILOVER`
//!   sent to the target replica, then a wait until the target reports itself primary. Never
//!   `FORCE` or `TAKEOVER` for a planned move: it must lose nothing, and a coordinated failover
//!   makes the target catch up with the primary (which pauses its clients) before it switches.
//! - Replication mode, [`mod@record_handover`]: a planned move, driven by `core::replication::RecordHandoverRun` —
//!   pause the old primary, wait for the target to catch up, move the record, promote, repoint,
//!   unpause (or unpause and leave everything as it was).
//! - Replication mode, [`run_promotion`]: an unplanned failover (`core::replication::Promotion`) in its
//!   documented order: record first, then fence, promote, repoint.
//!
//! Every command that changes anything is preceded by a check of the cluster Lease's acting
//! deadline (`may_act`); past it the executor stops and sends nothing more. A hand-over stopped
//! that way leaves its pause on the old primary to expire by itself (at most twice the hand-over
//! timeout): lifting it without the Lease could undo the pause of a successor coordinator's own
//! switchover, and every agent's keeper resolves the rest from the record.

pub mod handover;
pub mod promotion;
pub mod record_handover;

use std::collections::BTreeMap;
use std::time::Duration;

use valkey_sidecar_core::info::Info;

use crate::k8s::KubeError;
use crate::valkey::{Connector, Session};

pub use handover::{Elections, force, handover};
pub use promotion::{Waits, run_promotion};
pub use record_handover::record_handover;

/// How one move ended.
#[derive(Debug)]
pub enum MoveOutcome {
    Done {
        took: Duration,
    },
    /// The acting deadline passed before a command could be sent: nothing more was done.
    NoLease,
    /// The hand-over was undone: writes resumed on the old primary, the record is unchanged.
    RolledBack(String),
    /// The record changed since the decision (a 409): nothing was done.
    Conflict(String),
    Failed(String),
}

impl MoveOutcome {
    /// The `result` label of metrics and of the last decision.
    pub fn result(&self) -> &'static str {
        match self {
            MoveOutcome::Done { .. } => "ok",
            MoveOutcome::NoLease => "no_lease",
            MoveOutcome::RolledBack(_) => "rolled_back",
            MoveOutcome::Conflict(_) => "conflict",
            MoveOutcome::Failed(_) => "failed",
        }
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
