//! One container of a process-backed pod: its process, its probes and what its status reports.

use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::jiff::Timestamp;

use super::backoff::CrashLoop;
use super::memory::{MemoryCgroup, peak_of_process};
use super::probe::{Action, ProbeKind, Prober, in_cgroups};
use super::spec::{Kind, command_line, split_wrapper, valkey_args};
use crate::Result;
use crate::net::lock;
use crate::process::{ProcessSpec, ServerProcess};

/// A container's soft open-file limit, as containerd 2 leaves it (its unit no longer raises
/// `LimitNOFILE`, so containers get the host default `1024:524288`; the hard limit here stays the
/// test process's). A program that needs more must raise its own, as Valkey does.
const OPEN_FILES: &str = "--nofile=1024:";

/// A finished run of the container.
#[derive(Clone, Debug)]
pub(crate) struct Terminated {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
    /// Why, when the harness says more than the exit code (an init container it skipped).
    pub message: Option<String>,
}

/// A container's place in the pod's life (KEP-753 sidecar containers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// An `initContainers` entry without `restartPolicy`: runs to completion before the next.
    Init,
    /// An `initContainers` entry with `restartPolicy: Always`: a native sidecar, started before
    /// the next container, running beside the main containers, stopped after them.
    Sidecar,
    /// A `containers` entry.
    Main,
}

impl Class {
    pub fn of_init(spec: &Container) -> Self {
        if spec.restart_policy.as_deref() == Some("Always") {
            Self::Sidecar
        } else {
            Self::Init
        }
    }

    /// Whether a run that ended with `exit_code` is restarted under the pod's `restartPolicy`: a
    /// sidecar always is, a regular init container until it succeeds (unless `Never`), a main
    /// container per policy.
    pub fn restarts(self, pod_policy: &str, exit_code: i32) -> bool {
        match (self, pod_policy) {
            (Self::Sidecar, _) => true,
            (Self::Init, "Never") => false,
            (Self::Init, _) => exit_code != 0,
            (Self::Main, "Never") => false,
            (Self::Main, "OnFailure") => exit_code != 0,
            (Self::Main, _) => true,
        }
    }
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
    /// When the current run ended, as the back-off counts it.
    pub exited_at: Option<Instant>,
    pub crash_loop: CrashLoop,
    /// A liveness or startup probe failed past its threshold: the next sync pass kills the
    /// container (the probe runs apart from the sync loop, which decides on restarts).
    pub probe_kill: bool,
    pub probers: Vec<Prober>,
    /// The pid of the latest run, for `containerID`.
    pub last_pid: Option<u32>,
    /// The memory cgroup's OOM kills counted so far: one more at an exit makes it `OOMKilled`.
    pub oom_kills: u64,
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

/// A container's memory use (see `ContainerRuntime::memory_use`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUse {
    /// The most it used at once, in bytes.
    pub peak: u64,
    /// Its enforced limit, when the harness enforces one.
    pub limit: Option<u64>,
    /// How many of its processes the kernel killed for the limit.
    pub oom_kills: u64,
}

/// What a container is made of, once its environment and volume paths are resolved.
pub(crate) struct Setup {
    /// The spec with volume paths rewritten (see [`super::volume::Mounts`]).
    pub spec: Container,
    pub class: Class,
    pub kind: Kind,
    pub env: Vec<(String, String)>,
    /// `namespace/pod/container`, in diagnostics.
    pub label: String,
    /// `None`: the harness cannot run this image (see [`Kind`]).
    pub program: Option<PathBuf>,
    /// The pod cgroup's `cgroup.procs`: the process joins it before it execs.
    pub cgroup: Option<PathBuf>,
    /// The pods' `cpu` cgroup's `cgroup.procs` (see [`super::cpu`]), joined the same way.
    pub cpu: Option<PathBuf>,
    /// The container's memory cgroup, with `resources.limits.memory` (see [`super::memory`]).
    pub memory: Option<MemoryCgroup>,
}

/// A probe run the sync pass hands to its own task.
pub(crate) struct DueProbe {
    pub index: usize,
    /// Of the container run it probes (see [`Prober::generation`]).
    pub generation: u64,
    pub action: Action,
    pub timeout: Duration,
}

/// A container: spec, resolved environment and command line, and its process once started.
pub(crate) struct ContainerRuntime {
    pub name: String,
    pub spec: Container,
    pub class: Class,
    pub kind: Kind,
    pub env: Vec<(String, String)>,
    /// `namespace/pod/container`, in diagnostics.
    pub label: String,
    /// `None`: the harness cannot run this image (see [`Kind`]).
    program: Option<PathBuf>,
    cgroup: Option<PathBuf>,
    cpu: Option<PathBuf>,
    memory: Option<MemoryCgroup>,
    ip: Ipv4Addr,
    process: Mutex<Option<Arc<ServerProcess>>>,
    pub state: Mutex<ContainerState>,
}

impl ContainerRuntime {
    pub fn new(setup: Setup, ip: Ipv4Addr) -> Result<Self> {
        let Setup {
            spec,
            class,
            kind,
            env,
            label,
            program,
            cgroup,
            cpu,
            memory,
        } = setup;
        let mut probers = Vec::new();
        let probes = [
            (ProbeKind::Startup, &spec.startup_probe),
            (ProbeKind::Liveness, &spec.liveness_probe),
            (ProbeKind::Readiness, &spec.readiness_probe),
        ];
        for (kind, probe) in probes {
            let Some(probe) = probe else { continue };
            if let Some(action) = Action::of_probe(probe, &spec, ip)? {
                probers.push(Prober::new(kind, probe, action));
            }
        }
        let state = ContainerState {
            probers,
            ..ContainerState::default()
        };
        Ok(Self {
            name: spec.name.clone(),
            spec,
            class,
            kind,
            env,
            label,
            program,
            cgroup,
            cpu,
            memory,
            ip,
            process: Mutex::new(None),
            state: Mutex::new(state),
        })
    }

    /// Whether the harness can run this container at all.
    pub fn runnable(&self) -> bool {
        self.program.is_some()
    }

    /// Not started yet, nor given up on (a failed start leaves a `waiting` reason).
    pub fn untried(&self) -> bool {
        let state = lock(&self.state);
        state.last_pid.is_none() && state.waiting.is_none() && state.terminated.is_none()
    }

    /// For an init container: whether the next container may start. A regular one must have
    /// completed (exit 0); a sidecar must be started (running, startup probe passed). A sidecar
    /// the harness cannot run holds nothing up: it waits (`UnsupportedImage`) and keeps the pod
    /// unready, as an unrunnable main container does.
    pub fn init_passed(&self) -> bool {
        let state = lock(&self.state);
        match self.class {
            Class::Sidecar => state.started() || !self.runnable(),
            Class::Init | Class::Main => {
                state.running_since.is_none()
                    && state.terminated.as_ref().is_some_and(|t| t.exit_code == 0)
            }
        }
    }

    /// Records a regular init container the harness cannot run as completed, with `why`.
    pub fn skip(&self, why: String) {
        let now = Timestamp::now();
        lock(&self.state).terminated = Some(Terminated {
            exit_code: 0,
            signal: None,
            reason: "Completed".into(),
            started_at: Some(now),
            finished_at: now,
            message: Some(why),
        });
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
        let now = Instant::now();
        if let Some(previous) = state.terminated.take() {
            state.last_terminated = Some(previous);
            state.restart_count += 1;
            let exited = state.exited_at.unwrap_or(now);
            state.crash_loop.restarted(exited, now);
        }
        state.running_since = Some(Timestamp::now());
        state.waiting = None;
        state.restart_at = None;
        state.exited_at = None;
        state.probe_kill = false;
        state.last_pid = Some(process.pid());
        for p in &mut state.probers {
            p.reset(now);
        }
        Ok(())
    }

    /// Starts the container's process: in its pod's cgroup, with its environment and with the
    /// open-file limit a container gets from containerd 2 ([`OPEN_FILES`]).
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
        let (program, args, log) = match self.kind {
            Kind::Valkey => {
                let (program, args) = wrapped(program, &tokens, self.ip, dir.path());
                (program, args, dir.path().join("valkey.log"))
            }
            Kind::Pause => (
                program,
                vec!["infinity".into()],
                dir.path().join("output.log"),
            ),
            // The agent: `command[0]` names the program (the image's entrypoint); everything
            // after it and `args` pass through.
            _ => {
                let skip = usize::from(self.spec.command.as_ref().is_some_and(|c| !c.is_empty()));
                let args = tokens.iter().skip(skip).map(Into::into).collect();
                (program, args, dir.path().join("output.log"))
            }
        };
        let cgroups: Vec<PathBuf> = self
            .cgroup
            .iter()
            .chain(&self.cpu)
            .cloned()
            .chain(self.memory.as_ref().map(MemoryCgroup::procs))
            .collect();
        let (program, args) =
            in_cgroups(&cgroups, "env".into(), env_args(&self.env, &program, args));
        let mut limited: Vec<OsString> = vec![OPEN_FILES.into(), "--".into(), program];
        limited.extend(args);
        let spec = ProcessSpec {
            program: PathBuf::from("prlimit"),
            args: limited,
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
        let mut terminated = terminated(status, state.running_since.take());
        // As the kubelet reports it: killed by the kernel for the container's memory limit.
        if let Some(memory) = &self.memory {
            let kills = memory.oom_kills();
            if kills > state.oom_kills && terminated.signal == Some(9) {
                terminated.reason = "OOMKilled".into();
            }
            state.oom_kills = kills;
        }
        // As the kubelet does: a failed container's last output is its message when it asks.
        let fallback =
            self.spec.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
        if fallback && terminated.exit_code != 0 {
            terminated.message = Some(log_message(&process.log_tail(80)));
        }
        state.terminated = Some(terminated.clone());
        state.exited_at = Some(Instant::now());
        Some(terminated)
    }

    /// The pod cgroup's `cgroup.procs`, when pods have cgroups.
    pub fn cgroup(&self) -> Option<&Path> {
        self.cgroup.as_deref()
    }

    /// The container's memory use: its cgroup's peak and limit where limits are enforced, else
    /// the running process's peak resident set.
    pub fn memory_use(&self) -> Option<MemoryUse> {
        if let Some(memory) = &self.memory {
            return Some(MemoryUse {
                peak: memory.peak()?,
                limit: Some(memory.limit()),
                oom_kills: memory.oom_kills(),
            });
        }
        let peak = peak_of_process(self.pid()?)?;
        Some(MemoryUse {
            peak,
            limit: None,
            oom_kills: 0,
        })
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

    /// Probes that are due now, marked as running: one [`DueProbe`] each.
    pub fn due_probes(&self, now: Instant) -> Vec<DueProbe> {
        let mut state = lock(&self.state);
        if state.running_since.is_none() {
            return Vec::new();
        }
        let startup_pending = state.verdict(ProbeKind::Startup) == Some(false);
        let mut due = Vec::new();
        for (index, p) in state.probers.iter_mut().enumerate() {
            // Liveness and readiness wait for the startup probe, as in the kubelet.
            let waits = p.kind != ProbeKind::Startup && startup_pending;
            let done = p.kind == ProbeKind::Startup && p.passing;
            if !p.due(now) || waits || done {
                continue;
            }
            p.begin(now);
            due.push(DueProbe {
                index,
                generation: p.generation,
                action: p.action.clone(),
                timeout: p.timeout,
            });
        }
        due
    }

    /// Records the result of a probe run. A result from before the latest (re)start is dropped.
    /// A liveness or startup probe failing past its threshold marks the container for a kill
    /// ([`ContainerState::probe_kill`]).
    pub fn record_probe(&self, probe: &DueProbe, result: Result<String>) {
        let mut state = lock(&self.state);
        let Some(p) = state.probers.get_mut(probe.index) else {
            return;
        };
        if p.generation != probe.generation {
            return;
        }
        if p.record(result) {
            state.probe_kill = true;
        }
    }

    /// The node rebooted: the back-off history is gone (the kubelet keeps it in memory), so a
    /// container waiting out a back-off starts at once.
    pub fn rebooted(&self) {
        let mut state = lock(&self.state);
        state.crash_loop.forget();
        if state.restart_at.is_some() {
            state.restart_at = Some(Instant::now());
        }
    }

    /// Whether a probe asked for the container to be killed; clears the request.
    pub fn take_probe_kill(&self) -> bool {
        std::mem::take(&mut lock(&self.state).probe_kill)
    }
}

/// `env -i NAME=value... program args...`: the process gets exactly the pod's environment.
/// (`ProcessSpec` has no environment of its own; `env` execs, so the pid stays the program's.)
/// A Valkey container's program and arguments. The chart's runs `valkey-sidecar await … --
/// valkey-server …` (the binary an init container copied into a volume, here at its rewritten
/// path): that program runs with its own arguments, then `--`, this harness's `valkey-server` and
/// the Valkey arguments it execs into.
fn wrapped(
    valkey: PathBuf,
    tokens: &[String],
    ip: Ipv4Addr,
    dir: &Path,
) -> (PathBuf, Vec<OsString>) {
    match split_wrapper(tokens) {
        (Some(wrapper), rest) => {
            let mut args: Vec<OsString> = wrapper[1..].iter().map(Into::into).collect();
            args.push("--".into());
            args.push(valkey.into_os_string());
            args.extend(valkey_args(rest, ip, dir));
            (PathBuf::from(&wrapper[0]), args)
        }
        (None, all) => (valkey, valkey_args(all, ip, dir)),
    }
}

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

/// The kubelet's cap on a log-based termination message: its last 2048 bytes.
fn log_message(tail: &str) -> String {
    let mut start = tail.len().saturating_sub(2048);
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_owned()
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
        message: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecars_restart_whatever_the_pod_policy() {
        for policy in ["Always", "OnFailure", "Never"] {
            assert!(Class::Sidecar.restarts(policy, 0), "{policy}");
            assert!(Class::Sidecar.restarts(policy, 1), "{policy}");
        }
    }

    #[test]
    fn init_containers_retry_until_success_unless_never() {
        assert!(!Class::Init.restarts("Always", 0));
        assert!(Class::Init.restarts("Always", 1));
        assert!(Class::Init.restarts("OnFailure", 1));
        assert!(!Class::Init.restarts("Never", 1));
    }

    #[test]
    fn main_containers_follow_the_pod_policy() {
        assert!(Class::Main.restarts("Always", 0));
        assert!(!Class::Main.restarts("OnFailure", 0));
        assert!(Class::Main.restarts("OnFailure", 2));
        assert!(!Class::Main.restarts("Never", 2));
    }

    #[test]
    fn restart_policy_always_makes_an_init_container_a_sidecar() {
        let mut spec = Container::default();
        assert_eq!(Class::of_init(&spec), Class::Init);
        spec.restart_policy = Some("Always".into());
        assert_eq!(Class::of_init(&spec), Class::Sidecar);
    }
}
