//! `valkey-sidecar valkey-settings`: the chart's `valkey-settings` container, the only holder of
//! `CONFIG SET` in the pod. Once a second it reads the TLS files and the zone file the agent
//! writes, and tells Valkey what changed (`core::settings`): a rotated certificate, key or CA
//! (`CONFIG SET tls-cert-file <same path> …` makes Valkey before 9.1 read the files again), and
//! `availability-zone`.
//!
//! It talks to Valkey over a Unix socket in a volume only Valkey and this container mount, as a
//! user whose password the `valkey-config` init container made for this pod (`CONFIG SET` only).
//! The agent, which holds an API token, serves HTTP and talks to its peers, has no `CONFIG SET`:
//! docs/security.md argues the split. It needs no TLS client certificate (the socket is not TLS)
//! and opens no port.
//!
//! Failures (Valkey restarting, a refused `CONFIG SET`, a half-rotated key pair) are logged with
//! a running count and retried with backoff; the process only exits on SIGTERM (0) or bad
//! arguments (64).

use std::path::{Path, PathBuf};
use std::time::Duration;

use backon::ExponentialBackoff;
use clap::{ArgMatches, Args, FromArgMatches};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::signal::unix::{SignalKind, signal};
use valkey_sidecar_core::settings::{Applied, Push, Wanted, due};

use crate::cli::config::LogFormat;
use crate::cli::exit;
use crate::valkey::tls::fingerprint;

/// `valkey-sidecar valkey-settings`.
#[derive(Debug, Args)]
pub struct SettingsArgs {
    /// Valkey's Unix socket (`unixsocket`).
    #[arg(long)]
    pub socket: PathBuf,
    /// The user to log in as (the `valkey-config` init container's `--settings-user`).
    #[arg(long, requires = "password_file")]
    pub user: Option<String>,
    /// The file holding its password.
    #[arg(long, requires = "user")]
    pub password_file: Option<PathBuf>,
    /// Valkey's certificate, as Valkey was given it: re-read when any TLS file changes.
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Valkey's private key, as Valkey was given it.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// The CA bundle Valkey verifies peers with, as Valkey was given it.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_ca_cert_file: Option<PathBuf>,
    /// The file the agent writes the pod's zone into.
    #[arg(long)]
    pub zone_file: Option<PathBuf>,
    /// How often the files are read, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub interval_ms: u64,
}

/// Why one round did not get through.
#[derive(Debug, thiserror::Error)]
enum SettingsError {
    #[error("{0}: {1}")]
    Password(PathBuf, std::io::Error),
    #[error("valkey socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("valkey refused {what}: {reply}")]
    Refused { what: &'static str, reply: String },
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

impl SettingsError {
    /// Valkey's socket is not there or not listening (yet, or while Valkey restarts).
    fn not_up(&self) -> bool {
        use std::io::ErrorKind::{ConnectionRefused, NotFound};
        matches!(self, SettingsError::Io(e) if matches!(e.kind(), NotFound | ConnectionRefused))
    }
}

/// One exchange with Valkey may take this long (a blocked Valkey is asked again next round).
const CALL_LIMIT: Duration = Duration::from_secs(5);

/// `valkey-sidecar valkey-settings`; returns the exit code.
pub fn main(matches: &ArgMatches) -> i32 {
    let args = match SettingsArgs::from_arg_matches(matches) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return exit::CONFIG;
        }
    };
    crate::runtime::telemetry::init(LogFormat::Auto);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(rt) => rt.block_on(run(args)),
        Err(e) => {
            eprintln!("valkey-sidecar valkey-settings: cannot start the runtime: {e}");
            exit::SOFTWARE
        }
    }
}

/// Rounds until SIGTERM.
async fn run(args: SettingsArgs) -> i32 {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("valkey-sidecar valkey-settings: no SIGTERM handler: {e}");
            return exit::SOFTWARE;
        }
    };
    let mut pusher = Pusher::new(args);
    loop {
        let pause = pusher.round().await;
        tokio::select! {
            _ = term.recv() => return exit::OK,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The connection, what it has applied, and the failures so far.
struct Pusher {
    args: SettingsArgs,
    conn: Option<Conn>,
    applied: Applied,
    failures: u64,
    backoff: ExponentialBackoff,
}

impl Pusher {
    fn new(args: SettingsArgs) -> Pusher {
        Pusher {
            args,
            conn: None,
            applied: Applied::default(),
            failures: 0,
            backoff: backoff(),
        }
    }

    /// Reads the files, pushes what is due; returns how long to wait before the next round.
    async fn round(&mut self) -> Duration {
        let interval = Duration::from_millis(self.args.interval_ms);
        if self.conn.as_ref().is_some_and(Conn::closed) {
            // Valkey restarted (or dropped us): what it was told is forgotten.
            self.forget();
        }
        let wanted = wanted(&self.args).await;
        match self.push(&wanted).await {
            Ok(()) => {
                self.backoff = backoff();
                interval
            }
            Err(e) => {
                self.failures += 1;
                if e.not_up() {
                    // Every pod start: this container starts before Valkey makes its socket.
                    tracing::info!(error = %e, failures = self.failures, "valkey not up yet");
                } else {
                    tracing::warn!(error = %e, failures = self.failures, "cannot update valkey's settings");
                }
                self.backoff.next().unwrap_or(interval).max(interval)
            }
        }
    }

    async fn push(&mut self, wanted: &Wanted) -> Result<(), SettingsError> {
        for push in due(wanted, &self.applied) {
            let result = self.send(&push).await;
            if let Err(SettingsError::Io(_) | SettingsError::Timeout(_)) = &result {
                self.forget();
            }
            result?;
            log_applied(&push);
            self.applied.record(&push);
        }
        Ok(())
    }

    /// Drops the connection and what it applied: the next one starts with nothing applied.
    fn forget(&mut self) {
        self.conn = None;
        self.applied = Applied::default();
    }

    /// One `CONFIG SET`, on the connection (dialled first if there is none).
    async fn send(&mut self, push: &Push) -> Result<(), SettingsError> {
        let command = config_set(&self.args, push);
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => self.conn.insert(Conn::open(&self.args).await?),
        };
        conn.call(&command, "CONFIG SET").await
    }
}

fn log_applied(push: &Push) {
    match push {
        Push::Tls(_) => tracing::info!("valkey read its TLS files again"),
        Push::Zone(zone) => tracing::info!(zone, "availability-zone set in valkey"),
    }
}

/// Retries back off from one round to 30 s: Valkey restarting takes seconds, a refused setting
/// needs a person.
fn backoff() -> ExponentialBackoff {
    crate::runtime::retry::exponential(Duration::from_secs(1), Duration::from_secs(30))
}

/// The `CONFIG SET` of `push`. The TLS files are set to the paths Valkey already has, all in one
/// command, so that Valkey reads certificate, key and CA together and keeps its old ones if they
/// do not fit.
fn config_set(args: &SettingsArgs, push: &Push) -> Vec<Vec<u8>> {
    let mut words: Vec<Vec<u8>> = vec![b"CONFIG".to_vec(), b"SET".to_vec()];
    let mut pair = |name: &str, value: &[u8]| {
        words.push(name.as_bytes().to_vec());
        words.push(value.to_vec());
    };
    match push {
        Push::Tls(_) => {
            for (name, path) in args.tls_files() {
                pair(name, path.as_os_str().as_encoded_bytes());
            }
        }
        Push::Zone(zone) => pair("availability-zone", zone.as_bytes()),
    }
    words
}

impl SettingsArgs {
    /// The TLS files given, by the Valkey setting that names each.
    fn tls_files(&self) -> Vec<(&'static str, &Path)> {
        let files = [
            ("tls-cert-file", &self.tls_cert_file),
            ("tls-key-file", &self.tls_key_file),
            ("tls-ca-cert-file", &self.tls_ca_cert_file),
        ];
        files
            .into_iter()
            .filter_map(|(name, path)| Some((name, path.as_deref()?)))
            .collect()
    }
}

/// What the files say now. An unreadable TLS file means no reload (Valkey keeps what it has); a
/// missing zone file means the agent has not learnt the zone yet.
async fn wanted(args: &SettingsArgs) -> Wanted {
    let tls_files: Vec<&Path> = args.tls_files().into_iter().map(|(_, p)| p).collect();
    let zone = match &args.zone_file {
        Some(p) => tokio::fs::read_to_string(p).await.ok(),
        None => None,
    };
    Wanted {
        tls: fingerprint(&tls_files).await,
        zone: zone.map(|z| z.trim().to_owned()),
    }
}

/// A RESP connection to Valkey's socket: the two replies it needs are simple strings or errors.
struct Conn {
    stream: BufReader<UnixStream>,
}

impl Conn {
    /// Dials and logs in (the password read now: it is made anew when the pod starts).
    async fn open(args: &SettingsArgs) -> Result<Conn, SettingsError> {
        let stream = within(UnixStream::connect(&args.socket)).await??;
        let mut conn = Conn {
            stream: BufReader::new(stream),
        };
        if let (Some(user), Some(file)) = (&args.user, &args.password_file) {
            let password = tokio::fs::read(file)
                .await
                .map_err(|e| SettingsError::Password(file.clone(), e))?;
            let auth = vec![b"AUTH".to_vec(), user.as_bytes().to_vec(), password];
            conn.call(&auth, "AUTH").await?;
        }
        Ok(conn)
    }

    /// Whether Valkey closed the connection (a restart): between commands nothing may be
    /// waiting to be read, so end of file or any byte means the connection is done.
    fn closed(&self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.get_ref().try_read(&mut byte) {
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }

    /// Sends `words`, reads one reply: `+…` is success, anything else a refusal.
    async fn call(&mut self, words: &[Vec<u8>], what: &'static str) -> Result<(), SettingsError> {
        let request = resp(words);
        within(self.stream.get_mut().write_all(&request)).await??;
        let mut line = String::new();
        let read = within(self.stream.read_line(&mut line)).await??;
        if read == 0 {
            return Err(SettingsError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        match line.strip_prefix('+') {
            Some(_) => Ok(()),
            None => Err(SettingsError::Refused {
                what,
                reply: line.trim_end().to_owned(),
            }),
        }
    }
}

async fn within<F: std::future::Future>(f: F) -> Result<F::Output, SettingsError> {
    tokio::time::timeout(CALL_LIMIT, f)
        .await
        .map_err(|_| SettingsError::Timeout(CALL_LIMIT))
}

/// A command as a RESP array of bulk strings.
fn resp(words: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend(format!("${}\r\n", w.len()).into_bytes());
        out.extend(w);
        out.extend(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SettingsArgs,
    }

    fn args(extra: &[&str]) -> Result<SettingsArgs, clap::Error> {
        let mut argv = vec!["x", "--socket", "/run/valkey/valkey.sock"];
        argv.extend(extra);
        Cli::try_parse_from(argv).map(|c| c.args)
    }

    #[test]
    fn the_tls_files_are_set_to_their_own_paths_in_one_command() {
        let a = args(&[
            "--tls-cert-file",
            "/t/tls.crt",
            "--tls-key-file",
            "/t/tls.key",
            "--tls-ca-cert-file",
            "/t/ca.crt",
        ])
        .unwrap();
        let words = config_set(&a, &Push::Tls(1));
        let text: Vec<String> = words
            .iter()
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        assert_eq!(
            text,
            [
                "CONFIG",
                "SET",
                "tls-cert-file",
                "/t/tls.crt",
                "tls-key-file",
                "/t/tls.key",
                "tls-ca-cert-file",
                "/t/ca.crt"
            ]
        );
        let zone = config_set(&a, &Push::Zone("eu-1a".into()));
        assert_eq!(
            zone[2..],
            [b"availability-zone".to_vec(), b"eu-1a".to_vec()]
        );
    }

    #[test]
    fn a_certificate_without_its_key_or_a_user_without_a_password_is_refused() {
        assert!(args(&["--tls-cert-file", "/c"]).is_err());
        assert!(args(&["--user", "u"]).is_err());
        assert!(args(&["--interval-ms", "10"]).is_err());
        assert!(args(&[]).is_ok());
    }

    #[test]
    fn commands_are_resp_arrays_of_bulk_strings() {
        let words = [b"AUTH".to_vec(), b"u".to_vec(), b"p w".to_vec()];
        assert_eq!(
            resp(&words),
            b"*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$3\r\np w\r\n"
        );
    }

    #[tokio::test]
    async fn the_fingerprint_follows_the_contents() {
        let dir = std::env::temp_dir().join(format!("vs-settings-fp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, "cert").unwrap();
        std::fs::write(&b, "key").unwrap();
        let files = [a.as_path(), b.as_path()];
        let first = fingerprint(&files).await.unwrap();
        std::fs::write(&a, "cert").unwrap();
        assert_eq!(
            fingerprint(&files).await,
            Some(first),
            "same bytes, same print"
        );
        std::fs::write(&b, "key2").unwrap();
        assert_ne!(fingerprint(&files).await, Some(first));
        std::fs::remove_file(&b).unwrap();
        assert_eq!(fingerprint(&files).await, None, "unreadable: no reload");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
