//! One server process with its own temp dir: spawn, signals, teardown, log access.
//!
//! Teardown has two layers:
//! 1. `Drop` sends SIGKILL, reaps the process and removes the temp dir, which also covers panicking
//!    tests (unwinding runs `Drop`).
//! 2. When the whole test process dies without unwinding (SIGKILL, `panic = "abort"`, `exit`), the
//!    servers get SIGKILL from the kernel: they are started through `setpriv --pdeathsig KILL` when
//!    util-linux's `setpriv` exists. PDEATHSIG fires when the *thread* that spawned the child exits,
//!    not the process, so all children are spawned from one long-lived spawner thread owned by this
//!    module. A server started from a short-lived thread (a `std::thread::spawn`, a tokio blocking
//!    thread) would otherwise be killed the moment that thread ends.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tempfile::TempDir;

use crate::Result;
use crate::binaries::setpriv_bin;
use crate::net::lock;

/// Set to keep the temp dirs (data, logs, certs) of dropped servers for a post-mortem.
pub const KEEP_DIRS_ENV: &str = "VALKEY_TESTKIT_KEEP_DIRS";

/// What `cargo test` and rustup add to a test's environment (the package's `CARGO_*` facts, the
/// test's library path, the toolchain rustup picked) and a user's shell does not have.
const CARGO_TEST_ENV: &[&str] = &[
    "CARGO",
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_CRATE_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "LD_LIBRARY_PATH",
    "OUT_DIR",
    "RUSTUP_TOOLCHAIN",
    "RUSTUP_TOOLCHAIN_SOURCE",
    "RUST_RECURSION_COUNT",
];

/// `cmd` with the environment a shell would give it, not the one `cargo test` gave this test: a
/// script that runs `cargo build` (the static binaries) then finds the build the test command
/// made fresh instead of rebuilding it, LTO and all, for a changed environment.
pub fn as_from_a_shell(cmd: &mut std::process::Command) -> &mut std::process::Command {
    for (key, _) in std::env::vars_os() {
        let name = key.to_string_lossy();
        let added = CARGO_TEST_ENV.contains(&name.as_ref())
            || name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_");
        if added {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// How many log lines a panicking test prints per server while tearing it down.
const PANIC_TAIL_LINES: usize = 25;

/// What to run; kept so the same process can be started again on the same port and dir.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Names the server in diagnostics, e.g. `valkey 127.0.0.1:6379`.
    pub label: String,
}

pub struct ServerProcess {
    spec: ProcessSpec,
    child: Mutex<Child>,
    pid: AtomicU32,
    /// `Option` only so `Drop` can keep it on request.
    dir: Option<TempDir>,
    dir_path: PathBuf,
    /// The server's own `logfile`.
    log: PathBuf,
    /// stdout + stderr: the server writes here before its logfile is open (bad arguments).
    output: PathBuf,
}

impl ServerProcess {
    /// Starts `spec`; `log` is the server's logfile inside `dir`.
    pub fn spawn(spec: ProcessSpec, dir: TempDir, log: PathBuf) -> Result<Self> {
        let output = dir.path().join("output.log");
        let child = launch(&spec, &output)?;
        Ok(Self {
            pid: AtomicU32::new(child.id()),
            child: Mutex::new(child),
            dir_path: dir.path().to_path_buf(),
            dir: Some(dir),
            spec,
            log,
            output,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst)
    }

    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn label(&self) -> &str {
        &self.spec.label
    }

    /// `Some(status)` once the process has exited (it is reaped here).
    pub fn exit_status(&self) -> Option<ExitStatus> {
        lock(&self.child).try_wait().ok().flatten()
    }

    pub fn is_running(&self) -> bool {
        self.exit_status().is_none()
    }

    /// SIGKILL and reap. A no-op for a process that already exited.
    pub fn kill(&self) -> Result<()> {
        let mut child = lock(&self.child);
        child
            .kill()
            .with_context(|| format!("killing {}", self.spec.label))?;
        child
            .wait()
            .with_context(|| format!("reaping {}", self.spec.label))?;
        Ok(())
    }

    /// SIGTERM (after SIGCONT, in case the process is paused) and wait up to `timeout` for the
    /// process to exit; SIGKILL after that.
    pub fn terminate(&self, timeout: Duration) -> Result<()> {
        let mut child = lock(&self.child);
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        send_signal(child.id(), "CONT")?;
        send_signal(child.id(), "TERM")?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        child.kill()?;
        child.wait()?;
        bail!(
            "{} ignored SIGTERM for {timeout:?}; killed it",
            self.spec.label
        )
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, ...) to the live process.
    pub fn signal(&self, name: &str) -> Result<()> {
        // Holding the lock keeps the child unreaped, so its pid cannot have been reused.
        let mut child = lock(&self.child);
        if child.try_wait()?.is_some() {
            bail!("{} is not running; cannot send SIG{name}", self.spec.label);
        }
        send_signal(child.id(), name)
    }

    /// Starts the same command again (same args, port and dir). The old process must have exited.
    pub fn relaunch(&self) -> Result<()> {
        let mut child = lock(&self.child);
        if child.try_wait()?.is_none() {
            bail!(
                "{} is still running; stop it before restarting",
                self.spec.label
            );
        }
        *child = launch(&self.spec, &self.output)?;
        self.pid.store(child.id(), Ordering::SeqCst);
        Ok(())
    }

    /// The last `n` lines of the server's logfile (empty if it has none yet).
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }

    /// Log and stdout/stderr tails, for error messages about a server that misbehaved.
    pub fn diagnostics(&self, n: usize) -> String {
        format!(
            "--- {} log tail ({}) ---\n{}\n--- stdout/stderr tail ---\n{}",
            self.spec.label,
            self.log.display(),
            self.log_tail(n),
            tail(&self.output, n)
        )
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            eprintln!("valkey-testkit: {e:#}");
        }
        if std::thread::panicking() {
            eprintln!("{}", self.diagnostics(PANIC_TAIL_LINES));
        }
        if std::env::var_os(KEEP_DIRS_ENV).is_some()
            && let Some(dir) = self.dir.take()
        {
            eprintln!(
                "valkey-testkit: kept {} for {}",
                dir.keep().display(),
                self.spec.label
            );
        }
    }
}

fn launch(spec: &ProcessSpec, output: &Path) -> Result<Child> {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(output)
        .with_context(|| format!("opening {}", output.display()))?;
    let err = out.try_clone()?;
    let mut cmd = match setpriv_bin() {
        Some(setpriv) => {
            let mut c = Command::new(setpriv);
            c.args(["--pdeathsig", "KILL", "--"]).arg(&spec.program);
            c
        }
        None => Command::new(&spec.program),
    };
    cmd.args(&spec.args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    spawn_from_spawner_thread(cmd)
        .with_context(|| format!("spawning {} ({})", spec.label, spec.program.display()))
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` from the process-wide spawner thread (see the module docs for why).
fn spawn_from_spawner_thread(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(start_spawner);
    let Some(tx) = spawner else {
        // No spawner thread could be started: spawn here and accept the per-thread PDEATHSIG.
        let mut cmd = cmd;
        return cmd.spawn();
    };
    let (reply_tx, reply_rx) = mpsc::channel();
    tx.send((cmd, reply_tx))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("spawner thread dropped the request"))?
}

fn start_spawner() -> Option<mpsc::Sender<SpawnRequest>> {
    let (tx, rx) = mpsc::channel::<SpawnRequest>();
    let started = std::thread::Builder::new()
        .name("valkey-testkit-spawner".into())
        .spawn(move || {
            // Runs until the process exits: the sender lives in a static and is never dropped.
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
        });
    started.ok().map(|_| tx)
}

/// `kill -s NAME pid...` in one run: every pid gets the signal at about the same moment. Pids
/// that are gone by then are skipped (a process may exit while the caller collects pids).
pub(crate) fn signal_pids(pids: &[u32], name: &str) -> Result<()> {
    if pids.is_empty() {
        return Ok(());
    }
    Command::new("kill")
        .args(["-s", name])
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status()
        .context("running kill")?;
    Ok(())
}

/// `kill -s NAME pid` via the `kill` binary: the crate forbids `unsafe`, so no libc.
fn send_signal(pid: u32, name: &str) -> Result<()> {
    let status = Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill -s {name} {pid} failed ({status})");
    }
    Ok(())
}

fn tail(path: &Path, n: usize) -> String {
    // Lossy: a log with invalid UTF-8 still deserves a look.
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
