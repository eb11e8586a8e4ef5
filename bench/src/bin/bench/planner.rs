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
    ClusterNode, FormationView, Glance, LocalMap, Pool, Seat, decide as decide_formation,
};
use valkey_sidecar_core::observation::Role;
use valkey_sidecar_core::plan::{Member, NodeInfo, PodInfo, Policy, World, decide};
use valkey_sidecar_core::reply::Reply;
use valkey_sidecar_core::shards::{NodeHealth, Shard, ShardNode};
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

/// INFO and CLUSTER INFO as a real Valkey 9.1 answered them (the core tests' fixtures).
const INFO: &str = include_str!("../../../../core/tests/fixtures/cluster-replica.info.txt");
const CLUSTER_INFO: &str =
    include_str!("../../../../core/tests/fixtures/cluster-replica.cluster-info.txt");

/// What a formation round starts from at `shards` × 3: the coordinator's own map, and every
/// pod's answers to the short questions (address, replies), as a formed cluster gives them.
fn formation_inputs(shards: usize) -> (Vec<Shard>, Vec<(String, Vec<Reply>)>) {
    let ip = |s: usize, i: usize| format!("10.{s}.0.{i}");
    let known = format!("cluster_known_nodes:{}", shards * 3);
    let cluster_info = CLUSTER_INFO.replace("cluster_known_nodes:6", &known);
    let persistence = section(INFO, "# Persistence");
    let map = (0..shards)
        .map(|s| Shard {
            id: format!("shard{s}"),
            slots: vec![(0, 10)],
            nodes: (0..3)
                .map(|i| ShardNode {
                    id: format!("n{s}-{i}"),
                    ip: ip(s, i),
                    role: if i == 0 { Role::Primary } else { Role::Replica },
                    health: NodeHealth::Online,
                    ..ShardNode::default()
                })
                .collect(),
        })
        .collect();
    let replies = |s: usize, i: usize| {
        let text = |t: String| Reply::Text(t);
        let role = if i == 0 {
            vec![text("master".into()), Reply::Int(1), Reply::Array(vec![])]
        } else {
            let link = [text("connected".into()), Reply::Int(1)];
            [text("slave".into()), text(ip(s, 0)), Reply::Int(6379)]
                .into_iter()
                .chain(link)
                .collect()
        };
        vec![
            Reply::Array(role),
            text(persistence.clone()),
            text(cluster_info.clone()),
            text(format!("n{s}-{i}")),
            text(format!("shard{s}")),
        ]
    };
    let pods = (0..shards)
        .flat_map(|s| (0..3).map(move |i| (s, i)))
        .map(|(s, i)| (ip(s, i), replies(s, i)))
        .collect();
    (map, pods)
}

/// One section of INFO text, header included (what `INFO <section>` answers).
fn section(info: &str, header: &str) -> String {
    let from = info.find(header).unwrap_or(0);
    let rest = &info[from..];
    let end = rest[1..].find("\n#").map_or(rest.len(), |e| e + 1);
    rest[..end].to_owned()
}

/// One formation round's own CPU with nothing to do: the local map prepared, every pod's short
/// answers parsed and vouched for, the listings shared, `formation::decide`. Returns how many pods
/// were vouched for (all, or the figure is not the round it claims) and the steps decided.
fn formation_round(map: &[Shard], pods: &[(String, Vec<Reply>)], shards: u32) -> (usize, usize) {
    let local = LocalMap::new(map);
    let mut pool = Pool::default();
    let seats: Vec<Seat> = pods
        .iter()
        .enumerate()
        .map(|(k, (ip, replies))| {
            let glance = Glance::answered(replies);
            let mut node = glance.and_then(|g| local.vouch(&g, ip));
            if let Some(n) = node.as_mut() {
                pool.share(n);
            }
            Seat {
                pod: format!("v-{k}"),
                shard: u32::try_from(k / 3).ok(),
                index: u32::try_from(k % 3).ok(),
                addr: Some((ip.clone(), 6379)),
                node,
            }
        })
        .collect();
    let vouched = seats.iter().filter(|s| s.node.is_some()).count();
    let f = decide_formation(&FormationView { shards, seats });
    (vouched, f.steps.len())
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
`formation::Pool` shares equal listings (n² ids otherwise: 900 million strings at 10,000 shards × 3). \
The formation round's CPU is what a steady round costs the coordinator's thread beside its I/O: the local \
map prepared (`formation::LocalMap`), every pod's short answers (`formation::QUESTIONS`: `ROLE`, `INFO persistence`, `CLUSTER INFO`, \
`CLUSTER MYID`, `CLUSTER MYSHARDID`; INFO and CLUSTER INFO as captured from Valkey) parsed and vouched for, \
the listings shared, `formation::decide`. It reads no pod's whole map: every pod's answers agree with \
the local map (a few are read in full each round in turn, `formation::AUDIT`, each costing one map's parse).";

/// `formation::decide` and the whole formation round's CPU (`formation_round`), p50 / p99 each,
/// for a formed cluster of `shards`, or "–" past 1,000 shards.
fn formation(shards: usize, calls: usize) -> anyhow::Result<[String; 2]> {
    if shards > 1000 {
        return Ok(["–".into(), "–".into()]);
    }
    let f = formation_view(shards);
    let p = time(calls, || drop(std::hint::black_box(decide_formation(&f))));
    let (map, pods) = formation_inputs(shards);
    let n = u32::try_from(shards).unwrap_or(u32::MAX);
    let once = formation_round(&map, &pods, n);
    anyhow::ensure!(
        once == (pods.len(), 0),
        "a formed cluster of {shards} shards: {once:?} (pods vouched for, steps), not ({}, 0)",
        pods.len()
    );
    let r = time(calls, || {
        std::hint::black_box(formation_round(&map, &pods, n));
    });
    Ok([p, r].map(|(p50, p99)| format!("{} / {}", fmt(p50), fmt(p99))))
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
        "| shards | members | `plan::decide` p50 / p99 | `status::conditions` p50 / p99 | `formation::decide` p50 / p99 | formation round's CPU p50 / p99 | calls |"
    );
    println!("|---|---|---|---|---|---|---|");
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
        let [p, r] = formation(shards, calls)?;
        println!(
            "| {shards} | {} | {} / {} | {} / {} | {p} | {r} | {calls} |",
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
