//! etcd + kube-apiserver (+ kube-scheduler, kube-controller-manager) as local processes.
//!
//! Every instance gets its own temp dir (certificates, keys, token file, kubeconfigs; etcd's data
//! dir lives in etcd's own process dir) and fresh loopback ports, so tests can run concurrently.
//! All processes go through the harness's process machinery ([`crate::process`]): `Drop` kills and
//! reaps them and removes their dirs, also on panic, and `setpriv --pdeathsig KILL` takes them down
//! with the test process if it dies without unwinding.
//!
//! Authentication is a static token file (`--token-auth-file`): an admin in `system:masters`, the
//! scheduler and controller-manager identities the RBAC bootstrap policy knows
//! (`system:kube-scheduler`, `system:kube-controller-manager`), a `limited` user with no
//! permissions beyond discovery (for RBAC tests), and any extra users from the options.
//! Authorization is `RBAC`. Service-account tokens are signed with a generated ECDSA key, so the
//! TokenRequest API works and controllers run with `--use-service-account-credentials`.
//!
//! With [`ControlPlaneOptions::audit`] the apiserver keeps an audit log in the plane's dir (every
//! request at level `Metadata`), read with [`ControlPlane::audit_log`] and [`super::audit`]: the
//! apiserver's own record of who called what, which its request metrics cannot give per client.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use tempfile::TempDir;

use super::audit::AuditLog;
use super::bins::k8s_bin_dir_for;
use super::kubeconfig::{self, Credential};
use super::util::{http_get, poll_until, random_hex};
use crate::Result;
use crate::net::free_port;
use crate::process::{KEEP_DIRS_ENV, ProcessSpec, ServerProcess};
use crate::tls::TlsCerts;

/// The `--service-cluster-ip-range`. Only ever written into objects: nothing routes to it.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";

/// The static user without any RBAC grants (see [`ControlPlane::token`]).
pub const LIMITED_USER: &str = "limited";

/// The admin identity of the harness (group `system:masters`).
pub const ADMIN_USER: &str = "testkit-admin";

const SCHEDULER_USER: &str = "system:kube-scheduler";
const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";

/// How often start-up checks poll.
const POLL: Duration = Duration::from_millis(50);

/// How often a component is restarted on fresh ports after losing its port to another process.
const PORT_ATTEMPTS: usize = 3;

/// Lines of output quoted when a component fails.
const TAIL: usize = 40;

/// How to start a [`ControlPlane`]. `Default`: everything (scheduler and controller-manager on).
#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// Start kube-scheduler (pods without `nodeName` get placed).
    pub scheduler: bool,
    /// Start kube-controller-manager (service accounts, node lifecycle, disruption budgets,
    /// endpoint slices, garbage collection, ...). `start` waits for the `default` ServiceAccount.
    pub controller_manager: bool,
    /// Extra static identities: user name and groups. Tokens via [`ControlPlane::token`].
    pub users: Vec<(String, Vec<String>)>,
    /// kcm `--node-monitor-grace-period`: how long a node may go without a heartbeat before its
    /// Ready condition turns Unknown. Short by default so node-failure tests take seconds.
    pub node_monitor_grace_period: Duration,
    /// Extra flags, appended last (`--name=value`).
    pub apiserver_args: Vec<String>,
    pub scheduler_args: Vec<String>,
    pub controller_manager_args: Vec<String>,
    /// How long each component may take to become ready.
    pub start_timeout: Duration,
    /// Keep an audit log of every request (see [`ControlPlane::audit_log`]).
    pub audit: bool,
    /// Another pinned Kubernetes minor than the default (`"1.30"`; see [`super::k8s_bin_dir_for`]).
    pub kubernetes: Option<String>,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            scheduler: true,
            controller_manager: true,
            users: Vec::new(),
            node_monitor_grace_period: Duration::from_secs(10),
            apiserver_args: Vec::new(),
            scheduler_args: Vec::new(),
            controller_manager_args: Vec::new(),
            start_timeout: Duration::from_secs(60),
            audit: false,
            kubernetes: None,
        }
    }
}

impl ControlPlaneOptions {
    /// etcd and kube-apiserver only: enough for API tests, and faster to start.
    pub fn apiserver_only() -> Self {
        Self {
            scheduler: false,
            controller_manager: false,
            ..Self::default()
        }
    }

    /// Adds a static identity `name` in `groups`.
    pub fn user(mut self, name: &str, groups: &[&str]) -> Self {
        self.users.push((
            name.to_owned(),
            groups.iter().map(|g| g.to_string()).collect(),
        ));
        self
    }

    /// Turns the audit log on.
    pub fn audit(mut self) -> Self {
        self.audit = true;
        self
    }
}

/// How long start-up took, measured from the call to [`ControlPlane::start`].
#[derive(Clone, Copy, Debug, Default)]
pub struct StartTimings {
    /// etcd answered `/health`.
    pub etcd: Duration,
    /// kube-apiserver answered `/readyz` with 200 (bootstrap RBAC policy in place).
    pub apiserver: Duration,
    /// kube-scheduler answered `/healthz`.
    pub scheduler: Option<Duration>,
    /// The controller-manager created the `default` ServiceAccount.
    pub controller_manager: Option<Duration>,
    /// Everything requested is ready.
    pub total: Duration,
}

/// A running control plane; dropping it stops every process and removes every dir.
pub struct ControlPlane {
    // Processes first: fields drop in declaration order, so they die before their files go.
    controller_manager: Option<ServerProcess>,
    scheduler: Option<ServerProcess>,
    apiserver: ServerProcess,
    etcd: ServerProcess,
    client: kube::Client,
    url: String,
    ca_pem: Vec<u8>,
    tokens: BTreeMap<String, String>,
    kubeconfig: PathBuf,
    audit_log: Option<PathBuf>,
    timings: StartTimings,
    /// The directory of this plane's binaries (its `kubectl` is of the same release).
    bins: PathBuf,
    dir: TempDir,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("url", &self.url)
            .field("kubeconfig", &self.kubeconfig)
            .field("pids", &self.pids())
            .finish()
    }
}

impl Drop for ControlPlane {
    /// With `VALKEY_TESTKIT_KEEP_DIRS` the plane's dir stays, its audit log among its files: a
    /// benchmark's overloaded apiserver can then be read after the run (who sent what).
    fn drop(&mut self) {
        if std::env::var_os(KEEP_DIRS_ENV).is_some() {
            self.dir.disable_cleanup(true);
            eprintln!(
                "valkey-testkit: kept {} for the control plane (its audit log, kubeconfig)",
                self.dir.path().display()
            );
        }
    }
}

/// Files shared by the components, in the control plane's dir.
struct Assets {
    certs: TlsCerts,
    sa_key: PathBuf,
    token_file: PathBuf,
    tokens: BTreeMap<String, String>,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver, waits for `/readyz`, then (per `opts`) kube-scheduler and
    /// kube-controller-manager, and waits until they work.
    ///
    /// Looks up the binaries first ([`super::k8s_bin_dir`]), which builds them on a cold cache.
    pub async fn start(opts: ControlPlaneOptions) -> Result<Self> {
        let minor = opts.kubernetes.clone();
        let bins = tokio::task::spawn_blocking(move || k8s_bin_dir_for(minor.as_deref())).await??;
        let started = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix("valkey-testkit-k8s-")
            .tempdir()
            .context("creating the control plane's dir")?;
        let assets = {
            let (path, users) = (dir.path().to_path_buf(), opts.users.clone());
            tokio::task::spawn_blocking(move || write_assets(&path, &users)).await??
        };
        let mut timings = StartTimings::default();
        let (etcd, etcd_url) = start_etcd(&bins, opts.start_timeout).await?;
        timings.etcd = started.elapsed();
        let ca_pem = std::fs::read(assets.certs.ca_file()).context("reading the CA")?;
        let audit = opts
            .audit
            .then(|| AuditFiles::write(dir.path()))
            .transpose()?;
        let (apiserver, url, client) =
            start_apiserver(&bins, &etcd_url, &assets, &ca_pem, audit.as_ref(), &opts).await?;
        timings.apiserver = started.elapsed();
        let admin_kubeconfig = kubeconfig::render(
            &url,
            &ca_pem,
            ADMIN_USER,
            Credential::Token(&assets.tokens[ADMIN_USER]),
        );
        let kubeconfig = dir.path().join("admin.kubeconfig");
        kubeconfig::write_atomic(&kubeconfig, admin_kubeconfig.as_bytes())?;
        let mut plane = Self {
            controller_manager: None,
            scheduler: None,
            apiserver,
            etcd,
            client,
            url,
            ca_pem,
            tokens: assets.tokens.clone(),
            kubeconfig,
            audit_log: audit.map(|a| a.log),
            timings,
            bins: bins.clone(),
            dir,
        };
        plane
            .start_controllers(&bins, &assets, &opts, started)
            .await?;
        plane.timings.total = started.elapsed();
        Ok(plane)
    }

    /// Starts the scheduler and the controller-manager side by side and waits for both.
    async fn start_controllers(
        &mut self,
        bins: &Path,
        assets: &Assets,
        opts: &ControlPlaneOptions,
        started: Instant,
    ) -> Result<()> {
        let scheduler = async {
            if !opts.scheduler {
                return Ok(None);
            }
            let p = self.start_scheduler(bins, opts).await?;
            Ok::<_, anyhow::Error>(Some((p, started.elapsed())))
        };
        let kcm = async {
            if !opts.controller_manager {
                return Ok(None);
            }
            let p = self.start_controller_manager(bins, assets, opts).await?;
            Ok::<_, anyhow::Error>(Some((p, started.elapsed())))
        };
        let (scheduler, kcm) = tokio::join!(scheduler, kcm);
        let (scheduler, kcm) = (scheduler?, kcm?);
        if let Some((p, at)) = scheduler {
            self.scheduler = Some(p);
            self.timings.scheduler = Some(at);
        }
        if let Some((p, at)) = kcm {
            self.controller_manager = Some(p);
            self.timings.controller_manager = Some(at);
        }
        Ok(())
    }

    async fn start_scheduler(
        &self,
        bins: &Path,
        opts: &ControlPlaneOptions,
    ) -> Result<ServerProcess> {
        let kubeconfig = self.component_kubeconfig("scheduler", SCHEDULER_USER)?;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port(localhost())?;
            let mut args = flags(&[
                ("kubeconfig", kubeconfig.to_string_lossy().as_ref()),
                ("bind-address", "127.0.0.1"),
                ("secure-port", &port.to_string()),
                ("leader-elect", "false"),
            ]);
            args.extend(opts.scheduler_args.iter().map(OsString::from));
            let process = spawn("kube-scheduler", &bins.join("kube-scheduler"), args)?;
            let health = insecure_client(port)?;
            let ready = await_ready(&process, opts.start_timeout, || async {
                Ok(get_text(&health, "/healthz").await?.trim() == "ok")
            })
            .await?;
            if ready {
                return Ok(process);
            }
        }
        bail!("kube-scheduler lost its port {PORT_ATTEMPTS} times")
    }

    async fn start_controller_manager(
        &self,
        bins: &Path,
        assets: &Assets,
        opts: &ControlPlaneOptions,
    ) -> Result<ServerProcess> {
        let kubeconfig =
            self.component_kubeconfig("controller-manager", CONTROLLER_MANAGER_USER)?;
        let grace = format!("{}s", opts.node_monitor_grace_period.as_secs().max(1));
        let (ca, ca_key) = (assets.certs.ca_file(), assets.certs.dir().join("ca.key"));
        let sa_key = assets.sa_key.to_string_lossy();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port(localhost())?;
            let mut args = flags(&[
                ("kubeconfig", kubeconfig.to_string_lossy().as_ref()),
                ("bind-address", "127.0.0.1"),
                ("secure-port", &port.to_string()),
                ("leader-elect", "false"),
                ("use-service-account-credentials", "true"),
                ("service-account-private-key-file", &sa_key),
                ("root-ca-file", &ca.to_string_lossy()),
                // Lets the CSR signing controllers run (they are skipped without a signer).
                ("cluster-signing-cert-file", &ca.to_string_lossy()),
                ("cluster-signing-key-file", &ca_key.to_string_lossy()),
                ("service-cluster-ip-range", SERVICE_CIDR),
                ("node-monitor-grace-period", &grace),
                ("node-monitor-period", "1s"),
                // All default controllers; the cloud ones are off without a cloud provider anyway.
                ("controllers", "*"),
                // The defaults (20 qps) throttle its start-up, which fetches a token per
                // controller: seconds on a machine where nothing else talks to this apiserver.
                ("kube-api-qps", "200"),
                ("kube-api-burst", "400"),
            ]);
            args.extend(opts.controller_manager_args.iter().map(OsString::from));
            let process = spawn(
                "kube-controller-manager",
                &bins.join("kube-controller-manager"),
                args,
            )?;
            // Functional readiness: the serviceaccount controller created `default/default`,
            // which pod admission needs.
            let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), "default");
            let ready = await_ready(&process, opts.start_timeout, || async {
                Ok(accounts.get_opt("default").await?.is_some())
            })
            .await?;
            if ready {
                return Ok(process);
            }
        }
        bail!("kube-controller-manager lost its port {PORT_ATTEMPTS} times")
    }

    fn component_kubeconfig(&self, name: &str, user: &str) -> Result<PathBuf> {
        let token = self
            .tokens
            .get(user)
            .with_context(|| format!("no token for {user}"))?;
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        let text = kubeconfig::render(&self.url, &self.ca_pem, user, Credential::Token(token));
        kubeconfig::write_atomic(&path, text.as_bytes())?;
        Ok(path)
    }

    /// A client with the admin identity (`system:masters`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// An admin kubeconfig file, usable with `kubectl --kubeconfig` or `KUBECONFIG=`.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client that authenticates with `token` (a static token from [`Self::token`] or a
    /// ServiceAccount token).
    pub async fn client_for_token(&self, token: &str) -> Result<kube::Client> {
        kubeconfig::client_from_text(&self.kubeconfig_for(token, "token-user")).await
    }

    /// Kubeconfig text for `token`, e.g. to hand to a process.
    pub fn kubeconfig_for(&self, token: &str, user: &str) -> String {
        kubeconfig::render(&self.url, &self.ca_pem, user, Credential::Token(token))
    }

    /// The bearer token of a static identity: [`ADMIN_USER`], [`LIMITED_USER`], or one added with
    /// [`ControlPlaneOptions::user`].
    pub fn token(&self, user: &str) -> Option<&str> {
        self.tokens.get(user).map(String::as_str)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// PEM of the CA that signed the apiserver's serving certificate.
    pub fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }

    /// The apiserver's audit log, when [`ControlPlaneOptions::audit`] turned it on.
    pub fn audit_log(&self) -> Option<AuditLog> {
        self.audit_log.as_deref().map(AuditLog::new)
    }

    /// The control plane's dir (certificates, keys, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Pids of all running components (etcd, apiserver, scheduler, controller-manager).
    pub fn pids(&self) -> Vec<u32> {
        self.processes().map(ServerProcess::pid).collect()
    }

    fn processes(&self) -> impl Iterator<Item = &ServerProcess> {
        [Some(&self.etcd), Some(&self.apiserver)]
            .into_iter()
            .chain([self.scheduler.as_ref(), self.controller_manager.as_ref()])
            .flatten()
    }

    /// How long start-up took.
    pub fn timings(&self) -> StartTimings {
        self.timings
    }

    /// The last `n` lines of every component's output, for diagnosing a failed test.
    pub fn diagnostics(&self, n: usize) -> String {
        self.processes()
            .map(|p| p.diagnostics(n))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until the CustomResourceDefinition `name` is `Established`. `kubectl wait
    /// --for=condition=Established` is not used: on a CRD whose status has no conditions yet it
    /// fails at once (`.status.conditions accessor error: <nil>`) instead of waiting.
    pub async fn wait_crd_established(&self, name: &str, within: Duration) -> Result<()> {
        let established = r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#;
        let crd = format!("crd/{name}");
        let what = format!("{crd} Established");
        poll_until(&what, within, Duration::from_millis(100), || async {
            let status = self.kubectl(&["get", &crd, "-o", established]).await?;
            Ok(status.trim() == "True")
        })
        .await
    }

    /// Runs the bundled `kubectl` as admin with `args`; its stdout, or an error with its stderr.
    pub async fn kubectl(&self, args: &[&str]) -> Result<String> {
        let kubectl = self.bins.join("kubectl");
        let out = tokio::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .await
            .with_context(|| format!("running {}", kubectl.display()))?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

fn localhost() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

/// Certificates (CA, apiserver serving certificate for 127.0.0.1/localhost), the service-account
/// signing key and the static token file.
fn write_assets(dir: &Path, extra_users: &[(String, Vec<String>)]) -> Result<Assets> {
    let certs = TlsCerts::generate(&dir.join("pki"), &[])?;
    let sa_key = dir.join("pki/sa.key");
    let out = Command::new("openssl")
        .args([
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
        ])
        .arg(&sa_key)
        .output()
        .context("running openssl ecparam")?;
    if !out.status.success() {
        bail!(
            "openssl ecparam failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut users: Vec<(String, Vec<String>)> = vec![
        (ADMIN_USER.into(), vec!["system:masters".into()]),
        (SCHEDULER_USER.into(), vec![]),
        (CONTROLLER_MANAGER_USER.into(), vec![]),
        (LIMITED_USER.into(), vec![]),
    ];
    users.extend(extra_users.iter().cloned());
    let mut tokens = BTreeMap::new();
    let mut csv = String::new();
    for (k, (user, groups)) in users.iter().enumerate() {
        let token = random_hex(24)?;
        // token,user,uid,"group1,group2"
        csv.push_str(&format!(
            "{token},{user},uid-{k},\"{}\"\n",
            groups.join(",")
        ));
        tokens.insert(user.clone(), token);
    }
    let token_file = dir.join("tokens.csv");
    std::fs::write(&token_file, csv).context("writing the token file")?;
    Ok(Assets {
        certs,
        sa_key,
        token_file,
        tokens,
    })
}

/// The audit policy and log of the apiserver, in the plane's dir.
struct AuditFiles {
    policy: PathBuf,
    log: PathBuf,
}

impl AuditFiles {
    fn write(dir: &Path) -> Result<Self> {
        let policy = dir.join("audit-policy.yaml");
        std::fs::write(&policy, AUDIT_POLICY).context("writing the audit policy")?;
        Ok(Self {
            policy,
            log: dir.join("audit.log"),
        })
    }

    fn flags(&self) -> Vec<OsString> {
        flags(&[
            ("audit-policy-file", &self.policy.to_string_lossy()),
            ("audit-log-path", &self.log.to_string_lossy()),
            // Written as each request completes, so a reader right after a window sees it all.
            ("audit-log-mode", "blocking"),
            // Never rotate under a reader: the default would rotate at 100 MB.
            ("audit-log-maxsize", "100000"),
        ])
    }
}

/// Every request, reads included, at `Metadata` (who, verb, object; no bodies). One event per
/// request stage after the request was received: `ResponseComplete`, and `ResponseStarted` for
/// watches, which is the only record of a watch that is still open.
const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
";

async fn start_etcd(bins: &Path, timeout: Duration) -> Result<(ServerProcess, String)> {
    for _ in 0..PORT_ATTEMPTS {
        let (client_port, peer_port) = (free_port(localhost())?, free_port(localhost())?);
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let dir = process_dir("etcd")?;
        let data = dir.path().join("data");
        let args = flags(&[
            ("name", "default"),
            ("data-dir", &data.to_string_lossy()),
            ("listen-client-urls", &client_url),
            ("advertise-client-urls", &client_url),
            ("listen-peer-urls", &peer_url),
            ("initial-advertise-peer-urls", &peer_url),
            ("initial-cluster", &format!("default={peer_url}")),
            // Test data: durability is worth nothing, fsync latency is worth seconds.
            ("unsafe-no-fsync", "true"),
            ("log-level", "warn"),
        ]);
        let process = spawn_in("etcd", &bins.join("etcd"), args, dir)?;
        let addr = ([127, 0, 0, 1], client_port).into();
        let ready = await_ready(&process, timeout, || async {
            let (code, body) = http_get(addr, "/health", Duration::from_secs(1)).await?;
            Ok(code == 200 && body.contains("true"))
        })
        .await?;
        if ready {
            return Ok((process, client_url));
        }
    }
    bail!("etcd lost its ports {PORT_ATTEMPTS} times")
}

async fn start_apiserver(
    bins: &Path,
    etcd_url: &str,
    assets: &Assets,
    ca_pem: &[u8],
    audit: Option<&AuditFiles>,
    opts: &ControlPlaneOptions,
) -> Result<(ServerProcess, String, kube::Client)> {
    let certs = &assets.certs;
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port(localhost())?;
        let dir = process_dir("apiserver")?;
        let sa_key = assets.sa_key.to_string_lossy();
        let mut args = flags(&[
            ("etcd-servers", etcd_url),
            ("bind-address", "127.0.0.1"),
            // A loopback advertise address is refused by the endpoint reconciler; nothing here
            // routes to the `kubernetes` Service anyway, so the reconciler is off.
            ("advertise-address", "127.0.0.1"),
            ("endpoint-reconciler-type", "none"),
            ("secure-port", &port.to_string()),
            ("cert-dir", &dir.path().join("certs").to_string_lossy()),
            ("tls-cert-file", &certs.server_cert().to_string_lossy()),
            (
                "tls-private-key-file",
                &certs.server_key().to_string_lossy(),
            ),
            ("client-ca-file", &certs.ca_file().to_string_lossy()),
            ("token-auth-file", &assets.token_file.to_string_lossy()),
            ("authorization-mode", "RBAC"),
            ("service-cluster-ip-range", SERVICE_CIDR),
            ("service-account-issuer", "https://kubernetes.default.svc"),
            ("service-account-key-file", &sa_key),
            ("service-account-signing-key-file", &sa_key),
            ("allow-privileged", "true"),
        ]);
        args.extend(audit.map(AuditFiles::flags).unwrap_or_default());
        args.extend(opts.apiserver_args.iter().map(OsString::from));
        let process = spawn_in("kube-apiserver", &bins.join("kube-apiserver"), args, dir)?;
        let url = format!("https://127.0.0.1:{port}");
        let admin = kubeconfig::render(
            &url,
            ca_pem,
            ADMIN_USER,
            Credential::Token(&assets.tokens[ADMIN_USER]),
        );
        let client = kubeconfig::client_from_text(&admin).await?;
        let ready = await_ready(&process, opts.start_timeout, || async {
            Ok(get_text(&client, "/readyz").await?.trim() == "ok")
        })
        .await?;
        if ready {
            return Ok((process, url, client));
        }
    }
    bail!("kube-apiserver lost its port {PORT_ATTEMPTS} times")
}

/// `GET path` with `client`, as text.
pub(crate) async fn get_text(client: &kube::Client, path: &str) -> Result<String> {
    let req = http::Request::get(path).body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

/// A client for a component's own HTTPS endpoint (self-signed certificate, no credentials), for
/// `/healthz`, which every component serves to anonymous callers.
fn insecure_client(port: u16) -> Result<kube::Client> {
    let url = format!("https://127.0.0.1:{port}").parse()?;
    let mut config = kube::Config::new(url);
    config.accept_invalid_certs = true;
    config.connect_timeout = Some(Duration::from_secs(1));
    config.read_timeout = Some(Duration::from_secs(2));
    kube::Client::try_from(config).context("building a health-check client")
}

/// Waits until `check` passes (`Ok(true)`), or the process exits: `Ok(false)` if it exited because
/// its port was taken (start again on a fresh port), an error with its output otherwise.
async fn await_ready<F, Fut>(
    process: &ServerProcess,
    timeout: Duration,
    mut check: F,
) -> Result<bool>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = process.exit_status() {
            let output = process.diagnostics(TAIL);
            if output.contains("address already in use") {
                return Ok(false);
            }
            bail!(
                "{} exited during start-up ({status})\n{output}",
                process.label()
            );
        }
        let last = match check().await {
            Ok(true) => return Ok(true),
            Ok(false) => anyhow!("not ready yet"),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            bail!(
                "{} not ready after {timeout:?} (last check: {last:#})\n{}",
                process.label(),
                process.diagnostics(TAIL)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `--name=value` arguments.
fn flags(pairs: &[(&str, &str)]) -> Vec<OsString> {
    pairs
        .iter()
        .map(|(k, v)| OsString::from(format!("--{k}={v}")))
        .collect()
}

fn process_dir(name: &str) -> Result<TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("valkey-testkit-{name}-"))
        .tempdir()
        .with_context(|| format!("creating {name}'s dir"))
}

fn spawn(label: &str, program: &Path, args: Vec<OsString>) -> Result<ServerProcess> {
    spawn_in(label, program, args, process_dir(label)?)
}

/// Starts `program` with its output in `dir/output.log` (the components log to stderr).
fn spawn_in(
    label: &str,
    program: &Path,
    args: Vec<OsString>,
    dir: TempDir,
) -> Result<ServerProcess> {
    let log = dir.path().join("output.log");
    let spec = ProcessSpec {
        program: program.to_path_buf(),
        args,
        label: label.to_owned(),
    };
    ServerProcess::spawn(spec, dir, log)
}
