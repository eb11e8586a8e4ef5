//! `valkey-sidecar await -- valkey-server …`: the Valkey container's entrypoint in the chart. It
//! asks the agent beside it (`GET /valkey-start`) whether Valkey may start and then becomes
//! `valkey-server` (exec, same process). A primary that crashed is held until a replica has
//! taken over its slots (`core::restart`), so an empty restart never becomes the source its
//! replicas resync from. `valkey-sidecar install DIR` copies the binary into a volume the Valkey
//! container shares, as service meshes ship their proxy's helpers.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgMatches, Args, FromArgMatches};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, timeout};

use crate::cli::exit;

/// `valkey-sidecar await`.
#[derive(Debug, Args)]
pub struct AwaitArgs {
    /// The agent's permit endpoint, `http://HOST:PORT/valkey-start`.
    #[arg(long, env = "SIDECAR_AWAIT_URL")]
    pub url: String,
    /// Start anyway after this many seconds without a "go" (the agent unreachable, or nobody
    /// taking over): a shard without its data beats a shard that never starts.
    #[arg(long, default_value_t = 90)]
    pub timeout: u64,
    /// The program to become, with its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// `valkey-sidecar install`.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Where to put a copy of this binary (a file path in a shared volume).
    pub path: PathBuf,
}

/// How often the agent is asked while it holds the start.
const PACE: Duration = Duration::from_millis(50);

/// One question to the agent.
const ASK_LIMIT: Duration = Duration::from_secs(1);

/// `valkey-sidecar await`; returns only when it cannot become the command.
pub fn main(matches: &ArgMatches) -> i32 {
    let args = match AwaitArgs::from_arg_matches(matches) {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
    let Some(target) = Target::parse(&args.url) else {
        eprintln!(
            "valkey-sidecar await: --url {:?} is not http://HOST:PORT/PATH",
            args.url
        );
        return exit::CONFIG;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let limit = Duration::from_secs(args.timeout);
    let go = match runtime.map(|rt| rt.block_on(wait(&target, limit))) {
        Ok(Some(reason)) => reason,
        // SIGTERM while held: the pod is going away, Valkey never started.
        Ok(None) => return 143,
        Err(e) => format!("cannot wait ({e}): starting at once"),
    };
    eprintln!("valkey-sidecar await: {go}");
    become_command(&args.command)
}

/// Replaces this process with the command; returns only on failure.
fn become_command(command: &[OsString]) -> i32 {
    let Some((program, rest)) = command.split_first() else {
        return exit::CONFIG;
    };
    let e = std::process::Command::new(program).args(rest).exec();
    eprintln!("valkey-sidecar await: cannot run {program:?}: {e}");
    127
}

fn usage(e: &clap::Error) -> i32 {
    let _ = e.print();
    exit::CONFIG
}

/// Asks until the agent says go or `limit` passes; `None` on SIGTERM.
async fn wait(target: &Target, limit: Duration) -> Option<String> {
    let mut term = signal(SignalKind::terminate()).ok();
    let deadline = Instant::now() + limit;
    let mut said = String::new();
    loop {
        let answer = target.ask().await;
        let text = match answer {
            Ok((true, reason)) => return Some(reason),
            Ok((false, reason)) => reason,
            Err(e) => format!("the agent does not answer: {e}"),
        };
        if text != said {
            eprintln!("valkey-sidecar await: {text}");
            said = text;
        }
        if Instant::now() >= deadline {
            return Some(format!("no go within {limit:?} ({said}): starting anyway"));
        }
        tokio::select! {
            _ = sleep(PACE) => {}
            Some(()) = async { term.as_mut()?.recv().await } => return None,
        }
    }
}

/// The agent's endpoint.
struct Target {
    host: String,
    port: u16,
    path: String,
}

impl Target {
    fn parse(url: &str) -> Option<Target> {
        let rest = url.strip_prefix("http://")?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = authority.rsplit_once(':')?;
        Some(Target {
            host: host.to_owned(),
            port: port.parse().ok()?,
            path: format!("/{path}"),
        })
    }

    /// One `GET`: whether it answered 200, and the body (the agent's reason).
    async fn ask(&self) -> std::io::Result<(bool, String)> {
        let exchange = async {
            let mut s = TcpStream::connect((self.host.as_str(), self.port)).await?;
            let req = format!("GET {} HTTP/1.0\r\nHost: {}\r\n\r\n", self.path, self.host);
            s.write_all(req.as_bytes()).await?;
            let mut buf = Vec::new();
            s.take(8192).read_to_end(&mut buf).await?;
            Ok(parse_response(&String::from_utf8_lossy(&buf)))
        };
        timeout(ASK_LIMIT, exchange)
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
    }
}

/// `HTTP/1.x 200 …\r\n…\r\n\r\nbody` into (200?, body's first line).
fn parse_response(text: &str) -> (bool, String) {
    let ok = text.split(' ').nth(1) == Some("200");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (ok, body.lines().next().unwrap_or("").to_owned())
}

/// `valkey-sidecar install PATH`: copies this binary to `PATH` (mode 0755).
pub fn install(matches: &ArgMatches) -> i32 {
    let args = match InstallArgs::from_arg_matches(matches) {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
    match copy_self(&args.path) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("valkey-sidecar install: {}: {e}", args.path.display());
            73
        }
    }
}

/// Copies to a temporary name first, then renames: a container starting meanwhile never runs a
/// half-written binary.
fn copy_self(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe()?;
    let partial = path.with_extension("partial");
    std::fs::copy(&exe, &partial)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_host_port_and_path() {
        let t = Target::parse("http://10.1.2.3:9736/valkey-start").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("10.1.2.3", 9736, "/valkey-start")
        );
        assert!(Target::parse("https://x:1/").is_none());
        assert!(Target::parse("http://x/").is_none());
        assert!(Target::parse("http://x:port/").is_none());
    }

    #[test]
    fn responses_parse_into_status_and_reason() {
        let go = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\ngo: a2 took over\n";
        assert_eq!(parse_response(go), (true, "go: a2 took over".into()));
        let held = "HTTP/1.1 503 Service Unavailable\r\n\r\nhold: waiting\n";
        assert_eq!(parse_response(held), (false, "hold: waiting".into()));
        assert_eq!(parse_response("garbage"), (false, String::new()));
    }
}
