//! API usage per agent in steady state, from the apiserver's own records (its audit log): a
//! follower writes nothing and follows the Lease through a watch (no read every retry period),
//! the Lease holder writes nothing but its Lease renewals; in replication mode the same holds for
//! the shard record, which its holder renews and the others watch. With the watches off
//! (`SIDECAR_LEASE_WATCH=false`) followers read each Lease every retry period instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use valkey_sidecar_testkit::k8s::audit::{Usage, pod_identity};
use valkey_sidecar_testkit::k8s::shard::record;
use valkey_sidecar_testkit::k8s::{ROLE_LABEL, Stage, StageOptions, poll_until};

const SECOND: Duration = Duration::from_secs(1);
/// The agent's default `SIDECAR_LEASE_RETRY_PERIOD`: the holder renews once per period.
const RETRY_PERIOD: Duration = Duration::from_secs(2);
const WINDOW: Duration = Duration::from_secs(30);

/// The Lease's holder now.
async fn holder(s: &Stage) -> Option<String> {
    s.coordinator_holder().await.unwrap()
}

/// The stage `o` with the apiserver's audit log on; returns it once some agent holds the Lease.
async fn coordinated_stage(mut o: StageOptions) -> (Stage, String) {
    o.plane = o.plane.audit();
    let s = Stage::start(o).await.unwrap();
    let h = s.wait_coordinator(30 * SECOND).await.unwrap();
    (s, h)
}

/// Steady state: every pod carries its role label, and then nothing has moved for a while (the
/// agents' start-up writes are behind them).
async fn wait_steady(s: &Stage) {
    poll_until(
        "every pod labelled",
        30 * SECOND,
        Duration::from_millis(100),
        || async {
            for p in &s.pods {
                if !s.labels(p).await?.contains_key(ROLE_LABEL) {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(5 * SECOND).await;
}

/// The Leases `pod` listed or watched by name (a watch on one Lease: the apiserver names the
/// object of a list or watch whose field selector is `metadata.name=`), from the stage's start
/// (`started`) to now.
fn leases_watched(s: &Stage, started: SystemTime, pod: &str) -> BTreeSet<String> {
    let who = pod_identity(&s.namespace, pod);
    let log = s.plane.audit_log().unwrap();
    log.requests(started, SystemTime::now())
        .unwrap()
        .into_iter()
        .filter(|r| r.who == who && r.resource == "leases")
        .filter(|r| r.verb == "list" || r.verb == "watch")
        .filter_map(|r| r.name)
        .collect()
}

/// The two Leases a replication-mode agent follows: the coordinator's and shard 0's record.
fn followed_leases(s: &Stage) -> BTreeSet<String> {
    let names = [
        format!("{}-coordinator", s.cluster),
        format!("{}-0-primary", s.cluster),
    ];
    names.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_steady_state_followers_write_nothing_and_the_holder_only_renews() {
    let (s, coordinator) = coordinated_stage(StageOptions::cluster("api-usage", 3, 1)).await;
    wait_steady(&s).await;
    let from = SystemTime::now();
    tokio::time::sleep(WINDOW).await;
    let to = SystemTime::now();
    assert_eq!(
        holder(&s).await.as_deref(),
        Some(coordinator.as_str()),
        "the Lease changed hands during the window"
    );
    // Each request is logged as it completes: give the last ones time to reach the file.
    tokio::time::sleep(SECOND).await;
    let log = s.plane.audit_log().unwrap();
    let usage = log.usage(from, to).unwrap();
    let who = |pod: &str| pod_identity(&s.namespace, pod);
    for r in log.requests(from, to).unwrap() {
        if s.pods.iter().any(|p| r.who == who(p)) {
            assert!(r.user_agent.starts_with("valkey-sidecar/"), "{r:?}");
        }
    }
    let agents: Vec<(String, String)> = s
        .pods
        .iter()
        .map(|p| {
            let role = if *p == coordinator {
                "coordinator"
            } else {
                "follower"
            };
            (format!("{p} ({role})"), who(p))
        })
        .collect();
    println!(
        "requests per minute over {WINDOW:?}:\n{}\n{}",
        usage.verb_table(&agents),
        usage.detail_table(&agents)
    );
    for p in s.pods.iter().filter(|p| **p != coordinator) {
        // A follower learns the renewals from its watch: at most a re-established watch (the
        // apiserver ends each after minutes) in the window, where polling read 15 times.
        let lease_reads: u64 = ["get", "list", "watch"]
            .iter()
            .map(|verb| usage.get(&who(p), verb, "leases"))
            .sum();
        assert!(
            lease_reads <= 1,
            "follower {p} read the Lease {lease_reads} times"
        );
        assert_eq!(usage.writes(&who(p)), 0, "follower {p} wrote");
        let all = usage.total(&who(p));
        assert!(all <= 1, "follower {p} sent {all} requests");
    }
    let renewals = usage.get(&who(&coordinator), "update", "leases");
    let expected = WINDOW.as_secs_f64() / RETRY_PERIOD.as_secs_f64();
    println!("coordinator {coordinator}: {renewals} renewals, {expected} expected");
    assert_eq!(
        usage.writes(&who(&coordinator)),
        renewals,
        "the coordinator wrote more than its renewals"
    );
    assert!(
        renewals as f64 <= 1.5 * expected && renewals as f64 >= 0.5 * expected,
        "{renewals} renewals in {WINDOW:?}, expected about {expected}"
    );
}

/// A replication-mode stage's steady window: the stage, its coordinator and record holder, when
/// the stage was started, and the requests of the window, through which both kept their Leases.
struct Window {
    s: Stage,
    coordinator: String,
    primary: String,
    started: SystemTime,
    usage: Usage,
}

async fn replication_window(o: StageOptions) -> Window {
    let started = SystemTime::now();
    let (s, coordinator) = coordinated_stage(o).await;
    wait_steady(&s).await;
    let primary = record(&s, "0")
        .await
        .and_then(|r| r.holder)
        .expect("a record holder");
    let from = SystemTime::now();
    tokio::time::sleep(WINDOW).await;
    let to = SystemTime::now();
    assert_eq!(holder(&s).await.as_deref(), Some(coordinator.as_str()));
    assert_eq!(
        record(&s, "0").await.and_then(|r| r.holder).as_deref(),
        Some(primary.as_str()),
        "the record changed hands during the window"
    );
    // Each request is logged as it completes: give the last ones time to reach the file.
    tokio::time::sleep(SECOND).await;
    let usage = s.plane.audit_log().unwrap().usage(from, to).unwrap();
    let who = |pod: &str| pod_identity(&s.namespace, pod);
    let agents: Vec<(String, String)> = s.pods.iter().map(|p| (p.clone(), who(p))).collect();
    println!(
        "coordinator {coordinator}, record holder {primary}; requests per minute over {WINDOW:?}:\n{}\n{}",
        usage.verb_table(&agents),
        usage.detail_table(&agents)
    );
    Window {
        s,
        coordinator,
        primary,
        started,
        usage,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_replication_mode_followers_watch_both_leases_and_the_holders_only_renew() {
    let w = replication_window(StageOptions::replication("api-usage-repl", 2)).await;
    let (s, usage) = (&w.s, &w.usage);
    let who = |pod: &str| pod_identity(&s.namespace, pod);
    let expected = WINDOW.as_secs_f64() / RETRY_PERIOD.as_secs_f64();
    for p in &s.pods {
        // One renewal per retry period for each Lease the pod holds, and no other write.
        let held = [*p == w.coordinator, *p == w.primary]
            .iter()
            .filter(|h| **h)
            .count() as f64;
        let renewals = usage.get(&who(p), "update", "leases");
        assert_eq!(
            usage.writes(&who(p)),
            renewals,
            "{p} wrote more than renewals"
        );
        assert!(
            renewals as f64 <= 1.5 * held * expected && renewals as f64 >= 0.5 * held * expected,
            "{p} renewed {renewals} times in {WINDOW:?}, holding {held} Leases"
        );
        if held == 0.0 {
            // A follower watches the two Leases (at most one re-established watch each in the
            // window) and keeps the primary's address while its link to it is up: polling read
            // the record 15 times and listed pods 5 times here.
            let all = usage.total(&who(p));
            assert!(all <= 2, "follower {p} sent {all} requests");
        }
        // Every agent made its watch on each Lease it may follow (the Lease by name).
        assert_eq!(leases_watched(s, w.started, p), followed_leases(s), "{p}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lease_watch_off_followers_read_each_lease_every_retry_period() {
    let o = StageOptions::replication("api-usage-poll", 2).env("SIDECAR_LEASE_WATCH", "false");
    let w = replication_window(o).await;
    let (s, usage) = (&w.s, &w.usage);
    let who = |pod: &str| pod_identity(&s.namespace, pod);
    let expected = WINDOW.as_secs_f64() / RETRY_PERIOD.as_secs_f64();
    for p in &s.pods {
        // No Lease watched by name, by any agent in its whole life (the coordinator's watch on
        // the shard records, by label, is a holder's, not a follower's: it stays).
        let watched = leases_watched(s, w.started, p);
        assert!(
            watched.is_empty(),
            "{p} watched {watched:?} with SIDECAR_LEASE_WATCH=false"
        );
        if *p == w.coordinator {
            // The coordinator also reads the shard records in its rounds: not counted here.
            continue;
        }
        // What the watches replace: a read of the coordinator Lease every retry period, and of
        // the shard's record, which the keeper reads every retry period whether or not it holds
        // it (as every keeper did before the watch; CI caught the record holder at 29 reads).
        let reads = usage.get(&who(p), "get", "leases") as f64;
        assert!(
            reads >= 0.5 * 2.0 * expected && reads <= 1.5 * 2.0 * expected,
            "{p} read the Leases {reads} times in {WINDOW:?} (record holder: {})",
            w.primary
        );
    }
}
