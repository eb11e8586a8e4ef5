//! The coordinator: while this agent holds the cluster Lease, it plans with
//! `core::plan::decide` and carries out the moves — hand-over of primaries whose pod or node is
//! going away, fail-back to the preferred zone, balance across nodes — and clears the role label
//! of pods whose Valkey the cluster marks failed.
//!
//! Every agent runs it; only the Lease holder acts, and it checks its acting deadline again right
//! before each command it sends (`execute::failover`), so an agent that lost the Lease while
//! planning never acts.
//!
//! While leading it also publishes its status (`core::status`: conditions and the last decision)
//! for the Lease writer, which carries it in its renewals as annotations on the Lease.
//!
//! In replication mode (no `CLUSTER SHARDS`) the same loop runs [`replication`]'s round instead:
//! it observes every member itself, reads each shard's record, plans with the same planner and
//! also promotes a replica when a shard's primary is lost.

pub mod crash;
pub mod execute;
pub mod formation;
pub mod replication;
pub mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::kube::owner::LeaseOwner;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use valkey_sidecar_core::crash as core_crash;
use valkey_sidecar_core::health::{Bounds, HealthState};
use valkey_sidecar_core::lease::LeaseTimings;
use valkey_sidecar_core::observation::Mode;
use valkey_sidecar_core::plan::{
    Action, InFlight, Kind, Member, Plan, Policy, ShardMemory, World, decide, settle, track,
};
use valkey_sidecar_core::replication::{FailoverPolicy, ShardRecord};
use valkey_sidecar_core::shards::{NodeHealth, Shard, ShardNode};
use valkey_sidecar_core::status::{self, Condition, Decision, Status};
use valkey_sidecar_core::time::Millis;

use crate::clock::Clock;
use crate::kube::lease::{FormedMarker, Leadership, StatusAnnotations};
use crate::metrics::Metrics;
use crate::valkey::Connector;
use execute::Outcome;

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
    pub bounds: Bounds,
    pub state: watch::Receiver<HealthState>,
    pub leadership: watch::Receiver<Leadership>,
    pub policy: Policy,
    /// How to reach other Valkey nodes: host and port are replaced per target.
    pub connector: Connector,
    pub handover_timeout: Duration,
    pub role_label: String,
    /// The role label's primary value (`SIDECAR_ROLE_VALUES`).
    pub primary_value: String,
    pub recorder: Option<Recorder>,
    pub metrics: Arc<Metrics>,
    /// The status annotations for the Lease writer; emptied while this agent does not lead.
    pub status: watch::Sender<StatusAnnotations>,
    /// Replication mode: the own shard's record as this agent's keeper last saw it.
    pub seed: watch::Receiver<crate::replication::RecordSeed>,
    /// Cluster mode: form a cluster of this many shards, re-add replaced pods (`formation`).
    pub formation_shards: Option<u32>,
    /// When the cluster was first seen formed, shared with the Lease writer.
    pub formed: FormedMarker,
    /// Set on the shard records this agent writes (`kube::owner`).
    pub lease_owner: Option<LeaseOwner>,
}

/// How long a finished move may take to show in the local view before the shard is planned again.
const SETTLE_MS: u64 = 10_000;

/// A primary that died is failed over once; it is watched again (and, still refusing while it
/// serves slots, failed over again) only after this long.
const CRASH_REPEAT_MS: u64 = 10_000;

/// A move under way.
struct Move {
    shard: String,
    /// The node that should now be primary.
    to: String,
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
    outcome: Outcome,
}

/// What the loop keeps between rounds.
#[derive(Default)]
struct Memory {
    shards: BTreeMap<String, ShardMemory>,
    running: Vec<InFlight>,
    /// Moves that finished but that the local view (gossip) does not show yet: shard → (new
    /// primary, give up waiting at). Until then the shard counts as busy, so a stale view cannot
    /// plan the same move twice.
    settling: BTreeMap<String, (String, Millis)>,
    last_move: Option<Millis>,
    blocked: BTreeSet<String>,
    last_decision: Option<Decision>,
    /// Stale-label removals the API refused, retried with backoff rather than every round.
    label_retry: Retries,
    /// The status last published (`None`: not leading), so it is sent only when it changes.
    status: Option<Status>,
    /// Replication mode: sessions to the members, the records as last read, the holds logged.
    repl: replication::State,
    /// Cluster mode: when the last formation round ran.
    formed_at: Option<Millis>,
    /// Cluster mode: the last formation round sent steps, so the next one runs too.
    forming: bool,
    /// The drift last reported (reason, message), so each is an Event once.
    drift: BTreeSet<(String, String)>,
    /// Cluster mode, while leading: the watch on every primary's socket.
    deaths: Option<crash::DeathWatch>,
    /// Primaries failed over after their Valkey died, and when: one failover per death.
    crashes: BTreeMap<String, Millis>,
}

/// Wall-clock time for the status: humans read it, no decision does.
fn wall_clock() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Per-pod exponential backoff for a write the API refused: 1 s, 2 s, 4 s … up to a minute.
#[derive(Default)]
struct Retries(BTreeMap<String, (u32, Millis)>);

impl Retries {
    fn due(&self, key: &str, now: Millis) -> bool {
        self.0.get(key).is_none_or(|(_, at)| now >= *at)
    }

    /// Records a failure; returns the wait in ms before the next try.
    fn failed(&mut self, key: &str, now: Millis) -> u64 {
        let tries = self.0.get(key).map_or(0, |(n, _)| *n);
        let wait = (1000u64 << tries.min(6)).min(60_000);
        self.0.insert(key.to_owned(), (tries + 1, now.plus(wait)));
        wait
    }

    fn succeeded(&mut self, key: &str) {
        self.0.remove(key);
    }
}

/// The watches of the cluster's pods and of the nodes. Only the leader runs them: a follower costs
/// the apiserver nothing beyond its own pod's watch, and a new leader lists afresh (milliseconds).
struct Watches {
    pods: Store<Pod>,
    nodes: Store<Node>,
    /// Set when the API refuses to list nodes (the chart's `sidecar.readNodes=false`): the
    /// coordinator then plans without node facts — hand-overs of deleted pods still happen, those
    /// for cordoned or NotReady nodes cannot.
    nodes_forbidden: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Watches {
    /// Both initial lists are in (or nodes are forbidden): before that an empty store would read
    /// as "no pods".
    fn ready(&self) -> bool {
        let ready = |r: Option<Result<(), _>>| matches!(r, Some(Ok(())));
        let pods = ready(self.pods.wait_until_ready().now_or_never());
        let nodes = ready(self.nodes.wait_until_ready().now_or_never())
            || self.nodes_forbidden.load(Ordering::Relaxed);
        pods && nodes
    }
}

/// The shard whose record `lease` is, if its holder differs from the one last seen.
fn holder_change(
    cluster: &str,
    lease: &Lease,
    holders: &mut BTreeMap<String, Option<String>>,
) -> Option<String> {
    let name = lease.metadata.name.as_deref()?;
    let shard = ShardRecord::shard_of(cluster, name)?;
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
    let before = holders.insert(name.to_owned(), holder.clone());
    (before != Some(holder)).then(|| shard.to_owned())
}

/// Whether a watch error is the API refusing access.
fn forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 403,
        _ => false,
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Runs a move in its own task and reports its end to the loop.
fn spawn_move(
    started: Move,
    run: impl std::future::Future<Output = Outcome> + Send + 'static,
    done: &mpsc::Sender<Finished>,
) {
    let done = done.clone();
    tokio::spawn(async move {
        let outcome = run.await;
        let _ = done.send(Finished { started, outcome }).await;
    });
}

/// Running and settling shards: the planner leaves both alone.
fn busy(memory: &Memory) -> Vec<InFlight> {
    let settling = memory.settling.keys().map(|shard| InFlight {
        shard: shard.clone(),
        started: Millis(0),
    });
    memory.running.iter().cloned().chain(settling).collect()
}

/// The last decision shows how its move ended (unless a newer one replaced it meanwhile).
fn ended(memory: &mut Memory, done: &Move, result: &'static str) {
    let last = memory.last_decision.as_mut();
    let same = |d: &&mut Decision| d.shard == done.shard && Some(d.kind) == done.decision;
    if let Some(d) = last.filter(same) {
        d.result = result;
    }
}

/// The completion Event's type and note.
fn completion(shard: &str, outcome: &Outcome) -> (EventType, String) {
    match outcome {
        Outcome::Done { took } => (
            EventType::Normal,
            format!("shard {shard} has a new primary after {took:?}"),
        ),
        Outcome::NoLease => (
            EventType::Warning,
            format!("shard {shard}: lease lost before acting; nothing more done"),
        ),
        Outcome::RolledBack(e) => (
            EventType::Warning,
            format!("shard {shard}: rolled back, the primary is unchanged: {e}"),
        ),
        Outcome::Conflict(e) | Outcome::Failed(e) => {
            (EventType::Warning, format!("shard {shard}: {e}"))
        }
    }
}

impl Coordinator {
    /// Runs until shutdown.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let (done_tx, mut done_rx) = mpsc::channel::<Finished>(16);
        let (record_tx, mut record_rx) = mpsc::channel::<String>(64);
        let (death_tx, mut death_rx) = mpsc::channel::<crash::Death>(16);
        let mut memory = Memory::default();
        if self.mode == Mode::Cluster {
            memory.deaths = Some(crash::DeathWatch::new(death_tx));
        }
        let mut watches: Option<Watches> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        // A replication round waits for its slowest member: a late round is not caught up on.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.leadership.changed() => {}
                Some(done) = done_rx.recv() => self.finished(done, &mut memory),
                Some(shard) = record_rx.recv() => memory.repl.read_soon(&shard),
                Some(death) = death_rx.recv() => {
                    let pods = watches.as_ref().map(|w| &w.pods);
                    self.crashed(death, pods, &mut memory, &done_tx).await;
                }
                _ = shutdown.changed() => break,
            }
            if !self.leadership.borrow().may_act(self.clock.now()) {
                watches = None;
                self.follow(&mut memory);
                continue;
            }
            let w = watches.get_or_insert_with(|| self.watch(&record_tx));
            if !w.ready() {
                continue;
            }
            match self.mode {
                Mode::Cluster => {
                    self.form_if_incomplete(&w.pods, &mut memory).await;
                    self.round(&w.pods, &w.nodes, &mut memory, &done_tx).await
                }
                Mode::Replication => {
                    self.replication_round(&w.pods, &w.nodes, &mut memory, &done_tx)
                        .await
                }
            }
        }
    }

    /// Starts the watches a leader plans from.
    fn watch(&self, records: &mpsc::Sender<String>) -> Watches {
        let (pods, pods_task) = self.watch_pods();
        let nodes_forbidden = Arc::new(AtomicBool::new(false));
        let (nodes, nodes_task) = self.watch_nodes(nodes_forbidden.clone());
        let mut tasks = vec![pods_task, nodes_task];
        if self.mode == Mode::Replication {
            tasks.push(self.watch_records(records.clone()));
        }
        Watches {
            pods,
            nodes,
            nodes_forbidden,
            tasks,
        }
    }

    /// Replication mode: names the shard whenever its record changes hands (a release, a
    /// takeover), so the next round — at once — reads it instead of at its usual pace. Only a
    /// trigger: decisions still rest on the round's own quorum read.
    fn watch_records(&self, changed: mpsc::Sender<String>) -> JoinHandle<()> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let config = watcher::Config::default().labels(&ShardRecord::selector(&self.cluster));
        let cluster = self.cluster.clone();
        let mut holders: BTreeMap<String, Option<String>> = BTreeMap::new();
        let stream = watcher(api, config).default_backoff().applied_objects();
        let metrics = self.metrics.clone();
        tokio::spawn(stream.for_each(move |lease| {
            let lease = lease.map_err(|e| metrics.watch_error("shard_records", &e));
            if let Some(shard) = lease
                .ok()
                .and_then(|l| holder_change(&cluster, &l, &mut holders))
            {
                // A full channel already has a wake-up queued: dropping this one loses nothing.
                let _ = changed.try_send(shard);
            }
            async {}
        }))
    }

    /// A follower's round: it reports that it does not lead and forgets what it tracked, so that
    /// when it leads again the quiet periods start afresh instead of from a history it did not see.
    fn follow(&self, memory: &mut Memory) {
        self.metrics.coordinator_leader(false);
        self.metrics.drift(std::iter::empty());
        self.publish(None, memory);
        memory.shards.clear();
        memory.drift.clear();
        memory.crashes.clear();
        if let Some(d) = memory.deaths.as_mut() {
            d.clear();
        }
        // A new term reads every record afresh, so no expiry is judged on a history it missed.
        memory.repl = replication::State::default();
    }

    fn watch_pods(&self) -> (Store<Pod>, JoinHandle<()>) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let (reader, writer) = reflector::store();
        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default().labels(&self.selector)),
        );
        let metrics = self.metrics.clone();
        let task = stream.default_backoff().for_each(move |event| {
            if let Err(e) = &event {
                metrics.watch_error("pods", e);
            }
            async {}
        });
        (reader, tokio::spawn(task))
    }

    fn watch_nodes(&self, forbidden_flag: Arc<AtomicBool>) -> (Store<Node>, JoinHandle<()>) {
        let api: Api<Node> = Api::all(self.client.clone());
        let (reader, writer) = reflector::store();
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()));
        let metrics = self.metrics.clone();
        let task = stream.default_backoff().for_each(move |event| {
            match &event {
                // Said once: RBAC without nodes is a supported choice, not an error to repeat.
                Err(e) if forbidden(e) => {
                    if !forbidden_flag.swap(true, Ordering::Relaxed) {
                        tracing::warn!("may not list nodes: planning without node facts (cordons and NotReady nodes go unseen)");
                    }
                }
                Err(e) => metrics.watch_error("nodes", e),
                Ok(_) => {}
            }
            async {}
        });
        (reader, tokio::spawn(task))
    }

    /// With `SIDECAR_CLUSTER_SHARDS`: a formation round when the local node's view of the cluster
    /// misses a pod or the last round sent steps or met a silent pod, at most every
    /// [`formation::PERIOD_MS`], and at least every [`formation::RECHECK_MS`].
    async fn form_if_incomplete(&self, pods: &Store<Pod>, memory: &mut Memory) {
        let Some(shards) = self.formation_shards else {
            return;
        };
        let now = self.clock.now();
        let due = memory
            .formed_at
            .is_none_or(|at| now.since(at) >= formation::PERIOD_MS);
        let pods = pods.state();
        let local = self.shards(now);
        if local.iter().flatten().any(|s| !s.slots.is_empty()) {
            self.formed.set_if_unset(wall_clock);
        }
        let incomplete = local.is_some_and(|local| formation::incomplete(&local, &pods));
        // Now and then a round anyway: what only another node's own view shows (a node naming
        // itself by an old address) leaves the leader's view whole.
        let anyway = memory
            .formed_at
            .is_none_or(|at| now.since(at) >= formation::RECHECK_MS);
        if due && (incomplete || memory.forming || anyway) {
            memory.formed_at = Some(now);
            memory.forming = self.formation_round(shards, &pods, now).await;
        }
    }

    /// The shards as the local Valkey sees them, if the observation is fresh.
    fn shards(&self, now: Millis) -> Option<Vec<Shard>> {
        let state = self.state.borrow();
        Some(
            state
                .current(now, &self.bounds)?
                .cluster
                .as_ref()?
                .shards
                .clone(),
        )
    }

    async fn round(
        &self,
        pods: &Store<Pod>,
        nodes: &Store<Node>,
        memory: &mut Memory,
        done: &mpsc::Sender<Finished>,
    ) {
        let now = self.clock.now();
        let leader = self.leadership.borrow().may_act(now);
        self.metrics.coordinator_leader(leader);
        let Some(shards) = self.shards(now) else {
            self.publish(leader.then(status::without_view), memory);
            return;
        };
        if let Some(d) = memory.deaths.as_mut().filter(|_| leader) {
            d.track(&shards, &self.connector);
        }
        let members = world::members(&shards, &pods.state());
        let world = self.world(members, (pods, nodes), memory, now, leader);
        let plan = decide(&world, &self.policy);
        self.report(&plan, pods, memory);
        let conditions = leader.then(|| status::conditions(&world, &self.policy, &plan));
        for action in plan.actions {
            self.start(action, &shards, pods, memory, done);
        }
        self.publish(conditions, memory);
        if leader {
            self.clear_dead_labels(&world, pods, &mut memory.label_retry)
                .await;
        }
    }

    /// The planner's world from this round's members; settles finished moves the members now
    /// show and folds them into the per-shard memory (quiet periods).
    fn world(
        &self,
        members: Vec<Member>,
        (pods, nodes): (&Store<Pod>, &Store<Node>),
        memory: &mut Memory,
        now: Millis,
        leader: bool,
    ) -> World {
        settle(&mut memory.settling, &members, now);
        memory.shards = track(&memory.shards, &members, now);
        World {
            now,
            leader,
            members,
            nodes: world::nodes(&nodes.state()),
            steady_since: memory
                .shards
                .iter()
                .map(|(k, v)| (k.clone(), v.steady_since))
                .collect(),
            in_flight: busy(memory),
            last_move: memory.last_move,
            pending: world::pending(&pods.state()),
        }
    }

    /// Drift into metrics, and an Event (on the pod it is about) when a drift first appears;
    /// blocked moves logged when they first appear.
    fn report(&self, plan: &Plan, pods: &Store<Pod>, memory: &mut Memory) {
        self.metrics.drift(plan.drift.iter().map(|d| d.reason));
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
    /// with its next renewal); `None` clears it, so a lost leadership leaves nothing stale behind.
    fn publish(&self, conditions: Option<Vec<Condition>>, memory: &mut Memory) {
        let next = conditions.map(|conditions| Status {
            conditions,
            last_decision: memory.last_decision.clone(),
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

    /// A primary's Valkey died (`crash`): the leader fails its shard over at once to the replica
    /// with the highest offset, once per death, unless a move of that shard is under way.
    async fn crashed(
        &self,
        death: crash::Death,
        pods: Option<&Store<Pod>>,
        memory: &mut Memory,
        done: &mpsc::Sender<Finished>,
    ) {
        let now = self.clock.now();
        if !self.leadership.borrow().may_act(now) {
            return;
        }
        let Some(shards) = self.shards(now) else {
            tracing::warn!(node = %death.node, "a primary died; no fresh view of the cluster to fail it over from");
            return;
        };
        let Some(shard) = core_crash::crashed_shard(&shards, &death.node) else {
            return;
        };
        let repeated = memory
            .crashes
            .get(&death.node)
            .is_some_and(|at| now.since(*at) < CRASH_REPEAT_MS);
        if repeated {
            return;
        }
        // A pod going away is the planned hand-over's (its preStop holds Valkey until then);
        // after it, the coordinator's view can lag, and forcing a replica then could depose the
        // primary the hand-over just made.
        let pod = pods.and_then(|p| self.pod_of(&death.node, &shards, p));
        if pod.is_some_and(|p| p.metadata.deletion_timestamp.is_some()) {
            tracing::info!(node = %death.node, "a primary's Valkey stopped with its pod: left to the hand-over");
            memory.crashes.insert(death.node.clone(), now);
            return;
        }
        if busy(memory).iter().any(|f| f.shard == shard.id) {
            tracing::debug!(node = %death.node, "a primary died; its shard is already being moved");
            return;
        }
        memory.crashes.insert(death.node.clone(), now);
        let candidates = core_crash::candidates(shard, &death.node);
        let offsets = crash::offsets(candidates, &self.connector).await;
        match core_crash::choose(shard, &death.node, &offsets) {
            Ok(chosen) => self.force(chosen, &shards, pods, memory, done),
            Err(why) => {
                tracing::warn!(node = %death.node, %why, "a primary died; no replica to fail over to")
            }
        }
    }

    fn force(
        &self,
        chosen: core_crash::CrashFailover,
        shards: &[Shard],
        pods: Option<&Store<Pod>>,
        memory: &mut Memory,
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
        memory.running.push(InFlight {
            shard: chosen.shard.clone(),
            started: self.clock.now(),
        });
        tracing::info!(shard = %chosen.shard, from = %chosen.dead, to = %chosen.to, reason = %chosen.reason, "starting a crash failover");
        self.event(
            reference.clone(),
            EventType::Warning,
            "CrashFailoverStarted",
            format!("{} → {}: {}", chosen.dead, chosen.to, chosen.reason),
        );
        let started = Move {
            shard: chosen.shard,
            to: chosen.to,
            kind: "CrashFailover",
            decision: None,
            reference,
        };
        let (lead, clock, limit) = (self.leadership.clone(), self.clock, self.handover_timeout);
        let run = async move {
            let may_act = || lead.borrow().may_act(clock.now());
            crash::force(target, may_act, limit).await
        };
        spawn_move(started, run, done);
    }

    fn start(
        &self,
        action: Action,
        shards: &[Shard],
        pods: &Store<Pod>,
        memory: &mut Memory,
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
        let (lead, clock, limit) = (self.leadership.clone(), self.clock, self.handover_timeout);
        let run = async move {
            let may_act = || lead.borrow().may_act(clock.now());
            execute::failover(&action, target, peers, may_act, limit).await
        };
        spawn_move(started, run, done);
    }

    /// Books a planned move as started: in flight, the cooldown, the last decision, the Event.
    fn begin(
        &self,
        action: &Action,
        reference: Option<ObjectReference>,
        memory: &mut Memory,
    ) -> Move {
        let now = self.clock.now();
        memory.running.push(InFlight {
            shard: action.shard.clone(),
            started: now,
        });
        if action.kind != Kind::Handover {
            memory.last_move = Some(now);
        }
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
            kind: action.kind.as_str(),
            decision: Some(action.kind),
            reference,
        }
    }

    fn finished(&self, done: Finished, memory: &mut Memory) {
        let Finished { started, outcome } = done;
        memory.running.retain(|r| r.shard != started.shard);
        if matches!(outcome, Outcome::Done { .. }) {
            let until = self.clock.now().plus(SETTLE_MS);
            memory
                .settling
                .insert(started.shard.clone(), (started.to.clone(), until));
        }
        // Whatever happened, the record may have moved: read it next round.
        memory.repl.read_soon(&started.shard);
        if let Outcome::Done { took } = &outcome {
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
    fn target(&self, action: &Action, shards: &[Shard]) -> Option<Connector> {
        let node = shards
            .iter()
            .flat_map(|s| &s.nodes)
            .find(|n| n.id == action.to)?;
        Some(self.connector_of(node))
    }

    /// The move's shard's other members that are not marked failed (they must know the target).
    fn peers(&self, action: &Action, shards: &[Shard]) -> Vec<Connector> {
        let shard = shards.iter().find(|s| s.contains(&action.to));
        let nodes = shard.into_iter().flat_map(|s| &s.nodes);
        nodes
            .filter(|n| n.id != action.to && n.health != NodeHealth::Failed)
            .map(|n| self.connector_of(n))
            .collect()
    }

    fn connector_of(&self, node: &ShardNode) -> Connector {
        self.connector.for_node(node)
    }

    fn pod_of(&self, node_id: &str, shards: &[Shard], pods: &Store<Pod>) -> Option<Arc<Pod>> {
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

    /// Events go to the old primary's pod when known, else they are only logged.
    /// A reference to the cluster's pod `name`, for an Event.
    fn pod_ref(&self, pods: &Store<Pod>, name: &str) -> Option<ObjectReference> {
        let key = reflector::ObjectRef::new(name).within(&self.namespace);
        pods.get(&key).map(|p| p.object_ref(&()))
    }

    fn event(
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

    /// A pod whose Valkey the cluster marks failed cannot update its own label (its agent may be
    /// gone with it), so the coordinator removes the stale role label: a Service selecting the
    /// primary must not keep routing to it.
    async fn clear_dead_labels(&self, world: &World, pods: &Store<Pod>, retry: &mut Retries) {
        let dead: Vec<String> = world
            .members
            .iter()
            .filter(|m| m.health == NodeHealth::Failed)
            .filter_map(|m| Some(m.pod.as_ref()?.name.clone()))
            .collect();
        let why = "removed the role label of a failed node";
        self.clear_role_labels(&dead, (pods, retry), world.now, why)
            .await;
    }

    /// Removes the role label of each of `names` that still carries one, each pod retried with
    /// backoff when the apiserver refuses.
    async fn clear_role_labels(
        &self,
        names: &[String],
        (pods, retry): (&Store<Pod>, &mut Retries),
        now: Millis,
        why: &str,
    ) {
        for name in names {
            let labelled = pods
                .state()
                .into_iter()
                .find(|p| p.metadata.name.as_deref() == Some(name.as_str()));
            let has_role = labelled.is_some_and(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(&self.role_label))
            });
            if !has_role || !retry.due(name, now) {
                continue;
            }
            self.clear_role_label(name, retry, now, why).await;
        }
    }

    async fn clear_role_label(&self, name: &str, retry: &mut Retries, now: Millis, why: &str) {
        let patch =
            serde_json::json!({ "metadata": { "labels": { self.role_label.clone(): null } } });
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                retry.succeeded(name);
                tracing::info!(pod = %name, "{why}")
            }
            Err(e) => {
                let wait = retry.failed(name, now);
                tracing::warn!(pod = %name, error = %e, retry_in_ms = wait, "cannot remove a stale role label")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_writes_back_off_exponentially_up_to_a_minute_and_reset_on_success() {
        let mut r = Retries::default();
        let t = Millis(10_000);
        assert!(r.due("p", t));
        let waits: Vec<u64> = (0..9).map(|_| r.failed("p", t)).collect();
        assert_eq!(
            waits,
            [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]
        );
        assert!(!r.due("p", t.plus(59_999)));
        assert!(r.due("p", t.plus(60_000)));
        assert!(r.due("other", t), "backoff is per pod");
        r.succeeded("p");
        assert!(r.due("p", t));
        assert_eq!(r.failed("p", t), 1000);
    }
}
