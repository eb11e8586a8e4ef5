//! `bench failover`: unplanned failover in replication mode with the agent, measured like the
//! Sentinel baseline — kill -9 of the primary's Valkey (its agent stays), then the time until
//! another pod takes writes, and until it also carries the `primary` label; acknowledged writes
//! lost on the way. One stage, the runs one after the other (the killed node rejoins between).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use valkey_sidecar_testkit::k8s::writer::{Writer, lost};
use valkey_sidecar_testkit::k8s::{ROLE_LABEL, Stage, StageOptions, poll_until};
use valkey_sidecar_testkit::redis;

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

/// The pod the shard record names.
pub async fn holder(s: &Stage) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    let lease = leases.get_opt("valkey-0-primary").await?;
    Ok(lease
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty()))
}

fn writable(s: &Stage, pod: &str) -> bool {
    let Ok(addr) = s.valkey(pod) else {
        return false;
    };
    let Ok(client) = redis::Client::open(format!("redis://{addr}")) else {
        return false;
    };
    let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(100)) else {
        return false;
    };
    if c.set_read_timeout(Some(Duration::from_millis(100)))
        .is_err()
    {
        return false;
    }
    redis::cmd("SET")
        .arg("probe")
        .arg(1)
        .query::<()>(&mut c)
        .is_ok()
}

async fn labelled_primary(s: &Stage, pod: &str) -> bool {
    let labels = s.labels(pod).await.unwrap_or_default();
    labels.get(ROLE_LABEL).map(String::as_str) == Some("primary")
}

/// Every pod but the holder replicates from it with the link up, and the holder is labelled.
async fn steady(s: &Stage) -> Result<bool> {
    let Some(primary) = holder(s).await? else {
        return Ok(false);
    };
    let ip = s.valkey(&primary)?.ip().to_string();
    for p in s.pods.iter().filter(|p| **p != primary) {
        let info = valkey_sidecar_testkit::k8s::valkey::cmd(s.valkey(p)?, &["INFO", "replication"]);
        let text = match info {
            Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
            Ok(redis::Value::VerbatimString { text, .. }) => text,
            _ => return Ok(false),
        };
        if !text.contains(&format!("master_host:{ip}")) || !text.contains("master_link_status:up") {
            return Ok(false);
        }
    }
    Ok(labelled_primary(s, &primary).await)
}

/// One run: kill the primary's Valkey, time the replacement, count the writes lost.
pub async fn run(s: &Stage) -> Result<Run> {
    poll_until(
        "a steady shard",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || steady(s),
    )
    .await?;
    let old = holder(s).await?.context("no primary on record")?;
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
            if writable_at.is_none() && writable(s, p) {
                writable_at = Some(killed.elapsed());
            }
            if writable_at.is_some() && labelled_primary(s, p).await && writable(s, p) {
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
