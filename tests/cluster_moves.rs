//! The cluster-mode coordinator's Valkey side against real Valkey Cluster nodes on loopback: the
//! executor (`coordinator::execute::handover`) waits until the shard's peers know the target, and
//! only then sends `CLUSTER FAILOVER`; a formation round reads a pod's whole map only where its
//! short answers disagree with the coordinator's (`coordinator::formation::read_pod`).

use std::time::{Duration, Instant};

use valkey_sidecar::coordinator::execute::{self, Elections, MoveOutcome};
use valkey_sidecar::coordinator::formation::{Read, read_pod};
use valkey_sidecar::valkey::{Connector, Session, observe};
use valkey_sidecar_core::formation::LocalMap;
use valkey_sidecar_core::observation::{self, Mode};
use valkey_sidecar_core::plan::{Action, Kind};
use valkey_sidecar_testkit::{
    ClusterOptions, ServerOptions, ValkeyCluster, ValkeyServer, valkey_server_for_tag, wait_until,
};

fn connector(host: String, port: u16) -> Connector {
    Connector {
        host,
        port,
        username: None,
        password: None,
        tls: None,
        timeout: Duration::from_millis(500),
    }
}

fn of(n: &ValkeyServer) -> Connector {
    connector(n.host(), n.port())
}

fn handover(cluster: &ValkeyCluster) -> Action {
    Action {
        kind: Kind::Handover,
        shard: "s".into(),
        from: cluster.node_ids()[0].clone(),
        to: cluster.node_ids()[1].clone(),
        reason: "test".into(),
    }
}

fn accept_all() -> bool {
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handover_waits_for_every_peer_to_know_the_target_then_fails_over() {
    let cluster = ValkeyCluster::start(1, 1, ServerOptions::default()).unwrap();
    let (primary, replica) = (&cluster.nodes()[0], &cluster.nodes()[1]);
    // A cluster node that has not met the target yet, as a replaced pod's peers may be.
    let stranger = ValkeyServer::start(ServerOptions::default().cluster(true)).unwrap();
    let action = handover(&cluster);
    let peers = vec![of(primary), of(&stranger)];
    let t = Instant::now();
    let out = execute::handover(
        &action,
        (of(replica), peers),
        &Elections::default(),
        accept_all,
        Duration::from_secs(1),
    )
    .await;
    let waited = t.elapsed();
    println!("with a peer that does not know the target: {out:?} after {waited:?}");
    assert!(
        matches!(&out, MoveOutcome::Failed(e) if e.contains("is not yet known to")),
        "{out:?}"
    );
    assert!(waited >= Duration::from_secs(1), "gave up after {waited:?}");
    assert!(
        !replica.is_primary().unwrap(),
        "CLUSTER FAILOVER was sent anyway"
    );

    // A peer that does not answer is not waited for; the primary knows the target: it moves.
    let gone = connector("127.0.0.1".into(), 1);
    let peers = vec![of(primary), gone];
    let out = execute::handover(
        &action,
        (of(replica), peers),
        &Elections::default(),
        accept_all,
        Duration::from_secs(10),
    )
    .await;
    println!("with the primary and an unreachable peer: {out:?}");
    assert!(matches!(out, MoveOutcome::Done { .. }), "{out:?}");
    assert!(replica.is_primary().unwrap());
}

fn log_lengths(cluster: &ValkeyCluster) -> Vec<usize> {
    let len = |n: &ValkeyServer| std::fs::metadata(n.log_path()).map_or(0, |m| m.len() as usize);
    cluster.nodes().iter().map(len).collect()
}

/// The time of day (ms) of the first line of `log` that contains `what` (Valkey's log lines
/// read `pid:R dd Mon yyyy hh:mm:ss.mmm ...`).
fn logged_at(log: &str, what: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.contains(what))?;
    let (hms, ms) = line.split_whitespace().nth(4)?.split_once('.')?;
    let mut at = 0;
    for part in hms.split(':') {
        at = at * 60 + part.parse::<u64>().ok()?;
    }
    Some(at * 1000 + ms.parse::<u64>().ok()?)
}

/// Each shard's election as its target replica logged it since `marks`: (start, won), in ms.
fn elections(cluster: &ValkeyCluster, marks: &[usize]) -> Option<Vec<(u64, u64)>> {
    let per_shard = cluster.nodes().len() / cluster.shard_count();
    let mut out = Vec::new();
    for s in 0..cluster.shard_count() {
        let log = std::fs::read_to_string(cluster.shard(s)[1].log_path()).ok()?;
        let log = log.get(marks[s * per_shard + 1]..)?;
        let start = logged_at(log, "Starting a failover election")?;
        out.push((start, logged_at(log, "Failover election won")?));
    }
    Some(out)
}

/// Hands every shard's primary over to its replica at once, sharing `elections`.
async fn hand_over_every_shard(cluster: &ValkeyCluster, elections: &Elections) -> Vec<MoveOutcome> {
    let ids = cluster.node_ids();
    let runs = (0..cluster.shard_count()).map(|s| {
        let (primary, replica) = (&cluster.shard(s)[0], &cluster.shard(s)[1]);
        let action = Action {
            kind: Kind::Handover,
            shard: s.to_string(),
            from: ids[2 * s].clone(),
            to: ids[2 * s + 1].clone(),
            reason: "test".into(),
        };
        async move {
            let links = (of(replica), vec![of(primary)]);
            execute::handover(
                &action,
                links,
                elections,
                accept_all,
                Duration::from_secs(10),
            )
            .await
        }
    });
    futures::future::join_all(runs).await
}

/// Six shards' hand-overs at once on `opts`' Valkey: all land, and no election began before
/// the one before it was won, so no primary was asked for two votes in one epoch (on Valkey
/// 8.0.1, elections at once lose most of their hand-overs to "Manual failover timed out").
async fn several_shards_at_once(opts: ServerOptions) -> Result<(), String> {
    let cluster = ValkeyCluster::start(6, 1, opts).map_err(|e| format!("{e:#}"))?;
    let marks = log_lengths(&cluster);
    let t = Instant::now();
    let outcomes = hand_over_every_shard(&cluster, &Elections::default()).await;
    println!(
        "6 hand-overs sharing their elections: {outcomes:?} in {:?}",
        t.elapsed()
    );
    for o in &outcomes {
        assert!(matches!(o, MoveOutcome::Done { .. }), "{outcomes:?}");
    }
    for s in 0..6 {
        let primary = cluster.shard(s)[1]
            .is_primary()
            .map_err(|e| e.to_string())?;
        assert!(primary, "shard {s}");
    }
    // Valkey's log has millisecond times, on one clock here.
    let mut held = elections(&cluster, &marks).ok_or("an election is missing from a log")?;
    held.sort();
    println!("elections (start, won), ms of the day: {held:?}");
    for pair in held.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "two elections at once: {held:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn hand_overs_of_several_shards_at_once_take_turns_to_elect_and_all_land() {
    several_shards_at_once(ServerOptions::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn on_valkey_8_0_too() {
    let old = valkey_server_for_tag("8.0.1").unwrap().unwrap();
    let opts = ServerOptions::default()
        .binary(old)
        .arg("repl-diskless-load", "on-empty-db");
    several_shards_at_once(opts).await.unwrap();
}

/// A manual failover that Valkey gave up on is sent again. The target's primary hangs (SIGSTOP)
/// past Valkey's 5 s manual-failover timeout and answers at 6 s: the command sent at 0 s is
/// forgotten by then, the one sent again at 5.5 s lands, well inside the move's 10 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_failover_valkey_gave_up_on_is_sent_again_and_lands() {
    // Long enough that nobody marks the hung primary failed (no automatic failover).
    let opts = ServerOptions {
        cluster_node_timeout_ms: 30_000,
        ..ServerOptions::default()
    };
    let cluster = ValkeyCluster::start(3, 1, opts).unwrap();
    let (primary, replica) = (&cluster.shard(0)[0], &cluster.shard(0)[1]);
    let action = handover(&cluster);
    primary.pause().unwrap();
    let t = Instant::now();
    let thaw = async {
        tokio::time::sleep(Duration::from_secs(6)).await;
        primary.resume().unwrap();
    };
    let elections = Elections::default();
    let moved = execute::handover(
        &action,
        (of(replica), vec![of(primary)]),
        &elections,
        accept_all,
        Duration::from_secs(10),
    );
    let (out, ()) = tokio::join!(moved, thaw);
    let took = t.elapsed();
    println!("with the primary hung for 6 s: {out:?} after {took:?}");
    assert!(matches!(out, MoveOutcome::Done { .. }), "{out:?}");
    assert!(
        took >= Duration::from_secs(6),
        "landed before the thaw: {took:?}"
    );
    assert!(replica.is_primary().unwrap());
    // The thawed old primary learns of its demotion from the cluster bus.
    let demoted = wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
        primary.is_primary().is_ok_and(|p| !p)
    });
    assert!(demoted, "the old primary is still primary");
}

/// The map a formation round starts from: the first node's own, read in full as the
/// coordinator's observer reads it.
async fn local_map(cluster: &ValkeyCluster) -> Result<LocalMap, String> {
    let mut session = Session::new(of(&cluster.nodes()[0]));
    let pipeline = observe::pipeline(Mode::Cluster);
    let values = session.query(&pipeline).await.map_err(|e| e.to_string())?;
    let replies = observe::replies(values);
    let obs = observation::observe(&replies, Mode::Cluster).map_err(|e| format!("{e:?}"))?;
    let shards = obs.cluster.ok_or("no cluster view")?.shards;
    let nodes: usize = shards.iter().map(|s| s.nodes.len()).sum();
    if nodes != cluster.nodes().len() {
        return Err(format!("the first node lists {nodes} nodes"));
    }
    Ok(LocalMap::new(&shards))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_formation_round_reads_whole_maps_only_where_short_answers_disagree() {
    let opts = ClusterOptions::from(ServerOptions::default()).first_ip(61);
    let cluster = ValkeyCluster::start(3, 1, opts).unwrap();
    let local = local_map(&cluster).await.unwrap();
    // Formed and settled: every node's short answers agree, and the node the local map vouches
    // for is the one its own whole map gives.
    for n in cluster.nodes() {
        let (vouched, read) = read_pod(of(n), &local, false).await;
        assert_eq!(read, Read::Vouched, "{}", n.host());
        let (whole, read) = read_pod(of(n), &local, true).await;
        assert_eq!(read, Read::Audit);
        assert!(vouched.is_some());
        assert_eq!(
            vouched,
            whole,
            "{}: vouched as its own map shows it",
            n.host()
        );
    }
    // One node forgets a primary of another shard: it knows one node fewer, so its whole map is
    // read, and that map says so.
    let (forgetful, forgotten) = (&cluster.nodes()[5], &cluster.node_ids()[0]);
    forgetful.cmd(&["CLUSTER", "FORGET", forgotten]).unwrap();
    let (node, read) = read_pod(of(forgetful), &local, false).await;
    assert_eq!(read, Read::Disagreed);
    let node = node.unwrap();
    assert!(!node.knows.contains(forgotten), "{:?}", node.knows);
    // The others still agree.
    let (_, read) = read_pod(of(&cluster.nodes()[1]), &local, false).await;
    assert_eq!(read, Read::Vouched);
    // A node that does not answer is no node, whatever the map says.
    let mut gone = of(&cluster.nodes()[2]);
    gone.port = 1;
    assert_eq!(read_pod(gone, &local, false).await.0, None);
}
