//! Local PersistentVolumes for the fake nodes, so a chart's `volumeClaimTemplates` bind for real:
//! a StorageClass [`LOCAL_CLASS`] (no provisioner, `WaitForFirstConsumer`) and, per node, static
//! `local` PersistentVolumes whose node affinity pins them to it. kube-scheduler's volume binding
//! picks a node with a free volume and binds the claim before the pod; the PV controller of
//! kube-controller-manager completes the binding; the harness kubelet mounts the volume's
//! directory (see the kubelet's `volume` module). A pod deleted and created again by its
//! StatefulSet finds its claim bound to the same volume, on the same node, with the data it left.
//! The volumes' directories live under the control plane's directory and go with it.

use std::path::Path;

use kube::Client;
use serde_json::json;

use super::valkey::apply;
use crate::Result;

/// The StorageClass of the local volumes.
pub const LOCAL_CLASS: &str = "local";

/// Capacity of each volume (above the chart's default claim of 8Gi).
const CAPACITY: &str = "10Gi";

/// Creates [`LOCAL_CLASS`] and `per_node` volumes for each of `nodes`, their directories under
/// `root`.
pub async fn create_local_volumes(
    client: &Client,
    root: &Path,
    nodes: &[String],
    per_node: usize,
) -> Result<()> {
    apply(client, storage_class()).await?;
    for node in nodes {
        for i in 0..per_node {
            let dir = root.join(format!("{node}-{i}"));
            std::fs::create_dir_all(&dir)?;
            apply(client, volume(node, i, &dir)).await?;
        }
    }
    Ok(())
}

fn storage_class() -> serde_json::Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": LOCAL_CLASS},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
    })
}

fn volume(node: &str, i: usize, dir: &Path) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": format!("local-{node}-{i}")},
        "spec": {
            "capacity": {"storage": CAPACITY},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": LOCAL_CLASS,
            "local": {"path": dir.display().to_string()},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": super::nodes::HOSTNAME_LABEL, "operator": "In", "values": [node]}
            ]}]}},
        },
    })
}
