//! Replication mode, the planned switchover's step machine (`replication::step`): pause, catch
//! up, write the record, promote, repoint, unpause, or roll back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::*;
use valkey_sidecar_core::replication::{
    CATCH_UP_POLL_MS, Command, Phase, Switchover, SwitchoverEnd, WRITE_RETRY_MS, WriteOutcome, step,
};
use valkey_sidecar_core::time::Millis;

// ------------------------------------------------------------------------------------------
// The switchover step machine.
// ------------------------------------------------------------------------------------------

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

#[test]
fn an_unresolved_write_is_given_up_once_the_first_pause_would_have_run_out() {
    let s = Switchover::new(plan(), Millis(0));
    let (s, _) = step(&s, &obs(None, None, None), Millis(0));
    let (s, _) = step(&s, &obs(Some(100), Some(100), None), Millis(10));
    let (s, c) = step(&s, &obs(None, None, None), Millis(5_010));
    assert_eq!((s.phase.clone(), c.len()), (Phase::Writing, 1), "{c:?}");
    // pause_ms = 2 × 5 s: at 10 s the write is given up, and the last pause (sent at 5 010 ms)
    // is left to expire — no unpause: the write may have landed.
    let (s, c) = step(&s, &obs(None, None, None), Millis(10_000));
    assert!(matches!(s.phase, Phase::GaveUp { .. }), "{:?}", s.phase);
    assert!(c.is_empty(), "{c:?}");
    assert!(s.finished());
    let Some(SwitchoverEnd::Failed(why)) = s.end(&[]) else {
        panic!("{:?}", s.end(&[]));
    };
    assert!(why.contains("unknown"), "{why}");
    assert_eq!(step(&s, &obs(None, None, None), Millis(20_000)).1, vec![]);
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
fn a_done_switchover_fails_on_a_failed_promotion_and_keeps_an_undemoted_pod_paused() {
    let s = Switchover::new(plan(), Millis(0));
    let (s, _) = step(&s, &obs(None, None, None), Millis(0));
    let (s, _) = step(&s, &obs(Some(1), Some(1), None), Millis(1));
    let not_demoted = vec!["pod-0".to_owned()];
    assert!(!s.keeps_paused("pod-0", &not_demoted), "not committed yet");
    let (s, _) = step(&s, &obs(None, None, Some(WriteOutcome::Written)), Millis(2));
    assert_eq!(s.end(&[]), Some(SwitchoverEnd::Done));
    let failed = vec!["REPLICAOF NO ONE on pod-1: timed out".to_owned()];
    assert_eq!(
        s.end(&failed),
        Some(SwitchoverEnd::Failed(failed[0].clone()))
    );
    assert!(s.keeps_paused("pod-0", &not_demoted));
    assert!(!s.keeps_paused("pod-0", &[]));
    assert!(!s.keeps_paused("pod-2", &not_demoted));
}

#[test]
fn the_executor_polls_the_catch_up_steps_at_once_when_caught_up_and_paces_write_retries() {
    let s = Switchover::new(plan(), Millis(0));
    let (s, _) = step(&s, &obs(None, None, None), Millis(0));
    assert_eq!(s.wait_ms(&obs(None, None, None)), CATCH_UP_POLL_MS);
    assert_eq!(s.wait_ms(&obs(Some(10), Some(9), None)), CATCH_UP_POLL_MS);
    assert_eq!(s.wait_ms(&obs(Some(10), Some(10), None)), 0);
    let (s, _) = step(&s, &obs(Some(10), Some(10), None), Millis(1));
    assert_eq!(s.phase, Phase::Writing);
    assert_eq!(s.wait_ms(&obs(None, None, None)), WRITE_RETRY_MS);
    let written = obs(None, None, Some(WriteOutcome::Written));
    assert_eq!(s.wait_ms(&written), 0);
}

#[test]
fn every_switchover_command_says_why_naming_its_pod() {
    let commands = [
        (
            Command::Pause {
                pod: "pod-0".into(),
                ms: 1,
            },
            "pod-0",
        ),
        (
            Command::WriteRecord {
                holder: "pod-1".into(),
                epoch: 6,
                expect_holder: "pod-0".into(),
                expect_epoch: 5,
            },
            "pod-1 at epoch 6",
        ),
        (
            Command::PromoteNoOne {
                pod: "pod-1".into(),
            },
            "pod-1",
        ),
        (
            Command::ReplicaOf {
                pod: "pod-2".into(),
                to: "10.0.0.11 6379".into(),
            },
            "10.0.0.11 6379",
        ),
        (
            Command::Unpause {
                pod: "pod-0".into(),
            },
            "pod-0",
        ),
    ];
    for (command, named) in commands {
        assert!(
            command.reason().contains(named),
            "{command:?}: {}",
            command.reason()
        );
    }
}
