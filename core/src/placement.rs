//! Where the pod is: zone and region from the best source available.

use std::collections::BTreeMap;

/// The well-known node topology labels (copied onto pods by clusters with KEP-4742).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";

/// Where a zone came from, for the status and the one-time log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Config,
    PodLabels,
    Node,
    Unknown,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Config => "configuration",
            Source::PodLabels => "pod labels",
            Source::Node => "node labels",
            Source::Unknown => "unknown",
        }
    }
}

/// Zone and region of the pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    pub zone: Option<String>,
    pub region: Option<String>,
}

/// Picks zone and region in order: explicit configuration, the pod's own topology labels, the
/// Node's labels. Zone and region are resolved independently (a configured zone with a region
/// from the node is fine).
pub fn resolve(
    configured: &Placement,
    pod_labels: &BTreeMap<String, String>,
    node_labels: Option<&BTreeMap<String, String>>,
) -> (Placement, Source) {
    let (zone, source) = pick(
        configured.zone.as_ref(),
        pod_labels,
        node_labels,
        ZONE_LABEL,
    );
    let (region, _) = pick(
        configured.region.as_ref(),
        pod_labels,
        node_labels,
        REGION_LABEL,
    );
    (Placement { zone, region }, source)
}

fn pick(
    configured: Option<&String>,
    pod: &BTreeMap<String, String>,
    node: Option<&BTreeMap<String, String>>,
    key: &str,
) -> (Option<String>, Source) {
    let non_empty = |v: Option<&String>| v.filter(|s| !s.is_empty()).cloned();
    if let Some(v) = non_empty(configured) {
        return (Some(v), Source::Config);
    }
    if let Some(v) = non_empty(pod.get(key)) {
        return (Some(v), Source::PodLabels);
    }
    match non_empty(node.and_then(|n| n.get(key))) {
        Some(v) => (Some(v), Source::Node),
        None => (None, Source::Unknown),
    }
}

/// The zone to push into Valkey's `availability-zone`, if it differs from what Valkey reports.
/// Valkey forgets a `CONFIG SET` on restart, so this is checked on every observation.
pub fn zone_to_push<'a>(zone: Option<&'a str>, valkey_zone: Option<&str>) -> Option<&'a str> {
    zone.filter(|z| Some(*z) != valkey_zone)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn order_is_config_then_pod_then_node() {
        let pod = labels(&[(ZONE_LABEL, "pod-zone")]);
        let node = labels(&[(ZONE_LABEL, "node-zone"), (REGION_LABEL, "node-region")]);
        let configured = Placement {
            zone: Some("cfg-zone".into()),
            region: None,
        };
        let (p, s) = resolve(&configured, &pod, Some(&node));
        assert_eq!(
            (p.zone.as_deref(), p.region.as_deref(), s),
            (Some("cfg-zone"), Some("node-region"), Source::Config)
        );
        let (p, s) = resolve(&Placement::default(), &pod, Some(&node));
        assert_eq!(
            (p.zone.as_deref(), s),
            (Some("pod-zone"), Source::PodLabels)
        );
        let (p, s) = resolve(&Placement::default(), &BTreeMap::new(), Some(&node));
        assert_eq!((p.zone.as_deref(), s), (Some("node-zone"), Source::Node));
        let (p, s) = resolve(&Placement::default(), &BTreeMap::new(), None);
        assert_eq!((p, s), (Placement::default(), Source::Unknown));
    }

    #[test]
    fn zone_is_pushed_only_when_different() {
        assert_eq!(zone_to_push(Some("a"), None), Some("a"));
        assert_eq!(zone_to_push(Some("a"), Some("b")), Some("a"));
        assert_eq!(zone_to_push(Some("a"), Some("a")), None);
        assert_eq!(zone_to_push(None, Some("a")), None);
    }
}
