//! Loopback addresses, free ports and polling.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::Result;

/// `127.0.0.n`. Linux routes all of 127.0.0.0/8 to `lo`, so every "pod" of a test can have its own
/// address without any set-up. Use `n` in `1..=254`.
pub fn loopback_ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
}

/// A TCP port on `ip` that is free right now: the kernel picks one for a listener bound to port 0,
/// which is then released.
///
/// Another process can still take it before the server binds, so [`crate::ValkeyServer::start`]
/// retries with a new port when the server fails to bind. Within this process a port is never
/// handed out twice, so tests running in parallel threads cannot collide.
pub fn free_port(ip: IpAddr) -> Result<u16> {
    for _ in 0..64 {
        let port = TcpListener::bind(SocketAddr::new(ip, 0))
            .and_then(|l| l.local_addr())
            .with_context(|| format!("binding a probe listener on {ip}"))?
            .port();
        if lock(handed_out()).insert((ip, port)) {
            return Ok(port);
        }
    }
    bail!("no fresh free port on {ip} after 64 tries")
}

/// Polls `cond` every `poll` until it returns true (→ `true`) or `timeout` passes (→ `false`).
/// The condition is always evaluated at least once, and once more at the deadline.
pub fn wait_until(timeout: Duration, poll: Duration, mut cond: impl FnMut() -> bool) -> bool {
    wait_for("condition", timeout, poll, || Ok(cond())).is_ok()
}

/// Like [`wait_until`] for fallible checks: an `Err` from `check` counts as "not yet". On timeout the
/// error names `what` and carries the last check error, which is usually the interesting part.
pub fn wait_for(
    what: &str,
    timeout: Duration,
    poll: Duration,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = check();
        if matches!(last, Ok(true)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let detail = match last {
                Err(e) => format!(": last check failed: {e:#}"),
                _ => String::new(),
            };
            bail!("timed out after {timeout:?} waiting for {what}{detail}");
        }
        std::thread::sleep(poll.min(deadline.saturating_duration_since(Instant::now())));
    }
}

fn handed_out() -> &'static Mutex<HashSet<(IpAddr, u16)>> {
    static PORTS: OnceLock<Mutex<HashSet<(IpAddr, u16)>>> = OnceLock::new();
    PORTS.get_or_init(Default::default)
}

/// Locks ignoring poison: a test that panicked while holding a harness lock must not make every
/// later teardown panic too.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Claims one of `count` address blocks of the family `kind` for the rest of this process, so
/// that test processes running side by side (nextest runs every test in a process of its own)
/// never share one: network faults match by address, and two processes on one block would cut
/// each other's clients. The claim is an exclusive `flock` on `/tmp/valkey-testkit-blocks/<kind>-<n>`,
/// which the kernel drops when the process dies, so a killed test leaves nothing stale. The
/// search starts at a pid-derived block; when every block is taken (a process that made more
/// than `count` node sets) it falls back to that block, as before claims existed.
pub fn claim_block(kind: &str, count: u32) -> u32 {
    let start = std::process::id() % count;
    let dir = std::env::temp_dir().join("valkey-testkit-blocks");
    if std::fs::create_dir_all(&dir).is_err() {
        return start;
    }
    (0..count)
        .map(|i| (start + i) % count)
        .find(|&n| try_hold(&dir.join(format!("{kind}-{n}"))))
        .unwrap_or(start)
}

/// Takes the lock on `path` and keeps its file open until the process exits; false when another
/// process (or an earlier claim of this one) holds it.
fn try_hold(path: &std::path::Path) -> bool {
    let Ok(file) = std::fs::File::create(path) else {
        return false;
    };
    if file.try_lock().is_err() {
        return false;
    }
    lock(held()).push(file);
    true
}

fn held() -> &'static Mutex<Vec<std::fs::File>> {
    static HELD: OnceLock<Mutex<Vec<std::fs::File>>> = OnceLock::new();
    HELD.get_or_init(|| Mutex::new(Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimed_blocks_are_never_handed_out_twice_until_all_are_taken() {
        let kind = format!("unit-{}", std::process::id());
        let claims: HashSet<u32> = (0..3).map(|_| claim_block(&kind, 3)).collect();
        assert_eq!(claims, HashSet::from([0, 1, 2]));
        // Every block held: the pid-derived one again, as before claims existed.
        assert_eq!(claim_block(&kind, 3), std::process::id() % 3);
        for n in 0..3 {
            let _ = std::fs::remove_file(
                std::env::temp_dir().join(format!("valkey-testkit-blocks/{kind}-{n}")),
            );
        }
    }
}
