//! A chaos or upgrade test's view of a deployment while it changes: the writers' addresses kept
//! current as pods are re-created with new IPs, per shard who was labelled primary (a move is a
//! change of pod or of pod incarnation) and the fewest Ready pods; one writer per shard and what
//! each lost. Used by the drain and the rollout tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;

use super::chart::{label, shards};
use super::valkey::valkey_addr;
use super::writer::{Targets, Writer, missing, tag_for_with};
use super::{Stage, pod_is_ready};
use crate::Result;
use crate::net::lock;

const ROLE: &str = "valkey.io/role";

/// What the watcher saw of one shard.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// The pods (name and uid) labelled primary, in the order they were, repeats folded: a shard
    /// whose primary moved once shows two.
    pub primaries: Vec<(String, String)>,
    /// The fewest Ready pods the shard had.
    pub fewest_ready: usize,
}

/// The writers' addresses: every pod's (cluster mode: a hash tag finds its shard) and each
/// shard's own (replication mode).
#[derive(Clone, Default)]
pub struct Addresses {
    pub all: Targets,
    pub by_shard: BTreeMap<String, Targets>,
}

fn targets(pods: &[Pod]) -> Targets {
    Arc::new(Mutex::new(pods.iter().filter_map(valkey_addr).collect()))
}

impl Addresses {
    pub fn new(pods: &[Pod]) -> Addresses {
        let by_shard = shards(pods)
            .into_iter()
            .map(|(s, m)| (s, targets(&m)))
            .collect();
        Addresses {
            all: targets(pods),
            by_shard,
        }
    }

    /// Re-created pods get new IPs: the writers follow them.
    fn update(&self, pods: &[Pod]) {
        *lock(&self.all) = pods.iter().filter_map(valkey_addr).collect();
        for (shard, members) in shards(pods) {
            if let Some(t) = self.by_shard.get(&shard) {
                *lock(t) = members.iter().filter_map(valkey_addr).collect();
            }
        }
    }
}

/// Keeps the writers' addresses current and records what [`Seen`] holds, every 50 ms, until
/// stopped.
pub struct Watcher {
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<BTreeMap<String, Seen>>>,
}

impl Watcher {
    pub fn start(stage: &Stage, addresses: Addresses) -> Watcher {
        Watcher::start_every(stage, addresses, Duration::from_millis(50))
    }

    /// [`Watcher::start`], listing the pods every `period` (a large deployment's list every
    /// 50 ms would be much of what its apiserver serves).
    pub fn start_every(stage: &Stage, addresses: Addresses, period: Duration) -> Watcher {
        let api = stage.api();
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let log = seen.clone();
        // This deployment's Valkey pods only: not the chart's credentials Job, nor another
        // release's pods in the same namespace.
        let selector = format!("valkey.io/cluster={}", stage.cluster);
        let task = tokio::spawn(async move {
            loop {
                let valkey = ListParams::default().labels(&selector);
                if let Ok(list) = api.list(&valkey).await {
                    addresses.update(&list.items);
                    observe(&mut lock(&log), &list.items);
                }
                tokio::time::sleep(period).await;
            }
        });
        Watcher { task, seen }
    }

    pub fn stop(self) -> BTreeMap<String, Seen> {
        self.task.abort();
        lock(&self.seen).clone()
    }
}

fn primary_of(members: &[Pod]) -> Option<(String, String)> {
    let p = members.iter().find(|p| label(p, ROLE) == Some("primary"))?;
    Some((p.metadata.name.clone()?, p.metadata.uid.clone()?))
}

fn observe(log: &mut BTreeMap<String, Seen>, pods: &[Pod]) {
    for (shard, members) in shards(pods) {
        let ready = members.iter().filter(|p| pod_is_ready(p)).count();
        let seen = log.entry(shard).or_insert(Seen {
            primaries: Vec::new(),
            fewest_ready: ready,
        });
        seen.fewest_ready = seen.fewest_ready.min(ready);
        if let Some(p) = primary_of(&members)
            && seen.primaries.last() != Some(&p)
        {
            seen.primaries.push(p);
        }
    }
}

fn labelled_primary<'a>(members: &'a [Pod], shard: &str) -> Result<&'a Pod> {
    let primary = members.iter().find(|p| label(p, ROLE) == Some("primary"));
    primary.with_context(|| format!("shard {shard} has no pod labelled primary"))
}

/// One writer per shard: in cluster mode on a hash tag the shard serves (over every address), in
/// replication mode over the shard's own pods' addresses (whichever accepts writes).
pub fn writers(
    stage: &Stage,
    pods: &[Pod],
    at: &Addresses,
    cluster: bool,
) -> Result<Vec<(String, Writer)>> {
    let mut out = Vec::new();
    for (shard, members) in shards(pods) {
        let primary = labelled_primary(&members, &shard)?;
        let (targets, tag) = if cluster {
            let addr = valkey_addr(primary).context("the primary has no address")?;
            (at.all.clone(), tag_for_with(addr, &stage.client())?)
        } else {
            let targets = at.by_shard.get(&shard).context("no addresses")?;
            (targets.clone(), format!("writer-{shard}"))
        };
        out.push((shard, stage.writer_with(targets, &tag, stage.client())));
    }
    Ok(out)
}

/// What one shard's writer got acknowledged and its primary afterwards lacks.
#[derive(Debug, Clone)]
pub struct ShardWrites {
    pub shard: String,
    pub acked: usize,
    pub lost: usize,
    pub longest_pause: Duration,
    /// Connections and writes refused for their credentials ([`super::writer::Written`]).
    pub auth_failures: usize,
}

/// Stops the writers and reads every acknowledged write back from its shard's primary now.
pub async fn stop_writers(
    stage: &Stage,
    writers: Vec<(String, Writer)>,
) -> Result<Vec<ShardWrites>> {
    let pods = stage.pod_objects().await?;
    let by_shard = shards(&pods);
    let mut out = Vec::new();
    for (shard, w) in writers {
        let tag = w.tag.clone();
        let written = w.stop()?;
        let members = by_shard.get(&shard).context("the shard is gone")?;
        let primary = labelled_primary(members, &shard)?;
        let addr = valkey_addr(primary).context("the primary has no address")?;
        let lost = missing(addr, &stage.client(), &tag, &written.acked)?.len();
        let acked = written.acked.len();
        let longest_pause = written.longest_pause;
        out.push(ShardWrites {
            shard,
            acked,
            lost,
            longest_pause,
            auth_failures: written.auth_failures,
        });
    }
    Ok(out)
}
