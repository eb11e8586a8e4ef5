//! `quorum`: its tables, through the module's public entry points (tests of private helpers stay in the module).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use valkey_sidecar_core::observation::ClusterView;
use valkey_sidecar_core::observation::{Observation, Role};
use valkey_sidecar_core::quorum::*;

const NOW: u64 = 1_000_000;

fn line(id: &str, flags: &str, ping: u64, slots: &str) -> String {
    format!("{id} 10.0.0.1:6379@16379 {flags} - {ping} {NOW} 1 connected {slots}")
}

/// Three primaries (me first) with pings sent at the given times (0: none pending).
fn three(pings: [u64; 3]) -> String {
    let [a, b, c] = pings;
    [
        line("a", "myself,master", a, "0-5460"),
        line("b", "master", b, "5461-10922"),
        line("c", "master", c, "10923-16383"),
        line("d", "slave", NOW - 9_000, ""),
    ]
    .join("\n")
}

fn obs(role: Role, nodes: &str) -> Observation {
    Observation {
        role,
        cluster: Some(ClusterView {
            peers: Some(parse_nodes(nodes)),
            ..ClusterView::default()
        }),
        ..Observation::default()
    }
}

const POLICY: QuorumPolicy = QuorumPolicy {
    silent_after_ms: 1000,
    pause_ms: 1500,
};

#[test]
fn a_primary_unseen_for_two_silence_limits_is_fenced_whatever_it_hears_now() {
    let heard = obs(Role::Primary, &three([0, 0, 0]));
    let cases = [
        (Role::Primary, 1_999, false),
        (Role::Primary, 2_000, true),
        (Role::Primary, 60_000, true),
        (Role::Replica, 60_000, false),
    ];
    for (role, gap, fences) in cases {
        let o = Observation {
            role,
            ..heard.clone()
        };
        let got = decide(&o, Some(NOW), gap, false, &POLICY, None);
        assert_eq!(
            matches!(got, Guard::Fence { .. }),
            fences,
            "{role:?} {gap}: {got:?}"
        );
    }
    // Without slots it decides no election; without CLUSTER NODES it cannot tell.
    let slotless = three([0, 0, 0]).replace(
        &line("a", "myself,master", 0, "0-5460"),
        &line("a", "myself,master", 0, ""),
    );
    assert_ne!(slotless, three([0, 0, 0]));
    let got = decide(
        &obs(Role::Primary, &slotless),
        Some(NOW),
        60_000,
        false,
        &POLICY,
        None,
    );
    assert_eq!(got, Guard::Hold);
    let blind = Observation {
        role: Role::Primary,
        ..Observation::default()
    };
    assert_eq!(
        decide(&blind, Some(NOW), 60_000, false, &POLICY, None),
        Guard::Hold
    );
}

#[test]
fn heartbeats_fence_sooner_and_lift_only_when_both_say_majority() {
    let sight = |reachable| {
        Some(Sight {
            reachable,
            primaries: 3,
        })
    };
    let all = obs(Role::Primary, &three([0, 0, 0]));
    let pending = obs(Role::Primary, &three([0, NOW - 1000, NOW - 1000]));
    let cases = [
        (
            "pings fine, vouches from 1 of 3",
            &all,
            false,
            sight(1),
            "fence",
        ),
        (
            "pings fine, vouches from 2 of 3",
            &all,
            false,
            sight(2),
            "hold",
        ),
        ("fenced, both majority again", &all, true, sight(2), "lift"),
        (
            "fenced, vouched but pings pending",
            &pending,
            true,
            sight(3),
            "fence",
        ),
        ("fenced, no heartbeats", &all, true, None, "hold"),
        (
            "a replica",
            &obs(Role::Replica, &three([0, 0, 0])),
            false,
            sight(1),
            "hold",
        ),
    ];
    for (name, o, fenced, heard, want) in cases {
        let got = match guard(o, Some(NOW), fenced, &POLICY, heard) {
            Guard::Fence { .. } => "fence",
            Guard::Lift { .. } => "lift",
            Guard::Hold => "hold",
        };
        assert_eq!(got, want, "{name}");
    }
    // A stall fences whatever the heartbeats say.
    let got = decide(&all, Some(NOW), 5_000, true, &POLICY, sight(3));
    assert!(matches!(got, Guard::Fence { .. }), "{got:?}");
}

#[test]
fn parses_flags_slots_and_pings() {
    let text = format!(
        "{}\n{}\ngarbage\n",
        line("a", "myself,master", 0, "0-10 [11->-b]"),
        line("b", "master,fail?", 42, "[12-<-a]")
    );
    let peers = parse_nodes(&text);
    assert_eq!(peers.len(), 2);
    assert!(peers[0].myself && peers[0].primary && peers[0].serves_slots);
    assert!(peers[1].failing && !peers[1].serves_slots);
    assert_eq!(peers[1].ping_sent_ms, 42);
    assert_eq!(peers[0].ip, "10.0.0.1");
}

#[test]
fn the_rule_as_a_table() {
    let silent = NOW - 1000;
    let recent = NOW - 999;
    let fence = |r| Guard::Fence {
        ms: 1500,
        reason: format!("hears {r} of 3 primaries: the majority may elect my replica"),
    };
    let cases: &[(&str, Role, [u64; 3], bool, Guard)] = &[
        ("all heard", Role::Primary, [0, 0, 0], false, Guard::Hold),
        (
            "one silent",
            Role::Primary,
            [0, silent, 0],
            false,
            Guard::Hold,
        ),
        (
            "pending, not yet silent",
            Role::Primary,
            [0, silent, recent],
            false,
            Guard::Hold,
        ),
        (
            "both others silent",
            Role::Primary,
            [0, silent, silent],
            false,
            fence(1),
        ),
        (
            "renewed while fenced",
            Role::Primary,
            [0, silent, silent],
            true,
            fence(1),
        ),
        (
            "heard again: runs out",
            Role::Primary,
            [0, 0, silent],
            true,
            Guard::Hold,
        ),
        (
            "a replica",
            Role::Replica,
            [0, silent, silent],
            false,
            Guard::Hold,
        ),
    ];
    for (name, role, pings, fenced, want) in cases {
        let got = guard(
            &obs(*role, &three(*pings)),
            Some(NOW),
            *fenced,
            &POLICY,
            None,
        );
        assert_eq!(&got, want, "{name}");
    }
}

#[test]
fn a_demoted_node_is_unpaused_at_once() {
    let got = guard(
        &obs(Role::Replica, &three([0, 0, 0])),
        Some(NOW),
        true,
        &POLICY,
        None,
    );
    assert!(matches!(got, Guard::Lift { .. }), "{got:?}");
}

#[test]
fn valkeys_own_failure_flags_count_as_silent() {
    let nodes = [
        line("a", "myself,master", 0, "0-5460"),
        line("b", "master,fail?", 0, "5461-10922"),
        line("c", "master,fail", 0, "10923-16383"),
    ]
    .join("\n");
    let got = guard(&obs(Role::Primary, &nodes), Some(NOW), false, &POLICY, None);
    assert!(matches!(got, Guard::Fence { ms: 1500, .. }), "{got:?}");
}

#[test]
fn without_evidence_or_slots_nothing_is_fenced() {
    let nodes = three([0, NOW - 5000, NOW - 5000]);
    let unknown_time = guard(&obs(Role::Primary, &nodes), None, false, &POLICY, None);
    let no_slots = nodes.replace("0-5460", "");
    let slotless = guard(
        &obs(Role::Primary, &no_slots),
        Some(NOW),
        false,
        &POLICY,
        None,
    );
    let mut blind = obs(Role::Primary, &nodes);
    blind.cluster = Some(ClusterView::default());
    let unread = guard(&blind, Some(NOW), false, &POLICY, None);
    assert_eq!(
        [unknown_time, slotless, unread],
        [Guard::Hold, Guard::Hold, Guard::Hold]
    );
}

#[test]
fn one_primary_or_an_even_split() {
    let alone = line("a", "myself,master", 0, "0-16383");
    assert!(!sight(&parse_nodes(&alone), NOW, 1000).minority());
    let two = [
        line("a", "myself,master", 0, "0-1"),
        line("b", "master", 1, "2-3"),
    ]
    .join("\n");
    // Two primaries, one silent: 1 of 2 is no majority, as Valkey counts it.
    assert!(sight(&parse_nodes(&two), NOW, 1000).minority());
}
