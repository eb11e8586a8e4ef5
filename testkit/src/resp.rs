//! A minimal blocking RESP2 client for the harness's test clients (the writer, the two-primaries
//! checker): what a real application's client does and no more.
//!
//! Why not the `redis` crate: its synchronous connection cannot bind a source address before
//! connecting, and chaos tests need one (nftables rules let a given source IP through a partition,
//! or exempt an observer from every fault). Owning the socket also lets a timeout be told apart
//! from a refusal exactly: a timed-out command's outcome is unknown, a refused one's is not.
//!
//! Every socket operation is bounded by [`ClientOptions::timeout`] (connect, read, write), so a
//! frozen or partitioned server costs one timeout instead of hanging the test. After
//! [`RespError::Timeout`] or [`RespError::Io`] the connection's state is unknown (a reply may still
//! be on its way); drop it and connect again, as a real client would.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::tls_client::{TlsClient, TlsStream};

/// The timeout real clients commonly use, and the default here.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest bulk string accepted (Valkey's own `proto-max-bulk-len` default): a garbled length
/// must not make the client try to allocate gigabytes.
const MAX_BULK: usize = 512 * 1024 * 1024;

/// Deepest array nesting accepted: bounds the parser's recursion on a garbled stream.
const MAX_DEPTH: usize = 32;

/// How a [`Conn`] connects and authenticates.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// `AUTH user password` when set, else `AUTH password` (the `default` user). Ignored without
    /// a password: there is nothing to authenticate with.
    pub user: Option<String>,
    /// Sends `AUTH` right after connecting when set.
    pub password: Option<String>,
    /// Binds this source address before connecting (any port), so the server and any packet
    /// filter on the way see it.
    pub source: Option<Ipv4Addr>,
    /// Bounds the connect and every read and write. Must not be zero.
    pub timeout: Duration,
    /// TLS, verifying the client's server name; `None`: plain TCP.
    pub tls: Option<TlsClient>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            user: None,
            password: None,
            source: None,
            timeout: DEFAULT_TIMEOUT,
            tls: None,
        }
    }
}

impl ClientOptions {
    /// Authenticates as the `default` user with `password`.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Authenticates as the ACL user `user` with `password`.
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// Connects from `ip`.
    pub fn source(mut self, ip: Ipv4Addr) -> Self {
        self.source = Some(ip);
        self
    }

    /// Connect, read and write timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Over TLS, as `tls` says.
    pub fn tls(mut self, tls: TlsClient) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// One RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`: the server answered and refused.
    Error(String),
    /// `:1`
    Int(i64),
    /// `$3\r\nfoo` (`None`: the null bulk string `$-1`).
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n...` (`None`: the null array `*-1`).
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// A simple or bulk string as text (lossy UTF-8).
    pub fn text(&self) -> Option<String> {
        match self {
            Reply::Simple(s) => Some(s.clone()),
            Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// Whether the server refused the command.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// The error message, if the server refused the command.
    pub fn error(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }

    /// Whether this is `+OK`.
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Simple(s) if s == "OK")
    }

    /// An integer reply, or a string holding one (RESP2 sends some numbers as bulk strings).
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            other => other.text()?.parse().ok(),
        }
    }

    /// The elements of a non-null array.
    pub fn into_array(self) -> Option<Vec<Reply>> {
        match self {
            Reply::Array(items) => items,
            _ => None,
        }
    }

    /// The elements of a non-null array, borrowed.
    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(Some(items)) => Some(items),
            _ => None,
        }
    }

    /// The value under `key` in a RESP2 map (a flat array of key, value, key, value, …), as
    /// `CLUSTER SHARDS` and `HELLO` send them without RESP3.
    pub fn field(&self, key: &str) -> Option<&Reply> {
        self.as_array()?
            .chunks(2)
            .find(|kv| kv.len() == 2 && kv[0].text().as_deref() == Some(key))
            .map(|kv| &kv[1])
    }
}

/// Why a command got no reply (a server's refusal is a reply: [`Reply::Error`]).
#[derive(Debug)]
pub enum RespError {
    /// Connect, read or write timed out: the command's outcome is unknown.
    Timeout,
    /// The connection failed (refused, reset, closed).
    Io(io::Error),
    /// The server sent something that is not RESP2.
    Protocol(String),
    /// `AUTH` was refused.
    Auth(String),
}

impl fmt::Display for RespError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RespError::Timeout => write!(f, "timed out"),
            RespError::Io(e) => write!(f, "I/O error: {e}"),
            RespError::Protocol(m) => write!(f, "protocol error: {m}"),
            RespError::Auth(m) => write!(f, "authentication failed: {m}"),
        }
    }
}

impl std::error::Error for RespError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RespError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for RespError {
    /// A socket timeout surfaces as `WouldBlock` (reads and writes with a timeout set) or
    /// `TimedOut` (connect): both mean the same to a client.
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => RespError::Timeout,
            _ => RespError::Io(e),
        }
    }
}

impl RespError {
    /// Whether the command's outcome is unknown and the connection unusable (as opposed to the
    /// server refusing before anything was sent, e.g. [`RespError::Auth`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, RespError::Timeout)
    }
}

/// A connection's byte stream: plain or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// One connection to one server.
pub struct Conn {
    stream: BufReader<Stream>,
    peer: SocketAddr,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("peer", &self.peer)
            .field("local", &self.local_addr().ok())
            .finish()
    }
}

impl Conn {
    /// Connects (from `opts.source` if set) and authenticates when `opts.password` is set.
    pub fn connect(addr: SocketAddr, opts: &ClientOptions) -> Result<Conn, RespError> {
        let stream = open(addr, opts)?;
        stream.set_read_timeout(Some(opts.timeout))?;
        stream.set_write_timeout(Some(opts.timeout))?;
        // One small command at a time: Nagle would hold each one back waiting for an ACK.
        stream.set_nodelay(true)?;
        let stream = match &opts.tls {
            None => Stream::Plain(stream),
            Some(tls) => Stream::Tls(Box::new(tls.wrap(stream)?)),
        };
        let mut conn = Conn {
            stream: BufReader::new(stream),
            peer: addr,
        };
        conn.auth(opts)?;
        Ok(conn)
    }

    /// Sends one command and reads its reply. A server error is `Ok(Reply::Error)`; `Err` means
    /// no reply, and the connection should then be dropped.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<Reply, RespError> {
        if args.is_empty() {
            return Err(RespError::Protocol("empty command".into()));
        }
        self.stream.get_mut().write_all(&encode(args))?;
        read_reply(&mut self.stream)
    }

    /// [`Conn::cmd`] for the harness's own queries, where a refusal is as much a failure as no
    /// reply: either becomes an error naming the command and the server.
    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> crate::Result<Reply> {
        let name = args
            .iter()
            .map(|a| String::from_utf8_lossy(a.as_ref()).into_owned())
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        match self.cmd(args) {
            Ok(Reply::Error(e)) => Err(anyhow::anyhow!("{name} on {}: {e}", self.peer)),
            Ok(reply) => Ok(reply),
            Err(e) => Err(anyhow::Error::new(e).context(format!("{name} on {}", self.peer))),
        }
    }

    /// The server's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// This end's address, as the server sees it (`CLIENT LIST`'s `addr`).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.get_ref().tcp().local_addr()
    }

    fn auth(&mut self, opts: &ClientOptions) -> Result<(), RespError> {
        let Some(password) = &opts.password else {
            return Ok(());
        };
        let reply = match &opts.user {
            Some(user) => self.cmd(&["AUTH", user, password])?,
            None => self.cmd(&["AUTH", password])?,
        };
        match reply {
            Reply::Error(e) => Err(RespError::Auth(e)),
            _ => Ok(()),
        }
    }
}

/// A connected socket, bound to `opts.source` first if set.
fn open(addr: SocketAddr, opts: &ClientOptions) -> Result<TcpStream, RespError> {
    let Some(source) = opts.source else {
        return Ok(TcpStream::connect_timeout(&addr, opts.timeout)?);
    };
    if !addr.is_ipv4() {
        return Err(RespError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("an IPv4 source address {source} cannot reach {addr}"),
        )));
    }
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    socket.bind(&SockAddr::from(SocketAddr::new(IpAddr::V4(source), 0)))?;
    socket.connect_timeout(&SockAddr::from(addr), opts.timeout)?;
    Ok(socket.into())
}

/// A command as a RESP array of bulk strings (binary-safe, unlike inline commands).
pub fn encode<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one complete reply.
pub fn read_reply(r: &mut impl BufRead) -> Result<Reply, RespError> {
    read_nested(r, 0)
}

fn read_nested(r: &mut impl BufRead, depth: usize) -> Result<Reply, RespError> {
    let line = read_line(r)?;
    let (kind, rest) = line
        .split_first()
        .ok_or_else(|| RespError::Protocol("empty line".into()))?;
    let rest = String::from_utf8_lossy(rest).into_owned();
    match kind {
        b'+' => Ok(Reply::Simple(rest)),
        b'-' => Ok(Reply::Error(rest)),
        b':' => Ok(Reply::Int(number(&rest)?)),
        b'$' => read_bulk(r, number(&rest)?),
        b'*' => read_array(r, number(&rest)?, depth),
        other => Err(RespError::Protocol(format!(
            "unexpected type byte {:?}",
            char::from(*other)
        ))),
    }
}

fn read_bulk(r: &mut impl BufRead, len: i64) -> Result<Reply, RespError> {
    let Some(len) = length(len, MAX_BULK)? else {
        return Ok(Reply::Bulk(None));
    };
    let mut data = vec![0u8; len + 2];
    r.read_exact(&mut data)?;
    if !data.ends_with(b"\r\n") {
        return Err(RespError::Protocol("bulk string without CRLF".into()));
    }
    data.truncate(len);
    Ok(Reply::Bulk(Some(data)))
}

fn read_array(r: &mut impl BufRead, len: i64, depth: usize) -> Result<Reply, RespError> {
    if depth >= MAX_DEPTH {
        return Err(RespError::Protocol("arrays nested too deep".into()));
    }
    // Every element takes at least 3 bytes, which bounds a sane count like a bulk length.
    let Some(len) = length(len, MAX_BULK / 3)? else {
        return Ok(Reply::Array(None));
    };
    let items = (0..len)
        .map(|_| read_nested(r, depth + 1))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Reply::Array(Some(items)))
}

/// A length field: `-1` is null (`None`), other negatives and lengths over `max` are garbage.
fn length(len: i64, max: usize) -> Result<Option<usize>, RespError> {
    match usize::try_from(len) {
        Ok(n) if n <= max => Ok(Some(n)),
        _ if len == -1 => Ok(None),
        _ => Err(RespError::Protocol(format!("bad length {len}"))),
    }
}

fn number(s: &str) -> Result<i64, RespError> {
    s.parse()
        .map_err(|_| RespError::Protocol(format!("bad number {s:?}")))
}

/// One CRLF-terminated line without the CRLF.
fn read_line(r: &mut impl BufRead) -> Result<Vec<u8>, RespError> {
    let mut line = Vec::new();
    if r.read_until(b'\n', &mut line)? == 0 {
        return Err(RespError::Io(io::ErrorKind::UnexpectedEof.into()));
    }
    if !line.ends_with(b"\r\n") {
        return Err(RespError::Protocol("line without CRLF".into()));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ServerOptions, ValkeyServer};
    use std::time::Instant;

    fn parse(bytes: &[u8]) -> Result<Reply, RespError> {
        read_reply(&mut io::Cursor::new(bytes))
    }

    #[test]
    fn parses_every_resp2_type() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Reply::Simple("OK".into()));
        assert_eq!(
            parse(b"-READONLY no\r\n").unwrap(),
            Reply::Error("READONLY no".into())
        );
        assert_eq!(parse(b":-42\r\n").unwrap(), Reply::Int(-42));
        assert_eq!(
            parse(b"$5\r\na\r\nbc\r\n").unwrap(),
            Reply::Bulk(Some(b"a\r\nbc".to_vec())),
            "bulk strings are binary-safe"
        );
        assert_eq!(parse(b"$-1\r\n").unwrap(), Reply::Bulk(None));
        assert_eq!(parse(b"*-1\r\n").unwrap(), Reply::Array(None));
        let nested = parse(b"*2\r\n$6\r\nmaster\r\n*1\r\n:7\r\n").unwrap();
        assert_eq!(
            nested,
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"master".to_vec())),
                Reply::Array(Some(vec![Reply::Int(7)])),
            ]))
        );
    }

    #[test]
    fn garbage_and_truncation_are_errors_not_panics() {
        for bad in [
            &b"?x\r\n"[..],
            b"+OK\n",
            b":abc\r\n",
            b"$-2\r\n",
            b"$3\r\nabcd\r\n",
            b"$99999999999\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(RespError::Protocol(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(parse(b""), Err(RespError::Io(_))));
        assert!(matches!(parse(b"$3\r\nab"), Err(RespError::Io(_))));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(matches!(
            parse(deep.as_bytes()),
            Err(RespError::Protocol(_))
        ));
    }

    #[test]
    fn helpers_read_replies() {
        let map = parse(b"*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:9\r\n+id\r\n$2\r\nab\r\n").unwrap();
        assert_eq!(map.field("id").and_then(Reply::text).as_deref(), Some("ab"));
        assert_eq!(
            map.field("slots").and_then(Reply::as_array).map(<[_]>::len),
            Some(2)
        );
        assert_eq!(Reply::Bulk(Some(b"12".to_vec())).int(), Some(12));
        assert!(Reply::Simple("OK".into()).is_ok());
        assert!(Reply::Error("ERR".into()).is_error());
        assert_eq!(map.into_array().map(|a| a.len()), Some(4));
    }

    #[test]
    fn encodes_commands_as_bulk_arrays() {
        assert_eq!(
            encode(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn io_timeouts_map_to_timeout() {
        for kind in [io::ErrorKind::WouldBlock, io::ErrorKind::TimedOut] {
            assert!(RespError::from(io::Error::from(kind)).is_timeout());
        }
        assert!(matches!(
            RespError::from(io::Error::from(io::ErrorKind::ConnectionReset)),
            RespError::Io(_)
        ));
    }

    #[test]
    fn talks_to_a_real_server() {
        let server = ValkeyServer::start(ServerOptions::default()).unwrap();
        let mut c = Conn::connect(server.addr(), &ClientOptions::default()).unwrap();
        assert!(c.cmd(&["SET", "k", "v"]).unwrap().is_ok());
        assert_eq!(c.cmd(&["GET", "k"]).unwrap().text().as_deref(), Some("v"));
        assert_eq!(c.cmd(&["GET", "none"]).unwrap(), Reply::Bulk(None));
        assert_eq!(c.cmd(&["INCR", "n"]).unwrap(), Reply::Int(1));
        let refused = c.cmd(&["INCR", "k"]).unwrap();
        assert!(refused.is_error(), "{refused:?}");
        let role = c.cmd(&["ROLE"]).unwrap().into_array().unwrap();
        assert_eq!(role[0].text().as_deref(), Some("master"));
        assert!(c.cmd(&["PING"]).unwrap().text().as_deref() == Some("PONG"));
    }

    #[test]
    fn authenticates_as_default_and_acl_users() {
        let server = ValkeyServer::start(
            ServerOptions::default()
                .requirepass("secret")
                .user("app on >apppw ~* +@all"),
        )
        .unwrap();
        let addr = server.addr();
        let mut c = Conn::connect(addr, &ClientOptions::default().password("secret")).unwrap();
        assert!(c.cmd(&["SET", "k", "v"]).unwrap().is_ok());
        let mut c = Conn::connect(addr, &ClientOptions::default().user("app", "apppw")).unwrap();
        let who = c.cmd(&["ACL", "WHOAMI"]).unwrap();
        assert_eq!(who.text().as_deref(), Some("app"));
        let wrong = Conn::connect(addr, &ClientOptions::default().password("nope"));
        assert!(matches!(wrong, Err(RespError::Auth(_))), "{wrong:?}");
        let mut anonymous = Conn::connect(addr, &ClientOptions::default()).unwrap();
        let refused = anonymous.cmd(&["SET", "k", "v"]).unwrap();
        assert!(
            refused.error().is_some_and(|e| e.starts_with("NOAUTH")),
            "{refused:?}"
        );
    }

    #[test]
    fn binds_the_source_address() {
        let server = ValkeyServer::start(ServerOptions::default()).unwrap();
        let source = Ipv4Addr::new(127, 0, 0, 77);
        let mut c = Conn::connect(server.addr(), &ClientOptions::default().source(source)).unwrap();
        assert_eq!(c.local_addr().unwrap().ip(), IpAddr::V4(source));
        let me = c.cmd(&["CLIENT", "INFO"]).unwrap().text().unwrap();
        assert!(me.contains("addr=127.0.0.77:"), "{me}");
    }

    #[test]
    fn a_frozen_server_times_out_within_the_timeout() {
        let server = ValkeyServer::start(ServerOptions::default()).unwrap();
        let opts = ClientOptions::default().timeout(Duration::from_millis(300));
        let mut c = Conn::connect(server.addr(), &opts).unwrap();
        server.pause().unwrap();
        let start = Instant::now();
        let result = c.cmd(&["SET", "k", "v"]);
        let waited = start.elapsed();
        server.resume().unwrap();
        assert!(matches!(result, Err(RespError::Timeout)), "{result:?}");
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(1),
            "{waited:?}"
        );
    }

    #[test]
    fn a_closed_port_is_an_io_error() {
        let port = crate::free_port(crate::loopback_ip(1)).unwrap();
        let addr = SocketAddr::new(crate::loopback_ip(1), port);
        let result = Conn::connect(addr, &ClientOptions::default());
        assert!(matches!(result, Err(RespError::Io(_))), "{result:?}");
    }
}
