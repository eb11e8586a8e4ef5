//! The supervised rolling update's adapter (`core::roll`): evicts the pods the plan names, each
//! with its uid as precondition so a pod re-created meanwhile is never taken by mistake, and keeps
//! their shards out of the roll until the StatefulSet has re-created them.
//!
//! An eviction rather than a delete: the PodDisruptionBudgets bound it, so the agents' token can
//! take no more than a `kubectl drain` could (RBAC grants `pods/eviction`, not `delete`), and a
//! budget that forbids it now (429) only postpones the step to a later round.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource};
use valkey_sidecar_core::plan::{Plan, Replacement, World};
use valkey_sidecar_core::time::Millis;

use super::{Coordinator, CoordinatorMemory};
use crate::k8s::events::EventType;

/// How long a deleted pod's shard stays out of the roll at most, should its successor never
/// appear (a StatefulSet scaled down, a quota): then the roll judges it by its pods again.
const REPLACE_MS: u64 = 120_000;

/// A deletion whose pod has not come back yet.
#[derive(Debug, Clone)]
struct Replaced {
    shard: String,
    uid: String,
    at: Millis,
}

/// How long the roll waits without a step before it says so in an Event.
const STUCK_MS: u64 = 60_000;

/// How long a refused eviction (a budget that forbids it now, an API error) waits before it is
/// asked again: a round comes every 250 ms, the budgets change in seconds.
const REFUSED_PAUSE_MS: u64 = 5_000;

/// The roll's evictions by pod name, until the StatefulSet has re-created each; and the pods
/// whose eviction was refused, when.
#[derive(Debug, Clone, Default)]
pub(super) struct Replacing {
    evicted: BTreeMap<String, Replaced>,
    refused: BTreeMap<String, Millis>,
}

impl Coordinator {
    /// The shards with a deleted pod not yet re-created (a new uid under the same name), forgetting
    /// those that are.
    pub(super) fn replacing(
        &self,
        pods: &Store<Pod>,
        memory: &mut CoordinatorMemory,
        now: Millis,
    ) -> BTreeSet<String> {
        memory
            .replacing
            .refused
            .retain(|_, at| now.since(*at) < REFUSED_PAUSE_MS);
        memory.replacing.evicted.retain(|name, r| {
            let key = ObjectRef::new(name).within(&self.namespace);
            let uid = pods.get(&key).and_then(|p| p.metadata.uid.clone());
            let back = uid.is_some_and(|uid| uid != r.uid);
            !back && now.since(r.at) < REPLACE_MS
        });
        memory
            .replacing
            .evicted
            .values()
            .map(|r| r.shard.clone())
            .collect()
    }

    /// Evicts the pods the plan names, if this agent may still act.
    pub(super) async fn evict_outdated(
        &self,
        deletions: &[Replacement],
        pods: &Store<Pod>,
        memory: &mut CoordinatorMemory,
    ) {
        for d in deletions {
            if !self.term.borrow().may_act(self.clock.now()) {
                return;
            }
            self.evict_one(d, pods, memory).await;
        }
    }

    async fn evict_one(&self, d: &Replacement, pods: &Store<Pod>, memory: &mut CoordinatorMemory) {
        if memory.replacing.refused.contains_key(&d.pod) {
            return;
        }
        let key = ObjectRef::new(&d.pod).within(&self.namespace);
        let Some(pod) = pods.get(&key) else { return };
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            }),
            ..EvictParams::default()
        };
        // Bounded: a hanging apiserver must not stall the coordinator's rounds.
        let limit = std::time::Duration::from_secs(5);
        let result = crate::k8s::bounded(limit, api.evict(&d.pod, &params)).await;
        self.metrics.roll_eviction(result.is_ok());
        let reference = Some(pod.object_ref(&()));
        match result {
            Ok(_) => {
                tracing::info!(shard = %d.shard, pod = %d.pod, reason = %d.reason, "rolling update: evicted");
                let at = self.clock.now();
                let shard = d.shard.clone();
                let replaced = Replaced { shard, uid, at };
                memory.replacing.evicted.insert(d.pod.clone(), replaced);
                let note = format!("{}; its StatefulSet re-creates it updated", d.reason);
                self.event(reference, EventType::Normal, "RollEvictedPod", note);
            }
            Err(e) => {
                let now = self.clock.now();
                memory.replacing.refused.insert(d.pod.clone(), now);
                tracing::warn!(shard = %d.shard, pod = %d.pod, error = %e, "rolling update: eviction refused; asked again in 5 s");
                let note = format!("could not evict pod {}: {e}", d.pod);
                self.event(reference, EventType::Warning, "RollEvictionRefused", note);
            }
        }
    }

    /// The roll's progress into metrics; a roll that has waited [`STUCK_MS`] without a step, an
    /// Event on the first pod left to replace, saying why (once per wait). A healthy roll waits
    /// for every re-created pod to sync, seconds each: that is progress, not news.
    pub(super) fn report_roll(
        &self,
        world: &World,
        plan: &Plan,
        pods: &Store<Pod>,
        memory: &mut CoordinatorMemory,
    ) {
        if self.policy.roll.is_none() {
            return;
        }
        self.metrics
            .roll(plan.roll_outdated, plan.roll_waiting.is_some());
        let Some(why) = plan.roll_waiting.clone() else {
            memory.roll_waiting = None;
            return;
        };
        let now = self.clock.now();
        let wait = memory.roll_waiting.get_or_insert((now, false));
        if wait.1 || now.since(wait.0) < STUCK_MS {
            return;
        }
        wait.1 = true;
        tracing::warn!(reason = %why, "rolling update waits");
        let outdated = world.members.iter().filter_map(|m| m.pod.as_ref());
        let first = outdated
            .filter(|p| p.updated == Some(false))
            .map(|p| &p.name)
            .min();
        let reference = first.and_then(|name| self.pod_ref(pods, name));
        self.event(reference, EventType::Warning, "RollWaiting", why);
    }
}
