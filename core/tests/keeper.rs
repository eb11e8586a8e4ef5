//! Replication mode, the agent beside each Valkey (`replication::local`): one table row per
//! situation, and the claim, trust and fencing rules around it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::*;
use valkey_sidecar_core::heartbeat::{PeerSight, Promise, VouchedUntil};
use valkey_sidecar_core::observation::{History, Observation, PrimaryLink, Role};
use valkey_sidecar_core::replication::{
    LocalAction, LocalRole, LocalValkey, LocalView, NOT_FOLLOWING, RunTrust, SeenRecord,
    ShardRecord, Successor, ValkeyMemory, address_fresh, awaiting_promotion, claim, keeper,
    may_advertise, successor_wanted,
};
use valkey_sidecar_core::time::Millis;

// ------------------------------------------------------------------------------------------
// keeper::decide(): one table row per situation.
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
            "old primary, successor still a replica (forged record)",
            LocalView {
                successor: Some(Successor {
                    primary: false,
                    ..promoted("B", 1_200, "A", 1_000)
                }),
                ..follower_view(master("run", 1_000))
            },
            "fence",
        ),
        (
            "old primary, successor does not answer",
            LocalView {
                successor: None,
                ..follower_view(master("run", 1_000))
            },
            "fence",
        ),
        (
            "old primary, successor an empty master",
            LocalView {
                successor: Some(Successor {
                    primary: true,
                    history: stream("C", 0),
                }),
                ..follower_view(master("run", 1_000))
            },
            "fence",
        ),
        (
            "empty master, successor recorded",
            follower_view(fresh(master("run", 1_000))),
            "rejoin",
        ),
        (
            "empty master, successor still a replica: nothing to lose",
            LocalView {
                successor: None,
                ..follower_view(fresh(master("run", 1_000)))
            },
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
        let got = keeper::decide(&v);
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
    match keeper::decide(&v) {
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
        keeper::decide(&holder_view(10_000, 0)),
        LocalAction::Fence {
            until: Millis(25_000),
            reason: "could not renew the record before my renew deadline".into()
        }
    );
    let LocalAction::Demote { to, .. } = keeper::decide(&follower_view(master("run", 1_000)))
    else {
        panic!("expected a demotion")
    };
    assert_eq!(to, "10.0.0.11:6379");
}

/// `REPLICAOF` to the recorded successor only where Valkey's partial resync keeps every byte of
/// ours, or the successor's promoted stream is already past us (later failovers): never onto a
/// lagging stream or a stranger, whatever the record says.
#[test]
fn an_old_primary_follows_only_a_successor_that_continues_its_data() {
    let with = |s: Successor| LocalView {
        successor: Some(s),
        ..follower_view(master("run", 1_000))
    };
    let kind = |s: Successor| keeper::decide(&with(s)).kind();
    // Promoted from our stream at our offset, or past it: nothing of ours is discarded.
    assert_eq!(kind(promoted("B", 1_000, "A", 1_000)), "demote");
    assert_eq!(kind(promoted("B", 5_000, "A", 1_500)), "demote");
    // Promoted from our stream before our last write (we were cut off and wrote on): followed,
    // the tail it lacks named in the reason.
    let behind = keeper::decide(&with(promoted("B", 1_200, "A", 990)));
    assert_eq!(behind.kind(), "demote");
    assert!(behind.reason().contains("10 bytes"), "{behind:?}");
    // Two failovers later, a stream already past our offset.
    assert_eq!(kind(promoted("C", 1_001, "B", 900)), "demote");
    let other = keeper::decide(&with(promoted("C", 999, "B", 900)));
    assert_eq!(other.kind(), "fence");
    assert!(other.reason().starts_with(NOT_FOLLOWING), "{other:?}");
    // The same stream, further on (a replica of ours could never be master of it otherwise).
    let same = Successor {
        primary: true,
        history: stream("A", 1_000),
    };
    assert_eq!(kind(same.clone()), "demote");
    let behind = Successor {
        history: stream("A", 999),
        ..same
    };
    assert_eq!(kind(behind), "fence");
    // Asked for only while it matters: a master with data, another pod named, its address known.
    assert!(successor_wanted(&follower_view(master("run", 1_000))));
    let mut empty = master("run", 1_000);
    empty.fresh = true;
    assert!(!successor_wanted(&follower_view(empty)));
    assert!(!successor_wanted(&holder_view(2_000, 0)));
}

/// A persistent shard scaled to 0 and back: every Valkey restarts as a master of a stream of its
/// own, so streams are compared by how far each got in the old one (RDB), or not at all (AOF:
/// offset 0, no past) and then by keys; a successor with less data is still refused.
#[test]
fn after_a_restart_from_disk_a_master_follows_one_with_at_least_its_data() {
    let ask = |mine: History, theirs: History| {
        let mut m = master("run", 1_000);
        m.history = mine;
        let successor = Successor {
            primary: true,
            history: theirs,
        };
        keeper::decide(&LocalView {
            successor: Some(successor),
            ..follower_view(m)
        })
    };
    let aof = |id: &str, keys| History {
        keys,
        ..stream(id, 0)
    };
    assert_eq!(ask(aof("M", 100), aof("P", 100)).kind(), "demote");
    assert_eq!(ask(aof("M", 100), aof("P", 120)).kind(), "demote");
    let fewer = ask(aof("M", 100), aof("P", 99));
    assert_eq!(fewer.kind(), "fence");
    assert!(fewer.reason().starts_with(NOT_FOLLOWING), "{fewer:?}");
    let rdb = |id: &str, at: u64, own: u64| History {
        replid2: Some("X".into()),
        second_offset: Some(at + 1),
        ..stream(id, at + own)
    };
    // It got as far in X as I did; the 50 bytes I took since my restart are named.
    let taken = ask(rdb("M", 1_000, 50), rdb("P", 1_000, 0));
    assert_eq!(taken.kind(), "demote");
    assert!(taken.reason().contains("50 bytes"), "{taken:?}");
    assert_eq!(ask(rdb("M", 1_000, 0), rdb("P", 900, 0)).kind(), "fence");
}

// ------------------------------------------------------------------------------------------
// Peer heartbeats: the isolation fence and the failsafe (`heartbeat`).
// ------------------------------------------------------------------------------------------

/// pod-1 and pod-2 expected; each `(peer, until, promised)` a vouch; silence judged from 0.
fn peers(vouches: &[(&str, u64, bool)]) -> Option<PeerSight> {
    let vouch = |(id, until, promised): &(&str, u64, bool)| {
        let v = VouchedUntil {
            until: Millis(*until),
            promised: *promised,
        };
        ((*id).to_owned(), v)
    };
    Some(PeerSight {
        expected: ["pod-1", "pod-2"].map(str::to_owned).into(),
        vouches: vouches.iter().map(vouch).collect(),
        judged_from: Millis(0),
    })
}

fn with_peers(mut v: LocalView, p: Option<PeerSight>) -> LocalView {
    v.peers = p;
    v
}

#[test]
fn heartbeat_table() {
    let fenced = |mut v: LocalView| {
        v.fenced_until = Some(Millis(20_000));
        v
    };
    let both = |until| peers(&[("pod-1", until, true), ("pod-2", until, true)]);
    let rows: Vec<(&str, LocalView, &str)> = vec![
        // A valid holder: one vouch is enough, none fences.
        (
            "vouched",
            with_peers(holder_view(1_000, 0), peers(&[("pod-1", 1_200, false)])),
            "nothing",
        ),
        (
            "nobody vouches",
            with_peers(holder_view(1_000, 0), peers(&[])),
            "fence",
        ),
        (
            "the last vouch ran out",
            with_peers(holder_view(1_000, 0), peers(&[("pod-1", 1_000, false)])),
            "fence",
        ),
        (
            "alone in the shard",
            with_peers(holder_view(1_000, 0), Some(PeerSight::default())),
            "nothing",
        ),
        (
            "in the grace after pinging began",
            with_peers(
                holder_view(1_000, 0),
                peers(&[]).map(|mut p| {
                    p.judged_from = Millis(1_001);
                    p
                }),
            ),
            "nothing",
        ),
        (
            "fenced, vouched again",
            fenced(with_peers(
                holder_view(1_000, 0),
                peers(&[("pod-2", 1_100, false)]),
            )),
            "unfence",
        ),
        (
            "fenced, still silent, renewal due",
            fenced(with_peers(holder_view(2_000, 0), peers(&[]))),
            "renew",
        ),
        (
            "fenced, still silent",
            fenced(with_peers(holder_view(1_000, 0), peers(&[]))),
            "wait",
        ),
        // Past the renew deadline (the apiserver out of reach): the failsafe.
        (
            "every member promised",
            with_peers(holder_view(10_000, 0), both(10_200)),
            "renew",
        ),
        (
            "fenced, every member promised",
            fenced(with_peers(holder_view(10_500, 0), both(10_700))),
            "unfence",
        ),
        (
            "one member without a promise",
            with_peers(
                holder_view(10_000, 0),
                peers(&[("pod-1", 10_200, true), ("pod-2", 10_200, false)]),
            ),
            "fence",
        ),
        (
            "one member silent",
            with_peers(holder_view(10_000, 0), peers(&[("pod-1", 10_200, true)])),
            "fence",
        ),
        (
            "promises ran out",
            with_peers(holder_view(10_000, 0), both(10_000)),
            "fence",
        ),
    ];
    for (name, v, want) in rows {
        assert_eq!(
            keeper::decide(&v).kind(),
            want,
            "{name}: {:?}",
            keeper::decide(&v)
        );
    }
}

/// Before the read (`keeper::before_read`), nothing waits on the apiserver: fences, and a fence
/// lifted on a valid renewal or on every member's promise. A renewal, and everything an agent
/// that holds nothing decides, waits for the read.
#[test]
fn a_holder_fences_and_lifts_its_fence_before_reading_the_record() {
    let fenced = |mut v: LocalView| {
        v.fenced_until = Some(Millis(20_000));
        v
    };
    let both = |until| peers(&[("pod-1", until, true), ("pod-2", until, true)]);
    let rows: Vec<(&str, LocalView, Option<&str>)> = vec![
        (
            "fenced past the deadline, every promise back",
            fenced(with_peers(holder_view(10_500, 0), both(10_700))),
            Some("unfence"),
        ),
        (
            "fenced past the deadline, one promise still missing",
            fenced(with_peers(
                holder_view(10_500, 0),
                peers(&[("pod-1", 10_700, true), ("pod-2", 10_700, false)]),
            )),
            None,
        ),
        (
            "past the deadline, a promise ran out",
            with_peers(holder_view(10_000, 0), both(10_000)),
            Some("fence"),
        ),
        (
            "fenced, valid renewal, vouched again",
            fenced(with_peers(
                holder_view(1_000, 0),
                peers(&[("pod-2", 1_100, false)]),
            )),
            Some("unfence"),
        ),
        (
            "past the deadline, every member promised: renewing needs the apiserver",
            with_peers(holder_view(10_000, 0), both(10_200)),
            None,
        ),
        (
            "holding nothing",
            fenced(with_peers(follower_view(master("run", 0)), both(10_700))),
            None,
        ),
    ];
    for (name, v, want) in rows {
        let got = keeper::before_read(&v);
        assert_eq!(got.as_ref().map(LocalAction::kind), want, "{name}: {got:?}");
    }
}

#[test]
fn a_member_named_primary_waits_out_its_promise() {
    let named = |now: u64, promise: Option<(&str, u64)>| LocalView {
        valkey: Some(replica_of("10.0.0.10:6379", 0)),
        record: Some(seen(Some(record(Some("pod-0"), Some("pod-0"), 5)), 900)),
        promise: promise.map(|(to, until)| Promise {
            to: to.into(),
            until: Millis(until),
        }),
        ..view(now)
    };
    let promised = keeper::decide(&named(1_000, Some(("pod-1", 1_900))));
    assert_eq!(promised.kind(), "wait", "{promised:?}");
    assert!(promised.reason().contains("promised pod-1"), "{promised:?}");
    assert_eq!(
        keeper::decide(&named(1_900, Some(("pod-1", 1_900)))).kind(),
        "renew"
    );
    assert_eq!(keeper::decide(&named(1_000, None)).kind(), "renew");
    // Promoted without its consent (a coordinator of an older version): fenced, no renewal,
    // until the promise ran out.
    let promoted = |now: u64, promise| LocalView {
        valkey: Some(master("run", 0)),
        ..named(now, promise)
    };
    let early = keeper::decide(&promoted(1_000, Some(("pod-1", 1_900))));
    assert_eq!(early.kind(), "fence", "{early:?}");
    assert!(early.reason().contains("promised pod-1"), "{early:?}");
    assert_eq!(
        keeper::decide(&promoted(1_900, Some(("pod-1", 1_900)))).kind(),
        "fence"
    );
}

#[test]
fn promises_are_asked_for_once_a_renewal_is_overdue() {
    let retry = T.retry_ms;
    let from = |renewed: u64| {
        let got = claim(&holder_view(renewed + 10, renewed)).unwrap();
        (got.epoch, got.promises_from)
    };
    assert_eq!(from(0), (3, Millis(2 * retry)));
    assert_eq!(from(5_000), (3, Millis(5_000 + 2 * retry)));
    assert_eq!(claim(&follower_view(replica_of("x", 0))), None);
    // Only the holder advertises past its deadline, and only on every member's promise.
    let lapsed = holder_view(10_000, 0);
    assert!(!may_advertise(&lapsed));
    let both = peers(&[("pod-1", 10_100, true), ("pod-2", 10_100, true)]);
    assert!(may_advertise(&with_peers(lapsed.clone(), both)));
    let one = peers(&[("pod-1", 10_100, true)]);
    assert!(!may_advertise(&with_peers(lapsed, one)));
}

// LocalValkey::read: the keeper's reading of its own Valkey.

#[test]
fn a_replica_is_fresh_only_without_keys_and_offset() {
    let mut obs = Observation {
        role: Role::Replica,
        link: Some(PrimaryLink {
            host: "127.1.0.2".into(),
            port: 6379,
            ..PrimaryLink::default()
        }),
        ..Observation::default()
    };
    assert!(obs.fresh());
    assert_eq!(
        LocalRole::of(&obs),
        Some(LocalRole::Replica {
            of: "127.1.0.2:6379".into()
        })
    );
    if let Some(l) = obs.link.as_mut() {
        l.offset = 10;
    }
    assert!(!obs.fresh());
    let primary = Observation {
        role: Role::Primary,
        keys: 1,
        ..Observation::default()
    };
    assert!(!primary.fresh());
}

fn run(role: Role, run_id: &str, keys: u64) -> Observation {
    Observation {
        role,
        run_id: Some(run_id.into()),
        keys,
        repl_offset: keys * 10,
        ..Observation::default()
    }
}

#[test]
fn a_loading_or_roleless_valkey_reads_as_unknown() {
    let mut memory = ValkeyMemory::default();
    let loading = Observation {
        loading: true,
        ..run(Role::Primary, "r1", 5)
    };
    assert_eq!(
        LocalValkey::read(&loading, Millis(0), Millis(0), &mut memory),
        None
    );
    let orphan = run(Role::Replica, "r1", 5);
    assert_eq!(
        LocalValkey::read(&orphan, Millis(0), Millis(0), &mut memory),
        None
    );
}

#[test]
fn the_role_is_dated_from_its_first_sight_in_this_run() {
    let mut memory = ValkeyMemory::default();
    let read = |obs: &Observation, now: u64, memory: &mut ValkeyMemory| {
        LocalValkey::read(obs, Millis(now), Millis(now), memory).unwrap()
    };
    assert_eq!(
        read(&run(Role::Primary, "r1", 5), 100, &mut memory).since,
        Millis(100)
    );
    assert_eq!(
        read(&run(Role::Primary, "r1", 6), 200, &mut memory).since,
        Millis(100)
    );
    // A restart is a new run: its role is new, however alike.
    assert_eq!(
        read(&run(Role::Primary, "r2", 6), 300, &mut memory).since,
        Millis(300)
    );
    let replica = Observation {
        link: Some(PrimaryLink {
            host: "10.0.0.1".into(),
            port: 6379,
            ..PrimaryLink::default()
        }),
        ..run(Role::Replica, "r2", 6)
    };
    let r = read(&replica, 400, &mut memory);
    assert_eq!((r.since, r.observed_at), (Millis(400), Millis(400)));
    assert!(!r.linked, "the link is not up yet");
    let mut linked = replica.clone();
    if let Some(l) = linked.link.as_mut() {
        l.up = true;
    }
    let r = read(&linked, 500, &mut memory);
    assert!(r.linked);
    assert_eq!(
        r.since,
        Millis(400),
        "the link coming up does not change the role"
    );
}

#[test]
fn a_master_whose_run_started_empty_or_restarted_stays_fresh_until_it_holds_the_record() {
    let fresh = |obs: &Observation, memory: &mut ValkeyMemory| {
        LocalValkey::read(obs, Millis(0), Millis(0), memory)
            .unwrap()
            .fresh
    };
    // Started empty: the keys it gains later (clients writing to an empty primary) are not the
    // shard's data.
    let mut memory = ValkeyMemory::default();
    assert!(fresh(&run(Role::Primary, "r1", 0), &mut memory));
    assert!(fresh(&run(Role::Primary, "r1", 9), &mut memory));
    memory.held("r1");
    assert!(!fresh(&run(Role::Primary, "r1", 9), &mut memory));
    // First seen with data: trusted; restarted under this agent: not, whatever it holds.
    let mut memory = ValkeyMemory::default();
    assert!(!fresh(&run(Role::Primary, "r1", 9), &mut memory));
    assert!(fresh(&run(Role::Primary, "r2", 9), &mut memory));
    // Holding the record with another run does not vouch for this one.
    memory.held("r1");
    assert!(fresh(&run(Role::Primary, "r2", 9), &mut memory));
}

// address_fresh: how long the recorded primary's looked-up address is used.

#[test]
fn an_address_is_asked_again_after_10_s_unless_proven_then_after_5_min() {
    let addr = "10.0.0.10:6379";
    let linked = LocalValkey {
        linked: true,
        ..replica_of(addr, 0)
    };
    let unlinked = replica_of(addr, 0);
    let elsewhere = LocalValkey {
        linked: true,
        ..replica_of("10.0.0.11:6379", 0)
    };
    let cases: [(&str, u64, bool, Option<&LocalValkey>, bool); 9] = [
        ("young, unproven", 9_999, false, None, true),
        ("old, unproven", 10_000, false, None, false),
        ("old, link down", 60_000, false, Some(&unlinked), false),
        ("old, linked to it", 60_000, false, Some(&linked), true),
        (
            "old, linked elsewhere",
            60_000,
            false,
            Some(&elsewhere),
            false,
        ),
        ("old, a master", 60_000, false, Some(&master("r", 0)), false),
        ("old, its own", 60_000, true, None, true),
        ("rechecked, linked", 300_000, false, Some(&linked), false),
        ("rechecked, its own", 300_000, true, None, false),
    ];
    for (name, age, own, valkey, fresh) in cases {
        assert_eq!(address_fresh(addr, age, own, valkey), fresh, "{name}");
    }
}
