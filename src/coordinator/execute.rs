//! Carries out one planned move: a coordinated `CLUSTER FAILOVER` sent to the target replica,
//! then waits until the target reports itself primary.
//!
//! Never `FORCE` or `TAKEOVER`: a planned move must lose nothing, and a coordinated failover
//! makes the target catch up with the primary (which pauses its clients) before it switches.

use std::time::Duration;

use tokio::time::Instant;
use valkey_sidecar_core::plan::Action;

use crate::valkey::{Connector, Session};

/// How one move ended.
#[derive(Debug)]
pub enum Outcome {
    Done {
        took: Duration,
    },
    /// The acting deadline passed before the command could be sent: nothing was done.
    NoLease,
    Failed(String),
}

/// Sends the failover to `target` (the replica's address) and waits for its role to flip.
pub async fn failover(
    action: &Action,
    target: Connector,
    may_act: impl Fn() -> bool,
    limit: Duration,
) -> Outcome {
    let started = Instant::now();
    let mut session = Session::new(target);
    // Connect first, so the lease check sits right before the command itself.
    if let Err(e) = session.connection().await {
        return Outcome::Failed(format!("cannot reach {}: {e}", action.to));
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
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("FAILOVER");
    if let Err(e) = session.command(&cmd).await {
        return Outcome::Failed(format!("CLUSTER FAILOVER refused by {}: {e}", action.to));
    }
    match wait_primary(&mut session, started + limit).await {
        Ok(()) => Outcome::Done {
            took: started.elapsed(),
        },
        Err(e) => Outcome::Failed(e),
    }
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
