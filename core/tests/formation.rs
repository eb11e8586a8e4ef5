//! Cluster formation: a table of situations and what `formation::decide` does about them, and a
//! property: slots are assigned only when no node anywhere owns any.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proptest::prelude::*;
use valkey_sidecar_core::formation::{
    AUDIT, ClusterNode, FormationView, Glance, Listing, LocalMap, MAX_PAIR_MEETS, PERIOD_MS, Pool,
    RECHECK_MS, SLOTS, Seat, Step, audited, batches, decide, incomplete, round_due,
};
use valkey_sidecar_core::observation::Role;
use valkey_sidecar_core::shards::{NodeHealth, Shard, ShardNode};
use valkey_sidecar_core::time::Millis;

/// `v-<shard>-<index>` at 10.0.<shard>.<index>, a fresh node `n<shard><index>` knowing itself.
fn seat(shard: u32, index: u32) -> Seat {
    let id = format!("n{shard}{index}");
    let ip = format!("10.0.{shard}.{index}");
    Seat {
        pod: format!("v-{shard}-{index}"),
        shard: Some(shard),
        index: Some(index),
        addr: Some((ip.clone(), 6379)),
        node: Some(ClusterNode {
            id: id.clone(),
            role: Role::Primary,
            owns_slots: false,
            primary: None,
            knows: Arc::new(BTreeSet::from([id.clone()])),
            failed: BTreeSet::new(),
            addrs: Arc::new(BTreeMap::from([(id, ip)]).into()),
        }),
    }
}

fn deployment(shards: u32, replicas: u32) -> FormationView {
    FormationView {
        shards,
        seats: (0..shards)
            .flat_map(|s| (0..=replicas).map(move |i| seat(s, i)))
            .collect(),
    }
}

/// Node id → its pod's address now.
fn current_addrs(v: &FormationView) -> BTreeMap<String, String> {
    let id = |s: &Seat| s.node.as_ref().unwrap().id.clone();
    v.seats
        .iter()
        .map(|s| (id(s), s.addr.clone().unwrap().0))
        .collect()
}

/// Everyone knows everyone; node-index 0 pods own slots, the others replicate them.
fn formed(shards: u32, replicas: u32) -> FormationView {
    let mut v = deployment(shards, replicas);
    let addrs = current_addrs(&v);
    let all: BTreeSet<String> = addrs.keys().cloned().collect();
    for s in &mut v.seats {
        let primary = format!("n{}0", s.shard.unwrap());
        let n = s.node.as_mut().unwrap();
        n.knows = Arc::new(all.clone());
        n.addrs = Arc::new(addrs.clone().into());
        if s.index == Some(0) {
            n.owns_slots = true;
        } else {
            n.role = Role::Replica;
            n.primary = Some(primary);
        }
    }
    v
}

fn node<'a>(v: &'a mut FormationView, pod: &str) -> &'a mut ClusterNode {
    let s = v.seats.iter_mut().find(|s| s.pod == pod).unwrap();
    s.node.as_mut().unwrap()
}

#[test]
fn a_fresh_3x2_deployment_gets_epochs_even_slots_and_one_meeting_point() {
    let f = decide(&deployment(3, 1));
    let epochs: Vec<u32> = f
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::SetEpoch { epoch, .. } => Some(*epoch),
            _ => None,
        })
        .collect();
    assert_eq!(epochs, vec![1, 2, 3, 4, 5, 6], "distinct epochs: {f:?}");
    let slots: Vec<(String, u32, u32)> = f
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::AssignSlots { pod, from, to } => Some((pod.clone(), *from, *to)),
            _ => None,
        })
        .collect();
    assert_eq!(
        slots,
        vec![
            ("v-0-0".into(), 0, 5460),
            ("v-1-0".into(), 5461, 10921),
            ("v-2-0".into(), 10922, SLOTS - 1)
        ]
    );
    let meets: Vec<(String, String)> = f
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Meet { pod, ip, .. } => Some((pod.clone(), ip.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(meets.len(), 5, "everyone else meets the first primary");
    assert!(meets.iter().all(|(via, _)| via == "v-0-0"));
    assert!(!f.steps.iter().any(|s| matches!(s, Step::Replicate { .. })));
}

#[test]
fn every_step_says_why_naming_the_pod_it_goes_to() {
    let mut steps = decide(&deployment(3, 1)).steps;
    steps.extend(decide(&restarted(formed(3, 1))).steps);
    steps.push(Step::Replicate {
        pod: "v-0-1".into(),
        primary: "n00".into(),
    });
    steps.push(Step::Forget {
        pod: "v-0-1".into(),
        id: "gone".into(),
    });
    steps.extend(decide(&remembering_a_dead_cluster()).steps);
    let kinds: BTreeSet<&str> = steps.iter().map(Step::kind).collect();
    assert_eq!(kinds.len(), 6, "every kind of step: {kinds:?}");
    for step in &steps {
        let pod = match step {
            Step::SetEpoch { pod, .. }
            | Step::AssignSlots { pod, .. }
            | Step::Meet { pod, .. }
            | Step::Replicate { pod, .. }
            | Step::Forget { pod, .. }
            | Step::Reset { pod } => pod,
        };
        assert!(
            step.reason().starts_with(pod.as_str()),
            "{step:?}: {}",
            step.reason()
        );
    }
}

#[test]
fn waits_rather_than_forming_from_a_partial_view() {
    let mut missing_primary = deployment(3, 1);
    missing_primary.seats.retain(|s| s.pod != "v-2-0");
    let f = decide(&missing_primary);
    assert!(f.steps.is_empty());
    assert!(
        f.reason.contains("shard 2 has no node-index 0 pod"),
        "{f:?}"
    );

    let mut silent = deployment(3, 1);
    silent.seats[3].node = None;
    let f = decide(&silent);
    assert!(f.steps.is_empty() && f.reason.contains("v-1-1"), "{f:?}");
    // A silent pod is worth another round: its view is unseen.
    assert!(f.silent, "{f:?}");
    assert!(!decide(&missing_primary).silent);

    let mut unlabelled = deployment(1, 1);
    unlabelled.seats[1].index = None;
    let f = decide(&unlabelled);
    assert!(
        f.steps.is_empty() && f.reason.contains("no shard-index"),
        "{f:?}"
    );

    let none = FormationView {
        shards: 0,
        ..deployment(1, 0)
    };
    assert!(decide(&none).steps.is_empty());
}

/// `pod` is a master without slots: met, not yet attached.
fn slotless(v: &mut FormationView, pod: &str) {
    let n = node(v, pod);
    n.role = Role::Primary;
    n.primary = None;
}

fn replicate(pod: &str, primary: &str) -> Step {
    Step::Replicate {
        pod: pod.into(),
        primary: primary.into(),
    }
}

/// Every pod deleted at once without persistence, each primary's preStop too short for a
/// hand-over: two replacements were met into the old cluster before its last slot owners went
/// away; they remember it (its nodes failing, still listed with their slots), the others are
/// alone. Every pod is an empty master.
fn remembering_a_dead_cluster() -> FormationView {
    let mut v = deployment(3, 1);
    let dead = ["old0", "old1", "old2"];
    for pod in ["v-0-1", "v-1-0"] {
        let n = node(&mut v, pod);
        let mut knows: BTreeSet<String> = (*n.knows).clone();
        knows.extend(dead.iter().map(|d| (*d).to_owned()));
        knows.extend(["n01".to_owned(), "n10".to_owned()]);
        n.knows = Arc::new(knows);
    }
    v
}

#[test]
fn empty_masters_that_remember_a_cluster_no_pod_serves_are_reset_then_formed_afresh() {
    let v = remembering_a_dead_cluster();
    let f = decide(&v);
    let resets: Vec<&Step> = f.steps.iter().collect();
    assert_eq!(
        resets,
        [
            &Step::Reset {
                pod: "v-0-1".into()
            },
            &Step::Reset {
                pod: "v-1-0".into()
            }
        ],
        "{f:?}"
    );
    assert!(
        f.reason.contains("resetting 2 empty master(s)"),
        "{}",
        f.reason
    );
    // Once reset they are alone again, like every other pod: a fresh cluster.
    let after = decide(&deployment(3, 1));
    assert!(
        after
            .steps
            .iter()
            .any(|s| matches!(s, Step::AssignSlots { .. }))
    );
    // Not while any pod serves slots (that cluster is alive: the nodes are grown into it) …
    let mut alive = remembering_a_dead_cluster();
    node(&mut alive, "v-0-0").owns_slots = true;
    assert!(
        !decide(&alive)
            .steps
            .iter()
            .any(|s| matches!(s, Step::Reset { .. }))
    );
    // … nor while a pod is a replica: of a primary gone for good, it may hold the only copy of
    // its shard's data.
    let mut replica = remembering_a_dead_cluster();
    node(&mut replica, "v-0-1").role = Role::Replica;
    let f = decide(&replica);
    assert!(f.steps.is_empty(), "{f:?}");
    assert!(f.reason.contains("not resetting"), "{}", f.reason);
    // … nor while a pod is silent.
    let mut silent = remembering_a_dead_cluster();
    silent.seats[5].node = None;
    assert!(decide(&silent).steps.is_empty());
}

#[test]
fn met_nodes_become_replicas_of_their_shards_primary_once_they_know_it() {
    let mut v = formed(2, 1);
    // v-1-1 has met the others but is still a slot-less master.
    slotless(&mut v, "v-1-1");
    assert_eq!(decide(&v).steps, vec![replicate("v-1-1", "n10")]);
    // Not yet told about its primary by gossip: wait.
    Arc::make_mut(&mut node(&mut v, "v-1-1").knows).remove("n10");
    let f = decide(&v);
    assert!(f.steps.is_empty() && f.reason.contains("does not know its primary"));
}

#[test]
fn a_replaced_pod_that_came_back_empty_is_introduced_again() {
    let mut v = formed(2, 1);
    // v-0-1 was replaced: a new node id that knows only itself.
    let n = node(&mut v, "v-0-1");
    *n = ClusterNode {
        id: "fresh".into(),
        role: Role::Primary,
        owns_slots: false,
        primary: None,
        knows: Arc::new(BTreeSet::from(["fresh".into()])),
        failed: BTreeSet::new(),
        addrs: Arc::default(),
    };
    let f = decide(&v);
    assert_eq!(
        f.steps,
        vec![Step::Meet {
            pod: "v-0-0".into(),
            ip: "10.0.0.1".into(),
            port: 6379
        }]
    );
}

/// Every node knows `id` and marks it failed: a replaced pod's old identity.
fn every_node_lists_failed(v: &mut FormationView, id: &str) {
    for s in &mut v.seats {
        let n = s.node.as_mut().unwrap();
        Arc::make_mut(&mut n.knows).insert(id.into());
        n.failed.insert(id.into());
    }
}

#[test]
fn with_a_pod_silent_the_others_are_still_attached_but_nothing_is_forgotten() {
    let mut v = formed(3, 1);
    every_node_lists_failed(&mut v, "old");
    // v-1-1 came back empty and has met the cluster; v-2-1 is too busy to answer.
    slotless(&mut v, "v-1-1");
    v.seats.iter_mut().find(|s| s.pod == "v-2-1").unwrap().node = None;
    let f = decide(&v);
    assert_eq!(
        f.steps,
        vec![replicate("v-1-1", "n10")],
        "attached; \"old\" is not forgotten while v-2-1 may still list it"
    );
    assert!(f.silent && f.reason.contains("v-2-1"), "{f:?}");
    // Once it answers, the forgets follow the attachment.
    let mut answered = v.clone();
    answered.seats[5] = formed(3, 1).seats[5].clone();
    assert_eq!(answered.seats[5].pod, "v-2-1");
    let f = decide(&answered);
    assert!(matches!(f.steps[0], Step::Replicate { .. }), "{f:?}");
    assert!(
        f.steps[1..]
            .iter()
            .all(|s| matches!(s, Step::Forget { .. }))
    );
    assert_eq!(f.steps.len(), 6, "5 pods list \"old\": {f:?}");
    // A fresh deployment still waits for every pod.
    let mut fresh = deployment(3, 1);
    fresh.seats[5].node = None;
    assert!(decide(&fresh).steps.is_empty());
}

#[test]
fn a_round_is_sent_in_batches_of_one_kind_and_only_meets_and_forgets_may_wait() {
    let v = deployment(3, 1);
    let f = decide(&v);
    let kinds: Vec<(&str, usize, bool)> = batches(&f.steps)
        .map(|b| (b[0].kind(), b.len(), b[0].deferrable()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("set_config_epoch", 6, false),
            ("addslots", 3, false),
            ("meet", 5, true)
        ]
    );
    assert!(batches(&[]).next().is_none());
}

#[test]
fn a_replaced_pods_old_identity_is_forgotten_everywhere_but_a_live_failed_node_is_not() {
    let mut v = formed(2, 1);
    every_node_lists_failed(&mut v, "old");
    // n11 is marked failed by one node (a partition) but is a current pod: never forgotten.
    node(&mut v, "v-0-0").failed.insert("n11".into());
    let f = decide(&v);
    let forgets: Vec<(String, String)> = f
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Forget { pod, id } => Some((pod.clone(), id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(forgets.len(), 4, "{f:?}");
    assert!(forgets.iter().all(|(_, id)| id == "old"));
}

/// Forgets of `id` in `f`.
fn forgets_of(f: &valkey_sidecar_core::formation::Formation, id: &str) -> usize {
    let of = |s: &&Step| matches!(s, Step::Forget { id: x, .. } if x == id);
    f.steps.iter().filter(of).count()
}

#[test]
fn a_dead_primary_its_replica_still_follows_is_not_forgotten_whoever_lists_it_as_forgettable() {
    // Shard 0's primary n00 died without a hand-over; its pod came back empty as x00 and met the
    // cluster after n00 was gone: x00 never heard n00 claim its slots, so its own view lists n00
    // as a failed, slot-less node to forget. n01 still follows n00 and waits for its election.
    let mut v = formed(2, 1);
    let all: BTreeSet<String> = node(&mut v, "v-1-0").knows.iter().cloned().collect();
    let newcomer = node(&mut v, "v-0-0");
    newcomer.id = "x00".into();
    newcomer.owns_slots = false;
    newcomer.knows = Arc::new(all.into_iter().chain(["x00".to_owned()]).collect());
    newcomer.failed = BTreeSet::from(["n00".to_owned()]);
    assert_eq!(forgets_of(&decide(&v), "n00"), 0, "{:?}", decide(&v));
    // Once n01 took over, nobody follows n00: it is forgotten on every node that knows it.
    let replica = node(&mut v, "v-0-1");
    (replica.role, replica.owns_slots, replica.primary) = (Role::Primary, true, None);
    assert_eq!(forgets_of(&decide(&v), "n00"), 4, "{:?}", decide(&v));
}

#[test]
fn after_a_failover_the_shard_is_found_by_its_slots_not_its_node_index() {
    let mut v = formed(1, 2);
    // v-0-1 took over: it owns the slots; v-0-0 came back empty and has met the cluster.
    node(&mut v, "v-0-1").owns_slots = true;
    node(&mut v, "v-0-1").role = Role::Primary;
    let old = node(&mut v, "v-0-0");
    old.owns_slots = false;
    let f = decide(&v);
    assert_eq!(
        f.steps,
        vec![Step::Replicate {
            pod: "v-0-0".into(),
            primary: "n01".into()
        }]
    );
}

#[test]
fn a_formed_cluster_needs_nothing_and_a_new_shard_is_not_resharded_into_it() {
    let f = decide(&formed(3, 1));
    assert!(
        f.steps.is_empty() && f.reason.starts_with("formed"),
        "{f:?}"
    );
    let mut grown = formed(2, 1);
    grown.shards = 3;
    let mut extra = seat(2, 0);
    let all = grown.seats[0].node.as_ref().unwrap().knows.clone();
    extra.node.as_mut().unwrap().knows = all;
    grown.seats.push(extra);
    let f = decide(&grown);
    assert!(f.steps.is_empty(), "{f:?}");
    assert!(f.reason.contains("resharding) is not automatic"), "{f:?}");
}

/// Every pod of `v` moved to a new IP (10.1.x.y) while every node still lists the old ones.
fn restarted(mut v: FormationView) -> FormationView {
    for s in &mut v.seats {
        let (ip, port) = s.addr.clone().unwrap();
        s.addr = Some((ip.replacen("10.0.", "10.1.", 1), port));
    }
    v
}

fn meets(steps: &[Step]) -> Vec<(String, String)> {
    steps
        .iter()
        .map(|s| match s {
            Step::Meet { pod, ip, .. } => (pod.clone(), ip.clone()),
            other => panic!("only introductions expected: {other:?}"),
        })
        .collect()
}

#[test]
fn after_a_full_restart_every_node_is_met_again_at_its_new_address() {
    let f = decide(&restarted(formed(3, 1)));
    let meets = meets(&f.steps);
    // The anchor (the first node with slots) meets every other node at its new address ...
    let from_anchor: Vec<&str> = meets
        .iter()
        .filter(|(pod, _)| pod == "v-0-0")
        .map(|(_, ip)| ip.as_str())
        .collect();
    assert_eq!(
        from_anchor,
        ["10.1.0.1", "10.1.1.0", "10.1.1.1", "10.1.2.0", "10.1.2.1"],
        "{f:?}"
    );
    // ... another node meets the anchor (which lists itself at its old address too), and every
    // other node meets the non-anchor peers it still lists at old addresses.
    assert!(
        meets.contains(&("v-0-1".into(), "10.1.0.0".into())),
        "{f:?}"
    );
    assert_eq!(meets.len(), 5 + 1 + 5 * 4, "{f:?}");
    assert!(meets.iter().all(|(_, ip)| ip.starts_with("10.1.")), "{f:?}");
    assert!(f.reason.contains("new addresses"), "{f:?}");
}

#[test]
fn a_node_that_lists_only_itself_at_an_old_address_is_met_by_the_anchor_or_the_anchor_by_another() {
    let mut v = restarted(formed(2, 1));
    let current = current_addrs(&v);
    for s in &mut v.seats {
        s.node.as_mut().unwrap().addrs = Arc::new(current.clone().into());
    }
    // Everybody else has learned n11's new address, but n11 still names itself by the old one
    // (Valkey learns its own address only from a MEET it receives).
    Arc::make_mut(&mut node(&mut v, "v-1-1").addrs).insert("n11".into(), "10.0.1.1".into());
    assert_eq!(
        meets(&decide(&v).steps),
        [("v-0-0".into(), "10.1.1.1".into())]
    );
    Arc::make_mut(&mut node(&mut v, "v-1-1").addrs).insert("n11".into(), "10.1.1.1".into());
    // The anchor itself is met by another node.
    Arc::make_mut(&mut node(&mut v, "v-0-0").addrs).insert("n00".into(), "10.0.0.0".into());
    assert_eq!(
        meets(&decide(&v).steps),
        [("v-0-1".into(), "10.1.0.0".into())]
    );
    Arc::make_mut(&mut node(&mut v, "v-0-0").addrs).insert("n00".into(), "10.1.0.0".into());
    let f = decide(&v);
    assert!(
        f.steps.is_empty() && f.reason.starts_with("formed"),
        "{f:?}"
    );
}

#[test]
fn introductions_between_other_nodes_are_capped_per_round() {
    let f = decide(&restarted(formed(30, 1)));
    let meets = meets(&f.steps);
    let from_anchor = meets.iter().filter(|(pod, _)| pod == "v-0-0").count();
    assert_eq!(from_anchor, 59, "the anchor meets all 59 others");
    assert_eq!(
        meets.len() - from_anchor - 1,
        MAX_PAIR_MEETS,
        "one more meets the anchor"
    );
}

/// Where a node lists the ids it knows: node `nSI` at 10.0.S.I, or at an old 10.9.S.I.
fn shard_of(slots: Vec<(u16, u16)>, nodes: &[(&str, Role, NodeHealth)]) -> Shard {
    Shard {
        id: "s".into(),
        slots,
        nodes: nodes
            .iter()
            .map(|(ip, role, health)| ShardNode {
                id: format!("n-{ip}"),
                ip: (*ip).into(),
                role: *role,
                health: *health,
                ..ShardNode::default()
            })
            .collect(),
    }
}

#[test]
fn the_local_view_is_incomplete_with_a_pod_it_does_not_know_a_slotless_master_or_a_failed_node() {
    let whole = [shard_of(
        vec![(0, 16383)],
        &[
            ("10.0.0.1", Role::Primary, NodeHealth::Online),
            ("10.0.0.2", Role::Replica, NodeHealth::Online),
        ],
    )];
    assert!(!incomplete(&whole, ["10.0.0.1", "10.0.0.2"]));
    assert!(
        incomplete(&whole, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        "a new pod"
    );
    let slotless = [shard_of(
        Vec::new(),
        &[("10.0.0.1", Role::Primary, NodeHealth::Online)],
    )];
    assert!(
        incomplete(&slotless, ["10.0.0.1"]),
        "a master without slots"
    );
    let failed = [shard_of(
        vec![(0, 16383)],
        &[
            ("10.0.0.1", Role::Primary, NodeHealth::Online),
            ("10.0.0.9", Role::Replica, NodeHealth::Failed),
        ],
    )];
    assert!(
        incomplete(&failed, ["10.0.0.1"]),
        "an old identity to forget"
    );
}

#[test]
fn a_formation_round_runs_at_most_every_period_and_at_least_every_recheck() {
    let last = Some(Millis(10_000));
    assert!(round_due(None, false, false, Millis(0)), "the first round");
    assert!(
        !round_due(last, true, true, Millis(10_000 + PERIOD_MS - 1)),
        "paced"
    );
    assert!(
        round_due(last, true, false, Millis(10_000 + PERIOD_MS)),
        "incomplete"
    );
    assert!(
        round_due(last, false, true, Millis(10_000 + PERIOD_MS)),
        "the last round sent steps"
    );
    assert!(
        !round_due(last, false, false, Millis(10_000 + RECHECK_MS - 1)),
        "whole: waits"
    );
    assert!(
        round_due(last, false, false, Millis(10_000 + RECHECK_MS)),
        "a round anyway"
    );
}

fn listed(knows: &BTreeSet<String>, me: &str, stale: bool) -> Listing {
    let net = if stale { "10.9" } else { "10.0" };
    let ip = |id: &str| format!("{net}.{}.{}", &id[1..2], &id[2..3]);
    knows
        .iter()
        .map(String::as_str)
        .chain([me])
        .map(|id| (id.to_owned(), ip(id)))
        .collect()
}

fn any_view() -> impl Strategy<Value = FormationView> {
    let node = (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        proptest::collection::btree_set("n[0-2][0-2]", 0..6),
        any::<bool>(),
    );
    // Keyed by (shard, index): pod names are unique.
    let nodes = proptest::collection::btree_map((0u32..3, 0u32..3), node, 0..9);
    (1u32..4, nodes).prop_map(|(shards, nodes)| FormationView {
        shards,
        seats: nodes
            .into_iter()
            .map(|((s, i), (answers, owns, replica, knows, stale))| {
                let mut seat = seat(s, i);
                let id = seat.node.as_ref().unwrap().id.clone();
                seat.node = answers.then(|| ClusterNode {
                    id: id.clone(),
                    role: if replica {
                        Role::Replica
                    } else {
                        Role::Primary
                    },
                    owns_slots: owns && !replica,
                    primary: None,
                    addrs: Arc::new(listed(&knows, &id, stale)),
                    knows: Arc::new(knows.into_iter().chain([id]).collect()),
                    failed: BTreeSet::new(),
                });
                seat
            })
            .collect(),
    })
}

proptest! {
    #[test]
    fn slots_are_assigned_only_when_no_node_owns_any(v in any_view()) {
        let f = decide(&v);
        let assigns = f.steps.iter().any(|s| matches!(s, Step::AssignSlots { .. }));
        let owned = v.seats.iter().filter_map(|s| s.node.as_ref()).any(|n| n.owns_slots);
        prop_assert!(!(assigns && owned), "slots assigned over an existing cluster: {f:?}");
        // Never replicate a node that owns slots, never touch a silent pod.
        for step in &f.steps {
            let pod = match step {
                Step::SetEpoch { pod, .. } | Step::AssignSlots { pod, .. }
                | Step::Meet { pod, .. } | Step::Replicate { pod, .. }
                | Step::Forget { pod, .. } | Step::Reset { pod } => pod,
            };
            let seat = v.seats.iter().find(|s| &s.pod == pod).unwrap();
            prop_assert!(seat.node.is_some(), "a step for a silent pod: {step:?}");
            // A reset only while every pod answers, none serves slots and none is a replica
            // (one may hold the only copy of a shard's data).
            if let Step::Reset { .. } = step {
                let nodes: Vec<&ClusterNode> = v.seats.iter().filter_map(|s| s.node.as_ref()).collect();
                prop_assert_eq!(nodes.len(), v.seats.len(), "a reset with a pod silent");
                prop_assert!(nodes.iter().all(|n| n.role == Role::Primary && !n.owns_slots), "{:?}", f);
            }
            if let Step::Replicate { .. } = step {
                prop_assert!(!seat.node.as_ref().unwrap().owns_slots);
            }
            // Introductions only ever name a pod's current address.
            if let Step::Meet { ip, port, .. } = step {
                let to = Some((ip.clone(), *port));
                prop_assert!(v.seats.iter().any(|s| s.addr == to), "{step:?}");
            }
        }
    }
}

#[test]
fn equal_listings_are_kept_once_and_decide_the_same() {
    let separate = formed(3, 1);
    let mut shared = separate.clone();
    // One node lists n00 at an old address: its listing is its own.
    Arc::make_mut(&mut node(&mut shared, "v-2-1").addrs).insert("n00".into(), "10.9.0.0".into());
    let mut pool = Pool::default();
    for s in &mut shared.seats {
        pool.share(s.node.as_mut().unwrap());
    }
    let nodes: Vec<&ClusterNode> = shared
        .seats
        .iter()
        .map(|s| s.node.as_ref().unwrap())
        .collect();
    let first = nodes[0];
    for n in &nodes {
        assert!(
            Arc::ptr_eq(&n.knows, &first.knows),
            "{} knows the same",
            n.id
        );
        let same_addrs = Arc::ptr_eq(&n.addrs, &first.addrs);
        assert_eq!(
            same_addrs,
            n.id != "n21",
            "{} lists the same addresses",
            n.id
        );
    }
    let mut unshared = separate.clone();
    Arc::make_mut(&mut node(&mut unshared, "v-2-1").addrs).insert("n00".into(), "10.9.0.0".into());
    assert_eq!(decide(&shared), decide(&unshared));
}

/// The view's cluster as one node's `CLUSTER SHARDS` lists it: every node at its pod's address,
/// the slot owners' shards with slots.
fn local_shards(v: &FormationView) -> Vec<Shard> {
    let mut shards: BTreeMap<u32, Shard> = BTreeMap::new();
    for seat in &v.seats {
        let (index, n) = (seat.shard.unwrap(), seat.node.as_ref().unwrap());
        let shard = shards.entry(index).or_insert_with(|| Shard {
            id: format!("shard-{index}"),
            ..Shard::default()
        });
        if n.owns_slots {
            shard.slots.push((0, 100));
        }
        shard.nodes.push(ShardNode {
            id: n.id.clone(),
            ip: seat.addr.clone().unwrap().0,
            role: n.role,
            health: NodeHealth::Online,
            ..ShardNode::default()
        });
    }
    shards.into_values().collect()
}

/// What the pod's node answers to the short questions, its own view being `v`'s.
fn glance_of(v: &FormationView, pod: &str) -> Glance {
    let seat = v.seats.iter().find(|s| s.pod == pod).unwrap();
    let n = seat.node.as_ref().unwrap();
    let ip_of = |id: &String| {
        let s = v.seats.iter().find(|s| s.node.as_ref().unwrap().id == *id);
        s.unwrap().addr.clone().unwrap().0
    };
    Glance {
        id: n.id.clone(),
        shard_id: Some(format!("shard-{}", seat.shard.unwrap())),
        role: n.role,
        primary_ip: n.primary.as_ref().map(ip_of),
        known_nodes: n.knows.len(),
    }
}

fn ip(v: &FormationView, pod: &str) -> String {
    let seat = v.seats.iter().find(|s| s.pod == pod).unwrap();
    seat.addr.clone().unwrap().0
}

#[test]
fn a_node_whose_short_answers_agree_is_vouched_for_as_its_own_map_shows_it() {
    let v = formed(3, 1);
    let local = LocalMap::new(&local_shards(&v));
    for seat in &v.seats {
        let vouched = local.vouch(&glance_of(&v, &seat.pod), &ip(&v, &seat.pod));
        assert_eq!(vouched.as_ref(), seat.node.as_ref(), "{}", seat.pod);
    }
    // Older Valkeys have no CLUSTER MYSHARDID: the rest still vouches.
    let mut without_shard_id = glance_of(&v, "v-1-1");
    without_shard_id.shard_id = None;
    assert!(local.vouch(&without_shard_id, "10.0.1.1").is_some());
}

#[test]
fn a_node_whose_short_answers_disagree_is_read_in_full() {
    let v = formed(3, 1);
    let local = LocalMap::new(&local_shards(&v));
    let replica = || glance_of(&v, "v-1-1");
    let cases: Vec<(&str, Glance, &str)> = vec![
        (
            "knows a node fewer",
            Glance {
                known_nodes: 5,
                ..replica()
            },
            "10.0.1.1",
        ),
        (
            "knows a node more",
            Glance {
                known_nodes: 7,
                ..replica()
            },
            "10.0.1.1",
        ),
        ("at another address than the map's", replica(), "10.0.1.9"),
        (
            "a primary by its own account",
            Glance {
                role: Role::Primary,
                ..replica()
            },
            "10.0.1.1",
        ),
        (
            "replicates from another primary",
            Glance {
                primary_ip: Some("10.0.2.0".into()),
                ..replica()
            },
            "10.0.1.1",
        ),
        (
            "in another shard",
            Glance {
                shard_id: Some("shard-2".into()),
                ..replica()
            },
            "10.0.1.1",
        ),
        (
            "an id the map does not know",
            Glance {
                id: "x11".into(),
                ..replica()
            },
            "10.0.1.1",
        ),
    ];
    for (what, glance, at) in cases {
        assert_eq!(local.vouch(&glance, at), None, "{what}");
    }
    // A node the map lists as failed is not vouched for, even where it answers alike.
    let mut shards = local_shards(&v);
    shards[1].nodes[1].health = NodeHealth::Failed;
    assert_eq!(LocalMap::new(&shards).vouch(&replica(), "10.0.1.1"), None);
}

#[test]
fn a_replaced_pod_decides_the_same_from_vouched_nodes_as_from_every_whole_map() {
    let old = formed(3, 1);
    // v-1-1 came back empty as x11; every other node lists its old identity n11 as failed.
    let mut whole = old.clone();
    for s in &mut whole.seats {
        let n = s.node.as_mut().unwrap();
        if s.pod == "v-1-1" {
            *n = ClusterNode {
                id: "x11".into(),
                role: Role::Primary,
                owns_slots: false,
                primary: None,
                knows: Arc::new(BTreeSet::from(["x11".to_owned()])),
                failed: BTreeSet::new(),
                addrs: Arc::new(BTreeMap::from([("x11".to_owned(), "10.0.1.1".to_owned())]).into()),
            };
        } else {
            n.failed = BTreeSet::from(["n11".to_owned()]);
        }
    }
    let mut shards = local_shards(&old);
    shards[1].nodes[1].health = NodeHealth::Failed;
    let local = LocalMap::new(&shards);
    let mut vouched = whole.clone();
    for s in &mut vouched.seats {
        if s.pod == "v-1-1" {
            continue; // not in the map: read in full, as `whole` has it
        }
        let by_map = local.vouch(&glance_of(&old, &s.pod), &ip(&old, &s.pod));
        s.node = Some(by_map.expect("agrees with the map"));
    }
    let f = decide(&vouched);
    assert_eq!(f, decide(&whole));
    let forgets = f
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Forget { id, .. } if id == "n11"));
    assert_eq!(forgets.count(), 5, "{f:?}");
    assert!(
        f.steps
            .iter()
            .any(|s| matches!(s, Step::Meet { ip, .. } if ip == "10.0.1.1"))
    );
}

proptest! {
    #[test]
    fn every_pod_is_read_in_full_in_turn_and_no_round_reads_more_than_audit(
        pods in 1usize..300,
        start in 0u64..1 << 40,
    ) {
        let turns = pods.div_ceil(AUDIT) as u64;
        let mut seen = vec![0; pods];
        for round in (0..turns).map(|k| start.wrapping_add(k)) {
            let read: Vec<usize> = (0..pods).filter(|&i| audited(i, pods, round)).collect();
            prop_assert!(!read.is_empty() && read.len() <= AUDIT, "round {round}: {read:?}");
            for i in read {
                seen[i] += 1;
            }
        }
        prop_assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    }
}
