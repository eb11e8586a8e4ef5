//! Multi-node topologies: a replication set and a cluster.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use valkey_sidecar_testkit::{
    ClusterOptions, ReplicationOptions, ReplicationSet, ServerOptions, ValkeyCluster, loopback_ip,
    wait_until,
};

const POLL: Duration = Duration::from_millis(20);

#[test]
fn replication_set_of_one_plus_two() -> Result<()> {
    let started = Instant::now();
    let set = ReplicationSet::start(2, ServerOptions::default())?;
    eprintln!("replication set 1+2 synced in {:?}", started.elapsed());
    ensure!(
        set.primary()
            .info_field("replication", "connected_slaves")?
            == "2"
    );
    set.primary().cmd(&["SET", "k", "v"])?;
    for replica in set.replicas() {
        ensure!(replica.info_field("replication", "role")? == "slave");
        let replicated = wait_until(Duration::from_secs(2), POLL, || {
            replica
                .query::<Option<String>>(&["GET", "k"])
                .ok()
                .flatten()
                == Some("v".into())
        });
        ensure!(replicated, "{} did not get the write", replica.addr());
    }
    Ok(())
}

#[test]
fn replication_set_with_own_addresses_password_and_zones() -> Result<()> {
    let opts = ReplicationOptions {
        first_ip: Some(40),
        zones: vec!["a".into(), "b".into()],
        ..ServerOptions::default().requirepass("pw").into()
    };
    let set = ReplicationSet::start(1, opts)?;
    let replica = &set.replicas()[0];
    ensure!(set.primary().addr().ip() == loopback_ip(40));
    ensure!(replica.addr().ip() == loopback_ip(41));
    ensure!(replica.info_field("server", "availability_zone")? == "b");
    // The primary sees the replica's own address, not 127.0.0.1: outgoing connections are bound.
    let slave0 = set.primary().info_field("replication", "slave0")?;
    ensure!(slave0.starts_with("ip=127.0.0.41,"), "{slave0}");
    // Hand over and check the harness follows the new topology.
    replica.cmd(&["REPLICAOF", "NO", "ONE"])?;
    set.primary()
        .cmd(&["REPLICAOF", &replica.host(), &replica.port().to_string()])?;
    set.wait_synced(Duration::from_secs(5))?;
    ensure!(replica.is_primary()?);
    Ok(())
}

#[test]
fn cluster_of_three_shards_with_one_replica_each() -> Result<()> {
    let started = Instant::now();
    let cluster = ValkeyCluster::start(
        3,
        1,
        ClusterOptions::default()
            .first_ip(50)
            .zones(["a", "b", "c"]),
    )?;
    eprintln!("cluster 3x1 formed in {:?}", started.elapsed());
    for node in cluster.nodes() {
        ensure!(node.info_field("cluster", "cluster_enabled")? == "1");
        let info: String = node.query(&["CLUSTER", "INFO"])?;
        ensure!(info.contains("cluster_state:ok"), "{}: {info}", node.addr());
    }
    let ids = cluster.shard_ids()?;
    ensure!(ids.iter().collect::<HashSet<_>>().len() == 3, "{ids:?}");
    for (shard, id) in ids.iter().enumerate() {
        for replica in cluster.replicas_of(shard) {
            ensure!(&replica.query::<String>(&["CLUSTER", "MYSHARDID"])? == id);
            ensure!(replica.info_field("replication", "master_link_status")? == "up");
        }
    }
    // Every node announces its own 127.0.0.x.
    let nodes: String = cluster.nodes()[0].query(&["CLUSTER", "NODES"])?;
    for node in cluster.nodes() {
        ensure!(
            nodes.contains(&format!("{} ", node.addr()).replace(' ', "@")),
            "{nodes}"
        );
    }
    ensure!(cluster.primaries()[1].info_field("server", "availability_zone")? == "b");

    // A coordinated failover in shard 0, and the harness sees the cluster healthy again.
    let replica = &cluster.replicas_of(0)[0];
    let failover = Instant::now();
    replica.cmd(&["CLUSTER", "FAILOVER"])?;
    ensure!(wait_until(Duration::from_secs(5), POLL, || {
        replica.is_primary().unwrap_or(false)
    }));
    cluster.wait_healthy(Duration::from_secs(10))?;
    eprintln!("failover + healthy again in {:?}", failover.elapsed());
    ensure!(cluster.live_primaries()?.len() == 3);

    // A crashed replica comes back from its nodes.conf with the same node id.
    let old_primary = cluster.primaries()[0];
    let id = old_primary.query::<String>(&["CLUSTER", "MYID"])?;
    let rejoin = Instant::now();
    old_primary.kill()?;
    old_primary.restart()?;
    cluster.wait_healthy(Duration::from_secs(10))?;
    eprintln!("replica kill + restart + healthy in {:?}", rejoin.elapsed());
    ensure!(old_primary.query::<String>(&["CLUSTER", "MYID"])? == id);
    ensure!(cluster.node_by_id(&id).map(|n| n.addr()) == Some(old_primary.addr()));
    Ok(())
}
