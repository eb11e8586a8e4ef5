//! The Kubernetes adapter: the agent's own pod (labels, Events) and the Node it runs on.

pub mod events;
pub mod format;
pub mod labeler;
pub mod lease;
pub mod lease_object;
pub mod members;
pub mod owner;
pub mod pods;
pub mod record;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

/// The longest a watch request runs before it is made again: kube-rs's default. Over HTTP/1.1
/// without keepalives this timeout is also what notices a connection that died silently, so no
/// watch runs longer.
const WATCH_TIMEOUT_MAX_SECS: u32 = 290;

/// How much shorter, at random, each watch's timeout is. Agents started together (an install, a
/// roll) would otherwise all make their watches again in the same second every 290 s: a burst of
/// two requests per pod at the apiserver, and a one-minute measure that catches every agent's
/// or none.
const WATCH_TIMEOUT_JITTER_SECS: u32 = 90;

/// A watch's configuration: kube-rs's, its timeout shortened at random to 200–290 s.
pub fn watch_config() -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default().timeout(watch_timeout_secs(random_u64()))
}

/// A timeout from 200 to 290 s, picked by `random`.
fn watch_timeout_secs(random: u64) -> u32 {
    let span = u64::from(WATCH_TIMEOUT_JITTER_SECS) + 1;
    let less = u32::try_from(random % span).unwrap_or(0);
    WATCH_TIMEOUT_MAX_SECS - less
}

/// A random number from std's per-process random hash keys (new keys for each call): enough to
/// spread timeouts, without a dependency for it.
fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}

/// The field manager of every server-side apply the agent makes.
pub const FIELD_MANAGER: &str = "valkey-sidecar";

/// Why a Kubernetes call failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("no Kubernetes credentials (KUBECONFIG or in-cluster service account): {0}")]
    Credentials(#[source] kube::Error),
    #[error("kubernetes API: {0}{hint}", hint = unauthorized_hint(.0))]
    Api(#[from] kube::Error),
    #[error("kubernetes API did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error("Lease {name}: {why}")]
    Format {
        name: String,
        why: valkey_sidecar_core::format::Unreadable,
    },
}

/// What a 401 means for an agent, said where the error is logged: its token file no longer
/// authenticates, and only the kubelet can write a new one.
fn unauthorized_hint(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) if s.code == 401 => {
            " (this pod's ServiceAccount token was refused: it expired, or the ServiceAccount was \
             deleted or recreated, which revokes every token bound to it; the kubelet writes a new \
             token by 80% of its lifetime, and the agent reads the file again each minute)"
        }
        _ => "",
    }
}

impl KubeError {
    /// A short stable label for the metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            KubeError::Credentials(_) => "credentials",
            KubeError::Api(kube::Error::Api(s)) if s.code == 401 => "unauthorized",
            KubeError::Api(kube::Error::Api(s)) if s.code == 409 => "conflict",
            KubeError::Api(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            KubeError::Api(kube::Error::Api(s)) if s.code == 422 => "invalid",
            KubeError::Api(kube::Error::Api(s)) if s.code == 429 => "throttled",
            KubeError::Api(kube::Error::Api(s)) if s.code >= 500 => "server",
            KubeError::Api(_) => "transport",
            KubeError::Timeout(_) => "timeout",
            KubeError::Format { .. } => "unknown_format",
        }
    }
}

/// The `User-Agent` of every API request. kube-rs sends none, so without it the apiserver's audit
/// log cannot tell the agent from any other client of the same ServiceAccount.
pub const USER_AGENT: &str = concat!("valkey-sidecar/", env!("CARGO_PKG_VERSION"));

/// An API call bounded by `limit`: a hanging apiserver must not stall an election or a keeper.
pub async fn bounded<T>(
    limit: std::time::Duration,
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeError> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| KubeError::Timeout(limit))?
        .map_err(KubeError::Api)
}

/// A client from KUBECONFIG, else the in-cluster service account.
pub async fn client() -> Result<kube::Client, KubeError> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| KubeError::Credentials(kube::Error::InferConfig(e)))?;
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static(USER_AGENT),
    ));
    // No retries hidden in the client: every caller retries at its own layer with its own
    // deadline (a keeper's renewal must fail fast enough to fence on time), and a 429 from the
    // Eviction API is an answer — a budget refuses — not throttling to retry for minutes.
    config.default_retry = false;
    kube::Client::try_from(config).map_err(KubeError::Credentials)
}

/// The labels of an object, or none.
pub fn labels_of(meta: &kube::api::ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

/// The Node's labels, or `None` when it cannot be read (no `get nodes` permission is a normal,
/// least-privilege setup: the zone then comes from configuration or pod labels only).
pub async fn node_labels(client: &kube::Client, node: &str) -> Option<BTreeMap<String, String>> {
    match Api::<Node>::all(client.clone()).get(node).await {
        Ok(n) => Some(labels_of(&n.metadata)),
        Err(e) => {
            tracing::info!(node, error = %e, "cannot read the Node object; zone only from configuration or pod labels");
            None
        }
    }
}

/// Whether the API refuses this agent a list of Nodes (`Some(true)`), or lets it (`Some(false)`);
/// `None` when it did not answer. One call, a page of one Node's metadata.
pub async fn nodes_forbidden(client: &kube::Client, limit: std::time::Duration) -> Option<bool> {
    let nodes = Api::<Node>::all(client.clone());
    let page = kube::api::ListParams::default().limit(1);
    match bounded(limit, nodes.list_metadata(&page)).await {
        Ok(_) => Some(false),
        Err(KubeError::Api(kube::Error::Api(s))) if s.code == 403 => Some(true),
        Err(e) => {
            tracing::debug!(error = %e, "cannot tell whether Nodes may be read");
            None
        }
    }
}

/// The agent's own pod.
pub fn pods(client: &kube::Client, namespace: &str) -> Api<Pod> {
    Api::namespaced(client.clone(), namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_timeouts_spread_from_200_to_290_seconds() {
        let picked = [0, 1, 90, 91, 181, 182].map(watch_timeout_secs);
        assert_eq!(picked, [290, 289, 200, 290, 200, 290]);
        let drawn: std::collections::BTreeSet<_> =
            (0..50).map(|_| watch_config().timeout).collect();
        assert!(drawn.len() > 10, "timeouts not spread: {drawn:?}");
        assert!(
            drawn
                .iter()
                .all(|t| t.is_some_and(|t| (200..=290).contains(&t)))
        );
    }
}
