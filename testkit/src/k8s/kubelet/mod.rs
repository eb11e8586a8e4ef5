//! A minimal kubelet for tests: runs pods bound to the fake nodes as local processes.
//!
//! It watches all pods; for each one whose `spec.nodeName` is one of the [`FakeNodes`]:
//! 1. allocates a pod IP on the loopback (`127.<b>.x.y`, `b` a block this test process claims
//!    against every other, so concurrent test processes never meet; an address whose ports are
//!    taken is skipped;
//!    addresses are never reused within a process),
//! 2. requests a ServiceAccount token bound to the pod (TokenRequest API, default audience,
//!    renewed at 80% of its lifetime) and writes a kubeconfig using it (`KUBECONFIG` of each
//!    container that mounts the pod's ServiceAccount token at the in-cluster path, as the
//!    apiserver adds to every container unless `automountServiceAccountToken: false`),
//! 3. materialises the mounted volumes in the pod's temp dir (`emptyDir`, `secret`, `configMap`,
//!    `downwardAPI`, `projected`; refreshed about once a minute) and rewrites every container path
//!    under a `mountPath` to them ([`volume`]),
//! 4. starts the containers it recognises (see [`spec`] for the image → program mapping, the
//!    downward-API environment and the pod-local loopback rule) in the kubelet's order (below),
//!    each pod's processes in a cgroup of their own below one per node
//!    (`<root>/<node>/<pod uid>`, [`super::netfault`]), optionally all in one `cpu` cgroup as
//!    in `kubepods` ([`cpu`]), with the soft open-file limit a containerd 2 container gets
//!    (1024),
//! 5. reports status like a kubelet (phase, pod/host IPs, `initContainerStatuses` and
//!    `containerStatuses`, the `Initialized`/`ContainersReady`/`Ready` conditions) and runs
//!    startup, liveness and readiness probes as the pod specifies them ([`probe`]: every
//!    `periodSeconds`, `timeoutSeconds`, threshold and initial delay, period and timeout at least
//!    1 s, each probe in a task of its own), restarting exited containers with the kubelet's
//!    crash-loop back-off ([`backoff`]: at once, then 10 s, 20 s, … up to 5 min, reported as
//!    `waiting.reason: CrashLoopBackOff`; a liveness kill counts),
//! 6. on a `deletionTimestamp`: stops the containers in the kubelet's order ([`terminate`]: every
//!    container's own `preStop` at once, SIGTERM to each main container after its hook, to the
//!    native sidecars only after every main container has exited, in reverse order; SIGKILL at
//!    the end of the grace period) and removes the pod object (grace 0). Like the kubelet, it
//!    does not report the pod unready for its termination: the `Ready` condition stays as it
//!    was. What treats a terminating pod as not ready is everyone else (EndpointSlices, the
//!    disruption controller), and so does [`super::pod_is_ready`] (and [`Kubelet::wait_ready`]).
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
//! **Chaos.** Per pod: [`Kubelet::crash`] (SIGKILL behind Kubernetes' back; the kubelet notices
//! and restarts), [`Kubelet::pause`]/[`Kubelet::resume`] (SIGSTOP/SIGCONT), and network faults
//! between pods ([`Kubelet::partition`], [`Kubelet::cut_from_apiserver`], [`Kubelet::throttle`],
//! undone by [`Kubelet::heal_network`]). Per node, each undone by its twin:
//! - [`Kubelet::power_off`] / [`Kubelet::power_on`]: the node's addresses go silent (packets
//!   dropped, not refused) before every process of its pods is killed; peers and clients hang
//!   until their own timeouts. Its heartbeat stops (the node goes `Unknown` after the
//!   controller-manager's grace period) and the kubelet stops acting for it: no restarts, no
//!   status, deletions stay pending. Powered on, the containers start again at once, as after a
//!   reboot (back-off forgotten, `emptyDir` volumes kept).
//! - [`Kubelet::partition_node`] / [`Kubelet::heal_node`]: the processes keep running, but its
//!   pods reach only each other, the node's InternalIP ([`Kubelet::node_client_ip`]: a test
//!   client bound to it is on the node) and the observer; nobody else reaches them and they do
//!   not reach the apiserver. Heartbeat and kubelet stop as for a power-off.
//! - [`Kubelet::freeze_node`] / [`Kubelet::thaw_node`]: SIGSTOP / SIGCONT to every process of its
//!   pods; heartbeat and kubelet stop / resume.
//!
//! A client bound to [`Kubelet::observer_ip`] is exempt from every network fault. Records with
//! timings: [`Kubelet::starts`], [`Kubelet::hook_runs`], [`Kubelet::stops`].
//!
//! Needs root, cgroup v2 and `nft` unless [`KubeletOptions::network_faults`] is turned off (then
//! no network or node fault but [`Kubelet::freeze_node`] is available).
//!
//! **Differences from a real kubelet**, all of them deliberate or at least known:
//! - *Images and programs*: only `valkey`, `valkey-sidecar` and `pause` images run (see [`spec`]);
//!   other init containers are reported completed without running, other containers wait.
//! - *Probes*: `httpGet` (HTTP only), `tcpSocket` and `exec`; no gRPC probes, no HTTPS. HTTP and
//!   TCP probes come from the test process (source `127.0.0.1`), not from the node's address;
//!   exec probes run on the host (in the pod's cgroup, with the container's environment), not
//!   in the container's filesystem. The first probe runs right after `initialDelaySeconds`, with
//!   no random offset.
//! - *No isolation*: processes are not chrooted and share the host's network namespace and
//!   loopback; container paths under a volume's `mountPath` are rewritten to the volume's host
//!   directory, and `127.0.0.1`/`localhost` in environment values and exec arguments to the pod
//!   IP (pod-local loopback, see [`spec`]). A process that connects to `127.0.0.1` by other
//!   means reaches the host. Memory limits are enforced with a memory cgroup per container
//!   (OOM-killed past the limit, reported `OOMKilled`; see [`memory`]); CPU limits, users,
//!   capabilities and `readOnly` mounts are not.
//! - *Valkey*: the harness forces `bind`, `bind-source-addr` (the pod IP), `dir`, `logfile` and
//!   `daemonize` over the pod's arguments, because every pod shares the host; everything else
//!   is what the pod says. The config-file argument is skipped.
//! - *Restarts*: the crash-loop back-off is exact (the kubelet restarts on its own re-sync, a few
//!   seconds later); after a whole pod died (a crash of every container, a power-off) each
//!   container is restarted on its own — init containers do not run again, sidecars and main
//!   containers start together.
//! - *Node faults*: a partitioned or frozen node's kubelet stops acting entirely, where a real
//!   one would keep probing and restarting locally (and only fail to report). A powered-off
//!   node's processes are killed with SIGKILL and report exit code 137 (a real reboot reports
//!   the old containers as `Unknown`). Packets the kernel sends for a socket that is gone carry
//!   no cgroup: resets for the dead node's connections *from `127.0.0.1`* (its agents' API and
//!   peer connections) still reach their peers, which then see a reset where a real peer would
//!   time out (connections to its pod IPs stay silent). A frozen node's kernel still completes
//!   TCP handshakes and ACKs data for its stopped processes (only the processes stop, not the
//!   machine).
//! - *Not supported*: `envFrom`, a `resourceFieldRef` to a resource the container does not set
//!   (a kubelet gives the node's allocatable), volume types other than the five above (they
//!   are empty directories), ephemeral containers, `kubectl exec` through the API (see
//!   [`Kubelet::exec`] for a harness-side equivalent), logs through the API, events.

mod backoff;
mod container;
mod cpu;
mod faults;
mod ips;
mod memory;
mod pod;
mod probe;
pub(crate) mod spec;
mod status;
mod terminate;
mod volume;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use self::container::MemoryUse;
use self::pod::PodRuntime;
use self::probe::{ExecIn, exec_command};
use super::control_plane::ControlPlane;
use super::netfault::{Cgroups, NetFaults};
use super::nodes::{FakeNodes, NodesShared};
use super::slow_api::{ApiDelay, DelayRelay};
use super::util::poll_until;
use crate::Result;
use crate::net::lock;

/// How the [`Kubelet`] behaves.
#[derive(Clone, Debug)]
pub struct KubeletOptions {
    /// The agent binary for `valkey-sidecar` images; `None`: [`super::sidecar_bin`] (if that
    /// fails, such containers wait with reason `StartError`).
    pub sidecar_bin: Option<PathBuf>,
    /// How often each pod checks its processes and reports status.
    pub sync_period: Duration,
    /// Lifetime requested for pod ServiceAccount tokens.
    pub token_ttl: Duration,
    /// How often Secret, ConfigMap, downward-API and token volumes are refreshed (the kubelet's
    /// sync period is about a minute).
    pub volume_refresh: Duration,
    /// Run each pod in a cgroup of its own and keep an nftables table, so pod and node network
    /// faults ([`Kubelet::partition`], [`Kubelet::power_off`], …) can cut its traffic. On by
    /// default; needs root, cgroup v2 and `nft`.
    pub network_faults: bool,
    /// Pods reach the apiserver through a relay that holds what they send for this delay, set
    /// and changed by the test ([`super::slow_api`]); `None`: directly.
    pub api_delay: Option<ApiDelay>,
    /// Run every container in one `cpu` cgroup with these `cpu.shares`, as a kubelet runs pods
    /// in `kubepods` (the pods together weigh this much against each thread of the
    /// control plane and the harness); `None`: pods compete thread by thread with them.
    pub pods_cpu_shares: Option<u64>,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        Self {
            sidecar_bin: None,
            sync_period: Duration::from_millis(100),
            token_ttl: Duration::from_secs(3600),
            volume_refresh: Duration::from_secs(60),
            network_faults: true,
            api_delay: None,
            pods_cpu_shares: None,
        }
    }
}

impl KubeletOptions {
    pub fn sidecar_bin(mut self, path: impl Into<PathBuf>) -> Self {
        self.sidecar_bin = Some(path.into());
        self
    }

    /// See [`KubeletOptions::api_delay`].
    pub fn api_delay(mut self, delay: ApiDelay) -> Self {
        self.api_delay = Some(delay);
        self
    }

    /// See [`KubeletOptions::network_faults`] (already the default).
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

/// What a container's process was given: its environment (name, value) and its command line.
pub type ContainerInputs = (Vec<(String, String)>, Vec<String>);

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
    /// How long its preStop hook ran (zero without one).
    pub pre_stop: Duration,
    /// The last lines of its log when it exited: a replaced pod's log is gone with its
    /// directory, and a failed test must still be able to say what its agent did last.
    pub log_tail: String,
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
    binaries: Arc<HashMap<&'static str, PathBuf>>,
    /// Why `valkey-sidecar` images cannot run, if they cannot.
    sidecar_missing: Option<String>,
    /// By pod uid.
    pods: Mutex<HashMap<String, PodEntry>>,
    /// Nodes that are down, and why (see [`Down`]).
    down: Mutex<HashMap<String, HashSet<Down>>>,
    /// With [`KubeletOptions::network_faults`]: the pods' cgroups and the drop rules. Declared
    /// rules first: the table goes before the cgroups it names.
    faults: Option<(NetFaults, Cgroups)>,
    /// With [`KubeletOptions::api_delay`]: the relay `url` points to.
    _relay: Option<DelayRelay>,
    /// With [`KubeletOptions::pods_cpu_shares`]: the cgroup every container joins.
    kubepods: Option<cpu::KubePods>,
    hooks: Mutex<Vec<HookRun>>,
    starts: Mutex<Vec<StartRecord>>,
    stops: Mutex<Vec<StopRecord>>,
}

/// Why a node is down: its heartbeat stops and the kubelet stops acting for it while any of
/// these holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Down {
    PowerOff,
    Partition,
    Freeze,
}

impl Shared {
    /// Whether the kubelet has stopped acting for `node` (no restarts, probes, status or
    /// finalised deletions).
    fn is_down(&self, node: &str) -> bool {
        lock(&self.down)
            .get(node)
            .is_some_and(|why| !why.is_empty())
    }

    /// Runs `f` (which starts a process) only while `node` is up, and keeps it from going down
    /// meanwhile: once [`Self::go_down`] has returned, nothing starts there.
    fn while_up<T>(&self, node: &str, f: impl FnOnce() -> T) -> Option<T> {
        let down = lock(&self.down);
        if down.get(node).is_some_and(|why| !why.is_empty()) {
            return None;
        }
        let out = f();
        drop(down);
        Some(out)
    }

    /// Marks `node` down for `why` and stops its heartbeat.
    fn go_down(&self, node: &str, why: Down) -> Result<()> {
        if !self.host_ips.contains_key(node) {
            anyhow::bail!("{node} is not a node of this kubelet");
        }
        let mut down = lock(&self.down);
        if !down.entry(node.to_owned()).or_default().insert(why) {
            anyhow::bail!("{node} is already down ({why:?})");
        }
        self.nodes.set_beating(node, false)
    }

    /// Clears `why`; once nothing keeps `node` down, its heartbeat and the kubelet resume.
    fn come_up(&self, node: &str, why: Down) -> Result<()> {
        let mut down = lock(&self.down);
        let reasons = down.entry(node.to_owned()).or_default();
        if !reasons.remove(&why) {
            anyhow::bail!("{node} is not down ({why:?})");
        }
        if reasons.is_empty() {
            self.nodes.set_beating(node, true)?;
        }
        Ok(())
    }

    /// The pods of `node`.
    fn pods_on(&self, node: &str) -> Vec<Arc<PodRuntime>> {
        let pods = self.runtimes().into_iter();
        pods.filter(|p| p.node == node).collect()
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
            (Some((_, cgroups)), Some(uid)) => Some(cgroups.pod(&node, uid)?),
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
        let (url, relay) = pods_apiserver(plane.url(), opts.api_delay.as_ref()).await?;
        let kubepods = opts
            .pods_cpu_shares
            .map(cpu::KubePods::create)
            .transpose()?;
        let shared = Arc::new(Shared {
            client: plane.client(),
            url,
            _relay: relay,
            kubepods,
            ca_pem: plane.ca_pem().to_vec(),
            nodes: nodes.shared(),
            host_ips: nodes
                .nodes()
                .iter()
                .map(|n| (n.name.clone(), n.internal_ip.to_string()))
                .collect(),
            binaries: Arc::new(pod::binaries(sidecar.ok(), Some(valkey))),
            sidecar_missing,
            opts,
            pods: Mutex::new(HashMap::new()),
            down: Mutex::new(HashMap::new()),
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

    /// With [`KubeletOptions::pods_cpu_shares`]: the pods' `cpu` cgroup's `cgroup.procs`.
    pub fn kubepods(&self) -> Option<PathBuf> {
        self.shared.kubepods.as_ref().map(cpu::KubePods::procs)
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

    /// The environment and the command line (`command` + `args`, `$(VAR)` expanded) one container's
    /// process was given: what a process in the container can read, since a program may overwrite
    /// its own `/proc/<pid>/environ` and `cmdline` (valkey-server does, for its process title).
    pub fn container_inputs(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
    ) -> Option<ContainerInputs> {
        let pod = self.shared.find(namespace, name)?;
        let containers = pod.containers();
        let c = containers.iter().find(|c| c.name == container)?;
        Some((c.env.clone(), spec::command_line(&c.spec, &c.env)))
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
        container_of(&pod, container)?.kill()
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

    /// A container's memory use: its peak against its limit, where the harness enforces memory
    /// limits (see the kubelet's `memory` module); else the running process's peak resident set.
    pub fn memory_use(&self, namespace: &str, name: &str, container: &str) -> Option<MemoryUse> {
        self.shared
            .find(namespace, name)?
            .containers()
            .into_iter()
            .find(|c| c.name == container)?
            .memory_use()
    }

    /// Has the pod's ServiceAccount token renewed at the next sync, as the kubelet does at 80% of
    /// its lifetime: a new TokenRequest, written over the file the kubeconfig names. `false` when
    /// the pod is not here.
    pub fn renew_token(&self, namespace: &str, name: &str) -> bool {
        self.shared
            .find(namespace, name)
            .map(|p| p.renew_token_now())
            .is_some()
    }

    /// The kubeconfig the pod's entitled containers get (`KUBECONFIG`): the pod's ServiceAccount token.
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

    /// Runs `command` in the container's pod as `kubectl exec` would, but from the harness's side:
    /// on the host, inside the pod's cgroup (so the pod's and its node's network faults apply),
    /// with the container's environment, `127.0.0.1`/`localhost` arguments rewritten to the pod
    /// IP and `valkey-server`/`valkey-sidecar` found as for exec probes (volume paths are not
    /// rewritten). Works whatever the node's state, like a console on the machine. The command is
    /// killed after `timeout` (an error).
    pub async fn exec(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
        command: &[&str],
        timeout: Duration,
    ) -> Result<Output> {
        let pod = self.pod(namespace, name)?;
        let c = container_of(&pod, container)?;
        let argv: Vec<String> = command.iter().map(|a| spec::localize(a, pod.ip)).collect();
        let exec = ExecIn {
            env: &c.env,
            binaries: &self.shared.binaries,
            cgroup: c.cgroup(),
        };
        let mut cmd = exec_command(&argv, &exec)?;
        tokio::time::timeout(timeout, cmd.output())
            .await
            .with_context(|| format!("{argv:?} in {namespace}/{name} timed out after {timeout:?}"))?
            .with_context(|| format!("running {argv:?} in {namespace}/{name}"))
    }

    /// Waits until the pod object reports `Ready=True` and is not being deleted
    /// ([`super::pod_is_ready`]); returns it.
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

/// The pod's container `name`.
fn container_of(pod: &PodRuntime, name: &str) -> Result<Arc<container::ContainerRuntime>> {
    pod.containers()
        .into_iter()
        .find(|c| c.name == name)
        .with_context(|| format!("pod {}/{} has no container {name}", pod.namespace, pod.name))
}

/// The apiserver URL the pods get: the apiserver's own, or a delaying relay's in front of it.
async fn pods_apiserver(
    url: &str,
    delay: Option<&ApiDelay>,
) -> Result<(String, Option<DelayRelay>)> {
    let Some(delay) = delay else {
        return Ok((url.to_owned(), None));
    };
    let relay = DelayRelay::start(apiserver_addr(url)?.into(), delay.clone()).await?;
    Ok((format!("https://{}", relay.addr()), Some(relay)))
}

/// The apiserver's IP and port from its URL (`https://127.0.0.1:6443`).
fn apiserver_addr(url: &str) -> Result<std::net::SocketAddrV4> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or(rest);
    let (host, port) = hostport
        .rsplit_once(':')
        .with_context(|| format!("no port in {url}"))?;
    Ok(std::net::SocketAddrV4::new(host.parse()?, port.parse()?))
}
