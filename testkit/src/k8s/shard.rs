//! Looking at one replication-mode shard of a [`Stage`] the way a test or a benchmark needs to:
//! its record, who replicates from whom, who takes writes, who carries which label.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use super::{ROLE_LABEL, Stage, poll_until};
use crate::Result;

/// A shard record as the apiserver has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// `None`: released.
    pub holder: Option<String>,
    pub epoch: u64,
}

/// The record of the stage's `shard` (`<cluster>-<shard>-primary`), if it exists.
pub async fn record(s: &Stage, shard: &str) -> Option<Record> {
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    let lease = leases
        .get_opt(&format!("{}-{shard}-primary", s.cluster))
        .await
        .ok()??;
    let epoch = lease
        .metadata
        .annotations
        .and_then(|a| a.get("valkey.io/epoch")?.parse().ok())
        .unwrap_or(0);
    let holder = lease.spec?.holder_identity.filter(|h| !h.is_empty());
    Some(Record { holder, epoch })
}

fn text(v: Option<&redis::Value>) -> Option<String> {
    match v {
        Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        Some(redis::Value::SimpleString(s)) => Some(s.clone()),
        _ => None,
    }
}

/// Whether `pod`'s Valkey replicates from `primary`'s with the link up.
pub fn follows(s: &Stage, pod: &str, primary: &str) -> bool {
    let (Ok(addr), Ok(primary)) = (s.valkey(pod), s.valkey(primary)) else {
        return false;
    };
    let Ok(redis::Value::Array(items)) = s.cmd_at(addr, &["ROLE"]) else {
        return false;
    };
    text(items.get(1)) == Some(primary.ip().to_string())
        && text(items.get(3)).as_deref() == Some("connected")
}

/// Whether a write to `pod` is acknowledged within `limit` (a fenced primary blocks it, a
/// replica refuses it).
pub fn write_acked(s: &Stage, pod: &str, limit: Duration) -> bool {
    let Ok(addr) = s.valkey(pod) else {
        return false;
    };
    let url = match &s.password {
        Some(p) => format!("redis://:{}@{addr}", super::valkey::percent_encode(p)),
        None => format!("redis://{addr}"),
    };
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut c) = client.get_connection_with_timeout(limit) else {
        return false;
    };
    if c.set_read_timeout(Some(limit)).is_err() {
        return false;
    }
    redis::cmd("SET")
        .arg("probe")
        .arg(1)
        .query::<()>(&mut c)
        .is_ok()
}

/// The pods whose Valkey takes a write now.
pub fn writable(s: &Stage) -> Vec<String> {
    s.pods
        .iter()
        .filter(|p| write_acked(s, p, Duration::from_millis(300)))
        .cloned()
        .collect()
}

/// `pod`'s role label, if any.
pub async fn role_label(s: &Stage, pod: &str) -> Option<String> {
    s.labels(pod).await.ok()?.get(ROLE_LABEL).cloned()
}

/// Whether `pod` takes writes and carries the `primary` label.
pub async fn serves_as_primary(s: &Stage, pod: &str) -> bool {
    write_acked(s, pod, Duration::from_millis(100))
        && role_label(s, pod).await.as_deref() == Some("primary")
}

/// Waits until some pod other than `old` takes writes and carries the `primary` label.
pub async fn new_primary(s: &Stage, old: &str, timeout: Duration) -> Result<String> {
    let found = std::sync::Mutex::new(None);
    let waited = poll_until(
        "a new writable, labelled primary",
        timeout,
        Duration::from_millis(10),
        || async {
            for p in s.pods.iter().filter(|p| *p != old) {
                if serves_as_primary(s, p).await {
                    *crate::net::lock(&found) = Some(p.clone());
                    return Ok(true);
                }
            }
            Ok(false)
        },
    )
    .await;
    if let Err(e) = waited {
        let mut why = format!("{e:#}; record {:?}", record(s, "0").await);
        for p in &s.pods {
            why.push_str(&format!(
                "\n{p}: role {:?}, label {:?}, takes writes {}",
                s.role(p),
                role_label(s, p).await,
                write_acked(s, p, Duration::from_millis(100))
            ));
        }
        anyhow::bail!(why);
    }
    found
        .into_inner()
        .ok()
        .flatten()
        .context("no pod recorded as found")
}

/// Every pod but the record's holder replicates from it with the link up, and the holder carries
/// the `primary` label: a shard at rest. Returns the holder.
pub async fn steady(s: &Stage) -> Option<String> {
    let primary = record(s, "0").await?.holder?;
    let others = s.pods.iter().filter(|p| **p != primary);
    let linked = others.clone().all(|p| follows(s, p, &primary));
    (linked && role_label(s, &primary).await.as_deref() == Some("primary")).then_some(primary)
}

/// Waits for [`steady`]; returns the primary it saw. The primary comes from the steady look
/// itself: asking again a moment later can meet a transient (right after an apiserver outage a
/// replica's link or a label still catching up) and fail a test whose shard was steady.
pub async fn wait_steady(s: &Stage, timeout: Duration) -> Result<String> {
    let seen = std::sync::Mutex::new(None);
    poll_until(
        "a steady shard",
        timeout,
        Duration::from_millis(50),
        || async {
            let primary = steady(s).await;
            let found = primary.is_some();
            *crate::net::lock(&seen) = primary;
            Ok(found)
        },
    )
    .await?;
    let primary = crate::net::lock(&seen).take();
    primary.context("a steady shard was seen but not kept")
}

/// Replaces the Lease `name` with `edit` applied to it as last read. The running agents renew
/// their Leases, so a write may meet a newer resourceVersion: HTTP 409 comes before admission has
/// judged the write, so the Lease is read again and the write retried until admission answers.
pub async fn replace_fresh(
    api: &Api<Lease>,
    name: &str,
    edit: impl Fn(Lease) -> Lease,
) -> std::result::Result<Lease, kube::Error> {
    let mut tries = 0;
    loop {
        let lease = edit(api.get(name).await?);
        match api
            .replace(name, &kube::api::PostParams::default(), &lease)
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 409 && tries < 20 => tries += 1,
            other => return other,
        }
    }
}
