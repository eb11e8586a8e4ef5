//! Peer heartbeats (`core::heartbeat`, `src/peers/heartbeat.rs`) on the chart's pods: a healthy shard
//! under a writer's load is never fenced by them (a false positive stops writes for nothing), in
//! both modes, with what they cost printed; forged and flooding datagrams are dropped and counted.
//! The partitions they exist for are in `k8s_node_faults` (`*_partitioned*`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use valkey_sidecar_testkit::faults::{self, Outcome};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions};

const LOADED: Duration = Duration::from_secs(30);

fn counter(kind: &str) -> String {
    format!("valkey_sidecar_heartbeats_total{{kind=\"{kind}\"}}")
}

/// Per pod: the isolation fences its agent raised, and its heartbeat datagrams.
async fn tally(s: &Stage) -> Vec<(String, [u64; 4])> {
    let mut out = Vec::new();
    for pod in &s.pods {
        let mut row = [0; 4];
        for (i, kind) in [
            "isolation_fence",
            "ping_sent",
            "ping_answered",
            "pong_counted",
        ]
        .iter()
        .enumerate()
        {
            row[i] = s.agent_counter(pod, &counter(kind)).await.unwrap();
        }
        out.push((pod.clone(), row));
    }
    out
}

/// CPU seconds and RSS (KiB) of `pid` from `/proc`.
fn usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (ticks as f64 / 100.0, rss)
}

fn agent_usage(s: &Stage) -> Vec<(f64, u64)> {
    s.pods
        .iter()
        .filter_map(|p| s.kubelet.container_pid(&s.namespace, p, "valkey-sidecar"))
        .map(usage)
        .collect()
}

/// Writes to every pod for [`LOADED`] and checks that no agent fenced for want of a vouch.
async fn healthy(o: StageOptions, scenario: &str) -> Stage {
    let s = Stage::start(o).await.unwrap();
    let addrs = s.pods.iter().map(|p| s.valkey(p).unwrap()).collect();
    let before = tally(&s).await;
    let cpu_before = agent_usage(&s);
    let writer = s.writer(addrs, "hb");
    let started = Instant::now();
    tokio::time::sleep(LOADED).await;
    let w = writer.stop().unwrap();
    let took = started.elapsed().as_secs_f64();
    let after = tally(&s).await;
    let cpu_after = agent_usage(&s);
    let fences: u64 = after.iter().map(|(_, r)| r[0]).sum();
    let per_pod: Vec<String> = before
        .iter()
        .zip(&after)
        .map(|((pod, b), (_, a))| {
            let rate = |i: usize| (a[i] - b[i]) as f64 / took;
            format!(
                "{pod}: {:.0} pings/s sent, {:.0} answered, {:.0} pongs counted",
                rate(1),
                rate(2),
                rate(3)
            )
        })
        .collect();
    let cpu: Vec<String> = cpu_before
        .iter()
        .zip(&cpu_after)
        .map(|((c0, _), (c1, rss))| format!("{:.1}% CPU, {rss} KiB", (c1 - c0) / took * 100.0))
        .collect();
    println!(
        "{scenario}: {} writes acknowledged, longest pause {:?}, isolation fences {fences}\n  {}\n  agents: {}",
        w.acked.len(),
        w.longest_pause,
        per_pod.join("\n  "),
        cpu.join(", ")
    );
    faults::record(
        &Outcome::new(module_path!(), scenario)
            .writes(w.acked.len(), 0)
            .note(format!(
                "isolation fences (false positives) in {}s under a writer: {fences}; heartbeats {}; agents {}",
                LOADED.as_secs(),
                per_pod.join("; "),
                cpu.join(", ")
            )),
    );
    assert!(w.acked.len() > 100, "the writer made progress");
    assert_eq!(
        fences, 0,
        "isolation fences in a healthy deployment: {after:?}"
    );
    let counted: u64 = after.iter().map(|(_, r)| r[3]).sum();
    assert!(
        counted > 0,
        "no pong was ever counted: the heartbeats did not run"
    );
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_replication_shard_under_load_is_never_fenced_and_forgeries_are_dropped() {
    let s = healthy(
        StageOptions::replication("hb-repl", 2),
        "healthy 1×3 replication shard under a writer (chart defaults), 30 s",
    )
    .await;
    // Forged datagrams: a ping with a made-up MAC, then a flood from one address.
    let primary = s.primary_and_replicas(0).unwrap().0;
    let target = s.agent(&primary).unwrap();
    let forged_before = s
        .agent_counter(&primary, &counter("dropped_mac"))
        .await
        .unwrap();
    let sock = UdpSocket::bind((s.kubelet.observer_ip(), 0)).unwrap();
    let mut forged = b"VSHB1 ping valkey valkey-0-9 1 1 1\n".to_vec();
    forged.extend([7u8; 32]);
    for _ in 0..10 {
        sock.send_to(&forged, target).unwrap();
    }
    // The flood paced at 1,000/s for half a second, so the kernel's buffer keeps what it sends.
    let format_before = s
        .agent_counter(&primary, &counter("dropped_format"))
        .await
        .unwrap();
    for _ in 0..500 {
        let _ = sock.send_to(b"flood", target);
        std::thread::sleep(Duration::from_millis(1));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mac = s
        .agent_counter(&primary, &counter("dropped_mac"))
        .await
        .unwrap();
    let rate = s
        .agent_counter(&primary, &counter("dropped_rate"))
        .await
        .unwrap();
    let admitted = s
        .agent_counter(&primary, &counter("dropped_format"))
        .await
        .unwrap()
        - format_before;
    println!(
        "forged: {} dropped for their MAC; flood of 500: {rate} dropped by the rate limit, {admitted} past it (then dropped as malformed)",
        mac - forged_before
    );
    assert_eq!(mac - forged_before, 10, "every forged ping was refused");
    // 50 a second with a burst of 50, less the forgeries' 10: about 65 in the flood's ~0.6 s.
    assert!(
        admitted <= 90,
        "one source held to its rate: {admitted} let through"
    );
    assert!(rate >= 300, "the rate limit dropped the rest: {rate}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_cluster_under_load_is_never_fenced() {
    healthy(
        StageOptions::cluster("hb-cluster", 3, 1),
        "healthy 3×2 cluster under a writer (chart defaults), 30 s",
    )
    .await;
}
