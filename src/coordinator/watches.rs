//! The coordinator's watches: the cluster's pods and the nodes (reflector stores the rounds plan from)
//! and, in replication mode, the shard records changing hands.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeStatus, Pod};
use kube::Api;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use valkey_sidecar_core::observation::Mode;
use valkey_sidecar_core::plan::NodeInfo;
use valkey_sidecar_core::replication::ShardRecord;

use super::{Coordinator, world};

/// The watches of the cluster's pods and of the nodes. Only the coordinator runs them: a follower costs
/// the apiserver nothing beyond its own pod's watch, and a new coordinator lists afresh (milliseconds).
pub(super) struct Watches {
    pub(super) pods: Store<Pod>,
    pub(super) nodes: Store<Node>,
    /// Set when the API refuses to list nodes (the chart's `sidecar.readNodes=false`): the
    /// coordinator then plans without node facts — hand-overs of deleted pods still happen, those
    /// for cordoned or NotReady nodes cannot.
    nodes_forbidden: Arc<AtomicBool>,
    /// With the supervised roll: the release's StatefulSets (their update revisions).
    sets: Option<Store<StatefulSet>>,
    /// With `coordination: operator`: whether the operator's resource is settled.
    operator: Option<watch::Receiver<bool>>,
    tasks: Vec<JoinHandle<()>>,
}

/// What a round plans with besides the pods.
pub(super) struct Facts {
    pub(super) nodes: BTreeMap<String, NodeInfo>,
    /// Per pod: at its StatefulSet's update revision (only with the supervised roll).
    pub(super) revisions: BTreeMap<String, bool>,
    /// With `coordination: operator`: the operator is at work (`core::operator::settled`).
    pub(super) operator_busy: bool,
}

impl Watches {
    /// Both initial lists are in (or nodes are forbidden): before that an empty store would read
    /// as "no pods".
    pub(super) fn ready(&self) -> bool {
        let ready = |r: Option<Result<(), _>>| matches!(r, Some(Ok(())));
        let pods = ready(self.pods.wait_until_ready().now_or_never());
        let nodes = ready(self.nodes.wait_until_ready().now_or_never())
            || self.nodes_forbidden.load(Ordering::Relaxed);
        let sets = self.sets.as_ref();
        let sets = sets.is_none_or(|s| ready(s.wait_until_ready().now_or_never()));
        pods && nodes && sets
    }

    /// The node facts and the pods' revisions.
    pub(super) fn facts(&self) -> Facts {
        let sets = self.sets.as_ref().map(Store::state).unwrap_or_default();
        Facts {
            nodes: self.node_facts(),
            revisions: world::revisions(&self.pods.state(), &sets),
            operator_busy: self.operator.as_ref().is_some_and(|r| !*r.borrow()),
        }
    }

    /// The node facts to plan with: the watched Nodes, or where the API refuses them, what the
    /// pods say (`core::plan::unseen_nodes`).
    pub(super) fn node_facts(&self) -> BTreeMap<String, NodeInfo> {
        if self.nodes_forbidden.load(Ordering::Relaxed) {
            return world::unseen_nodes(&self.pods.state());
        }
        world::nodes(&self.nodes.state())
    }
}

/// The shard whose record `lease` is, if its holder differs from the one last seen.
fn holder_change(
    cluster: &str,
    lease: &Lease,
    holders: &mut BTreeMap<String, Option<String>>,
) -> Option<String> {
    let name = lease.metadata.name.as_deref()?;
    let shard = ShardRecord::shard_of(cluster, name)?;
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
    let before = holders.insert(name.to_owned(), holder.clone());
    (before != Some(holder)).then(|| shard.to_owned())
}

/// A Node as the coordinator keeps it: its name, labels, spec and conditions (`world::nodes`).
/// The rest — the images a kubelet reports (up to 50 names each), addresses, capacity,
/// annotations, managed fields — is most of a Node's size, and every Node of the Kubernetes
/// cluster is kept: thousands of nodes would hold tens of MB for nothing.
fn slim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    if let Some(status) = node.status.as_mut() {
        *status = NodeStatus {
            conditions: status.conditions.take(),
            ..NodeStatus::default()
        };
    }
}

/// Whether a watch error is the API refusing access.
fn forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 403,
        _ => false,
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Coordinator {
    /// Starts the watches a coordinator plans from.
    pub(super) fn watch(&self, records: &mpsc::Sender<String>) -> Watches {
        let (pods, pods_task) = self.watch_pods();
        let nodes_forbidden = Arc::new(AtomicBool::new(false));
        let (nodes, nodes_task) = self.watch_nodes(nodes_forbidden.clone());
        let mut tasks = vec![pods_task, nodes_task];
        if self.mode == Mode::Replication {
            tasks.push(self.watch_records(records.clone()));
        }
        let sets = self.policy.roll.map(|_| {
            let (store, task) = self.watch_sets();
            tasks.push(task);
            store
        });
        let operator = self.operator.as_deref().map(|name| {
            let (settled, task) = self.watch_operator(name);
            tasks.push(task);
            settled
        });
        Watches {
            pods,
            nodes,
            nodes_forbidden,
            sets,
            operator,
            tasks,
        }
    }

    /// Replication mode: names the shard whenever its record changes hands (a release, a
    /// takeover), so the next round — at once — reads it instead of at its usual pace. Only a
    /// trigger: decisions still rest on the round's own quorum read.
    pub(super) fn watch_records(&self, changed: mpsc::Sender<String>) -> JoinHandle<()> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let config = crate::k8s::watch_config().labels(&ShardRecord::selector(&self.cluster));
        let cluster = self.cluster.clone();
        let mut holders: BTreeMap<String, Option<String>> = BTreeMap::new();
        let stream = watcher(api, config).default_backoff().applied_objects();
        let metrics = self.metrics.clone();
        tokio::spawn(stream.for_each(move |lease| {
            let lease = lease.map_err(|e| metrics.watch_error("shard_records", &e));
            if let Some(shard) = lease
                .ok()
                .and_then(|l| holder_change(&cluster, &l, &mut holders))
            {
                // A full channel already has a wake-up queued: dropping this one loses nothing.
                let _ = changed.try_send(shard);
            }
            async {}
        }))
    }

    /// valkey-operator's `ValkeyCluster` `name`: whether it is settled, false until known (a
    /// missing resource or a refused read keeps the agent deferring; the errors are counted).
    pub(super) fn watch_operator(&self, name: &str) -> (watch::Receiver<bool>, JoinHandle<()>) {
        let resource = ApiResource {
            group: "valkey.io".into(),
            version: "v1alpha1".into(),
            api_version: "valkey.io/v1alpha1".into(),
            kind: "ValkeyCluster".into(),
            plural: "valkeyclusters".into(),
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &resource);
        let config = crate::k8s::watch_config().fields(&format!("metadata.name={name}"));
        let (tx, rx) = watch::channel(false);
        let metrics = self.metrics.clone();
        let task = watcher(api, config)
            .default_backoff()
            .for_each(move |event| {
                match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        tx.send_replace(world::operator_settled(&o));
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        tx.send_replace(false);
                    }
                    Ok(_) => {}
                    Err(e) => metrics.watch_error("operator", &e),
                }
                async {}
            });
        (rx, tokio::spawn(task))
    }

    pub(super) fn watch_pods(&self) -> (Store<Pod>, JoinHandle<()>) {
        self.reflect_selected("pods")
    }

    /// The release's StatefulSets, selected like its pods (the chart labels both alike).
    pub(super) fn watch_sets(&self) -> (Store<StatefulSet>, JoinHandle<()>) {
        self.reflect_selected("statefulsets")
    }

    /// A store of the namespace's objects of kind `K` that carry the deployment's selector; its
    /// watch errors counted under `kind`.
    fn reflect_selected<K>(&self, kind: &'static str) -> (Store<K>, JoinHandle<()>)
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + Send
            + Sync
            + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), &self.namespace);
        let (reader, writer) = reflector::store();
        let config = crate::k8s::watch_config().labels(&self.selector);
        let slim = watcher(api, config).modify(|o: &mut K| o.meta_mut().managed_fields = None);
        let stream = reflector::reflector(writer, slim);
        let metrics = self.metrics.clone();
        let task = stream.default_backoff().for_each(move |event| {
            if let Err(e) = &event {
                metrics.watch_error(kind, e);
            }
            async {}
        });
        (reader, tokio::spawn(task))
    }

    pub(super) fn watch_nodes(
        &self,
        forbidden_flag: Arc<AtomicBool>,
    ) -> (Store<Node>, JoinHandle<()>) {
        let api: Api<Node> = Api::all(self.client.clone());
        let (reader, writer) = reflector::store();
        let slim = watcher(api, crate::k8s::watch_config()).modify(slim_node);
        let stream = reflector::reflector(writer, slim);
        let metrics = self.metrics.clone();
        let task = stream.default_backoff().for_each(move |event| {
            match &event {
                // Said once: RBAC without nodes is a supported choice, not an error to repeat.
                Err(e) if forbidden(e) => {
                    if !forbidden_flag.swap(true, Ordering::Relaxed) {
                        tracing::warn!("may not list nodes: planning without node facts (cordons and NotReady nodes go unseen)");
                    }
                }
                Err(e) => metrics.watch_error("nodes", e),
                Ok(_) => {}
            }
            async {}
        });
        (reader, tokio::spawn(task))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerImage, NodeCondition, NodeSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    use super::*;

    fn node() -> Node {
        let labels = BTreeMap::from([(
            valkey_sidecar_core::placement::ZONE_LABEL.to_owned(),
            "zone-b".to_owned(),
        )]);
        let image = |i: usize| ContainerImage {
            names: Some(vec![format!("images.invalid/app-{i}@sha256:{i:064}")]),
            size_bytes: Some(1 << 20),
        };
        Node {
            metadata: ObjectMeta {
                name: Some("worker-1".into()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([("a".into(), "b".repeat(1000))])),
                managed_fields: Some(vec![ManagedFieldsEntry::default(); 5]),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(true),
                taints: Some(vec![Taint {
                    key: "node.kubernetes.io/unschedulable".into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "False".into(),
                    ..NodeCondition::default()
                }]),
                images: Some((0..50).map(image).collect()),
                ..NodeStatus::default()
            }),
        }
    }

    #[test]
    fn a_slim_node_keeps_every_fact_the_planner_uses_and_drops_the_rest() {
        let full = node();
        let mut slim = full.clone();
        slim_node(&mut slim);
        let facts = |n: &Node| world::nodes(&[Arc::new(n.clone())]);
        assert_eq!(facts(&slim), facts(&full));
        let info = &facts(&slim)["worker-1"];
        assert_eq!(
            (info.zone.as_deref(), info.ready, info.unschedulable),
            (Some("zone-b"), false, true)
        );
        let status = slim.status.as_ref().unwrap();
        assert!(status.images.is_none() && slim.metadata.managed_fields.is_none());
        let size = |n: &Node| serde_json::to_vec(n).unwrap().len();
        println!("a Node: {} bytes, slim {} bytes", size(&full), size(&slim));
        assert!(size(&slim) * 10 < size(&full));
    }
}
