//! The coordinator's round in replication mode (`SIDECAR_MODE=replication`): there is no
//! `CLUSTER SHARDS`, so the coordinator looks at everything itself.
//!
//! Each round (every 250 ms while it leads) it
//! 1. groups the cluster's pods into shards by `valkey.io/shard-index` (absent: shard `0`);
//! 2. observes every member's Valkey at `<pod IP>:<the local Valkey port>` with the agent's own
//!    connection settings (auth, TLS) — all members at once, a session kept per pod, the same
//!    pipeline as the agent's own tick, a short timeout — while it reads the shards' records
//!    (`<cluster>-<shard>-primary`) concurrently;
//! 3. plans with the cluster-mode planner (`core::plan::decide`): hand-over of a primary whose pod
//!    or node is going away, fail-back, balance — each carried out as a hand-over
//!    (`execute::record_handover`, the `core::replication::RecordHandoverRun` step machine);
//! 4. for every other shard asks `core::replication::promotion::decide` whether the primary is lost, and
//!    carries a promotion out (`execute::run_promotion`, the `core::replication::PromotionRun` step machine).
//!
//! Record reads (`core::replication::next_read` and `calm`): a shard whose holder's Valkey answers as primary, with nothing in flight, is
//! read once per retry period (the holder's own renewal period); any other shard — never read,
//! released, not bootstrapped yet, holder silent or not primary, a move running or settling — at
//! every round. A read's *receive* time is when a new `resourceVersion` counts as seen
//! (`changed_at`): the write it reflects was sent before, so a takeover judged from it is never
//! early. Reading a calm shard less often can only make `changed_at` later, i.e. a failover of
//! a primary that dies silently up to one retry period slower, never earlier. Every record
//! write is a compare-and-swap besides, so a stale read costs a 409, not a second primary.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use kube::runtime::reflector::Store;
use tokio::sync::mpsc;
use valkey_sidecar_core::labels::stale_primaries;
use valkey_sidecar_core::moves::Started;
use valkey_sidecar_core::observation::{self, Mode};
use valkey_sidecar_core::plan::{Action, Member, Shards, World, decide, preferred_zone};
use valkey_sidecar_core::replication::{
    Hold, HoldKind, MemberValkey, Promotion, RecordHandoverPlan, SeenRecord, ShardRecord,
    ShardView, calm, next_read, promotion,
};
use valkey_sidecar_core::status;
use valkey_sidecar_core::time::Millis;

use super::execute::{self, Links};
use super::watches::Facts;
use super::{Coordinator, CoordinatorMemory, Finished, Move, spawn_move, world};
use crate::k8s::events::EventType;
use crate::k8s::pods::pod_ip;
use crate::k8s::record::RecordClient;
use crate::keeper::RecordSeed;
use crate::runtime::clock::{Clock, thread_cpu, thread_cpu_since};
use crate::runtime::metrics::Metrics;
use crate::valkey::{Connector, Session, observe};

/// How long one member's observation may take: a round waits for its slowest member, and a
/// member that cannot answer in this time is of no use to a failover decision either.
const OBSERVE_TIMEOUT: Duration = Duration::from_millis(500);

/// What replication mode keeps between rounds.
#[derive(Default)]
pub struct State {
    /// Pod → its session, kept across rounds (reconnecting with backoff when it breaks).
    members: BTreeMap<String, MemberLink>,
    /// Shard → its record client and the record as last read.
    records: BTreeMap<String, RecordState>,
    /// Shard → the hold last logged, so a hold is logged when it changes, not every round.
    holds: BTreeMap<String, String>,
}

struct MemberLink {
    /// The pod IP the session was opened for: a recreated pod has a new one.
    host: String,
    session: Session,
}

struct RecordState {
    client: RecordClient,
    seen: Option<SeenRecord>,
    /// When to read next: `Millis(0)` means at the next round.
    next_read: Millis,
}

impl State {
    /// Reads the shard's record at the next round (a move may have changed it).
    pub(super) fn read_soon(&mut self, shard: &str) {
        if let Some(r) = self.records.get_mut(shard) {
            r.next_read = Millis(0);
        }
    }

    /// One session per pod that has an IP; a pod gone or with a new IP loses its old session.
    fn sync_members(&mut self, shards: &BTreeMap<String, Vec<Arc<Pod>>>, template: &Connector) {
        let wanted: BTreeMap<&str, &str> = shards
            .values()
            .flatten()
            .filter_map(|p| Some((p.metadata.name.as_deref()?, pod_ip(p)?)))
            .collect();
        self.members
            .retain(|pod, m| wanted.get(pod.as_str()) == Some(&m.host.as_str()));
        for (pod, ip) in wanted {
            self.members
                .entry(pod.to_owned())
                .or_insert_with(|| MemberLink {
                    host: ip.to_owned(),
                    session: Session::new(at(template, ip)),
                });
        }
    }

    /// One record state per shard; the agent's own shard starts from what its keeper saw (the
    /// same clock), every other shard from this coordinator's first read.
    fn sync_records(
        &mut self,
        shards: &BTreeMap<String, Vec<Arc<Pod>>>,
        client: impl Fn(&str) -> RecordClient,
        seed: &RecordSeed,
    ) {
        self.records.retain(|shard, _| shards.contains_key(shard));
        for shard in shards.keys() {
            let seen = seed
                .as_ref()
                .filter(|(s, _)| s == shard)
                .map(|(_, seen)| seen.clone());
            self.records
                .entry(shard.clone())
                .or_insert_with(|| RecordState {
                    client: client(shard),
                    seen,
                    next_read: Millis(0),
                });
        }
    }

    fn client(&self, shard: &str) -> Option<RecordClient> {
        Some(self.records.get(shard)?.client.clone())
    }

    /// Schedules the next read of every shard's record (see the module docs).
    fn pace(&mut self, shards: &[ShardRound], busy: &BTreeSet<String>, now: Millis, retry_ms: u64) {
        for s in shards {
            let Some(r) = self.records.get_mut(&s.name) else {
                continue;
            };
            let calm = s.calm(busy.contains(&s.name));
            r.next_read = next_read(r.seen.as_ref(), calm, now, retry_ms);
        }
    }

    /// Logs a hold when it changes; a countdown (`Held`, "… ms left") counts as one hold.
    fn note_hold(&mut self, shard: &str, hold: &Hold) {
        let key = match hold.kind {
            HoldKind::Held => "Held".to_owned(),
            kind => format!("{kind:?}: {}", hold.reason),
        };
        if self.holds.get(shard) == Some(&key) {
            return;
        }
        let reason = &hold.reason;
        match hold.kind {
            HoldKind::NoCandidate => tracing::warn!(shard, %reason, "failover blocked"),
            HoldKind::Held => tracing::debug!(shard, %reason, "no failover"),
            _ => tracing::info!(shard, %reason, "no failover"),
        }
        self.holds.insert(shard.to_owned(), key);
    }
}

/// `template` pointed at `host` (the port stays the local Valkey's: every pod serves on it).
fn at(template: &Connector, host: &str) -> Connector {
    Connector {
        host: host.to_owned(),
        ..template.clone()
    }
}

impl RecordState {
    /// `gap_ms`: a longer gap since the previous read restarts the expiry clock.
    async fn read(&mut self, clock: Clock, metrics: &Metrics, gap_ms: u64) {
        let sent = clock.now();
        match self.client.read().await {
            Ok(record) => {
                metrics.coordinator_record_read("ok");
                let prev = self.seen.take();
                let received = clock.now();
                let seen = SeenRecord::after_continuous_read(
                    prev.as_ref(),
                    record,
                    sent,
                    received,
                    gap_ms,
                );
                self.seen = Some(seen);
            }
            Err(e) => {
                metrics.coordinator_record_read(e.kind());
                tracing::debug!(lease = self.client.name(), error = %e, "cannot read a shard record");
            }
        }
    }
}

/// Reads every record that is due; `gap_ms` (the renew deadline): see
/// [`SeenRecord::after_continuous_read`].
async fn read_records(
    records: &mut BTreeMap<String, RecordState>,
    clock: Clock,
    metrics: &Metrics,
    gap_ms: u64,
) {
    let now = clock.now();
    let due = records.values_mut().filter(|r| r.next_read <= now);
    join_all(due.map(|r| r.read(clock, metrics, gap_ms))).await;
}

async fn observe_members(
    members: &mut BTreeMap<String, MemberLink>,
) -> BTreeMap<String, MemberValkey> {
    let pipe = observe::pipeline(Mode::Replication);
    let each = members.iter_mut().map(|(pod, m)| {
        let pipe = &pipe;
        async move { (pod.clone(), observe_member(&mut m.session, pipe).await) }
    });
    let answers = join_all(each).await.into_iter();
    answers.filter_map(|(pod, v)| Some((pod, v?))).collect()
}

/// The agent's own tick pipeline (`ROLE`, `INFO`), read by `core` plus one INFO field of ours.
async fn observe_member(session: &mut Session, pipe: &redis::Pipeline) -> Option<MemberValkey> {
    let replies = observe::replies(session.query(pipe).await.ok()?);
    let obs = observation::observe(&replies, Mode::Replication).ok()?;
    Some(MemberValkey::of(&obs))
}

/// One shard as this round sees it.
struct ShardRound {
    name: String,
    /// By name.
    pods: Vec<Arc<Pod>>,
    /// The members that answered this round, by pod name.
    valkey: BTreeMap<String, MemberValkey>,
    record: Option<SeenRecord>,
}

impl ShardRound {
    fn existing(&self) -> Option<&ShardRecord> {
        self.record.as_ref()?.record.as_ref()
    }

    fn pod(&self, name: &str) -> Option<&Arc<Pod>> {
        self.pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
    }

    fn reference(&self, name: &str) -> Option<ObjectReference> {
        self.pod(name).map(|p| p.object_ref(&()))
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.pods.iter().filter_map(|p| p.metadata.name.as_deref())
    }

    fn plan_members(&self) -> impl Iterator<Item = Member> + '_ {
        let record = self.existing();
        self.pods.iter().map(move |p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            world::plan_member(&self.name, p, self.valkey.get(name), record)
        })
    }

    /// What `promotion::decide` looks at.
    fn view(&self, world: &World, zone: Option<&str>, lease_ms: u64) -> ShardView {
        let members = self.pods.iter().map(|p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            world::shard_member(p, self.valkey.get(name), &world.nodes)
        });
        ShardView {
            now: world.now,
            coordinating: world.coordinating,
            record: self.record.clone(),
            lease_ms,
            members: members.collect(),
            preferred_zone: zone.map(str::to_owned),
        }
    }

    /// `core::replication::calm`, from this round's answers.
    fn calm(&self, busy: bool) -> bool {
        let members = self
            .valkey
            .iter()
            .map(|(pod, v)| (pod.as_str(), v.role, v.link_up));
        calm(self.record.as_ref(), members, busy)
    }
}

impl Coordinator {
    /// One round in replication mode (see the module docs).
    pub(super) async fn replication_round(
        &self,
        pods: &Store<Pod>,
        facts: Facts,
        memory: &mut CoordinatorMemory,
        done: &mpsc::Sender<Finished>,
    ) {
        let grouped = world::group(&pods.state());
        let valkey = self.observe_and_read(&grouped, &mut memory.repl).await;
        let shards = rounds(grouped, valkey, &memory.repl);
        let now = self.clock.now();
        let coordinating = self.term.borrow().may_act(now);
        self.metrics.set_coordinating(coordinating);
        let started = std::time::Instant::now();
        let cpu = coordinating.then(thread_cpu).flatten();
        let members = shards.iter().flat_map(ShardRound::plan_members).collect();
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
        let planned = plan.actions.clone();
        for action in plan.actions {
            self.start_handover(action, &shards, memory, done);
        }
        self.failovers(&shards, &world, &planned, memory, done);
        self.publish(conditions, memory);
        if coordinating {
            let stale = self.stale_primaries(&shards);
            let why = "removed the primary label of a pod the shard record no longer names";
            self.clear_role_labels(&stale, (pods, &mut memory.label_retry), now, why)
                .await;
        }
        let busy = memory.moves.busy();
        memory.repl.pace(&shards, &busy, now, self.timings.retry_ms);
    }

    /// Pods labelled primary that their shard's record does not name
    /// (`core::labels::stale_primaries`).
    fn stale_primaries(&self, shards: &[ShardRound]) -> Vec<String> {
        let labelled_primary = |p: &Pod| {
            let labels = p.metadata.labels.as_ref();
            labels.and_then(|l| l.get(&self.role_label)) == Some(&self.primary_value)
        };
        let mut stale = Vec::new();
        for s in shards {
            let labelled: Vec<(&str, bool)> = s
                .pods
                .iter()
                .filter_map(|p| Some((p.metadata.name.as_deref()?, labelled_primary(p))))
                .collect();
            let holder = s.existing().and_then(ShardRecord::holder);
            stale.extend(
                stale_primaries(holder, &labelled)
                    .into_iter()
                    .map(str::to_owned),
            );
        }
        stale
    }

    /// Observes every member and reads the due records, all at once.
    async fn observe_and_read(
        &self,
        shards: &BTreeMap<String, Vec<Arc<Pod>>>,
        state: &mut State,
    ) -> BTreeMap<String, MemberValkey> {
        let template = Connector {
            timeout: OBSERVE_TIMEOUT.min(self.connector.timeout),
            ..self.connector.clone()
        };
        state.sync_members(shards, &template);
        let seed = self.seed.borrow().clone();
        state.sync_records(shards, |shard| self.record_client(shard), &seed);
        let (observed, ()) = tokio::join!(
            observe_members(&mut state.members),
            read_records(
                &mut state.records,
                self.clock,
                &self.metrics,
                self.timings.renew_deadline_ms,
            ),
        );
        observed
    }

    fn record_client(&self, shard: &str) -> RecordClient {
        RecordClient::new(
            self.client.clone(),
            &self.namespace,
            (&self.cluster, shard),
            // A call must finish well inside the renew deadline to be of any use.
            Duration::from_millis(self.timings.call_limit_ms()),
            Duration::from_millis(self.timings.lease_ms),
        )
        .owned_by(self.lease_owner.clone())
        .telling(self.notice.clone())
    }

    /// Connections to the shard's members for a move (the full configured timeout).
    fn links(&self, s: &ShardRound) -> Links {
        let connectors = s
            .pods
            .iter()
            .filter_map(|p| {
                let name = p.metadata.name.clone()?;
                Some((name, at(&self.connector, pod_ip(p)?)))
            })
            .collect();
        Links::new(connectors)
    }

    /// Starts a planned move as a record hand-over, if the record still names its `from`.
    fn start_handover(
        &self,
        action: Action,
        shards: &[ShardRound],
        memory: &mut CoordinatorMemory,
        done: &mpsc::Sender<Finished>,
    ) {
        let Some(s) = shards.iter().find(|s| s.name == action.shard) else {
            return;
        };
        let (Some(plan), Some(record)) =
            (self.handover_plan(&action, s), memory.repl.client(&s.name))
        else {
            tracing::warn!(shard = %action.shard, from = %action.from, "hand-over not started: the record does not name the primary, or the target has no address");
            return;
        };
        let links = self.links(s);
        let started = self.begin(&action, s.reference(&action.from), memory);
        let (lead, clock) = (self.term.clone(), self.clock);
        let run = async move {
            let may_act = || lead.borrow().may_act(clock.now());
            execute::record_handover(plan, links, record, clock, may_act).await
        };
        spawn_move(started, run, done);
    }

    fn handover_plan(&self, action: &Action, s: &ShardRound) -> Option<RecordHandoverPlan> {
        let record = s.existing()?;
        if record.recorded_primary() != Some(action.from.as_str()) {
            return None;
        }
        let to_addr = format!("{} {}", pod_ip(s.pod(&action.to)?)?, self.connector.port);
        let others = s.names().filter(|n| *n != action.from && *n != action.to);
        Some(RecordHandoverPlan {
            from: action.from.clone(),
            to: action.to.clone(),
            to_addr,
            others: others.map(str::to_owned).collect(),
            epoch: record.epoch,
            timeout_ms: crate::runtime::clock::millis(self.handover_timeout),
        })
    }

    /// Unplanned failover of every shard nothing else is happening to.
    fn failovers(
        &self,
        shards: &[ShardRound],
        world: &World,
        planned: &[Action],
        memory: &mut CoordinatorMemory,
        done: &mpsc::Sender<Finished>,
    ) {
        let names = shards.iter().map(|s| s.name.as_str());
        let free: BTreeSet<String> = memory
            .moves
            .free_for_unplanned(names, planned)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let grouped = Shards::new(world);
        for s in shards.iter().filter(|s| free.contains(&s.name)) {
            let zone = preferred_zone(&grouped, &self.policy, &s.name);
            let view = s.view(world, zone, self.timings.lease_ms);
            match promotion::decide(&view, &self.failover) {
                Ok(p) => self.start_promotion(s, p, memory, done),
                Err(hold) => memory.repl.note_hold(&s.name, &hold),
            }
        }
    }

    fn start_promotion(
        &self,
        s: &ShardRound,
        p: Promotion,
        memory: &mut CoordinatorMemory,
        done: &mpsc::Sender<Finished>,
    ) {
        let Some(record) = memory.repl.client(&s.name) else {
            return;
        };
        let old = s.existing().and_then(ShardRecord::recorded_primary);
        let reference = old
            .and_then(|o| s.reference(o))
            .or_else(|| s.reference(&p.target));
        let started = self.begin_failover(&s.name, &p, reference, memory);
        let links = self.links(s);
        let waits = execute::Waits {
            fence_ms: self.timings.lease_ms,
            consent_ms: self.consent_ms,
        };
        let (lead, clock) = (self.term.clone(), self.clock);
        let run = async move {
            let may_act = || lead.borrow().may_act(clock.now());
            execute::run_promotion(&p, links, &record, waits, clock, may_act).await
        };
        spawn_move(started, run, done);
    }

    /// Books an unplanned failover as started: in flight, logged, its Event.
    fn begin_failover(
        &self,
        shard: &str,
        p: &Promotion,
        reference: Option<ObjectReference>,
        memory: &mut CoordinatorMemory,
    ) -> Move {
        memory
            .moves
            .start(shard, Started::Unplanned, self.clock.now());
        memory.repl.holds.remove(shard);
        self.metrics
            .coordinator_decision(jiff::Timestamp::now().as_second());
        tracing::warn!(shard, to = %p.target, epoch = p.epoch, reason = %p.reason, "failover: promoting");
        let note = format!("→ {} at epoch {}: {}", p.target, p.epoch, p.reason);
        self.event(
            reference.clone(),
            EventType::Warning,
            "FailoverStarted",
            note,
        );
        if p.empty {
            let note = format!(
                "no member of shard {shard} holds a key as {} becomes primary at epoch {}: whatever the shard held is gone (every member came back without its data: no persistence, or its volumes were lost)",
                p.target, p.epoch
            );
            tracing::error!(shard, "{note}");
            self.event(reference.clone(), EventType::Warning, "ShardDataLost", note);
        }
        Move {
            shard: shard.to_owned(),
            to: p.target.clone(),
            from: None,
            kind: "Failover",
            decision: None,
            reference,
        }
    }
}

/// This round's shards: their pods, the members that answered, the records as last read.
fn rounds(
    grouped: BTreeMap<String, Vec<Arc<Pod>>>,
    mut valkey: BTreeMap<String, MemberValkey>,
    state: &State,
) -> Vec<ShardRound> {
    grouped
        .into_iter()
        .map(|(name, pods)| {
            let mine: BTreeMap<String, MemberValkey> = pods
                .iter()
                .filter_map(|p| p.metadata.name.as_deref())
                .filter_map(|n| Some((n.to_owned(), valkey.remove(n)?)))
                .collect();
            let record = state.records.get(&name).and_then(|r| r.seen.clone());
            ShardRound {
                name,
                pods,
                valkey: mine,
                record,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use valkey_sidecar_core::observation::Role;

    fn record(version: &str) -> Option<ShardRecord> {
        Some(ShardRecord {
            version: version.into(),
            ..ShardRecord::bootstrap("v-0-0")
        })
    }

    fn primary() -> MemberValkey {
        MemberValkey {
            role: Role::Primary,
            offset: 10,
            link_up: false,
            fresh: false,
            keys: 10,
        }
    }

    fn shard(record: Option<Option<ShardRecord>>, answering: &[&str]) -> ShardRound {
        ShardRound {
            name: "0".into(),
            pods: Vec::new(),
            valkey: answering
                .iter()
                .map(|p| (p.to_string(), primary()))
                .collect(),
            record: record.map(|record| SeenRecord {
                record,
                ..SeenRecord::default()
            }),
        }
    }

    #[test]
    fn a_shard_is_calm_only_while_its_holder_serves_and_nothing_is_in_flight() {
        assert!(shard(Some(record("1")), &["v-0-0"]).calm(false));
        assert!(
            !shard(Some(record("1")), &["v-0-0"]).calm(true),
            "a move runs"
        );
        assert!(
            !shard(Some(record("1")), &[]).calm(false),
            "the holder is silent"
        );
        assert!(!shard(None, &["v-0-0"]).calm(false), "never read");
        assert!(shard(Some(None), &[]).calm(false), "not bootstrapped yet");
        let released = record("1").map(|r| r.released());
        assert!(!shard(Some(released), &["v-0-0"]).calm(false));
    }

    #[test]
    fn a_countdown_is_one_hold_but_a_new_reason_is_another() {
        let mut state = State::default();
        let held = |left: u64| Hold {
            kind: HoldKind::Held,
            reason: format!("v-0-0 holds the record ({left} ms left)"),
        };
        state.note_hold("0", &held(900));
        state.note_hold("0", &held(650));
        assert_eq!(state.holds["0"], "Held");
        let none = Hold {
            kind: HoldKind::NoCandidate,
            reason: "no member can take over".into(),
        };
        state.note_hold("0", &none);
        assert_eq!(state.holds["0"], "NoCandidate: no member can take over");
    }
}
