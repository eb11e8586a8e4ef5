//! Parsers and health rules on replies captured from a real valkey-server 9.1.2
//! (`scripts/capture-fixtures.py`; see `fixtures/README.md` for how each state was produced).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_json::Value as Json;
use valkey_sidecar_core::formation;
use valkey_sidecar_core::health::{Bounds, HealthState, Outcome, StopWait, Verdict};
use valkey_sidecar_core::observation::{Mode, Observation, Replies, Role, observe};
use valkey_sidecar_core::reply::Reply;
use valkey_sidecar_core::shards::NodeHealth;
use valkey_sidecar_core::time::Millis;

const BOUNDS: Bounds = Bounds {
    liveness_window_ms: 30_000,
    stale_after_ms: 2_000,
    max_lag_bytes: 1 << 20,
};

fn path(name: &str) -> PathBuf {
    fixtures().join(name)
}

/// This package's fixtures where it is checked out now (cargo sets the variable when it runs a
/// test; the compiled-in one may name a checkout elsewhere that shared the build cache).
fn fixtures() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("tests/fixtures")
}

fn json_reply(v: &Json) -> Reply {
    match v {
        Json::Null => Reply::Nil,
        Json::Number(n) => Reply::Int(n.as_i64().unwrap()),
        Json::String(s) => Reply::Text(s.clone()),
        Json::Array(items) => Reply::Array(items.iter().map(json_reply).collect()),
        Json::Object(o) if o.contains_key("error") => {
            Reply::Error(o["error"].as_str().unwrap().into())
        }
        Json::Object(o) => Reply::Text(o["status"].as_str().unwrap().into()),
        Json::Bool(b) => Reply::Int(i64::from(*b)),
    }
}

fn load(name: &str) -> Option<Reply> {
    let p = path(name);
    let text = std::fs::read_to_string(&p).ok()?;
    Some(if name.ends_with(".txt") {
        Reply::Text(text)
    } else {
        json_reply(&serde_json::from_str(&text).unwrap())
    })
}

fn replies(state: &str) -> Replies {
    Replies {
        role: load(&format!("{state}.role.json")),
        info: load(&format!("{state}.info.txt")),
        cluster_info: load(&format!("{state}.cluster-info.txt")),
        my_id: load(&format!("{state}.cluster-myid.json")),
        shard_id: load(&format!("{state}.cluster-myshardid.json")),
        shards: load(&format!("{state}.cluster-shards.json")),
        nodes: load(&format!("{state}.cluster-nodes.txt")),
    }
}

fn obs(state: &str, mode: Mode) -> Observation {
    observe(&replies(state), mode).unwrap_or_else(|e| panic!("{state}: {e:?}"))
}

/// A health state that has seen `states` in order, one poll apart, and the time of the last.
fn health(states: &[&str], mode: Mode) -> (HealthState, Millis) {
    let mut h = HealthState::new(Millis(0));
    let mut now = Millis(0);
    for s in states {
        now = now.plus(250);
        h.record(now, Outcome::Observed(Box::new(obs(s, mode))));
    }
    (h, now)
}

#[test]
fn standalone_primary() {
    let o = obs("standalone-primary", Mode::Replication);
    assert_eq!(o.role, Role::Primary);
    assert!(!o.loading);
    assert!(o.repl_offset > 0);
    assert_eq!(o.replicas.len(), 2);
    assert!(o.replicas.iter().all(|r| r.state == "online" && r.port > 0));
    assert_eq!(o.version.as_deref(), Some("9.1.2"));
    assert_eq!(o.failover_state.as_deref(), Some("no-failover"));
    assert!(o.cluster.is_none());
    let (h, now) = health(&["standalone-primary"], Mode::Replication);
    assert!(h.readiness(now, &BOUNDS, Mode::Replication, None).ok);
    assert!(h.primary(now, &BOUNDS).ok);
    assert!(!h.replica(now, &BOUNDS, None).ok);
    // Where a record is kept: ready only on record (a fenced or superseded master holds no data a
    // PodDisruptionBudget may count on).
    assert!(h.readiness(now, &BOUNDS, Mode::Replication, Some(true)).ok);
    let off = h.readiness(now, &BOUNDS, Mode::Replication, Some(false));
    assert!(!off.ok && off.reason.contains("not on record"), "{off:?}");
}

#[test]
fn replica_link_up_is_ready() {
    let o = obs("replica-link-up", Mode::Replication);
    assert_eq!(o.role, Role::Replica);
    let link = o.link.as_ref().unwrap();
    assert!(link.up && !link.sync_in_progress);
    assert!(link.port > 0 && !link.host.is_empty());
    let (h, now) = health(&["replica-link-up"], Mode::Replication);
    assert!(h.readiness(now, &BOUNDS, Mode::Replication, None).ok);
    // A replica is not held to the primary's record.
    assert!(h.readiness(now, &BOUNDS, Mode::Replication, Some(false)).ok);
    assert!(
        h.replica(now, &BOUNDS, Some(0)).ok,
        "lag unknown in replication mode: link decides"
    );
    assert!(!h.primary(now, &BOUNDS).ok);
}

#[test]
fn replica_link_down_is_not_ready() {
    let (h, now) = health(&["replica-link-down"], Mode::Replication);
    let v = h.readiness(now, &BOUNDS, Mode::Replication, None);
    assert!(!v.ok);
    assert_eq!(v.reason, "link to primary is down");
    assert_eq!(
        h.role(now, &BOUNDS),
        Role::Replica,
        "a disconnected replica is still a replica"
    );
    assert!(h.liveness(now, &BOUNDS).ok);
}

#[test]
fn replica_syncing_is_not_ready() {
    for state in [
        "replica-sync-in-progress",
        "replica-sync-in-progress-diskless",
    ] {
        let o = obs(state, Mode::Replication);
        assert!(o.link.as_ref().unwrap().sync_in_progress, "{state}");
        let (h, now) = health(&[state], Mode::Replication);
        let v = h.readiness(now, &BOUNDS, Mode::Replication, None);
        assert!(!v.ok, "{state}");
        assert_eq!(h.role(now, &BOUNDS), Role::Replica);
    }
}

#[test]
fn loading_is_alive_but_not_ready_and_role_unknown() {
    let o = obs("loading", Mode::Replication);
    assert!(o.loading);
    // ROLE says master while loading; the agent must not believe it.
    assert_eq!(o.role, Role::Primary);
    let (h, now) = health(&["loading"], Mode::Replication);
    assert_eq!(h.role(now, &BOUNDS), Role::Unknown);
    assert_eq!(
        h.readiness(now, &BOUNDS, Mode::Replication, None).reason,
        "loading dataset"
    );
    assert!(h.liveness(now, &BOUNDS).ok);
    assert!(h.startup().ok);
    assert!(!h.primary(now, &BOUNDS).ok);
}

#[test]
fn cluster_primary_sees_its_shard() {
    let o = obs("cluster-primary", Mode::Cluster);
    assert_eq!(o.role, Role::Primary);
    let c = o.cluster.as_ref().unwrap();
    assert!(c.enabled);
    assert_eq!(c.state_ok, Some(true));
    let shard_id = c.shard_id.as_deref().unwrap();
    assert_eq!(shard_id.len(), 40);
    assert_eq!(c.shards.len(), 3);
    let mine = o.my_shard().unwrap();
    assert_eq!(mine.id, shard_id);
    assert_eq!(mine.primary().map(|p| p.id.as_str()), c.my_id.as_deref());
    assert_eq!(mine.slots, vec![(0, 5460)]);
    assert_eq!(o.availability_zone.as_deref(), Some("zone-a"));
    assert!(
        c.shards
            .iter()
            .flat_map(|s| &s.nodes)
            .all(|n| n.health == NodeHealth::Online && n.availability_zone.is_some())
    );
    let (h, now) = health(&["cluster-primary"], Mode::Cluster);
    assert!(h.readiness(now, &BOUNDS, Mode::Cluster, None).ok);
}

#[test]
fn cluster_replica_knows_its_lag() {
    let o = obs("cluster-replica", Mode::Cluster);
    assert_eq!(o.role, Role::Replica);
    let lag = o.lag_bytes(None).unwrap();
    assert!(lag < 1024, "synced replica, lag {lag}");
    let (h, now) = health(&["cluster-replica"], Mode::Cluster);
    assert!(h.readiness(now, &BOUNDS, Mode::Cluster, None).ok);
    let tight = Bounds {
        max_lag_bytes: 0,
        ..BOUNDS
    };
    assert_eq!(h.readiness(now, &tight, Mode::Cluster, None).ok, lag == 0);
}

#[test]
fn cluster_fail_is_sticky_once_joined() {
    let o = obs("cluster-fail", Mode::Cluster);
    assert_eq!(o.cluster.as_ref().unwrap().state_ok, Some(false));
    let failed: Vec<_> = o
        .cluster
        .as_ref()
        .unwrap()
        .shards
        .iter()
        .flat_map(|s| &s.nodes)
        .filter(|n| n.health == NodeHealth::Failed)
        .collect();
    assert_eq!(
        failed.len(),
        2,
        "both nodes of the killed shard are marked fail"
    );
    // A node that never saw the cluster healthy is not ready…
    let (fresh, now) = health(&["cluster-fail"], Mode::Cluster);
    assert!(!fresh.readiness(now, &BOUNDS, Mode::Cluster, None).ok);
    // …but a joined node stays ready when another shard fails, so PDBs do not see every pod drop.
    let (joined, now) = health(&["cluster-primary", "cluster-fail"], Mode::Cluster);
    assert!(joined.readiness(now, &BOUNDS, Mode::Cluster, None).ok);
}

#[test]
fn cluster_failover_flips_roles() {
    let promoted = obs("cluster-promoted", Mode::Cluster);
    let demoted = obs("cluster-demoted", Mode::Cluster);
    assert_eq!(promoted.role, Role::Primary);
    assert_eq!(demoted.role, Role::Replica);
    let (p, d) = (promoted.cluster.unwrap(), demoted.cluster.unwrap());
    assert_eq!(p.shard_id, d.shard_id, "a failover keeps the shard id");
}

#[test]
fn cluster_replica_loading_has_unknown_role() {
    let (h, now) = health(&["cluster-replica-loading"], Mode::Cluster);
    assert_eq!(h.role(now, &BOUNDS), Role::Unknown);
    assert!(!h.readiness(now, &BOUNDS, Mode::Cluster, None).ok);
}

#[test]
fn noauth_is_a_refusal() {
    let error = load("noauth.error.json").unwrap();
    let r = Replies {
        role: Some(error.clone()),
        info: Some(error),
        ..Replies::default()
    };
    let refusal = observe(&r, Mode::Cluster).unwrap_err();
    assert!(refusal.0.starts_with("NOAUTH"), "{refusal:?}");
}

#[test]
fn stale_observations_lose_role_and_readiness() {
    let (mut h, now) = health(&["replica-link-up"], Mode::Replication);
    let later = now.plus(BOUNDS.stale_after_ms + 1);
    assert_eq!(h.role(later, &BOUNDS), Role::Unknown);
    h.record(later, Outcome::Unreachable("connect: refused".into()));
    let v = h.readiness(later, &BOUNDS, Mode::Replication, None);
    assert!(!v.ok && v.reason.contains("refused"), "{v:?}");
    assert!(h.liveness(later, &BOUNDS).ok, "within the liveness window");
    let dead = later.plus(BOUNDS.liveness_window_ms);
    h.record(dead, Outcome::Unreachable("connect: refused".into()));
    assert!(!h.liveness(dead, &BOUNDS).ok);
}

#[test]
fn valkey_is_gone_when_refused_or_silent_twice() {
    let (mut h, now) = health(&["replica-link-up"], Mode::Replication);
    assert!(!h.gone());
    h.record(now, Outcome::Unreachable("timeout".into()));
    assert!(!h.gone(), "one timeout may be a busy server");
    h.record(now, Outcome::Unreachable("timeout".into()));
    assert!(h.gone(), "two in a row are not waited on");
    let (mut h, now) = health(&["replica-link-up"], Mode::Replication);
    h.record(now, Outcome::Down("connection refused".into()));
    assert!(h.gone(), "nothing listens: gone at once");
    h.record(now, Outcome::Unreachable("reconnecting in 50ms".into()));
    assert!(h.gone(), "backing off after a refusal stays gone");
    h.record(now, Outcome::Refused("NOAUTH".into()));
    assert!(
        !h.down,
        "an answer, even a refusal, means a process listens"
    );
    assert!(
        h.gone(),
        "yet three failed ticks in a row: the agent is blind"
    );
    h.record(
        now,
        Outcome::Observed(Box::new(obs("replica-link-up", Mode::Replication))),
    );
    assert!(!h.gone());
}

#[test]
fn a_replica_that_never_synced_is_unsynced_whatever_keys_it_holds() {
    let mut syncing = obs("replica-sync-in-progress", Mode::Replication);
    assert!(syncing.unsynced());
    syncing.keys = 3;
    assert!(!syncing.fresh(), "it has keys");
    assert!(
        syncing.unsynced(),
        "but not the shard's: its link never came up"
    );
    assert!(!obs("replica-link-up", Mode::Replication).unsynced());
    assert!(!obs("replica-link-down", Mode::Replication).unsynced());
    let primary = obs("standalone-primary", Mode::Replication);
    assert_eq!(primary.unsynced(), primary.fresh());
}

#[test]
fn a_pod_may_stop_when_it_is_not_primary_or_no_replica_can_take_over() {
    let (h, now) = health(&["replica-link-up"], Mode::Replication);
    let v = h.stop(now, &BOUNDS).unwrap();
    assert!(
        v.ok && v.reason.contains("replica: nothing to hand over"),
        "{v:?}"
    );
    // A cluster primary with a replica in its shard waits for the hand-over.
    let (h, now) = health(&["cluster-primary"], Mode::Cluster);
    assert!(obs("cluster-primary", Mode::Cluster).has_replica());
    assert_eq!(h.stop(now, &BOUNDS), None);
    // A primary nobody replicates from has nobody to wait for.
    let mut alone = obs("standalone-primary", Mode::Replication);
    alone.replicas.clear();
    let mut h = HealthState::new(Millis(0));
    h.record(Millis(10), Outcome::Observed(Box::new(alone)));
    let v = h.stop(Millis(10), &BOUNDS).unwrap();
    assert!(v.ok && v.reason.contains("without a replica"), "{v:?}");
}

#[test]
fn a_primary_whose_replicas_went_away_waits_for_their_replacements() {
    let with = obs("standalone-primary", Mode::Replication);
    assert!(with.has_replica());
    let mut without = with.clone();
    without.replicas.clear();
    let mut h = HealthState::new(Millis(0));
    h.record(Millis(10), Outcome::Observed(Box::new(with)));
    // Its replica's pod deleted too (every pod at once): the replica's Valkey exits first.
    h.record(Millis(20), Outcome::Observed(Box::new(without.clone())));
    assert_eq!(
        h.stop(Millis(20), &BOUNDS),
        None,
        "a replacement syncs from it"
    );
    // A restarted Valkey starts over: what it had before is not its shard's any more.
    let mut restarted = without;
    restarted.run_id = Some("another run".into());
    h.record(Millis(30), Outcome::Observed(Box::new(restarted)));
    assert!(h.stop(Millis(30), &BOUNDS).is_some_and(|v| v.ok));
}

/// The quorum fence reads real `CLUSTER NODES` with Valkey's own clock: a primary that lost one
/// shard of three (both nodes killed, flagged `fail`) still hears a majority and is not fenced;
/// with its ping to a second primary pending long enough, it is.
#[test]
fn the_quorum_fence_on_real_cluster_nodes() {
    use valkey_sidecar_core::quorum::{Guard, QuorumPolicy, guard, sight};
    let policy = QuorumPolicy {
        silent_after_ms: 1000,
        pause_ms: 1500,
    };
    let o = obs("cluster-fail", Mode::Cluster);
    let now = o.server_time_ms.expect("server_time_usec");
    let peers = o
        .cluster
        .as_ref()
        .and_then(|c| c.peers.clone())
        .expect("CLUSTER NODES");
    let seen = sight(&peers, now, policy.silent_after_ms);
    assert_eq!((seen.reachable, seen.primaries), (2, 3));
    assert_eq!(guard(&o, Some(now), false, &policy, None), Guard::Hold);
    let mut cut = o.clone();
    let other = cut
        .cluster
        .as_mut()
        .and_then(|c| c.peers.as_mut())
        .expect("peers");
    let live = other
        .iter_mut()
        .find(|p| p.primary && !p.myself && !p.failing)
        .expect("a live primary");
    live.ping_sent_ms = now - 1000;
    assert!(matches!(
        guard(&cut, Some(now), false, &policy, None),
        Guard::Fence { .. }
    ));
    let healthy = obs("cluster-primary", Mode::Cluster);
    let peers = healthy
        .cluster
        .as_ref()
        .and_then(|c| c.peers.clone())
        .expect("CLUSTER NODES");
    let all = sight(&peers, healthy.server_time_ms.expect("time"), 1000);
    assert_eq!((all.reachable, all.primaries), (3, 3));
}

#[test]
fn a_master_whose_shard_owns_no_slots_is_no_primary_to_advertise() {
    // A pod re-created empty is a master of a new, slotless shard until it is joined to its own.
    let mut o = obs("cluster-primary", Mode::Cluster);
    assert_eq!(o.owns_slots(), Some(true));
    let mut h = HealthState::new(Millis(0));
    h.record(Millis(250), Outcome::Observed(Box::new(o.clone())));
    assert_eq!(h.advertised_role(Millis(250), &BOUNDS), Role::Primary);
    let ready = |h: &HealthState, at| h.readiness(Millis(at), &BOUNDS, Mode::Cluster, None);
    assert!(ready(&h, 250).ok, "{:?}", ready(&h, 250));
    let me = o.cluster.as_ref().unwrap().my_id.clone().unwrap();
    let cluster = o.cluster.as_mut().unwrap();
    let mine = cluster.shards.iter_mut().find(|s| s.contains(&me)).unwrap();
    mine.slots.clear();
    assert_eq!(o.owns_slots(), Some(false));
    h.record(Millis(500), Outcome::Observed(Box::new(o)));
    assert_eq!(h.role(Millis(500), &BOUNDS), Role::Primary);
    assert_eq!(h.advertised_role(Millis(500), &BOUNDS), Role::Unknown);
    assert!(!h.primary(Millis(500), &BOUNDS).ok);
    // Nor is it Ready: it holds none of its shard's data, and a PodDisruptionBudget counting it
    // would let a drain evict the shard's primary before any replica synced.
    let slotless = ready(&h, 500);
    assert!(
        !slotless.ok && slotless.reason.contains("owns no slots"),
        "{slotless:?}"
    );
    // Outside cluster mode there are no slots to own.
    assert_eq!(
        obs("standalone-primary", Mode::Replication).owns_slots(),
        None
    );
}

/// The one `ROLE` parser (the coordinator's read-back of a promotion uses it too) reads every
/// captured `ROLE` reply as its first word says, and nothing else as a role.
#[test]
fn every_captured_role_reply_reads_as_its_first_word() {
    use valkey_sidecar_core::observation::role_reply;
    let dir = fixtures();
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(state) = name.strip_suffix(".role.json") else {
            continue;
        };
        let reply = load(&name).unwrap();
        let first = reply.as_array().unwrap()[0].as_text().unwrap().to_owned();
        let want = if first == "master" {
            Role::Primary
        } else {
            Role::Replica
        };
        assert_eq!(role_reply(&reply), Some(want), "{state}");
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} ROLE fixtures");
    assert_eq!(role_reply(&Reply::Error("NOPERM".into())), None);
    assert_eq!(role_reply(&Reply::Array(vec![])), None);
    let sentinel = Reply::Array(vec![Reply::Text("sentinel".into())]);
    assert_eq!(role_reply(&sentinel), Some(Role::Unknown));
}

#[test]
fn the_prestop_wait_answers_only_once_the_pod_stayed_free_to_stop() {
    let pass = || {
        Some(Verdict {
            ok: true,
            reason: "valkey is replica: nothing to hand over".into(),
        })
    };
    let settle = valkey_sidecar_core::health::STOP_SETTLE_MS;
    let mut wait = StopWait::default();
    assert_eq!(
        wait.step(pass(), Millis(100)),
        Err(Some(Millis(100 + settle)))
    );
    // A hand-over to it lands meanwhile: primary now, it waits for its own hand-over.
    assert_eq!(wait.step(None, Millis(300)), Err(None));
    assert_eq!(
        wait.step(pass(), Millis(900)),
        Err(Some(Millis(900 + settle)))
    );
    assert_eq!(
        wait.step(pass(), Millis(900 + settle - 1)),
        Err(Some(Millis(900 + settle)))
    );
    assert_eq!(wait.step(pass(), Millis(900 + settle)), pass().ok_or(None));
}

/// Real `CLUSTER SHARDS` of a cluster whose shard 2 lost both nodes (SIGKILL, marked `fail`): the
/// failed replica may be forgotten once it is no pod; the failed primary still serving the slots
/// may not — a replica of it could still be elected, and forgotten it never can be.
#[test]
fn a_failed_primary_that_still_serves_its_slots_is_not_forgettable() {
    use valkey_sidecar_core::formation::ClusterNode;
    let node = ClusterNode::observed(&obs("cluster-fail", Mode::Cluster)).unwrap();
    let failed: Vec<&str> = node.failed.iter().map(String::as_str).collect();
    assert_eq!(failed, ["835cc1c1ea944e632afe7e1bff28e02dc6fe4983"]);
    assert!(
        node.knows
            .contains("08298011e91072d0e69e816fcbf96f6405e94439")
    );
}

/// A formation round's short answers ([`formation::QUESTIONS`]) as `state`'s node gave them: its
/// whole INFO stands in for `INFO persistence` (the fields read are the same).
fn glance(state: &str) -> Option<formation::Glance> {
    let r = replies(state);
    let error = || {
        Some(Reply::Error(
            "ERR This instance has cluster support disabled".into(),
        ))
    };
    let answers = [
        r.role,
        r.info,
        r.cluster_info.or_else(error),
        r.my_id.or_else(error),
        r.shard_id.or_else(error),
    ];
    let answers: Vec<Reply> = answers.into_iter().map(Option::unwrap).collect();
    formation::Glance::answered(&answers)
}

#[test]
fn a_formation_glance_reads_role_primary_id_and_node_count_and_skips_loading_or_standalone() {
    let replica = glance("cluster-replica").unwrap();
    let own = obs("cluster-replica", Mode::Cluster);
    let view = own.cluster.as_ref().unwrap();
    assert_eq!(Some(&replica.id), view.my_id.as_ref());
    assert_eq!(replica.shard_id, view.shard_id);
    assert_eq!(replica.role, Role::Replica);
    assert_eq!(
        replica.primary_ip.as_deref(),
        Some(own.link.unwrap().host.as_str())
    );
    assert_eq!(replica.known_nodes, 6);
    let primary = glance("cluster-primary").unwrap();
    assert_eq!((primary.role, primary.primary_ip), (Role::Primary, None));
    assert_eq!(glance("cluster-replica-loading"), None, "loading");
    assert_eq!(glance("standalone-primary"), None, "not in cluster mode");
}
