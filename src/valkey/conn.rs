//! The one connection to the local Valkey, re-established with backoff whenever it breaks.
//!
//! A restart of Valkey, a refused connection or a broken TLS handshake never ends the agent: the
//! session reports the error for this tick and tries again after a delay from `backon`'s
//! exponential schedule (with jitter), so a crash-looping Valkey is not hammered and a restarted
//! one is seen again within one delay.

use std::time::Duration;

use backon::ExponentialBackoff;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisConnectionInfo};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use valkey_sidecar_core::shards::ShardNode;

use super::capped::{Capped, REPLY_CAP};
use super::tls::Tls;
use crate::cli::config::Password;

/// Why a tick got no answer from Valkey.
#[derive(Debug, thiserror::Error)]
pub enum ValkeyError {
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("TLS handshake with {addr}: {source}")]
    Tls {
        addr: String,
        source: std::io::Error,
    },
    #[error("TLS files: {0}")]
    TlsFiles(#[from] super::tls::TlsSetupError),
    #[error("reading password file {path}: {source}")]
    Password {
        path: String,
        source: std::io::Error,
    },
    #[error("connection setup (hello, auth) failed: {0}")]
    Setup(redis::RedisError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("valkey: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("reconnecting in {0:?} after: {1}")]
    Backoff(Duration, String),
}

impl ValkeyError {
    /// A short stable label for the metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ValkeyError::Connect { .. } => "connect",
            ValkeyError::Tls { .. } | ValkeyError::TlsFiles(_) => "tls",
            ValkeyError::Password { .. } => "password_file",
            ValkeyError::Setup(_) => "auth",
            ValkeyError::Timeout(_) => "timeout",
            ValkeyError::Redis(_) => "protocol",
            ValkeyError::Backoff(..) => "backoff",
        }
    }

    /// Nothing listens at the address: on the pod's own loopback that means the process is gone.
    pub fn refused(&self) -> bool {
        matches!(self, ValkeyError::Connect { source, .. }
            if source.kind() == std::io::ErrorKind::ConnectionRefused)
    }

    /// Valkey answered (with an error) — it is alive even though the agent cannot use the answer.
    pub fn valkey_answered(&self) -> bool {
        match self {
            ValkeyError::Setup(e) | ValkeyError::Redis(e) => {
                e.code().is_some() || e.kind() == redis::ErrorKind::AuthenticationFailed
            }
            _ => false,
        }
    }
}

/// How to open a connection.
#[derive(Clone)]
pub struct Connector {
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<Password>,
    pub tls: Option<Tls>,
    pub timeout: Duration,
}

impl Connector {
    /// The same settings for another node of the cluster, by the address its peers know it by.
    pub fn for_node(&self, node: &ShardNode) -> Connector {
        let host = if node.ip.is_empty() {
            node.endpoint.clone()
        } else {
            node.ip.clone()
        };
        Connector {
            host,
            port: node.port,
            ..self.clone()
        }
    }

    /// One command on a fresh connection, all within `limit`; `None` on any failure (callers
    /// asking other nodes treat silence and refusal alike).
    pub async fn ask(&self, cmd: &redis::Cmd, limit: Duration) -> Option<redis::Value> {
        self.ask_or_refused(cmd, limit).await.ok()
    }

    /// [`Connector::ask`], telling a refused connection (nothing listens there) from silence
    /// (slow, frozen, gone or cut off): `Err(true)` refused, `Err(false)` no answer.
    pub async fn ask_or_refused(
        &self,
        cmd: &redis::Cmd,
        limit: Duration,
    ) -> Result<redis::Value, bool> {
        let connector = Connector {
            timeout: limit,
            ..self.clone()
        };
        let ask = async {
            let (mut conn, _driver) = connector.connect().await.map_err(|e| e.refused())?;
            cmd.query_async(&mut conn).await.map_err(|_| false)
        };
        timeout(limit, ask).await.unwrap_or(Err(false))
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Dials, starts TLS if configured, authenticates; the connection's driver runs as a task,
    /// whose end tells that the connection closed.
    pub async fn connect(&self) -> Result<(MultiplexedConnection, JoinHandle<()>), ValkeyError> {
        let addr = self.addr();
        let tcp = timeout(
            self.timeout,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| ValkeyError::Timeout(self.timeout))?
        .map_err(|source| ValkeyError::Connect {
            addr: addr.clone(),
            source,
        })?;
        tcp.set_nodelay(true)
            .map_err(|source| ValkeyError::Connect {
                addr: addr.clone(),
                source,
            })?;
        let info = self.redis_info().await?;
        match &self.tls {
            Some(tls) => {
                let connector = tls.connector()?;
                let stream = timeout(
                    self.timeout,
                    connector.connect(tls.server_name.clone(), tcp),
                )
                .await
                .map_err(|_| ValkeyError::Timeout(self.timeout))?
                .map_err(|source| ValkeyError::Tls { addr, source })?;
                self.handshake(&info, stream).await
            }
            None => self.handshake(&info, tcp).await,
        }
    }

    async fn handshake<S>(
        &self,
        info: &RedisConnectionInfo,
        stream: S,
    ) -> Result<(MultiplexedConnection, JoinHandle<()>), ValkeyError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(self.timeout));
        let stream = Capped::new(stream, REPLY_CAP);
        let setup = MultiplexedConnection::new_with_config(info, stream, config);
        let (conn, driver) = timeout(self.timeout, setup)
            .await
            .map_err(|_| ValkeyError::Timeout(self.timeout))?
            .map_err(ValkeyError::Setup)?;
        Ok((conn, tokio::spawn(driver)))
    }

    /// Credentials are read at every connect so a rotated password file needs no restart; they
    /// are never logged.
    async fn redis_info(&self) -> Result<RedisConnectionInfo, ValkeyError> {
        let mut info = RedisConnectionInfo::default();
        if let Some(user) = &self.username {
            info = info.set_username(user);
        }
        match &self.password {
            Some(Password::File(path)) => {
                let text = tokio::fs::read_to_string(path).await.map_err(|source| {
                    ValkeyError::Password {
                        path: path.display().to_string(),
                        source,
                    }
                })?;
                info = info.set_password(text.trim_end_matches(['\r', '\n']));
            }
            // As given: valkey-operator hashes a Secret's bytes as they are, a final newline too.
            Some(Password::Value(secret)) => info = info.set_password(secret.0.as_str()),
            None => {}
        }
        Ok(info)
    }
}

/// Consecutive timeouts after which a connection is presumed dead rather than Valkey busy.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 3;

/// A connection that heals itself.
pub struct Session {
    connector: Connector,
    conn: Option<MultiplexedConnection>,
    /// The connection's driver task: it ends when the peer closes the socket.
    driver: Option<JoinHandle<()>>,
    backoff: ExponentialBackoff,
    retry_at: Option<(Instant, String)>,
    timeouts: u32,
    /// The TLS files' fingerprint the connection was made with (or last tried), and when they
    /// were last read.
    tls_seen: (Option<u64>, Option<Instant>),
}

/// How often a session with TLS reads its files to see whether they were rotated.
const TLS_CHECK: Duration = Duration::from_secs(1);

/// Reconnects back off from 50 ms to 500 ms: a refused connection costs nothing to retry, and a
/// restarted Valkey must be seen within a poll or two (in replication mode its agent has to
/// release the record before the restarted, empty primary can feed its replicas).
fn backoff() -> ExponentialBackoff {
    crate::runtime::retry::exponential(Duration::from_millis(50), Duration::from_millis(500))
}

impl Session {
    pub fn new(connector: Connector) -> Session {
        Session {
            connector,
            conn: None,
            driver: None,
            backoff: backoff(),
            retry_at: None,
            timeouts: 0,
            tls_seen: (None, None),
        }
    }

    /// Sends a pipeline and returns every reply, error replies included.
    pub async fn query(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<redis::Value>, ValkeyError> {
        let limit = self.connector.timeout;
        let conn = self.connection().await?;
        match timeout(limit, pipe.query_async::<Vec<redis::Value>>(conn)).await {
            Ok(Ok(values)) => {
                self.timeouts = 0;
                Ok(values)
            }
            Ok(Err(e)) if e.is_timeout() => Err(self.timed_out(limit)),
            Ok(Err(e)) => Err(self.broken(e).await),
            Err(_) => Err(self.timed_out(limit)),
        }
    }

    /// A failed query; when it broke a connection that worked, dial again at once (no backoff:
    /// this is no crash loop yet) so the same tick can tell a dead process (refused) from a
    /// dropped connection.
    async fn broken(&mut self, e: redis::RedisError) -> ValkeyError {
        let err = self.failed(e);
        if self.conn.is_some() {
            return err;
        }
        match self.reconnect().await {
            Err(redial) if redial.refused() => redial,
            _ => err,
        }
    }

    /// Resolves when the current connection closes (Valkey exited, or reset it); never while
    /// there is none. The observer ticks at once then, instead of at its next interval.
    pub async fn closed(&mut self) {
        match self.driver.as_mut() {
            Some(driver) => {
                let _ = driver.await;
                self.drop_connection();
            }
            None => std::future::pending().await,
        }
    }

    /// Sends one command (e.g. `CONFIG SET`) on the session's connection.
    pub async fn command(&mut self, cmd: &redis::Cmd) -> Result<redis::Value, ValkeyError> {
        let limit = self.connector.timeout;
        let conn = self.connection().await?;
        match timeout(limit, cmd.query_async::<redis::Value>(conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.failed(e)),
            Err(_) => Err(self.timed_out(limit)),
        }
    }

    /// The live connection, dialling first if there is none and the backoff delay has passed.
    pub async fn connection(&mut self) -> Result<&mut MultiplexedConnection, ValkeyError> {
        if self.conn.is_none() {
            self.reconnect().await?;
        } else if let Some(print) = self.tls_rotated().await {
            self.rotate(print).await;
        }
        self.conn
            .as_mut()
            .ok_or_else(|| ValkeyError::Backoff(Duration::ZERO, "no connection".into()))
    }

    async fn reconnect(&mut self) -> Result<(), ValkeyError> {
        if let Some((at, why)) = &self.retry_at {
            let now = Instant::now();
            if now < *at {
                return Err(ValkeyError::Backoff(*at - now, why.clone()));
            }
        }
        let print = self.tls_print().await;
        match self.connector.connect().await {
            Ok(pair) => {
                self.adopt(pair, print);
                self.retry_at = None;
                self.backoff = backoff();
                Ok(())
            }
            Err(e) => {
                let delay = self.backoff.next().unwrap_or(Duration::from_secs(2));
                self.retry_at = Some((Instant::now() + delay, e.to_string()));
                Err(e)
            }
        }
    }

    fn adopt(
        &mut self,
        (conn, driver): (MultiplexedConnection, JoinHandle<()>),
        print: Option<u64>,
    ) {
        self.conn = Some(conn);
        if let Some(old) = self.driver.replace(driver) {
            old.abort();
        }
        self.tls_seen = (print, Some(Instant::now()));
    }

    async fn tls_print(&self) -> Option<u64> {
        let tls = self.connector.tls.as_ref()?;
        super::tls::fingerprint(&tls.files()).await
    }

    /// The TLS files' new fingerprint, when a second has passed since they were last read and
    /// they changed since. A live TLS connection keeps the certificate it began with for good;
    /// this is what moves the agent onto a rotated one (and off one about to expire or be
    /// distrusted) without waiting for the connection to break.
    async fn tls_rotated(&mut self) -> Option<u64> {
        let (seen, at) = self.tls_seen;
        if self.connector.tls.is_none() || at.is_some_and(|t| t.elapsed() < TLS_CHECK) {
            return None;
        }
        self.tls_seen.1 = Some(Instant::now());
        let print = self.tls_print().await;
        print.filter(|p| seen != Some(*p))
    }

    /// A new connection with the rotated files in place of the live one; if it fails, the live
    /// one is kept (it still works) and the same files are not tried again.
    async fn rotate(&mut self, print: u64) {
        match self.connector.connect().await {
            Ok(pair) => {
                self.adopt(pair, Some(print));
                tracing::info!("tls files changed: connected to valkey with them");
            }
            Err(e) => {
                self.tls_seen.0 = Some(print);
                tracing::warn!(error = %e, "tls files changed but do not connect; keeping the connection made before");
            }
        }
    }

    fn failed(&mut self, e: redis::RedisError) -> ValkeyError {
        if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
            self.drop_connection();
        }
        ValkeyError::Redis(e)
    }

    /// Forgets the connection and its driver (so [`Session::closed`] does not fire for a
    /// connection the session already gave up).
    fn drop_connection(&mut self) {
        self.conn = None;
        if let Some(driver) = self.driver.take() {
            driver.abort();
        }
    }

    /// A blocked Valkey (`DEBUG SLEEP`, a slow script) answers late, so one timeout keeps the
    /// connection; several in a row mean a dead peer, and the next tick dials again.
    fn timed_out(&mut self, limit: Duration) -> ValkeyError {
        self.timeouts += 1;
        if self.timeouts >= TIMEOUTS_BEFORE_RECONNECT {
            self.drop_connection();
            self.timeouts = 0;
        }
        ValkeyError::Timeout(limit)
    }
}
