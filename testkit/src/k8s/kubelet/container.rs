//! One container of a process-backed pod: its process, its probes and what its status reports.

use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::jiff::Timestamp;

use super::probe::{Action, ProbeKind, Prober};
use super::spec::{Kind, command_line, valkey_args};
use crate::Result;
use crate::net::lock;
use crate::process::{ProcessSpec, ServerProcess};

/// A finished run of the container.
#[derive(Clone, Debug)]
pub(crate) struct Terminated {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
}

/// What the container's status reports, and when it restarts.
#[derive(Debug, Default)]
pub(crate) struct ContainerState {
    pub restart_count: i32,
    /// Set while the process runs.
    pub running_since: Option<Timestamp>,
    /// The current run ended and the container waits for its restart (or for good).
    pub terminated: Option<Terminated>,
    /// The previous run, once there was one (`lastState`).
    pub last_terminated: Option<Terminated>,
    /// Why the container is not running: reason and message.
    pub waiting: Option<(String, String)>,
    pub restart_at: Option<Instant>,
    pub probers: Vec<Prober>,
    /// The pid of the latest run, for `containerID`.
    pub last_pid: Option<u32>,
}

impl ContainerState {
    fn verdict(&self, kind: ProbeKind) -> Option<bool> {
        self.probers
            .iter()
            .find(|p| p.kind == kind)
            .map(|p| p.passing)
    }

    /// Started: running, and the startup probe (if any) has passed.
    pub fn started(&self) -> bool {
        self.running_since.is_some() && self.verdict(ProbeKind::Startup).unwrap_or(true)
    }

    /// Ready: started, and the readiness probe (if any) passes.
    pub fn ready(&self) -> bool {
        self.started() && self.verdict(ProbeKind::Readiness).unwrap_or(true)
    }
}

/// A container: spec, resolved environment and command line, and its process once started.
pub(crate) struct ContainerRuntime {
    pub name: String,
    pub spec: Container,
    pub kind: Kind,
    pub env: Vec<(String, String)>,
    /// `namespace/pod/container`, in diagnostics.
    pub label: String,
    /// `None`: the harness cannot run this image (see [`Kind`]).
    program: Option<PathBuf>,
    ip: Ipv4Addr,
    process: Mutex<Option<Arc<ServerProcess>>>,
    pub state: Mutex<ContainerState>,
}

impl ContainerRuntime {
    pub fn new(
        spec: Container,
        kind: Kind,
        env: Vec<(String, String)>,
        label: String,
        program: Option<PathBuf>,
        ip: Ipv4Addr,
        probe_period: Option<Duration>,
    ) -> Result<Self> {
        let mut probers = Vec::new();
        let probes = [
            (ProbeKind::Startup, &spec.startup_probe),
            (ProbeKind::Liveness, &spec.liveness_probe),
            (ProbeKind::Readiness, &spec.readiness_probe),
        ];
        for (kind, probe) in probes {
            let Some(probe) = probe else { continue };
            if let Some(action) = Action::of_probe(probe, &spec, ip)? {
                probers.push(Prober::new(kind, probe, action, probe_period));
            }
        }
        let state = ContainerState {
            probers,
            ..ContainerState::default()
        };
        Ok(Self {
            name: spec.name.clone(),
            spec,
            kind,
            env,
            label,
            program,
            ip,
            process: Mutex::new(None),
            state: Mutex::new(state),
        })
    }

    /// Whether the harness can run this container at all.
    pub fn runnable(&self) -> bool {
        self.program.is_some()
    }

    /// Starts the process: the first time in a fresh dir, later again in the same dir (like a
    /// container restart, which keeps the pod's volumes).
    pub fn start(&self) -> Result<()> {
        let existing = lock(&self.process).clone();
        let process = match existing {
            Some(p) => {
                p.relaunch()?;
                p
            }
            None => {
                let p = Arc::new(self.spawn()?);
                *lock(&self.process) = Some(Arc::clone(&p));
                p
            }
        };
        let mut state = lock(&self.state);
        if let Some(previous) = state.terminated.take() {
            state.last_terminated = Some(previous);
            state.restart_count += 1;
        }
        state.running_since = Some(Timestamp::now());
        state.waiting = None;
        state.restart_at = None;
        state.last_pid = Some(process.pid());
        let now = Instant::now();
        for p in &mut state.probers {
            p.reset(now);
        }
        Ok(())
    }

    fn spawn(&self) -> Result<ServerProcess> {
        let program = self.program.clone().with_context(|| {
            format!(
                "{}: image {:?} is not runnable",
                self.label, self.spec.image
            )
        })?;
        let dir = tempfile::Builder::new()
            .prefix("valkey-testkit-pod-")
            .tempdir()
            .context("creating a container dir")?;
        let tokens = command_line(&self.spec, &self.env);
        let (args, log) = match self.kind {
            Kind::Valkey => (
                valkey_args(&tokens, self.ip, dir.path()),
                dir.path().join("valkey.log"),
            ),
            Kind::Pause => (vec!["infinity".into()], dir.path().join("output.log")),
            // The agent: `command[0]` names the program (the image's entrypoint); everything
            // after it and `args` pass through.
            _ => {
                let skip = usize::from(self.spec.command.as_ref().is_some_and(|c| !c.is_empty()));
                let args = tokens.iter().skip(skip).map(Into::into).collect();
                (args, dir.path().join("output.log"))
            }
        };
        let spec = ProcessSpec {
            program: PathBuf::from("env"),
            args: env_args(&self.env, &program, args),
            label: self.label.clone(),
        };
        ServerProcess::spawn(spec, dir, log)
    }

    /// If the process ended since the last check: records the run as terminated and returns it.
    pub fn check_exit(&self) -> Option<Terminated> {
        let process = lock(&self.process).clone()?;
        let mut state = lock(&self.state);
        state.running_since?;
        let status = process.exit_status()?;
        let terminated = terminated(status, state.running_since.take());
        state.terminated = Some(terminated.clone());
        Some(terminated)
    }

    /// The pid while the process runs.
    pub fn pid(&self) -> Option<u32> {
        let process = lock(&self.process).clone()?;
        process.is_running().then(|| process.pid())
    }

    /// SIGKILL (a crash, or a kubelet giving up on it). A no-op if not running.
    pub fn kill(&self) -> Result<()> {
        match lock(&self.process).clone() {
            Some(p) => p.kill(),
            None => Ok(()),
        }
    }

    /// Sends a signal (`STOP`, `CONT`, ...) if the process runs.
    pub fn signal(&self, name: &str) -> Result<()> {
        match lock(&self.process).clone() {
            Some(p) if p.is_running() => p.signal(name),
            _ => Ok(()),
        }
    }

    /// SIGTERM, then SIGKILL after `grace` (blocking). `Ok(false)` if SIGKILL was needed.
    pub fn terminate_blocking(&self, grace: Duration) -> bool {
        match lock(&self.process).clone() {
            Some(p) => p.terminate(grace).is_ok(),
            None => true,
        }
    }

    /// The last `n` lines of the process's log.
    pub fn log_tail(&self, n: usize) -> String {
        lock(&self.process)
            .as_ref()
            .map(|p| p.diagnostics(n))
            .unwrap_or_default()
    }

    /// Probes that are due now: index, action and timeout.
    pub fn due_probes(&self, now: Instant) -> Vec<(usize, Action, Duration)> {
        let state = lock(&self.state);
        if state.running_since.is_none() {
            return Vec::new();
        }
        let startup_pending = state.verdict(ProbeKind::Startup) == Some(false);
        state
            .probers
            .iter()
            .enumerate()
            // Liveness and readiness wait for the startup probe, as in the kubelet.
            .filter(|(_, p)| p.due(now) && (p.kind == ProbeKind::Startup || !startup_pending))
            .filter(|(_, p)| !(p.kind == ProbeKind::Startup && p.passing))
            .map(|(i, p)| (i, p.action.clone(), p.timeout))
            .collect()
    }

    /// Records a probe result; `true` if the container must be restarted (liveness or startup
    /// failed past the threshold).
    pub fn record_probe(&self, index: usize, result: Result<String>) -> bool {
        let mut state = lock(&self.state);
        state
            .probers
            .get_mut(index)
            .is_some_and(|p| p.record(result, Instant::now()))
    }
}

/// `env -i NAME=value... program args...`: the process gets exactly the pod's environment.
/// (`ProcessSpec` has no environment of its own; `env` execs, so the pid stays the program's.)
fn env_args(
    env: &[(String, String)],
    program: &std::path::Path,
    args: Vec<std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = vec!["-i".into()];
    out.extend(env.iter().map(|(k, v)| format!("{k}={v}").into()));
    out.push(program.as_os_str().to_owned());
    out.extend(args);
    out
}

fn terminated(status: ExitStatus, started_at: Option<Timestamp>) -> Terminated {
    let signal = status.signal();
    let exit_code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
    let reason = if exit_code == 0 { "Completed" } else { "Error" };
    Terminated {
        exit_code,
        signal,
        reason: reason.into(),
        started_at,
        finished_at: Timestamp::now(),
    }
}
