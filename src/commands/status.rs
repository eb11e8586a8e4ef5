//! `valkey-sidecar status` (also `kubectl valkey-sidecar status`, the binary under the name
//! `kubectl-valkey_sidecar` on PATH): a cluster's pods with their live roles, readiness, zone,
//! node and revision; the coordinator Lease's holder and the status it publishes; a roll in
//! progress (`core::overview`). Read-only, with the user's kubeconfig.
//!
//! Exit codes: 0 shown, 69 the API could not be asked, 64 bad usage.

use std::sync::Arc;
use std::time::Duration;

use clap::{ArgMatches, Args, ValueEnum};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use valkey_sidecar_core::labels::LabelPolicy;
use valkey_sidecar_core::observation::Role;
use valkey_sidecar_core::overview::{Overview, PodRow, table};
use valkey_sidecar_core::placement::ZONE_LABEL;
use valkey_sidecar_core::requests::PAUSED;
use valkey_sidecar_core::status::PREFIX;

use crate::cli::RoleLabelArgs;
use crate::cli::exit;
use crate::commands::operate::Target;
use crate::coordinator::world::revisions;
use crate::k8s::KubeError;
use crate::k8s::pods::{SHARD_INDEX_LABEL, is_ready};

/// How `status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Show a Valkey deployment: each shard's pods (role, readiness, zone, node, revision), the
/// coordinator and its status, a roll in progress (uses KUBECONFIG or the in-cluster account).
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub role: RoleLabelArgs,
    /// `table` or `json`.
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    pub output: Output,
}

/// `valkey-sidecar status`; returns the exit code.
pub fn main(matches: &ArgMatches) -> i32 {
    crate::cli::api_tool("status", matches, |args: StatusArgs| async move {
        let overview = overview(&args).await.map_err(|e| e.to_string())?;
        match args.output {
            Output::Table => print!("{}", table(&overview)),
            Output::Json => println!("{}", json(&overview)),
        }
        Ok(exit::OK)
    })
}

/// Asks the API: the pods, their StatefulSets, the coordinator Lease.
async fn overview(args: &StatusArgs) -> Result<Overview, KubeError> {
    let client = crate::k8s::client().await?;
    let selector = format!("valkey.io/cluster={}", args.target.cluster);
    let params = ListParams::default().labels(&selector);
    let limit = Duration::from_secs(10);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &args.target.namespace);
    let pods = crate::k8s::bounded(limit, pods.list(&params)).await?.items;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &args.target.namespace);
    // Pods of an operator or of `inject` may have no StatefulSet of this label: no revisions then.
    let sets = crate::k8s::bounded(limit, sets.list(&params))
        .await
        .map(|l| l.items);
    let leases: Api<Lease> = Api::namespaced(client, &args.target.namespace);
    let name = args.target.lease_name();
    let lease = crate::k8s::bounded(limit, leases.get_opt(&name)).await?;
    let pods: Vec<Arc<Pod>> = pods.into_iter().map(Arc::new).collect();
    let sets: Vec<Arc<StatefulSet>> = sets.unwrap_or_default().into_iter().map(Arc::new).collect();
    let updated = revisions(&pods, &sets);
    let policy = args.role.policy();
    let rows = pods
        .iter()
        .filter_map(|p| row(p, &policy, &updated))
        .collect();
    let (coordinator, status) = lease.as_ref().map(coordinator_of).unwrap_or_default();
    let paused = lease.as_ref().and_then(|l| annotation(l, PAUSED));
    Ok(Overview {
        cluster: args.target.cluster.clone(),
        pods: rows,
        coordinator,
        status,
        paused,
    })
}

fn row(
    p: &Pod,
    policy: &LabelPolicy,
    updated: &std::collections::BTreeMap<String, bool>,
) -> Option<PodRow> {
    let labels = crate::k8s::labels_of(&p.metadata);
    let name = p.metadata.name.clone()?;
    Some(PodRow {
        shard: labels
            .get(SHARD_INDEX_LABEL)
            .cloned()
            .unwrap_or_else(|| "?".into()),
        role: policy.role_in(&labels),
        ready: is_ready(p),
        terminating: p.metadata.deletion_timestamp.is_some(),
        zone: labels
            .get(ZONE_LABEL)
            .or_else(|| labels.get("valkey.io/zone"))
            .cloned(),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        updated: updated.get(&name).copied(),
        name,
    })
}

/// One annotation of the Lease.
pub(crate) fn annotation(lease: &Lease, key: &str) -> Option<String> {
    lease.metadata.annotations.as_ref()?.get(key).cloned()
}

/// The Lease's holder and its status annotations (prefix removed).
fn coordinator_of(lease: &Lease) -> (Option<String>, std::collections::BTreeMap<String, String>) {
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    let status = annotations
        .into_iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(PREFIX)?.to_owned(), v)))
        .collect();
    (holder.filter(|h| !h.is_empty()), status)
}

fn json(o: &Overview) -> serde_json::Value {
    let role = |r: Option<Role>| match r {
        Some(Role::Primary) => Some("primary"),
        Some(Role::Replica) => Some("replica"),
        _ => None,
    };
    let pods: Vec<serde_json::Value> = o
        .pods
        .iter()
        .map(|p| {
            serde_json::json!({
                "shard": p.shard, "name": p.name, "role": role(p.role), "ready": p.ready,
                "terminating": p.terminating, "zone": p.zone, "node": p.node, "updated": p.updated,
            })
        })
        .collect();
    serde_json::json!({
        "cluster": o.cluster,
        "coordinator": o.coordinator,
        "paused": o.paused,
        "status": o.status,
        "pods": pods,
        "rollout": { "outdated": o.outdated(), "pods": o.pods.len() },
    })
}
