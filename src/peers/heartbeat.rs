//! Peer heartbeats over UDP on the agent port (`core::heartbeat` has the rules and the format).
//!
//! One task per agent: every interval it pings its peers when its Valkey is a primary that could
//! be replaced (cluster mode: the other slot-serving primaries from `CLUSTER NODES`; replication
//! mode: the other members of its shard, while its keeper holds the record), answers every ping it
//! receives, and publishes what the pongs say ([`PeerSight`]) for the fence, and the promise it
//! made ([`Promise`]) for its keeper. It never waits on Valkey or the apiserver: what it answers
//! comes from the latest observation and record the other tasks published.
//!
//! Every datagram carries an HMAC-SHA256 over its text, keyed from the agents' Valkey password
//! (which only the agents hold); unauthenticated, malformed or excess datagrams are dropped and
//! counted. Each source address may send `PER_SOURCE_PER_S` datagrams per second, all sources
//! together `ALL_PER_S`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use valkey_sidecar_core::health::{Bounds, HealthState};
use valkey_sidecar_core::heartbeat::{
    Beat, IsolationPolicy, PeerSight, Pinger, Promise, ResponderView, Spread, answer,
    cluster_targets, until_next_round,
};
use valkey_sidecar_core::observation::{Mode, Observation, Role};
use valkey_sidecar_core::ratelimit::TokenBucket;
use valkey_sidecar_core::replication::Claim;
use valkey_sidecar_core::time::Millis;

use crate::cli::config::Password;
use crate::keeper::RecordSeed;
use crate::runtime::clock::Clock;
use crate::runtime::metrics::Metrics;

/// Datagrams one source address may send per second (a primary pings 10 a second).
const PER_SOURCE_PER_S: u32 = 50;
/// Datagrams all sources together may send per second (a token bucket refills by the
/// millisecond, so 1,000 is its finest rate).
const ALL_PER_S: u32 = 1_000;
/// Sources tracked for the per-source limit; past it the table starts afresh.
const SOURCES: usize = 1_024;
/// The password file is read again this often (a rotation needs no restart).
const KEY_REFRESH: Duration = Duration::from_secs(30);
/// A datagram's text ends here; the 32-byte MAC follows.
const SEPARATOR: u8 = b'\n';

/// Replication mode's inputs from the keeper.
#[derive(Clone)]
pub struct ShardLinks {
    /// The shard's members, name → pod IP (`k8s::members`), this pod included.
    pub members: watch::Receiver<BTreeMap<String, IpAddr>>,
    /// The epoch this agent holds and from when it asks for promises (`replication::claim`).
    pub claim: watch::Receiver<Option<Claim>>,
    /// The shard record as the keeper last read it (what a vouch is about).
    pub seed: watch::Receiver<RecordSeed>,
}

/// Everything the heartbeat task needs.
#[derive(Clone)]
pub struct Heartbeat {
    /// Bound to the agent's own address and port, so a pong goes back to where pings come from.
    pub bind: SocketAddr,
    pub cluster: String,
    pub pod: String,
    pub mode: Mode,
    pub policy: IsolationPolicy,
    pub password: Option<Password>,
    pub clock: Clock,
    pub bounds: Bounds,
    pub state: watch::Receiver<HealthState>,
    pub shard: Option<ShardLinks>,
    pub sight: watch::Sender<Option<PeerSight>>,
    pub promise: watch::Sender<Option<Promise>>,
    pub metrics: Arc<Metrics>,
}

/// Why a datagram was dropped, for the counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drop {
    Rate,
    Mac,
    Format,
    Foreign,
}

impl Drop {
    fn kind(self) -> &'static str {
        match self {
            Drop::Rate => "dropped_rate",
            Drop::Mac => "dropped_mac",
            Drop::Format => "dropped_format",
            Drop::Foreign => "dropped_foreign",
        }
    }
}

/// The running state of the task.
struct Beating {
    pinger: Pinger,
    keys: Keys,
    limits: Limits,
    /// Who was pinged last round, by identity, and where.
    targets: BTreeMap<String, IpAddr>,
    /// When this run of pinging began (silence is judged a window later).
    pinging_since: Option<Millis>,
    /// Rounds so far, and the vouch window for how the pings are spread over them now.
    round: u64,
    policy: IsolationPolicy,
    buf: Vec<u8>,
}

impl Heartbeat {
    /// Runs until shutdown. Without a socket (the port taken) it says so and fences nothing.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let socket = match UdpSocket::bind(self.bind).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(addr = %self.bind, error = %e, "cannot bind the heartbeat socket: no peer isolation fence");
                return;
            }
        };
        tracing::info!(addr = %self.bind, interval_ms = self.policy.interval_ms, fence_after_ms = self.policy.fence_after_ms, "peer heartbeats started");
        let mut beating = Beating {
            pinger: Pinger::starting_at(random_u64()),
            keys: Keys::load(self.password.as_ref(), &self.cluster),
            limits: Limits::new(self.clock.now()),
            targets: BTreeMap::new(),
            pinging_since: None,
            round: 0,
            policy: self.policy,
            buf: vec![0; 2_048],
        };
        let next_round = tokio::time::sleep(self.until_next_round());
        tokio::pin!(next_round);
        let mut refresh = tokio::time::interval(KEY_REFRESH);
        let mut news = News::of(&self);
        loop {
            // An agent with nobody to ping (a replica, most of a cluster's agents) waits for news
            // instead of waking every interval for nothing; the round then runs at once.
            let idle = beating.targets.is_empty();
            // The next round is set only after one ran: the round's instant is when pings
            // arrive, and a datagram taken first must not move that round away.
            let ran = tokio::select! {
                () = &mut next_round, if !idle => true,
                () = news.changed(), if idle => true,
                r = socket.recv_from(&mut beating.buf) => {
                    match r {
                        Ok((n, from)) => self.received(&socket, &mut beating, n, from).await,
                        Err(e) => tracing::debug!(error = %e, "heartbeat receive failed"),
                    }
                    false
                }
                _ = refresh.tick() => {
                    beating.keys.refresh(self.password.as_ref(), &self.cluster);
                    false
                }
                _ = shutdown.changed() => return,
            };
            if ran {
                self.round(&socket, &mut beating).await;
                let next = tokio::time::Instant::now() + self.until_next_round();
                next_round.as_mut().reset(next);
            }
        }
    }

    /// Rounds start on the wall clock's multiples of the interval, the same instants for every
    /// agent (`core::heartbeat::until_next_round`: one wake-up for a round's pings, not one each).
    fn until_next_round(&self) -> Duration {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, crate::runtime::clock::millis);
        Duration::from_millis(until_next_round(wall, self.policy.interval_ms))
    }

    /// One interval: ping the peers of a primary that could be replaced, publish what is known.
    async fn round(&self, socket: &UdpSocket, b: &mut Beating) {
        let now = self.clock.now();
        let (me, targets, epoch, wants_promise) = self.targets();
        b.pinging_since = match (&targets.is_empty(), b.pinging_since) {
            (true, _) => None,
            (false, None) => Some(now),
            (false, since) => since,
        };
        b.targets = targets;
        // Cluster mode spreads a primary's pings over rounds (`core::heartbeat::Spread`); every
        // peer still counts, with a window that outlasts the rounds between its pings.
        let spread = match self.mode {
            Mode::Cluster => Spread::cluster(b.targets.len()),
            Mode::Replication => Spread::EVERY_ROUND,
        };
        b.policy = self.policy.spread_over(spread);
        b.round = b.round.wrapping_add(1);
        if !b.targets.is_empty() {
            let seq = b.pinger.ping(now, wants_promise);
            let ping = Beat::Ping {
                cluster: self.cluster.clone(),
                from: me,
                seq,
                epoch,
                wants_promise,
            };
            let wire = b.keys.seal(&ping.encode());
            let due = b.targets.iter().filter(|(id, _)| spread.due(id, b.round));
            for (_, ip) in due {
                let _ = socket
                    .send_to(&wire, SocketAddr::new(*ip, self.bind.port()))
                    .await;
            }
            self.metrics.heartbeat("ping_sent");
        }
        self.publish(b, now);
    }

    /// My identity, the peers to ping (identity → IP), the epoch claimed and whether promises
    /// are asked for. Nobody, while this agent's Valkey is not a primary that could be replaced.
    fn targets(&self) -> (String, BTreeMap<String, IpAddr>, u64, bool) {
        match (&self.mode, &self.shard) {
            (Mode::Replication, Some(links)) => self.shard_targets(links),
            _ => self.cluster_peers(),
        }
    }

    fn shard_targets(&self, links: &ShardLinks) -> (String, BTreeMap<String, IpAddr>, u64, bool) {
        let Some(claim) = *links.claim.borrow() else {
            return (self.pod.clone(), BTreeMap::new(), 0, false);
        };
        let mut members = links.members.borrow().clone();
        members.remove(&self.pod);
        let wants = self.clock.now() >= claim.promises_from;
        (self.pod.clone(), members, claim.epoch, wants)
    }

    /// Read under the state's lock, never cloned: it runs every round, and a clone of a large
    /// cluster's observation per round and per datagram was most of an idle agent's CPU.
    fn cluster_peers(&self) -> (String, BTreeMap<String, IpAddr>, u64, bool) {
        let none = || (String::new(), BTreeMap::new(), 0, false);
        let now = self.clock.now();
        let state = self.state.borrow();
        let Some(obs) = state.current(now, &self.bounds) else {
            return none();
        };
        let Some((me, peers)) = cluster_me_and_peers(obs) else {
            return none();
        };
        if obs.role != Role::Primary {
            return (me.to_owned(), BTreeMap::new(), 0, false);
        }
        let targets = cluster_targets(peers)
            .into_iter()
            .filter_map(|(id, ip)| Some((id, ip.parse().ok()?)))
            .collect();
        (me.to_owned(), targets, 0, false)
    }

    /// Whether `to`, a pong's addressee, is this agent: the pod (replication mode), else the
    /// node id. Compared under the state's lock, not copied: it runs for every pong.
    fn is_me(&self, to: &str) -> bool {
        if let (Mode::Replication, Some(_)) = (&self.mode, &self.shard) {
            return self.pod == to;
        }
        let now = self.clock.now();
        let state = self.state.borrow();
        let obs = state.current(now, &self.bounds);
        obs.and_then(cluster_me_and_peers)
            .is_some_and(|(me, _)| me == to)
    }

    /// What the fence reads: the expected peers (those pinged that vouched before in this run,
    /// `Pinger::vouchers`) and the vouches.
    fn publish(&self, b: &mut Beating, now: Millis) {
        let Some(since) = b.pinging_since else {
            self.sight.send_if_modified(|s| s.take().is_some());
            self.metrics.peers_vouching(0);
            return;
        };
        let targets = &b.targets;
        b.pinger.retain(|id| targets.contains_key(id));
        let expected = b
            .pinger
            .vouchers()
            .iter()
            .filter(|id| targets.contains_key(*id));
        let sight = PeerSight {
            expected: expected.cloned().collect(),
            vouches: b.pinger.valid(now, &b.policy),
            judged_from: since.plus(b.policy.fence_after_ms),
        };
        self.metrics.peers_vouching(sight.vouches.len());
        self.sight.send_if_modified(|old| {
            let flipped = old.as_ref().is_none_or(|o| changed(o, &sight, now));
            *old = Some(sight);
            flipped
        });
    }

    async fn received(&self, socket: &UdpSocket, b: &mut Beating, n: usize, from: SocketAddr) {
        let now = self.clock.now();
        let beat = match b
            .limits
            .admit(from.ip(), now)
            .and_then(|()| b.keys.open(&b.buf[..n]))
        {
            Ok(beat) => beat,
            Err(why) => return self.metrics.heartbeat(why.kind()),
        };
        match beat {
            ping @ Beat::Ping { .. } => self.answer(socket, b, &ping, from).await,
            Beat::Pong {
                cluster,
                from: peer,
                to,
                seq,
                vouch,
                promise_ms,
            } => {
                if cluster != self.cluster || !self.is_me(&to) {
                    return self.metrics.heartbeat(Drop::Foreign.kind());
                }
                if b.pinger.pong(&peer, seq, vouch, promise_ms) {
                    self.metrics.heartbeat("pong_counted");
                    if !self.renew(b, &peer, now) {
                        self.publish(b, now);
                    }
                }
            }
        }
    }

    /// A pong that only renews a vouch the published sight holds is applied in place, unannounced
    /// (`PeerSight::renew`); a sight made afresh per pong copied every peer's identity, the most
    /// of an idle primary's CPU at 50 primaries. `false`: publish afresh.
    fn renew(&self, b: &Beating, peer: &str, now: Millis) -> bool {
        let Some(vouch) = b.pinger.vouched_until(peer, &b.policy) else {
            return false;
        };
        let mut renewed = false;
        self.sight.send_if_modified(|sight| {
            renewed = sight.as_mut().is_some_and(|s| s.renew(peer, vouch, now));
            false
        });
        renewed
    }

    async fn answer(&self, socket: &UdpSocket, b: &mut Beating, ping: &Beat, to: SocketAddr) {
        let Beat::Ping { cluster, .. } = ping else {
            return;
        };
        if *cluster != self.cluster {
            return self.metrics.heartbeat(Drop::Foreign.kind());
        }
        let now = self.clock.now();
        let answered = {
            let state = self.state.borrow();
            let obs = state.current(now, &self.bounds);
            match (&self.mode, obs.and_then(cluster_me_and_peers)) {
                (Mode::Cluster, Some((me, peers))) => answer(
                    ping,
                    me,
                    &ResponderView::Cluster { peers },
                    now,
                    &self.policy,
                ),
                _ => {
                    let (me, view) = self.responder(obs);
                    answer(ping, &me, &view.as_view(), now, &self.policy)
                }
            }
        };
        let Some((pong, promise)) = answered else {
            return;
        };
        if let Some(p) = promise {
            self.promise
                .send_modify(|old| *old = Some(Promise::merge(old.take(), p)));
        }
        let _ = socket.send_to(&b.keys.seal(&pong.encode()), to).await;
        self.metrics.heartbeat("ping_answered");
    }

    /// This agent's identity and what it knows, as a responder (replication mode; cluster mode
    /// answers from the borrowed observation in [`Self::answer`]).
    fn responder(&self, obs: Option<&Observation>) -> (String, OwnedView) {
        match (&self.mode, &self.shard, obs) {
            (Mode::Replication, Some(links), Some(obs)) => {
                let holder = links.seed.borrow().as_ref().and_then(|(_, seen)| {
                    let r = seen.record.as_ref()?;
                    Some((r.holder()?.to_owned(), r.epoch))
                });
                let replica = obs.role == Role::Replica;
                (self.pod.clone(), OwnedView::Replication { holder, replica })
            }
            _ => (self.pod.clone(), OwnedView::Unknown),
        }
    }
}

/// What can give an agent with nobody to ping someone to ping: its Valkey's state (cluster mode:
/// its role and peers), and in replication mode its claim on the record and the shard's members.
struct News {
    state: watch::Receiver<HealthState>,
    links: Option<ShardLinks>,
}

impl News {
    fn of(heartbeat: &Heartbeat) -> News {
        let links = match (&heartbeat.mode, &heartbeat.shard) {
            (Mode::Replication, Some(l)) => Some(l.clone()),
            _ => None,
        };
        News {
            state: heartbeat.state.clone(),
            links,
        }
    }

    /// Returns on a change; never, once every sender is gone (shutting down), so that an idle
    /// loop cannot spin on a closed channel.
    async fn changed(&mut self) {
        match &mut self.links {
            Some(links) => tokio::select! {
                Ok(()) = self.state.changed() => {}
                Ok(()) = links.claim.changed() => {}
                Ok(()) = links.members.changed() => {}
                else => std::future::pending().await,
            },
            None => {
                if self.state.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// Whether the fence must hear about the new sight now: who is expected or vouches changed, or
/// the failsafe's condition flipped. Untils alone change every pong and are read, not announced.
fn changed(old: &PeerSight, new: &PeerSight, now: Millis) -> bool {
    old.expected != new.expected
        || !old.vouches.keys().eq(new.vouches.keys())
        || old.all_promised(now) != new.all_promised(now)
        || old.judged_from != new.judged_from
}

fn cluster_me_and_peers(obs: &Observation) -> Option<(&str, &[valkey_sidecar_core::quorum::Peer])> {
    let c = obs.cluster.as_ref()?;
    Some((c.my_id.as_deref()?, c.peers.as_deref()?))
}

/// [`ResponderView`] with owned data, replication mode (the record's watch is released first).
enum OwnedView {
    Replication {
        holder: Option<(String, u64)>,
        replica: bool,
    },
    Unknown,
}

impl OwnedView {
    fn as_view(&self) -> ResponderView<'_> {
        match self {
            OwnedView::Replication { holder, replica } => ResponderView::Replication {
                holder: holder.as_ref().map(|(h, e)| (h.as_str(), *e)),
                replica: *replica,
            },
            OwnedView::Unknown => ResponderView::Unknown,
        }
    }
}

/// The MAC keys: the current one, and the one before a rotation (still accepted).
struct Keys {
    current: hmac::Key,
    previous: Option<hmac::Key>,
    secret: Vec<u8>,
}

impl Keys {
    fn load(password: Option<&Password>, cluster: &str) -> Keys {
        let secret = secret(password, cluster);
        Keys {
            current: key_of(&secret),
            previous: None,
            secret,
        }
    }

    fn refresh(&mut self, password: Option<&Password>, cluster: &str) {
        let secret = secret(password, cluster);
        if secret != self.secret {
            tracing::info!("the agent password changed: heartbeats use the new key");
            let old = std::mem::replace(&mut self.current, key_of(&secret));
            self.previous = Some(old);
            self.secret = secret;
        }
    }

    fn seal(&self, text: &str) -> Vec<u8> {
        let tag = hmac::sign(&self.current, text.as_bytes());
        let mut wire = Vec::with_capacity(text.len() + 33);
        wire.extend_from_slice(text.as_bytes());
        wire.push(SEPARATOR);
        wire.extend_from_slice(tag.as_ref());
        wire
    }

    fn open(&self, wire: &[u8]) -> Result<Beat, Drop> {
        let split = wire.len().checked_sub(33).ok_or(Drop::Format)?;
        let (text, rest) = wire.split_at(split);
        let (sep, tag) = rest.split_first().ok_or(Drop::Format)?;
        if *sep != SEPARATOR {
            return Err(Drop::Format);
        }
        let verified = [Some(&self.current), self.previous.as_ref()]
            .into_iter()
            .flatten()
            .any(|k| hmac::verify(k, text, tag).is_ok());
        if !verified {
            return Err(Drop::Mac);
        }
        let text = std::str::from_utf8(text).map_err(|_| Drop::Format)?;
        Beat::decode(text).ok_or(Drop::Format)
    }
}

/// The password the agents share, or (auth off: nothing to protect) the cluster's name.
fn secret(password: Option<&Password>, cluster: &str) -> Vec<u8> {
    let password = match password {
        Some(Password::File(f)) => std::fs::read(f).ok().map(|p| trim_newline(&p).to_vec()),
        Some(Password::Value(v)) => Some(v.0.clone().into_bytes()),
        None => None,
    };
    let mut s = b"valkey-sidecar heartbeat v1\0".to_vec();
    s.extend_from_slice(password.as_deref().unwrap_or(cluster.as_bytes()));
    s
}

fn trim_newline(b: &[u8]) -> &[u8] {
    b.strip_suffix(b"\n").unwrap_or(b)
}

fn key_of(secret: &[u8]) -> hmac::Key {
    let digest = ring::digest::digest(&ring::digest::SHA256, secret);
    hmac::Key::new(hmac::HMAC_SHA256, digest.as_ref())
}

/// Per-source and global token buckets.
struct Limits {
    all: TokenBucket,
    per_source: BTreeMap<IpAddr, TokenBucket>,
}

impl Limits {
    fn new(now: Millis) -> Limits {
        Limits {
            all: TokenBucket::new(ALL_PER_S, 1_000 / u64::from(ALL_PER_S.max(1)), now),
            per_source: BTreeMap::new(),
        }
    }

    fn admit(&mut self, ip: IpAddr, now: Millis) -> Result<(), Drop> {
        if self.per_source.len() >= SOURCES && !self.per_source.contains_key(&ip) {
            self.per_source.clear();
        }
        let refill = 1_000 / u64::from(PER_SOURCE_PER_S.max(1));
        let source = self
            .per_source
            .entry(ip)
            .or_insert_with(|| TokenBucket::new(PER_SOURCE_PER_S, refill, now));
        match source.try_take(now) && self.all.try_take(now) {
            true => Ok(()),
            false => Err(Drop::Rate),
        }
    }
}

/// A random start for the sequence numbers (a pong to an earlier run's ping never counts).
fn random_u64() -> u64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    // Half the range: the sequence never wraps in practice.
    u64::from_le_bytes(b) >> 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::config::Secret;

    #[test]
    fn sealed_beats_open_and_tampering_is_refused() {
        let keys = Keys::load(None, "valkey");
        let beat = Beat::Ping {
            cluster: "valkey".into(),
            from: "a".into(),
            seq: 1,
            epoch: 2,
            wants_promise: false,
        };
        let wire = keys.seal(&beat.encode());
        assert_eq!(keys.open(&wire), Ok(beat));
        let mut bad = wire.clone();
        bad[10] ^= 1;
        assert_eq!(keys.open(&bad), Err(Drop::Mac));
        assert_eq!(keys.open(b"short"), Err(Drop::Format));
        let other = Keys::load(None, "other");
        assert_eq!(other.open(&wire), Err(Drop::Mac), "another key");
    }

    #[test]
    fn a_rotated_key_still_opens_the_old_ones_beats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        std::fs::write(&path, "old\n").unwrap();
        let file = Password::File(path.clone());
        let mut keys = Keys::load(Some(&file), "valkey");
        let old = keys.seal("VSHB1 ping valkey a 1 0 0");
        std::fs::write(&path, "new").unwrap();
        keys.refresh(Some(&file), "valkey");
        assert!(keys.open(&old).is_ok());
        assert!(Keys::load(Some(&file), "valkey").open(&old).is_err());
    }

    #[test]
    fn a_password_from_the_environment_keys_like_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        std::fs::write(&path, "pw\n").unwrap();
        let file = Keys::load(Some(&Password::File(path)), "valkey");
        let env = Keys::load(Some(&Password::Value(Secret("pw".into()))), "valkey");
        let beat = file.seal("VSHB1 ping valkey a 1 0 0");
        assert!(
            env.open(&beat).is_ok(),
            "agents of either form must hear each other"
        );
        let other = Keys::load(Some(&Password::Value(Secret("pw2".into()))), "valkey");
        assert_eq!(other.open(&beat).err(), Some(Drop::Mac));
    }

    #[test]
    fn one_source_is_held_to_its_rate() {
        let mut limits = Limits::new(Millis(0));
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let admitted = (0..200)
            .filter(|_| limits.admit(ip, Millis(0)).is_ok())
            .count();
        assert_eq!(admitted, PER_SOURCE_PER_S as usize);
        assert!(limits.admit("10.0.0.2".parse().unwrap(), Millis(0)).is_ok());
        assert!(
            limits.admit(ip, Millis(1_000)).is_ok(),
            "refilled a second later"
        );
    }

    #[test]
    fn all_sources_together_are_held_to_the_total() {
        let mut limits = Limits::new(Millis(0));
        let ips = (0..1_100u32).map(|n| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n)));
        let admitted = ips
            .filter(|ip| limits.admit(*ip, Millis(0)).is_ok())
            .count();
        assert_eq!(admitted, ALL_PER_S as usize);
        assert!(
            limits.admit("10.9.9.9".parse().unwrap(), Millis(1)).is_ok(),
            "one more a millisecond later"
        );
    }
}
