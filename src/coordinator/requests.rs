//! The operator's requests (`core::requests`), as the Lease writer found them on the coordinator
//! Lease: a pause becomes the world's `paused`, a switchover the world's `Ask` (the pods of the
//! shard index it names); the planner's refusal or the move's end becomes the answer the status
//! carries, and the request is consumed so the next write drops it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use valkey_sidecar_core::plan::{Ask, Kind, Plan, World};
use valkey_sidecar_core::requests::{Outcome, SwitchoverAnswer, SwitchoverRequest};

use super::execute::MoveOutcome;
use super::report::completion;
use super::world::shard_of;
use super::{Coordinator, CoordinatorMemory, Move};

/// What the holder keeps of the requests between rounds.
#[derive(Debug, Default)]
pub(super) struct Asked {
    /// The pause honoured now (the request's value).
    pub(super) paused: Option<String>,
    /// The id of the switchover request the planner sees this round.
    pending: Option<String>,
    /// The id of the switchover under way and its pods (`from → to`), answered when it ends.
    running: Option<(String, String)>,
    /// The last answer, carried in the status until the next one.
    pub(super) answer: Option<SwitchoverAnswer>,
}

impl Coordinator {
    /// The pause and the switchover asked for, for this round's world; an unreadable switchover
    /// request is refused here (and consumed) rather than half-understood.
    pub(super) fn asked(&self, pods: &Store<Pod>, memory: &mut CoordinatorMemory) -> Option<Ask> {
        let requests = self.requests.get();
        let asked = &mut memory.asked;
        asked.paused = requests.paused;
        asked.pending = None;
        match requests.switchover? {
            Ok(r) if asked.running.as_ref().is_some_and(|(id, _)| *id == r.id) => None,
            Ok(r) => {
                asked.pending = Some(r.id.clone());
                Some(ask(r, &pods.state()))
            }
            Err(bad) => {
                let id = "unreadable".to_owned();
                self.answer(memory, id, Outcome::Refused, format!("bad request: {bad}"));
                None
            }
        }
    }

    /// The planner refused the switchover asked for, or started it (the move answers at its end).
    pub(super) fn answer_plan(&self, plan: &Plan, world: &World, memory: &mut CoordinatorMemory) {
        if let Some((id, reason)) = &plan.refused {
            self.answer(memory, id.clone(), Outcome::Refused, reason.clone());
        } else if let Some(a) = plan.actions.iter().find(|a| a.kind == Kind::Switchover) {
            let pods = format!("{} → {}", pod_of(world, &a.from), pod_of(world, &a.to));
            memory.asked.running = memory.asked.pending.take().map(|id| (id, pods));
            self.requests.consume();
        }
    }

    /// A move ended: if it was the switchover asked for, that is its answer.
    pub(super) fn answer_move(
        &self,
        started: &Move,
        outcome: &MoveOutcome,
        memory: &mut CoordinatorMemory,
    ) {
        if started.decision != Some(Kind::Switchover) {
            return;
        }
        let Some((id, pods)) = memory.asked.running.take() else {
            return;
        };
        let (verdict, message) = match outcome {
            MoveOutcome::Done { took } => {
                (Outcome::Done, format!("{pods}, new primary after {took:?}"))
            }
            _ => (
                Outcome::Failed,
                format!("{pods}: {}", completion(&started.shard, outcome).1),
            ),
        };
        self.answer(memory, id, verdict, message);
    }

    fn answer(
        &self,
        memory: &mut CoordinatorMemory,
        id: String,
        outcome: Outcome,
        message: String,
    ) {
        tracing::info!(%id, outcome = outcome.as_str(), %message, "switchover request answered");
        self.requests.consume();
        memory.asked.answer = Some(SwitchoverAnswer {
            id,
            outcome,
            message,
        });
    }
}

/// The pod of a Valkey node, by name (its node id when it has none).
fn pod_of<'a>(world: &'a World, id: &'a str) -> &'a str {
    let member = world.members.iter().find(|m| m.id == id);
    member
        .and_then(|m| m.pod.as_ref())
        .map_or(id, |p| p.name.as_str())
}

/// The request with the names of the pods of the shard index it names (a pod without the index
/// label is in shard 0, as everywhere).
fn ask(r: SwitchoverRequest, pods: &[Arc<Pod>]) -> Ask {
    let pods = pods
        .iter()
        .filter(|p| shard_of(p) == r.shard)
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    Ask {
        id: r.id,
        shard: r.shard,
        pods,
        to: r.to,
    }
}
