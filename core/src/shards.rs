//! `CLUSTER SHARDS` into shards and nodes.
//!
//! Each shard is a map with `slots` (flat start/end pairs) and `nodes` (maps with `id`, `ip`,
//! `endpoint`, `port` or `tls-port`, `role`, `replication-offset`, `health` and, from Valkey 9.1,
//! `availability-zone`). Unknown keys are ignored; a node without an id is dropped.

use crate::observation::Role;
use crate::reply::Reply;

/// One shard: a primary and its replicas, and the slot ranges they serve.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shard {
    /// The shard id (`CLUSTER MYSHARDID` of its members).
    pub id: String,
    pub slots: Vec<(u16, u16)>,
    pub nodes: Vec<ShardNode>,
}

/// One node of a shard as the local node sees it (through cluster gossip, so possibly stale).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardNode {
    pub id: String,
    pub ip: String,
    pub endpoint: String,
    pub port: u16,
    pub role: Role,
    pub replication_offset: u64,
    pub health: NodeHealth,
    pub availability_zone: Option<String>,
}

/// A node's health as `CLUSTER SHARDS` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeHealth {
    Online,
    Loading,
    Failed,
    #[default]
    Unknown,
}

impl Shard {
    /// The shard's primary, if the local node knows one. A primary that died and was failed over
    /// stays listed as a (failed) master beside the replica that took over: a live one first.
    pub fn primary(&self) -> Option<&ShardNode> {
        let primaries = || self.nodes.iter().filter(|n| n.role == Role::Primary);
        primaries()
            .find(|n| n.health != NodeHealth::Failed)
            .or_else(|| primaries().next())
    }

    /// Whether the node with `id` belongs to this shard.
    pub fn contains(&self, id: &str) -> bool {
        self.nodes.iter().any(|n| n.id == id)
    }
}

/// Parses a `CLUSTER SHARDS` reply; anything that is not a shard map is skipped.
pub fn parse_shards(reply: &Reply) -> Vec<Shard> {
    reply
        .as_array()
        .unwrap_or_default()
        .iter()
        .map(parse_shard)
        .collect()
}

fn parse_shard(reply: &Reply) -> Shard {
    let slots = reply.get("slots").map(parse_slots).unwrap_or_default();
    let nodes: Vec<ShardNode> = reply
        .get("nodes")
        .and_then(Reply::as_array)
        .unwrap_or_default()
        .iter()
        .filter_map(parse_node)
        .collect();
    let id = reply
        .get("id")
        .and_then(Reply::as_text)
        .filter(|id| !id.is_empty())
        .map_or_else(|| stand_in_id(&slots, &nodes), str::to_owned);
    Shard { id, slots, nodes }
}

/// A shard's name where `CLUSTER SHARDS` gives none (Valkey 8.0 has no `id` there; 8.1 added it):
/// its first slot, which a failover does not change, else its first node. Without it every shard
/// of an 8.0 view would share the empty name and look like one shard with several primaries — in
/// a cluster mid-upgrade from 8.0 too.
fn stand_in_id(slots: &[(u16, u16)], nodes: &[ShardNode]) -> String {
    match (slots.iter().map(|r| r.0).min(), nodes.first()) {
        (Some(first), _) => format!("slots-{first}"),
        (None, Some(node)) => format!("node-{}", node.id),
        (None, None) => String::new(),
    }
}

fn parse_slots(reply: &Reply) -> Vec<(u16, u16)> {
    let ints: Vec<Option<u16>> = reply
        .as_array()
        .unwrap_or_default()
        .iter()
        .map(|r| r.as_int().and_then(|n| u16::try_from(n).ok()))
        .collect();
    ints.chunks_exact(2)
        .filter_map(|p| Some((p[0]?, p[1]?)))
        .collect()
}

fn parse_node(reply: &Reply) -> Option<ShardNode> {
    let text = |k: &str| reply.get(k).and_then(Reply::as_text).map(str::to_owned);
    let int = |k: &str| reply.get(k).and_then(Reply::as_int);
    let port = int("port").or_else(|| int("tls-port")).unwrap_or(0);
    Some(ShardNode {
        id: text("id").filter(|id| !id.is_empty())?,
        ip: text("ip").unwrap_or_default(),
        endpoint: text("endpoint").unwrap_or_default(),
        port: u16::try_from(port).unwrap_or(0),
        role: text("role").map_or(Role::Unknown, |r| Role::from_wire(&r)),
        replication_offset: int("replication-offset").map_or(0, |n| n.max(0).unsigned_abs()),
        health: text("health").map_or(NodeHealth::Unknown, |h| health(&h)),
        availability_zone: text("availability-zone").filter(|z| !z.is_empty()),
    })
}

fn health(text: &str) -> NodeHealth {
    match text {
        "online" => NodeHealth::Online,
        "loading" => NodeHealth::Loading,
        "fail" | "failed" => NodeHealth::Failed,
        _ => NodeHealth::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Reply {
        Reply::Text(s.into())
    }

    fn node(id: &str, role: &str, offset: i64) -> Reply {
        Reply::Array(vec![
            t("id"),
            t(id),
            t("port"),
            Reply::Int(7000),
            t("ip"),
            t("127.0.0.1"),
            t("endpoint"),
            t("127.0.0.1"),
            t("role"),
            t(role),
            t("replication-offset"),
            Reply::Int(offset),
            t("health"),
            t("online"),
            t("availability-zone"),
            t("zone-a"),
        ])
    }

    #[test]
    fn the_live_primary_is_the_primary_when_a_failed_one_is_still_listed() {
        let n = |id: &str, health| ShardNode {
            id: id.into(),
            role: Role::Primary,
            health,
            ..ShardNode::default()
        };
        let shard = Shard {
            id: "s".into(),
            slots: vec![(0, 1)],
            nodes: vec![n("dead", NodeHealth::Failed), n("new", NodeHealth::Online)],
        };
        assert_eq!(shard.primary().map(|p| p.id.as_str()), Some("new"));
        let alone = Shard {
            nodes: vec![n("dead", NodeHealth::Failed)],
            ..shard
        };
        assert_eq!(alone.primary().map(|p| p.id.as_str()), Some("dead"));
    }

    #[test]
    fn a_shard_without_an_id_is_named_by_its_first_slot_else_its_first_node() {
        let shard = |slots: Vec<Reply>| {
            Reply::Array(vec![
                t("slots"),
                Reply::Array(slots),
                t("nodes"),
                Reply::Array(vec![node("n1", "master", 1)]),
            ])
        };
        let two = [
            Reply::Int(100),
            Reply::Int(200),
            Reply::Int(5),
            Reply::Int(9),
        ];
        let parsed = parse_shards(&Reply::Array(vec![shard(two.to_vec()), shard(vec![])]));
        assert_eq!(parsed[0].id, "slots-5");
        assert_eq!(parsed[1].id, "node-n1");
    }

    #[test]
    fn parses_a_shard() {
        let shard = Reply::Array(vec![
            t("slots"),
            Reply::Array(vec![Reply::Int(0), Reply::Int(5460)]),
            t("nodes"),
            Reply::Array(vec![node("a", "master", 10), node("b", "replica", 9)]),
        ]);
        let shards = parse_shards(&Reply::Array(vec![shard]));
        assert_eq!(shards.len(), 1);
        assert_eq!(shards[0].slots, vec![(0, 5460)]);
        let primary = shards[0].primary().map(|n| n.id.as_str());
        assert_eq!(primary, Some("a"));
        assert_eq!(shards[0].nodes[1].role, Role::Replica);
        assert_eq!(shards[0].nodes[1].replication_offset, 9);
        assert_eq!(
            shards[0].nodes[1].availability_zone.as_deref(),
            Some("zone-a")
        );
        assert!(shards[0].contains("b"));
    }

    #[test]
    fn garbage_yields_nothing() {
        assert!(parse_shards(&Reply::Int(3)).is_empty());
        let weird = Reply::Array(vec![Reply::Nil, t("nodes")]);
        assert_eq!(
            parse_shards(&Reply::Array(vec![weird])),
            vec![Shard::default()]
        );
    }
}
