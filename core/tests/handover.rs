//! Cluster mode's hand-over step machine (`core::handover::HandoverRun`): peers first, then the
//! target's role, the failover, and the target's role until it is primary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use valkey_sidecar_core::handover::{
    HandoverAnswer as A, HandoverCommand as C, HandoverRun, HandoverStep as S, PEER_POLL_MS,
    PEERS_KNOW_WITHIN_MS, RESEND_AFTER_MS, ROLE_POLL_MS,
};
use valkey_sidecar_core::time::Millis;

fn peers() -> Vec<String> {
    vec!["p1".into(), "p2".into()]
}

#[test]
fn a_planned_hand_over_asks_every_peer_then_the_role_then_fails_over_and_waits() {
    let mut run = HandoverRun::coordinated("t", peers(), Millis(0), 10_000);
    assert_eq!(
        run.next(A::Start, Millis(0)),
        S::Send(C::AskPeer { index: 0 })
    );
    assert_eq!(
        run.next(A::Knows(Some(true)), Millis(1)),
        S::Send(C::AskPeer { index: 1 })
    );
    assert_eq!(
        run.next(A::Knows(Some(true)), Millis(2)),
        S::Send(C::AskRole)
    );
    assert_eq!(run.next(A::Primary(false), Millis(3)), S::Send(C::Failover));
    assert_eq!(run.next(A::Sent, Millis(4)), S::Send(C::AskRole));
    let again = S::Retry {
        after_ms: ROLE_POLL_MS,
        command: C::AskRole,
    };
    assert_eq!(run.next(A::Primary(false), Millis(5)), again);
    assert_eq!(run.next(A::Primary(true), Millis(20)), S::Done);
}

#[test]
fn a_peer_that_does_not_know_the_target_is_asked_again_and_a_silent_one_is_not_waited_for() {
    let mut run = HandoverRun::coordinated("t", peers(), Millis(0), 10_000);
    run.next(A::Start, Millis(0));
    // p1 does not know t yet; p2 does not answer.
    assert_eq!(
        run.next(A::Knows(Some(false)), Millis(1)),
        S::Send(C::AskPeer { index: 1 })
    );
    let ask_p1 = S::Retry {
        after_ms: PEER_POLL_MS,
        command: C::AskPeer { index: 0 },
    };
    assert_eq!(run.next(A::Knows(None), Millis(2)), ask_p1);
    assert_eq!(run.next(A::Knows(Some(false)), Millis(30)), ask_p1);
    assert_eq!(
        run.next(A::Knows(Some(true)), Millis(60)),
        S::Send(C::AskRole)
    );
}

#[test]
fn peers_that_never_learn_the_target_fail_the_hand_over_before_anything_is_sent() {
    let mut run = HandoverRun::coordinated("t", peers(), Millis(0), 10_000);
    run.next(A::Start, Millis(0));
    run.next(A::Knows(Some(false)), Millis(1));
    let step = run.next(A::Knows(Some(false)), Millis(PEERS_KNOW_WITHIN_MS));
    assert_eq!(step, S::Failed("t is not yet known to p1, p2".into()));
    // A shorter limit bounds the wait for the peers too.
    let mut short = HandoverRun::coordinated("t", peers(), Millis(0), 1_000);
    short.next(A::Start, Millis(0));
    short.next(A::Knows(Some(false)), Millis(1));
    assert!(matches!(
        short.next(A::Knows(None), Millis(1_000)),
        S::Failed(_)
    ));
}

#[test]
fn a_target_already_primary_is_done_and_an_unreachable_or_refusing_one_fails() {
    let mut done = HandoverRun::forced("t", Millis(0), 10_000);
    assert_eq!(done.next(A::Start, Millis(0)), S::Send(C::AskRole));
    assert_eq!(done.next(A::Primary(true), Millis(1)), S::Done);
    let mut gone = HandoverRun::forced("t", Millis(0), 10_000);
    gone.next(A::Start, Millis(0));
    let step = gone.next(A::Refused("connection refused".into()), Millis(1));
    assert_eq!(step, S::Failed("cannot reach t: connection refused".into()));
    let mut refusing = HandoverRun::forced("t", Millis(0), 10_000);
    refusing.next(A::Start, Millis(0));
    assert_eq!(
        refusing.next(A::Primary(false), Millis(1)),
        S::Send(C::Failover)
    );
    let step = refusing.next(A::Refused("ERR no".into()), Millis(2));
    assert_eq!(
        step,
        S::Failed("the failover was refused by t: ERR no".into())
    );
}

#[test]
fn a_target_that_does_not_take_over_within_the_limit_fails_it() {
    let mut run = HandoverRun::forced("t", Millis(0), 1_000);
    run.next(A::Start, Millis(0));
    run.next(A::Primary(false), Millis(1));
    run.next(A::Sent, Millis(2));
    assert!(matches!(
        run.next(A::Primary(false), Millis(999)),
        S::Retry { .. }
    ));
    let step = run.next(A::Primary(false), Millis(1_000));
    assert_eq!(
        step,
        S::Failed("the target did not become primary in time".into())
    );
}

#[test]
fn a_failover_valkey_gave_up_on_is_sent_again_and_a_refusal_then_is_read_from_the_role() {
    let mut run = HandoverRun::forced("t", Millis(0), 20_000);
    run.next(A::Start, Millis(0));
    assert_eq!(run.next(A::Primary(false), Millis(1)), S::Send(C::Failover));
    assert_eq!(run.next(A::Sent, Millis(2)), S::Send(C::AskRole));
    // Valkey's manual failover lasts 5 s: until then only the role is read.
    let wait = run.next(A::Primary(false), Millis(2 + RESEND_AFTER_MS - 1));
    assert!(matches!(wait, S::Retry { .. }), "{wait:?}");
    let at = 2 + RESEND_AFTER_MS;
    assert_eq!(
        run.next(A::Primary(false), Millis(at)),
        S::Send(C::Failover)
    );
    // It took over between the read and the command: "send it to a replica" is no failure.
    assert_eq!(
        run.next(A::Refused("ERR a replica".into()), Millis(at + 1)),
        S::Send(C::AskRole)
    );
    // Still not primary: the role is read again, the command not sent again before its period.
    let wait = run.next(A::Primary(false), Millis(at + 2));
    assert!(matches!(wait, S::Retry { .. }), "{wait:?}");
    assert_eq!(run.next(A::Primary(true), Millis(at + 3)), S::Done);
    // The first command refused still fails the move: the target cannot fail over.
    let mut first = HandoverRun::forced("t", Millis(0), 20_000);
    first.next(A::Start, Millis(0));
    first.next(A::Primary(false), Millis(1));
    let refused = first.next(A::Refused("ERR".into()), Millis(2));
    assert!(matches!(refused, S::Failed(_)), "{refused:?}");
}
