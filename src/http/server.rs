//! The accept loop: HTTP/1.1, one task per connection, graceful on shutdown.
//!
//! The probe port is reachable from other pods, and the kubelet's probes must keep being answered
//! while something else holds connections open (a liveness probe that times out restarts Valkey).
//! So no client can hold on to the agent for long: each request head must arrive within
//! [`HEADER_TIMEOUT`] (idle keep-alive connections included), a connection lives at most
//! [`MAX_LIFETIME`], a request head is at most [`MAX_HEAD`] bytes, one source address holds at
//! most [`PER_SOURCE`] connections, and [`Connections`] at most its cap. Past either limit the
//! *oldest* connection (of that source, or of all) is closed to make room, never the new one: the
//! kubelet opens a connection per probe and sends its request at once, so the newest connection is
//! the one most likely to be a probe — also when a hostile pod shares the kubelet's address (a
//! `hostNetwork` pod on the node). After each accept the loop yields, so the new connection's task
//! reads and answers its request before a flood waiting in the backlog can push it out. Past the
//! total cap, connections from addresses that sent a whole request within [`ANSWERED_FOR`] (the
//! kubelet's, every probe period) go last: a flood of silent connections from many addresses
//! turns over the others, not the probes'.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hyper::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

use super::App;
use super::routes::MAX_PRESTOP_WAIT;
use crate::runtime::metrics::Metrics;

/// How long open connections get to finish once shutdown starts.
const DRAIN: Duration = Duration::from_secs(2);
/// How long a client may take to send a request head, counted from the connection's start or the
/// previous response (the kubelet sends its whole request at once).
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a connection may live: past the longest `/prestop` wait, so a hook is never cut.
const MAX_LIFETIME: Duration = Duration::from_secs(MAX_PRESTOP_WAIT.as_secs() + 30);
/// hyper's smallest read buffer: request heads beyond it are refused (431).
const MAX_HEAD: usize = 8192;
/// Open connections at most, unless the open-file limit is lower (see [`connection_cap`]).
const MAX_CONNECTIONS: usize = 1024;
/// Open connections at most from one address: the kubelet needs one per probe at a time.
const PER_SOURCE: usize = 32;
/// How long an address that sent a whole request keeps its precedence past the total cap.
const ANSWERED_FOR: Duration = Duration::from_secs(60);
/// Addresses remembered as answered, at most (the kubelet's, a scraper's, a few peers').
const ANSWERED_MAX: usize = 64;
/// How many of the oldest connections are searched for one from a silent address: past the
/// kubelet's own (at most [`PER_SOURCE`]) and a scraper's.
const EVICTION_SCAN: usize = 2 * PER_SOURCE + 1;

/// Serves `app` on `listener` until `shutdown` turns true.
pub async fn serve(listener: TcpListener, app: Arc<App>, mut shutdown: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    let connections = Connections::new(connection_cap(), app.metrics.clone());
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let admitted = connections.admit(peer.ip(), Instant::now());
                    serve_one((stream, peer.ip()), &app, &graceful, &connections, admitted);
                    // The single-threaded runtime runs the new task before the next accept.
                    tokio::task::yield_now().await;
                }
                // Out of file descriptors and the like: pause instead of spinning.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
}

/// Runs one connection in its own task until it ends, is evicted or outlives [`MAX_LIFETIME`].
fn serve_one(
    (stream, source): (TcpStream, IpAddr),
    app: &Arc<App>,
    graceful: &GracefulShutdown,
    connections: &Connections,
    (id, evicted): (u64, oneshot::Receiver<&'static str>),
) {
    let _ = stream.set_nodelay(true);
    let app = app.clone();
    let answering = connections.clone();
    let service = service_fn(move |req: Request<Incoming>| {
        let app = app.clone();
        answering.answered(source, Instant::now());
        async move { Ok::<_, Infallible>(app.respond(req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(stream), service);
    let conn = graceful.watch(conn);
    let connections = connections.clone();
    tokio::spawn(async move {
        // Dropping the connection closes its socket.
        let why = tokio::select! {
            done = conn => if done.is_err_and(|e| e.is_timeout()) { "header_timeout" } else { "done" },
            why = evicted => why.unwrap_or("evicted"),
            _ = tokio::time::sleep(MAX_LIFETIME) => "lifetime",
        };
        connections.close(id, why);
    });
}

/// The open connections, oldest first, each with the means to close it.
#[derive(Clone)]
struct Connections {
    cap: usize,
    open: Arc<Mutex<Open>>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Open {
    next: u64,
    by_age: BTreeMap<u64, (IpAddr, oneshot::Sender<&'static str>)>,
    /// Each source's connections, oldest first (ids grow with age).
    by_source: HashMap<IpAddr, BTreeSet<u64>>,
    /// When each address last sent a whole request.
    answered: HashMap<IpAddr, Instant>,
}

impl Open {
    fn remove(&mut self, id: u64) -> Option<oneshot::Sender<&'static str>> {
        let (source, close) = self.by_age.remove(&id)?;
        if let Some(ids) = self.by_source.get_mut(&source) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_source.remove(&source);
            }
        }
        Some(close)
    }

    /// Closes connection `id`, telling its task `why`.
    fn evict(&mut self, id: u64, why: &'static str) {
        if let Some(close) = self.remove(id) {
            let _ = close.send(why);
        }
    }

    fn is_answered(&self, source: IpAddr, now: Instant) -> bool {
        let at = self.answered.get(&source);
        at.is_some_and(|at| now.saturating_duration_since(*at) < ANSWERED_FOR)
    }

    /// The connection to close past the total cap: the oldest from an address not answered
    /// lately among the [`EVICTION_SCAN`] oldest, else the oldest. Bounded, so addresses that
    /// made themselves answered cannot turn each accept into a walk over every connection.
    fn to_evict(&self, now: Instant) -> Option<u64> {
        let mut ids = self.by_age.iter().take(EVICTION_SCAN);
        let silent = ids.find(|(_, (source, _))| !self.is_answered(*source, now));
        silent
            .or_else(|| self.by_age.iter().next())
            .map(|(id, _)| *id)
    }

    /// The oldest connection of `source` once it holds [`PER_SOURCE`].
    fn oldest_of_full(&self, source: IpAddr) -> Option<u64> {
        let ids = self.by_source.get(&source)?;
        (ids.len() >= PER_SOURCE).then(|| ids.first().copied())?
    }
}

impl Connections {
    fn new(cap: usize, metrics: Arc<Metrics>) -> Connections {
        Connections {
            cap: cap.max(1),
            open: Arc::default(),
            metrics,
        }
    }

    /// Registers a new connection from `source` and returns its id and the signal that closes it
    /// (with why), first closing the oldest of `source` if it holds [`PER_SOURCE`] and the oldest
    /// of all past the cap.
    fn admit(&self, source: IpAddr, now: Instant) -> (u64, oneshot::Receiver<&'static str>) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(oldest) = open.oldest_of_full(source) {
            open.evict(oldest, "per_source");
        }
        while open.by_age.len() >= self.cap {
            let Some(victim) = open.to_evict(now) else {
                break;
            };
            open.evict(victim, "evicted");
        }
        let (tx, rx) = oneshot::channel();
        let id = open.next;
        open.next += 1;
        open.by_age.insert(id, (source, tx));
        open.by_source.entry(source).or_default().insert(id);
        (id, rx)
    }

    /// Remembers that `source` sent a whole request at `now`; a full table takes no new address
    /// until its entries age out, so a flood of requests from many addresses cannot push out the
    /// kubelet's, which it refreshes every probe period.
    fn answered(&self, source: IpAddr, now: Instant) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if !open.answered.contains_key(&source) && open.answered.len() >= ANSWERED_MAX {
            open.answered
                .retain(|_, at| now.saturating_duration_since(*at) < ANSWERED_FOR);
            if open.answered.len() >= ANSWERED_MAX {
                return;
            }
        }
        open.answered.insert(source, now);
    }

    /// Forgets a connection that ended, counting why.
    fn close(&self, id: u64, why: &'static str) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.remove(id);
        drop(open);
        self.metrics.http_connection_closed(why);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_age
            .len()
    }
}

/// [`MAX_CONNECTIONS`], or a quarter of the open-file limit if that is lower: the agent's own
/// connections (Valkey, the apiserver, its peers) must always find a descriptor.
fn connection_cap() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    match soft_open_files(&limits) {
        Some(soft) => MAX_CONNECTIONS.min(soft / 4),
        None => MAX_CONNECTIONS / 4,
    }
}

/// The soft limit of `Max open files` in a `/proc/self/limits` text (`None`: absent, unlimited).
fn soft_open_files(limits: &str) -> Option<usize> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    soft.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_file_limit_is_read_from_proc() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(soft_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_open_files(unlimited), None);
        assert_eq!(soft_open_files(""), None);
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    #[tokio::test]
    async fn past_the_cap_an_address_that_sent_requests_goes_last() {
        let c = Connections::new(2, Arc::new(Metrics::new()));
        c.answered(ip(1), t0());
        let (_, mut kubelet) = c.admit(ip(1), t0());
        let (_, mut silent) = c.admit(ip(2), t0());
        let (_, mut newer) = c.admit(ip(3), t0());
        assert_eq!(
            silent.try_recv(),
            Ok("evicted"),
            "the silent one goes first"
        );
        assert!(
            kubelet.try_recv().is_err(),
            "though older, the answered one stays"
        );
        // Once all that is left answered, the oldest goes; an answer a minute old counts no more.
        c.answered(ip(3), t0());
        let _ = c.admit(ip(4), t0());
        assert_eq!(kubelet.try_recv(), Ok("evicted"));
        let later = t0() + ANSWERED_FOR;
        let _ = c.admit(ip(5), later);
        assert_eq!(newer.try_recv(), Ok("evicted"));
    }

    #[tokio::test]
    async fn the_answered_table_keeps_whom_it_has_when_full() {
        let c = Connections::new(8, Arc::new(Metrics::new()));
        (0..ANSWERED_MAX).for_each(|k| c.answered(IpAddr::from([10, 1, 0, k as u8]), t0()));
        c.answered(ip(1), t0());
        let open = c.open.lock().unwrap();
        assert!(!open.is_answered(ip(1), t0()), "no room for a new address");
        assert!(open.is_answered(IpAddr::from([10, 1, 0, 0]), t0()));
    }

    #[tokio::test]
    async fn past_the_cap_the_oldest_connection_is_closed() {
        let c = Connections::new(2, Arc::new(Metrics::new()));
        let (a, mut a_closed) = c.admit(ip(1), t0());
        let (_, mut b_closed) = c.admit(ip(2), t0());
        assert_eq!(c.len(), 2);
        let (_, mut c_closed) = c.admit(ip(3), t0());
        assert_eq!(c.len(), 2);
        assert_eq!(a_closed.try_recv(), Ok("evicted"), "the oldest is closed");
        assert!(b_closed.try_recv().is_err());
        assert!(c_closed.try_recv().is_err());
        // The evicted connection's task reports its end; nothing else is forgotten.
        c.close(a, "evicted");
        assert_eq!(c.len(), 2);
    }

    #[tokio::test]
    async fn one_source_holds_at_most_its_share_and_its_newest_wins() {
        let c = Connections::new(1000, Arc::new(Metrics::new()));
        let mut mine: Vec<_> = (0..PER_SOURCE).map(|_| c.admit(ip(1), t0())).collect();
        let (_, mut other) = c.admit(ip(2), t0());
        // Past its share: its own oldest goes, not the new one, nor another source's.
        let (_, mut newest) = c.admit(ip(1), t0());
        assert_eq!(mine[0].1.try_recv(), Ok("per_source"));
        assert!(mine[1..].iter_mut().all(|(_, rx)| rx.try_recv().is_err()));
        assert!(other.try_recv().is_err() && newest.try_recv().is_err());
        assert_eq!(c.len(), PER_SOURCE + 1);
        // A closed one frees its place: nothing is evicted for the next.
        c.close(mine[1].0, "done");
        let _ = c.admit(ip(1), t0());
        assert!(mine[2].1.try_recv().is_err());
    }
}
