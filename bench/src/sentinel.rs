//! Valkey Sentinel, the failover baseline the agent is measured against.
//!
//! [`Sentinels`] runs N sentinel processes (the same `valkey-server` binary with `--sentinel`)
//! monitoring a [`ReplicationSet`]. [`Sentinels::unplanned`] takes the primary down in one of two
//! ways ([`SentinelFault`]) and measures what a client sees, the same way the agent's own failover
//! is measured: fault → some node accepts a write, and how many acknowledged writes of a
//! continuous writer the primary the sentinels finally settle on does not have, counted once the
//! faulted node is back and everything is steady again.
//!
//! - [`SentinelFault::Crash`]: the primary's Valkey is killed and restarted at once, as a kubelet
//!   restarts a crashed container: same port, dir and arguments, and without persistence it comes
//!   back empty. Back within `down-after-milliseconds`, Sentinel may never see it down; it stays
//!   the primary, empty, and its replicas resync from it.
//! - [`SentinelFault::PowerOff`]: the primary's node loses power: the process is frozen (SIGSTOP),
//!   its address silent and clients hang until their timeouts; once the sentinels have settled
//!   it is killed and restarted empty (the node back on).
//!
//! Either way the restarted node takes the role the sentinels name at that moment, as the start
//! scripts of Sentinel deployments do (primary if they still name it, else a replica of the one
//! they name).
//!
//! Two Sentinel behaviours shape the numbers (both seen in its logs, see [`SentinelEvents`]):
//! with `down-after-milliseconds` near 1 s the sentinels sometimes fail over a second time right
//! after the first (losing what the first new primary acknowledged), and a failover attempt that
//! is aborted is retried only after 2 × `failover-timeout` (6 minutes with the defaults).
//!
//! ```no_run
//! use std::time::Duration;
//! use valkey_sidecar_bench::sentinel::{SentinelFault, SentinelOptions, Sentinels};
//! use valkey_sidecar_testkit::{ReplicationSet, ServerOptions};
//!
//! # fn main() -> anyhow::Result<()> {
//! let set = ReplicationSet::start(2, ServerOptions::default())?;
//! let opts = SentinelOptions::default().down_after(Duration::from_millis(1000));
//! let budget = opts.failover_budget();
//! let sentinels = Sentinels::monitor(&set, opts)?; // every sentinel knows the set
//! let run = sentinels.unplanned(&set, SentinelFault::Crash, budget)?; // ready for the next run
//! println!("writable after {:?}, {} writes lost", run.writable_after, run.lost);
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail, ensure};
use redis::{FromRedisValue, IntoConnectionInfo};

use valkey_sidecar_testkit::Result;
use valkey_sidecar_testkit::k8s::netfault::AddrPartition;
use valkey_sidecar_testkit::k8s::writer::{
    Ack, Writer, WriterOptions, Written, deposed_acks, lost, targets,
};
use valkey_sidecar_testkit::process::{ProcessSpec, ServerProcess};
use valkey_sidecar_testkit::{
    POLL, ReplicationSet, ValkeyServer, cached_query, free_port, valkey_server_bin, wait_for,
};

/// The name the sentinels monitor the primary under (`sentinel monitor <name> ...`).
pub const SENTINEL_MASTER_NAME: &str = "valkey";

/// How many fresh ports to try when a sentinel loses its port to another process before binding.
const BIND_ATTEMPTS: usize = 5;

/// Read/write timeout of the connections to the sentinels: they answer from memory.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Lines of log quoted in start-up errors.
const ERROR_TAIL_LINES: usize = 30;

/// How often the surviving nodes are asked to accept a write after the fault: the resolution of
/// the "fault → writable" measurement.
const WRITE_PROBE_INTERVAL: Duration = Duration::from_millis(5);

/// How long the writer runs against the healthy primary before the fault, so that replication is
/// streaming (and possibly behind) at the moment the primary dies.
const WRITER_WARMUP: Duration = Duration::from_millis(500);

/// How long the sentinels must agree on a healthy primary to count as settled. Right after a
/// sentinel switches to a new primary, its link to it may wait up to a second to reconnect
/// (reconnects are throttled to one per second, and the last one went to the dead primary), so with
/// `down-after-milliseconds` near 1 s it can flag the new primary down and, counting the other
/// sentinels' stale "primary down" votes, fail over again: that shows within about a second.
const SETTLE_WINDOW: Duration = Duration::from_secs(3);

/// The key the write probe sets; not one of the writer's, so it never counts as lost.
const PROBE_KEY: &str = "sentinel-baseline-probe";

/// How to start [`Sentinels`]. `Default` is Sentinel's own defaults with 3 sentinels and quorum 2.
#[derive(Clone, Debug)]
pub struct SentinelOptions {
    /// How many sentinel processes.
    pub count: usize,
    /// Sentinels that must agree the primary is down (`sentinel monitor ... <quorum>`).
    pub quorum: usize,
    /// `down-after-milliseconds`: Sentinel's default is 30 s.
    pub down_after: Duration,
    /// `failover-timeout`: Sentinel's default is 180 s. A failover attempt that fails (e.g. a split
    /// vote) is retried only after twice this.
    pub failover_timeout: Duration,
    /// `parallel-syncs`: replicas resynced with the new primary at the same time.
    pub parallel_syncs: u32,
    /// `primary-reboot-down-after-period`: a primary that restarted within this long counts as
    /// down, so a primary restarted empty is failed over. Sentinel's default is 0 (off).
    pub primary_reboot_down_after: Duration,
    /// Address every sentinel binds (and announces to the others)...
    pub bind: IpAddr,
    /// ... unless this names one per sentinel (a sentinel beside each Valkey, on its node's
    /// address, as Sentinel deployments on Kubernetes run them).
    pub binds: Vec<IpAddr>,
    /// How long each sentinel may take to answer `PING` after its start.
    pub startup_timeout: Duration,
    /// How long [`Sentinels::monitor`] waits for every sentinel to know the set.
    pub ready_timeout: Duration,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        Self {
            count: 3,
            quorum: 2,
            down_after: Duration::from_millis(30_000),
            failover_timeout: Duration::from_millis(180_000),
            parallel_syncs: 1,
            primary_reboot_down_after: Duration::ZERO,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            binds: Vec::new(),
            startup_timeout: Duration::from_secs(10),
            ready_timeout: Duration::from_secs(30),
        }
    }
}

impl SentinelOptions {
    /// `count` sentinels with `quorum`.
    pub fn sentinels(mut self, count: usize, quorum: usize) -> Self {
        self.count = count;
        self.quorum = quorum;
        self
    }

    /// `down-after-milliseconds`.
    pub fn down_after(mut self, d: Duration) -> Self {
        self.down_after = d;
        self
    }

    /// `failover-timeout`.
    pub fn failover_timeout(mut self, d: Duration) -> Self {
        self.failover_timeout = d;
        self
    }

    /// `parallel-syncs`.
    pub fn parallel_syncs(mut self, n: u32) -> Self {
        self.parallel_syncs = n;
        self
    }

    /// Sentinel `i` binds `binds[i]`.
    pub fn binds(mut self, binds: Vec<IpAddr>) -> Self {
        self.binds = binds;
        self
    }

    /// Sentinel `i`'s options: its own address when [`Self::binds`] names one.
    fn nth(&self, i: usize) -> SentinelOptions {
        let mut o = self.clone();
        o.bind = self.binds.get(i).copied().unwrap_or(self.bind);
        o
    }

    /// `primary-reboot-down-after-period`.
    pub fn primary_reboot_down_after(mut self, d: Duration) -> Self {
        self.primary_reboot_down_after = d;
        self
    }

    /// A timeout for [`Sentinels::unplanned`] that only a broken failover exceeds: failure
    /// detection, one failed attempt and its retry (2 × `failover-timeout` later), plus slack.
    pub fn failover_budget(&self) -> Duration {
        self.down_after + self.failover_timeout * 2 + Duration::from_secs(30)
    }

    /// The lines of one sentinel's config file. Sentinel rewrites the file (known replicas and
    /// sentinels, epochs), so it lives in the sentinel's own dir.
    fn config(&self, port: u16, dir: &Path, log: &Path, primary: &ValkeyServer) -> String {
        let name = SENTINEL_MASTER_NAME;
        let mut lines = vec![
            format!("port {port}"),
            format!("bind {}", self.bind),
            // Hello messages would otherwise carry the source address the kernel picked for the
            // link to the primary, which is not the bound one when `bind` is not 127.0.0.1.
            format!("sentinel announce-ip {}", self.bind),
            // Its links to the Valkeys and the other sentinels leave from its own address too.
            format!("bind-source-addr {}", self.bind),
            "daemonize no".into(),
            format!("dir \"{}\"", dir.display()),
            format!("logfile \"{}\"", log.display()),
            format!(
                "sentinel monitor {name} {} {} {}",
                primary.host(),
                primary.port(),
                self.quorum
            ),
            format!(
                "sentinel down-after-milliseconds {name} {}",
                self.down_after.as_millis()
            ),
            format!(
                "sentinel failover-timeout {name} {}",
                self.failover_timeout.as_millis()
            ),
            format!("sentinel parallel-syncs {name} {}", self.parallel_syncs),
        ];
        if !self.primary_reboot_down_after.is_zero() {
            lines.push(format!(
                "sentinel primary-reboot-down-after-period {name} {}",
                self.primary_reboot_down_after.as_millis()
            ));
        }
        if let Some(pw) = primary.password() {
            lines.push(format!("sentinel auth-pass {name} {pw}"));
        }
        lines.join("\n") + "\n"
    }
}

/// How the primary goes down in [`Sentinels::unplanned`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SentinelFault {
    /// Its Valkey crashes (SIGKILL) and is restarted at once, as a kubelet restarts a crashed
    /// container: same port, dir and arguments, so empty without persistence.
    Crash,
    /// Its node loses power: frozen (SIGSTOP, the address silent, clients hang until their
    /// timeouts) until the sentinels have settled, then killed and restarted empty.
    PowerOff,
}

/// One unplanned failover as a client saw it.
#[derive(Clone, Debug)]
pub struct UnplannedFailover {
    pub fault: SentinelFault,
    /// The primary that was taken down.
    pub old_primary: SocketAddr,
    /// The node that accepted a write first after the fault: a replica the sentinels promoted, or
    /// (after a crash) the restarted node itself.
    pub new_primary: SocketAddr,
    /// The primary the sentinels settled on; differs from `new_primary` after a second failover.
    pub final_primary: SocketAddr,
    /// The fault → the first `SET` a node accepted (polled every 5 ms).
    pub writable_after: Duration,
    /// The fault → every sentinel monitors the primary it settles on, healthy, with no failover
    /// in progress, from then on.
    pub agreed_after: Duration,
    /// What the sentinels did during the run: a clean failover is one attempt, no abort and one
    /// switch; more switches mean they failed over again before settling.
    pub events: SentinelEvents,
    /// Writes the continuous writer got acknowledged during the run, from any node.
    pub acked: usize,
    /// Acknowledged writes the final primary does not have once the faulted node is back and the
    /// set steady.
    pub lost: usize,
    /// Writes another node acknowledged after the final primary's first acknowledgement: taken by
    /// a primary that was then deposed.
    pub deposed: usize,
}

impl UnplannedFailover {
    /// The node taken down is the primary again at the end: nobody failed over (after a crash it
    /// came back empty and its replicas resynced from it).
    pub fn kept_primary(&self) -> bool {
        self.final_primary == self.old_primary
    }
}

/// Counts of Sentinel events from the sentinels' logs, to tell what Sentinel did in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SentinelEvents {
    /// `+switch-master` (the event clients subscribe to), the most any one sentinel logged: the
    /// failovers completed. The config epoch is no substitute: failed attempts use up epochs too.
    pub switches: usize,
    /// `+try-failover`, summed over the sentinels: failover attempts (each starts an election).
    pub attempts: usize,
    /// `-failover-abort-*`, summed over the sentinels: attempts given up (election not won, no good
    /// replica...). After one, that sentinel waits 2 × `failover-timeout` before trying again.
    pub aborts: usize,
    /// `+reboot`, the most any one sentinel logged: it saw an instance come back with a new run id
    /// (the crashed primary restarted).
    pub reboots: usize,
}

impl SentinelEvents {
    /// The events after `earlier`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            switches: self.switches.saturating_sub(earlier.switches),
            attempts: self.attempts.saturating_sub(earlier.attempts),
            aborts: self.aborts.saturating_sub(earlier.aborts),
            reboots: self.reboots.saturating_sub(earlier.reboots),
        }
    }
}

/// N sentinels monitoring one [`ReplicationSet`] as [`SENTINEL_MASTER_NAME`].
pub struct Sentinels {
    nodes: Vec<Sentinel>,
    opts: SentinelOptions,
}

impl Sentinels {
    /// Starts `opts.count` sentinels monitoring the set's current primary and waits until every
    /// sentinel knows the primary, all its replicas (synced) and every other sentinel: a failover
    /// measured before that would measure discovery.
    pub fn monitor(set: &ReplicationSet, opts: SentinelOptions) -> Result<Self> {
        ensure!(
            opts.count > 0 && (1..=opts.count).contains(&opts.quorum),
            "quorum {} does not fit {} sentinels",
            opts.quorum,
            opts.count
        );
        let bin = valkey_server_bin()?;
        let primary = current_primary(set)?;
        let nodes = (0..opts.count)
            .map(|i| Sentinel::start(&bin, &opts.nth(i), primary))
            .collect::<Result<Vec<_>>>()?;
        let sentinels = Self { nodes, opts };
        sentinels.wait_steady(set, sentinels.opts.ready_timeout)?;
        Ok(sentinels)
    }

    pub fn options(&self) -> &SentinelOptions {
        &self.opts
    }

    /// The sentinels' process ids (the benchmark measures their footprint).
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.process.pid()).collect()
    }

    /// The sentinels' addresses.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|s| s.addr).collect()
    }

    /// Runs one command on sentinel `i`, e.g. `query::<Vec<String>>(0, &["SENTINEL", "MASTER", name])`.
    pub fn query<T: FromRedisValue>(&self, i: usize, args: &[&str]) -> Result<T> {
        self.nodes
            .get(i)
            .with_context(|| format!("there is no sentinel #{i}"))?
            .query(args)
    }

    /// The last `n` lines of sentinel `i`'s log (empty if there is no such sentinel).
    pub fn log_tail(&self, i: usize, n: usize) -> String {
        self.nodes
            .get(i)
            .map(|s| s.process.log_tail(n))
            .unwrap_or_default()
    }

    /// Each sentinel's answer to `SENTINEL get-master-addr-by-name`, in order.
    pub fn primaries(&self) -> Result<Vec<SocketAddr>> {
        self.nodes.iter().map(Sentinel::primary).collect()
    }

    /// The primary every sentinel names; an error listing their views when they disagree.
    pub fn primary(&self) -> Result<SocketAddr> {
        let all = self.primaries()?;
        match all.split_first() {
            Some((first, rest)) if rest.iter().all(|a| a == first) => Ok(*first),
            _ => bail!("the sentinels disagree on the primary: {all:?}"),
        }
    }

    /// Waits until every sentinel names `expected` as the primary.
    pub fn wait_primary(&self, expected: SocketAddr, timeout: Duration) -> Result<()> {
        let what = format!("every sentinel to name {expected} the primary");
        wait_for(&what, timeout, POLL, || {
            Ok(self.primaries()?.iter().all(|a| *a == expected))
        })
    }

    /// Waits until the set is synced (one primary, every running node its replica) and every
    /// sentinel sees it so: the primary healthy with no failover in progress, each running replica
    /// reported (by its own `INFO`) as a replica of it with the link up, and every other sentinel
    /// alive. Returns the primary. Sentinel refreshes a replica's `INFO` only every 10 s while its
    /// link is up, so this can take that long after a topology change.
    pub fn wait_steady(&self, set: &ReplicationSet, timeout: Duration) -> Result<SocketAddr> {
        let deadline = Instant::now() + timeout;
        set.wait_synced(timeout)?;
        let others = self.nodes.len() - 1;
        let mut primary = None;
        let left = deadline.saturating_duration_since(Instant::now());
        wait_for("every sentinel to see the set as it is", left, POLL, || {
            // Asked on every poll: Sentinel may still change the topology while we wait.
            let p = current_primary(set)?.addr();
            let replicas: Vec<SocketAddr> = set
                .nodes()
                .iter()
                .filter(|n| n.is_running() && n.addr() != p)
                .map(ValkeyServer::addr)
                .collect();
            for s in &self.nodes {
                s.check_steady(p, &replicas, others)?;
            }
            primary = Some(p);
            Ok(true)
        })?;
        primary.context("the steady check passed without a primary")
    }

    /// Waits until every sentinel monitors the same primary with no failover in progress and
    /// nothing flagged down, without change for 3 s; returns that primary.
    /// `get-master-addr-by-name` names a promoted replica earlier, while the leader still
    /// reconfigures the other replicas, and with a short `down-after-milliseconds` a sentinel can
    /// fail over again right after switching.
    pub fn wait_settled(&self, timeout: Duration) -> Result<SocketAddr> {
        self.wait_settled_since(timeout).map(|(p, _)| p)
    }

    /// [`Self::wait_settled`], and when the 3 s of agreement began.
    fn wait_settled_since(&self, timeout: Duration) -> Result<(SocketAddr, Instant)> {
        let mut held: Option<(SocketAddr, Instant)> = None;
        wait_for(
            "the sentinels to settle on a primary",
            timeout,
            POLL,
            || {
                let now = match self.switched_primary() {
                    Ok(p) => p,
                    Err(e) => {
                        // Any disagreement or flag in between restarts the window.
                        held = None;
                        return Err(e);
                    }
                };
                let since = match held {
                    Some((p, since)) if p == now => since,
                    _ => Instant::now(),
                };
                held = Some((now, since));
                Ok(since.elapsed() >= SETTLE_WINDOW)
            },
        )?;
        held.context("the sentinels settled without a primary")
    }

    /// The primary every sentinel has switched to (monitored, healthy, no failover in progress);
    /// an error saying who differs otherwise.
    fn switched_primary(&self) -> Result<SocketAddr> {
        let first = self
            .nodes
            .first()
            .context("no sentinels")?
            .healthy_master()?;
        for s in &self.nodes[1..] {
            s.check_master(first)?;
        }
        Ok(first)
    }

    /// The events the sentinels have logged so far.
    pub fn events(&self) -> Result<SentinelEvents> {
        let mut events = SentinelEvents::default();
        for s in &self.nodes {
            let path = s.process.log_path();
            let log = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let text = String::from_utf8_lossy(&log);
            events.switches = events.switches.max(text.matches("+switch-master").count());
            events.attempts += text.matches("+try-failover").count();
            events.aborts += text.matches("-failover-abort").count();
            events.reboots = events.reboots.max(text.matches("+reboot").count());
        }
        Ok(events)
    }

    /// [`Self::unplanned`] with [`SentinelFault::PowerOff`]: the primary is gone until the
    /// sentinels have failed over and settled.
    pub fn unplanned_failover(
        &self,
        set: &ReplicationSet,
        timeout: Duration,
    ) -> Result<UnplannedFailover> {
        self.unplanned(set, SentinelFault::PowerOff, timeout)
    }

    /// Takes the primary down (`fault`) while a writer writes unique keys to whichever node
    /// accepts them; measures until some node accepts a write (after a crash the restarted node
    /// counts too) and until the sentinels have settled (see [`Self::wait_settled`]). A powered-off
    /// primary is brought back then. Once the set is steady again (the restarted node synced, or
    /// its replicas synced from it), stops the writer and counts the acknowledged writes the
    /// final primary lacks. Finally empties the data set (later runs then sync quickly): ready for
    /// the next run. `timeout` bounds each phase; see [`SentinelOptions::failover_budget`]. The
    /// writer does not authenticate: no `requirepass`.
    pub fn unplanned(
        &self,
        set: &ReplicationSet,
        fault: SentinelFault,
        timeout: Duration,
    ) -> Result<UnplannedFailover> {
        let old = self.primary()?;
        let events = self.events()?;
        let victim = set
            .node_by_addr(old)
            .with_context(|| format!("the sentinels' primary {old} is not in the set"))?;
        let others: Vec<&ValkeyServer> = set
            .nodes()
            .iter()
            .filter(|n| n.addr() != old && n.is_running())
            .collect();
        ensure!(!others.is_empty(), "no replica to fail over to");
        // A crashed node is back at once and may take writes itself; a powered-off one cannot.
        let candidates = match fault {
            SentinelFault::Crash => set.nodes().iter().collect(),
            SentinelFault::PowerOff => others.clone(),
        };
        // Connected before the fault, so connecting is not part of the measured time.
        let mut probe = WriteProbe::connect(&candidates);
        let writer = RunningWriter::start(old, &others);
        std::thread::sleep(WRITER_WARMUP);

        let at = Instant::now();
        self.take_down(victim, fault)?;
        let (new_primary, writable_at) = probe.wait_writable(at + timeout)?;
        // A node restarted while the sentinels still move would race the failover itself.
        let (settled, agreed_at) = self.wait_settled_since(timeout)?;
        if fault == SentinelFault::PowerOff {
            victim.kill()?;
            self.restart_as_named(victim)?;
        }
        let read = self.read_back(set, writer, settled, timeout)?;
        Ok(UnplannedFailover {
            fault,
            old_primary: old,
            new_primary,
            final_primary: read.primary,
            writable_after: writable_at.duration_since(at),
            agreed_after: agreed_at.saturating_duration_since(at),
            events: self.events()?.since(events),
            acked: read.acked,
            lost: read.lost,
            deposed: read.deposed,
        })
    }

    /// The fault itself: a crash is a SIGKILL and the restart at once; a power-off freezes the
    /// process, so its address goes silent.
    fn take_down(&self, victim: &ValkeyServer, fault: SentinelFault) -> Result<()> {
        match fault {
            SentinelFault::Crash => {
                victim.kill()?;
                self.restart_as_named(victim)
            }
            SentinelFault::PowerOff => victim.pause(),
        }
    }

    /// Waits until the set is steady, then stops the writer and reads every acknowledged key
    /// back from the primary: only then, because an empty node feeding its replicas costs writes
    /// only once it is back and they have synced. Empties the data set afterwards.
    fn read_back(
        &self,
        set: &ReplicationSet,
        writer: RunningWriter,
        settled: SocketAddr,
        timeout: Duration,
    ) -> Result<ReadBack> {
        let primary = self.wait_steady(set, timeout)?;
        if primary != settled {
            eprintln!("sentinel: settled on {settled}, steady under {primary}: read back from it");
        }
        let (tag, written) = writer.stop()?;
        let read = ReadBack {
            primary,
            acked: written.acked.len(),
            lost: lost(primary, &tag, &written.acked)?,
            deposed: deposed_acks(&[&written], primary).acks.len(),
        };
        empty(set, primary)?;
        Ok(read)
    }

    /// Starts a stopped `node` again as a container restarts: same port, dir and arguments, so
    /// empty without persistence. Then gives it the role the sentinels name, as the start script
    /// of a Sentinel deployment does: primary if they still name it, else a replica of the one
    /// they name (its arguments may name a primary of long ago).
    fn restart_as_named(&self, node: &ValkeyServer) -> Result<()> {
        node.restart()?;
        let named = self.nodes.first().context("no sentinels")?.primary()?;
        let (host, port) = match named == node.addr() {
            true => ("NO".to_string(), "ONE".to_string()),
            false => (named.ip().to_string(), named.port().to_string()),
        };
        // A restarted node may still be loading (it answers `LOADING` until it is done): ask again.
        wait_for(
            "the restarted node to accept REPLICAOF",
            Duration::from_secs(30),
            Duration::from_millis(20),
            // An error counts as "not yet"; the last one is in the timeout's message.
            || node.cmd(&["REPLICAOF", &host, &port]).map(|_| true),
        )
    }
}

/// One partition of the primary's node as the clients on both sides saw it
/// ([`Sentinels::partitioned`]).
#[derive(Clone, Debug)]
pub struct Partitioned {
    pub old_primary: SocketAddr,
    /// The cut → the first write a node on the majority side accepted.
    pub writable_after: Duration,
    /// The cut → the old primary's last acknowledgement to the client on its side; zero when it
    /// acknowledged nothing after the cut.
    pub last_ack: Duration,
    /// Writes the old primary acknowledged to its side's client after the cut.
    pub side_after: usize,
    /// Writes both clients got acknowledged during the run.
    pub acked: usize,
    /// Acknowledged writes the final primary lacks once the partition healed and the set is
    /// steady.
    pub lost: usize,
    /// Writes another node acknowledged after the final primary's first acknowledgement.
    pub deposed: usize,
}

impl Partitioned {
    /// A run's figures from its two writers: `main` on the majority side, `side` writing to `old`
    /// only from the cut side; the cut at `at`, `lost` counted on `final_primary`.
    pub fn measured(
        old: SocketAddr,
        (at, writable_after): (Instant, Duration),
        (main, side): (&Written, &Written),
        lost: usize,
        final_primary: SocketAddr,
    ) -> Partitioned {
        let after_cut: Vec<&Ack> = side
            .acks
            .iter()
            .filter(|a| a.node == old && a.at > at)
            .collect();
        let last = after_cut.iter().map(|a| a.at.duration_since(at)).max();
        Partitioned {
            old_primary: old,
            writable_after,
            last_ack: last.unwrap_or_default(),
            side_after: after_cut.len(),
            acked: main.acked.len() + side.acked.len(),
            lost,
            deposed: deposed_acks(&[main, side], final_primary).acks.len(),
        }
    }
}

impl Sentinels {
    /// Partitions the primary's node: its Valkey, the sentinel beside it (sentinel `k` stands
    /// beside node `k` of the set: start the sentinels with [`SentinelOptions::binds`]) and a
    /// client bound to `client_ip` that keeps writing to the old primary, cut from everything
    /// else while a writer on the majority side writes to whichever node accepts. The cut holds
    /// until `hold` after it, and at least 2 s past the first write the majority side accepted;
    /// then it heals, the set settles (the old primary rejoins as a replica) and the writes are
    /// read back from the final primary. Empties the data set afterwards.
    pub fn partitioned(
        &self,
        set: &ReplicationSet,
        client_ip: Ipv4Addr,
        hold: Duration,
        timeout: Duration,
    ) -> Result<Partitioned> {
        let old = self.primary()?;
        let k = set
            .nodes()
            .iter()
            .position(|n| n.addr() == old)
            .with_context(|| format!("the sentinels' primary {old} is not in the set"))?;
        let others: Vec<&ValkeyServer> = set.nodes().iter().filter(|n| n.addr() != old).collect();
        let mut probe = WriteProbe::connect(&others);
        let main = RunningWriter::start(old, &others);
        let side = side_writer(old, client_ip);
        std::thread::sleep(WRITER_WARMUP);
        let beside = self
            .nodes
            .get(k)
            .context("no sentinel beside the primary")?;
        let inside = [v4(old)?, v4(beside.addr)?, client_ip];
        let cut = AddrPartition::cut(&inside)?;
        let at = Instant::now();
        let (_, writable_at) = probe.wait_writable(at + timeout)?;
        let until = (at + hold).max(writable_at + Duration::from_secs(2));
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        drop(cut);
        let primary = self.wait_steady(set, timeout)?;
        let (tag, main) = main.stop()?;
        let (side_tag, side) = side.stop()?;
        let lost = lost(primary, &tag, &main.acked)? + lost(primary, &side_tag, &side.acked)?;
        let run = Partitioned::measured(
            old,
            (at, writable_at.duration_since(at)),
            (&main, &side),
            lost,
            primary,
        );
        empty(set, primary)?;
        Ok(run)
    }
}

/// The IPv4 address of `addr` (the loopback partition is IPv4 only).
pub fn v4(addr: SocketAddr) -> Result<Ipv4Addr> {
    match addr.ip() {
        IpAddr::V4(ip) => Ok(ip),
        IpAddr::V6(_) => bail!("{addr} is not IPv4"),
    }
}

/// A client on the primary's side of a partition: bound to `client_ip`, writing to `primary`
/// only.
fn side_writer(primary: SocketAddr, client_ip: Ipv4Addr) -> RunningWriter {
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let mut opts = WriterOptions::new(format!("sentinel-side-{}-{run}", std::process::id()));
    opts.client.source = Some(client_ip);
    RunningWriter(Some(Writer::start_with(targets(vec![primary]), opts)))
}

/// What [`Sentinels::read_back`] found.
struct ReadBack {
    primary: SocketAddr,
    acked: usize,
    lost: usize,
    deposed: usize,
}

/// Empties the data set through `primary` (later runs then sync quickly).
fn empty(set: &ReplicationSet, primary: SocketAddr) -> Result<()> {
    let node = set
        .node_by_addr(primary)
        .with_context(|| format!("the primary {primary} is not in the set"))?;
    // Sentinel promotes with `CLIENT KILL TYPE normal`, so a cached connection to the new
    // primary is dead: the first attempt drops it, the second connects afresh.
    node.cmd(&["FLUSHALL"])
        .or_else(|_| node.cmd(&["FLUSHALL"]))
        .map(|_| ())
}

/// The one running node of the set that says it is primary.
fn current_primary(set: &ReplicationSet) -> Result<&ValkeyServer> {
    let mut primaries = Vec::new();
    for node in set.nodes().iter().filter(|n| n.is_running()) {
        if node.is_primary()? {
            primaries.push(node);
        }
    }
    match primaries[..] {
        [one] => Ok(one),
        _ => bail!(
            "expected one primary in the set, found {:?}",
            primaries.iter().map(|n| n.addr()).collect::<Vec<_>>()
        ),
    }
}

/// Run tags, so keys of different runs never collide.
static RUNS: AtomicUsize = AtomicUsize::new(0);

/// The continuous writer of a run; stopped on drop too, so an error mid-run leaves no thread
/// writing forever.
struct RunningWriter(Option<Writer>);

impl RunningWriter {
    /// Starts with the primary, moving on to the next node whenever a write fails.
    fn start(primary: SocketAddr, others: &[&ValkeyServer]) -> Self {
        let mut addrs = vec![primary];
        addrs.extend(others.iter().map(|n| n.addr()));
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("sentinel-{}-{run}", std::process::id());
        Self(Some(Writer::start(addrs, tag)))
    }

    /// Stops the writer; its key tag and what it saw.
    fn stop(mut self) -> Result<(String, Written)> {
        let writer = self.0.take().context("the writer was already stopped")?;
        let tag = writer.tag.clone();
        Ok((tag, writer.stop()?))
    }
}

impl Drop for RunningWriter {
    fn drop(&mut self) {
        if let Some(writer) = self.0.take() {
            let _ = writer.stop();
        }
    }
}

/// `SET`s against every surviving node until one accepts, like a client looking for the primary.
struct WriteProbe<'a> {
    nodes: Vec<(&'a ValkeyServer, Option<redis::Connection>)>,
}

impl<'a> WriteProbe<'a> {
    fn connect(nodes: &[&'a ValkeyServer]) -> Self {
        Self {
            nodes: nodes.iter().map(|n| (*n, n.client().ok())).collect(),
        }
    }

    /// The first node that accepts a write and when it did; `READONLY` (or any error) is "not yet".
    fn wait_writable(&mut self, deadline: Instant) -> Result<(SocketAddr, Instant)> {
        loop {
            for (node, conn) in &mut self.nodes {
                if accepts_write(node, conn) {
                    return Ok((node.addr(), Instant::now()));
                }
            }
            if Instant::now() >= deadline {
                bail!("no surviving node accepted a write before the deadline");
            }
            std::thread::sleep(WRITE_PROBE_INTERVAL);
        }
    }
}

fn accepts_write(node: &ValkeyServer, conn: &mut Option<redis::Connection>) -> bool {
    if conn.is_none() {
        *conn = node.client().ok();
    }
    let Some(c) = conn.as_mut() else {
        return false;
    };
    match redis::cmd("SET").arg(PROBE_KEY).arg(1).query::<()>(c) {
        Ok(()) => true,
        Err(e) => {
            // READONLY leaves the connection usable; a broken one is replaced on the next poll.
            if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                *conn = None;
            }
            false
        }
    }
}

/// One sentinel process.
struct Sentinel {
    process: ServerProcess,
    addr: SocketAddr,
    conn: Mutex<Option<redis::Connection>>,
}

impl Sentinel {
    /// Starts a sentinel on a free port, retrying with a new port when another process took it.
    fn start(bin: &Path, opts: &SentinelOptions, primary: &ValkeyServer) -> Result<Self> {
        let mut last = anyhow!("no attempt to start a sentinel");
        for _ in 0..BIND_ATTEMPTS {
            match Self::try_start(bin, opts, primary) {
                Ok(s) => return Ok(s),
                // The server logs the bind failure; the diagnostics quote the log.
                Err(e) if format!("{e:#}").contains("Address already in use") => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last.context(format!("no free port after {BIND_ATTEMPTS} attempts")))
    }

    fn try_start(bin: &Path, opts: &SentinelOptions, primary: &ValkeyServer) -> Result<Self> {
        let port = free_port(opts.bind)?;
        let dir = tempfile::Builder::new()
            .prefix("valkey-sentinel-")
            .tempdir()
            .context("creating the sentinel's temp dir")?;
        let log = dir.path().join("sentinel.log");
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(&conf, opts.config(port, dir.path(), &log, primary))
            .with_context(|| format!("writing {}", conf.display()))?;
        let addr = SocketAddr::new(opts.bind, port);
        let spec = ProcessSpec {
            program: PathBuf::from(bin),
            args: vec![conf.into(), "--sentinel".into()],
            label: format!("sentinel {addr}"),
        };
        let sentinel = Self {
            process: ServerProcess::spawn(spec, dir, log)?,
            addr,
            conn: Mutex::new(None),
        };
        sentinel.wait_serving(opts.startup_timeout)?;
        Ok(sentinel)
    }

    /// Polls until the process answers as itself (not a stranger on its port), or fails if it exits
    /// or times out.
    fn wait_serving(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.exit_status() {
                bail!(
                    "{} exited during start-up ({status})\n{}",
                    self.process.label(),
                    self.process.diagnostics(ERROR_TAIL_LINES)
                );
            }
            if let Ok(info) = self.query::<String>(&["INFO", "server"]) {
                let pid = valkey_sidecar_testkit::info_field(&info, "process_id");
                ensure!(
                    pid == Some(self.process.pid().to_string().as_str()),
                    "{} is answered by another process (pid {pid:?})",
                    self.process.label()
                );
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not answer within {timeout:?}\n{}",
                    self.process.label(),
                    self.process.diagnostics(ERROR_TAIL_LINES)
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Runs one command on a cached connection (replaced after connection-level errors).
    fn query<T: FromRedisValue>(&self, args: &[&str]) -> Result<T> {
        cached_query(&self.conn, || self.connect(), args)
            .with_context(|| format!("{} on {}", args.join(" "), self.process.label()))
    }

    fn connect(&self) -> Result<redis::Connection> {
        let settings = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
        let info = redis::ConnectionAddr::Tcp(self.addr.ip().to_string(), self.addr.port())
            .into_connection_info()?
            .set_redis_settings(settings);
        let conn = redis::Client::open(info)?
            .get_connection_with_timeout(COMMAND_TIMEOUT)
            .with_context(|| format!("connecting to {}", self.process.label()))?;
        conn.set_read_timeout(Some(COMMAND_TIMEOUT))?;
        conn.set_write_timeout(Some(COMMAND_TIMEOUT))?;
        Ok(conn)
    }

    /// `SENTINEL get-master-addr-by-name`.
    fn primary(&self) -> Result<SocketAddr> {
        let reply: Option<(String, u16)> =
            self.query(&["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER_NAME])?;
        let (ip, port) = reply.with_context(|| {
            format!(
                "{} does not monitor {SENTINEL_MASTER_NAME}",
                self.process.label()
            )
        })?;
        Ok(SocketAddr::new(ip.parse().context("primary ip")?, port))
    }

    /// `SENTINEL <what> <name>` as one field map per entry (`REPLICAS`, `SENTINELS`).
    fn table(&self, what: &str) -> Result<Vec<Fields>> {
        let rows: Vec<Vec<String>> = self.query(&["SENTINEL", what, SENTINEL_MASTER_NAME])?;
        Ok(rows.into_iter().map(Fields::from_flat).collect())
    }

    /// `SENTINEL MASTER <name>`.
    fn master(&self) -> Result<Fields> {
        let flat = self.query(&["SENTINEL", "MASTER", SENTINEL_MASTER_NAME])?;
        Ok(Fields::from_flat(flat))
    }

    /// The primary this sentinel monitors, if it is healthy with no failover in progress (the
    /// flags are exactly `master`: no `s_down`, `o_down`, `failover_in_progress`...).
    fn healthy_master(&self) -> Result<SocketAddr> {
        let master = self.master()?;
        let monitored = master.addr("ip", "port")?;
        let flags = master.get("flags");
        ensure!(
            flags == "master",
            "{} flags the primary {monitored} {flags}",
            self.process.label()
        );
        Ok(monitored)
    }

    /// Ok when this sentinel monitors `primary`, healthy and with no failover in progress.
    fn check_master(&self, primary: SocketAddr) -> Result<()> {
        let monitored = self.healthy_master()?;
        ensure!(
            monitored == primary,
            "{} monitors {monitored}, not {primary}",
            self.process.label()
        );
        Ok(())
    }

    /// Ok when this sentinel sees `primary` healthy with no failover in progress, every one of
    /// `replicas` as its synced replica, and `others` live sentinels; else an error saying what
    /// differs (the last one is quoted when the wait times out).
    fn check_steady(
        &self,
        primary: SocketAddr,
        replicas: &[SocketAddr],
        others: usize,
    ) -> Result<()> {
        let me = self.process.label();
        self.check_master(primary)?;
        let seen = self.table("REPLICAS")?;
        for r in replicas {
            let entry = seen
                .iter()
                .find(|f| f.addr("ip", "port").ok() == Some(*r))
                .with_context(|| format!("{me} does not know replica {r}"))?;
            let state = [
                entry.get("flags"),
                entry.get("role-reported"),
                entry.get("master-link-status"),
            ];
            ensure!(
                state == ["slave", "slave", "ok"]
                    && entry.addr("master-host", "master-port")? == primary,
                "{me} sees replica {r} as {state:?} of {}:{}",
                entry.get("master-host"),
                entry.get("master-port")
            );
        }
        let live = self
            .table("SENTINELS")?
            .iter()
            // `master_down` (this sentinel once voted the primary down) sticks after a failover.
            .filter(|f| f.healthy())
            .count();
        ensure!(
            live == others,
            "{me} sees {live} of {others} other sentinels"
        );
        Ok(())
    }
}

/// One `SENTINEL MASTER|REPLICAS|SENTINELS` entry: a flat `field, value, ...` list in RESP2.
struct Fields(HashMap<String, String>);

impl Fields {
    fn from_flat(flat: Vec<String>) -> Self {
        let pairs = flat
            .chunks_exact(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()));
        Self(pairs.collect())
    }

    /// A field's value, empty when absent.
    fn get(&self, key: &str) -> &str {
        self.0.get(key).map_or("", String::as_str)
    }

    /// Neither down (subjectively or objectively) nor disconnected, whatever else `flags` says.
    fn healthy(&self) -> bool {
        let unhealthy = ["s_down", "o_down", "disconnected"];
        !self.get("flags").split(',').any(|f| unhealthy.contains(&f))
    }

    fn addr(&self, ip: &str, port: &str) -> Result<SocketAddr> {
        let ip: IpAddr = self
            .get(ip)
            .parse()
            .with_context(|| format!("field {ip}"))?;
        let port: u16 = self
            .get(port)
            .parse()
            .with_context(|| format!("field {port}"))?;
        Ok(SocketAddr::new(ip, port))
    }
}
