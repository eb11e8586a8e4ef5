//! Disruption safety with the apiserver's own Eviction API and kube-controller-manager's
//! disruption controller, fed by the agents' readiness (a replica is Ready only in sync):
//! `kubectl drain` of every node in turn under writers, two nodes at once, a lagging replica, and a
//! one-pod deployment on one node. The chart's budgets are what is tested (per shard
//! `maxUnavailable: 1`), with the agents forming the cluster and handing primaries over.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::EvictParams;
use valkey_sidecar_testkit::faults::{self, Outcome, show};
use valkey_sidecar_testkit::k8s::chart::{label, node_of, shards};
use valkey_sidecar_testkit::k8s::follow::{Addresses, ShardWrites, Watcher, stop_writers, writers};
use valkey_sidecar_testkit::k8s::valkey::valkey_addr;
use valkey_sidecar_testkit::k8s::writer::tag_for_with;
use valkey_sidecar_testkit::k8s::{
    FakeNodesOptions, Stage, StageOptions, pod_is_ready, poll_until, sidecar_bin,
};
use valkey_sidecar_testkit::redis;

const SECOND: Duration = Duration::from_secs(1);
const ROLE: &str = "valkey.io/role";

/// The chart's `cluster-3x1` example (auth on, the chart's Valkey settings), `sets` on top.
fn options(namespace: &str, sets: &[&str]) -> StageOptions {
    let mut o = StageOptions::example(namespace, "cluster-3x1");
    for set in sets {
        o = o.set(set);
    }
    o
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap()
}

/// Waits until `count` pods are Ready with `primaries` primary labels, none terminating.
async fn settled(stage: &Stage, count: usize, primaries: usize) -> Vec<Pod> {
    stage
        .wait_settled(count, primaries, 120 * SECOND)
        .await
        .unwrap()
}

/// `valkey-sidecar drain-check` against the stage: exit code and output.
fn drain_check(stage: &Stage, node: &str) -> (i32, String) {
    let out = std::process::Command::new(sidecar_bin().unwrap())
        .args(["drain-check", node, "-n", &stage.namespace])
        .env("KUBECONFIG", stage.plane.kubeconfig_path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_every_node_in_turn_loses_nothing_and_two_at_once_is_refused_until_safe() {
    let stage = Stage::install(options("drain", &["replicas=2"]))
        .await
        .unwrap();
    let pods = settled(&stage, 9, 3).await;
    let addresses = Addresses::new(&pods);
    let watcher = Watcher::start(&stage, addresses.clone());
    let writers = writers(&stage, &pods, &addresses, true).unwrap();
    tokio::time::sleep(SECOND).await;
    let nodes: Vec<String> = stage.nodes.names();
    let start = Instant::now();
    let mut drains = Vec::new();
    for node in &nodes {
        let (code, text) = drain_check(&stage, node);
        println!("drain-check {node}: exit {code}\n{text}");
        let t = Instant::now();
        let out = stage.drain(node, 300 * SECOND).await;
        assert!(
            out.is_ok(),
            "kubectl drain {node}: {out:?}\n{}",
            stage.describe().await
        );
        drains.push((node.clone(), t.elapsed()));
        stage.plane.kubectl(&["uncordon", node]).await.unwrap();
        settled(&stage, 9, 3).await;
    }
    let total = start.elapsed();
    let seen = watcher.stop();
    let fewest: BTreeMap<String, usize> = seen
        .iter()
        .map(|(s, v)| (s.clone(), v.fewest_ready))
        .collect();
    let written = stop_writers(&stage, writers).await.unwrap();
    println!(
        "rolling drain of {} nodes: {total:?} in all, each {drains:?}",
        nodes.len()
    );
    println!("fewest Ready pods per shard during it: {fewest:?}; writers: {written:?}");
    faults::record(&rolling_drain(&nodes, total, &drains, &fewest, &written));
    assert!(
        fewest.values().all(|n| *n >= 1),
        "a shard had no Ready member: {fewest:?}"
    );
    for w in &written {
        assert!(w.acked > 100, "shard {}: {} writes", w.shard, w.acked);
        assert_eq!(w.lost, 0, "shard {} lost acknowledged writes", w.shard);
    }

    two_evictions_at_once(&stage).await;
}

/// The fault table's row for the rolling drain: all shards' writers together, and as the recovery
/// the longest write pause of any (the shards stay up; the pause is how long one was not
/// writable).
fn rolling_drain(
    nodes: &[String],
    total: Duration,
    drains: &[(String, Duration)],
    fewest: &BTreeMap<String, usize>,
    written: &[ShardWrites],
) -> Outcome {
    let acked = written.iter().map(|w| w.acked).sum();
    let missing = written.iter().map(|w| w.lost).sum();
    let pause = written.iter().map(|w| w.longest_pause).max();
    let slowest = drains.iter().map(|(_, d)| *d).max().unwrap_or_default();
    let fewest = fewest.values().min().copied().unwrap_or_default();
    Outcome::new(module_path!(), &format!("kubectl drain of all {} nodes in turn", nodes.len()))
        .writes(acked, missing)
        .recovery(pause.unwrap_or_default())
        .note(format!(
            "recovery: the longest write pause of {} shards' writers; {} in all, the slowest drain {}; every shard kept at least {fewest} Ready pod(s)",
            written.len(),
            show(total),
            show(slowest)
        ))
}

/// Evicts a shard's primary and one of its replicas at the same moment (as draining their two
/// nodes at once would): the budget lets one go and refuses the other with 429 until the first's
/// replacement is back and Ready.
async fn two_evictions_at_once(stage: &Stage) {
    let pods = settled(stage, 9, 3).await;
    let shard1 = shards(&pods).remove("1").unwrap();
    let (a, b) = (name(&shard1[0]), name(&shard1[1]));
    let api = stage.api();
    let params = EvictParams::default();
    let (ra, rb) = tokio::join!(api.evict(&a, &params), api.evict(&b, &params));
    let refused =
        |r: &Result<_, kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 429);
    println!(
        "evicting {a} and {b} at once: {:?} / {:?}",
        ra.as_ref().map(|_| "evicted"),
        rb.as_ref().map(|_| "evicted")
    );
    assert!(
        ra.is_ok() != rb.is_ok(),
        "exactly one eviction may pass: {ra:?} {rb:?}"
    );
    assert!(
        refused(&ra) || refused(&rb),
        "the other is refused with 429: {ra:?} {rb:?}"
    );
    let waiting = if ra.is_ok() { b } else { a };
    let t = Instant::now();
    let mut refusals = 0;
    loop {
        match api.evict(&waiting, &params).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 429 => refusals += 1,
            Err(e) => panic!("{e}"),
        }
        assert!(
            t.elapsed() < 120 * SECOND,
            "{waiting} never became evictable"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let whole = t.elapsed();
    println!(
        "{waiting}: refused {refusals} times, evicted {whole:?} later, once the shard was whole again"
    );
    faults::record(
        &Outcome::new(module_path!(), "two evictions in one shard at once")
            .recovery(whole)
            .note(format!(
                "recovery: first eviction → the shard whole again (the second eviction admitted); one admitted, the other refused with 429 {refusals} times; no writer"
            )),
    );
    assert!(refusals > 0);
    settled(stage, 9, 3).await;
}

/// Writes 16 KiB values under `tag` to `addr` until `stop`: enough for a throttled replica to
/// fall megabytes behind.
fn bulk_writer(
    (addr, password): (SocketAddr, &str),
    tag: String,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let url = format!("redis://:{password}@{addr}");
    std::thread::spawn(move || {
        let client = redis::Client::open(url).unwrap();
        let mut c = client.get_connection().unwrap();
        let value = "x".repeat(16 * 1024);
        let mut n = 0u64;
        // About 3 MiB/s: the throttled replica falls behind fast, yet its backlog stays far under
        // Valkey's replica output-buffer limits (a disconnect would mean a full resync).
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
            let _: redis::RedisResult<()> = redis::cmd("SET")
                .arg(format!("{{{tag}}}:bulk:{}", n % 512))
                .arg(&value)
                .query(&mut c);
            n += 1;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_blocks_the_eviction_of_its_primary_until_it_is_in_sync() {
    let stage = Stage::install(options("lag", &[])).await.unwrap();
    let pods = settled(&stage, 6, 3).await;
    let shard0 = shards(&pods).remove("0").unwrap();
    let primary = shard0
        .iter()
        .find(|p| label(p, ROLE) == Some("primary"))
        .unwrap()
        .clone();
    let replica = shard0
        .iter()
        .find(|p| label(p, ROLE) == Some("replica"))
        .unwrap()
        .clone();
    let addr = valkey_addr(&primary).unwrap();
    // The primary's replication stream to the replica is throttled to 64 KiB/s while a client
    // writes megabytes a second: the replica falls behind, beyond the agent's lag bound (1 MiB).
    stage
        .kubelet
        .throttle(
            &stage.namespace,
            (&name(&primary), addr.port()),
            &name(&replica),
            64 * 1024,
        )
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let password = stage.password.clone().unwrap();
    let tag = tag_for_with(addr, &stage.client()).unwrap();
    let load = bulk_writer((addr, &password), tag, stop.clone());
    let lagging = Instant::now();
    poll_until(
        "the lagging replica not Ready",
        60 * SECOND,
        Duration::from_millis(100),
        || async { Ok(!pod_is_ready(&stage.api().get(&name(&replica)).await?)) },
    )
    .await
    .unwrap();
    println!("replica throttled: not Ready after {:?}", lagging.elapsed());
    let dry = EvictParams {
        post_options: kube::api::PostParams {
            dry_run: true,
            ..Default::default()
        },
        ..EvictParams::default()
    };
    let api = stage.api();
    let refused =
        |r: &Result<_, kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 429);
    // The disruption controller needs a moment to count the unready replica.
    let blocked = poll_until(
        "the primary's eviction refused",
        30 * SECOND,
        Duration::from_millis(100),
        || async { Ok(refused(&api.evict(&name(&primary), &dry).await)) },
    )
    .await;
    assert!(blocked.is_ok(), "{blocked:?}");
    let refused_after = lagging.elapsed();
    println!("replica throttled: the primary's eviction refused after {refused_after:?}");
    let (code, text) = drain_check(&stage, node_of(&primary).unwrap());
    println!("drain-check while the replica lags: exit {code}\n{text}");
    assert_eq!(code, 1, "{text}");
    assert!(text.contains(&format!("NO  {}", name(&primary))), "{text}");
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let healed = Instant::now();
    stage.kubelet.heal_network().unwrap();
    poll_until(
        "the primary evictable again",
        60 * SECOND,
        Duration::from_millis(100),
        || async { Ok(api.evict(&name(&primary), &dry).await.is_ok()) },
    )
    .await
    .unwrap();
    let evictable = healed.elapsed();
    println!(
        "primary evictable {evictable:?} after the throttle was lifted (the replica caught up, Ready again)"
    );
    faults::record(
        &Outcome::new(module_path!(), "replica lagging (replication throttled to 64 KiB/s)")
            .recovery(evictable)
            .note(format!(
                "recovery: throttle lifted → the replica caught up and its primary evictable again; the primary's eviction refused (429) {} after the throttle began; bulk writer, not counted",
                show(refused_after)
            )),
    );
    let (code, text) = drain_check(&stage, node_of(&primary).unwrap());
    println!("drain-check after: exit {code}\n{text}");
    assert_eq!(code, 0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_pod_deployment_on_one_node_drains_without_hanging() {
    let mut opts = options("tiny", &["shards=1", "replicas=0"]);
    opts.nodes = FakeNodesOptions {
        count: 1,
        zones: vec!["zone-a".into()],
        ..FakeNodesOptions::default()
    };
    let stage = Stage::install(opts).await.unwrap();
    let pods = settled(&stage, 1, 1).await;
    let node = node_of(&pods[0]).unwrap().to_owned();
    let (code, text) = drain_check(&stage, &node);
    println!("drain-check: exit {code}\n{text}");
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("only pod"), "{text}");
    let t = Instant::now();
    stage.drain(&node, 120 * SECOND).await.unwrap();
    let took = t.elapsed();
    println!(
        "one pod, one node, no replica: drained in {took:?} (no budget; the preStop wait ends at once, nothing can take over)"
    );
    assert!(
        took < 15 * SECOND,
        "the drain hung on the preStop wait: {took:?}"
    );
    let uncordoned = Instant::now();
    stage.plane.kubectl(&["uncordon", &node]).await.unwrap();
    settled(&stage, 1, 1).await;
    faults::record(
        &Outcome::new(module_path!(), "one-pod deployment on one node drained")
            .recovery(uncordoned.elapsed())
            .note(format!(
                "recovery: uncordon → the pod back, Ready and labelled (no replica: down meanwhile); the drain took {} (no hang on the preStop wait); no writer",
                show(took)
            )),
    );
}
