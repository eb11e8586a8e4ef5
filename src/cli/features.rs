//! What the agent does not do in this deployment, and why: said once at start and shown in
//! `/status`, so a pod template without the downward API (or RBAC without Nodes) is noticed
//! instead of silently never labelling or handing over.

use serde::Serialize;
use valkey_sidecar_core::observation::Mode;

use crate::cli::config::Config;

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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::config::Cli;

    /// What a configuration from these flags leaves off: (feature, why) pairs.
    fn off(args: &[&str]) -> Vec<(String, String)> {
        let mut argv = vec!["valkey-sidecar"];
        argv.extend(args);
        let cli = Cli::try_parse_from(argv).unwrap();
        let config = cli.agent.validate().unwrap();
        config
            .off
            .into_iter()
            .map(|o| (o.feature.to_owned(), o.why))
            .collect()
    }

    const POD: [&str; 4] = ["--pod-name", "v-0-0", "--pod-namespace", "ns"];

    #[test]
    fn everything_on_says_nothing() {
        let args = [&POD[..], &["--cluster-name", "v"]].concat();
        assert!(off(&args).is_empty());
    }

    #[test]
    fn without_the_pods_name_labels_and_everything_coordinated_are_off() {
        let found = off(&["--pod-namespace", "ns", "--mode", "replication"]);
        let features: Vec<&str> = found.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            features,
            [super::LABELS, super::COORDINATOR, super::RECORDS]
        );
        assert!(
            found
                .iter()
                .all(|(_, why)| why.starts_with("POD_NAME is not set"))
        );
        let found = off(&["--pod-name", "v-0-0"]);
        assert!(
            found[0].1.starts_with("POD_NAMESPACE is not set"),
            "{found:?}"
        );
        assert_eq!(found.len(), 2, "cluster mode keeps no record: {found:?}");
    }

    #[test]
    fn what_was_turned_off_says_which_setting() {
        let found = off(&[&POD[..], &["--labels", "false"]].concat());
        assert_eq!(
            found[0],
            (super::LABELS.to_owned(), "SIDECAR_LABELS=false".to_owned())
        );
        let found = off(&[&POD[..], &["--coordinator", "false", "--cluster-name", "v"]].concat());
        let want = (
            super::COORDINATOR.to_owned(),
            "SIDECAR_COORDINATOR=false".to_owned(),
        );
        assert_eq!(found, [want]);
        let found = off(&POD);
        assert_eq!(found[0].1, "SIDECAR_CLUSTER_NAME is not set");
    }
}
