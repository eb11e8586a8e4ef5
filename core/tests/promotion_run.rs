//! `PromotionRun`: a decided promotion's order, its retries and the read-back of an unanswered
//! record write, as tables of answers and the commands they lead to.

use valkey_sidecar_core::replication::{
    Promotion, PromotionAnswer as A, PromotionCommand as C, PromotionRun, PromotionStep as S,
    PromotionStop, WithoutLease,
};
use valkey_sidecar_core::time::Millis;

fn promotion() -> Promotion {
    Promotion {
        target: "b".into(),
        epoch: 2,
        version: "7".into(),
        fence: vec!["a".into()],
        repoint: vec!["a".into(), "c".into()],
        reason: "test".into(),
        empty: false,
    }
}

fn unknown() -> A {
    A::Unknown {
        error: "timeout".into(),
    }
}

/// Feeds `answers` (each at its time) and returns every step.
fn steps(answers: Vec<(A, u64)>) -> Vec<S> {
    let mut run = PromotionRun::new(promotion(), 15_000, CONSENT_MS);
    answers
        .into_iter()
        .map(|(a, at)| run.next(a, Millis(at)))
        .collect()
}

const CONSENT_MS: u64 = 3_000;

fn given() -> A {
    A::Consent { given: true }
}

fn send(c: C) -> S {
    S::Send(c)
}

fn pod(name: &str) -> String {
    name.into()
}

#[test]
fn the_record_first_then_fence_consent_promote_repoint_and_unpause_the_fenced() {
    let all_ok = (0..9)
        .map(|i| {
            let a = match i {
                0 => A::Start,
                3 => given(),
                _ => A::Ok,
            };
            (a, i)
        })
        .collect();
    assert_eq!(
        steps(all_ok),
        [
            send(C::WriteRecord),
            send(C::Fence {
                pod: pod("a"),
                ms: 15_000
            }),
            send(C::AwaitConsent { pod: pod("b") }),
            send(C::PromoteTarget { pod: pod("b") }),
            send(C::Repoint { pod: pod("a") }),
            send(C::Unpause { pod: pod("a") }),
            send(C::Repoint { pod: pod("c") }),
            S::Done,
            S::Done,
        ]
    );
}

#[test]
fn every_command_of_a_run_says_why_naming_its_pod() {
    let all_ok = (0..6)
        .map(|i| (if i == 0 { A::Start } else { A::Ok }, i))
        .collect();
    for step in steps(all_ok) {
        let S::Send(command) = step else { continue };
        let reason = command.reason();
        match &command {
            C::WriteRecord | C::ReadRecord => assert!(reason.contains("record"), "{reason}"),
            C::Fence { pod, .. }
            | C::AwaitConsent { pod }
            | C::PromoteTarget { pod }
            | C::Repoint { pod }
            | C::Unpause { pod } => assert!(reason.starts_with(pod.as_str()), "{reason}"),
        }
    }
    assert!(C::ReadRecord.reason().contains("landed"));
}

#[test]
fn a_refused_record_write_stops_everything() {
    let conflict = A::Refused {
        conflict: true,
        error: "409".into(),
    };
    let out = steps(vec![(A::Start, 0), (conflict, 1)]);
    assert!(
        matches!(&out[1], S::Stopped(PromotionStop::Conflict(_))),
        "{out:?}"
    );
    let forbidden = A::Refused {
        conflict: false,
        error: "403".into(),
    };
    let out = steps(vec![(A::Start, 0), (forbidden, 1)]);
    assert!(
        matches!(&out[1], S::Stopped(PromotionStop::Failed(_))),
        "{out:?}"
    );
}

#[test]
fn an_unanswered_write_is_read_back_and_goes_on_only_if_it_landed() {
    let landed = steps(vec![
        (A::Start, 0),
        (unknown(), 1),
        (A::Read { ours: true }, 2),
    ]);
    assert_eq!(landed[1], send(C::ReadRecord));
    assert_eq!(
        landed[2],
        send(C::Fence {
            pod: pod("a"),
            ms: 15_000
        })
    );
    let lost = steps(vec![
        (A::Start, 0),
        (unknown(), 1),
        (A::Read { ours: false }, 2),
    ]);
    assert!(
        matches!(&lost[2], S::Stopped(PromotionStop::Conflict(_))),
        "{lost:?}"
    );
}

#[test]
fn a_record_that_cannot_be_read_back_is_read_again_then_given_up() {
    let mut answers = vec![(A::Start, 0), (unknown(), 1)];
    answers.extend((0..6).map(|i| (unknown(), 2 + i * 200)));
    let out = steps(answers);
    let retries = out
        .iter()
        .filter(|s| {
            matches!(
                s,
                S::Retry {
                    command: C::ReadRecord,
                    after_ms: 200
                }
            )
        })
        .count();
    assert_eq!(retries, 4, "{out:?}");
    assert!(
        matches!(&out[6], S::Stopped(PromotionStop::Failed(_))),
        "{out:?}"
    );
}

#[test]
fn replicaof_no_one_is_tried_again_within_a_second_of_its_first_try() {
    let to_promote = vec![(A::Start, 0), (A::Ok, 1), (A::Ok, 2), (given(), 2)];
    let mut answers = to_promote.clone();
    answers.extend([(unknown(), 300), (unknown(), 600), (A::Ok, 800)]);
    let out = steps(answers);
    assert_eq!(out[3], send(C::PromoteTarget { pod: pod("b") }));
    assert!(matches!(out[4], S::Retry { .. }) && matches!(out[5], S::Retry { .. }));
    assert_eq!(out[6], send(C::Repoint { pod: pod("a") }));
    // Past the second since the first try: no more tries.
    let mut late = to_promote;
    late.push((unknown(), 1_002));
    let out = steps(late);
    assert!(
        matches!(&out[4], S::Stopped(PromotionStop::Failed(_))),
        "{out:?}"
    );
}

#[test]
fn failed_fences_and_repoints_are_best_effort() {
    let out = steps(vec![
        (A::Start, 0),
        (A::Ok, 1),
        (unknown(), 2),
        (given(), 2),
        (A::Ok, 3),
        (unknown(), 4),
        (A::Ok, 5),
    ]);
    assert_eq!(out[2], send(C::AwaitConsent { pod: pod("b") }));
    assert_eq!(out[3], send(C::PromoteTarget { pod: pod("b") }));
    // A fenced master that did not follow keeps its pause.
    assert_eq!(out[5], send(C::Repoint { pod: pod("c") }));
    assert_eq!(out[6], S::Done);
}

#[test]
fn the_target_is_promoted_only_once_its_agent_took_the_record() {
    let poll = S::Retry {
        after_ms: 10,
        command: C::AwaitConsent { pod: pod("b") },
    };
    let waiting = vec![(A::Start, 0), (A::Ok, 1), (A::Ok, 2)];
    let mut answers = waiting.clone();
    answers.extend([
        (A::Consent { given: false }, 3),
        (unknown(), 500),
        (A::Consent { given: false }, 2_900),
        (given(), 2_950),
    ]);
    let out = steps(answers);
    assert_eq!(out[3..6], [poll.clone(), poll.clone(), poll]);
    assert_eq!(out[6], send(C::PromoteTarget { pod: pod("b") }));
    // Never given: the promotion fails after the consent window; a moved record stops it.
    let mut never = waiting.clone();
    never.push((A::Consent { given: false }, 2 + CONSENT_MS));
    let out = steps(never);
    assert!(
        matches!(&out[3], S::Stopped(PromotionStop::Failed(_))),
        "{out:?}"
    );
    let mut moved = waiting;
    moved.push((A::Read { ours: false }, 5));
    let out = steps(moved);
    assert!(
        matches!(&out[3], S::Stopped(PromotionStop::Conflict(_))),
        "{out:?}"
    );
}

#[test]
fn without_the_lease_nothing_that_changes_a_primary_is_sent() {
    for c in [
        C::WriteRecord,
        C::Fence {
            pod: pod("a"),
            ms: 1,
        },
        C::PromoteTarget { pod: pod("b") },
    ] {
        assert_eq!(c.without_lease(), WithoutLease::Stop, "{c:?}");
    }
    assert_eq!(
        C::Repoint { pod: pod("a") }.without_lease(),
        WithoutLease::Finish
    );
    assert_eq!(C::ReadRecord.without_lease(), WithoutLease::Send);
    assert_eq!(
        C::AwaitConsent { pod: pod("b") }.without_lease(),
        WithoutLease::Send
    );
    assert_eq!(
        C::Unpause { pod: pod("a") }.without_lease(),
        WithoutLease::Send
    );
}
