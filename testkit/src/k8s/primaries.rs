//! The two-primaries checker: one thread per node polls `ROLE` and then a `SET` every few
//! milliseconds for the whole run, and afterwards tells how long two nodes accepted writes at once.
//!
//! A node counts as *writable* over the span of consecutive acknowledged probe writes (from the
//! first probe's send to the last one's reply; a gap longer than [`BRIDGE`] splits the span). Two
//! nodes overlap where their spans intersect: both acknowledged a client's write within that window,
//! and a client could have been acknowledged by either — the split brain that loses writes. The
//! measure errs on the side of reporting overlap (a span covers each probe's whole round trip).
//!
//! What the checker can miss is bounded by how densely it probed: [`Seen::density`] gives per node
//! the probes, their rate and the longest gap between two probe sends (a stalled thread, or a
//! connect timing out against an unreachable node), so a report can say how fine its net was.
//!
//! In cluster mode each probe also reads the node's epoch (`cluster_my_epoch`: its own config
//! epoch as a primary, its primary's as a replica), so a client's acknowledgement can be given the
//! epoch its node was in when it answered ([`Seen::epoch_at`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::anyhow;

use crate::Result;
use crate::resp::{ClientOptions, Conn, Reply};

/// Pause between two probes of one node.
const PERIOD: Duration = Duration::from_millis(5);
/// How long one probe may wait: a paused (`CLIENT PAUSE WRITE`) or frozen node blocks the write.
const PROBE_TIMEOUT: Duration = Duration::from_millis(50);
/// Consecutive acknowledged probes this close together form one writable span.
pub const BRIDGE: Duration = Duration::from_millis(60);

/// One probe of one node.
#[derive(Clone, Debug)]
pub struct Probe {
    pub sent: Instant,
    pub answered: Instant,
    /// `ROLE`'s first element (`master`, `slave`), if it answered.
    pub role: Option<String>,
    /// The write was acknowledged.
    pub wrote: bool,
    /// The node's cluster epoch, in cluster mode.
    pub epoch: Option<u64>,
}

/// An interval during which a node (or two at once) accepted writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub from: Instant,
    pub to: Instant,
}

impl Span {
    pub fn len(&self) -> Duration {
        self.to.saturating_duration_since(self.from)
    }

    fn intersect(&self, other: &Span) -> Option<Span> {
        let (from, to) = (self.from.max(other.from), self.to.min(other.to));
        (from < to).then_some(Span { from, to })
    }
}

/// What the checker saw of every node.
#[derive(Debug)]
pub struct Seen {
    pub nodes: Vec<(String, Vec<Probe>)>,
}

impl Seen {
    /// The writable spans of one node.
    pub fn spans(probes: &[Probe]) -> Vec<Span> {
        let mut spans: Vec<Span> = Vec::new();
        for p in probes.iter().filter(|p| p.wrote) {
            match spans.last_mut() {
                Some(s) if p.sent.saturating_duration_since(s.to) <= BRIDGE => s.to = p.answered,
                _ => spans.push(Span {
                    from: p.sent,
                    to: p.answered,
                }),
            }
        }
        spans
    }

    /// Every interval in which two nodes accepted writes at once, with the two nodes.
    pub fn overlaps(&self) -> Vec<(String, String, Span)> {
        let spans: Vec<(&str, Vec<Span>)> = self
            .nodes
            .iter()
            .map(|(n, p)| (n.as_str(), Seen::spans(p)))
            .collect();
        let mut out = Vec::new();
        for (i, (a, sa)) in spans.iter().enumerate() {
            for (b, sb) in &spans[i + 1..] {
                for x in sa {
                    out.extend(
                        sb.iter()
                            .filter_map(|y| x.intersect(y))
                            .map(|s| (a.to_string(), b.to_string(), s)),
                    );
                }
            }
        }
        out
    }

    /// The longest overlap that ends after `after` (counted from `after` if it began before).
    pub fn longest_overlap_after(&self, after: Instant) -> Duration {
        self.overlaps()
            .iter()
            .filter(|(_, _, s)| s.to > after)
            .map(|(_, _, s)| s.to.saturating_duration_since(s.from.max(after)))
            .max()
            .unwrap_or_default()
    }

    /// The longest overlap of the whole run.
    pub fn longest_overlap(&self) -> Duration {
        self.overlaps()
            .iter()
            .map(|(_, _, s)| s.len())
            .max()
            .unwrap_or_default()
    }

    /// How many times a node's role changed (`master` ↔ `slave`), over all nodes.
    pub fn role_changes(&self) -> usize {
        self.nodes
            .iter()
            .map(|(_, probes)| {
                let roles: Vec<&str> = probes.iter().filter_map(|p| p.role.as_deref()).collect();
                roles.windows(2).filter(|w| w[0] != w[1]).count()
            })
            .sum()
    }

    /// The whole run: from the first probe sent to the last one answered, over all nodes.
    pub fn run(&self) -> Option<Span> {
        let probes = || self.nodes.iter().flat_map(|(_, p)| p.iter());
        Some(Span {
            from: probes().map(|p| p.sent).min()?,
            to: probes().map(|p| p.answered).max()?,
        })
    }

    /// How densely each node was probed over the [`Seen::run`].
    pub fn density(&self) -> Vec<Density> {
        let run = self.run().map(|r| r.len()).unwrap_or_default();
        self.nodes
            .iter()
            .map(|(node, probes)| Density::of(node, probes, run))
            .collect()
    }

    /// The longest time between two consecutive probe sends of any one node.
    pub fn longest_probe_gap(&self) -> Duration {
        self.density()
            .iter()
            .map(|d| d.longest_gap)
            .max()
            .unwrap_or_default()
    }

    /// One line for a report: `probes/s per node: a 180, b 179; longest gap 61 ms`.
    pub fn density_summary(&self) -> String {
        let rates: Vec<String> = self
            .density()
            .iter()
            .map(|d| format!("{} {:.0}", d.node, d.per_second))
            .collect();
        format!(
            "probes/s per node: {}; longest gap {} ms",
            if rates.is_empty() {
                "none".to_string()
            } else {
                rates.join(", ")
            },
            self.longest_probe_gap().as_millis()
        )
    }

    /// The epoch `node` last reported at or before `at` (cluster mode; `None` before its first).
    pub fn epoch_at(&self, node: &str, at: Instant) -> Option<u64> {
        let (_, probes) = self.nodes.iter().find(|(n, _)| n == node)?;
        probes
            .iter()
            .filter(|p| p.answered <= at)
            .filter_map(|p| p.epoch)
            .next_back()
    }

    /// The nodes that acknowledged a probe write at `at` ± [`BRIDGE`].
    pub fn writable_at(&self, at: Instant) -> Vec<String> {
        let near = |p: &Probe| p.wrote && p.answered + BRIDGE >= at && p.sent <= at + BRIDGE;
        self.nodes
            .iter()
            .filter(|(_, probes)| probes.iter().any(near))
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// How densely the checker probed one node: a two-primaries window shorter than the longest gap
/// can fall between two probes unseen.
#[derive(Clone, Debug, PartialEq)]
pub struct Density {
    pub node: String,
    pub probes: usize,
    /// Probes per second over the whole run ([`Seen::run`]), so a node whose thread stalled shows
    /// a lower rate than the others.
    pub per_second: f64,
    /// Longest time between two consecutive probe sends (zero with fewer than two probes).
    pub longest_gap: Duration,
}

impl Density {
    fn of(node: &str, probes: &[Probe], run: Duration) -> Density {
        let secs = run.as_secs_f64();
        Density {
            node: node.to_string(),
            probes: probes.len(),
            per_second: if secs > 0.0 {
                probes.len() as f64 / secs
            } else {
                0.0
            },
            longest_gap: probes
                .windows(2)
                .map(|w| w[1].sent.saturating_duration_since(w[0].sent))
                .max()
                .unwrap_or_default(),
        }
    }
}

/// A running checker; [`PrimaryChecker::stop`] ends it.
pub struct PrimaryChecker {
    stop: Arc<AtomicBool>,
    threads: Vec<(String, JoinHandle<Vec<Probe>>)>,
}

impl PrimaryChecker {
    /// Starts polling every `(name, addr)`, without authentication.
    pub fn start(nodes: Vec<(String, SocketAddr)>) -> PrimaryChecker {
        PrimaryChecker::start_with(nodes, &ClientOptions::default())
    }

    /// Like [`PrimaryChecker::start`], connecting as `opts` says (authentication, source address);
    /// `opts.timeout` is replaced by the probe's own 50 ms, since a probe must not hold up the
    /// next one by a client's usual second.
    pub fn start_with(nodes: Vec<(String, SocketAddr)>, opts: &ClientOptions) -> PrimaryChecker {
        let stop = Arc::new(AtomicBool::new(false));
        let opts = ClientOptions {
            timeout: PROBE_TIMEOUT,
            ..opts.clone()
        };
        let threads = nodes
            .into_iter()
            .map(|(name, addr)| {
                let (flag, key) = (stop.clone(), format!("__primary_checker__:{name}"));
                let opts = opts.clone();
                let thread = std::thread::spawn(move || poll(addr, &opts, &key, &flag));
                (name, thread)
            })
            .collect();
        PrimaryChecker { stop, threads }
    }

    pub fn stop(self) -> Result<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        let mut nodes = Vec::new();
        for (name, t) in self.threads {
            let probes = t
                .join()
                .map_err(|_| anyhow!("the checker thread of {name} panicked"))?;
            nodes.push((name, probes));
        }
        Ok(Seen { nodes })
    }
}

fn poll(addr: SocketAddr, opts: &ClientOptions, key: &str, stop: &AtomicBool) -> Vec<Probe> {
    let mut probes = Vec::new();
    let mut conn: Option<Conn> = None;
    let mut n = 0u64;
    // Asked until a node says it has no cluster: a replication-mode node costs one round trip.
    let mut clustered = true;
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        if conn.is_none() {
            conn = Conn::connect(addr, opts).ok();
        }
        let (role, wrote) = match conn.as_mut() {
            Some(c) => probe(c, key, n),
            None => (None, None),
        };
        let epoch = match conn.as_mut() {
            Some(c) if clustered && wrote.is_some() => cluster_epoch(c, &mut clustered),
            _ => None,
        };
        if wrote.is_none() {
            // Timed out or broken: the connection's state is unknown, start a new one.
            conn = None;
        }
        probes.push(Probe {
            sent,
            answered: Instant::now(),
            role,
            wrote: wrote == Some(true),
            epoch,
        });
        n += 1;
        std::thread::sleep(PERIOD);
    }
    probes
}

/// `ROLE`, then `SET key n`: the role (if it answered) and `Some(acknowledged)`, or `None` when
/// the connection failed (timeout, reset) rather than Valkey refusing the write.
fn probe(c: &mut Conn, key: &str, n: u64) -> (Option<String>, Option<bool>) {
    let role = match c.cmd(&["ROLE"]) {
        Ok(reply) => reply
            .into_array()
            .and_then(|items| items.first().and_then(Reply::text)),
        Err(_) => return (None, None),
    };
    match c.cmd(&["SET", key, &n.to_string()]) {
        // READONLY, NOREPLICAS, …: Valkey answered and refused.
        Ok(reply) => (role, Some(!reply.is_error())),
        Err(_) => (role, None),
    }
}

/// `cluster_my_epoch` of `CLUSTER INFO`; clears `clustered` when the node has no cluster.
fn cluster_epoch(c: &mut Conn, clustered: &mut bool) -> Option<u64> {
    let reply = c.cmd(&["CLUSTER", "INFO"]).ok()?;
    if reply.is_error() {
        *clustered = false;
        return None;
    }
    let text = reply.text()?;
    text.lines()
        .find_map(|l| l.strip_prefix("cluster_my_epoch:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{ServerOptions, ValkeyServer};

    fn probe(at: Instant, ms: u64, wrote: bool) -> Probe {
        Probe {
            sent: at + Duration::from_millis(ms),
            answered: at + Duration::from_millis(ms + 1),
            role: Some(if wrote { "master" } else { "slave" }.into()),
            wrote,
            epoch: None,
        }
    }

    #[test]
    fn overlapping_spans_are_measured_and_gaps_split_spans() {
        let t = Instant::now();
        let a: Vec<Probe> = [0, 10, 20, 30, 200, 210]
            .iter()
            .map(|ms| probe(t, *ms, true))
            .collect();
        let spans = Seen::spans(&a);
        assert_eq!(spans.len(), 2, "{spans:?}");
        assert_eq!(spans[0].len(), Duration::from_millis(31));
        let b: Vec<Probe> = [0, 25, 35, 45, 205]
            .iter()
            .map(|ms| probe(t, *ms, *ms >= 25))
            .collect();
        let seen = Seen {
            nodes: vec![("a".into(), a), ("b".into(), b)],
        };
        // a: [0, 31] and [200, 211]; b: [25, 46] and [205, 206].
        assert_eq!(seen.longest_overlap(), Duration::from_millis(6));
        assert_eq!(seen.overlaps().len(), 2);
        let after = t + Duration::from_millis(100);
        assert_eq!(seen.longest_overlap_after(after), Duration::from_millis(1));
        assert_eq!(seen.role_changes(), 1);
    }

    #[test]
    fn density_counts_probes_their_rate_and_the_longest_gap_between_sends() {
        let t = Instant::now();
        let a: Vec<Probe> = (0..20).map(|i| probe(t, i * 5, true)).collect();
        let b: Vec<Probe> = [0, 10, 71, 80]
            .iter()
            .map(|ms| probe(t, *ms, false))
            .collect();
        let seen = Seen {
            nodes: vec![("a".into(), a), ("b".into(), b)],
        };
        // The run: a's first send at 0 ms to its last answer at 96 ms.
        assert_eq!(seen.run().map(|r| r.len()), Some(Duration::from_millis(96)));
        let d = seen.density();
        assert_eq!((d[0].probes, d[1].probes), (20, 4));
        assert!((d[0].per_second - 20.0 / 0.096).abs() < 1e-6, "{d:?}");
        assert!((d[1].per_second - 4.0 / 0.096).abs() < 1e-6, "{d:?}");
        assert_eq!(d[0].longest_gap, Duration::from_millis(5));
        assert_eq!(d[1].longest_gap, Duration::from_millis(61));
        assert_eq!(seen.longest_probe_gap(), Duration::from_millis(61));
        assert_eq!(
            seen.density_summary(),
            "probes/s per node: a 208, b 42; longest gap 61 ms"
        );
    }

    #[test]
    fn density_of_too_few_probes_is_zero_not_a_panic() {
        let empty = Seen { nodes: Vec::new() };
        assert_eq!(empty.run(), None);
        assert_eq!(
            empty.density_summary(),
            "probes/s per node: none; longest gap 0 ms"
        );
        let t = Instant::now();
        let one = Seen {
            nodes: vec![("a".into(), vec![probe(t, 0, true)]), ("b".into(), vec![])],
        };
        let d = one.density();
        assert_eq!((d[0].probes, d[0].longest_gap), (1, Duration::ZERO));
        assert_eq!((d[1].probes, d[1].per_second), (0, 0.0));
        assert_eq!(
            one.density_summary(),
            "probes/s per node: a 1000, b 0; longest gap 0 ms"
        );
    }

    #[test]
    fn probes_a_real_server_with_auth_from_a_source_address() {
        let server = ValkeyServer::start(ServerOptions::default().requirepass("pw")).unwrap();
        let opts = ClientOptions::default()
            .password("pw")
            .source(Ipv4Addr::new(127, 0, 0, 78));
        let nodes = vec![("v".to_string(), server.addr())];
        let checker = PrimaryChecker::start_with(nodes.clone(), &opts);
        let anonymous = PrimaryChecker::start(vec![("anon".to_string(), server.addr())]);
        std::thread::sleep(Duration::from_millis(300));
        let clients: String = server.query(&["CLIENT", "LIST"]).unwrap();
        let (seen, anon) = (checker.stop().unwrap(), anonymous.stop().unwrap());
        assert!(clients.contains("addr=127.0.0.78:"), "{clients}");
        let probes = &seen.nodes[0].1;
        assert!(probes.len() > 10, "{}", seen.density_summary());
        assert!(
            probes
                .iter()
                .all(|p| p.wrote && p.role.as_deref() == Some("master"))
        );
        // Without the password Valkey answers NOAUTH: no role, no write, but probed all along.
        let refused = &anon.nodes[0].1;
        assert!(refused.len() > 10 && refused.iter().all(|p| !p.wrote && p.role.is_none()));
        // Without a cluster there is no epoch.
        assert!(probes.iter().all(|p| p.epoch.is_none()));
        eprintln!("{}", seen.density_summary());
    }

    #[test]
    fn a_cluster_nodes_epoch_is_read_with_each_probe() {
        let cluster = crate::ValkeyCluster::start(1, 1, crate::ClusterOptions::default()).unwrap();
        cluster.wait_healthy(Duration::from_secs(20)).unwrap();
        let primary = cluster.primaries()[0];
        let info: String = primary.query(&["CLUSTER", "INFO"]).unwrap();
        let epoch: u64 = crate::info_field(&info, "cluster_my_epoch")
            .unwrap()
            .parse()
            .unwrap();
        let checker = PrimaryChecker::start(vec![("p".to_string(), primary.addr())]);
        std::thread::sleep(Duration::from_millis(200));
        let seen = checker.stop().unwrap();
        let probes = &seen.nodes[0].1;
        assert!(probes.iter().all(|p| p.epoch == Some(epoch)), "{probes:?}");
        let last = probes.last().unwrap().answered;
        assert_eq!(seen.epoch_at("p", last), Some(epoch));
        assert_eq!(
            seen.epoch_at("p", probes[0].answered - Duration::from_millis(1)),
            None
        );
        assert_eq!(seen.epoch_at("nobody", last), None);
    }

    #[test]
    fn the_epoch_at_a_time_is_the_last_one_reported_before_it() {
        let t = Instant::now();
        let mut probes: Vec<Probe> = (0..4).map(|i| probe(t, i * 10, true)).collect();
        probes[0].epoch = Some(3);
        probes[2].epoch = Some(5);
        let seen = Seen {
            nodes: vec![("a".into(), probes)],
        };
        let at = |ms| t + Duration::from_millis(ms);
        assert_eq!(seen.epoch_at("a", at(0)), None, "before the first answer");
        assert_eq!(seen.epoch_at("a", at(15)), Some(3));
        assert_eq!(seen.epoch_at("a", at(21)), Some(5));
        assert_eq!(
            seen.epoch_at("a", at(99)),
            Some(5),
            "a probe without one keeps the last"
        );
    }

    #[test]
    fn one_writable_node_never_overlaps() {
        let t = Instant::now();
        let a: Vec<Probe> = (0..10).map(|i| probe(t, i * 10, true)).collect();
        let b: Vec<Probe> = (0..10).map(|i| probe(t, i * 10, false)).collect();
        let seen = Seen {
            nodes: vec![("a".into(), a), ("b".into(), b)],
        };
        assert_eq!(seen.longest_overlap(), Duration::ZERO);
        assert_eq!(seen.writable_at(t + Duration::from_millis(50)), vec!["a"]);
    }
}
