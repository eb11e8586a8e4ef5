//! The answer to `valkey-sidecar await` (`GET /valkey-start`): whether the local Valkey may start
//! again. The rule is `core::restart`; this task asks the replicas how they see the cluster while
//! Valkey is down and publishes the permit, so the endpoint answers from cached state.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;
use valkey_sidecar_core::health::HealthState;
use valkey_sidecar_core::restart::{self, Permit, Replies};
use valkey_sidecar_core::shards::{Shard, ShardNode, parse_shards};

use crate::runtime::metrics::Metrics;
use crate::valkey::{Connector, observe};

/// How often the replicas are asked while a start is held: the start follows a takeover by
/// about this much.
const HELD_PACE: Duration = Duration::from_millis(50);

/// How often they are asked once the answer is "go" and Valkey is still not back.
const GO_PACE: Duration = Duration::from_secs(1);

/// One question to a replica: short, a held start is waiting on it.
const ASK_LIMIT: Duration = Duration::from_millis(300);

#[derive(Clone)]
pub struct StartGuard {
    pub state: watch::Receiver<HealthState>,
    pub connector: Connector,
    pub permit: watch::Sender<Permit>,
    pub metrics: Arc<Metrics>,
    /// Since when no replica has answered (local monotonic clock); `None` while one does or
    /// nobody is asked.
    pub silent_since: Option<Instant>,
}

impl StartGuard {
    /// Publishes the permit until shutdown.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        loop {
            let (permit, asked) = self.judge().await;
            let pace = if permit.go() { GO_PACE } else { HELD_PACE };
            self.publish(permit);
            tokio::select! {
                _ = tokio::time::sleep(pace), if asked => {}
                Ok(()) = self.state.changed() => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// The permit now, and whether the replicas were asked for it (then it is asked again).
    async fn judge(&mut self) -> (Permit, bool) {
        // Only a refusal means nothing runs: a blocked or slow Valkey (timeouts) is still there,
        // and its replicas are not asked on its behalf.
        let (last, running) = {
            let s = self.state.borrow_and_update();
            (s.observation.as_ref().map(|(_, o)| o.clone()), !s.down)
        };
        let replicas = match restart::takeover(last.as_ref()) {
            Ok(t) if !running => t.replicas,
            // Running (or nothing to wait for): the rule answers without asking anyone.
            _ => {
                self.silent_since = None;
                return (restart::decide(last.as_ref(), None), false);
            }
        };
        let replies = self.ask(&replicas).await;
        (restart::decide(last.as_ref(), Some(&replies)), true)
    }

    /// `CLUSTER SHARDS` of every replica that answers in time, how many refused, and for how
    /// long none has answered.
    async fn ask(&mut self, replicas: &[ShardNode]) -> Replies {
        let asks = replicas.iter().map(|n| self.view_of(n));
        let mut replies = Replies {
            asked: replicas.len(),
            ..Replies::default()
        };
        for answer in join_all(asks).await {
            match answer {
                Ok(view) => replies.views.push(view),
                Err(refused) => replies.refused += usize::from(refused),
            }
        }
        let since = match replies.views.is_empty() {
            true => *self.silent_since.get_or_insert_with(Instant::now),
            false => {
                self.silent_since = None;
                Instant::now()
            }
        };
        replies.silent_for_ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
        replies
    }

    /// A replica's `CLUSTER SHARDS`; `Err(true)`: it refused, `Err(false)`: no answer in time.
    async fn view_of(&self, node: &ShardNode) -> Result<Vec<Shard>, bool> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SHARDS");
        let value = self
            .connector
            .for_node(node)
            .ask_or_refused(&cmd, ASK_LIMIT)
            .await?;
        Ok(parse_shards(&observe::reply(value)))
    }

    fn publish(&self, permit: Permit) {
        let changed = self.permit.send_if_modified(|p| {
            let changed = *p != permit;
            *p = permit.clone();
            changed
        });
        if changed {
            self.metrics.start_permit(permit.go());
            tracing::info!(
                go = permit.go(),
                reason = permit.reason(),
                "valkey start permit"
            );
        }
    }
}
