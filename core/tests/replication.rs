//! Replication mode: property tests of the safety rules (fencing before promotion, no promotion
//! while held, lossless switchover, no bootstrap over existing data).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use proptest::prelude::*;

use support::*;
use valkey_sidecar_core::heartbeat::{PeerSight, Promise, VouchedUntil};
use valkey_sidecar_core::lease::LeaseTimings;
use valkey_sidecar_core::observation::{History, Role};
use valkey_sidecar_core::replication::{
    FailoverPolicy, HoldKind, LocalAction, LocalRole, LocalValkey, LocalView, MemberValkey, Phase,
    RecordHandoverAnswer, RecordHandoverCommand, RecordHandoverEnd, RecordHandoverPlan,
    RecordHandoverRun, RecordHandoverStep, SeenRecord, ShardMember, ShardRecord, ShardView,
    Successor, keeper, may_advertise, promotion,
};
use valkey_sidecar_core::time::Millis;

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
    let last = prop::option::of(0u64..1_000);
    (record, 0u64..40_000, 0u64..40_000, last).prop_map(|(r, read, changed, last)| {
        // What was read is part of what was seen.
        let last_epoch = match (&r, last) {
            (Some(r), l) => Some(l.unwrap_or(0).max(r.epoch)),
            (None, l) => l,
        };
        SeenRecord {
            record: r,
            read_at: Millis(read),
            heard_at: Millis(read),
            changed_at: Millis(changed.min(read)),
            last_epoch,
        }
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
        .prop_map(|(now, coordinating, record, lease_ms, mut members, zone)| {
            // Pod names are unique within a shard.
            members.sort_by(|a, b| a.pod.cmp(&b.pod));
            members.dedup_by(|a, b| a.pod == b.pod);
            ShardView {
                now: Millis(now),
                coordinating,
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
        history(),
    )
        .prop_map(|(role, fresh, run, since, history)| LocalValkey {
            role,
            fresh,
            run_id: run.into(),
            since: Millis(since),
            observed_at: Millis(since),
            history,
            linked: false,
        })
}

/// Streams `A`, `B`, `C` at offsets around 1,000, some promoted from another.
fn history() -> impl Strategy<Value = History> {
    let id = || prop::sample::select(vec!["A", "B", "C"]).prop_map(str::to_owned);
    (
        id(),
        900u64..1_100,
        prop::option::weighted(0.5, (id(), 900u64..1_100)),
    )
        .prop_map(|(replid, offset, before)| History {
            replid,
            offset,
            replid2: before.as_ref().map(|(id, _)| id.clone()),
            second_offset: before.map(|(_, at)| at),
            keys: 100,
        })
}

fn successor() -> impl Strategy<Value = Successor> {
    (any::<bool>(), history()).prop_map(|(primary, history)| Successor { primary, history })
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
        (
            prop::option::weighted(0.6, peer_sight()),
            prop::option::weighted(0.3, promise()),
            prop::option::weighted(0.7, successor()),
        ),
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
                (peers, promise, successor),
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
                peers,
                promise,
                successor,
            },
        )
}

/// Heartbeats around the times the views use: some of pod-0/1/2 expected, some vouching.
fn peer_sight() -> impl Strategy<Value = PeerSight> {
    let vouch = (0u64..40_000, any::<bool>()).prop_map(|(until, promised)| VouchedUntil {
        until: Millis(until),
        promised,
    });
    let ids = || prop::sample::subsequence(vec!["pod-0", "pod-1", "pod-2"], 0..=3);
    (
        ids(),
        prop::collection::btree_map(pod(), vouch, 0..3),
        0u64..40_000,
    )
        .prop_map(move |(expected, vouches, judged)| PeerSight {
            expected: expected.into_iter().map(str::to_owned).collect(),
            vouches,
            judged_from: Millis(judged),
        })
}

fn promise() -> impl Strategy<Value = Promise> {
    (pod(), 0u64..60_000).prop_map(|(to, until)| Promise {
        to,
        until: Millis(until),
    })
}

/// Whether the view shows a renewal of the record by this agent for this Valkey run at the
/// record's epoch, valid or not.
fn holds_current(v: &LocalView) -> bool {
    let (Some(valkey), Some(rec), Some(h)) = (
        v.valkey.as_ref(),
        v.record.as_ref().and_then(|s| s.record.as_ref()),
        v.holding.as_ref(),
    ) else {
        return false;
    };
    rec.holder() == Some(v.me.as_str()) && h.epoch == rec.epoch && h.run_id == valkey.run_id
}

/// The failsafe's condition: the holding is current (if lapsed) and every member promised.
fn failsafe_holds(v: &LocalView) -> bool {
    holds_current(v) && v.peers.as_ref().is_some_and(|p| p.all_promised(v.now))
}

/// Writable by the rules: a valid renewal that some member vouches for (or nobody is expected
/// to), or the failsafe.
fn may_write(v: &LocalView) -> bool {
    let vouched = v.peers.as_ref().is_none_or(|p| !p.silent(v.now));
    (holds_validly(v) && vouched) || failsafe_holds(v)
}

/// Whether the view shows a renewal of the record, by this agent, valid now for this Valkey run.
fn holds_validly(v: &LocalView) -> bool {
    let valid = v
        .holding
        .as_ref()
        .is_some_and(|h| v.now < h.deadline(&v.timings));
    holds_current(v) && valid
}

fn fence_lasts(v: &LocalView) -> bool {
    v.fenced_until
        .is_some_and(|u| u.since(v.now) >= v.timings.lease_ms / 2)
}

#[derive(Debug, Clone)]
struct SwitchStep {
    dt: u64,
    /// An offset, for the answer to a pause or a read of the target (`None`: no reply).
    offset: Option<u64>,
    /// Picks among the other answers a command can get.
    pick: u8,
}

impl SwitchStep {
    /// A plausible answer to `command`.
    fn answer(&self, command: &RecordHandoverCommand) -> RecordHandoverAnswer {
        let unknown = || RecordHandoverAnswer::Unknown {
            error: "timed out".into(),
        };
        let failed = || RecordHandoverAnswer::Failed {
            error: "timed out".into(),
        };
        match command {
            RecordHandoverCommand::Pause { .. } => RecordHandoverAnswer::Paused {
                offset: self.offset.map(|o| o % 1_000),
            },
            RecordHandoverCommand::ReadTarget { .. } => RecordHandoverAnswer::TargetAt {
                offset: self.offset,
            },
            RecordHandoverCommand::WriteRecord { .. } => match self.pick % 4 {
                0 => RecordHandoverAnswer::Written,
                1 => RecordHandoverAnswer::Moved,
                2 => RecordHandoverAnswer::Refused {
                    error: "forbidden".into(),
                },
                _ => unknown(),
            },
            RecordHandoverCommand::ReadRecord => match self.pick % 3 {
                0 => RecordHandoverAnswer::Record(Some(record(Some("pod-1"), Some("pod-1"), 6))),
                1 => RecordHandoverAnswer::Record(Some(record(Some("pod-2"), Some("pod-2"), 6))),
                _ => unknown(),
            },
            RecordHandoverCommand::PromoteNoOne { .. }
            | RecordHandoverCommand::ReplicaOf { .. }
                if self.pick.is_multiple_of(5) =>
            {
                failed()
            }
            _ => RecordHandoverAnswer::Ok,
        }
    }
}

fn switch_steps() -> impl Strategy<Value = Vec<SwitchStep>> {
    let step = (
        0u64..3_000,
        prop::option::weighted(0.8, 0u64..1_200),
        any::<u8>(),
    )
        .prop_map(|(dt, offset, pick)| SwitchStep { dt, offset, pick });
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

    /// A master with data follows another pod only if that pod answers as master and its stream
    /// keeps every byte of ours, was promoted from ours, is a promoted stream already past our
    /// offset, or (after a full restart) restarted from our old stream at least as far: a record
    /// naming a lagging replica, an absent pod or an empty master never costs data.
    #[test]
    fn a_master_with_data_follows_only_a_master_that_continues_it(v in local_view()) {
        let Some(mine) = v.valkey.as_ref() else { return Ok(()) };
        if let LocalAction::Demote { .. } = keeper::decide(&v) {
            prop_assert!(mine.role == LocalRole::Primary && !mine.fresh);
            let s = v.successor.as_ref();
            prop_assert!(s.is_some_and(|s| s.primary), "{v:?}");
            let s = &s.unwrap().history;
            let moved_on = s.replid2.is_some() && s.offset >= mine.history.offset;
            let from_mine = s.replid2.as_ref() == Some(&mine.history.replid);
            // Both restarted from one stream (each a new stream of its own), it at least as far.
            let restarted = s.replid != mine.history.replid
                && s.replid2.is_some()
                && s.replid2 == mine.history.replid2
                && s.second_offset >= mine.history.second_offset;
            let positionless = mine.history.offset == 0 && mine.history.replid2.is_none()
                && s.replid2.is_none() && s.keys >= mine.history.keys;
            prop_assert!(s.continues(&mine.history) || from_mine || moved_on || restarted || positionless, "{v:?}");
        }
    }

    /// A vanished record is re-created only once seen absent for a full lease (any holder's
    /// renew deadline has passed), above every epoch seen, and never for a shard without data
    /// that never had one (the node-index 0 agent bootstraps it).
    #[test]
    fn a_vanished_record_is_recreated_only_after_a_lease_above_the_last_epoch(v in shard_view()) {
        let Some(seen) = v.record.as_ref().filter(|s| s.record.is_none()) else { return Ok(()) };
        if let Ok(p) = promotion::decide(&v, &FailoverPolicy::default()) {
            prop_assert!(v.now >= seen.changed_at.plus(v.lease_ms), "{v:?}");
            prop_assert!(p.epoch > seen.last_epoch.unwrap_or(0));
            prop_assert!(p.version.is_empty(), "created, not updated");
            let data = v.members.iter().any(|m| m.valkey.as_ref().is_some_and(|k| !k.fresh));
            prop_assert!(seen.last_epoch.is_some() || data);
        }
    }

    /// A held record seen changing within the lease is never taken over.
    #[test]
    fn never_promotes_while_the_record_is_held_and_fresh(v in shard_view()) {
        let held_fresh = v.record.as_ref().is_some_and(|s| {
            s.record.as_ref().is_some_and(|r| r.holder().is_some())
                && v.now < s.changed_at.plus(v.lease_ms)
        });
        if held_fresh {
            prop_assert!(promotion::decide(&v, &FailoverPolicy::default()).is_err());
        }
    }

    /// Only the coordinator promotes.
    #[test]
    fn never_promotes_when_not_leader(mut v in shard_view()) {
        v.coordinating = false;
        let hold = promotion::decide(&v, &FailoverPolicy::default()).unwrap_err();
        prop_assert_eq!(hold.kind, HoldKind::NotCoordinator);
    }

    /// The target is an answering member with data (a synced replica, or a master while the
    /// record names a replica never promoted) on a usable node, not going away, not the recorded
    /// primary, with the highest offset of all such members — or, when no other member can hold
    /// data, the recorded primary answering as one; the epoch goes up by one. (A vanished
    /// record: above.)
    #[test]
    fn the_target_is_always_eligible(v in shard_view()) {
        let Ok(p) = promotion::decide(&v, &FailoverPolicy::default()) else { return Ok(()) };
        let Some(rec) = v.record.as_ref().and_then(|s| s.record.as_ref()) else { return Ok(()) };
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
        let stalled = v.members.iter().any(|o| {
            Some(o.pod.as_str()) == rec.recorded_primary()
                && o.valkey.as_ref().is_some_and(|ov| ov.role == Role::Replica)
        });
        prop_assert!(mv.role == Role::Replica || (stalled && mv.role == Role::Primary));
        prop_assert!(!mv.fresh);
        prop_assert_eq!(p.epoch, rec.epoch + 1);
        prop_assert_eq!(p.record().epoch, p.epoch);
        prop_assert!(!p.repoint.contains(&p.target) && !p.fence.contains(&p.target));
        prop_assert_eq!(p.repoint.len(), v.members.len() - 1);
        let better = v.members.iter().any(|o| {
            let ahead = o.valkey.as_ref().is_some_and(|ov| {
                (ov.role == Role::Replica || (stalled && ov.role == Role::Primary))
                    && !ov.fresh
                    && ov.offset > mv.offset
            });
            o.pod != rec.holder().unwrap_or_default()
                && Some(o.pod.as_str()) != rec.primary.as_deref()
                && !o.terminating && o.node_ready && o.node_schedulable
                && ahead
        });
        prop_assert!(!better, "a member with a higher offset was passed over");
    }

    /// Chained decisions, each applied to the store, only ever raise the epoch; a hand-over
    /// writes exactly the next epoch.
    #[test]
    fn epochs_strictly_increase(
        views in prop::collection::vec(shard_view(), 1..10),
        first in 0u64..100,
    ) {
        let mut current = record(Some("pod-0"), Some("pod-0"), first);
        for mut v in views {
            v.coordinating = true;
            v.record = Some(seen(Some(current.clone()), 0));
            v.now = Millis(v.lease_ms);
            if let Ok(p) = promotion::decide(&v, &FailoverPolicy::default()) {
                prop_assert!(p.record().epoch > current.epoch);
                current = p.record();
            }
        }
        let mut r = RecordHandoverRun::new(RecordHandoverPlan { epoch: first, ..plan() }, Millis(0));
        r.next(RecordHandoverAnswer::Start, Millis(0));
        r.next(RecordHandoverAnswer::Paused { offset: Some(1) }, Millis(1));
        let step = r.next(RecordHandoverAnswer::TargetAt { offset: Some(1) }, Millis(1));
        let RecordHandoverStep::Send(RecordHandoverCommand::WriteRecord { epoch, expect_epoch, .. }) = step
        else {
            panic!("{step:?}")
        };
        prop_assert!(epoch > expect_epoch);
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
        let fence = keeper::decide(&holder(deadline, None));
        let LocalAction::Fence { until, .. } = fence else {
            panic!("no fence at the deadline: {fence:?}")
        };
        // The earliest instant a promotion is allowed, and the instant before it.
        let earliest = sent + seen_delay + t.lease_ms;
        prop_assert!(promotion::decide(&coordinator(earliest), &FailoverPolicy::default()).is_ok());
        prop_assert!(promotion::decide(&coordinator(earliest - 1), &FailoverPolicy::default()).is_err());
        prop_assert!(deadline < earliest);
        for p in probes {
            let now = sent + p;
            if promotion::decide(&coordinator(now), &FailoverPolicy::default()).is_ok() {
                prop_assert!(deadline < now, "promoted at {} before deadline {}", now, deadline);
            }
            if now >= deadline {
                // Fenced (or told to refresh the fence, or to keep renewing behind it) — never
                // unfenced writes.
                let fenced = if now < until.0 { Some(until) } else { None };
                let a = keeper::decide(&holder(now, fenced));
                let renewing = fenced.is_some() && matches!(a, LocalAction::Renew { .. });
                prop_assert!(matches!(a, LocalAction::Fence { .. }) || renewing, "{:?}", a);
            } else {
                let a = keeper::decide(&holder(now, None));
                prop_assert!(!matches!(a, LocalAction::Fence { .. }), "fenced early: {:?}", a);
            }
        }
    }

    /// A master accepts writes unfenced only while its agent holds a valid renewal of a record
    /// naming it: Nothing/Unfence need one, Renew needs one or a fence that still lasts.
    #[test]
    fn an_advertised_primary_always_holds_a_valid_renewal_of_the_current_epoch(v in any_local_view()) {
        if may_advertise(&v) {
            prop_assert!(
                holds_validly(&v) || failsafe_holds(&v),
                "advertised without a valid renewal or every member's promise: {v:?}"
            );
            prop_assert!(v.fenced_until.is_none());
            let epoch = v.record.as_ref().and_then(|s| s.record.as_ref()).map(|r| r.epoch);
            prop_assert_eq!(v.holding.as_ref().map(|h| h.epoch), epoch);
        }
    }

    /// A member that promised a holder to take part in no promotion never claims the record
    /// (the coordinator promotes only a named member that renewed) while the promise binds,
    /// whether its Valkey is still a replica or was promoted without its consent.
    #[test]
    fn a_promise_is_never_broken(v in local_view()) {
        // A member never promises itself (it vouches only for another pod, the holder).
        // Renewing a valid holding takes nothing from anyone; taking the record does.
        let binds = v.promise.as_ref().is_some_and(|p| p.binds(v.now) && p.to != v.me);
        if binds && !holds_validly(&v) {
            let a = keeper::decide(&v);
            prop_assert!(!matches!(a, LocalAction::Renew { .. } | LocalAction::Bootstrap { .. }), "{:?}", a);
        }
    }

    #[test]
    fn a_master_without_a_valid_renewal_is_never_left_unfenced(v in local_view()) {
        let is_master = v.valkey.as_ref().is_some_and(|k| k.role == LocalRole::Primary);
        if !is_master {
            return Ok(());
        }
        let a = keeper::decide(&v);
        match a {
            LocalAction::Nothing { .. } | LocalAction::Unfence { .. } => {
                prop_assert!(may_write(&v), "{:?}", a)
            }
            LocalAction::Renew { .. } => {
                prop_assert!(may_write(&v) || fence_lasts(&v), "{:?}", a)
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
            let last_epoch = Some(rec.epoch);
            v.record = Some(SeenRecord { record: Some(rec), read_at: v.now, changed_at: v.now, last_epoch, heard_at: v.now });
        } else {
            v.other_master = true;
        }
        let a = keeper::decide(&v);
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
    /// before the deadline (a write retried after it is the same write); a hand-over that times
    /// out before that unpauses and never writes; the target is promoted only once the record is
    /// known to name it; every finished switchover has lifted its last pause, unless the old
    /// primary could not be made a replica or the write's outcome stayed unknown.
    #[test]
    fn a_record_hand_over_is_lossless_and_always_unpauses(steps in switch_steps(), timeout in 1u64..8_000) {
        let p = RecordHandoverPlan { timeout_ms: timeout, ..plan() };
        let mut r = RecordHandoverRun::new(p, Millis(0));
        let mut now = Millis(0);
        let mut sent: Vec<RecordHandoverCommand> = Vec::new();
        let (mut paused_at, mut target_at, mut ours) = (None, None, false);
        let mut answer = RecordHandoverAnswer::Start;
        let mut end = None;
        for st in steps {
            now = now.plus(st.dt);
            let (before, asked_at) = (r.phase().clone(), now);
            let command = match r.next(answer.clone(), now) {
                RecordHandoverStep::Send(c) => c,
                RecordHandoverStep::Wait { ms, command } => {
                    now = now.plus(ms);
                    command
                }
                RecordHandoverStep::End(e) => {
                    end = Some(e);
                    break;
                }
            };
            let waiting = matches!(before, Phase::Pausing | Phase::CatchingUp { .. });
            let write = matches!(command, RecordHandoverCommand::WriteRecord { .. });
            if write && !sent.iter().any(|c| matches!(c, RecordHandoverCommand::WriteRecord { .. })) {
                let (Some(p), Some(t)) = (paused_at, target_at) else { panic!("{sent:?}") };
                prop_assert!(t >= p, "written at target offset {} below {}", t, p);
                prop_assert!(asked_at < r.deadline());
            }
            if waiting && asked_at >= r.deadline() {
                prop_assert!(matches!(r.phase(), Phase::RollingBack { .. }), "{:?}", r.phase());
                prop_assert_eq!(&command, &RecordHandoverCommand::Unpause { pod: "pod-0".into() });
            }
            if let RecordHandoverCommand::PromoteNoOne { .. } = command {
                prop_assert!(ours || answer == RecordHandoverAnswer::Written, "{:?}", answer);
            }
            answer = st.answer(&command);
            match (&command, &answer) {
                (RecordHandoverCommand::Pause { .. }, RecordHandoverAnswer::Paused { offset }) => {
                    paused_at = paused_at.or(*offset);
                }
                (RecordHandoverCommand::ReadTarget { .. }, RecordHandoverAnswer::TargetAt { offset }) => {
                    target_at = *offset;
                }
                (RecordHandoverCommand::ReadRecord, RecordHandoverAnswer::Record(Some(rec))) => {
                    ours = rec.holder() == Some("pod-1");
                }
                _ => {}
            }
            sent.push(command);
        }
        let writes: Vec<_> = sent.iter().filter(|c| matches!(c, RecordHandoverCommand::WriteRecord { .. })).collect();
        prop_assert!(writes.windows(2).all(|w| w[0] == w[1]), "{:?}", writes);
        let promoted = sent.iter().any(|c| matches!(c, RecordHandoverCommand::PromoteNoOne { .. }));
        let last_pause = sent.iter().rposition(|c| matches!(c, RecordHandoverCommand::Pause { .. }));
        let last_unpause = sent.iter().rposition(|c| matches!(c, RecordHandoverCommand::Unpause { .. }));
        match end {
            Some(RecordHandoverEnd::RolledBack(reason)) => {
                prop_assert!(!promoted, "{:?}", sent);
                prop_assert!(!reason.is_empty());
                prop_assert!(last_unpause > last_pause, "{:?}", sent);
            }
            Some(RecordHandoverEnd::Failed(why)) if why.contains("unknown") => {
                // Given up with the write's outcome unknown: never before the first pause would
                // have run out, nothing promoted, the last pause left to expire, not lifted.
                prop_assert!(now >= r.started().plus(r.pause_ms()));
                prop_assert!(!promoted, "{:?}", sent);
                prop_assert!(last_unpause.is_none() || last_unpause < last_pause, "{:?}", sent);
            }
            Some(_) if r.left_paused().is_some() => {
                prop_assert!(last_unpause.is_none() || last_unpause < last_pause, "{:?}", sent);
            }
            Some(_) => prop_assert!(last_unpause > last_pause, "{:?}", sent),
            None => {}
        }
    }
}
