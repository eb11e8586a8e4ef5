//! An operator's CLI end to end (`valkey-sidecar switchover | pause | resume | status`, run with the
//! control plane's admin kubeconfig as a user would) against chart-rendered pods and real agents:
//! the Lease holder picks each request up from the coordinator Lease and answers it. And the
//! agents' record format: a coordinator Lease or shard record of a future format is not acted on,
//! and said so (metric, Event); one of the previous format (no annotation) is read as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use valkey_sidecar_testkit::faults::{self, Outcome, show};
use valkey_sidecar_testkit::k8s::writer::{Writer, Written};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, poll_until};

const SECOND: Duration = Duration::from_secs(1);

/// Runs the freshly built CLI against the stage with its admin kubeconfig.
fn cli(s: &Stage, args: &[&str]) -> Output {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_valkey-sidecar"))
        .args(args)
        .args(["--cluster", "valkey", "-n", &s.namespace])
        .env("KUBECONFIG", s.plane.kubeconfig_path())
        .output()
        .unwrap();
    println!(
        "valkey-sidecar {}: {:?}\n{}{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A switchover of `shard` under its writer, as the CLI makes it: what the writer saw, how long
/// the command took, the old primary and the one named (else the replica that took over).
async fn switchover_under_writer(
    s: &Stage,
    shard: usize,
    to: Option<&str>,
) -> (Written, Duration, String, String) {
    let (primary, replicas) = s.primary_and_replicas(shard).unwrap();
    let w = writer(s, shard);
    let tag = w.tag.clone();
    tokio::time::sleep(SECOND).await;
    let index = shard.to_string();
    let mut args = vec!["switchover", "--shard", index.as_str()];
    args.extend(to.iter().flat_map(|t| ["--to", *t]));
    let t = Instant::now();
    let out = cli(s, &args);
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    tokio::time::sleep(SECOND).await;
    let written = w.stop().unwrap();
    let new = replicas
        .into_iter()
        .find(|r| s.role(r).as_deref() == Some("master"))
        .expect("a replica became primary");
    if let Some(to) = to {
        assert_eq!(new, to, "the named pod became primary");
    }
    assert_eq!(s.role(&primary).as_deref(), Some("slave"));
    let lost = s.lost(&new, &tag, &written.acked).unwrap();
    println!(
        "switchover {primary} → {new}: CLI {took:?}; {} acknowledged, {lost} lost, longest pause {:?}",
        written.acked.len(),
        written.longest_pause
    );
    assert!(written.acked.len() > 100, "the writer made progress");
    assert_eq!(lost, 0, "acknowledged writes lost in a switchover");
    (written, took, primary, new)
}

/// A writer to the shard's primary: by slot in cluster mode, else to whichever pod is primary.
fn writer(s: &Stage, shard: usize) -> Writer {
    match s.shard_writer(shard) {
        Ok(w) => w,
        Err(_) => s.writer(s.pods.iter().map(|p| s.valkey(p).unwrap()).collect(), "w"),
    }
}

fn record(mode: &str, w: &Written, took: Duration) {
    let row = Outcome::new(
        module_path!(),
        &format!("`valkey-sidecar switchover` under a writer ({mode} mode)"),
    )
    .writes(w.acked.len(), 0)
    .recovery(w.longest_pause)
    .note(format!(
        "recovery: the longest write pause; the command returned after {} (the holder reads the \
         request with its next renewal, 2 s apart)",
        show(took)
    ));
    faults::record(&row);
}

/// How many agents report `valkey_sidecar_coordinator_leader 1`, and the sum of `sample`.
async fn sum(s: &Stage, sample: &str) -> u64 {
    let mut n = 0;
    for p in &s.pods {
        n += s.agent_counter(p, sample).await.unwrap_or(0);
    }
    n
}

async fn annotate(s: &Stage, object: &str, annotation: &str) {
    let ns = s.namespace.clone();
    let args = ["annotate", "-n", &ns, object, annotation, "--overwrite"];
    s.plane.kubectl(&args).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_switches_over_pauses_and_resumes_through_the_lease_holder() {
    let s = Stage::start(StageOptions::cluster("operate", 2, 1))
        .await
        .unwrap();
    s.wait_settled(4, 2, 120 * SECOND).await.unwrap();
    let holder = s.wait_coordinator(30 * SECOND).await.unwrap();
    println!("coordinator: {holder}");
    // A switchover to the best replica, lossless, through the holder.
    let (w, took, _, new) = switchover_under_writer(&s, 0, None).await;
    record("cluster", &w, took);
    let events = s.events().await.unwrap();
    assert!(events.contains("SwitchoverSucceeded"), "{events}");
    // Refused as unsafe: the named pod is the primary already (exit 75, one line why).
    let out = cli(&s, &["switchover", "--shard", "0", "--to", &new]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert!(text(&out).contains("is the primary of shard 0 already"));
    // Bad usage: 64.
    assert_eq!(cli(&s, &["switchover"]).status.code(), Some(64));
    paused_cordon_waits_until_resume(&s).await;
}

/// While paused, a cordon of a primary's node moves nothing; `resume` lets the hand-over happen.
async fn paused_cordon_waits_until_resume(s: &Stage) {
    let out = cli(s, &["pause", "--reason", "kernel upgrade"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("acknowledged"), "{}", text(&out));
    let paused = s.condition("Paused").await.unwrap().unwrap_or_default();
    assert!(paused.starts_with("True Requested: since "), "{paused}");
    assert!(paused.ends_with(": kernel upgrade"), "{paused}");
    assert_eq!(sum(s, "valkey_sidecar_coordinator_paused").await, 1);
    let status = cli(s, &["status"]);
    assert!(
        text(&status).contains("\npaused: since "),
        "{}",
        text(&status)
    );
    let (primary, _) = s.primary_and_replicas(1).unwrap();
    let node = s.node_of(&primary).await.unwrap();
    s.plane.kubectl(&["cordon", &node]).await.unwrap();
    tokio::time::sleep(8 * SECOND).await;
    assert_eq!(
        s.role(&primary).as_deref(),
        Some("master"),
        "a paused coordinator moved a primary for a cordon"
    );
    let out = cli(s, &["resume"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let resumed = Instant::now();
    poll_until(
        "the hand-over after resume",
        30 * SECOND,
        SECOND / 10,
        || async { Ok(s.role(&primary).as_deref() == Some("slave")) },
    )
    .await
    .unwrap();
    println!(
        "resume → the cordoned primary handed over after {:?}",
        resumed.elapsed()
    );
    assert_eq!(s.condition("Paused").await.unwrap(), None);
    assert_eq!(sum(s, "valkey_sidecar_coordinator_paused").await, 0);
    s.plane.kubectl(&["uncordon", &node]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_lease_of_a_future_format_is_not_acted_on_and_said_so() {
    let s = Stage::start(StageOptions::cluster("format", 1, 1))
        .await
        .unwrap();
    let before = s.wait_coordinator(30 * SECOND).await.unwrap();
    let lease = s.coordinator_lease().await.unwrap().unwrap();
    let format = |l: &Lease| {
        let a = l.metadata.annotations.clone().unwrap_or_default();
        a.get("valkey.io/format").cloned()
    };
    assert_eq!(
        format(&lease).as_deref(),
        Some("1"),
        "the agents write format 1"
    );
    // A newer agent's Lease: nobody renews or takes it over.
    annotate(&s, "lease/valkey-coordinator", "valkey.io/format=2").await;
    let newer = r#"valkey_sidecar_records_newer_format_total{kind="coordinator"}"#;
    poll_until("no agent leads", 30 * SECOND, SECOND / 4, || async {
        Ok(sum(&s, "valkey_sidecar_coordinator_leader").await == 0)
    })
    .await
    .unwrap();
    assert!(sum(&s, newer).await > 0, "the refusals are counted");
    let version = |l: &Lease| l.metadata.resource_version.clone();
    let frozen = version(&s.coordinator_lease().await.unwrap().unwrap());
    tokio::time::sleep(20 * SECOND).await;
    let after = s.coordinator_lease().await.unwrap().unwrap();
    assert_eq!(
        version(&after),
        frozen,
        "an agent wrote over a newer format"
    );
    assert_eq!(sum(&s, "valkey_sidecar_coordinator_leader").await, 0);
    let events = s.events().await.unwrap();
    assert!(events.contains("RecordFormatUnknown"), "{events}");
    assert!(events.contains("newer than this agent's 1"), "{events}");
    // The previous format (no annotation, as written before formats were numbered): read again.
    annotate(&s, "lease/valkey-coordinator", "valkey.io/format-").await;
    let t = Instant::now();
    let now = s.wait_coordinator(40 * SECOND).await.unwrap();
    poll_until("an agent leads again", 40 * SECOND, SECOND / 4, || async {
        Ok(sum(&s, "valkey_sidecar_coordinator_leader").await == 1)
    })
    .await
    .unwrap();
    let lease = s.coordinator_lease().await.unwrap().unwrap();
    println!("leading again after {:?}: {before} → {now}", t.elapsed());
    assert_eq!(format(&lease).as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_mode_switchover_and_a_shard_record_of_a_future_format() {
    let s = Stage::start(StageOptions::replication("operate-repl", 2))
        .await
        .unwrap();
    s.wait_settled(3, 1, 120 * SECOND).await.unwrap();
    s.wait_coordinator(30 * SECOND).await.unwrap();
    let (_, replicas) = s.primary_and_replicas(0).unwrap();
    let named = replicas.last().unwrap().clone();
    let (w, took, _, new) = switchover_under_writer(&s, 0, Some(&named)).await;
    record("replication", &w, took);
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    poll_until(
        "the record names the new primary",
        20 * SECOND,
        SECOND / 4,
        || async {
            let l = leases.get("valkey-0-primary").await?;
            Ok(l.spec.and_then(|s| s.holder_identity).as_deref() == Some(new.as_str()))
        },
    )
    .await
    .unwrap();
    // A record of a future format: no agent writes it, the refusal is counted and told.
    annotate(&s, "lease/valkey-0-primary", "valkey.io/format=2").await;
    let newer = r#"valkey_sidecar_records_newer_format_total{kind="shard"}"#;
    poll_until(
        "the refusal is counted",
        20 * SECOND,
        SECOND / 4,
        || async { Ok(sum(&s, newer).await > 0) },
    )
    .await
    .unwrap();
    let frozen = leases
        .get("valkey-0-primary")
        .await
        .unwrap()
        .metadata
        .resource_version;
    tokio::time::sleep(10 * SECOND).await;
    let after = leases.get("valkey-0-primary").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, frozen,
        "an agent wrote over a newer format"
    );
    let events = s.events().await.unwrap();
    assert!(events.contains("RecordFormatUnknown"), "{events}");
    // Back to a format the agents know: the shard has a writable primary again.
    annotate(&s, "lease/valkey-0-primary", "valkey.io/format=1").await;
    let t = Instant::now();
    s.wait_settled(3, 1, 60 * SECOND).await.unwrap();
    let w = writer(&s, 0);
    tokio::time::sleep(2 * SECOND).await;
    let written = w.stop().unwrap();
    println!(
        "known format again: settled after {:?}; {} writes acknowledged",
        t.elapsed(),
        written.acked.len()
    );
    assert!(written.acked.len() > 100, "the shard takes writes again");
}

/// `coordination: operator` beside valkey-operator's `ValkeyCluster` (its published CRD, as
/// `inject` targets it): while the resource is not Ready the coordinator makes no fail-back (the
/// operator may be moving primaries itself); once Ready for its generation, it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_an_operator_fail_back_waits_until_its_cluster_is_ready() {
    let o = StageOptions::cluster("operator", 1, 1)
        .env("SIDECAR_COORDINATION", "operator")
        .env("SIDECAR_FAILBACK", "true")
        .env("SIDECAR_QUIET_PERIOD", "2s")
        .env("SIDECAR_MOVE_COOLDOWN", "1s");
    let s = Stage::start(o).await.unwrap();
    s.wait_settled(2, 1, 120 * SECOND).await.unwrap();
    operator_resource(&s).await;
    s.wait_coordinator(30 * SECOND).await.unwrap();
    let (home, away) = ("valkey-0-0", "valkey-0-1");
    let zone = |l: std::collections::BTreeMap<String, String>| {
        l.get("topology.kubernetes.io/zone").cloned()
    };
    let zones = (
        zone(s.labels(home).await.unwrap()),
        zone(s.labels(away).await.unwrap()),
    );
    assert_ne!(zones.0, zones.1, "the chart spreads a shard over zones");
    poll_until(
        "the shard's primary at home",
        30 * SECOND,
        SECOND / 4,
        || async { Ok(s.role(home).as_deref() == Some("master")) },
    )
    .await
    .unwrap();
    let out = cli(&s, &["switchover", "--shard", "0", "--to", away]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    tokio::time::sleep(8 * SECOND).await;
    assert_eq!(
        s.role(away).as_deref(),
        Some("master"),
        "a fail-back while the operator is at work"
    );
    assert_eq!(sum(&s, "valkey_sidecar_coordinator_operator_busy").await, 1);
    let status = r#"{"status":{"conditions":[{"type":"Ready","status":"True","reason":"ClusterHealthy","message":"ok","lastTransitionTime":"2026-12-01T00:00:00Z","observedGeneration":1}]}}"#;
    let ns = s.namespace.clone();
    let patch = [
        "patch",
        "-n",
        &ns,
        "valkeycluster",
        "valkey",
        "--subresource=status",
        "--type=merge",
        "-p",
        status,
    ];
    s.plane.kubectl(&patch).await.unwrap();
    let ready = Instant::now();
    poll_until(
        "the fail-back once the operator is Ready",
        30 * SECOND,
        SECOND / 4,
        || async { Ok(s.role(home).as_deref() == Some("master")) },
    )
    .await
    .unwrap();
    println!(
        "operator Ready → fail-back home after {:?}",
        ready.elapsed()
    );
    assert_eq!(sum(&s, "valkey_sidecar_coordinator_operator_busy").await, 0);
}

/// valkey-operator's CRD, a `ValkeyCluster` named like the deployment, and the right to read it
/// for the agents' ServiceAccount (`inject` prints the same rule).
async fn operator_resource(s: &Stage) {
    let crd =
        valkey_sidecar_testkit::repo_root().join("tests/fixtures/inject/valkeycluster-crd.yaml");
    let crd = crd.display().to_string();
    s.plane.kubectl(&["create", "-f", &crd]).await.unwrap();
    let crd = "valkeyclusters.valkey.io";
    let within = Duration::from_secs(30);
    s.plane.wait_crd_established(crd, within).await.unwrap();
    let ns = s.namespace.clone();
    let role = [
        "create",
        "role",
        "-n",
        &ns,
        "read-valkeyclusters",
        "--verb=get,list,watch",
        "--resource=valkeyclusters.valkey.io",
    ];
    s.plane.kubectl(&role).await.unwrap();
    let sa = format!("--serviceaccount={ns}:valkey-sidecar");
    let binding = [
        "create",
        "rolebinding",
        "-n",
        &ns,
        "read-valkeyclusters",
        "--role=read-valkeyclusters",
        &sa,
    ];
    s.plane.kubectl(&binding).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("valkeycluster.yaml");
    let resource = "apiVersion: valkey.io/v1alpha1\nkind: ValkeyCluster\nmetadata:\n  name: valkey\nspec:\n  shards: 1\n  replicas: 1\n";
    std::fs::write(&path, resource).unwrap();
    let create = ["create", "-n", &ns, "-f", path.to_str().unwrap()];
    s.plane.kubectl(&create).await.unwrap();
}
