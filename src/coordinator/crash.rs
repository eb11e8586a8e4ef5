//! Cluster mode: the coordinator's watch on every primary's socket, and the failover of one that died
//! (`core::crash`).
//!
//! The coordinator keeps one idle TCP connection to each primary serving slots. A process that dies
//! has its sockets closed by the kernel, so the watch sees the end at once — no poll, no
//! `cluster-node-timeout` — and dials again: refused means nothing listens there any more. A
//! Valkey that is slow, blocked or loading still accepts, and a silent node (power loss, a cut)
//! closes nothing; both are left to Valkey's own failure detection.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::runtime::reflector::Store;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};
use valkey_sidecar_core::crash as core_crash;
use valkey_sidecar_core::crash::{DeathVerdict, ReplicaOffset};
use valkey_sidecar_core::moves::Started;
use valkey_sidecar_core::observation::{self, Mode, Observation, Replies};
use valkey_sidecar_core::shards::{Shard, ShardNode};

use super::execute;
use super::{Coordinator, CoordinatorMemory, Finished, Move, spawn_move};
use crate::k8s::events::EventType;
use crate::valkey::{Connector, observe};

/// A primary whose socket refused a connection right after its connection closed.
#[derive(Debug, Clone)]
pub struct Death {
    pub node: String,
}

/// One dial of a watch.
const DIAL_LIMIT: Duration = Duration::from_secs(1);

/// Between dials that did not reach a verdict (a timeout, a connection closed at once).
const REDIAL_PAUSE: Duration = Duration::from_millis(250);

/// A watch connection that ends sooner than this after it opened ended "at once".
const QUICK_END: Duration = Duration::from_millis(100);

/// Reading a replica's offset: short, the shard takes no writes meanwhile.
const OFFSET_LIMIT: Duration = Duration::from_millis(300);

/// The watches, one per primary (node id → its address and task).
pub struct DeathWatch {
    watched: BTreeMap<String, ((String, u16), JoinHandle<()>)>,
    deaths: mpsc::Sender<Death>,
}

impl DeathWatch {
    pub fn new(deaths: mpsc::Sender<Death>) -> DeathWatch {
        DeathWatch {
            watched: BTreeMap::new(),
            deaths,
        }
    }

    /// Watches exactly the primaries serving slots in `shards`.
    pub fn track(&mut self, shards: &[Shard], connector: &Connector) {
        let wanted: BTreeMap<String, (String, u16)> = shards
            .iter()
            .filter(|s| !s.slots.is_empty())
            .filter_map(Shard::primary)
            .map(|p| {
                let c = connector.for_node(p);
                (p.id.clone(), (c.host, c.port))
            })
            .collect();
        self.watched.retain(|id, (addr, task)| {
            let keep = wanted.get(id) == Some(addr);
            if !keep {
                task.abort();
            }
            keep
        });
        for (id, addr) in wanted {
            if !self.watched.contains_key(&id) {
                let task = tokio::spawn(watch(id.clone(), addr.clone(), self.deaths.clone()));
                self.watched.insert(id, (addr, task));
            }
        }
    }

    /// Stops every watch (this agent no longer leads).
    pub fn clear(&mut self) {
        for (_, (_, task)) in std::mem::take(&mut self.watched) {
            task.abort();
        }
    }
}

impl Drop for DeathWatch {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Holds a connection to `addr` until it ends, then dials again; reports every refusal.
async fn watch(node: String, addr: (String, u16), deaths: mpsc::Sender<Death>) {
    let mut quick_ends = 0u32;
    loop {
        match dial(&addr).await {
            Ok(stream) => {
                quick_ends = if wait_closed(stream).await {
                    quick_ends + 1
                } else {
                    0
                };
                sleep(quick_pause(quick_ends)).await;
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                tracing::info!(%node, host = %addr.0, port = addr.1, "a primary's Valkey refuses connections");
                let death = Death { node: node.clone() };
                if deaths.send(death).await.is_err() {
                    return;
                }
                sleep(REDIAL_PAUSE).await;
            }
            // Reset while connecting (the same dying listener), or no answer: soon, then slower.
            Err(_) => {
                quick_ends += 1;
                sleep(quick_pause(quick_ends)).await;
            }
        }
    }
}

/// The pause before dialing again after `n` connections in a row that ended at once. A dying
/// process can close its connections a moment before its listening socket, so the first redial
/// may still be accepted and then reset: try again soon (5 ms), doubling up to [`REDIAL_PAUSE`]
/// so a server that always closes (e.g. protected mode) is not dialed in a tight loop.
fn quick_pause(n: u32) -> Duration {
    match n {
        0 => Duration::ZERO,
        n => (Duration::from_millis(5) * (1 << n.min(6))).min(REDIAL_PAUSE),
    }
}

async fn dial(addr: &(String, u16)) -> std::io::Result<TcpStream> {
    timeout(DIAL_LIMIT, TcpStream::connect((addr.0.as_str(), addr.1)))
        .await
        .unwrap_or_else(|_| Err(ErrorKind::TimedOut.into()))
}

/// Returns when the peer closes the connection (or it fails): whether that was at once (within
/// [`QUICK_END`] of opening). Anything Valkey sends unasked (an error before closing) is read and
/// dropped.
async fn wait_closed(mut stream: TcpStream) -> bool {
    let opened = tokio::time::Instant::now();
    let mut buf = [0u8; 512];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
    opened.elapsed() < QUICK_END
}

/// Each candidate's own offset (`INFO replication`'s `master_repl_offset`, which on a replica is
/// how far it has processed its primary's stream), whom it follows and whether its link is up,
/// read from the replica itself.
pub async fn offsets<'a>(
    replicas: impl Iterator<Item = &'a ShardNode>,
    connector: &Connector,
) -> Vec<ReplicaOffset> {
    let reads = replicas.map(|n| async move {
        let seen = observe_replica(&connector.for_node(n)).await;
        ReplicaOffset::read(&n.id, seen.as_ref())
    });
    join_all(reads).await
}

/// Another node's `INFO replication`, through the same parser as the agent's own ticks.
async fn observe_replica(connector: &Connector) -> Option<Observation> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("replication");
    let value = connector.ask(&cmd, OFFSET_LIMIT).await?;
    let replies = Replies {
        info: Some(observe::reply(value)),
        ..Replies::default()
    };
    observation::observe(&replies, Mode::Replication).ok()
}

impl Coordinator {
    /// A primary's Valkey died (`crash`): the coordinator fails its shard over at once to the replica
    /// with the highest offset, once per death, unless a move of that shard is under way.
    pub(super) async fn crashed(
        &self,
        death: Death,
        pods: Option<&Store<Pod>>,
        memory: &mut CoordinatorMemory,
        done: &mpsc::Sender<Finished>,
    ) {
        let now = self.clock.now();
        if !self.term.borrow().may_act(now) {
            return;
        }
        let Some(shards) = self.shards(now) else {
            tracing::warn!(node = %death.node, "a primary died; no fresh view of the cluster to fail it over from");
            return;
        };
        let pod = pods.and_then(|p| self.pod_of(&death.node, &shards, p));
        let seen = core_crash::Death {
            now,
            node: &death.node,
            shards: &shards,
            last_handled: memory.crashes.get(&death.node).copied(),
            terminating: pod.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        };
        let verdict = core_crash::decide(&seen, &memory.moves);
        if verdict.handled() {
            memory.crashes.insert(death.node.clone(), now);
        }
        let (shard, candidates) = match verdict {
            DeathVerdict::ReadOffsets { shard, candidates } => (shard, candidates),
            DeathVerdict::LeftToHandover => {
                tracing::info!(node = %death.node, "a primary's Valkey stopped with its pod: left to the hand-over");
                return;
            }
            DeathVerdict::Busy => {
                tracing::debug!(node = %death.node, "a primary died; its shard is already being moved");
                return;
            }
            DeathVerdict::NotServing | DeathVerdict::Repeated => return,
        };
        let offsets = offsets(candidates.into_iter(), &self.connector).await;
        let chosen = core_crash::target(shard, &death.node, &offsets);
        if core_crash::handled_after_reading(&offsets, chosen.is_ok()) {
            memory.crashes.insert(death.node.clone(), now);
        }
        match chosen {
            Ok(chosen) => self.force(chosen, &shards, pods, memory, done),
            Err(why) => {
                tracing::warn!(node = %death.node, %why, "a primary died; no replica to fail over to")
            }
        }
    }

    pub(super) fn force(
        &self,
        chosen: core_crash::CrashFailover,
        shards: &[Shard],
        pods: Option<&Store<Pod>>,
        memory: &mut CoordinatorMemory,
        done: &mpsc::Sender<Finished>,
    ) {
        let Some(node) = shards
            .iter()
            .flat_map(|s| &s.nodes)
            .find(|n| n.id == chosen.to)
        else {
            return;
        };
        let target = self.connector_of(node);
        let reference = pods
            .and_then(|p| self.pod_of(&chosen.dead, shards, p))
            .map(|p| p.object_ref(&()));
        let now = self.clock.now();
        memory.moves.start(&chosen.shard, Started::Unplanned, now);
        tracing::info!(shard = %chosen.shard, from = %chosen.dead, to = %chosen.to, reason = %chosen.reason, "starting a crash failover");
        self.event(
            reference.clone(),
            EventType::Warning,
            "CrashFailoverStarted",
            format!("{} → {}: {}", chosen.dead, chosen.to, chosen.reason),
        );
        let to = chosen.to.clone();
        let started = Move {
            shard: chosen.shard,
            to: chosen.to,
            from: None,
            kind: "CrashFailover",
            decision: None,
            reference,
        };
        let (lead, clock, limit) = (self.term.clone(), self.clock, self.handover_timeout);
        let elections = self.elections.clone();
        let run = async move {
            let may_act = || lead.borrow().may_act(clock.now());
            execute::force(&to, target, &elections, may_act, limit).await
        };
        spawn_move(started, run, done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_ends_are_retried_soon_then_ever_slower() {
        let ms = |n| quick_pause(n).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(2), ms(5), ms(6), ms(40)],
            [0, 10, 20, 160, 250, 250]
        );
    }
}
