//! A writer that is a real client of one shard: it writes unique keys continuously, records every
//! acknowledged write (which node acknowledged it, when it was sent and when the reply came) and
//! the longest pause between two acknowledgements; afterwards every acknowledged key is read back.
//! Used by the hand-over and chaos tests and the benchmarks.
//!
//! Like a real client it has connect, read and write timeouts (1 s by default): a frozen or
//! partitioned node costs one timeout, after which the writer drops that connection (its state is
//! unknown) and tries the next address. A write that timed out is not acknowledged: its outcome is
//! unknown, and it is counted in [`Written::timeouts`]. It can authenticate and bind a source
//! address ([`ClientOptions`]), so a chaos test can put it on one side of a network partition.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use crate::Result;
use crate::net::lock;
use crate::resp::{ClientOptions, Conn, Reply};

/// Pause after a failed attempt, so a writer with no reachable node does not spin.
const RETRY_PAUSE: Duration = Duration::from_millis(1);

/// Keys per `MGET` when reading acknowledged writes back.
const READ_BACK_CHUNK: usize = 500;

/// Timeout of the read-back helpers without options ([`lost`], [`tag_for`]): they run right after a
/// fault, when a node may still be slow, and a spurious failure there costs a whole test run.
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a read-back waits out a cluster that is down for a moment: a test reads right after a
/// fault, and while Valkey elects a new primary for another shard (a node cut with the fault under
/// test) `CLUSTERDOWN` answers every key, those of healthy shards too.
const CLUSTER_DOWN_WAIT: Duration = Duration::from_secs(30);

/// How a writer connects and what it writes.
#[derive(Clone, Debug)]
pub struct WriterOptions {
    /// Authentication, source address and timeouts (1 s by default).
    pub client: ClientOptions,
    /// Keys are `{tag}:n`: the hash tag pins them to one slot, hence one shard.
    pub tag: String,
}

impl WriterOptions {
    /// No authentication, any source address, 1 s timeouts.
    pub fn new(tag: impl Into<String>) -> Self {
        Self {
            client: ClientOptions::default(),
            tag: tag.into(),
        }
    }

    /// With these client options.
    pub fn client(mut self, client: ClientOptions) -> Self {
        self.client = client;
        self
    }
}

/// One acknowledged write: `{tag}:n` = n.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    pub n: u64,
    /// The address that acknowledged it.
    pub node: SocketAddr,
    /// When the `SET` was sent.
    pub sent: Instant,
    /// When its `+OK` was read.
    pub at: Instant,
}

/// What a writer saw.
#[derive(Debug, Default)]
pub struct Written {
    /// Every acknowledged write, in order.
    pub acks: Vec<Ack>,
    /// The acknowledged numbers (those of `acks`), kept for callers that only read them back.
    pub acked: Vec<u64>,
    pub longest_pause: Duration,
    /// Failed attempts (MOVED, READONLY, NOREPLICAS, no connection, timeouts) before it found the
    /// primary again.
    pub errors: usize,
    /// Writes sent whose outcome is unknown: no reply within the timeout, or the connection broke
    /// before the reply. Not acknowledged, and also counted in `errors`.
    pub timeouts: usize,
    /// Connections whose `AUTH` was refused, and writes refused `NOAUTH`: a password the node
    /// did not take. Also counted in `errors`.
    pub auth_failures: usize,
}

impl Written {
    /// Checks a crash's losses: every write in `lost` was acknowledged within `tail` before the
    /// crash at `at` (the stream its replicas had not received yet) — none after it, none earlier
    /// (a resync from an empty restart would have wiped them all) — and the writer made progress
    /// before it. `Err` names what broke that.
    pub fn only_tail_lost(&self, lost: &[u64], at: Instant, tail: Duration) -> Result<()> {
        let outside = self.lost_outside_tail(lost, at, tail);
        if !outside.is_empty() {
            bail!("lost beyond the unreplicated tail of {tail:?}: {outside:?}");
        }
        let before = self.acks.iter().filter(|a| a.at <= at).count();
        if before <= 100 {
            bail!("the writer made little progress before the crash: {before} writes");
        }
        Ok(())
    }

    /// The acknowledgements among `lost` that fall outside the `tail` before a crash at `at`:
    /// acknowledged earlier (a replica had had time to receive them) or after it.
    pub fn lost_outside_tail(&self, lost: &[u64], at: Instant, tail: Duration) -> Vec<&Ack> {
        let lost: std::collections::HashSet<u64> = lost.iter().copied().collect();
        self.acks
            .iter()
            .filter(|a| lost.contains(&a.n))
            .filter(|a| a.at > at || at.duration_since(a.at) > tail)
            .collect()
    }

    /// The acknowledged numbers.
    pub fn acked(&self) -> Vec<u64> {
        self.acks.iter().map(|a| a.n).collect()
    }

    /// The writes `node` acknowledged.
    pub fn acks_by(&self, node: SocketAddr) -> impl Iterator<Item = &Ack> + '_ {
        self.acks.iter().filter(move |a| a.node == node)
    }

    /// When `node` first acknowledged a write.
    pub fn first_ack_by(&self, node: SocketAddr) -> Option<Instant> {
        self.acks_by(node).map(|a| a.at).min()
    }
}

/// A running writer; [`Writer::stop`] ends it and returns what it saw.
pub struct Writer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Written>,
    pub tag: String,
    /// How it connects; replaced by [`Writer::switch_client`].
    client: SharedClient,
}

/// The writer's client options and how many times they were replaced.
type SharedClient = Arc<Mutex<(u64, ClientOptions)>>;

/// Addresses a writer may use, updated while it runs (pods recreated elsewhere get new IPs).
pub type Targets = Arc<Mutex<Vec<SocketAddr>>>;

/// A fixed list of addresses as [`Targets`].
pub fn targets(addrs: Vec<SocketAddr>) -> Targets {
    Arc::new(Mutex::new(addrs))
}

impl Writer {
    /// Writes `{tag}:n` = n for n = 0, 1, … to whichever of `addrs` accepts writes, without
    /// authentication and with 1 s timeouts.
    pub fn start(addrs: Vec<SocketAddr>, tag: String) -> Writer {
        Writer::follow(targets(addrs), tag)
    }

    /// Like [`Writer::start`], over a list the caller keeps current, as a client would follow a
    /// Service's endpoints.
    pub fn follow(targets: Targets, tag: String) -> Writer {
        Writer::start_with(targets, WriterOptions::new(tag))
    }

    /// Like [`Writer::follow`], connecting as `opts.client` says (authentication, source address,
    /// timeouts).
    pub fn start_with(targets: Targets, opts: WriterOptions) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let tag = opts.tag.clone();
        let client = Arc::new(Mutex::new((0, opts.client.clone())));
        let shared = client.clone();
        let thread = std::thread::spawn(move || WriteLoop::new(opts, shared).run(&targets, &flag));
        Writer {
            stop,
            thread,
            tag,
            client,
        }
    }

    /// From now on connect as `client` says (say, with a new password), dropping every open
    /// connection, as an application switching credentials reconnects its pool.
    pub fn switch_client(&self, client: ClientOptions) {
        let mut shared = lock(&self.client);
        *shared = (shared.0 + 1, client);
    }

    /// Ends the writer (within one timeout: an attempt in flight is finished first).
    pub fn stop(self) -> Result<Written> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow!("the writer thread panicked"))
    }
}

/// How one write attempt ended.
enum Attempt {
    Acked(Ack),
    /// The node answered and refused (MOVED, READONLY, NOREPLICAS, NOAUTH, …): the connection is
    /// fine, the node is not the primary (or not yet).
    Refused,
    /// No connection (refused, timed out): nothing was sent.
    Unconnected,
    /// `AUTH` refused, or a write refused `NOAUTH`: nothing was written.
    AuthFailed,
    /// Sent, but no reply: the outcome is unknown, and so is the connection's state.
    Unknown,
}

/// The writer thread's state.
struct WriteLoop {
    opts: WriterOptions,
    /// The options' source, and the generation `opts.client` was taken from.
    client: (SharedClient, u64),
    addrs: Vec<SocketAddr>,
    /// One connection per address, opened on first use and dropped when its state is unknown.
    conns: Vec<Option<Conn>>,
    target: usize,
    n: u64,
    last_ok: Instant,
    w: Written,
}

impl WriteLoop {
    fn new(opts: WriterOptions, client: SharedClient) -> Self {
        Self {
            opts,
            client: (client, 0),
            addrs: Vec::new(),
            conns: Vec::new(),
            target: 0,
            n: 0,
            last_ok: Instant::now(),
            w: Written::default(),
        }
    }

    fn run(mut self, targets: &Targets, stop: &AtomicBool) -> Written {
        while !stop.load(Ordering::Relaxed) {
            self.follow(targets);
            if self.addrs.is_empty() {
                std::thread::sleep(RETRY_PAUSE);
                continue;
            }
            let attempt = self.attempt();
            self.record(attempt);
        }
        self.w
    }

    /// The caller may have replaced the list (a recreated pod): start over with the new one.
    fn follow(&mut self, targets: &Targets) {
        let (generation, client) = lock(&self.client.0).clone();
        let switched = generation != self.client.1;
        if switched {
            self.client.1 = generation;
            self.opts.client = client;
        }
        let current = lock(targets).clone();
        if switched || current != self.addrs {
            self.conns = current.iter().map(|_| None).collect();
            self.addrs = current;
            self.target = 0;
        }
    }

    fn attempt(&mut self) -> Attempt {
        let node = self.addrs[self.target];
        let conn = match &mut self.conns[self.target] {
            Some(c) => c,
            slot => match Conn::connect(node, &self.opts.client) {
                Ok(c) => slot.insert(c),
                Err(crate::resp::RespError::Auth(_)) => return Attempt::AuthFailed,
                Err(_) => return Attempt::Unconnected,
            },
        };
        let (key, value) = (key(&self.opts.tag, self.n), self.n.to_string());
        let sent = Instant::now();
        match conn.cmd(&["SET", &key, &value]) {
            Ok(reply) if reply.is_ok() => Attempt::Acked(Ack {
                n: self.n,
                node,
                sent,
                at: Instant::now(),
            }),
            Ok(reply) if reply.error().is_some_and(|e| e.starts_with("NOAUTH")) => {
                Attempt::AuthFailed
            }
            Ok(_) => Attempt::Refused,
            Err(_) => Attempt::Unknown,
        }
    }

    fn record(&mut self, attempt: Attempt) {
        match attempt {
            Attempt::Acked(ack) => {
                self.w.longest_pause = self
                    .w
                    .longest_pause
                    .max(ack.at.saturating_duration_since(self.last_ok));
                self.last_ok = ack.at;
                self.w.acked.push(ack.n);
                self.w.acks.push(ack);
                self.n += 1;
                return;
            }
            // A refusal leaves the connection usable: keep it for when this node is primary.
            Attempt::Refused => {}
            Attempt::Unknown => {
                self.w.timeouts += 1;
                self.conns[self.target] = None;
            }
            Attempt::Unconnected => self.conns[self.target] = None,
            Attempt::AuthFailed => {
                self.w.auth_failures += 1;
                self.conns[self.target] = None;
            }
        }
        // Not (or no longer) the primary, or unreachable: try the next member, with the same n.
        self.w.errors += 1;
        self.target = (self.target + 1) % self.addrs.len();
        std::thread::sleep(RETRY_PAUSE);
    }
}

fn key(tag: &str, n: u64) -> String {
    format!("{{{tag}}}:{n}")
}

fn read_back_options() -> ClientOptions {
    ClientOptions::default().timeout(READ_BACK_TIMEOUT)
}

fn connect(addr: SocketAddr, opts: &ClientOptions) -> Result<Conn> {
    Conn::connect(addr, opts).with_context(|| format!("cannot connect to {addr}"))
}

/// A hash tag whose slot the shard with `addr` serves.
pub fn tag_for(addr: SocketAddr) -> Result<String> {
    tag_for_with(addr, &read_back_options())
}

/// [`tag_for`], connecting as `opts` says.
pub fn tag_for_with(addr: SocketAddr, opts: &ClientOptions) -> Result<String> {
    tag_named(addr, opts, "t")
}

/// A hash tag `<prefix><n>` whose slot the shard with `addr` serves: several writers on one shard
/// take tags of different prefixes, so their keys never meet.
pub fn tag_named(addr: SocketAddr, opts: &ClientOptions, prefix: &str) -> Result<String> {
    let mut c = connect(addr, opts)?;
    let ranges = own_slots(&mut c)?;
    for i in 0..100_000 {
        let tag = format!("{prefix}{i}");
        let slot = c
            .call(&["CLUSTER", "KEYSLOT", &tag])?
            .int()
            .context("CLUSTER KEYSLOT answered no integer")?;
        if ranges
            .iter()
            .any(|(from, to)| (*from..=*to).contains(&slot))
        {
            return Ok(tag);
        }
    }
    bail!("no hash tag maps to the slots of {addr}")
}

/// The slot ranges of the shard the node behind `c` belongs to, from `CLUSTER SHARDS`.
fn own_slots(c: &mut Conn) -> Result<Vec<(i64, i64)>> {
    let my_id = c
        .call(&["CLUSTER", "MYID"])?
        .text()
        .context("CLUSTER MYID answered no text")?;
    let shards = c
        .call(&["CLUSTER", "SHARDS"])?
        .into_array()
        .context("CLUSTER SHARDS answered no array")?;
    let mine = shards
        .iter()
        .find(|s| has_node(s, &my_id))
        .context("this node is in no shard")?;
    let slots = mine
        .field("slots")
        .and_then(Reply::as_array)
        .context("no slots")?;
    Ok(slots
        .chunks(2)
        .filter_map(|r| Some((r.first()?.int()?, r.get(1)?.int()?)))
        .collect())
}

fn has_node(shard: &Reply, id: &str) -> bool {
    shard
        .field("nodes")
        .and_then(Reply::as_array)
        .is_some_and(|nodes| {
            nodes
                .iter()
                .any(|n| n.field("id").and_then(Reply::text).as_deref() == Some(id))
        })
}

/// How many of `acked` `addr` does not have.
pub fn lost(addr: SocketAddr, tag: &str, acked: &[u64]) -> Result<usize> {
    lost_with(addr, &read_back_options(), tag, acked)
}

/// [`lost`], connecting as `opts` says.
pub fn lost_with(
    addr: SocketAddr,
    opts: &ClientOptions,
    tag: &str,
    acked: &[u64],
) -> Result<usize> {
    Ok(missing(addr, opts, tag, acked)?.len())
}

/// Which of `acked` `addr` does not have (absent, or with another value), in the order given: with
/// [`Written::acks`] a test finds which node acknowledged a lost write, and when.
pub fn missing(
    addr: SocketAddr,
    opts: &ClientOptions,
    tag: &str,
    acked: &[u64],
) -> Result<Vec<u64>> {
    let mut c = connect(addr, opts)?;
    let mut out = Vec::new();
    for chunk in acked.chunks(READ_BACK_CHUNK) {
        let mut args = vec!["MGET".to_string()];
        args.extend(chunk.iter().map(|n| key(tag, *n)));
        let got = call_when_up(&mut c, &args)?
            .into_array()
            .filter(|got| got.len() == chunk.len())
            .with_context(|| format!("MGET on {addr} answered no array of {}", chunk.len()))?;
        out.extend(
            got.iter()
                .zip(chunk)
                .filter(|(g, n)| g.text() != Some(n.to_string()))
                .map(|(_, n)| *n),
        );
    }
    Ok(out)
}

/// `c.call(args)`, retried while the cluster answers `CLUSTERDOWN` (up to [`CLUSTER_DOWN_WAIT`]).
fn call_when_up(c: &mut Conn, args: &[String]) -> Result<Reply> {
    let deadline = Instant::now() + CLUSTER_DOWN_WAIT;
    loop {
        match c.call(args) {
            Err(e) if e.to_string().contains("CLUSTERDOWN") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Acknowledgements by a deposed primary after the new one took its first write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deposed {
    /// When the new primary first acknowledged a write (`None`: it never did).
    pub first_new: Option<Instant>,
    /// Every acknowledgement by another node after `first_new`, in the order they came.
    pub acks: Vec<Ack>,
}

impl Deposed {
    /// How long after the new primary's first write another node still acknowledged one.
    pub fn window(&self) -> Duration {
        match (self.first_new, self.acks.last()) {
            (Some(first), Some(last)) => last.at.saturating_duration_since(first),
            _ => Duration::ZERO,
        }
    }
}

/// Every acknowledgement, across all `written`, by a node other than `new_primary` that came after
/// `new_primary`'s first acknowledgement: writes a deposed primary took while the new one already
/// served, which a failover then loses (the safety figure of a split brain). Comparing replies
/// across writers is sound because they share one clock ([`Instant`]).
pub fn deposed_acks(written: &[&Written], new_primary: SocketAddr) -> Deposed {
    let all = || written.iter().flat_map(|w| w.acks.iter());
    let first_new = all().filter(|a| a.node == new_primary).map(|a| a.at).min();
    let mut acks: Vec<Ack> = match first_new {
        Some(first) => all()
            .filter(|a| a.node != new_primary && a.at > first)
            .copied()
            .collect(),
        None => Vec::new(),
    };
    acks.sort_by_key(|a| a.at);
    Deposed { first_new, acks }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{ServerOptions, ValkeyServer, wait_until};

    fn ack(n: u64, node: SocketAddr, t: Instant, ms: u64) -> Ack {
        Ack {
            n,
            node,
            sent: t + Duration::from_millis(ms),
            at: t + Duration::from_millis(ms + 1),
        }
    }

    fn written(acks: Vec<Ack>) -> Written {
        Written {
            acked: acks.iter().map(|a| a.n).collect(),
            acks,
            ..Written::default()
        }
    }

    fn dbsize(server: &ValkeyServer) -> i64 {
        server.query(&["DBSIZE"]).unwrap_or(0)
    }

    /// Starts a writer on `addrs` and stops it once `server` holds `keys` keys.
    fn write_until(addrs: Vec<SocketAddr>, opts: WriterOptions, server: &ValkeyServer) -> Written {
        let writer = Writer::start_with(targets(addrs), opts);
        let wrote = wait_until(Duration::from_secs(10), Duration::from_millis(10), || {
            dbsize(server) >= 50
        });
        let w = writer.stop().unwrap();
        assert!(wrote, "the writer made no progress: {w:?}");
        w
    }

    #[test]
    fn deposed_acks_are_those_after_the_new_primarys_first() {
        let t = Instant::now();
        let (old, new, other) = (
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.2:1".parse().unwrap(),
            "127.0.0.3:1".parse().unwrap(),
        );
        // Writer 1 moves from old to new at 20 ms; writer 2 still reaches old until 40 ms, and a
        // third node acknowledges once at 35 ms.
        let w1 = written(vec![
            ack(0, old, t, 0),
            ack(1, old, t, 10),
            ack(2, new, t, 20),
        ]);
        let w2 = written(vec![
            ack(0, old, t, 5),
            ack(1, old, t, 30),
            ack(2, other, t, 35),
            ack(3, old, t, 40),
            ack(4, new, t, 50),
        ]);
        let d = deposed_acks(&[&w1, &w2], new);
        assert_eq!(d.first_new, Some(t + Duration::from_millis(21)));
        let late: Vec<(u64, SocketAddr)> = d.acks.iter().map(|a| (a.n, a.node)).collect();
        assert_eq!(late, vec![(1, old), (2, other), (3, old)]);
        assert_eq!(d.window(), Duration::from_millis(20));
        assert_eq!(w2.first_ack_by(new), Some(t + Duration::from_millis(51)));
        assert_eq!(w2.acks_by(old).count(), 3);
        assert_eq!(w2.acked(), w2.acked);

        let never = deposed_acks(&[&w1, &w2], "127.0.0.9:1".parse().unwrap());
        assert_eq!(never, Deposed::default());
    }

    #[test]
    fn a_frozen_server_costs_one_timeout_then_the_writer_moves_on() {
        let a = ValkeyServer::start(ServerOptions::default()).unwrap();
        let b = ValkeyServer::start(ServerOptions::default()).unwrap();
        let writer = Writer::start(vec![a.addr(), b.addr()], "f".into());
        assert!(wait_until(
            Duration::from_secs(10),
            Duration::from_millis(10),
            || dbsize(&a) >= 20
        ));
        a.pause().unwrap();
        let paused = Instant::now();
        std::thread::sleep(Duration::from_secs(3));
        let resumed = Instant::now();
        a.resume().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let w = writer.stop().unwrap();

        assert_eq!(w.timeouts, 1, "the write in flight timed out: {w:?}");
        let moved = w.first_ack_by(b.addr()).unwrap();
        let after = moved.saturating_duration_since(paused);
        eprintln!(
            "froze for 3 s: first write to the second server {after:?} after, longest pause \
             {:?}, {} acks ({} by the first server), {} errors",
            w.longest_pause,
            w.acks.len(),
            w.acks_by(a.addr()).count(),
            w.errors
        );
        assert!(
            after > Duration::from_millis(500) && after < Duration::from_millis(2000),
            "first write to the second server {after:?} after the freeze"
        );
        // A reply already on its way when the signal landed may be read just after it; a write
        // sent during the freeze cannot be acknowledged before the server resumes.
        assert!(
            !w.acks_by(a.addr())
                .any(|x| x.sent >= paused && x.at < resumed),
            "an ack by the frozen server"
        );
        assert!(w.acks_by(b.addr()).all(|x| x.sent > paused));
        assert!(w.longest_pause < Duration::from_millis(2000), "{w:?}");
        let numbers: Vec<u64> = (0..w.acks.len() as u64).collect();
        assert_eq!(w.acked, numbers, "every number acknowledged once, in order");
        assert_eq!(w.acked(), numbers);
    }

    #[test]
    fn authenticates_with_a_password() {
        let server = ValkeyServer::start(ServerOptions::default().requirepass("pw")).unwrap();
        let client = ClientOptions::default().password("pw");
        let opts = WriterOptions::new("p").client(client.clone());
        let w = write_until(vec![server.addr()], opts, &server);
        assert_eq!((w.errors, w.timeouts), (0, 0), "{w:?}");
        assert_eq!(lost_with(server.addr(), &client, "p", &w.acked).unwrap(), 0);
        // Without the password every write is refused (NOAUTH), none acknowledged.
        let writer = Writer::start(vec![server.addr()], "anon".into());
        std::thread::sleep(Duration::from_millis(100));
        let anon = writer.stop().unwrap();
        assert!(anon.acks.is_empty() && anon.errors > 0, "{anon:?}");
        assert_eq!(
            anon.auth_failures, anon.errors,
            "every refusal was NOAUTH: {anon:?}"
        );
    }

    #[test]
    fn a_switched_password_is_used_on_fresh_connections_and_a_refused_one_is_counted() {
        let server =
            ValkeyServer::start(ServerOptions::default().user("app on >old >new ~* +@all"))
                .unwrap();
        let as_app = |pw: &str| ClientOptions::default().user("app", pw);
        let writer = Writer::start_with(
            targets(vec![server.addr()]),
            WriterOptions::new("s").client(as_app("old")),
        );
        let progress = |keys: i64| {
            wait_until(Duration::from_secs(10), Duration::from_millis(10), || {
                dbsize(&server) >= keys
            })
        };
        assert!(progress(20));
        writer.switch_client(as_app("new"));
        // Only `new` is accepted from now on: a writer still on `old` would stop here.
        server
            .query::<String>(&["ACL", "SETUSER", "app", "<old"])
            .unwrap();
        let at = dbsize(&server);
        assert!(progress(at + 20));
        writer.switch_client(as_app("gone"));
        std::thread::sleep(Duration::from_millis(100));
        let w = writer.stop().unwrap();
        assert!(w.auth_failures > 0, "{w:?}");
        assert_eq!(w.timeouts, 0, "{w:?}");
    }

    #[test]
    fn writes_from_the_source_address() {
        let server = ValkeyServer::start(ServerOptions::default()).unwrap();
        let source = Ipv4Addr::new(127, 0, 0, 77);
        let opts = WriterOptions::new("s").client(ClientOptions::default().source(source));
        let writer = Writer::start_with(targets(vec![server.addr()]), opts);
        assert!(wait_until(
            Duration::from_secs(10),
            Duration::from_millis(10),
            || dbsize(&server) >= 20
        ));
        let clients: String = server.query(&["CLIENT", "LIST"]).unwrap();
        let w = writer.stop().unwrap();
        assert!(clients.contains("addr=127.0.0.77:"), "{clients}");
        assert!(!w.acks.is_empty());
        assert!(w.acks.iter().all(|a| a.node == server.addr()));
    }

    #[test]
    fn missing_names_the_acknowledged_writes_a_node_lacks() {
        let server = ValkeyServer::start(ServerOptions::default()).unwrap();
        let w = write_until(vec![server.addr()], WriterOptions::new("m"), &server);
        let gone = [w.acked[3], w.acked[7]];
        for n in gone {
            server.cmd(&["DEL", &key("m", n)]).unwrap();
        }
        let client = ClientOptions::default();
        assert_eq!(
            missing(server.addr(), &client, "m", &w.acked).unwrap(),
            gone
        );
        assert_eq!(lost(server.addr(), "m", &w.acked).unwrap(), 2);
        // A key holding another value is as lost as an absent one.
        server.cmd(&["SET", &key("m", w.acked[1]), "x"]).unwrap();
        assert_eq!(lost(server.addr(), "m", &w.acked).unwrap(), 3);
    }

    #[test]
    fn tag_for_picks_a_tag_of_the_nodes_own_slots() {
        let server = ValkeyServer::start(ServerOptions::default().cluster(true)).unwrap();
        server
            .cmd(&["CLUSTER", "ADDSLOTSRANGE", "5000", "5100"])
            .unwrap();
        let tag = tag_for(server.addr()).unwrap();
        let slot: i64 = server.query(&["CLUSTER", "KEYSLOT", &tag]).unwrap();
        assert!((5000..=5100).contains(&slot), "{tag} → {slot}");
    }
}
