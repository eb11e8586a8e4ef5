//! The supervised rolling update end to end (`rollout.strategy: supervised`, the chart's default):
//! a `helm upgrade` changing a Valkey setting on a chart install with a writer per shard, the
//! StatefulSets on `OnDelete`, the coordinator evicting the outdated pods — replicas first, then
//! each primary handed over once to an updated replica — while kube-controller-manager re-creates
//! them and the disruption budgets bound every eviction. Every pod ends at the new revision, no
//! acknowledged write is lost, and each shard's primary moves exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use valkey_sidecar_testkit::faults::{self, Outcome, show};
use valkey_sidecar_testkit::k8s::chart::text;
use valkey_sidecar_testkit::k8s::follow::{
    Addresses, Seen, ShardWrites, Watcher, stop_writers, writers,
};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, kubectl_bin, sidecar_bin};
use valkey_sidecar_testkit::redis;

const SECOND: Duration = Duration::from_secs(1);

/// What a roll under writers showed.
struct Figures {
    took: Duration,
    seen: BTreeMap<String, Seen>,
    written: Vec<ShardWrites>,
    events: String,
    before: Vec<Pod>,
    after: Vec<Pod>,
}

/// Installs `shards_n` shards of `pods` with `strategy`, starts a writer per shard, upgrades a
/// Valkey setting and waits until every pod runs the new revision.
async fn upgrade_under_writers(
    opts: StageOptions,
    (shards_n, pods): (usize, usize),
    cluster: bool,
    (strategy, setting): (&str, &str),
) -> (Stage, Figures) {
    let mut opts = opts
        .set(&format!("shards={shards_n}"))
        .set(&format!("replicas={}", pods - 1))
        .set(&format!("rollout.strategy={strategy}"));
    opts.helm_install = true;
    let stage = Stage::install(opts).await.unwrap();
    let count = shards_n * pods;
    let before = stage
        .wait_settled(count, shards_n, 180 * SECOND)
        .await
        .unwrap();
    let addresses = Addresses::new(&before);
    let watcher = Watcher::start(&stage, addresses.clone());
    let writers = writers(&stage, &before, &addresses, cluster).unwrap();
    tokio::time::sleep(2 * SECOND).await;
    let start = Instant::now();
    println!("{}", stage.upgrade(&[setting]).unwrap());
    stage.wait_rolled(600 * SECOND).await.unwrap();
    let took = start.elapsed();
    let after = stage
        .wait_settled(count, shards_n, 120 * SECOND)
        .await
        .unwrap();
    let seen = watcher.stop();
    let written = stop_writers(&stage, writers).await.unwrap();
    let events = stage.events().await.unwrap();
    println!("{strategy} roll of {shards_n} shards x {pods} pods: {took:?}; seen {seen:?}");
    println!("writers (shard, acknowledged, lost, longest pause): {written:?}");
    let figures = Figures {
        took,
        seen,
        written,
        events,
        before,
        after,
    };
    let what = match setting.strip_prefix("valkey.image.tag=") {
        Some(to) => format!("helm upgrade of Valkey to {to}"),
        None => "helm upgrade of a Valkey setting".to_owned(),
    };
    record(&what, strategy, cluster, (shards_n, pods), &figures);
    (stage, figures)
}

/// A Valkey setting the roll applies.
const SETTING: &str = "valkey.extraArgs={--maxmemory,2gb,--maxmemory-policy,allkeys-lru}";

/// The fault table's row (`scripts/bench.sh` runs both strategies in one run).
fn record(what: &str, strategy: &str, cluster: bool, shape: (usize, usize), f: &Figures) {
    let (shards_n, pods) = shape;
    let mode = if cluster { "cluster" } else { "replication" };
    let scenario = format!(
        "{what} under a writer per shard, {strategy} ({mode} mode, {shards_n} × {pods} pods)"
    );
    let acked = f.written.iter().map(|w| w.acked).sum();
    let lost = f.written.iter().map(|w| w.lost).sum();
    let pause = f.written.iter().map(|w| w.longest_pause).max();
    let pause = pause.unwrap_or_default();
    let moves: Vec<usize> = f
        .seen
        .values()
        .map(|s| s.primaries.len().saturating_sub(1))
        .collect();
    let fewest: Vec<usize> = f.seen.values().map(|s| s.fewest_ready).collect();
    let note = format!(
        "recovery: the longest write pause of any shard; every pod re-created in {}; primary moves per shard {moves:?}; fewest Ready pods per shard {fewest:?}",
        show(f.took)
    );
    let row = Outcome::new(module_path!(), &scenario)
        .writes(acked, lost)
        .recovery(pause);
    faults::record(&row.note(note));
}

/// The supervised roll's promises: all pods re-created at the new revision (the setting applied),
/// nothing lost, one primary move per shard, no shard below `pods - 1` Ready pods, the moves
/// made by the roll alone.
async fn roll(opts: StageOptions, shape: (usize, usize), cluster: bool, setting: &str) -> Stage {
    let upgrade = ("supervised", setting);
    let (stage, f) = upgrade_under_writers(opts, shape, cluster, upgrade).await;
    let (shards_n, pods) = shape;
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap();
    let old: Vec<String> = f.before.iter().map(uid).collect();
    assert!(
        f.after.iter().all(|p| !old.contains(&uid(p))),
        "a pod was not replaced"
    );
    for pod in &f.after {
        applied(&stage, &name(pod), setting);
    }
    for (shard, s) in &f.seen {
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
    for w in &f.written {
        assert!(w.acked > 100, "shard {}: {} writes", w.shard, w.acked);
        assert_eq!(w.lost, 0, "shard {} lost acknowledged writes", w.shard);
    }
    let events = &f.events;
    let count = |reason: &str| events.lines().filter(|l| l.starts_with(reason)).count();
    assert_eq!(count("RollStarted"), shards_n, "{events}");
    assert_eq!(count("RollEvictedPod"), shards_n * pods, "{events}");
    for unplanned in ["HandoverStarted", "FailoverStarted", "CrashFailoverStarted"] {
        assert_eq!(count(unplanned), 0, "{events}");
    }
    stage
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap()
}

/// The pod's Valkey runs with what the upgrade set: the new version, or the setting.
fn applied(stage: &Stage, pod: &str, setting: &str) {
    if let Some(version) = setting.strip_prefix("valkey.image.tag=") {
        let info = text(stage.cmd(pod, &["INFO", "server"]).unwrap()).unwrap();
        let want = format!("valkey_version:{version}");
        assert!(info.lines().any(|l| l.trim() == want), "{pod}: {info}");
        return;
    }
    let reply = stage.cmd(pod, &["CONFIG", "GET", "maxmemory"]).unwrap();
    let value = match reply {
        redis::Value::Array(items) => text(items[1].clone()).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(value, "2147483648", "{pod}: maxmemory");
}

/// The benchmark's 3 × 3 row; the test command rolls cluster mode once, from Valkey 8.0.1 below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the benchmark's row; the test command rolls cluster mode in the 8.0 → 9.1 test"]
async fn a_cluster_upgrade_rolls_replicas_first_and_moves_each_primary_once() {
    let stage = roll(
        StageOptions::example("roll", "cluster-3x1"),
        (3, 3),
        true,
        SETTING,
    )
    .await;
    status_shows_the_rolled_cluster(&stage, (3, 3)).await;
}

/// `valkey-sidecar status` after the roll, as JSON and as a kubectl plugin's table.
async fn status_shows_the_rolled_cluster(stage: &Stage, (shards_n, pods_n): (usize, usize)) {
    let bin = sidecar_bin().unwrap();
    let kubeconfig = stage.plane.kubeconfig_path();
    let ns = stage.namespace.as_str();
    let out = std::process::Command::new(&bin)
        .args(["status", "--cluster", "valkey", "-n", ns, "-o", "json"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pods = v["pods"].as_array().unwrap();
    assert_eq!(pods.len(), shards_n * pods_n, "{v}");
    let primaries = pods.iter().filter(|p| p["role"] == "primary").count();
    assert_eq!(primaries, shards_n, "{v}");
    // Readiness is live (a replica briefly behind reads `false`); the revision is settled.
    assert!(pods.iter().all(|p| p["updated"] == true), "{v}");
    assert_eq!(v["rollout"]["outdated"], 0, "{v}");
    assert!(
        v["coordinator"]
            .as_str()
            .is_some_and(|h| h.starts_with("valkey-")),
        "{v}"
    );
    let rolled = v["status"]["RolloutComplete"].as_str().unwrap_or_default();
    assert!(rolled.starts_with("True UpToDate"), "{v}");
    // The same binary as a kubectl plugin: `kubectl valkey-sidecar status`.
    let dir = tempfile_dir();
    std::os::unix::fs::symlink(&bin, dir.join("kubectl-valkey_sidecar")).unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(kubectl_bin().unwrap())
        .args(["valkey-sidecar", "status", "--cluster", "valkey", "-n", ns])
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text.starts_with("SHARD  POD"), "{text}");
    assert!(
        text.contains("rollout: every pod runs its update revision"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kubectl-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// In the benchmark only: the test command rolls replication mode once, from Valkey 9.0.0 below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the benchmark's row; the test command rolls replication mode in the 9.0 → 9.1 test"]
async fn a_replication_upgrade_rolls_replicas_first_and_moves_the_primary_once() {
    roll(
        StageOptions::replication("rollrepl", 2),
        (1, 3),
        false,
        SETTING,
    )
    .await;
}

/// Valkey 8.0.1 (built with TLS from the vendored source) to 9.1.2 in cluster mode: during the roll
/// 9.1 replicas follow an 8.0 primary, then the primary moves to a 9.1 replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_8_0_to_9_1_in_cluster_mode_rolls_with_mixed_versions_and_loses_nothing() {
    let opts = StageOptions::example("v80", "cluster-3x1").set("valkey.image.tag=8.0.1");
    let stage = roll(opts, (2, 3), true, "valkey.image.tag=9.1.2").await;
    status_shows_the_rolled_cluster(&stage, (2, 3)).await;
}

/// Valkey 9.0.0 (PyPI) to 9.1.2 in replication mode; then `helm upgrade` refuses what the agents
/// cannot carry out: another shard count, a downgrade to an older major.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_9_0_to_9_1_in_replication_mode_rolls_and_loses_nothing() {
    let opts = StageOptions::replication("v90", 2).set("valkey.image.tag=9.0.0");
    let stage = roll(opts, (1, 3), false, "valkey.image.tag=9.1.2").await;
    let refused = |set: &str| format!("{:#}", stage.upgrade(&[set]).unwrap_err());
    let shards = refused("shards=2");
    assert!(
        shards.contains("runs 1 shards and the agents never reshard"),
        "{shards}"
    );
    let older = refused("valkey.image.tag=8.0.1");
    assert!(older.contains("to an older major version"), "{older}");
}

/// The benchmark's other two version rows, so that both versions roll in both modes: 9.0.0 → 9.1.2
/// in cluster mode and 8.0.1 → 9.1.2 in replication mode (a 9.1 replica of an 8.0 primary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the benchmark's row; the test command rolls 9.0 in replication mode, 8.0 in cluster mode"]
async fn valkey_9_0_to_9_1_in_cluster_mode_rolls_and_loses_nothing() {
    let opts = StageOptions::example("v90c", "cluster-3x1").set("valkey.image.tag=9.0.0");
    roll(opts, (3, 3), true, "valkey.image.tag=9.1.2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the benchmark's row; the test command rolls 9.0 in replication mode, 8.0 in cluster mode"]
async fn valkey_8_0_to_9_1_in_replication_mode_rolls_with_mixed_versions_and_loses_nothing() {
    let opts = StageOptions::replication("v80r", 2).set("valkey.image.tag=8.0.1");
    roll(opts, (1, 3), false, "valkey.image.tag=9.1.2").await;
}

/// The baseline the benchmark sets beside the supervised roll, same install, same writers:
/// StatefulSet's `RollingUpdate`. Only recorded (its figures are what they are); not part of the
/// test command. `scripts/bench.sh` runs the ignored tests of this file: this baseline, and the
/// supervised rolls of a setting in both modes beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark baseline: scripts/bench.sh runs it with --ignored"]
async fn baseline_rolling_update_of_the_same_cluster_install() {
    let opts = StageOptions::example("rollbase", "cluster-3x1");
    let upgrade = ("RollingUpdate", SETTING);
    let (_stage, f) = upgrade_under_writers(opts, (3, 3), true, upgrade).await;
    assert!(f.written.iter().all(|w| w.acked > 100), "{:?}", f.written);
}

/// The same baseline in replication mode: 1 shard × 3 pods rolled by `RollingUpdate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark baseline: scripts/bench.sh runs it with --ignored"]
async fn baseline_rolling_update_of_the_same_replication_install() {
    let opts = StageOptions::replication("rollbaser", 2);
    let upgrade = ("RollingUpdate", SETTING);
    let (_stage, f) = upgrade_under_writers(opts, (1, 3), false, upgrade).await;
    assert!(f.written.iter().all(|w| w.acked > 100), "{:?}", f.written);
}
