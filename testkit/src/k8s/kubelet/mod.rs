//! A minimal kubelet for tests: runs pods bound to the fake nodes as local processes.
//!
//! It watches all pods; for each one whose `spec.nodeName` is one of the [`FakeNodes`]:
//! 1. allocates a pod IP on the loopback (`127.<b>.x.y`, `b` derived from the test process's pid
//!    so concurrent test processes rarely meet; an address whose ports are taken is skipped;
//!    addresses are never reused within a process),
//! 2. requests a ServiceAccount token bound to the pod (TokenRequest API, default audience,
//!    renewed at 80% of its lifetime) and writes a kubeconfig using it (`KUBECONFIG` of every
//!    container),
//! 3. materialises the mounted volumes in the pod's temp dir (`emptyDir`, `secret`, `configMap`,
//!    `downwardAPI`, `projected`; refreshed about once a minute) and rewrites every container path
//!    under a `mountPath` to them ([`volume`]),
//! 4. starts the containers it recognises (see [`spec`] for the image → program mapping, the
//!    downward-API environment and the pod-local loopback rule) in the kubelet's order (below),
//! 5. reports status like a kubelet (phase, pod/host IPs, `initContainerStatuses` and
//!    `containerStatuses`, the `Initialized`/`ContainersReady`/`Ready` conditions) and runs
//!    startup, liveness and readiness probes ([`probe`]), restarting crashed containers after a
//!    fixed short back-off,
//! 6. on a `deletionTimestamp`: stops the containers in the kubelet's order ([`terminate`]: every
//!    container's own `preStop` at once, SIGTERM to each main container after its hook, to the
//!    native sidecars only after every main container has exited, in reverse order; SIGKILL at
//!    the end of the grace period) and removes the pod object (grace 0).
//!
//! **Init containers and native sidecars** (Kubernetes ≥ 1.29, KEP-753). `initContainers` run one
//! at a time in order before the main containers. A regular one (no `restartPolicy`) must exit 0
//! before the next starts; it is restarted while it fails (the pod is `Failed` if it fails with
//! `restartPolicy: Never`). If the harness does not know its image (see [`spec`]; e.g. a
//! `busybox` set-up step) it is not run but reported as completed (exit 0, reason `Completed`,
//! the message says so), so a chart's pods still start; its work (chown, config rendering) is not
//! done. One with `restartPolicy: Always` is a sidecar: the next container starts once it is
//! *started* (running and its startup probe passed, or at once without one), it is restarted
//! whenever it exits, whatever the pod's `restartPolicy`, its readiness counts toward the pod's
//! `Ready`, and its status is in `initContainerStatuses`. A sidecar the harness cannot run waits
//! (`UnsupportedImage`) without holding up the next container, and keeps the pod unready. The
//! pod is `Pending` until every init container has passed.
//!
//! Chaos: [`Kubelet::crash`] (SIGKILL behind Kubernetes' back; the kubelet notices and restarts),
//! [`Kubelet::pause`]/[`Kubelet::resume`] (SIGSTOP/SIGCONT), [`Kubelet::cut_node`] (every process
//! of the node killed and its heartbeat stopped: the node goes Unknown, its pods stay as they are
//! in the API, as with a real dead node) and [`Kubelet::restore_node`]. Records with timings:
//! [`Kubelet::starts`], [`Kubelet::hook_runs`], [`Kubelet::stops`].
//!
//! Not supported: `envFrom`, gRPC probes, HTTPS probes, resource limits, volume types other than
//! the five above (they are empty directories), re-running init containers after a crash of the
//! whole pod.

mod container;
mod ips;
mod pod;
mod probe;
pub(crate) mod spec;
mod status;
mod terminate;
mod volume;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::pod::PodRuntime;
use super::control_plane::ControlPlane;
use super::netfault::{Cgroups, Cut, NetFaults};
use super::nodes::{FakeNodes, NodesShared};
use super::util::poll_until;
use crate::Result;
use crate::net::lock;

/// How the [`Kubelet`] behaves.
#[derive(Clone, Debug)]
pub struct KubeletOptions {
    /// The agent binary for `valkey-sidecar` images; `None`: [`super::sidecar_bin`] (if that
    /// fails, such containers wait with reason `StartError`).
    pub sidecar_bin: Option<PathBuf>,
    /// Replaces every probe's `periodSeconds` (default: the probe's, else 1 s).
    pub probe_period: Option<Duration>,
    /// Delay before a crashed container is restarted.
    pub restart_backoff: Duration,
    /// How often each pod checks its processes and reports status.
    pub sync_period: Duration,
    /// Lifetime requested for pod ServiceAccount tokens.
    pub token_ttl: Duration,
    /// How often Secret, ConfigMap, downward-API and token volumes are refreshed (the kubelet's
    /// sync period is about a minute).
    pub volume_refresh: Duration,
    /// Run each pod in a cgroup of its own, so [`Kubelet::partition`] and
    /// [`Kubelet::cut_from_apiserver`] can cut its traffic (needs root, cgroup v2 and `nft`).
    pub network_faults: bool,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        Self {
            sidecar_bin: None,
            probe_period: None,
            restart_backoff: Duration::from_secs(1),
            sync_period: Duration::from_millis(100),
            token_ttl: Duration::from_secs(3600),
            volume_refresh: Duration::from_secs(60),
            network_faults: false,
        }
    }
}

impl KubeletOptions {
    /// Probes every `period` instead of the pods' `periodSeconds`.
    pub fn probe_period(mut self, period: Duration) -> Self {
        self.probe_period = Some(period);
        self
    }

    pub fn sidecar_bin(mut self, path: impl Into<PathBuf>) -> Self {
        self.sidecar_bin = Some(path.into());
        self
    }

    /// See [`KubeletOptions::network_faults`].
    pub fn network_faults(mut self) -> Self {
        self.network_faults = true;
        self
    }
}

/// A lifecycle hook the kubelet ran.
#[derive(Clone, Debug)]
pub struct HookRun {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// `preStop` or `postStart`.
    pub hook: &'static str,
    /// What was done, e.g. `httpGet http://127.1.0.1:9736/livez`.
    pub action: String,
    /// `Ok(outcome)` (e.g. `HTTP 200`) or the failure.
    pub result: Result<String, String>,
    /// When the hook started.
    pub at: Instant,
    pub took: Duration,
}

/// A container process the kubelet started (a restart too).
#[derive(Clone, Debug)]
pub struct StartRecord {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub at: Instant,
}

/// How a container process ended when its pod was deleted.
#[derive(Clone, Debug)]
pub struct StopRecord {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// Exited after SIGTERM within the grace period (else it got SIGKILL).
    pub graceful: bool,
    /// When SIGTERM was sent.
    pub at: Instant,
    /// From SIGTERM to exit.
    pub took: Duration,
}

struct PodEntry {
    runtime: Arc<PodRuntime>,
    updates: watch::Sender<Option<Pod>>,
    task: JoinHandle<()>,
}

/// State shared by the watch task, the pod tasks and the [`Kubelet`] handle.
pub(crate) struct Shared {
    client: Client,
    url: String,
    ca_pem: Vec<u8>,
    nodes: Arc<NodesShared>,
    /// Node name → host IP, for the nodes this kubelet serves.
    host_ips: HashMap<String, String>,
    opts: KubeletOptions,
    binaries: HashMap<&'static str, PathBuf>,
    /// Why `valkey-sidecar` images cannot run, if they cannot.
    sidecar_missing: Option<String>,
    /// By pod uid.
    pods: Mutex<HashMap<String, PodEntry>>,
    cut: Mutex<HashSet<String>>,
    /// With [`KubeletOptions::network_faults`]: the pods' cgroups and the drop rules. Declared
    /// rules first: the table goes before the cgroups it names.
    faults: Option<(NetFaults, Cgroups)>,
    hooks: Mutex<Vec<HookRun>>,
    starts: Mutex<Vec<StartRecord>>,
    stops: Mutex<Vec<StopRecord>>,
}

impl Shared {
    fn is_cut(&self, node: &str) -> bool {
        lock(&self.cut).contains(node)
    }

    /// A new or changed pod from the watch.
    fn observe(self: &Arc<Self>, pod: Pod) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        let Some(host_ip) = self.host_ips.get(&node).cloned() else {
            return;
        };
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let mut pods = lock(&self.pods);
        if let Some(entry) = pods.get(&uid) {
            entry.updates.send_replace(Some(pod));
            return;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return;
        }
        match self.admit(&pod, node, host_ip) {
            Ok(runtime) => {
                let (updates, rx) = watch::channel(Some(pod));
                let task = tokio::spawn(pod_task(Arc::clone(self), Arc::clone(&runtime), rx));
                pods.insert(
                    uid,
                    PodEntry {
                        runtime,
                        updates,
                        task,
                    },
                );
            }
            Err(e) => eprintln!("valkey-testkit kubelet: cannot admit a pod: {e:#}"),
        }
    }

    fn admit(&self, pod: &Pod, node: String, host_ip: String) -> Result<Arc<PodRuntime>> {
        let ip = ips::allocate(&ips::ports_of(pod))?;
        let cgroup = match (&self.faults, pod.metadata.uid.as_deref()) {
            (Some((_, cgroups)), Some(uid)) => Some(cgroups.pod(uid)?),
            _ => None,
        };
        Ok(Arc::new(PodRuntime::new(pod, node, host_ip, ip, cgroup)?))
    }

    /// The pod object is gone.
    fn removed(&self, uid: &str) {
        if let Some(entry) = lock(&self.pods).get(uid) {
            entry.updates.send_replace(None);
        }
    }

    fn find(&self, namespace: &str, name: &str) -> Option<Arc<PodRuntime>> {
        lock(&self.pods)
            .values()
            .map(|e| &e.runtime)
            .find(|r| r.namespace == namespace && r.name == name)
            .cloned()
    }

    fn runtimes(&self) -> Vec<Arc<PodRuntime>> {
        lock(&self.pods)
            .values()
            .map(|e| Arc::clone(&e.runtime))
            .collect()
    }
}

async fn pod_task(
    shared: Arc<Shared>,
    runtime: Arc<PodRuntime>,
    mut rx: watch::Receiver<Option<Pod>>,
) {
    pod::run(&shared, &runtime, &mut rx).await;
    runtime.kill_all();
    lock(&shared.pods).remove(&runtime.uid);
}

async fn watch_pods(shared: Arc<Shared>) {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listed: HashSet<String> = HashSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(pod)) => {
                listed.extend(pod.metadata.uid.clone());
                shared.observe(pod);
            }
            Ok(watcher::Event::InitDone) => {
                // After a re-list, pods we run that were not listed have been removed.
                let gone: Vec<String> = lock(&shared.pods)
                    .keys()
                    .filter(|uid| !listed.contains(*uid))
                    .cloned()
                    .collect();
                gone.iter().for_each(|uid| shared.removed(uid));
            }
            Ok(watcher::Event::Apply(pod)) => shared.observe(pod),
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(uid) = &pod.metadata.uid {
                    shared.removed(uid);
                }
            }
            Err(e) => eprintln!("valkey-testkit kubelet: pod watch: {e}"),
        }
    }
}

/// The kubelet of all fake nodes. Dropping it kills every pod process (the pod objects stay).
pub struct Kubelet {
    shared: Arc<Shared>,
    watch: JoinHandle<()>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.watch.abort();
        let entries: Vec<PodEntry> = lock(&self.shared.pods).drain().map(|(_, e)| e).collect();
        for entry in entries {
            entry.task.abort();
            entry.runtime.kill_all();
        }
    }
}

impl Kubelet {
    /// Starts serving the pods bound to `nodes`, talking to `plane` as admin.
    pub async fn start(
        plane: &ControlPlane,
        nodes: &FakeNodes,
        opts: KubeletOptions,
    ) -> Result<Self> {
        let sidecar = match &opts.sidecar_bin {
            Some(p) => Ok(p.clone()),
            None => super::sidecar_bin(),
        };
        // Pods without the agent still run; pods with it report why it cannot start.
        let sidecar_missing = sidecar.as_ref().err().map(|e| format!("{e:#}"));
        let valkey = tokio::task::spawn_blocking(crate::valkey_server_bin)
            .await?
            .context("locating valkey-server")?;
        let faults = match opts.network_faults {
            true => Some((NetFaults::create()?, Cgroups::create()?)),
            false => None,
        };
        let shared = Arc::new(Shared {
            client: plane.client(),
            url: plane.url().to_owned(),
            ca_pem: plane.ca_pem().to_vec(),
            nodes: nodes.shared(),
            host_ips: nodes
                .nodes()
                .iter()
                .map(|n| (n.name.clone(), n.internal_ip.to_string()))
                .collect(),
            binaries: pod::binaries(sidecar.ok(), Some(valkey)),
            sidecar_missing,
            opts,
            pods: Mutex::new(HashMap::new()),
            cut: Mutex::new(HashSet::new()),
            faults,
            hooks: Mutex::new(Vec::new()),
            starts: Mutex::new(Vec::new()),
            stops: Mutex::new(Vec::new()),
        });
        let watch = tokio::spawn(watch_pods(Arc::clone(&shared)));
        Ok(Self { shared, watch })
    }

    fn pod(&self, namespace: &str, name: &str) -> Result<Arc<PodRuntime>> {
        self.shared
            .find(namespace, name)
            .with_context(|| format!("the kubelet runs no pod {namespace}/{name}"))
    }

    /// The pod IP the kubelet gave the pod.
    pub fn pod_ip(&self, namespace: &str, name: &str) -> Option<Ipv4Addr> {
        self.shared.find(namespace, name).map(|p| p.ip)
    }

    /// Pids of the pod's running processes.
    pub fn pids(&self, namespace: &str, name: &str) -> Vec<u32> {
        self.shared
            .find(namespace, name)
            .map(|p| p.pids())
            .unwrap_or_default()
    }

    /// Pids of every running pod process.
    pub fn all_pids(&self) -> Vec<u32> {
        self.shared
            .runtimes()
            .iter()
            .flat_map(|p| p.pids())
            .collect()
    }

    /// The pid of one container's process, while it runs.
    pub fn container_pid(&self, namespace: &str, name: &str, container: &str) -> Option<u32> {
        let pod = self.shared.find(namespace, name)?;
        pod.containers().iter().find(|c| c.name == container)?.pid()
    }

    /// SIGKILL every process of the pod without telling Kubernetes. The kubelet notices on its
    /// next pass, reports the containers terminated and not ready, and restarts them.
    pub fn crash(&self, namespace: &str, name: &str) -> Result<()> {
        self.pod(namespace, name)?.kill_all();
        Ok(())
    }

    /// SIGKILL one container's process.
    pub fn crash_container(&self, namespace: &str, name: &str, container: &str) -> Result<()> {
        let pod = self.pod(namespace, name)?;
        let c = pod
            .containers()
            .into_iter()
            .find(|c| c.name == container)
            .with_context(|| format!("pod {namespace}/{name} has no container {container}"))?;
        c.kill()
    }

    /// SIGSTOP every process of the pod (probes then time out).
    pub fn pause(&self, namespace: &str, name: &str) -> Result<()> {
        self.signal_pod(namespace, name, "STOP")
    }

    /// SIGCONT after [`Self::pause`].
    pub fn resume(&self, namespace: &str, name: &str) -> Result<()> {
        self.signal_pod(namespace, name, "CONT")
    }

    fn signal_pod(&self, namespace: &str, name: &str, signal: &str) -> Result<()> {
        for c in self.pod(namespace, name)?.containers() {
            c.signal(signal)?;
        }
        Ok(())
    }

    /// The node dies: SIGKILL every process of its pods, stop its heartbeat, and stop acting for
    /// it (no restarts, no status, deletions stay pending) until [`Self::restore_node`].
    pub fn cut_node(&self, node: &str) -> Result<()> {
        self.shared.nodes.set_beating(node, false)?;
        lock(&self.shared.cut).insert(node.to_owned());
        for pod in self.shared.runtimes().iter().filter(|p| p.node == node) {
            pod.kill_all();
        }
        Ok(())
    }

    /// The node comes back: heartbeat resumes, its pods' containers restart.
    pub fn restore_node(&self, node: &str) -> Result<()> {
        lock(&self.shared.cut).remove(node);
        self.shared.nodes.set_beating(node, true)
    }

    /// Cuts the network between pod `a` and each of `others` (both directions), as a partition
    /// would: their connections hang, everything else still works.
    pub fn partition(&self, namespace: &str, a: &str, others: &[&str]) -> Result<()> {
        let (faults, cgroups) = self.faults()?;
        let a = self.pod(namespace, a)?;
        for other in others {
            let b = self.pod(namespace, other)?;
            for (from, to) in [(&a, &b), (&b, &a)] {
                let cut = Cut {
                    from_uid: from.uid.clone(),
                    to: to.ip,
                    port: None,
                };
                faults.drop(cgroups, &cut)?;
            }
        }
        Ok(())
    }

    /// Cuts the pod off from the apiserver (its requests hang); pods still reach each other.
    pub fn cut_from_apiserver(&self, namespace: &str, pod: &str) -> Result<()> {
        let (faults, cgroups) = self.faults()?;
        let (host, port) = apiserver_addr(&self.shared.url)?;
        let cut = Cut {
            from_uid: self.pod(namespace, pod)?.uid.clone(),
            to: host,
            port: Some(port),
        };
        faults.drop(cgroups, &cut)
    }

    /// Throttles what pod `from` sends from its port `port` to pod `to` (e.g. a primary's
    /// replication stream to one replica) to `bytes_per_second`.
    pub fn throttle(
        &self,
        namespace: &str,
        (from, port): (&str, u16),
        to: &str,
        bytes_per_second: u64,
    ) -> Result<()> {
        let (faults, cgroups) = self.faults()?;
        let from = self.pod(namespace, from)?;
        let to = self.pod(namespace, to)?;
        faults.throttle(cgroups, (&from.uid, port), to.ip, bytes_per_second)
    }

    /// Removes every network fault.
    pub fn heal_network(&self) -> Result<()> {
        self.faults()?.0.heal()
    }

    fn faults(&self) -> Result<(&NetFaults, &Cgroups)> {
        let (faults, cgroups) =
            self.shared.faults.as_ref().context(
                "the kubelet runs without network faults (KubeletOptions::network_faults)",
            )?;
        Ok((faults, cgroups))
    }

    /// Every lifecycle hook run so far, in order.
    pub fn hook_runs(&self) -> Vec<HookRun> {
        lock(&self.shared.hooks).clone()
    }

    /// Every container start (and restart) so far, in order.
    pub fn starts(&self) -> Vec<StartRecord> {
        lock(&self.shared.starts).clone()
    }

    /// How each container of a deleted pod stopped, in the order they exited.
    pub fn stops(&self) -> Vec<StopRecord> {
        lock(&self.shared.stops).clone()
    }

    /// Where the pod's volume `volume` is on this host (see the module docs on volumes).
    pub fn volume_dir(&self, namespace: &str, name: &str, volume: &str) -> Option<PathBuf> {
        self.shared
            .find(namespace, name)
            .map(|p| p.volumes.dir(volume))
    }

    /// The kubeconfig the pod's containers get (`KUBECONFIG`): the pod's ServiceAccount token.
    pub fn pod_kubeconfig(&self, namespace: &str, name: &str) -> Option<PathBuf> {
        self.shared
            .find(namespace, name)
            .map(|p| p.kubeconfig_path())
    }

    /// The tail of a container's output (or Valkey log), for diagnostics.
    pub fn container_log(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
        lines: usize,
    ) -> String {
        self.shared
            .find(namespace, name)
            .and_then(|p| p.containers().into_iter().find(|c| c.name == container))
            .map(|c| c.log_tail(lines))
            .unwrap_or_default()
    }

    /// Waits until the pod object reports `Ready=True`; returns it.
    pub async fn wait_ready(&self, namespace: &str, name: &str, timeout: Duration) -> Result<Pod> {
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), namespace);
        let what = format!("pod {namespace}/{name} Ready");
        poll_until(&what, timeout, Duration::from_millis(50), || async {
            Ok(super::pod_is_ready(&api.get(name).await?))
        })
        .await?;
        Ok(api.get(name).await?)
    }
}

/// The apiserver's IP and port from its URL (`https://127.0.0.1:6443`).
fn apiserver_addr(url: &str) -> Result<(Ipv4Addr, u16)> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or(rest);
    let (host, port) = hostport
        .rsplit_once(':')
        .with_context(|| format!("no port in {url}"))?;
    Ok((host.parse()?, port.parse()?))
}
