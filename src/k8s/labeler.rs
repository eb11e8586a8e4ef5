//! Keeps the role, shard and zone labels on the agent's own pod in step with Valkey.
//!
//! The labeler wakes on every observation tick and on every change of its pod (a watch on that one
//! pod), computes the labels it wants with `core::labels::desired`, and writes them with
//! server-side apply only when `core::labels::needs_write` says so. API errors (409, 429, 5xx,
//! timeouts) are retried with backoff; the observation loop and the probes never wait on them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use backon::ExponentialBackoff;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};
use valkey_sidecar_core::health::{Bounds, HealthState};
use valkey_sidecar_core::labels::{Facts, advertised, desired, needs_write};
use valkey_sidecar_core::observation::{Mode, Role};
use valkey_sidecar_core::placement::{Placement, resolve};
use valkey_sidecar_core::ratelimit::TokenBucket;

use super::{FIELD_MANAGER, KubeError, labels_of, node_labels};
use crate::cli::config::{Identity, KubeConfig};
use crate::k8s::events::{Event, EventType, Recorder, Reporter};
use crate::runtime::clock::Clock;
use crate::runtime::metrics::Metrics;

/// How long one API call may take before it counts as failed.
const API_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything the labeler needs.
#[derive(Clone)]
pub struct Labeler {
    pub client: kube::Client,
    pub config: KubeConfig,
    pub identity: Identity,
    pub mode: Mode,
    pub bounds: Bounds,
    pub clock: Clock,
    pub state: watch::Receiver<HealthState>,
    pub placement: watch::Sender<Placement>,
    pub metrics: Arc<Metrics>,
    /// Replication mode: whether the shard record lets this Valkey be primary now (the keeper
    /// holds a valid renewal and has not fenced it). A master without it is labelled as unknown,
    /// so a Service selecting the primary never routes to a fenced or superseded master.
    pub claim: Option<watch::Receiver<bool>>,
}

/// Resolves when the claim changes; never without one.
async fn claim_changed(claim: &mut Option<watch::Receiver<bool>>) {
    match claim {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// The role the labels may claim (`core::labels::advertised`).
fn claimable(role: Role, claim: Option<&watch::Receiver<bool>>) -> Role {
    advertised(role, claim.map(|rx| *rx.borrow()))
}

/// What the labeler remembers between wake-ups.
struct Progress {
    current: BTreeMap<String, String>,
    applied: Option<BTreeMap<String, String>>,
    retry_at: Option<Instant>,
    backoff: ExponentialBackoff,
    events: TokenBucket,
    reported_bad: bool,
    /// `resourceVersion` of the agent's last write: watch events older than it describe the pod
    /// before that write and must not trigger another one.
    written: Option<u64>,
}

/// Whether a watched pod predates the agent's last write. Resource versions are etcd revisions;
/// the API asks clients not to rely on that, so a version that is not a number never counts as
/// stale (at worst one extra, idempotent write).
fn predates(pod: &Pod, written: Option<u64>) -> bool {
    let version = pod
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok());
    matches!((version, written), (Some(v), Some(w)) if v < w)
}

fn version_of(pod: &Pod) -> Option<u64> {
    pod.metadata.resource_version.as_deref()?.parse().ok()
}

fn backoff() -> ExponentialBackoff {
    crate::runtime::retry::exponential(Duration::from_millis(100), Duration::from_secs(10))
}

impl Labeler {
    fn pods(&self) -> Api<Pod> {
        super::pods(&self.client, &self.config.namespace)
    }

    /// Runs until shutdown.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let Some(pod) = self.fetch_pod(&mut shutdown).await else {
            return;
        };
        self.resolve_placement(&pod).await;
        let recorder = self.recorder();
        let reference = pod.object_ref(&());
        let fields = format!("metadata.name={}", self.config.pod_name);
        let mut pod_events = watcher(self.pods(), super::watch_config().fields(&fields))
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut p = Progress {
            current: labels_of(&pod.metadata),
            applied: None,
            retry_at: None,
            backoff: backoff(),
            events: TokenBucket::new(5, 12_000, self.clock.now()),
            reported_bad: false,
            written: None,
        };
        loop {
            self.step(&mut p, recorder.as_ref(), &reference).await;
            let retry = p.retry_at;
            tokio::select! {
                changed = self.state.changed() => if changed.is_err() { return },
                _ = claim_changed(&mut self.claim) => {},
                Some(event) = pod_events.next() => match event {
                    Ok(pod) if !predates(&pod, p.written) => p.current = labels_of(&pod.metadata),
                    Ok(_) => {}
                    Err(e) => self.metrics.watch_error("own_pod", &e),
                },
                _ = sleep_until(retry.unwrap_or_else(Instant::now)), if retry.is_some() => p.retry_at = None,
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Reads the own pod, retrying with backoff: nothing can be labelled without it.
    async fn fetch_pod(&self, shutdown: &mut watch::Receiver<bool>) -> Option<Pod> {
        let mut delays = backoff();
        loop {
            match timeout(API_TIMEOUT, self.pods().get(&self.config.pod_name)).await {
                Ok(Ok(pod)) => return Some(pod),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, pod = %self.config.pod_name, "cannot read own pod; retrying")
                }
                Err(_) => tracing::warn!("reading own pod timed out; retrying"),
            }
            let delay = delays.next().unwrap_or(Duration::from_secs(10));
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => return None,
            }
        }
    }

    /// Zone and region: configuration, then the pod's topology labels, then the Node.
    async fn resolve_placement(&self, pod: &Pod) {
        let configured = Placement {
            zone: self.identity.zone.clone(),
            region: self.identity.region.clone(),
        };
        let pod_labels = labels_of(&pod.metadata);
        let (quick, _) = resolve(&configured, &pod_labels, None);
        let node = match (
            &self.identity.node_name,
            quick.zone.is_some() && quick.region.is_some(),
        ) {
            (Some(node), false) => node_labels(&self.client, node).await,
            _ => None,
        };
        let (placement, source) = resolve(&configured, &pod_labels, node.as_ref());
        match &placement.zone {
            Some(zone) => {
                tracing::info!(zone, region = ?placement.region, source = source.as_str(), "placement")
            }
            None => tracing::warn!(
                "no zone known (not configured, no topology labels on the pod, Node unreadable); running without one"
            ),
        }
        self.placement.send_replace(placement);
    }

    fn recorder(&self) -> Option<Recorder> {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(self.config.pod_name.clone()),
        };
        self.config
            .events
            .then(|| Recorder::new(self.client.clone(), reporter))
    }

    /// The labels the agent wants now.
    fn want(&self, p: &mut Progress) -> (BTreeMap<String, String>, Role) {
        let now = self.clock.now();
        let state = self.state.borrow();
        let role = claimable(
            state.advertised_role(now, &self.bounds),
            self.claim.as_ref(),
        );
        let observation = state.observation.as_ref().map(|(_, o)| o);
        let shard = match self.mode {
            Mode::Cluster => observation.and_then(|o| o.cluster.as_ref()?.shard_id.clone()),
            Mode::Replication => self.config.shard_name.clone(),
        };
        let placement = self.placement.borrow();
        let facts = Facts {
            role,
            shard: shard.as_deref(),
            zone: placement.zone.as_deref(),
            region: placement.region.as_deref(),
        };
        let (labels, bad) = desired(&facts, &self.config.policy);
        if !bad.is_empty() && !p.reported_bad {
            tracing::error!(?bad, "values that cannot be labels are not sent");
            p.reported_bad = true;
        }
        (labels, role)
    }

    async fn step(
        &self,
        p: &mut Progress,
        recorder: Option<&Recorder>,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
    ) {
        if p.retry_at.is_some() {
            return; // backing off after a failed write
        }
        let (want, role) = self.want(p);
        if !needs_write(&p.current, &want, p.applied.as_ref(), &self.config.policy) {
            // Already on the pod (e.g. after an agent restart): adopt it as applied.
            p.applied.get_or_insert(want);
            return;
        }
        let before = p
            .applied
            .as_ref()
            .and_then(|a| self.config.policy.role_in(a));
        let started = Instant::now();
        match self.apply(&want).await {
            Ok(pod) => {
                self.metrics.label_write(started.elapsed(), None);
                p.current = labels_of(&pod.metadata);
                p.written = version_of(&pod);
                p.applied = Some(want);
                p.backoff = backoff();
                tracing::info!(role = role.as_str(), labels = ?p.applied, "pod labels updated");
                self.announce(p, recorder, reference, before, role);
            }
            Err(e) => {
                self.metrics.label_write(started.elapsed(), Some(e.kind()));
                let delay = p.backoff.next().unwrap_or(Duration::from_secs(10));
                tracing::warn!(error = %e, retry_in = ?delay, "pod label update failed");
                p.retry_at = Some(Instant::now() + delay);
            }
        }
    }

    async fn apply(&self, labels: &BTreeMap<String, String>) -> Result<Pod, KubeError> {
        let body = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": self.config.pod_name, "labels": labels },
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let (pods, patch) = (self.pods(), Patch::Apply(&body));
        let call = pods.patch(&self.config.pod_name, &params, &patch);
        timeout(API_TIMEOUT, call)
            .await
            .map_err(|_| KubeError::Timeout(API_TIMEOUT))?
            .map_err(KubeError::Api)
    }

    /// Publishes `Promoted`/`Demoted` in the background, rate-limited: a flapping primary must not
    /// flood the Events API.
    fn announce(
        &self,
        p: &mut Progress,
        recorder: Option<&Recorder>,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        from: Option<Role>,
        to: Role,
    ) {
        let reason = match (from, to) {
            (Some(Role::Replica), Role::Primary) => "Promoted",
            (Some(Role::Primary), Role::Replica) => "Demoted",
            _ => return,
        };
        let Some(recorder) = recorder.cloned() else {
            return;
        };
        if !p.events.try_take(self.clock.now()) {
            self.metrics.event(reason, "suppressed");
            return;
        }
        let event = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(format!(
                "valkey role changed from {} to {}",
                from.map_or("unknown", Role::as_str),
                to.as_str()
            )),
            action: "RoleChange".into(),
            secondary: None,
        };
        let (reference, metrics) = (reference.clone(), self.metrics.clone());
        tokio::spawn(async move {
            let result = match timeout(API_TIMEOUT, recorder.publish(&event, &reference)).await {
                Ok(Ok(())) => "ok",
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "event not published");
                    "error"
                }
                Err(_) => "timeout",
            };
            metrics.event(reason, result);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(version: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.resource_version = Some(version.into());
        p
    }

    #[test]
    fn a_master_is_labelled_primary_only_with_the_claim() {
        let (tx, rx) = watch::channel(false);
        assert_eq!(claimable(Role::Primary, Some(&rx)), Role::Unknown);
        assert_eq!(claimable(Role::Replica, Some(&rx)), Role::Replica);
        assert_eq!(claimable(Role::Primary, None), Role::Primary);
        tx.send_replace(true);
        assert_eq!(claimable(Role::Primary, Some(&rx)), Role::Primary);
    }

    #[test]
    fn events_older_than_the_last_write_are_ignored() {
        assert!(predates(&pod("41"), Some(42)));
        assert!(!predates(&pod("42"), Some(42)));
        assert!(!predates(&pod("43"), Some(42)));
        assert!(!predates(&pod("41"), None));
        assert!(
            !predates(&pod("opaque"), Some(42)),
            "non-numeric versions are never stale"
        );
    }
}
