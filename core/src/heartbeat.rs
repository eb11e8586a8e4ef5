//! Peer heartbeats: how a primary learns within a fraction of a second that it is cut off.
//!
//! A primary's agent sends a [`Beat::Ping`] to each peer every interval (100 ms at the chart's
//! defaults; a cluster-mode primary with many peers, every few intervals: [`Spread`]), over UDP on
//! the agent port. Every agent answers every valid ping with a
//! [`Beat::Pong`] that echoes the ping's sequence number and says whether it *vouches* for the
//! pinger: it can hear it, and in its own view the pinger is still the primary (cluster mode: a
//! slot-serving primary not flagged failing; replication mode: the holder the shard record names at
//! the epoch the ping claims). The pinger counts a vouch by the *send* time of the ping it echoes,
//! on its own monotonic clock: a vouch proves a round trip that began then, so it is good for
//! [`IsolationPolicy::fence_after_ms`] from that instant, whatever the two clocks say.
//!
//! A primary that no peer vouches for within that window is fenced by its keeper (replication) or
//! quorum fence (cluster: by a majority of primaries, as Valkey counts votes) — well before the
//! other side can promote anyone. A partition cuts both directions of the exchange, so the cut-off
//! side is fenced about one window after the cut.
//!
//! **Failsafe (replication mode).** While the apiserver cannot be reached, the holder of the shard
//! record cannot renew it. It may go on taking writes past its renew deadline only while *every*
//! member of its shard vouches for it with a promise ([`Beat::Pong::promise_ms`]): the member will
//! not take part in a promotion until the promise expires ([`Promise`]). The pinger asks for
//! promises only then, so a planned hand-over never waits on one. A member that cannot be reached
//! makes no promise, so the holder fences as before; a member that learns the record moved stops
//! vouching, so the holder fences one window later, and the member's promise (three windows) runs
//! out only after that fence is up.
//!
//! The wire format is one line of text (the adapter appends a MAC over it and authenticates
//! before anything here parses it): `VSHB1 ping <cluster> <from> <seq> <epoch> <promise?>` and
//! `VSHB1 pong <cluster> <from> <to> <seq> <vouch> <promise_ms>`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::quorum::{Peer, Sight};
use crate::time::Millis;

/// The format's first word; a new format gets a new word, so old and new agents ignore each other.
pub const MAGIC: &str = "VSHB1";

/// One heartbeat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Beat {
    /// From a primary's agent: "do you still see me as the primary?"
    Ping {
        cluster: String,
        /// The pinger's identity: its node id (cluster mode) or pod name (replication mode).
        from: String,
        seq: u64,
        /// Replication mode: the record epoch the pinger holds; 0 in cluster mode.
        epoch: u64,
        /// The pinger writes past its renew deadline and needs a promise with the vouch.
        wants_promise: bool,
    },
    /// The answer to a ping.
    Pong {
        cluster: String,
        /// The answering agent's identity (node id or pod name).
        from: String,
        /// The pinger's identity, as in the ping: a pong cannot be replayed to another pinger.
        to: String,
        seq: u64,
        vouch: bool,
        /// Replication mode: how long the answering member will not take part in a promotion.
        promise_ms: u64,
    },
}

impl Beat {
    /// The text the MAC covers; identities are DNS labels or hex node ids (no spaces).
    pub fn encode(&self) -> String {
        match self {
            Beat::Ping {
                cluster,
                from,
                seq,
                epoch,
                wants_promise,
            } => format!(
                "{MAGIC} ping {cluster} {from} {seq} {epoch} {}",
                u8::from(*wants_promise)
            ),
            Beat::Pong {
                cluster,
                from,
                to,
                seq,
                vouch,
                promise_ms,
            } => format!(
                "{MAGIC} pong {cluster} {from} {to} {seq} {} {promise_ms}",
                u8::from(*vouch)
            ),
        }
    }

    /// Parses [`Beat::encode`]'s text; anything else is `None`.
    pub fn decode(text: &str) -> Option<Beat> {
        let words: Vec<&str> = text.split(' ').collect();
        match words.as_slice() {
            [MAGIC, "ping", cluster, from, seq, epoch, promise] => Some(Beat::Ping {
                cluster: word(cluster)?,
                from: word(from)?,
                seq: seq.parse().ok()?,
                epoch: epoch.parse().ok()?,
                wants_promise: flag(promise)?,
            }),
            [MAGIC, "pong", cluster, from, to, seq, vouch, promise] => Some(Beat::Pong {
                cluster: word(cluster)?,
                from: word(from)?,
                to: word(to)?,
                seq: seq.parse().ok()?,
                vouch: flag(vouch)?,
                promise_ms: promise.parse().ok()?,
            }),
            _ => None,
        }
    }
}

/// A non-empty identity of at most 253 bytes (a DNS name's limit), printable, no spaces.
fn word(w: &str) -> Option<String> {
    let ok = !w.is_empty() && w.len() <= 253 && w.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| w.to_owned())
}

fn flag(w: &str) -> Option<bool> {
    match w {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

/// Cadence and window, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IsolationPolicy {
    /// How often a primary pings each peer.
    pub interval_ms: u64,
    /// A vouch is good this long after its ping was sent; a primary without one is fenced.
    pub fence_after_ms: u64,
}

impl IsolationPolicy {
    /// The policy when each peer is pinged once every `spread.cycle` rounds: a vouch must outlast
    /// the rounds until its peer's next ping, twice over (a change of the cycle moves peers
    /// between rounds once). The same with [`Spread::EVERY_ROUND`].
    pub fn spread_over(&self, spread: Spread) -> IsolationPolicy {
        let rounds = spread.cycle.saturating_sub(1).saturating_mul(2);
        IsolationPolicy {
            interval_ms: self.interval_ms,
            fence_after_ms: self
                .fence_after_ms
                .saturating_add(rounds.saturating_mul(self.interval_ms)),
        }
    }

    /// How long a member keeps a promise: three windows, so that the holder it vouched for has
    /// fenced (one window after the last vouch, plus a check and a `CLIENT PAUSE`) well before.
    pub fn promise_ms(&self) -> u64 {
        self.fence_after_ms.saturating_mul(3)
    }
}

/// Peers a cluster-mode primary pings per round, at most: every primary pinging every other one
/// each round costs the cluster primaries² datagrams a round. At 50 primaries that was ~40,000 a
/// second on one machine (`bench scale`), and each primary received 20 per peer a second — the
/// agents' 1,000-a-second receive cap, so vouches would be dropped and healthy primaries fenced.
pub const PINGS_PER_ROUND: usize = 8;

/// The most rounds between two pings of one peer: the vouch window grows by two rounds per
/// round of the cycle (3.3 s at the 100 ms default), still inside Valkey's own failure detection
/// (`cluster-node-timeout`, 5 s by default), so a cut-off primary is fenced before anyone can be
/// elected over it.
pub const MAX_CYCLE: u64 = 16;

/// How a primary spreads its pings over rounds: each peer once every `cycle` rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spread {
    pub cycle: u64,
}

impl Spread {
    /// Every peer every round (replication mode: a shard's few members, and the failsafe's
    /// promises are timed by the unstretched window).
    pub const EVERY_ROUND: Spread = Spread { cycle: 1 };

    /// Cluster mode, `peers` other primaries: [`PINGS_PER_ROUND`] a round, unless that would take
    /// more than [`MAX_CYCLE`] rounds to reach them all.
    pub fn cluster(peers: usize) -> Spread {
        let per_round = PINGS_PER_ROUND.max(peers.div_ceil(MAX_CYCLE as usize));
        let cycle = peers.div_ceil(per_round).max(1);
        Spread {
            cycle: u64::try_from(cycle).unwrap_or(MAX_CYCLE),
        }
    }

    /// Whether `peer` is pinged in round `round`: by a fixed hash of its identity, so that peers
    /// coming and going never move the others between rounds.
    pub fn due(&self, peer: &str, round: u64) -> bool {
        self.cycle <= 1 || fnv1a(peer) % self.cycle == round % self.cycle
    }
}

/// Milliseconds from `wall_ms` (the wall clock, ms since the epoch) until the next round: every
/// agent starts its rounds on the same multiples of the interval. Each round's pings then reach a
/// primary together and are read in one wake-up, where unaligned rounds woke every primary once
/// per ping: at 50 primaries on one 2-core machine, the agents were the largest consumer of CPU
/// and most of it was waking up (`bench scale`). Timing is unaffected: a vouch is counted from
/// the pinger's own monotonic send time, whatever the wall clock says. The wait is between half
/// and one and a half intervals, so a step of the wall clock moves one round by less than an
/// interval and a wake-up a little before the boundary does not run a second round.
pub fn until_next_round(wall_ms: u64, interval_ms: u64) -> u64 {
    let interval = interval_ms.max(1);
    let half = interval / 2;
    let after = wall_ms.saturating_add(half);
    let next = (after / interval)
        .saturating_add(1)
        .saturating_mul(interval);
    next.saturating_sub(wall_ms)
}

/// FNV-1a: a hash that is the same in every process and build.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The pinger's memory: the pings it sent recently and the latest vouch of each peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pinger {
    next_seq: u64,
    /// Sequence number and send time of recent pings, oldest first.
    sent: VecDeque<(u64, Millis, bool)>,
    /// Peer identity → the vouch it gave for the latest ping it answered.
    vouches: BTreeMap<String, Vouch>,
    /// Peers that vouched at least once in this run: they speak heartbeats and see this agent's
    /// Valkey as the primary.
    vouchers: BTreeSet<String>,
}

/// One peer's latest vouch, timed by the ping it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vouch {
    /// When the echoed ping was sent (the pinger's clock).
    pub sent: Millis,
    /// The ping asked for a promise and the peer gave one.
    pub promised: bool,
}

/// How many sent pings are remembered: enough for any pong that still counts.
const REMEMBERED: usize = 64;

impl Pinger {
    /// A pinger whose sequence numbers start at `first` (random per process, so a pong from an
    /// earlier run of this agent cannot echo a ping of this one).
    pub fn starting_at(first: u64) -> Pinger {
        Pinger {
            next_seq: first,
            ..Pinger::default()
        }
    }

    /// Registers a ping sent at `now` and returns its sequence number.
    pub fn ping(&mut self, now: Millis, wants_promise: bool) -> u64 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.sent.push_back((seq, now, wants_promise));
        while self.sent.len() > REMEMBERED {
            self.sent.pop_front();
        }
        seq
    }

    /// Takes a pong from `from`; returns whether it counted (it echoes a remembered ping and is
    /// newer than the peer's last). A pong that does not vouch clears the peer's vouch.
    pub fn pong(&mut self, from: &str, seq: u64, vouch: bool, promise_ms: u64) -> bool {
        let Some(&(_, sent, wanted)) = self.sent.iter().find(|(s, _, _)| *s == seq) else {
            return false;
        };
        if self.vouches.get(from).is_some_and(|v| v.sent > sent) {
            return false;
        }
        if !vouch {
            return self.vouches.remove(from).is_some();
        }
        if !self.vouchers.contains(from) {
            self.vouchers.insert(from.to_owned());
        }
        let promised = wanted && promise_ms > 0;
        self.vouches
            .insert(from.to_owned(), Vouch { sent, promised });
        true
    }

    /// Forgets peers that are no longer pinged (scaled away, no longer a primary). A predicate,
    /// not a set: the caller's own map answers it, with no copy of every peer's identity per pong.
    pub fn retain(&mut self, pinged: impl Fn(&str) -> bool) {
        self.vouches.retain(|id, _| pinged(id));
        self.vouchers.retain(|id| pinged(id));
    }

    /// The peers that vouched at least once in this run. Only they are expected to vouch: a peer
    /// that never did may run an agent without heartbeats (mid-upgrade), or may not have caught
    /// up yet (a replica still starting, members after a promotion), and must not fence anyone.
    /// One that did and stops (cut off, or it saw the record move) does.
    pub fn vouchers(&self) -> &BTreeSet<String> {
        &self.vouchers
    }

    /// `peer`'s latest vouch, with until when it is good (it may have run out already).
    pub fn vouched_until(&self, peer: &str, policy: &IsolationPolicy) -> Option<VouchedUntil> {
        self.vouches.get(peer).map(|v| VouchedUntil {
            until: v.sent.plus(policy.fence_after_ms),
            promised: v.promised,
        })
    }

    /// Every peer's vouch that is still good at `now`, with until when.
    pub fn valid(&self, now: Millis, policy: &IsolationPolicy) -> BTreeMap<String, VouchedUntil> {
        let good = |v: &Vouch| v.sent.plus(policy.fence_after_ms);
        self.vouches
            .iter()
            .filter(|(_, v)| now < good(v))
            .map(|(id, v)| {
                let until = good(v);
                (
                    id.clone(),
                    VouchedUntil {
                        until,
                        promised: v.promised,
                    },
                )
            })
            .collect()
    }
}

/// A vouch that is good until `until`; `promised`: it carries a promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VouchedUntil {
    pub until: Millis,
    pub promised: bool,
}

/// What the heartbeats tell the fence: who vouches, and who was expected to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerSight {
    /// The peers that should vouch: the shard's other members (replication) or the other voting
    /// primaries (cluster), by identity.
    pub expected: BTreeSet<String>,
    /// The vouches good at the time this was made, with until when.
    pub vouches: BTreeMap<String, VouchedUntil>,
    /// Silence counts only from here: a window after pinging began (at start, after a
    /// promotion), so that a primary is not fenced before its first pongs could arrive.
    pub judged_from: Millis,
}

impl PeerSight {
    /// No one could vouch: alone in the shard, nobody can be promoted over this primary.
    pub fn alone(&self) -> bool {
        self.expected.is_empty()
    }

    /// Some expected peer vouches at `now`.
    pub fn vouched(&self, now: Millis) -> bool {
        self.expected
            .iter()
            .any(|id| self.vouches.get(id).is_some_and(|v| now < v.until))
    }

    /// Expected peers exist, the grace has passed and none of them vouches at `now`.
    pub fn silent(&self, now: Millis) -> bool {
        !self.alone() && now >= self.judged_from && !self.vouched(now)
    }

    /// Every expected peer vouches at `now` with a promise (the failsafe's condition).
    pub fn all_promised(&self, now: Millis) -> bool {
        let promised = |id: &String| {
            self.vouches
                .get(id)
                .is_some_and(|v| v.promised && now < v.until)
        };
        !self.expected.is_empty() && self.expected.iter().all(promised)
    }

    /// Renews `peer`'s vouch in place when that is all a pong changes: the peer is expected, its
    /// vouch here is still good at `now` and keeps its promise flag, and the new one is good too.
    /// Then every reader ([`Self::vouched`], [`Self::silent`], [`Self::all_promised`],
    /// [`Self::next_change`], [`cluster_sight`]) answers at `now` and later as from a sight made
    /// afresh (which would also drop others' lapsed vouches, that every reader ignores), and
    /// nothing the fence is told about changed. A pong is cheap this way: a sight made afresh
    /// copies every peer's identity. `false`: make it afresh.
    pub fn renew(&mut self, peer: &str, vouch: VouchedUntil, now: Millis) -> bool {
        if !self.expected.contains(peer) || now >= vouch.until {
            return false;
        }
        match self.vouches.get_mut(peer) {
            Some(v) if v.promised == vouch.promised && now < v.until => {
                v.until = v.until.max(vouch.until);
                true
            }
            _ => false,
        }
    }

    /// When the current answer of [`Self::vouched`] may change by the clock alone (the latest
    /// vouch running out): the keeper wakes then to fence on time.
    pub fn next_change(&self, now: Millis) -> Option<Millis> {
        let untils = self.vouches.values().map(|v| v.until);
        untils.chain([self.judged_from]).filter(|u| *u > now).min()
    }
}

/// Cluster mode: the voting primaries whose agents vouch, myself included, out of all voting
/// primaries; `None` during the grace after pinging began. A primary whose agent never vouched
/// in this run (one without heartbeats, mid-upgrade) counts as heard: its silence proves nothing,
/// and Valkey's own pings still judge it ([`crate::quorum`]). One that vouched before and has
/// no valid vouch now counts as unreachable.
pub fn cluster_sight(peers: &[Peer], sight: &PeerSight, now: Millis) -> Option<Sight> {
    if now < sight.judged_from {
        return None;
    }
    let voters = peers.iter().filter(|p| p.primary && p.serves_slots);
    let heard = |p: &&Peer| {
        let vouched = sight.vouches.get(&p.id).is_some_and(|v| now < v.until);
        p.myself || vouched || !sight.expected.contains(&p.id)
    };
    Some(Sight {
        reachable: voters.clone().filter(heard).count(),
        primaries: voters.count(),
    })
}

/// Cluster mode: the primaries to ping (every other voting primary, by node id and IP).
pub fn cluster_targets(peers: &[Peer]) -> Vec<(String, String)> {
    peers
        .iter()
        .filter(|p| !p.myself && p.primary && p.serves_slots && !p.ip.is_empty())
        .map(|p| (p.id.clone(), p.ip.clone()))
        .collect()
}

/// What a responder knows when it answers a ping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponderView<'a> {
    /// Cluster mode: the latest `CLUSTER NODES` of the local Valkey.
    Cluster { peers: &'a [Peer] },
    /// Replication mode: the holder and epoch of the shard record as last read (`None`: not
    /// read, or no record), and whether the local Valkey is a replica.
    Replication {
        holder: Option<(&'a str, u64)>,
        replica: bool,
    },
    /// Nothing is known yet: no vouch.
    Unknown,
}

/// The answer to a ping, and the promise it makes (replication mode, when asked and vouching):
/// until `now + promise_ms` this member takes part in no promotion.
pub fn answer(
    ping: &Beat,
    me: &str,
    view: &ResponderView<'_>,
    now: Millis,
    policy: &IsolationPolicy,
) -> Option<(Beat, Option<Promise>)> {
    let Beat::Ping {
        cluster,
        from,
        seq,
        epoch,
        wants_promise,
    } = ping
    else {
        return None;
    };
    let vouch = vouches(view, from, *epoch);
    let promise = (vouch && *wants_promise && matches!(view, ResponderView::Replication { .. }))
        .then(|| Promise {
            to: from.clone(),
            until: now.plus(policy.promise_ms()),
        });
    let pong = Beat::Pong {
        cluster: cluster.clone(),
        from: me.to_owned(),
        to: from.clone(),
        seq: *seq,
        vouch,
        promise_ms: promise.as_ref().map_or(0, |_| policy.promise_ms()),
    };
    Some((pong, promise))
}

fn vouches(view: &ResponderView<'_>, from: &str, epoch: u64) -> bool {
    match view {
        ResponderView::Cluster { peers } => peers
            .iter()
            .any(|p| p.id == from && p.primary && p.serves_slots && !p.failing),
        ResponderView::Replication { holder, replica } => {
            *replica && *holder == Some((from, epoch))
        }
        ResponderView::Unknown => false,
    }
}

/// A member's promise not to take part in a promotion until `until` (its own clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promise {
    pub to: String,
    pub until: Millis,
}

impl Promise {
    /// Keeps the later of two promises (a newer one never shortens an older one).
    pub fn merge(old: Option<Promise>, new: Promise) -> Promise {
        match old {
            Some(o) if o.until > new.until => o,
            _ => new,
        }
    }

    /// The promise binds at `now`.
    pub fn binds(&self, now: Millis) -> bool {
        now < self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quorum::parse_nodes;

    const POLICY: IsolationPolicy = IsolationPolicy {
        interval_ms: 100,
        fence_after_ms: 300,
    };

    #[test]
    fn beats_round_trip_and_garbage_is_refused() {
        let ping = Beat::Ping {
            cluster: "valkey".into(),
            from: "valkey-0-0".into(),
            seq: 7,
            epoch: 3,
            wants_promise: true,
        };
        let pong = Beat::Pong {
            cluster: "valkey".into(),
            from: "valkey-0-1".into(),
            to: "valkey-0-0".into(),
            seq: 7,
            vouch: true,
            promise_ms: 900,
        };
        for b in [ping, pong] {
            assert_eq!(Beat::decode(&b.encode()), Some(b.clone()));
        }
        for bad in [
            "",
            "VSHB1 ping valkey a 1 2",
            "VSHB1 ping valkey a x 2 0",
            "VSHB1 ping valkey a 1 2 2",
            "VSHB2 ping valkey a 1 2 0",
            "VSHB1 ping  a 1 2 0",
            "VSHB1 pong valkey a b 1 yes 0",
            "VSHB1 pong valkey a b 1 1 -5",
        ] {
            assert_eq!(Beat::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn rounds_start_on_the_wall_clocks_multiples_of_the_interval() {
        // (wall clock, interval) → wait: on the boundary a whole interval; just before it (a
        // wake-up a little early) the one after, never a second round at once.
        for (wall, interval, wait) in [
            (1_000, 100, 100),
            (1_001, 100, 99),
            (1_049, 100, 51),
            (1_050, 100, 150),
            (1_099, 100, 101),
            (7, 1, 1),
            (5, 0, 1),
            (u64::MAX - 10, 100, 10), // saturates at the end of time, no overflow
        ] {
            let got = until_next_round(wall, interval);
            assert_eq!(got, wait, "wall {wall}, interval {interval}");
        }
        // Wherever a round starts, the next one starts on a boundary, half to 1.5 intervals on.
        for wall in 1_000..1_300 {
            let wait = until_next_round(wall, 100);
            assert_eq!((wall + wait) % 100, 0, "{wall}");
            assert!((50..=150).contains(&wait), "{wall}: {wait}");
        }
    }

    #[test]
    fn a_vouch_is_timed_by_the_ping_it_echoes() {
        let mut p = Pinger::starting_at(100);
        let first = p.ping(Millis(1_000), false);
        let second = p.ping(Millis(1_100), false);
        assert_eq!((first, second), (100, 101));
        // The later ping's pong first, then a late pong of the earlier one: the later counts.
        assert!(p.pong("b", second, true, 0));
        assert!(
            !p.pong("b", first, true, 0),
            "an older pong never replaces a newer"
        );
        assert!(!p.pong("b", 99, true, 0), "a pong of no ping of ours");
        assert!(p.vouchers().contains("b"));
        p.retain(|_| false);
        assert!(p.vouchers().is_empty());
        assert!(p.pong("b", second, true, 0));
        let valid = p.valid(Millis(1_399), &POLICY);
        assert_eq!(valid["b"].until, Millis(1_400));
        assert!(
            p.valid(Millis(1_400), &POLICY).is_empty(),
            "a window after its ping"
        );
    }

    /// The sight as the adapter makes it afresh: the vouchers that are pinged, the good vouches.
    fn afresh(p: &Pinger, pinged: &[&str], now: Millis, judged_from: Millis) -> PeerSight {
        PeerSight {
            expected: p
                .vouchers()
                .iter()
                .filter(|id| pinged.contains(&id.as_str()))
                .cloned()
                .collect(),
            vouches: p.valid(now, &POLICY),
            judged_from,
        }
    }

    /// What every reader says at `t`.
    type Readings = (bool, bool, bool, Option<Millis>, Option<usize>);
    fn readings(s: &PeerSight, peers: &[Peer], t: Millis) -> Readings {
        let reachable = cluster_sight(peers, s, t).map(|q| q.reachable);
        let (vouched, silent) = (s.vouched(t), s.silent(t));
        (
            vouched,
            silent,
            s.all_promised(t),
            s.next_change(t),
            reachable,
        )
    }

    #[test]
    fn a_renewed_sight_reads_as_one_made_afresh() {
        let pinged = ["a", "b", "c"];
        let peers: Vec<Peer> = ["me", "a", "b", "c"]
            .iter()
            .map(|id| Peer {
                id: (*id).into(),
                myself: *id == "me",
                primary: true,
                serves_slots: true,
                ..Peer::default()
            })
            .collect();
        for promise in [0, 900] {
            let mut p = Pinger::default();
            let (s0, s1) = (
                p.ping(Millis(0), promise > 0),
                p.ping(Millis(100), promise > 0),
            );
            assert!(p.pong("a", s0, true, promise));
            assert!(p.pong("b", s1, true, promise));
            assert!(p.pong("c", s0, true, promise));
            let now = Millis(250);
            let mut kept = afresh(&p, &pinged, now, Millis(0));
            // A later ping's pong from a peer already vouching: renewed in place.
            let s2 = p.ping(Millis(200), promise > 0);
            assert!(p.pong("a", s2, true, promise));
            let now = Millis(280);
            let renewal = p.vouched_until("a", &POLICY).unwrap();
            assert!(kept.renew("a", renewal, now));
            let fresh = afresh(&p, &pinged, now, Millis(0));
            for t in (280..800).step_by(10).map(Millis) {
                assert_eq!(
                    readings(&kept, &peers, t),
                    readings(&fresh, &peers, t),
                    "at {t:?}"
                );
            }
            // A peer whose vouch lapsed (c's, from the ping at 0) is made afresh: news.
            let s3 = p.ping(Millis(300), promise > 0);
            assert!(p.pong("c", s3, true, promise));
            let renewal = p.vouched_until("c", &POLICY).unwrap();
            assert!(!kept.renew("c", renewal, Millis(320)));
            // A promise given or withdrawn, or a stranger, is news too.
            let flipped = VouchedUntil {
                promised: promise == 0,
                ..renewal
            };
            assert!(!kept.renew("b", flipped, Millis(320)));
            assert!(!kept.renew("d", renewal, Millis(320)));
        }
    }

    #[test]
    fn a_pong_that_withdraws_clears_the_vouch() {
        let mut p = Pinger::default();
        let s = p.ping(Millis(0), false);
        assert!(p.pong("b", s, true, 0));
        let t = p.ping(Millis(100), false);
        assert!(p.pong("b", t, false, 0));
        assert!(p.valid(Millis(150), &POLICY).is_empty());
        assert!(
            p.vouchers().contains("b"),
            "it vouched once: it stays expected"
        );
        let u = p.ping(Millis(200), false);
        assert!(!p.pong("c", u, false, 0));
        assert!(!p.vouchers().contains("c"), "never vouched: not expected");
    }

    #[test]
    fn only_remembered_pings_count() {
        let mut p = Pinger::default();
        let first = p.ping(Millis(0), false);
        for i in 1..=REMEMBERED as u64 {
            p.ping(Millis(i), false);
        }
        assert!(!p.pong("b", first, true, 0));
    }

    #[test]
    fn a_promise_counts_only_when_asked_for() {
        let mut p = Pinger::default();
        let plain = p.ping(Millis(0), false);
        assert!(p.pong("b", plain, true, 900));
        assert!(!p.valid(Millis(10), &POLICY)["b"].promised);
        let asked = p.ping(Millis(100), true);
        assert!(p.pong("b", asked, true, 900));
        assert!(p.valid(Millis(110), &POLICY)["b"].promised);
        let refused = p.ping(Millis(200), true);
        assert!(p.pong("c", refused, true, 0));
        assert!(!p.valid(Millis(210), &POLICY)["c"].promised);
    }

    fn sight(expected: &[&str], vouches: &[(&str, u64, bool)]) -> PeerSight {
        PeerSight {
            expected: expected.iter().map(|s| (*s).to_owned()).collect(),
            vouches: vouches
                .iter()
                .map(|(id, until, promised)| {
                    let v = VouchedUntil {
                        until: Millis(*until),
                        promised: *promised,
                    };
                    ((*id).to_owned(), v)
                })
                .collect(),
            judged_from: Millis(0),
        }
    }

    #[test]
    fn silence_counts_after_the_grace_only() {
        let mut s = sight(&["b"], &[]);
        s.judged_from = Millis(500);
        assert!(!s.silent(Millis(499)));
        assert!(s.silent(Millis(500)));
        assert_eq!(s.next_change(Millis(100)), Some(Millis(500)));
        assert!(
            !sight(&[], &[]).silent(Millis(1_000)),
            "alone: never silent"
        );
        assert!(!sight(&["b"], &[("b", 1_200, false)]).silent(Millis(1_000)));
    }

    #[test]
    fn vouched_and_all_promised_as_a_table() {
        let now = Millis(1_000);
        let cases: &[(&str, PeerSight, bool, bool)] = &[
            ("alone", sight(&[], &[]), false, false),
            ("nobody vouches", sight(&["b", "c"], &[]), false, false),
            (
                "one of two",
                sight(&["b", "c"], &[("b", 1_200, true)]),
                true,
                false,
            ),
            (
                "both, one without a promise",
                sight(&["b", "c"], &[("b", 1_200, true), ("c", 1_200, false)]),
                true,
                false,
            ),
            (
                "both promised",
                sight(&["b", "c"], &[("b", 1_200, true), ("c", 1_100, true)]),
                true,
                true,
            ),
            (
                "one ran out",
                sight(&["b", "c"], &[("b", 1_200, true), ("c", 1_000, true)]),
                true,
                false,
            ),
            (
                "a stranger's vouch",
                sight(&["b"], &[("x", 1_200, true)]),
                false,
                false,
            ),
        ];
        for (name, s, vouched, all) in cases {
            assert_eq!(s.vouched(now), *vouched, "{name}");
            assert_eq!(s.all_promised(now), *all, "{name}");
        }
        let s = sight(&["b", "c"], &[("b", 1_200, true), ("c", 1_100, true)]);
        assert_eq!(s.next_change(now), Some(Millis(1_100)));
        assert_eq!(s.next_change(Millis(1_200)), None);
    }

    const NODES: &str = "a 10.0.0.1:6379@16379 myself,master - 0 0 1 connected 0-5460
b 10.0.0.2:6379@16379 master - 0 0 2 connected 5461-10922
c 10.0.0.3:6379@16379,host-c master,fail? - 0 0 3 connected 10923-16383
d 10.0.0.4:6379@16379 slave a 0 0 1 connected";

    #[test]
    fn cluster_mode_pings_the_other_voters_and_counts_their_vouches() {
        let peers = parse_nodes(NODES);
        assert_eq!(
            cluster_targets(&peers),
            [
                ("b".to_owned(), "10.0.0.2".to_owned()),
                ("c".to_owned(), "10.0.0.3".to_owned())
            ]
        );
        let now = Millis(1_000);
        let count = |s: &PeerSight| {
            let got = cluster_sight(&peers, s, now).unwrap();
            (got.reachable, got.primaries, got.minority())
        };
        assert_eq!(count(&sight(&["b", "c"], &[])), (1, 3, true));
        assert_eq!(
            count(&sight(&["b", "c"], &[("b", 1_100, false)])),
            (2, 3, false)
        );
        assert_eq!(
            count(&sight(&["b", "c"], &[("b", 1_000, false)])),
            (1, 3, true),
            "ran out"
        );
        // c never vouched: its agent may not speak heartbeats; it cannot fence anyone.
        assert_eq!(count(&sight(&["b"], &[])), (2, 3, false));
        let mut early = sight(&["b", "c"], &[]);
        early.judged_from = Millis(1_001);
        assert_eq!(cluster_sight(&peers, &early, now), None, "in the grace");
    }

    #[test]
    fn a_responder_vouches_only_for_whom_it_sees_as_primary() {
        let peers = parse_nodes(NODES);
        let ping = |from: &str, epoch, wants_promise| Beat::Ping {
            cluster: "v".into(),
            from: from.into(),
            seq: 1,
            epoch,
            wants_promise,
        };
        let vouch =
            |b: &Beat, view: &ResponderView<'_>| match answer(b, "me", view, Millis(0), &POLICY) {
                Some((
                    Beat::Pong {
                        vouch, promise_ms, ..
                    },
                    promise,
                )) => (vouch, promise_ms, promise.is_some()),
                other => panic!("{other:?}"),
            };
        let cluster = ResponderView::Cluster { peers: &peers };
        let replica = ResponderView::Replication {
            holder: Some(("p", 4)),
            replica: true,
        };
        let primary = ResponderView::Replication {
            holder: Some(("p", 4)),
            replica: false,
        };
        let unknown = ResponderView::Unknown;
        let cases = [
            (
                "a slot-serving primary",
                ping("b", 0, false),
                &cluster,
                (true, 0, false),
            ),
            (
                "flagged failing",
                ping("c", 0, false),
                &cluster,
                (false, 0, false),
            ),
            (
                "a replica",
                ping("d", 0, false),
                &cluster,
                (false, 0, false),
            ),
            (
                "no promises in cluster mode",
                ping("b", 0, true),
                &cluster,
                (true, 0, false),
            ),
            (
                "the holder",
                ping("p", 4, false),
                &replica,
                (true, 0, false),
            ),
            (
                "the holder, asking",
                ping("p", 4, true),
                &replica,
                (true, 900, true),
            ),
            (
                "an older epoch",
                ping("p", 3, true),
                &replica,
                (false, 0, false),
            ),
            (
                "not the holder",
                ping("q", 4, true),
                &replica,
                (false, 0, false),
            ),
            (
                "a master never vouches",
                ping("p", 4, true),
                &primary,
                (false, 0, false),
            ),
            (
                "nothing known",
                ping("p", 4, true),
                &unknown,
                (false, 0, false),
            ),
        ];
        for (name, p, view, want) in cases {
            assert_eq!(vouch(&p, view), want, "{name}");
        }
        let pong = Beat::Pong {
            cluster: "v".into(),
            from: "x".into(),
            to: "y".into(),
            seq: 1,
            vouch: true,
            promise_ms: 0,
        };
        assert_eq!(
            answer(&pong, "me", &cluster, Millis(0), &POLICY),
            None,
            "pongs are not answered"
        );
    }

    #[test]
    fn a_newer_promise_never_shortens_an_older_one() {
        let long = Promise {
            to: "p".into(),
            until: Millis(900),
        };
        let short = Promise {
            to: "p".into(),
            until: Millis(500),
        };
        assert_eq!(Promise::merge(Some(long.clone()), short.clone()), long);
        assert_eq!(Promise::merge(Some(short), long.clone()), long);
        assert!(long.binds(Millis(899)) && !long.binds(Millis(900)));
    }

    #[test]
    fn a_cluster_primary_spreads_its_pings_once_it_has_more_than_eight_peers() {
        let cycles: Vec<(usize, u64)> = [0, 1, 8, 9, 16, 17, 49, 128, 499, 2_000]
            .into_iter()
            .map(|n| (n, Spread::cluster(n).cycle))
            .collect();
        let want = [
            (0, 1),
            (1, 1),
            (8, 1),
            (9, 2),
            (16, 2),
            (17, 3),
            (49, 7),
            (128, 16),
            (499, 16),
            (2_000, 16),
        ];
        assert_eq!(cycles, want);
    }

    #[test]
    fn every_peer_is_pinged_once_in_any_cycle_of_rounds() {
        let peers: Vec<String> = (0..49).map(|i| format!("{i:040x}")).collect();
        let spread = Spread::cluster(peers.len());
        for start in 0..spread.cycle * 3 {
            for p in &peers {
                let due = (start..start + spread.cycle)
                    .filter(|r| spread.due(p, *r))
                    .count();
                assert_eq!(due, 1, "{p} from round {start}");
            }
        }
        assert!(peers.iter().all(|p| Spread::EVERY_ROUND.due(p, 7)));
    }

    #[test]
    fn a_spread_stretches_the_vouch_window_by_two_rounds_per_round_of_the_cycle() {
        let policy = IsolationPolicy {
            interval_ms: 100,
            fence_after_ms: 300,
        };
        assert_eq!(policy.spread_over(Spread::EVERY_ROUND), policy);
        assert_eq!(
            policy.spread_over(Spread { cycle: 7 }).fence_after_ms,
            1_500
        );
        let widest = policy.spread_over(Spread { cycle: MAX_CYCLE });
        assert_eq!(
            widest.fence_after_ms, 3_300,
            "inside a 5 s cluster-node-timeout"
        );
    }
}
