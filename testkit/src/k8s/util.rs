//! Small async helpers shared by the Kubernetes harness.

use std::future::Future;
use std::io::Read;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Result;

/// Polls `check` every `poll` until it returns `Ok(true)`; an `Err` counts as "not yet" and is
/// quoted if the deadline passes. The async twin of [`crate::wait_for`].
pub async fn poll_until<F, Fut>(
    what: &str,
    timeout: Duration,
    poll: Duration,
    mut check: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = check().await;
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
        tokio::time::sleep(poll.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// A minimal HTTP/1.1 GET (`Connection: close`) with one overall timeout, for probes and hooks:
/// status code and body.
pub async fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String)> {
    tokio::time::timeout(timeout, get(addr, path))
        .await
        .with_context(|| format!("GET http://{addr}{path} timed out after {timeout:?}"))?
}

async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.37\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let raw = String::from_utf8_lossy(&raw);
    let code = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no HTTP status line from {addr}"))?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// `n` random bytes as hex, from the kernel (no `rand` dependency for a handful of tokens).
pub fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("reading /dev/urandom")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether process `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state letter follows the parenthesised command name.
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    !matches!(state.and_then(|s| s.chars().next()), Some('Z' | 'X'))
}
