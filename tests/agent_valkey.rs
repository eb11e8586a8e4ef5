//! The agent binary against real valkey-server processes on loopback.
//!
//! Durations are printed (run with `--nocapture` to see them) but asserted only loosely, against
//! bounds far above the expected value: timing figures belong to the benchmarks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use std::path::Path;

use valkey_sidecar_testkit::{
    Agent, AgentOptions, ClusterOptions, ReplicationSet, ServerOptions, TlsCerts, TlsClientAuth,
    TlsOptions, TlsServer, ValkeyCluster, ValkeyServer, http_get, wait_for,
};

const BIN: &str = env!("CARGO_BIN_EXE_valkey-sidecar");
const SECOND: Duration = Duration::from_secs(1);

fn sidecar(valkey: impl ToString, mode: &str) -> AgentOptions {
    AgentOptions::new(BIN, valkey, mode).arg("--poll-interval", "100ms")
}

#[test]
fn replica_readiness_follows_its_primary() {
    let set = ReplicationSet::start(1, ServerOptions::default()).unwrap();
    let replica = &set.replicas()[0];
    let agent = Agent::start(sidecar(replica.addr(), "replication")).unwrap();
    agent.wait_code("/readyz", 200, 5 * SECOND).unwrap();
    assert_eq!(agent.get("/replica").unwrap().0, 200);
    assert_eq!(agent.get("/primary").unwrap().0, 503);

    let killed = Instant::now();
    set.primary().kill().unwrap();
    let unready = agent.wait_code("/readyz", 503, 5 * SECOND).unwrap();
    println!(
        "replica /readyz 503 {:?} after its primary was killed (poll 100ms)",
        killed.elapsed()
    );
    assert!(unready < 5 * SECOND);
    let (_, reason) = agent.get("/readyz").unwrap();
    assert_eq!(reason.trim(), "link to primary is down");
    assert_eq!(
        agent.get("/livez").unwrap().0,
        200,
        "a replica without primary is alive"
    );
    assert_eq!(
        agent.status().unwrap()["role"],
        "replica",
        "still a replica, not unknown"
    );

    set.primary().restart().unwrap();
    let back = agent.wait_code("/readyz", 200, 10 * SECOND).unwrap();
    println!("replica /readyz 200 again {back:?} after the primary restarted");
}

#[test]
fn liveness_holds_while_valkey_is_blocked_and_probes_stay_fast() {
    let server = ValkeyServer::start(ServerOptions::default()).unwrap();
    let agent = Agent::start(sidecar(server.addr(), "replication")).unwrap();
    agent.wait_code("/readyz", 200, 5 * SECOND).unwrap();

    let addr = server.addr();
    let sleeper = std::thread::spawn(move || {
        let mut c = valkey_sidecar_testkit::redis::Client::open(format!("redis://{addr}"))
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = valkey_sidecar_testkit::redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(5)
            .query(&mut c)
            .unwrap();
    });
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut readiness = Vec::new();
    while !sleeper.is_finished() {
        let t = Instant::now();
        let (live, _) = agent.get("/livez").unwrap();
        slowest = slowest.max(t.elapsed());
        assert_eq!(
            live,
            200,
            "liveness must hold during DEBUG SLEEP ({:?} in)",
            start.elapsed()
        );
        readiness.push(agent.get("/readyz").unwrap().0);
        std::thread::sleep(Duration::from_millis(50));
    }
    sleeper.join().unwrap();
    println!(
        "during DEBUG SLEEP 5: slowest /livez {slowest:?}; readyz codes seen {:?}",
        dedup(&readiness)
    );
    assert!(slowest < SECOND, "a probe waited on Valkey: {slowest:?}");
    assert!(
        readiness.contains(&503),
        "a 5 s stall exceeds the 2 s staleness bound"
    );
    agent.wait_code("/readyz", 200, 5 * SECOND).unwrap();
}

fn dedup(codes: &[u16]) -> Vec<u16> {
    let mut v = codes.to_vec();
    v.dedup();
    v
}

#[test]
fn liveness_holds_while_valkey_loads_a_dataset() {
    // Slow loading on purpose: a real dataset, loaded with a per-key delay.
    let server = ValkeyServer::start(
        ServerOptions::default()
            .arg("key-load-delay", "20")
            .arg("loading-process-events-interval-bytes", "1024"),
    )
    .unwrap();
    server
        .cmd(&["DEBUG", "POPULATE", "50000", "key", "100"])
        .unwrap();
    server.cmd(&["SAVE"]).unwrap();
    let agent = Agent::start(sidecar(server.addr(), "replication")).unwrap();
    agent.wait_code("/readyz", 200, 5 * SECOND).unwrap();

    server.restart().unwrap();
    agent.wait_code("/readyz", 503, 5 * SECOND).unwrap();
    let (_, reason) = agent.get("/readyz").unwrap();
    assert_eq!(reason.trim(), "loading dataset");
    let status = agent.status().unwrap();
    assert_eq!(
        status["role"], "unknown",
        "a loading node reports master; the agent must not"
    );
    assert_eq!(status["valkey"]["loading"], true);
    assert_eq!(agent.get("/livez").unwrap().0, 200);
    assert_eq!(agent.get("/primary").unwrap().0, 503);
    let loaded = agent.wait_code("/readyz", 200, 60 * SECOND).unwrap();
    println!("loading took {loaded:?}; /livez was 200 throughout the checks");
}

/// A 3 × 1 cluster with a ready agent beside shard 0's primary and one beside its replica.
fn shard_zero_with_agents() -> (ValkeyCluster, Agent, Agent) {
    let cluster = ValkeyCluster::start(3, 1, ClusterOptions::default()).unwrap();
    let on_primary = Agent::start(sidecar(cluster.primaries()[0].addr(), "cluster")).unwrap();
    let on_replica = Agent::start(sidecar(cluster.replicas_of(0)[0].addr(), "cluster")).unwrap();
    on_primary.wait_code("/readyz", 200, 5 * SECOND).unwrap();
    on_replica.wait_code("/readyz", 200, 5 * SECOND).unwrap();
    (cluster, on_primary, on_replica)
}

#[test]
fn cluster_failover_shows_in_status_within_a_poll() {
    let (cluster, on_primary, on_replica) = shard_zero_with_agents();
    let replica = &cluster.replicas_of(0)[0];
    let status = on_replica.status().unwrap();
    assert_eq!(status["role"], "replica");
    let shard = status["valkey"]["shard_id"].as_str().unwrap().to_owned();
    assert_eq!(
        on_primary.status().unwrap()["valkey"]["shard_id"],
        shard.as_str()
    );
    assert!(status["valkey"]["lag_bytes"].as_u64().unwrap() < 1024);

    replica.cmd(&["CLUSTER", "FAILOVER"]).unwrap();
    let flipped = Instant::now();
    wait_for(
        "replica reports primary",
        5 * SECOND,
        Duration::from_millis(2),
        || replica.is_primary(),
    )
    .unwrap();
    let valkey_flip = flipped.elapsed();
    let promoted = on_replica
        .wait_status("/role", "primary", 5 * SECOND)
        .unwrap();
    let demoted = on_primary
        .wait_status("/role", "replica", 5 * SECOND)
        .unwrap();
    println!(
        "CLUSTER FAILOVER: valkey flipped in {valkey_flip:?}; /status primary after {promoted:?}, replica after {demoted:?} (poll 100ms)"
    );
    assert_eq!(on_replica.get("/primary").unwrap().0, 200);
    assert_eq!(
        on_replica.status().unwrap()["valkey"]["shard_id"],
        shard.as_str(),
        "same shard after failover"
    );
}

/// How many times `command` (e.g. `cluster|shards`) ran on `server` since its last
/// `CONFIG RESETSTAT`, from `INFO commandstats`.
fn calls(server: &ValkeyServer, command: &str) -> u64 {
    let stats: String = server.query(&["INFO", "commandstats"]).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[test]
fn the_cluster_map_is_read_when_it_changed_or_is_due_not_on_every_tick() {
    let (cluster, _on_primary, on_replica) = shard_zero_with_agents();
    let (primary, replica) = (&cluster.primaries()[0], &cluster.replicas_of(0)[0]);
    for server in [primary, replica] {
        server.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
    }
    // 30 ticks of 100 ms; a 6-node map is re-read each second when nothing changes.
    std::thread::sleep(3 * SECOND);
    let seen = |s: &ValkeyServer| {
        let names = ["cluster|info", "cluster|shards", "cluster|nodes"];
        names.map(|c| calls(s, c))
    };
    let (on_p, on_r) = (seen(primary), seen(replica));
    println!("in 3 s, CLUSTER INFO / SHARDS / NODES calls: primary {on_p:?}, replica {on_r:?}");
    for (who, [info, shards, _]) in [("primary", on_p), ("replica", on_r)] {
        assert!(
            info >= 15,
            "{who}: its own state is read every tick: {info}"
        );
        assert!(
            shards <= 6,
            "{who}: the map is read once a second, not every tick: {shards}"
        );
    }
    assert!(
        on_p[2] >= 15,
        "the primary's quorum fence reads CLUSTER NODES every tick"
    );
    assert!(
        on_r[2] <= 6,
        "a replica reads CLUSTER NODES with the map: {}",
        on_r[2]
    );

    // A failover changes the node's own state: the map is read on the tick that sees it.
    replica.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
    replica.cmd(&["CLUSTER", "FAILOVER"]).unwrap();
    on_replica
        .wait_status("/role", "primary", 5 * SECOND)
        .unwrap();
    assert!(
        calls(replica, "cluster|shards") >= 1,
        "the map read with the new role"
    );
    let status = on_replica.status().unwrap();
    println!("{status:#}");
}

#[test]
fn cluster_metrics_and_status_describe_the_node() {
    let cluster = ValkeyCluster::start(3, 0, ClusterOptions::default()).unwrap();
    let agent = Agent::start(
        sidecar(cluster.primaries()[1].addr(), "cluster")
            .arg("--zone", "zone-b")
            .arg("--node-name", "node-1")
            .arg("--pod-name", "valkey-1-0"),
    )
    .unwrap();
    agent.wait_code("/readyz", 200, 5 * SECOND).unwrap();
    let (code, metrics) = agent.get("/metrics").unwrap();
    assert_eq!(code, 200);
    for line in [
        "valkey_sidecar_role{role=\"primary\"} 1",
        "valkey_sidecar_ready 1",
        "valkey_sidecar_valkey_up 1",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    assert!(metrics.contains("valkey_sidecar_http_requests_total{path=\"/readyz\",code=\"200\"}"));
    let status = agent.status().unwrap();
    assert_eq!(
        (
            status["zone"].as_str(),
            status["node"].as_str(),
            status["pod"].as_str()
        ),
        (Some("zone-b"), Some("node-1"), Some("valkey-1-0"))
    );
    assert_eq!(status["valkey"]["cluster_state_ok"], true);
    assert_eq!(status["valkey"]["version"], "9.1.2");
    assert_eq!(agent.get("/nope").unwrap().0, 404);
}

#[test]
fn wrong_password_is_a_clear_error_and_rotation_recovers() {
    let server = ValkeyServer::start(
        ServerOptions::default()
            .requirepass("right")
            .user("sidecar on >agentpw ~* &* +@all"),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("password");
    std::fs::write(&pw, "wrong\n").unwrap();
    let agent = Agent::start(
        sidecar(server.addr(), "replication")
            .arg("--valkey-username", "sidecar")
            .arg("--valkey-password-file", pw.display()),
    )
    .unwrap();
    wait_for(
        "auth error in status",
        5 * SECOND,
        Duration::from_millis(20),
        || {
            Ok(agent.status()?["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("authentication failed")))
        },
    )
    .unwrap();
    assert_eq!(agent.get("/readyz").unwrap().0, 503);
    assert_eq!(
        agent.get("/livez").unwrap().0,
        200,
        "Valkey answers; restarting it would not help"
    );
    assert!(agent.is_running());
    assert!(
        !agent.log().contains("wrong\n") && !agent.log().contains("\"wrong\""),
        "password leaked into logs"
    );

    std::fs::write(&pw, "agentpw\n").unwrap();
    agent.wait_code("/readyz", 200, 10 * SECOND).unwrap();
}

#[test]
fn a_password_given_directly_authenticates_and_is_never_logged() {
    let server = ValkeyServer::start(
        ServerOptions::default()
            .requirepass("right")
            .user("sidecar on >agent-s3cret ~* &* +@all"),
    )
    .unwrap();
    // The flag stands for VALKEY_PASSWORD here (the same setting; pods use the variable).
    let agent = Agent::start(
        sidecar(server.addr(), "replication")
            .arg("--valkey-username", "sidecar")
            .arg("--valkey-password", "agent-s3cret"),
    )
    .unwrap();
    agent.wait_code("/readyz", 200, 10 * SECOND).unwrap();
    assert!(!agent.log().contains("agent-s3cret"), "password leaked");
}

#[test]
fn missing_password_shows_noauth() {
    let server = ValkeyServer::start(ServerOptions::default().requirepass("secret")).unwrap();
    let agent = Agent::start(sidecar(server.addr(), "replication")).unwrap();
    wait_for(
        "NOAUTH in status",
        5 * SECOND,
        Duration::from_millis(20),
        || {
            Ok(agent.status()?["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("NOAUTH")))
        },
    )
    .unwrap();
    assert_eq!(agent.get("/startupz").unwrap().0, 503);
    assert_eq!(agent.get("/livez").unwrap().0, 200);
}

#[test]
fn tls_with_the_right_ca_client_cert_and_server_name() {
    let server = TlsServer::start(TlsOptions::default()).unwrap();
    let opts = sidecar(format!("127.0.0.1:{}", server.port()), "replication")
        .arg("--valkey-tls", "true")
        .arg("--valkey-tls-ca-file", server.ca_file().display())
        .arg("--valkey-tls-cert-file", server.client_cert().display())
        .arg("--valkey-tls-key-file", server.client_key().display())
        .arg("--valkey-tls-server-name", "valkey.test");
    let agent = Agent::start(opts).unwrap();
    agent.wait_code("/readyz", 200, 5 * SECOND).unwrap();
    assert_eq!(agent.status().unwrap()["role"], "primary");
}

/// Puts `files` (source, name) into `dir` as a Secret volume changes: each written aside, then
/// renamed over the old one.
fn replace_files(dir: &Path, files: &[(std::path::PathBuf, &str)]) {
    for (from, name) in files {
        let aside = dir.join(format!(".{name}.new"));
        std::fs::copy(from, &aside).unwrap();
        std::fs::rename(&aside, dir.join(name)).unwrap();
    }
}

#[test]
fn a_rotated_ca_and_client_certificate_are_used_from_the_next_connection() {
    let opts = TlsOptions {
        auth_clients: TlsClientAuth::Yes,
        ..TlsOptions::default()
    };
    let server = TlsServer::start(opts).unwrap();
    // The agent's files in a directory of their own, like its Secret volume.
    let secret = tempfile::tempdir().unwrap();
    let old = server.certs().clone();
    let agent_files = |c: &TlsCerts| {
        [
            (c.ca_file(), "ca.crt"),
            (c.client_cert(), "tls.crt"),
            (c.client_key(), "tls.key"),
        ]
    };
    replace_files(secret.path(), &agent_files(&old));
    let opts = sidecar(format!("127.0.0.1:{}", server.port()), "replication")
        .arg("--valkey-tls", "true")
        .arg(
            "--valkey-tls-ca-file",
            secret.path().join("ca.crt").display(),
        )
        .arg(
            "--valkey-tls-cert-file",
            secret.path().join("tls.crt").display(),
        )
        .arg(
            "--valkey-tls-key-file",
            secret.path().join("tls.key").display(),
        )
        .arg("--valkey-tls-server-name", "valkey.test");
    let agent = Agent::start(opts).unwrap();
    agent.wait_code("/readyz", 200, 5 * SECOND).unwrap();

    // A new CA, and the server restarted with a certificate from it: the agent's old CA and client
    // certificate no longer pass.
    let next = TlsCerts::generate(&secret.path().join("next"), &[]).unwrap();
    let server_files = [
        (next.ca_file(), "ca.crt"),
        (next.server_cert(), "server.crt"),
        (next.server_key(), "server.key"),
        (next.client_cert(), "client.crt"),
        (next.client_key(), "client.key"),
    ];
    replace_files(old.dir(), &server_files);
    server.restart().unwrap();
    wait_for("the old CA refused", 10 * SECOND, SECOND / 20, || {
        Ok(agent.status()?["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("certificate")))
    })
    .unwrap();
    // Unready once its last observation is stale (SIDECAR_STALE_AFTER).
    agent.wait_code("/readyz", 503, 10 * SECOND).unwrap();

    // The Secret is rotated: the agent, still the same process, connects with the new files.
    replace_files(secret.path(), &agent_files(&next));
    let rotated = Instant::now();
    agent.wait_code("/readyz", 200, 10 * SECOND).unwrap();
    println!(
        "ready {:?} after its files were rotated (reconnect back-off up to 2 s)",
        rotated.elapsed()
    );
    assert!(agent.is_running());
    assert_eq!(agent.status().unwrap()["role"], "primary");
}

/// Resident memory of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The agent's cap on one reply (`src/valkey/capped.rs`).
const CAP_MIB: u64 = 8;

#[test]
fn an_endless_reply_costs_the_connection_not_the_agent() {
    // A hostile "Valkey" (a compromised pod the coordinator dials, say) answers every connection
    // with one bulk string that never ends.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::spawn(move || {
                use std::io::Write;
                let chunk = vec![b'a'; 1 << 20];
                let mut ok = stream.write_all(b"$4000000000\r\n").is_ok();
                while ok {
                    ok = stream.write_all(&chunk).is_ok();
                }
            });
        }
    });
    let agent = Agent::start(sidecar(addr, "replication")).unwrap();
    let started = Instant::now();
    // Before the first reply is read: the agent's own footprint, which the cap is measured from.
    let baseline = rss_kib(agent.pid());
    let mut peak = 0;
    let mut reported = false;
    while started.elapsed() < 10 * SECOND {
        peak = peak.max(rss_kib(agent.pid()));
        let status = agent.status().unwrap();
        let error = status["last_error"].as_str().unwrap_or_default();
        reported |= error.contains("larger than");
        std::thread::sleep(SECOND / 20);
    }
    let connections = accepted.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "10 s of endless replies: agent RSS {baseline} → peak {peak} KiB (cap {CAP_MIB} MiB per reply), \
         {connections} connections, the cap named in the status: {reported}"
    );
    assert!(agent.is_running());
    assert!(reported, "the status never named the reply cap");
    // One capped reply buffered at a time, and the client's buffer may double once past the cap:
    // a few caps, never the reply's 4 GB.
    let grown = peak.saturating_sub(baseline);
    assert!(
        grown < 4 * CAP_MIB * 1024,
        "the agent grew by {grown} KiB, more than 4 × the {CAP_MIB} MiB cap"
    );
    assert!(connections >= 2, "the agent never gave up a connection");
    assert_eq!(
        agent.get("/readyz").unwrap().0,
        503,
        "its probes still answer"
    );
}

#[test]
fn tls_mismatches_are_clear_errors_without_panic() {
    let server = TlsServer::start(TlsOptions::default()).unwrap();
    let addr = format!("127.0.0.1:{}", server.port());
    let cases = [
        (
            "wrong CA",
            sidecar(&addr, "replication")
                .arg("--valkey-tls", "true")
                .arg("--valkey-tls-ca-file", server.wrong_ca_file().display()),
            "certificate",
        ),
        (
            "wrong name",
            sidecar(&addr, "replication")
                .arg("--valkey-tls", "true")
                .arg("--valkey-tls-ca-file", server.ca_file().display())
                .arg("--valkey-tls-server-name", "other.test"),
            "certificate",
        ),
        (
            "plaintext to a TLS port",
            sidecar(&addr, "replication").arg("--valkey-timeout", "300ms"),
            "",
        ),
    ];
    for (what, opts, expect) in cases {
        let agent = Agent::start(opts).unwrap();
        wait_for(what, 5 * SECOND, Duration::from_millis(20), || {
            Ok(agent.status()?["last_error"]
                .as_str()
                .is_some_and(|e| e.contains(expect)))
        })
        .unwrap();
        let err = agent.status().unwrap()["last_error"]
            .as_str()
            .unwrap()
            .to_owned();
        println!("{what}: {err}");
        assert_eq!(agent.get("/readyz").unwrap().0, 503, "{what}");
        assert!(agent.is_running(), "{what}");
        assert!(!agent.log().contains("panicked"), "{what}");
    }
}

#[test]
fn sigterm_stops_gracefully() {
    let server = ValkeyServer::start(ServerOptions::default()).unwrap();
    let agent = Agent::start(sidecar(server.addr(), "replication")).unwrap();
    agent.wait_code("/readyz", 200, 5 * SECOND).unwrap();
    let start = Instant::now();
    agent.terminate(5 * SECOND).unwrap();
    println!("SIGTERM to exit: {:?}", start.elapsed());
    assert_eq!(agent.exit_status().and_then(|s| s.code()), Some(0));
    assert!(
        http_get(agent.probe_addr(), "/livez").is_err(),
        "listener closed"
    );
}

#[test]
fn prestop_waits_until_the_primary_is_handed_over() {
    let cluster = ValkeyCluster::start(3, 1, ClusterOptions::default()).unwrap();
    let primary = &cluster.primaries()[0];
    let replica = &cluster.replicas_of(0)[0];
    let on_primary = Agent::start(sidecar(primary.addr(), "cluster")).unwrap();
    let on_replica = Agent::start(sidecar(replica.addr(), "cluster")).unwrap();
    on_primary.wait_code("/readyz", 200, 5 * SECOND).unwrap();
    on_replica.wait_code("/readyz", 200, 5 * SECOND).unwrap();

    // Nobody hands over: the hook gives up after its timeout.
    let (code, body) = on_primary.get("/prestop?timeout=300ms").unwrap();
    assert_eq!((code, body.trim()), (503, "still primary after 300ms"));
    // A replica has nothing to hand over.
    assert_eq!(on_replica.get("/prestop").unwrap().0, 200);

    let probe = on_primary.probe_addr();
    let started = Instant::now();
    let hook = std::thread::spawn(move || http_get(probe, "/prestop?timeout=10s").unwrap());
    std::thread::sleep(Duration::from_millis(300));
    replica.cmd(&["CLUSTER", "FAILOVER"]).unwrap();
    let (code, body) = hook.join().unwrap();
    println!(
        "/prestop returned after {:?}: {}",
        started.elapsed(),
        body.trim()
    );
    assert_eq!(
        (code, body.trim()),
        (200, "valkey is replica: nothing to hand over")
    );
    assert!(started.elapsed() < 5 * SECOND);
}

/// A pod template without the downward API: the agent still serves its probes, and says once at
/// start, and in `/status`, what it leaves off and why.
#[test]
fn without_its_pods_name_the_agent_says_what_is_off() {
    let server = ValkeyServer::start(ServerOptions::default()).unwrap();
    let agent = Agent::start(sidecar(server.addr(), "replication")).unwrap();
    agent.wait_code("/readyz", 200, 5 * SECOND).unwrap();
    let status = agent.status().unwrap();
    let off = status["off"].as_array().unwrap().clone();
    let features: Vec<&str> = off.iter().map(|o| o["feature"].as_str().unwrap()).collect();
    assert_eq!(features.len(), 3, "{off:?}");
    assert!(features[0].contains("labels"), "{features:?}");
    assert!(features[1].contains("hand-overs"), "{features:?}");
    assert!(features[2].contains("primary record"), "{features:?}");
    assert!(
        off.iter().all(|o| o["why"]
            .as_str()
            .unwrap()
            .starts_with("POD_NAME is not set")),
        "{off:?}"
    );
    std::thread::sleep(SECOND);
    let log = agent.log();
    let said = log
        .lines()
        .filter(|l| l.contains("POD_NAME is not set"))
        .count();
    assert_eq!(said, 3, "once per feature:\n{log}");
}
