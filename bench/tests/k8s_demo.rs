//! The demo binary end to end (`demo --once`): control plane, nodes, six pods placed by the real
//! scheduler, a Valkey Cluster formed across the pod IPs, everything Ready, one table, teardown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;

use valkey_sidecar_testkit::k8s::{SIDECAR_BIN_ENV, sidecar_bin};

#[test]
fn demo_once_shows_three_shards_spread_over_zones() {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_demo"))
        .arg("--once")
        .env(SIDECAR_BIN_ENV, sidecar_bin().unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("demo --once took {:?}", started.elapsed());

    // NAME READY STATUS RESTARTS NODE ZONE IP ROLE SHARD-ID
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| l.starts_with("valkey-"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    // Ready: Valkey and the two native sidecars (the agent, valkey-settings).
    assert!(
        rows.iter().all(|r| r[1] == "3/3" && r[2] == "Running"),
        "{stdout}"
    );
    let role = |r: &Vec<&str>| r[7].trim_end_matches('*').to_owned();
    assert_eq!(rows.iter().filter(|r| role(r) == "primary").count(), 3);
    assert_eq!(rows.iter().filter(|r| role(r) == "replica").count(), 3);
    // Preferred anti-affinity: the scheduler put each shard's two pods in different zones.
    let mut zones: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in &rows {
        let shard = r[0].rsplit_once('-').unwrap().0;
        zones.entry(shard).or_default().push(r[5]);
    }
    assert!(
        zones.values().all(|z| z.len() == 2 && z[0] != z[1]),
        "{zones:?}"
    );
}
