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
        heard_at: Millis(read_at),
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

/// Retry period 2 s.
const PERIODS: u64 = 2_000;

#[test]
fn a_keeper_reads_first_then_per_retry_period_at_once_after_a_role_change_or_a_refusal() {
    let s = seen(Some("a"), 1_000);
    let due = |seen, forced, role_since, now| {
        keeper_read_due(seen, forced, role_since, Millis(now), PERIODS, None)
    };
    assert!(due(None, false, None, 0), "first read");
    assert!(!due(Some(&s), false, Some(Millis(500)), 2_000));
    assert!(due(Some(&s), false, None, 3_000), "a period passed");
    assert!(
        due(Some(&s), false, Some(Millis(1_500)), 2_000),
        "role changed"
    );
    assert!(due(Some(&s), true, None, 1_001), "after a refused write");
}

#[test]
fn while_its_watch_is_live_a_keeper_reads_only_when_something_moved() {
    let s = seen(Some("a"), 1_000);
    let due = |forced, role_since, now, last_event| {
        keeper_read_due(
            Some(&s),
            forced,
            role_since,
            Millis(now),
            PERIODS,
            last_event,
        )
    };
    // A renewal heard 1 s ago, or one missed: no read however long since the last one.
    assert!(!due(false, None, 60_000, Some(Millis(59_000))));
    assert!(!due(false, None, 60_000, Some(Millis(56_001))));
    // Still at once: a moved claim or a refused write, and a role change.
    assert!(due(true, None, 60_000, Some(Millis(59_000))));
    assert!(due(
        false,
        Some(Millis(59_500)),
        60_000,
        Some(Millis(59_000))
    ));
    // Two renewals missed (a broken watch, or a holder that stopped renewing): reads every
    // retry period again, long before its lease (15 s by default) runs out; likewise without a
    // watch.
    assert!(due(false, None, 60_000, Some(Millis(56_000))));
    assert!(due(false, None, 60_000, None));
    assert!(!due(false, None, 2_999, None));
}

#[test]
fn a_watched_renewal_moves_the_clock_not_the_read_and_a_moved_claim_is_left_to_a_read() {
    let s = seen(Some("a"), 1_000);
    let renewal = ShardRecord {
        version: "v2".into(),
        ..s.record.clone().unwrap()
    };
    let next = s.after_event(renewal.clone(), Millis(3_000)).unwrap();
    assert_eq!(
        (next.read_at, next.changed_at, next.heard_at),
        (Millis(1_000), Millis(3_000), Millis(3_000))
    );
    assert_eq!(next.record, Some(renewal.clone()));
    // The same version again keeps the clock.
    let again = next.after_event(renewal, Millis(4_000)).unwrap();
    assert_eq!(
        (again.changed_at, again.heard_at),
        (Millis(3_000), Millis(4_000))
    );
    // Another holder, or another epoch: not taken from the watch.
    let moved = ShardRecord {
        holder: Some("b".into()),
        ..s.record.clone().unwrap()
    };
    assert_eq!(s.after_event(moved, Millis(3_000)), None);
    let bumped = ShardRecord {
        epoch: 2,
        ..s.record.clone().unwrap()
    };
    assert_eq!(s.after_event(bumped, Millis(3_000)), None);
    // A read 11 s after the last read but 8 s after the last renewal heard is no read after a
    // gap: the clock is not reset.
    let read = SeenRecord::after_continuous_read(
        Some(&again),
        again.record.clone(),
        Millis(12_000),
        Millis(12_010),
        10_000,
    );
    assert_eq!(read.changed_at, Millis(3_000));
    let silent = SeenRecord::after_continuous_read(
        Some(&s),
        s.record.clone(),
        Millis(12_000),
        Millis(12_010),
        10_000,
    );
    assert_eq!(
        silent.changed_at,
        Millis(12_010),
        "nothing heard for 11 s: the clock restarts"
    );
}
