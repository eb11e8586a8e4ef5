//! Configuration: flags and environment variables into a validated [`Config`].
//!
//! Every variable is read as text first and validated in one pass, so a bad deployment gets one
//! message naming every bad variable instead of a fix-one-rerun loop. The binary exits with
//! code 64 (`EX_USAGE`) on any of them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::features::Cause;
use clap::{Args, Parser, Subcommand};
use valkey_sidecar_core::health::Bounds;
use valkey_sidecar_core::heartbeat::IsolationPolicy;
use valkey_sidecar_core::labels::{LabelPolicy, check_key, check_value};
use valkey_sidecar_core::lease::LeaseTimings;
use valkey_sidecar_core::observation::Mode;
use valkey_sidecar_core::plan::Policy;
use valkey_sidecar_core::quorum::QuorumPolicy;
use valkey_sidecar_core::roll::RollPolicy;

/// Default port of the probe listener (kubelet probes, `/metrics`, role endpoints).
pub const DEFAULT_PROBE_PORT: u16 = 9736;

#[derive(Debug, Parser)]
#[command(
    name = "valkey-sidecar",
    version,
    about = "Keeps Kubernetes in step with the Valkey beside it."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub agent: RawConfig,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent (the default).
    Run,
}

/// Configuration as given, before validation. Every field has a flag and an environment variable.
#[derive(Debug, Args, Default, Clone)]
pub struct RawConfig {
    /// This pod's name (downward API `metadata.name`).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// This pod's UID (downward API `metadata.uid`): with the name, the agent's identity in the
    /// coordinator election, so a pod recreated under the same name counts as someone else.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// This pod's namespace (downward API `metadata.namespace`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// The node the pod runs on (downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// The pod's IP (downward API `status.podIP`); the probe listener binds to it.
    #[arg(long, env = "POD_IP")]
    pub pod_ip: Option<String>,
    /// Zone of this pod; overrides pod labels and the Node object.
    #[arg(long, env = "SIDECAR_ZONE")]
    pub zone: Option<String>,
    /// Region of this pod; overrides pod labels and the Node object.
    #[arg(long, env = "SIDECAR_REGION")]
    pub region: Option<String>,
    /// Hand the zone to Valkey by writing it into this file (read by the chart's
    /// `valkey-settings` container) instead of `CONFIG SET availability-zone`, so the agent's
    /// Valkey user needs no `CONFIG SET`. Its directory must exist and be writable.
    #[arg(long, env = "SIDECAR_ZONE_FILE")]
    pub zone_file: Option<String>,
    /// Address of the local Valkey, `host:port`.
    #[arg(long, env = "VALKEY_ADDR", default_value = "127.0.0.1:6379")]
    pub valkey_addr: String,
    /// ACL user the agent authenticates as (default user when unset).
    #[arg(long, env = "VALKEY_USERNAME")]
    pub valkey_username: Option<String>,
    /// File holding the Valkey password (read at every connect, so rotation needs no restart).
    #[arg(long, env = "VALKEY_PASSWORD_FILE")]
    pub valkey_password_file: Option<String>,
    /// The Valkey password itself, for a Secret passed as environment (`valueFrom.secretKeyRef`,
    /// as valkey-operator passes its Secrets); not with VALKEY_PASSWORD_FILE. Never shown in
    /// `--help`, errors or logs; prefer the variable to the flag (argv is world-readable).
    #[arg(long, env = "VALKEY_PASSWORD", hide_env_values = true)]
    pub valkey_password: Option<Secret>,
    /// Connect to Valkey over TLS.
    #[arg(long, env = "VALKEY_TLS", default_value = "false")]
    pub valkey_tls: String,
    /// PEM file of the CA that signed Valkey's certificate (required with TLS).
    #[arg(long, env = "VALKEY_TLS_CA_FILE")]
    pub valkey_tls_ca_file: Option<String>,
    /// PEM client certificate, when Valkey requires client authentication.
    #[arg(long, env = "VALKEY_TLS_CERT_FILE")]
    pub valkey_tls_cert_file: Option<String>,
    /// PEM private key of the client certificate.
    #[arg(long, env = "VALKEY_TLS_KEY_FILE")]
    pub valkey_tls_key_file: Option<String>,
    /// Name to verify Valkey's certificate against (default: the host of VALKEY_ADDR).
    #[arg(long, env = "VALKEY_TLS_SERVER_NAME")]
    pub valkey_tls_server_name: Option<String>,
    /// `cluster` (Valkey Cluster) or `replication` (one primary and replicas, no Cluster).
    #[arg(long, env = "SIDECAR_MODE", default_value = "cluster")]
    pub mode: String,
    /// Listener for probes, role endpoints and metrics (default `$POD_IP:9736`, else `0.0.0.0:9736`).
    #[arg(long, env = "SIDECAR_PROBE_ADDR")]
    pub probe_addr: Option<String>,
    /// Listener for admin endpoints; must be a loopback address.
    #[arg(long, env = "SIDECAR_ADMIN_ADDR", default_value = "127.0.0.1:9737")]
    pub admin_addr: String,
    /// How often Valkey is observed (e.g. `250ms`).
    #[arg(long, env = "SIDECAR_POLL_INTERVAL", default_value = "250ms")]
    pub poll_interval: String,
    /// Cluster mode: a primary fences itself (`CLIENT PAUSE WRITE`) once its pings to most
    /// primaries have been unanswered this long; keep it under half `cluster-node-timeout`
    /// (the chart sets a fifth). `off` disables the fence.
    #[arg(long, env = "SIDECAR_QUORUM_FENCE_AFTER", default_value = "1s")]
    pub quorum_fence_after: String,
    /// How often a primary's agent pings its peers' agents (UDP, on the probe port).
    #[arg(long, env = "SIDECAR_HEARTBEAT_INTERVAL", default_value = "100ms")]
    pub heartbeat_interval: String,
    /// A primary that no peer's agent has vouched for this long pauses its writes (cluster
    /// mode: most primaries' agents); at least two heartbeat intervals. `off` turns heartbeats off.
    #[arg(long, env = "SIDECAR_ISOLATION_FENCE_AFTER", default_value = "300ms")]
    pub isolation_fence_after: String,
    /// How long one observation may wait for Valkey.
    #[arg(long, env = "SIDECAR_VALKEY_TIMEOUT", default_value = "1s")]
    pub valkey_timeout: String,
    /// `/livez` fails after the loop stalled, or Valkey gave no answer at all, for this long.
    #[arg(long, env = "SIDECAR_LIVENESS_WINDOW", default_value = "30s")]
    pub liveness_window: String,
    /// An observation older than this no longer counts for readiness or role.
    #[arg(long, env = "SIDECAR_STALE_AFTER", default_value = "2s")]
    pub stale_after: String,
    /// A replica further behind than this many bytes is not ready.
    #[arg(long, env = "SIDECAR_MAX_LAG_BYTES", default_value = "1048576")]
    pub max_lag_bytes: String,
    /// Keep labels on the own pod: `auto` (when POD_NAME and POD_NAMESPACE are set), `true`, `false`.
    #[arg(long, env = "SIDECAR_LABELS", default_value = "auto")]
    pub labels: String,
    /// Label key for the role.
    #[arg(long, env = "SIDECAR_ROLE_LABEL", default_value = "valkey.io/role")]
    pub role_label: String,
    /// Role label values for primary and replica, comma-separated (e.g. `master,slave`).
    #[arg(long, env = "SIDECAR_ROLE_VALUES", default_value = "primary,replica")]
    pub role_values: String,
    /// Label key for the shard (Valkey's shard id in cluster mode, SIDECAR_SHARD_NAME otherwise).
    #[arg(
        long,
        env = "SIDECAR_SHARD_LABEL",
        default_value = "valkey.io/shard-id"
    )]
    pub shard_label: String,
    /// Shard name for the shard label in replication mode.
    #[arg(long, env = "SIDECAR_SHARD_NAME")]
    pub shard_name: Option<String>,
    /// Label key for the zone.
    #[arg(long, env = "SIDECAR_ZONE_LABEL", default_value = "valkey.io/zone")]
    pub zone_label: String,
    /// Label key for the region.
    #[arg(long, env = "SIDECAR_REGION_LABEL", default_value = "valkey.io/region")]
    pub region_label: String,
    /// Publish Events (core v1) on the pod for role changes.
    #[arg(long, env = "SIDECAR_EVENTS", default_value = "true")]
    pub events: String,
    /// Run the coordinator (Lease election, hand-overs, fail-back, balance; in replication mode
    /// also failover and the shard record): `auto` (on when SIDECAR_CLUSTER_NAME is set), `true`,
    /// `false`.
    #[arg(long, env = "SIDECAR_COORDINATOR", default_value = "auto")]
    pub coordinator: String,
    /// Name of the Valkey cluster (e.g. from the pod label `valkey.io/cluster` via the downward API).
    #[arg(long, env = "SIDECAR_CLUSTER_NAME")]
    pub cluster_name: Option<String>,
    /// Name of the coordinator Lease (default `<cluster>-coordinator`).
    #[arg(long, env = "SIDECAR_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// A ConfigMap in the pod's namespace that owns the Leases the agents create, so they are
    /// garbage-collected with it (default: the pod's ServiceAccount).
    #[arg(long, env = "SIDECAR_LEASE_OWNER")]
    pub lease_owner: Option<String>,
    /// Label selector of the cluster's pods (default `valkey.io/cluster=<cluster>`).
    #[arg(long, env = "SIDECAR_POD_SELECTOR")]
    pub pod_selector: Option<String>,
    /// Lease duration; candidates take over after seeing the Lease unchanged this long.
    #[arg(long, env = "SIDECAR_LEASE_DURATION", default_value = "15s")]
    pub lease_duration: String,
    /// The holder stops acting when it could not renew for this long.
    #[arg(long, env = "SIDECAR_LEASE_RENEW_DEADLINE", default_value = "10s")]
    pub lease_renew_deadline: String,
    /// How often the Lease is renewed or retried.
    #[arg(long, env = "SIDECAR_LEASE_RETRY_PERIOD", default_value = "2s")]
    pub lease_retry_period: String,
    /// Followers learn of the Leases they follow (the coordinator's, a shard record) from a
    /// watch on each; `false`: they read each one every retry period instead.
    #[arg(long, env = "SIDECAR_LEASE_WATCH", default_value = "true")]
    pub lease_watch: String,
    /// Fail primaries back to their preferred zone once the shard is steady.
    #[arg(long, env = "SIDECAR_FAILBACK", default_value = "false")]
    pub failback: String,
    /// How long a shard must be steady before fail-back or balance moves it.
    #[arg(long, env = "SIDECAR_QUIET_PERIOD", default_value = "60s")]
    pub quiet_period: String,
    /// Keep primaries spread across nodes.
    #[arg(long, env = "SIDECAR_BALANCE", default_value = "true")]
    pub balance: String,
    /// Minimum time between two fail-back or balance moves.
    #[arg(long, env = "SIDECAR_MOVE_COOLDOWN", default_value = "30s")]
    pub move_cooldown: String,
    /// Hand-overs of primaries whose pod or node is going away, on different shards at once
    /// (a drained node may carry many primaries); their elections still run one at a time.
    #[arg(long, env = "SIDECAR_MAX_HANDOVERS", default_value = "8")]
    pub max_handovers: String,
    /// How long a hand-over may take before it counts as failed.
    #[arg(long, env = "SIDECAR_HANDOVER_TIMEOUT", default_value = "10s")]
    pub handover_timeout: String,
    /// Preferred zone per shard id, `shard=zone,shard=zone` (default: the zone of the node-index-0 pod).
    #[arg(long, env = "SIDECAR_PREFERRED_ZONES")]
    pub preferred_zones: Option<String>,
    /// The supervised rolling update, `<shards at once>:<pods per shard>`: the coordinator replaces
    /// the pods not at their StatefulSet's update revision (sets with `updateStrategy: OnDelete`),
    /// replicas first, each primary handed over once (unset: rollouts are left to the sets).
    #[arg(long, env = "SIDECAR_ROLL")]
    pub roll: Option<String>,
    /// Who moves primaries besides failures: `agent` (the coordinator alone) or `operator` (an
    /// operator beside the agent: no fail-back or balance while its resource is not Ready).
    #[arg(long, env = "SIDECAR_COORDINATION", default_value = "agent")]
    pub coordination: String,
    /// With `SIDECAR_COORDINATION=operator`: the operator's `ValkeyCluster` in the pod's namespace
    /// (default: the cluster name).
    #[arg(long, env = "SIDECAR_OPERATOR_RESOURCE")]
    pub operator_resource: Option<String>,
    /// Cluster mode: the coordinator forms a fresh Valkey Cluster of this many shards from the pods'
    /// shard-index and node-index labels, and brings pods that come back empty into it again
    /// (unset: cluster membership is left alone).
    #[arg(long, env = "SIDECAR_CLUSTER_SHARDS")]
    pub cluster_shards: Option<String>,
    /// Log format: `auto` (JSON unless stderr is a terminal), `json` or `text`. Filter with RUST_LOG
    /// (`level` or `target=level`, comma-separated).
    #[arg(long, env = "SIDECAR_LOG_FORMAT", default_value = "auto")]
    pub log_format: String,
}

/// Who and where the agent is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    pub namespace: Option<String>,
    pub node_name: Option<String>,
    pub pod_ip: Option<IpAddr>,
    pub zone: Option<String>,
    pub region: Option<String>,
}

/// How to reach Valkey.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValkeyConfig {
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<Password>,
    pub tls: Option<TlsConfig>,
    pub timeout: Duration,
    /// Where the zone is handed over instead of `CONFIG SET availability-zone`.
    pub zone_file: Option<PathBuf>,
}

/// Where the Valkey password comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Password {
    /// Read at every connect, so a rotated Secret volume needs no restart.
    File(PathBuf),
    /// From the environment: fixed for the life of the process (Kubernetes does not update a
    /// running container's environment when its Secret changes).
    Value(Secret),
}

/// A value that `{:?}` does not show (the raw and validated configs derive `Debug`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(HIDDEN)
    }
}

impl From<String> for Secret {
    fn from(v: String) -> Self {
        Secret(v)
    }
}

/// TLS to Valkey; the files are read at start (to check them) and again for every connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    pub ca_file: PathBuf,
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub server_name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Auto,
    Json,
    Text,
}

/// Kubernetes side of the agent: present when it keeps labels on its pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeConfig {
    pub pod_name: String,
    pub namespace: String,
    pub policy: LabelPolicy,
    pub shard_name: Option<String>,
    pub events: bool,
    /// The ConfigMap owning the Leases; `None`: the pod's ServiceAccount.
    pub lease_owner: Option<String>,
    pub coordinator: Option<CoordinatorConfig>,
}

/// The coordinator: present when this agent takes part in the Lease election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinatorConfig {
    pub cluster: String,
    pub lease_name: String,
    pub pod_selector: String,
    pub timings: LeaseTimings,
    /// Followers watch the Leases they follow (`SIDECAR_LEASE_WATCH`); `false`: they poll them
    /// every retry period, as before the watch (for an apiserver path that does not hold watches).
    pub lease_watch: bool,
    pub policy: Policy,
    pub handover_timeout: Duration,
    /// Cluster mode: the shard count to form (`SIDECAR_CLUSTER_SHARDS`); `None`: no formation.
    pub formation_shards: Option<u32>,
    /// `SIDECAR_COORDINATION=operator`: the operator's resource to defer to.
    pub operator: Option<String>,
}

/// Validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub identity: Identity,
    pub kube: Option<KubeConfig>,
    pub valkey: ValkeyConfig,
    pub mode: Mode,
    pub probe_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub poll_interval: Duration,
    pub bounds: Bounds,
    /// Cluster mode's quorum fence; `None`: off.
    pub quorum_fence: Option<QuorumPolicy>,
    /// Peer heartbeats and the isolation fence; `None`: off.
    pub isolation: Option<IsolationPolicy>,
    pub log_format: LogFormat,
    /// Features this configuration leaves off, and why (said at start, in `/status`).
    pub off: Vec<crate::cli::features::Off>,
}

/// What an error shows for a secret's value.
const HIDDEN: &str = "<hidden>";

/// One bad variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub var: &'static str,
    pub value: String,
    pub problem: String,
}

/// Every bad variable found in one pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError(pub Vec<Invalid>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problem(s)):", self.0.len())?;
        for i in &self.0 {
            writeln!(f, "  {}={:?}: {}", i.var, i.value, i.problem)?;
        }
        Ok(())
    }
}

/// Collects problems while each field is validated.
#[derive(Default)]
struct Checker {
    problems: Vec<Invalid>,
}

impl Checker {
    fn check<T>(&mut self, var: &'static str, value: &str, parsed: Result<T, String>) -> Option<T> {
        parsed
            .map_err(|problem| {
                self.problems.push(Invalid {
                    var,
                    value: value.to_owned(),
                    problem,
                })
            })
            .ok()
    }

    fn opt<T>(
        &mut self,
        var: &'static str,
        value: &Option<String>,
        f: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        let v = value.as_deref()?;
        self.check(var, v, f(v))
    }
}

impl RawConfig {
    /// Validates everything, reporting every bad variable at once.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let mut c = Checker::default();
        match self.build(&mut c) {
            Some(config) if c.problems.is_empty() => Ok(config),
            _ => Err(ConfigError(c.problems)),
        }
    }

    /// Validates every field (recording problems in `c`) and assembles the config if all passed.
    fn build(&self, c: &mut Checker) -> Option<Config> {
        let identity = self.identity(c);
        let valkey = self.valkey(c);
        let mode = c.check("SIDECAR_MODE", &self.mode, parse_mode(&self.mode));
        let probe = self.probe_addr(c, identity.pod_ip);
        let admin = c.check(
            "SIDECAR_ADMIN_ADDR",
            &self.admin_addr,
            parse_loopback(&self.admin_addr),
        );
        let poll = c.check(
            "SIDECAR_POLL_INTERVAL",
            &self.poll_interval,
            parse_duration_in(&self.poll_interval, 10, 60_000),
        );
        let bounds = self.bounds(c, poll);
        let quorum = c.check(
            "SIDECAR_QUORUM_FENCE_AFTER",
            &self.quorum_fence_after,
            parse_quorum_fence(&self.quorum_fence_after, poll),
        );
        let isolation = self.isolation(c);
        let log = c.check(
            "SIDECAR_LOG_FORMAT",
            &self.log_format,
            parse_log_format(&self.log_format),
        );
        let kube = self.kube(c, &identity);
        let mut config = Config {
            identity,
            kube: kube?,
            valkey: valkey?,
            mode: mode?,
            probe_addr: probe?,
            admin_addr: admin?,
            poll_interval: poll?,
            bounds: bounds?,
            quorum_fence: quorum?,
            isolation: isolation?,
            log_format: log?,
            off: Vec::new(),
        };
        config.off = crate::cli::features::off(&config, self.cause_of_off(&config));
        Some(config)
    }

    /// Why labels or the coordinator are off in a validated `config`; `None` when both are on.
    fn cause_of_off(&self, config: &Config) -> Option<Cause> {
        let Some(kube) = &config.kube else {
            return Some(if parse_auto_bool(&self.labels) == Ok(Some(false)) {
                Cause::LabelsOff
            } else if config.identity.pod_name.is_none() {
                Cause::NoPodName
            } else {
                Cause::NoNamespace
            });
        };
        match (&kube.coordinator, parse_auto_bool(&self.coordinator)) {
            (Some(_), _) => None,
            (None, Ok(Some(false))) => Some(Cause::CoordinatorOff),
            (None, _) => Some(Cause::NoClusterName),
        }
    }

    fn identity(&self, c: &mut Checker) -> Identity {
        Identity {
            pod_name: c.opt("POD_NAME", &self.pod_name, parse_dns_name),
            pod_uid: c.opt("POD_UID", &self.pod_uid, parse_label_value),
            namespace: c.opt("POD_NAMESPACE", &self.pod_namespace, parse_dns_name),
            node_name: c.opt("NODE_NAME", &self.node_name, parse_dns_name),
            pod_ip: c.opt("POD_IP", &self.pod_ip, |v| {
                v.parse().map_err(|_| "not an IP address".into())
            }),
            zone: c.opt("SIDECAR_ZONE", &self.zone, parse_label_value),
            region: c.opt("SIDECAR_REGION", &self.region, parse_label_value),
        }
    }

    /// `Some(None)`: labels off; `None`: a label variable was bad.
    fn kube(&self, c: &mut Checker, id: &Identity) -> Option<Option<KubeConfig>> {
        let mode = c.check(
            "SIDECAR_LABELS",
            &self.labels,
            parse_auto_bool(&self.labels),
        );
        let policy = self.policy(c);
        let shard_name = c.opt("SIDECAR_SHARD_NAME", &self.shard_name, |v| {
            check_value(v).map(|_| v.to_owned()).map_err(str::to_owned)
        });
        let events = c.check("SIDECAR_EVENTS", &self.events, parse_bool(&self.events));
        // Empty: unset (the chart's way of leaving a variable out).
        let lease_owner = c
            .opt("SIDECAR_LEASE_OWNER", &self.lease_owner, |v| {
                check_value(v).map(|_| v.to_owned()).map_err(str::to_owned)
            })
            .filter(|v| !v.is_empty());
        let known = id.pod_name.clone().zip(id.namespace.clone());
        let on = match mode? {
            Some(on) => on,
            None => known.is_some(),
        };
        if !on {
            return Some(None);
        }
        let Some((pod_name, namespace)) = known else {
            let missing = if id.pod_name.is_none() {
                "POD_NAME"
            } else {
                "POD_NAMESPACE"
            };
            c.check::<()>(missing, "", Err("required when SIDECAR_LABELS=true".into()));
            return None;
        };
        let coordinator = self.coordinator_config(c)?;
        Some(Some(KubeConfig {
            pod_name,
            namespace,
            policy: policy?,
            shard_name,
            events: events?,
            lease_owner,
            coordinator,
        }))
    }

    /// `Some(None)`: no coordinator; `None`: a coordinator variable was bad.
    fn coordinator_config(&self, c: &mut Checker) -> Option<Option<CoordinatorConfig>> {
        let wanted = c.check(
            "SIDECAR_COORDINATOR",
            &self.coordinator,
            parse_auto_bool(&self.coordinator),
        )?;
        let name = c.opt(
            "SIDECAR_CLUSTER_NAME",
            &self.cluster_name,
            parse_label_value,
        );
        let on = wanted.unwrap_or(name.is_some());
        if !on {
            return Some(None);
        }
        // Every coordinator variable is checked before giving up on a missing cluster name.
        let timings = self.timings(c);
        let watch = c.check(
            "SIDECAR_LEASE_WATCH",
            &self.lease_watch,
            parse_bool(&self.lease_watch),
        );
        let policy = self.planner_policy(c);
        let handover = c.check(
            "SIDECAR_HANDOVER_TIMEOUT",
            &self.handover_timeout,
            parse_duration_in(&self.handover_timeout, 100, 600_000),
        );
        let shards = c.opt("SIDECAR_CLUSTER_SHARDS", &self.cluster_shards, parse_shards);
        let operator = self.operator(c);
        let Some(cluster) = name else {
            c.check::<()>(
                "SIDECAR_CLUSTER_NAME",
                "",
                Err("required when SIDECAR_COORDINATOR=true".into()),
            );
            return None;
        };
        Some(Some(CoordinatorConfig {
            lease_name: self
                .lease_name
                .clone()
                .unwrap_or_else(|| format!("{cluster}-coordinator")),
            pod_selector: self
                .pod_selector
                .clone()
                .unwrap_or_else(|| format!("valkey.io/cluster={cluster}")),
            timings: timings?,
            lease_watch: watch?,
            policy: policy?,
            handover_timeout: handover?,
            formation_shards: shards,
            operator: operator?.map(|o| o.unwrap_or_else(|| cluster.clone())),
            cluster,
        }))
    }

    /// `SIDECAR_COORDINATION`: `None` on an error; `Some(None)` with `agent`; with `operator`,
    /// `Some(Some(resource))`, the resource `None` where the caller defaults it (the cluster name).
    fn operator(&self, c: &mut Checker) -> Option<Option<Option<String>>> {
        let mode = c.check(
            "SIDECAR_COORDINATION",
            &self.coordination,
            match self.coordination.as_str() {
                "agent" => Ok(false),
                "operator" => Ok(true),
                _ => Err("must be agent or operator".into()),
            },
        );
        let resource = c.opt(
            "SIDECAR_OPERATOR_RESOURCE",
            &self.operator_resource,
            parse_label_value,
        );
        if self.operator_resource.is_some() && resource.is_none() {
            return None;
        }
        Some(mode?.then_some(resource))
    }

    fn timings(&self, c: &mut Checker) -> Option<LeaseTimings> {
        let ms = |c: &mut Checker, var, v: &String| {
            c.check(var, v, parse_duration_in(v, 100, 3_600_000))
                .map(|d| d.as_millis() as u64)
        };
        let lease_ms = ms(c, "SIDECAR_LEASE_DURATION", &self.lease_duration);
        let renew_deadline_ms = ms(
            c,
            "SIDECAR_LEASE_RENEW_DEADLINE",
            &self.lease_renew_deadline,
        );
        let retry_ms = ms(c, "SIDECAR_LEASE_RETRY_PERIOD", &self.lease_retry_period);
        let timings = LeaseTimings {
            lease_ms: lease_ms?,
            renew_deadline_ms: renew_deadline_ms?,
            retry_ms: retry_ms?,
        };
        let all = format!(
            "{}/{}/{}",
            self.lease_duration, self.lease_renew_deadline, self.lease_retry_period
        );
        c.check(
            "SIDECAR_LEASE_DURATION",
            &all,
            timings.validate().map(|_| timings).map_err(str::to_owned),
        )
    }

    fn planner_policy(&self, c: &mut Checker) -> Option<Policy> {
        let ms = |c: &mut Checker, var, v: &String| {
            c.check(var, v, parse_duration_in(v, 0, 86_400_000))
                .map(|d| d.as_millis() as u64)
        };
        let failback = c.check(
            "SIDECAR_FAILBACK",
            &self.failback,
            parse_bool(&self.failback),
        );
        let balance = c.check("SIDECAR_BALANCE", &self.balance, parse_bool(&self.balance));
        let quiet = ms(c, "SIDECAR_QUIET_PERIOD", &self.quiet_period);
        let cooldown = ms(c, "SIDECAR_MOVE_COOLDOWN", &self.move_cooldown);
        let zones = c.opt(
            "SIDECAR_PREFERRED_ZONES",
            &self.preferred_zones,
            parse_zone_map,
        );
        let handovers = c.check(
            "SIDECAR_MAX_HANDOVERS",
            &self.max_handovers,
            parse_count(&self.max_handovers, 64),
        );
        let roll = c.opt("SIDECAR_ROLL", &self.roll, parse_roll);
        if self.roll.is_some() && roll.is_none() {
            return None;
        }
        Some(Policy {
            roll,
            failback: failback?,
            quiet_period_ms: quiet?,
            balance: balance?,
            cooldown_ms: cooldown?,
            max_concurrent: 1,
            max_handovers: handovers?,
            preferred_zones: zones.unwrap_or_default(),
        })
    }

    fn policy(&self, c: &mut Checker) -> Option<LabelPolicy> {
        let key = |c: &mut Checker, var, v: &String| {
            c.check(
                var,
                v,
                check_key(v).map(|_| v.clone()).map_err(str::to_owned),
            )
        };
        let role_key = key(c, "SIDECAR_ROLE_LABEL", &self.role_label);
        let shard_key = key(c, "SIDECAR_SHARD_LABEL", &self.shard_label);
        let zone_key = key(c, "SIDECAR_ZONE_LABEL", &self.zone_label);
        let region_key = key(c, "SIDECAR_REGION_LABEL", &self.region_label);
        let values = c.check(
            "SIDECAR_ROLE_VALUES",
            &self.role_values,
            parse_role_values(&self.role_values),
        );
        let (primary_value, replica_value) = values?;
        Some(LabelPolicy {
            role_key: role_key?,
            primary_value,
            replica_value,
            shard_key: shard_key?,
            zone_key: zone_key?,
            region_key: region_key?,
        })
    }

    fn valkey(&self, c: &mut Checker) -> Option<ValkeyConfig> {
        let addr = c.check(
            "VALKEY_ADDR",
            &self.valkey_addr,
            parse_host_port(&self.valkey_addr),
        );
        let password = self.password(c);
        let username = c.opt("VALKEY_USERNAME", &self.valkey_username, parse_username);
        let timeout = c.check(
            "SIDECAR_VALKEY_TIMEOUT",
            &self.valkey_timeout,
            parse_duration_in(&self.valkey_timeout, 10, 60_000),
        );
        let tls = self.tls(c, addr.as_ref().map(|(h, _)| h.as_str()));
        let zone_file = c.opt("SIDECAR_ZONE_FILE", &self.zone_file, writable_dir_file);
        let (host, port) = addr?;
        Some(ValkeyConfig {
            host,
            port,
            username,
            password: password?,
            tls: tls?,
            timeout: timeout?,
            zone_file,
        })
    }

    /// VALKEY_PASSWORD_FILE or VALKEY_PASSWORD, not both (which would win is a guess an operator
    /// should not have to make). An empty VALKEY_PASSWORD is unset, as the chart leaves variables
    /// out. `Some(None)`: no password; `None`: a password variable was bad.
    fn password(&self, c: &mut Checker) -> Option<Option<Password>> {
        let value = self.valkey_password.as_ref().filter(|v| !v.0.is_empty());
        match (&self.valkey_password_file, value) {
            (Some(path), Some(_)) => {
                let only_one = |other: &str| Err::<(), _>(format!("set together with {other}"));
                c.check("VALKEY_PASSWORD_FILE", path, only_one("VALKEY_PASSWORD"));
                c.check("VALKEY_PASSWORD", HIDDEN, only_one("VALKEY_PASSWORD_FILE"));
                None
            }
            (Some(path), None) => {
                let file = c.check("VALKEY_PASSWORD_FILE", path, readable_file(path))?;
                Some(Some(Password::File(file)))
            }
            (None, Some(v)) => Some(Some(Password::Value(v.clone()))),
            (None, None) => Some(None),
        }
    }

    /// `Some(None)`: TLS off; `None`: a TLS variable was bad.
    fn tls(&self, c: &mut Checker, host: Option<&str>) -> Option<Option<TlsConfig>> {
        let on = c.check("VALKEY_TLS", &self.valkey_tls, parse_bool(&self.valkey_tls))?;
        let ca = c.opt(
            "VALKEY_TLS_CA_FILE",
            &self.valkey_tls_ca_file,
            readable_file,
        );
        let cert = c.opt(
            "VALKEY_TLS_CERT_FILE",
            &self.valkey_tls_cert_file,
            readable_file,
        );
        let key = c.opt(
            "VALKEY_TLS_KEY_FILE",
            &self.valkey_tls_key_file,
            readable_file,
        );
        if !on {
            return Some(None);
        }
        let ca = ca.or_else(|| {
            c.check::<PathBuf>(
                "VALKEY_TLS_CA_FILE",
                "",
                Err("required when VALKEY_TLS=true".into()),
            )
        });
        let client_cert = match (cert, key) {
            (Some(cert), Some(key)) => Some(Some((cert, key))),
            (None, None) => Some(None),
            (Some(_), None) => c.check(
                "VALKEY_TLS_KEY_FILE",
                "",
                Err("required with VALKEY_TLS_CERT_FILE".into()),
            ),
            (None, Some(_)) => c.check(
                "VALKEY_TLS_CERT_FILE",
                "",
                Err("required with VALKEY_TLS_KEY_FILE".into()),
            ),
        };
        let server_name = self
            .valkey_tls_server_name
            .clone()
            .or(host.map(str::to_owned))?;
        Some(Some(TlsConfig {
            ca_file: ca?,
            client_cert: client_cert?,
            server_name,
        }))
    }

    /// Both heartbeat variables; the window must hold two intervals (one lost datagram is not
    /// a cut).
    fn isolation(&self, c: &mut Checker) -> Option<Option<IsolationPolicy>> {
        let interval = c.check(
            "SIDECAR_HEARTBEAT_INTERVAL",
            &self.heartbeat_interval,
            parse_duration_in(&self.heartbeat_interval, 10, 5_000),
        );
        let after = c.check(
            "SIDECAR_ISOLATION_FENCE_AFTER",
            &self.isolation_fence_after,
            parse_isolation_after(&self.isolation_fence_after, interval),
        );
        let interval_ms = interval?.as_millis() as u64;
        Some(after?.map(|fence_after_ms| IsolationPolicy {
            interval_ms,
            fence_after_ms,
        }))
    }

    fn probe_addr(&self, c: &mut Checker, pod_ip: Option<IpAddr>) -> Option<SocketAddr> {
        let default_ip = pod_ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        match &self.probe_addr {
            Some(v) => c.check("SIDECAR_PROBE_ADDR", v, parse_socket_addr(v)),
            None => Some(SocketAddr::new(default_ip, DEFAULT_PROBE_PORT)),
        }
    }

    fn bounds(&self, c: &mut Checker, poll: Option<Duration>) -> Option<Bounds> {
        let poll_ms = poll.map_or(10, |p| p.as_millis() as u64);
        let live = c.check(
            "SIDECAR_LIVENESS_WINDOW",
            &self.liveness_window,
            parse_duration_in(&self.liveness_window, poll_ms * 2, 3_600_000),
        );
        let stale = c.check(
            "SIDECAR_STALE_AFTER",
            &self.stale_after,
            parse_duration_in(&self.stale_after, poll_ms, 3_600_000),
        );
        let lag = c.check(
            "SIDECAR_MAX_LAG_BYTES",
            &self.max_lag_bytes,
            self.max_lag_bytes
                .parse::<u64>()
                .map_err(|_| "not a number of bytes".into()),
        );
        Some(Bounds {
            liveness_window_ms: live?.as_millis() as u64,
            stale_after_ms: stale?.as_millis() as u64,
            max_lag_bytes: lag?,
        })
    }
}

fn parse_mode(v: &str) -> Result<Mode, String> {
    match v {
        "cluster" => Ok(Mode::Cluster),
        "replication" => Ok(Mode::Replication),
        _ => Err("must be `cluster` or `replication`".into()),
    }
}

fn parse_log_format(v: &str) -> Result<LogFormat, String> {
    match v {
        "auto" => Ok(LogFormat::Auto),
        "json" => Ok(LogFormat::Json),
        "text" => Ok(LogFormat::Text),
        _ => Err("must be `auto`, `json` or `text`".into()),
    }
}

/// `auto` → `None` (decide from other settings).
fn parse_auto_bool(v: &str) -> Result<Option<bool>, String> {
    if v == "auto" {
        return Ok(None);
    }
    parse_bool(v)
        .map(Some)
        .map_err(|_| "must be `auto`, `true` or `false`".into())
}

fn parse_zone_map(v: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    v.split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (shard, zone) = kv.split_once('=').ok_or("entries must be `shard=zone`")?;
            parse_label_value(zone)?;
            Ok((shard.to_owned(), zone.to_owned()))
        })
        .collect()
}

/// `<primary>,<replica>`: two different valid label values.
pub(crate) fn parse_role_values(v: &str) -> Result<(String, String), String> {
    let (p, r) = v.split_once(',').ok_or("must be `<primary>,<replica>`")?;
    check_value(p).and(check_value(r)).map_err(str::to_owned)?;
    if p.is_empty() || r.is_empty() || p == r {
        return Err("two different non-empty label values".into());
    }
    Ok((p.to_owned(), r.to_owned()))
}

/// `<shards at once>:<pods per shard>`, both at least 1.
fn parse_roll(v: &str) -> Result<RollPolicy, String> {
    let bad = || "expected `<shards at once>:<pods per shard>`, e.g. `1:3`".to_owned();
    let (shards, pods) = v.split_once(':').ok_or_else(bad)?;
    let count = |s: &str| {
        s.trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=16_384).contains(n))
    };
    Ok(RollPolicy {
        max_shards_rolling: count(shards).ok_or_else(bad)?,
        pods_per_shard: count(pods).ok_or_else(bad)?,
    })
}

/// A shard count: 1 to 16384 (each shard owns at least one slot).
fn parse_shards(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(n) if (1..=16_384).contains(&n) => Ok(n),
        _ => Err("expected a shard count from 1 to 16384".into()),
    }
}

/// A count from 1 to `max`.
fn parse_count(v: &str, max: usize) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected a count from 1 to {max}")),
    }
}

fn parse_bool(v: &str) -> Result<bool, String> {
    match v {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err("must be `true` or `false`".into()),
    }
}

/// A duration with a unit (`ms`, `s`, `m`), between `min_ms` and `max_ms`.
pub fn parse_duration_in(v: &str, min_ms: u64, max_ms: u64) -> Result<Duration, String> {
    let ms = parse_millis(v)?;
    if ms < min_ms || ms > max_ms {
        return Err(format!("must be between {min_ms}ms and {max_ms}ms"));
    }
    Ok(Duration::from_millis(ms))
}

/// The fence after `v` of silence; each fence lasts four polls (at least 1 s), renewed every poll
/// while the minority lasts, so one slow tick does not let it lapse.
fn parse_quorum_fence(v: &str, poll: Option<Duration>) -> Result<Option<QuorumPolicy>, String> {
    if v == "off" {
        return Ok(None);
    }
    let after = parse_duration_in(v, 100, 60_000).map_err(|e| format!("{e}, or off"))?;
    let poll_ms = poll.map_or(250, |p| p.as_millis() as u64);
    Ok(Some(QuorumPolicy {
        silent_after_ms: after.as_millis() as u64,
        pause_ms: (4 * poll_ms).max(1000),
    }))
}

/// `off`, or a window of at least two heartbeat intervals (and 20 ms) up to a minute.
fn parse_isolation_after(v: &str, interval: Option<Duration>) -> Result<Option<u64>, String> {
    if v == "off" {
        return Ok(None);
    }
    let floor = interval.map_or(20, |i| (2 * i.as_millis() as u64).max(20));
    let after = parse_duration_in(v, floor, 60_000)
        .map_err(|e| format!("{e} (at least two SIDECAR_HEARTBEAT_INTERVAL), or off"))?;
    Ok(Some(after.as_millis() as u64))
}

fn parse_millis(v: &str) -> Result<u64, String> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| "not a duration such as 250ms, 2s or 1m".to_owned())?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        _ => return Err("needs a unit: ms, s or m".into()),
    };
    n.checked_mul(scale).ok_or_else(|| "too large".into())
}

fn parse_host_port(v: &str) -> Result<(String, u16), String> {
    let (host, port) = v.rsplit_once(':').ok_or("must be host:port")?;
    let port: u16 = port
        .parse()
        .map_err(|_| "port must be 1-65535".to_owned())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || port == 0 {
        return Err("must be host:port".into());
    }
    Ok((host.to_owned(), port))
}

fn parse_socket_addr(v: &str) -> Result<SocketAddr, String> {
    v.parse().map_err(|_| "must be ip:port".into())
}

fn parse_loopback(v: &str) -> Result<SocketAddr, String> {
    let addr = parse_socket_addr(v)?;
    if !addr.ip().is_loopback() {
        return Err("admin endpoints must listen on a loopback address".into());
    }
    Ok(addr)
}

/// A file path whose directory exists (the file itself is written later).
fn writable_dir_file(v: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(v);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() && path.file_name().is_some() => d,
        _ => return Err("must be a file path with a directory".into()),
    };
    if !dir.is_dir() {
        return Err(format!("directory {} does not exist", dir.display()));
    }
    Ok(path)
}

fn readable_file(v: &str) -> Result<PathBuf, String> {
    std::fs::File::open(v).map_err(|e| format!("cannot read: {e}"))?;
    Ok(PathBuf::from(v))
}

fn parse_username(v: &str) -> Result<String, String> {
    if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must be a non-empty ACL user name without spaces".into());
    }
    Ok(v.to_owned())
}

/// RFC 1123 subdomain, as Kubernetes object names are.
fn parse_dns_name(v: &str) -> Result<String, String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let edges_ok = v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric());
    if v.len() > 253 || !edges_ok || !v.chars().all(ok_char) {
        return Err("must be a lowercase RFC 1123 name".into());
    }
    Ok(v.to_owned())
}

/// A Kubernetes label value: at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn parse_label_value(v: &str) -> Result<String, String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let edges_ok = v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric());
    if v.len() > 63 || !edges_ok || !v.chars().all(ok_char) {
        return Err("must be a valid label value (≤ 63 chars of A-Z a-z 0-9 . _ -)".into());
    }
    Ok(v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units_and_bounds() {
        assert_eq!(
            parse_duration_in("250ms", 10, 1000),
            Ok(Duration::from_millis(250))
        );
        assert_eq!(
            parse_duration_in("2s", 10, 5000),
            Ok(Duration::from_secs(2))
        );
        assert_eq!(
            parse_duration_in("1m", 10, 60_000),
            Ok(Duration::from_secs(60))
        );
        assert!(parse_duration_in("250", 10, 1000).is_err());
        assert!(parse_duration_in("5ms", 10, 1000).is_err());
        assert!(parse_duration_in("-1s", 10, 1000).is_err());
        assert!(parse_duration_in("99999999999999999999s", 10, 1000).is_err());
    }

    #[test]
    fn host_port_accepts_names_and_ipv6() {
        assert_eq!(parse_host_port("valkey:6379"), Ok(("valkey".into(), 6379)));
        assert_eq!(parse_host_port("[::1]:6380"), Ok(("::1".into(), 6380)));
        assert!(parse_host_port("valkey").is_err());
        assert!(parse_host_port(":6379").is_err());
        assert!(parse_host_port("h:0").is_err());
    }

    #[test]
    fn defaults_validate() {
        let raw = Cli::parse_from(["valkey-sidecar"]).agent;
        let config = raw.validate().map_err(|e| e.to_string());
        let config = config
            .as_ref()
            .map(|c| (c.mode, c.probe_addr.port(), c.poll_interval));
        assert_eq!(
            config,
            Ok((
                Mode::Cluster,
                DEFAULT_PROBE_PORT,
                Duration::from_millis(250)
            ))
        );
    }

    #[test]
    fn hand_overs_at_once_are_a_count_from_1_to_64() {
        let handovers = |n: &str| {
            let args = [
                "valkey-sidecar",
                "--pod-name",
                "v-0",
                "--pod-namespace",
                "ns",
            ];
            let named = ["--cluster-name", "orders", "--max-handovers", n];
            let raw = Cli::parse_from(args.iter().chain(&named)).agent;
            match raw.validate() {
                Ok(c) => Ok(c
                    .kube
                    .and_then(|k| k.coordinator)
                    .map(|co| co.policy.max_handovers)),
                Err(e) => Err(e.0.iter().map(|i| i.var).collect::<Vec<_>>()),
            }
        };
        assert_eq!(handovers("8"), Ok(Some(8)));
        assert_eq!(handovers("64"), Ok(Some(64)));
        for bad in ["0", "65", "many"] {
            assert_eq!(handovers(bad), Err(vec!["SIDECAR_MAX_HANDOVERS"]), "{bad}");
        }
    }

    #[test]
    fn coordination_with_an_operator_defaults_to_the_cluster_name() {
        let operator = |args: &[&str]| {
            let base = [
                "valkey-sidecar",
                "--pod-name",
                "v-0",
                "--pod-namespace",
                "ns",
            ];
            let args: Vec<&str> = base.iter().chain(args).copied().collect();
            let raw = Cli::parse_from(args).agent;
            let config = raw.validate().map_err(|e| e.to_string());
            config.map(|c| {
                c.kube
                    .and_then(|k| k.coordinator)
                    .and_then(|co| co.operator)
            })
        };
        let cluster = ["--cluster-name", "orders"];
        assert_eq!(operator(&cluster), Ok(None));
        let deferring = [&cluster[..], &["--coordination", "operator"]].concat();
        assert_eq!(operator(&deferring), Ok(Some("orders".into())));
        let named = [&deferring[..], &["--operator-resource", "orders-vc"]].concat();
        assert_eq!(operator(&named), Ok(Some("orders-vc".into())));
    }

    #[test]
    fn every_bad_variable_is_named() {
        let mut raw = Cli::parse_from(["valkey-sidecar"]).agent;
        raw.mode = "sentinel".into();
        raw.poll_interval = "fast".into();
        raw.admin_addr = "0.0.0.0:9737".into();
        raw.zone = Some("not a zone".into());
        let err = raw
            .validate()
            .err()
            .map(|e| e.0.iter().map(|i| i.var).collect::<Vec<_>>());
        assert_eq!(
            err,
            Some(vec![
                "SIDECAR_ZONE",
                "SIDECAR_MODE",
                "SIDECAR_ADMIN_ADDR",
                "SIDECAR_POLL_INTERVAL"
            ])
        );
    }

    #[test]
    fn the_zone_file_needs_an_existing_directory() {
        let zone_file = |v: &str| {
            let mut raw = Cli::parse_from(["valkey-sidecar"]).agent;
            raw.zone_file = Some(v.to_owned());
            raw.validate().map(|c| c.valkey.zone_file)
        };
        let dir = std::env::temp_dir();
        let ok = dir.join("zone");
        assert_eq!(zone_file(ok.to_str().unwrap()), Ok(Some(ok.clone())));
        for bad in ["/nonexistent-dir-of-vs/zone", "zone", "/"] {
            let err = zone_file(bad).unwrap_err();
            assert_eq!(err.0.len(), 1, "{bad}: {err}");
            assert_eq!(err.0[0].var, "SIDECAR_ZONE_FILE", "{bad}");
        }
    }

    /// A raw config with VALKEY_PASSWORD and VALKEY_PASSWORD_FILE as given.
    fn with_passwords(value: Option<&str>, file: Option<&str>) -> RawConfig {
        let mut raw = Cli::parse_from(["valkey-sidecar"]).agent;
        raw.valkey_password = value.map(|v| Secret(v.to_owned()));
        raw.valkey_password_file = file.map(str::to_owned);
        raw
    }

    #[test]
    fn a_password_comes_from_the_environment_or_a_file() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().to_str().unwrap();
        let password = |raw: RawConfig| raw.validate().map(|c| c.valkey.password);
        assert_eq!(
            password(with_passwords(Some("s3cret"), None)),
            Ok(Some(Password::Value(Secret("s3cret".into()))))
        );
        assert_eq!(
            password(with_passwords(None, Some(path))),
            Ok(Some(Password::File(PathBuf::from(path))))
        );
        assert_eq!(password(with_passwords(None, None)), Ok(None));
        // Empty is unset (the chart leaves variables out that way), so it conflicts with nothing.
        assert_eq!(
            password(with_passwords(Some(""), Some(path))),
            Ok(Some(Password::File(PathBuf::from(path))))
        );
    }

    #[test]
    fn both_password_variables_are_an_error_naming_both_and_showing_neither_password() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().to_str().unwrap();
        let err = with_passwords(Some("s3cret"), Some(path)).validate().err();
        let vars = err
            .as_ref()
            .map(|e| e.0.iter().map(|i| i.var).collect::<Vec<_>>());
        assert_eq!(vars, Some(vec!["VALKEY_PASSWORD_FILE", "VALKEY_PASSWORD"]));
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("set together with VALKEY_PASSWORD_FILE"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");
        // Nor does a config's or a raw config's Debug (configs are logged that way).
        let raw = with_passwords(Some("s3cret"), None);
        assert!(!format!("{raw:?}").contains("s3cret"));
        let config = raw.validate().map(|c| format!("{c:?}")).unwrap_or_default();
        assert!(
            config.contains("<hidden>") && !config.contains("s3cret"),
            "{config}"
        );
    }

    #[test]
    fn label_values_follow_kubernetes_rules() {
        assert!(parse_label_value("eu-west-1a").is_ok());
        assert!(parse_label_value(&"a".repeat(64)).is_err());
        assert!(parse_label_value("-a").is_err());
        assert!(parse_dns_name("valkey-0").is_ok());
        assert!(parse_dns_name("Valkey").is_err());
    }
}
