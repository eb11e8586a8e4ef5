//! The two-primaries checker: one thread per node polls `ROLE` and then a `SET` every few
//! milliseconds for the whole run, and afterwards tells how long two nodes accepted writes at once.
//!
//! A node counts as *writable* over the span of consecutive acknowledged probe writes (from the
//! first probe's send to the last one's reply; a gap longer than [`BRIDGE`] splits the span). Two
//! nodes overlap where their spans intersect: both acknowledged a client's write within that window,
//! and a client could have been acknowledged by either — the split brain that loses writes. The
//! measure errs on the side of reporting overlap (a span covers each probe's whole round trip).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::anyhow;

use crate::Result;

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

/// A running checker; [`PrimaryChecker::stop`] ends it.
pub struct PrimaryChecker {
    stop: Arc<AtomicBool>,
    threads: Vec<(String, JoinHandle<Vec<Probe>>)>,
}

impl PrimaryChecker {
    /// Starts polling every `(name, addr)`.
    pub fn start(nodes: Vec<(String, SocketAddr)>) -> PrimaryChecker {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = nodes
            .into_iter()
            .map(|(name, addr)| {
                let (flag, key) = (stop.clone(), format!("__primary_checker__:{name}"));
                (name, std::thread::spawn(move || poll(addr, &key, &flag)))
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

fn connect(addr: SocketAddr) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://{addr}")).ok()?;
    let c = client.get_connection_with_timeout(PROBE_TIMEOUT).ok()?;
    c.set_read_timeout(Some(PROBE_TIMEOUT)).ok()?;
    c.set_write_timeout(Some(PROBE_TIMEOUT)).ok()?;
    Some(c)
}

fn poll(addr: SocketAddr, key: &str, stop: &AtomicBool) -> Vec<Probe> {
    let mut probes = Vec::new();
    let mut conn: Option<redis::Connection> = None;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        if conn.is_none() {
            conn = connect(addr);
        }
        let (role, wrote) = match conn.as_mut() {
            Some(c) => probe(c, key, n),
            None => (None, None),
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
        });
        n += 1;
        std::thread::sleep(PERIOD);
    }
    probes
}

/// `ROLE`, then `SET key n`: the role (if it answered) and `Some(acknowledged)`, or `None` when
/// the connection failed (timeout, reset) rather than Valkey refusing the write.
fn probe(c: &mut redis::Connection, key: &str, n: u64) -> (Option<String>, Option<bool>) {
    let role = match redis::cmd("ROLE").query::<redis::Value>(c) {
        Ok(redis::Value::Array(items)) => items.first().and_then(text),
        Ok(_) => None,
        Err(e) if e.is_io_error() || e.is_timeout() => return (None, None),
        Err(_) => None,
    };
    match redis::cmd("SET").arg(key).arg(n).query::<redis::Value>(c) {
        Ok(_) => (role, Some(true)),
        Err(e) if e.is_io_error() || e.is_timeout() => (role, None),
        // READONLY, NOREPLICAS, …: Valkey answered and refused.
        Err(_) => (role, Some(false)),
    }
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(at: Instant, ms: u64, wrote: bool) -> Probe {
        Probe {
            sent: at + Duration::from_millis(ms),
            answered: at + Duration::from_millis(ms + 1),
            role: Some(if wrote { "master" } else { "slave" }.into()),
            wrote,
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
