//! `bench restart`: Valkey Cluster without persistence when a crashed primary is restarted at
//! once, as the kubelet does the first time a container dies. The node keeps its `nodes.conf`
//! (an emptyDir survives container restarts) but not its data: back within the node timeout it
//! is still the shard's primary, empty, and its replica resyncs from it.

use std::time::Duration;

use anyhow::Result;
use valkey_sidecar_testkit::k8s::writer::{Writer, tag_for};
use valkey_sidecar_testkit::{ClusterOptions, ValkeyCluster};

use crate::alone::{current_primary, finish};
use crate::failover::Move;

const NODE_TIMEOUT_MS: u64 = 2000;

/// One crash and immediate restart: what the writer lost, and whether the restarted node was
/// still the primary afterwards.
struct Restart {
    moved: Move,
    same_primary: bool,
}

/// `runs` crashes with an immediate restart, shards in turn, one writer each.
pub fn run(runs: usize) -> Result<()> {
    let opts = ClusterOptions::default().node_timeout_ms(NODE_TIMEOUT_MS);
    let cluster = ValkeyCluster::start(3, 1, opts)?;
    let mut out = Vec::new();
    for i in 0..runs {
        let r = once(&cluster, i % 3)?;
        eprintln!(
            "restart {}/{runs}: {} acked, {} lost, still primary: {}",
            i + 1,
            r.moved.acked,
            r.moved.lost,
            r.same_primary
        );
        out.push(r);
    }
    report(&out);
    Ok(())
}

fn once(cluster: &ValkeyCluster, shard: usize) -> Result<Restart> {
    let members = cluster.shard(shard);
    let old = current_primary(members)?;
    let writer = Writer::start(
        members.iter().map(|n| n.addr()).collect(),
        tag_for(old.addr())?,
    );
    std::thread::sleep(Duration::from_secs(1));
    old.kill()?;
    old.restart()?;
    // Two node timeouts: long enough for an election had the cluster seen the node fail.
    std::thread::sleep(Duration::from_millis(2 * NODE_TIMEOUT_MS));
    let now = current_primary(members)?;
    let same_primary = now.addr() == old.addr();
    let moved = finish(writer, now)?;
    cluster.wait_healthy(Duration::from_secs(60))?;
    Ok(Restart {
        moved,
        same_primary,
    })
}

fn report(runs: &[Restart]) {
    let acked: usize = runs.iter().map(|r| r.moved.acked).sum();
    let lost: usize = runs.iter().map(|r| r.moved.lost).sum();
    let same = runs.iter().filter(|r| r.same_primary).count();
    println!("### Cluster mode without persistence: a crashed primary restarted at once\n");
    println!(
        "Command: `BENCH_RESTARTS={} target/release/bench restart`. Valkey alone (3 shards × 1 replica on loopback, `cluster-node-timeout` {NODE_TIMEOUT_MS} ms, no persistence), a writer on the next shard; its primary is killed with SIGKILL and started again at once with its `nodes.conf`, as the kubelet restarts a crashed container the first time (the chart keeps `nodes.conf` in the pod's data volume, an emptyDir when persistence is off). Two node timeouts later the writer stops and every acknowledged key is read back from the shard's primary.\n",
        runs.len()
    );
    println!("| runs | restarted node still primary | acknowledged | lost |");
    println!("|---|---|---|---|");
    println!("| {} | {same} | {acked} | {lost} |\n", runs.len());
    println!("{RESTART_NOTE}\n");
    crate::faults::record_runs(
        "restart",
        crate::faults::Runs {
            scenario: "cluster, no persistence: crashed primary restarted at once",
            acked: Some(acked),
            lost,
            recovery: Vec::new(),
            what: "none: the restarted node stays primary, empty, and its replica resyncs from it",
        },
    );
}

/// What the table means for a deployment, and what the agent does (nothing yet).
const RESTART_NOTE: &str = "Back within the node timeout, the node is never flagged failed: it is still the shard's \
primary, now empty, and its replica takes a full sync from it, so the shard's data is gone. This is Valkey's known rule \
(persistence off means no automatic restart of a primary), and **the agent does not guard against it yet**: with the \
chart's default `persistence.enabled: false`, a crash of a primary's Valkey container can empty its shard. Run with \
persistence (`persistence.enabled`, `appendonly yes`) where the data matters. The crash runs of `bench handover` use a \
5 s restart back-off so that Valkey Cluster fails over first.";
