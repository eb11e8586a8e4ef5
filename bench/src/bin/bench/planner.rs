//! `bench planner`: what a coordinator round's pure rules cost as the deployment grows —
//! `plan::decide` (hand-over, fail-back, balance, drift), `status::conditions` and
//! `formation::decide` over worlds of 10, 100, 1,000 and 10,000 shards (3 members each, spread over
//! nodes in 3 zones, one primary out of its zone and one node cordoned, so every rule has work).
//! Timed in-process, many calls per size; the median and p99 of the calls are reported. Then what
//! those rules, run back to back at 1,000 shards, do to the probes (`stall`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use valkey_sidecar_core::formation::{
    ClusterNode, FormationView, Seat, decide as decide_formation,
};
use valkey_sidecar_core::observation::Role;
use valkey_sidecar_core::plan::{Member, NodeInfo, PodInfo, Policy, World, decide};
use valkey_sidecar_core::shards::NodeHealth;
use valkey_sidecar_core::status::conditions;
use valkey_sidecar_core::time::Millis;

use crate::report::percentile;

fn member(shard: usize, index: usize, nodes: usize) -> Member {
    let node = (shard * 3 + index) % nodes;
    Member {
        id: format!("n{shard}-{index}"),
        shard: format!("s{shard}"),
        role: if index == 0 {
            Role::Primary
        } else {
            Role::Replica
        },
        offset: 1000,
        health: NodeHealth::Online,
        pod: Some(PodInfo {
            name: format!("v-{shard}-{index}"),
            node: Some(format!("node{node}")),
            ready: true,
            terminating: false,
            node_index: Some(u32::try_from(index).unwrap_or(0)),
            zone: None,
            ..PodInfo::default()
        }),
    }
}

/// `shards` shards of 3 members on `shards` nodes (at least 6) over 3 zones.
fn world(shards: usize) -> World {
    let nodes = shards.max(6);
    let mut members: Vec<Member> = (0..shards)
        .flat_map(|s| (0..3).map(move |i| member(s, i, nodes)))
        .collect();
    // Work for the planner: shard 0's primary sits out of its zone, node 1 is cordoned.
    if let Some(p) = members[0].pod.as_mut() {
        p.node_index = Some(1);
    }
    if let Some(p) = members[1].pod.as_mut() {
        p.node_index = Some(0);
    }
    let nodes: BTreeMap<String, NodeInfo> = (0..nodes)
        .map(|n| {
            let info = NodeInfo {
                zone: Some(["a", "b", "c"][n % 3].into()),
                ready: true,
                unschedulable: n == 1,
            };
            (format!("node{n}"), info)
        })
        .collect();
    World {
        now: Millis(10_000_000),
        coordinating: true,
        steady_since: (0..shards).map(|s| (format!("s{s}"), Millis(0))).collect(),
        members,
        nodes,
        ..World::default()
    }
}

/// The same deployment as formation sees it, fully formed (the common case: nothing to do).
fn formation_view(shards: usize) -> FormationView {
    // Shared between the nodes, as the coordinator's `formation::Pool` shares equal listings.
    let ids: Arc<BTreeSet<String>> = Arc::new(
        (0..shards)
            .flat_map(|s| (0..3).map(move |i| format!("n{s}-{i}")))
            .collect(),
    );
    // Every node lists every node at its current address, as in a healthy cluster.
    let addrs: BTreeMap<String, String> = (0..shards)
        .flat_map(|s| (0..3).map(move |i| (format!("n{s}-{i}"), format!("10.{s}.0.{i}"))))
        .collect();
    let addrs = Arc::new(addrs.into());
    let seats = (0..shards)
        .flat_map(|s| (0..3).map(move |i| (s, i)))
        .map(|(s, i)| Seat {
            pod: format!("v-{s}-{i}"),
            shard: u32::try_from(s).ok(),
            index: u32::try_from(i).ok(),
            addr: Some((format!("10.{s}.0.{i}"), 6379)),
            node: Some(ClusterNode {
                id: format!("n{s}-{i}"),
                role: if i == 0 { Role::Primary } else { Role::Replica },
                owns_slots: i == 0,
                primary: (i > 0).then(|| format!("n{s}-0")),
                knows: Arc::clone(&ids),
                failed: BTreeSet::new(),
                addrs: Arc::clone(&addrs),
            }),
        })
        .collect();
    FormationView {
        shards: u32::try_from(shards).unwrap_or(u32::MAX),
        seats,
    }
}

/// Times `f` `calls` times; (median, p99).
fn time(calls: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut samples: Vec<Duration> = (0..calls)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

fn fmt(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

/// Why the formation column stops at 1,000 shards.
const FORMATION_NOTE: &str = "Formation is timed up to 1,000 shards only: Valkey Cluster itself is not run beyond \
about 1,000 nodes. Every node's listing of the cluster is one shared copy here, as the coordinator's \
`formation::Pool` shares equal listings (n² ids otherwise: 900 million strings at 10,000 shards × 3).";

/// `formation::decide` p50 / p99 for a formed cluster of `shards`, or "–" past 1,000 shards.
fn formation(shards: usize, calls: usize) -> String {
    if shards > 1000 {
        return "–".into();
    }
    let f = formation_view(shards);
    let p = time(calls, || drop(std::hint::black_box(decide_formation(&f))));
    format!("{} / {}", fmt(p.0), fmt(p.1))
}

/// The size the probe rows run at: well past most deployments, still run as one cluster.
const PROBED_SHARDS: usize = 1000;

/// Prints the table and plots how the cost grows.
pub fn run() -> anyhow::Result<()> {
    let policy = Policy {
        failback: true,
        ..Policy::default()
    };
    println!("### Planner cost (pure rules, one coordinator round)\n");
    println!(
        "Command: `target/release/bench planner`. Worlds of N shards × 3 members on max(N, 6) nodes in 3 zones, one primary out of its preferred zone and one node cordoned; release build, one core, the calls one after the other (median and p99 of the calls).\n"
    );
    println!(
        "| shards | members | `plan::decide` p50 / p99 | `status::conditions` p50 / p99 | `formation::decide` p50 / p99 | calls |"
    );
    println!("|---|---|---|---|---|---|");
    let mut lines = [
        crate::plot::Line::new("plan::decide p50"),
        crate::plot::Line::new("status::conditions p50"),
    ];
    for (shards, calls) in [(10, 2000), (100, 500), (1000, 50), (10_000, 5)] {
        let w = world(shards);
        let plan = decide(&w, &policy);
        let d = time(calls, || drop(std::hint::black_box(decide(&w, &policy))));
        let c = time(calls, || {
            drop(std::hint::black_box(conditions(&w, &policy, &plan)))
        });
        let p = formation(shards, calls);
        println!(
            "| {shards} | {} | {} / {} | {} / {} | {p} | {calls} |",
            shards * 3,
            fmt(d.0),
            fmt(d.1),
            fmt(c.0),
            fmt(c.1),
        );
        eprintln!(
            "planner {shards} shards: decide {:?}, conditions {:?} (p50)",
            d.0, c.0
        );
        lines[0].push(shards, d.0);
        lines[1].push(shards, c.0);
    }
    println!("\n{FORMATION_NOTE}\n");
    let title = "Planner cost per coordinator round";
    println!(
        "{}",
        crate::plot::growth("planner", title, "shards", "ms per call", &lines)?
    );
    let size = PROBED_SHARDS;
    crate::stall::run(size, world(size), policy, formation_view(size))
}
