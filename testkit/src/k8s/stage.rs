//! A whole stage for end-to-end tests and benchmarks: control plane, six nodes over three zones,
//! the kubelet, the chart's RBAC and admission policy (rendered by the real `helm`), and Valkey
//! pods with the agent beside each, optionally formed into a Valkey Cluster.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

use super::util::poll_until;
use super::valkey::{
    SIDECAR_PORT, VALKEY_PORT, ValkeyPodTemplate, cmd, form_cluster, valkey_pod, wait_valkey_up,
};
use super::{
    ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions,
    http_get,
};
use crate::Result;

/// The role label key the chart and the agent use by default.
pub const ROLE_LABEL: &str = "valkey.io/role";

/// How to build a [`Stage`].
#[derive(Clone, Debug)]
pub struct StageOptions {
    pub namespace: String,
    pub plane: ControlPlaneOptions,
    pub kubelet: KubeletOptions,
    pub template: ValkeyPodTemplate,
    pub shards: usize,
    pub members: usize,
    /// Form a Valkey Cluster across the pods (cluster mode).
    pub form_cluster: bool,
    /// Grant the agent `get nodes` (chart value `sidecar.readNodes`).
    pub read_nodes: bool,
}

impl Default for StageOptions {
    fn default() -> Self {
        Self {
            namespace: "valkey".into(),
            plane: ControlPlaneOptions::default(),
            kubelet: KubeletOptions::default(),
            template: ValkeyPodTemplate::default(),
            shards: 3,
            members: 2,
            form_cluster: true,
            read_nodes: true,
        }
    }
}

impl StageOptions {
    /// One shard of three pods in replication mode, the agents (`sidecar_bin`) with the
    /// coordinator on (cluster name `valkey`) plus `env`.
    ///
    /// Valkey's `repl-diskless-sync-delay` is 2 s here (Valkey's own default is 5 s; the kubelet
    /// adds no defaults): a primary that restarts empty (killed before any snapshot) must not
    /// stream its empty dataset to the replicas before its agent has released the record and the
    /// coordinator has promoted a replica.
    pub fn replication(namespace: &str, sidecar_bin: &Path, env: &[(&str, &str)]) -> StageOptions {
        let mut o = StageOptions {
            namespace: namespace.into(),
            shards: 1,
            members: 3,
            form_cluster: false,
            ..StageOptions::default()
        };
        o.template.mode = "replication".into();
        o.template.valkey_args = vec!["--repl-diskless-sync-delay".into(), "2".into()];
        o.kubelet = o.kubelet.sidecar_bin(sidecar_bin);
        let env = [("SIDECAR_CLUSTER_NAME", "valkey")].iter().chain(env);
        o.template.sidecar_env = env.map(|(k, v)| (k.to_string(), v.to_string())).collect();
        o
    }
}

/// A running stage; fields drop in declaration order: pods' processes, nodes, control plane.
pub struct Stage {
    pub kubelet: Kubelet,
    pub nodes: FakeNodes,
    pub plane: ControlPlane,
    pub namespace: String,
    /// Pods in creation order: shard 0's members, then shard 1's, …
    pub pods: Vec<String>,
    /// Members per shard.
    pub members: usize,
}

/// The `helm` binary: `$HELM_BIN`, else `scripts/helm-bin.sh` (builds it if needed).
pub fn helm_bin() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("HELM_BIN") {
        return Ok(PathBuf::from(p));
    }
    crate::binaries::path_from_script("helm-bin.sh")
}

impl Stage {
    /// Starts everything and waits until every pod is Ready.
    pub async fn start(opts: StageOptions) -> Result<Stage> {
        let plane = ControlPlane::start(opts.plane.clone()).await?;
        let nodes = FakeNodes::start(plane.client(), FakeNodesOptions::default()).await?;
        nodes.wait_ready(Duration::from_secs(30)).await?;
        let kubelet = Kubelet::start(&plane, &nodes, opts.kubelet.clone()).await?;
        install_chart(&plane, &opts).await?;
        let mut stage = Stage {
            kubelet,
            nodes,
            plane,
            namespace: opts.namespace.clone(),
            pods: Vec::new(),
            members: opts.members,
        };
        stage.create_pods(&opts).await?;
        Ok(stage)
    }

    async fn create_pods(&mut self, opts: &StageOptions) -> Result<()> {
        let api = self.api();
        for shard in 0..opts.shards {
            for member in 0..opts.members {
                let pod = valkey_pod(&opts.template, shard, member)?;
                let name = pod.metadata.name.clone().unwrap_or_default();
                match api.create(&PostParams::default(), &pod).await {
                    Ok(_) => {}
                    // The client retries a request the busy apiserver answered late; the
                    // first attempt may have created the pod.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
                self.pods.push(name);
            }
        }
        let addrs = wait_valkey_up(&api, &self.pods, Duration::from_secs(60)).await?;
        if opts.form_cluster {
            form_cluster(
                addrs.chunks(opts.members).map(<[_]>::to_vec).collect(),
                Duration::from_secs(30),
            )
            .await?;
        }
        for p in &self.pods {
            self.kubelet
                .wait_ready(&self.namespace, p, Duration::from_secs(60))
                .await?;
        }
        Ok(())
    }

    pub fn api(&self) -> Api<Pod> {
        Api::namespaced(self.plane.client(), &self.namespace)
    }

    /// Valkey's address in `pod`.
    pub fn valkey(&self, pod: &str) -> Result<SocketAddr> {
        let ip = self
            .kubelet
            .pod_ip(&self.namespace, pod)
            .with_context(|| format!("no IP for {pod}"))?;
        Ok(SocketAddr::new(ip.into(), VALKEY_PORT))
    }

    /// The agent's probe address in `pod`.
    pub fn agent(&self, pod: &str) -> Result<SocketAddr> {
        let ip = self
            .kubelet
            .pod_ip(&self.namespace, pod)
            .with_context(|| format!("no IP for {pod}"))?;
        Ok(SocketAddr::new(ip.into(), SIDECAR_PORT))
    }

    /// `master` / `slave` as Valkey's `ROLE` says, `None` when it does not answer.
    pub fn role(&self, pod: &str) -> Option<String> {
        let redis::Value::Array(items) = cmd(self.valkey(pod).ok()?, &["ROLE"]).ok()? else {
            return None;
        };
        match items.first()? {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// The node the pod was scheduled to.
    pub async fn node_of(&self, pod: &str) -> Result<String> {
        let p = self.api().get(pod).await?;
        p.spec
            .and_then(|s| s.node_name)
            .with_context(|| format!("{pod} is not scheduled"))
    }

    /// Waits until the pod object is gone (its containers stopped and the kubelet removed it).
    pub async fn wait_gone(&self, pod: &str, timeout: Duration) -> Result<()> {
        let api = self.api();
        poll_until(
            &format!("{pod} is gone"),
            timeout,
            Duration::from_millis(20),
            || async { Ok(api.get_opt(pod).await?.is_none()) },
        )
        .await
    }

    /// The pod's labels now.
    pub async fn labels(&self, pod: &str) -> Result<BTreeMap<String, String>> {
        Ok(self
            .api()
            .get(pod)
            .await?
            .metadata
            .labels
            .unwrap_or_default())
    }

    /// Sends `signal` (e.g. `STOP`, `CONT`) to kube-apiserver: freezes or thaws the API while
    /// everything else keeps running.
    pub fn signal_apiserver(&self, signal: &str) -> Result<()> {
        let is_apiserver = |p: &u32| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.contains("kube-apiserver"))
        };
        let pid = self
            .plane
            .pids()
            .into_iter()
            .find(is_apiserver)
            .context("no kube-apiserver process")?;
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed");
        }
        Ok(())
    }

    /// Events in the namespace: reason, regarding pod and note, as `kubectl` prints them.
    pub async fn events(&self) -> Result<String> {
        let columns = "custom-columns=REASON:.reason,POD:.regarding.name,NOTE:.note";
        self.plane
            .kubectl(&[
                "get",
                "events.events.k8s.io",
                "-n",
                &self.namespace,
                "-o",
                columns,
            ])
            .await
    }

    /// A counter from the agent's `/metrics` in `pod` (the full sample name with labels).
    pub async fn agent_counter(&self, pod: &str, sample: &str) -> Result<u64> {
        let (code, text) = http_get(self.agent(pod)?, "/metrics", Duration::from_secs(2)).await?;
        if code != 200 {
            bail!("/metrics answered {code}");
        }
        let prefix = format!("{sample} ");
        let value = text.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
        Ok(value.map(|v| v.trim().parse()).transpose()?.unwrap_or(0))
    }

    /// The pods of shard `shard` (including deleted ones).
    pub fn shard_pods(&self, shard: usize) -> &[String] {
        let start = (shard * self.members).min(self.pods.len());
        let end = ((shard + 1) * self.members).min(self.pods.len());
        &self.pods[start..end]
    }

    /// The shard's primary pod by Valkey's own word, and its other members.
    pub fn primary_and_replicas(&self, shard: usize) -> Result<(String, Vec<String>)> {
        let pods = self.shard_pods(shard);
        let primary = pods
            .iter()
            .find(|p| self.role(p).as_deref() == Some("master"))
            .with_context(|| format!("shard {shard} has no primary"))?;
        let others = pods.iter().filter(|p| *p != primary).cloned().collect();
        Ok((primary.clone(), others))
    }

    /// The primary and (first) replica pods of a shard, by Valkey's own word.
    pub fn primary_and_replica(&self, shard: usize) -> Result<(String, String)> {
        let (primary, replicas) = self.primary_and_replicas(shard)?;
        let replica = replicas.into_iter().next().context("no replica")?;
        Ok((primary, replica))
    }
}

/// The chart's RBAC and admission policy, rendered by `helm template` and applied server-side.
async fn install_chart(plane: &ControlPlane, opts: &StageOptions) -> Result<()> {
    plane
        .kubectl(&["create", "namespace", &opts.namespace])
        .await?;
    let chart = std::env::var_os("VALKEY_TESTKIT_CHART").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/valkey-sidecar"),
        PathBuf::from,
    );
    let sets = [
        format!("clusterName={}", opts.template.cluster),
        format!(
            "sidecar.serviceAccount.name={}",
            opts.template.service_account
        ),
        format!("sidecar.readNodes={}", opts.read_nodes),
    ];
    let mut args = vec![
        "template".to_string(),
        opts.template.cluster.clone(),
        chart.display().to_string(),
        "--namespace".into(),
        opts.namespace.clone(),
    ];
    for s in sets {
        args.extend(["--set".into(), s]);
    }
    // Only the agent's permissions: this stage brings its own bare Valkey pods, so the chart's
    // workloads, Services and budgets stay out.
    for t in ["templates/rbac.yaml", "templates/admission-policy.yaml"] {
        args.extend(["--show-only".into(), t.into()]);
    }
    let out = std::process::Command::new(helm_bin()?)
        .args(&args)
        .output()?;
    if !out.status.success() {
        bail!("helm template: {}", String::from_utf8_lossy(&out.stderr));
    }
    let file = plane.dir().join(format!("chart-{}.yaml", opts.namespace));
    std::fs::write(&file, &out.stdout)?;
    plane
        .kubectl(&["apply", "--server-side", "-f", &file.display().to_string()])
        .await?;
    Ok(())
}

/// One watch event: when it arrived, the pod, and its role label.
type Sighting = (Instant, String, Option<String>);

/// Role-label values seen through a watch, with their arrival time.
#[derive(Clone, Default)]
pub struct RoleWatch {
    seen: Arc<Mutex<Vec<Sighting>>>,
}

impl RoleWatch {
    /// Starts watching the pods of `api`; abort the returned task when done.
    pub fn start(api: Api<Pod>, role_label: &str) -> (RoleWatch, tokio::task::JoinHandle<()>) {
        let watch = RoleWatch::default();
        let (sink, key) = (watch.seen.clone(), role_label.to_owned());
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(Ok(pod)) = stream.next().await {
                let role = pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(&key).cloned());
                let entry = (Instant::now(), pod.metadata.name.unwrap_or_default(), role);
                if let Ok(mut seen) = sink.lock() {
                    seen.push(entry);
                }
            }
        });
        (watch, task)
    }

    /// When the watch first showed `pod` with role `want` at or after `since`.
    pub fn seen_at(&self, pod: &str, want: Option<&str>, since: Instant) -> Option<Instant> {
        let seen = self.seen.lock().ok()?;
        seen.iter()
            .find(|(t, p, r)| *t >= since && p == pod && r.as_deref() == want)
            .map(|(t, _, _)| *t)
    }

    /// Waits for [`RoleWatch::seen_at`].
    pub async fn wait(
        &self,
        pod: &str,
        want: Option<&str>,
        since: Instant,
        timeout: Duration,
    ) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(t) = self.seen_at(pod, want, since) {
                return Ok(t);
            }
            if Instant::now() >= deadline {
                bail!("{pod} never showed role {want:?} within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
