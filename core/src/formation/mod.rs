//! Cluster mode: forming a fresh Valkey Cluster from the deployment's pods, and bringing a pod that
//! came back empty (a replaced pod without persistence) back into it — as pure decisions.
//!
//! The pods say where they belong: `valkey.io/shard-index` (which shard) and
//! `valkey.io/node-index` (0 = the shard's intended primary; the StatefulSet's pod index where the
//! label is missing). The coordinator observes every pod's Valkey and asks [`decide`] what to do:
//!
//! - **A fresh cluster** — no node owns a slot and every node knows only itself: once every shard
//!   `0..shards` has its node-index 0 pod answering, give each node a distinct config epoch, each
//!   such pod an even share of the 16384 slots, and introduce every other node to the first
//!   primary (`CLUSTER MEET`).
//! - **An existing cluster** — some node owns slots: introduce any node that knows only itself; make
//!   every slot-less master that the cluster knows a replica of its shard's primary (the node of
//!   the same shard index that owns slots), once it knows that primary; forget, on every node,
//!   a node marked failed that no pod is any more (the previous identity of a replaced pod) unless
//!   it is a primary still serving its shard's slots (`forgettable`); and
//!   introduce again every node that some node (itself included) lists at an address that is not
//!   its pod's any more ([`readdress`]): after a full restart every pod has a new IP and every
//!   `nodes.conf` names the old ones, so no node could reach another by itself. A `CLUSTER MEET`
//!   to a known node's new address makes Valkey update the address ("we already know node …,
//!   updating the address"), and the node met learns its own new address from it.
//!
//! # Why it is safe
//! - Slots are only ever assigned when *no* node anywhere owns a slot: an existing cluster is never
//!   resharded, a node with slots is never touched, and a partial deployment (a shard's primary
//!   missing) waits instead of spreading the slots over too few shards.
//! - `CLUSTER REPLICATE` only goes to a master that owns no slots (Valkey itself refuses it unless
//!   the node is empty), so no data is replaced.
//! - Everything waits while any pod of the deployment does not answer: a decision from a partial
//!   view could assign slots twice.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use crate::observation::{Observation, Role};
use crate::shards::{NodeHealth, Shard, ShardNode};
use crate::time::Millis;

mod glance;

pub use glance::{AUDIT, Glance, LocalMap, QUESTIONS, audited};

/// Valkey Cluster's slot count.
pub const SLOTS: u32 = 16_384;

/// One pod of the deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seat {
    pub pod: String,
    /// `valkey.io/shard-index`.
    pub shard: Option<u32>,
    /// `valkey.io/node-index` (else the StatefulSet pod index).
    pub index: Option<u32>,
    /// Where its Valkey listens (pod IP, client port).
    pub addr: Option<(String, u16)>,
    /// `None`: it did not answer this round (or is loading, or not in cluster mode).
    pub node: Option<ClusterNode>,
}

/// A pod's Valkey as its own `CLUSTER` replies show it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterNode {
    pub id: String,
    pub role: Role,
    /// It owns at least one slot.
    pub owns_slots: bool,
    /// A replica's primary (node id).
    pub primary: Option<String>,
    /// Every node id it knows, itself included (from `CLUSTER SHARDS`); shared between nodes
    /// that know the same ([`Pool`]).
    pub knows: Arc<BTreeSet<String>>,
    /// The node ids it marks failed.
    pub failed: BTreeSet<String>,
    /// Node id → the IP it lists that node at (itself included); empty when not read. Shared
    /// like `knows`.
    pub addrs: Arc<Listing>,
}

/// Node id → IP, as one node lists the cluster, with a digest of the whole kept up to date: a
/// node whose listing equals the pods' current addresses (the digests agree) is not searched
/// entry by entry, so a formed cluster costs a round O(nodes), not O(nodes²).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Listing {
    map: BTreeMap<String, String>,
    digest: u64,
}

impl Listing {
    pub fn get(&self, id: &str) -> Option<&str> {
        self.map.get(id).map(String::as_str)
    }

    /// Adds or replaces one entry, updating the digest by that entry alone.
    pub fn insert(&mut self, id: String, ip: String) {
        let added = entry_hash(&id, &ip);
        if let Some(old) = self.map.insert(id.clone(), ip) {
            self.digest = self.digest.wrapping_sub(entry_hash(&id, &old));
        }
        self.digest = self.digest.wrapping_add(added);
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Whether it lists exactly the entries whose [`digest`] is `digest` and whose count is
    /// `len`.
    fn same_as(&self, (digest, len): (u64, usize)) -> bool {
        self.digest == digest && self.map.len() == len
    }
}

impl FromIterator<(String, String)> for Listing {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(entries: I) -> Listing {
        Listing::from(entries.into_iter().collect::<BTreeMap<_, _>>())
    }
}

impl From<BTreeMap<String, String>> for Listing {
    fn from(map: BTreeMap<String, String>) -> Listing {
        let digest = digest(map.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        Listing { map, digest }
    }
}

/// The listings of a formation round's nodes, each distinct one kept once. In a formed cluster
/// every node knows the same nodes at the same addresses, so a copy per node would be n² strings
/// (1,000 pods: a million ids and addresses, an estimated ~150 MB, every formation round); shared, a round
/// holds O(nodes).
#[derive(Debug, Default)]
pub struct Pool {
    knows: Vec<Arc<BTreeSet<String>>>,
    addrs: Vec<Arc<Listing>>,
}

/// Distinct listings kept for sharing; past it (a cluster in the middle of changing) a node
/// keeps its own, and the search for an equal one stays short.
const POOL_MAX: usize = 16;

impl Pool {
    /// Points the node's listings at equal ones seen before, or remembers them.
    pub fn share(&mut self, node: &mut ClusterNode) {
        node.knows = intern(&mut self.knows, &node.knows, |a, b| {
            a.len() == b.len() && a == b
        });
        node.addrs = intern(&mut self.addrs, &node.addrs, |a, b| {
            a.digest == b.digest && a == b
        });
    }
}

/// The pooled equal of `item` (`same`: cheap checks first), else `item`, pooled while there is room.
/// The same allocation is equal without a look inside: every node a round vouches for shares the
/// local map's listings, and comparing each entry by entry would cost the round pods × nodes.
fn intern<T>(pool: &mut Vec<Arc<T>>, item: &Arc<T>, same: impl Fn(&T, &T) -> bool) -> Arc<T> {
    let equal = |p: &&Arc<T>| Arc::ptr_eq(p, item) || same(p, item);
    if let Some(found) = pool.iter().find(equal) {
        return Arc::clone(found);
    }
    if pool.len() < POOL_MAX {
        pool.push(Arc::clone(item));
    }
    Arc::clone(item)
}

/// A digest of entries in any order: the sum of each entry's hash (`DefaultHasher`'s fixed keys:
/// equal listings, equal digests), so one entry changes it by its own hash alone and the pods'
/// addresses digest without being sorted.
fn digest<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> u64 {
    entries.fold(0, |sum, (id, ip)| sum.wrapping_add(entry_hash(id, ip)))
}

fn entry_hash(id: &str, ip: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (id, ip).hash(&mut h);
    h.finish()
}

/// The failed nodes a node lists, but for a failed primary still serving its shard's slots: its
/// replica is about to be elected in its place (Valkey's own election, or the agent's after a
/// crash), and a replica whose primary was forgotten can never be — the slots would be served by
/// nobody for good. Once a replica took over, the old node serves nothing and is forgotten.
fn forgettable(shards: &[Shard]) -> impl Iterator<Item = String> + '_ {
    shards.iter().flat_map(|s| {
        let serving = |n: &&ShardNode| n.role == Role::Primary && !s.slots.is_empty();
        s.nodes
            .iter()
            .filter(|n| n.health == NodeHealth::Failed)
            .filter(move |n| !serving(n))
            .map(|n| n.id.clone())
    })
}

impl ClusterNode {
    /// What formation needs of a node's own observation; `None` for a node that is loading or
    /// not in cluster mode.
    pub fn observed(obs: &Observation) -> Option<ClusterNode> {
        let view = obs.cluster.as_ref().filter(|c| c.enabled && !obs.loading)?;
        let id = view.my_id.clone()?;
        let mine = view
            .shards
            .iter()
            .find(|s| s.nodes.iter().any(|n| n.id == id));
        let primary = mine
            .and_then(|s| {
                s.nodes
                    .iter()
                    .find(|n| n.role == Role::Primary && n.id != id)
            })
            .map(|n| n.id.clone());
        let owns_slots = obs.role == Role::Primary && mine.is_some_and(|s| !s.slots.is_empty());
        let listed = || view.shards.iter().flat_map(|s| &s.nodes);
        let knows = listed().map(|n| n.id.clone());
        Some(ClusterNode {
            knows: Arc::new(knows.chain([id.clone()]).collect()),
            failed: forgettable(&view.shards).collect(),
            addrs: Arc::new(listed().map(|n| (n.id.clone(), n.ip.clone())).collect()),
            id,
            role: obs.role,
            owns_slots,
            primary: primary.filter(|_| obs.role == Role::Replica),
        })
    }

    fn alone(&self) -> bool {
        self.knows.iter().all(|k| *k == self.id)
    }
}

/// What the coordinator knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormationView {
    /// How many shards the deployment has (`SIDECAR_CLUSTER_SHARDS`): shard indexes `0..shards`.
    pub shards: u32,
    pub seats: Vec<Seat>,
}

/// One command, with the reason it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `CLUSTER SET-CONFIG-EPOCH <epoch>` on `pod` (fresh nodes only: distinct epochs spare the
    /// cluster its epoch-collision resolution).
    SetEpoch { pod: String, epoch: u32 },
    /// `CLUSTER ADDSLOTSRANGE <from> <to>` on `pod`.
    AssignSlots { pod: String, from: u32, to: u32 },
    /// `CLUSTER MEET <ip> <port>` sent to `pod`, introducing `ip:port`.
    Meet { pod: String, ip: String, port: u16 },
    /// `CLUSTER REPLICATE <primary>` on `pod`.
    Replicate { pod: String, primary: String },
    /// `CLUSTER FORGET <id>` on `pod`: a failed node that is no pod any more.
    Forget { pod: String, id: String },
    /// `CLUSTER RESET HARD` on `pod`: an empty master that remembers a cluster no pod serves any
    /// more ([`decide`]). Valkey refuses it on a master that holds keys.
    Reset { pod: String },
}

impl Step {
    /// Whether the step may be left for the next round when a round runs out of time: a missing
    /// introduction or forget is planned again from the next round's view, while epochs, slots
    /// and attachments are sent in full (a fresh cluster half given its slots would be grown, not
    /// formed).
    pub fn deferrable(&self) -> bool {
        matches!(self, Step::Meet { .. } | Step::Forget { .. })
    }

    /// The step's kind, for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::SetEpoch { .. } => "set_config_epoch",
            Step::AssignSlots { .. } => "addslots",
            Step::Meet { .. } => "meet",
            Step::Replicate { .. } => "replicate",
            Step::Forget { .. } => "forget",
            Step::Reset { .. } => "reset",
        }
    }

    /// Why the step is sent, for logs and Events.
    pub fn reason(&self) -> String {
        match self {
            Step::SetEpoch { pod, epoch } => format!(
                "{pod} is a fresh node: a config epoch of its own ({epoch}) spares the cluster its epoch-collision resolution"
            ),
            Step::AssignSlots { pod, from, to } => {
                format!(
                    "{pod} is its shard's first pod in a fresh cluster: it serves slots {from}-{to}"
                )
            }
            Step::Meet { pod, ip, port } => {
                format!("{pod} does not know {ip}:{port}, the address of a pod of this cluster")
            }
            Step::Replicate { pod, primary } => {
                format!("{pod} serves no slots and does not follow its shard's primary {primary}")
            }
            Step::Forget { pod, id } => {
                format!("{pod} still lists {id}, a failed node that is no pod any more")
            }
            Step::Reset { pod } => format!(
                "{pod} is an empty master that remembers a cluster whose slots no pod serves any more: reset, so that a fresh cluster can form"
            ),
        }
    }
}

/// A round's steps in order, in batches of one kind: the steps of a batch go to different pods
/// or are independent (forgets of one id everywhere), so a batch may be sent at once, while
/// batches keep their order (a fresh node's epoch before anyone meets it).
pub fn batches(steps: &[Step]) -> impl Iterator<Item = &[Step]> {
    steps.chunk_by(|a, b| a.kind() == b.kind())
}

/// Between two formation rounds: a `CLUSTER MEET` needs a gossip round or two to spread.
pub const PERIOD_MS: u64 = 1_000;

/// A formation round runs at least this often while coordinating, whatever the coordinator's own view says.
pub const RECHECK_MS: u64 = 30_000;

/// Whether the local node's view of the cluster leaves formation something to do: a pod (by its
/// IP) it does not know among the nodes not marked failed, a master that owns no slots (not yet a
/// replica), or a node marked failed (perhaps a replaced pod's old identity, to forget).
pub fn incomplete<'a>(local: &[Shard], pod_ips: impl IntoIterator<Item = &'a str>) -> bool {
    let nodes = || {
        local
            .iter()
            .flat_map(|s| s.nodes.iter().map(move |n| (s, n)))
    };
    let failed = nodes().any(|(_, n)| n.health == NodeHealth::Failed);
    let slotless = nodes().any(|(s, n)| n.role == Role::Primary && s.slots.is_empty());
    let known: BTreeSet<&str> = nodes()
        .filter(|(_, n)| n.health != NodeHealth::Failed)
        .map(|(_, n)| n.ip.as_str())
        .collect();
    let missing = pod_ips.into_iter().any(|ip| !known.contains(ip));
    failed || slotless || missing
}

/// Whether the coordinator runs a formation round now: at most every [`PERIOD_MS`] since the last
/// (`last`), and then if the local view is [`incomplete`], the last round sent steps or met a
/// silent pod (`again`), or [`RECHECK_MS`] have passed — what only another node's own view shows
/// (a node naming itself by an old address) leaves the coordinator's view whole.
pub fn round_due(last: Option<Millis>, incomplete: bool, again: bool, now: Millis) -> bool {
    let since = |ms: u64| last.is_none_or(|at| now.since(at) >= ms);
    since(PERIOD_MS) && (incomplete || again || since(RECHECK_MS))
}

/// What to do now, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Formation {
    pub steps: Vec<Step>,
    pub reason: String,
    /// Some pod did not answer this round: what it lists (its own address, say) is unseen.
    pub silent: bool,
}

impl Formation {
    fn wait(reason: impl Into<String>) -> Formation {
        Formation {
            steps: Vec::new(),
            reason: reason.into(),
            silent: false,
        }
    }
}

/// Decides the formation steps for this round (none: formed, or waiting — the reason says which).
pub fn decide(view: &FormationView) -> Formation {
    let nodes: Vec<(&Seat, &ClusterNode)> = view
        .seats
        .iter()
        .filter_map(|s| Some((s, s.node.as_ref()?)))
        .collect();
    if let Some(why) = not_ready(view) {
        let silent = view
            .seats
            .iter()
            .any(|s| s.node.is_none() || s.addr.is_none());
        if silent && view.shards > 0 && nodes.iter().any(|(_, n)| n.owns_slots) {
            return attach_only(&nodes, why);
        }
        return Formation {
            silent,
            ..Formation::wait(why)
        };
    }
    if nodes.iter().any(|(_, n)| n.owns_slots) {
        return grow(&nodes);
    }
    if nodes.iter().all(|(_, n)| n.alone()) {
        return fresh(view, &nodes);
    }
    if nodes.iter().all(|(_, n)| n.role == Role::Primary) {
        return reset_stale(&nodes);
    }
    Formation::wait(
        "no node owns slots, and a replica may hold the only copy of its shard's data: not resetting",
    )
}

/// Every pod answered, none serves a slot, and none is a replica: whatever cluster some of them
/// remember (met into it by a coordinator before its last slot owners went away: every pod
/// deleted at once, with preStop waits too short for a hand-over) is gone for good, and its data
/// with it. Each such node is reset, so that the next round forms a fresh cluster, which says
/// that the data is gone (`ClusterDataLost`). Nothing that holds data is touched: Valkey refuses
/// the reset on a master with keys, and a replica (it may hold the only copy of a shard that
/// lost its primary) keeps this round waiting.
fn reset_stale(nodes: &[(&Seat, &ClusterNode)]) -> Formation {
    let steps: Vec<Step> = nodes
        .iter()
        .filter(|(_, n)| !n.alone())
        .map(|(s, _)| Step::Reset { pod: s.pod.clone() })
        .collect();
    Formation {
        reason: format!(
            "no node owns slots: resetting {} empty master(s) that remember a cluster no pod serves",
            steps.len()
        ),
        steps,
        silent: false,
    }
}

/// Why nothing can be decided yet, if so.
fn not_ready(view: &FormationView) -> Option<String> {
    if view.shards == 0 {
        return Some("no shard count configured".into());
    }
    let silent: Vec<&str> = view
        .seats
        .iter()
        .filter(|s| s.node.is_none() || s.addr.is_none())
        .map(|s| s.pod.as_str())
        .collect();
    if !silent.is_empty() {
        return Some(format!("waiting for {} to answer", silent.join(", ")));
    }
    let unplaced: Vec<&str> = view
        .seats
        .iter()
        .filter(|s| s.shard.is_none() || s.index.is_none())
        .map(|s| s.pod.as_str())
        .collect();
    (!unplaced.is_empty()).then(|| {
        format!(
            "{} carry no shard-index or node-index label",
            unplaced.join(", ")
        )
    })
}

/// The intended primary (node-index 0) of each shard `0..shards`, or the first shard without one.
fn primaries<'a>(
    view: &FormationView,
    nodes: &[(&'a Seat, &'a ClusterNode)],
) -> Result<Vec<&'a Seat>, u32> {
    let mut first: BTreeMap<u32, &Seat> = BTreeMap::new();
    let intended = nodes.iter().filter(|(s, _)| s.index == Some(0));
    for (seat, _) in intended {
        if let Some(shard) = seat.shard {
            first.entry(shard).or_insert(seat);
        }
    }
    (0..view.shards)
        .map(|shard| first.get(&shard).copied().ok_or(shard))
        .collect()
}

/// A fresh cluster: epochs, slots on the intended primaries, everyone introduced to the first.
fn fresh(view: &FormationView, nodes: &[(&Seat, &ClusterNode)]) -> Formation {
    let primaries = match primaries(view, nodes) {
        Ok(p) => p,
        Err(shard) => {
            return Formation::wait(format!(
                "shard {shard} has no node-index 0 pod yet: not forming a partial cluster"
            ));
        }
    };
    let mut steps: Vec<Step> = nodes
        .iter()
        .zip(1..)
        .map(|((s, _), epoch)| Step::SetEpoch {
            pod: s.pod.clone(),
            epoch,
        })
        .collect();
    steps.extend(slot_steps(&primaries));
    let first = primaries[0];
    let others = nodes.iter().filter(|(s, _)| s.pod != first.pod);
    steps.extend(others.filter_map(|(s, _)| meet(first, s)));
    Formation {
        steps,
        reason: format!(
            "forming a fresh cluster of {} shards over {} nodes",
            primaries.len(),
            nodes.len()
        ),
        silent: false,
    }
}

/// Even, contiguous slot ranges over the primaries, in shard order.
fn slot_steps(primaries: &[&Seat]) -> Vec<Step> {
    let n = u32::try_from(primaries.len()).unwrap_or(u32::MAX).max(1);
    primaries
        .iter()
        .zip(0..)
        .map(|(p, i)| Step::AssignSlots {
            pod: p.pod.clone(),
            from: i * SLOTS / n,
            to: (i + 1) * SLOTS / n - 1,
        })
        .collect()
}

fn meet(via: &Seat, whom: &Seat) -> Option<Step> {
    let (ip, port) = whom.addr.clone()?;
    Some(Step::Meet {
        pod: via.pod.clone(),
        ip,
        port,
    })
}

/// An existing cluster with some pods silent (an overloaded node, a pod starting): the answering
/// ones are still introduced and attached — a re-created pod must not wait, unready, for every
/// other pod to answer at once, which at 100 pods under load can take minutes. Forgetting and
/// re-addressing wait for the whole view: a silent pod may still list a node to forget.
fn attach_only(nodes: &[(&Seat, &ClusterNode)], why: String) -> Formation {
    let Some((via, _)) = nodes.iter().find(|(_, n)| n.owns_slots) else {
        return Formation::wait(why);
    };
    let (steps, _) = introduce_and_attach(via, nodes);
    Formation {
        reason: format!("{why}; meanwhile {} step(s) for the others", steps.len()),
        steps,
        silent: true,
    }
}

/// Lone nodes met by `via`, slot-less masters that know their shard's primary made its replicas;
/// and why the others wait.
fn introduce_and_attach(via: &Seat, nodes: &[(&Seat, &ClusterNode)]) -> (Vec<Step>, Vec<String>) {
    let owners = owners_by_shard(nodes);
    let (mut steps, mut meets, mut waiting) = (Vec::new(), Vec::new(), Vec::new());
    for (seat, node) in nodes.iter().filter(|(_, n)| !n.owns_slots) {
        if node.alone() {
            meets.extend(meet(via, seat));
            continue;
        }
        match attach(seat, node, &owners) {
            Attach::Step(step) => steps.push(step),
            Attach::Wait(why) => waiting.push(why),
            Attach::Done => {}
        }
    }
    // Attachments first: one batch each, and a met node is attached only next round anyway.
    steps.extend(meets);
    (steps, waiting)
}

/// An existing cluster: introduce the lone nodes, attach slot-less masters to their shard's
/// primary, forget replaced identities, re-introduce pods at new addresses — in that order, so
/// that a round cut short (see [`Step::deferrable`]) has done what makes pods Ready first.
fn grow(nodes: &[(&Seat, &ClusterNode)]) -> Formation {
    let Some((via, _)) = nodes.iter().find(|(_, n)| n.owns_slots) else {
        return Formation::wait("no node owns slots");
    };
    let (mut steps, waiting) = introduce_and_attach(via, nodes);
    steps.extend(forget(nodes));
    let moved: Vec<Step> = readdress(via, nodes)
        .into_iter()
        .filter(|m| !steps.contains(m))
        .collect();
    let reason = match (steps.is_empty() && moved.is_empty(), waiting.is_empty()) {
        (true, true) => "formed: every node is in the cluster and placed".into(),
        (true, false) => waiting.join("; "),
        (false, _) if moved.is_empty() => {
            format!("bringing {} node(s) into the cluster", steps.len())
        }
        (false, _) if steps.is_empty() => {
            format!("{} introduction(s) at pods' new addresses", moved.len())
        }
        (false, _) => format!(
            "{} step(s) to bring nodes into the cluster, {} introduction(s) at pods' new addresses",
            steps.len(),
            moved.len()
        ),
    };
    steps.extend(moved);
    Formation {
        steps,
        reason,
        silent: false,
    }
}

/// At most this many `CLUSTER MEET`s between nodes other than the anchor per round: after a full
/// restart of n nodes each lists the n − 1 others at old addresses, and gossip repairs what the
/// anchor's introductions leave (a node flagged failing takes a peer's newer address for it).
pub const MAX_PAIR_MEETS: usize = 256;

/// Introductions at pods' current addresses. First through the anchor `via` (a node with slots):
/// every node that `via` lists at an old address, that lists itself or `via` at an old address, is
/// met by `via` — one round reconnects every node to it and tells each its own address — and
/// another node meets `via` if it lists itself at an old one. Then every other node meets the
/// peers it still lists at an old address, up to [`MAX_PAIR_MEETS`].
pub fn readdress(via: &Seat, nodes: &[(&Seat, &ClusterNode)]) -> Vec<Step> {
    let current: HashMap<&str, &str> = nodes
        .iter()
        .filter_map(|(s, n)| Some((n.id.as_str(), s.addr.as_ref()?.0.as_str())))
        .collect();
    let stale = |lister: &ClusterNode, id: &str| {
        let listed = lister.addrs.get(id);
        listed.is_some() && current.get(id).is_some_and(|ip| Some(*ip) != listed)
    };
    let Some((_, anchor)) = nodes.iter().find(|(s, _)| s.pod == via.pod) else {
        return Vec::new();
    };
    // The pods' addresses as a listing would digest them: a node whose listing digests the same
    // lists every pod at its current address, so a formed cluster is checked in O(nodes), never
    // entry by entry.
    let now = (
        digest(current.iter().map(|(id, ip)| (*id, *ip))),
        current.len(),
    );
    let whole = |n: &ClusterNode| n.addrs.same_as(now);
    let anchor_whole = whole(anchor);
    let mut steps: Vec<Step> = nodes
        .iter()
        .filter(|(s, n)| s.pod != via.pod && !(anchor_whole && whole(n)))
        .filter(|(_, n)| stale(anchor, &n.id) || stale(n, &n.id) || stale(n, &anchor.id))
        .filter_map(|(s, _)| meet(via, s))
        .collect();
    // The anchor's own address it learns only from a MEET it receives.
    if !anchor_whole && stale(anchor, &anchor.id) {
        let other = nodes.iter().find(|(s, _)| s.pod != via.pod);
        steps.extend(other.and_then(|(s, _)| meet(s, via)));
    }
    let by_id: HashMap<&str, &Seat> = nodes.iter().map(|(s, n)| (n.id.as_str(), *s)).collect();
    let pairs = nodes
        .iter()
        .filter(|(s, n)| s.pod != via.pod && !whole(n))
        .flat_map(|(s, n)| {
            let listed = n.addrs.iter().map(|(id, _)| id);
            let targets = listed.filter(|id| *id != n.id && *id != anchor.id);
            let targets = targets.filter(|id| stale(n, id));
            targets.filter_map(|id| meet(s, by_id.get(id)?))
        });
    steps.extend(pairs.take(MAX_PAIR_MEETS));
    steps
}

/// A node marked failed whose id no pod has any more is a replaced pod's old identity: every node
/// that knows it forgets it (all in one round, within Valkey's 60 s ban on re-learning it) — but
/// never while an answering replica still follows it. A node met after that primary died never
/// heard it claim its slots, so its own view lists it as forgettable; forgotten by the other
/// primaries, it leaves its replica with no vote to win, and the shard with no primary for good.
fn forget(nodes: &[(&Seat, &ClusterNode)]) -> Vec<Step> {
    let current: HashSet<&str> = nodes.iter().map(|(_, n)| n.id.as_str()).collect();
    let followed: HashSet<&str> = nodes
        .iter()
        .filter_map(|(_, n)| n.primary.as_deref())
        .collect();
    let stale: BTreeSet<&str> = nodes
        .iter()
        .flat_map(|(_, n)| n.failed.iter().map(String::as_str))
        .filter(|id| !current.contains(id) && !followed.contains(id))
        .collect();
    let mut steps = Vec::new();
    for id in stale {
        let knowing = nodes.iter().filter(|(_, n)| n.knows.contains(id));
        steps.extend(knowing.map(|(s, _)| Step::Forget {
            pod: s.pod.clone(),
            id: id.to_owned(),
        }));
    }
    steps
}

/// Shard index → the id of the node of that shard that owns slots.
fn owners_by_shard(nodes: &[(&Seat, &ClusterNode)]) -> BTreeMap<u32, String> {
    nodes
        .iter()
        .filter(|(_, n)| n.owns_slots)
        .filter_map(|(s, n)| Some((s.shard?, n.id.clone())))
        .collect()
}

enum Attach {
    Step(Step),
    Wait(String),
    Done,
}

/// A slot-less node the cluster knows: a replica of its shard's primary, or on the way to it.
fn attach(seat: &Seat, node: &ClusterNode, owners: &BTreeMap<u32, String>) -> Attach {
    let Some(primary) = seat.shard.and_then(|s| owners.get(&s)) else {
        let shard = seat.shard.unwrap_or_default();
        return Attach::Wait(format!(
            "shard {shard} has no primary with slots: adding a shard (resharding) is not automatic"
        ));
    };
    if node.role == Role::Replica {
        // Already a replica (of its primary, or of a successor after a failover): leave it.
        return Attach::Done;
    }
    if !node.knows.contains(primary) {
        return Attach::Wait(format!("{} does not know its primary yet", seat.pod));
    }
    Attach::Step(Step::Replicate {
        pod: seat.pod.clone(),
        primary: primary.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_digests_its_entries_whatever_the_order_and_replacements() {
        let pairs = [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")];
        let whole: Listing = pairs
            .iter()
            .map(|(id, ip)| (id.to_string(), ip.to_string()))
            .collect();
        let mut built = Listing::default();
        built.insert("c".into(), "10.9.9.9".into());
        built.insert("b".into(), "10.0.0.2".into());
        built.insert("a".into(), "10.0.0.1".into());
        assert!(!built.same_as((whole.digest, 3)), "c at an old address");
        built.insert("c".into(), "10.0.0.3".into());
        assert_eq!(built, whole);
        assert!(built.same_as((digest(pairs.into_iter()), pairs.len())));
        assert!(!built.same_as((digest(pairs[..2].iter().copied()), 2)));
    }
}
