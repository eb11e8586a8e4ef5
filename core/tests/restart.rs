//! `restart`: its tables, through the module's public entry points (tests of private helpers stay in the module).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use valkey_sidecar_core::health::Verdict;
use valkey_sidecar_core::observation::ClusterView;
use valkey_sidecar_core::observation::{Observation, Role};
use valkey_sidecar_core::restart::*;
use valkey_sidecar_core::shards::{NodeHealth, Shard, ShardNode};

fn node(id: &str, role: Role, health: NodeHealth) -> ShardNode {
    ShardNode {
        id: id.into(),
        ip: "10.0.0.1".into(),
        port: 6379,
        role,
        health,
        ..ShardNode::default()
    }
}

fn shard(id: &str, slots: bool, nodes: Vec<ShardNode>) -> Shard {
    Shard {
        id: id.into(),
        slots: if slots { vec![(0, 100)] } else { vec![] },
        nodes,
    }
}

/// Three shards; `a` (primary of s1, replica `a2`) is the node that stopped.
fn cluster(s1: Vec<ShardNode>, others_health: NodeHealth) -> Vec<Shard> {
    vec![
        shard("s1", true, s1),
        shard("s2", true, vec![node("b", Role::Primary, others_health)]),
        shard("s3", true, vec![node("c", Role::Primary, others_health)]),
    ]
}

fn as_before() -> Vec<ShardNode> {
    vec![
        node("a", Role::Primary, NodeHealth::Online),
        node("a2", Role::Replica, NodeHealth::Online),
    ]
}

fn last(role: Role, shards: Vec<Shard>) -> Observation {
    Observation {
        role,
        cluster: Some(ClusterView {
            enabled: true,
            my_id: Some("a".into()),
            shards,
            ..ClusterView::default()
        }),
        ..Observation::default()
    }
}

fn primary_before() -> Observation {
    last(Role::Primary, cluster(as_before(), NodeHealth::Online))
}

#[test]
fn only_a_primary_serving_slots_with_a_replica_is_held() {
    let lone = cluster(
        vec![node("a", Role::Primary, NodeHealth::Online)],
        NodeHealth::Online,
    );
    let no_slots = vec![shard("s1", false, as_before())];
    let cases = [
        (None, "nothing observed"),
        (
            Some(last(
                Role::Replica,
                cluster(as_before(), NodeHealth::Online),
            )),
            "not a primary",
        ),
        (
            Some(last(Role::Primary, no_slots)),
            "not a primary serving slots",
        ),
        (Some(last(Role::Primary, lone)), "no replica"),
        (Some(Observation::default()), "not a cluster node"),
    ];
    for (obs, why) in cases {
        let p = decide(obs.as_ref(), None);
        assert!(p.go() && p.reason().contains(why), "{why}: {p:?}");
    }
    assert!(!decide(Some(&primary_before()), None).go());
    // Just after a hand-over to `a`, gossip may still show the old primary `a0` as a master of
    // the shard: it is about to follow `a` with the shard's data, so the restart is held too. A
    // master marked failed holds nothing to wait for.
    let handed_over = |health| {
        let nodes = vec![
            node("a", Role::Primary, NodeHealth::Online),
            node("a0", Role::Primary, health),
        ];
        last(Role::Primary, cluster(nodes, NodeHealth::Online))
    };
    assert!(!decide(Some(&handed_over(NodeHealth::Online)), None).go());
    let failed = decide(Some(&handed_over(NodeHealth::Failed)), None);
    assert!(
        failed.go() && failed.reason().contains("no replica"),
        "{failed:?}"
    );
}

#[test]
fn a_held_start_goes_once_a_replica_took_over_or_none_can() {
    // As Valkey shows it: the dead primary still a master (failed) in the shard's entry.
    let promoted = vec![
        node("a", Role::Primary, NodeHealth::Failed),
        node("a2", Role::Primary, NodeHealth::Online),
    ];
    let cases: [(Vec<Vec<Shard>>, bool, &str); 5] = [
        (
            vec![cluster(as_before(), NodeHealth::Online)],
            false,
            "waiting",
        ),
        (
            vec![cluster(promoted.clone(), NodeHealth::Online)],
            true,
            "a2 took over",
        ),
        // One replica already knows, another does not yet: the first one is enough.
        (
            vec![
                cluster(as_before(), NodeHealth::Online),
                cluster(promoted, NodeHealth::Online),
            ],
            true,
            "a2 took over",
        ),
        (
            vec![cluster(as_before(), NodeHealth::Failed)],
            true,
            "too few primaries",
        ),
        (
            vec![vec![shard(
                "s2",
                true,
                vec![node("b", Role::Primary, NodeHealth::Online)],
            )]],
            true,
            "forgotten",
        ),
    ];
    for (views, go, why) in cases {
        let replies = Replies {
            asked: views.len(),
            views,
            ..Replies::default()
        };
        let p = decide(Some(&primary_before()), Some(&replies));
        assert_eq!(p.go(), go, "{why}: {p:?}");
        assert!(p.reason().contains(why), "{why}: {p:?}");
    }
}

/// No replica answered: only a refusal says none runs. A replica that times out may be alive on
/// a loaded node and about to take over; the empty primary must not start under it before
/// [`SILENT_GO_MS`] of silence (a start that went after one 300 ms timeout made the empty node
/// the sync source of its live replica).
#[test]
fn a_held_start_goes_without_answers_only_when_no_replica_runs_or_after_long_silence() {
    let cases = [
        // (asked, refused, silent for, go, why)
        (1, 1, 0, true, "every one refused"),
        (2, 2, 0, true, "every one refused"),
        (1, 0, 0, false, "may still take over"),
        (2, 1, 5_000, false, "may still take over"),
        (1, 0, SILENT_GO_MS - 1, false, "may still take over"),
        (1, 0, SILENT_GO_MS, true, "no replica answered for 30 s"),
        (2, 1, SILENT_GO_MS + 1, true, "none can take over"),
    ];
    for (asked, refused, silent_for_ms, go, why) in cases {
        let replies = Replies {
            views: vec![],
            refused,
            asked,
            silent_for_ms,
        };
        let p = decide(Some(&primary_before()), Some(&replies));
        assert_eq!(
            p.go(),
            go,
            "{asked} asked, {refused} refused, silent {silent_for_ms} ms: {p:?}"
        );
        assert!(p.reason().contains(why), "{why}: {p:?}");
    }
}

#[test]
fn a_held_valkey_is_alive_a_silent_one_that_may_start_is_not() {
    let dead = Verdict {
        ok: false,
        reason: "silent".into(),
    };
    let held = Permit::Hold("waiting".into());
    assert!(liveness(dead.clone(), true, &held).ok);
    // Silent but listening (blocked, frozen): the held permit of a running primary is no
    // excuse.
    assert!(!liveness(dead.clone(), false, &held).ok);
    assert!(!liveness(dead, true, &Permit::Go("took over".into())).ok);
}
