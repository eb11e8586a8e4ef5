//! Probe verdicts from the cached state.
//!
//! The observation loop records each tick's outcome into [`HealthState`]; HTTP handlers ask it
//! for verdicts. Both are cheap and never wait on Valkey, which is what keeps a slow or blocked
//! Valkey from stalling a kubelet probe.

use crate::observation::{Mode, Observation, Role};
use crate::time::Millis;

/// Thresholds for the verdicts, from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `/livez` fails when the loop has not ticked, or Valkey has not answered, for this long.
    pub liveness_window_ms: u64,
    /// An observation older than this no longer tells the role or readiness.
    pub stale_after_ms: u64,
    /// A replica further behind its primary than this is not ready.
    pub max_lag_bytes: u64,
}

/// What one tick of the observation loop got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Valkey answered with data the agent could read.
    Observed(Box<Observation>),
    /// Valkey answered, but refused (auth, ACL, unexpected reply): it is alive, the agent is blind.
    Refused(String),
    /// No answer: reset, TLS failure, timeout, or a reconnect still backing off.
    Unreachable(String),
    /// Nothing listens at Valkey's address (connection refused): the process is gone, not slow.
    Down(String),
}

/// Failed ticks in a row after which a silent Valkey counts as gone even without a refusal: one
/// timeout may be a busy server (`DEBUG SLEEP`, a slow script), two in a row are not worth waiting
/// on when a failover depends on it.
pub const GONE_AFTER_FAILURES: u32 = 2;

/// How long `/prestop` must have found its pod free to stop before it answers. The coordinator
/// can start a hand-over to a replica just before it sees that replica's pod deleted (every pod of
/// a shard deleted at once: it sees the primary's deletion first); the hand-over lands within this
/// (p99 ~250 ms, a poll later in the agent's view), so the replica, primary now, waits for its own
/// hand-over instead of leaving the shard with no copy. Every stop is this much later.
pub const STOP_SETTLE_MS: u64 = 2_000;

/// `/prestop`'s wait: [`HealthState::stop`]'s answer only once it has held for
/// [`STOP_SETTLE_MS`] without a break.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopWait {
    free_since: Option<Millis>,
}

impl StopWait {
    /// The answer, once settled (`Ok`); else when to look again (`Err(None)`: at the next change).
    pub fn step(
        &mut self,
        verdict: Option<Verdict>,
        now: Millis,
    ) -> Result<Verdict, Option<Millis>> {
        let Some(verdict) = verdict else {
            self.free_since = None;
            return Err(None);
        };
        let since = *self.free_since.get_or_insert(now);
        match now.since(since) >= STOP_SETTLE_MS {
            true => Ok(verdict),
            false => Err(Some(since.plus(STOP_SETTLE_MS))),
        }
    }
}

/// A probe answer and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub reason: String,
}

impl Verdict {
    fn pass(reason: impl Into<String>) -> Verdict {
        Verdict {
            ok: true,
            reason: reason.into(),
        }
    }

    fn fail(reason: impl Into<String>) -> Verdict {
        Verdict {
            ok: false,
            reason: reason.into(),
        }
    }
}

/// What the agent remembers across ticks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthState {
    pub started_at: Millis,
    pub last_tick: Option<Millis>,
    /// Last time Valkey answered anything at all (data, `LOADING`, `NOAUTH`, …).
    pub last_answer: Option<Millis>,
    /// The latest readable observation and when it was taken.
    pub observation: Option<(Millis, Observation)>,
    pub first_observation: Option<Millis>,
    /// Set once the node has seen `cluster_state:ok`; cleared when Valkey restarts. Once joined,
    /// a cluster-wide `fail` (another shard down) must not make every node unready at once.
    pub cluster_joined: bool,
    pub last_error: Option<String>,
    pub consecutive_failures: u32,
    /// The last thing learned about Valkey's socket is that nothing listens there (cleared by the
    /// next answer; timeouts and backoff in between do not clear it).
    pub down: bool,
    /// Valkey was seen as a primary with a replica in this run (cleared when Valkey restarts): its
    /// shard has replica pods, and one that failed or was deleted gets a replacement.
    pub replica_seen: bool,
}

impl HealthState {
    pub fn new(started_at: Millis) -> HealthState {
        HealthState {
            started_at,
            ..HealthState::default()
        }
    }

    /// Folds one tick's outcome into the state.
    pub fn record(&mut self, at: Millis, outcome: Outcome) {
        self.last_tick = Some(at);
        match outcome {
            Outcome::Observed(obs) => self.observed(at, *obs),
            Outcome::Refused(e) => {
                self.down = false;
                self.failed(Some(at), e);
            }
            Outcome::Unreachable(e) => self.failed(None, e),
            Outcome::Down(e) => {
                self.down = true;
                self.failed(None, e);
            }
        }
    }

    /// Whether Valkey counts as gone: refused outright, or silent for
    /// [`GONE_AFTER_FAILURES`] ticks in a row. A replication-mode holder releases its record
    /// then, long before its last observation turns stale.
    pub fn gone(&self) -> bool {
        self.down || self.consecutive_failures >= GONE_AFTER_FAILURES
    }

    fn observed(&mut self, at: Millis, obs: Observation) {
        let restarted = self
            .observation
            .as_ref()
            .is_some_and(|(_, old)| old.run_id != obs.run_id);
        let state_ok = obs.cluster.as_ref().and_then(|c| c.state_ok);
        self.cluster_joined = (self.cluster_joined && !restarted) || state_ok == Some(true);
        let serving = obs.role == Role::Primary && obs.has_replica();
        self.replica_seen = (self.replica_seen && !restarted) || serving;
        self.last_answer = Some(at);
        self.first_observation.get_or_insert(at);
        self.observation = Some((at, obs));
        self.last_error = None;
        self.consecutive_failures = 0;
        self.down = false;
    }

    fn failed(&mut self, answered_at: Option<Millis>, error: String) {
        if answered_at.is_some() {
            self.last_answer = answered_at;
        }
        self.last_error = Some(error);
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
    }

    /// The latest observation if it is still fresh enough to act on.
    pub fn current(&self, now: Millis, bounds: &Bounds) -> Option<&Observation> {
        let (at, obs) = self.observation.as_ref()?;
        (now.since(*at) <= bounds.stale_after_ms).then_some(obs)
    }

    /// The role Valkey has now, as far as the agent can tell; `Unknown` when stale or loading.
    pub fn role(&self, now: Millis, bounds: &Bounds) -> Role {
        match self.current(now, bounds) {
            Some(obs) if !obs.loading => obs.role,
            _ => Role::Unknown,
        }
    }

    /// The role the labels may claim: [`HealthState::role`], but a cluster master whose shard owns
    /// no slots is no shard's primary ([`Observation::owns_slots`]), so it is `Unknown` — a
    /// Service selecting the primary label must never route to an empty node.
    pub fn advertised_role(&self, now: Millis, bounds: &Bounds) -> Role {
        let role = self.role(now, bounds);
        let slotless = |o: &Observation| o.owns_slots() == Some(false);
        match self.current(now, bounds) {
            Some(obs) if role == Role::Primary && slotless(obs) => Role::Unknown,
            _ => role,
        }
    }

    /// `/livez`: the loop ticks and Valkey answers. Loading and refusals count as answers, so a
    /// node loading a large dataset is not restarted.
    pub fn liveness(&self, now: Millis, bounds: &Bounds) -> Verdict {
        let window = bounds.liveness_window_ms;
        let tick = self.last_tick.unwrap_or(self.started_at);
        if now.since(tick) > window {
            return Verdict::fail(format!(
                "observation loop stalled for {} ms",
                now.since(tick)
            ));
        }
        let answer = self.last_answer.unwrap_or(self.started_at);
        if now.since(answer) > window {
            return Verdict::fail(format!(
                "valkey has not answered for {} ms",
                now.since(answer)
            ));
        }
        Verdict::pass("alive")
    }

    /// `/startupz`: passes once the first complete observation is in.
    pub fn startup(&self) -> Verdict {
        match self.first_observation {
            Some(_) => Verdict::pass("observed"),
            None => Verdict::fail(
                self.last_error
                    .clone()
                    .unwrap_or_else(|| "no observation yet".into()),
            ),
        }
    }

    /// `/readyz`: the node can serve its role — a primary that serves, a replica that is in sync.
    /// `claim`: where the role is checked against a record (replication mode), whether this
    /// master is the one on record; one that is not (fenced, superseded, or an empty restart) is
    /// not ready: its writes are not the shard's, and a PodDisruptionBudget must not count it.
    pub fn readiness(
        &self,
        now: Millis,
        bounds: &Bounds,
        mode: Mode,
        claim: Option<bool>,
    ) -> Verdict {
        let obs = match self.fresh(now, bounds) {
            Ok(obs) => obs,
            Err(v) => return v,
        };
        match obs.role {
            Role::Primary if claim == Some(false) => {
                Verdict::fail("primary, but not on record: fenced or superseded")
            }
            Role::Primary => self.primary_ready(obs, mode),
            Role::Replica => replica_ready(obs, bounds.max_lag_bytes),
            Role::Unknown => Verdict::fail("role unknown"),
        }
    }

    fn fresh(&self, now: Millis, bounds: &Bounds) -> Result<&Observation, Verdict> {
        let Some(obs) = self.current(now, bounds) else {
            let why = self
                .last_error
                .as_deref()
                .unwrap_or("no recent observation");
            return Err(Verdict::fail(format!("valkey not observed: {why}")));
        };
        if obs.loading {
            return Err(Verdict::fail("loading dataset"));
        }
        Ok(obs)
    }

    fn primary_ready(&self, obs: &Observation, mode: Mode) -> Verdict {
        if mode == Mode::Cluster {
            if !obs.cluster.as_ref().is_some_and(|c| c.enabled) {
                return Verdict::fail("valkey is not running in cluster mode");
            }
            if !self.cluster_joined {
                return Verdict::fail("cluster_state is not ok yet");
            }
            // A pod re-created empty is a master without slots until the coordinator makes it its
            // shard's replica: it holds none of the shard's data, so it must not count as an
            // available member in the PodDisruptionBudget. Counted Ready, it lets a drain evict its
            // shard's primary before it had synced, leaving no replica to hand over to.
            if obs.owns_slots() == Some(false) {
                return Verdict::fail(
                    "a master whose shard owns no slots: not yet its shard's replica, holds none of its data",
                );
            }
        }
        Verdict::pass("primary serving")
    }

    /// `/primary`: 200 only on a fresh, loaded primary (for load balancers).
    pub fn primary(&self, now: Millis, bounds: &Bounds) -> Verdict {
        match self.fresh(now, bounds) {
            Ok(obs) if obs.role == Role::Primary && obs.owns_slots() == Some(false) => {
                Verdict::fail("a master whose shard owns no slots: no shard's primary")
            }
            Ok(obs) if obs.role == Role::Primary => Verdict::pass("primary"),
            Ok(obs) => Verdict::fail(format!("role is {}", obs.role.as_str())),
            Err(v) => v,
        }
    }

    /// `/prestop`: whether the pod may stop now (`Some`, and why) or should wait for its hand-over
    /// (`None`). Not primary: nothing to hand over. A primary that never had a replica in this run
    /// (a one-pod shard): no hand-over can come, so waiting would only hold up the drain — it stops
    /// as primary, and without persistence its data goes with it. One whose replicas failed or were
    /// deleted waits on: their pods come back empty and sync from it (every pod deleted at once,
    /// the replicas' replacements are its only way out), and the wait is bounded by its limit.
    pub fn stop(&self, now: Millis, bounds: &Bounds) -> Option<Verdict> {
        let role = self.role(now, bounds);
        if role != Role::Primary {
            return Some(Verdict::pass(format!(
                "valkey is {}: nothing to hand over",
                role.as_str()
            )));
        }
        let obs = self.current(now, bounds)?;
        (!obs.has_replica() && !self.replica_seen)
            .then(|| Verdict::pass("primary without a replica in this run: nothing can take over"))
    }

    /// `/replica?lag=`: 200 only on an in-sync replica within `max_lag` bytes (default: the bound).
    pub fn replica(&self, now: Millis, bounds: &Bounds, max_lag: Option<u64>) -> Verdict {
        match self.fresh(now, bounds) {
            Ok(obs) if obs.role == Role::Replica => {
                replica_ready(obs, max_lag.unwrap_or(bounds.max_lag_bytes))
            }
            Ok(obs) => Verdict::fail(format!("role is {}", obs.role.as_str())),
            Err(v) => v,
        }
    }
}

/// A replica is ready when linked, not syncing, and — when the primary's offset is known — close
/// enough behind it.
fn replica_ready(obs: &Observation, max_lag: u64) -> Verdict {
    let Some(link) = obs.link.as_ref() else {
        return Verdict::fail("replica without link information");
    };
    if !link.up {
        return Verdict::fail("link to primary is down");
    }
    if link.sync_in_progress {
        return Verdict::fail("initial sync in progress");
    }
    match obs.lag_bytes(None) {
        Some(lag) if lag > max_lag => Verdict::fail(format!("lag {lag} bytes > {max_lag}")),
        Some(lag) => Verdict::pass(format!("in sync, lag {lag} bytes")),
        None => Verdict::pass("in sync"),
    }
}
