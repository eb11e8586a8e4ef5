//! The owner of the Leases the agents create (the coordinator Lease, replication mode's shard
//! records): the ServiceAccount the pods run as. Kubernetes' garbage collector deletes the Leases
//! when it goes — with `helm uninstall`, or whoever removes the deployment — so nothing is left
//! behind, while no other deletion (a pod, a StatefulSet, a scale-down) can pull a Lease away from
//! under a holder that still acts on it.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Api, Resource};

use super::{KubeError, bounded};

/// How long one lookup call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The owner reference to put on the Leases. Retried while the API fails transiently, because an
/// agent writing without it would strip it from a Lease another agent created; `None` only when
/// the API refuses (403, 404: the same RBAC for every agent of the deployment, so they agree),
/// and the Leases then outlive the deployment, as they would without this.
pub async fn lease_owner(
    client: kube::Client,
    namespace: String,
    pod: String,
) -> Option<OwnerReference> {
    let mut wait = crate::retry::exponential(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        match lookup(&client, &namespace, &pod).await {
            Ok(owner) => return owner,
            Err(e) if definitive(&e) => {
                tracing::warn!(error = %e, "cannot read my ServiceAccount: the Leases I create will not be garbage-collected with it");
                return None;
            }
            Err(e) => tracing::warn!(error = %e, "reading my ServiceAccount; retrying"),
        }
        tokio::time::sleep(wait.next().unwrap_or(Duration::from_secs(5))).await;
    }
}

fn definitive(e: &KubeError) -> bool {
    matches!(e, KubeError::Api(kube::Error::Api(s)) if s.code == 403 || s.code == 404)
}

async fn lookup(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
) -> Result<Option<OwnerReference>, KubeError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let me = bounded(CALL_TIMEOUT, pods.get(pod)).await?;
    let account = me
        .spec
        .and_then(|s| s.service_account_name)
        .unwrap_or_else(|| "default".into());
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let sa = bounded(CALL_TIMEOUT, accounts.get(&account)).await?;
    Ok(owner_of(&sa))
}

/// A plain (non-controller) owner reference to `sa`.
pub fn owner_of(sa: &ServiceAccount) -> Option<OwnerReference> {
    let mut owner = sa.controller_owner_ref(&())?;
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
