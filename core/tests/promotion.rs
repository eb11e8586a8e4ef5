//! Replication mode, the coordinator's failover decision (`replication::promote`): who is
//! promoted, when the lease has run out, and why a promotion is blocked.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::*;
use valkey_sidecar_core::observation::{Observation, PrimaryLink, Role};
use valkey_sidecar_core::replication::{
    FailoverPolicy, HoldKind, MemberValkey, SeenRecord, ShardMember, ShardRecord, ShardView,
    promotion,
};
use valkey_sidecar_core::time::Millis;

// ------------------------------------------------------------------------------------------
// promotion::decide(): the coordinator's failover decision.
// ------------------------------------------------------------------------------------------

#[test]
fn promotes_the_highest_offset_once_the_lease_ran_out() {
    let held = promotion::decide(&shard(14_999), &FailoverPolicy::default()).unwrap_err();
    assert_eq!(held.kind, HoldKind::Held);
    let p = promotion::decide(&shard(15_000), &FailoverPolicy::default()).unwrap();
    assert_eq!(p.target, "pod-2");
    assert_eq!(p.epoch, 6);
    assert_eq!(p.version, "v5");
    assert_eq!(p.fence, vec!["pod-0".to_string()]);
    assert_eq!(p.repoint, vec!["pod-0".to_string(), "pod-1".to_string()]);
    assert_eq!(
        p.record(),
        ShardRecord {
            lease_ms: None,
            holder: Some("pod-2".into()),
            primary: Some("pod-2".into()),
            epoch: 6,
            version: "v5".into()
        }
    );
    assert!(p.reason.contains("did not renew"), "{}", p.reason);
    assert!(!p.empty, "the members hold keys");
}

#[test]
fn a_promotion_among_members_that_all_came_back_without_keys_says_the_data_is_gone() {
    let mut view = shard(15_000);
    for m in &mut view.members {
        if let Some(v) = m.valkey.as_mut() {
            v.keys = 0;
        }
    }
    let p = promotion::decide(&view, &FailoverPolicy::default()).unwrap();
    assert!(p.empty, "{p:?}");
    // One member with a key is enough to say nothing.
    view.members[1].valkey.as_mut().unwrap().keys = 1;
    assert!(
        !promotion::decide(&view, &FailoverPolicy::default())
            .unwrap()
            .empty
    );
}

/// The holder's own lease, when longer, is what the record is judged by (a rolling change of
/// lease settings), up to twice the judge's own: a forged hour freezes a failover for one more
/// lease, not for an hour.
#[test]
fn expiry_is_judged_by_the_holders_lease_up_to_twice_our_own() {
    use valkey_sidecar_core::replication::{MAX_LEASE_MS, judged_lease_ms};
    let cases = [
        (15_000, None, 15_000),
        (15_000, Some(10_000), 15_000),
        (15_000, Some(30_000), 30_000),
        (15_000, Some(45_000), 30_000),
        (15_000, Some(MAX_LEASE_MS), 30_000),
        (15_000, Some(u64::MAX), 30_000),
        (MAX_LEASE_MS, Some(u64::MAX), MAX_LEASE_MS),
    ];
    for (own, recorded, want) in cases {
        assert_eq!(judged_lease_ms(own, recorded), want, "{own} {recorded:?}");
    }
    let longer = |now: u64, lease_ms: u64| {
        let mut v = shard(now);
        let rec = v.record.as_mut().unwrap().record.as_mut().unwrap();
        rec.lease_ms = Some(lease_ms);
        promotion::decide(&v, &FailoverPolicy::default())
    };
    assert_eq!(longer(29_999, 30_000).unwrap_err().kind, HoldKind::Held);
    assert!(longer(30_000, 30_000).unwrap().reason.contains("30000 ms"));
    let forged = longer(29_999, MAX_LEASE_MS);
    assert_eq!(forged.unwrap_err().kind, HoldKind::Held);
    assert!(longer(30_000, u64::MAX / 1000 * 1000).is_ok());
}

/// After a gap in reads longer than the renew deadline (an apiserver outage) the record counts
/// as just seen: the holder, which could not renew either, gets a full lease once it can.
#[test]
fn a_gap_in_reads_restarts_the_expiry_clock() {
    let before = seen(Some(record(Some("pod-0"), Some("pod-0"), 5)), 1_000);
    let same = || Some(record(Some("pod-0"), Some("pod-0"), 5));
    let steady = SeenRecord::after_continuous_read(
        Some(&before),
        same(),
        Millis(3_000),
        Millis(3_010),
        10_000,
    );
    assert_eq!(
        steady.changed_at,
        Millis(1_000),
        "a continuous watch keeps the first sighting"
    );
    let after_gap = SeenRecord::after_continuous_read(
        Some(&before),
        same(),
        Millis(61_000),
        Millis(61_010),
        10_000,
    );
    assert_eq!(after_gap.changed_at, Millis(61_010));
    let mut v = shard(61_010 + 14_999);
    v.record = Some(after_gap.clone());
    assert_eq!(
        promotion::decide(&v, &FailoverPolicy::default())
            .unwrap_err()
            .kind,
        HoldKind::Held
    );
    v.now = Millis(61_010 + 15_000);
    assert!(promotion::decide(&v, &FailoverPolicy::default()).is_ok());
}

#[test]
fn a_released_record_is_taken_at_once() {
    let mut v = shard(1);
    v.record = Some(seen(Some(record(None, Some("pod-0"), 5)), 0));
    v.members[0].valkey = None;
    let p = promotion::decide(&v, &FailoverPolicy::default()).unwrap();
    assert_eq!(p.target, "pod-2");
    assert!(p.fence.is_empty());
    assert!(p.reason.contains("released"));
}

#[test]
fn ties_go_to_the_preferred_zone_then_the_pod_name() {
    let mut v = shard(20_000);
    v.members[1].valkey.as_mut().unwrap().offset = 950;
    v.preferred_zone = Some("b".into());
    assert_eq!(
        promotion::decide(&v, &FailoverPolicy::default())
            .unwrap()
            .target,
        "pod-1"
    );
    v.preferred_zone = None;
    assert_eq!(
        promotion::decide(&v, &FailoverPolicy::default())
            .unwrap()
            .target,
        "pod-1"
    );
    v.members[1].zone = Some("c".into());
    v.preferred_zone = Some("c".into());
    assert_eq!(
        promotion::decide(&v, &FailoverPolicy::default())
            .unwrap()
            .target,
        "pod-1"
    );
}

#[test]
fn the_last_primary_takes_a_vacant_record_back_only_when_no_other_member_holds_data() {
    let policy = FailoverPolicy::default();
    let released = |members: Vec<ShardMember>| ShardView {
        record: Some(seen(Some(record(None, Some("pod-0"), 5)), 0)),
        members,
        ..shard(1_000)
    };
    let fresh = |pod: &str| {
        let mut m = member(pod, Role::Primary, 0, "b");
        m.valkey.as_mut().unwrap().fresh = true;
        m
    };
    // A shard of one pod, back after a restart.
    let alone = released(vec![member("pod-0", Role::Primary, 0, "a")]);
    let p = promotion::decide(&alone, &policy).unwrap();
    assert_eq!((p.target.as_str(), p.epoch), ("pod-0", 6));
    assert!(p.reason.contains("the last primary"), "{}", p.reason);
    // Its replicas came back empty: they hold nothing the last primary lacks.
    let p = promotion::decide(
        &released(vec![member("pod-0", Role::Primary, 7, "a"), fresh("pod-1")]),
        &policy,
    );
    assert_eq!(p.unwrap().target, "pod-0");
    // A member that does not answer, or a replica that synced but may not be promoted, may hold
    // data the last primary lost: hold.
    let mut silent = member("pod-1", Role::Replica, 900, "b");
    silent.valkey = None;
    let mut cordoned = member("pod-1", Role::Replica, 900, "b");
    cordoned.node_schedulable = false;
    for other in [silent, cordoned] {
        let v = released(vec![member("pod-0", Role::Primary, 0, "a"), other]);
        assert_eq!(
            promotion::decide(&v, &policy).unwrap_err().kind,
            HoldKind::NoCandidate
        );
    }
    // The last primary must answer as a primary, on a usable node, and not be going away.
    let mut down = member("pod-0", Role::Primary, 0, "a");
    down.valkey = None;
    let mut leaving = member("pod-0", Role::Primary, 0, "a");
    leaving.terminating = true;
    let emptied = fresh("pod-0");
    for last in [
        down,
        leaving,
        emptied,
        member("pod-0", Role::Replica, 0, "a"),
    ] {
        assert!(promotion::decide(&released(vec![last]), &policy).is_err());
    }
    // A held record stays held.
    let held = ShardView {
        members: vec![member("pod-0", Role::Primary, 0, "a")],
        ..shard(1_000)
    };
    assert_eq!(
        promotion::decide(&held, &policy).unwrap_err().kind,
        HoldKind::Held
    );
}

#[test]
fn blocked_promotions_say_why() {
    let policy = FailoverPolicy::default();
    let mut v = shard(20_000);
    v.members[1].terminating = true;
    v.members[2].valkey.as_mut().unwrap().fresh = true;
    let h = promotion::decide(&v, &policy).unwrap_err();
    assert_eq!(h.kind, HoldKind::NoCandidate);
    assert!(
        h.reason.contains("pod-0 is the recorded primary"),
        "{}",
        h.reason
    );
    assert!(h.reason.contains("pod-1 is terminating"), "{}", h.reason);
    assert!(h.reason.contains("pod-2 never synced"), "{}", h.reason);

    let mut v = shard(20_000);
    v.members[1].node_ready = false;
    v.members[2].valkey = None;
    let h = promotion::decide(&v, &policy).unwrap_err();
    assert!(h.reason.contains("pod-1 is on a node"), "{}", h.reason);
    assert!(h.reason.contains("pod-2 does not answer"), "{}", h.reason);

    let rows = [
        (
            ShardView {
                coordinating: false,
                ..shard(20_000)
            },
            HoldKind::NotCoordinator,
        ),
        (
            ShardView {
                record: None,
                ..shard(20_000)
            },
            HoldKind::NoRecord,
        ),
        (
            ShardView {
                record: Some(seen(None, 0)),
                members: shard(0)
                    .members
                    .into_iter()
                    .map(|mut m| {
                        m.valkey.as_mut().unwrap().fresh = true;
                        m
                    })
                    .collect(),
                ..shard(20_000)
            },
            HoldKind::NoRecord,
        ),
    ];
    for (v, want) in rows {
        assert_eq!(promotion::decide(&v, &policy).unwrap_err().kind, want);
    }
    let off = FailoverPolicy { automatic: false };
    assert_eq!(
        promotion::decide(&shard(20_000), &off).unwrap_err().kind,
        HoldKind::Disabled
    );
}

/// A record that vanished and that no holder re-created within a lease is re-created one epoch
/// above the last seen, naming the shard's one master with data (the fenced primary), or the
/// replica with the highest offset when no single master holds it.
#[test]
fn a_vanished_record_is_recreated_above_the_last_epoch_naming_the_data() {
    let gone = |now: u64| ShardView {
        record: Some(SeenRecord {
            last_epoch: Some(5),
            ..seen(None, 1_000)
        }),
        ..shard(now)
    };
    let policy = FailoverPolicy::default();
    let wait = promotion::decide(&gone(15_999), &policy).unwrap_err();
    assert_eq!(wait.kind, HoldKind::Held, "{wait:?}");
    let p = promotion::decide(&gone(16_000), &policy).unwrap();
    assert_eq!((p.target.as_str(), p.epoch), ("pod-0", 6), "{p:?}");
    assert!(p.version.is_empty(), "a create: {p:?}");
    assert!(p.fence.is_empty(), "{p:?}");
    assert!(p.reason.contains("vanished"), "{}", p.reason);
    // The primary is gone too: the replica with the most data, at epoch 1 when none was seen.
    let mut v = gone(16_000);
    v.members[0].valkey = None;
    v.record.as_mut().unwrap().last_epoch = None;
    let p = promotion::decide(&v, &policy).unwrap();
    assert_eq!((p.target.as_str(), p.epoch), ("pod-2", 1), "{p:?}");
    // Two masters with data: neither is trusted over the replica.
    let mut v = gone(16_000);
    v.members[1].valkey.as_mut().unwrap().role = Role::Primary;
    v.members[1].valkey.as_mut().unwrap().offset = 2_000;
    assert_eq!(promotion::decide(&v, &policy).unwrap().target, "pod-2");
}

/// A record naming a member that is no master (a promotion that never landed, or a record no
/// coordinator wrote), released or expired, while the master with the data answers: that master
/// is named again — with a 2-pod shard no replica could be promoted otherwise, and with more no
/// data moves.
#[test]
fn a_record_naming_a_replica_gives_way_to_the_master_with_the_data() {
    let policy = FailoverPolicy::default();
    let mut v = ShardView {
        record: Some(seen(Some(record(None, Some("pod-1"), 6)), 0)),
        ..shard(1_000)
    };
    v.members[0].valkey.as_mut().unwrap().offset = 1_000;
    v.members[2].valkey.as_mut().unwrap().offset = 1_000;
    let p = promotion::decide(&v, &policy).unwrap();
    assert_eq!((p.target.as_str(), p.epoch), ("pod-0", 7), "{p:?}");
    assert!(p.fence.is_empty(), "{p:?}");
    // Two pods: the master is the only candidate.
    v.members.remove(2);
    assert_eq!(promotion::decide(&v, &policy).unwrap().target, "pod-0");
    // The named member gone instead: a master may be an old primary the shard moved past.
    let mut v = ShardView {
        record: Some(seen(Some(record(None, Some("pod-1"), 6)), 0)),
        ..shard(1_000)
    };
    v.members[1].valkey = None;
    v.members[0].valkey.as_mut().unwrap().offset = 5_000;
    assert_eq!(promotion::decide(&v, &policy).unwrap().target, "pod-2");
}

// A member as one observation shows it (`MemberValkey::of`).

fn replica(offset: u64, up: bool, keys: u64) -> Observation {
    Observation {
        role: Role::Replica,
        repl_offset: offset,
        link: Some(PrimaryLink {
            up,
            offset,
            ever_up: up,
            ..PrimaryLink::default()
        }),
        keys,
        ..Observation::default()
    }
}

#[test]
fn a_member_is_fresh_only_empty_at_offset_zero_and_never_linked() {
    let never_synced = MemberValkey::of(&replica(0, false, 0));
    assert!(never_synced.fresh && !never_synced.link_up);
    let synced = MemberValkey::of(&replica(14, true, 0));
    assert!(!synced.fresh, "a completed sync moves the offset");
    assert_eq!((synced.role, synced.offset), (Role::Replica, 14));
    // Synced from an empty primary that died before streaming anything to it.
    let mut linked_once = replica(0, false, 0);
    if let Some(l) = linked_once.link.as_mut() {
        l.ever_up = true;
    }
    let orphan = MemberValkey::of(&linked_once);
    assert!(!orphan.fresh, "it holds all its primary had");
    let linked_at_zero = MemberValkey::of(&replica(0, true, 0));
    assert!(!linked_at_zero.fresh);
    let restarted_with_data = Observation {
        role: Role::Primary,
        keys: 3,
        ..Observation::default()
    };
    assert!(!MemberValkey::of(&restarted_with_data).fresh);
    let empty_master = Observation {
        role: Role::Primary,
        ..Observation::default()
    };
    assert!(MemberValkey::of(&empty_master).fresh);
}

#[test]
fn a_primary_reports_its_own_offset_and_a_loading_node_no_role() {
    let primary = Observation {
        role: Role::Primary,
        repl_offset: 500,
        keys: 1,
        ..Observation::default()
    };
    assert_eq!(MemberValkey::of(&primary).offset, 500);
    let loading = Observation {
        loading: true,
        ..primary
    };
    assert_eq!(MemberValkey::of(&loading).role, Role::Unknown);
}
