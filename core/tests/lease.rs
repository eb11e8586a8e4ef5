//! `lease`: its tables, through the module's public entry points (tests of private helpers stay in the module).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use valkey_sidecar_core::lease::*;
use valkey_sidecar_core::time::Millis;

#[test]
fn a_call_gets_one_retry_period_and_at_least_half_a_second() {
    let t = |retry_ms| {
        LeaseTimings {
            retry_ms,
            ..LeaseTimings::default()
        }
        .call_limit_ms()
    };
    assert_eq!((t(2_000), t(500), t(100)), (2_000, 500, 500));
}

#[test]
fn a_renewal_and_an_acquire_may_take_a_renew_deadline() {
    let mut e = Candidate::new("a", T);
    e.observe(None, Millis(0));
    assert_eq!(e.next(Millis(0)).0, LeaseAction::Acquire);
    assert_eq!(e.write_limit_ms(), 10_000, "an acquire");
    e.written(held_by("a", "1"), Millis(1_000));
    // Renewed at 1 s: the term runs to 11 s. A renewal sent at 9.5 s and answered at 12 s starts
    // a term to 19.5 s: it may take a renew deadline, not what is left of the old term.
    assert_eq!(e.next(Millis(9_500)).0, LeaseAction::Renew);
    assert_eq!(e.write_limit_ms(), 10_000, "a renewal");
    e.written(held_by("a", "2"), Millis(9_500));
    assert!(e.is_coordinator(Millis(12_000)) && !e.is_coordinator(Millis(19_500)));
    e.observe(Some(held_by("b", "3")), Millis(20_000));
    assert_eq!(e.write_limit_ms(), 10_000, "no longer the holder");
}

/// A candidate the holder did not name gets one call for its acquire, a named one a renew deadline:
/// late candidates never hold the apiserver's seats for long while a successor takes over.
#[test]
fn only_a_named_successors_acquire_may_take_a_renew_deadline() {
    let limit = |identity: &str, successors: &[&str]| {
        let mut e = Candidate::new(identity, T);
        e.observe(Some(naming(held_by("h_1", "2"), successors)), Millis(0));
        e.write_limit_ms()
    };
    let limits = [
        limit("a_1", &["a", "b"]),
        limit("c_1", &["a", "b"]),
        limit("c_1", &[]),
    ];
    assert_eq!(limits, [10_000, 2_000, 10_000], "named, not named, no list");
}

const T: LeaseTimings = LeaseTimings {
    lease_ms: 15_000,
    renew_deadline_ms: 10_000,
    retry_ms: 2_000,
};

fn held_by(h: &str, version: &str) -> LeaseRecord {
    LeaseRecord {
        holder: Some(h.into()),
        lease_ms: 15_000,
        transitions: 0,
        version: version.into(),
        successors: Vec::new(),
    }
}

#[test]
fn timings_follow_client_go() {
    assert!(T.validate().is_ok());
    assert!(
        LeaseTimings {
            lease_ms: 10_000,
            ..T
        }
        .validate()
        .is_err()
    );
    assert!(
        LeaseTimings {
            retry_ms: 9_000,
            ..T
        }
        .validate()
        .is_err()
    );
}

#[test]
fn acquires_a_missing_lease() {
    let mut e = Candidate::new("a", T);
    assert_eq!(e.next(Millis(0)).0, LeaseAction::Read);
    e.observe(None, Millis(0));
    assert!(!e.exists());
    assert_eq!(e.next(Millis(0)).0, LeaseAction::Acquire);
    e.written(held_by("a", "1"), Millis(0));
    assert!(e.is_coordinator(Millis(1)));
    assert_eq!(
        e.next(Millis(1_000)).0,
        LeaseAction::Wait {
            until: Millis(2_000)
        }
    );
    assert_eq!(e.next(Millis(2_000)).0, LeaseAction::Renew);
}

#[test]
fn takes_over_only_after_a_full_lease_without_change() {
    let mut e = Candidate::new("b", T);
    e.observe(Some(held_by("a", "1")), Millis(0));
    assert_eq!(
        e.next(Millis(1_000)).0,
        LeaseAction::Wait {
            until: Millis(2_000)
        }
    );
    assert_eq!(e.next(Millis(14_999)).0, LeaseAction::Read);
    // The holder renewed at 10 s (new version): the clock starts again.
    e.observe(Some(held_by("a", "2")), Millis(10_000));
    assert_eq!(e.next(Millis(20_000)).0, LeaseAction::Read);
    e.observe(Some(held_by("a", "2")), Millis(20_000));
    assert_eq!(e.next(Millis(25_000)).0, LeaseAction::Acquire);
    assert_eq!(e.record_to_write().transitions, 1);
}

/// A watching follower reads nothing while the holder renews; it takes over a full lease
/// after the last change delivered, as a polling one does; a broken watch polls again.
#[test]
fn a_watching_follower_reads_nothing_and_takes_over_on_the_same_clock() {
    let mut e = Candidate::new("b", T);
    e.set_watching(true);
    assert_eq!(e.next(Millis(0)).0, LeaseAction::Read, "nothing known yet");
    e.observe(Some(held_by("a", "1")), Millis(0));
    let wait = |until| LeaseAction::Wait {
        until: Millis(until),
    };
    assert_eq!(e.next(Millis(1_000)).0, wait(15_000));
    // A renewal delivered by the watch at 2 s moves expiry to 17 s.
    e.observe(Some(held_by("a", "2")), Millis(2_000));
    assert_eq!(e.next(Millis(14_999)).0, wait(17_000));
    assert_eq!(e.next(Millis(17_000)).0, LeaseAction::Acquire);
    // A release delivered by the watch is taken at once.
    e.observe(Some(LeaseRecord::default()), Millis(3_000));
    assert_eq!(e.next(Millis(3_000)).0, LeaseAction::Acquire);
    // The watch broke: back to a read every retry period.
    e.observe(Some(held_by("a", "3")), Millis(4_000));
    e.set_watching(false);
    assert_eq!(e.next(Millis(5_000)).0, wait(6_000));
    assert_eq!(e.next(Millis(6_000)).0, LeaseAction::Read);
    assert!(e.wants_changes());
    e.written(held_by("b", "4"), Millis(6_000));
    assert!(!e.wants_changes(), "a holder needs no watch");
}

#[test]
fn a_longer_lease_of_the_holder_counts_but_at_most_twice_our_own() {
    let mut e = Candidate::new("b", T);
    let long = |ms| LeaseRecord {
        lease_ms: ms,
        ..held_by("a", "1")
    };
    e.observe(Some(long(20_000)), Millis(0));
    assert_eq!(e.next(Millis(19_999)).0, LeaseAction::Read);
    assert_eq!(e.next(Millis(20_000)).0, LeaseAction::Acquire);
    // A forged hour (or more) is honoured for two of our leases only.
    for forged in [MAX_LEASE_MS, u64::MAX] {
        let mut f = Candidate::new("b", T);
        f.observe(Some(long(forged)), Millis(0));
        assert_eq!(f.next(Millis(29_999)).0, LeaseAction::Read);
        assert_eq!(f.next(Millis(30_000)).0, LeaseAction::Acquire);
    }
}

#[test]
fn a_recreated_pod_of_the_same_name_waits_out_the_old_holders_lease() {
    let old = election_identity("valkey-0-0", Some("uid-1"));
    let restarted = Candidate::new(old.clone(), T);
    let recreated = Candidate::new(election_identity("valkey-0-0", Some("uid-2")), T);
    for (mut e, takes) in [(restarted, true), (recreated, false)] {
        e.observe(Some(held_by(&old, "1")), Millis(1_000));
        let acquires = e.next(Millis(1_000)).0 == LeaseAction::Acquire;
        assert_eq!(acquires, takes, "{}", e.identity);
    }
    assert_eq!(election_identity("p", None), "p");
}

#[test]
fn holder_steps_down_at_the_renew_deadline() {
    let mut e = Candidate::new("a", T);
    e.observe(None, Millis(0));
    e.written(held_by("a", "1"), Millis(0));
    e.write_failed(Millis(2_000));
    e.write_failed(Millis(9_999));
    assert!(e.is_coordinator(Millis(9_999)));
    assert!(!e.is_coordinator(Millis(10_000)));
    assert_eq!(e.acting_deadline(), Some(Millis(10_000)));
}

#[test]
fn reading_someone_else_as_holder_ends_its_term() {
    let mut e = Candidate::new("a", T);
    e.observe(None, Millis(0));
    e.written(held_by("a", "1"), Millis(0));
    e.observe(Some(held_by("b", "5")), Millis(100));
    assert!(!e.is_coordinator(Millis(100)));
}

#[test]
fn failed_reads_are_paced() {
    let mut e = Candidate::new("b", T);
    e.observe(Some(held_by("a", "1")), Millis(0));
    e.read_failed(Millis(2_000));
    assert_eq!(
        e.next(Millis(2_001)).0,
        LeaseAction::Wait {
            until: Millis(4_000)
        }
    );
}

#[test]
fn a_follower_whose_reads_keep_failing_backs_off_and_a_read_resets_it() {
    let mut e = Candidate::new("b", T);
    e.observe(Some(held_by("a", "1")), Millis(0));
    let wait = |until| LeaseAction::Wait {
        until: Millis(until),
    };
    // 2 s, 4 s, 8 s, then 8 s again: four retry periods at most.
    for (failed_at, next_read) in [(100, 2_100), (2_100, 6_100), (6_100, 14_100)] {
        e.read_failed(Millis(failed_at));
        assert_eq!(
            e.next(Millis(failed_at)).0,
            wait(next_read),
            "after {failed_at}"
        );
    }
    // The lease expires unread at 15 s: the follower tries to acquire then, not later.
    e.read_failed(Millis(14_100));
    assert_eq!(e.next(Millis(14_100)).0, wait(15_000));
    assert_eq!(e.next(Millis(15_000)).0, LeaseAction::Acquire);
    // The acquire fails and so does the read after it: the next attempt waits 8 s, not 2 s.
    e.write_failed(Millis(15_000));
    e.read_failed(Millis(15_000));
    assert_eq!(e.next(Millis(15_001)).0, wait(23_000));
    // A read that works resets the pace to the retry period.
    e.observe(Some(held_by("a", "2")), Millis(23_000));
    assert_eq!(e.next(Millis(23_000)).0, wait(25_000));
}

#[test]
fn a_holders_renewals_are_never_slowed_by_failed_reads() {
    let mut e = Candidate::new("a", T);
    e.observe(None, Millis(0));
    e.written(held_by("a", "1"), Millis(0));
    for at in [2_000, 4_000, 6_000] {
        e.write_failed(Millis(at));
        e.read_failed(Millis(at));
    }
    let next = e.next(Millis(6_001)).0;
    assert_eq!(
        next,
        LeaseAction::Wait {
            until: Millis(8_000)
        }
    );
    assert_eq!(e.next(Millis(8_000)).0, LeaseAction::Renew);
}

#[test]
fn released_lease_is_taken_at_once() {
    let mut e = Candidate::new("b", T);
    e.observe(Some(held_by("a", "1")), Millis(0));
    // The holder released it: holder emptied, new version.
    e.observe(
        Some(LeaseRecord {
            holder: Some(String::new()),
            version: "2".into(),
            ..LeaseRecord::default()
        }),
        Millis(500),
    );
    assert_eq!(e.next(Millis(500)).0, LeaseAction::Acquire);
}

fn naming(mut r: LeaseRecord, successors: &[&str]) -> LeaseRecord {
    r.successors = successors.iter().map(|s| (*s).to_owned()).collect();
    r
}

/// A release or a lapse sends only the named successors at the apiserver at first; the others
/// contend between one and two leases later, each at its own moment, if nobody took over
/// meanwhile (the watch would have shown it).
#[test]
fn only_the_named_successors_contend_at_once_the_others_later_and_spread() {
    let released = naming(
        LeaseRecord {
            holder: Some(String::new()),
            version: "2".into(),
            ..LeaseRecord::default()
        },
        &["pod-1", "pod-2"],
    );
    let at = |identity: &str, record: &LeaseRecord, now: u64| {
        let mut e = Candidate::new(identity, T);
        e.set_watching(true);
        e.observe(Some(record.clone()), Millis(1_000));
        e.next(Millis(now)).0
    };
    // When a candidate waiting for `record` (seen at 1 s) contends.
    let contends = |identity: &str, record: &LeaseRecord| match at(identity, record, 1_000) {
        LeaseAction::Wait { until } => until.0,
        _ => 1_000,
    };
    assert_eq!(at("pod-1_uid", &released, 1_000), LeaseAction::Acquire);
    let others: Vec<u64> = (3..40)
        .map(|i| contends(&format!("pod-{i}_uid"), &released))
        .collect();
    // Released at 1 s: the others from 16 s (a lease later) up to 31 s, not at one moment.
    assert!(
        others.iter().all(|t| (16_000..31_000).contains(t)),
        "{others:?}"
    );
    let distinct: std::collections::BTreeSet<_> = others.iter().collect();
    assert!(distinct.len() > 30, "{others:?}");
    let seven = contends("pod-7_uid", &released);
    assert_eq!(
        at("pod-7_uid", &released, seven - 1),
        LeaseAction::Wait {
            until: Millis(seven)
        }
    );
    assert_eq!(at("pod-7_uid", &released, seven), LeaseAction::Acquire);
    // Expiry: the successors at a lease without change, the others one to two leases after.
    let held = naming(held_by("pod-0_uid", "3"), &["pod-2"]);
    assert_eq!(at("pod-2_uid", &held, 16_000), LeaseAction::Acquire);
    let one = match at("pod-1_uid", &held, 16_000) {
        LeaseAction::Wait { until } => until.0,
        other => panic!("{other:?}"),
    };
    assert!((31_000..46_000).contains(&one), "{one}");
    assert_eq!(at("pod-1_uid", &held, one), LeaseAction::Acquire);
    // No list (a holder of an older version): everyone at once, as before.
    assert_eq!(
        at("pod-7_uid", &held_by("pod-0_uid", "3"), 16_000),
        LeaseAction::Acquire
    );
}

#[test]
fn successors_are_usable_pods_on_nodes_of_their_own_away_from_the_holder() {
    let seat = |pod: &str, node: &str, usable: bool| SuccessorSeat {
        pod: pod.into(),
        node: Some(node.into()),
        usable,
    };
    let seats = [
        seat("v-0-0", "a", true),
        seat("v-0-1", "b", true),
        seat("v-1-0", "b", true),
        seat("v-1-1", "a", true),
        seat("v-2-0", "c", false),
        seat("v-2-1", "d", true),
        seat("v-3-0", "e", true),
        seat("v-3-1", "f", true),
    ];
    // Holder on a: nothing else on a, one per node, the unusable one skipped, three at most.
    assert_eq!(successors(&seats, "v-0-0"), ["v-0-1", "v-2-1", "v-3-0"]);
    // Every other pod on the holder's node, or unusable: no list, everyone contends.
    assert!(successors(&seats[..2], "v-0-0") == ["v-0-1"]);
    assert!(
        successors(
            &[seat("v-0-0", "a", true), seat("v-1-1", "a", true)],
            "v-0-0"
        )
        .is_empty()
    );
    // Without node facts, pods count one each.
    let nodeless = |pod: &str| SuccessorSeat {
        pod: pod.into(),
        node: None,
        usable: true,
    };
    let seats = ["v-0", "v-1", "v-2", "v-3", "v-4"].map(nodeless);
    assert_eq!(successors(&seats, "v-0"), ["v-1", "v-2", "v-3"]);
}
