//! The owner of the Leases the agents create (the coordinator Lease, replication mode's shard
//! records): a ConfigMap the chart creates for nothing else (`SIDECAR_LEASE_OWNER`), or else the
//! ServiceAccount the pods run as. Kubernetes' garbage collector deletes the Leases when it goes —
//! with `helm uninstall`, or whoever removes the deployment — so nothing is left behind, while no
//! other deletion (a pod, a StatefulSet, a scale-down, a renamed ServiceAccount) can pull a Lease
//! away from under a holder that still acts on it.
//!
//! The owner's uid is looked up again whenever a Lease is created: an owner deleted and created
//! anew (a GitOps tool re-syncing it) has a new uid, and a Lease created with the old one would be
//! deleted by the garbage collector right away, again and again. A replace carries the owner the
//! Lease was read with (learnt from every read): an agent that only renews or takes over never
//! looked the owner up again, and writing its stale one back would hand the Lease, just created
//! under the new owner by another agent, to the collector.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Api, Resource};

use super::{KubeError, bounded};

/// How long one lookup call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What owns the Leases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// A ConfigMap of this name in the pod's namespace.
    ConfigMap(String),
    /// The ServiceAccount of this pod.
    ServiceAccountOf(String),
}

/// The owner reference to put on the Leases, cached between creations.
#[derive(Clone)]
pub struct LeaseOwner {
    client: kube::Client,
    namespace: String,
    anchor: Anchor,
    cached: Arc<Mutex<Option<OwnerReference>>>,
}

impl LeaseOwner {
    /// Looks the owner up, retrying while the API fails transiently, because an agent writing
    /// without it would strip it from a Lease another agent created; `None` only when the API
    /// refuses (403, 404: the same RBAC for every agent of the deployment, so they agree), and
    /// the Leases then outlive the deployment, as they would without this.
    pub async fn resolve(client: kube::Client, namespace: String, anchor: Anchor) -> LeaseOwner {
        let owner = LeaseOwner {
            client,
            namespace,
            anchor,
            cached: Arc::new(Mutex::new(None)),
        };
        let mut wait =
            crate::runtime::retry::exponential(Duration::from_millis(200), Duration::from_secs(5));
        while !owner.refresh().await {
            tokio::time::sleep(wait.next().unwrap_or(Duration::from_secs(5))).await;
        }
        owner
    }

    /// Takes the owner `lease` was written with, when it is of the anchor's kind: what the
    /// writer before looked up, at least as recent as this agent's own lookup.
    pub fn learn(&self, lease: &Lease) {
        let kind = match &self.anchor {
            Anchor::ConfigMap(_) => "ConfigMap",
            Anchor::ServiceAccountOf(_) => "ServiceAccount",
        };
        let refs = lease.metadata.owner_references.iter().flatten();
        let Some(found) = refs.into_iter().find(|o| o.kind == kind) else {
            return;
        };
        if let Ok(mut cached) = self.cached.lock() {
            *cached = Some(found.clone());
        }
    }

    /// The owner as last looked up or learnt.
    pub fn current(&self) -> Option<OwnerReference> {
        self.cached.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// The owner looked up now, for a Lease about to be created; the cached one if the API fails
    /// transiently or takes longer than `within` (the creating call's own budget).
    pub async fn refreshed(&self, within: Duration) -> Option<OwnerReference> {
        let _ = tokio::time::timeout(within, self.refresh()).await;
        self.current()
    }

    /// One lookup; `false` when it failed transiently (the cache is kept).
    async fn refresh(&self) -> bool {
        let found = match lookup(&self.client, &self.namespace, &self.anchor).await {
            Ok(owner) => owner,
            Err(e) if definitive(&e) => {
                tracing::warn!(error = %e, anchor = ?self.anchor, "cannot read the Leases' owner: the Leases I create will not be garbage-collected with it");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, anchor = ?self.anchor, "reading the Leases' owner; retrying");
                return false;
            }
        };
        if let Ok(mut cached) = self.cached.lock() {
            *cached = found;
        }
        true
    }
}

/// The owner reference for one Lease write: looked up afresh for a creation (within the call's
/// own budget), the cached one for a replace; none without an owner.
pub async fn for_write(
    owner: Option<&LeaseOwner>,
    creating: bool,
    within: Duration,
) -> Option<OwnerReference> {
    let owner = owner?;
    match creating {
        true => owner.refreshed(within).await,
        false => owner.current(),
    }
}

fn definitive(e: &KubeError) -> bool {
    matches!(e, KubeError::Api(kube::Error::Api(s)) if s.code == 403 || s.code == 404)
}

async fn lookup(
    client: &kube::Client,
    namespace: &str,
    anchor: &Anchor,
) -> Result<Option<OwnerReference>, KubeError> {
    match anchor {
        Anchor::ConfigMap(name) => {
            let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
            Ok(owner_of(&bounded(CALL_TIMEOUT, maps.get(name)).await?))
        }
        Anchor::ServiceAccountOf(pod) => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let me = bounded(CALL_TIMEOUT, pods.get(pod)).await?;
            let account = me
                .spec
                .and_then(|s| s.service_account_name)
                .unwrap_or_else(|| "default".into());
            let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
            Ok(owner_of(
                &bounded(CALL_TIMEOUT, accounts.get(&account)).await?,
            ))
        }
    }
}

/// A plain (non-controller) owner reference to `object`.
pub fn owner_of<K: Resource<DynamicType = ()>>(object: &K) -> Option<OwnerReference> {
    let mut owner = object.controller_owner_ref(&())?;
    owner.controller = None;
    owner.block_owner_deletion = None;
    Some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    #[test]
    fn the_owner_is_the_service_account_and_blocks_nothing() {
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some("valkey-sidecar".into()),
                namespace: Some("cache".into()),
                uid: Some("1234".into()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        let owner = owner_of(&sa).unwrap();
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str()
            ),
            ("v1", "ServiceAccount", "valkey-sidecar", "1234")
        );
        assert_eq!((owner.controller, owner.block_owner_deletion), (None, None));
        let no_uid = ServiceAccount::default();
        assert!(owner_of(&no_uid).is_none());
    }
}
