//! One primary and N replicas, standalone (non-cluster) mode.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::Result;
use crate::info::info_field;
use crate::net::{loopback_ip, wait_for};
use crate::server::{POLL, ServerOptions, ValkeyServer};

/// How to start a [`ReplicationSet`]. `From<ServerOptions>` fills in the defaults.
#[derive(Clone, Debug)]
pub struct ReplicationOptions {
    /// Template for every node (`replica_of` is set per replica; `bind` is overridden by `first_ip`).
    pub server: ServerOptions,
    /// `Some(n)`: node `k` (0 = primary) binds `127.0.0.(n + k)`, one address per "pod".
    pub first_ip: Option<u8>,
    /// Availability zones, node `k` gets `zones[k % zones.len()]`; empty keeps `server`'s zone.
    pub zones: Vec<String>,
    /// How long to wait for every replica to be in sync.
    pub ready_timeout: Duration,
}

impl Default for ReplicationOptions {
    fn default() -> Self {
        ServerOptions::default().into()
    }
}

impl From<ServerOptions> for ReplicationOptions {
    fn from(server: ServerOptions) -> Self {
        Self {
            server,
            first_ip: None,
            zones: Vec::new(),
            ready_timeout: Duration::from_secs(15),
        }
    }
}

/// A primary and its replicas (`REPLICAOF`), every replica synced when `start` returns.
pub struct ReplicationSet {
    /// Index 0 is the primary at start-up.
    nodes: Vec<ValkeyServer>,
}

impl ReplicationSet {
    /// Starts 1 primary and `replicas` replicas, then waits until every replica reports
    /// `master_link_status:up` and `master_sync_in_progress:0`.
    pub fn start(replicas: usize, opts: impl Into<ReplicationOptions>) -> Result<Self> {
        let opts = opts.into();
        let primary = ValkeyServer::start(node_options(&opts, 0, None)?)?;
        let replica_opts = (1..=replicas)
            .map(|k| node_options(&opts, k, Some(primary.addr())))
            .collect::<Result<Vec<_>>>()?;
        let mut nodes = vec![primary];
        nodes.extend(start_all(replica_opts)?);
        let set = Self { nodes };
        set.wait_synced(opts.ready_timeout)?;
        Ok(set)
    }

    /// The primary at start-up (after a failover, ask [`ValkeyServer::role`]).
    pub fn primary(&self) -> &ValkeyServer {
        &self.nodes[0]
    }

    /// The replicas at start-up.
    pub fn replicas(&self) -> &[ValkeyServer] {
        &self.nodes[1..]
    }

    /// All nodes, the start-up primary first.
    pub fn nodes(&self) -> &[ValkeyServer] {
        &self.nodes
    }

    pub fn node_by_addr(&self, addr: SocketAddr) -> Option<&ValkeyServer> {
        self.nodes.iter().find(|n| n.addr() == addr)
    }

    /// Waits until the running nodes form one healthy set, whoever is primary now: exactly one
    /// primary, every other running node its replica with the link up and no sync in progress.
    /// Useful after a failover or a restart too.
    pub fn wait_synced(&self, timeout: Duration) -> Result<()> {
        wait_for("the replication set to sync", timeout, POLL, || {
            self.check_synced()
        })
    }

    fn check_synced(&self) -> Result<bool> {
        let running: Vec<&ValkeyServer> = self.nodes.iter().filter(|n| n.is_running()).collect();
        let mut primaries = Vec::new();
        for node in &running {
            if node.is_primary()? {
                primaries.push(node.addr());
            }
        }
        let [primary] = primaries[..] else {
            bail!("expected one primary, found {primaries:?}");
        };
        for node in running.iter().filter(|n| n.addr() != primary) {
            if !replica_synced_to(node, primary)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// `node` replicates from `primary`, its link is up and no (full) sync is in progress.
pub(crate) fn replica_synced_to(node: &ValkeyServer, primary: SocketAddr) -> Result<bool> {
    let info = node.info("replication")?;
    let field = |k| info_field(&info, k).unwrap_or_default();
    let following = field("master_host") == primary.ip().to_string()
        && field("master_port") == primary.port().to_string();
    Ok(following && replica_link_ok(&info))
}

/// `master_link_status:up` and `master_sync_in_progress:0` in an `INFO replication` text.
pub(crate) fn replica_link_ok(info: &str) -> bool {
    info_field(info, "master_link_status") == Some("up")
        && info_field(info, "master_sync_in_progress") == Some("0")
}

/// Options for node `k` of a multi-node topology: its address and zone.
pub(crate) fn node_options(
    opts: &ReplicationOptions,
    k: usize,
    replica_of: Option<SocketAddr>,
) -> Result<ServerOptions> {
    let mut server = opts.server.clone();
    server.replica_of = replica_of;
    if let Some(ip) = nth_ip(opts.first_ip, k)? {
        server.bind = ip;
    }
    if !opts.zones.is_empty() {
        server.availability_zone = Some(opts.zones[k % opts.zones.len()].clone());
    }
    Ok(server)
}

/// `127.0.0.(first + k)`, or `None` when every node shares the template's address.
pub(crate) fn nth_ip(first: Option<u8>, k: usize) -> Result<Option<IpAddr>> {
    let Some(first) = first else {
        return Ok(None);
    };
    let last = u8::try_from(k)
        .ok()
        .and_then(|k| first.checked_add(k))
        .filter(|n| *n < 255)
        .with_context(|| format!("127.0.0.{first} + {k} is past 127.0.0.254"))?;
    Ok(Some(loopback_ip(last)))
}

/// Starts servers concurrently: each start waits for its own process, so in parallel they take as
/// long as the slowest one instead of the sum.
pub(crate) fn start_all(opts: Vec<ServerOptions>) -> Result<Vec<ValkeyServer>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = opts
            .into_iter()
            .map(|o| scope.spawn(move || ValkeyServer::start(o)))
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(result) => result,
                Err(_) => bail!("a server start-up thread panicked"),
            })
            .collect()
    })
}
