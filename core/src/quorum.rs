//! Cluster mode: a primary cut off from most primaries stops taking writes before the majority
//! can elect its replica.
//!
//! Valkey has this rule too, but late: a primary marks a peer unreachable only after its ping has
//! gone unanswered for `cluster-node-timeout`, while the majority may elect the primary's replica
//! from one timeout after *its* pings went unanswered, plus 0.5–1 s. Each side pings every node at
//! least every half timeout, so the two clocks start up to half a timeout apart, and the cut-off
//! primary can keep acknowledging writes after its replica has been elected (a benchmark run
//! caught 1,066 such writes in a 61 ms window). Those writes are lost when the partition heals.
//!
//! The agent beside the primary reads the same evidence from `CLUSTER NODES` (a ping pending
//! for a peer) but judges it after [`QuorumPolicy::silent_after_ms`], a fraction of the node
//! timeout: the latest ping to a peer goes out half a timeout after the cut, so the fence is up by
//! `timeout/2 + silent_after + poll`, well before the earliest election at `timeout + 0.5 s`.
//!
//! The fence is `CLIENT PAUSE … WRITE` for [`QuorumPolicy::pause_ms`], renewed on every
//! observation that still sees a minority. It is never lifted early while the node is a primary:
//! when the partition heals, the pause runs out on its own, which leaves the majority's slot
//! update time to arrive, so that writes queued during the pause meet a replica (and a `MOVED`),
//! not a primary about to be superseded. A node that has become a replica is unpaused at once.

use crate::observation::{Observation, Role};

/// One line of `CLUSTER NODES`, as much as the quorum rule needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Peer {
    pub id: String,
    /// The node's IP as Valkey announces it (`ip:port@cport[,hostname]`); empty when absent.
    pub ip: String,
    pub myself: bool,
    pub primary: bool,
    /// Serves at least one slot: only such primaries vote in elections.
    pub serves_slots: bool,
    /// Flagged `fail?` or `fail`: Valkey itself already judges it unreachable.
    pub failing: bool,
    /// When the pending ping was sent (Valkey's wall clock, ms); 0: no ping pending.
    pub ping_sent_ms: u64,
}

/// Parses `CLUSTER NODES` text; malformed lines are skipped.
pub fn parse_nodes(text: &str) -> Vec<Peer> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Peer> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [
        id,
        addr,
        flags,
        _primary,
        ping,
        _pong,
        _epoch,
        _link,
        slots @ ..,
    ] = fields.as_slice()
    else {
        return None;
    };
    let flag = |f: &str| flags.split(',').any(|x| x == f);
    Some(Peer {
        id: (*id).to_owned(),
        ip: ip_of(addr),
        myself: flag("myself"),
        primary: flag("master"),
        // `[slot->-id]` entries are migrations in progress, not slots served.
        serves_slots: slots.iter().any(|s| !s.starts_with('[')),
        failing: flag("fail?") || flag("fail"),
        ping_sent_ms: ping.parse().ok()?,
    })
}

/// The IP of `ip:port@cport[,hostname]` (IPv6 as Valkey prints it, bare or bracketed).
fn ip_of(addr: &str) -> String {
    let ip_port = addr.split(['@', ',']).next().unwrap_or_default();
    let ip = ip_port.rsplit_once(':').map_or("", |(ip, _)| ip);
    ip.trim_start_matches('[').trim_end_matches(']').to_owned()
}

/// How many slot-serving primaries this node hears, itself included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sight {
    pub reachable: usize,
    pub primaries: usize,
}

impl Sight {
    /// No majority: Valkey's own quorum is `primaries / 2 + 1`.
    pub fn minority(&self) -> bool {
        self.reachable * 2 <= self.primaries
    }
}

/// Counts the voting primaries and those heard from: a peer is silent when it is flagged failing or
/// its ping has been pending for `silent_after_ms` by Valkey's clock (`now_ms`, same clock).
pub fn sight(peers: &[Peer], now_ms: u64, silent_after_ms: u64) -> Sight {
    let voters = peers.iter().filter(|p| p.primary && p.serves_slots);
    let heard = |p: &&Peer| p.myself || !silent(p, now_ms, silent_after_ms);
    Sight {
        reachable: voters.clone().filter(heard).count(),
        primaries: voters.count(),
    }
}

fn silent(p: &Peer, now_ms: u64, silent_after_ms: u64) -> bool {
    let pending = p.ping_sent_ms > 0 && now_ms.saturating_sub(p.ping_sent_ms) >= silent_after_ms;
    p.failing || pending
}

/// When to fence, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuorumPolicy {
    /// A peer whose ping has been pending this long counts as unreachable; must stay below
    /// half the node timeout (the chart sets a fifth of it).
    pub silent_after_ms: u64,
    /// One fence's length; renewed while the minority lasts, so it only bounds how long writes
    /// stay paused after the partition heals (or after the agent itself died).
    pub pause_ms: u64,
}

/// What to do about the local Valkey.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// `CLIENT PAUSE ms WRITE`.
    Fence { ms: u64, reason: String },
    /// `CLIENT UNPAUSE`: the node is no longer a primary.
    Lift { reason: String },
    /// Nothing to do; an earlier fence, if any, runs out on its own.
    Hold,
}

/// [`guard`], after first asking whether the node went unseen too long: `gap_ms` since the
/// previous observation by the agent's monotonic clock. A node frozen (a paused VM, SIGSTOP, a
/// long stall) wakes up with its clients' writes queued and its pings answered at once, so the
/// ping rule sees a majority again while the majority may have elected its replica meanwhile; it
/// learns so only when the new epoch's gossip arrives, tens of milliseconds later. A primary not
/// seen for twice the silence limit is fenced at its first observation, before it acknowledges
/// more than what was already queued; the fence then runs out on its own.
pub fn decide(
    obs: &Observation,
    now_ms: Option<u64>,
    gap_ms: u64,
    fenced: bool,
    policy: &QuorumPolicy,
    heard: Option<Sight>,
) -> Guard {
    let serving = obs
        .cluster
        .as_ref()
        .and_then(|c| c.peers.as_deref())
        .is_some_and(serves_slots);
    let stalled = gap_ms >= policy.silent_after_ms.saturating_mul(2);
    if obs.role == Role::Primary && serving && stalled {
        return Guard::Fence {
            ms: policy.pause_ms,
            reason: format!(
                "unseen for {gap_ms} ms (this node or its agent stalled): the majority may have elected my replica"
            ),
        };
    }
    guard(obs, now_ms, fenced, policy, heard)
}

/// The rule for one observation; `fenced`: this guard's own fence may still be in force;
/// `heard`: the voting primaries whose agents vouch for this one (`crate::heartbeat`), `None`
/// when heartbeats are off or have not been running a window yet.
///
/// Either kind of silence fences: a minority by Valkey's pings, or by the agents' heartbeats
/// (which learn of a cut within a fraction of a second, where Valkey's pings take seconds). A
/// fence is lifted early only when both say majority: the vouching agents see this node as a
/// slot-serving primary not flagged failing, so nobody has taken its slots.
pub fn guard(
    obs: &Observation,
    now_ms: Option<u64>,
    fenced: bool,
    policy: &QuorumPolicy,
    heard: Option<Sight>,
) -> Guard {
    if obs.role != Role::Primary {
        return lift_if(
            fenced,
            "no longer a primary: a replica refuses writes anyway",
        );
    }
    let Some((peers, now)) = obs
        .cluster
        .as_ref()
        .and_then(|c| c.peers.as_ref())
        .zip(now_ms)
    else {
        return Guard::Hold;
    };
    let seen = sight(peers, now, policy.silent_after_ms);
    if !serves_slots(peers) {
        return Guard::Hold;
    }
    if seen.minority() {
        return minority_fence(policy, "hears", seen);
    }
    match heard {
        Some(h) if h.minority() => minority_fence(policy, "has vouches from", h),
        Some(_) if fenced => Guard::Lift {
            reason: "most primaries vouch for me again and nobody took my slots".into(),
        },
        _ => Guard::Hold,
    }
}

fn minority_fence(policy: &QuorumPolicy, how: &str, s: Sight) -> Guard {
    Guard::Fence {
        ms: policy.pause_ms,
        reason: format!(
            "{how} {} of {} primaries: the majority may elect my replica",
            s.reachable, s.primaries
        ),
    }
}

/// Whether the local node serves slots: only then can the majority elect its replica.
fn serves_slots(peers: &[Peer]) -> bool {
    peers.iter().any(|p| p.myself && p.serves_slots)
}

fn lift_if(fenced: bool, reason: &str) -> Guard {
    match fenced {
        true => Guard::Lift {
            reason: reason.to_owned(),
        },
        false => Guard::Hold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observation::ClusterView;

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
        assert_eq!(ip_of("[fd00::5]:6379@16379,valkey-0"), "fd00::5");
        assert_eq!(ip_of("fd00::5:6379@16379"), "fd00::5");
        assert_eq!(ip_of(":0@0"), "");
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
}
