//! Replication mode, the planned switchover's step machine (`replication::step`): pause, catch
//! up, write the record, promote, repoint, unpause, or roll back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::*;
use valkey_sidecar_core::replication::{Command, Phase, Switchover, WriteOutcome, step};
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
