//! Replication mode, the agent's own part: the *keeper* holds its shard's primary record while its
//! Valkey is the recorded primary, fences its Valkey (`CLIENT PAUSE … WRITE`) when it cannot
//! renew in time, releases the record when its Valkey is gone, and points its Valkey at the
//! recorded primary otherwise. Every decision is `core::replication::local`; this module reads the
//! record, observes, and carries the decision out.
//!
//! Promotions are not here: only the coordinator (the cluster Lease holder) promotes.

mod commands;
mod foreign;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher;
use tokio::sync::watch;
use valkey_sidecar_core::health::{Bounds, HealthState};
use valkey_sidecar_core::heartbeat::{PeerSight, Promise};
use valkey_sidecar_core::lease::LeaseTimings;
use valkey_sidecar_core::replication::{
    Claim, Holding, LocalAction, LocalValkey, LocalView, SeenRecord, ShardRecord, ValkeyMemory,
    address_fresh, awaiting_promotion, claim, keeper, keeper_read_due, may_advertise,
    successor_wanted, unvouched,
};
use valkey_sidecar_core::time::Millis;

use crate::k8s::KubeError;
use crate::k8s::format::FormatNotice;
use crate::k8s::owner::LeaseOwner;
use crate::k8s::pods::{DEFAULT_SHARD, SHARD_INDEX_LABEL, node_index};
use crate::k8s::record::RecordClient;
use crate::runtime::clock::Clock;
use crate::runtime::metrics::Metrics;
use crate::runtime::task::Owned;
use crate::valkey::{Connector, Session};

/// Everything the keeper needs.
#[derive(Clone)]
pub struct Keeper {
    pub client: kube::Client,
    pub namespace: String,
    pub pod: String,
    pub cluster: String,
    /// Selects the cluster's pods (to look for a master with data before bootstrapping).
    pub selector: String,
    pub timings: LeaseTimings,
    /// Whether the record is followed through a watch (`SIDECAR_LEASE_WATCH`).
    pub lease_watch: bool,
    pub clock: Clock,
    pub bounds: Bounds,
    pub state: watch::Receiver<HealthState>,
    /// The local Valkey; its port is every pod's Valkey port.
    pub connector: Connector,
    pub poll: Duration,
    pub metrics: Arc<Metrics>,
    /// Whether this agent holds a valid renewal of a record naming it: the labeler and `/primary`
    /// claim `primary` only then, so a fenced master is never advertised.
    pub claim: watch::Sender<bool>,
    /// Set while a promotion of the local Valkey is due (`core::replication::awaiting_promotion`):
    /// the observer then polls fast, so the promoted node is advertised within milliseconds.
    pub hurry: watch::Sender<bool>,
    /// Set on the record when this agent writes it (`k8s::owner`).
    pub owner: Option<LeaseOwner>,
    /// Events on this agent's pod (`SIDECAR_EVENTS`): a record naming a pod outside the shard.
    pub recorder: Option<crate::k8s::events::Recorder>,
    /// This pod's UID (`POD_UID`), for the Events' reference.
    pub pod_uid: Option<String>,
    /// This pod's shard and its record as the keeper last read it, for the coordinator of the
    /// same agent (same monotonic clock): a new coordinator starts judging expiry from it instead of
    /// from its own first read, so losing the primary and the coordinator together costs one
    /// lease, not two.
    pub seed: watch::Sender<RecordSeed>,
    /// The keeper's side of the peer heartbeats; `None`: they are off.
    pub beats: Option<KeeperBeats>,
}

/// What the keeper and the heartbeat task (`crate::peers::heartbeat`) tell each other.
#[derive(Clone)]
pub struct KeeperBeats {
    /// The shard's members (filled by a watch the keeper starts once it knows its shard).
    pub members: watch::Sender<BTreeMap<String, std::net::IpAddr>>,
    /// The epoch this agent holds and from when it asks for promises (`replication::claim`).
    pub claim: watch::Sender<Option<Claim>>,
    pub sight: watch::Receiver<Option<PeerSight>>,
    pub promise: watch::Receiver<Option<Promise>>,
}

/// A shard and its record as seen by this agent's keeper.
pub type RecordSeed = Option<(String, SeenRecord)>;

/// Where this pod sits, from its own labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Seat {
    shard: String,
    node_index: Option<u32>,
    /// The pod carries the shard label (the chart's and the operator's pods do); without it,
    /// membership is the cluster's selector alone.
    shard_labelled: bool,
}

/// What the keeper remembers between steps.
#[derive(Default)]
struct KeeperMemory {
    seen: Option<SeenRecord>,
    holding: Option<Holding>,
    fenced_until: Option<Millis>,
    /// The local Valkey's role and run, and whether its data is trusted.
    valkey: ValkeyMemory,
    /// Pod name → (`ip:port`, when looked up), for the recorded primary.
    addrs: BTreeMap<String, (String, Millis)>,
    /// The pod outside the shard a record last named (reported once, `foreign`).
    foreign: Option<String>,
    /// The successor last refused (reported once, `foreign`).
    unfollowed: Option<String>,
    force_read: bool,
    /// When the watch of the record last delivered a change; `None` after an error (reads every
    /// retry period resume until it delivers again).
    last_event: Option<Millis>,
    last_reason: String,
}

impl Keeper {
    /// Where a record of an unknown format is told: metrics, log, an Event on the agent's pod.
    fn format_notice(&self) -> FormatNotice {
        let events = self.recorder.clone().map(|r| (r, self.own_reference()));
        FormatNotice::new(self.metrics.clone(), events)
    }

    /// Runs until shutdown; on the way out a holder fences its Valkey and releases the record, so
    /// the coordinator can promote at once instead of waiting for the record to expire.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        // A keeper started afresh (after a panic of the last one) holds nothing until it renews.
        self.claim.send_replace(false);
        let Some(seat) = self.seat(&mut shutdown).await else {
            return;
        };
        let name = ShardRecord::lease_name(&self.cluster, &seat.shard);
        let lease_timeout = self.api_limit();
        let lease = Duration::from_millis(self.timings.lease_ms);
        let records = RecordClient::new(
            self.client.clone(),
            &self.namespace,
            (&self.cluster, &seat.shard),
            lease_timeout,
            lease,
        )
        .owned_by(self.owner.clone())
        .telling(self.format_notice())
        .watching(self.lease_watch);
        tracing::info!(shard = %seat.shard, lease = %name, "replication keeper started");
        let mut session = Session::new(self.connector.clone());
        let mut memory = KeeperMemory::default();
        // Every new observation is a step: a holder whose Valkey just died releases within the
        // tick that saw it, not at the keeper's own next poll. A record that changes hands is
        // read at once (the watch only triggers the read: decisions rest on quorum reads).
        let mut observed = self.state.clone();
        let mut changes = records.watch();
        let _members = self.follow_members(&seat);
        let mut beats = self.beats.as_ref().map(|b| b.sight.clone());
        loop {
            let wake = self.next_wake(&memory);
            tokio::select! {
                _ = tokio::time::sleep(wake) => {}
                () = sight_changed(&mut beats) => {}
                Ok(()) = observed.changed() => {}
                Some(change) = changes.next() => self.heard(change, &mut memory),
                _ = shutdown.changed() => break,
            }
            self.step(&seat, &records, &mut session, &mut memory).await;
        }
        self.stop(&records, &mut session, &mut memory).await;
    }

    /// The pod's shard and node index; retried until the API answers (or shutdown).
    async fn seat(&self, shutdown: &mut watch::Receiver<bool>) -> Option<Seat> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut wait =
            crate::runtime::retry::exponential(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            match tokio::time::timeout(Duration::from_secs(5), pods.get(&self.pod)).await {
                Ok(Ok(pod)) => return Some(seat_of(&pod)),
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot read my own pod; retrying"),
                Err(_) => tracing::warn!("reading my own pod timed out; retrying"),
            }
            let delay = wait.next().unwrap_or(Duration::from_secs(5));
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => return None,
            }
        }
    }

    /// The next poll, or the holding's deadline or a change of the vouches or of a promise if
    /// that comes first: the fence must land on time, a promise kept no longer than made.
    fn next_wake(&self, memory: &KeeperMemory) -> Duration {
        let poll = crate::runtime::clock::millis(self.poll);
        let ahead = [self.deadline_ahead(memory), self.beats_ahead()];
        let soonest = ahead.into_iter().flatten().min();
        Duration::from_millis(soonest.map_or(poll, |ms| ms.min(poll)))
    }

    /// Milliseconds until the vouches or this member's promise may change by the clock alone.
    fn beats_ahead(&self) -> Option<u64> {
        let beats = self.beats.as_ref()?;
        let now = self.clock.now();
        let sight = beats
            .sight
            .borrow()
            .as_ref()
            .and_then(|s| s.next_change(now));
        let promise = beats.promise.borrow().as_ref().map(|p| p.until);
        let soonest = [sight, promise]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .min()?;
        Some(soonest.since(now))
    }

    /// Starts the watch of the shard's members for the heartbeats; it ends with the returned guard.
    fn follow_members(&self, seat: &Seat) -> Option<Owned<()>> {
        let beats = self.beats.as_ref()?;
        let task = crate::k8s::members::follow(
            self.client.clone(),
            self.namespace.clone(),
            self.members_of(seat),
            beats.members.clone(),
            self.metrics.clone(),
        );
        Some(Owned::spawn(task))
    }

    /// Milliseconds until the holding's deadline, while it lies ahead.
    fn deadline_ahead(&self, memory: &KeeperMemory) -> Option<u64> {
        let now = self.clock.now();
        let deadline = memory.holding.as_ref()?.deadline(&self.timings);
        (deadline > now).then(|| deadline.since(now))
    }

    /// Fence if due, then observe, read the record when due, decide and act (see [`Self::decide`]).
    async fn step(
        &self,
        seat: &Seat,
        records: &RecordClient,
        session: &mut Session,
        memory: &mut KeeperMemory,
    ) {
        // First, with what is known and no API call: a fence due now must not wait behind a
        // request to an apiserver that may not answer, nor must lifting one whose cause is gone.
        self.settle_first(seat, records, session, memory).await;
        // A holder's requests never outlive its deadline: a renewal hanging on a frozen
        // apiserver would otherwise hold the fence back by up to the request timeout. Cut off at
        // the deadline, the step fences at once (an unanswered renewal may still have landed;
        // the next read shows it, and the fence is lifted then). Nor do they outlive the
        // vouches the holder writes on: the peers falling silent mid-request fences as well.
        // And a fenced holder whose vouches come back mid-request lifts its fence at once.
        let budget = self.until_deadline(memory);
        let watch = self.isolation_watch(memory);
        let cut = {
            let decided = self.decide(seat, records, session, memory);
            self.until_cut(decided, budget, watch).await
        };
        if let Some(cut) = cut {
            cut.log();
            self.settle_first(seat, records, session, memory).await;
        }
    }

    /// Runs `decided` to its end, or until the deadline (`budget`) or until what the holder
    /// relies on or waits for (`watch`) changes: then it is dropped and the reason returned.
    async fn until_cut(
        &self,
        decided: impl Future<Output = ()>,
        budget: Duration,
        watch: Option<Reliance>,
    ) -> Option<Cut> {
        let deadline = tokio::time::Instant::now() + budget;
        // A vouch or promise that comes back arrives with a heartbeat, not by the clock.
        let mut sight = watch.and(self.beats.as_ref()).map(|b| b.sight.clone());
        tokio::pin!(decided);
        loop {
            let check = watch
                .and_then(|_| self.beats_ahead())
                .map(Duration::from_millis);
            let until = check.map_or(deadline, |d| deadline.min(tokio::time::Instant::now() + d));
            tokio::select! {
                biased;
                () = &mut decided => return None,
                () = tokio::time::sleep_until(until) => {}
                () = sight_changed(&mut sight) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Some(Cut::Fence(
                    "the renew deadline passed while waiting for the apiserver",
                ));
            }
            if let Some(cut) = watch.and_then(|r| self.reliance_cut(r)) {
                return Some(cut);
            }
        }
    }

    /// What the holder's writes rest on besides its renewal as the step begins, or what its fence
    /// waits for.
    fn isolation_watch(&self, memory: &KeeperMemory) -> Option<Reliance> {
        let beats = self.beats.as_ref()?;
        let sight = beats.sight.borrow();
        let sight = sight.as_ref()?;
        let h = memory.holding.as_ref()?;
        let now = self.clock.now();
        let fenced = memory.fenced_until.is_some();
        match (now < h.deadline(&self.timings), fenced) {
            (true, false) => (!sight.silent(now)).then_some(Reliance::Vouched),
            (true, true) => sight.silent(now).then_some(Reliance::AwaitVouch),
            (false, false) => sight.all_promised(now).then_some(Reliance::Promised),
            (false, true) => (!sight.all_promised(now)).then_some(Reliance::AwaitPromises),
        }
    }

    /// Whether the step must end now because what `r` names changed, and why.
    fn reliance_cut(&self, r: Reliance) -> Option<Cut> {
        const GONE: &str =
            "the vouches this primary writes on ran out while waiting for the apiserver";
        const BACK: &str =
            "my shard's vouches are back: lifting the fence without waiting for the apiserver";
        let beats = self.beats.as_ref()?;
        let now = self.clock.now();
        let sight = beats.sight.borrow();
        let Some(s) = sight.as_ref() else {
            return matches!(r, Reliance::Vouched | Reliance::Promised).then_some(Cut::Fence(GONE));
        };
        match r {
            Reliance::Vouched => s.silent(now).then_some(Cut::Fence(GONE)),
            Reliance::Promised => (!s.all_promised(now)).then_some(Cut::Fence(GONE)),
            Reliance::AwaitVouch => (!s.silent(now)).then_some(Cut::Lift(BACK)),
            Reliance::AwaitPromises => s.all_promised(now).then_some(Cut::Lift(BACK)),
        }
    }

    /// How long the current step may wait on anything: until the holding's deadline while it
    /// lies ahead; otherwise unbounded (an hour) — nothing is held, or the deadline passed and
    /// `settle_first` fenced already, and a late renewal must be able to take its time.
    fn until_deadline(&self, memory: &KeeperMemory) -> Duration {
        self.deadline_ahead(memory)
            .map_or(Duration::from_secs(3600), Duration::from_millis)
    }

    /// Read the record when due, decide, act — up to three times (a fence is followed by a late
    /// renewal, which is followed by lifting the fence).
    async fn decide(
        &self,
        seat: &Seat,
        records: &RecordClient,
        session: &mut Session,
        memory: &mut KeeperMemory,
    ) {
        for _ in 0..3 {
            let valkey = self.local_valkey(memory);
            self.read_if_due(records, valkey.as_ref(), memory).await;
            self.resolve_primary(seat, valkey.as_ref(), memory).await;
            let other_master = self.other_master(seat, memory).await;
            let mut view = self.view(seat, valkey, memory, other_master);
            if let Some(addr) = view
                .primary_addr
                .clone()
                .filter(|_| successor_wanted(&view))
            {
                view.successor = commands::successor(self, &addr).await;
            }
            let action = keeper::decide(&view);
            self.log(&action, memory);
            self.report_unfollowed(&action, &view, &mut memory.unfollowed)
                .await;
            let acted = self.act(action, &view, records, session, memory).await;
            self.publish(&seat.shard, &view, memory);
            if !acted {
                break;
            }
        }
    }

    /// A holder's fence, or the lifting of its fence, decided from what it knows without
    /// reading the record (`keeper::before_read`). Only for a holder: any other fence can wait
    /// for a fresh read, and deciding it from a stale record would fence a primary just promoted.
    /// Carried out like every other action (`act`: counted in `keeper_actions_total`), only
    /// without the read before it.
    async fn settle_first(
        &self,
        seat: &Seat,
        records: &RecordClient,
        session: &mut Session,
        memory: &mut KeeperMemory,
    ) {
        let valkey = self.local_valkey(memory);
        let view = self.view(seat, valkey, memory, false);
        if let Some(action) = keeper::before_read(&view) {
            self.log(&action, memory);
            self.act(action, &view, records, session, memory).await;
            self.publish(&seat.shard, &view, memory);
        }
    }

    fn view(
        &self,
        seat: &Seat,
        valkey: Option<LocalValkey>,
        memory: &KeeperMemory,
        other_master: bool,
    ) -> LocalView {
        let primary = memory
            .seen
            .as_ref()
            .and_then(|s| s.record.as_ref())
            .and_then(|r| r.recorded_primary().map(str::to_owned));
        LocalView {
            now: self.clock.now(),
            me: self.pod.clone(),
            node_index: seat.node_index,
            timings: self.timings,
            valkey,
            record: memory.seen.clone(),
            holding: memory.holding.clone(),
            fenced_until: memory.fenced_until,
            primary_addr: primary.and_then(|p| memory.addrs.get(&p).map(|(a, _)| a.clone())),
            other_master,
            peers: self.beats.as_ref().and_then(|b| b.sight.borrow().clone()),
            promise: self.beats.as_ref().and_then(|b| b.promise.borrow().clone()),
            successor: None,
        }
    }

    /// The local Valkey from the latest fresh observation; `None` while it does not answer or
    /// loads. Tracks since when its role (and primary) and run have been what they are.
    fn local_valkey(&self, memory: &mut KeeperMemory) -> Option<LocalValkey> {
        let now = self.clock.now();
        let state = self.state.borrow();
        // Gone (refused, or silent two ticks in a row) well before its last observation turns
        // stale: a holder releases the record without waiting.
        if state.gone() {
            return None;
        }
        let obs = state.current(now, &self.bounds).cloned()?;
        let observed_at = state.observation.as_ref().map_or(now, |(at, _)| *at);
        drop(state);
        LocalValkey::read(&obs, observed_at, now, &mut memory.valkey)
    }

    /// A change the record's watch delivered: a moved claim is read at once (decisions rest on
    /// quorum reads); a renewal of the same claim is taken as it is, unless this agent holds the
    /// record (its own writes keep it current); an error brings back the periodic reads.
    fn heard(
        &self,
        change: Result<Option<ShardRecord>, watcher::Error>,
        memory: &mut KeeperMemory,
    ) {
        let change = match change {
            Ok(change) => change,
            Err(e) => {
                self.metrics.watch_error("shard_record", &e);
                memory.last_event = None;
                return;
            }
        };
        let now = self.clock.now();
        memory.last_event = Some(now);
        // Deleted: read it (the holder re-creates it one epoch up, not by its next renewal).
        let Some(rec) = change else {
            memory.force_read = true;
            return;
        };
        if moved(memory, &rec) {
            memory.force_read = true;
            return;
        }
        if memory.holding.is_none()
            && let Some(next) = memory.seen.as_ref().and_then(|s| s.after_event(rec, now))
        {
            memory.seen = Some(next);
        }
    }

    /// Reads the record at once when the local role changed since the last read, after a
    /// refused write or a moved claim, and every retry period while its watch is not live.
    async fn read_if_due(
        &self,
        records: &RecordClient,
        valkey: Option<&LocalValkey>,
        memory: &mut KeeperMemory,
    ) {
        let now = self.clock.now();
        let since = valkey.map(|v| v.since);
        let seen = memory.seen.as_ref();
        let retry_ms = self.timings.retry_ms;
        let (forced, last_event) = (memory.force_read, memory.last_event);
        if !keeper_read_due(seen, forced, since, now, retry_ms, last_event) {
            return;
        }
        match records.read().await {
            Ok(record) => {
                memory.force_read = false;
                self.note_read(memory, record, now);
            }
            Err(e) => self.api_error("read", &e),
        }
    }

    /// The address of the recorded primary: looked up when unknown and again when no longer
    /// [`address_fresh`] (a recreated pod keeps its name but gets a new IP). Only a pod of
    /// this cluster and shard has an address: a record naming any other pod (forged, or from
    /// another deployment) never makes this Valkey replicate from it.
    async fn resolve_primary(
        &self,
        seat: &Seat,
        valkey: Option<&LocalValkey>,
        memory: &mut KeeperMemory,
    ) {
        let Some(primary) = memory
            .seen
            .as_ref()
            .and_then(|s| s.record.as_ref())
            .and_then(|r| r.recorded_primary().map(str::to_owned))
        else {
            return;
        };
        let now = self.clock.now();
        let cached = memory.addrs.get(&primary);
        let own = primary == self.pod;
        if cached.is_some_and(|(addr, at)| address_fresh(addr, now.since(*at), own, valkey)) {
            return;
        }
        match self.member_ip(seat, &primary).await {
            Ok(Some(ip)) => {
                let addr = format!("{ip}:{}", self.connector.port);
                memory.addrs.insert(primary, (addr, now));
            }
            Ok(None) => {
                memory.addrs.remove(&primary);
                self.report_foreign(&primary, &mut memory.foreign).await;
            }
            Err(e) => self.api_error("read", &e),
        }
    }

    /// The IP of `pod` if it is a member of this pod's shard: selected by the cluster's selector
    /// and the shard label on the server, so a pod outside the shard reads as absent.
    async fn member_ip(&self, seat: &Seat, pod: &str) -> Result<Option<String>, KubeError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = ListParams::default()
            .labels(&self.members_of(seat))
            .fields(&format!("metadata.name={pod}"));
        let got = crate::k8s::bounded(self.api_limit(), pods.list(&params)).await?;
        let member = got.items.into_iter().next();
        if member.is_none() {
            // Also while the pod is being recreated: no warning for every step of that.
            tracing::debug!(pod, shard = %seat.shard, "the record names no current member of my shard");
        }
        Ok(member.and_then(|p| p.status?.pod_ip))
    }

    /// The label selector of this pod's shard: the cluster's selector and the shard label, or
    /// the cluster's selector alone for pods without that label.
    fn members_of(&self, seat: &Seat) -> String {
        match seat.shard_labelled {
            true => format!("{},{SHARD_INDEX_LABEL}={}", self.selector, seat.shard),
            false => self.selector.clone(),
        }
    }

    /// Only when no record exists (bootstrap): whether another pod of the shard runs a master
    /// holding data, in which case nobody may bootstrap over it.
    async fn other_master(&self, seat: &Seat, memory: &KeeperMemory) -> bool {
        let absent = memory.seen.as_ref().is_some_and(|s| s.record.is_none());
        if !absent {
            return false;
        }
        commands::other_master_with_data(self, &self.members_of(seat)).await
    }

    async fn act(
        &self,
        action: LocalAction,
        view: &LocalView,
        records: &RecordClient,
        session: &mut Session,
        memory: &mut KeeperMemory,
    ) -> bool {
        let kind = action.kind();
        let acted = self.carry_out(action, view, records, session, memory).await;
        if acted {
            self.metrics.keeper_action(kind);
        }
        acted
    }

    async fn carry_out(
        &self,
        action: LocalAction,
        view: &LocalView,
        records: &RecordClient,
        session: &mut Session,
        memory: &mut KeeperMemory,
    ) -> bool {
        match action {
            LocalAction::Renew { .. } => self.renew(view, records, memory).await,
            LocalAction::Bootstrap { epoch, .. } => {
                let rec = ShardRecord {
                    epoch,
                    ..ShardRecord::bootstrap(&self.pod)
                };
                self.write_holding(&rec, view, records, memory).await
            }
            LocalAction::Release { .. } => {
                let answering = view.valkey.is_some();
                self.release(records, session, memory, answering).await
            }
            LocalAction::Fence { until, .. } => {
                self.count_isolation(view);
                commands::fence(session, until.since(view.now), memory, until).await
            }
            LocalAction::Unfence { .. } => commands::unfence(session, memory).await,
            LocalAction::Demote { to, .. } | LocalAction::Rejoin { to, .. } => {
                commands::replicate(session, &to, true, memory).await
            }
            LocalAction::Repoint { to, .. } => {
                commands::replicate(session, &to, false, memory).await
            }
            LocalAction::Wait { .. } | LocalAction::Nothing { .. } => false,
        }
    }

    /// Counts a fence raised because no member vouched (not a renewal of one already up): the
    /// figure that shows the heartbeats' false positives.
    fn count_isolation(&self, view: &LocalView) {
        if view.fenced_until.is_none() && unvouched(view) {
            self.metrics.heartbeat("isolation_fence");
        }
    }

    async fn renew(
        &self,
        view: &LocalView,
        records: &RecordClient,
        memory: &mut KeeperMemory,
    ) -> bool {
        let Some(rec) = memory.seen.as_ref().and_then(|s| s.record.clone()) else {
            return false;
        };
        self.write_holding(&rec, view, records, memory).await
    }

    /// Writes a record naming us; on success our holding counts from the write's *send* time.
    async fn write_holding(
        &self,
        rec: &ShardRecord,
        view: &LocalView,
        records: &RecordClient,
        memory: &mut KeeperMemory,
    ) -> bool {
        let sent = self.clock.now();
        match records.write(rec).await {
            Ok(written) => {
                let run_id = view.valkey.as_ref().map(|v| v.run_id.clone());
                let run_id = run_id.unwrap_or_default();
                memory.valkey.held(&run_id);
                memory.holding = Some(Holding {
                    epoch: written.epoch,
                    renewed_at: sent,
                    run_id,
                });
                self.written(memory, written, sent)
            }
            Err(e) => self.refused(&e, memory),
        }
    }

    async fn release(
        &self,
        records: &RecordClient,
        session: &mut Session,
        memory: &mut KeeperMemory,
        answering: bool,
    ) -> bool {
        let Some(rec) = memory.seen.as_ref().and_then(|s| s.record.clone()) else {
            return false;
        };
        if !rec.held_by(&self.pod) {
            // Not ours (any more): a switchover moved it on. Our claim ends here, nothing else.
            memory.holding = None;
            return false;
        }
        // Writes stop before the record says anyone else may be primary (skipped when Valkey
        // does not answer: nothing to fence, and the attempt would only delay the release).
        if answering {
            let until = self.clock.now().plus(self.timings.lease_ms);
            commands::fence(session, self.timings.lease_ms, memory, until).await;
        }
        let sent = self.clock.now();
        match records.write(&rec.released()).await {
            Ok(written) => {
                memory.holding = None;
                self.written(memory, written, sent)
            }
            Err(e) => self.refused(&e, memory),
        }
    }

    /// A read sent at `sent` and answered now (or our own write): the record's clock restarts
    /// after a gap in the reads longer than the renew deadline ([`seen`]).
    fn note_read(&self, memory: &mut KeeperMemory, record: Option<ShardRecord>, sent: Millis) {
        let at = (sent, self.clock.now());
        seen(memory, record, at, self.timings.renew_deadline_ms);
    }

    /// A Kubernetes call must finish well inside the renew deadline to be of any use.
    fn api_limit(&self) -> Duration {
        Duration::from_millis(self.timings.call_limit_ms())
    }

    /// Our own write is the freshest read there is.
    fn written(&self, memory: &mut KeeperMemory, written: ShardRecord, sent: Millis) -> bool {
        self.note_read(memory, Some(written), sent);
        self.metrics.shard_record("ok");
        true
    }

    /// A refused or failed write: read the record again before deciding anything else.
    fn refused(&self, e: &KubeError, memory: &mut KeeperMemory) -> bool {
        self.api_error("write", e);
        memory.force_read = true;
        false
    }

    /// Tells the labeler and the endpoints whether Valkey may be advertised as primary, the
    /// observer whether a promotion is due, and the coordinator what the record looked like.
    fn publish(&self, shard: &str, view: &LocalView, memory: &KeeperMemory) {
        let seed = memory.seen.clone().map(|s| (shard.to_owned(), s));
        self.seed
            .send_if_modified(|s| std::mem::replace(s, seed.clone()) != seed);
        let view = LocalView {
            holding: memory.holding.clone(),
            fenced_until: memory.fenced_until,
            ..view.clone()
        };
        let valid = may_advertise(&view);
        let fenced = memory.fenced_until.is_some_and(|until| until > view.now);
        self.metrics.fenced(fenced);
        self.claim
            .send_if_modified(|h| std::mem::replace(h, valid) != valid);
        let due = awaiting_promotion(&view);
        self.hurry
            .send_if_modified(|h| std::mem::replace(h, due) != due);
        if let Some(b) = &self.beats {
            let c = claim(&view);
            b.claim
                .send_if_modified(|old| std::mem::replace(old, c) != c);
        }
    }

    fn log(&self, action: &LocalAction, memory: &mut KeeperMemory) {
        let reason = action.reason();
        if reason == memory.last_reason {
            return;
        }
        // A primary alternates between renewing and resting every retry period: not news.
        if matches!(
            action,
            LocalAction::Renew { .. } | LocalAction::Nothing { .. }
        ) && memory.holding.is_some()
        {
            tracing::debug!(action = action.kind(), %reason, "replication");
        } else {
            tracing::info!(action = action.kind(), %reason, "replication");
        }
        memory.last_reason = reason.to_owned();
    }

    fn api_error(&self, op: &'static str, e: &KubeError) {
        tracing::warn!(op, error = %e, "shard record");
        self.metrics.shard_record(e.kind());
    }

    /// Graceful stop: a holder pauses writes and releases, so a successor can be promoted now.
    /// The record is read first: the stop often follows a switchover that moved it on.
    async fn stop(&self, records: &RecordClient, session: &mut Session, memory: &mut KeeperMemory) {
        if memory.holding.is_none() {
            return;
        }
        let sent = self.clock.now();
        match records.read().await {
            Ok(record) => self.note_read(memory, record, sent),
            Err(e) => self.api_error("read", &e),
        }
        if self.release(records, session, memory, true).await {
            tracing::info!("released the shard record on shutdown");
        }
    }
}

/// What a holder's writes rest on besides a valid renewal, or what its fence waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reliance {
    /// A valid renewal and some member's vouch.
    Vouched,
    /// Past the renew deadline: every member's promise (the failsafe).
    Promised,
    /// Fenced with a valid renewal because no member vouched: a vouch.
    AwaitVouch,
    /// Fenced past the renew deadline: every member's promise.
    AwaitPromises,
}

/// Why a step was cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// What the writes rest on is gone: the step ends with a fence.
    Fence(&'static str),
    /// What the fence waited for is back: the step ends by lifting it.
    Lift(&'static str),
}

impl Cut {
    fn log(self) {
        match self {
            Cut::Fence(why) => tracing::warn!("{why}"),
            Cut::Lift(why) => tracing::info!("{why}"),
        }
    }
}

/// Resolves when the heartbeats' sight changes; never without heartbeats.
async fn sight_changed(rx: &mut Option<watch::Receiver<Option<PeerSight>>>) {
    let open = match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => false,
    };
    if !open {
        std::future::pending::<()>().await;
    }
}

/// Whether a watched record names another holder, primary or epoch than the one last read.
fn moved(memory: &KeeperMemory, rec: &ShardRecord) -> bool {
    let last = memory.seen.as_ref().and_then(|s| s.record.as_ref());
    !last.is_some_and(|l| l.same_claim(rec))
}

/// Folds a read (or our own write) into the memory. The clock of an unchanged record restarts
/// after a gap in the reads longer than `gap_ms`, as in the coordinator's own reads: this view
/// seeds a new coordinator of the same agent, and after an apiserver outage it would otherwise judge
/// the primary's record stale at once (a CI run failed over a primary 82 ms after a 60 s outage).
fn seen(memory: &mut KeeperMemory, record: Option<ShardRecord>, at: (Millis, Millis), gap_ms: u64) {
    let prev = memory.seen.take();
    let (sent, received) = at;
    let next = SeenRecord::after_continuous_read(prev.as_ref(), record, sent, received, gap_ms);
    memory.seen = Some(next);
}

fn seat_of(pod: &Pod) -> Seat {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    Seat {
        shard: labels
            .get(SHARD_INDEX_LABEL)
            .cloned()
            .unwrap_or_else(|| DEFAULT_SHARD.into()),
        node_index: node_index(&labels),
        shard_labelled: labels.contains_key(SHARD_INDEX_LABEL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::pods::{NODE_INDEX_LABEL, POD_INDEX_LABEL};

    #[test]
    fn the_seat_comes_from_the_static_labels_with_shard_0_by_default() {
        let mut pod = Pod::default();
        assert_eq!(seat_of(&pod).shard, "0");
        assert!(!seat_of(&pod).shard_labelled);
        pod.metadata.labels = Some(BTreeMap::from([
            (SHARD_INDEX_LABEL.to_owned(), "2".to_owned()),
            (NODE_INDEX_LABEL.to_owned(), "0".to_owned()),
        ]));
        assert_eq!(
            seat_of(&pod),
            Seat {
                shard: "2".into(),
                node_index: Some(0),
                shard_labelled: true,
            }
        );
    }

    #[test]
    fn an_unchanged_record_read_after_an_outage_counts_from_that_read() {
        let record = ShardRecord {
            version: "7".into(),
            ..ShardRecord::bootstrap("valkey-0-0")
        };
        let mut memory = KeeperMemory::default();
        seen(
            &mut memory,
            Some(record.clone()),
            (Millis(0), Millis(5)),
            3_000,
        );
        seen(
            &mut memory,
            Some(record.clone()),
            (Millis(1_000), Millis(1_005)),
            3_000,
        );
        let calm = memory.seen.clone().unwrap();
        assert_eq!(
            calm.changed_at,
            Millis(5),
            "read every second: unchanged since the first"
        );
        // The apiserver was silent for a minute: the seed a new coordinator starts from must give the
        // holder a full lease from now, not call it expired at once.
        seen(
            &mut memory,
            Some(record),
            (Millis(61_000), Millis(61_010)),
            3_000,
        );
        assert_eq!(memory.seen.unwrap().changed_at, Millis(61_010));
    }

    #[test]
    fn the_node_index_falls_back_to_the_statefulset_pod_index() {
        let label = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        assert_eq!(node_index(&label(POD_INDEX_LABEL, "0")), Some(0));
        let mut both = label(POD_INDEX_LABEL, "2");
        both.insert(NODE_INDEX_LABEL.to_owned(), "1".to_owned());
        assert_eq!(node_index(&both), Some(1), "the operator's label wins");
        assert_eq!(node_index(&BTreeMap::new()), None);
    }
}
