//! The install smoke that the Kubernetes version matrix and the chart's install profiles share,
//! on a settled [`Stage`] made with `helm install`: `helm test` passes; with the agents reading
//! Nodes, cordoning shard 0's primary's node hands the primary over under a writer with nothing
//! lost; `kubectl drain` of the node of shard 0's (new) primary hands over again, with nothing
//! lost, and the deployment settles again.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::writer::Writer;
use super::{Stage, poll_until};
use crate::Result;

/// What the smoke measured.
#[derive(Debug, Clone)]
pub struct SmokeReport {
    /// Cordon → the primary moved (when the agents read Nodes).
    pub cordon: Option<Moved>,
    /// `kubectl drain` of the primary's node.
    pub drain: Moved,
    /// `helm test`'s output.
    pub helm_test: String,
}

/// One planned move under a writer.
#[derive(Debug, Clone)]
pub struct Moved {
    pub from: String,
    pub to: String,
    pub took: Duration,
    pub acked: usize,
    pub lost: usize,
    pub longest_pause: Duration,
    /// The old primary's `preStop` hook (drain: its pod was evicted): `HTTP 200` once the
    /// hand-over finished, an error when it waited out its timeout.
    pub prestop: Option<Result<String, String>>,
}

/// Runs the smoke; `cordon`: the agents read Nodes, so a cordon alone hands the primary over.
pub async fn run(stage: &Stage, cordon: bool) -> Result<SmokeReport> {
    let helm_test = stage.helm_test().await?;
    let cordon = match cordon {
        true => Some(cordon_hands_over(stage).await?),
        false => None,
    };
    let drain = drain_hands_over(stage).await?;
    Ok(SmokeReport {
        cordon,
        drain,
        helm_test,
    })
}

/// A writer on shard 0: its hash tag in cluster mode, over all of the shard's pods.
fn writer(stage: &Stage) -> Result<(Writer, String)> {
    let cluster_mode = stage
        .cmd(&stage.shard_pods(0)[0], &["CLUSTER", "MYID"])
        .is_ok();
    if cluster_mode {
        let w = stage.shard_writer(0)?;
        let tag = w.tag.clone();
        return Ok((w, tag));
    }
    let addrs = stage
        .shard_pods(0)
        .iter()
        .map(|p| stage.valkey(p))
        .collect::<Result<Vec<_>>>()?;
    Ok((stage.writer(addrs, "smoke"), "smoke".into()))
}

/// Shard 0's primary before a move, its node, and a writer on the shard that has been writing for
/// half a second.
struct Before {
    primary: String,
    node: String,
    writer: Writer,
    tag: String,
}

async fn before(stage: &Stage) -> Result<Before> {
    let (primary, _) = stage.primary_and_replicas(0)?;
    let node = stage.node_of(&primary).await?;
    let (writer, tag) = writer(stage)?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(Before {
        primary,
        node,
        writer,
        tag,
    })
}

/// Waits for the move that began at `started` and reads the writes back.
async fn after(stage: &Stage, b: Before, started: Instant) -> Result<Moved> {
    let to = wait_moved(stage, &b.primary, Duration::from_secs(30)).await?;
    let took = started.elapsed();
    stop(stage, b.writer, &b.tag, b.primary, to, took).await
}

/// Cordons the node of shard 0's primary and waits until another pod is primary by Valkey's word
/// and by its label.
async fn cordon_hands_over(stage: &Stage) -> Result<Moved> {
    let b = before(stage).await?;
    let node = b.node.clone();
    let started = Instant::now();
    stage.plane.kubectl(&["cordon", &node]).await?;
    let moved = after(stage, b, started).await?;
    stage.plane.kubectl(&["uncordon", &node]).await?;
    Ok(moved)
}

/// Drains the node of shard 0's primary (the pods evicted through the budgets, the primary
/// handing over in its preStop) and waits until the deployment settles again.
async fn drain_hands_over(stage: &Stage) -> Result<Moved> {
    let b = before(stage).await?;
    let node = b.node.clone();
    let started = Instant::now();
    if let Err(e) = stage.drain(&node, Duration::from_secs(300)).await {
        bail!("kubectl drain {node}: {e:#}\n{}", stage.describe().await);
    }
    let mut moved = after(stage, b, started).await?;
    moved.prestop = stage
        .kubelet
        .hook_runs()
        .into_iter()
        .filter(|h| h.pod == moved.from && h.hook == "preStop" && h.at >= started)
        .map(|h| h.result)
        .next_back();
    stage.plane.kubectl(&["uncordon", &node]).await?;
    let (shards, members) = stage.shape();
    stage
        .wait_settled(shards * members, shards, Duration::from_secs(120))
        .await?;
    Ok(moved)
}

/// Waits until a pod of shard 0 other than `from` is its primary, by Valkey and by label.
async fn wait_moved(stage: &Stage, from: &str, timeout: Duration) -> Result<String> {
    let moved = std::sync::Mutex::new(None);
    poll_until(
        "shard 0's primary moved",
        timeout,
        Duration::from_millis(20),
        || async {
            let Ok((now, _)) = stage.primary_and_replicas(0) else {
                return Ok(false);
            };
            let labelled = stage.labels(&now).await?.get(super::ROLE_LABEL).cloned();
            let done = now != from && labelled.as_deref() == Some("primary");
            if done {
                *moved.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
            }
            Ok(done)
        },
    )
    .await?;
    // The pod seen moved and labelled, not a second look: that may meet the evicted pod's
    // replacement before its agent made it a replica.
    moved
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .context("no primary seen")
}

/// Stops the writer a second after the move and reads every acknowledged write back from the new
/// primary.
async fn stop(
    stage: &Stage,
    w: Writer,
    tag: &str,
    from: String,
    to: String,
    took: Duration,
) -> Result<Moved> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = w.stop()?;
    let lost = stage
        .lost(&to, tag, &written.acked)
        .with_context(|| format!("reading the writes back from {to}"))?;
    Ok(Moved {
        from,
        to,
        took,
        acked: written.acked.len(),
        lost,
        longest_pause: written.longest_pause,
        prestop: None,
    })
}
