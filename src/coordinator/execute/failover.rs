//! Cluster mode: a coordinated `CLUSTER FAILOVER` to the target replica once every reachable
//! member of the shard knows it, then a wait until it reports itself primary. Never `FORCE` or
//! `TAKEOVER` for a planned move: a coordinated failover makes the target catch up with the
//! primary (which pauses its clients) before it switches, so nothing is lost.

use std::time::Duration;

use tokio::time::Instant;
use valkey_sidecar_core::observation::{Role, role_reply};
use valkey_sidecar_core::plan::Action;
use valkey_sidecar_core::shards::parse_shards;

use super::MoveOutcome;
use crate::valkey::{Connector, Session, observe};

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
) -> MoveOutcome {
    let started = Instant::now();
    let known_by = (started + PEERS_KNOW_WITHIN).min(started + limit);
    if let Err(e) = known_by_peers(&action.to, peers, known_by).await {
        return MoveOutcome::Failed(e);
    }
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("FAILOVER");
    fail_over_to(target, &cmd, may_act, started, started + limit).await
}

/// Sends `cmd` (a `CLUSTER FAILOVER` variant) to the replica `target`, its Lease checked right
/// before, and waits until `deadline` for it to report itself primary; `started` times the move.
pub async fn fail_over_to(
    target: Connector,
    cmd: &redis::Cmd,
    may_act: impl Fn() -> bool,
    started: Instant,
    deadline: Instant,
) -> MoveOutcome {
    let addr = format!("{}:{}", target.host, target.port);
    let mut session = Session::new(target);
    // Connect first, so the lease check sits right before the command itself.
    if let Err(e) = session.connection().await {
        return MoveOutcome::Failed(format!("cannot reach {addr}: {e}"));
    }
    // The planner works from gossip, which can lag: a target that is already primary is done.
    if is_primary(&mut session).await {
        return MoveOutcome::Done {
            took: started.elapsed(),
        };
    }
    if !may_act() {
        return MoveOutcome::NoLease;
    }
    if let Err(e) = session.command(cmd).await {
        return MoveOutcome::Failed(format!("CLUSTER FAILOVER refused by {addr}: {e}"));
    }
    match wait_primary(&mut session, deadline).await {
        Ok(()) => MoveOutcome::Done {
            took: started.elapsed(),
        },
        Err(e) => MoveOutcome::Failed(e),
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
    let Ok(value) = session.command(&redis::cmd("ROLE")).await else {
        return false;
    };
    role_reply(&observe::reply(value)) == Some(Role::Primary)
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
