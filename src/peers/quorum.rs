//! Cluster mode: the quorum fence of `core::quorum`, applied to the local Valkey after each
//! observation (a primary cut off from most primaries pauses its writes).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use valkey_sidecar_core::heartbeat::{PeerSight, cluster_sight};
use valkey_sidecar_core::observation::Observation;
use valkey_sidecar_core::quorum::{Guard, QuorumPolicy, Sight, decide};

use crate::runtime::clock::Clock;

use crate::runtime::metrics::Metrics;
use crate::valkey::Session;

/// The fence's memory: until when the last `CLIENT PAUSE` holds, by the local monotonic clock.
#[derive(Clone)]
pub struct QuorumFence {
    pub policy: QuorumPolicy,
    pub metrics: Arc<Metrics>,
    until: Option<Instant>,
    /// When the previous observation was applied: a long gap means this node went unseen.
    last: Option<Instant>,
    /// Logged once: Valkey would not show `CLUSTER NODES` (an ACL without `cluster|nodes`).
    blind_logged: bool,
    /// What the peer heartbeats say (`crate::peers::heartbeat`), with the clock they are timed by.
    beats: Option<(watch::Receiver<Option<PeerSight>>, Clock)>,
}

impl QuorumFence {
    pub fn new(policy: QuorumPolicy, metrics: Arc<Metrics>) -> QuorumFence {
        QuorumFence {
            policy,
            metrics,
            until: None,
            last: None,
            blind_logged: false,
            beats: None,
        }
    }

    /// Adds the heartbeats' evidence: a cut is then seen within a fraction of a second.
    pub fn with_heartbeats(
        mut self,
        sight: watch::Receiver<Option<PeerSight>>,
        clock: Clock,
    ) -> Self {
        self.beats = Some((sight, clock));
        self
    }

    /// Resolves when the heartbeats' answer changes (never without heartbeats), so that the
    /// observer looks at once instead of at its next tick.
    pub async fn news(&mut self) {
        let open = match self.beats.as_mut() {
            Some((rx, _)) => rx.changed().await.is_ok(),
            None => false,
        };
        if !open {
            std::future::pending::<()>().await;
        }
    }

    /// The voting primaries whose agents vouch for this one, from the latest heartbeats.
    fn heard(&self, obs: &Observation) -> Option<Sight> {
        let (rx, clock) = self.beats.as_ref()?;
        let sight = rx.borrow();
        let peers = obs.cluster.as_ref()?.peers.as_deref()?;
        cluster_sight(peers, sight.as_ref()?, clock.now())
    }

    /// Applies the rule to one observation.
    pub async fn apply(&mut self, session: &mut Session, obs: &Observation) {
        self.log_blindness(obs);
        let fenced = self.until.is_some_and(|t| Instant::now() < t);
        if !fenced && self.until.take().is_some() {
            tracing::info!("quorum fence ran out: writes resume");
        }
        let now = Instant::now();
        let gap = self.last.replace(now).map_or(Duration::ZERO, |t| now - t);
        let gap_ms = crate::runtime::clock::millis(gap);
        let heard = self.heard(obs);
        match decide(obs, obs.server_time_ms, gap_ms, fenced, &self.policy, heard) {
            Guard::Fence { ms, reason } => {
                if !fenced && heard.is_some_and(|h| h.minority()) {
                    self.metrics.heartbeat("isolation_fence");
                }
                self.fence(session, ms, &reason, fenced).await
            }
            Guard::Lift { reason } => self.lift(session, &reason).await,
            Guard::Hold => {}
        }
        self.metrics
            .fenced(self.until.is_some_and(|t| Instant::now() < t));
    }

    fn log_blindness(&mut self, obs: &Observation) {
        let blind = obs.cluster.as_ref().is_some_and(|c| c.peers.is_none());
        if blind && !self.blind_logged {
            tracing::warn!(
                "CLUSTER NODES is not readable (grant the agent +cluster|nodes): no quorum fence"
            );
            self.blind_logged = true;
        }
    }

    async fn fence(&mut self, session: &mut Session, ms: u64, reason: &str, renewal: bool) {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("PAUSE").arg(ms).arg("WRITE");
        let sent = Instant::now();
        match session.command(&cmd).await {
            Ok(_) => {
                // Counted from before the command: the pause may end sooner, never later.
                self.until = Some(sent + Duration::from_millis(ms));
                if !renewal {
                    tracing::warn!(reason, ms, "quorum fence: writes paused");
                    self.metrics.keeper_action("quorum_fence");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, reason, "cannot fence my Valkey");
                self.metrics.keeper_action("quorum_fence_failed");
            }
        }
    }

    async fn lift(&mut self, session: &mut Session, reason: &str) {
        let cmd = redis::cmd("CLIENT").arg("UNPAUSE").clone();
        match session.command(&cmd).await {
            Ok(_) => {
                self.until = None;
                tracing::info!(reason, "quorum fence lifted");
                self.metrics.keeper_action("quorum_lift");
            }
            Err(e) => tracing::warn!(error = %e, "cannot lift the quorum fence"),
        }
    }
}
