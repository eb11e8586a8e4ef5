//! `valkey-sidecar check` (the chart's `helm test`): is a Valkey deployment healthy — every shard
//! with exactly one pod labelled primary, every pod there and Ready, the coordinator Lease held by
//! one of its pods and renewed. Each problem names its shard, so a failed test says which.

use std::collections::BTreeMap;

use crate::observation::Role;

/// One pod of the deployment, as the API has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub name: String,
    /// `valkey.io/shard-index`.
    pub shard: Option<String>,
    /// The live role label.
    pub role: Option<Role>,
    /// Ready, and not being deleted.
    pub ready: bool,
}

/// The coordinator Lease, as watched for a while.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseFacts {
    pub name: String,
    pub holder: Option<String>,
    /// The holder renewed it while the check watched (at most one lease duration).
    pub renewed: bool,
}

/// What the check looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckView {
    /// The shards there should be (`0..shards`).
    pub shards: u32,
    /// Pods each shard should have.
    pub pods_per_shard: u32,
    pub pods: Vec<PodFacts>,
    /// `None`: the Lease does not exist.
    pub lease: Option<LeaseFacts>,
    pub lease_name: String,
}

/// Every problem found, shard by shard, then the Lease's; empty when healthy.
pub fn decide(view: &CheckView) -> Vec<String> {
    let by_shard = group(&view.pods);
    let mut problems: Vec<String> = (0..view.shards)
        .flat_map(|s| shard(view, &s.to_string(), by_shard.get(&s.to_string())))
        .collect();
    problems.extend(strays(view, &by_shard));
    problems.extend(lease(view));
    problems
}

fn group(pods: &[PodFacts]) -> BTreeMap<String, Vec<&PodFacts>> {
    let mut by_shard: BTreeMap<String, Vec<&PodFacts>> = BTreeMap::new();
    for p in pods {
        let shard = p.shard.clone().unwrap_or_else(|| "?".into());
        by_shard.entry(shard).or_default().push(p);
    }
    by_shard
}

fn names(pods: &[&PodFacts]) -> String {
    pods.iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn shard(view: &CheckView, shard: &str, pods: Option<&Vec<&PodFacts>>) -> Vec<String> {
    let pods = pods.map(Vec::as_slice).unwrap_or_default();
    let mut problems = Vec::new();
    if pods.len() != view.pods_per_shard as usize {
        problems.push(format!(
            "shard {shard}: {} of {} pods exist",
            pods.len(),
            view.pods_per_shard
        ));
    }
    let primaries: Vec<&PodFacts> = pods
        .iter()
        .copied()
        .filter(|p| p.role == Some(Role::Primary))
        .collect();
    match primaries.len() {
        0 => problems.push(format!("shard {shard}: no pod is labelled primary")),
        1 => {}
        _ => problems.push(format!(
            "shard {shard}: {} pods are labelled primary ({})",
            primaries.len(),
            names(&primaries)
        )),
    }
    let unready: Vec<&PodFacts> = pods.iter().copied().filter(|p| !p.ready).collect();
    if !unready.is_empty() {
        problems.push(format!("shard {shard}: not Ready: {}", names(&unready)));
    }
    problems
}

/// Pods of no expected shard (a wrong label, or more shards than the release has).
fn strays(view: &CheckView, by_shard: &BTreeMap<String, Vec<&PodFacts>>) -> Vec<String> {
    let expected = |s: &str| s.parse::<u32>().is_ok_and(|n| n < view.shards);
    by_shard
        .iter()
        .filter(|(s, _)| !expected(s))
        .map(|(s, pods)| {
            format!(
                "pods of no shard of this release (shard {s}): {}",
                names(pods)
            )
        })
        .collect()
}

fn lease(view: &CheckView) -> Option<String> {
    let Some(lease) = &view.lease else {
        return Some(format!(
            "the coordinator Lease {} does not exist",
            view.lease_name
        ));
    };
    let Some(holder) = lease.holder.as_deref().filter(|h| !h.is_empty()) else {
        return Some(format!("the coordinator Lease {} is not held", lease.name));
    };
    // The holder identity is `<pod>_<pod uid>` (pod names have no `_`).
    let pod = holder.split('_').next().unwrap_or(holder);
    if !view.pods.iter().any(|p| p.name == pod) {
        return Some(format!(
            "the coordinator Lease {} is held by {holder}, no pod of this deployment",
            lease.name
        ));
    }
    (!lease.renewed).then(|| {
        format!(
            "the coordinator Lease {} (held by {holder}) was not renewed within its duration",
            lease.name
        )
    })
}
