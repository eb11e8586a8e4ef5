//! `crash`: its tables, through the module's public entry points (tests of private helpers stay in the module).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use valkey_sidecar_core::crash::*;
use valkey_sidecar_core::moves::Ledger;
use valkey_sidecar_core::observation::Role;
use valkey_sidecar_core::shards::{NodeHealth, Shard, ShardNode};
use valkey_sidecar_core::time::Millis;

fn node(id: &str, role: Role, zone: &str) -> ShardNode {
    ShardNode {
        id: id.into(),
        ip: format!("10.0.0.{}", id.len()),
        port: 6379,
        role,
        availability_zone: Some(zone.into()),
        ..ShardNode::default()
    }
}

fn shard() -> Shard {
    Shard {
        id: "s1".into(),
        slots: vec![(0, 5460)],
        nodes: vec![
            node("p", Role::Primary, "a"),
            node("r1", Role::Replica, "b"),
            node("r2", Role::Replica, "a"),
        ],
    }
}

fn read(id: &str, offset: Option<u64>) -> ReplicaOffset {
    ReplicaOffset {
        id: id.into(),
        offset,
        // "p" is at 10.0.0.1 (see `node`).
        primary: Some(("10.0.0.1".into(), 6379)),
        link_up: false,
    }
}

fn offsets(r1: Option<u64>, r2: Option<u64>) -> Vec<ReplicaOffset> {
    vec![read("r1", r1), read("r2", r2)]
}

#[test]
fn the_highest_offset_wins_then_the_primary_zone_then_the_id() {
    let cases = [
        (offsets(Some(10), Some(9)), Some("r1")),
        (offsets(Some(9), Some(10)), Some("r2")),
        // Tie: r2 shares the dead primary's zone.
        (offsets(Some(10), Some(10)), Some("r2")),
        (offsets(None, Some(1)), Some("r2")),
        (offsets(None, None), None),
    ];
    for (given, want) in cases {
        let got = target(&shard(), "p", &given).ok().map(|f| f.to);
        assert_eq!(got.as_deref(), want, "{given:?}");
    }
    let mut other_zones = shard();
    other_zones.nodes[2].availability_zone = Some("c".into());
    let f = target(&other_zones, "p", &offsets(Some(10), Some(10))).unwrap();
    assert_eq!(f.to, "r1");
    assert!(f.reason.contains("highest offset (10)"), "{}", f.reason);
}

#[test]
fn only_a_primary_serving_slots_counts_and_failed_replicas_never_do() {
    let shards = [shard()];
    assert!(crashed_shard(&shards, "p").is_some());
    assert!(crashed_shard(&shards, "r1").is_none());
    let mut empty = shard();
    empty.slots.clear();
    assert!(crashed_shard(&[empty], "p").is_none());
    let mut failed = shard();
    failed.nodes[1].health = NodeHealth::Failed;
    let ids: Vec<&str> = candidates(&failed, "p").map(|n| n.id.as_str()).collect();
    assert_eq!(ids, ["r2"]);
    let f = target(&failed, "p", &offsets(Some(99), Some(1))).unwrap();
    assert_eq!(f.to, "r2", "a replica marked failed is never chosen");
}

#[test]
fn a_replica_that_follows_someone_else_or_is_still_linked_is_never_forced() {
    // A stale view: the shard was handed over to r1 already; r2 follows r1.
    let mut moved = offsets(Some(5), Some(9));
    moved[1].primary = Some(("10.0.0.2".into(), 6379));
    let f = target(&shard(), "p", &moved).unwrap();
    assert_eq!(f.to, "r1");
    let mut linked = offsets(Some(5), Some(9));
    linked[0].link_up = true;
    linked[1].link_up = true;
    assert!(
        target(&shard(), "p", &linked).is_err(),
        "its primary answers it: not dead"
    );
}

/// The adapter's former checks, as one table: each case, its verdict, whether it books the
/// death (the repeat window starts).
#[test]
fn a_death_is_failed_over_once_unless_its_pod_goes_or_its_shard_moves() {
    use valkey_sidecar_core::moves::Started;
    let shards = [shard()];
    let now = Millis(100_000);
    let death = |node, last: Option<u64>, terminating| Death {
        now,
        node,
        shards: &shards,
        last_handled: last.map(Millis),
        terminating,
    };
    let idle = Ledger::default();
    let mut moving = Ledger::default();
    moving.start("s1", Started::Unplanned, Millis(99_000));
    let kind = |v: &DeathVerdict| match v {
        DeathVerdict::NotServing => "not serving",
        DeathVerdict::Repeated => "repeated",
        DeathVerdict::LeftToHandover => "hand-over",
        DeathVerdict::Busy => "busy",
        DeathVerdict::ReadOffsets { .. } => "read offsets",
    };
    let cases = [
        // Booked only once the offsets are read (`handled_after_reading`).
        (death("p", None, false), &idle, "read offsets", false),
        (death("r1", None, false), &idle, "not serving", false),
        (death("p", Some(90_001), false), &idle, "repeated", false),
        (
            death("p", Some(90_000), false),
            &idle,
            "read offsets",
            false,
        ),
        (death("p", Some(95_000), true), &idle, "repeated", false),
        (death("p", None, true), &idle, "hand-over", true),
        (death("p", None, true), &moving, "hand-over", true),
        (death("p", None, false), &moving, "busy", false),
    ];
    for (d, moves, want, handled) in cases {
        let v = decide(&d, moves);
        let case = format!(
            "{} last {:?} terminating {}",
            d.node, d.last_handled, d.terminating
        );
        assert_eq!((kind(&v), v.handled()), (want, handled), "{case}");
    }
    let DeathVerdict::ReadOffsets { shard, candidates } = decide(&death("p", None, false), &idle)
    else {
        unreachable!()
    };
    let ids: Vec<&str> = candidates.iter().map(|n| n.id.as_str()).collect();
    assert_eq!((shard.id.as_str(), ids), ("s1", vec!["r1", "r2"]));
}

/// After reading the offsets: booked when a failover was sent or any replica answered; when none
/// answered (frozen, overloaded) the next report of the death asks again.
#[test]
fn a_death_no_replica_answered_for_is_asked_again() {
    let cases = [
        (offsets(None, None), false, false),
        (offsets(Some(5), None), false, true),
        (offsets(None, Some(5)), true, true),
        (offsets(Some(5), Some(6)), true, true),
        (vec![], false, false),
    ];
    for (read, sent, booked) in cases {
        assert_eq!(
            handled_after_reading(&read, sent),
            booked,
            "{read:?} sent {sent}"
        );
    }
}
