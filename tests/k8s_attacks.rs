//! Attacks on the agent from inside the cluster, on the chart's pods: each test plays the attacker
//! and asserts that nothing bad happened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;
use valkey_sidecar_testkit::k8s::shard::record;
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, http_get, pod_is_ready, poll_until};

const SECOND: Duration = Duration::from_secs(1);
/// Idle connections the attacker keeps open (re-opening those the agent closes).
const IDLE: usize = 5000;
/// Connections that drip a request head one byte at a time.
const DRIPPING: usize = 200;
/// Longer than the chart's liveness probe needs to restart Valkey (3 × 5 s) and its readiness
/// probe to turn the pod unready (2 × 2 s).
const ATTACK: Duration = Duration::from_secs(25);

/// The hostile pod's address (the kubelet's probes come from 127.0.0.1, its node's).
const HOSTILE: Ipv4Addr = Ipv4Addr::new(127, 0, 99, 66);

async fn connect_from(source: Ipv4Addr, target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    socket.connect(target).await
}

/// One attacker connection, re-opened whenever the agent closes it, until the task is aborted:
/// idle (connect, then wait) or dripping (a request line, then a header byte every 500 ms).
async fn hold(target: SocketAddr, drip: bool, open: Arc<AtomicUsize>, closed: Arc<AtomicUsize>) {
    loop {
        let Ok(mut stream) = connect_from(HOSTILE, target).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        open.fetch_add(1, Ordering::Relaxed);
        if drip {
            let _ = stream.write_all(b"GET /livez HTTP/1.1\r\nX-A: ").await;
            while stream.write_all(b"a").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if closed_by_peer(&mut stream).await {
                    break;
                }
            }
        } else {
            let mut buf = [0u8; 64];
            // Returns once the agent closes the connection.
            while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
        }
        open.fetch_sub(1, Ordering::Relaxed);
        closed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether the peer has closed `stream` (a read that would not block returns 0 or fails).
async fn closed_by_peer(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 512];
    match tokio::time::timeout(Duration::from_millis(1), stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        // A 408/431 answer is followed by the close.
        Ok(Ok(_)) => false,
        Err(_) => false,
    }
}

/// The agent's resident memory, from `/proc`.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn restarts(pod: &Pod) -> i32 {
    let status = pod.status.as_ref().unwrap();
    let all = status.container_statuses.iter().flatten();
    let init = status.init_container_statuses.iter().flatten();
    all.chain(init).map(|c| c.restart_count).sum()
}

/// What the defender saw during the attack.
#[derive(Default)]
struct Watched {
    probes: usize,
    failed: Vec<String>,
    slowest: Duration,
    unready: usize,
    peak_rss_kib: u64,
}

/// The kubelet's view during the attack, sampled: a `/livez` probe with its 1 s timeout every
/// 250 ms, the pods' Ready condition and the agent's memory.
async fn watch(s: &Stage, pod: &str, agent_pid: u32, until: Instant) -> Watched {
    let mut w = Watched::default();
    let agent = s.agent(pod).unwrap();
    while Instant::now() < until {
        let at = Instant::now();
        match http_get(agent, "/livez", SECOND).await {
            Ok((200, _)) => {}
            Ok((code, body)) => w.failed.push(format!("{code}: {body}")),
            Err(e) => w.failed.push(format!("{e:#}")),
        }
        w.probes += 1;
        w.slowest = w.slowest.max(at.elapsed());
        let pods = s.pod_objects().await.unwrap();
        w.unready += pods.iter().filter(|p| !pod_is_ready(p)).count();
        w.peak_rss_kib = w.peak_rss_kib.max(rss_kib(agent_pid));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_and_dripping_connections_to_the_probe_port_harms_nothing() {
    let s = Stage::start(StageOptions::replication("attack-flood", 1).lease("4s", "3s", "1s"))
        .await
        .unwrap();
    let pod = "valkey-0-0";
    poll_until(
        "valkey-0-0 holds the record",
        30 * SECOND,
        SECOND / 10,
        || async {
            Ok(record(&s, "0")
                .await
                .is_some_and(|r| r.holder.as_deref() == Some(pod)))
        },
    )
    .await
    .unwrap();
    s.wait_ready(2, 60 * SECOND).await.unwrap();
    let before = record(&s, "0").await;
    let restarts_before: i32 = s.pod_objects().await.unwrap().iter().map(restarts).sum();
    let agent_pid = s
        .kubelet
        .container_pid(&s.namespace, pod, "valkey-sidecar")
        .unwrap();
    let rss_before = rss_kib(agent_pid);

    let target = s.agent(pod).unwrap();
    let (open, closed) = (Arc::default(), Arc::<AtomicUsize>::default());
    let mut attackers = JoinSet::new();
    for k in 0..IDLE + DRIPPING {
        attackers.spawn(hold(
            target,
            k >= IDLE,
            Arc::clone(&open),
            Arc::clone(&closed),
        ));
    }
    let started = Instant::now();
    let w = watch(&s, pod, agent_pid, started + ATTACK).await;
    let (open_at_end, reopened) = (open.load(Ordering::Relaxed), closed.load(Ordering::Relaxed));
    attackers.abort_all();

    let closed_for =
        |why: &str| format!("valkey_sidecar_http_connections_closed_total{{kind=\"{why}\"}}");
    let refused = s
        .agent_counter(pod, &closed_for("per_source"))
        .await
        .unwrap();
    let timed_out = s
        .agent_counter(pod, &closed_for("header_timeout"))
        .await
        .unwrap();
    println!(
        "{ATTACK:?} of {IDLE} idle + {DRIPPING} dripping connections: {} probes, {} failed, slowest {:?}; \
         unready samples {}; agent RSS {} → peak {} KiB; the agent closed {refused} (its source held too many) + \
         {timed_out} (no request head in time), the attacker re-opened {reopened}, {open_at_end} open at the end",
        w.probes,
        w.failed.len(),
        w.slowest,
        w.unready,
        rss_before,
        w.peak_rss_kib,
    );
    assert!(w.failed.is_empty(), "probes failed: {:?}", w.failed);
    assert_eq!(w.unready, 0, "a pod turned unready during the attack");
    let restarts_after: i32 = s.pod_objects().await.unwrap().iter().map(restarts).sum();
    assert_eq!(restarts_after, restarts_before, "a container was restarted");
    assert_eq!(record(&s, "0").await, before, "the record changed hands");
    assert!(
        w.peak_rss_kib < rss_before + 32 * 1024,
        "the agent's memory grew from {rss_before} to {} KiB",
        w.peak_rss_kib
    );
    // The defences were what held: connections were closed for both reasons.
    assert!(
        refused > 0 && timed_out > 0,
        "{refused} refused, {timed_out} timed out"
    );
}
