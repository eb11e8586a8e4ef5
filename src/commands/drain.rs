//! `valkey-sidecar drain-check NODE`: can this node be drained now, and if not, which shard would
//! lose what. Read-only: it lists the deployment's pods, asks the apiserver for a server-side
//! dry-run eviction of each pod on the node (the PodDisruptionBudgets' own verdict), and judges the
//! rest with `core::drain::decide` (a primary needs an in-sync replica elsewhere to hand over to).
//!
//! Exit codes: 0 the node can be drained now, 1 a drain would wait or lose a shard's primary
//! without a hand-over, 69 the API could not be asked (sysexits' EX_UNAVAILABLE), 64 bad usage.

use std::collections::BTreeMap;

use clap::{ArgMatches, Args};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{EvictParams, ListParams, PostParams};
use valkey_sidecar_core::drain::{DrainView, Eviction, NodeVerdict, ShardCopy, decide};
use valkey_sidecar_core::labels::LabelPolicy;

use crate::cli::RoleLabelArgs;

use crate::cli::exit;
use crate::k8s::KubeError;
use crate::k8s::pods::{SHARD_INDEX_LABEL, cordoned, is_ready, node_ready};

/// Tell whether a node can be drained now without a shard losing its primary or its last
/// in-sync copy (read-only; uses KUBECONFIG or the in-cluster account).
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// The node to drain.
    pub node: String,
    /// The namespace of the Valkey pods.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    /// Selects the Valkey pods.
    #[arg(long, short = 'l', default_value = "valkey.io/cluster")]
    pub selector: String,
    #[command(flatten)]
    pub role: RoleLabelArgs,
}

/// `valkey-sidecar drain-check`; returns the exit code.
pub fn main(matches: &ArgMatches) -> i32 {
    crate::cli::api_tool("drain-check", matches, |args: DrainArgs| async move {
        let verdict = check(&args).await.map_err(|e| e.to_string())?;
        Ok(report(&args.node, &verdict))
    })
}

/// Asks the API and judges.
pub async fn check(args: &DrainArgs) -> Result<NodeVerdict, KubeError> {
    let client = crate::k8s::client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &args.namespace);
    let list = pods
        .list(&ListParams::default().labels(&args.selector))
        .await?;
    let usable = usable_nodes(&client).await;
    let copies: Vec<ShardCopy> = list
        .items
        .iter()
        .filter_map(|p| copy_of(p, &args.role.policy(), &usable))
        .collect();
    let mut evictions = BTreeMap::new();
    for c in copies.iter().filter(|c| c.node == args.node) {
        evictions.insert(c.pod.clone(), dry_run_eviction(&pods, &c.pod).await?);
    }
    Ok(decide(&DrainView {
        node: args.node.clone(),
        copies,
        evictions,
    }))
}

/// Node name → usable (Ready and schedulable). Without the right to list nodes every node counts
/// as usable: the budgets still judge, only cordons go unseen.
async fn usable_nodes(client: &kube::Client) -> Option<BTreeMap<String, bool>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default()).await.ok()?;
    Some(
        list.items
            .iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, node_usable(n))))
            .collect(),
    )
}

fn node_usable(n: &Node) -> bool {
    node_ready(n) && !cordoned(n)
}

fn copy_of(
    p: &Pod,
    policy: &LabelPolicy,
    usable: &Option<BTreeMap<String, bool>>,
) -> Option<ShardCopy> {
    let labels = p.metadata.labels.clone().unwrap_or_default();
    let node = p.spec.as_ref()?.node_name.clone()?;
    let shard = labels
        .get(SHARD_INDEX_LABEL)
        .or_else(|| labels.get("valkey.io/shard-id"))
        .cloned()
        .unwrap_or_else(|| "?".into());
    let role = policy.role_in(&labels);
    Some(ShardCopy {
        pod: p.metadata.name.clone()?,
        shard,
        role,
        ready: is_ready(p),
        usable_node: usable
            .as_ref()
            .is_none_or(|u| u.get(&node).copied().unwrap_or(false)),
        node,
    })
}

/// A server-side dry run of the pod's eviction: the apiserver checks the budgets, nothing happens.
async fn dry_run_eviction(pods: &Api<Pod>, pod: &str) -> Result<Eviction, KubeError> {
    let params = EvictParams {
        post_options: PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        ..EvictParams::default()
    };
    match pods.evict(pod, &params).await {
        Ok(_) => Ok(Eviction::Allowed),
        Err(kube::Error::Api(s)) if s.code == 429 || s.code == 403 => {
            Ok(Eviction::Refused(s.message))
        }
        Err(e) => Err(KubeError::Api(e)),
    }
}

/// Prints the verdict; the exit code says it.
fn report(node: &str, v: &NodeVerdict) -> i32 {
    let head = if v.now {
        "can be drained now"
    } else {
        "cannot be drained now"
    };
    println!("node {node} {head}");
    for p in &v.pods {
        let mark = if p.now { "ok " } else { "NO " };
        println!("  {mark} {} (shard {}): {}", p.pod, p.shard, p.reason);
    }
    for n in &v.notes {
        println!("  note: {n}");
    }
    if v.now { exit::OK } else { exit::NO }
}
