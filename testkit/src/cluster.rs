//! A real Valkey Cluster, built with plain cluster commands (no `valkey-cli --cluster create`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::Result;
use crate::info::info_field;
use crate::replication::{nth_ip, replica_link_ok, start_all};
use crate::server::{POLL, ServerOptions, ValkeyServer};

/// Number of hash slots in a Valkey Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// How to start a [`ValkeyCluster`]. `From<ServerOptions>` fills in the defaults.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Template for every node; cluster mode is forced on. Its `cluster_node_timeout_ms` (default
    /// 2000) is the cluster's `cluster-node-timeout`.
    pub server: ServerOptions,
    /// `Some(n)`: node `k` (in [`ValkeyCluster::nodes`] order) binds `127.0.0.(n + k)`.
    pub first_ip: Option<u8>,
    /// Availability zones: member `j` of shard `s` gets `zones[(s + j) % zones.len()]`, so each shard
    /// spans distinct zones and the primaries rotate through them. Empty keeps `server`'s zone.
    pub zones: Vec<String>,
    /// How long to wait for `cluster_state:ok` and synced replicas.
    pub ready_timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ServerOptions::default().into()
    }
}

impl From<ServerOptions> for ClusterOptions {
    fn from(server: ServerOptions) -> Self {
        Self {
            server,
            first_ip: None,
            zones: Vec::new(),
            ready_timeout: Duration::from_secs(20),
        }
    }
}

impl ClusterOptions {
    /// `cluster-node-timeout` in milliseconds.
    pub fn node_timeout_ms(mut self, ms: u64) -> Self {
        self.server.cluster_node_timeout_ms = ms;
        self
    }

    /// One address per node, starting at `127.0.0.first`.
    pub fn first_ip(mut self, first: u8) -> Self {
        self.first_ip = Some(first);
        self
    }

    /// Zones to spread the nodes over (see [`ClusterOptions::zones`]).
    pub fn zones<S: Into<String>>(mut self, zones: impl IntoIterator<Item = S>) -> Self {
        self.zones = zones.into_iter().map(Into::into).collect();
        self
    }
}

/// A formed cluster: `shards` primaries owning even slot ranges, each with its replicas.
///
/// The layout accessors ([`Self::primaries`], [`Self::replicas_of`], [`Self::shard`]) describe the
/// cluster as formed; after a failover, ask the nodes ([`ValkeyServer::role`],
/// [`Self::live_primaries`]).
pub struct ValkeyCluster {
    /// Grouped by shard: shard `s` is `nodes[s * per_shard..(s + 1) * per_shard]`, primary first.
    nodes: Vec<ValkeyServer>,
    /// `CLUSTER MYID` of each node, parallel to `nodes` (stable across restarts: `nodes.conf`).
    ids: Vec<String>,
    shards: usize,
    per_shard: usize,
}

impl ValkeyCluster {
    /// Starts `shards * (1 + replicas_per_shard)` nodes and forms the cluster: config epochs, slots,
    /// `CLUSTER MEET`, `CLUSTER REPLICATE`. Returns once every node reports `cluster_state:ok`, sees
    /// the whole topology, and every replica has `master_link_status:up`.
    pub fn start(
        shards: usize,
        replicas_per_shard: usize,
        opts: impl Into<ClusterOptions>,
    ) -> Result<Self> {
        let opts = opts.into();
        if shards == 0 || shards > usize::from(CLUSTER_SLOTS) {
            bail!("a cluster needs 1..={CLUSTER_SLOTS} shards, not {shards}");
        }
        let per_shard = 1 + replicas_per_shard;
        let node_opts = (0..shards * per_shard)
            .map(|k| node_options(&opts, k, k / per_shard, k % per_shard))
            .collect::<Result<Vec<_>>>()?;
        let nodes = start_all(node_opts)?;
        let ids = nodes
            .iter()
            .map(|n| n.query::<String>(&["CLUSTER", "MYID"]))
            .collect::<Result<Vec<_>>>()?;
        let cluster = Self {
            nodes,
            ids,
            shards,
            per_shard,
        };
        cluster.form(opts.ready_timeout)?;
        Ok(cluster)
    }

    fn form(&self, timeout: Duration) -> Result<()> {
        // Distinct epochs up front, as valkey-cli does: otherwise every primary starts at epoch 0 and
        // the cluster spends time resolving the collisions one bump at a time.
        for (k, node) in self.nodes.iter().enumerate() {
            node.cmd(&["CLUSTER", "SET-CONFIG-EPOCH", &(k + 1).to_string()])?;
        }
        for shard in 0..self.shards {
            let (first, last) = self.slot_range(shard);
            self.shard(shard)[0].cmd(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ])?;
        }
        self.meet_all()?;
        self.wait_replicas_know_primaries(timeout)?;
        for shard in 0..self.shards {
            let primary_id = &self.ids[shard * self.per_shard];
            for replica in self.replicas_of(shard) {
                replica.cmd(&["CLUSTER", "REPLICATE", primary_id])?;
            }
        }
        self.wait_healthy(timeout)
    }

    /// One node meets all others; gossip spreads the rest.
    fn meet_all(&self) -> Result<()> {
        let (first, others) = self.nodes.split_first().context("empty cluster")?;
        for node in others {
            let bus = node.bus_port().context("cluster node without a bus port")?;
            first.cmd(&[
                "CLUSTER",
                "MEET",
                &node.host(),
                &node.port().to_string(),
                &bus.to_string(),
            ])?;
        }
        Ok(())
    }

    /// `CLUSTER REPLICATE <id>` fails with "Unknown node" until the replica has finished the
    /// handshake with that primary.
    fn wait_replicas_know_primaries(&self, timeout: Duration) -> Result<()> {
        crate::wait_for("replicas to learn their primaries", timeout, POLL, || {
            for shard in 0..self.shards {
                let primary_id = &self.ids[shard * self.per_shard];
                for replica in self.replicas_of(shard) {
                    let nodes: String = replica.query(&["CLUSTER", "NODES"])?;
                    let known = parse_nodes(&nodes)
                        .iter()
                        .any(|n| n.id == primary_id && n.has_flag("master") && n.settled());
                    if !known {
                        return Ok(false);
                    }
                }
            }
            Ok(true)
        })
    }

    /// Waits until every node reports `cluster_state:ok`, sees all nodes settled (no handshake, no
    /// failure flags) with one primary per shard, all nodes of a shard share one shard id, and every
    /// replica's link is up with no sync in progress. Holds for the current roles, so it also serves
    /// after a failover or a restart (all nodes must be running).
    pub fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        crate::wait_for("the cluster to be healthy", timeout, POLL, || {
            self.check_healthy()
        })
    }

    fn check_healthy(&self) -> Result<bool> {
        for node in &self.nodes {
            if !self.node_healthy(node)? {
                return Ok(false);
            }
        }
        self.shards_consistent()
    }

    fn node_healthy(&self, node: &ValkeyServer) -> Result<bool> {
        let info: String = node.query(&["CLUSTER", "INFO"])?;
        if info_field(&info, "cluster_state") != Some("ok") {
            return Ok(false);
        }
        let text: String = node.query(&["CLUSTER", "NODES"])?;
        let view = parse_nodes(&text);
        let primaries = view.iter().filter(|n| n.has_flag("master")).count();
        let all_settled = view.len() == self.nodes.len() && view.iter().all(NodeLine::settled);
        if !all_settled || primaries != self.shards {
            return Ok(false);
        }
        let me_replica = view
            .iter()
            .any(|n| n.has_flag("myself") && n.has_flag("slave"));
        Ok(!me_replica || replica_link_ok(&node.info("replication")?))
    }

    /// Every shard id is carried by exactly `1 + replicas_per_shard` nodes.
    fn shards_consistent(&self) -> Result<bool> {
        let mut members: HashMap<String, usize> = HashMap::new();
        for node in &self.nodes {
            *members
                .entry(node.query(&["CLUSTER", "MYSHARDID"])?)
                .or_default() += 1;
        }
        Ok(members.len() == self.shards && members.values().all(|&n| n == self.per_shard))
    }

    /// All nodes, grouped by shard, each shard's start-up primary first.
    pub fn nodes(&self) -> &[ValkeyServer] {
        &self.nodes
    }

    /// `CLUSTER MYID` of each node, parallel to [`Self::nodes`].
    pub fn node_ids(&self) -> &[String] {
        &self.ids
    }

    pub fn shard_count(&self) -> usize {
        self.shards
    }

    /// Shard `shard`'s nodes as formed, primary first. Panics if `shard` is out of range.
    pub fn shard(&self, shard: usize) -> &[ValkeyServer] {
        &self.nodes[shard * self.per_shard..(shard + 1) * self.per_shard]
    }

    /// The primary of each shard as formed.
    pub fn primaries(&self) -> Vec<&ValkeyServer> {
        self.nodes.iter().step_by(self.per_shard).collect()
    }

    /// The replicas of `shard` as formed.
    pub fn replicas_of(&self, shard: usize) -> &[ValkeyServer] {
        &self.shard(shard)[1..]
    }

    /// The nodes whose `ROLE` is primary right now (running nodes only).
    pub fn live_primaries(&self) -> Result<Vec<&ValkeyServer>> {
        let mut out = Vec::new();
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            if node.is_primary()? {
                out.push(node);
            }
        }
        Ok(out)
    }

    pub fn node_by_addr(&self, addr: SocketAddr) -> Option<&ValkeyServer> {
        self.nodes.iter().find(|n| n.addr() == addr)
    }

    pub fn node_by_id(&self, id: &str) -> Option<&ValkeyServer> {
        let k = self.ids.iter().position(|i| i == id)?;
        self.nodes.get(k)
    }

    /// `CLUSTER MYSHARDID` of each shard (asked of its first running node).
    pub fn shard_ids(&self) -> Result<Vec<String>> {
        (0..self.shards)
            .map(|s| {
                let node = self
                    .shard(s)
                    .iter()
                    .find(|n| n.is_running())
                    .with_context(|| format!("no running node in shard {s}"))?;
                node.query(&["CLUSTER", "MYSHARDID"])
            })
            .collect()
    }

    /// The inclusive slot range shard `shard` was given: 16384 slots split evenly.
    pub fn slot_range(&self, shard: usize) -> (u16, u16) {
        slot_range(shard, self.shards)
    }
}

fn slot_range(shard: usize, shards: usize) -> (u16, u16) {
    let total = usize::from(CLUSTER_SLOTS);
    let first = shard * total / shards;
    let end = (shard + 1) * total / shards;
    // Both fit: they are below 16384.
    (first as u16, (end - 1) as u16)
}

fn node_options(
    opts: &ClusterOptions,
    k: usize,
    shard: usize,
    member: usize,
) -> Result<ServerOptions> {
    let mut server = opts.server.clone();
    server.cluster = true;
    server.replica_of = None;
    if let Some(ip) = nth_ip(opts.first_ip, k)? {
        server.bind = ip;
    }
    if !opts.zones.is_empty() {
        server.availability_zone = Some(opts.zones[(shard + member) % opts.zones.len()].clone());
    }
    Ok(server)
}

/// The parts of a `CLUSTER NODES` line the harness needs.
#[derive(Debug)]
struct NodeLine<'a> {
    id: &'a str,
    flags: Vec<&'a str>,
}

impl NodeLine<'_> {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.contains(&flag)
    }

    /// Past the handshake and not suspected or known to be failing.
    fn settled(&self) -> bool {
        !["handshake", "noaddr", "fail", "fail?"]
            .iter()
            .any(|f| self.has_flag(f))
    }
}

/// `<id> <ip:port@cport[,hostname]> <flags> <primary> <ping> <pong> <epoch> <link> <slots...>`
fn parse_nodes(text: &str) -> Vec<NodeLine<'_>> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let id = fields.next()?;
            let flags = fields.nth(1)?.split(',').collect();
            Some(NodeLine { id, flags })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ranges_cover_all_slots_without_overlap() {
        for shards in [1, 2, 3, 5, 7] {
            let ranges: Vec<_> = (0..shards).map(|s| slot_range(s, shards)).collect();
            assert_eq!(ranges[0].0, 0);
            assert_eq!(ranges[shards - 1].1, CLUSTER_SLOTS - 1);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].1 + 1, pair[1].0);
            }
        }
    }

    #[test]
    fn parses_cluster_nodes_flags() {
        let text = "07c3 127.0.0.1:30004@31004 slave,fail? e7d1 0 1426238317239 4 connected\n\
                    e7d1 127.0.0.1:30001@31001,host myself,master - 0 0 1 connected 0-5460\n";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 2);
        assert!(nodes[0].has_flag("slave") && !nodes[0].settled());
        assert!(nodes[1].has_flag("myself") && nodes[1].has_flag("master") && nodes[1].settled());
    }
}
