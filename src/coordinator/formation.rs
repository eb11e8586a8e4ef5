//! Cluster mode with `SIDECAR_CLUSTER_SHARDS`: the leader forms a fresh Valkey Cluster from the
//! deployment's pods and brings pods that come back empty into it again. The decisions are
//! `core::formation::plan`; this module observes every pod's Valkey and sends the steps.
//!
//! It runs while the local node's `CLUSTER SHARDS` misses one of the pods (by IP, among the nodes
//! not marked failed), after a round that sent steps or met a silent pod, and otherwise every
//! [`RECHECK_MS`] (other nodes' own views show only in theirs) — at most once a second, which leaves
//! gossip time to spread a `CLUSTER MEET` between rounds.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::runtime::events::EventType;
use valkey_sidecar_core::formation::{ClusterNode, FormationView, Seat, Step, plan};
use valkey_sidecar_core::observation::{self, Mode, Observation, Role};
use valkey_sidecar_core::shards::{NodeHealth, Shard};
use valkey_sidecar_core::time::Millis;

use super::Coordinator;
use super::world::{SHARD_INDEX_LABEL, pod_ip};
use crate::valkey::{Connector, Session, observe};

/// Between two formation rounds: a `CLUSTER MEET` needs a gossip round or two to spread.
pub const PERIOD_MS: u64 = 1_000;

/// A formation round runs at least this often while leading, whatever the leader's own view says.
pub const RECHECK_MS: u64 = 30_000;

/// How long one pod's observation may take in a formation round.
const OBSERVE_TIMEOUT: Duration = Duration::from_millis(500);

/// Whether the local node's view of the cluster leaves formation something to do: a pod it does
/// not know (among the nodes not marked failed), a master that owns no slots (not yet a replica),
/// or a node marked failed (perhaps a replaced pod's old identity, to forget).
pub fn incomplete(local: &[Shard], pods: &[Arc<Pod>]) -> bool {
    let nodes = || {
        local
            .iter()
            .flat_map(|s| s.nodes.iter().map(move |n| (s, n)))
    };
    let failed = nodes().any(|(_, n)| n.health == NodeHealth::Failed);
    let slotless = nodes().any(|(s, n)| n.role == Role::Primary && s.slots.is_empty());
    let known: BTreeSet<&str> = nodes()
        .filter(|(_, n)| n.health != NodeHealth::Failed)
        .map(|(_, n)| n.ip.as_str())
        .collect();
    let missing = pods
        .iter()
        .filter_map(|p| pod_ip(p))
        .any(|ip| !known.contains(ip));
    failed || slotless || missing
}

impl Coordinator {
    /// One formation round: observe every pod, plan, send the steps in order. Whether it sent
    /// any or a pod did not answer: the next round then runs even if the local view looks whole,
    /// since other nodes' views (a node naming itself by its old address, say) show only in
    /// theirs.
    pub(super) async fn formation_round(
        &self,
        shards: u32,
        pods: &[Arc<Pod>],
        now: Millis,
    ) -> bool {
        let seats = join_all(pods.iter().map(|p| self.seat(p))).await;
        let f = plan(&FormationView { shards, seats });
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
        for step in &f.steps {
            self.send(step, pods).await;
        }
        true
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

    async fn seat(&self, p: &Arc<Pod>) -> Seat {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let ip = pod_ip(p).map(str::to_owned);
        let node = match &ip {
            Some(ip) => self.observe_pod(ip).await,
            None => None,
        };
        Seat {
            pod: p.metadata.name.clone().unwrap_or_default(),
            shard: labels.get(SHARD_INDEX_LABEL).and_then(|s| s.parse().ok()),
            index: crate::replication::node_index(&labels),
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

    async fn observe_pod(&self, ip: &str) -> Option<ClusterNode> {
        let mut session = Session::new(self.connector_at(ip));
        let values = session
            .query(&observe::pipeline(Mode::Cluster))
            .await
            .ok()?;
        let replies = observe::replies(values);
        cluster_node(&observation::observe(&replies, Mode::Cluster).ok()?)
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
        self.metrics.formation_step(kind(step), result.is_ok());
        match result {
            Ok(_) => tracing::info!(pod, step = ?step, "formation step"),
            Err(e) => tracing::warn!(pod, step = ?step, error = %e, "formation step failed"),
        }
    }
}

/// What formation needs of a node's own observation; `None` for a node that is loading or not
/// in cluster mode.
pub fn cluster_node(obs: &Observation) -> Option<ClusterNode> {
    let view = obs.cluster.as_ref().filter(|c| c.enabled && !obs.loading)?;
    let id = view.my_id.clone()?;
    let mine = view
        .shards
        .iter()
        .find(|s| s.nodes.iter().any(|n| n.id == id));
    let primary = mine
        .and_then(|s| {
            s.nodes
                .iter()
                .find(|n| n.role == Role::Primary && n.id != id)
        })
        .map(|n| n.id.clone());
    let owns_slots = obs.role == Role::Primary && mine.is_some_and(|s| !s.slots.is_empty());
    let knows = view
        .shards
        .iter()
        .flat_map(|s| s.nodes.iter().map(|n| n.id.clone()));
    let listed = || view.shards.iter().flat_map(|s| &s.nodes);
    let failed = listed().filter(|n| n.health == NodeHealth::Failed);
    Some(ClusterNode {
        knows: knows.chain([id.clone()]).collect(),
        failed: failed.map(|n| n.id.clone()).collect(),
        addrs: listed().map(|n| (n.id.clone(), n.ip.clone())).collect(),
        id,
        role: obs.role,
        owns_slots,
        primary: primary.filter(|_| obs.role == Role::Replica),
    })
}

fn kind(step: &Step) -> &'static str {
    match step {
        Step::SetEpoch { .. } => "set_config_epoch",
        Step::AssignSlots { .. } => "addslots",
        Step::Meet { .. } => "meet",
        Step::Replicate { .. } => "replicate",
        Step::Forget { .. } => "forget",
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
    };
    (pod, cmd)
}
