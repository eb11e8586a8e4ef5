//! The observation loop: one tick per poll interval, results into the shared health state.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use valkey_sidecar_core::cluster_map::Reading;
use valkey_sidecar_core::health::{Bounds, HealthState, Outcome};
use valkey_sidecar_core::observation::{Mode, Observation, Role};
use valkey_sidecar_core::placement::{Placement, zone_to_push};

use crate::k8s::lease::CoordinatorTerm;
use crate::peers::quorum::QuorumFence;
use crate::runtime::clock::Clock;
use crate::runtime::metrics::Metrics;
use crate::valkey::observe::MapReader;
use crate::valkey::{Connector, Session, ValkeyError, observe};

/// Everything the loop needs.
#[derive(Clone)]
pub struct Observer {
    pub connector: Connector,
    pub mode: Mode,
    pub interval: Duration,
    pub bounds: Bounds,
    pub clock: Clock,
    pub state: watch::Sender<HealthState>,
    pub metrics: Arc<Metrics>,
    /// Where the pod is; its zone is pushed into Valkey's `availability-zone`.
    pub placement: watch::Receiver<Placement>,
    /// Where the zone is handed to the `valkey-settings` container; `None`: `CONFIG SET` here.
    pub zone_file: Option<PathBuf>,
    /// While true, tick every `HURRIED` instead of every interval (a promotion is due).
    pub hurry: watch::Receiver<bool>,
    /// Cluster mode: pauses writes while this primary hears only a minority of primaries.
    pub quorum: Option<QuorumFence>,
    /// Replication mode with a coordinator: whether the keeper may advertise Valkey as primary
    /// (readiness, as `/readyz` says it, for the metrics).
    pub claim: Option<watch::Receiver<bool>>,
    /// The coordinator's term: while this agent leads, it reads the whole cluster map on every
    /// tick (`core::cluster_map`).
    pub lead: watch::Receiver<CoordinatorTerm>,
}

/// The tick period while hurried: the promoted node is seen (and advertised) within this.
const HURRIED: Duration = Duration::from_millis(10);

/// After a failed zone push (e.g. the ACL denies `CONFIG SET`), wait this long.
const ZONE_RETRY: Duration = Duration::from_secs(30);

/// After handing the zone over, look at Valkey's again this much later (not every tick: a missing
/// settings container would cost a file read per tick for good).
const ZONE_HANDED: Duration = Duration::from_secs(5);

impl Observer {
    /// Ticks until shutdown. A tick blocked on Valkey is abandoned at shutdown, not awaited.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut session = Session::new(self.connector.clone());
        let pipe = observe::own_pipeline(self.mode);
        let mut map = MapReader::default();
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut log = LogOnChange::default();
        let mut zone_retry_at = None;
        let mut orphaned = Orphaned::default();
        loop {
            // A closed connection is news (Valkey exited): tick now, not at the next interval.
            let hurried = *self.hurry.borrow_and_update() || orphaned.watching();
            tokio::select! {
                _ = ticker.tick() => {}
                _ = tokio::time::sleep(HURRIED), if hurried => {}
                Ok(()) = self.hurry.changed() => {}
                // A new coordinator acts on a fresh map: read it now, not a tick later.
                Ok(()) = self.lead.changed() => {}
                _ = session.closed() => {}
                () = quorum_news(&mut self.quorum) => {}
                _ = shutdown.changed() => return,
            }
            let started = Instant::now();
            let reading = self.reading();
            let (outcome, error) = tokio::select! {
                r = self.observe(&mut session, &pipe, &mut map, reading) => r,
                _ = shutdown.changed() => return,
            };
            self.metrics
                .tick(started.elapsed(), error.as_ref().map(ValkeyError::kind));
            log.outcome(&outcome);
            orphaned.saw(&outcome);
            if let Outcome::Observed(obs) = &outcome {
                // Fence first: it is the one reaction here that has a deadline.
                if let Some(q) = self.quorum.as_mut() {
                    q.apply(&mut session, obs).await;
                }
                self.push_zone(&mut session, obs, &mut zone_retry_at).await;
            }
            self.record(outcome);
        }
    }

    /// What this tick is, for `core::cluster_map`.
    fn reading(&self) -> Reading {
        Reading {
            leading: self.lead.borrow().until.is_some(),
            fencing: self.quorum.is_some(),
        }
    }

    /// One observation: in cluster mode through the map reader, in replication mode plainly.
    async fn observe(
        &self,
        session: &mut Session,
        pipe: &redis::Pipeline,
        map: &mut MapReader,
        reading: Reading,
    ) -> (Outcome, Option<ValkeyError>) {
        match self.mode {
            Mode::Cluster => map.tick(session, pipe, self.clock.now(), reading).await,
            Mode::Replication => observe::tick(session, pipe, self.mode).await,
        }
    }

    /// Valkey forgets `CONFIG SET` on restart, so the zone is compared on every observation.
    async fn push_zone(
        &mut self,
        session: &mut Session,
        obs: &Observation,
        retry_at: &mut Option<Instant>,
    ) {
        let zone = self.placement.borrow().zone.clone();
        let Some(zone) = zone_to_push(zone.as_deref(), obs.availability_zone.as_deref()) else {
            return;
        };
        if retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let result = match &self.zone_file {
            Some(file) => hand_over_zone(file, zone).await,
            None => set_zone(session, zone).await.map(|()| true),
        };
        let wait = match result {
            // Already handed over: the settings container has not pushed it yet.
            Ok(false) => ZONE_HANDED,
            Ok(true) => {
                tracing::info!(zone, "availability-zone pushed to valkey");
                self.metrics.zone_push(true);
                return;
            }
            Err(e) => {
                tracing::warn!(zone, error = %e, "cannot push availability-zone to valkey");
                self.metrics.zone_push(false);
                ZONE_RETRY
            }
        };
        *retry_at = Some(Instant::now() + wait);
    }

    fn record(&self, outcome: Outcome) {
        let now = self.clock.now();
        self.state.send_modify(|h| h.record(now, outcome));
        let state = self.state.borrow();
        let claim = self.claim.as_ref().map(|rx| *rx.borrow());
        let ready = state.readiness(now, &self.bounds, self.mode, claim).ok;
        self.metrics.update(&state, now, &self.bounds, ready);
    }
}

/// `CONFIG SET availability-zone` on the agent's own connection.
async fn set_zone(session: &mut Session, zone: &str) -> Result<(), String> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("SET").arg("availability-zone").arg(zone);
    session
        .command(&cmd)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Writes the zone for the `valkey-settings` container, unless the file already says it (the
/// container pushes it within a second; Valkey's own view is compared again next tick). Written
/// whole and renamed, so the container never reads half a zone. `Ok(false)`: it already did.
async fn hand_over_zone(file: &std::path::Path, zone: &str) -> Result<bool, String> {
    if tokio::fs::read_to_string(file).await.ok().as_deref() == Some(zone) {
        return Ok(false);
    }
    let partial = file.with_extension("partial");
    let write = async {
        tokio::fs::write(&partial, zone).await?;
        tokio::fs::rename(&partial, file).await
    };
    write
        .await
        .map(|()| true)
        .map_err(|e| format!("{}: {e}", file.display()))
}

/// Resolves when the heartbeats behind the quorum fence change their answer; never without.
async fn quorum_news(quorum: &mut Option<QuorumFence>) {
    match quorum {
        Some(q) => q.news().await,
        None => std::future::pending::<()>().await,
    }
}

/// A replica that lost its primary may be promoted any moment (in cluster mode the coordinator
/// fails a dead primary over within milliseconds), so for a while it is polled every [`HURRIED`]
/// and its new role labelled at once rather than up to an interval later.
#[derive(Default)]
struct Orphaned {
    since: Option<Instant>,
}

/// How long after losing its primary a replica is polled fast: past the node timeout, a promotion
/// that has not happened waits on Valkey's own election, which is not that fast.
const ORPHAN_WATCH: Duration = Duration::from_secs(10);

impl Orphaned {
    fn saw(&mut self, outcome: &Outcome) {
        let lost = matches!(outcome, Outcome::Observed(o) if o.primary_lost());
        self.since = match (lost, self.since) {
            (true, None) => Some(Instant::now()),
            (true, since) => since,
            (false, _) => None,
        };
    }

    fn watching(&self) -> bool {
        self.since.is_some_and(|t| t.elapsed() < ORPHAN_WATCH)
    }
}

/// Logs transitions, not every tick: a Valkey that is down for an hour writes one line, not 14,400.
#[derive(Default)]
struct LogOnChange {
    role: Option<Role>,
    error: Option<String>,
}

impl LogOnChange {
    fn outcome(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Observed(obs) => {
                if let Some(e) = self.error.take() {
                    tracing::info!(previous_error = %e, "valkey observed again");
                }
                if self.role != Some(obs.role) {
                    tracing::info!(from = ?self.role.map(Role::as_str), to = obs.role.as_str(), "valkey role");
                    self.role = Some(obs.role);
                }
            }
            Outcome::Refused(e) | Outcome::Unreachable(e) | Outcome::Down(e) => self.failed(e),
        }
    }

    fn failed(&mut self, e: &str) {
        // Backoff messages change every tick (the remaining delay); compare the cause only.
        let cause = e.split_once(" after: ").map_or(e, |(_, c)| c);
        if self.error.as_deref() != Some(cause) {
            tracing::warn!(error = %e, "valkey observation failed");
            self.error = Some(cause.to_owned());
        }
    }
}
