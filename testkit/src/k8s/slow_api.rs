//! A slow apiserver, as under load: a TCP relay in front of kube-apiserver that holds every byte
//! a client sends for a set delay before passing it on (answers come back at once). TLS passes
//! through untouched, so clients verify the apiserver's own certificate; with the relay on the
//! apiserver's IP its certificate fits. Every request then takes at least the delay, whatever the
//! apiserver's own load: what a loaded control plane does to the agents, without the load.
//!
//! The kubelet starts one when given [`KubeletOptions::api_delay`](super::KubeletOptions) and
//! points the pods' kubeconfigs at it; the test holds the [`ApiDelay`] and turns it up and down.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Result;

/// The delay the relay adds to what clients send; zero at first, shared with the relay.
#[derive(Clone, Debug, Default)]
pub struct ApiDelay(Arc<AtomicU64>);

impl ApiDelay {
    pub fn set(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.0.store(ms, Ordering::Relaxed);
    }

    pub fn get(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::Relaxed))
    }
}

/// A running relay; it stops accepting when dropped (connections end with their clients).
pub struct DelayRelay {
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl DelayRelay {
    /// Listens on `upstream`'s IP, any port, and relays to `upstream` with `delay`.
    pub async fn start(upstream: SocketAddr, delay: ApiDelay) -> Result<DelayRelay> {
        let listener = TcpListener::bind((upstream.ip(), 0)).await?;
        let addr = listener.local_addr()?;
        let accept = tokio::spawn(accept(listener, upstream, delay));
        Ok(DelayRelay { addr, accept })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, delay: ApiDelay) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                tokio::spawn(relay(client, upstream, delay.clone()));
            }
            Err(e) => eprintln!("valkey-testkit slow api: accept: {e}"),
        }
    }
}

/// One connection: client → apiserver held for the delay (in order), apiserver → client at once.
async fn relay(client: TcpStream, upstream: SocketAddr, delay: ApiDelay) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, to_server) = server.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let forward = tokio::spawn(forward(rx, to_server));
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n @ 1..) = from_client.read(&mut buf).await {
        if tx
            .send((Instant::now() + delay.get(), buf[..n].to_vec()))
            .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = forward.await;
    back.abort();
}

/// Writes each chunk to the apiserver once it is due; shuts the write side when the client has.
async fn forward(
    mut rx: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    mut to_server: tokio::net::tcp::OwnedWriteHalf,
) {
    while let Some((due, bytes)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if to_server.write_all(&bytes).await.is_err() {
            return;
        }
    }
    let _ = to_server.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn what_a_client_sends_arrives_after_the_delay_and_answers_come_at_once() {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = server.local_addr().unwrap();
        let echo = tokio::spawn(async move {
            let (mut s, _) = server.accept().await.unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await.unwrap();
            s.write_all(&b).await.unwrap();
        });
        let delay = ApiDelay::default();
        let relay = DelayRelay::start(upstream, delay.clone()).await.unwrap();
        delay.set(Duration::from_millis(300));
        let mut c = TcpStream::connect(relay.addr()).await.unwrap();
        let t = Instant::now();
        c.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).await.unwrap();
        let took = t.elapsed();
        assert_eq!(&b, b"ping");
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        echo.await.unwrap();
    }
}
