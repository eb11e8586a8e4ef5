//! Replication mode: tables of every local action, promotion and switchover step, and property
//! tests of the safety rules (fencing before promotion, no promotion while held, lossless
//! switchover, no bootstrap over existing data).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use valkey_sidecar_core::lease::LeaseTimings;
use valkey_sidecar_core::observation::Role;
use valkey_sidecar_core::replication::{
    Command, FailoverPolicy, HoldKind, Holding, LocalAction, LocalRole, LocalValkey, LocalView,
    MemberValkey, Phase, RunTrust, SeenRecord, ShardMember, ShardRecord, ShardView, Switchover,
    SwitchoverObservation, SwitchoverPlan, WriteOutcome, awaiting_promotion, local, may_advertise,
    promote, step,
};
use valkey_sidecar_core::time::Millis;

const T: LeaseTimings = LeaseTimings {
    lease_ms: 15_000,
    renew_deadline_ms: 10_000,
    retry_ms: 2_000,
};

fn record(holder: Option<&str>, primary: Option<&str>, epoch: u64) -> ShardRecord {
    ShardRecord {
        lease_ms: None,
        holder: holder.map(str::to_owned),
        primary: primary.map(str::to_owned),
        epoch,
        version: format!("v{epoch}"),
    }
}

fn seen(record: Option<ShardRecord>, read_at: u64) -> SeenRecord {
    SeenRecord {
        record,
        read_at: Millis(read_at),
        changed_at: Millis(read_at),
    }
}

fn master(run: &str, since: u64) -> LocalValkey {
    LocalValkey {
        role: LocalRole::Primary,
        fresh: false,
        run_id: run.into(),
        since: Millis(since),
        observed_at: Millis(since),
    }
}

fn replica_of(of: &str, since: u64) -> LocalValkey {
    LocalValkey {
        role: LocalRole::Replica { of: of.into() },
        ..master("run", since)
    }
}

fn holding(epoch: u64, at: u64, run: &str) -> Holding {
    Holding {
        epoch,
        renewed_at: Millis(at),
        run_id: run.into(),
    }
}

/// pod-0, node-index 0, at `now`; nothing known yet.
fn view(now: u64) -> LocalView {
    LocalView {
        now: Millis(now),
        me: "pod-0".into(),
        node_index: Some(0),
        timings: T,
        valkey: None,
        record: None,
        holding: None,
        fenced_until: None,
        primary_addr: None,
        other_master: false,
    }
}

/// pod-0 is the primary on record (epoch 3), renewed at `renewed`, its Valkey master.
fn holder_view(now: u64, renewed: u64) -> LocalView {
    LocalView {
        valkey: Some(master("run", 0)),
        record: Some(seen(Some(record(Some("pod-0"), Some("pod-0"), 3)), renewed)),
        holding: Some(holding(3, renewed, "run")),
        primary_addr: Some("10.0.0.10:6379".into()),
        ..view(now)
    }
}

/// pod-1 is the primary on record (epoch 4), read at 5 s; pod-0's Valkey given by the caller.
fn follower_view(valkey: LocalValkey) -> LocalView {
    LocalView {
        valkey: Some(valkey),
        record: Some(seen(Some(record(Some("pod-1"), Some("pod-1"), 4)), 5_000)),
        primary_addr: Some("10.0.0.11:6379".into()),
        ..view(6_000)
    }
}

// ------------------------------------------------------------------------------------------
// local(): one table row per situation.
// ------------------------------------------------------------------------------------------

#[test]
fn local_table() {
    let fenced = |mut v: LocalView, until: u64| {
        v.fenced_until = Some(Millis(until));
        v
    };
    let fresh = |mut v: LocalValkey| {
        v.fresh = true;
        v
    };
    let rows: Vec<(&str, LocalView, &str)> = vec![
        // The primary on record.
        ("renewal due", holder_view(2_000, 0), "renew"),
        ("renewed recently", holder_view(1_999, 0), "nothing"),
        ("renew deadline passed", holder_view(10_000, 0), "fence"),
        (
            "fenced, renewing late",
            fenced(holder_view(10_500, 0), 25_000),
            "renew",
        ),
        (
            "fence about to lapse",
            fenced(holder_view(20_000, 0), 25_000),
            "fence",
        ),
        (
            "renewed again while fenced",
            fenced(holder_view(12_000, 11_000), 25_000),
            "unfence",
        ),
        (
            "holding of an older epoch",
            LocalView {
                holding: Some(holding(2, 1_000, "run")),
                ..holder_view(2_000, 1_000)
            },
            "fence",
        ),
        (
            "Valkey restarted with data",
            LocalView {
                holding: Some(holding(3, 1_000, "old")),
                ..holder_view(2_000, 1_000)
            },
            "fence",
        ),
        (
            "Valkey restarted empty",
            LocalView {
                valkey: Some(fresh(master("new", 1_500))),
                holding: Some(holding(3, 1_000, "old")),
                ..holder_view(2_000, 1_000)
            },
            "release",
        ),
        (
            "bootstrapped, no writes yet, renewal due",
            LocalView {
                valkey: Some(fresh(master("run", 0))),
                ..holder_view(2_000, 0)
            },
            "renew",
        ),
        (
            "Valkey does not answer",
            LocalView {
                valkey: None,
                ..holder_view(2_000, 0)
            },
            "release",
        ),
        // A successor is recorded.
        (
            "old primary, successor recorded",
            follower_view(master("run", 1_000)),
            "demote",
        ),
        (
            "empty master, successor recorded",
            follower_view(fresh(master("run", 1_000))),
            "rejoin",
        ),
        (
            "became master after the last read",
            follower_view(master("run", 5_001)),
            "fence",
        ),
        (
            "successor's address unknown",
            LocalView {
                primary_addr: None,
                ..follower_view(master("run", 1_000))
            },
            "fence",
        ),
        (
            "released by me, no successor yet",
            LocalView {
                record: Some(seen(Some(record(None, Some("pod-0"), 3)), 11_000)),
                ..holder_view(11_000, 0)
            },
            "fence",
        ),
        (
            "released by me, already fenced",
            LocalView {
                record: Some(seen(Some(record(None, Some("pod-0"), 3)), 11_000)),
                fenced_until: Some(Millis(30_000)),
                ..holder_view(11_000, 0)
            },
            "wait",
        ),
        // Replicas.
        (
            "following the recorded primary",
            follower_view(replica_of("10.0.0.11:6379", 1_000)),
            "nothing",
        ),
        (
            "following the wrong primary",
            follower_view(replica_of("10.0.0.12:6379", 1_000)),
            "repoint",
        ),
        (
            "repointed after the last read",
            follower_view(replica_of("10.0.0.12:6379", 5_500)),
            "wait",
        ),
        (
            "named primary, not promoted yet",
            LocalView {
                valkey: Some(replica_of("10.0.0.11:6379", 0)),
                holding: None,
                ..holder_view(3_000, 0)
            },
            "renew",
        ),
        (
            "named primary, renewed, waiting",
            LocalView {
                valkey: Some(replica_of("10.0.0.11:6379", 0)),
                ..holder_view(3_000, 0)
            },
            "wait",
        ),
        (
            "named primary, promotion never came",
            LocalView {
                valkey: Some(replica_of("10.0.0.11:6379", 0)),
                ..holder_view(10_000, 0)
            },
            "release",
        ),
        (
            "named primary but never synced",
            LocalView {
                valkey: Some(fresh(replica_of("10.0.0.11:6379", 0))),
                holding: None,
                ..holder_view(3_000, 0)
            },
            "release",
        ),
        (
            "named primary, empty in an observation older than the record read",
            LocalView {
                valkey: Some(fresh(replica_of("10.0.0.11:6379", 0))),
                holding: None,
                record: Some(seen(Some(record(Some("pod-0"), Some("pod-0"), 3)), 1_000)),
                ..holder_view(3_000, 0)
            },
            "wait",
        ),
        // Before anything is known, and bootstrap.
        (
            "record not read, replica",
            LocalView {
                valkey: Some(replica_of("x:1", 0)),
                ..view(0)
            },
            "wait",
        ),
        (
            "record not read, master",
            LocalView {
                valkey: Some(master("run", 0)),
                ..view(0)
            },
            "fence",
        ),
        ("Valkey silent, not holder", view(0), "wait"),
        (
            "no record, node-index 0",
            LocalView {
                valkey: Some(fresh(master("run", 0))),
                record: Some(seen(None, 10)),
                ..view(10)
            },
            "bootstrap",
        ),
        (
            "no record, node-index 1",
            LocalView {
                node_index: Some(1),
                valkey: Some(fresh(master("run", 0))),
                record: Some(seen(None, 10)),
                ..view(10)
            },
            "fence",
        ),
        (
            "no record any more, node-index 1 held it at epoch 4 in this run",
            LocalView {
                node_index: Some(1),
                valkey: Some(master("run", 0)),
                holding: Some(holding(4, 5, "run")),
                record: Some(seen(None, 10)),
                other_master: true,
                ..view(10)
            },
            "bootstrap",
        ),
        (
            "no record any more, held it at epoch 4 but past the renew deadline",
            LocalView {
                node_index: Some(1),
                valkey: Some(master("run", 0)),
                holding: Some(holding(4, 5, "run")),
                record: Some(seen(None, 10_005)),
                ..view(10_005)
            },
            "fence",
        ),
        (
            "no record any more, held it in an earlier Valkey run",
            LocalView {
                node_index: Some(1),
                valkey: Some(master("run-2", 0)),
                holding: Some(holding(4, 5, "run")),
                record: Some(seen(None, 10)),
                ..view(10)
            },
            "fence",
        ),
        (
            "no record, another master has data",
            LocalView {
                valkey: Some(fresh(master("run", 0))),
                record: Some(seen(None, 10)),
                other_master: true,
                ..view(10)
            },
            "fence",
        ),
        (
            "no record, replica",
            LocalView {
                valkey: Some(replica_of("x:1", 0)),
                record: Some(seen(None, 10)),
                ..view(10)
            },
            "nothing",
        ),
    ];
    for (name, v, want) in rows {
        let got = local(&v);
        assert_eq!(got.kind(), want, "{name}: {got:?}");
        assert!(!got.reason().is_empty(), "{name}: no reason");
    }
}

#[test]
fn a_vanished_record_is_re_created_by_its_holder_above_its_epoch() {
    let v = LocalView {
        node_index: Some(2),
        valkey: Some(master("run", 0)),
        holding: Some(holding(4, 5, "run")),
        record: Some(seen(None, 10)),
        ..view(10)
    };
    match local(&v) {
        LocalAction::Bootstrap { epoch, reason } => {
            assert_eq!(epoch, 5);
            assert!(reason.contains("epoch 4"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn only_a_held_unfenced_master_is_advertised() {
    let steady = holder_view(3_000, 2_000);
    let rows: Vec<(&str, LocalView, bool)> = vec![
        ("held, renewed 1 s ago", steady.clone(), true),
        ("past the renew deadline", holder_view(12_001, 2_000), false),
        (
            "fenced by its own agent",
            LocalView {
                fenced_until: Some(Millis(9_000)),
                ..steady.clone()
            },
            false,
        ),
        (
            "Valkey restarted (new run)",
            LocalView {
                valkey: Some(master("run-2", 2_500)),
                ..steady.clone()
            },
            false,
        ),
        (
            "the record moved on (epoch 4, pod-1)",
            LocalView {
                record: Some(seen(Some(record(Some("pod-1"), Some("pod-1"), 4)), 2_500)),
                ..steady.clone()
            },
            false,
        ),
        (
            "a named replica holding a renewal (advertised once promoted)",
            LocalView {
                valkey: Some(replica_of("10.0.0.11:6379", 0)),
                ..steady.clone()
            },
            true,
        ),
        (
            "no answer from Valkey",
            LocalView {
                valkey: None,
                ..steady
            },
            false,
        ),
    ];
    for (why, v, want) in rows {
        assert_eq!(may_advertise(&v), want, "{why}");
    }
}

#[test]
fn a_named_replica_with_data_awaits_its_promotion() {
    let named = LocalView {
        valkey: Some(replica_of("10.0.0.10:6379", 0)),
        record: Some(seen(Some(record(Some("pod-0"), Some("pod-0"), 4)), 5_000)),
        ..view(6_000)
    };
    assert!(awaiting_promotion(&named));
    let fresh = LocalValkey {
        fresh: true,
        ..replica_of("10.0.0.10:6379", 0)
    };
    let empty = LocalView {
        valkey: Some(fresh),
        ..named.clone()
    };
    assert!(awaiting_promotion(&empty), "an empty one looks again, fast");
    let promoted = LocalView {
        valkey: Some(master("run", 5_500)),
        ..named
    };
    assert!(!awaiting_promotion(&promoted), "already master");
    let other = follower_view(replica_of("10.0.0.11:6379", 0));
    assert!(!awaiting_promotion(&other), "the record names pod-1");
}

#[test]
fn a_renewal_keeps_the_claim_but_a_release_or_promotion_changes_it() {
    let a = record(Some("pod-0"), Some("pod-0"), 3);
    let renewed = ShardRecord {
        version: "v3b".into(),
        ..a.clone()
    };
    assert!(a.same_claim(&renewed));
    assert!(!a.same_claim(&a.released()));
    assert!(!a.same_claim(&record(Some("pod-1"), Some("pod-1"), 4)));
}

#[test]
fn a_new_version_counts_as_changed_when_its_answer_arrived() {
    let rec = |v: &str| {
        Some(ShardRecord {
            version: v.into(),
            ..ShardRecord::bootstrap("v-0-0")
        })
    };
    let first = SeenRecord::after_read(None, rec("1"), Millis(100), Millis(130));
    assert_eq!(
        (first.read_at, first.changed_at),
        (Millis(100), Millis(130))
    );
    let same = SeenRecord::after_read(Some(&first), rec("1"), Millis(2100), Millis(2110));
    assert_eq!((same.read_at, same.changed_at), (Millis(2100), Millis(130)));
    let renewed = SeenRecord::after_read(Some(&same), rec("2"), Millis(4100), Millis(4120));
    assert_eq!(renewed.changed_at, Millis(4120));
    let deleted = SeenRecord::after_read(Some(&renewed), None, Millis(5000), Millis(5001));
    assert_eq!(deleted.changed_at, Millis(5001));
    let still_none = SeenRecord::after_read(Some(&deleted), None, Millis(6000), Millis(6001));
    assert_eq!(still_none.changed_at, Millis(5001));
}

#[test]
fn a_run_is_trusted_once_synced_or_promoted_never_after_an_unseen_restart() {
    let replica = LocalRole::Replica { of: "p:1".into() };
    let primary = LocalRole::Primary;
    let first = RunTrust::observe(None, "r1", &primary, true, false);
    assert!(first.untrusted, "started empty");
    let known = RunTrust::observe(None, "r1", &primary, false, false);
    assert!(!known.untrusted, "found with data when the agent started");
    let restarted = RunTrust::observe(Some(&known), "r2", &primary, false, false);
    assert!(
        restarted.untrusted,
        "restarted under the agent: it took writes since"
    );
    let rejoined = RunTrust::observe(Some(&restarted), "r2", &replica, false, false);
    assert!(rejoined.untrusted, "a replica before its sync");
    let synced = RunTrust::observe(Some(&rejoined), "r2", &replica, false, true);
    assert!(
        !synced.untrusted,
        "a completed sync brings the shard's data"
    );
    let promoted = RunTrust::observe(Some(&rejoined), "r2", &primary, false, false);
    assert!(
        !promoted.untrusted,
        "replica to master in one run: the coordinator's promotion"
    );
    let again = RunTrust::observe(Some(&restarted), "r2", &primary, false, false);
    assert!(
        again.untrusted,
        "a master that stays master stays untrusted"
    );
    let bootstrapped = first.held();
    let later = RunTrust::observe(Some(&bootstrapped), "r1", &primary, false, false);
    assert!(
        !later.untrusted,
        "the run that held the record is the shard's primary"
    );
}

#[test]
fn record_names_and_selector() {
    let name = ShardRecord::lease_name("cache", "2");
    assert_eq!(name, "cache-2-primary");
    assert_eq!(ShardRecord::shard_of("cache", &name), Some("2"));
    assert_eq!(ShardRecord::shard_of("cache", "cache-coordinator"), None);
    assert_eq!(ShardRecord::shard_of("cache", "cache--primary"), None);
    assert_eq!(ShardRecord::shard_of("other", &name), None);
    assert_eq!(
        ShardRecord::selector("cache"),
        "valkey.io/record=shard-primary,valkey.io/cluster=cache"
    );
}

#[test]
fn record_helpers() {
    assert_eq!(ShardRecord::lease_name("cache", "s0"), "cache-s0-primary");
    let r = ShardRecord::bootstrap("pod-0");
    assert_eq!(
        (r.holder(), r.recorded_primary(), r.epoch),
        (Some("pod-0"), Some("pod-0"), 1)
    );
    let released = r.released();
    assert_eq!(released.holder(), None);
    assert_eq!(released.recorded_primary(), Some("pod-0"));
    assert_eq!(released.epoch, 1);
    let empty = ShardRecord {
        holder: Some(String::new()),
        ..released
    };
    assert_eq!(empty.holder(), None, "an empty holder is a release");
    assert!(r.held_by("pod-0") && !r.held_by("pod-1"));
    assert!(
        !r.released().held_by("pod-0"),
        "nobody holds a released record"
    );
}

#[test]
fn fence_pauses_for_a_lease_and_demotion_targets_the_recorded_address() {
    assert_eq!(
        local(&holder_view(10_000, 0)),
        LocalAction::Fence {
            until: Millis(25_000),
            reason: "could not renew the record before my renew deadline".into()
        }
    );
    let LocalAction::Demote { to, .. } = local(&follower_view(master("run", 1_000))) else {
        panic!("expected a demotion")
    };
    assert_eq!(to, "10.0.0.11:6379");
}

// ------------------------------------------------------------------------------------------
// promote(): the coordinator's failover decision.
// ------------------------------------------------------------------------------------------

fn member(pod: &str, role: Role, offset: u64, zone: &str) -> ShardMember {
    ShardMember {
        pod: pod.into(),
        valkey: Some(MemberValkey {
            role,
            offset,
            link_up: role == Role::Replica,
            fresh: false,
            keys: 10,
        }),
        zone: Some(zone.into()),
        terminating: false,
        node_ready: true,
        node_schedulable: true,
    }
}

/// pod-0 holds the record (epoch 5, seen changing at 0); pod-1 and pod-2 replicate.
fn shard(now: u64) -> ShardView {
    ShardView {
        now: Millis(now),
        leader: true,
        record: Some(seen(Some(record(Some("pod-0"), Some("pod-0"), 5)), 0)),
        lease_ms: 15_000,
        members: vec![
            member("pod-0", Role::Primary, 1_000, "a"),
            member("pod-1", Role::Replica, 900, "b"),
            member("pod-2", Role::Replica, 950, "c"),
        ],
        preferred_zone: Some("a".into()),
    }
}

#[test]
fn promotes_the_highest_offset_once_the_lease_ran_out() {
    let held = promote(&shard(14_999), &FailoverPolicy::default()).unwrap_err();
    assert_eq!(held.kind, HoldKind::Held);
    let p = promote(&shard(15_000), &FailoverPolicy::default()).unwrap();
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
    let p = promote(&view, &FailoverPolicy::default()).unwrap();
    assert!(p.empty, "{p:?}");
    // One member with a key is enough to say nothing.
    view.members[1].valkey.as_mut().unwrap().keys = 1;
    assert!(!promote(&view, &FailoverPolicy::default()).unwrap().empty);
}

/// The holder's own lease, when longer, is what the record is judged by (a rolling change of
/// lease settings); a record claiming more than an hour is judged by an hour.
#[test]
fn expiry_is_judged_by_the_holders_lease_up_to_an_hour() {
    use valkey_sidecar_core::replication::{MAX_LEASE_MS, judged_lease_ms};
    let cases = [
        (15_000, None, 15_000),
        (15_000, Some(10_000), 15_000),
        (15_000, Some(30_000), 30_000),
        (15_000, Some(u64::MAX), MAX_LEASE_MS),
    ];
    for (own, recorded, want) in cases {
        assert_eq!(judged_lease_ms(own, recorded), want, "{own} {recorded:?}");
    }
    let longer = |now: u64, lease_ms: u64| {
        let mut v = shard(now);
        let rec = v.record.as_mut().unwrap().record.as_mut().unwrap();
        rec.lease_ms = Some(lease_ms);
        promote(&v, &FailoverPolicy::default())
    };
    assert_eq!(longer(29_999, 30_000).unwrap_err().kind, HoldKind::Held);
    assert!(longer(30_000, 30_000).unwrap().reason.contains("30000 ms"));
    let forged = longer(MAX_LEASE_MS - 1, u64::MAX / 1000 * 1000);
    assert_eq!(forged.unwrap_err().kind, HoldKind::Held);
    assert!(longer(MAX_LEASE_MS, u64::MAX / 1000 * 1000).is_ok());
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
        promote(&v, &FailoverPolicy::default()).unwrap_err().kind,
        HoldKind::Held
    );
    v.now = Millis(61_010 + 15_000);
    assert!(promote(&v, &FailoverPolicy::default()).is_ok());
}

#[test]
fn a_released_record_is_taken_at_once() {
    let mut v = shard(1);
    v.record = Some(seen(Some(record(None, Some("pod-0"), 5)), 0));
    v.members[0].valkey = None;
    let p = promote(&v, &FailoverPolicy::default()).unwrap();
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
        promote(&v, &FailoverPolicy::default()).unwrap().target,
        "pod-1"
    );
    v.preferred_zone = None;
    assert_eq!(
        promote(&v, &FailoverPolicy::default()).unwrap().target,
        "pod-1"
    );
    v.members[1].zone = Some("c".into());
    v.preferred_zone = Some("c".into());
    assert_eq!(
        promote(&v, &FailoverPolicy::default()).unwrap().target,
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
    let p = promote(&alone, &policy).unwrap();
    assert_eq!((p.target.as_str(), p.epoch), ("pod-0", 6));
    assert!(p.reason.contains("the last primary"), "{}", p.reason);
    // Its replicas came back empty: they hold nothing the last primary lacks.
    let p = promote(
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
            promote(&v, &policy).unwrap_err().kind,
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
        assert!(promote(&released(vec![last]), &policy).is_err());
    }
    // A held record stays held.
    let held = ShardView {
        members: vec![member("pod-0", Role::Primary, 0, "a")],
        ..shard(1_000)
    };
    assert_eq!(promote(&held, &policy).unwrap_err().kind, HoldKind::Held);
}

#[test]
fn blocked_promotions_say_why() {
    let policy = FailoverPolicy::default();
    let mut v = shard(20_000);
    v.members[1].terminating = true;
    v.members[2].valkey.as_mut().unwrap().fresh = true;
    let h = promote(&v, &policy).unwrap_err();
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
    let h = promote(&v, &policy).unwrap_err();
    assert!(h.reason.contains("pod-1 is on a node"), "{}", h.reason);
    assert!(h.reason.contains("pod-2 does not answer"), "{}", h.reason);

    let rows = [
        (
            ShardView {
                leader: false,
                ..shard(20_000)
            },
            HoldKind::NotLeader,
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
                ..shard(20_000)
            },
            HoldKind::NoRecord,
        ),
    ];
    for (v, want) in rows {
        assert_eq!(promote(&v, &policy).unwrap_err().kind, want);
    }
    let off = FailoverPolicy { automatic: false };
    assert_eq!(
        promote(&shard(20_000), &off).unwrap_err().kind,
        HoldKind::Disabled
    );
}

// ------------------------------------------------------------------------------------------
// The switchover step machine.
// ------------------------------------------------------------------------------------------

fn plan() -> SwitchoverPlan {
    SwitchoverPlan {
        from: "pod-0".into(),
        to: "pod-1".into(),
        to_addr: "10.0.0.11 6379".into(),
        others: vec!["pod-2".into()],
        epoch: 5,
        timeout_ms: 5_000,
    }
}

fn obs(
    paused: Option<u64>,
    target: Option<u64>,
    write: Option<WriteOutcome>,
) -> SwitchoverObservation {
    SwitchoverObservation {
        paused_offset: paused,
        target_offset: target,
        write,
    }
}

#[test]
fn switchover_happy_path() {
    let s = Switchover::new(plan(), Millis(0));
    let (s, c) = step(&s, &obs(None, None, None), Millis(0));
    assert_eq!(
        c,
        vec![Command::Pause {
            pod: "pod-0".into(),
            ms: 10_000
        }]
    );
    let (s, c) = step(&s, &obs(Some(100), Some(90), None), Millis(10));
    assert_eq!(s.phase, Phase::CatchingUp { offset: 100 });
    assert!(c.is_empty());
    let (s, c) = step(&s, &obs(Some(100), Some(100), None), Millis(20));
    assert_eq!(s.phase, Phase::Writing);
    assert_eq!(
        c,
        vec![Command::WriteRecord {
            holder: "pod-1".into(),
            epoch: 6,
            expect_holder: "pod-0".into(),
            expect_epoch: 5
        }]
    );
    let (s, c) = step(
        &s,
        &obs(None, None, Some(WriteOutcome::Written)),
        Millis(30),
    );
    assert_eq!(s.phase, Phase::Done);
    assert!(s.finished());
    assert_eq!(
        c,
        vec![
            Command::PromoteNoOne {
                pod: "pod-1".into()
            },
            Command::ReplicaOf {
                pod: "pod-0".into(),
                to: "10.0.0.11 6379".into()
            },
            Command::ReplicaOf {
                pod: "pod-2".into(),
                to: "10.0.0.11 6379".into()
            },
            Command::Unpause {
                pod: "pod-0".into()
            },
        ]
    );
    assert_eq!(step(&s, &obs(None, None, None), Millis(40)).1, vec![]);
}

#[test]
fn switchover_rolls_back_when_the_target_lags() {
    let s = Switchover::new(plan(), Millis(0));
    let (s, _) = step(&s, &obs(None, None, None), Millis(0));
    let (s, _) = step(&s, &obs(Some(100), Some(50), None), Millis(100));
    let (s, c) = step(&s, &obs(Some(100), Some(99), None), Millis(5_000));
    assert!(matches!(s.phase, Phase::RolledBack { .. }), "{:?}", s.phase);
    assert_eq!(
        c,
        vec![Command::Unpause {
            pod: "pod-0".into()
        }]
    );
}

#[test]
fn switchover_rolls_back_when_the_pause_never_reports() {
    let s = Switchover::new(plan(), Millis(0));
    let (s, _) = step(&s, &obs(None, None, None), Millis(0));
    let (s, c) = step(&s, &obs(None, Some(100), None), Millis(5_000));
    assert!(matches!(s.phase, Phase::RolledBack { .. }));
    assert_eq!(
        c,
        vec![Command::Unpause {
            pod: "pod-0".into()
        }]
    );
}

#[test]
fn switchover_rolls_back_when_the_record_moved() {
    let s = Switchover::new(plan(), Millis(0));
    let (s, _) = step(&s, &obs(None, None, None), Millis(0));
    let (s, _) = step(&s, &obs(Some(100), Some(100), None), Millis(10));
    let (s, c) = step(
        &s,
        &obs(None, None, Some(WriteOutcome::Refused)),
        Millis(20),
    );
    assert!(matches!(s.phase, Phase::RolledBack { .. }));
    assert_eq!(
        c,
        vec![Command::Unpause {
            pod: "pod-0".into()
        }]
    );
}

#[test]
fn an_unresolved_write_keeps_the_old_primary_paused() {
    let s = Switchover::new(plan(), Millis(0));
    let (s, _) = step(&s, &obs(None, None, None), Millis(0));
    let (s, _) = step(&s, &obs(Some(100), Some(100), None), Millis(4_000));
    // Past the catch-up deadline, but the write may have landed: no rollback, the pause is kept.
    let (s, c) = step(&s, &obs(None, None, None), Millis(4_999));
    assert!(c.is_empty());
    let (s, c) = step(&s, &obs(None, None, None), Millis(5_000));
    assert_eq!(s.phase, Phase::Writing);
    assert_eq!(
        c,
        vec![Command::Pause {
            pod: "pod-0".into(),
            ms: 10_000
        }]
    );
    let (_, c) = step(&s, &obs(None, None, None), Millis(9_000));
    assert!(c.is_empty());
}

// ------------------------------------------------------------------------------------------
// Properties.
// ------------------------------------------------------------------------------------------

const PODS: [&str; 3] = ["pod-0", "pod-1", "pod-2"];

fn pod() -> impl Strategy<Value = String> {
    prop::sample::select(PODS.to_vec()).prop_map(str::to_owned)
}

fn shard_record() -> impl Strategy<Value = ShardRecord> {
    (
        prop::option::of(pod()),
        prop::option::of(pod()),
        0u64..1_000,
    )
        .prop_map(|(h, p, e)| ShardRecord {
            lease_ms: None,
            holder: h,
            primary: p,
            epoch: e,
            version: format!("v{e}"),
        })
}

/// A read record; it exists with probability `exists`.
fn seen_record(exists: f64) -> impl Strategy<Value = SeenRecord> {
    let record = prop::option::weighted(exists, shard_record());
    (record, 0u64..40_000, 0u64..40_000).prop_map(|(r, read, changed)| SeenRecord {
        record: r,
        read_at: Millis(read),
        changed_at: Millis(changed.min(read)),
    })
}

/// Every valid timing, built rather than filtered: retry, then a renew deadline just above
/// 1.2 × retry plus any slack, then a lease just above that plus any slack (tight margins
/// included).
fn timings() -> impl Strategy<Value = LeaseTimings> {
    (1u64..20_000, 0u64..30_000, 0u64..30_000)
        .prop_map(|(retry_ms, rd_slack, lease_slack)| {
            let renew_deadline_ms = retry_ms * 6 / 5 + 1 + rd_slack;
            LeaseTimings {
                lease_ms: renew_deadline_ms + 1 + lease_slack,
                renew_deadline_ms,
                retry_ms,
            }
        })
        .prop_filter("client-go timings", |t| t.validate().is_ok())
}

fn member_strategy() -> impl Strategy<Value = ShardMember> {
    let valkey = (
        prop_oneof![1 => Just(Role::Primary), 4 => Just(Role::Replica), 1 => Just(Role::Unknown)],
        0u64..2_000,
        any::<bool>(),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(role, offset, link_up, fresh)| MemberValkey {
            role,
            offset,
            link_up,
            fresh,
            keys: if fresh { 0 } else { offset },
        });
    (
        pod(),
        prop::option::weighted(0.8, valkey),
        prop::option::of(prop::sample::select(vec!["a", "b", "c"])),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.9),
    )
        .prop_map(
            |(pod, valkey, zone, terminating, node_ready, node_schedulable)| ShardMember {
                pod,
                valkey,
                zone: zone.map(str::to_owned),
                terminating,
                node_ready,
                node_schedulable,
            },
        )
}

fn shard_view() -> impl Strategy<Value = ShardView> {
    (
        0u64..60_000,
        prop::bool::weighted(0.8),
        prop::option::weighted(0.95, seen_record(0.95)),
        1u64..30_000,
        prop::collection::vec(member_strategy(), 0..6),
        prop::option::of(prop::sample::select(vec!["a", "b", "c"])),
    )
        .prop_map(|(now, leader, record, lease_ms, mut members, zone)| {
            // Pod names are unique within a shard.
            members.sort_by(|a, b| a.pod.cmp(&b.pod));
            members.dedup_by(|a, b| a.pod == b.pod);
            ShardView {
                now: Millis(now),
                leader,
                record,
                lease_ms,
                members,
                preferred_zone: zone.map(str::to_owned),
            }
        })
}

fn local_valkey() -> impl Strategy<Value = LocalValkey> {
    let role = prop_oneof![
        Just(LocalRole::Primary),
        prop::sample::select(vec!["10.0.0.10:6379", "10.0.0.11:6379", "10.0.0.12:6379"])
            .prop_map(|of| LocalRole::Replica { of: of.into() }),
    ];
    (
        role,
        any::<bool>(),
        prop::sample::select(vec!["r1", "r2"]),
        0u64..40_000,
    )
        .prop_map(|(role, fresh, run, since)| LocalValkey {
            role,
            fresh,
            run_id: run.into(),
            since: Millis(since),
            observed_at: Millis(since),
        })
}

/// Half the views are lined up so that this agent is the holder on record, with a holding for
/// the record's epoch and its Valkey's run: the paths where it may act as primary.
fn local_view() -> impl Strategy<Value = LocalView> {
    (any_local_view(), any::<bool>()).prop_map(|(mut v, align)| {
        let holder = v
            .record
            .as_ref()
            .and_then(|s| s.record.as_ref())
            .and_then(|r| Some((r.holder()?.to_owned(), r.epoch)));
        if let (true, Some((me, epoch))) = (align, holder) {
            v.me = me;
            let run = v.valkey.as_ref().map(|k| k.run_id.clone());
            if let (Some(h), Some(run)) = (v.holding.as_mut(), run) {
                h.epoch = epoch;
                h.run_id = run;
            }
        }
        v
    })
}

fn any_local_view() -> impl Strategy<Value = LocalView> {
    let holding = (
        0u64..1_000,
        0u64..40_000,
        prop::sample::select(vec!["r1", "r2"]),
    )
        .prop_map(|(epoch, at, run)| holding(epoch, at, run));
    (
        (0u64..40_000, pod(), prop::option::of(0u32..3), timings()),
        prop::option::weighted(0.85, local_valkey()),
        prop::option::weighted(0.9, seen_record(0.7)),
        prop::option::weighted(0.7, holding),
        prop::option::of((0u64..60_000).prop_map(Millis)),
        prop::option::weighted(
            0.8,
            prop::sample::select(vec!["10.0.0.10:6379", "10.0.0.11:6379", "10.0.0.12:6379"]),
        ),
        any::<bool>(),
    )
        .prop_map(
            |(
                (now, me, node_index, timings),
                valkey,
                record,
                holding,
                fenced_until,
                addr,
                other,
            )| LocalView {
                now: Millis(now),
                me,
                node_index,
                timings,
                valkey,
                record,
                holding,
                fenced_until,
                primary_addr: addr.map(str::to_owned),
                other_master: other,
            },
        )
}

/// Whether the view shows a renewal of the record, by this agent, valid now for this Valkey run.
fn holds_validly(v: &LocalView) -> bool {
    let (Some(valkey), Some(rec), Some(h)) = (
        v.valkey.as_ref(),
        v.record.as_ref().and_then(|s| s.record.as_ref()),
        v.holding.as_ref(),
    ) else {
        return false;
    };
    rec.holder() == Some(v.me.as_str())
        && h.epoch == rec.epoch
        && h.run_id == valkey.run_id
        && v.now < h.deadline(&v.timings)
}

fn fence_lasts(v: &LocalView) -> bool {
    v.fenced_until
        .is_some_and(|u| u.since(v.now) >= v.timings.lease_ms / 2)
}

#[derive(Debug, Clone)]
struct SwitchStep {
    dt: u64,
    obs: SwitchoverObservation,
}

fn switch_steps() -> impl Strategy<Value = Vec<SwitchStep>> {
    let outcome = prop::option::weighted(
        0.3,
        prop::sample::select(vec![WriteOutcome::Written, WriteOutcome::Refused]),
    );
    let step = (
        0u64..3_000,
        prop::option::weighted(0.6, 0u64..1_000),
        prop::option::weighted(0.8, 0u64..1_200),
        outcome,
    )
        .prop_map(|(dt, paused, target, write)| SwitchStep {
            dt,
            obs: obs(paused, target, write),
        });
    prop::collection::vec(step, 1..40)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// A held record seen changing within the lease is never taken over.
    #[test]
    fn never_promotes_while_the_record_is_held_and_fresh(v in shard_view()) {
        let held_fresh = v.record.as_ref().is_some_and(|s| {
            s.record.as_ref().is_some_and(|r| r.holder().is_some())
                && v.now < s.changed_at.plus(v.lease_ms)
        });
        if held_fresh {
            prop_assert!(promote(&v, &FailoverPolicy::default()).is_err());
        }
    }

    /// Only the coordinator promotes.
    #[test]
    fn never_promotes_when_not_leader(mut v in shard_view()) {
        v.leader = false;
        let hold = promote(&v, &FailoverPolicy::default()).unwrap_err();
        prop_assert_eq!(hold.kind, HoldKind::NotLeader);
    }

    /// The target is an answering, synced replica on a usable node, not going away, not the
    /// recorded primary, with the highest offset of all such members — or, when no other member
    /// can hold data, the recorded primary answering as one; the epoch goes up by one.
    #[test]
    fn the_target_is_always_eligible(v in shard_view()) {
        let Ok(p) = promote(&v, &FailoverPolicy::default()) else { return Ok(()) };
        let rec = v.record.as_ref().unwrap().record.as_ref().unwrap();
        let m = v.members.iter().find(|m| m.pod == p.target).unwrap();
        let mv = m.valkey.as_ref().expect("answering");
        if rec.recorded_primary() == Some(p.target.as_str()) {
            prop_assert_eq!(mv.role, Role::Primary);
            prop_assert!(!mv.fresh);
            prop_assert!(!m.terminating && m.node_ready && m.node_schedulable);
            let others = v.members.iter().filter(|o| o.pod != p.target);
            prop_assert!(others.clone().all(|o| o.valkey.as_ref().is_some_and(|ov| ov.fresh)));
            prop_assert_eq!(p.epoch, rec.epoch + 1);
            return Ok(());
        }
        prop_assert!(rec.holder() != Some(p.target.as_str()));
        prop_assert!(rec.primary.as_deref() != Some(p.target.as_str()));
        prop_assert!(!m.terminating && m.node_ready && m.node_schedulable);
        prop_assert_eq!(mv.role, Role::Replica);
        prop_assert!(!mv.fresh);
        prop_assert_eq!(p.epoch, rec.epoch + 1);
        prop_assert_eq!(p.record().epoch, p.epoch);
        prop_assert!(!p.repoint.contains(&p.target) && !p.fence.contains(&p.target));
        prop_assert_eq!(p.repoint.len(), v.members.len() - 1);
        let better = v.members.iter().any(|o| {
            let ahead = o.valkey.as_ref().is_some_and(|ov| {
                ov.role == Role::Replica && !ov.fresh && ov.offset > mv.offset
            });
            o.pod != rec.holder().unwrap_or_default()
                && Some(o.pod.as_str()) != rec.primary.as_deref()
                && !o.terminating && o.node_ready && o.node_schedulable
                && ahead
        });
        prop_assert!(!better, "a replica with a higher offset was passed over");
    }

    /// Chained decisions, each applied to the store, only ever raise the epoch; a switchover
    /// writes exactly the next epoch.
    #[test]
    fn epochs_strictly_increase(
        views in prop::collection::vec(shard_view(), 1..10),
        first in 0u64..100,
    ) {
        let mut current = record(Some("pod-0"), Some("pod-0"), first);
        for mut v in views {
            v.leader = true;
            v.record = Some(seen(Some(current.clone()), 0));
            v.now = Millis(v.lease_ms);
            if let Ok(p) = promote(&v, &FailoverPolicy::default()) {
                prop_assert!(p.record().epoch > current.epoch);
                current = p.record();
            }
        }
        let s = Switchover::new(SwitchoverPlan { epoch: first, ..plan() }, Millis(0));
        let (s, _) = step(&s, &obs(None, None, None), Millis(0));
        let (_, c) = step(&s, &obs(Some(1), Some(1), None), Millis(1));
        let Some(Command::WriteRecord { epoch, expect_epoch, .. }) = c.first() else {
            panic!("{c:?}")
        };
        prop_assert!(*epoch > *expect_epoch);
    }

    /// For all valid timings: a holder whose last successful renewal was sent at `sent` fences at
    /// its deadline, and that is strictly before the earliest instant the coordinator — which
    /// saw the renewal `seen_delay` later — may promote. From then on, until it can renew, it
    /// stays fenced.
    #[test]
    fn a_holder_that_cannot_renew_fences_before_anyone_may_promote(
        t in timings(),
        sent in 0u64..100_000,
        seen_delay in 0u64..5_000,
        probes in prop::collection::vec(0u64..200_000, 1..20),
    ) {
        let rec = record(Some("pod-0"), Some("pod-0"), 7);
        let holder = |now: u64, fenced_until: Option<Millis>| LocalView {
            now: Millis(now),
            timings: t,
            valkey: Some(master("run", 0)),
            record: Some(seen(Some(rec.clone()), sent)),
            holding: Some(holding(7, sent, "run")),
            primary_addr: Some("10.0.0.10:6379".into()),
            fenced_until,
            ..view(now)
        };
        let coordinator = |now: u64| ShardView {
            now: Millis(now),
            record: Some(seen(Some(rec.clone()), sent + seen_delay)),
            lease_ms: t.lease_ms,
            ..shard(now)
        };
        let deadline = sent + t.renew_deadline_ms;
        let fence = local(&holder(deadline, None));
        let LocalAction::Fence { until, .. } = fence else {
            panic!("no fence at the deadline: {fence:?}")
        };
        // The earliest instant a promotion is allowed, and the instant before it.
        let earliest = sent + seen_delay + t.lease_ms;
        prop_assert!(promote(&coordinator(earliest), &FailoverPolicy::default()).is_ok());
        prop_assert!(promote(&coordinator(earliest - 1), &FailoverPolicy::default()).is_err());
        prop_assert!(deadline < earliest);
        for p in probes {
            let now = sent + p;
            if promote(&coordinator(now), &FailoverPolicy::default()).is_ok() {
                prop_assert!(deadline < now, "promoted at {} before deadline {}", now, deadline);
            }
            if now >= deadline {
                // Fenced (or told to refresh the fence, or to keep renewing behind it) — never
                // unfenced writes.
                let fenced = if now < until.0 { Some(until) } else { None };
                let a = local(&holder(now, fenced));
                let renewing = fenced.is_some() && matches!(a, LocalAction::Renew { .. });
                prop_assert!(matches!(a, LocalAction::Fence { .. }) || renewing, "{:?}", a);
            } else {
                let a = local(&holder(now, None));
                prop_assert!(!matches!(a, LocalAction::Fence { .. }), "fenced early: {:?}", a);
            }
        }
    }

    /// A master accepts writes unfenced only while its agent holds a valid renewal of a record
    /// naming it: Nothing/Unfence need one, Renew needs one or a fence that still lasts.
    #[test]
    fn an_advertised_primary_always_holds_a_valid_renewal_of_the_current_epoch(v in any_local_view()) {
        if may_advertise(&v) {
            prop_assert!(holds_validly(&v), "advertised without a valid renewal: {v:?}");
            prop_assert!(v.fenced_until.is_none());
            let epoch = v.record.as_ref().and_then(|s| s.record.as_ref()).map(|r| r.epoch);
            prop_assert_eq!(v.holding.as_ref().map(|h| h.epoch), epoch);
        }
    }

    #[test]
    fn a_master_without_a_valid_renewal_is_never_left_unfenced(v in local_view()) {
        let is_master = v.valkey.as_ref().is_some_and(|k| k.role == LocalRole::Primary);
        if !is_master {
            return Ok(());
        }
        let a = local(&v);
        match a {
            LocalAction::Nothing { .. } | LocalAction::Unfence { .. } => {
                prop_assert!(holds_validly(&v), "{:?}", a)
            }
            LocalAction::Renew { .. } => {
                prop_assert!(holds_validly(&v) || fence_lasts(&v), "{:?}", a)
            }
            LocalAction::Wait { .. } => prop_assert!(fence_lasts(&v), "{:?}", a),
            LocalAction::Bootstrap { epoch, .. } => {
                let absent = v.record.as_ref().is_some_and(|s| s.record.is_none());
                let valkey = v.valkey.as_ref().unwrap();
                // The holder, validly and with this run's data, re-creates one above its epoch; else
                // only node-index 0 creates epoch 1, and only when nobody else has data.
                let last_holder = v.holding.as_ref().is_some_and(|h| {
                    let valid = v.now < h.deadline(&v.timings);
                    valid && h.run_id == valkey.run_id && !valkey.fresh && epoch == h.epoch + 1
                });
                let first = epoch == 1 && v.node_index == Some(0) && !v.other_master;
                prop_assert!(absent && (last_holder || first), "{:?}", a);
            }
            _ => {}
        }
    }

    /// A fresh, empty node never makes itself primary while a record or another master with data
    /// exists: no bootstrap, no renewal, no unfencing; a fresh master is fenced or on its way out.
    #[test]
    fn a_fresh_node_never_claims_an_existing_shard(
        mut v in local_view(),
        rec in shard_record(),
        has_record in any::<bool>(),
    ) {
        let Some(valkey) = v.valkey.as_mut() else { return Ok(()) };
        valkey.fresh = true;
        v.holding = None;
        if has_record {
            v.record = Some(SeenRecord { record: Some(rec), read_at: v.now, changed_at: v.now });
        } else {
            v.other_master = true;
        }
        let a = local(&v);
        let claims = matches!(
            a,
            LocalAction::Bootstrap { .. } | LocalAction::Renew { .. } | LocalAction::Unfence { .. }
        );
        prop_assert!(!claims, "{:?}", a);
        if v.valkey.as_ref().unwrap().role == LocalRole::Primary {
            let out = matches!(
                a,
                LocalAction::Fence { .. } | LocalAction::Rejoin { .. } | LocalAction::Release { .. }
            );
            let fenced_wait = matches!(a, LocalAction::Wait { .. }) && fence_lasts(&v);
            prop_assert!(out || fenced_wait, "{:?}", a);
        }
    }

    /// The record moves only after the target reached the offset read under the pause, and only
    /// before the deadline; a switchover that times out before that unpauses and never writes;
    /// every finished switchover has lifted its last pause; promotion follows a written record.
    #[test]
    fn switchover_is_lossless_and_always_unpauses(steps in switch_steps(), timeout in 1u64..8_000) {
        let p = SwitchoverPlan { timeout_ms: timeout, ..plan() };
        let mut s = Switchover::new(p, Millis(0));
        let mut now = Millis(0);
        let mut all: Vec<Command> = Vec::new();
        for st in steps {
            now = now.plus(st.dt);
            let before = s.clone();
            let (next, cmds) = step(&s, &st.obs, now);
            for c in &cmds {
                if let Command::WriteRecord { .. } = c {
                    let Phase::CatchingUp { offset } = before.phase else {
                        // Written straight from Pausing: the offset is this observation's.
                        let off = st.obs.paused_offset.unwrap();
                        prop_assert!(st.obs.target_offset.unwrap() >= off);
                        prop_assert!(now < s.deadline());
                        continue;
                    };
                    prop_assert!(st.obs.target_offset.is_some_and(|t| t >= offset));
                    prop_assert!(now < s.deadline());
                }
                if let Command::PromoteNoOne { .. } = c {
                    prop_assert_eq!(&before.phase, &Phase::Writing);
                    prop_assert_eq!(st.obs.write, Some(WriteOutcome::Written));
                }
            }
            let waiting = matches!(before.phase, Phase::Pausing | Phase::CatchingUp { .. });
            let timed_out = waiting && now >= s.deadline();
            if timed_out {
                prop_assert!(matches!(next.phase, Phase::RolledBack { .. }), "{:?}", next.phase);
                prop_assert_eq!(&cmds, &vec![Command::Unpause { pod: "pod-0".into() }]);
            }
            all.extend(cmds);
            s = next;
        }
        let writes = all.iter().filter(|c| matches!(c, Command::WriteRecord { .. })).count();
        prop_assert!(writes <= 1);
        if let Phase::RolledBack { reason } = &s.phase {
            let promoted = all.iter().any(|c| matches!(c, Command::PromoteNoOne { .. }));
            prop_assert!(!promoted, "{:?}", all);
            if writes == 0 {
                prop_assert!(!reason.is_empty());
            }
        }
        if s.finished() {
            let last_pause = all.iter().rposition(|c| matches!(c, Command::Pause { .. }));
            let last_unpause = all.iter().rposition(|c| matches!(c, Command::Unpause { .. }));
            prop_assert!(last_unpause > last_pause, "{:?}", all);
        }
    }
}
