//! One tick's Valkey replies into a typed [`Observation`].
//!
//! The adapter sends the same commands every tick (see [`Replies`]) and hands the raw replies
//! here. Parsing is total: any reply tree yields either an observation (fields it could not read
//! are left empty) or a [`Refusal`] naming what Valkey said instead; it never panics.

use crate::info::{Info, record};
use crate::quorum::{Peer, parse_nodes};
use crate::reply::Reply;
use crate::shards::{NodeHealth, Shard, parse_shards};

/// How Valkey is deployed beside this agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Valkey Cluster: shards and failover are Valkey's own; the agent observes and coordinates.
    Cluster,
    /// One primary and replicas without Cluster: the agent promotes.
    Replication,
}

/// A node's replication role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    Primary,
    Replica,
    /// Not yet known, or something the agent does not manage (e.g. a sentinel).
    #[default]
    Unknown,
}

impl Role {
    /// Reads the role names Valkey uses on the wire (`master`/`slave` and the newer spellings).
    pub fn from_wire(text: &str) -> Role {
        match text {
            "master" | "primary" => Role::Primary,
            "slave" | "replica" => Role::Replica,
            _ => Role::Unknown,
        }
    }

    /// The name used in labels, logs and status.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Replica => "replica",
            Role::Unknown => "unknown",
        }
    }
}

/// A replica's link to its primary.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrimaryLink {
    pub host: String,
    pub port: u16,
    pub up: bool,
    pub sync_in_progress: bool,
    /// Seconds since the last byte from the primary; `None` while there is no link.
    pub last_io_seconds: Option<u64>,
    /// The replica's own position in the replication stream.
    pub offset: u64,
    /// A link to a primary has been up in this Valkey run (a full sync completed):
    /// `master_link_down_since_seconds` is `-1` until then.
    pub ever_up: bool,
}

/// A replica as its primary reports it (`slaveN:` lines).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaEntry {
    pub ip: String,
    pub port: u16,
    pub state: String,
    pub offset: u64,
    pub lag_seconds: Option<u64>,
}

/// What the node knows of its Valkey Cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterView {
    /// `cluster_enabled:1` in INFO: the server really runs in cluster mode.
    pub enabled: bool,
    /// `cluster_state` from CLUSTER INFO; `None` when it could not be read (e.g. while loading).
    pub state_ok: Option<bool>,
    pub my_id: Option<String>,
    pub shard_id: Option<String>,
    pub shards: Vec<Shard>,
    /// `CLUSTER NODES`, for the quorum fence; `None` when it could not be read (e.g. an ACL
    /// without `cluster|nodes`): then the agent does not fence.
    pub peers: Option<Vec<Peer>>,
    /// `shards` were read on this very tick, not carried from an earlier one
    /// ([`crate::cluster_map`]): the coordinator acts only on a map read this fresh.
    pub fresh_map: bool,
}

/// Everything one tick learned about the local Valkey.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observation {
    pub role: Role,
    pub loading: bool,
    /// `master_repl_offset`: this node's position in its replication stream.
    pub repl_offset: u64,
    pub link: Option<PrimaryLink>,
    pub replicas: Vec<ReplicaEntry>,
    /// `master_failover_state` (standalone `FAILOVER` progress), e.g. `no-failover`.
    pub failover_state: Option<String>,
    pub version: Option<String>,
    /// Changes whenever the Valkey process restarts.
    pub run_id: Option<String>,
    pub availability_zone: Option<String>,
    pub cluster: Option<ClusterView>,
    /// Keys over all databases (`INFO keyspace`, `dbN:keys=…`): 0 for an empty dataset.
    pub keys: u64,
    /// Valkey's wall clock in ms (`server_time_usec`): the clock of `CLUSTER NODES`' ping times.
    pub server_time_ms: Option<u64>,
    /// Which replication stream its data is, and how far: what `PSYNC` compares.
    pub history: History,
}

/// A node's replication stream (`INFO replication`): `master_replid` and `master_repl_offset`,
/// and, once it was promoted, the stream it followed before (`master_replid2`) and up to where
/// the two are one (`second_repl_offset`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct History {
    pub replid: String,
    pub offset: u64,
    /// `None`: never promoted in this run (Valkey prints forty zeros).
    pub replid2: Option<String>,
    /// Valkey's `second_repl_offset`: the first offset not shared with `replid2` (the promotion
    /// offset + 1); `None` when it prints -1.
    pub second_offset: Option<u64>,
    /// Keys over all databases: the one measure of its data left when streams cannot be compared
    /// (every Valkey restarted from an AOF starts a new stream at offset 0).
    pub keys: u64,
}

impl History {
    /// Whether a node with history `other`, following this one, keeps every byte it holds:
    /// Valkey's own rule for a partial resync — the same stream at most as far as ours, or the
    /// stream we were promoted from, no further than where we left it.
    pub fn continues(&self, other: &History) -> bool {
        let same = !self.replid.is_empty() && other.replid == self.replid;
        let before = self.replid2.as_deref() == Some(other.replid.as_str());
        let shared = |end: &u64| other.offset < *end;
        (same && other.offset <= self.offset)
            || (before && self.second_offset.as_ref().is_some_and(shared))
    }
}

/// The raw replies of one tick, in the order the adapter sends the commands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Replies {
    pub role: Option<Reply>,
    /// `INFO replication persistence server cluster`.
    pub info: Option<Reply>,
    /// Cluster mode only: `CLUSTER INFO`, `CLUSTER MYID`, `CLUSTER MYSHARDID`, `CLUSTER SHARDS`,
    /// `CLUSTER NODES`.
    pub cluster_info: Option<Reply>,
    pub my_id: Option<Reply>,
    pub shard_id: Option<Reply>,
    pub shards: Option<Reply>,
    pub nodes: Option<Reply>,
}

/// Valkey answered, but not with data the agent can use (e.g. `NOAUTH`, `NOPERM`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

/// Assembles an observation from one tick's replies.
pub fn observe(replies: &Replies, mode: Mode) -> Result<Observation, Refusal> {
    let info = info_of(replies.info.as_ref())?;
    let role = role_of(replies.role.as_ref(), &info);
    Ok(Observation {
        role,
        loading: info.flag("loading").unwrap_or(false),
        repl_offset: info.u64("master_repl_offset").unwrap_or(0),
        link: (role == Role::Replica).then(|| link_of(&info)),
        replicas: replicas_of(&info),
        failover_state: info.get("master_failover_state").map(str::to_owned),
        version: info
            .get("valkey_version")
            .or(info.get("redis_version"))
            .map(str::to_owned),
        run_id: info.get("run_id").map(str::to_owned),
        availability_zone: info
            .get("availability_zone")
            .filter(|z| !z.is_empty())
            .map(str::to_owned),
        cluster: (mode == Mode::Cluster).then(|| cluster_of(replies, &info)),
        keys: keys_of(&info),
        server_time_ms: info.u64("server_time_usec").map(|us| us / 1000),
        history: history_of(&info),
    })
}

fn history_of(info: &Info) -> History {
    let never = |id: &&str| id.bytes().all(|b| b == b'0');
    History {
        replid: info.get("master_replid").unwrap_or_default().to_owned(),
        offset: info.u64("master_repl_offset").unwrap_or(0),
        replid2: info
            .get("master_replid2")
            .filter(|id| !never(id))
            .map(str::to_owned),
        second_offset: info
            .i64("second_repl_offset")
            .and_then(|o| u64::try_from(o).ok()),
        keys: keys_of(info),
    }
}

fn keys_of(info: &Info) -> u64 {
    info.with_prefix("db")
        .filter(|(k, _)| {
            k.strip_prefix("db")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|(_, v)| record(v).get("keys")?.parse::<u64>().ok())
        // A hostile or broken reply cannot wrap the count around to "empty".
        .fold(0, u64::saturating_add)
}

fn info_of(reply: Option<&Reply>) -> Result<Info, Refusal> {
    match reply {
        Some(Reply::Text(text)) => Ok(Info::parse(text)),
        Some(Reply::Error(e)) => Err(Refusal(e.clone())),
        Some(other) => Err(Refusal(format!("unexpected INFO reply: {}", kind(other)))),
        None => Err(Refusal("no INFO reply".into())),
    }
}

fn kind(reply: &Reply) -> &'static str {
    match reply {
        Reply::Nil => "nil",
        Reply::Int(_) => "integer",
        Reply::Text(_) => "string",
        Reply::Error(_) => "error",
        Reply::Array(_) => "array",
        Reply::Map(_) => "map",
    }
}

/// ROLE is authoritative; INFO's `role` is the fallback when ROLE is denied by ACL.
fn role_of(role: Option<&Reply>, info: &Info) -> Role {
    let from_role = role.and_then(role_reply);
    from_role.unwrap_or_else(|| info.get("role").map_or(Role::Unknown, Role::from_wire))
}

/// The one reading of a `ROLE` reply (its first element); `None` when it is not one (an error,
/// e.g. denied by ACL).
pub fn role_reply(reply: &Reply) -> Option<Role> {
    let first = reply.as_array()?.first()?;
    first.as_text().map(Role::from_wire)
}

fn link_of(info: &Info) -> PrimaryLink {
    let up = info.get("master_link_status") == Some("up");
    PrimaryLink {
        host: info.get("master_host").unwrap_or_default().to_owned(),
        port: info
            .get("master_port")
            .and_then(|p| p.parse().ok())
            .unwrap_or(0),
        up,
        sync_in_progress: info.flag("master_sync_in_progress").unwrap_or(false),
        last_io_seconds: info
            .i64("master_last_io_seconds_ago")
            .and_then(|s| u64::try_from(s).ok()),
        offset: info
            .u64("slave_repl_offset")
            .or(info.u64("master_repl_offset"))
            .unwrap_or(0),
        ever_up: up
            || info
                .i64("master_link_down_since_seconds")
                .is_some_and(|s| s >= 0),
    }
}

fn replicas_of(info: &Info) -> Vec<ReplicaEntry> {
    info.with_prefix("slave")
        .filter(|(k, _)| is_replica_key(k))
        .map(|(_, v)| replica_entry(v))
        .collect()
}

/// `slave0`, `slave1`, … but not `slave_repl_offset` and friends.
fn is_replica_key(key: &str) -> bool {
    let digits = key.trim_start_matches("slave");
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn replica_entry(value: &str) -> ReplicaEntry {
    let r = record(value);
    let num = |k: &str| r.get(k).and_then(|v| v.parse::<u64>().ok());
    ReplicaEntry {
        ip: r.get("ip").copied().unwrap_or_default().to_owned(),
        port: r.get("port").and_then(|p| p.parse().ok()).unwrap_or(0),
        state: r.get("state").copied().unwrap_or_default().to_owned(),
        offset: num("offset").unwrap_or(0),
        lag_seconds: num("lag"),
    }
}

fn cluster_of(replies: &Replies, info: &Info) -> ClusterView {
    let text = |r: &Option<Reply>| r.as_ref().and_then(Reply::as_text).map(str::to_owned);
    let state = text(&replies.cluster_info).map(|t| Info::parse(&t));
    ClusterView {
        enabled: info.flag("cluster_enabled").unwrap_or(false),
        state_ok: state.and_then(|s| s.get("cluster_state").map(|v| v == "ok")),
        my_id: text(&replies.my_id).filter(|s| !s.is_empty()),
        shard_id: text(&replies.shard_id).filter(|s| !s.is_empty()),
        shards: replies
            .shards
            .as_ref()
            .map(parse_shards)
            .unwrap_or_default(),
        peers: text(&replies.nodes).map(|t| parse_nodes(&t)),
        fresh_map: replies.shards.is_some(),
    }
}

impl Observation {
    /// The shard this node belongs to, as the node itself sees the cluster.
    pub fn my_shard(&self) -> Option<&Shard> {
        let cluster = self.cluster.as_ref()?;
        let me = cluster.my_id.as_deref()?;
        cluster.shards.iter().find(|s| s.contains(me))
    }

    /// Cluster mode: whether this node's shard owns slots; `None` outside cluster mode or where the
    /// shard map was not read. A master of a shard without slots — a pod re-created empty, before
    /// the coordinator joins it to its shard — serves no key: it is no shard's primary.
    pub fn owns_slots(&self) -> Option<bool> {
        let cluster = self.cluster.as_ref().filter(|c| c.enabled)?;
        if cluster.shards.is_empty() {
            return None;
        }
        Some(self.my_shard().is_some_and(|s| !s.slots.is_empty()))
    }

    /// Whether this node has any replica that could take over from it: in cluster mode another
    /// node of its shard not marked failed; otherwise a replica its `INFO` lists.
    pub fn has_replica(&self) -> bool {
        match self.my_shard() {
            Some(shard) => shard
                .nodes
                .iter()
                .any(|n| n.role == Role::Replica && n.health != NodeHealth::Failed),
            None => !self.replicas.is_empty(),
        }
    }

    /// A replica whose link to its primary broke after it had been up in this run: the primary
    /// went away, and the replica may be promoted any moment.
    pub fn primary_lost(&self) -> bool {
        self.role == Role::Replica && self.link.as_ref().is_some_and(|l| !l.up && l.ever_up)
    }

    /// Nothing anyone wrote is on it: no keys, offset 0, and (a replica) never completed a sync.
    /// Offset 0 alone is not enough: a replica fresh from a completed sync of an empty primary
    /// stays at offset 0 until its primary streams to it, yet it holds all there was.
    pub fn fresh(&self) -> bool {
        let (offset, ever_up) = self
            .link
            .as_ref()
            .map_or((self.repl_offset, false), |l| (l.offset, l.ever_up));
        self.keys == 0 && offset == 0 && !ever_up
    }

    /// Holds nothing it got from the shard: [`Observation::fresh`], or a replica at offset 0 whose
    /// link never came up in this run — whatever keys it has are its own (e.g. written to it as
    /// an empty master after a restart), not the shard's. Never a failover candidate.
    pub fn unsynced(&self) -> bool {
        let never = |l: &PrimaryLink| l.offset == 0 && !l.ever_up;
        self.fresh() || (self.role == Role::Replica && self.link.as_ref().is_some_and(never))
    }

    /// A master holding something (keys, or a replication stream that moved): bootstrapping a
    /// shard beside it would throw that away.
    pub fn master_with_data(&self) -> bool {
        self.role == Role::Primary && !self.fresh()
    }

    /// How many bytes this replica is behind its primary, when the primary's offset is known.
    ///
    /// In cluster mode the primary's offset comes from gossip (`CLUSTER SHARDS`) and may be a
    /// little old, which can only make the lag look smaller by that much, never negative.
    pub fn lag_bytes(&self, primary_offset: Option<u64>) -> Option<u64> {
        let link = self.link.as_ref()?;
        let from_shard = || self.my_shard()?.primary().map(|p| p.replication_offset);
        let primary = primary_offset.or_else(from_shard)?;
        Some(primary.saturating_sub(link.offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(text: &str) -> Replies {
        Replies {
            info: Some(Reply::Text(text.into())),
            ..Replies::default()
        }
    }

    #[test]
    fn a_replica_has_lost_its_primary_only_when_a_link_that_was_up_went_down() {
        let replica = |link: &str| {
            let text = format!(
                "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:6379\r\n{link}"
            );
            observe(&info(&text), Mode::Replication)
                .unwrap()
                .primary_lost()
        };
        assert!(replica(
            "master_link_status:down\r\nmaster_link_down_since_seconds:0\r\n"
        ));
        assert!(!replica(
            "master_link_status:up\r\nmaster_link_down_since_seconds:-1\r\n"
        ));
        // Never synced in this run (a replica's first full sync): nothing was lost.
        assert!(!replica(
            "master_link_status:down\r\nmaster_link_down_since_seconds:-1\r\n"
        ));
    }

    #[test]
    fn keys_are_summed_over_databases_and_an_empty_keyspace_is_zero() {
        let both = "# Replication\r\nrole:master\r\n# Keyspace\r\ndb0:keys=3,expires=0,avg_ttl=0\r\ndb12:keys=4,expires=1,avg_ttl=0\r\n";
        let obs = observe(&info(both), Mode::Replication).unwrap();
        assert_eq!(obs.keys, 7);
        let empty = "# Replication\r\nrole:master\r\n# Keyspace\r\n";
        assert_eq!(observe(&info(empty), Mode::Replication).unwrap().keys, 0);
        // Not a database line, though it starts with "db".
        let odd = "# Replication\r\nrole:master\r\ndbfoo:keys=9\r\n";
        assert_eq!(observe(&info(odd), Mode::Replication).unwrap().keys, 0);
    }

    #[test]
    fn a_replica_that_never_completed_a_sync_is_fresh_one_that_did_is_not() {
        let replica = |down_since: i64| {
            format!(
                "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:6379\r\nmaster_link_status:down\r\nmaster_link_down_since_seconds:{down_since}\r\nslave_repl_offset:0\r\n"
            )
        };
        assert!(
            observe(&info(&replica(-1)), Mode::Replication)
                .unwrap()
                .fresh()
        );
        // Synced an empty primary, which died before streaming anything: it holds all there was.
        assert!(
            !observe(&info(&replica(3)), Mode::Replication)
                .unwrap()
                .fresh()
        );
        let empty_master = "# Replication\r\nrole:master\r\nmaster_repl_offset:0\r\n";
        assert!(
            observe(&info(empty_master), Mode::Replication)
                .unwrap()
                .fresh()
        );
    }

    #[test]
    fn a_master_has_data_once_it_holds_keys_or_its_stream_moved() {
        let master = |offset: u64, keys: &str| {
            let text = format!(
                "# Replication\r\nrole:master\r\nmaster_repl_offset:{offset}\r\n# Keyspace\r\n{keys}"
            );
            observe(&info(&text), Mode::Replication)
                .unwrap()
                .master_with_data()
        };
        assert!(!master(0, ""));
        assert!(master(0, "db0:keys=1,expires=0,avg_ttl=0\r\n"));
        assert!(
            master(42, ""),
            "written, then flushed: its replicas still follow that stream"
        );
        let replica =
            "# Replication\r\nrole:slave\r\nslave_repl_offset:9\r\n# Keyspace\r\ndb0:keys=3\r\n";
        let replica = observe(&info(replica), Mode::Replication).unwrap();
        assert!(!replica.master_with_data());
    }
}
