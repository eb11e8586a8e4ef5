//! Replication mode: the members of this pod's shard and their pod IPs, for the heartbeats.
//!
//! A watch on the shard's pods (one label selector), so that the steady state costs one request
//! per watch renewal, not one per interval. While the apiserver is out of reach the last list
//! stays: the failsafe needs to know whom to ask for promises exactly then.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use super::pods::pod_ip;
use crate::runtime::metrics::Metrics;

/// Keeps `out` equal to the pods `selector` selects (name → IP, pods without an IP left out)
/// until the task is aborted.
pub async fn follow(
    client: kube::Client,
    namespace: String,
    selector: String,
    out: watch::Sender<BTreeMap<String, IpAddr>>,
    metrics: Arc<Metrics>,
) {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let config = super::watch_config().labels(&selector);
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut pending: BTreeMap<String, IpAddr> = BTreeMap::new();
    loop {
        match events.next().await {
            Some(Ok(e)) => apply(e, &mut pending, &out),
            Some(Err(e)) => metrics.watch_error("members", &e),
            None => return,
        }
    }
}

/// One watch event into the published map: a re-list is gathered in `pending` and replaces the
/// map only once complete, so a re-list never shows a half-empty shard.
fn apply(
    event: watcher::Event<Pod>,
    pending: &mut BTreeMap<String, IpAddr>,
    out: &watch::Sender<BTreeMap<String, IpAddr>>,
) {
    match event {
        watcher::Event::Init => pending.clear(),
        watcher::Event::InitApply(p) => insert(pending, &p),
        watcher::Event::InitDone => {
            let fresh = std::mem::take(pending);
            out.send_if_modified(|m| std::mem::replace(m, fresh.clone()) != fresh);
        }
        watcher::Event::Apply(p) => {
            out.send_if_modified(|m| {
                let before = m.clone();
                insert(m, &p);
                *m != before
            });
        }
        watcher::Event::Delete(p) => {
            let name = p.metadata.name.unwrap_or_default();
            out.send_if_modified(|m| m.remove(&name).is_some());
        }
    }
}

fn insert(map: &mut BTreeMap<String, IpAddr>, pod: &Pod) {
    let Some(name) = pod.metadata.name.clone() else {
        return;
    };
    match pod_ip(pod).and_then(|ip| ip.parse().ok()) {
        Some(ip) => map.insert(name, ip),
        None => map.remove(&name),
    };
}
