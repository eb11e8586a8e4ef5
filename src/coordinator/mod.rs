//! The coordinator: while this agent holds the cluster Lease, it plans with
//! `core::plan::decide` and carries out the moves — hand-over of primaries whose pod or node is
//! going away, fail-back to the preferred zone, balance across nodes — and clears the role label
//! of pods whose Valkey the cluster marks failed.
//!
//! Every agent runs it; only the Lease holder acts, and it checks its acting deadline again right
//! before each command it sends (`execute::handover`), so an agent that lost the Lease while
//! planning never acts.
//!
//! While leading it also publishes its status (`core::status`: conditions and the last decision)
//! for the Lease writer, which carries it in its renewals as annotations on the Lease.
//!
//! In replication mode (no `CLUSTER SHARDS`) the same loop runs [`replication_round`] instead:
//! it observes every member itself, reads each shard's record, plans with the same planner and
//! also promotes a replica when a shard's primary is lost.

pub mod cleanup;
pub mod crash;
pub mod execute;
pub mod formation;
pub mod replication_round;
pub mod report;
pub mod requests;
pub mod roll;
pub mod round;
pub mod watches;
pub mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use tokio::sync::{mpsc, watch};
use valkey_sidecar_core::health::{Bounds, HealthState};
use valkey_sidecar_core::lease::LeaseTimings;
use valkey_sidecar_core::moves::Ledger;
use valkey_sidecar_core::observation::Mode;
use valkey_sidecar_core::plan::{Kind, Policy, ShardMemory};
use valkey_sidecar_core::replication::FailoverPolicy;
use valkey_sidecar_core::status::{Decision, Status};
use valkey_sidecar_core::time::Millis;

use crate::k8s::events::Recorder;
use crate::k8s::format::FormatNotice;
use crate::k8s::lease::{
    CoordinatorTerm, FormedMarker, RequestCell, StatusAnnotations, SuccessorCell,
};
use crate::k8s::owner::LeaseOwner;
use crate::runtime::clock::Clock;
use crate::runtime::metrics::Metrics;
use crate::runtime::task::Owned;
use crate::valkey::Connector;
use cleanup::Retries;
use execute::MoveOutcome;
use watches::Watches;

/// Everything the coordinator needs.
#[derive(Clone)]
pub struct Coordinator {
    pub client: kube::Client,
    pub namespace: String,
    /// Selects the pods of this Valkey cluster (e.g. `valkey.io/cluster=my-valkey`).
    pub selector: String,
    pub clock: Clock,
    /// Cluster mode plans from `CLUSTER SHARDS`; replication mode from its own observations.
    pub mode: Mode,
    /// The Valkey cluster's name: replication mode's shard records are `<cluster>-<shard>-primary`.
    pub cluster: String,
    /// The Lease timings, shared by the shard records (replication mode).
    pub timings: LeaseTimings,
    /// Replication mode: whether a lost primary is replaced (`core::replication::promote`).
    pub failover: FailoverPolicy,
    /// Replication mode: how long a promotion waits for its target's agent to take the record
    /// (a member's heartbeat promise, plus a margin; `core::replication::PromotionRun`).
    pub consent_ms: u64,
    pub bounds: Bounds,
    pub state: watch::Receiver<HealthState>,
    pub term: watch::Receiver<CoordinatorTerm>,
    pub policy: Policy,
    /// How to reach other Valkey nodes: host and port are replaced per target.
    pub connector: Connector,
    pub handover_timeout: Duration,
    /// The failover elections of this cluster, one at a time (`execute::Elections`).
    pub elections: execute::Elections,
    pub role_label: String,
    /// The role label's primary value (`SIDECAR_ROLE_VALUES`).
    pub primary_value: String,
    pub recorder: Option<Recorder>,
    pub metrics: Arc<Metrics>,
    /// The status annotations for the Lease writer; emptied while this agent does not lead.
    pub status: watch::Sender<StatusAnnotations>,
    /// Replication mode: the own shard's record as this agent's keeper last saw it.
    pub seed: watch::Receiver<crate::keeper::RecordSeed>,
    /// Cluster mode: form a cluster of this many shards, re-add replaced pods (`formation`).
    pub formation_shards: Option<u32>,
    /// When the cluster was first seen formed, shared with the Lease writer.
    pub formed: FormedMarker,
    /// The pods that take over first should this term end, shared with the Lease writer.
    pub successors: SuccessorCell,
    /// Set on the shard records this agent writes (`k8s::owner`).
    pub lease_owner: Option<LeaseOwner>,
    /// The operator's requests on the coordinator Lease, shared with the Lease writer.
    pub requests: RequestCell,
    /// Where a shard record of an unknown format is told (`k8s::format`).
    pub notice: FormatNotice,
    /// With `coordination: operator`: the operator's resource whose readiness holds fail-back
    /// and balance (`watches`, `core::operator`).
    pub operator: Option<String>,
}

/// A move under way.
struct Move {
    shard: String,
    /// The node that should now be primary.
    to: String,
    /// The primary it replaces, where a planned move names it.
    from: Option<String>,
    /// `Handover`, `FailBack`, `Rebalance` (planned) or `Failover` (replication mode, unplanned).
    kind: &'static str,
    /// The planner's kind, for the last decision; `None` for an unplanned failover.
    decision: Option<Kind>,
    /// The old primary's pod (else the target's), for the Events.
    reference: Option<ObjectReference>,
}

/// A finished move, reported back to the loop.
struct Finished {
    started: Move,
    outcome: MoveOutcome,
}

/// What the loop keeps between rounds.
#[derive(Default)]
struct CoordinatorMemory {
    shards: BTreeMap<String, ShardMemory>,
    /// Moves running and settling, and the cooldown (`core::moves`).
    moves: Ledger,
    blocked: BTreeSet<String>,
    last_decision: Option<Decision>,
    /// Stale-label removals the API refused, retried with backoff rather than every round.
    label_retry: Retries,
    /// The status last published (`None`: not leading), so it is sent only when it changes.
    status: Option<Status>,
    /// Replication mode: sessions to the members, the records as last read, the holds logged.
    repl: replication_round::State,
    /// Cluster mode: when the last formation round ran.
    formed_at: Option<Millis>,
    /// Cluster mode: the last formation round sent steps, so the next one runs too.
    forming: bool,
    /// Cluster mode: formation rounds started, whose number picks the pods read in full in turn.
    formation_rounds: u64,
    /// Cluster mode: the formation round running beside the loop, one at a time. Observing 100
    /// pods under load took ~11 s, and the loop answers crash deaths and finished moves
    /// meanwhile. Dropped (aborted) when the term ends.
    formation: Option<Owned<bool>>,
    /// The drift last reported (reason, message), so each is an Event once.
    drift: BTreeSet<(String, String)>,
    /// Cluster mode, while coordinating: the watch on every primary's socket.
    deaths: Option<crash::DeathWatch>,
    /// Primaries failed over after their Valkey died, and when: one failover per death.
    crashes: BTreeMap<String, Millis>,
    /// The supervised roll's deletions whose pods have not come back yet (`roll`).
    replacing: roll::Replacing,
    /// Since when the roll has waited without a step, and whether that was said (`roll`).
    roll_waiting: Option<(Millis, bool)>,
    /// The operator's pause and switchover requests, and the last answer (`requests`).
    asked: requests::Asked,
}

/// Runs a move in its own task and reports its end to the loop.
fn spawn_move(
    started: Move,
    run: impl std::future::Future<Output = MoveOutcome> + Send + 'static,
    done: &mpsc::Sender<Finished>,
) {
    let done = done.clone();
    tokio::spawn(async move {
        let outcome = run.await;
        let _ = done.send(Finished { started, outcome }).await;
    });
}

impl Coordinator {
    /// Runs until shutdown.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let (done_tx, mut done_rx) = mpsc::channel::<Finished>(16);
        let (record_tx, mut record_rx) = mpsc::channel::<String>(64);
        let (death_tx, mut death_rx) = mpsc::channel::<crash::Death>(16);
        let mut memory = CoordinatorMemory::default();
        if self.mode == Mode::Cluster {
            memory.deaths = Some(crash::DeathWatch::new(death_tx));
        }
        let mut watches: Option<Watches> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        // A replication round waits for its slowest member: a late round is not caught up on.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A follower's tick would only repeat `follow`: it waits for its term to change instead
        // (a term becomes acting only by changing; it stops acting by time, while ticking). The
        // first tick looks at the term as it stands.
        let mut acting = true;
        loop {
            tokio::select! {
                _ = tick.tick(), if acting => {}
                Ok(()) = self.term.changed() => {}
                Some(done) = done_rx.recv() => self.finished(done, &mut memory),
                Some(shard) = record_rx.recv() => memory.repl.read_soon(&shard),
                ended = formation::ended(&mut memory.formation) => memory.formation_ended(ended),
                Some(death) = death_rx.recv() => {
                    let pods = watches.as_ref().map(|w| &w.pods);
                    self.crashed(death, pods, &mut memory, &done_tx).await;
                }
                _ = shutdown.changed() => break,
            }
            acting = self.term.borrow().may_act(self.clock.now());
            if !acting {
                // A holder whose term lapsed while the Lease still names it keeps its watches:
                // its renewal, answered late, may start a new term at any moment, which then acts
                // at once instead of listing every pod and Node again (on a loaded apiserver, for
                // longer than the term lasts: the 50-shard drains).
                if !self.term.borrow().held {
                    watches = None;
                }
                self.follow(&mut memory);
                continue;
            }
            let w = watches.get_or_insert_with(|| self.watch(&record_tx));
            if !w.ready() {
                continue;
            }
            // The node facts are built once a round, for the successors and the round alike.
            let facts = w.facts();
            self.name_successors(&w.pods, &facts.nodes);
            match self.mode {
                Mode::Cluster => {
                    self.form_if_incomplete(&w.pods, &mut memory);
                    self.round(&w.pods, facts, &mut memory, &done_tx).await
                }
                Mode::Replication => {
                    self.replication_round(&w.pods, facts, &mut memory, &done_tx)
                        .await
                }
            }
        }
    }
}
