//! Probe and lifecycle-hook actions, and the kubelet's probe bookkeeping.
//!
//! Actions: `httpGet` (HTTP only, against `host` or the pod IP; success = status 200..=399),
//! `tcpSocket` (connect), `exec` (run on the host inside the pod's cgroup, so the pod's network
//! faults apply to it as to the container; see [`super::spec`] for how the program is found; with
//! the container's environment and `127.0.0.1`/`localhost` arguments rewritten to the pod IP;
//! success = exit 0) and, for hooks, `sleep`. `httpGet` and `tcpSocket` come from the test
//! process (source 127.0.0.1), as the kubelet's come from its node.

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Container, ExecAction, HTTPGetAction, LifecycleHandler, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::spec::{host_program, localize, resolve_port};
use crate::Result;
use crate::k8s::util::http_get;

/// Something the kubelet does against a container.
#[derive(Clone, Debug)]
pub(crate) enum Action {
    HttpGet { addr: SocketAddr, path: String },
    Tcp { addr: SocketAddr },
    Exec { argv: Vec<String> },
    Sleep(Duration),
}

impl Action {
    /// The action of a probe; `None` for a probe type the harness does not run (gRPC).
    pub fn of_probe(probe: &Probe, container: &Container, ip: Ipv4Addr) -> Result<Option<Self>> {
        if let Some(get) = &probe.http_get {
            return http(get, container, ip).map(Some);
        }
        if let Some(tcp) = &probe.tcp_socket {
            let addr = address(tcp.host.as_deref(), ip, &tcp.port, container)?;
            return Ok(Some(Self::Tcp { addr }));
        }
        if let Some(exec) = &probe.exec {
            return Ok(Some(exec_action(exec, ip)));
        }
        Ok(None)
    }

    /// The action of a lifecycle hook (`preStop`, `postStart`).
    pub fn of_hook(
        handler: &LifecycleHandler,
        container: &Container,
        ip: Ipv4Addr,
    ) -> Result<Self> {
        if let Some(get) = &handler.http_get {
            return http(get, container, ip);
        }
        if let Some(exec) = &handler.exec {
            return Ok(exec_action(exec, ip));
        }
        if let Some(tcp) = &handler.tcp_socket {
            let addr = address(tcp.host.as_deref(), ip, &tcp.port, container)?;
            return Ok(Self::Tcp { addr });
        }
        if let Some(sleep) = &handler.sleep {
            let secs = u64::try_from(sleep.seconds).unwrap_or(0);
            return Ok(Self::Sleep(Duration::from_secs(secs)));
        }
        bail!("hook of container {} has no action", container.name)
    }

    /// Runs the action within `timeout`: `Ok(what happened)` on success, `Err` on failure.
    pub async fn run(&self, timeout: Duration, exec: &ExecIn<'_>) -> Result<String> {
        match self {
            Self::HttpGet { addr, path } => {
                let (code, body) = http_get(*addr, path, timeout).await?;
                if !(200..400).contains(&code) {
                    bail!("HTTP {code}: {}", body.trim());
                }
                Ok(format!("HTTP {code}"))
            }
            Self::Tcp { addr } => {
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr))
                    .await
                    .with_context(|| format!("connecting to {addr} timed out"))??;
                Ok("connected".into())
            }
            Self::Exec { argv } => run_exec(argv, timeout, exec).await,
            Self::Sleep(d) => {
                tokio::time::sleep((*d).min(timeout)).await;
                Ok(format!("slept {d:?}"))
            }
        }
    }

    /// A short description, e.g. `httpGet http://127.1.0.1:9736/livez`.
    pub fn describe(&self) -> String {
        match self {
            Self::HttpGet { addr, path } => format!("httpGet http://{addr}{path}"),
            Self::Tcp { addr } => format!("tcpSocket {addr}"),
            Self::Exec { argv } => format!("exec {argv:?}"),
            Self::Sleep(d) => format!("sleep {d:?}"),
        }
    }
}

fn http(get: &HTTPGetAction, container: &Container, ip: Ipv4Addr) -> Result<Action> {
    if get.scheme.as_deref().is_some_and(|s| s != "HTTP") {
        bail!("only HTTP probes and hooks are supported");
    }
    let addr = address(get.host.as_deref(), ip, &get.port, container)?;
    let path = get.path.clone().unwrap_or_else(|| "/".into());
    Ok(Action::HttpGet { addr, path })
}

fn address(
    host: Option<&str>,
    ip: Ipv4Addr,
    port: &IntOrString,
    c: &Container,
) -> Result<SocketAddr> {
    let port = resolve_port(port, c)?;
    let ip = match host {
        Some(h) if !h.is_empty() => localize(h, ip)
            .parse::<IpAddr>()
            .with_context(|| format!("probe host {h} is not an IP address"))?,
        _ => IpAddr::V4(ip),
    };
    Ok(SocketAddr::new(ip, port))
}

fn exec_action(exec: &ExecAction, ip: Ipv4Addr) -> Action {
    let argv = exec
        .command
        .iter()
        .flatten()
        .map(|a| localize(a, ip))
        .collect();
    Action::Exec { argv }
}

/// Where an `exec` runs: with the container's environment, inside its pod's cgroup.
pub(crate) struct ExecIn<'a> {
    pub env: &'a [(String, String)],
    pub binaries: &'a HashMap<&'static str, PathBuf>,
    /// The pod cgroup's `cgroup.procs`, when pods have cgroups.
    pub cgroup: Option<&'a Path>,
}

/// The command for `argv` as `exec` runs it (see [`ExecIn`]); killed when dropped.
pub(crate) fn exec_command(argv: &[String], exec: &ExecIn<'_>) -> Result<tokio::process::Command> {
    let (program, args) = argv.split_first().context("exec without a command")?;
    let program = host_program(program, exec.binaries).into_os_string();
    let args = args.iter().map(OsString::from).collect();
    let (program, args) = in_cgroup(exec.cgroup, program, args);
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(exec.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    Ok(cmd)
}

/// `program args` run from a shell that first moves itself into the cgroup whose `cgroup.procs`
/// is `procs`, then execs: everything the program starts, every socket it opens, belongs to the
/// pod. Unchanged without a cgroup.
pub(crate) fn in_cgroup(
    procs: Option<&Path>,
    program: OsString,
    args: Vec<OsString>,
) -> (OsString, Vec<OsString>) {
    let procs: Vec<PathBuf> = procs.map(Path::to_path_buf).into_iter().collect();
    in_cgroups(&procs, program, args)
}

/// [`in_cgroup`] for several cgroups at once (the pod's, and a container's memory cgroup of
/// another hierarchy): the shell joins each, then execs.
pub(crate) fn in_cgroups(
    procs: &[PathBuf],
    program: OsString,
    args: Vec<OsString>,
) -> (OsString, Vec<OsString>) {
    if procs.is_empty() {
        return (program, args);
    }
    // `$0` is how many `cgroup.procs` files follow, then the command.
    let script = r#"n=$0; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift; n=$((n - 1)); done; exec "$@""#;
    let mut wrapped: Vec<OsString> =
        vec!["-c".into(), script.into(), procs.len().to_string().into()];
    wrapped.extend(procs.iter().map(|p| p.as_os_str().to_owned()));
    wrapped.push(program);
    wrapped.extend(args);
    ("sh".into(), wrapped)
}

async fn run_exec(argv: &[String], timeout: Duration, exec: &ExecIn<'_>) -> Result<String> {
    let mut cmd = exec_command(argv, exec)?;
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .with_context(|| format!("{argv:?} timed out after {timeout:?}"))?
        .with_context(|| format!("running {argv:?}"))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() {
        bail!(
            "{argv:?} failed ({}): {} {}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(format!("exit 0 {text}"))
}

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProbeKind {
    Startup,
    Liveness,
    Readiness,
}

/// The API's defaults for a probe's fields (what a pod created through the API carries).
const DEFAULT_PERIOD_SECONDS: i32 = 10;
const DEFAULT_TIMEOUT_SECONDS: i32 = 1;
const DEFAULT_FAILURE_THRESHOLD: i32 = 3;

/// The kubelet's floor for `periodSeconds` and `timeoutSeconds` (validation rejects less).
const MIN_PROBE_SECONDS: u64 = 1;

/// One probe of one container: schedule, thresholds and consecutive results, like the kubelet's
/// prober workers.
#[derive(Debug)]
pub(crate) struct Prober {
    pub kind: ProbeKind,
    pub action: Action,
    period: Duration,
    pub timeout: Duration,
    initial_delay: Duration,
    success_threshold: u32,
    failure_threshold: u32,
    successes: u32,
    failures: u32,
    next_due: Option<Instant>,
    /// A run of this probe has not reported back yet: the next waits for it, as a prober worker
    /// runs one probe at a time.
    in_flight: bool,
    /// Counts container (re)starts, so a result from before a restart is ignored.
    pub generation: u64,
    /// The probe's verdict: readiness and startup start failing, liveness starts passing.
    pub passing: bool,
    pub last_error: Option<String>,
}

/// `seconds` as a duration, `default` when unset, at least `min` seconds.
fn seconds(value: Option<i32>, default: i32, min: u64) -> Duration {
    let secs = value.unwrap_or(default);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0).max(min))
}

impl Prober {
    /// The probe as the pod specifies it: `periodSeconds`, `timeoutSeconds`,
    /// `initialDelaySeconds`, `successThreshold` and `failureThreshold`, the API's defaults for
    /// what is unset, and period and timeout at least 1 s as in the kubelet.
    pub fn new(kind: ProbeKind, probe: &Probe, action: Action) -> Self {
        let count =
            |v: Option<i32>, default: i32| u32::try_from(v.unwrap_or(default)).unwrap_or(1).max(1);
        Self {
            kind,
            action,
            period: seconds(
                probe.period_seconds,
                DEFAULT_PERIOD_SECONDS,
                MIN_PROBE_SECONDS,
            ),
            timeout: seconds(
                probe.timeout_seconds,
                DEFAULT_TIMEOUT_SECONDS,
                MIN_PROBE_SECONDS,
            ),
            initial_delay: seconds(probe.initial_delay_seconds, 0, 0),
            success_threshold: count(probe.success_threshold, 1),
            failure_threshold: count(probe.failure_threshold, DEFAULT_FAILURE_THRESHOLD),
            successes: 0,
            failures: 0,
            next_due: None,
            in_flight: false,
            generation: 0,
            passing: kind == ProbeKind::Liveness,
            last_error: None,
        }
    }

    /// Starts over for a (re)started container.
    pub fn reset(&mut self, container_started: Instant) {
        self.successes = 0;
        self.failures = 0;
        self.passing = self.kind == ProbeKind::Liveness;
        self.next_due = Some(container_started + self.initial_delay);
        self.in_flight = false;
        self.generation += 1;
        self.last_error = None;
    }

    pub fn due(&self, now: Instant) -> bool {
        !self.in_flight && self.next_due.is_some_and(|at| now >= at)
    }

    /// A run starts `now`; [`Self::record`] ends it. The next run is due on the next tick of a
    /// ticker with the probe's period, as with the kubelet's prober workers: a run that starts
    /// late or takes long does not shift the schedule, ticks missed meanwhile are skipped.
    pub fn begin(&mut self, now: Instant) {
        self.in_flight = true;
        let mut next = self.next_due.unwrap_or(now);
        while next <= now {
            next += self.period;
        }
        self.next_due = Some(next);
    }

    /// Records the result of a run; returns `true` if the verdict flipped to failing past the
    /// threshold (for liveness and startup: restart the container).
    pub fn record(&mut self, result: Result<String>) -> bool {
        self.in_flight = false;
        match result {
            Ok(_) => {
                self.failures = 0;
                self.successes += 1;
                self.last_error = None;
                if self.successes >= self.success_threshold {
                    self.passing = true;
                }
                false
            }
            Err(e) => {
                self.successes = 0;
                self.failures += 1;
                self.last_error = Some(format!("{e:#}"));
                let tripped = self.failures >= self.failure_threshold;
                match self.kind {
                    ProbeKind::Readiness if tripped => self.passing = false,
                    ProbeKind::Liveness if tripped => self.passing = false,
                    _ => {}
                }
                tripped && self.kind != ProbeKind::Readiness
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn prober(kind: ProbeKind) -> Prober {
        let probe = Probe {
            failure_threshold: Some(2),
            ..Probe::default()
        };
        let action = Action::Sleep(Duration::ZERO);
        let mut p = Prober::new(kind, &probe, action);
        p.reset(Instant::now());
        p
    }

    #[test]
    fn readiness_needs_a_success_and_fails_after_the_threshold() {
        let mut p = prober(ProbeKind::Readiness);
        let now = Instant::now();
        assert!(!p.passing && p.due(now));
        p.begin(now);
        p.record(Ok(String::new()));
        assert!(p.passing && !p.due(now));
        assert!(!p.record(Err(anyhow::anyhow!("503"))));
        assert!(p.passing, "one failure is below the threshold");
        p.record(Err(anyhow::anyhow!("503")));
        assert!(!p.passing);
    }

    #[test]
    fn liveness_trips_a_restart_after_the_threshold() {
        let mut p = prober(ProbeKind::Liveness);
        assert!(p.passing);
        assert!(!p.record(Err(anyhow::anyhow!("down"))));
        assert!(p.record(Err(anyhow::anyhow!("down"))));
    }

    #[test]
    fn periods_and_timeouts_come_from_the_pod_with_a_floor_of_a_second() {
        let action = || Action::Sleep(Duration::ZERO);
        let given = Probe {
            period_seconds: Some(2),
            timeout_seconds: Some(3),
            initial_delay_seconds: Some(4),
            ..Probe::default()
        };
        let p = Prober::new(ProbeKind::Readiness, &given, action());
        assert_eq!(
            (p.period, p.timeout, p.initial_delay),
            (2 * SECOND, 3 * SECOND, 4 * SECOND)
        );
        let unset = Prober::new(ProbeKind::Readiness, &Probe::default(), action());
        assert_eq!((unset.period, unset.timeout), (10 * SECOND, SECOND));
        assert_eq!(unset.failure_threshold, 3);
        let zero = Probe {
            period_seconds: Some(0),
            timeout_seconds: Some(-1),
            ..Probe::default()
        };
        let floor = Prober::new(ProbeKind::Liveness, &zero, action());
        assert_eq!((floor.period, floor.timeout), (SECOND, SECOND));
    }

    #[test]
    fn runs_follow_a_ticker_one_at_a_time() {
        let probe = Probe {
            period_seconds: Some(2),
            initial_delay_seconds: Some(1),
            ..Probe::default()
        };
        let mut p = Prober::new(ProbeKind::Readiness, &probe, Action::Sleep(Duration::ZERO));
        let t0 = Instant::now();
        p.reset(t0);
        assert!(!p.due(t0) && p.due(t0 + SECOND), "initial delay");
        // Started 0.3 s late: the next run is still due on the tick, 2 s after the first.
        let late = t0 + SECOND + SECOND * 3 / 10;
        p.begin(late);
        assert!(!p.due(late + 5 * SECOND), "one run at a time");
        p.record(Ok(String::new()));
        assert!(!p.due(t0 + 3 * SECOND - SECOND / 10));
        assert!(p.due(t0 + 3 * SECOND));
        // A run that took longer than a period skips the ticks it missed.
        let slow = t0 + 3 * SECOND;
        p.begin(slow);
        p.record(Ok(String::new()));
        assert!(!p.due(slow + SECOND), "not twice in a row");
        assert!(p.due(slow + 2 * SECOND));
    }
}
