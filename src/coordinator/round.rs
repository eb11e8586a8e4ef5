//! Cluster mode's round: the view from the local Valkey's `CLUSTER SHARDS`, formation when the
//! view misses a pod, the planner's world and decision, and each planned move started and booked
//! (`core::moves`) until it lands.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use kube::runtime::reflector::Store;
use tokio::sync::mpsc;
use valkey_sidecar_core::formation;
use valkey_sidecar_core::moves::Started;
use valkey_sidecar_core::plan::{Action, Member, World, decide, track};
use valkey_sidecar_core::shards::{NodeHealth, Shard, ShardNode};
use valkey_sidecar_core::status::{self, Decision};
use valkey_sidecar_core::time::Millis;

use super::execute::MoveOutcome;
use super::formation::RoundInput;
use super::report::{completion, ended, wall_clock};
use super::watches::Facts;
use super::{Coordinator, CoordinatorMemory, Finished, Move, execute, spawn_move, world};
use crate::k8s::events::EventType;
use crate::k8s::pods::pod_ip;
use crate::runtime::clock::{thread_cpu, thread_cpu_since};
use crate::runtime::task::Owned;
use crate::valkey::Connector;

impl Coordinator {
    /// With `SIDECAR_CLUSTER_SHARDS`: a formation round when `core::formation::round_due` says so,
    /// started beside the loop unless one is still running.
    pub(super) fn form_if_incomplete(&self, pods: &Store<Pod>, memory: &mut CoordinatorMemory) {
        let Some(shards) = self.formation_shards.filter(|_| memory.formation.is_none()) else {
            return;
        };
        let now = self.clock.now();
        let pods = pods.state();
        let local = self.shards(now);
        if local.iter().flatten().any(|s| !s.slots.is_empty()) {
            self.formed.set_if_unset(wall_clock);
        }
        let ips = pods.iter().filter_map(|p| pod_ip(p));
        let incomplete = local
            .as_deref()
            .is_some_and(|local| formation::incomplete(local, ips));
        if formation::round_due(memory.formed_at, incomplete, memory.forming, now) {
            memory.formed_at = Some(now);
            memory.formation_rounds += 1;
            let input = RoundInput {
                shards,
                pods,
                local,
                number: memory.formation_rounds,
            };
            let this = self.clone();
            let round = async move { this.formation_round(input, now).await };
            memory.formation = Some(Owned::spawn(round));
        }
    }

    /// The shards as the local Valkey sees them, if the observation is fresh and read its map on
    /// that tick: an agent that just began to lead may still hold a map carried for seconds
    /// (`core::cluster_map`), and its next tick, at once, reads a new one.
    pub(super) fn shards(&self, now: Millis) -> Option<Vec<Shard>> {
        let state = self.state.borrow();
        let cluster = state.current(now, &self.bounds)?.cluster.as_ref()?;
        cluster.fresh_map.then(|| cluster.shards.clone())
    }

    pub(super) async fn round(
        &self,
        pods: &Store<Pod>,
        facts: Facts,
        memory: &mut CoordinatorMemory,
        done: &mpsc::Sender<Finished>,
    ) {
        let now = self.clock.now();
        let coordinating = self.term.borrow().may_act(now);
        self.metrics.set_coordinating(coordinating);
        let Some(shards) = self.shards(now) else {
            self.publish(coordinating.then(status::without_view), memory);
            return;
        };
        if let Some(d) = memory.deaths.as_mut().filter(|_| coordinating) {
            d.track(&shards, &self.connector);
        }
        let started = std::time::Instant::now();
        let cpu = coordinating.then(thread_cpu).flatten();
        let members = world::members(&shards, &pods.state());
        let world = self.world(members, (pods, facts), memory, now, coordinating);
        let plan = decide(&world, &self.policy);
        self.answer_plan(&plan, &world, memory);
        self.report(&plan, pods, memory);
        let conditions = coordinating.then(|| status::conditions(&world, &self.policy, &plan));
        self.report_roll(&world, &plan, pods, memory);
        if coordinating {
            self.metrics
                .coordinator_round(started.elapsed(), thread_cpu_since(cpu));
        }
        self.evict_outdated(&plan.replacements, pods, memory).await;
        for action in plan.actions {
            self.start(action, &shards, pods, memory, done);
        }
        self.publish(conditions, memory);
        if coordinating {
            self.clear_dead_labels(&world, pods, &mut memory.label_retry)
                .await;
        }
    }

    /// The planner's world from this round's members; settles finished moves the members now
    /// show and folds them into the per-shard memory (quiet periods).
    pub(super) fn world(
        &self,
        mut members: Vec<Member>,
        (pods, facts): (&Store<Pod>, Facts),
        memory: &mut CoordinatorMemory,
        now: Millis,
        coordinating: bool,
    ) -> World {
        for pod in members.iter_mut().filter_map(|m| m.pod.as_mut()) {
            pod.updated = facts.revisions.get(&pod.name).copied();
        }
        let replacing = self.replacing(pods, memory, now);
        let switchover = self.asked(pods, memory);
        let operator_busy = facts.operator_busy;
        self.metrics.holds(
            coordinating && memory.asked.paused.is_some(),
            coordinating && operator_busy,
        );
        memory.moves.settle(&members, now);
        memory.shards = track(&memory.shards, &members, now);
        World {
            now,
            coordinating,
            members,
            nodes: facts.nodes,
            steady_since: memory
                .shards
                .iter()
                .map(|(k, v)| (k.clone(), v.steady_since))
                .collect(),
            primary_since: memory
                .shards
                .iter()
                .map(|(k, v)| (k.clone(), v.primary_since))
                .collect(),
            in_flight: memory.moves.in_flight(),
            last_move: memory.moves.last_move(),
            pending: world::pending(&pods.state()),
            replacing,
            paused: memory.asked.paused.is_some(),
            operator_busy,
            switchover,
        }
    }

    pub(super) fn start(
        &self,
        action: Action,
        shards: &[Shard],
        pods: &Store<Pod>,
        memory: &mut CoordinatorMemory,
        done: &mpsc::Sender<Finished>,
    ) {
        let Some(target) = self.target(&action, shards) else {
            return;
        };
        let peers = self.peers(&action, shards);
        let reference = self
            .pod_of(&action.from, shards, pods)
            .map(|p| p.object_ref(&()));
        let started = self.begin(&action, reference, memory);
        let (lead, clock, limit) = (self.term.clone(), self.clock, self.handover_timeout);
        let elections = self.elections.clone();
        let run = async move {
            let may_act = || lead.borrow().may_act(clock.now());
            let links = (target, peers);
            execute::handover(&action, links, &elections, may_act, limit).await
        };
        spawn_move(started, run, done);
    }

    /// Books a planned move as started: in flight, the cooldown, the last decision, the Event.
    pub(super) fn begin(
        &self,
        action: &Action,
        reference: Option<ObjectReference>,
        memory: &mut CoordinatorMemory,
    ) -> Move {
        let now = self.clock.now();
        let kind = Started::Planned(action.kind);
        memory.moves.start(&action.shard, kind, now);
        memory.last_decision = Some(Decision {
            kind: action.kind,
            shard: action.shard.clone(),
            reason: action.reason.clone(),
            result: "started",
            at: wall_clock(),
        });
        self.metrics
            .coordinator_decision(jiff::Timestamp::now().as_second());
        tracing::info!(kind = action.kind.as_str(), shard = %action.shard, from = %action.from, to = %action.to, reason = %action.reason, "starting");
        self.event(
            reference.clone(),
            EventType::Normal,
            &format!("{}Started", action.kind.as_str()),
            format!("{} → {}: {}", action.from, action.to, action.reason),
        );
        Move {
            shard: action.shard.clone(),
            to: action.to.clone(),
            from: Some(action.from.clone()),
            kind: action.kind.as_str(),
            decision: Some(action.kind),
            reference,
        }
    }

    pub(super) fn finished(&self, done: Finished, memory: &mut CoordinatorMemory) {
        let Finished { started, outcome } = done;
        self.answer_move(&started, &outcome, memory);
        let done = matches!(outcome, MoveOutcome::Done { .. });
        let made = done.then_some((started.to.as_str(), started.from.as_deref()));
        memory.moves.finish(&started.shard, made, self.clock.now());
        // Whatever happened, the record may have moved: read it next round.
        memory.repl.read_soon(&started.shard);
        if let MoveOutcome::Done { took } = &outcome {
            self.metrics.coordinator_move_duration(*took);
        }
        let (kind, result) = (started.kind, outcome.result());
        let (event_type, message) = completion(&started.shard, &outcome);
        self.metrics.action(kind, result);
        ended(memory, &started, result);
        tracing::info!(kind, shard = %started.shard, result, %message, "finished");
        let reason = if result == "ok" {
            format!("{kind}Succeeded")
        } else {
            format!("{kind}Failed")
        };
        self.event(started.reference, event_type, &reason, message);
    }

    /// The connector for the target node's address (from `CLUSTER SHARDS`).
    pub(super) fn target(&self, action: &Action, shards: &[Shard]) -> Option<Connector> {
        let node = shards
            .iter()
            .flat_map(|s| &s.nodes)
            .find(|n| n.id == action.to)?;
        Some(self.connector_of(node))
    }

    /// The move's shard's other members that are not marked failed (they must know the target).
    pub(super) fn peers(&self, action: &Action, shards: &[Shard]) -> Vec<Connector> {
        let shard = shards.iter().find(|s| s.contains(&action.to));
        let nodes = shard.into_iter().flat_map(|s| &s.nodes);
        nodes
            .filter(|n| n.id != action.to && n.health != NodeHealth::Failed)
            .map(|n| self.connector_of(n))
            .collect()
    }

    pub(super) fn connector_of(&self, node: &ShardNode) -> Connector {
        self.connector.for_node(node)
    }

    pub(super) fn pod_of(
        &self,
        node_id: &str,
        shards: &[Shard],
        pods: &Store<Pod>,
    ) -> Option<Arc<Pod>> {
        let ip = shards
            .iter()
            .flat_map(|s| &s.nodes)
            .find(|n| n.id == node_id)?
            .ip
            .clone();
        pods.state()
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some(ip.as_str()))
    }
}
