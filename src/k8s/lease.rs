//! The Lease election adapter: reads and writes one `coordination.k8s.io/v1` Lease for
//! `core::lease::Candidate`, and publishes who leads.
//!
//! Writes carry the `resourceVersion` of the record they were based on, so a concurrent writer
//! gets 409 and nobody overwrites a renewal it has not seen. `renewTime` is written for humans and
//! `kubectl`; no decision ever reads it — expiry is judged on the local monotonic clock.
//!
//! The holder's writes also carry the coordinator's status as `status.valkey.io/*` annotations
//! (`core::status`): the renewals happen anyway, so the status costs no extra write, and only the
//! holder ever writes it. A release drops them, as a released Lease vouches for nothing.
//!
//! The operator's requests (`valkey.io/paused`, `valkey.io/switchover`; `core::requests`) are
//! carried on by every write too ([`RequestCell`]), until a `resume` removes the pause or the
//! coordinator answers the switchover.
//!
//! The holder names the pods that take over first (`valkey.io/successors`, [`SuccessorCell`]); a
//! release carries the list on, so only they contend at once.
//!
//! One annotation outlives holders and releases: `valkey.io/cluster-formed` ([`FormedMarker`]),
//! when the coordinator first saw the cluster formed. Every write carries it on, so after a full
//! restart without persistence the next coordinator knows that the empty cluster it forms replaces
//! one that held data.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::ObjectMeta;
use kube::runtime::watcher;
use tokio::sync::watch;
use valkey_sidecar_core::lease::{Candidate, LeaseAction, LeaseRecord, LeaseTimings};
use valkey_sidecar_core::requests::{PAUSED, Requests, SWITCHOVER};
use valkey_sidecar_core::time::Millis;

use super::KubeError;
use super::format::{FormatNotice, stamp};
use super::lease_object::LeaseObject;
use super::owner::LeaseOwner;
use crate::runtime::clock::Clock;

/// Who leads, as this agent knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordinatorTerm {
    /// The agent may act until this local time (its renew deadline); `None`: it does not lead.
    pub until: Option<Millis>,
    pub holder: Option<String>,
    /// The Lease names this agent as its holder, as last read or written: true also while its
    /// term has lapsed with a renewal still in flight, which may yet start a new term.
    pub held: bool,
}

impl CoordinatorTerm {
    /// Whether the agent may issue an action at `now`.
    pub fn may_act(&self, now: Millis) -> bool {
        self.until.is_some_and(|u| now < u)
    }
}

/// The status annotations the holder writes with each renewal (`core::status::annotations`);
/// empty while this agent does not lead.
pub type StatusAnnotations = BTreeMap<String, String>;

/// When the cluster was first seen formed: learnt from every Lease read and write, set by the
/// coordinator, carried on by every write (the status annotations are not: they end with a holder).
#[derive(Clone, Debug, Default)]
pub struct FormedMarker(Arc<Mutex<Option<String>>>);

impl FormedMarker {
    pub const ANNOTATION: &'static str = "valkey.io/cluster-formed";

    pub fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Keeps `value()` unless a value is known already (the first formation's time stays);
    /// `value` runs only then.
    pub fn set_if_unset(&self, value: impl FnOnce() -> String) {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if known.is_none() {
            *known = Some(value());
        }
    }

    fn learn(&self, lease: &Lease) {
        let annotations = lease.metadata.annotations.as_ref();
        if let Some(v) = annotations.and_then(|a| a.get(Self::ANNOTATION)) {
            self.set_if_unset(|| v.clone());
        }
    }
}

/// The pods the holder names to take over first (`core::lease::successors`), as
/// `valkey.io/successors`: set by the coordinator, learnt from every read and write, and carried
/// on by every write, a release included — so that after a release too only they contend at
/// once. A new holder's coordinator names its own in its first round.
#[derive(Clone, Debug, Default)]
pub struct SuccessorCell(Arc<Mutex<Vec<String>>>);

impl SuccessorCell {
    pub const ANNOTATION: &'static str = "valkey.io/successors";

    pub fn set(&self, pods: Vec<String>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = pods;
    }

    fn get(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn learn(&self, lease: &Lease) {
        self.set(successors_of(lease));
    }

    fn carry(&self, out: &mut StatusAnnotations) {
        let pods = self.get();
        if !pods.is_empty() {
            out.insert(Self::ANNOTATION.to_owned(), pods.join(","));
        }
    }
}

/// The successors a Lease names; none when it names none.
fn successors_of(lease: &Lease) -> Vec<String> {
    let annotations = lease.metadata.annotations.as_ref();
    let value = annotations.and_then(|a| a.get(SuccessorCell::ANNOTATION));
    value.map_or_else(Vec::new, |v| {
        v.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

/// The operator's requests on the Lease (`core::requests`): learnt from every read and write,
/// carried on by every write (a write replaces the object, and a pause must outlive holders),
/// except a switchover request the coordinator has answered (`consume`).
#[derive(Clone, Debug, Default)]
pub struct RequestCell(Arc<Mutex<RequestState>>);

#[derive(Debug, Default)]
struct RequestState {
    paused: Option<String>,
    switchover: Option<String>,
    /// The switchover value answered: dropped from the writes while the Lease still shows it.
    consumed: Option<String>,
}

impl RequestCell {
    fn lock(&self) -> std::sync::MutexGuard<'_, RequestState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The requests as last seen on the Lease, a consumed switchover left out.
    pub fn get(&self) -> Requests {
        let s = self.lock();
        let pending = s
            .switchover
            .as_deref()
            .filter(|v| s.consumed.as_deref() != Some(*v));
        Requests::from_annotations(|key| match key {
            PAUSED => s.paused.as_deref(),
            SWITCHOVER => pending,
            _ => None,
        })
    }

    /// The switchover request now pending has been answered.
    pub fn consume(&self) {
        let mut s = self.lock();
        s.consumed = s.switchover.clone();
    }

    fn learn(&self, lease: &Lease) {
        let annotations = lease.metadata.annotations.as_ref();
        let get = |k: &str| annotations.and_then(|a| a.get(k)).cloned();
        let mut s = self.lock();
        s.paused = get(PAUSED);
        s.switchover = get(SWITCHOVER);
        if s.switchover.is_none() {
            s.consumed = None;
        }
    }

    fn carry(&self, out: &mut StatusAnnotations) {
        let s = self.lock();
        if let Some(p) = &s.paused {
            out.insert(PAUSED.to_owned(), p.clone());
        }
        if let Some(v) = s
            .switchover
            .as_ref()
            .filter(|v| s.consumed.as_ref() != Some(*v))
        {
            out.insert(SWITCHOVER.to_owned(), v.clone());
        }
    }
}

/// The coordinator's Lease, read and written with optimistic concurrency ([`LeaseObject`]).
#[derive(Clone)]
pub struct LeaseClient {
    lease: LeaseObject,
    status: watch::Receiver<StatusAnnotations>,
    formed: FormedMarker,
    requests: RequestCell,
    successors: SuccessorCell,
}

impl LeaseClient {
    /// Where a Lease of an unknown format is told.
    pub fn telling(mut self, notice: FormatNotice) -> LeaseClient {
        self.lease.set_notice(notice);
        self
    }

    /// Shares the operator's requests with the coordinator.
    pub fn asked(mut self, requests: RequestCell) -> LeaseClient {
        self.requests = requests;
        self
    }

    /// The owner to put on the Lease.
    pub fn owned_by(mut self, owner: Option<LeaseOwner>) -> LeaseClient {
        self.lease.set_owner(owner);
        self
    }

    /// Shares the successors the coordinator names.
    pub fn naming(mut self, successors: SuccessorCell) -> LeaseClient {
        self.successors = successors;
        self
    }

    /// Whether followers watch the Lease (`SIDECAR_LEASE_WATCH`; [`LeaseObject::set_watch`]).
    pub fn watching(mut self, watch: bool) -> LeaseClient {
        self.lease.set_watch(watch);
        self
    }

    /// Shares the formation marker with the coordinator.
    pub fn remembering(mut self, formed: FormedMarker) -> LeaseClient {
        self.formed = formed;
        self
    }

    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        timeout: Duration,
        status: watch::Receiver<StatusAnnotations>,
    ) -> LeaseClient {
        LeaseClient {
            lease: LeaseObject::new(client, namespace, name.to_owned(), timeout, "coordinator"),
            status,
            formed: FormedMarker::default(),
            requests: RequestCell::default(),
            successors: SuccessorCell::default(),
        }
    }

    /// The current record; `None` when the Lease does not exist. A Lease of a newer format is an
    /// error, as an unreadable one: the election then neither takes it over nor renews it.
    pub async fn read(&self, limit: Duration) -> Result<Option<LeaseRecord>, KubeError> {
        let lease = self.lease.get_within(limit).await?;
        if let Some(l) = &lease {
            self.learn(l);
        }
        Ok(lease.as_ref().map(record_of))
    }

    /// A Lease a watch delivered, taken as a read takes it (format checked, marker, requests and
    /// owner learnt).
    pub fn absorb(&self, lease: &Lease) -> Result<LeaseRecord, KubeError> {
        self.lease.accept(lease)?;
        self.learn(lease);
        Ok(record_of(lease))
    }

    fn learn(&self, lease: &Lease) {
        self.formed.learn(lease);
        self.requests.learn(lease);
        self.successors.learn(lease);
    }

    /// The Lease's changes ([`LeaseObject::changes`]).
    pub fn changes(&self) -> BoxStream<'static, Result<watcher::Event<Lease>, watcher::Error>> {
        self.lease.changes()
    }

    /// Creates the Lease, or replaces it if it exists (409 when someone wrote in between); the
    /// write may take `limit`.
    pub async fn write(
        &self,
        rec: &LeaseRecord,
        exists: bool,
        limit: Duration,
    ) -> Result<LeaseRecord, KubeError> {
        let written = self
            .lease
            .put_within(limit, !exists, |owner| self.lease_of(rec, owner))
            .await?;
        self.learn(&written);
        Ok(record_of(&written))
    }

    /// The status goes only with a record that names a holder: a release carries none, and the
    /// replace then removes what the holder wrote before. The formation marker goes with every
    /// write.
    fn annotations(&self, rec: &LeaseRecord) -> Option<StatusAnnotations> {
        let holds = rec.holder.as_deref().is_some_and(|h| !h.is_empty());
        let mut out = if holds {
            self.status.borrow().clone()
        } else {
            StatusAnnotations::new()
        };
        if let Some(at) = self.formed.get() {
            out.insert(FormedMarker::ANNOTATION.to_owned(), at);
        }
        self.requests.carry(&mut out);
        self.successors.carry(&mut out);
        stamp(&mut out);
        Some(out)
    }

    fn lease_of(&self, rec: &LeaseRecord, owner: Option<OwnerReference>) -> Lease {
        let now = MicroTime(jiff::Timestamp::now());
        let version = Some(rec.version.clone()).filter(|v| !v.is_empty());
        Lease {
            metadata: ObjectMeta {
                name: Some(self.lease.name().to_owned()),
                resource_version: version,
                annotations: self.annotations(rec),
                owner_references: owner.map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: rec.holder.clone(),
                lease_duration_seconds: Some(
                    i32::try_from(rec.lease_ms.div_ceil(1000)).unwrap_or(i32::MAX),
                ),
                lease_transitions: Some(i32::try_from(rec.transitions).unwrap_or(i32::MAX)),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..LeaseSpec::default()
            }),
        }
    }
}

/// The parts of a Lease the election reads.
pub fn record_of(lease: &Lease) -> LeaseRecord {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseRecord {
        holder: spec.holder_identity,
        lease_ms: spec
            .lease_duration_seconds
            .map_or(0, |s| u64::try_from(s).unwrap_or(0) * 1000),
        transitions: spec
            .lease_transitions
            .map_or(0, |t| u32::try_from(t).unwrap_or(0)),
        version: lease.metadata.resource_version.clone().unwrap_or_default(),
        successors: successors_of(lease),
    }
}

/// Runs the election until shutdown, publishing [`CoordinatorTerm`] after every step; releases the
/// Lease on the way out so a successor takes over at once.
pub async fn run(
    lease: LeaseClient,
    identity: String,
    timings: LeaseTimings,
    clock: Clock,
    tx: watch::Sender<CoordinatorTerm>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut e = Candidate::new(identity, timings);
    let mut follow = Follow::new(lease.changes());
    loop {
        let now = clock.now();
        let (action, why) = e.next(now);
        if !matches!(action, LeaseAction::Wait { .. }) {
            tracing::trace!(?action, why, "coordinator lease");
        }
        match action {
            LeaseAction::Read => read(&lease, &mut e, &clock).await,
            // A renewal may take seconds on a loaded apiserver: shutdown does not wait for it.
            LeaseAction::Acquire | LeaseAction::Renew => tokio::select! {
                _ = write(&lease, &mut e, &clock) => {}
                _ = shutdown.changed() => break,
            },
            LeaseAction::Wait { until } => {
                // Wake at the acting deadline too, so the term ends on time even while waiting.
                let wake = e
                    .acting_deadline()
                    .filter(|d| *d > now)
                    .map_or(until, |d| d.min(until));
                let sleep = Duration::from_millis(wake.since(now).max(1));
                tokio::select! {
                    _ = tokio::time::sleep(sleep) => {}
                    _ = shutdown.changed() => break,
                    change = follow.next() => follow.apply(change, &lease, &mut e, &clock),
                }
            }
        }
        publish(&tx, &e, clock.now());
    }
    release(&lease, &mut e, &clock).await;
    publish(&tx, &e, clock.now());
}

/// A follower's watch on the Lease: its changes fed to the election in place of a read every
/// retry period (`Candidate::set_watching`), from its initial list on; any error or a Lease of an
/// unknown format falls back to reads until the watch is listed again.
struct Follow {
    changes: BoxStream<'static, Result<watcher::Event<Lease>, watcher::Error>>,
    /// What the current initial list delivered so far.
    listed: Option<Lease>,
    /// The stream ended (it does not, with backoff; should it, reads go on).
    ended: bool,
}

impl Follow {
    fn new(changes: BoxStream<'static, Result<watcher::Event<Lease>, watcher::Error>>) -> Follow {
        Follow {
            changes,
            listed: None,
            ended: false,
        }
    }

    /// The next change; never, once the stream has ended.
    async fn next(&mut self) -> Option<Result<watcher::Event<Lease>, watcher::Error>> {
        if self.ended {
            return std::future::pending().await;
        }
        self.changes.next().await
    }

    fn apply(
        &mut self,
        change: Option<Result<watcher::Event<Lease>, watcher::Error>>,
        lease: &LeaseClient,
        e: &mut Candidate,
        clock: &Clock,
    ) {
        let event = match change {
            Some(Ok(event)) => event,
            Some(Err(err)) => {
                tracing::debug!(error = %err, "coordinator lease watch: reading instead");
                return e.set_watching(false);
            }
            None => {
                self.ended = true;
                return e.set_watching(false);
            }
        };
        match event {
            watcher::Event::Init => {
                self.listed = None;
                e.set_watching(false);
            }
            watcher::Event::InitApply(l) => self.listed = Some(l),
            watcher::Event::InitDone => {
                let listed = self.listed.take();
                let seen = Self::seen(listed.as_ref(), lease, e, clock);
                e.set_watching(seen);
            }
            watcher::Event::Apply(l) => {
                if !Self::seen(Some(&l), lease, e, clock) {
                    e.set_watching(false);
                }
            }
            watcher::Event::Delete(_) => {
                Self::seen(None, lease, e, clock);
            }
        }
    }

    /// Feeds the Lease as it is now (`None`: gone) to a follower's election; false when it
    /// cannot be read (a newer format: the reads then report it).
    fn seen(l: Option<&Lease>, lease: &LeaseClient, e: &mut Candidate, clock: &Clock) -> bool {
        if !e.wants_changes() {
            return true;
        }
        match l.map(|l| lease.absorb(l)).transpose() {
            Ok(record) => {
                e.observe(record, clock.now());
                true
            }
            Err(err) => {
                tracing::debug!(error = %err, "coordinator lease watch: reading instead");
                false
            }
        }
    }
}

fn publish(tx: &watch::Sender<CoordinatorTerm>, e: &Candidate, now: Millis) {
    let until = e.is_coordinator(now).then(|| e.acting_deadline()).flatten();
    let next = CoordinatorTerm {
        until,
        holder: e.holder().map(str::to_owned),
        held: e.holder() == Some(e.identity.as_str()),
    };
    tx.send_if_modified(|l| {
        let changed = *l != next;
        // Every renewal moves the deadline; only a change of coordinator or holder is news.
        let news = l.until.is_some() != next.until.is_some() || l.holder != next.holder;
        if news {
            tracing::info!(coordinating = next.until.is_some(), holder = ?next.holder, "coordinator lease");
        }
        if changed {
            *l = next;
        }
        changed
    });
}

async fn read(lease: &LeaseClient, e: &mut Candidate, clock: &Clock) {
    read_within(lease, e, clock, e.timings.call_limit_ms()).await;
}

/// A read that may take `limit_ms`.
async fn read_within(lease: &LeaseClient, e: &mut Candidate, clock: &Clock, limit_ms: u64) {
    match lease.read(Duration::from_millis(limit_ms)).await {
        Ok(rec) => e.observe(rec, clock.now()),
        Err(err) => {
            tracing::warn!(error = %err, "reading the lease failed");
            e.read_failed(clock.now());
        }
    }
}

async fn write(lease: &LeaseClient, e: &mut Candidate, clock: &Clock) {
    let sent = clock.now();
    let limit = Duration::from_millis(e.write_limit_ms());
    match lease.write(&e.record_to_write(), e.exists(), limit).await {
        Ok(rec) => e.written(rec, sent),
        Err(err) => {
            tracing::debug!(error = %err, "lease write failed");
            e.write_failed(clock.now());
            // The record moved (409: often our own renewal, applied after we stopped waiting
            // for it) or is unknown: read before trying again, a holder within a renew deadline
            // (a loaded apiserver answers in seconds, and without the read's version the next
            // renewal is refused too).
            let limit = e.write_limit_ms();
            read_within(lease, e, clock, limit).await;
        }
    }
}

async fn release(lease: &LeaseClient, e: &mut Candidate, clock: &Clock) {
    if !e.is_coordinator(clock.now()) {
        return;
    }
    let mut outcome = release_once(lease, e).await;
    // A renewal the shutdown cut short may have been applied all the same (409): read what is
    // there, and release it if it is still ours.
    if outcome.as_ref().is_err_and(|err| err.kind() == "conflict") {
        read(lease, e, clock).await;
        if e.is_coordinator(clock.now()) {
            outcome = release_once(lease, e).await;
        }
    }
    match outcome {
        Ok(_) => tracing::info!("lease released"),
        Err(err) => {
            tracing::warn!(error = %err, "releasing the lease failed; successors wait for expiry")
        }
    }
    e.released();
}

async fn release_once(lease: &LeaseClient, e: &Candidate) -> Result<LeaseRecord, KubeError> {
    let mut rec = e.record_to_write();
    rec.holder = Some(String::new());
    let limit = Duration::from_millis(e.timings.call_limit_ms());
    lease.write(&rec, true, limit).await
}
