//! A writer that is a real client of one shard: it writes unique keys continuously, records every
//! acknowledged write and the longest pause between two acknowledgements; afterwards every
//! acknowledged key is read back. Used by the hand-over tests and the benchmarks.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};

use super::valkey::cmd;
use crate::Result;
use crate::net::lock;

/// What a writer saw.
#[derive(Debug, Default)]
pub struct Written {
    pub acked: Vec<u64>,
    pub longest_pause: Duration,
    /// Failed attempts (MOVED, READONLY, paused or dead node) before it found the primary again.
    pub errors: usize,
}

/// A running writer; [`Writer::stop`] ends it and returns what it saw.
pub struct Writer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Written>,
    pub tag: String,
}

/// Addresses a writer may use, updated while it runs (pods recreated elsewhere get new IPs).
pub type Targets = Arc<Mutex<Vec<SocketAddr>>>;

impl Writer {
    /// Writes `{tag}:n` = n for n = 0, 1, … to whichever of `addrs` accepts writes.
    pub fn start(addrs: Vec<SocketAddr>, tag: String) -> Writer {
        Writer::follow(Arc::new(Mutex::new(addrs)), tag)
    }

    /// Like [`Writer::start`], over a list the caller keeps current, as a client would follow a
    /// Service's endpoints.
    pub fn follow(targets: Targets, tag: String) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, key) = (stop.clone(), tag.clone());
        let thread = std::thread::spawn(move || write_loop(&targets, &key, &flag));
        Writer { stop, thread, tag }
    }

    pub fn stop(self) -> Result<Written> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow!("the writer thread panicked"))
    }
}

fn connect(addr: SocketAddr) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://{addr}")).ok()?;
    client
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()
}

fn write_loop(targets: &Targets, tag: &str, stop: &AtomicBool) -> Written {
    let mut w = Written::default();
    let (mut target, mut n, mut last_ok) = (0usize, 0u64, Instant::now());
    let mut addrs = lock(targets).clone();
    let mut conns: Vec<Option<redis::Connection>> = addrs.iter().map(|_| None).collect();
    while !stop.load(Ordering::Relaxed) {
        // The caller may have replaced the list (a recreated pod): start over with the new one.
        let current = lock(targets).clone();
        if current != addrs {
            addrs = current;
            conns = addrs.iter().map(|_| None).collect();
            target = 0;
        }
        if addrs.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        if conns[target].is_none() {
            conns[target] = connect(addrs[target]);
        }
        let result: Option<()> = conns[target].as_mut().and_then(|c| {
            redis::cmd("SET")
                .arg(format!("{{{tag}}}:{n}"))
                .arg(n)
                .query(c)
                .ok()
        });
        if result.is_some() {
            w.acked.push(n);
            w.longest_pause = w.longest_pause.max(last_ok.elapsed());
            last_ok = Instant::now();
            n += 1;
        } else {
            // Not (or no longer) the primary, or gone: try the next member.
            w.errors += 1;
            conns[target] = None;
            target = (target + 1) % addrs.len();
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    w
}

/// A hash tag whose slot the shard with `addr` serves.
pub fn tag_for(addr: SocketAddr) -> Result<String> {
    let shards: Vec<Vec<redis::Value>> =
        redis::from_redis_value(cmd(addr, &["CLUSTER", "SHARDS"])?)?;
    let my_id: String = redis::from_redis_value(cmd(addr, &["CLUSTER", "MYID"])?)?;
    let mine = shards
        .iter()
        .find(|s| format!("{s:?}").contains(&my_id))
        .context("this node is in no shard")?;
    let ranges: Vec<i64> = redis::from_redis_value(mine.get(1).context("no slots")?.clone())?;
    for i in 0..100_000 {
        let tag = format!("t{i}");
        let slot: i64 = redis::from_redis_value(cmd(addr, &["CLUSTER", "KEYSLOT", &tag])?)?;
        if ranges
            .chunks(2)
            .any(|r| r.len() == 2 && slot >= r[0] && slot <= r[1])
        {
            return Ok(tag);
        }
    }
    anyhow::bail!("no hash tag maps to this shard's slots")
}

/// How many of `acked` `addr` does not have.
pub fn lost(addr: SocketAddr, tag: &str, acked: &[u64]) -> Result<usize> {
    let mut c = connect(addr).with_context(|| format!("cannot connect to {addr}"))?;
    let mut missing = 0;
    for chunk in acked.chunks(500) {
        let keys: Vec<String> = chunk.iter().map(|n| format!("{{{tag}}}:{n}")).collect();
        let got: Vec<Option<u64>> = redis::cmd("MGET").arg(&keys).query(&mut c)?;
        missing += got
            .iter()
            .zip(chunk)
            .filter(|(g, n)| **g != Some(**n))
            .count();
    }
    Ok(missing)
}
