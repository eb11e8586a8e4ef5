//! One process-backed pod: set-up, the sync loop (crashes, restarts, probes, status) and graceful
//! termination.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, Pod, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::watch;

use super::container::{Class, ContainerRuntime, Setup};
use super::cpu;
use super::memory::{MemoryCgroup, quantity};
use super::probe::{Action, ExecIn};
use super::spec::{Kind, PodFacts, api_credentials, harness_env, kind_of, pod_env};
use super::status::{PodView, Transitions, status_patch};
use super::terminate::terminate;
use super::volume::{Mounts, Sources, Volumes};
use super::{HookRun, Shared, StartRecord};
use crate::Result;
use crate::k8s::kubeconfig::{self, Credential};
use crate::k8s::netfault::{cgroup_pids, kill_cgroup};
use crate::k8s::pod_condition;
use crate::net::lock;
use crate::process::signal_pids;

/// A pod the kubelet runs.
pub(crate) struct PodRuntime {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub ip: Ipv4Addr,
    pub host_ip: String,
    /// The pod's own files: service-account token, kubeconfig and volumes.
    dir: TempDir,
    /// The `cgroup.procs` of the pod's cgroup, when the kubelet gives pods one.
    pub cgroup: Option<PathBuf>,
    /// Init containers in order, then the main containers.
    pub containers: Mutex<Vec<Arc<ContainerRuntime>>>,
    /// Every init container has completed or (a sidecar) started; the main containers started.
    initialized: AtomicBool,
    pub volumes: Volumes,
    start_time: Timestamp,
    transitions: Transitions,
    token_refresh_at: Mutex<Option<Instant>>,
    last_status: Mutex<Option<Value>>,
}

impl PodRuntime {
    pub fn new(
        pod: &Pod,
        node: String,
        host_ip: String,
        ip: Ipv4Addr,
        cgroup: Option<PathBuf>,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("valkey-testkit-pod-")
            .tempdir()
            .context("creating a pod dir")?;
        let volumes = Volumes::new(dir.path());
        Ok(Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            node,
            ip,
            host_ip,
            dir,
            cgroup,
            containers: Mutex::new(Vec::new()),
            initialized: AtomicBool::new(false),
            volumes,
            start_time: Timestamp::now(),
            transitions: Transitions::default(),
            token_refresh_at: Mutex::new(None),
            last_status: Mutex::new(None),
        })
    }

    pub fn containers(&self) -> Vec<Arc<ContainerRuntime>> {
        lock(&self.containers).clone()
    }

    /// SIGKILL every process of the pod at once (children too, with a cgroup), and reap them.
    pub fn kill_all(&self) {
        match &self.cgroup {
            Some(procs) => {
                if let Err(e) = kill_cgroup(procs) {
                    eprintln!("valkey-testkit kubelet: {e:#}");
                }
            }
            None => {
                // Freeze every container first: a stopped process keeps its sockets open, so no
                // container sees another die and reacts (an agent releasing its Lease in the
                // moment between its Valkey's kill and its own) — a pod that is lost loses
                // everything at once.
                for c in self.containers() {
                    if let Err(e) = c.signal("STOP") {
                        eprintln!("valkey-testkit kubelet: stopping {}: {e:#}", c.label);
                    }
                }
            }
        }
        self.reap();
    }

    /// SIGKILL to what is still running and reap every container's process (killed behind its
    /// back, e.g. by `cgroup.kill`).
    pub fn reap(&self) {
        for c in self.containers() {
            if let Err(e) = c.kill() {
                eprintln!("valkey-testkit kubelet: killing {}: {e:#}", c.label);
            }
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to every process of the pod: with a cgroup every
    /// process in it (children a container started too), else each container's process.
    pub fn signal_all(&self, signal: &str) -> Result<()> {
        let pids = match &self.cgroup {
            Some(procs) => cgroup_pids(procs)?,
            None => self.pids(),
        };
        signal_pids(&pids, signal)
    }

    /// The node came back from a power-off: the kubelet forgot every back-off, containers start
    /// again at once.
    pub fn rebooted(&self) {
        for c in self.containers() {
            c.rebooted();
        }
    }

    /// Pids of the running processes.
    pub fn pids(&self) -> Vec<u32> {
        self.containers().iter().filter_map(|c| c.pid()).collect()
    }

    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn token_path(&self) -> PathBuf {
        self.dir.path().join("token")
    }

    /// The token is renewed at the next sync (a pod without API credentials has none).
    pub fn renew_token_now(&self) {
        let mut at = lock(&self.token_refresh_at);
        if at.is_some() {
            *at = Some(Instant::now());
        }
    }
}

/// The pod's life, from its first sighting to its removal. Returns when the pod object is gone
/// or the kubelet stops; the caller then kills what is left.
pub(crate) async fn run(shared: &Shared, pod: &PodRuntime, rx: &mut watch::Receiver<Option<Pod>>) {
    if let Err(e) = lifecycle(shared, pod, rx).await {
        eprintln!(
            "valkey-testkit kubelet: pod {}/{}: {e:#}",
            pod.namespace, pod.name
        );
    }
}

async fn lifecycle(
    shared: &Shared,
    pod: &PodRuntime,
    rx: &mut watch::Receiver<Option<Pod>>,
) -> Result<()> {
    // Set-up (token, environment) can fail until e.g. a ServiceAccount or Secret exists:
    // retry, as a kubelet does, reporting the error in the pod status.
    loop {
        match next_step(shared, pod, rx) {
            Step::Gone => return Ok(()),
            Step::Frozen => {}
            Step::Terminate(object) => return terminate(shared, pod, &object).await,
            Step::Run(object) => match prepare(shared, pod, &object).await {
                Ok(()) => break,
                Err(e) => report_setup_error(shared, pod, &e).await,
            },
        }
        if !wait_change_or(rx, Duration::from_secs(1)).await {
            return Ok(());
        }
    }
    advance(shared, pod).await;
    loop {
        match next_step(shared, pod, rx) {
            Step::Gone => return Ok(()),
            Step::Frozen => {}
            Step::Terminate(object) => return terminate(shared, pod, &object).await,
            Step::Run(object) => sync(shared, pod, &object).await,
        }
        if !wait_change_or(rx, shared.opts.sync_period).await {
            return Ok(());
        }
    }
}

/// What the pod task does next, from the latest pod object.
enum Step {
    /// The object was removed (force-deleted, or finalised by us).
    Gone,
    /// The node is down (powered off, partitioned or frozen): nobody restarts, probes or
    /// reports, nobody finalises a deletion.
    Frozen,
    Terminate(Pod),
    Run(Pod),
}

fn next_step(shared: &Shared, pod: &PodRuntime, rx: &mut watch::Receiver<Option<Pod>>) -> Step {
    let Some(object) = rx.borrow_and_update().clone() else {
        return Step::Gone;
    };
    if shared.is_down(&pod.node) {
        Step::Frozen
    } else if deleting(&object) {
        Step::Terminate(object)
    } else {
        Step::Run(object)
    }
}

/// Waits for a new version of the pod or `timeout`; `false` when the kubelet is gone.
async fn wait_change_or(rx: &mut watch::Receiver<Option<Pod>>, timeout: Duration) -> bool {
    !matches!(
        tokio::time::timeout(timeout, rx.changed()).await,
        Ok(Err(_))
    )
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Token, kubeconfig, volumes, environments and container runtimes.
async fn prepare(shared: &Shared, pod: &PodRuntime, object: &Pod) -> Result<()> {
    refresh_token(shared, pod, object).await?;
    let facts = PodFacts {
        pod: object,
        ip: pod.ip,
        host_ip: pod.host_ip.clone(),
    };
    let sources = Sources {
        client: &shared.client,
        facts: &facts,
    };
    pod.volumes.materialise(&sources).await?;
    let spec = object.spec.as_ref().context("pod without spec")?;
    let init = spec.init_containers.iter().flatten();
    let init = init.map(|c| (c, Class::of_init(c)));
    let all = init.chain(spec.containers.iter().map(|c| (c, Class::Main)));
    let mut containers = Vec::new();
    for (container, class) in all {
        let setup = setup(shared, pod, &facts, container, class).await?;
        let runtime = ContainerRuntime::new(setup, pod.ip)?;
        containers.push(Arc::new(runtime));
    }
    *lock(&pod.containers) = containers;
    Ok(())
}

/// The image's tag (`valkey/valkey:8.0.1` → `8.0.1`; none for a digest or no tag).
fn image_tag(image: &str) -> Option<&str> {
    let (_, tag) = image.rsplit_once(':')?;
    (!tag.contains('/') && !image.contains('@')).then_some(tag)
}

/// An older Valkey's binary where the image's tag names one the harness has
/// ([`crate::valkey_server_for_tag`]): upgrade tests run the version the pod asks for.
async fn older_valkey(image: &str) -> Result<Option<PathBuf>> {
    let Some(tag) = image_tag(image).map(str::to_owned) else {
        return Ok(None);
    };
    tokio::task::spawn_blocking(move || crate::valkey_server_for_tag(&tag)).await?
}

/// One container's program, environment and spec, its volume paths rewritten.
async fn setup(
    shared: &Shared,
    pod: &PodRuntime,
    facts: &PodFacts<'_>,
    container: &Container,
    class: Class,
) -> Result<Setup> {
    let image = container.image.clone().unwrap_or_default();
    let kind = kind_of(&image);
    let program = match kind {
        Kind::Valkey => match older_valkey(&image).await? {
            Some(path) => Some(path),
            None => shared.binaries.get("valkey-server").cloned(),
        },
        Kind::Sidecar => shared.binaries.get("valkey-sidecar").cloned(),
        Kind::Pause => Some(PathBuf::from("sleep")),
        Kind::Unsupported => None,
    };
    let own = pod_env(&shared.client, facts, container).await?;
    let mounts = Mounts::new(container, &pod.volumes, &own)
        .with_context(|| format!("volume mounts of container {}", container.name))?;
    let own = own.into_iter().map(|(k, v)| {
        let v = mounts.rewrite(&v);
        (k, v)
    });
    let kubeconfig = api_credentials(facts.pod, container).then(|| pod.kubeconfig_path());
    let env = harness_env(own.collect(), facts, kind, kubeconfig.as_deref());
    let mut spec = container.clone();
    mounts.rewrite_spec(&mut spec);
    let memory = match memory_limit(container)? {
        Some(limit) => MemoryCgroup::create(&pod.uid, &container.name, limit)?,
        None => None,
    };
    Ok(Setup {
        spec,
        class,
        kind,
        env,
        label: format!("{}/{}/{}", pod.namespace, pod.name, container.name),
        program,
        cgroup: pod.cgroup.clone(),
        cpu: shared.kubepods.as_ref().map(cpu::KubePods::procs),
        memory,
    })
}

/// The container's `resources.limits.memory` in bytes.
fn memory_limit(container: &Container) -> Result<Option<u64>> {
    let limit = container
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"));
    let Some(q) = limit else { return Ok(None) };
    // Whole bytes, as the kubelet rounds a limit up.
    Ok(Some(quantity(&q.0)?.ceil() as u64))
}

/// Requests a token for the pod's ServiceAccount bound to the pod (TokenRequest API, default
/// audience) and (re)writes the token file the pod's kubeconfig points to.
async fn refresh_token(shared: &Shared, pod: &PodRuntime, object: &Pod) -> Result<()> {
    let account = object
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let ttl = shared.opts.token_ttl;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
            }),
            expiration_seconds: i64::try_from(ttl.as_secs()).ok(),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let api: Api<ServiceAccount> = Api::namespaced(shared.client.clone(), &pod.namespace);
    let issued = api
        .create_token_request(&account, &PostParams::default(), &request)
        .await
        .with_context(|| {
            format!(
                "TokenRequest for serviceaccount {}/{account}",
                pod.namespace
            )
        })?;
    let token = issued
        .status
        .and_then(|s| s.token)
        .context("TokenRequest without a token")?;
    kubeconfig::write_atomic(&pod.token_path(), token.as_bytes())?;
    let user = format!("system:serviceaccount:{}:{account}", pod.namespace);
    let text = kubeconfig::render(
        &shared.url,
        &shared.ca_pem,
        &user,
        Credential::TokenFile(&pod.token_path()),
    );
    kubeconfig::write_atomic(&pod.kubeconfig_path(), text.as_bytes())?;
    // Renew at 80% of the lifetime, like the kubelet's projected token volumes.
    *lock(&pod.token_refresh_at) = Some(Instant::now() + ttl.mul_f64(0.8));
    Ok(())
}

async fn report_setup_error(shared: &Shared, pod: &PodRuntime, e: &anyhow::Error) {
    let message = format!("{e:#}");
    if lock(&pod.last_status).is_none() {
        eprintln!(
            "valkey-testkit kubelet: pod {}/{} not started yet: {message}",
            pod.namespace, pod.name
        );
    }
    let patch = serde_json::json!({ "status": {
        "phase": "Pending",
        "hostIP": pod.host_ip,
        "message": message,
        "reason": "CreateContainerConfigError",
    }});
    if patch_status(shared, pod, patch.clone()).await {
        *lock(&pod.last_status) = Some(patch);
    }
}

/// Starts what is due, in the kubelet's order: the init containers one at a time — the next
/// starts once a regular one has completed (exit 0) or a sidecar has *started* (running, its
/// startup probe passed) — and then all main containers at once.
async fn advance(shared: &Shared, pod: &PodRuntime) {
    if pod.initialized.load(Ordering::SeqCst) {
        return;
    }
    let containers = pod.containers();
    for c in containers.iter().filter(|c| c.class != Class::Main) {
        if c.untried() {
            launch(shared, pod, c).await;
        }
        if !c.init_passed() {
            return;
        }
    }
    pod.initialized.store(true, Ordering::SeqCst);
    for c in containers.iter().filter(|c| c.class == Class::Main) {
        launch(shared, pod, c).await;
    }
}

/// Starts a container, or records why the harness cannot: a regular init container with an
/// image it does not know counts as completed (so charts with e.g. a `busybox` set-up step still
/// start), anything else waits.
async fn launch(shared: &Shared, pod: &PodRuntime, c: &ContainerRuntime) {
    if c.runnable() {
        start_container(shared, pod, c).await;
        return;
    }
    let image = c.spec.image.clone().unwrap_or_default();
    let why = match (c.kind, &shared.sidecar_missing, c.class) {
        (Kind::Sidecar, Some(e), _) => ("StartError", e.clone()),
        (_, _, Class::Init) => {
            c.skip(format!(
                "not run: the valkey-testkit kubelet does not run image {image:?}"
            ));
            return;
        }
        _ => (
            "UnsupportedImage",
            "the valkey-testkit kubelet runs valkey, valkey-sidecar and pause images".into(),
        ),
    };
    lock(&c.state).waiting = Some((why.0.into(), why.1));
}

/// Starts (or restarts) one container and runs its postStart hook. Nothing starts on a node
/// that is down, even if this pass began before it went down.
async fn start_container(shared: &Shared, pod: &PodRuntime, c: &ContainerRuntime) {
    match shared.while_up(&pod.node, || c.start()) {
        None => return,
        Some(Err(e)) => {
            lock(&c.state).waiting = Some(("StartError".into(), format!("{e:#}")));
            return;
        }
        Some(Ok(())) => {}
    }
    lock(&shared.starts).push(StartRecord {
        namespace: pod.namespace.clone(),
        pod: pod.name.clone(),
        container: c.name.clone(),
        at: Instant::now(),
    });
    let hook = c
        .spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.post_start.as_ref());
    if let Some(handler) = hook {
        run_hook(
            shared,
            pod,
            c,
            "postStart",
            handler,
            Duration::from_secs(30),
        )
        .await;
    }
}

/// One pass: probe kills, exits and restarts, due probes, the init sequence, token and volume
/// renewal, status report.
async fn sync(shared: &Shared, pod: &PodRuntime, object: &Pod) {
    let policy = restart_policy(object);
    for c in pod.containers() {
        if c.take_probe_kill() {
            eprintln!(
                "valkey-testkit kubelet: {} failed its probe; restarting it",
                c.label
            );
            if let Err(e) = c.kill() {
                eprintln!("valkey-testkit kubelet: killing {}: {e:#}", c.label);
            }
        }
        if let Some(t) = c.check_exit() {
            schedule_restart(pod, &c, &policy, t.exit_code);
        }
        let due = lock(&c.state)
            .restart_at
            .is_some_and(|at| Instant::now() >= at);
        if due {
            start_container(shared, pod, &c).await;
        }
    }
    run_probes(shared, pod);
    advance(shared, pod).await;
    refresh_volumes(shared, pod, object).await;
    let renew = lock(&pod.token_refresh_at).is_some_and(|at| Instant::now() >= at);
    if renew && let Err(e) = refresh_token(shared, pod, object).await {
        eprintln!(
            "valkey-testkit kubelet: renewing the token of {}: {e:#}",
            pod.name
        );
    }
    report_status(shared, pod, object).await;
}

fn restart_policy(object: &Pod) -> String {
    object
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into())
}

/// Re-reads Secrets and ConfigMaps, recomputes downward-API files and renews projected tokens
/// every [`super::KubeletOptions::volume_refresh`]; a failure keeps the old files.
async fn refresh_volumes(shared: &Shared, pod: &PodRuntime, object: &Pod) {
    if !pod.volumes.refresh_due(shared.opts.volume_refresh) {
        return;
    }
    let facts = PodFacts {
        pod: object,
        ip: pod.ip,
        host_ip: pod.host_ip.clone(),
    };
    let sources = Sources {
        client: &shared.client,
        facts: &facts,
    };
    if let Err(e) = pod.volumes.materialise(&sources).await {
        eprintln!(
            "valkey-testkit kubelet: refreshing the volumes of {}/{}: {e:#}",
            pod.namespace, pod.name
        );
    }
}

/// Schedules the restart of a container whose run just ended, if [`Class::restarts`] says so:
/// at once or after the crash-loop back-off ([`super::backoff`]), reporting `CrashLoopBackOff`
/// while it waits.
fn schedule_restart(pod: &PodRuntime, c: &ContainerRuntime, policy: &str, exit_code: i32) {
    if !c.class.restarts(policy, exit_code) {
        return;
    }
    let mut state = lock(&c.state);
    let exited = state.exited_at.unwrap_or_else(Instant::now);
    let delay = state.crash_loop.delay(exited);
    state.restart_at = Some(exited + delay);
    if !delay.is_zero() {
        let message = format!(
            "back-off {} restarting failed container={} pod={}_{}({})",
            go_duration(delay),
            c.name,
            pod.name,
            pod.namespace,
            pod.uid
        );
        state.waiting = Some(("CrashLoopBackOff".into(), message));
    }
}

/// A whole-second duration as Go prints it (`10s`, `2m40s`, `5m0s`), as in the kubelet's
/// messages.
fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    match secs / 60 {
        0 => format!("{secs}s"),
        minutes => format!("{minutes}m{}s", secs % 60),
    }
}

/// Starts every due probe in a task of its own, as the kubelet's prober workers run apart from
/// its sync loop: a probe that hangs until its timeout holds up neither the other probes nor
/// the status. Results land in the container's state; a liveness or startup failure past its
/// threshold is acted on by the next pass.
fn run_probes(shared: &Shared, pod: &PodRuntime) {
    let now = Instant::now();
    for c in pod.containers() {
        for probe in c.due_probes(now) {
            let c = Arc::clone(&c);
            let binaries = Arc::clone(&shared.binaries);
            tokio::spawn(async move {
                let exec = ExecIn {
                    env: &c.env,
                    binaries: &binaries,
                    cgroup: c.cgroup(),
                };
                let result = probe.action.run(probe.timeout, &exec).await;
                c.record_probe(&probe, result);
            });
        }
    }
}

/// Patches the pod status if it changed since the last report.
async fn report_status(shared: &Shared, pod: &PodRuntime, object: &Pod) {
    let containers = pod.containers();
    let view = PodView {
        object,
        ip: pod.ip.to_string(),
        host_ip: pod.host_ip.clone(),
        start_time: pod.start_time,
        transitions: &pod.transitions,
        initialized: pod.initialized.load(Ordering::SeqCst),
    };
    let refs: Vec<&ContainerRuntime> = containers.iter().map(AsRef::as_ref).collect();
    let patch = status_patch(&view, &refs);
    // Others write the status too (the node-lifecycle controller marks pods NotReady while their
    // node looks dead), so "unchanged since our last report" is not enough: the object must also
    // agree with what we would report.
    let agrees = pod_condition(object, "Ready") == Some(patch_ready(&patch));
    if agrees && lock(&pod.last_status).as_ref() == Some(&patch) {
        return;
    }
    if patch_status(shared, pod, patch.clone()).await {
        *lock(&pod.last_status) = Some(patch);
    }
}

/// The `Ready` condition in a status patch.
fn patch_ready(patch: &Value) -> bool {
    patch["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .is_some_and(|c| c["status"] == "True")
}

/// Strategic-merge patch of the status subresource; `false` on failure (retried next pass).
async fn patch_status(shared: &Shared, pod: &PodRuntime, patch: Value) -> bool {
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &pod.namespace);
    match api
        .patch_status(&pod.name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => true,
        Err(kube::Error::Api(e)) if e.code == 404 => false,
        Err(e) => {
            eprintln!(
                "valkey-testkit kubelet: status of {}/{}: {e:#}",
                pod.namespace, pod.name
            );
            false
        }
    }
}

/// Runs a lifecycle hook within `timeout` and records it.
pub(super) async fn run_hook(
    shared: &Shared,
    pod: &PodRuntime,
    c: &ContainerRuntime,
    hook: &'static str,
    handler: &k8s_openapi::api::core::v1::LifecycleHandler,
    timeout: Duration,
) {
    let at = Instant::now();
    let (action, result) = match Action::of_hook(handler, &c.spec, pod.ip) {
        Ok(action) => {
            let exec = ExecIn {
                env: &c.env,
                binaries: &shared.binaries,
                cgroup: c.cgroup(),
            };
            let result = action.run(timeout, &exec).await;
            (action.describe(), result)
        }
        Err(e) => ("invalid".into(), Err(e)),
    };
    let run = HookRun {
        namespace: pod.namespace.clone(),
        pod: pod.name.clone(),
        container: c.name.clone(),
        hook,
        action,
        result: result.map_err(|e| format!("{e:#}")),
        at,
        took: at.elapsed(),
    };
    if let Err(e) = &run.result {
        eprintln!(
            "valkey-testkit kubelet: {hook} hook of {} failed: {e}",
            c.label
        );
    }
    lock(&shared.hooks).push(run);
}

/// Unused-binary lookups stay cheap: the map is built once per kubelet.
pub(crate) fn binaries(
    sidecar: Option<PathBuf>,
    valkey: Option<PathBuf>,
) -> HashMap<&'static str, PathBuf> {
    let mut map = HashMap::new();
    if let Some(p) = sidecar {
        map.insert("valkey-sidecar", p);
    }
    if let Some(p) = valkey {
        map.insert("valkey-server", p);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_messages_print_durations_as_go_does() {
        let secs = |s| go_duration(Duration::from_secs(s));
        assert_eq!(
            [secs(10), secs(40), secs(160), secs(300)],
            ["10s", "40s", "2m40s", "5m0s"]
        );
    }

    #[test]
    fn an_image_names_its_tag() {
        assert_eq!(image_tag("valkey/valkey:8.0.1"), Some("8.0.1"));
        assert_eq!(
            image_tag("registry:5000/valkey/valkey:9.0.0"),
            Some("9.0.0")
        );
        assert_eq!(image_tag("registry:5000/valkey/valkey"), None);
        assert_eq!(image_tag("valkey/valkey@sha256:abc"), None);
    }
}
