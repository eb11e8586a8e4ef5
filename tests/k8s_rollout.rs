//! The supervised rolling update end to end (`rollout.strategy: supervised`, the chart's default):
//! a `helm upgrade` changing a Valkey setting on a chart install with a writer per shard, the
//! StatefulSets on `OnDelete`, the coordinator evicting the outdated pods — replicas first, then
//! each primary handed over once to an updated replica — while kube-controller-manager re-creates
//! them and the disruption budgets bound every eviction. Every pod ends at the new revision, no
//! acknowledged write is lost, and each shard's primary moves exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use valkey_sidecar_testkit::k8s::chart::{label, shards, text};
use valkey_sidecar_testkit::k8s::valkey::valkey_addr;
use valkey_sidecar_testkit::k8s::writer::{Targets, Writer, missing, tag_for_with};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, pod_is_ready};
use valkey_sidecar_testkit::redis;

const SECOND: Duration = Duration::from_secs(1);
const ROLE: &str = "valkey.io/role";

/// What the watcher saw during the roll, per shard.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// The pods (name and uid) labelled primary, in the order they were, repeats folded.
    primaries: Vec<(String, String)>,
    /// The fewest Ready pods the shard had.
    fewest_ready: usize,
}

/// The writers' addresses: every pod's (cluster mode: a hash tag finds its shard) and each
/// shard's own (replication mode).
#[derive(Clone, Default)]
struct Addresses {
    all: Targets,
    by_shard: BTreeMap<String, Targets>,
}

impl Addresses {
    fn new(pods: &[Pod]) -> Addresses {
        let addrs =
            |pods: &[Pod]| Arc::new(Mutex::new(pods.iter().filter_map(valkey_addr).collect()));
        let by_shard = shards(pods)
            .into_iter()
            .map(|(s, m)| (s, addrs(&m)))
            .collect();
        Addresses {
            all: addrs(pods),
            by_shard,
        }
    }

    /// Re-created pods get new IPs: the writers follow them.
    fn update(&self, pods: &[Pod]) {
        *self.all.lock().unwrap() = pods.iter().filter_map(valkey_addr).collect();
        for (shard, members) in shards(pods) {
            if let Some(t) = self.by_shard.get(&shard) {
                *t.lock().unwrap() = members.iter().filter_map(valkey_addr).collect();
            }
        }
    }
}

/// Keeps the writers' addresses current and records per shard who is labelled primary and the
/// fewest Ready pods, until stopped.
struct Watcher {
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<BTreeMap<String, Seen>>>,
}

impl Watcher {
    fn start(stage: &Stage, addresses: Addresses) -> Watcher {
        let api = stage.api();
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                // The Valkey pods only (not the chart's credentials Job, say).
                let valkey = ListParams::default().labels("valkey.io/cluster");
                if let Ok(list) = api.list(&valkey).await {
                    addresses.update(&list.items);
                    observe(&mut log.lock().unwrap(), &list.items);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Watcher { task, seen }
    }

    fn stop(self) -> BTreeMap<String, Seen> {
        self.task.abort();
        self.seen.lock().unwrap().clone()
    }
}

fn observe(log: &mut BTreeMap<String, Seen>, pods: &[Pod]) {
    for (shard, members) in shards(pods) {
        let ready = members.iter().filter(|p| pod_is_ready(p)).count();
        let seen = log.entry(shard).or_insert(Seen {
            primaries: Vec::new(),
            fewest_ready: ready,
        });
        seen.fewest_ready = seen.fewest_ready.min(ready);
        let primary = members
            .iter()
            .filter(|p| label(p, ROLE) == Some("primary"))
            .map(|p| {
                let m = &p.metadata;
                (m.name.clone().unwrap(), m.uid.clone().unwrap())
            })
            .next();
        if let Some(p) = primary
            && seen.primaries.last() != Some(&p)
        {
            seen.primaries.push(p);
        }
    }
}

/// One writer per shard: in cluster mode on a hash tag the shard serves, in replication mode on
/// the shard's own pods' addresses (whichever accepts writes).
fn writers(stage: &Stage, pods: &[Pod], at: &Addresses, cluster: bool) -> Vec<(String, Writer)> {
    let mut out = Vec::new();
    for (shard, members) in shards(pods) {
        let primary = members
            .iter()
            .find(|p| label(p, ROLE) == Some("primary"))
            .unwrap();
        let (targets, tag) = if cluster {
            let tag = tag_for_with(valkey_addr(primary).unwrap(), &stage.client()).unwrap();
            (at.all.clone(), tag)
        } else {
            (at.by_shard[&shard].clone(), format!("roll-{shard}"))
        };
        out.push((shard, stage.writer_with(targets, &tag, stage.client())));
    }
    out
}

/// Per shard: acknowledged writes, how many the primary lacks afterwards, the longest pause.
async fn stop_writers(
    stage: &Stage,
    writers: Vec<(String, Writer)>,
) -> Vec<(String, usize, usize, Duration)> {
    let pods = stage.pod_objects().await.unwrap();
    let by_shard = shards(&pods);
    let mut out = Vec::new();
    for (shard, w) in writers {
        let tag = w.tag.clone();
        let written = w.stop().unwrap();
        let primary = by_shard[&shard]
            .iter()
            .find(|p| label(p, ROLE) == Some("primary"))
            .unwrap();
        let lost = missing(
            valkey_addr(primary).unwrap(),
            &stage.client(),
            &tag,
            &written.acked,
        );
        let lost = lost.unwrap().len();
        out.push((shard, written.acked.len(), lost, written.longest_pause));
    }
    out
}

/// Installs, upgrades a Valkey setting, and checks the roll: all pods re-created at the new
/// revision, nothing lost, one primary move per shard, no shard below `pods - 1` Ready pods.
async fn roll(opts: StageOptions, shards_n: usize, pods: usize, cluster: bool) {
    let mut opts = opts
        .set(&format!("shards={shards_n}"))
        .set(&format!("replicas={}", pods - 1));
    opts.helm_install = true;
    let stage = Stage::install(opts).await.unwrap();
    let before = stage
        .wait_settled(shards_n * pods, shards_n, 180 * SECOND)
        .await
        .unwrap();
    let addresses = Addresses::new(&before);
    let watcher = Watcher::start(&stage, addresses.clone());
    let writers = writers(&stage, &before, &addresses, cluster);
    tokio::time::sleep(2 * SECOND).await;
    let start = Instant::now();
    let setting = "valkey.extraArgs={--maxmemory,2gb,--maxmemory-policy,allkeys-lru}";
    println!("{}", stage.upgrade(&[setting]).unwrap());
    stage.wait_rolled(600 * SECOND).await.unwrap();
    let took = start.elapsed();
    let after = stage
        .wait_settled(shards_n * pods, shards_n, 120 * SECOND)
        .await
        .unwrap();
    let seen = watcher.stop();
    let written = stop_writers(&stage, writers).await;
    let events = stage.events().await.unwrap();
    println!("roll of {shards_n} shards x {pods} pods: {took:?}; seen {seen:?}");
    println!("writers (shard, acknowledged, lost, longest pause): {written:?}");
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap();
    let old: Vec<String> = before.iter().map(uid).collect();
    assert!(
        after.iter().all(|p| !old.contains(&uid(p))),
        "a pod was not replaced"
    );
    for pod in &after {
        let reply = stage
            .cmd(&name(pod), &["CONFIG", "GET", "maxmemory"])
            .unwrap();
        let value = match reply {
            redis::Value::Array(items) => text(items[1].clone()).unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(value, "2147483648", "{}: maxmemory", name(pod));
    }
    for (shard, s) in &seen {
        assert_eq!(
            s.primaries.len(),
            2,
            "shard {shard}: primaries {:?}",
            s.primaries
        );
        assert!(
            s.fewest_ready >= pods - 1,
            "shard {shard}: {} Ready",
            s.fewest_ready
        );
    }
    for (shard, acked, lost, _) in &written {
        assert!(*acked > 100, "shard {shard}: {acked} writes");
        assert_eq!(*lost, 0, "shard {shard} lost acknowledged writes");
    }
    let count = |reason: &str| events.lines().filter(|l| l.starts_with(reason)).count();
    assert_eq!(count("RollStarted"), shards_n, "{events}");
    assert_eq!(count("RollEvictedPod"), shards_n * pods, "{events}");
    for unplanned in ["HandoverStarted", "FailoverStarted", "CrashFailoverStarted"] {
        assert_eq!(count(unplanned), 0, "{events}");
    }
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_upgrade_rolls_replicas_first_and_moves_each_primary_once() {
    roll(StageOptions::example("roll", "cluster-3x1"), 3, 3, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replication_upgrade_rolls_replicas_first_and_moves_the_primary_once() {
    roll(StageOptions::replication("rollrepl", 2), 1, 3, false).await;
}
