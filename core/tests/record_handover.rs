//! Replication mode, the planned hand-over's step machine (`replication::RecordHandoverRun`): pause,
//! catch up, write the record, promote, repoint, unpause, or roll back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::*;
use valkey_sidecar_core::replication::{
    CATCH_UP_POLL_MS, Phase, RecordHandoverAnswer as A, RecordHandoverCommand as C,
    RecordHandoverEnd, RecordHandoverRun, RecordHandoverStep as S, WRITE_RETRY_MS, WriteOutcome,
};
use valkey_sidecar_core::time::Millis;

fn pause() -> C {
    C::Pause {
        pod: "pod-0".into(),
        ms: 10_000,
    }
}

fn read_target() -> C {
    C::ReadTarget {
        pod: "pod-1".into(),
    }
}

fn write() -> C {
    C::WriteRecord {
        holder: "pod-1".into(),
        epoch: 6,
        expect_holder: "pod-0".into(),
        expect_epoch: 5,
    }
}

fn unpause() -> C {
    C::Unpause {
        pod: "pod-0".into(),
    }
}

fn paused(offset: Option<u64>) -> A {
    A::Paused { offset }
}

fn target(offset: u64) -> A {
    A::TargetAt {
        offset: Some(offset),
    }
}

fn unknown() -> A {
    A::Unknown {
        error: "timed out".into(),
    }
}

/// A run that has paused the old primary at offset 100 (at 0 ms) and sent the record write at `at`.
fn writing(at: u64) -> RecordHandoverRun {
    let mut r = RecordHandoverRun::new(plan(), Millis(0));
    r.next(A::Start, Millis(0));
    r.next(paused(Some(100)), Millis(0));
    assert_eq!(r.next(target(100), Millis(at)), S::Send(write()));
    r
}

fn rolled_back(step: S) -> String {
    let S::End(RecordHandoverEnd::RolledBack(why)) = step else {
        panic!("{step:?}")
    };
    why
}

#[test]
fn a_hand_over_commits_once_the_target_caught_up() {
    let mut r = RecordHandoverRun::new(plan(), Millis(0));
    assert_eq!(r.next(A::Start, Millis(0)), S::Send(pause()));
    assert_eq!(
        r.next(paused(Some(100)), Millis(10)),
        S::Send(read_target())
    );
    assert_eq!(r.phase(), &Phase::CatchingUp { offset: 100 });
    let poll = S::Wait {
        ms: CATCH_UP_POLL_MS,
        command: read_target(),
    };
    assert_eq!(r.next(target(90), Millis(11)), poll);
    assert_eq!(r.next(target(100), Millis(20)), S::Send(write()));
    assert_eq!(r.phase(), &Phase::Writing);
    let commit = [
        C::PromoteNoOne {
            pod: "pod-1".into(),
        },
        C::ReplicaOf {
            pod: "pod-0".into(),
            to: "10.0.0.11 6379".into(),
        },
        C::ReplicaOf {
            pod: "pod-2".into(),
            to: "10.0.0.11 6379".into(),
        },
        unpause(),
    ];
    let mut answer = A::Written;
    for command in commit {
        assert_eq!(r.next(answer, Millis(30)), S::Send(command));
        answer = A::Ok;
    }
    assert_eq!(r.next(A::Ok, Millis(31)), S::End(RecordHandoverEnd::Done));
    assert_eq!(r.next(A::Ok, Millis(40)), S::End(RecordHandoverEnd::Done));
}

#[test]
fn a_hand_over_rolls_back_when_the_target_lags() {
    let mut r = RecordHandoverRun::new(plan(), Millis(0));
    r.next(A::Start, Millis(0));
    r.next(paused(Some(100)), Millis(100));
    r.next(target(50), Millis(100));
    assert_eq!(r.next(target(99), Millis(5_000)), S::Send(unpause()));
    let why = rolled_back(r.next(A::Ok, Millis(5_001)));
    assert!(why.contains("reached offset 99, not 100"), "{why}");
}

#[test]
fn a_hand_over_rolls_back_when_the_pause_never_reports() {
    let mut r = RecordHandoverRun::new(plan(), Millis(0));
    r.next(A::Start, Millis(0));
    let poll = S::Wait {
        ms: CATCH_UP_POLL_MS,
        command: read_target(),
    };
    assert_eq!(r.next(paused(None), Millis(0)), poll);
    assert_eq!(r.next(target(100), Millis(4_999)), poll);
    assert_eq!(r.next(target(100), Millis(5_000)), S::Send(unpause()));
    let why = rolled_back(r.next(A::Ok, Millis(5_000)));
    assert!(why.contains("did not report its offset"), "{why}");
}

#[test]
fn a_hand_over_rolls_back_when_the_record_moved_or_the_write_is_refused() {
    let mut r = writing(10);
    assert_eq!(r.next(A::Moved, Millis(20)), S::Send(C::ReadRecord));
    let theirs = Some(record(Some("pod-2"), Some("pod-2"), 6));
    assert_eq!(r.next(A::Record(theirs), Millis(21)), S::Send(unpause()));
    let why = rolled_back(r.next(A::Ok, Millis(22)));
    assert_eq!(why, "the record moved under the hand-over");

    let mut r = writing(10);
    let refused = A::Refused {
        error: "forbidden".into(),
    };
    assert_eq!(r.next(refused, Millis(20)), S::Send(unpause()));
    assert!(rolled_back(r.next(A::Ok, Millis(21))).contains("forbidden"));
}

#[test]
fn a_compare_and_swap_that_finds_its_own_earlier_try_commits() {
    let mut r = writing(10);
    assert_eq!(r.next(A::Moved, Millis(20)), S::Send(C::ReadRecord));
    let ours = Some(record(Some("pod-1"), Some("pod-1"), 6));
    let promote = C::PromoteNoOne {
        pod: "pod-1".into(),
    };
    assert_eq!(r.next(A::Record(ours), Millis(21)), S::Send(promote));
}

#[test]
fn an_unresolved_write_keeps_the_old_primary_paused() {
    // Past the catch-up deadline, but the write may have landed: no rollback, the same write
    // again after the retry pause, and the pause refreshed once half of it has run.
    let mut r = writing(4_000);
    let retry = S::Wait {
        ms: WRITE_RETRY_MS,
        command: write(),
    };
    assert_eq!(r.next(unknown(), Millis(4_999)), retry);
    assert_eq!(r.next(unknown(), Millis(5_000)), S::Send(pause()));
    assert_eq!(r.phase(), &Phase::Writing);
    assert_eq!(r.next(paused(Some(100)), Millis(5_000)), retry);
    // An unanswered read-back is as unknown as an unanswered write.
    assert_eq!(r.next(A::Moved, Millis(6_000)), S::Send(C::ReadRecord));
    assert_eq!(r.next(unknown(), Millis(9_000)), retry);
}

#[test]
fn an_unresolved_write_is_given_up_once_the_first_pause_would_have_run_out() {
    let mut r = writing(10);
    assert_eq!(r.next(unknown(), Millis(5_010)), S::Send(pause()));
    r.next(paused(None), Millis(5_010));
    // pause_ms = 2 × 5 s: at 10 s the write is given up, and the last pause (sent at 5 010 ms)
    // is left to expire — no unpause: the write may have landed.
    let S::End(RecordHandoverEnd::Failed(why)) = r.next(unknown(), Millis(10_000)) else {
        panic!("{:?}", r.phase())
    };
    assert!(why.contains("unknown"), "{why}");
    assert!(matches!(r.next(A::Ok, Millis(20_000)), S::End(_)));
}

#[test]
fn a_refused_write_read_back_is_ours_only_at_our_holder_and_epoch() {
    let cases = [
        (
            Some(record(Some("pod-1"), Some("pod-1"), 6)),
            WriteOutcome::Written,
        ),
        (
            Some(record(Some("pod-1"), Some("pod-1"), 7)),
            WriteOutcome::Refused,
        ),
        (
            Some(record(Some("pod-2"), Some("pod-2"), 6)),
            WriteOutcome::Refused,
        ),
        (Some(record(None, Some("pod-1"), 6)), WriteOutcome::Refused),
        (None, WriteOutcome::Refused),
    ];
    for (read, want) in cases {
        let got = WriteOutcome::read_back(read.as_ref(), "pod-1", 6);
        assert_eq!(got, want, "{read:?}");
    }
}

#[test]
fn a_done_hand_over_fails_on_a_failed_promotion_and_keeps_an_undemoted_pod_paused() {
    let failed = || A::Failed {
        error: "timed out".into(),
    };
    // The promotion fails and the old primary cannot be repointed: no unpause for it.
    let mut r = writing(1);
    r.next(A::Written, Millis(2));
    r.next(failed(), Millis(3));
    r.next(failed(), Millis(4));
    let end = r.next(A::Ok, Millis(5));
    let want = "REPLICAOF NO ONE on pod-1: timed out";
    assert_eq!(end, S::End(RecordHandoverEnd::Failed(want.into())));
    assert_eq!(r.left_paused(), Some("pod-0"));
    // Promoted, but the old primary cannot be repointed: done, and it stays paused.
    let mut r = writing(1);
    r.next(A::Written, Millis(2));
    r.next(A::Ok, Millis(3));
    r.next(failed(), Millis(4));
    assert_eq!(r.next(A::Ok, Millis(5)), S::End(RecordHandoverEnd::Done));
    assert_eq!(r.left_paused(), Some("pod-0"));
    // Another replica that cannot be repointed does not keep the old primary paused.
    let mut r = writing(1);
    r.next(A::Written, Millis(2));
    r.next(A::Ok, Millis(3));
    r.next(A::Ok, Millis(4));
    assert_eq!(r.next(failed(), Millis(5)), S::Send(unpause()));
    assert_eq!(r.left_paused(), None);
}

#[test]
fn the_target_is_read_at_once_when_paused_and_write_retries_are_paced() {
    let mut r = RecordHandoverRun::new(plan(), Millis(0));
    r.next(A::Start, Millis(0));
    assert_eq!(r.next(paused(Some(10)), Millis(1)), S::Send(read_target()));
    let poll = S::Wait {
        ms: CATCH_UP_POLL_MS,
        command: read_target(),
    };
    assert_eq!(r.next(A::Failed { error: "x".into() }, Millis(1)), poll);
    assert_eq!(r.next(target(9), Millis(1)), poll);
    let write = C::WriteRecord {
        holder: "pod-1".into(),
        epoch: 6,
        expect_holder: "pod-0".into(),
        expect_epoch: 5,
    };
    assert_eq!(r.next(target(10), Millis(2)), S::Send(write.clone()));
    let retry = S::Wait {
        ms: WRITE_RETRY_MS,
        command: write,
    };
    assert_eq!(r.next(unknown(), Millis(3)), retry);
}

#[test]
fn only_the_reads_go_out_without_the_lease() {
    assert!(!read_target().needs_lease());
    assert!(!C::ReadRecord.needs_lease());
    for command in [pause(), write(), unpause()] {
        assert!(command.needs_lease(), "{command:?}");
    }
}

#[test]
fn every_hand_over_command_says_why_naming_its_pod() {
    let commands = [
        (pause(), "pod-0"),
        (read_target(), "pod-1"),
        (write(), "pod-1 at epoch 6"),
        (C::ReadRecord, "earlier try"),
        (
            C::PromoteNoOne {
                pod: "pod-1".into(),
            },
            "pod-1",
        ),
        (
            C::ReplicaOf {
                pod: "pod-2".into(),
                to: "10.0.0.11 6379".into(),
            },
            "10.0.0.11 6379",
        ),
        (unpause(), "pod-0"),
    ];
    for (command, named) in commands {
        assert!(
            command.reason().contains(named),
            "{command:?}: {}",
            command.reason()
        );
    }
}
