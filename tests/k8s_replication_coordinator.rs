//! The coordinator in replication mode end to end: what it costs the apiserver while the shard
//! is calm, and a planned hand-over when the primary's node is cordoned (a switchover: pause,
//! catch-up, record, promote, repoint) with a writer checking every acknowledged write.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use valkey_sidecar_testkit::faults::{self, Outcome, show};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, http_get, poll_until};
use valkey_sidecar_testkit::redis;

const SECOND: Duration = Duration::from_secs(1);

/// The chart's replication mode, one shard of three pods (the agents run the keeper and the
/// coordinator).
async fn replication_stage(namespace: &str) -> Stage {
    Stage::start(StageOptions::replication(namespace, 2))
        .await
        .unwrap()
}

async fn lease(s: &Stage, name: &str) -> Option<Lease> {
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    leases.get_opt(name).await.ok()?
}

/// The shard record: holder and epoch.
async fn record(s: &Stage) -> Option<(String, String)> {
    let l = lease(s, "valkey-0-primary").await?;
    let epoch = l.metadata.annotations?.get("valkey.io/epoch")?.clone();
    Some((l.spec?.holder_identity?, epoch))
}

/// `ROLE` of `pod`'s Valkey: `master`, or `slave` with the port of its primary's host.
fn role(s: &Stage, pod: &str) -> Option<(String, String)> {
    let redis::Value::Array(items) = s.cmd(pod, &["ROLE"]).ok()? else {
        return None;
    };
    let text = |v: Option<&redis::Value>| match v {
        Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    Some((text(items.first())?, text(items.get(1)).unwrap_or_default()))
}

/// The record names `primary`, its Valkey is master, the others replicate from it.
fn led_by(s: &Stage, primary: &str) -> bool {
    let ip = s.valkey(primary).unwrap().ip().to_string();
    let others = s.pods.iter().filter(|p| *p != primary);
    role(s, primary).is_some_and(|(r, _)| r == "master")
        && others
            .clone()
            .all(|p| role(s, p) == Some(("slave".into(), ip.clone())))
}

/// Whether `pod`'s Valkey has its link to its primary up.
fn link_up(s: &Stage, pod: &str) -> bool {
    let info = s.cmd(pod, &["INFO", "replication"]);
    match info {
        Ok(redis::Value::BulkString(b)) => {
            String::from_utf8_lossy(&b).contains("master_link_status:up")
        }
        Ok(redis::Value::VerbatimString { text, .. }) => text.contains("master_link_status:up"),
        _ => false,
    }
}

/// The coordinator's count of successful record reads, from its `/metrics`.
async fn record_reads(s: &Stage, coordinator: &str) -> u64 {
    let (_, body) = http_get(s.agent(coordinator).unwrap(), "/metrics", 5 * SECOND)
        .await
        .unwrap();
    let line = body
        .lines()
        .find(|l| l.starts_with("valkey_sidecar_coordinator_record_reads_total{result=\"ok\"}"));
    line.and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calm_shard_costs_a_read_per_retry_period_and_a_cordon_switches_over_losslessly() {
    let s = replication_stage("repl-coordinator").await;
    poll_until(
        "bootstrapped",
        30 * SECOND,
        Duration::from_millis(50),
        || async {
            let recorded = record(&s).await == Some(("valkey-0-0".into(), "1".into()));
            Ok(recorded && led_by(&s, "valkey-0-0"))
        },
    )
    .await
    .unwrap();
    let coordinator = s.coordinator_holder().await.unwrap().unwrap();

    // Calm only once every replica has finished its first sync (links up).
    poll_until(
        "the replicas' links are up",
        30 * SECOND,
        Duration::from_millis(50),
        || async { Ok(s.pods.iter().skip(1).all(|p| link_up(&s, p))) },
    )
    .await
    .unwrap();
    // Calm: the holder serves and renews; the coordinator reads the record once per retry period (2 s).
    let before = record_reads(&s, &coordinator).await;
    tokio::time::sleep(10 * SECOND).await;
    let reads = record_reads(&s, &coordinator).await - before;
    println!("calm shard: {reads} record reads by the coordinator in 10 s (rounds: 40)");
    // Paced at one per retry period (2 s) while calm; a busy machine can make a round see a
    // replica's link down and read once more — but never every round (40).
    assert!((3..=12).contains(&reads), "{reads} reads in 10 s");

    let writer = s.writer(s.pods.iter().map(|p| s.valkey(p).unwrap()).collect(), "w");
    tokio::time::sleep(SECOND).await;
    let node = s.node_of("valkey-0-0").await.unwrap();
    let cordoned = Instant::now();
    s.plane.kubectl(&["cordon", &node]).await.unwrap();
    let moved = |r: Option<(String, String)>| r.filter(|(h, e)| h != "valkey-0-0" && e == "2");
    poll_until(
        "the record moves",
        20 * SECOND,
        Duration::from_millis(10),
        || async { Ok(moved(record(&s).await).is_some()) },
    )
    .await
    .unwrap();
    let (primary, _) = moved(record(&s).await).unwrap();
    poll_until(
        "the others follow",
        20 * SECOND,
        Duration::from_millis(10),
        || async { Ok(led_by(&s, &primary)) },
    )
    .await
    .unwrap();
    let took = cordoned.elapsed();
    tokio::time::sleep(SECOND).await;
    let w = writer.stop().unwrap();
    let missing = s.lost(&primary, "w", &w.acked).unwrap();
    let events = s.events().await.unwrap();
    println!(
        "node {node} cordoned: {primary} primary on record and followed after {took:?}; writer: {} acknowledged, {missing} lost, longest pause {:?}\n{events}",
        w.acked.len(),
        w.longest_pause
    );
    faults::record(
        &Outcome::new(module_path!(), "primary's node cordoned (replication switchover)")
            .writes(w.acked.len(), missing)
            .recovery(w.longest_pause)
            .note(format!(
                "recovery: the longest write pause (a planned move: the shard stays up); cordon → the new primary on record and followed {}",
                show(took)
            )),
    );
    assert_eq!(missing, 0, "a planned switchover lost acknowledged writes");
    assert!(events.contains("HandoverStarted") && events.contains("HandoverSucceeded"));
    // "FailoverDrift" may appear (the primary left its preferred zone); no failover may.
    let failover = ["FailoverStarted", "FailoverSucceeded", "FailoverFailed"];
    assert!(!events.contains("HandoverFailed") && !failover.iter().any(|r| events.contains(r)));
}
