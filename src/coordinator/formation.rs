//! Cluster mode with `SIDECAR_CLUSTER_SHARDS`: the coordinator forms a fresh Valkey Cluster from the
//! deployment's pods and brings pods that come back empty into it again. The decisions are
//! `core::formation::decide`; this module observes every pod's Valkey and sends the steps.
//!
//! It runs while the local node's `CLUSTER SHARDS` misses one of the pods (by IP, among the nodes
//! not marked failed), after a round that sent steps or met a silent pod, and otherwise every
//! [`RECHECK_MS`](valkey_sidecar_core::formation::RECHECK_MS) (other nodes' own views show only in theirs) — at most once a second, which leaves
//! gossip time to spread a `CLUSTER MEET` between rounds.
//!
//! A round reads a pod's whole map only where the pod's short answers disagree with the local
//! map, or in its turn (`core::formation::LocalMap::vouch`, `audited`): reading every pod's would
//! cost a round pods × nodes.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use valkey_sidecar_core::formation::{
    ClusterNode, FormationView, Glance, LocalMap, Pool, Seat, Step, audited, batches, decide,
};
use valkey_sidecar_core::observation::{self, Mode};
use valkey_sidecar_core::shards::Shard;
use valkey_sidecar_core::time::Millis;

use super::Coordinator;
use crate::k8s::events::EventType;
use crate::k8s::pods::{SHARD_INDEX_LABEL, node_index, pod_ip};
use crate::runtime::task::Owned;
use crate::valkey::{Connector, Session, observe};

/// Steps sent at once in a formation round: at 50 shards, after a drain, every pod forgets
/// each replaced identity, and one at a time under load took ~2 s a step.
const SEND_PARALLEL: usize = 16;

/// After this long sending, a formation round leaves its deferrable steps (introductions,
/// forgets) for the next round: the coordinator's loop waits for it.
const SEND_BUDGET: Duration = Duration::from_secs(2);

/// How long one pod's observation may take in a formation round.
const OBSERVE_TIMEOUT: Duration = Duration::from_millis(500);

/// Pods observed at once in a formation round. A pod read in full holds its whole cluster map as
/// replies until it is reduced to a [`ClusterNode`] (an estimated ~0.5 MB at 100 nodes, growing
/// with the nodes): all pods at once made a round's memory grow with pods × nodes.
const OBSERVE_PARALLEL: usize = 16;

/// What a formation round works from: the shard count, the pods (in name order, for
/// [`audited`]), the local node's map, and the round's number.
pub(super) struct RoundInput {
    pub shards: u32,
    pub pods: Vec<Arc<Pod>>,
    pub local: Option<Vec<Shard>>,
    pub number: u64,
}

/// How a formation round observed one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Its short answers agreed with the local map, which stands for its own.
    Vouched,
    /// They disagreed (or were missing): its whole map was read.
    Disagreed,
    /// Its turn to be read in full whatever it answers.
    Audit,
}

impl Read {
    fn kind(self) -> &'static str {
        match self {
            Read::Vouched => "vouched",
            Read::Disagreed => "disagreed",
            Read::Audit => "audit",
        }
    }
}

impl Coordinator {
    /// One formation round: observe every pod, plan, send the steps in order. Whether it sent
    /// any or a pod did not answer: the next round then runs even if the local view looks whole,
    /// since other nodes' views (a node naming itself by its old address, say) show only in
    /// theirs.
    pub(super) async fn formation_round(&self, mut input: RoundInput, now: Millis) -> bool {
        input
            .pods
            .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let (shards, pods) = (input.shards, &input.pods);
        let local = LocalMap::new(input.local.as_deref().unwrap_or_default());
        let seats = self.seats(pods, &local, input.number).await;
        let f = decide(&FormationView { shards, seats });
        if f.steps.is_empty() {
            tracing::debug!(reason = %f.reason, at = now.0, "formation");
            return f.silent;
        }
        tracing::info!(reason = %f.reason, steps = f.steps.len(), "forming the cluster");
        if f.steps
            .iter()
            .any(|s| matches!(s, Step::AssignSlots { .. }))
        {
            self.announce_fresh(shards, pods);
        }
        self.send_all(&f.steps, pods).await;
        true
    }

    /// The steps batch by batch (`core::formation::batches`), [`SEND_PARALLEL`] at a time, while
    /// the coordinator term lasts. The coordinator's loop waits for the round, crash failovers
    /// and hand-overs included: past [`SEND_BUDGET`] the deferrable steps are left for the next
    /// round, a second later.
    async fn send_all(&self, steps: &[Step], pods: &[Arc<Pod>]) {
        let deadline = tokio::time::Instant::now() + SEND_BUDGET;
        let mut sent = 0;
        for batch in batches(steps) {
            for chunk in batch.chunks(SEND_PARALLEL) {
                // A round can outlast the term (observing 100 pods under load took 11 s in the
                // 50-shard bench, and the term ended meanwhile): only the holder sends steps.
                if !self.term.borrow().may_act(self.clock.now()) {
                    tracing::info!(
                        "the coordinator term ended during a formation round: not sending its steps"
                    );
                    return;
                }
                if chunk[0].deferrable() && tokio::time::Instant::now() >= deadline {
                    let left = steps.len() - sent;
                    tracing::info!(left, "formation round out of time: the rest next round");
                    return;
                }
                futures::future::join_all(chunk.iter().map(|step| self.send(step, pods))).await;
                sent += chunk.len();
            }
        }
    }

    /// A fresh formation says so in an Event; where the Lease says a cluster was formed before,
    /// every node came back without data (no persistence, or volumes lost): that data is gone.
    fn announce_fresh(&self, shards: u32, pods: &[Arc<Pod>]) {
        let reference = pods.first().map(|p| p.object_ref(&()));
        match self.formed.get() {
            Some(at) => {
                let note = format!(
                    "every pod came back without data or cluster state: forming a fresh, empty cluster of {shards} shards; the data of the cluster formed at {at} is gone (no persistence, or its volumes were lost)"
                );
                tracing::error!(formed = %at, "{note}");
                self.event(reference, EventType::Warning, "ClusterDataLost", note);
            }
            None => {
                let note = format!("forming a fresh cluster of {shards} shards");
                self.event(reference, EventType::Normal, "ClusterFormed", note);
            }
        }
    }

    /// Every pod's seat, [`OBSERVE_PARALLEL`] observed at a time, equal listings shared.
    async fn seats(&self, pods: &[Arc<Pod>], local: &LocalMap, round: u64) -> Vec<Seat> {
        let mut pool = Pool::default();
        let count = pods.len();
        // Owned pods: a closure over borrowed ones is not `Send` for the round's task (a
        // higher-ranked lifetime the compiler cannot prove general).
        let mut observed = futures::stream::iter(pods.iter().cloned().enumerate())
            .map(|(i, p)| async move { self.seat(&p, local, audited(i, count, round)).await })
            .buffered(OBSERVE_PARALLEL);
        let mut seats = Vec::with_capacity(pods.len());
        while let Some(mut seat) = observed.next().await {
            if let Some(node) = seat.node.as_mut() {
                pool.share(node);
            }
            seats.push(seat);
        }
        seats
    }

    async fn seat(&self, p: &Arc<Pod>, local: &LocalMap, audit: bool) -> Seat {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let ip = pod_ip(p).map(str::to_owned);
        let node = match &ip {
            Some(ip) => {
                let (node, read) = read_pod(self.connector_at(ip), local, audit).await;
                let kind = if node.is_some() {
                    read.kind()
                } else {
                    "silent"
                };
                self.metrics.formation_read(kind);
                node
            }
            None => None,
        };
        Seat {
            pod: p.metadata.name.clone().unwrap_or_default(),
            shard: labels.get(SHARD_INDEX_LABEL).and_then(|s| s.parse().ok()),
            index: node_index(&labels),
            addr: ip.map(|ip| (ip, self.connector.port)),
            node,
        }
    }

    fn connector_at(&self, host: &str) -> Connector {
        Connector {
            host: host.to_owned(),
            timeout: OBSERVE_TIMEOUT.min(self.connector.timeout),
            ..self.connector.clone()
        }
    }

    async fn send(&self, step: &Step, pods: &[Arc<Pod>]) {
        let (pod, cmd) = command(step);
        let Some(ip) = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(pod))
            .and_then(|p| pod_ip(p))
        else {
            return;
        };
        let mut session = Session::new(Connector {
            timeout: self.connector.timeout,
            ..self.connector_at(ip)
        });
        let result = session.command(&cmd).await;
        self.metrics.formation_step(step.kind(), result.is_ok());
        match result {
            Ok(_) => tracing::info!(pod, step = ?step, reason = %step.reason(), "formation step"),
            Err(e) => {
                tracing::warn!(pod, step = ?step, reason = %step.reason(), error = %e, "formation step failed");
            }
        }
    }
}

/// One pod's node for a formation round (`connector` at its address): its short answers, where
/// `local` vouches for them, else (or when `audit`) its whole map. `None`: silent, loading, or
/// not in cluster mode.
pub async fn read_pod(
    connector: Connector,
    local: &LocalMap,
    audit: bool,
) -> (Option<ClusterNode>, Read) {
    let ip = connector.host.clone();
    let mut session = Session::new(connector);
    if !audit {
        let Ok(values) = session.query(&observe::glance_pipeline()).await else {
            return (None, Read::Disagreed);
        };
        let replies: Vec<_> = values.into_iter().map(observe::reply).collect();
        let glance = Glance::answered(&replies);
        if let Some(node) = glance.and_then(|g| local.vouch(&g, &ip)) {
            return (Some(node), Read::Vouched);
        }
    }
    let read = if audit { Read::Audit } else { Read::Disagreed };
    (whole(&mut session).await, read)
}

/// The node as its whole map shows it.
async fn whole(session: &mut Session) -> Option<ClusterNode> {
    let values = session
        .query(&observe::pipeline(Mode::Cluster))
        .await
        .ok()?;
    let replies = observe::replies(values);
    ClusterNode::observed(&observation::observe(&replies, Mode::Cluster).ok()?)
}

/// The end of the formation round running, if any: whether it sent steps or met a silent pod
/// (`false` for a round that panicked: logged, and the next one runs when due).
pub(super) async fn ended(round: &mut Option<Owned<bool>>) -> bool {
    let Some(round) = round.as_mut() else {
        return std::future::pending().await;
    };
    round.join().await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "a formation round ended abnormally");
        false
    })
}

impl super::CoordinatorMemory {
    /// The round is over: the next may start, at once if this one sent steps.
    pub(super) fn formation_ended(&mut self, forming: bool) {
        self.formation = None;
        self.forming = forming;
    }
}

/// The pod a step goes to and its command.
fn command(step: &Step) -> (&str, redis::Cmd) {
    let mut cmd = redis::cmd("CLUSTER");
    let pod = match step {
        Step::SetEpoch { pod, epoch } => {
            cmd.arg("SET-CONFIG-EPOCH").arg(*epoch);
            pod
        }
        Step::AssignSlots { pod, from, to } => {
            cmd.arg("ADDSLOTSRANGE").arg(*from).arg(*to);
            pod
        }
        Step::Meet { pod, ip, port } => {
            cmd.arg("MEET").arg(ip).arg(*port);
            pod
        }
        Step::Replicate { pod, primary } => {
            cmd.arg("REPLICATE").arg(primary);
            pod
        }
        Step::Forget { pod, id } => {
            cmd.arg("FORGET").arg(id);
            pod
        }
        Step::Reset { pod } => {
            cmd.arg("RESET").arg("HARD");
            pod
        }
    };
    (pod, cmd)
}
