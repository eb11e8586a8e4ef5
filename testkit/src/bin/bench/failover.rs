//! `bench failover`: unplanned failover in replication mode with the agent, measured like the
//! Sentinel baseline — kill -9 of the primary's Valkey (its agent stays), then the time until
//! another pod takes writes, and until it also carries the `primary` label; acknowledged writes
//! lost on the way. One stage, the runs one after the other (the killed node rejoins between).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use valkey_sidecar_testkit::k8s::shard;
use valkey_sidecar_testkit::k8s::writer::{Writer, lost};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions};

/// What one run measured.
pub struct Run {
    pub writable: Duration,
    pub labelled: Duration,
    pub lost: usize,
}

/// The stage: one shard of three pods in replication mode.
pub async fn stage(bin: &Path) -> Result<Stage> {
    Stage::start(StageOptions::replication("valkey", bin, &[])).await
}

/// One run: kill the primary's Valkey, time the replacement, count the writes lost.
pub async fn run(s: &Stage) -> Result<Run> {
    let old = shard::wait_steady(s, Duration::from_secs(60)).await?;
    let addrs = s
        .pods
        .iter()
        .map(|p| s.valkey(p))
        .collect::<Result<Vec<_>>>()?;
    let writer = Writer::start(addrs, format!("r{}", rand_tag()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    s.kubelet.crash_container(&s.namespace, &old, "valkey")?;
    let (mut writable_at, mut new) = (None, None);
    while killed.elapsed() < Duration::from_secs(30) {
        for p in s.pods.iter().filter(|p| **p != old) {
            if writable_at.is_none() && shard::write_acked(s, p, Duration::from_millis(100)) {
                writable_at = Some(killed.elapsed());
            }
            if writable_at.is_some() && shard::serves_as_primary(s, p).await {
                new = Some((p.clone(), killed.elapsed()));
            }
        }
        if new.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (primary, labelled) = new.context("no new primary within 30 s")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tag = writer.tag.clone();
    let written = writer.stop()?;
    let lost = lost(s.valkey(&primary)?, &tag, &written.acked)?;
    Ok(Run {
        writable: writable_at.unwrap_or(labelled),
        labelled,
        lost,
    })
}

fn rand_tag() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
