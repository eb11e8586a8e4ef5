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

    #[test]
    fn addresses_are_read_in_every_form_valkey_prints() {
        assert_eq!(ip_of("10.0.0.1:6379@16379"), "10.0.0.1");
        assert_eq!(ip_of("[fd00::5]:6379@16379,valkey-0"), "fd00::5");
        assert_eq!(ip_of("fd00::5:6379@16379"), "fd00::5");
        assert_eq!(ip_of(":0@0"), "");
    }
}
