//! The replication-mode coordinator's moves against real Valkey processes and a real
//! kube-apiserver holding the shard record: a planned switchover (timed against Valkey's own
//! `FAILOVER TO`, both under a writer that checks every acknowledged write), its rollback when
//! the target cannot catch up, and an unplanned promotion (with its 409 when the record moved).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use valkey_sidecar::coordinator::execute::{self, Links, MoveOutcome};
use valkey_sidecar::k8s::record::RecordClient;
use valkey_sidecar::runtime::clock::Clock;
use valkey_sidecar::valkey::Connector;
use valkey_sidecar_core::replication::{Promotion, RecordHandoverPlan, ShardRecord};
use valkey_sidecar_testkit::k8s::writer::{Writer, lost};
use valkey_sidecar_testkit::k8s::{ControlPlane, ControlPlaneOptions};
use valkey_sidecar_testkit::{ReplicationSet, ServerOptions, ValkeyServer, wait_for};

const POD: [&str; 3] = ["v-0-0", "v-0-1", "v-0-2"];

/// Renews the record once it names `pod`, as that pod's keeper does before its Valkey may be
/// promoted (`PromotionCommand::AwaitConsent`).
fn consent_when_named(record: RecordClient, pod: &'static str) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok(Some(r)) = record.read().await
                && r.holder.as_deref() == Some(pod)
            {
                record.write(&r).await.unwrap();
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// A primary and two replicas named like the pods of one shard, and the record naming the first.
struct Shard {
    set: ReplicationSet,
    record: RecordClient,
    _plane: ControlPlane,
}

impl Shard {
    async fn start() -> Shard {
        let plane = ControlPlane::start(ControlPlaneOptions::apiserver_only())
            .await
            .unwrap();
        let record = RecordClient::new(
            plane.client(),
            "default",
            ("valkey", "0"),
            Duration::from_secs(2),
            Duration::from_secs(15),
        );
        record.write(&ShardRecord::bootstrap(POD[0])).await.unwrap();
        let set = ReplicationSet::start(2, ServerOptions::default()).unwrap();
        Shard {
            set,
            record,
            _plane: plane,
        }
    }

    fn node(&self, pod: &str) -> &ValkeyServer {
        let k = POD.iter().position(|p| *p == pod).unwrap();
        &self.set.nodes()[k]
    }

    fn links(&self) -> Links {
        let connector = |n: &ValkeyServer| Connector {
            host: n.host(),
            port: n.port(),
            username: None,
            password: None,
            tls: None,
            timeout: Duration::from_secs(1),
        };
        let pods = POD.iter().map(|p| (p.to_string(), connector(self.node(p))));
        Links::new(pods.collect::<BTreeMap<_, _>>())
    }

    fn plan(&self, from: &str, to: &str, epoch: u64, timeout_ms: u64) -> RecordHandoverPlan {
        RecordHandoverPlan {
            from: from.into(),
            to: to.into(),
            to_addr: format!("{} {}", self.node(to).host(), self.node(to).port()),
            others: POD.iter().map(|p| p.to_string()).collect(),
            epoch,
            timeout_ms,
        }
    }

    fn writer(&self) -> Writer {
        let addrs = self.set.nodes().iter().map(ValkeyServer::addr).collect();
        Writer::start(addrs, "t".into())
    }

    async fn holder(&self) -> (Option<String>, u64) {
        let r = self.record.read().await.unwrap().unwrap();
        (r.holder, r.epoch)
    }

    /// Every other node replicates from `primary`, link up, caught up.
    fn wait_led_by(&self, primary: &str) {
        self.wait_following(primary, &POD);
    }

    /// `pods` (but `primary`) replicate from `primary` with the link up and have all it has.
    fn wait_following(&self, primary: &str, pods: &[&str]) {
        let port = self.node(primary).port().to_string();
        let synced = || {
            let at = self
                .node(primary)
                .info_field("replication", "master_repl_offset")?;
            for pod in pods.iter().filter(|q| **q != primary) {
                let info = self.node(pod).info("replication")?;
                let field = |k| valkey_sidecar_testkit::info_field(&info, k).unwrap_or_default();
                // A replica fresh from a sync gets the stream only after its first ACK (≤ 1 s).
                let follows = field("master_port") == port
                    && field("master_link_status") == "up"
                    && field("slave_repl_offset") == at;
                if !follows {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let (limit, poll) = (Duration::from_secs(10), Duration::from_millis(10));
        wait_for("the others to follow", limit, poll, synced).unwrap();
    }
}

/// Writes for a moment, runs `act`, writes for a moment more; returns what `act` returned and
/// checks every acknowledged write against `primary` afterwards.
async fn under_writes<T>(shard: &Shard, primary: &str, act: impl AsyncFnOnce() -> T) -> T {
    let w = shard.writer();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = act().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = w.stop().unwrap();
    let missing = lost(shard.node(primary).addr(), "t", &written.acked).unwrap();
    println!(
        "  {} writes acknowledged, longest pause between two {:?}, {} failed attempts, {missing} lost",
        written.acked.len(),
        written.longest_pause,
        written.errors
    );
    assert_eq!(missing, 0, "acknowledged writes lost");
    out
}

/// `FAILOVER TO` on `from`, until `to` is primary and the failover is over.
fn failover_to(shard: &Shard, from: &str, to: &str) -> Duration {
    let target = shard.node(to);
    let t = Instant::now();
    let (host, port) = (target.host(), target.port().to_string());
    shard
        .node(from)
        .cmd(&["FAILOVER", "TO", &host, &port, "TIMEOUT", "5000"])
        .unwrap();
    wait_for(
        "FAILOVER TO to finish",
        Duration::from_secs(10),
        Duration::from_millis(1),
        || {
            let done = shard
                .node(from)
                .info_field("replication", "master_failover_state")?;
            Ok(target.is_primary()? && done == "no-failover")
        },
    )
    .unwrap();
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_moves_record_and_primary_without_losing_a_write_faster_than_failover_to() {
    let shard = Shard::start().await;
    // Replicas fresh from their first sync get the stream only after their first ACK (≤ 1 s):
    // both moves start from a shard that streams.
    shard.node(POD[0]).cmd(&["SET", "warm", "1"]).unwrap();
    shard.wait_led_by(POD[0]);
    let ours = under_writes(&shard, POD[1], async || {
        let plan = shard.plan(POD[0], POD[1], 1, 5000);
        let record = shard.record.clone();
        execute::record_handover(plan, shard.links(), record, Clock::start(), || true).await
    })
    .await;
    let MoveOutcome::Done { took } = ours else {
        panic!("switchover: {ours:?}");
    };
    assert_eq!(shard.holder().await, (Some(POD[1].into()), 2));
    assert!(shard.node(POD[1]).is_primary().unwrap());
    shard.wait_led_by(POD[1]);

    let valkeys = under_writes(&shard, POD[0], async || failover_to(&shard, POD[1], POD[0])).await;
    // FAILOVER TO swaps the two; the third replica stays with the old primary.
    shard.wait_following(POD[0], &POD[..2]);
    println!(
        "switchover (pause, catch-up, record CAS on the apiserver, promote, repoint): {took:?}"
    );
    println!(
        "Valkey's own FAILOVER TO ... TIMEOUT 5000:                                  {valkeys:?}"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_whose_target_cannot_catch_up_rolls_back_and_writes_resume() {
    let shard = Shard::start().await;
    // The target stops replicating, and then misses a write: it cannot reach the paused offset.
    let target = shard.node(POD[1]);
    target.cmd(&["REPLICAOF", "127.0.0.1", "1"]).unwrap();
    shard.node(POD[0]).cmd(&["SET", "missed", "1"]).unwrap();
    let plan = shard.plan(POD[0], POD[1], 1, 300);
    let t = Instant::now();
    let out = execute::record_handover(
        plan,
        shard.links(),
        shard.record.clone(),
        Clock::start(),
        || true,
    )
    .await;
    println!("rolled back after {:?}: {out:?}", t.elapsed());
    assert!(matches!(out, MoveOutcome::RolledBack(_)), "{out:?}");
    assert_eq!(
        shard.holder().await,
        (Some(POD[0].into()), 1),
        "the record did not move"
    );
    // Unpaused: a write goes through at once.
    let t = Instant::now();
    shard.node(POD[0]).cmd(&["SET", "after", "1"]).unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_writes_the_record_first_promotes_and_repoints_and_stops_on_a_409() {
    let shard = Shard::start().await;
    shard.node(POD[0]).cmd(&["SET", "k", "v"]).unwrap();
    shard.wait_led_by(POD[0]);
    let version = shard.record.read().await.unwrap().unwrap().version;
    let promotion = |version: &str| Promotion {
        target: POD[1].into(),
        epoch: 2,
        version: version.into(),
        fence: vec![POD[0].into()],
        repoint: vec![POD[0].into(), POD[2].into()],
        reason: "test".into(),
        empty: false,
    };

    // The holder renewed since the decision: nothing happens.
    let renewed = shard.record.read().await.unwrap().unwrap();
    shard.record.write(&renewed).await.unwrap();
    let stale = execute::run_promotion(
        &promotion(&version),
        shard.links(),
        &shard.record,
        execute::Waits {
            fence_ms: 5000,
            consent_ms: 5000,
        },
        Clock::start(),
        || true,
    )
    .await;
    assert!(matches!(stale, MoveOutcome::Conflict(_)), "{stale:?}");
    assert!(shard.node(POD[0]).is_primary().unwrap());
    assert!(!shard.node(POD[1]).is_primary().unwrap());

    // Without the Lease, nothing happens either.
    let current = shard.record.read().await.unwrap().unwrap().version;
    let no_lease = execute::run_promotion(
        &promotion(&current),
        shard.links(),
        &shard.record,
        execute::Waits {
            fence_ms: 5000,
            consent_ms: 5000,
        },
        Clock::start(),
        || false,
    )
    .await;
    assert!(matches!(no_lease, MoveOutcome::NoLease), "{no_lease:?}");
    assert_eq!(shard.holder().await, (Some(POD[0].into()), 1));

    // The target's agent takes the record once it names it (its consent), as a keeper does.
    let agent = consent_when_named(shard.record.clone(), POD[1]);
    let t = Instant::now();
    let done = execute::run_promotion(
        &promotion(&current),
        shard.links(),
        &shard.record,
        execute::Waits {
            fence_ms: 5000,
            consent_ms: 5000,
        },
        Clock::start(),
        || true,
    )
    .await;
    println!("promotion: {done:?} ({:?})", t.elapsed());
    agent.await.unwrap();
    assert!(matches!(done, MoveOutcome::Done { .. }), "{done:?}");
    assert_eq!(shard.holder().await, (Some(POD[1].into()), 2));
    assert!(shard.node(POD[1]).is_primary().unwrap());
    shard.wait_led_by(POD[1]);
    // The fenced old primary was unpaused once it was a replica, and it has the data.
    for p in POD {
        let v: Option<String> = shard.node(p).query(&["GET", "k"]).unwrap();
        println!("{p}: {v:?} {}", shard.node(p).info("replication").unwrap());
    }
    let value: Option<String> = shard.node(POD[0]).query(&["GET", "k"]).unwrap();
    assert_eq!(value.as_deref(), Some("v"));
}
