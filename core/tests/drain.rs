//! `drain-check`'s rules: a table of nodes and what draining them would do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use valkey_sidecar_core::drain::{DrainView, Eviction, ShardCopy, decide};
use valkey_sidecar_core::observation::Role;

fn copy(pod: &str, shard: &str, role: Role, node: &str) -> ShardCopy {
    ShardCopy {
        pod: pod.into(),
        shard: shard.into(),
        role: Some(role),
        ready: true,
        node: node.into(),
        usable_node: true,
    }
}

/// Shard 0: primary on n1, replicas on n2 and n3; shard 1: primary n2, replica n1.
fn view(node: &str) -> DrainView {
    let copies = vec![
        copy("v-0-0", "0", Role::Primary, "n1"),
        copy("v-0-1", "0", Role::Replica, "n2"),
        copy("v-0-2", "0", Role::Replica, "n3"),
        copy("v-1-0", "1", Role::Primary, "n2"),
        copy("v-1-1", "1", Role::Replica, "n1"),
    ];
    let evictions = copies
        .iter()
        .filter(|c| c.node == node)
        .map(|c| (c.pod.clone(), Eviction::Allowed))
        .collect();
    DrainView {
        node: node.into(),
        copies,
        evictions,
    }
}

fn find<'a>(v: &'a mut DrainView, pod: &str) -> &'a mut ShardCopy {
    v.copies.iter_mut().find(|c| c.pod == pod).unwrap()
}

#[test]
fn a_node_whose_primaries_have_synced_replicas_elsewhere_drains_now() {
    let verdict = decide(&view("n1"));
    assert!(verdict.now, "{verdict:?}");
    let primary = &verdict.pods[0];
    assert!(
        primary.reason.contains("hands over to v-0-1"),
        "{primary:?}"
    );
    assert!(verdict.pods[1].reason.contains("a replica"));
}

#[test]
fn what_would_stop_a_drain_is_named() {
    type Change = fn(&mut DrainView);
    let cases: Vec<(&str, Change, &str)> = vec![
        (
            "the budget refuses",
            |v| {
                v.evictions.insert(
                    "v-1-1".into(),
                    Eviction::Refused(
                        "Cannot evict pod as it would violate the pod's disruption budget.".into(),
                    ),
                );
            },
            "would be refused: Cannot evict pod",
        ),
        (
            "the replicas are syncing",
            |v| {
                find(v, "v-0-1").ready = false;
                find(v, "v-0-2").ready = false;
            },
            "no replica elsewhere is in sync",
        ),
        (
            "the only synced replica is on a cordoned node",
            |v| {
                find(v, "v-0-2").ready = false;
                find(v, "v-0-1").usable_node = false;
            },
            "no replica elsewhere is in sync on a usable node",
        ),
    ];
    for (what, change, want) in cases {
        let mut v = view("n1");
        change(&mut v);
        let verdict = decide(&v);
        assert!(!verdict.now, "{what}: {verdict:?}");
        assert!(
            verdict
                .pods
                .iter()
                .any(|p| !p.now && p.reason.contains(want)),
            "{what}: {verdict:?}"
        );
    }
}

#[test]
fn a_one_pod_shard_drains_and_says_what_goes_with_it() {
    let v = DrainView {
        node: "n1".into(),
        copies: vec![copy("tiny-0-0", "0", Role::Primary, "n1")],
        evictions: BTreeMap::from([("tiny-0-0".into(), Eviction::Allowed)]),
    };
    let verdict = decide(&v);
    assert!(verdict.now);
    assert!(verdict.pods[0].reason.contains("only pod"), "{verdict:?}");
}

#[test]
fn two_copies_of_a_shard_on_the_node_are_noted_and_the_primary_waits() {
    let mut v = view("n1");
    // Shard 0's only in-sync replica is on the node being drained too.
    find(&mut v, "v-0-1").node = "n1".into();
    find(&mut v, "v-0-2").ready = false;
    v.evictions.insert("v-0-1".into(), Eviction::Allowed);
    let verdict = decide(&v);
    assert!(!verdict.now, "{verdict:?}");
    assert!(
        verdict
            .notes
            .iter()
            .any(|n| n.contains("shard 0 has 2 copies on this node")),
        "{verdict:?}"
    );
}
