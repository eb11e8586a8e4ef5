//! Stale role labels: a pod whose Valkey the cluster marks failed (cluster mode) or that its
//! shard's record no longer names (replication mode) cannot update its own label — its agent may
//! be gone with it — so the coordinator removes it, each pod retried with backoff when the API refuses.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use valkey_sidecar_core::plan::World;
use valkey_sidecar_core::shards::NodeHealth;
use valkey_sidecar_core::time::Millis;

use super::Coordinator;

/// Per-pod exponential backoff for a write the API refused: 1 s, 2 s, 4 s … up to a minute.
#[derive(Default)]
pub(super) struct Retries(BTreeMap<String, (u32, Millis)>);

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

impl Coordinator {
    /// A pod whose Valkey the cluster marks failed cannot update its own label (its agent may be
    /// gone with it), so the coordinator removes the stale role label: a Service selecting the
    /// primary must not keep routing to it.
    pub(super) async fn clear_dead_labels(
        &self,
        world: &World,
        pods: &Store<Pod>,
        retry: &mut Retries,
    ) {
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
    pub(super) async fn clear_role_labels(
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

    pub(super) async fn clear_role_label(
        &self,
        name: &str,
        retry: &mut Retries,
        now: Millis,
        why: &str,
    ) {
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
