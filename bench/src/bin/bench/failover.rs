//! Replication mode (Valkey without Cluster) under the agent, measured like the Sentinel baseline:
//!
//! - unplanned: kill -9 of the primary's Valkey (its agent stays; the kubelet restarts Valkey at
//!   once, empty), or its whole node powered off (the agent dies too, the node's address goes
//!   silent), then the time until another pod takes writes, and until it also carries the
//!   `primary` label; acknowledged writes lost, read back once the faulted pod is back;
//! - planned: the primary's node cordoned (the coordinator's switchover) against Valkey's own
//!   `FAILOVER TO` on a plain primary + 2 replicas: the longest write pause and the writes lost.
//!
//! One stage per configuration, the runs one after the other (the old primary rejoins between).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use valkey_sidecar_testkit::k8s::shard;
use valkey_sidecar_testkit::k8s::writer::{Writer, Written, deposed_acks, lost};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions};
use valkey_sidecar_testkit::{ReplicationSet, ServerOptions, wait_for};

/// The chart's replication defaults for Valkey (`valkey.minReplicasToWrite`, 1 with replicas;
/// `valkey.minReplicasMaxLag`) as `valkey-server` settings: what the agent's pods run, given to
/// the Sentinel baseline's servers too so that both fence the same way.
pub const MIN_REPLICAS: [(&str, &str); 2] = [
    ("min-replicas-to-write", "1"),
    ("min-replicas-max-lag", "10"),
];

/// Short leases for the whole-pod-cut runs (the failover waits out the lease there): a label and
/// the agent's settings.
pub const SHORT_LEASES: [(&str, [(&str, &str); 3]); 2] = [
    (
        "4 s",
        [
            ("SIDECAR_LEASE_DURATION", "4s"),
            ("SIDECAR_LEASE_RENEW_DEADLINE", "3s"),
            ("SIDECAR_LEASE_RETRY_PERIOD", "1s"),
        ],
    ),
    (
        "2 s",
        [
            ("SIDECAR_LEASE_DURATION", "2s"),
            ("SIDECAR_LEASE_RENEW_DEADLINE", "1500ms"),
            ("SIDECAR_LEASE_RETRY_PERIOD", "500ms"),
        ],
    ),
];

/// What one unplanned failover measured.
pub struct Run {
    /// A watch on the shard record delivered another holder (`None`: it missed it).
    pub held: Option<Duration>,
    pub writable: Duration,
    pub labelled: Duration,
    pub acked: usize,
    pub lost: usize,
    /// Writes another pod acknowledged after the new primary's first: taken by a deposed primary.
    pub deposed: usize,
}

/// The unplanned fault.
#[derive(Clone, Copy)]
pub enum Fault {
    /// SIGKILL of the primary's Valkey; its agent lives, the kubelet restarts Valkey empty.
    KillValkey,
    /// The primary's node loses power: every process of its pod, the agent too, its heartbeat,
    /// and its address goes silent.
    CutNode,
}

/// The chart's replication mode (one shard of three pods, its Valkey settings) with `env` for the
/// agents, the apiserver's audit log on with `audit`.
pub async fn stage(bin: &Path, env: &[(&str, &str)], audit: bool) -> Result<Stage> {
    let mut o = StageOptions::replication("valkey", 2);
    o.kubelet = o.kubelet.sidecar_bin(bin);
    o.plane.audit = audit;
    for (k, v) in env {
        o = o.env(k, v);
    }
    Stage::start(o).await
}

fn writer(s: &Stage) -> Result<Writer> {
    let addrs = s
        .pods
        .iter()
        .map(|p| s.valkey(p))
        .collect::<Result<Vec<_>>>()?;
    Ok(s.writer(addrs, &format!("r{}", crate::rand_tag())))
}

/// One run: the fault on the current primary, the replacement timed, the writes lost counted.
pub async fn run(s: &Stage, fault: Fault) -> Result<Run> {
    let old = shard::wait_steady(s, Duration::from_secs(60)).await?;
    let writer = writer(s)?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let node = s.node_of(&old).await?;
    let (records, watching) = s.watch_lease_holders(&format!("{}-0-primary", s.cluster));
    let at = Instant::now();
    match fault {
        Fault::KillValkey => s.kubelet.crash_container(&s.namespace, &old, "valkey")?,
        Fault::CutNode => s.kubelet.power_off(&node)?,
    }
    let replacement = replaced(s, &old, at).await;
    watching.abort();
    let (primary, writable, labelled) = replacement?;
    let held = records
        .taken_over(&old)
        .map(|(_, seen)| seen.duration_since(at));
    tokio::time::sleep(Duration::from_secs(1)).await;
    if let Fault::CutNode = fault {
        s.kubelet.power_on(&node)?;
    }
    // Read back once the faulted pod is back and in sync: the moment an empty restart could
    // still cost writes.
    shard::wait_steady(s, Duration::from_secs(90)).await?;
    let tag = writer.tag.clone();
    let written = writer.stop()?;
    let lost = s.lost(&primary, &tag, &written.acked)?;
    let deposed = deposed_acks(&[&written], s.valkey(&primary)?).acks.len();
    if let Fault::KillValkey = fault {
        // The next run's crash must be a first crash too (restarted at once, as in production),
        // not one the kubelet holds back in crash-loop back-off: a fresh pod.
        s.recycle(&old, Duration::from_secs(120)).await?;
    }
    Ok(Run {
        held,
        writable,
        labelled,
        acked: written.acked.len(),
        lost,
        deposed,
    })
}

/// Polls the other pods until one takes writes and one carries the label: (that pod, first
/// write accepted, writable and labelled), from `at`.
async fn replaced(s: &Stage, old: &str, at: Instant) -> Result<(String, Duration, Duration)> {
    let mut writable = None;
    while at.elapsed() < Duration::from_secs(60) {
        for p in s.pods.iter().filter(|p| **p != old) {
            if writable.is_none() && shard::write_acked(s, p, Duration::from_millis(100)) {
                writable = Some(at.elapsed());
            }
            if writable.is_some() && shard::serves_as_primary(s, p).await {
                let labelled = at.elapsed();
                return Ok((p.clone(), writable.unwrap_or(labelled), labelled));
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    anyhow::bail!("no new primary within 60 s of the fault on {old}")
}

/// What one planned move measured.
#[derive(Clone)]
pub struct Move {
    pub pause: Duration,
    pub acked: usize,
    pub lost: usize,
}

fn moved(w: &Written, lost: usize) -> Move {
    Move {
        pause: w.longest_pause,
        acked: w.acked.len(),
        lost,
    }
}

/// Planned moves as a row of the fault table: recovery is the write pause.
pub fn as_runs<'a>(scenario: &'a str, moves: &[Move]) -> crate::faults::Runs<'a> {
    crate::faults::Runs {
        scenario,
        acked: Some(moves.iter().map(|m| m.acked).sum()),
        lost: moves.iter().map(|m| m.lost).sum(),
        deposed: None,
        recovery: moves.iter().map(|m| m.pause).collect(),
        what: "the longest write pause",
    }
}

/// One planned switchover by the agents: cordon the primary's node, wait until another pod is
/// the labelled, writable primary, uncordon.
pub async fn switchover(s: &Stage) -> Result<Move> {
    let old = shard::wait_steady(s, Duration::from_secs(60)).await?;
    let writer = writer(s)?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let node = s.node_of(&old).await?;
    crate::cordon(s, &node, true).await?;
    let (primary, _, _) = replaced(s, &old, Instant::now()).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tag = writer.tag.clone();
    let written = writer.stop()?;
    let missing = s.lost(&primary, &tag, &written.acked)?;
    crate::cordon(s, &node, false).await?;
    Ok(moved(&written, missing))
}

/// `runs` of Valkey's own `FAILOVER TO <replica> TIMEOUT 5000` on a plain primary + 2 replicas,
/// each to the next node, under the same writer.
pub fn failover_to_runs(runs: usize) -> Result<Vec<Move>> {
    let set = ReplicationSet::start(2, ServerOptions::default())?;
    set.primary().cmd(&["SET", "warm", "1"])?;
    set.wait_synced(Duration::from_secs(30))?;
    let nodes = set.nodes();
    let mut out = Vec::new();
    for i in 0..runs {
        let (from, to) = (&nodes[i % 3], &nodes[(i + 1) % 3]);
        let addrs = nodes.iter().map(|n| n.addr()).collect();
        let writer = Writer::start(addrs, format!("f{}", crate::rand_tag()));
        std::thread::sleep(Duration::from_millis(500));
        let (host, port) = (to.host(), to.port().to_string());
        from.cmd(&["FAILOVER", "TO", &host, &port, "TIMEOUT", "5000"])?;
        wait_for(
            "FAILOVER TO",
            Duration::from_secs(15),
            Duration::from_millis(1),
            || {
                let done = from.info_field("replication", "master_failover_state")?;
                Ok(to.is_primary()? && done == "no-failover")
            },
        )?;
        std::thread::sleep(Duration::from_secs(1));
        let tag = writer.tag.clone();
        let written = writer.stop()?;
        let missing = lost(to.addr(), &tag, &written.acked)?;
        // `FAILOVER TO` leaves the third node replicating from the old primary (a chain): point it
        // at the new one, as the operator (or Sentinel) would, so the next run can target it.
        let third = &nodes[(i + 2) % 3];
        third.cmd(&["REPLICAOF", &host, &port])?;
        wait_linked(&set, to)?;
        eprintln!(
            "FAILOVER TO {}/{runs}: pause {:?}, {missing} lost",
            i + 1,
            written.longest_pause
        );
        out.push(moved(&written, missing));
    }
    Ok(out)
}

/// Every node but `primary` replicates from it with the link up.
fn wait_linked(set: &ReplicationSet, primary: &valkey_sidecar_testkit::ValkeyServer) -> Result<()> {
    let (host, port) = (primary.host(), primary.port().to_string());
    wait_for(
        "replicas follow the new primary",
        Duration::from_secs(30),
        Duration::from_millis(20),
        || {
            for n in set.nodes().iter().filter(|n| n.addr() != primary.addr()) {
                let up = n.info_field("replication", "master_link_status")? == "up";
                let at = (
                    n.info_field("replication", "master_host")?,
                    n.info_field("replication", "master_port")?,
                );
                if !up || at != (host.clone(), port.clone()) {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .context("after FAILOVER TO")
}
