//! Cluster mode: when an agent reads its Valkey's whole cluster map (`CLUSTER SHARDS`, `CLUSTER
//! NODES`) rather than only its own node.
//!
//! The map lists every node of the cluster, so reading it on every tick makes each agent's cost,
//! and each Valkey's (the two commands took ~190 µs of Valkey's one thread at 100 nodes,
//! measured; the cost grows with the node count), grow with the cluster. Most ticks learn nothing from it: what an agent
//! labels and reports — its role, its shard, its replication link — comes from its own node's
//! replies. So the map is read:
//! - on every tick by the coordinator, whose rounds act on it;
//! - whenever the node's own state or `CLUSTER INFO` changed (an epoch, a slot or node failure
//!   count, the known nodes, the cluster state): every failover, join and failure detection moves
//!   one of those, so the map is re-read on the tick that sees the change;
//! - otherwise once per [`refresh_after`], which grows with the cluster so that the bytes read per
//!   second stay about flat, and catches what moves nothing above (an address change).
//!
//! `CLUSTER NODES` alone is also read on every tick by a primary whose quorum fence is on: the
//! fence judges Valkey's own pending pings, which age by the tick.

use crate::observation::{ClusterView, Observation, Role};
use crate::quorum::{Peer, parse_nodes};
use crate::reply::Reply;
use crate::shards::{Shard, parse_shards};
use crate::time::Millis;

/// The shortest interval between two reads of the map when nothing changed.
pub const REFRESH_MIN_MS: u64 = 1_000;
/// The longest: the map's staleness for what moves no counter stays bounded.
pub const REFRESH_MAX_MS: u64 = 15_000;
/// Per node of the cluster: 100 nodes re-read every 2.5 s, 40 nodes' lines a second.
pub const REFRESH_PER_NODE_MS: u64 = 25;

/// How long a map of `nodes` nodes is used before it is read again, nothing having changed.
pub fn refresh_after(nodes: usize) -> u64 {
    let per_node = u64::try_from(nodes)
        .unwrap_or(u64::MAX)
        .saturating_mul(REFRESH_PER_NODE_MS);
    per_node.clamp(REFRESH_MIN_MS, REFRESH_MAX_MS)
}

/// What a tick must read beyond the node's own replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MapNeed {
    /// `CLUSTER SHARDS` and `CLUSTER NODES`: the whole map.
    pub whole: bool,
    /// `CLUSTER NODES`: with the whole map, or alone for the quorum fence's pings.
    pub nodes: bool,
}

/// Why this tick is special, as the adapter knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    /// The agent leads the coordinator: its rounds act on the map.
    pub leading: bool,
    /// The quorum fence is on (cluster mode, `SIDECAR_QUORUM_FENCE`).
    pub fencing: bool,
}

/// The last read of the whole map: when, what the node's own state was, how many nodes it had.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LastRead {
    at: Millis,
    key: String,
    nodes: usize,
}

/// The schedule of whole-map reads, kept by the observer across ticks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapSchedule {
    last: Option<LastRead>,
}

impl MapSchedule {
    /// What the tick at `now` must read, given the node's own state `key` ([`key`]).
    pub fn need(&self, now: Millis, key: &str, obs: &Observation, reading: Reading) -> MapNeed {
        let whole = reading.leading || self.stale(now, key);
        let fenced_primary = reading.fencing && obs.role == Role::Primary;
        MapNeed {
            whole,
            nodes: whole || fenced_primary,
        }
    }

    fn stale(&self, now: Millis, key: &str) -> bool {
        self.last
            .as_ref()
            .is_none_or(|l| l.key != key || now.since(l.at) >= refresh_after(l.nodes))
    }

    /// The whole map was read at `now`, with `nodes` nodes; `key` as [`MapSchedule::need`] had it.
    pub fn read(&mut self, now: Millis, key: String, nodes: usize) {
        self.last = Some(LastRead {
            at: now,
            key,
            nodes,
        });
    }

    /// The map could not be read (Valkey loading, an error): read it again on the next tick.
    pub fn forget(&mut self) {
        self.last = None;
    }
}

/// The map as last read, carried into the ticks that do not read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownMap {
    shards: Vec<Shard>,
    peers: Option<Vec<Peer>>,
}

impl KnownMap {
    /// Takes the replies this tick read (`None`: not read) and fills `view` with the latest map.
    /// A reply that was read replaces the known one even when it is an error (Valkey loading, an
    /// ACL without the command): the view then says "not read", as it would without carrying.
    /// Returns the whole map's node count when `CLUSTER SHARDS` was read and held nodes.
    pub fn fill(
        &mut self,
        view: &mut ClusterView,
        shards: Option<&Reply>,
        nodes: Option<&Reply>,
    ) -> Option<usize> {
        if let Some(reply) = shards {
            self.shards = parse_shards(reply);
        }
        if let Some(reply) = nodes {
            self.peers = reply.as_text().map(parse_nodes);
        }
        view.shards.clone_from(&self.shards);
        view.peers.clone_from(&self.peers);
        view.fresh_map = shards.is_some();
        let count = self.shards.iter().map(|s| s.nodes.len()).sum();
        (view.fresh_map && count > 0).then_some(count)
    }
}

/// The node's own state that, when it changes, means the map may have changed: its role, link
/// and replicas, its shard, and `CLUSTER INFO` without its ever-moving message counters.
pub fn key(obs: &Observation, cluster_info: Option<&str>) -> String {
    let mut key = format!("{} loading={}", obs.role.as_str(), obs.loading);
    if let Some(link) = &obs.link {
        key.push_str(&format!(" link={}:{} up={}", link.host, link.port, link.up));
    }
    for r in &obs.replicas {
        key.push_str(&format!(" replica={}:{}:{}", r.ip, r.port, r.state));
    }
    if let Some(c) = &obs.cluster {
        let id = |s: &Option<String>| s.clone().unwrap_or_default();
        key.push_str(&format!(" me={} shard={}", id(&c.my_id), id(&c.shard_id)));
    }
    for line in cluster_info
        .unwrap_or_default()
        .lines()
        .filter(|l| moves_map(l))
    {
        key.push(' ');
        key.push_str(line.trim());
    }
    key
}

/// `CLUSTER INFO` fields that count messages and bytes change on every tick without news.
fn moves_map(line: &str) -> bool {
    !line.starts_with("cluster_stats_") && !line.starts_with("total_cluster_links")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observation::{ClusterView, PrimaryLink, ReplicaEntry};

    const INFO: &str = "cluster_state:ok\r\ncluster_slots_fail:0\r\ncluster_nodes_fail:0\r\ncluster_known_nodes:6\r\ncluster_current_epoch:7\r\ncluster_stats_messages_sent:100\r\n";

    fn primary() -> Observation {
        Observation {
            role: Role::Primary,
            replicas: vec![ReplicaEntry {
                ip: "10.0.0.2".into(),
                port: 6379,
                state: "online".into(),
                offset: 10,
                ..ReplicaEntry::default()
            }],
            cluster: Some(ClusterView {
                enabled: true,
                my_id: Some("a".into()),
                shard_id: Some("s".into()),
                ..ClusterView::default()
            }),
            ..Observation::default()
        }
    }

    fn replica() -> Observation {
        Observation {
            role: Role::Replica,
            link: Some(PrimaryLink {
                host: "10.0.0.1".into(),
                port: 6379,
                up: true,
                ..PrimaryLink::default()
            }),
            ..primary()
        }
    }

    const QUIET: Reading = Reading {
        leading: false,
        fencing: true,
    };

    fn read_at(ms: u64, obs: &Observation, nodes: usize) -> MapSchedule {
        let mut s = MapSchedule::default();
        s.read(Millis(ms), key(obs, Some(INFO)), nodes);
        s
    }

    #[test]
    fn the_refresh_interval_grows_with_the_cluster_within_bounds() {
        let table = [
            (0, 1_000),
            (6, 1_000),
            (40, 1_000),
            (100, 2_500),
            (200, 5_000),
            (600, 15_000),
            (3_000, 15_000),
            (usize::MAX, 15_000),
        ];
        for (nodes, ms) in table {
            assert_eq!(refresh_after(nodes), ms, "{nodes} nodes");
        }
    }

    #[test]
    fn the_first_tick_reads_the_whole_map() {
        let need = MapSchedule::default().need(Millis(0), "k", &replica(), QUIET);
        assert!(need.whole && need.nodes);
    }

    #[test]
    fn a_replica_with_nothing_new_reads_no_map_until_the_refresh_is_due() {
        let obs = replica();
        let s = read_at(1_000, &obs, 100);
        let k = key(&obs, Some(INFO));
        assert_eq!(s.need(Millis(3_499), &k, &obs, QUIET), MapNeed::default());
        assert!(s.need(Millis(3_500), &k, &obs, QUIET).whole);
    }

    #[test]
    fn a_fencing_primary_reads_cluster_nodes_on_every_tick_but_not_the_shards() {
        let obs = primary();
        let s = read_at(0, &obs, 100);
        let k = key(&obs, Some(INFO));
        let need = s.need(Millis(250), &k, &obs, QUIET);
        assert_eq!(
            need,
            MapNeed {
                whole: false,
                nodes: true
            }
        );
        let unfenced = Reading {
            fencing: false,
            ..QUIET
        };
        assert_eq!(s.need(Millis(250), &k, &obs, unfenced), MapNeed::default());
    }

    #[test]
    fn the_coordinator_reads_the_whole_map_on_every_tick() {
        let obs = replica();
        let s = read_at(0, &obs, 100);
        let k = key(&obs, Some(INFO));
        let leading = Reading {
            leading: true,
            ..QUIET
        };
        assert!(s.need(Millis(10), &k, &obs, leading).whole);
    }

    #[test]
    fn a_change_of_the_nodes_own_state_or_of_cluster_info_reads_the_map_at_once() {
        let obs = replica();
        let s = read_at(0, &obs, 100);
        let epoch = INFO.replace("cluster_current_epoch:7", "cluster_current_epoch:8");
        let failed = INFO.replace("cluster_nodes_fail:0", "cluster_nodes_fail:1");
        let mut promoted = obs.clone();
        promoted.role = Role::Primary;
        promoted.link = None;
        let mut broken = obs.clone();
        if let Some(l) = broken.link.as_mut() {
            l.up = false;
        }
        let changed = [
            key(&obs, Some(&epoch)),
            key(&obs, Some(&failed)),
            key(&promoted, Some(INFO)),
            key(&broken, Some(INFO)),
            key(&obs, None),
        ];
        for k in changed {
            assert!(s.need(Millis(10), &k, &obs, QUIET).whole, "{k}");
        }
    }

    #[test]
    fn message_counters_and_offsets_are_no_news() {
        let obs = replica();
        let s = read_at(0, &obs, 100);
        let counters = INFO.replace("messages_sent:100", "messages_sent:9999");
        let mut further = obs.clone();
        if let Some(l) = further.link.as_mut() {
            l.offset = 1_000_000;
            l.last_io_seconds = Some(1);
        }
        further.repl_offset = 1_000_000;
        let k = key(&further, Some(&counters));
        assert!(!s.need(Millis(10), &k, &further, QUIET).whole);
    }

    fn t(s: &str) -> Reply {
        Reply::Text(s.into())
    }

    /// `CLUSTER SHARDS` of one shard, two nodes (flat key/value arrays, as RESP2 has it).
    fn shards_reply() -> Reply {
        let node = |id: &str, role: &str| Reply::Array(vec![t("id"), t(id), t("role"), t(role)]);
        Reply::Array(vec![Reply::Array(vec![
            t("slots"),
            Reply::Array(vec![Reply::Int(0), Reply::Int(16383)]),
            t("nodes"),
            Reply::Array(vec![node("a", "master"), node("b", "replica")]),
        ])])
    }

    const NODES: &str = "a 10.0.0.1:6379@16379 myself,master - 0 0 1 connected 0-16383\n";

    /// A map of one shard read once.
    fn known_map() -> KnownMap {
        let mut known = KnownMap::default();
        let mut view = ClusterView::default();
        known.fill(&mut view, Some(&shards_reply()), Some(&t(NODES)));
        known
    }

    #[test]
    fn a_map_read_once_is_carried_into_the_ticks_that_do_not_read_it() {
        let mut known = KnownMap::default();
        let mut read = ClusterView::default();
        let count = known.fill(&mut read, Some(&shards_reply()), Some(&t(NODES)));
        assert_eq!(count, Some(2));
        assert!(read.fresh_map);
        assert_eq!(read.shards.len(), 1);
        assert_eq!(read.peers.as_ref().map(Vec::len), Some(1));
        let mut carried = ClusterView::default();
        assert_eq!(known.fill(&mut carried, None, None), None);
        assert!(!carried.fresh_map, "a carried map is not fresh");
        assert_eq!(
            (&carried.shards, &carried.peers),
            (&read.shards, &read.peers)
        );
    }

    #[test]
    fn a_map_that_failed_to_read_is_not_carried() {
        let mut known = known_map();
        let mut loading = ClusterView::default();
        let error = Reply::Error("LOADING Valkey is loading the dataset in memory".into());
        assert_eq!(known.fill(&mut loading, Some(&error), Some(&error)), None);
        assert!(loading.shards.is_empty());
        assert_eq!(loading.peers, None);
        let mut later = ClusterView::default();
        known.fill(&mut later, None, None);
        assert!(
            later.shards.is_empty(),
            "the error, not the older map, is what is known"
        );
    }

    #[test]
    fn nodes_alone_refresh_the_peers_and_keep_the_shards() {
        let mut known = known_map();
        let failing = NODES.replace("myself,master", "myself,master,fail?");
        let mut view = ClusterView::default();
        assert_eq!(known.fill(&mut view, None, Some(&t(&failing))), None);
        assert_eq!(view.shards.len(), 1);
        let peers = view.peers.unwrap_or_default();
        assert!(peers[0].failing);
    }

    #[test]
    fn a_forgotten_read_is_read_again() {
        let obs = replica();
        let mut s = read_at(0, &obs, 100);
        s.forget();
        let k = key(&obs, Some(INFO));
        assert!(s.need(Millis(10), &k, &obs, QUIET).whole);
    }
}
