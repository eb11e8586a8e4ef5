//! The cluster-mode executor (`coordinator::execute::handover`) against real Valkey Cluster nodes
//! on loopback: a hand-over waits until the shard's peers know the target, and only then sends
//! `CLUSTER FAILOVER`.

use std::time::{Duration, Instant};

use valkey_sidecar::coordinator::execute::{self, MoveOutcome};
use valkey_sidecar::valkey::Connector;
use valkey_sidecar_core::plan::{Action, Kind};
use valkey_sidecar_testkit::{ServerOptions, ValkeyCluster, ValkeyServer};

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
        of(replica),
        peers,
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
        of(replica),
        peers,
        accept_all,
        Duration::from_secs(10),
    )
    .await;
    println!("with the primary and an unreachable peer: {out:?}");
    assert!(matches!(out, MoveOutcome::Done { .. }), "{out:?}");
    assert!(replica.is_primary().unwrap());
}
