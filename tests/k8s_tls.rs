//! A TLS-only install end to end (issue 32): the chart with `tls.enabled` (the plain port closed,
//! `tls-replication`, `tls-cluster`, clients' certificates required), Valkey 8.0.1 built with TLS
//! (the harness runs it for the image tag `8.0.1`), the agents with their own client
//! certificate, the Secrets holding what cert-manager's `Certificate`s would (the chart's names:
//! every client Service, every pod under the headless Service). In both modes: formation and
//! labels, a hand-over on cordon, a crash failover and a drain, under TLS writers that verify the
//! client Service's name in Valkey's certificate, nothing acknowledged lost (a crash only the
//! stream its replica had not received). And a rotation of both certificates and the CA under
//! writers (`valkey-settings` makes Valkey 8.0 read its files again).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use valkey_sidecar_testkit::TlsCerts;
use valkey_sidecar_testkit::k8s::follow::{Addresses, Watcher, stop_writers, writers};
use valkey_sidecar_testkit::k8s::writer::{missing, targets};
use valkey_sidecar_testkit::k8s::{ROLE_LABEL, Stage, StageOptions, http_get, poll_until};
use valkey_sidecar_testkit::resp::Conn;
use valkey_sidecar_testkit::tls_client::TlsClient;

const SECOND: Duration = Duration::from_secs(1);

/// The names the chart's Valkey `Certificate` gives (templates/certificates.yaml).
fn names(cluster: &str, ns: &str) -> Vec<String> {
    let mut names = Vec::new();
    for suffix in ["svc", "svc.cluster.local"] {
        names.push(format!("{cluster}.{ns}.{suffix}"));
        names.push(format!("{cluster}-read.{ns}.{suffix}"));
        names.push(format!("*.{cluster}-headless.{ns}.{suffix}"));
    }
    names.push("localhost".into());
    names
}

/// A `kubernetes.io/tls` Secret of `cert`, `key` and the CA.
fn secret(name: &str, dir: &Path, cert: &str, key: &str) -> Value {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": name },
        "type": "kubernetes.io/tls",
        "stringData": { "tls.crt": read(cert), "tls.key": read(key), "ca.crt": read("ca.crt") },
    })
}

/// `o` with TLS only: the Secrets, the chart's TLS values, Valkey 8.0.1, and the harness's
/// clients presenting the client certificate.
fn tls(mut o: StageOptions, certs_dir: &Path) -> StageOptions {
    let certs = TlsCerts::generate_for(certs_dir, &names(&o.release, &o.namespace)).unwrap();
    let dir = certs.dir();
    o.objects
        .push(secret("valkey-tls", dir, "server.crt", "server.key"));
    o.objects
        .push(secret("valkey-agent-tls", dir, "client.crt", "client.key"));
    for set in [
        "tls.enabled=true",
        "tls.existingSecret=valkey-tls",
        "tls.authClients=yes",
        "tls.agentExistingSecret=valkey-agent-tls",
        "tls.autoReloadInterval=0",
        "valkey.image.tag=8.0.1",
    ] {
        o = o.set(set);
    }
    let client = (certs.client_cert(), certs.client_key());
    let client = Some((client.0.as_path(), client.1.as_path()));
    o.tls = Some(TlsClient::new(&certs.ca_file(), client, "localhost").unwrap());
    o
}

async fn cordon(s: &Stage, node: &str, on: bool) {
    let nodes: Api<Node> = Api::all(s.plane.client());
    let patch = json!({ "spec": { "unschedulable": on } });
    let params = PatchParams::default();
    nodes
        .patch(node, &params, &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Until `pod` is labelled with role `role`.
async fn labelled(s: &Stage, pod: &str, role: &str) {
    let what = format!("{pod} labelled {role}");
    poll_until(&what, 60 * SECOND, SECOND / 20, || async {
        Ok(s.labels(pod).await?.get(ROLE_LABEL).map(String::as_str) == Some(role))
    })
    .await
    .unwrap();
}

/// Every pod Ready and labelled, one primary per shard, replicas synced.
async fn settled(s: &Stage) {
    let shards = s.pods.len() / s.members.max(1);
    s.wait_settled(s.pods.len(), shards, 180 * SECOND)
        .await
        .unwrap();
    s.wait_synced(120 * SECOND).await.unwrap();
    s.wait_labels_true(60 * SECOND).await.unwrap();
}

/// Shard 0's primary handed over when its node is cordoned.
async fn hand_over_on_cordon(s: &Stage) {
    let (primary, _) = s.primary_and_replicas(0).unwrap();
    let node = s.node_of(&primary).await.unwrap();
    cordon(s, &node, true).await;
    labelled(s, &primary, "replica").await;
    cordon(s, &node, false).await;
    settled(s).await;
}

/// Shard 0's primary's Valkey killed under a TLS writer; another member takes over, and only
/// what the replica had not received when it died is lost.
async fn crash(s: &Stage, cluster: bool) {
    const TAIL: Duration = Duration::from_millis(500);
    let (primary, _) = s.primary_and_replicas(0).unwrap();
    let writer = match cluster {
        true => s.shard_writer(0).unwrap(),
        // One shard: every pod's address (a crash restarts the container, the pod keeps its IP).
        false => {
            let addrs = s.pods.iter().map(|p| s.valkey(p).unwrap()).collect();
            s.writer_with(targets(addrs), "crash", s.client())
        }
    };
    let tag = writer.tag.clone();
    tokio::time::sleep(SECOND).await;
    let killed = Instant::now();
    s.kubelet
        .crash_container(&s.namespace, &primary, "valkey")
        .unwrap();
    poll_until(
        "another member primary",
        60 * SECOND,
        SECOND / 50,
        || async { Ok(s.primary_and_replicas(0).is_ok_and(|(p, _)| p != primary)) },
    )
    .await
    .unwrap();
    settled(s).await;
    let w = writer.stop().unwrap();
    let (now, _) = s.primary_and_replicas(0).unwrap();
    let lost = missing(s.valkey(&now).unwrap(), &s.client(), &tag, &w.acked).unwrap();
    println!(
        "crash of {primary}: {} acknowledged over TLS, {} lost",
        w.acked.len(),
        lost.len()
    );
    assert_eq!(w.auth_failures, 0, "{w:?}");
    w.only_tail_lost(&lost, killed, TAIL).unwrap();
}

/// The node of shard 0's primary drained, then uncordoned.
async fn drain(s: &Stage) {
    let (primary, _) = s.primary_and_replicas(0).unwrap();
    let node = s.node_of(&primary).await.unwrap();
    let drained = s.drain(&node, 300 * SECOND).await;
    assert!(drained.is_ok(), "kubectl drain {node}: {drained:?}");
    s.plane.kubectl(&["uncordon", &node]).await.unwrap();
    settled(s).await;
    // How each evicted pod's wait ended: a primary's is its hand-over (HTTP 200), or a timeout.
    for h in s.kubelet.hook_runs() {
        if h.namespace == s.namespace && h.hook == "preStop" && h.container == "valkey" {
            println!("preStop {}: {:?} after {:?}", h.pod, h.result, h.took);
        }
    }
}

/// A hand-over and a drain under a TLS writer per shard, every acknowledged write read back
/// over TLS; then a crash.
async fn moves_lose_nothing(s: Stage, cluster: bool) {
    settled(&s).await;
    let pods = s.pod_objects().await.unwrap();
    let addresses = Addresses::new(&pods);
    let watcher = Watcher::start(&s, addresses.clone());
    let app = writers(&s, &pods, &addresses, cluster).unwrap();
    tokio::time::sleep(SECOND).await;
    hand_over_on_cordon(&s).await;
    drain(&s).await;
    drop(watcher.stop());
    for w in stop_writers(&s, app).await.unwrap() {
        println!("TLS writer through a hand-over and a drain: {w:?}");
        assert!(w.acked > 0, "{w:?}");
        assert_eq!((w.lost, w.auth_failures), (0, 0), "{w:?}");
    }
    crash(&s, cluster).await;
}

/// A Python with valkey-py: `$VALKEY_PY` (scripts/test.sh sets it), else from the script.
fn valkey_py() -> String {
    if let Ok(path) = std::env::var("VALKEY_PY") {
        return path;
    }
    let out = Command::new("scripts/valkey-py.sh")
        .current_dir(valkey_sidecar_testkit::repo_root())
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/valkey-py.sh: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// valkey-py's cluster client, TLS with hostname verification, from one pod's hostname through
/// the cluster's topology and redirects to every primary (tests/fixtures/tls_cluster_client.py).
fn real_cluster_client(s: &Stage, pods: &[k8s_openapi::api::core::v1::Pod], dir: &Path) {
    let host = |pod: &str| format!("{pod}.{}-headless.{}.svc", s.cluster, s.namespace);
    let hosts: serde_json::Map<String, Value> = pods
        .iter()
        .filter_map(|p| {
            let name = p.metadata.name.as_deref()?;
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            Some((host(name), Value::String(ip)))
        })
        .collect();
    let script = valkey_sidecar_testkit::repo_root().join("tests/fixtures/tls_cluster_client.py");
    let file = |f: &str| dir.join(f).display().to_string();
    let password = s.password.clone().unwrap_or_default();
    let (ca, cert, key) = (file("ca.crt"), file("client.crt"), file("client.key"));
    let seed = host(&s.pods[0]);
    let args = [seed.as_str(), "6379", &ca, &cert, &key, &password, "300"];
    let out = Command::new(valkey_py())
        .arg(&script)
        .args(args)
        .env("HOSTS", Value::Object(hosts).to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "valkey-py: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("valkey-py cluster client over TLS: {text}");
    let seen: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(
        (seen["written"].as_u64(), seen["read"].as_u64()),
        (Some(300), Some(300))
    );
    let dialled = seen["dialled"].as_array().unwrap();
    assert!(
        dialled.len() >= 3,
        "one primary per shard dialled by name: {seen}"
    );
    assert_eq!(
        seen["ip_refused"],
        Value::Bool(true),
        "an IP it does not name verified: {seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_cluster_forms_labels_and_moves_its_primaries_under_tls_writers() {
    let certs = tempfile::tempdir().unwrap();
    let o = tls(StageOptions::cluster("tls-cluster", 3, 1), certs.path());
    let s = Stage::start(o).await.unwrap();
    settled(&s).await;
    let pods = s.pod_objects().await.unwrap();
    real_cluster_client(&s, &pods, certs.path());
    moves_lose_nothing(s, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_replication_shard_moves_its_primary_under_a_tls_writer() {
    let certs = tempfile::tempdir().unwrap();
    let o = tls(StageOptions::replication("tls-repl", 2), certs.path());
    let s = Stage::start(o).await.unwrap();
    moves_lose_nothing(s, false).await;
}

/// `documents` as one file, applied server-side in dry-run with strict field validation.
async fn dry_run(
    plane: &valkey_sidecar_testkit::k8s::ControlPlane,
    dir: &Path,
    documents: &[String],
) -> valkey_sidecar_testkit::Result<String> {
    let file = dir.join("certificates.yaml");
    std::fs::write(&file, documents.join("\n---\n"))?;
    let file = file.display().to_string();
    let args = [
        "apply",
        "--server-side",
        "--dry-run=server",
        "--validate=strict",
    ];
    plane
        .kubectl(&[&args[..], &["-n", "certs", "-f", &file]].concat())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_certificates_pass_the_apiserver_against_cert_managers_schema() {
    use valkey_sidecar_testkit::k8s::chart::{documents, kind_of, render};
    use valkey_sidecar_testkit::k8s::{ControlPlane, ControlPlaneOptions};
    let plane = ControlPlane::start(ControlPlaneOptions::apiserver_only())
        .await
        .unwrap();
    let crd = valkey_sidecar_testkit::repo_root()
        .join("tests/fixtures/cert-manager/certificates-crd.yaml");
    let crd = crd.display().to_string();
    plane
        .kubectl(&["apply", "--server-side", "-f", &crd])
        .await
        .unwrap();
    let crd = "certificates.cert-manager.io";
    let within = Duration::from_secs(60);
    plane.wait_crd_established(crd, within).await.unwrap();
    plane
        .kubectl(&["create", "namespace", "certs"])
        .await
        .unwrap();
    let sets: Vec<String> = [
        "tls.enabled=true",
        "tls.certManager.enabled=true",
        "tls.certManager.issuerRef.name=valkey-ca",
        "tls.authClients=yes",
    ]
    .map(String::from)
    .to_vec();
    let rendered = render("valkey", "certs", &[], &sets).unwrap();
    let certs: Vec<String> = documents(&rendered)
        .into_iter()
        .filter(|d| kind_of(d) == Some("Certificate"))
        .map(str::to_owned)
        .collect();
    assert_eq!(certs.len(), 2, "Valkey's and the agent's");
    let dir = tempfile::tempdir().unwrap();
    let out = dry_run(&plane, dir.path(), &certs).await.unwrap();
    println!("{out}");
    // The schema has teeth: a usage cert-manager does not know, and a field it does not have.
    let usage = certs[0].replace("server auth", "server-auth");
    let refused = dry_run(&plane, dir.path(), &[usage]).await;
    assert!(refused.is_err_and(|e| format!("{e:#}").contains("usages")));
    let field = certs[0].replace("  duration:", "  lifetime:");
    let refused = dry_run(&plane, dir.path(), &[field]).await;
    assert!(refused.is_err_and(|e| format!("{e:#}").contains("lifetime")));
}

/// Both Secrets rewritten with Valkey's and the agent's certificate from `leaf` and the CA file
/// `ca` (a bundle during the overlap), as cert-manager renews them.
async fn put_certificates(s: &Stage, leaf: &Path, ca: &Path) {
    let api: Api<Secret> = Api::namespaced(s.plane.client(), &s.namespace);
    let read = |f: &Path| std::fs::read_to_string(f).unwrap();
    for (name, cert, key) in [
        ("valkey-tls", "server.crt", "server.key"),
        ("valkey-agent-tls", "client.crt", "client.key"),
    ] {
        let data = json!({ "stringData": {
            "tls.crt": read(&leaf.join(cert)),
            "tls.key": read(&leaf.join(key)),
            "ca.crt": read(ca),
        }});
        let patch = Patch::Merge(data);
        api.patch(name, &PatchParams::default(), &patch)
            .await
            .unwrap();
    }
}

/// `pod`'s name under the headless Service (what its certificate names).
fn host(s: &Stage, pod: &str) -> String {
    format!("{pod}.{}-headless.{}.svc", s.cluster, s.namespace)
}

/// Whether `pod`'s Valkey answers `PING` to a client trusting and presenting what `tls` does.
fn pings(s: &Stage, pod: &str, tls: &TlsClient) -> bool {
    let mut client = s.client();
    client.tls = Some(tls.named(&host(s, pod)));
    let addr = s.valkey(pod).unwrap();
    Conn::connect(addr, &client)
        .and_then(|mut c| c.cmd(&["PING"]))
        .is_ok_and(|r| !r.is_error())
}

/// Whether `pod`'s client port and cluster bus both present the certificate `der`.
fn serves(s: &Stage, pod: &str, tls: &TlsClient, der: &[u8]) -> bool {
    let client = s.valkey(pod).unwrap();
    let bus = std::net::SocketAddr::new(client.ip(), client.port() + 10_000);
    let named = tls.named(&host(s, pod));
    [client, bus]
        .iter()
        .all(|a| named.leaf_at(*a, SECOND).is_ok_and(|leaf| leaf == der))
}

/// The highest client id each pod's Valkey has handed out so far: a connection with a higher id
/// was made later.
fn client_ids(s: &Stage) -> BTreeMap<String, u64> {
    let id = |p: &String| match s.cmd(p, &["CLIENT", "ID"]) {
        Ok(redis::Value::Int(n)) => u64::try_from(n).unwrap(),
        other => panic!("CLIENT ID on {p}: {other:?}"),
    };
    s.pods.iter().map(|p| (p.clone(), id(p))).collect()
}

/// Whether every connection of the agents' Valkey user was made after `marks` (and there is
/// one on every pod): the agents moved to the rotated files.
fn agents_redialled(s: &Stage, marks: &BTreeMap<String, u64>) -> bool {
    s.pods.iter().all(|p| {
        let Ok(redis::Value::BulkString(list)) = s.cmd(p, &["CLIENT", "LIST"]) else {
            return false;
        };
        let list = String::from_utf8_lossy(&list);
        let ids: Vec<u64> = list
            .lines()
            .filter(|l| l.split(' ').any(|f| f == "user=valkey-sidecar"))
            .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
            .filter_map(|id| id.parse().ok())
            .collect();
        !ids.is_empty() && ids.iter().all(|id| *id > marks[p])
    })
}

/// How long from `start` until `ok` holds for every pod (checked every 100 ms, off the runtime's
/// threads).
async fn until_every_pod(
    what: &str,
    s: &Arc<Stage>,
    start: Instant,
    ok: impl Fn(&Stage, &str) -> bool + Send + Sync + Clone + 'static,
) -> Duration {
    poll_until(what, 60 * SECOND, SECOND / 10, || {
        let (s, ok) = (s.clone(), ok.clone());
        async move {
            let all = tokio::task::spawn_blocking(move || s.pods.iter().all(|p| ok(&s, p)));
            Ok(all.await?)
        }
    })
    .await
    .unwrap();
    start.elapsed()
}

/// Every pod's `/readyz` asked every 200 ms with the kubelet's 1 s timeout until stopped:
/// (probes, failures).
fn watch_probes(
    s: Arc<Stage>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, Vec<String>)> {
    tokio::spawn(async move {
        let (mut probes, mut failed) = (0, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            for p in &s.pods {
                probes += 1;
                match http_get(s.agent(p).unwrap(), "/readyz", SECOND).await {
                    Ok((200, _)) => {}
                    other => failed.push(format!("{p}: {other:?}")),
                }
            }
            tokio::time::sleep(SECOND / 5).await;
        }
        (probes, failed)
    })
}

/// The primary of every shard, by pod.
fn primaries(s: &Stage) -> Vec<String> {
    let shards = s.pods.len() / s.members.max(1);
    (0..shards)
        .map(|i| s.primary_and_replicas(i).unwrap().0)
        .collect()
}

/// Certificate rotation under load on Valkey 8.0.1 (no `tls-auto-reload-interval`): both
/// Secrets rewritten three times while a TLS writer per shard runs, the harness's kubelet
/// syncing Secret volumes every 2 s (a real one: about a minute). First the CA file becomes a
/// bundle of the old and a new CA; then Valkey's and the agent's certificates are replaced by
/// ones from the new CA (the applications switch their client certificate too); then the old CA
/// is dropped. After each step the time until every path uses the new files is measured:
/// Valkey's client port and cluster bus (the certificate presented, the CA a client is judged
/// by: the `valkey-settings` container's `CONFIG SET`), and the agents' connections (all made
/// after the change). Then every replica's link to its primary is cut and must come back under
/// the new CA alone. Nothing acknowledged lost, no probe failed, no failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_and_the_ca_rotate_under_writers_with_nothing_lost_and_no_failover() {
    let (old_dir, new_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut o = tls(StageOptions::cluster("tls-rotate", 3, 1), old_dir.path());
    o.kubelet.volume_refresh = 2 * SECOND;
    let (old, new) = (old_dir.path(), new_dir.path());
    TlsCerts::generate_for(new, &names(&o.release, &o.namespace)).unwrap();
    let bundle = old.join("bundle.crt");
    let cas = [old.join("ca.crt"), new.join("ca.crt")].map(|f| std::fs::read_to_string(f).unwrap());
    std::fs::write(&bundle, cas.concat()).unwrap();
    let client_of = |dir: &Path| {
        let (c, k) = (dir.join("client.crt"), dir.join("client.key"));
        TlsClient::new(&bundle, Some((&c, &k)), "localhost").unwrap()
    };
    let (with_old, with_new) = (client_of(old), client_of(new));
    // The applications' client (the harness's checks and writers): trusts both CAs throughout.
    // Its own (a `named` one would share `with_old`'s certificate, and switch it too).
    let apps = client_of(old);
    o.tls = Some(apps.clone());
    let s = Arc::new(Stage::start(o).await.unwrap());
    settled(&s).await;
    let before = primaries(&s);
    let pods = s.pod_objects().await.unwrap();
    let addresses = Addresses::new(&pods);
    let watcher = Watcher::start(&s, addresses.clone());
    let app = writers(&s, &pods, &addresses, true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let probes = watch_probes(s.clone(), stop.clone());
    tokio::time::sleep(SECOND).await;

    // 1. The CA file becomes old + new: Valkey accepts clients of the new CA.
    let marks = client_ids(&s);
    let updated = Instant::now();
    put_certificates(&s, old, &bundle).await;
    let trusted = until_every_pod("the new CA trusted", &s, updated, {
        let with_new = with_new.clone();
        move |s, p| pings(s, p, &with_new)
    })
    .await;
    let agents_1 = until_every_pod("agents on the bundle", &s, updated, move |s, _| {
        agents_redialled(s, &marks)
    })
    .await;

    // 2. New certificates from the new CA; the applications present theirs.
    let (new_cert, new_key) = (new.join("client.crt"), new.join("client.key"));
    apps.reload(&bundle, Some((&new_cert, &new_key))).unwrap();
    let marks = client_ids(&s);
    let updated = Instant::now();
    put_certificates(&s, new, &bundle).await;
    let leaf = valkey_sidecar_testkit::cert_der(&new.join("server.crt")).unwrap();
    let served = until_every_pod("the new certificate served on both ports", &s, updated, {
        let with_new = with_new.clone();
        move |s, p| serves(s, p, &with_new, &leaf)
    })
    .await;
    let agents_2 = until_every_pod(
        "agents on their new certificate",
        &s,
        updated,
        move |s, _| agents_redialled(s, &marks),
    )
    .await;

    // 3. The old CA dropped: its clients are refused, the new ones served.
    let marks = client_ids(&s);
    let updated = Instant::now();
    put_certificates(&s, new, &new.join("ca.crt")).await;
    let dropped = until_every_pod("the old CA no longer trusted", &s, updated, {
        let (with_old, with_new) = (with_old.clone(), with_new.clone());
        move |s, p| !pings(s, p, &with_old) && pings(s, p, &with_new)
    })
    .await;
    let agents_3 = until_every_pod("agents on the new CA", &s, updated, move |s, _| {
        agents_redialled(s, &marks)
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let (asked, failed) = probes.await.unwrap();

    // Replication under the new CA alone: every replica's link cut, then up again.
    let cut = Instant::now();
    for p in &s.pods {
        if s.role(p).as_deref() == Some("slave") {
            s.cmd(p, &["CLIENT", "KILL", "TYPE", "master"]).unwrap();
        }
    }
    tokio::time::sleep(SECOND / 10).await;
    s.wait_synced(60 * SECOND).await.unwrap();
    let relinked = cut.elapsed();
    settled(&s).await;
    drop(watcher.stop());
    let written = stop_writers(&s, app).await.unwrap();
    println!(
        "rotation under writers, from each Secret update: CA bundle trusted by every Valkey in \
         {trusted:?} (every agent redialled {agents_1:?}); new certificate on every client port \
         and bus in {served:?} (agents {agents_2:?}); old CA refused everywhere in {dropped:?} \
         (agents {agents_3:?}); replicas relinked under the new CA alone in {relinked:?}; \
         {asked} readiness probes, {} failed; volume sync every 2 s",
        failed.len()
    );
    let peak = |container: &str| {
        let peaks = s
            .pods
            .iter()
            .filter_map(|p| s.kubelet.memory_use(&s.namespace, p, container));
        peaks.map(|m| m.peak).max().unwrap_or_default() / 1024
    };
    println!(
        "peak resident memory: valkey-settings {} KiB, agent {} KiB",
        peak("valkey-settings"),
        peak("valkey-sidecar")
    );
    for w in &written {
        println!("TLS writer through the rotation: {w:?}");
        assert!(w.acked > 0, "{w:?}");
        assert_eq!((w.lost, w.auth_failures), (0, 0), "{w:?}");
    }
    assert!(failed.is_empty(), "failed probes: {failed:?}");
    assert_eq!(primaries(&s), before, "no failover");
}
