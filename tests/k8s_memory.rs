//! Valkey under its memory limit, end to end: the chart's `nano` preset (256Mi requested and
//! limited) on a replication shard of a primary and a replica, the harness kubelet enforcing the
//! limit with a memory cgroup per container as a kubelet does. `maxmemory` is 75 % of the limit
//! the pod got (read through the downward API by the `valkey-config` init container); a writer
//! filling the primary gets `OOM command not allowed` once it is reached, nothing it was told was
//! written is lost, and no container is ever OOM-killed — not even while the replica copies the
//! full dataset again from scratch.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use valkey_sidecar_testkit::k8s::{MemoryUse, Stage, StageOptions};
use valkey_sidecar_testkit::resp::{Conn, Reply};

const SECOND: Duration = Duration::from_secs(1);
const LIMIT: u64 = 256 * 1024 * 1024;
/// The values written: large enough that the dataset, not the per-key overhead, fills the memory.
const VALUE_BYTES: usize = 4096;

/// What a fill got: the keys acknowledged, and how many writes were refused for memory.
struct Fill {
    acked: u64,
    refused: u64,
    first_refused_at: Option<u64>,
}

/// Writes `fill:<n>` from `n = from` (new keys only: an overwrite of the same size would not grow
/// the dataset) until `refusals` writes in a row were refused with Valkey's OOM error; `acked`
/// counts on from `from`.
fn fill(conn: &mut Conn, from: u64, refusals: u64) -> Fill {
    let value = "v".repeat(VALUE_BYTES);
    let mut f = Fill {
        acked: from,
        refused: 0,
        first_refused_at: None,
    };
    let mut in_a_row = 0;
    while in_a_row < refusals {
        let n = f.acked;
        match conn.cmd(&["SET", &format!("fill:{n}"), &value]).unwrap() {
            Reply::Error(e) if e.starts_with("OOM command not allowed") => {
                f.first_refused_at.get_or_insert(n);
                f.refused += 1;
                in_a_row += 1;
            }
            Reply::Error(e) => panic!("SET fill:{n}: {e}"),
            _ => {
                f.acked += 1;
                in_a_row = 0;
            }
        }
    }
    f
}

/// How many of `fill:0 .. fill:<acked>` `conn`'s Valkey holds (EXISTS, 1,000 keys at a time).
fn present(conn: &mut Conn, acked: u64) -> u64 {
    let mut found = 0;
    for start in (0..acked).step_by(1000) {
        let mut args = vec!["EXISTS".to_owned()];
        args.extend((start..acked.min(start + 1000)).map(|n| format!("fill:{n}")));
        found += conn.call(&args).unwrap().int().unwrap() as u64;
    }
    found
}

fn info_field(conn: &mut Conn, section: &str, field: &str) -> String {
    let info = conn.call(&["INFO", section]).unwrap().text().unwrap();
    let prefix = format!("{field}:");
    let line = info.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
    line.unwrap_or_else(|| panic!("INFO {section} without {field}"))
        .trim()
        .to_owned()
}

/// Waits until the replica has everything the primary acknowledged.
async fn wait_in_sync(primary: &mut Conn, replica: &mut Conn) {
    let start = Instant::now();
    loop {
        let want = info_field(primary, "replication", "master_repl_offset");
        let link = info_field(replica, "replication", "master_link_status");
        let have = info_field(replica, "replication", "slave_repl_offset");
        if link == "up" && want == have {
            return;
        }
        assert!(
            start.elapsed() < 60 * SECOND,
            "replica not in sync: {have} of {want}"
        );
        tokio::time::sleep(SECOND / 10).await;
    }
}

fn memory(stage: &Stage, pod: &str) -> MemoryUse {
    stage
        .kubelet
        .memory_use(&stage.namespace, pod, "valkey")
        .unwrap()
}

/// The Valkey container's restarts, and why its last run ended (`OOMKilled` for the kernel).
async fn restarts(stage: &Stage, pod: &str) -> (i32, Option<String>) {
    let object = stage.api().get(pod).await.unwrap();
    let statuses = object.status.unwrap().container_statuses.unwrap();
    let valkey = statuses.into_iter().find(|c| c.name == "valkey").unwrap();
    let last = valkey.last_state.and_then(|s| s.terminated);
    (
        valkey.restart_count,
        last.map(|t| t.reason.unwrap_or_default()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_valkey_refuses_writes_at_maxmemory_loses_nothing_and_is_never_oom_killed() {
    let opts = StageOptions::replication("memory", 1).set("valkey.resourcesPreset=nano");
    let stage = Stage::install(opts).await.unwrap();
    stage.wait_settled(2, 1, 120 * SECOND).await.unwrap();
    let (primary, replica) = stage.primary_and_replica(0).unwrap();
    let mut p = Conn::connect(stage.valkey(&primary).unwrap(), &stage.client()).unwrap();
    let mut r = Conn::connect(stage.valkey(&replica).unwrap(), &stage.client()).unwrap();
    // 75 % of the limit the pods got, on both.
    for conn in [&mut p, &mut r] {
        let max = conn.call(&["CONFIG", "GET", "maxmemory"]).unwrap();
        let max = max.as_array().unwrap()[1].text().unwrap();
        assert_eq!(max, (LIMIT * 75 / 100).to_string());
    }

    let start = Instant::now();
    let filled = fill(&mut p, 0, 500);
    println!(
        "filled: {} acknowledged ({} MiB of values) in {:?}, {} refused, the first at {:?}",
        filled.acked,
        (filled.acked * VALUE_BYTES as u64) >> 20,
        start.elapsed(),
        filled.refused,
        filled.first_refused_at,
    );
    assert!(
        filled.acked * (VALUE_BYTES as u64) > LIMIT / 2,
        "refused too early"
    );
    let used: u64 = info_field(&mut p, "memory", "used_memory").parse().unwrap();
    assert!(used <= LIMIT * 75 / 100 + (1 << 20), "used_memory {used}");

    // Nothing acknowledged is lost, on the primary and on its replica.
    wait_in_sync(&mut p, &mut r).await;
    assert_eq!(present(&mut p, filled.acked), filled.acked);
    assert_eq!(present(&mut r, filled.acked), filled.acked);

    // The replica copies the full dataset again from scratch (its Valkey killed, restarted by
    // the kubelet empty): a fork on the primary, a load on the replica, both at the limit.
    stage.signal_container(&replica, "valkey", "KILL").unwrap();
    let start = Instant::now();
    let mut r = loop {
        tokio::time::sleep(SECOND / 2).await;
        assert!(
            start.elapsed() < 120 * SECOND,
            "the replica did not come back"
        );
        let Ok(mut conn) = Conn::connect(stage.valkey(&replica).unwrap(), &stage.client()) else {
            continue;
        };
        let link = conn
            .call(&["INFO", "replication"])
            .ok()
            .and_then(|i| i.text());
        if link.is_some_and(|i| i.contains("master_link_status:up")) {
            break conn;
        }
    };
    wait_in_sync(&mut p, &mut r).await;
    println!("resynced in {:?}", start.elapsed());
    assert_eq!(present(&mut r, filled.acked), filled.acked);
    // Still full: a few writes may fit where buffers were freed, no more.
    let more = fill(&mut p, filled.acked, 50);
    let extra = more.acked - filled.acked;
    assert!(extra < 64, "{extra} writes accepted past maxmemory");

    for pod in [&primary, &replica] {
        let m = memory(&stage, pod);
        println!(
            "{pod}: peak {} MiB of a {} MiB limit, OOM kills {}",
            m.peak >> 20,
            m.limit.map_or(0, |l| l >> 20),
            m.oom_kills
        );
        assert_eq!(m.oom_kills, 0, "{pod}: {m:?}");
        if let Some(limit) = m.limit {
            assert_eq!(limit, LIMIT, "{pod}");
        }
        assert!(m.peak < LIMIT, "{pod}: {m:?}");
    }
    assert_eq!(restarts(&stage, &primary).await, (0, None));
    // The replica's one restart is the kill above, not the kernel's.
    let (count, reason) = restarts(&stage, &replica).await;
    assert_eq!((count, reason.as_deref()), (1, Some("Error")));
}
