//! The supervised rolling update: tables of single rounds, and a simulated roll with faults that
//! checks its safety rules (no primary deleted, nothing deleted while another copy is at risk, one
//! primary move per shard) and that it finishes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use valkey_sidecar_core::observation::Role;
use valkey_sidecar_core::roll::{RollPlan, RollPod, RollPolicy, RollShard, RollStep, decide};

const POLICY: RollPolicy = RollPolicy {
    max_shards_rolling: 1,
    pods_per_shard: 3,
};

fn pod(shard: &str, ordinal: u32, role: Role, updated: bool) -> RollPod {
    RollPod {
        name: format!("{shard}-{ordinal}"),
        id: format!("id-{shard}-{ordinal}"),
        ordinal,
        updated,
        role,
        healthy: true,
        offset: 100,
        preferred_zone: false,
        node_usable: true,
    }
}

/// A shard of pod 0 primary and pods 1, 2 replicas, `updated` per ordinal.
fn shard(name: &str, updated: [bool; 3]) -> RollShard {
    let roles = [Role::Primary, Role::Replica, Role::Replica];
    RollShard {
        name: name.into(),
        settled: true,
        pods: (0..3)
            .map(|i| pod(name, i as u32, roles[i], updated[i]))
            .collect(),
        busy: false,
    }
}

fn deleted(plan: &RollPlan) -> Vec<&str> {
    let pods = plan.steps.iter().filter_map(|s| match s {
        RollStep::Replace { pod, .. } => Some(pod.as_str()),
        RollStep::Handover { .. } => None,
    });
    pods.collect()
}

fn handed(plan: &RollPlan) -> Vec<(&str, &str)> {
    let moves = plan.steps.iter().filter_map(|s| match s {
        RollStep::Handover { from, to, .. } => Some((from.as_str(), to.as_str())),
        RollStep::Replace { .. } => None,
    });
    moves.collect()
}

#[test]
fn nothing_outdated_is_nothing_to_do() {
    let plan = decide(&[shard("a", [true; 3])], &[], &POLICY);
    assert_eq!(plan, RollPlan::default());
}

#[test]
fn replicas_go_first_highest_ordinal_one_shard_at_a_time() {
    let shards = [shard("a", [false; 3]), shard("b", [false; 3])];
    let plan = decide(&shards, &[], &POLICY);
    assert_eq!(deleted(&plan), ["a-2"]);
    assert_eq!(plan.outdated, 6);
    assert_eq!(plan.waiting, None);
}

#[test]
fn an_unhealthy_outdated_replica_goes_before_a_healthy_one() {
    let mut a = shard("a", [false; 3]);
    a.pods[1].healthy = false;
    assert_eq!(deleted(&decide(&[a], &[], &POLICY)), ["a-1"]);
}

#[test]
fn a_replica_waits_while_another_pod_of_its_shard_is_unhealthy() {
    let mut a = shard("a", [false, false, true]);
    a.pods[2].healthy = false; // the replacement of a-2, still syncing
    let plan = decide(&[a], &[], &POLICY);
    assert!(plan.steps.is_empty());
    assert!(plan.waiting.unwrap().contains("a-1 waits"));
}

#[test]
fn the_primary_goes_last_to_the_updated_replica_with_the_highest_offset() {
    let mut a = shard("a", [false, true, true]);
    a.pods[1].offset = 90;
    let plan = decide(std::slice::from_ref(&a), &[], &POLICY);
    assert_eq!(handed(&plan), [("id-a-0", "id-a-2")]);
    // Same offsets: the preferred zone, then the name.
    a.pods[1].offset = 100;
    a.pods[1].preferred_zone = true;
    assert_eq!(handed(&decide(&[a], &[], &POLICY)), [("id-a-0", "id-a-1")]);
}

#[test]
fn the_primary_waits_for_a_whole_shard_and_an_updated_successor() {
    let mut a = shard("a", [false, true, true]);
    a.pods[2].healthy = false;
    let plan = decide(&[a], &[], &POLICY);
    assert!(plan.steps.is_empty());
    assert!(plan.waiting.unwrap().contains("2 of 3"));
    let mut b = shard("b", [false, true, true]);
    b.pods[1].node_usable = false;
    b.pods[2].node_usable = false;
    let plan = decide(&[b], &[], &POLICY);
    assert!(plan.waiting.unwrap().contains("no updated replica"));
}

#[test]
fn the_roll_waits_while_any_other_shard_is_short() {
    let mut b = shard("b", [true; 3]);
    b.pods[1].healthy = false;
    let plan = decide(&[shard("a", [false; 3]), b], &[], &POLICY);
    assert!(plan.steps.is_empty());
    assert!(plan.waiting.unwrap().contains("shard b has 2 of 3"));
    // A shard without a live primary is short however many pods it has.
    let mut c = shard("c", [true; 3]);
    c.pods[0].role = Role::Unknown;
    let plan = decide(&[shard("a", [false; 3]), c], &[], &POLICY);
    assert!(plan.waiting.unwrap().contains("shard c"));
}

#[test]
fn a_shard_whose_view_shows_two_primaries_waits() {
    // After a hand-over the view may still show the old primary beside the new one.
    let mut a = shard("a", [false, true, true]);
    a.pods[2].role = Role::Primary;
    let plan = decide(&[a], &[], &POLICY);
    assert!(plan.steps.is_empty());
    assert!(plan.waiting.unwrap().contains("2 primaries"));
}

#[test]
fn a_shard_with_a_new_primary_waits_for_its_replicas_to_re_point() {
    let mut a = shard("a", [false, true, true]);
    a.pods[0].role = Role::Replica;
    a.pods[1].role = Role::Primary;
    a.settled = false;
    let plan = decide(std::slice::from_ref(&a), &[], &POLICY);
    assert!(plan.waiting.unwrap().contains("re-point first"));
    a.settled = true;
    assert_eq!(deleted(&decide(&[a], &[], &POLICY)), ["a-0"]);
}

#[test]
fn an_unknown_revision_stops_the_roll() {
    let plan = decide(&[shard("a", [false; 3])], &["a-1".into()], &POLICY);
    assert!(plan.steps.is_empty());
    assert!(plan.waiting.unwrap().contains("a-1"));
}

#[test]
fn a_busy_shard_takes_no_step_and_is_not_waiting() {
    let mut a = shard("a", [false; 3]);
    a.busy = true;
    let plan = decide(&[a], &[], &POLICY);
    assert_eq!(plan.steps, []);
    assert_eq!((plan.outdated, plan.waiting), (3, None));
}

#[test]
fn max_shards_rolling_lets_that_many_shards_step_at_once() {
    let shards = [
        shard("a", [false; 3]),
        shard("b", [false; 3]),
        shard("c", [false; 3]),
    ];
    let two = RollPolicy {
        max_shards_rolling: 2,
        ..POLICY
    };
    assert_eq!(deleted(&decide(&shards, &[], &two)), ["a-2", "b-2"]);
    // A rolling shard short of a pod does not hold the other rolling one.
    let mut a = shards[0].clone();
    a.pods[2].updated = true;
    a.pods[2].healthy = false;
    let shards = [a, shards[1].clone(), shards[2].clone()];
    assert_eq!(deleted(&decide(&shards, &[], &two)), ["b-2"]);
}

/// The simulated cluster: each round the roll's steps are applied; a deleted pod comes back
/// updated and unhealthy, and syncs one round later; `faults` make pods unhealthy for a round.
fn simulate(shards: usize, max: usize, faults: &[(usize, usize, usize)]) {
    let policy = RollPolicy {
        max_shards_rolling: max,
        pods_per_shard: 3,
    };
    let names: Vec<String> = (0..shards).map(|s| format!("s{s}")).collect();
    let mut world: Vec<RollShard> = names.iter().map(|n| shard(n, [false; 3])).collect();
    let mut moves = vec![0; shards];
    for round in 0..200 {
        // Pods re-created last round are in sync now, a new primary's replicas re-pointed; this
        // round's faults hit.
        for s in &mut world {
            s.settled = true;
            s.pods.iter_mut().for_each(|p| p.healthy = true);
        }
        for &(r, s, i) in faults {
            if r == round {
                world[s % shards].pods[i % 3].healthy = false;
            }
        }
        let plan = decide(&world, &[], &policy);
        if plan.outdated == 0 {
            assert!(
                moves.iter().all(|m| *m == 1),
                "one primary move per shard: {moves:?}"
            );
            return;
        }
        for step in &plan.steps {
            apply(&mut world, step, &policy, &mut moves);
        }
    }
    panic!("the roll did not finish in 200 rounds");
}

fn apply(world: &mut [RollShard], step: &RollStep, policy: &RollPolicy, moves: &mut [usize]) {
    let whole = |s: &RollShard| {
        let primary = s.pods.iter().any(|p| p.healthy && p.role == Role::Primary);
        primary && s.pods.iter().filter(|p| p.healthy).count() >= policy.pods_per_shard
    };
    let short = world.iter().filter(|s| !whole(s)).count();
    match step {
        RollStep::Replace { shard, pod, .. } => {
            let s = world.iter_mut().find(|s| &s.name == shard).unwrap();
            assert!(
                s.settled,
                "replaced {pod} right after its shard's hand-over"
            );
            let p = s.pods.iter_mut().find(|p| &p.name == pod).unwrap();
            assert_ne!(p.role, Role::Primary, "deleted the primary {pod}");
            let others = s
                .pods
                .iter()
                .filter(|q| &q.name != pod && q.healthy)
                .count();
            assert!(
                others >= 2,
                "deleted {pod} with {others} other healthy pods"
            );
            let p = s.pods.iter_mut().find(|p| &p.name == pod).unwrap();
            p.updated = true;
            p.healthy = false;
            assert!(short <= policy.max_shards_rolling, "{short} shards short");
        }
        RollStep::Handover {
            shard, from, to, ..
        } => {
            let i = world.iter().position(|s| &s.name == shard).unwrap();
            moves[i] += 1;
            world[i].settled = false;
            for p in &mut world[i].pods {
                if &p.id == from {
                    p.role = Role::Replica;
                } else if &p.id == to {
                    assert!(
                        p.updated && p.healthy,
                        "handed over to {to}, not updated and synced"
                    );
                    p.role = Role::Primary;
                }
            }
        }
    }
}

#[test]
fn a_roll_without_faults_finishes_in_order() {
    simulate(3, 1, &[]);
    simulate(3, 2, &[]);
}

proptest! {
    #[test]
    fn a_roll_under_faults_stays_safe_and_finishes(
        shards in 1usize..5,
        max in 1usize..3,
        faults in proptest::collection::vec((0usize..40, 0usize..5, 0usize..3), 0..30),
    ) {
        simulate(shards, max, &faults);
    }
}
