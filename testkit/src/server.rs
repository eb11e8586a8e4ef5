//! A single real `valkey-server` on loopback.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use redis::{FromRedisValue, IntoConnectionInfo};

use crate::Result;
use crate::binaries::valkey_server_bin;
use crate::info::info_field;
use crate::net::{free_port, lock};
use crate::process::{ProcessSpec, ServerProcess};

/// Default `cluster-node-timeout` in milliseconds: valkey-operator's 2 s rather than Valkey's 15 s, so
/// failure detection in tests takes seconds.
pub const DEFAULT_CLUSTER_NODE_TIMEOUT_MS: u64 = 2000;

/// How often readiness checks poll.
pub const POLL: Duration = Duration::from_millis(20);

/// How many fresh ports to try when the server loses its port to another process before binding.
const BIND_ATTEMPTS: usize = 5;

/// How long `terminate` waits for a clean exit before SIGKILL.
const TERMINATE_TIMEOUT: Duration = Duration::from_secs(10);

/// Lines of log quoted in start-up errors.
const ERROR_TAIL_LINES: usize = 30;

/// How to start a [`ValkeyServer`]. `Default` is a standalone primary on a free port of 127.0.0.1.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Address to bind (and to source outgoing replication/cluster-bus connections from, so peers see
    /// this address rather than 127.0.0.1). Any 127.0.0.x works on Linux; see [`crate::loopback_ip`].
    pub bind: IpAddr,
    /// `None`: a free port (with retries if another process grabs it first).
    pub port: Option<u16>,
    /// `--cluster-enabled yes` with `nodes.conf` in the server's dir.
    pub cluster: bool,
    /// `--cluster-node-timeout`, used in cluster mode.
    pub cluster_node_timeout_ms: u64,
    /// `--cluster-port` in cluster mode. `None`: a free port (not port+10000, which may be taken or
    /// above 65535).
    pub cluster_bus_port: Option<u16>,
    /// `--replicaof ip port` (standalone only; Valkey rejects it in cluster mode).
    pub replica_of: Option<SocketAddr>,
    /// `--requirepass`; also used as `--masterauth` so replicas of a protected primary can sync, and by
    /// [`ValkeyServer::client`] to authenticate.
    pub requirepass: Option<String>,
    /// ACL user lines as in a config file, e.g. `"sidecar on >pw ~* +@all"` (a leading `user ` is
    /// accepted too). Each becomes `--user sidecar on >pw ~* +@all` with one argv entry per word:
    /// Valkey treats a single argv entry as one (quoted) token, so a whole line would be read as a user
    /// name with spaces in it.
    pub users: Vec<String>,
    /// Extra `--name value...` arguments, appended last so they override the defaults above.
    pub extra_args: Vec<(String, Vec<String>)>,
    /// `--availability-zone`.
    pub availability_zone: Option<String>,
    /// How long `start`/`restart` wait for the server to answer.
    pub startup_timeout: Duration,
    /// Read/write timeout of the connections made by [`ValkeyServer::client`]; a paused server makes
    /// commands fail after this instead of hanging the test.
    pub command_timeout: Duration,
    /// The `valkey-server` to run (an older version, [`crate::valkey_server_for_tag`]); `None`:
    /// [`valkey_server_bin`].
    pub binary: Option<PathBuf>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: None,
            cluster: false,
            cluster_node_timeout_ms: DEFAULT_CLUSTER_NODE_TIMEOUT_MS,
            cluster_bus_port: None,
            replica_of: None,
            requirepass: None,
            users: Vec::new(),
            extra_args: Vec::new(),
            availability_zone: None,
            startup_timeout: Duration::from_secs(10),
            command_timeout: Duration::from_secs(5),
            binary: None,
        }
    }
}

impl ServerOptions {
    /// Runs `binary` instead of the default `valkey-server`.
    pub fn binary(mut self, binary: PathBuf) -> Self {
        self.binary = Some(binary);
        self
    }

    /// Binds (and sources outgoing connections from) `ip`.
    pub fn bind(mut self, ip: IpAddr) -> Self {
        self.bind = ip;
        self
    }

    /// A fixed port instead of a free one.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Cluster mode on or off.
    pub fn cluster(mut self, on: bool) -> Self {
        self.cluster = on;
        self
    }

    /// Starts as a replica of `primary`.
    pub fn replica_of(mut self, primary: SocketAddr) -> Self {
        self.replica_of = Some(primary);
        self
    }

    /// Password of the `default` user (and `masterauth`).
    pub fn requirepass(mut self, password: impl Into<String>) -> Self {
        self.requirepass = Some(password.into());
        self
    }

    /// Adds an ACL user line such as `"sidecar on >pw ~* +@all"`.
    pub fn user(mut self, line: impl Into<String>) -> Self {
        self.users.push(line.into());
        self
    }

    /// Adds `--name value` (name without dashes).
    pub fn arg(self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.args(name, [value.into()])
    }

    /// Adds `--name v1 v2 ...` for multi-value settings such as `save 3600 1`.
    pub fn args(
        mut self,
        name: impl Into<String>,
        values: impl IntoIterator<Item = String>,
    ) -> Self {
        self.extra_args
            .push((name.into(), values.into_iter().collect()));
        self
    }

    /// `--availability-zone zone`.
    pub fn availability_zone(mut self, zone: impl Into<String>) -> Self {
        self.availability_zone = Some(zone.into());
        self
    }
}

/// A running `valkey-server` with its own temp dir (data, `nodes.conf`, `valkey.log`).
///
/// All methods take `&self`, so a server can be shared (e.g. in an `Arc`) between the test and the
/// code under test. Dropping it kills the process (SIGKILL), reaps it and deletes the dir; if the
/// test is panicking, the log tail is printed to stderr first.
pub struct ValkeyServer {
    process: ServerProcess,
    addr: SocketAddr,
    bus_port: Option<u16>,
    password: Option<String>,
    startup_timeout: Duration,
    command_timeout: Duration,
    /// Reused by [`Self::cmd`]/[`Self::query`]; dropped after connection-level errors.
    conn: Mutex<Option<redis::Connection>>,
}

impl std::fmt::Debug for ValkeyServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValkeyServer")
            .field("addr", &self.addr)
            .field("pid", &self.pid())
            .field("dir", &self.dir())
            .finish()
    }
}

/// Why a start attempt failed; `bind_conflict` means "try again on another port".
struct StartFailure {
    bind_conflict: bool,
    error: anyhow::Error,
}

impl ValkeyServer {
    /// Starts a server and waits until it answers `PING` (a `-LOADING` or `-NOAUTH` reply counts: the
    /// process is up and serving). Fails with the log tail if the process exits first.
    pub fn start(opts: ServerOptions) -> Result<Self> {
        if opts.cluster && opts.replica_of.is_some() {
            bail!("replica_of is standalone-only; in cluster mode use CLUSTER REPLICATE");
        }
        let bin = match &opts.binary {
            Some(bin) => bin.clone(),
            None => valkey_server_bin()?,
        };
        let mut last_error = None;
        for _ in 0..BIND_ATTEMPTS {
            match Self::try_start(&bin, &opts) {
                Ok(server) => return Ok(server),
                Err(f) if f.bind_conflict && opts.port.is_none() => last_error = Some(f.error),
                Err(f) => return Err(f.error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow!("no start attempt was made")))
            .context(format!("valkey-server lost its port {BIND_ATTEMPTS} times"))
    }

    fn try_start(bin: &Path, opts: &ServerOptions) -> Result<Self, StartFailure> {
        let fail = |error: anyhow::Error| StartFailure {
            bind_conflict: false,
            error,
        };
        let port = match opts.port {
            Some(p) => p,
            None => free_port(opts.bind).map_err(fail)?,
        };
        let bus_port = match (opts.cluster, opts.cluster_bus_port) {
            (false, _) => None,
            (true, Some(p)) => Some(p),
            (true, None) => Some(free_port(opts.bind).map_err(fail)?),
        };
        let dir = tempfile::Builder::new()
            .prefix("valkey-testkit-")
            .tempdir()
            .context("creating the server's temp dir")
            .map_err(fail)?;
        let log = dir.path().join("valkey.log");
        let addr = SocketAddr::new(opts.bind, port);
        let spec = ProcessSpec {
            program: bin.to_path_buf(),
            args: server_args(opts, port, bus_port, dir.path(), &log),
            label: format!("valkey {addr}"),
        };
        let server = Self {
            process: ServerProcess::spawn(spec, dir, log).map_err(fail)?,
            addr,
            bus_port,
            password: opts.requirepass.clone(),
            startup_timeout: opts.startup_timeout,
            command_timeout: opts.command_timeout,
            conn: Mutex::new(None),
        };
        server.wait_serving()?;
        Ok(server)
    }

    /// Polls until the process answers on its port, or fails if it exits or times out.
    fn wait_serving(&self) -> Result<(), StartFailure> {
        let deadline = Instant::now() + self.startup_timeout;
        loop {
            if let Some(status) = self.process.exit_status() {
                return Err(self.exited_early(status));
            }
            if answers_resp(self.addr) {
                return self.confirm_identity();
            }
            if Instant::now() >= deadline {
                return Err(StartFailure {
                    bind_conflict: false,
                    error: anyhow!(
                        "{} did not answer within {:?}\n{}",
                        self.process.label(),
                        self.startup_timeout,
                        self.process.diagnostics(ERROR_TAIL_LINES)
                    ),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    fn exited_early(&self, status: std::process::ExitStatus) -> StartFailure {
        let log = self.process.log_tail(ERROR_TAIL_LINES);
        StartFailure {
            bind_conflict: log.contains("Address already in use"),
            error: anyhow!(
                "{} exited during start-up ({status})\n{}",
                self.process.label(),
                self.process.diagnostics(ERROR_TAIL_LINES)
            ),
        }
    }

    /// Guards against a race in which another process took our port first: then the answer came
    /// from a stranger, and our own process is about to exit.
    fn confirm_identity(&self) -> Result<(), StartFailure> {
        let Ok(info) = self.info("server") else {
            // Unreachable through the client (e.g. the default user is disabled): trust the probe.
            return Ok(());
        };
        match info_field(&info, "process_id").and_then(|p| p.parse::<u32>().ok()) {
            Some(pid) if pid != self.pid() => Err(StartFailure {
                bind_conflict: true,
                error: anyhow!(
                    "{} is answered by another process (pid {pid})",
                    self.process.label()
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound IP as a string, handy for `REPLICAOF`/`CLUSTER MEET` arguments.
    pub fn host(&self) -> String {
        self.addr.ip().to_string()
    }

    pub fn ip(&self) -> IpAddr {
        self.addr.ip()
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The cluster bus port (`cluster-port`), in cluster mode.
    pub fn bus_port(&self) -> Option<u16> {
        self.bus_port
    }

    /// Pid of the current process (it changes on [`Self::restart`]).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The server's own temp dir (its `--dir`).
    pub fn dir(&self) -> &Path {
        self.process.dir()
    }

    /// The server's logfile.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }

    /// The last `n` lines of the server's log.
    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }

    /// The `requirepass` the server was started with.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// `redis://[:password@]ip:port` (the password is not percent-encoded: keep test passwords plain).
    pub fn url(&self) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{pw}@{}", self.addr),
            None => format!("redis://{}", self.addr),
        }
    }

    /// Connection info with the password set, for building async clients in the code under test.
    pub fn connection_info(&self) -> Result<redis::ConnectionInfo> {
        let mut settings = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(pw) = &self.password {
            settings = settings.set_password(pw);
        }
        Ok(redis::ConnectionAddr::Tcp(self.host(), self.port())
            .into_connection_info()?
            .set_redis_settings(settings))
    }

    /// A new synchronous connection, authenticated as `default` with `requirepass` if set.
    pub fn client(&self) -> Result<redis::Connection> {
        self.connect(self.connection_info()?)
    }

    /// A new synchronous connection authenticated as an ACL user.
    pub fn client_as(&self, user: &str, password: &str) -> Result<redis::Connection> {
        let settings = redis::RedisConnectionInfo::default()
            .set_skip_set_lib_name()
            .set_username(user)
            .set_password(password);
        let info = redis::ConnectionAddr::Tcp(self.host(), self.port())
            .into_connection_info()?
            .set_redis_settings(settings);
        self.connect(info)
    }

    fn connect(&self, info: redis::ConnectionInfo) -> Result<redis::Connection> {
        let conn = redis::Client::open(info)?
            .get_connection_with_timeout(self.command_timeout)
            .with_context(|| format!("connecting to {}", self.addr))?;
        conn.set_read_timeout(Some(self.command_timeout))?;
        conn.set_write_timeout(Some(self.command_timeout))?;
        Ok(conn)
    }

    /// Runs one command, e.g. `server.cmd(&["SET", "k", "v"])`, on a cached connection.
    pub fn cmd(&self, args: &[&str]) -> Result<redis::Value> {
        self.query(args)
    }

    /// Runs one command and converts the reply, e.g. `server.query::<String>(&["CLUSTER", "MYID"])`.
    pub fn query<T: FromRedisValue>(&self, args: &[&str]) -> Result<T> {
        cached_query(&self.conn, || self.client(), args)
            .with_context(|| format!("{} on {}", args.join(" "), self.addr))
    }

    /// `INFO section` as text.
    pub fn info(&self, section: &str) -> Result<String> {
        self.query(&["INFO", section])
    }

    /// One `field:value` of `INFO section`; an error if the field is absent.
    pub fn info_field(&self, section: &str, field: &str) -> Result<String> {
        let info = self.info(section)?;
        info_field(&info, field)
            .map(str::to_owned)
            .with_context(|| format!("no {field} in INFO {section} of {}", self.addr))
    }

    /// `ROLE`, parsed.
    pub fn role(&self) -> Result<redis::Role> {
        self.query(&["ROLE"])
    }

    /// Whether `ROLE` says primary.
    pub fn is_primary(&self) -> Result<bool> {
        Ok(matches!(self.role()?, redis::Role::Primary { .. }))
    }

    /// Whether the process has not exited (a paused process counts as running).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// SIGKILL and reap: a crash. The dir stays, so [`Self::restart`] reloads `nodes.conf`/RDB.
    pub fn kill(&self) -> Result<()> {
        self.forget_connection();
        self.process.kill()
    }

    /// SIGTERM and wait for a clean exit (SIGKILL after 10 s). Resumes a paused server first.
    pub fn terminate(&self) -> Result<()> {
        self.forget_connection();
        self.process.terminate(TERMINATE_TIMEOUT)
    }

    /// SIGSTOP: the process stays, sockets stay open, nothing answers. Simulates a hung node.
    pub fn pause(&self) -> Result<()> {
        self.process.signal("STOP")
    }

    /// SIGCONT after [`Self::pause`].
    pub fn resume(&self) -> Result<()> {
        self.process.signal("CONT")
    }

    /// Stops the server if it still runs (SIGTERM), then starts it again with the same arguments,
    /// address and dir, and waits until it answers `PING` (or `-LOADING`).
    pub fn restart(&self) -> Result<()> {
        self.terminate()?;
        self.process.relaunch()?;
        self.wait_serving().map_err(|f| f.error)
    }

    fn forget_connection(&self) {
        lock(&self.conn).take();
    }
}

/// Runs one command on the connection cached in `cached`, dialling with `connect` when there is
/// none. A server error (WRONGTYPE, LOADING...) leaves the connection usable; anything at the
/// connection level means a fresh one next time.
pub fn cached_query<T: FromRedisValue>(
    cached: &Mutex<Option<redis::Connection>>,
    connect: impl FnOnce() -> Result<redis::Connection>,
    args: &[&str],
) -> Result<T> {
    let (name, rest) = args.split_first().context("empty command")?;
    let mut cmd = redis::cmd(name);
    for arg in rest {
        cmd.arg(*arg);
    }
    let mut cached = lock(cached);
    let mut conn = match cached.take() {
        Some(c) => c,
        None => connect()?,
    };
    let result = cmd.query::<T>(&mut conn);
    if !result.as_ref().is_err_and(connection_broken) {
        *cached = Some(conn);
    }
    Ok(result?)
}

fn connection_broken(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_unrecoverable_error()
}

/// Whether something on `addr` answers a raw inline `PING` with any RESP simple reply. Raw TCP rather
/// than a client: a server that is loading or wants AUTH is up, and says so with `-LOADING`/`-NOAUTH`.
fn answers_resp(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut first = [0u8; 1];
    matches!(stream.read(&mut first), Ok(1) if first[0] == b'+' || first[0] == b'-')
}

/// The full `valkey-server` command line for `opts`.
fn server_args(
    opts: &ServerOptions,
    port: u16,
    bus_port: Option<u16>,
    dir: &Path,
    log: &Path,
) -> Vec<OsString> {
    // A name in `extra_args` replaces the harness's default of that name rather than following
    // it: an older Valkey stops at a value it does not know before it reads the override.
    let mut args = ArgList {
        replaced: opts.extra_args.iter().map(|(n, _)| n.clone()).collect(),
        ..ArgList::default()
    };
    let ip = opts.bind.to_string();
    args.set("port", [port.to_string()]);
    args.set("bind", [ip.clone()]);
    args.set("bind-source-addr", [ip]);
    args.unless_replaced("save", [String::new()]);
    args.unless_replaced("appendonly", ["no".into()]);
    args.unless_replaced("enable-debug-command", ["yes".into()]);
    // The 5 s default delays every initial replica sync by 5 s.
    args.unless_replaced("repl-diskless-sync-delay", ["0".into()]);
    // With the default (`disabled`) a replica saves the RDB to disk in a bio thread and the main
    // thread notices completion only on its 1 Hz replication cron: ~1 s per full sync. Loading from
    // the socket after a flush keeps the `loading:1` semantics of a disk load without that wait.
    // (Valkey 9.0's value: Valkey 8.0 knows `on-empty-db`, given in `extra_args`.)
    args.unless_replaced("repl-diskless-load", ["flush-before-load".into()]);
    args.unless_replaced("daemonize", ["no".into()]);
    args.args.extend(["--dir".into(), dir.into()]);
    args.args.extend(["--logfile".into(), log.into()]);
    if let Some(bus) = bus_port {
        args.set("cluster-enabled", ["yes".into()]);
        args.set("cluster-config-file", ["nodes.conf".into()]);
        args.set(
            "cluster-node-timeout",
            [opts.cluster_node_timeout_ms.to_string()],
        );
        args.set("cluster-port", [bus.to_string()]);
    }
    if let Some(primary) = opts.replica_of {
        args.set(
            "replicaof",
            [primary.ip().to_string(), primary.port().to_string()],
        );
    }
    if let Some(pw) = &opts.requirepass {
        args.set("requirepass", [pw.clone()]);
        args.set("masterauth", [pw.clone()]);
    }
    for line in &opts.users {
        let line = line.trim();
        let line = line.strip_prefix("user ").unwrap_or(line);
        args.set("user", line.split_whitespace().map(str::to_owned));
    }
    if let Some(zone) = &opts.availability_zone {
        args.set("availability-zone", [zone.clone()]);
    }
    for (name, values) in &opts.extra_args {
        args.set(name, values.iter().cloned());
    }
    args.args
}

#[derive(Default)]
struct ArgList {
    args: Vec<OsString>,
    /// The names `extra_args` sets: their defaults are left out.
    replaced: BTreeSet<String>,
}

impl ArgList {
    fn set(&mut self, name: &str, values: impl IntoIterator<Item = String>) {
        self.args.push(format!("--{name}").into());
        self.args.extend(values.into_iter().map(OsString::from));
    }

    /// A harness default, unless `extra_args` sets the name itself.
    fn unless_replaced(&mut self, name: &str, values: impl IntoIterator<Item = String>) {
        if !self.replaced.contains(name) {
            self.set(name, values);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args_of(opts: &ServerOptions) -> Vec<String> {
        server_args(
            opts,
            7000,
            None,
            Path::new("/d"),
            Path::new("/d/valkey.log"),
        )
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
    }

    #[test]
    fn user_lines_become_one_argv_entry_per_word() {
        let args = args_of(&ServerOptions::default().user("user sidecar on >pw ~* +@all"));
        let at = args.iter().position(|a| a == "--user");
        assert_eq!(
            at.map(|i| &args[i + 1..i + 6]),
            Some(&["sidecar", "on", ">pw", "~*", "+@all"].map(String::from)[..])
        );
    }

    #[test]
    fn save_is_disabled_with_an_empty_argument() {
        let args = args_of(&ServerOptions::default());
        let at = args.iter().position(|a| a == "--save");
        assert_eq!(at.map(|i| args[i + 1].as_str()), Some(""));
    }

    #[test]
    fn extra_args_come_last_so_they_override() {
        let args = args_of(&ServerOptions::default().arg("repl-diskless-sync-delay", "5"));
        assert_eq!(
            args[args.len() - 2..],
            ["--repl-diskless-sync-delay".to_string(), "5".to_string()]
        );
    }

    #[test]
    fn an_extra_arg_replaces_the_default_of_its_name() {
        let opts = ServerOptions::default().arg("repl-diskless-load", "on-empty-db");
        let args = args_of(&opts);
        let named = args.iter().filter(|a| *a == "--repl-diskless-load").count();
        assert_eq!(named, 1, "{args:?}");
        assert!(!args.iter().any(|a| a == "flush-before-load"), "{args:?}");
    }
}
