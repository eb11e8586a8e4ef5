//! The three ways a node fails, in both modes, on the chart's pods: **power-off** (its processes
//! die and its address goes silent: peers and clients hang until their own timeouts), **partition**
//! (its processes run on, cut from the apiserver and from the other nodes, while a client on its
//! side keeps writing to the old primary) and **freeze** (every process of the node stopped, then
//! continued after the failover).
//!
//! Each scenario faults the node of shard 0's primary under a writer that behaves like a real client
//! (1 s timeouts, reconnects, a record of which node acknowledged each write and when) and a checker
//! that probes every member's role and a write every few milliseconds from an address no fault
//! cuts. It measures the time until another member is writable and labelled primary, acknowledged
//! writes lost once the faulted node is back (read from the final primary), and the safety figure:
//! writes acknowledged by the deposed primary after the new primary took its first write.
//!
//! Cluster mode runs the chart's defaults (Valkey Cluster elects, `cluster-node-timeout` 5 s);
//! replication mode the chart's defaults (`min-replicas-to-write 1`, `min-replicas-max-lag 10`)
//! with a short lease (4 s, renew deadline 3 s, retry 1 s), as printed in each row.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use valkey_sidecar_testkit::faults::{self, Outcome, show};
use valkey_sidecar_testkit::k8s::primaries::{PrimaryChecker, Seen};
use valkey_sidecar_testkit::k8s::writer::{
    Ack, Deposed, Writer, Written, deposed_acks, tag_named, targets,
};
use valkey_sidecar_testkit::k8s::{ROLE_LABEL, RoleWatch, Stage, StageOptions, poll_until};

const SECOND: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Cluster,
    Replication,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    PowerOff,
    Partition,
    Freeze,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::PowerOff => "powered off",
            Fault::Partition => "partitioned",
            Fault::Freeze => "frozen (SIGSTOP)",
        }
    }
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Cluster => "cluster",
            Mode::Replication => "replication",
        }
    }

    /// What the row's configuration is, for the fault table.
    fn settings(self) -> &'static str {
        match self {
            Mode::Cluster => "chart defaults: 3×2, cluster-node-timeout 5 s",
            Mode::Replication => {
                "chart defaults: 1×3, min-replicas-to-write 1, min-replicas-max-lag 10; lease 4 s / renew 3 s / retry 1 s"
            }
        }
    }

    fn options(self, namespace: &str) -> StageOptions {
        match self {
            Mode::Cluster => StageOptions::cluster(namespace, 3, 1),
            Mode::Replication => StageOptions::replication(namespace, 2).lease("4s", "3s", "1s"),
        }
    }
}

/// The shard under test: its members, the primary and its node, and the writers' key tags (the
/// main writer's, the partitioned side's: keys of the shard's slots in cluster mode).
struct Shard {
    members: Vec<String>,
    old: String,
    node: String,
    tags: [String; 2],
}

impl Shard {
    fn of(s: &Stage, mode: Mode) -> Shard {
        let (old, _) = s.primary_and_replicas(0).unwrap();
        let tag = |prefix: &str| match mode {
            Mode::Cluster => tag_named(s.valkey(&old).unwrap(), &s.client(), prefix).unwrap(),
            Mode::Replication => prefix.to_owned(),
        };
        Shard {
            members: s.shard_pods(0).to_vec(),
            node: String::new(),
            tags: [tag("main"), tag("side")],
            old,
        }
    }

    fn addrs(&self, s: &Stage) -> Vec<SocketAddr> {
        self.members.iter().map(|p| s.valkey(p).unwrap()).collect()
    }
}

/// The clients during the fault: the main writer (any member, from outside the faulted node), in a
/// partition a second writer on the faulted node's side (to the old primary only), the checker.
struct Clients {
    main: Writer,
    side: Option<Writer>,
    checker: PrimaryChecker,
}

impl Clients {
    fn start(s: &Stage, shard: &Shard, fault: Fault) -> Clients {
        let main = s.writer(shard.addrs(s), &shard.tags[0]);
        let side = (fault == Fault::Partition).then(|| {
            let client = s.client_on(&shard.node).unwrap();
            let old = vec![s.valkey(&shard.old).unwrap()];
            s.writer_with(targets(old), &shard.tags[1], client)
        });
        let nodes = shard
            .members
            .iter()
            .map(|p| (p.clone(), s.valkey(p).unwrap()))
            .collect();
        let checker = PrimaryChecker::start_with(nodes, &s.observer());
        Clients {
            main,
            side,
            checker,
        }
    }

    fn stop(self) -> (Vec<(String, Written)>, Seen) {
        let mut written = vec![(self.main.tag.clone(), self.main.stop().unwrap())];
        if let Some(side) = self.side {
            written.push((side.tag.clone(), side.stop().unwrap()));
        }
        (written, self.checker.stop().unwrap())
    }
}

fn inject(s: &Stage, fault: Fault, node: &str) {
    match fault {
        Fault::PowerOff => s.kubelet.power_off(node),
        Fault::Partition => s.kubelet.partition_node(node),
        Fault::Freeze => s.kubelet.freeze_node(node),
    }
    .unwrap();
}

fn restore(s: &Stage, fault: Fault, node: &str) {
    match fault {
        Fault::PowerOff => s.kubelet.power_on(node),
        Fault::Partition => s.kubelet.heal_node(node),
        Fault::Freeze => s.kubelet.thaw_node(node),
    }
    .unwrap();
}

/// Waits until a member other than `old` takes a write and carries the primary label; returns it.
async fn new_primary(s: &Stage, shard: &Shard, timeout: Duration) -> String {
    let found = std::sync::Mutex::new(None);
    let waited = poll_until(
        "another member writable and labelled primary",
        timeout,
        Duration::from_millis(10),
        || async {
            for p in shard.members.iter().filter(|p| **p != shard.old) {
                let labelled = s.labels(p).await?.get(ROLE_LABEL).cloned();
                if labelled.as_deref() == Some("primary") && writable(s, p, &shard.tags[0]) {
                    *found.lock().unwrap() = Some(p.clone());
                    return Ok(true);
                }
            }
            Ok(false)
        },
    )
    .await;
    if let Err(e) = waited {
        panic!("{e:#}\n{}", s.describe().await);
    }
    found.into_inner().unwrap().unwrap()
}

/// Whether `pod`'s Valkey acknowledges a write of a key in the shard's slots now (from the
/// observer address, within 300 ms).
fn writable(s: &Stage, pod: &str, tag: &str) -> bool {
    let client = s.observer().timeout(Duration::from_millis(300));
    let Ok(mut c) = valkey_sidecar_testkit::resp::Conn::connect(s.valkey(pod).unwrap(), &client)
    else {
        return false;
    };
    c.cmd(&["SET", &format!("{{{tag}}}:probe"), "1"])
        .is_ok_and(|r| r.is_ok())
}

/// Waits until the old primary is back as a replica of `primary`, labelled so, and the shard's
/// members all Ready again.
async fn rejoined(s: &Stage, shard: &Shard, primary: &str) {
    let primary_ip = s.valkey(primary).unwrap().ip().to_string();
    let waited = poll_until(
        "the old primary back as a replica",
        90 * SECOND,
        Duration::from_millis(100),
        || async {
            let role = s.cmd(&shard.old, &["ROLE"]);
            let follows = matches!(&role, Ok(redis::Value::Array(items))
                if items.get(1).is_some_and(|v| matches!(v, redis::Value::BulkString(b) if *b == primary_ip.as_bytes())));
            let label = s.labels(&shard.old).await?.get(ROLE_LABEL).cloned();
            Ok(follows && label.as_deref() == Some("replica"))
        },
    )
    .await;
    if let Err(e) = waited {
        panic!("{e:#}\n{}", s.describe().await);
    }
}

/// How long two members of the shard carried the primary label at once, from the label watch.
fn double_labelled(watch: &RoleWatch, members: &[String], from: Instant) -> Duration {
    watch.longest_overlap(members, "primary", from)
}

/// What one scenario measured.
struct Measured {
    /// When the fault began, and the old primary's address then.
    at: Instant,
    old: SocketAddr,
    recovery: Duration,
    acked: usize,
    lost: Vec<(String, Ack)>,
    deposed: Deposed,
    seen: Seen,
    labels: Duration,
    timeouts: usize,
    /// Partition: the writes the partitioned side's client got acknowledged after the fault began
    /// (the old primary kept serving its side until it fenced or lost its cluster).
    side_after: Option<usize>,
}

impl Measured {
    fn note(&self, mode: Mode, fault: Fault, where_coordinator: &str) -> String {
        let lost_by_old = self.lost.len();
        format!(
            "{}; recovery: fault → another member writable and labelled primary; acknowledged by the deposed primary after the new one's first write: {} (window {}); two pods labelled primary for {}; writes with unknown outcome (client timeouts): {}; the partitioned side's client acknowledged after the cut: {}; coordinator {where_coordinator}; checker {}; lost writes were all acknowledged by the old primary after the fault began: {lost_by_old}; {} {}",
            mode.settings(),
            self.deposed.acks.len(),
            show(self.deposed.window()),
            show(self.labels),
            self.timeouts,
            self.side_after.map_or("–".into(), |n| n.to_string()),
            self.seen.density_summary(),
            mode.name(),
            fault.name(),
        )
    }
}

/// Runs one scenario end to end and records its row.
async fn scenario(mode: Mode, fault: Fault, namespace: &str) -> Measured {
    let s = Stage::start(mode.options(namespace)).await.unwrap();
    let mut shard = Shard::of(&s, mode);
    shard.node = s.node_of(&shard.old).await.unwrap();
    let coordinator = s.coordinator_holder().await.unwrap().unwrap_or_default();
    let coordinator_node = s.node_of(&coordinator).await.unwrap_or_default();
    let where_coordinator = if coordinator_node == shard.node {
        "on the faulted node (a successor takes over after the lease)"
    } else {
        "elsewhere"
    };
    let old = s.valkey(&shard.old).unwrap();
    let (watch, watch_task) = RoleWatch::start(s.api(), ROLE_LABEL);
    let clients = Clients::start(&s, &shard, fault);
    tokio::time::sleep(2 * SECOND).await;
    let at = Instant::now();
    inject(&s, fault, &shard.node);
    let promoted = new_primary(&s, &shard, 60 * SECOND).await;
    let recovery = at.elapsed();
    // The fault lasts a while past the failover: a partitioned client keeps writing, a frozen
    // node stays frozen, a dead one dead.
    tokio::time::sleep(3 * SECOND).await;
    restore(&s, fault, &shard.node);
    rejoined(&s, &shard, &promoted).await;
    tokio::time::sleep(SECOND).await;
    let (written, seen) = clients.stop();
    watch_task.abort();
    let labels = double_labelled(&watch, &shard.members, at);
    let new_addr = s.valkey(&promoted).unwrap();
    let all: Vec<&Written> = written.iter().map(|(_, w)| w).collect();
    let deposed = deposed_acks(&all, new_addr);
    let lost = lost_writes(&s, &promoted, &written);
    let side_after = written
        .get(1)
        .map(|(_, w)| w.acks.iter().filter(|a| a.at > at).count());
    let m = Measured {
        at,
        old,
        recovery,
        acked: all.iter().map(|w| w.acks.len()).sum(),
        lost,
        deposed,
        seen,
        labels,
        timeouts: all.iter().map(|w| w.timeouts).sum(),
        side_after,
    };
    report(mode, fault, &shard, &promoted, &m, where_coordinator);
    m
}

/// Every acknowledged write the final primary lacks, with its acknowledgement.
fn lost_writes(s: &Stage, primary: &str, written: &[(String, Written)]) -> Vec<(String, Ack)> {
    let addr = s.valkey(primary).unwrap();
    let mut lost = Vec::new();
    for (tag, w) in written {
        let missing =
            valkey_sidecar_testkit::k8s::writer::missing(addr, &s.client(), tag, &w.acked).unwrap();
        lost.extend(
            w.acks
                .iter()
                .filter(|a| missing.contains(&a.n))
                .map(|a| (tag.clone(), *a)),
        );
    }
    lost
}

fn report(
    mode: Mode,
    fault: Fault,
    shard: &Shard,
    promoted: &str,
    m: &Measured,
    where_coordinator: &str,
) {
    let at = m.at;
    let scenario = format!("node {} ({} mode)", fault.name(), mode.name());
    println!(
        "{scenario}: {} on {} → {promoted} writable and labelled after {:?}; acknowledged {}, lost {}, acknowledged by the deposed primary after the new one's first write {}; longest two-primary overlap {:?}; two primary labels {:?}; checker {}",
        shard.old,
        shard.node,
        m.recovery,
        m.acked,
        m.lost.len(),
        m.deposed.acks.len(),
        m.seen.longest_overlap(),
        m.labels,
        m.seen.density_summary()
    );
    // The evidence: who acknowledged what was lost, and when relative to the fault.
    let lost: Vec<&Ack> = m.lost.iter().map(|(_, a)| a).collect();
    println!("  lost: {}", acks_by_node(&lost, at));
    let deposed: Vec<&Ack> = m.deposed.acks.iter().collect();
    println!(
        "  acknowledged by a deposed primary: {}",
        acks_by_node(&deposed, at)
    );
    faults::record(
        &Outcome::new(module_path!(), &scenario)
            .writes(m.acked, m.lost.len())
            .overlap(m.seen.longest_overlap())
            .deposed(m.deposed.acks.len())
            .recovery(m.recovery)
            .note(m.note(mode, fault, where_coordinator)),
    );
}

/// Acknowledgements per node: how many, the first and the last, relative to the fault.
fn acks_by_node(acks: &[&Ack], at: Instant) -> String {
    let mut nodes: Vec<SocketAddr> = acks.iter().map(|a| a.node).collect();
    nodes.sort();
    nodes.dedup();
    let per_node = nodes.iter().map(|node| {
        let mine: Vec<&&Ack> = acks.iter().filter(|a| a.node == *node).collect();
        let first = mine.iter().map(|a| a.at).min().map(|t| signed_secs(t, at));
        let last = mine.iter().map(|a| a.at).max().map(|t| signed_secs(t, at));
        format!(
            "{} by {node} (fault{:+.3} s … fault{:+.3} s)",
            mine.len(),
            first.unwrap_or_default(),
            last.unwrap_or_default()
        )
    });
    let text: Vec<String> = per_node.collect();
    if text.is_empty() {
        "none".into()
    } else {
        text.join("; ")
    }
}

/// `t - at` in seconds, negative before.
fn signed_secs(t: Instant, at: Instant) -> f64 {
    match t.checked_duration_since(at) {
        Some(d) => d.as_secs_f64(),
        None => -at.duration_since(t).as_secs_f64(),
    }
}

/// What holds in every scenario: loss is only ever the deposed primary's tail (writes it
/// acknowledged after the fault began, at most a replication round trip before), nothing the new
/// primary acknowledged is lost, and no writer was acknowledged by the deposed primary once the
/// new one took writes.
fn assert_safe(m: &Measured) {
    for (tag, a) in &m.lost {
        assert_eq!(
            a.node, m.old,
            "{tag}:{} lost, acknowledged by {}",
            a.n, a.node
        );
        assert!(
            a.at + Duration::from_millis(100) >= m.at,
            "{tag}:{} acknowledged {:?} before the fault, yet lost",
            a.n,
            m.at - a.at
        );
    }
    assert!(
        m.deposed.acks.is_empty(),
        "the deposed primary acknowledged {} writes after the new one's first: {:?}",
        m.deposed.acks.len(),
        m.deposed.acks
    );
    assert!(m.acked > 100, "the writers made progress: {}", m.acked);
}

/// Replication mode: nobody is promoted before the old primary's renew deadline (3 s) has passed.
/// Partition: the client on the old primary's side really kept writing to it after the cut (else
/// the scenario measured nothing of a partition).
fn assert_the_old_side_wrote(m: &Measured) {
    let side = m.side_after.unwrap_or_default();
    assert!(
        side > 0,
        "the partitioned side's writer got no write acknowledged after the cut"
    );
}

fn assert_not_before_the_deadline(m: &Measured) {
    assert!(
        m.recovery >= 3 * SECOND,
        "promoted {:?} after the fault, before the old primary's renew deadline",
        m.recovery
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_node_powered_off() {
    let m = scenario(Mode::Cluster, Fault::PowerOff, "nf-c-off").await;
    assert_safe(&m);
    assert_eq!(m.seen.longest_overlap(), Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_node_partitioned() {
    let m = scenario(Mode::Cluster, Fault::Partition, "nf-c-part").await;
    assert_safe(&m);
    assert_the_old_side_wrote(&m);
    assert_eq!(m.seen.longest_overlap(), Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_node_frozen() {
    let m = scenario(Mode::Cluster, Fault::Freeze, "nf-c-freeze").await;
    assert_safe(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_node_powered_off() {
    let m = scenario(Mode::Replication, Fault::PowerOff, "nf-r-off").await;
    assert_safe(&m);
    assert_not_before_the_deadline(&m);
    assert_eq!(m.seen.longest_overlap(), Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_node_partitioned() {
    let m = scenario(Mode::Replication, Fault::Partition, "nf-r-part").await;
    assert_safe(&m);
    assert_the_old_side_wrote(&m);
    assert_not_before_the_deadline(&m);
    assert_eq!(m.seen.longest_overlap(), Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_node_frozen() {
    let m = scenario(Mode::Replication, Fault::Freeze, "nf-r-freeze").await;
    assert_safe(&m);
    assert_not_before_the_deadline(&m);
}
