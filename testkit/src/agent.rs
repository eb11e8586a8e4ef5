//! The `valkey-sidecar` binary as a process beside a test server, with a tiny HTTP client for
//! its endpoints.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::Result;
use crate::net::{free_port, wait_for};
use crate::process::{ProcessSpec, ServerProcess};

/// How to start an agent. Every setting is passed as a flag (each has one, see `--help`).
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Path of the `valkey-sidecar` binary (in tests: `env!("CARGO_BIN_EXE_valkey-sidecar")`).
    pub bin: PathBuf,
    /// The Valkey it watches, `host:port`.
    pub valkey: String,
    /// `cluster` or `replication`.
    pub mode: String,
    /// Address the probe and admin listeners bind to (each on a free port).
    pub ip: IpAddr,
    /// Further flags, e.g. `("--poll-interval", "100ms")`.
    pub args: Vec<(String, String)>,
    /// A program that runs the binary, e.g. `qemu-aarch64-static` for another architecture's.
    pub runner: Option<PathBuf>,
}

impl AgentOptions {
    pub fn new(bin: impl Into<PathBuf>, valkey: impl ToString, mode: &str) -> Self {
        Self {
            bin: bin.into(),
            valkey: valkey.to_string(),
            mode: mode.to_owned(),
            ip: IpAddr::from([127, 0, 0, 1]),
            args: Vec::new(),
            runner: None,
        }
    }

    /// Runs the binary through `runner` (its first argument is the binary).
    pub fn under(mut self, runner: impl Into<PathBuf>) -> Self {
        self.runner = Some(runner.into());
        self
    }

    /// Adds a flag with its value.
    pub fn arg(mut self, name: &str, value: impl ToString) -> Self {
        self.args.push((name.to_owned(), value.to_string()));
        self
    }
}

/// A running agent; killed and cleaned up on drop.
pub struct Agent {
    process: ServerProcess,
    probe: SocketAddr,
    admin: SocketAddr,
}

impl Agent {
    /// Starts the agent and waits until its probe listener answers.
    pub fn start(opts: AgentOptions) -> Result<Self> {
        let probe = SocketAddr::new(opts.ip, free_port(opts.ip)?);
        let admin = SocketAddr::new(
            IpAddr::from([127, 0, 0, 1]),
            free_port(IpAddr::from([127, 0, 0, 1]))?,
        );
        let dir = tempfile::Builder::new()
            .prefix("valkey-sidecar-agent-")
            .tempdir()?;
        let log = dir.path().join("output.log");
        let mut argv = args(&opts, probe, admin);
        if opts.runner.is_some() {
            argv.insert(0, opts.bin.clone().into_os_string());
        }
        let spec = ProcessSpec {
            program: opts.runner.clone().unwrap_or_else(|| opts.bin.clone()),
            args: argv,
            label: format!("sidecar {probe}"),
        };
        let process = ServerProcess::spawn(spec, dir, log)?;
        let sidecar = Self {
            process,
            probe,
            admin,
        };
        wait_for(
            "sidecar listening",
            Duration::from_secs(10),
            Duration::from_millis(10),
            || {
                if !sidecar.process.is_running() {
                    bail!("sidecar exited: {}", sidecar.log());
                }
                Ok(sidecar.get("/livez").is_ok())
            },
        )?;
        Ok(sidecar)
    }

    pub fn probe_addr(&self) -> SocketAddr {
        self.probe
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Everything the agent wrote to stdout and stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn log_path(&self) -> PathBuf {
        self.process.dir().join("output.log")
    }

    /// `GET path` on the probe listener: status code and body.
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        http_get(self.probe, path)
    }

    /// `/status` as JSON.
    pub fn status(&self) -> Result<serde_json::Value> {
        let (code, body) = self.get("/status")?;
        if code != 200 {
            bail!("/status answered {code}: {body}");
        }
        serde_json::from_str(&body).context("parse /status")
    }

    /// Waits until `GET path` answers `code`; returns how long that took.
    pub fn wait_code(&self, path: &str, code: u16, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        wait_for(
            &format!("{path} -> {code}"),
            timeout,
            Duration::from_millis(5),
            || Ok(self.get(path)?.0 == code),
        )?;
        Ok(start.elapsed())
    }

    /// Waits until `/status` has `field` equal to `value`; returns how long that took.
    pub fn wait_status(&self, field: &str, value: &str, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        wait_for(
            &format!("status {field}={value}"),
            timeout,
            Duration::from_millis(5),
            || Ok(self.status()?.pointer(field).and_then(|v| v.as_str()) == Some(value)),
        )?;
        Ok(start.elapsed())
    }

    /// SIGTERM and wait for exit.
    pub fn terminate(&self, timeout: Duration) -> Result<()> {
        self.process.terminate(timeout)
    }

    /// The exit status once the process has ended.
    pub fn exit_status(&self) -> Option<std::process::ExitStatus> {
        self.process.exit_status()
    }

    pub fn signal(&self, name: &str) -> Result<()> {
        self.process.signal(name)
    }

    pub fn dir(&self) -> &Path {
        self.process.dir()
    }
}

fn args(opts: &AgentOptions, probe: SocketAddr, admin: SocketAddr) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |k: &str, v: &str| {
        args.push(k.into());
        args.push(v.into());
    };
    push("--valkey-addr", &opts.valkey);
    push("--mode", &opts.mode);
    push("--probe-addr", &probe.to_string());
    push("--admin-addr", &admin.to_string());
    push("--log-format", "json");
    for (k, v) in &opts.args {
        push(k, v);
    }
    args
}

/// A minimal HTTP/1.1 GET (`Connection: close`), enough for the agent's endpoints.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let code = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status line")?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}
