//! `valkey-sidecar check`: the chart's `helm test`. Reads the deployment's pods and watches the
//! coordinator Lease for up to one lease duration (a renewal seen on this process's monotonic
//! clock, never a comparison of `renewTime` with a wall clock), then judges with
//! `core::check::decide`. Read-only.
//!
//! Exit codes: 0 healthy, 1 not (each problem printed, naming its shard), 69 the API could not be
//! asked, 64 bad usage.

use std::time::Duration;

use clap::{ArgMatches, Args};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use valkey_sidecar_core::check::{CheckView, LeaseFacts, PodFacts, decide};
use valkey_sidecar_core::labels::LabelPolicy;

use crate::cli::RoleLabelArgs;
use crate::cli::exit;
use crate::k8s::KubeError;
use crate::k8s::pods::{SHARD_INDEX_LABEL, is_ready};

/// Check a Valkey deployment: one labelled primary per shard, every pod Ready, the coordinator
/// Lease held and renewed (uses KUBECONFIG or the in-cluster account).
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The deployment's name (`valkey.io/cluster`).
    #[arg(long)]
    pub cluster: String,
    /// Its namespace.
    #[arg(long, short = 'n', env = "POD_NAMESPACE")]
    pub namespace: String,
    /// Shards it should have.
    #[arg(long)]
    pub shards: u32,
    /// Pods each shard should have (1 + replicas).
    #[arg(long)]
    pub pods_per_shard: u32,
    /// The coordinator Lease (default `<cluster>-coordinator`).
    #[arg(long)]
    pub lease: Option<String>,
    #[command(flatten)]
    pub role: RoleLabelArgs,
    /// The longest the Lease is watched for a renewal (its duration is used when shorter).
    #[arg(long, default_value = "30", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub lease_wait_seconds: u64,
}

impl CheckArgs {
    fn lease_name(&self) -> String {
        self.lease
            .clone()
            .unwrap_or_else(|| format!("{}-coordinator", self.cluster))
    }
}

/// `valkey-sidecar check`; returns the exit code.
pub fn main(matches: &ArgMatches) -> i32 {
    crate::cli::api_tool("check", matches, |args: CheckArgs| async move {
        let view = view(&args).await.map_err(|e| e.to_string())?;
        Ok(report(&args, &view))
    })
}

fn report(args: &CheckArgs, view: &CheckView) -> i32 {
    let problems = decide(view);
    if problems.is_empty() {
        let holder = view.lease.as_ref().and_then(|l| l.holder.as_deref());
        println!(
            "{} is healthy: {} shard(s), {} pod(s) Ready, one labelled primary each, the coordinator {}",
            args.cluster,
            args.shards,
            view.pods.len(),
            holder.unwrap_or("?")
        );
        return exit::OK;
    }
    for p in &problems {
        println!("{}: {p}", args.cluster);
    }
    exit::NO
}

/// Asks the API.
async fn view(args: &CheckArgs) -> Result<CheckView, KubeError> {
    let client = crate::k8s::client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &args.namespace);
    let selector = format!("valkey.io/cluster={}", args.cluster);
    let params = ListParams::default().labels(&selector);
    let list = crate::k8s::bounded(Duration::from_secs(10), pods.list(&params)).await?;
    let policy = args.role.policy();
    let leases: Api<Lease> = Api::namespaced(client, &args.namespace);
    Ok(CheckView {
        shards: args.shards,
        pods_per_shard: args.pods_per_shard,
        pods: list
            .items
            .iter()
            .filter_map(|p| facts(p, &policy))
            .collect(),
        lease: watch_lease(&leases, &args.lease_name(), args.lease_wait_seconds).await?,
        lease_name: args.lease_name(),
    })
}

fn facts(p: &Pod, policy: &LabelPolicy) -> Option<PodFacts> {
    let labels = crate::k8s::labels_of(&p.metadata);
    Some(PodFacts {
        name: p.metadata.name.clone()?,
        shard: labels.get(SHARD_INDEX_LABEL).cloned(),
        role: policy.role_in(&labels),
        ready: is_ready(p) && p.metadata.deletion_timestamp.is_none(),
    })
}

/// The Lease's holder, and whether it was renewed while watched: read every 500 ms until its
/// `resourceVersion` changes (a renewal, or a new holder's first write), for at most its duration
/// (capped at `cap`).
async fn watch_lease(
    leases: &Api<Lease>,
    name: &str,
    cap: u64,
) -> Result<Option<LeaseFacts>, KubeError> {
    let read = || crate::k8s::bounded(Duration::from_secs(10), leases.get_opt(name));
    let Some(first) = read().await? else {
        return Ok(None);
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(duration_of(&first, cap));
    let mut latest = first.clone();
    while holder_of(&latest).is_some() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(now) = read().await? else {
            return Ok(None);
        };
        latest = now;
        if latest.metadata.resource_version != first.metadata.resource_version {
            break;
        }
    }
    let renewed = latest.metadata.resource_version != first.metadata.resource_version;
    Ok(Some(LeaseFacts {
        name: name.to_owned(),
        holder: holder_of(&latest),
        renewed: renewed && holder_of(&latest).is_some(),
    }))
}

fn duration_of(l: &Lease, cap: u64) -> u64 {
    l.spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|d| u64::try_from(d).ok())
        .unwrap_or(cap)
        .min(cap)
}

fn holder_of(l: &Lease) -> Option<String> {
    l.spec
        .as_ref()?
        .holder_identity
        .clone()
        .filter(|h| !h.is_empty())
}
