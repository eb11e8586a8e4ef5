//! The coordinator's planner: tables of scenarios and property tests of its safety rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use valkey_sidecar_core::observation::Role;
use valkey_sidecar_core::plan::{
    Ask, InFlight, Kind, Member, NodeInfo, PodInfo, Policy, World, decide, unseen_nodes,
};
use valkey_sidecar_core::replication::MemberValkey;
use valkey_sidecar_core::roll::RollPolicy;
use valkey_sidecar_core::shards::NodeHealth;
use valkey_sidecar_core::time::Millis;

/// `(id, shard, role, offset, node, node_index)`; pods are Ready unless changed afterwards.
fn member(id: &str, shard: &str, role: Role, offset: u64, node: &str, index: u32) -> Member {
    Member {
        id: id.into(),
        shard: shard.into(),
        role,
        offset,
        health: NodeHealth::Online,
        pod: Some(PodInfo {
            name: format!("pod-{id}"),
            node: Some(node.into()),
            ready: true,
            terminating: false,
            node_index: Some(index),
            zone: None,
            ..PodInfo::default()
        }),
    }
}

/// Six nodes n0..n5 over zones a, b, c (n0,n3 → a; n1,n4 → b; n2,n5 → c).
fn nodes() -> BTreeMap<String, NodeInfo> {
    (0..6)
        .map(|i| {
            (
                format!("n{i}"),
                NodeInfo {
                    zone: Some(["a", "b", "c"][i % 3].into()),
                    ready: true,
                    unschedulable: false,
                },
            )
        })
        .collect()
}

/// Three shards × 2 replicas, primaries on n0, n1, n2 (their preferred zones a, b, c).
fn world() -> World {
    let mut members = Vec::new();
    for s in 0..3 {
        let shard = format!("s{s}");
        members.push(member(
            &format!("p{s}"),
            &shard,
            Role::Primary,
            1000,
            &format!("n{s}"),
            0,
        ));
        members.push(member(
            &format!("r{s}a"),
            &shard,
            Role::Replica,
            1000,
            &format!("n{}", (s + 1) % 3 + 3),
            1,
        ));
        members.push(member(
            &format!("r{s}b"),
            &shard,
            Role::Replica,
            1000,
            &format!("n{}", (s + 2) % 3),
            2,
        ));
    }
    let steady_since = (0..3).map(|s| (format!("s{s}"), Millis(0))).collect();
    World {
        now: Millis(1_000_000),
        coordinating: true,
        members,
        nodes: nodes(),
        steady_since,
        in_flight: vec![],
        last_move: None,
        pending: vec![],
        ..World::default()
    }
}

fn find<'a>(w: &'a mut World, id: &str) -> &'a mut Member {
    w.members.iter_mut().find(|m| m.id == id).unwrap()
}

#[test]
fn steady_cluster_needs_nothing() {
    let plan = decide(&world(), &Policy::default());
    assert!(
        plan.actions.is_empty() && plan.blocked.is_empty() && plan.drift.is_empty(),
        "{plan:?}"
    );
}

#[test]
fn terminating_primary_is_handed_to_the_highest_offset_replica() {
    let mut w = world();
    find(&mut w, "p0").pod.as_mut().unwrap().terminating = true;
    find(&mut w, "r0b").offset = 1001;
    let plan = decide(&w, &Policy::default());
    assert_eq!(plan.actions.len(), 1);
    let a = &plan.actions[0];
    assert_eq!(
        (a.kind, a.shard.as_str(), a.from.as_str(), a.to.as_str()),
        (Kind::Handover, "s0", "p0", "r0b")
    );
    assert!(a.reason.contains("terminating"), "{}", a.reason);
}

#[test]
fn a_ready_replica_is_synced_however_stale_its_gossiped_offset() {
    // Measured: one client writing 9.7k SETs/s, the view's primary-minus-replica offset (cluster
    // mode, node timeout 5 s) was over 1 MiB in 14 of 257 samples, up to 1.56 MB.
    let mut w = world();
    find(&mut w, "p0").pod.as_mut().unwrap().terminating = true;
    find(&mut w, "p0").offset = 2 << 20;
    let plan = decide(&w, &Policy::default());
    assert_eq!(plan.actions.len(), 1, "{plan:?}");
    let mut memory = valkey_sidecar_core::plan::track(&Default::default(), &w.members, Millis(0));
    memory = valkey_sidecar_core::plan::track(&memory, &w.members, Millis(9_000));
    assert_eq!(memory["s0"].steady_since, Millis(0), "steady throughout");
}

#[test]
fn equal_offsets_prefer_the_shards_zone() {
    let mut w = world();
    find(&mut w, "p0").pod.as_mut().unwrap().terminating = true;
    // r0a is on n4 (zone b), r0b on n2 (zone c); move r0b to n3 (zone a, the preferred zone).
    find(&mut w, "r0b").pod.as_mut().unwrap().node = Some("n3".into());
    let plan = decide(&w, &Policy::default());
    assert_eq!(plan.actions[0].to, "r0b");
}

#[test]
fn syncing_or_unready_replicas_are_never_targets() {
    let mut w = world();
    find(&mut w, "p0").pod.as_mut().unwrap().terminating = true;
    find(&mut w, "r0a").health = NodeHealth::Loading; // in a full sync…
    // …and a replica its agent judged behind (its pod is not Ready), however high its offset.
    find(&mut w, "r0b").offset = 1 << 40;
    find(&mut w, "r0b").pod.as_mut().unwrap().ready = false;
    let plan = decide(&w, &Policy::default());
    assert!(plan.actions.is_empty());
    assert_eq!(plan.blocked.len(), 1, "{plan:?}");
    assert!(plan.blocked[0].contains("no synced replica"));
}

#[test]
fn cordoned_or_not_ready_node_triggers_handover() {
    for (unschedulable, ready) in [(true, true), (false, false)] {
        let mut w = world();
        let n1 = w.nodes.get_mut("n1").unwrap();
        n1.unschedulable = unschedulable;
        n1.ready = ready;
        let plan = decide(&w, &Policy::default());
        // n1 carries p1 and r2b: p1 is handed over, never onto n1.
        assert_eq!(plan.actions.len(), 1, "{plan:?}");
        assert_eq!(
            (plan.actions[0].from.as_str(), plan.actions[0].kind),
            ("p1", Kind::Handover)
        );
    }
}

#[test]
fn followers_never_act() {
    let mut w = world();
    w.coordinating = false;
    find(&mut w, "p0").pod.as_mut().unwrap().terminating = true;
    assert!(decide(&w, &Policy::default()).actions.is_empty());
}

#[test]
fn hand_overs_of_several_shards_run_at_once_up_to_their_limit_and_skip_busy_shards() {
    let mut w = world();
    for p in ["p0", "p1"] {
        find(&mut w, p).pod.as_mut().unwrap().terminating = true;
    }
    let limited = |n| Policy {
        max_handovers: n,
        ..Policy::default()
    };
    assert_eq!(decide(&w, &Policy::default()).actions.len(), 2);
    assert_eq!(decide(&w, &limited(1)).actions.len(), 1);
    // The larger limit counts: max_concurrent above max_handovers does not hold one back.
    let wide = Policy {
        max_concurrent: 3,
        ..limited(1)
    };
    assert_eq!(decide(&w, &wide).actions.len(), 2);
    w.in_flight.push(InFlight {
        shard: "s0".into(),
        started: Millis(0),
    });
    let plan = decide(&w, &limited(2));
    assert_eq!(plan.actions.len(), 1);
    assert_eq!(plan.actions[0].shard, "s1");
    assert!(
        decide(&w, &limited(1)).actions.is_empty(),
        "the move in flight counts"
    );
}

/// Shard 0's primary failed over to r0a (zone b): drift, then fail-back once steady.
fn drifted() -> World {
    let mut w = world();
    find(&mut w, "p0").role = Role::Replica;
    find(&mut w, "r0a").role = Role::Primary;
    w
}

#[test]
fn failback_is_off_by_default_but_drift_is_reported() {
    let plan = decide(
        &drifted(),
        &Policy {
            balance: false,
            ..Policy::default()
        },
    );
    assert!(plan.actions.is_empty());
    assert_eq!(plan.drift.len(), 1);
    assert_eq!(plan.drift[0].reason, "FailoverDrift");
}

#[test]
fn failback_waits_for_the_quiet_period() {
    let policy = Policy {
        failback: true,
        balance: false,
        quiet_period_ms: 60_000,
        ..Policy::default()
    };
    let mut w = drifted();
    w.steady_since.insert("s0".into(), Millis(w.now.0 - 59_999));
    assert!(
        decide(&w, &policy).actions.is_empty(),
        "inside the quiet period"
    );
    w.steady_since.insert("s0".into(), Millis(w.now.0 - 60_000));
    let plan = decide(&w, &policy);
    assert_eq!(plan.actions.len(), 1);
    let a = &plan.actions[0];
    assert_eq!(
        (a.kind, a.from.as_str(), a.to.as_str()),
        (Kind::FailBack, "r0a", "p0")
    );
    w.last_move = Some(Millis(w.now.0 - 1));
    assert!(decide(&w, &policy).actions.is_empty(), "cooldown");
}

#[test]
fn crowded_node_is_rebalanced_within_the_zone() {
    let mut w = world();
    // Shard 1's primary moves onto n0 (zone a) next to p0: n0 carries two primaries.
    find(&mut w, "p1").role = Role::Replica;
    find(&mut w, "r1b").pod.as_mut().unwrap().node = Some("n0".into());
    find(&mut w, "r1b").role = Role::Primary;
    let plan = decide(&w, &Policy::default());
    assert_eq!(plan.actions.len(), 1, "{plan:?}");
    let a = &plan.actions[0];
    assert_eq!(a.kind, Kind::Rebalance);
    // Shard 1 prefers zone b (p1 on n1): it may leave n0, since n0 is not in its preferred zone.
    assert_eq!((a.shard.as_str(), a.from.as_str()), ("s1", "r1b"));
    assert!(plan.drift.iter().any(|d| d.reason == "PrimaryImbalance"));
}

/// Node n0's primaries when its shards' replicas in their preferred zones share n0 or live in
/// other zones: balance can move none (it keeps each primary in its shard's preferred zone, and
/// moves primaries, not pods), and the drift says so; a replica of the zone on an empty node
/// makes the same crowding movable.
#[test]
fn a_crowding_that_balance_cannot_lower_says_so() {
    let mut w = world();
    // Shard 1's intended primary p1 was rescheduled onto n0: shard 1 prefers zone a now, and its
    // replicas are on n5 (zone c) and n0.
    find(&mut w, "p1").pod.as_mut().unwrap().node = Some("n0".into());
    let imbalance = |w: &World| {
        let plan = decide(w, &Policy::default());
        let drift = plan.drift.iter().find(|d| d.reason == "PrimaryImbalance");
        (plan.actions.clone(), drift.map(|d| d.message.clone()))
    };
    let (actions, message) = imbalance(&w);
    assert!(actions.is_empty(), "{actions:?}");
    let message = message.expect("n0 carries two primaries, over the cap of 1");
    assert!(
        message.starts_with("node n0 carries 2 primaries (cap 1)"),
        "{message}"
    );
    assert!(message.contains("balance cannot lower it"), "{message}");
    // Shard 0's replica r0b moves to n3 (zone a, no primary): shard 0 can leave n0.
    find(&mut w, "r0b").pod.as_mut().unwrap().node = Some("n3".into());
    let (actions, message) = imbalance(&w);
    let message = message.expect("still crowded until the move");
    assert!(!message.contains("cannot"), "{message}");
    let moved: Vec<_> = actions.iter().map(|a| (a.kind, a.to.as_str())).collect();
    assert_eq!(moved, [(Kind::Rebalance, "r0b")]);
}

#[test]
fn steadiness_restarts_on_a_new_primary_or_an_unsynced_replica() {
    use valkey_sidecar_core::plan::track;
    let w = world();
    let t0 = track(&Default::default(), &w.members, Millis(0));
    let t1 = track(&t0, &w.members, Millis(5_000));
    assert_eq!(t1["s0"].steady_since, Millis(0));
    let d = drifted();
    let t2 = track(&t1, &d.members, Millis(6_000));
    assert_eq!(t2["s0"].steady_since, Millis(6_000), "new primary");
    assert_eq!(t2["s1"].steady_since, Millis(0));
    let mut lag = d.clone();
    // p0 is a replica now; its agent judges it behind.
    find(&mut lag, "p0").pod.as_mut().unwrap().ready = false;
    let t3 = track(&t2, &lag.members, Millis(7_000));
    assert_eq!(
        t3["s0"].steady_since,
        Millis(7_000),
        "a replica fell behind"
    );
}

#[test]
fn a_finished_move_settles_until_the_view_shows_it() {
    use valkey_sidecar_core::moves::{Ledger, Started};
    let mut ledger = Ledger::default();
    ledger.start("s0", Started::Planned(Kind::Handover), Millis(1_000));
    assert!(ledger.is_busy("s0"), "running");
    ledger.finish("s0", Some(("r0a", None)), Millis(2_000));
    let stale = world();
    ledger.settle(&stale.members, Millis(5_000));
    assert!(ledger.is_busy("s0"), "the view still shows the old primary");
    assert_eq!(
        ledger.in_flight()[0].started,
        Millis(1_000),
        "counted from its start"
    );
    ledger.settle(&drifted().members, Millis(5_000));
    assert!(!ledger.is_busy("s0"), "the view caught up");
    ledger.start("s0", Started::Planned(Kind::Handover), Millis(6_000));
    ledger.finish("s0", Some(("r0a", None)), Millis(7_000));
    ledger.settle(&stale.members, Millis(17_000));
    assert!(!ledger.is_busy("s0"), "given up after the deadline");
    ledger.start("s1", Started::Unplanned, Millis(8_000));
    ledger.finish("s1", None, Millis(9_000));
    assert!(!ledger.is_busy("s1"), "a failed move does not settle");
    // A view that shows the new primary but still the old one too has not caught up.
    ledger.start("s0", Started::Planned(Kind::Roll), Millis(20_000));
    ledger.finish("s0", Some(("r0a", Some("p0"))), Millis(21_000));
    let mut both = world();
    find(&mut both, "r0a").role = Role::Primary;
    ledger.settle(&both.members, Millis(22_000));
    assert!(
        ledger.is_busy("s0"),
        "the old primary is still shown as primary"
    );
    ledger.settle(&drifted().members, Millis(22_000));
    assert!(!ledger.is_busy("s0"), "the view caught up");
}

#[test]
fn only_fail_back_and_balance_start_the_cooldown() {
    use valkey_sidecar_core::moves::{Ledger, Started};
    let mut ledger = Ledger::default();
    ledger.start("s0", Started::Planned(Kind::Handover), Millis(1_000));
    ledger.start("s1", Started::Unplanned, Millis(2_000));
    assert_eq!(ledger.last_move(), None);
    ledger.start("s2", Started::Planned(Kind::FailBack), Millis(3_000));
    ledger.start("s3", Started::Planned(Kind::Rebalance), Millis(4_000));
    assert_eq!(ledger.last_move(), Some(Millis(4_000)));
}

#[test]
fn a_planned_move_goes_before_an_unplanned_one() {
    use valkey_sidecar_core::moves::{Ledger, Started};
    use valkey_sidecar_core::plan::Action;
    let mut ledger = Ledger::default();
    ledger.start("s0", Started::Unplanned, Millis(1_000));
    let planned = [Action {
        kind: Kind::Handover,
        shard: "s1".into(),
        from: "p1".into(),
        to: "r1".into(),
        reason: "pod deleted".into(),
    }];
    let free = ledger.free_for_unplanned(["s0", "s1", "s2"], &planned);
    assert_eq!(free, ["s2"]);
}

// ---- properties --------------------------------------------------------------------------------

fn arb_world() -> impl Strategy<Value = World> {
    let member = (
        0usize..3,
        prop::bool::ANY,
        0u64..2_000,
        0usize..6,
        prop::bool::ANY,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
    );
    let node = (prop::bool::weighted(0.85), prop::bool::weighted(0.15));
    (
        prop::collection::vec(member, 1..12),
        prop::collection::vec(node, 6),
        prop::bool::ANY,
        prop::collection::vec(0u64..200_000, 3),
        prop::option::of(0usize..3),
        (
            prop::bool::weighted(0.3),
            prop::bool::weighted(0.2),
            prop::option::weighted(0.3, (0usize..3, prop::option::of(0usize..12))),
        ),
    )
        .prop_map(
            |(ms, ns, coordinating, steady, in_flight, (paused, operator_busy, asked))| {
                let shards: Vec<usize> = ms.iter().map(|m| m.0).collect();
                let members = ms
                    .into_iter()
                    .enumerate()
                    .map(
                        |(i, (shard, primary, offset, node, ready, terminating, failed))| Member {
                            id: format!("m{i}"),
                            shard: format!("s{shard}"),
                            role: if primary {
                                Role::Primary
                            } else {
                                Role::Replica
                            },
                            offset,
                            health: if failed {
                                NodeHealth::Failed
                            } else {
                                NodeHealth::Online
                            },
                            pod: Some(PodInfo {
                                name: format!("pod{i}"),
                                node: Some(format!("n{node}")),
                                ready,
                                terminating,
                                node_index: Some(i as u32 % 3),
                                zone: None,
                                ..PodInfo::default()
                            }),
                        },
                    )
                    .collect();
                let nodes = ns
                    .into_iter()
                    .enumerate()
                    .map(|(i, (ready, unschedulable))| {
                        (
                            format!("n{i}"),
                            NodeInfo {
                                zone: Some(["a", "b", "c"][i % 3].into()),
                                ready,
                                unschedulable,
                            },
                        )
                    })
                    .collect();
                let now = Millis(200_000);
                let steady_since = steady
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| (format!("s{i}"), Millis(t)))
                    .collect();
                let in_flight = in_flight
                    .map(|s| InFlight {
                        shard: format!("s{s}"),
                        started: Millis(0),
                    })
                    .into_iter()
                    .collect();
                World {
                    now,
                    coordinating,
                    members,
                    nodes,
                    steady_since,
                    in_flight,
                    last_move: None,
                    pending: vec![],
                    paused,
                    operator_busy,
                    switchover: asked.map(|(shard, to)| ask(&shards, shard, to)),
                    ..World::default()
                }
            },
        )
}

/// A switchover of shard `s<shard>` (the pods of its members), to `pod<to>` if named.
fn ask(shards: &[usize], shard: usize, to: Option<usize>) -> Ask {
    Ask {
        id: "req".into(),
        shard: shard.to_string(),
        pods: (0..shards.len())
            .filter(|i| shards[*i] == shard)
            .map(|i| format!("pod{i}"))
            .collect(),
        to: to.map(|i| format!("pod{i}")),
    }
}

fn arb_policy() -> impl Strategy<Value = Policy> {
    let limits = (1usize..4, 1usize..6);
    (prop::bool::ANY, prop::bool::ANY, limits).prop_map(
        |(failback, balance, (max_concurrent, max_handovers))| Policy {
            failback,
            balance,
            max_concurrent,
            max_handovers,
            quiet_period_ms: 60_000,
            ..Policy::default()
        },
    )
}

/// What the property asks of every target, written out apart from the planner's own filter.
fn takes_over(w: &World, m: &Member) -> bool {
    let Some(pod) = m.pod.as_ref() else {
        return false;
    };
    let node = pod.node.as_ref().and_then(|n| w.nodes.get(n));
    let node_ok = node.is_some_and(|n| n.ready && !n.unschedulable);
    m.role == Role::Replica
        && m.health == NodeHealth::Online
        && pod.ready
        && !pod.terminating
        && node_ok
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000)))]

    #[test]
    fn planner_safety(w in arb_world(), policy in arb_policy()) {
        let plan = decide(&w, &policy);
        if !w.coordinating {
            prop_assert!(plan.actions.is_empty(), "an action without the lease");
        }
        // A switchover asked for is outside the budget: someone asked for it. Safety hand-overs
        // have their own, larger limit; any other move fits within max_concurrent, counting
        // the hand-overs planned beside it.
        let count = |f: &dyn Fn(Kind) -> bool| plan.actions.iter().filter(|a| f(a.kind)).count();
        let handovers = count(&|k| k == Kind::Handover);
        let others = count(&|k| k != Kind::Handover && k != Kind::Switchover);
        let running = w.in_flight.len();
        let limit = policy.max_handovers.max(policy.max_concurrent);
        prop_assert!(handovers + running <= limit.max(running));
        if others > 0 {
            prop_assert!(others + handovers + running <= policy.max_concurrent);
        }
        prop_assert!(plan.actions.iter().filter(|a| a.kind == Kind::Switchover).count() <= 1);
        let mut shards: Vec<&str> = plan.actions.iter().map(|a| a.shard.as_str()).collect();
        shards.extend(w.in_flight.iter().map(|f| f.shard.as_str()));
        let before = shards.len();
        shards.sort();
        shards.dedup();
        prop_assert_eq!(before, shards.len(), "two actions on one shard");
        for a in &plan.actions {
            let from = w.members.iter().find(|m| m.id == a.from).unwrap();
            let to = w.members.iter().find(|m| m.id == a.to).unwrap();
            prop_assert_eq!(from.role, Role::Primary);
            prop_assert_eq!(&from.shard, &a.shard);
            prop_assert_eq!(&to.shard, &a.shard);
            prop_assert_eq!(to.role, Role::Replica);
            prop_assert_eq!(to.health, NodeHealth::Online);
            let pod = to.pod.as_ref().unwrap();
            prop_assert!(pod.ready && !pod.terminating, "target not ready or terminating");
            let node = &w.nodes[pod.node.as_ref().unwrap()];
            prop_assert!(node.ready && !node.unschedulable, "target on a node going away");
            if a.kind == Kind::Handover {
                let better = w.members.iter().filter(|m| m.shard == a.shard && m.offset > to.offset);
                prop_assert!(better.filter(|m| takes_over(&w, m)).count() == 0, "a synced replica with a higher offset was passed over");
            }
            if matches!(a.kind, Kind::FailBack | Kind::Rebalance) {
                let since = w.steady_since.get(&a.shard).copied().unwrap_or(w.now);
                prop_assert!(w.now.since(since) >= policy.quiet_period_ms, "fail-back/balance inside the quiet period");
            }
            if a.kind == Kind::FailBack {
                prop_assert!(policy.failback);
            }
            if matches!(a.kind, Kind::FailBack | Kind::Rebalance) {
                prop_assert!(!w.paused && !w.operator_busy, "a chosen move while held");
            }
            if w.paused && a.kind == Kind::Handover {
                let node = &w.nodes[from.pod.as_ref().unwrap().node.as_ref().unwrap()];
                prop_assert!(from.pod.as_ref().unwrap().terminating || !node.ready, "paused, yet moved for a cordon");
            }
            if a.kind == Kind::Switchover {
                let ask = w.switchover.as_ref().unwrap();
                prop_assert!(ask.pods.contains(&to.pod.as_ref().unwrap().name));
                if let Some(named) = &ask.to {
                    prop_assert_eq!(&to.pod.as_ref().unwrap().name, named);
                }
            }
        }
        if plan.refused.is_some() {
            prop_assert!(plan.actions.iter().all(|a| a.kind != Kind::Switchover));
        }
    }
}

// ------------------------------------------------------------------------------------------
// Without Node facts (RBAC without Nodes: the chart's namespace profile).
// ------------------------------------------------------------------------------------------

/// The world as a coordinator that may not read Nodes builds it: node facts from the pods only.
fn world_without_nodes() -> World {
    let mut w = world();
    for (i, m) in w.members.iter_mut().enumerate() {
        if let Some(p) = m.pod.as_mut() {
            p.zone = Some(["a", "b", "c"][i % 3].into());
        }
    }
    w.nodes = unseen_nodes(w.members.iter().filter_map(|m| m.pod.as_ref()));
    w
}

#[test]
fn unseen_nodes_are_the_pods_nodes_usable_in_their_pods_zone() {
    let w = world_without_nodes();
    assert_eq!(w.nodes.len(), 6, "{:?}", w.nodes);
    assert!(w.nodes.values().all(NodeInfo::usable));
    assert_eq!(w.nodes["n0"].zone.as_deref(), Some("a"));
    let none = unseen_nodes(&[PodInfo::default()]);
    assert!(none.is_empty(), "a pod not yet scheduled names no node");
}

#[test]
fn without_node_facts_a_terminating_primary_still_hands_over() {
    let mut w = world_without_nodes();
    find(&mut w, "p1").pod.as_mut().unwrap().terminating = true;
    let plan = decide(&w, &Policy::default());
    assert_eq!(plan.actions.len(), 1, "{plan:?}");
    let a = &plan.actions[0];
    assert_eq!((a.kind, a.from.as_str()), (Kind::Handover, "p1"));
    assert!(a.to == "r1a" || a.to == "r1b", "{a:?}");
}

#[test]
fn without_node_facts_nothing_moves_while_nothing_is_deleted() {
    let plan = decide(&world_without_nodes(), &Policy::default());
    assert!(plan.actions.is_empty(), "{plan:?}");
}

/// The world with every pod's revision set: `outdated` pods are not at their update revision.
fn rolling(outdated: &[&str]) -> World {
    let mut w = drifted();
    w.primary_since = w.steady_since.clone();
    for m in &mut w.members {
        let pod = m.pod.as_mut().unwrap();
        pod.updated = Some(!outdated.contains(&m.id.as_str()));
    }
    w
}

fn roll_policy() -> Policy {
    Policy {
        failback: true,
        quiet_period_ms: 0,
        cooldown_ms: 0,
        roll: Some(RollPolicy {
            max_shards_rolling: 1,
            pods_per_shard: 3,
        }),
        ..Policy::default()
    }
}

#[test]
fn the_roll_replaces_replicas_then_hands_the_primary_over_and_holds_fail_back() {
    // Without a roll the drifted shard fails back.
    let plan = decide(&rolling(&[]), &roll_policy());
    assert_eq!(plan.actions[0].kind, Kind::FailBack, "{plan:?}");
    assert_eq!(plan.roll_outdated, 0);
    // r0b (ordinal 2) goes first; fail-back waits for the roll.
    let plan = decide(&rolling(&["p0", "r0a", "r0b"]), &roll_policy());
    assert!(plan.actions.is_empty(), "{plan:?}");
    let pods: Vec<&str> = plan.replacements.iter().map(|d| d.pod.as_str()).collect();
    assert_eq!((pods, plan.roll_outdated), (vec!["pod-r0b"], 3));
    // Only the primary (r0a after the fail-over) left: a Roll hand-over to an updated replica.
    let plan = decide(&rolling(&["r0a"]), &roll_policy());
    let a = &plan.actions[0];
    assert_eq!((a.kind, a.from.as_str()), (Kind::Roll, "r0a"));
    assert!(["p0", "r0b"].contains(&a.to.as_str()), "{a:?}");
    // A shard whose deleted pod has not come back takes no step, and other shards wait for it.
    let mut w = rolling(&["p0", "r0a", "r0b"]);
    w.replacing.insert("s0".into());
    let plan = decide(&w, &roll_policy());
    assert!(
        plan.replacements.is_empty() && plan.roll_waiting.is_none(),
        "{plan:?}"
    );
    // A pod of unknown revision stops it.
    let mut w = rolling(&["r0b"]);
    find(&mut w, "p1").pod.as_mut().unwrap().updated = None;
    let plan = decide(&w, &roll_policy());
    assert!(plan.replacements.is_empty());
    assert!(plan.roll_waiting.unwrap().contains("pod-p1"));
}

#[test]
fn the_rollout_condition_says_whether_the_roll_is_done_under_way_or_waiting() {
    use valkey_sidecar_core::status::{ROLLED, conditions};
    let reason = |w: &World| {
        let plan = decide(w, &roll_policy());
        let all = conditions(w, &roll_policy(), &plan);
        all.into_iter()
            .find(|c| c.type_ == ROLLED)
            .map(|c| (c.status, c.reason))
    };
    assert_eq!(reason(&rolling(&[])), Some((true, "UpToDate")));
    assert_eq!(reason(&rolling(&["r0b"])), Some((false, "Rolling")));
    let mut w = rolling(&["r0b"]);
    find(&mut w, "r1a").pod.as_mut().unwrap().ready = false;
    assert_eq!(reason(&w), Some((false, "RollWaiting")));
    // Without the roll there is no such condition.
    let plan = decide(&w, &Policy::default());
    assert!(
        conditions(&w, &Policy::default(), &plan)
            .iter()
            .all(|c| c.type_ != ROLLED)
    );
}

// ------------------------------------------------------------------------------------------
// Pause and switchover (`valkey-sidecar pause | switchover`).
// ------------------------------------------------------------------------------------------

/// A switchover of s0 (pods pod-p0, pod-r0a, pod-r0b).
fn asked(to: Option<&str>) -> Ask {
    Ask {
        id: "r1".into(),
        shard: "0".into(),
        pods: ["pod-p0", "pod-r0a", "pod-r0b"].map(String::from).into(),
        to: to.map(Into::into),
    }
}

#[test]
fn a_switchover_goes_to_the_named_replica_or_the_best_one() {
    let mut w = world();
    find(&mut w, "r0b").offset = 1001;
    w.switchover = Some(asked(None));
    let plan = decide(&w, &Policy::default());
    let a = &plan.actions[0];
    assert_eq!(
        (a.kind, a.shard.as_str(), a.from.as_str(), a.to.as_str()),
        (Kind::Switchover, "s0", "p0", "r0b")
    );
    w.switchover = Some(asked(Some("pod-r0a")));
    let plan = decide(&w, &Policy::default());
    assert_eq!(plan.actions[0].to, "r0a");
    assert_eq!(plan.refused, None);
}

#[test]
fn a_switchover_that_could_lose_writes_is_refused_with_its_reason() {
    type Change = fn(&mut World);
    let cases: [(&str, Change, &str); 5] = [
        (
            "pod-r0a",
            |w| find(w, "r0a").pod.as_mut().unwrap().ready = false,
            "not a synced replica",
        ),
        (
            "pod-r0a",
            |w| w.nodes.get_mut("n4").unwrap().unschedulable = true,
            "usable node",
        ),
        ("pod-p0", |_| {}, "the primary of shard 0 already"),
        ("pod-r1a", |_| {}, "not a member of shard 0"),
        (
            "pod-r0a",
            |w| find(w, "p0").health = NodeHealth::Failed,
            "no live primary",
        ),
    ];
    for (to, change, why) in cases {
        let mut w = world();
        change(&mut w);
        w.switchover = Some(asked(Some(to)));
        let plan = decide(&w, &Policy::default());
        assert!(
            plan.actions.iter().all(|a| a.kind != Kind::Switchover),
            "{to}: {plan:?}"
        );
        let (id, reason) = plan.refused.expect(why);
        assert_eq!(id, "r1");
        assert!(reason.contains(why), "{reason} lacks {why}");
    }
    let mut w = world();
    for r in ["r0a", "r0b"] {
        find(&mut w, r).pod.as_mut().unwrap().ready = false;
    }
    w.switchover = Some(asked(None));
    let reason = decide(&w, &Policy::default()).refused.unwrap().1;
    assert!(reason.contains("no synced replica"), "{reason}");
}

#[test]
fn a_switchover_waits_while_its_shard_is_busy_and_ignores_the_budget() {
    let mut w = world();
    w.switchover = Some(asked(None));
    w.in_flight = vec![InFlight {
        shard: "s0".into(),
        started: w.now,
    }];
    let plan = decide(&w, &Policy::default());
    assert!(
        plan.actions.is_empty() && plan.refused.is_none(),
        "{plan:?}"
    );
    w.in_flight[0].shard = "s1".into();
    let plan = decide(&w, &Policy::default());
    assert_eq!(plan.actions.len(), 1, "beyond max_concurrent 1: {plan:?}");
    assert_eq!(plan.actions[0].kind, Kind::Switchover);
}

#[test]
fn paused_only_going_away_and_asked_for_moves_are_made() {
    let policy = Policy {
        failback: true,
        ..Policy::default()
    };
    let mut w = drifted();
    w.paused = true;
    w.nodes.get_mut("n1").unwrap().unschedulable = true;
    assert!(
        decide(&w, &policy).actions.is_empty(),
        "no fail-back, no cordon hand-over"
    );
    w.paused = false;
    let kinds: Vec<Kind> = decide(&w, &policy).actions.iter().map(|a| a.kind).collect();
    assert_eq!(kinds, [Kind::Handover], "unpaused, the cordon counts");
    w.paused = true;
    find(&mut w, "p1").pod.as_mut().unwrap().terminating = true;
    w.switchover = Some(asked(Some("pod-r0b")));
    let plan = decide(&w, &policy);
    let kinds: Vec<Kind> = plan.actions.iter().map(|a| a.kind).collect();
    assert_eq!(kinds, [Kind::Handover, Kind::Switchover], "{plan:?}");
}

#[test]
fn while_the_operator_is_busy_no_fail_back_or_balance() {
    let policy = Policy {
        failback: true,
        ..Policy::default()
    };
    let mut w = drifted();
    assert_eq!(decide(&w, &policy).actions[0].kind, Kind::FailBack);
    w.operator_busy = true;
    assert!(decide(&w, &policy).actions.is_empty());
    find(&mut w, "p1").pod.as_mut().unwrap().terminating = true;
    assert_eq!(decide(&w, &policy).actions[0].kind, Kind::Handover);
}

// Member::replicated: a replication-mode pod as the planner sees it.

fn valkey(role: Role, offset: u64, link_up: bool) -> MemberValkey {
    MemberValkey {
        role,
        offset,
        link_up,
        fresh: false,
        keys: offset,
    }
}

fn pod(name: &str, node: &str) -> PodInfo {
    PodInfo {
        name: name.into(),
        node: Some(node.into()),
        ..PodInfo::default()
    }
}

#[test]
fn only_the_recorded_primary_is_a_primary_for_the_planner() {
    let v = valkey(Role::Primary, 90, false);
    let m = Member::replicated("0", pod("v-0-0", "n1"), Some(&v), true);
    assert_eq!((m.id.as_str(), m.shard.as_str()), ("v-0-0", "0"));
    assert_eq!(
        (m.role, m.offset, m.health),
        (Role::Primary, 90, NodeHealth::Online)
    );
    let stray = Member::replicated("0", pod("v-0-2", "n1"), Some(&v), false);
    assert_eq!(
        (stray.role, stray.health),
        (Role::Unknown, NodeHealth::Unknown),
        "a master the record does not name (or no record): no primary to move"
    );
}

#[test]
fn a_replica_is_online_for_the_planner_only_with_its_link_up() {
    let up = Member::replicated(
        "0",
        pod("v-0-1", "n2"),
        Some(&valkey(Role::Replica, 80, true)),
        false,
    );
    assert_eq!((up.role, up.health), (Role::Replica, NodeHealth::Online));
    let down = Member::replicated(
        "0",
        pod("v-0-1", "n2"),
        Some(&valkey(Role::Replica, 80, false)),
        false,
    );
    assert_eq!(down.health, NodeHealth::Unknown);
    let silent = Member::replicated("0", pod("v-0-1", "n2"), None, false);
    assert_eq!(
        (silent.role, silent.health),
        (Role::Unknown, NodeHealth::Unknown)
    );
    assert_eq!(silent.pod.map(|i| i.node), Some(Some("n2".to_owned())));
}
