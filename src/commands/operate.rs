//! `valkey-sidecar pause | resume | switchover` (also as `kubectl valkey-sidecar …`): requests to
//! the coordinator, written as annotations on its Lease with the user's kubeconfig
//! (`core::requests`). The Lease holder picks them up with its next renewal, so one actor still
//! moves primaries; `switchover` waits for the holder's answer.
//!
//! Exit codes: 0 done, 64 bad usage, 69 the API or the coordinator could not be had (or the move
//! failed), 75 refused because it would be unsafe (no synced replica, a switchover pending, …).

use std::time::Duration;

use clap::{ArgMatches, Args};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use valkey_sidecar_core::requests::{
    ANSWER, Outcome, PAUSED, SWITCHOVER, SwitchoverAnswer, SwitchoverRequest,
};
use valkey_sidecar_core::status::{PAUSED as PAUSED_CONDITION, PREFIX};

use crate::cli::exit;
use crate::commands::status::annotation;
use crate::k8s::KubeError;

/// One API call may take this long.
const CALL: Duration = Duration::from_secs(10);
/// How often the Lease is read while waiting for the holder.
const POLL: Duration = Duration::from_millis(250);

/// Which coordinator: the deployment and its namespace.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// The deployment's name (`valkey.io/cluster`; the chart's `clusterName`, else the release).
    #[arg(long, default_value = "valkey")]
    pub cluster: String,
    /// Its namespace.
    #[arg(long, short = 'n', env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// The coordinator Lease (default `<cluster>-coordinator`).
    #[arg(long)]
    pub lease: Option<String>,
}

impl Target {
    /// The coordinator Lease's name.
    pub fn lease_name(&self) -> String {
        self.lease
            .clone()
            .unwrap_or_else(|| format!("{}-coordinator", self.cluster))
    }
}

/// Maintenance mode: the coordinator makes no move of its own choosing — no fail-back, no
/// balance, no roll step, no hand-over for a mere cordon. Labels and probes keep working, and it
/// still answers what is happening now: it hands over the primary of a pod being deleted (the pod
/// goes either way, and the hand-over keeps that to a ~50 ms pause instead of a failover), fails
/// over a primary whose Valkey died (in cluster mode Valkey would fail over itself after its node
/// timeout; in replication mode nothing else would), and makes switchovers asked for.
#[derive(Debug, Clone, Args)]
pub struct PauseArgs {
    #[command(flatten)]
    pub target: Target,
    /// Why, shown by `status` and on the Lease.
    #[arg(long, default_value = "maintenance")]
    pub reason: String,
}

/// Ends a pause.
#[derive(Debug, Clone, Args)]
pub struct ResumeArgs {
    #[command(flatten)]
    pub target: Target,
}

/// A planned, lossless hand-over of one shard's primary, made by the coordinator Lease's holder:
/// to `--to`, else to the synced replica with the highest offset (preferring the shard's zone).
/// Waits for the holder's answer. Fail-back and balance may move the primary again later unless
/// paused or turned off.
#[derive(Debug, Clone, Args)]
pub struct SwitchoverArgs {
    #[command(flatten)]
    pub target: Target,
    /// The shard (its `valkey.io/shard-index`).
    #[arg(long)]
    pub shard: u32,
    /// The pod to make primary (default: the best synced replica).
    #[arg(long)]
    pub to: Option<String>,
    /// How long to wait for the coordinator's answer.
    #[arg(long, default_value = "60s", value_parser = timeout)]
    pub timeout: Duration,
}

/// `--timeout`: 1 s to 1 h, with a unit.
fn timeout(v: &str) -> Result<Duration, String> {
    crate::cli::config::parse_duration_in(v, 1_000, 3_600_000)
}

/// What stopped a request, with its exit code.
#[derive(Debug, thiserror::Error)]
enum Stop {
    #[error("{0}")]
    Api(#[from] KubeError),
    #[error("{0}")]
    Unavailable(String),
    #[error("refused: {0}")]
    Refused(String),
}

impl Stop {
    fn code(&self) -> i32 {
        match self {
            Stop::Refused(_) => exit::REFUSED,
            Stop::Api(_) | Stop::Unavailable(_) => exit::UNAVAILABLE,
        }
    }
}

/// Runs one request tool: its error printed on one line, its exit code returned.
fn tool<A, F, Fut>(name: &str, matches: &ArgMatches, body: F) -> i32
where
    A: clap::FromArgMatches,
    F: FnOnce(A) -> Fut,
    Fut: std::future::Future<Output = Result<(), Stop>>,
{
    crate::cli::api_tool(name, matches, |args: A| async move {
        match body(args).await {
            Ok(()) => Ok(exit::OK),
            Err(e) => {
                eprintln!("valkey-sidecar {name}: {e}");
                Ok(e.code())
            }
        }
    })
}

/// `valkey-sidecar pause`.
pub fn pause(matches: &ArgMatches) -> i32 {
    tool("pause", matches, |args: PauseArgs| async move {
        let coordinator = Coordinator::open(&args.target).await?;
        let value = format!("since {} by {}: {}", now(), who(), args.reason);
        coordinator.annotate(PAUSED, Some(&value), None).await?;
        let acked = coordinator.wait_for(|l| paused_ack(l).is_some()).await;
        report("paused", acked.as_ref(), &coordinator.name);
        Ok(())
    })
}

/// `valkey-sidecar resume`.
pub fn resume(matches: &ArgMatches) -> i32 {
    tool("resume", matches, |args: ResumeArgs| async move {
        let coordinator = Coordinator::open(&args.target).await?;
        coordinator.annotate(PAUSED, None, None).await?;
        let acked = coordinator.wait_for(|l| paused_ack(l).is_none()).await;
        report("resumed", acked.as_ref(), &coordinator.name);
        Ok(())
    })
}

/// `valkey-sidecar switchover`.
pub fn switchover(matches: &ArgMatches) -> i32 {
    tool("switchover", matches, |args: SwitchoverArgs| async move {
        let coordinator = Coordinator::open(&args.target).await?;
        let request = SwitchoverRequest {
            id: request_id(),
            shard: args.shard.to_string(),
            to: args.to.clone(),
        };
        coordinator.ask(&request).await?;
        let answer = coordinator.answer(&request, args.timeout).await;
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                coordinator.withdraw(&request).await;
                return Err(e);
            }
        };
        match answer.outcome {
            Outcome::Done => {
                println!("shard {}: {}", args.shard, answer.message);
                println!(
                    "fail-back and balance may move it again later (see `valkey-sidecar pause`)"
                );
                Ok(())
            }
            Outcome::Refused => Err(Stop::Refused(answer.message)),
            Outcome::Failed => Err(Stop::Unavailable(format!("failed: {}", answer.message))),
        }
    })
}

/// The coordinator Lease, as the tools use it.
struct Coordinator {
    api: Api<Lease>,
    name: String,
}

impl Coordinator {
    /// The Lease must exist: without it no agent coordinates, and a request would go unread.
    async fn open(target: &Target) -> Result<Coordinator, Stop> {
        let client = crate::k8s::client().await?;
        let c = Coordinator {
            api: Api::namespaced(client, &target.namespace),
            name: target.lease_name(),
        };
        if c.get().await?.is_none() {
            return Err(Stop::Unavailable(format!(
                "no coordinator Lease {} in namespace {}: is this the deployment's name, and is \
                 its coordinator on?",
                c.name, target.namespace
            )));
        }
        Ok(c)
    }

    async fn get(&self) -> Result<Option<Lease>, KubeError> {
        crate::k8s::bounded(CALL, self.api.get_opt(&self.name)).await
    }

    /// Sets (or with `None` removes) one annotation; with `version`, only on that
    /// `resourceVersion` (409 otherwise), so a request never overwrites one it has not seen.
    async fn annotate(
        &self,
        key: &str,
        value: Option<&str>,
        version: Option<String>,
    ) -> Result<(), KubeError> {
        let mut metadata = json!({ "annotations": { key: value } });
        if let Some(v) = version {
            metadata["resourceVersion"] = Value::String(v);
        }
        let patch = Patch::Merge(json!({ "metadata": metadata }));
        let params = PatchParams::default();
        let call = self.api.patch(&self.name, &params, &patch);
        crate::k8s::bounded(CALL, call).await.map(|_| ())
    }

    /// Writes the switchover request, unless one is pending or no agent holds the Lease.
    async fn ask(&self, request: &SwitchoverRequest) -> Result<(), Stop> {
        for _ in 0..3 {
            let lease = self.get().await?.ok_or_else(|| gone(&self.name))?;
            if holder(&lease).is_none() {
                return Err(Stop::Unavailable(
                    "no agent holds the coordinator Lease: nobody would make the move".into(),
                ));
            }
            if let Some(pending) = annotation(&lease, SWITCHOVER) {
                return Err(Stop::Refused(format!(
                    "a switchover is pending already ({pending})"
                )));
            }
            let version = lease.metadata.resource_version.clone();
            match self
                .annotate(SWITCHOVER, Some(&request.render()), version)
                .await
            {
                Err(e) if e.kind() == "conflict" => continue,
                other => return other.map_err(Stop::from),
            }
        }
        Err(Stop::Unavailable(
            "the Lease kept changing; try again".into(),
        ))
    }

    /// The holder's answer to `request`, read from the Lease until `timeout`.
    async fn answer(
        &self,
        request: &SwitchoverRequest,
        timeout: Duration,
    ) -> Result<SwitchoverAnswer, Stop> {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            let lease = self.get().await?.ok_or_else(|| gone(&self.name))?;
            let answer = annotation(&lease, ANSWER).and_then(|a| SwitchoverAnswer::parse(&a));
            if let Some(a) = answer.filter(|a| a.id == request.id) {
                return Ok(a);
            }
            tokio::time::sleep(POLL).await;
        }
        Err(Stop::Unavailable(format!(
            "no answer from the coordinator within {timeout:?}; the request was withdrawn if \
             still pending (see `valkey-sidecar status`)"
        )))
    }

    /// Removes `request` if it is still the pending one (a late holder must not act on it).
    async fn withdraw(&self, request: &SwitchoverRequest) {
        let Ok(Some(lease)) = self.get().await else {
            return;
        };
        if annotation(&lease, SWITCHOVER) != Some(request.render()) {
            return;
        }
        let version = lease.metadata.resource_version.clone();
        if let Err(e) = self.annotate(SWITCHOVER, None, version).await {
            eprintln!("valkey-sidecar switchover: could not withdraw the request: {e}");
        }
    }

    /// The Lease once `done` holds for it, within ten seconds (a holder renews every two).
    async fn wait_for(&self, done: impl Fn(&Lease) -> bool) -> Option<Lease> {
        let deadline = tokio::time::Instant::now() + CALL;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(lease)) = self.get().await
                && holder(&lease).is_some()
                && done(&lease)
            {
                return Some(lease);
            }
            tokio::time::sleep(POLL).await;
        }
        None
    }
}

fn gone(name: &str) -> Stop {
    Stop::Unavailable(format!("the coordinator Lease {name} is gone"))
}

/// The holder's acknowledgement of a pause (its `Paused` condition).
fn paused_ack(lease: &Lease) -> Option<String> {
    annotation(lease, &format!("{PREFIX}{PAUSED_CONDITION}"))
}

fn holder(lease: &Lease) -> Option<String> {
    let spec = lease.spec.as_ref()?;
    spec.holder_identity.clone().filter(|h| !h.is_empty())
}

/// Says whether the holder has seen the change (a request is honoured by every later holder).
fn report(what: &str, acked: Option<&Lease>, lease: &str) {
    match acked.and_then(holder) {
        Some(h) => println!("{what}: the coordinator ({h}) acknowledged"),
        None => println!(
            "{what}: written on Lease {lease}; no holder acknowledged it yet (the next holder \
             honours it)"
        ),
    }
}

/// A request id unique enough to tell one request's answer from another's.
fn request_id() -> String {
    let nanos = jiff::Timestamp::now().as_nanosecond();
    format!("{:x}-{:x}", nanos, std::process::id())
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Who asked, for the record: the login name where there is one.
fn who() -> String {
    std::env::var("USER").unwrap_or_else(|_| "unknown".into())
}
