//! Probe and lifecycle-hook actions, and the kubelet's probe bookkeeping.
//!
//! Actions: `httpGet` (HTTP only, against `host` or the pod IP; success = status 200..=399),
//! `tcpSocket` (connect), `exec` (run on the host, see [`super::spec`] for how the program is
//! found, with the container's environment and `127.0.0.1`/`localhost` arguments rewritten to the
//! pod IP; success = exit 0) and, for hooks, `sleep`.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
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
    pub async fn run(
        &self,
        timeout: Duration,
        env: &[(String, String)],
        binaries: &HashMap<&'static str, PathBuf>,
    ) -> Result<String> {
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
            Self::Exec { argv } => run_exec(argv, timeout, env, binaries).await,
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

async fn run_exec(
    argv: &[String],
    timeout: Duration,
    env: &[(String, String)],
    binaries: &HashMap<&'static str, PathBuf>,
) -> Result<String> {
    let (program, args) = argv.split_first().context("exec without a command")?;
    let mut cmd = tokio::process::Command::new(host_program(program, binaries));
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
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
    /// The probe's verdict: readiness and startup start failing, liveness starts passing.
    pub passing: bool,
    pub last_error: Option<String>,
}

impl Prober {
    /// `period_override` replaces `periodSeconds` (tests want faster probes than 1 s). Pods from
    /// the API always carry a period (the API defaults it to 10 s); 1 s applies only to specs
    /// that never went through the API.
    pub fn new(
        kind: ProbeKind,
        probe: &Probe,
        action: Action,
        period_override: Option<Duration>,
    ) -> Self {
        let secs = |v: Option<i32>, default: u64| {
            v.and_then(|s| u64::try_from(s).ok())
                .map_or(Duration::from_secs(default), Duration::from_secs)
        };
        let count = |v: Option<i32>, default: u32| {
            v.and_then(|n| u32::try_from(n).ok())
                .unwrap_or(default)
                .max(1)
        };
        Self {
            kind,
            action,
            period: period_override.unwrap_or_else(|| secs(probe.period_seconds, 1)),
            timeout: secs(probe.timeout_seconds, 1),
            initial_delay: secs(probe.initial_delay_seconds, 0),
            success_threshold: count(probe.success_threshold, 1),
            failure_threshold: count(probe.failure_threshold, 3),
            successes: 0,
            failures: 0,
            next_due: None,
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
        self.last_error = None;
    }

    pub fn due(&self, now: Instant) -> bool {
        self.next_due.is_some_and(|at| now >= at)
    }

    /// Records one result; returns `true` if the verdict flipped to failing past the threshold
    /// (for liveness and startup: restart the container).
    pub fn record(&mut self, result: Result<String>, now: Instant) -> bool {
        self.next_due = Some(now + self.period);
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

    fn prober(kind: ProbeKind) -> Prober {
        let probe = Probe {
            failure_threshold: Some(2),
            ..Probe::default()
        };
        let action = Action::Sleep(Duration::ZERO);
        let mut p = Prober::new(kind, &probe, action, Some(Duration::from_millis(100)));
        p.reset(Instant::now());
        p
    }

    #[test]
    fn readiness_needs_a_success_and_fails_after_the_threshold() {
        let mut p = prober(ProbeKind::Readiness);
        let now = Instant::now();
        assert!(!p.passing && p.due(now));
        p.record(Ok(String::new()), now);
        assert!(p.passing && !p.due(now));
        assert!(!p.record(Err(anyhow::anyhow!("503")), now));
        assert!(p.passing, "one failure is below the threshold");
        p.record(Err(anyhow::anyhow!("503")), now);
        assert!(!p.passing);
    }

    #[test]
    fn liveness_trips_a_restart_after_the_threshold() {
        let mut p = prober(ProbeKind::Liveness);
        let now = Instant::now();
        assert!(p.passing);
        assert!(!p.record(Err(anyhow::anyhow!("down")), now));
        assert!(p.record(Err(anyhow::anyhow!("down")), now));
    }
}
