//! What the coordinator tells: its status for the Lease writer (`core::status`), drift and blocked
//! moves, Events on the pods they are about, and a follower's report that it does not lead.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use kube::runtime::reflector::{self, Store};
use valkey_sidecar_core::lease::{self, SuccessorSeat};
use valkey_sidecar_core::plan::{NodeInfo, Plan};
use valkey_sidecar_core::status::{self, Condition, Decision, Status};

use super::execute::MoveOutcome;
use super::{Coordinator, CoordinatorMemory, Move, replication_round};
use crate::k8s::events::{Event, EventType};
use crate::k8s::lease::StatusAnnotations;
use crate::k8s::pods::is_ready;

/// Wall-clock time for the status: humans read it, no decision does.
pub(super) fn wall_clock() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The last decision shows how its move ended (unless a newer one replaced it meanwhile).
pub(super) fn ended(memory: &mut CoordinatorMemory, done: &Move, result: &'static str) {
    let last = memory.last_decision.as_mut();
    let same = |d: &&mut Decision| d.shard == done.shard && Some(d.kind) == done.decision;
    if let Some(d) = last.filter(same) {
        d.result = result;
    }
}

/// The completion Event's type and note.
pub(super) fn completion(shard: &str, outcome: &MoveOutcome) -> (EventType, String) {
    match outcome {
        MoveOutcome::Done { took } => (
            EventType::Normal,
            format!("shard {shard} has a new primary after {took:?}"),
        ),
        MoveOutcome::NoLease => (
            EventType::Warning,
            format!("shard {shard}: lease lost before acting; nothing more done"),
        ),
        MoveOutcome::RolledBack(e) => (
            EventType::Warning,
            format!("shard {shard}: rolled back, the primary is unchanged: {e}"),
        ),
        MoveOutcome::Conflict(e) | MoveOutcome::Failed(e) => {
            (EventType::Warning, format!("shard {shard}: {e}"))
        }
    }
}

/// Pods labelled primary, by shard (`world::group`: `valkey.io/shard-index`): what the rule "a
/// shard without a labelled primary" reads, exported by the coordinator because it alone sees every pod
/// (a pod's own agent cannot report that its shard lacks a primary when that pod is gone).
fn labelled_primaries(pods: &[Arc<Pod>], key: &str, primary: &str) -> BTreeMap<String, i64> {
    super::world::group(pods)
        .into_iter()
        .map(|(shard, members)| {
            let labelled = members
                .iter()
                .filter(|p| {
                    let labels = p.metadata.labels.as_ref();
                    labels.and_then(|l| l.get(key)).map(String::as_str) == Some(primary)
                })
                .count();
            (shard, i64::try_from(labelled).unwrap_or(i64::MAX))
        })
        .collect()
}

impl Coordinator {
    /// A follower's round: it reports that it does not lead and forgets what it tracked, so that
    /// when it leads again the quiet periods start afresh instead of from a history it did not see.
    pub(super) fn follow(&self, memory: &mut CoordinatorMemory) {
        self.metrics.set_coordinating(false);
        self.metrics.drift(std::iter::empty());
        self.metrics.shard_primaries(&BTreeMap::new());
        // Only the holder reports the roll: a former holder's gauges must not keep an alert up.
        self.metrics.roll(0, false);
        self.metrics.holds(false, false);
        memory.roll_waiting = None;
        memory.asked = super::requests::Asked::default();
        self.publish(None, memory);
        memory.shards.clear();
        memory.drift.clear();
        memory.crashes.clear();
        // A formation round sends nothing once the term has ended; it is not waited for either.
        memory.formation = None;
        if let Some(d) = memory.deaths.as_mut() {
            d.clear();
        }
        // A new term reads every record afresh, so no expiry is judged on a history it missed.
        memory.repl = replication_round::State::default();
    }

    /// Drift into metrics, and an Event (on the pod it is about) when a drift first appears;
    /// blocked moves logged when they first appear.
    pub(super) fn report(&self, plan: &Plan, pods: &Store<Pod>, memory: &mut CoordinatorMemory) {
        self.metrics.drift(plan.drift.iter().map(|d| d.reason));
        let primaries = labelled_primaries(&pods.state(), &self.role_label, &self.primary_value);
        self.metrics.shard_primaries(&primaries);
        let now_drift: BTreeSet<(String, String)> = plan
            .drift
            .iter()
            .map(|d| (d.reason.to_owned(), d.message.clone()))
            .collect();
        for d in plan.drift.iter().filter(|d| {
            !memory
                .drift
                .contains(&(d.reason.to_owned(), d.message.clone()))
        }) {
            let pod = d.pod.as_deref().and_then(|p| self.pod_ref(pods, p));
            tracing::warn!(reason = d.reason, shard = %d.shard, message = %d.message, "placement drift");
            self.event(pod, EventType::Warning, d.reason, d.message.clone());
        }
        memory.drift = now_drift;
        let now_blocked: BTreeSet<String> = plan.blocked.iter().cloned().collect();
        for b in now_blocked.difference(&memory.blocked) {
            tracing::warn!(blocked = %b, "coordinator cannot act");
        }
        memory.blocked = now_blocked;
    }

    /// Hands the status to the Lease writer when it changed (the writer sends whatever is current
    /// with its next renewal); `None` clears it, so a lost Lease leaves nothing stale behind.
    pub(super) fn publish(
        &self,
        conditions: Option<Vec<Condition>>,
        memory: &mut CoordinatorMemory,
    ) {
        let next = conditions.map(|conditions| Status {
            conditions,
            last_decision: memory.last_decision.clone(),
            paused: memory.asked.paused.clone(),
            answer: memory.asked.answer.clone(),
        });
        if next == memory.status {
            return;
        }
        let annotations = next.as_ref().map_or_else(StatusAnnotations::new, |s| {
            status::annotations(s, &wall_clock())
        });
        memory.status = next;
        self.status.send_replace(annotations);
    }

    /// Names the pods that take over first should this term end (`core::lease::successors`):
    /// the next renewal carries them.
    pub(super) fn name_successors(&self, pods: &Store<Pod>, nodes: &BTreeMap<String, NodeInfo>) {
        let Some(holder) = self.term.borrow().holder.clone() else {
            return;
        };
        let me = lease::identity_pod(&holder);
        let seats: Vec<SuccessorSeat> = pods
            .state()
            .iter()
            .map(|p| successor_seat(p, nodes))
            .collect();
        self.successors.set(lease::successors(&seats, me));
    }

    /// Events go to the old primary's pod when known, else they are only logged.
    /// A reference to the cluster's pod `name`, for an Event.
    pub(super) fn pod_ref(&self, pods: &Store<Pod>, name: &str) -> Option<ObjectReference> {
        let key = reflector::ObjectRef::new(name).within(&self.namespace);
        pods.get(&key).map(|p| p.object_ref(&()))
    }

    pub(super) fn event(
        &self,
        reference: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let (Some(recorder), Some(reference)) = (self.recorder.clone(), reference) else {
            return;
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Coordinate".into(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(error = %e, "event not published");
            }
        });
    }
}

/// A pod as a successor: usable when Ready, not being deleted, on a usable node (or one
/// without facts).
fn successor_seat(p: &Pod, nodes: &BTreeMap<String, NodeInfo>) -> SuccessorSeat {
    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
    let node_usable = node
        .as_ref()
        .and_then(|n| nodes.get(n))
        .is_none_or(NodeInfo::usable);
    let alive = p.metadata.deletion_timestamp.is_none() && is_ready(p);
    SuccessorSeat {
        pod: p.metadata.name.clone().unwrap_or_default(),
        node,
        usable: alive && node_usable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, labels: &[(&str, &str)]) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        Arc::new(p)
    }

    #[test]
    fn a_shard_whose_primary_label_is_gone_counts_zero() {
        let pods = [
            pod(
                "v-0-0",
                &[
                    ("valkey.io/shard-index", "0"),
                    ("valkey.io/role", "primary"),
                ],
            ),
            pod(
                "v-0-1",
                &[
                    ("valkey.io/shard-index", "0"),
                    ("valkey.io/role", "replica"),
                ],
            ),
            pod(
                "v-1-0",
                &[
                    ("valkey.io/shard-index", "1"),
                    ("valkey.io/role", "replica"),
                ],
            ),
            pod("v-1-1", &[("valkey.io/shard-index", "1")]),
            // Another policy's value is not this deployment's primary.
            pod(
                "v-2-0",
                &[("valkey.io/shard-index", "2"), ("valkey.io/role", "master")],
            ),
        ];
        let counts = labelled_primaries(&pods, "valkey.io/role", "primary");
        let want: BTreeMap<String, i64> = [("0", 1), ("1", 0), ("2", 0)]
            .into_iter()
            .map(|(s, n)| (s.to_owned(), n))
            .collect();
        assert_eq!(counts, want);
    }
}
