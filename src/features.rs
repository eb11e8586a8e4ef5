//! What the agent does not do in this deployment, and why: said once at start and shown in
//! `/status`, so a pod template without the downward API (or RBAC without Nodes) is noticed
//! instead of silently never labelling or handing over.

use serde::Serialize;
use valkey_sidecar_core::observation::Mode;

use crate::config::Config;

/// One feature that is off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Off {
    /// What the agent does not do.
    pub feature: &'static str,
    /// Why, naming what to set.
    pub why: String,
}

/// Why a whole group of features is off, as the configuration says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// `POD_NAME` is missing (labels on `auto`).
    NoPodName,
    /// `POD_NAMESPACE` is missing (labels on `auto`).
    NoNamespace,
    /// `SIDECAR_LABELS=false`.
    LabelsOff,
    /// `SIDECAR_COORDINATOR=false`.
    CoordinatorOff,
    /// `SIDECAR_CLUSTER_NAME` is missing (coordinator on `auto`).
    NoClusterName,
}

const LABELS: &str = "role, shard and zone labels on this pod";
const COORDINATOR: &str = "hand-overs before a pod or node goes away, fail-back and balance";
const RECORDS: &str = "replication mode's primary record and failover";
const NODES: &str = "reading Nodes: cordons and NotReady nodes, the zone from the Node";

impl Cause {
    fn why(self) -> String {
        match self {
            Cause::NoPodName => {
                "POD_NAME is not set (downward API fieldRef metadata.name in the pod template)"
            }
            Cause::NoNamespace => {
                "POD_NAMESPACE is not set (downward API fieldRef metadata.namespace in the pod template)"
            }
            Cause::LabelsOff => "SIDECAR_LABELS=false",
            Cause::CoordinatorOff => "SIDECAR_COORDINATOR=false",
            Cause::NoClusterName => "SIDECAR_CLUSTER_NAME is not set",
        }
        .to_owned()
    }
}

/// The features a validated configuration leaves off. Labels need the pod's name and namespace;
/// everything coordinated needs labels (the agents find each other through them) and a cluster
/// name.
pub fn off(config: &Config, cause: Option<Cause>) -> Vec<Off> {
    let Some(cause) = cause else {
        return Vec::new();
    };
    let labelled = config.kube.is_some();
    let mut features = Vec::new();
    if !labelled {
        features.push(LABELS);
    }
    features.push(COORDINATOR);
    if config.mode == Mode::Replication {
        features.push(RECORDS);
    }
    features
        .into_iter()
        .map(|feature| Off {
            feature,
            why: cause.why(),
        })
        .collect()
}

/// Nodes may not be read (found out at run time, from the API).
pub fn nodes_unreadable() -> Off {
    Off {
        feature: NODES,
        why: "the ServiceAccount may not list nodes (the chart's namespace profile or sidecar.readNodes=false): \
              hand-overs start when a pod is deleted or evicted, the zone comes from SIDECAR_ZONE or the pod's topology labels"
            .to_owned(),
    }
}

/// Says each feature that is off, once.
pub fn announce(off: &[Off]) {
    for o in off {
        tracing::warn!(feature = o.feature, why = %o.why, "off");
    }
}
