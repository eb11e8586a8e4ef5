//! The keeper's Valkey commands: fence (`CLIENT PAUSE … WRITE`), unfence, follow a primary
//! (`REPLICAOF`), and the one look at other pods it ever takes (before a bootstrap).

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use valkey_sidecar_core::observation::Mode;
use valkey_sidecar_core::replication::Successor;
use valkey_sidecar_core::time::Millis;

use super::{Keeper, KeeperMemory};
use crate::valkey::{Session, observe};
use valkey_sidecar_core::health::Outcome;

/// Pauses writes for `ms`; `CLIENT PAUSE … WRITE` still serves reads and lets the replication
/// stream drain, so replicas catch up while nobody can write.
pub(super) async fn fence(
    session: &mut Session,
    ms: u64,
    memory: &mut KeeperMemory,
    until: Millis,
) -> bool {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("PAUSE").arg(ms.max(1)).arg("WRITE");
    match session.command(&cmd).await {
        Ok(_) => {
            memory.fenced_until = Some(until);
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot fence my Valkey");
            false
        }
    }
}

pub(super) async fn unfence(session: &mut Session, memory: &mut KeeperMemory) -> bool {
    match session
        .command(&redis::cmd("CLIENT").arg("UNPAUSE").clone())
        .await
    {
        Ok(_) => {
            memory.fenced_until = None;
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot lift my fence");
            false
        }
    }
}

/// `REPLICAOF host port` (`to` is `host:port`); `unpause` also lifts a pause left behind, which is
/// safe once Valkey is a replica (it refuses writes) and needed for a later promotion.
pub(super) async fn replicate(
    session: &mut Session,
    to: &str,
    unpause: bool,
    memory: &mut KeeperMemory,
) -> bool {
    let Some((host, port)) = to.rsplit_once(':') else {
        tracing::warn!(to, "not a host:port address");
        return false;
    };
    let mut cmd = redis::cmd("REPLICAOF");
    cmd.arg(host).arg(port);
    if let Err(e) = session.command(&cmd).await {
        tracing::warn!(error = %e, to, "REPLICAOF failed");
        return false;
    }
    tracing::info!(to, "now replicating");
    if unpause {
        unfence(session, memory).await;
    }
    true
}

/// Whether another pod the shard's `selector` selects runs a master with data (asked directly,
/// each with a short timeout). Only called while no record exists, i.e. once per shard's life.
pub(super) async fn other_master_with_data(keeper: &Keeper, selector: &str) -> bool {
    let pods: Api<Pod> = Api::namespaced(keeper.client.clone(), &keeper.namespace);
    let params = ListParams::default().labels(selector);
    let listing = pods.list(&params);
    let list = match tokio::time::timeout(Duration::from_secs(2), listing).await {
        Ok(Ok(list)) => list.items,
        failed => {
            tracing::warn!(?failed, "cannot list the shard's pods");
            // Unknown: assume the worst, so nobody bootstraps over data it cannot see.
            return true;
        }
    };
    let others = list
        .iter()
        .filter(|p| p.metadata.name.as_deref() != Some(keeper.pod.as_str()))
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone());
    let asks = others.map(|ip| has_data_as_master(keeper, ip));
    join_all(asks).await.into_iter().any(|b| b)
}

async fn has_data_as_master(keeper: &Keeper, ip: String) -> bool {
    match look_at(keeper, ip, keeper.connector.port).await {
        Some(obs) => obs.master_with_data(),
        // A pod that does not answer holds nothing we could lose by bootstrapping.
        None => false,
    }
}

/// The recorded primary's Valkey at `addr` (`host:port`): its role and replication stream, which
/// the keeper compares with its own before following it (`core::replication::successor_wanted`).
/// `None` when it does not answer within half a second.
pub(super) async fn successor(keeper: &Keeper, addr: &str) -> Option<Successor> {
    let (host, port) = addr.rsplit_once(':')?;
    let obs = look_at(keeper, host.to_owned(), port.parse().ok()?).await?;
    Some(Successor::of(&obs))
}

/// One observation of another pod's Valkey, with the agent's own credentials.
async fn look_at(
    keeper: &Keeper,
    host: String,
    port: u16,
) -> Option<valkey_sidecar_core::observation::Observation> {
    let connector = crate::valkey::Connector {
        host,
        port,
        timeout: Duration::from_millis(500),
        ..keeper.connector.clone()
    };
    let mut session = Session::new(connector);
    let pipe = observe::pipeline(Mode::Replication);
    match observe::tick(&mut session, &pipe, Mode::Replication)
        .await
        .0
    {
        Outcome::Observed(obs) => Some(*obs),
        _ => None,
    }
}
