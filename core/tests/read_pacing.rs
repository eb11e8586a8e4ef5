//! When the shard records are read: the coordinator's pace (`next_read`, `calm`) and each
//! keeper's (`keeper_read_due`).

use valkey_sidecar_core::observation::Role;
use valkey_sidecar_core::replication::{SeenRecord, ShardRecord, calm, keeper_read_due, next_read};
use valkey_sidecar_core::time::Millis;

fn seen(holder: Option<&str>, read_at: u64) -> SeenRecord {
    SeenRecord {
        record: Some(ShardRecord {
            holder: holder.map(str::to_owned),
            primary: Some("a".into()),
            epoch: 1,
            ..ShardRecord::default()
        }),
        read_at: Millis(read_at),
        changed_at: Millis(read_at),
        last_epoch: Some(1),
    }
}

#[test]
fn a_calm_shard_is_read_once_per_retry_period_any_other_at_every_round() {
    let s = seen(Some("a"), 1_000);
    assert_eq!(
        next_read(Some(&s), true, Millis(1_500), 2_000),
        Millis(3_000)
    );
    assert_eq!(next_read(None, true, Millis(1_500), 2_000), Millis(3_500));
    assert_eq!(next_read(Some(&s), false, Millis(1_500), 2_000), Millis(0));
}

#[test]
fn calm_needs_the_holder_serving_as_primary_every_replica_linked_and_nothing_busy() {
    let s = seen(Some("a"), 0);
    let healthy = [("a", Role::Primary, false), ("b", Role::Replica, true)];
    assert!(calm(Some(&s), healthy.iter().copied(), false));
    assert!(
        !calm(Some(&s), healthy.iter().copied(), true),
        "a move is busy"
    );
    let unlinked = [("a", Role::Primary, false), ("b", Role::Replica, false)];
    assert!(
        !calm(Some(&s), unlinked.iter().copied(), false),
        "a replica lost its link"
    );
    let holder_replica = [("a", Role::Replica, true), ("b", Role::Replica, true)];
    assert!(
        !calm(Some(&s), holder_replica.iter().copied(), false),
        "the holder is not primary"
    );
    let silent = [("b", Role::Replica, true)];
    assert!(
        !calm(Some(&s), silent.iter().copied(), false),
        "the holder does not answer"
    );
    let released = seen(None, 0);
    assert!(
        !calm(Some(&released), healthy.iter().copied(), false),
        "released"
    );
    assert!(!calm(None, healthy.iter().copied(), false), "never read");
    let absent = SeenRecord::default();
    assert!(
        calm(Some(&absent), healthy.iter().copied(), false),
        "not bootstrapped: the keepers'"
    );
}

#[test]
fn a_keeper_reads_first_then_per_retry_period_at_once_after_a_role_change_or_a_refusal() {
    let s = seen(Some("a"), 1_000);
    assert!(
        keeper_read_due(None, false, None, Millis(0), 2_000),
        "first read"
    );
    assert!(!keeper_read_due(
        Some(&s),
        false,
        Some(Millis(500)),
        Millis(2_000),
        2_000
    ));
    assert!(
        keeper_read_due(Some(&s), false, None, Millis(3_000), 2_000),
        "a period passed"
    );
    assert!(
        keeper_read_due(Some(&s), false, Some(Millis(1_500)), Millis(2_000), 2_000),
        "role changed"
    );
    assert!(
        keeper_read_due(Some(&s), true, None, Millis(1_001), 2_000),
        "after a refused write"
    );
}
