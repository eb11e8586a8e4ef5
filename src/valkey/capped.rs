//! A cap on what a Valkey may send in answer to one request.
//!
//! The agent reads replies from other pods' Valkeys too (the coordinator, formation, the bootstrap
//! check), and the client library buffers a reply whole: a hostile or broken Valkey answering with
//! an endless bulk string would grow the agent until the kernel kills it, and the probes it
//! answers with it. Each write grants [`REPLY_CAP`] bytes of reading; more before the next write
//! ends the connection. A per-tick write and the session's timeout rule (a connection dropped
//! after a few timeouts) bound what one slow, endless reply can pile up to a few caps.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes of replies allowed per request: several times the largest the agent asks for (a tick's
/// `INFO`, `CLUSTER SHARDS` and `CLUSTER NODES` of a thousand shards come to about 1.5 MB). Parsed,
/// a reply of tiny array elements takes about ten times its wire size, so this bounds the worst
/// case near 100 MB.
pub(super) const REPLY_CAP: usize = 8 << 20;

/// `inner` with the read allowance described in the module docs.
pub(super) struct Capped<S> {
    inner: S,
    cap: usize,
    read_since_write: usize,
}

impl<S> Capped<S> {
    pub(super) fn new(inner: S, cap: usize) -> Self {
        Capped {
            inner,
            cap,
            read_since_write: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Capped<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.read_since_write > self.cap {
            return Poll::Ready(Err(io::Error::other(format!(
                "a reply larger than {} MiB: closing the connection",
                self.cap >> 20
            ))));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.read_since_write = self.read_since_write.saturating_add(read);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Capped<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.read_since_write = 0;
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reading_past_the_cap_fails_until_the_next_write() {
        let (client, mut server) = tokio::io::duplex(1 << 16);
        let mut capped = Capped::new(client, 10);
        server.write_all(&[b'x'; 12]).await.unwrap();
        let mut buf = [0u8; 12];
        capped.read_exact(&mut buf).await.unwrap();
        assert!(
            capped.read(&mut buf).await.is_err(),
            "12 bytes read, cap 10"
        );
        capped.write_all(b"PING").await.unwrap();
        server.write_all(b"+PONG\r\n").await.unwrap();
        let mut pong = [0u8; 7];
        capped.read_exact(&mut pong).await.unwrap();
        assert_eq!(&pong, b"+PONG\r\n");
    }
}
