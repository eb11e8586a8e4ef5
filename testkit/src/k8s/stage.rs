//! The stage every Kubernetes-level test, the demo and the benchmarks run on: the control plane,
//! six nodes over three zones, the kubelet, and the production chart (`charts/valkey-sidecar`)
//! installed the way a user installs it — kube-controller-manager creates the pods from the
//! chart's StatefulSets, kube-scheduler binds them, the process kubelet runs the chart's Valkey and
//! agent containers with the chart's arguments and probes.
//!
//! There is one pod definition: the chart's. A test chooses the shape with chart values
//! ([`StageOptions::cluster`], [`StageOptions::replication`], an example file, `--set`s and agent
//! settings through `sidecar.env`); the harness overrides only what a loopback host forces
//! (addresses, directories — see the kubelet's module docs). Auth is on, as in the chart's
//! defaults: the stage reads the generated default password back ([`Stage::password`]) and every
//! helper here uses it.
//!
//! The apply order differs from `helm install` in one way (unless [`StageOptions::helm_install`]):
//! the admission policies go first, and the node-index policy is in force (checked with a dry-run
//! pod) before the StatefulSets exist, so every pod is created with `valkey.io/node-index`.
//!
//! Harness limits that shape the tests: pod IPs are loopback addresses, which EndpointSlices may
//! not hold, so the EndpointSlice controller's *attempted* endpoints are read from its events
//! ([`Stage::attempted_endpoints`]). PersistentVolumeClaims bind to local volumes only with
//! [`StageOptions::persistent`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod, Secret, Service};
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use super::chart::{self, label, node_of};
use super::storage::create_local_volumes;
use super::util::poll_until;
use super::valkey::{CLUSTER_LABEL, SIDECAR_PORT, VALKEY_PORT, apply, cmd_with, valkey_addr};
use super::writer::{Targets, Writer, WriterOptions, missing, tag_for_with};
use super::{
    ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions,
    http_get,
};
use crate::Result;
use crate::resp::ClientOptions;
use crate::tls_client::TlsClient;

/// The role label key the chart and the agent use by default.
pub const ROLE_LABEL: &str = "valkey.io/role";

/// How to build a [`Stage`]: the chart's values and the harness around it.
#[derive(Clone, Debug)]
pub struct StageOptions {
    pub namespace: String,
    /// The Helm release (and, by the chart's default, the Valkey deployment's name).
    pub release: String,
    /// Values files, in order (`-f`).
    pub values: Vec<PathBuf>,
    /// `--set` arguments, after the files.
    pub sets: Vec<String>,
    /// `--set-string` arguments, after the `--set`s (agent settings: `sidecar.env.NAME=value`).
    pub set_strings: Vec<String>,
    /// Objects applied before the chart, e.g. the Secret of `auth.existingSecret` (server-side
    /// apply; a namespaced one without a namespace gets [`StageOptions::namespace`]).
    pub objects: Vec<Value>,
    pub plane: ControlPlaneOptions,
    pub kubelet: KubeletOptions,
    /// The fake nodes (six over three zones by default).
    pub nodes: FakeNodesOptions,
    /// Install with `helm install` (a release helm can upgrade and uninstall) instead of rendering
    /// and applying the manifests (policies first, which `helm install` cannot order).
    pub helm_install: bool,
    /// Local PersistentVolumes per node ([`super::storage`]); 0: none.
    pub local_volumes: usize,
    /// Install as this user (impersonated: `helm --kube-as-user`, `kubectl --as`), who holds only
    /// the built-in `admin` ClusterRole, bound in the namespace by the stage: a namespace admin.
    pub install_as: Option<String>,
    /// Labels of the namespace, e.g. `pod-security.kubernetes.io/enforce=restricted`.
    pub namespace_labels: Vec<String>,
    /// Where the chart comes from, as helm arguments (e.g. `oci://…/valkey-sidecar --version 0.1.0
    /// --plain-http`); empty: this repository's `charts/valkey-sidecar`.
    pub chart: Vec<String>,
    /// The chart's Valkey serves TLS only (`tls.enabled`): how the harness's own clients connect
    /// (the CA, their certificate), each verifying the name a real client would — a pod's
    /// headless-Service hostname, else the client Service's.
    pub tls: Option<TlsClient>,
}

impl Default for StageOptions {
    fn default() -> Self {
        Self {
            namespace: "valkey".into(),
            release: "valkey".into(),
            values: Vec::new(),
            sets: Vec::new(),
            set_strings: Vec::new(),
            objects: Vec::new(),
            plane: ControlPlaneOptions::default(),
            kubelet: KubeletOptions::default(),
            helm_install: false,
            nodes: FakeNodesOptions::default(),
            local_volumes: 0,
            install_as: None,
            namespace_labels: Vec::new(),
            chart: Vec::new(),
            tls: None,
        }
    }
}

impl StageOptions {
    /// The chart's defaults in cluster mode: `shards` × (1 + `replicas`) pods in `namespace`.
    pub fn cluster(namespace: &str, shards: usize, replicas: usize) -> Self {
        StageOptions {
            namespace: namespace.into(),
            ..StageOptions::default()
        }
        .set("mode=cluster")
        .set(&format!("shards={shards}"))
        .set(&format!("replicas={replicas}"))
    }

    /// The chart's defaults in replication mode: one shard of 1 + `replicas` pods.
    pub fn replication(namespace: &str, replicas: usize) -> Self {
        StageOptions {
            namespace: namespace.into(),
            ..StageOptions::default()
        }
        .set("mode=replication")
        .set("shards=1")
        .set(&format!("replicas={replicas}"))
    }

    /// The chart with the values file `examples/<name>.yaml` of this repository, and the Secret
    /// `valkey-auth` the examples name (`auth.existingSecret`), created first as they say.
    pub fn example(namespace: &str, name: &str) -> Self {
        StageOptions {
            namespace: namespace.into(),
            values: vec![chart::example(name)],
            objects: vec![auth_secret("valkey-auth")],
            ..StageOptions::default()
        }
    }

    /// The chart generates the auth Secret (`auth.existingSecret=`) instead of the example's
    /// `valkey-auth` created beforehand.
    pub fn generated_auth(mut self) -> Self {
        self.objects
            .retain(|o| o["kind"] != "Secret" || o["metadata"]["name"] != "valkey-auth");
        self.set("auth.existingSecret=")
    }

    /// The chart's `persistence.enabled` path: a claim per pod, bound to one of two local volumes
    /// per node ([`super::storage`]).
    pub fn persistent(mut self) -> Self {
        self.local_volumes = 2;
        self.set("persistence.enabled=true").set(&format!(
            "persistence.storageClassName={}",
            super::storage::LOCAL_CLASS
        ))
    }

    /// One more `--set`.
    pub fn set(mut self, set: &str) -> Self {
        self.sets.push(set.into());
        self
    }

    /// An agent setting: `sidecar.env.<name>=<value>` (as a string).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.set_strings.push(format!("sidecar.env.{name}={value}"));
        self
    }

    /// More `valkey-server` arguments (`valkey.extraArgs`), e.g. `--enable-debug-command yes`
    /// for a test that blocks Valkey with `DEBUG SLEEP`.
    pub fn valkey_args(self, args: &[&str]) -> Self {
        let list = args
            .iter()
            .map(|a| a.replace(',', "\\,"))
            .collect::<Vec<_>>()
            .join(",");
        self.set(&format!("valkey.extraArgs={{{list}}}"))
    }

    /// A short coordinator and shard-record lease: `lease` / renew deadline / retry period.
    pub fn lease(self, lease: &str, renew: &str, retry: &str) -> Self {
        self.env("SIDECAR_LEASE_DURATION", lease)
            .env("SIDECAR_LEASE_RENEW_DEADLINE", renew)
            .env("SIDECAR_LEASE_RETRY_PERIOD", retry)
    }

    /// Installed by a namespace admin (see [`StageOptions::install_as`]).
    pub fn as_namespace_admin(mut self, user: &str) -> Self {
        self.install_as = Some(user.into());
        self
    }

    /// Pod Security Admission enforces `level` in the namespace.
    pub fn pod_security(mut self, level: &str) -> Self {
        self.namespace_labels
            .push(format!("pod-security.kubernetes.io/enforce={level}"));
        self
    }

    /// On another pinned Kubernetes minor (`"1.30"`).
    pub fn kubernetes(mut self, minor: &str) -> Self {
        self.plane.kubernetes = Some(minor.into());
        self
    }

    /// Other fake nodes.
    pub fn nodes(mut self, nodes: FakeNodesOptions) -> Self {
        self.nodes = nodes;
        self
    }
}

/// A running chart install; fields drop in declaration order: pods' processes, nodes, control
/// plane (shared with the releases installed beside it, [`Stage::install_beside`]: the last one
/// dropped stops them).
pub struct Stage {
    pub kubelet: Arc<Kubelet>,
    pub nodes: Arc<FakeNodes>,
    pub plane: Arc<ControlPlane>,
    pub namespace: String,
    /// The Helm release.
    pub release: String,
    /// The Valkey deployment's name (`valkey.io/cluster`).
    pub cluster: String,
    /// The rendered manifests as applied.
    pub manifest: PathBuf,
    /// The pods the chart's StatefulSets create, in order: shard 0's (`<cluster>-0-0`,
    /// `<cluster>-0-1`, …), then shard 1's, …
    pub pods: Vec<String>,
    /// Pods per shard.
    pub members: usize,
    /// The default user's password (auth on), read back from the chart's Secret.
    pub password: Option<String>,
    /// Who installed it (impersonated), if not the admin.
    pub installed_as: Option<String>,
    /// Where the chart came from, as helm arguments ([`StageOptions::chart`]).
    chart: Vec<String>,
    /// [`StageOptions::tls`].
    pub tls: Option<TlsClient>,
}

impl Stage {
    /// Installs the chart and waits until the deployment has settled: every pod Ready and
    /// labelled, one primary per shard (the agents formed the cluster or bootstrapped the record).
    pub async fn start(opts: StageOptions) -> Result<Stage> {
        let stage = Stage::install(opts).await?;
        let shards = stage.pods.len() / stage.members.max(1);
        stage
            .wait_settled(stage.pods.len(), shards, Duration::from_secs(120))
            .await?;
        // Ready lags Valkey by up to a probe period: a replica that was Ready as a fenced empty
        // master a moment before its `REPLICAOF` still shows Ready while its first full sync
        // waits out `repl-diskless-sync-delay`. A test that faulted the primary then would find
        // no replica that ever synced, and rightly no failover.
        stage.wait_synced(Duration::from_secs(60)).await?;
        Ok(stage)
    }

    /// Waits until every pod whose Valkey answers as a replica has its link to its primary up
    /// (`master_link_status:up`): its first sync is done.
    pub async fn wait_synced(&self, timeout: Duration) -> Result<()> {
        let waited = poll_until(
            "every replica synced with its primary",
            timeout,
            Duration::from_millis(100),
            || async { Ok(self.pods.iter().all(|p| self.synced(p))) },
        )
        .await;
        if let Err(e) = waited {
            bail!("{e:#}\n{}", self.describe().await);
        }
        Ok(())
    }

    /// Not a replica (or not answering), or a replica with its link up.
    fn synced(&self, pod: &str) -> bool {
        if self.role(pod).as_deref() != Some("slave") {
            return true;
        }
        let text = match self.cmd(pod, &["INFO", "replication"]) {
            Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
            Ok(redis::Value::VerbatimString { text, .. }) => text,
            _ => return false,
        };
        crate::info_field(&text, "master_link_status") == Some("up")
    }

    /// Starts the control plane, the nodes and the kubelet, then installs the chart. Returns once
    /// everything is applied; the pods come up on their own (see [`Stage::wait_settled`]).
    pub async fn install(opts: StageOptions) -> Result<Stage> {
        let plane = ControlPlane::start(opts.plane.clone()).await?;
        let nodes = FakeNodes::start(plane.client(), opts.nodes.clone()).await?;
        nodes.wait_ready(Duration::from_secs(30)).await?;
        if opts.local_volumes > 0 {
            let root = plane.dir().join("local-volumes");
            let names = nodes.names();
            create_local_volumes(&plane.client(), &root, &names, opts.local_volumes).await?;
        }
        let kubelet = Kubelet::start(&plane, &nodes, opts.kubelet.clone()).await?;
        let shared = (Arc::new(kubelet), Arc::new(nodes), Arc::new(plane));
        Stage::install_release(shared, opts).await
    }

    /// Installs `opts`'s chart beside this stage's release: on the same control plane, nodes and
    /// kubelet (`opts.plane`, `opts.nodes` and `opts.kubelet` are not used), in the same namespace
    /// or another. Returns once everything is applied, like [`Stage::install`].
    pub async fn install_beside(&self, opts: StageOptions) -> Result<Stage> {
        let shared = (self.kubelet.clone(), self.nodes.clone(), self.plane.clone());
        Stage::install_release(shared, opts).await
    }

    /// The namespace (created unless it exists), its binding for the installing user, the
    /// objects and the chart of `opts`, on a running control plane.
    async fn install_release(
        (kubelet, nodes, plane): (Arc<Kubelet>, Arc<FakeNodes>, Arc<ControlPlane>),
        opts: StageOptions,
    ) -> Result<Stage> {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(plane.client());
        if namespaces.get_opt(&opts.namespace).await?.is_none() {
            plane
                .kubectl(&["create", "namespace", &opts.namespace])
                .await?;
        }
        for label in &opts.namespace_labels {
            plane
                .kubectl(&["label", "namespace", &opts.namespace, label])
                .await?;
        }
        if let Some(user) = &opts.install_as {
            let binding = format!("{user}-admin");
            let user = format!("--user={user}");
            let args = [
                "create",
                "rolebinding",
                &binding,
                "--clusterrole=admin",
                &user,
            ];
            plane
                .kubectl(&[&args[..], &["-n", &opts.namespace]].concat())
                .await?;
        }
        for mut object in opts.objects.clone() {
            if object["metadata"]["namespace"].is_null() && object["kind"] != "Namespace" {
                object["metadata"]["namespace"] = json!(opts.namespace);
            }
            apply(&plane.client(), object).await?;
        }
        let (cluster, manifest) = chart::install(&plane, &opts).await?;
        let chart = chart::chart_source(&opts);
        let mut stage = Stage {
            kubelet,
            nodes,
            plane,
            namespace: opts.namespace,
            release: opts.release,
            cluster,
            manifest,
            pods: Vec::new(),
            members: 0,
            password: None,
            installed_as: opts.install_as.clone(),
            chart,
            tls: opts.tls.clone(),
        };
        stage.learn_deployment().await?;
        Ok(stage)
    }

    /// The pod names and the password, from the StatefulSets as the apiserver has them.
    async fn learn_deployment(&mut self) -> Result<()> {
        let api: Api<StatefulSet> = Api::namespaced(self.plane.client(), &self.namespace);
        let selector = format!("{CLUSTER_LABEL}={}", self.cluster);
        let mut sets = api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        sets.sort_by_key(|s| shard_of(s).unwrap_or(usize::MAX));
        for set in &sets {
            let name = set.metadata.name.clone().unwrap_or_default();
            let replicas = set.spec.replicas.unwrap_or(1);
            let replicas = usize::try_from(replicas).unwrap_or(0);
            self.members = self.members.max(replicas);
            self.pods
                .extend((0..replicas).map(|i| format!("{name}-{i}")));
        }
        if let Some(set) = sets.first() {
            self.password = self.default_password(set).await?;
        }
        Ok(())
    }

    /// The default user's password ([`password_ref`]), if the pods have one.
    async fn default_password(&self, set: &StatefulSet) -> Result<Option<String>> {
        let Some(reference) = password_ref(set) else {
            return Ok(None);
        };
        Ok(Some(self.secret(&reference.0, &reference.1).await?))
    }

    /// `helm uninstall` of a release made with [`StageOptions::helm_install`], waiting until its
    /// objects are gone.
    pub fn uninstall(&self) -> Result<String> {
        let kubeconfig = self.plane.kubeconfig_path().display().to_string();
        let args = ["uninstall", &self.release, "--namespace", &self.namespace];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.extend(["--wait".into(), "--kubeconfig".into(), kubeconfig]);
        chart::helm(&args)
    }

    /// `kubectl drain` of `node` as a platform team runs it (DaemonSets ignored, emptyDir data
    /// deleted), giving up after `timeout`.
    pub async fn drain(&self, node: &str, timeout: Duration) -> Result<String> {
        let timeout = format!("--timeout={}s", timeout.as_secs());
        let args = [
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            &timeout,
        ];
        self.plane.kubectl(&args).await
    }

    /// `helm get notes` of a release made with [`StageOptions::helm_install`]: what the install
    /// printed after its objects.
    pub fn notes(&self) -> Result<String> {
        let kubeconfig = self.plane.kubeconfig_path().display().to_string();
        let args = ["get", "notes", &self.release, "-n", &self.namespace];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.extend(["--kubeconfig".into(), kubeconfig]);
        chart::helm(&args)
    }

    /// `helm test` of a release made with [`StageOptions::helm_install`], as whoever installed it.
    /// On failure the error carries what the test pod said (its termination message).
    pub async fn helm_test(&self) -> Result<String> {
        let mut args: Vec<String> = vec!["test".into(), self.release.clone()];
        args.extend(["--namespace".into(), self.namespace.clone()]);
        args.extend(["--timeout".into(), "120s".into(), "--kubeconfig".into()]);
        args.push(self.plane.kubeconfig_path().display().to_string());
        if let Some(user) = &self.installed_as {
            args.extend(["--kube-as-user".into(), user.clone()]);
        }
        match chart::helm(&args) {
            Ok(out) => Ok(out),
            Err(e) => bail!("{e:#}\nthe test pod said: {}", self.check_message().await),
        }
    }

    /// The termination message of the `helm test` pod's container.
    async fn check_message(&self) -> String {
        let pod = format!("{}-check", self.cluster);
        let Ok(p) = self.api().get(&pod).await else {
            return format!("(no pod {pod})");
        };
        let statuses = p
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default();
        statuses
            .iter()
            .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `helm upgrade --reuse-values` of a release made with [`StageOptions::helm_install`], with
    /// more `--set`s.
    pub fn upgrade(&self, sets: &[&str]) -> Result<String> {
        let mut args: Vec<String> = vec!["upgrade".into(), self.release.clone()];
        args.extend(self.chart.clone());
        args.extend(["--reuse-values".into(), "--namespace".into()]);
        args.push(self.namespace.clone());
        args.push("--kubeconfig".into());
        args.push(self.plane.kubeconfig_path().display().to_string());
        for set in sets {
            args.extend(["--set".into(), (*set).to_owned()]);
        }
        chart::helm(&args)
    }

    /// Waits until every StatefulSet of the deployment has rolled out its current template: all
    /// pods updated and Ready.
    pub async fn wait_rolled(&self, timeout: Duration) -> Result<()> {
        let api: Api<StatefulSet> = Api::namespaced(self.plane.client(), &self.namespace);
        let selector = format!("{CLUSTER_LABEL}={}", self.cluster);
        let waited = poll_until(
            "rolled out",
            timeout,
            Duration::from_millis(500),
            || async {
                let sets = api.list(&ListParams::default().labels(&selector)).await?;
                Ok(sets.items.iter().all(rolled_out))
            },
        )
        .await;
        if let Err(e) = waited {
            bail!("{e:#}\n{}", self.describe().await);
        }
        Ok(())
    }

    pub fn api(&self) -> Api<Pod> {
        Api::namespaced(self.plane.client(), &self.namespace)
    }

    /// The Valkey deployment's pods as the apiserver has them now, by name.
    pub async fn pod_objects(&self) -> Result<Vec<Pod>> {
        let selector = format!("{CLUSTER_LABEL}={}", self.cluster);
        let mut pods = self
            .api()
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }

    /// Valkey's address in `pod` (its current incarnation's IP).
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

    /// One command to `pod`'s Valkey as the default user.
    pub fn cmd(&self, pod: &str, args: &[&str]) -> Result<redis::Value> {
        let mut client = self.client();
        let name = format!("{pod}.{}-headless.{}.svc", self.cluster, self.namespace);
        client.tls = client.tls.map(|t| t.named(&name));
        cmd_with(self.valkey(pod)?, &client, args)
    }

    /// One command to the Valkey at `addr` as the default user.
    pub fn cmd_at(&self, addr: SocketAddr, args: &[&str]) -> Result<redis::Value> {
        cmd_with(addr, &self.client(), args)
    }

    /// Empties every primary (`FLUSHALL SYNC`, which their replicas follow): a benchmark's runs
    /// start from the same empty dataset instead of one that grows run after run past the chart's
    /// `maxmemory`. Pods that do not answer as a master are left alone. A primary that refuses
    /// the write for now — `NOREPLICAS` while its replicas link up after a start (the chart's
    /// `min-replicas-to-write`), a pause — is asked again every 100 ms for up to 30 s.
    pub fn flush_primaries(&self) -> Result<()> {
        for pod in self
            .pods
            .iter()
            .filter(|p| self.role(p).as_deref() == Some("master"))
        {
            self.flush(pod)
                .with_context(|| format!("FLUSHALL on {pod}"))?;
        }
        Ok(())
    }

    fn flush(&self, pod: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.cmd(pod, &["FLUSHALL", "SYNC"]) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// `master` / `slave` as Valkey's `ROLE` says, `None` when it does not answer.
    pub fn role(&self, pod: &str) -> Option<String> {
        let redis::Value::Array(items) = self.cmd(pod, &["ROLE"]).ok()? else {
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

    /// Waits until the pod object as it is now is gone (its containers stopped and the kubelet
    /// removed it): the name may come back at once, the StatefulSet's new pod of the same name.
    pub async fn wait_gone(&self, pod: &str, timeout: Duration) -> Result<()> {
        let Some(uid) = self.pod_uid(pod).await? else {
            return Ok(());
        };
        self.wait_uid_gone(pod, &uid, timeout).await
    }

    /// The uid of `pod` now; `None` when there is no such pod.
    pub async fn pod_uid(&self, pod: &str) -> Result<Option<String>> {
        Ok(self.api().get_opt(pod).await?.and_then(|p| p.metadata.uid))
    }

    /// Waits until the pod named `pod` with `uid` is gone: absent, or replaced by its
    /// StatefulSet's next pod of the same name (which may already be there when this is called).
    pub async fn wait_uid_gone(&self, pod: &str, uid: &str, timeout: Duration) -> Result<()> {
        let api = self.api();
        let gone = |p: Option<Pod>| p.is_none_or(|p| p.metadata.uid.as_deref() != Some(uid));
        poll_until(
            &format!("{pod} is gone"),
            timeout,
            Duration::from_millis(20),
            || async { Ok(gone(api.get_opt(pod).await?)) },
        )
        .await
    }

    /// Deletes `pod` and waits until its StatefulSet's replacement is Ready: a fresh pod, whose
    /// containers the kubelet restarts at once on their first crash again (a container that
    /// crashed before restarts only after the crash-loop back-off).
    pub async fn recycle(&self, pod: &str, timeout: Duration) -> Result<()> {
        self.api().delete(pod, &Default::default()).await?;
        self.wait_gone(pod, timeout).await?;
        self.kubelet
            .wait_ready(&self.namespace, pod, timeout)
            .await?;
        Ok(())
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

    /// Waits until every pod's role label says what its Valkey says, and its shard and zone
    /// labels are set.
    pub async fn wait_labels_true(&self, timeout: Duration) -> Result<()> {
        poll_until(
            "labels match Valkey",
            timeout,
            Duration::from_millis(50),
            || async {
                for p in &self.pods {
                    if !self.labelled_true(p).await? {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
        .await
    }

    async fn labelled_true(&self, pod: &str) -> Result<bool> {
        let want = match self.role(pod).as_deref() {
            Some("master") => "primary",
            Some("slave") => "replica",
            _ => return Ok(false),
        };
        let labels = self.labels(pod).await?;
        Ok(labels.get(ROLE_LABEL).map(String::as_str) == Some(want)
            && labels.contains_key("valkey.io/shard-id")
            && labels.contains_key("valkey.io/zone"))
    }

    /// Sends `signal` (e.g. `STOP`, `CONT`) to one container's process: the rest of the pod
    /// runs on (a hung agent, a frozen Valkey).
    pub fn signal_container(&self, pod: &str, container: &str, signal: &str) -> Result<()> {
        let pid = self
            .kubelet
            .container_pid(&self.namespace, pod, container)
            .with_context(|| format!("no process for {pod}/{container}"))?;
        kill(pid, signal)
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
        kill(pid, signal)
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

    /// `sample` summed over every pod's agent: a counter that only some agents keep (the
    /// coordinator's), or one read for the whole deployment.
    pub async fn agents_counter(&self, sample: &str) -> Result<u64> {
        let mut total = 0;
        for pod in &self.pods {
            total += self.agent_counter(pod, sample).await?;
        }
        Ok(total)
    }

    /// How many shards the stage has, and how many pods each.
    pub fn shape(&self) -> (usize, usize) {
        (self.pods.len() / self.members.max(1), self.members)
    }

    /// The pods of shard `shard` by name (whether or not they exist now).
    pub fn shard_pods(&self, shard: usize) -> &[String] {
        let start = (shard * self.members).min(self.pods.len());
        let end = ((shard + 1) * self.members).min(self.pods.len());
        &self.pods[start..end]
    }

    /// The shard's primary pod by Valkey's own word, and its other members. In cluster mode the
    /// primary is the master that owns slots: a pod the StatefulSet just recreated empty is a
    /// master too until the agents make it a replica.
    pub fn primary_and_replicas(&self, shard: usize) -> Result<(String, Vec<String>)> {
        let pods = self.shard_pods(shard);
        let primary = pods
            .iter()
            .filter_map(|p| Some((self.master_rank(p)?, p)))
            .filter(|(_, p)| self.serves_slots(p))
            .max_by_key(|(rank, _)| *rank)
            .map(|(_, p)| p)
            .with_context(|| format!("shard {shard} has no primary"))?;
        let others = pods.iter().filter(|p| *p != primary).cloned().collect();
        Ok((primary.clone(), others))
    }

    /// For a master: how many replicas it lists, then its replication offset (`ROLE`). A pod
    /// recreated in replication mode answers as an empty master until its agent points it at the
    /// primary; the shard's primary is the master its replicas follow, not the first one asked.
    fn master_rank(&self, pod: &str) -> Option<(usize, i64)> {
        let redis::Value::Array(items) = self.cmd(pod, &["ROLE"]).ok()? else {
            return None;
        };
        match items.as_slice() {
            [
                redis::Value::BulkString(role),
                offset,
                redis::Value::Array(replicas),
                ..,
            ] if role.as_slice() == b"master" => {
                let offset = match offset {
                    redis::Value::Int(n) => *n,
                    _ => 0,
                };
                Some((replicas.len(), offset))
            }
            _ => None,
        }
    }

    /// Whether `pod`'s Valkey owns hash slots (`CLUSTER NODES`, its `myself` line); true without
    /// Cluster (replication mode), where a master is a primary.
    fn serves_slots(&self, pod: &str) -> bool {
        match self.cmd(pod, &["CLUSTER", "NODES"]) {
            Ok(redis::Value::BulkString(b)) => owns_slots(&String::from_utf8_lossy(&b)),
            Ok(redis::Value::VerbatimString { text, .. }) => owns_slots(&text),
            Ok(_) => false,
            Err(e) => format!("{e:#}").contains("cluster support disabled"),
        }
    }

    /// The primary and (first) replica pods of a shard, by Valkey's own word.
    pub fn primary_and_replica(&self, shard: usize) -> Result<(String, String)> {
        let (primary, replicas) = self.primary_and_replicas(shard)?;
        let replica = replicas.into_iter().next().context("no replica")?;
        Ok((primary, replica))
    }

    /// A status condition the coordinator writes on its Lease (`status.valkey.io/<type>`):
    /// `"<True|False> <Reason>: <message>"`, if present.
    pub async fn condition(&self, type_: &str) -> Result<Option<String>> {
        let annotations = self
            .coordinator_lease()
            .await?
            .and_then(|l| l.metadata.annotations)
            .unwrap_or_default();
        Ok(annotations
            .get(&format!("status.valkey.io/{type_}"))
            .cloned())
    }

    /// The coordinator Lease (`<cluster>-coordinator`), if it exists.
    pub async fn coordinator_lease(&self) -> Result<Option<Lease>> {
        let leases: Api<Lease> = Api::namespaced(self.plane.client(), &self.namespace);
        let name = format!("{}-coordinator", self.cluster);
        Ok(leases.get_opt(&name).await?)
    }

    /// A client that authenticates with `pod`'s own bound ServiceAccount token (the kubelet keeps
    /// it next to the pod's kubeconfig): an attacker who took it from the pod.
    pub async fn client_as_pod(&self, pod: &str) -> Result<kube::Client> {
        let kubeconfig = self
            .kubelet
            .pod_kubeconfig(&self.namespace, pod)
            .with_context(|| format!("no kubeconfig for {pod}"))?;
        let token = std::fs::read_to_string(kubeconfig.with_file_name("token"))?;
        self.plane.client_for_token(token.trim()).await
    }

    /// Which pod holds the coordinator Lease now (the holder identity is `<pod>_<pod uid>`).
    pub async fn coordinator_holder(&self) -> Result<Option<String>> {
        let lease = self.coordinator_lease().await?;
        Ok(lease.as_ref().and_then(lease_holder))
    }

    /// Every holder of the coordinator Lease in turn, from a watch on that one Lease: a holder
    /// that held for less than a poll's round trip (a successor that took over, handed its own
    /// primary over and released on its way out) shows here, where polling missed it once in CI.
    /// Abort the returned task when done.
    pub fn watch_coordinator_holders(&self) -> (HolderWatch, tokio::task::JoinHandle<()>) {
        self.watch_lease_holders(&format!("{}-coordinator", self.cluster))
    }

    /// Every holder of the Lease `name` in the stage's namespace in turn (a shard record:
    /// `<cluster>-<shard>-primary`), from a watch on it. Abort the returned task when done.
    pub fn watch_lease_holders(&self, name: &str) -> (HolderWatch, tokio::task::JoinHandle<()>) {
        let leases: Api<Lease> = Api::namespaced(self.plane.client(), &self.namespace);
        let name = format!("metadata.name={name}");
        HolderWatch::start(leases, watcher::Config::default().fields(&name))
    }

    /// The pods the coordinator Lease names to take over first (`valkey.io/successors`).
    pub async fn coordinator_successors(&self) -> Result<Vec<String>> {
        let lease = self.coordinator_lease().await?;
        Ok(lease.as_ref().map(lease_successors).unwrap_or_default())
    }

    /// Waits until some agent holds the coordinator Lease; returns it.
    pub async fn wait_coordinator(&self, timeout: Duration) -> Result<String> {
        poll_until(
            "a coordinator holds the lease",
            timeout,
            Duration::from_millis(100),
            || async { Ok(self.coordinator_holder().await?.is_some()) },
        )
        .await?;
        self.coordinator_holder()
            .await?
            .context("the coordinator Lease lost its holder")
    }

    /// Every object left in the namespace (`kind/name`), but what every namespace has (the
    /// `default` ServiceAccount, the `kube-root-ca.crt` ConfigMap) and Events, which expire.
    pub async fn leftovers(&self) -> Result<Vec<String>> {
        let kinds = self
            .plane
            .kubectl(&[
                "api-resources",
                "--verbs=list",
                "--namespaced",
                "-o",
                "name",
            ])
            .await?;
        let kinds: Vec<&str> = kinds.lines().filter(|k| !k.starts_with("events")).collect();
        let listed = self
            .plane
            .kubectl(&["get", &kinds.join(","), "-n", &self.namespace, "-o", "name"])
            .await?;
        let expected = ["serviceaccount/default", "configmap/kube-root-ca.crt"];
        let mut left: Vec<String> = listed
            .lines()
            .filter(|l| !l.is_empty() && !expected.contains(l))
            .map(str::to_owned)
            .collect();
        // The chart's cluster-scoped kinds that this apiserver serves (MutatingAdmissionPolicy
        // only from 1.36).
        let served = self
            .plane
            .kubectl(&["api-resources", "--namespaced=false", "-o", "name"])
            .await?;
        let wanted = [
            "clusterroles.rbac.authorization.k8s.io",
            "clusterrolebindings.rbac.authorization.k8s.io",
            "validatingadmissionpolicies.admissionregistration.k8s.io",
            "validatingadmissionpolicybindings.admissionregistration.k8s.io",
            "mutatingadmissionpolicies.admissionregistration.k8s.io",
            "mutatingadmissionpolicybindings.admissionregistration.k8s.io",
        ];
        let cluster_wide: Vec<&str> = served.lines().filter(|k| wanted.contains(k)).collect();
        let selector = format!("app.kubernetes.io/instance={}", self.release);
        let args = [
            "get",
            &cluster_wide.join(","),
            "-l",
            &selector,
            "-o",
            "name",
        ];
        let global = self.plane.kubectl(&args).await?;
        left.extend(global.lines().filter(|l| !l.is_empty()).map(str::to_owned));
        Ok(left)
    }

    /// Waits until `count` pods of the deployment exist and every one has an IP and a Valkey
    /// that answers `PING`; returns them by name.
    pub async fn wait_valkey_up(&self, count: usize, timeout: Duration) -> Result<Vec<Pod>> {
        let what = format!("{count} pods with Valkey up");
        poll_until(&what, timeout, Duration::from_millis(200), || async {
            let pods = self.pod_objects().await?;
            if pods.len() != count {
                return Ok(false);
            }
            for pod in &pods {
                let Some(addr) = valkey_addr(pod) else {
                    return Ok(false);
                };
                let client = self.client();
                let up =
                    tokio::task::spawn_blocking(move || cmd_with(addr, &client, &["PING"]).is_ok())
                        .await?;
                if !up {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await?;
        self.pod_objects().await
    }

    /// Waits until `count` pods of the deployment exist and all are Ready; returns them by name.
    pub async fn wait_ready(&self, count: usize, timeout: Duration) -> Result<Vec<Pod>> {
        let what = format!("{count} pods Ready");
        let waited = poll_until(&what, timeout, Duration::from_millis(200), || async {
            let pods = self.pod_objects().await?;
            Ok(pods.len() == count && pods.iter().all(super::pod_is_ready))
        })
        .await;
        if let Err(e) = waited {
            let (pods, why) = (self.describe().await, self.diagnose_unsettled().await);
            bail!("{e:#}\n{pods}\n{why}");
        }
        self.pod_objects().await
    }

    /// Waits until `count` pods exist, all Ready (none terminating), each with a role label, and
    /// `primaries` of them labelled primary: the deployment settled. Returns them by name.
    pub async fn wait_settled(
        &self,
        count: usize,
        primaries: usize,
        timeout: Duration,
    ) -> Result<Vec<Pod>> {
        let what = format!("{count} pods Ready, {primaries} primaries");
        let waited =
            poll_until(&what, timeout, Duration::from_millis(200), || async {
                let pods = self.pod_objects().await?;
                let led = pods
                    .iter()
                    .filter(|p| label(p, ROLE_LABEL) == Some("primary"))
                    .count();
                Ok(pods.len() == count
                    && pods.iter().all(super::diagnose::settled)
                    && led == primaries)
            })
            .await;
        if let Err(e) = waited {
            let (pods, why) = (self.describe().await, self.diagnose_unsettled().await);
            bail!("{e:#}\n{pods}\n{why}");
        }
        self.pod_objects().await
    }

    /// Pods with their node, readiness and valkey.io labels, for failure messages.
    pub async fn describe(&self) -> String {
        let Ok(pods) = self.pod_objects().await else {
            return "(pods cannot be listed)".into();
        };
        pods.iter()
            .map(|p| {
                let labels: Vec<String> = p
                    .metadata
                    .labels
                    .iter()
                    .flatten()
                    .filter(|(k, _)| k.starts_with("valkey.io/"))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!(
                    "{} node={} ready={} {}",
                    p.metadata.name.as_deref().unwrap_or("?"),
                    node_of(p).unwrap_or("-"),
                    super::pod_is_ready(p),
                    labels.join(",")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A key of a Secret in the namespace, as text.
    /// Waits up to a minute for it: the chart's credentials Job makes its Secret after install.
    pub async fn secret(&self, name: &str, key: &str) -> Result<String> {
        let api: Api<Secret> = Api::namespaced(self.plane.client(), &self.namespace);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let secret = api.get_opt(name).await?;
            if let Some(value) = secret.and_then(|s| s.data?.get(key).cloned()) {
                return Ok(String::from_utf8(value.0)?);
            }
            if Instant::now() > deadline {
                bail!("secret {name} has no key {key} after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The pods a Service's selector picks, by name: what its EndpointSlices should hold.
    pub async fn service_pods(&self, service: &str) -> Result<Vec<Pod>> {
        let api: Api<Service> = Api::namespaced(self.plane.client(), &self.namespace);
        let selector = api
            .get(service)
            .await?
            .spec
            .and_then(|s| s.selector)
            .with_context(|| format!("service {service} has no selector"))?;
        let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut pods = self
            .api()
            .list(&ListParams::default().labels(&labels.join(",")))
            .await?
            .items;
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }

    /// The endpoint IPs kube-controller-manager's EndpointSlice controller last tried to write
    /// for `service`. The harness's pod IPs are loopback addresses, which the apiserver refuses
    /// in EndpointSlices; the controller reports the refused addresses in a
    /// `FailedToUpdateEndpointSlices` event, so that event shows the endpoints it computed.
    /// `None` before any such event.
    pub async fn attempted_endpoints(&self, service: &str) -> Result<Option<BTreeSet<String>>> {
        let api: Api<Event> = Api::namespaced(self.plane.client(), &self.namespace);
        let events = api.list(&ListParams::default()).await?.items;
        let latest = events
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("FailedToUpdateEndpointSlices")
                    && e.involved_object.kind.as_deref() == Some("Service")
                    && e.involved_object.name.as_deref() == Some(service)
            })
            .max_by_key(|e| {
                let at = e.last_timestamp.as_ref().map(|t| t.0);
                (at, e.count.unwrap_or(0))
            });
        Ok(latest.map(|e| chart::quoted_ips(e.message.as_deref().unwrap_or(""))))
    }
}

/// Clients of the deployment's Valkeys, as its users would be: authenticated, 1 s timeouts.
impl Stage {
    /// How a client of this deployment connects (the default user's password, 1 s timeouts).
    pub fn client(&self) -> ClientOptions {
        let service = format!("{}.{}.svc", self.cluster, self.namespace);
        ClientOptions {
            password: self.password.clone(),
            tls: self.tls.as_ref().map(|t| t.named(&service)),
            ..ClientOptions::default()
        }
    }

    /// A client that watches from outside every fault: the kubelet's observer address (no node
    /// fault cuts it), for checkers that must see both sides of a partition.
    pub fn observer(&self) -> ClientOptions {
        ClientOptions {
            source: Some(self.kubelet.observer_ip()),
            ..self.client()
        }
    }

    /// A client on `node`'s side of a partition: its source address is the node's own.
    pub fn client_on(&self, node: &str) -> Result<ClientOptions> {
        Ok(ClientOptions {
            source: Some(self.kubelet.node_client_ip(node)?),
            ..self.client()
        })
    }

    /// A writer of `{tag}:n` keys over `addrs` (whichever accepts writes).
    pub fn writer(&self, addrs: Vec<SocketAddr>, tag: &str) -> Writer {
        self.writer_with(Arc::new(Mutex::new(addrs)), tag, self.client())
    }

    /// A writer over a list the caller keeps current, with its own client options (e.g. a source
    /// address on one side of a partition).
    pub fn writer_with(&self, targets: Targets, tag: &str, client: ClientOptions) -> Writer {
        let opts = WriterOptions {
            client,
            tag: tag.to_owned(),
        };
        Writer::start_with(targets, opts)
    }

    /// A writer on shard `shard` of a Valkey Cluster: keys of a hash tag the shard serves, over
    /// all its members.
    pub fn shard_writer(&self, shard: usize) -> Result<Writer> {
        let (primary, _) = self.primary_and_replicas(shard)?;
        let tag = tag_for_with(self.valkey(&primary)?, &self.client())?;
        let addrs = self
            .shard_pods(shard)
            .iter()
            .map(|p| self.valkey(p))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.writer(addrs, &tag))
    }

    /// How many of `acked` (`{tag}:n` keys) `pod`'s Valkey lacks.
    pub fn lost(&self, pod: &str, tag: &str, acked: &[u64]) -> Result<usize> {
        Ok(missing(self.valkey(pod)?, &self.client(), tag, acked)?.len())
    }
}

/// A StatefulSet whose controller has seen its spec and brought every replica to it, Ready. Not
/// `currentRevision == updateRevision`: under `OnDelete` (the chart's supervised roll) the
/// controller never advances `currentRevision`; `updatedReplicas` counts the pods at the update
/// revision under either strategy.
fn rolled_out(set: &StatefulSet) -> bool {
    let Some(status) = &set.status else {
        return false;
    };
    let want = set.spec.replicas.unwrap_or(1);
    status.observed_generation == set.metadata.generation
        && status.update_revision.is_some()
        && status.updated_replicas == Some(want)
        && status.ready_replicas == Some(want)
}

/// The pod of a coordinator Lease holder identity (`<pod>_<pod uid>`; pod names have no `_`).
pub fn holder_pod(identity: &str) -> &str {
    valkey_sidecar_core::lease::identity_pod(identity)
}

/// A Secret `name` with the chart's three auth keys (test passwords named after the key, and the
/// agent password's SHA-256, `printf %s test-agent-password | sha256sum`).
pub fn auth_secret(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": name },
        "stringData": {
            "default-password": "test-default-password",
            "agent-password": "test-agent-password",
            "agent-password-sha256": "f4bdc3ad73351e339aeac3f135dc2f6a7265183c02733d668691a6a766e318a2",
        },
    })
}

/// Whether the `myself` line of a `CLUSTER NODES` reply lists slots (fields after the eighth).
fn owns_slots(nodes: &str) -> bool {
    nodes
        .lines()
        .find(|l| {
            l.split_whitespace()
                .nth(2)
                .is_some_and(|f| f.contains("myself"))
        })
        .is_some_and(|l| l.split_whitespace().count() > 8)
}

/// A StatefulSet's shard index (`valkey.io/shard-index`).
fn shard_of(set: &StatefulSet) -> Option<usize> {
    set.metadata
        .labels
        .as_ref()?
        .get(super::valkey::SHARD_INDEX_LABEL)?
        .parse()
        .ok()
}

/// The Secret name and key of the default password: the chart's `valkey-passwords` volume, its
/// `default` item (only the `valkey-config` init container mounts it).
fn password_ref(set: &StatefulSet) -> Option<(String, String)> {
    let template = set.spec.template.spec.as_ref()?;
    let mut volumes = template.volumes.iter().flatten();
    let secret = volumes
        .find(|v| v.name == "valkey-passwords")?
        .secret
        .as_ref()?;
    let item = secret
        .items
        .iter()
        .flatten()
        .find(|i| i.path == "default")?;
    Some((secret.secret_name.clone()?, item.key.clone()))
}

/// `kill -<signal> <pid>`.
fn kill(pid: u32, signal: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()?;
    if !status.success() {
        bail!("kill -{signal} {pid} failed");
    }
    Ok(())
}

/// Every version of the coordinator Lease a watch delivered: who held it (`None`: released)
/// and whom it named to take over first (`valkey.io/successors`), in order, each with when it
/// arrived.
#[derive(Clone, Default)]
pub struct HolderWatch {
    seen: Arc<Mutex<Vec<(Instant, LeaseVersion)>>>,
}

/// A version of the coordinator Lease: its holder's pod (`None`: released) and its successors.
type LeaseVersion = (Option<String>, Vec<String>);

impl HolderWatch {
    fn start(
        api: Api<Lease>,
        config: watcher::Config,
    ) -> (HolderWatch, tokio::task::JoinHandle<()>) {
        let watch = HolderWatch::default();
        let sink = watch.seen.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, config).applied_objects().boxed();
            // An error is the watcher's, which re-lists and goes on: so does this.
            while let Some(event) = stream.next().await {
                let Ok(lease) = event else { continue };
                let version = (lease_holder(&lease), lease_successors(&lease));
                if let Ok(mut seen) = sink.lock()
                    && seen.last().map(|(_, v)| v) != Some(&version)
                {
                    seen.push((Instant::now(), version));
                }
            }
        });
        (watch, task)
    }

    fn versions(&self) -> Vec<(Instant, LeaseVersion)> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The holders seen so far, in order (releases left out).
    pub fn holders(&self) -> Vec<String> {
        let mut holders: Vec<String> = Vec::new();
        for holder in self.versions().into_iter().filter_map(|(_, (h, _))| h) {
            if holders.last() != Some(&holder) {
                holders.push(holder);
            }
        }
        holders
    }

    /// The first holder after `gone`, and the successors the Lease named when it took over: the
    /// list of `gone`'s last renewal (or release). `None` if nobody took over.
    pub fn successor_of(&self, gone: &str) -> Option<(String, Vec<String>)> {
        let mut named = Vec::new();
        for (_, (holder, successors)) in self.versions() {
            match holder {
                Some(h) if h != gone => return Some((h, named)),
                _ => named = successors,
            }
        }
        None
    }

    /// The first version naming a holder other than `gone`, and when the watch delivered it.
    pub fn taken_over(&self, gone: &str) -> Option<(String, Instant)> {
        self.versions()
            .into_iter()
            .find_map(|(at, (holder, _))| holder.filter(|h| h != gone).map(|h| (h, at)))
    }
}

/// The pods a Lease names to take over first.
fn lease_successors(lease: &Lease) -> Vec<String> {
    let annotations = lease.metadata.annotations.as_ref();
    let named = annotations.and_then(|a| a.get("valkey.io/successors"));
    named.map_or_else(Vec::new, |n| {
        n.split(',')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

/// The pod a Lease names as its holder, if any.
fn lease_holder(lease: &Lease) -> Option<String> {
    let identity = lease.spec.as_ref()?.holder_identity.as_deref()?;
    (!identity.is_empty()).then(|| holder_pod(identity).to_owned())
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

    /// The longest time, from `from` on, that two or more of `pods` carried the role `value` at
    /// once, as the watch saw it (an episode still open counts until now).
    pub fn longest_overlap(&self, pods: &[String], value: &str, from: Instant) -> Duration {
        let Ok(seen) = self.seen.lock() else {
            return Duration::ZERO;
        };
        let mut current: BTreeMap<&str, bool> = BTreeMap::new();
        let (mut since, mut longest) = (None::<Instant>, Duration::ZERO);
        for (t, pod, role) in seen.iter().filter(|(_, p, _)| pods.contains(p)) {
            current.insert(pod, role.as_deref() == Some(value));
            let both = current.values().filter(|v| **v).count() >= 2;
            match (both, since) {
                (true, None) => since = Some((*t).max(from)),
                (false, Some(s)) => {
                    longest = longest.max(t.saturating_duration_since(s));
                    since = None;
                }
                _ => {}
            }
        }
        let open = since.map(|s| Instant::now().saturating_duration_since(s));
        longest.max(open.unwrap_or_default())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_primary_owns_slots_and_a_fresh_master_does_not() {
        let primary = "a1 127.1.0.1:6379@16379 myself,master - 0 0 1 connected 0-5460\nb2 127.1.0.2:6379@16379 slave a1 0 1 1 connected\n";
        let fresh = "c3 127.1.0.3:6379@16379 myself,master - 0 0 0 connected\n";
        let replica = "b2 127.1.0.2:6379@16379 myself,slave a1 0 1 1 connected\na1 127.1.0.1:6379@16379 master - 0 0 1 connected 0-5460\n";
        assert!(owns_slots(primary));
        assert!(!owns_slots(fresh));
        assert!(!owns_slots(replica));
    }
}
