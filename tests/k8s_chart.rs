//! The Helm chart installed end to end: rendered by the real `helm` from the examples, applied to a
//! real control plane, the pods created by kube-controller-manager from the per-shard
//! StatefulSets, bound by kube-scheduler to six fake nodes over three zones, and run by the
//! harness kubelet (Valkey and this crate's agent as a native sidecar, with the chart's ACL user,
//! Secrets and probes).
//!
//! Pod IPs are loopback addresses here, which EndpointSlices may not hold: the client Service is
//! checked through its selector and through the endpoints kube-controller-manager's
//! EndpointSlice controller tried to write ([`Stage::attempted_endpoints`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, EvictParams, PostParams};
use valkey_sidecar_testkit::faults::{self, Outcome, show};
use valkey_sidecar_testkit::k8s::chart::{cmd, label, node_of, role, shards, text};
use valkey_sidecar_testkit::k8s::follow::{Addresses, Watcher, stop_writers, writers};
use valkey_sidecar_testkit::k8s::valkey::valkey_addr;
use valkey_sidecar_testkit::k8s::{
    Stage, StageOptions, holder_pod, http_get, pod_is_ready, poll_until,
};
use valkey_sidecar_testkit::redis;
use valkey_sidecar_testkit::resp::ClientOptions;

const SECOND: Duration = Duration::from_secs(1);
const ROLE: &str = "valkey.io/role";
const PASSWORD: &str = "test-default-password";

/// The chart with `examples/<name>.yaml` (and the Secret it names, `PASSWORD` for the default
/// user).
fn options(example_name: &str) -> StageOptions {
    StageOptions::example("valkey", example_name)
}

/// Whether the apiserver serves MutatingAdmissionPolicy v1 (Kubernetes >= 1.36), which the
/// chart's node-index policy needs.
async fn serves_mutating_policies(stage: &Stage) -> bool {
    let version = stage.plane.client().apiserver_version().await.unwrap();
    version.minor.parse::<u32>().unwrap() >= 36
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap()
}

fn ip(pod: &Pod) -> String {
    pod.status.as_ref().unwrap().pod_ip.clone().unwrap()
}

fn with_role<'a>(pods: &'a [Pod], want: &str) -> Vec<&'a Pod> {
    pods.iter()
        .filter(|p| label(p, ROLE) == Some(want))
        .collect()
}

/// Valkey's own word on its role, as the default user.
async fn valkey_role(addr: SocketAddr, password: &str) -> String {
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || role(addr, Some(&password)))
        .await
        .unwrap()
        .unwrap_or_else(|e| format!("{e:#}"))
}

/// Nothing the agents sent was refused by their ACL user: `ACL LOG` is empty on every Ready pod.
async fn check_acl_log(stage: &Stage, password: &str) {
    for pod in stage.pod_objects().await.unwrap() {
        let live = pod_is_ready(&pod) && pod.metadata.deletion_timestamp.is_none();
        let Some(addr) = valkey_addr(&pod).filter(|_| live) else {
            continue;
        };
        let password = password.to_owned();
        let log = tokio::task::spawn_blocking(move || cmd(addr, Some(&password), &["ACL", "LOG"]))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            log,
            redis::Value::Array(vec![]),
            "ACL LOG of {}",
            name(&pod)
        );
    }
}

/// Waits until the pods carry `primaries` primary and `replicas` replica labels and all are
/// Ready; returns them.
async fn wait_roles(stage: &Stage, primaries: usize, replicas: usize) -> Vec<Pod> {
    let want = format!("{primaries} primaries and {replicas} replicas labelled, all Ready");
    let waited = poll_until(&want, 60 * SECOND, Duration::from_millis(200), || async {
        let pods = stage.pod_objects().await?;
        Ok(pods.len() == primaries + replicas
            && with_role(&pods, "primary").len() == primaries
            && with_role(&pods, "replica").len() == replicas
            && pods
                .iter()
                .all(|p| pod_is_ready(p) && p.metadata.deletion_timestamp.is_none())
            && one_shard_id_per_shard(&pods))
    })
    .await;
    if let Err(e) = waited {
        panic!("{e:#}\n{}", stage.describe().await);
    }
    stage.pod_objects().await.unwrap()
}

/// Every shard's pods carry the same `valkey.io/shard-id` (or none). A replica just made one by
/// `CLUSTER REPLICATE` can report its role before its new shard id, so its labels settle on the
/// agent's next tick: formation is labelled when the shard ids agree too.
fn one_shard_id_per_shard(pods: &[Pod]) -> bool {
    shards(pods).values().all(|members| {
        let ids: BTreeSet<Option<&str>> = members
            .iter()
            .map(|p| label(p, "valkey.io/shard-id"))
            .collect();
        ids.len() == 1
    })
}

/// Polls `probe` until it gives a value; on timeout the namespace's events and the pods are
/// printed.
async fn until_or_dump<T, F, Fut>(stage: &Stage, what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if Instant::now() >= deadline {
            let columns =
                "custom-columns=TIME:.eventTime,REASON:.reason,POD:.regarding.name,NOTE:.note";
            let events = stage
                .plane
                .kubectl(&[
                    "get",
                    "events.events.k8s.io",
                    "-n",
                    &stage.namespace,
                    "-o",
                    columns,
                ])
                .await
                .unwrap_or_default();
            let events: Vec<&str> = events.lines().filter(|l| !l.contains("Endpoint")).collect();
            panic!(
                "{what}: not within {timeout:?}\n{}\n{}",
                events.join("\n"),
                stage.describe().await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the EndpointSlice controller's endpoints for `service` are exactly `ips`.
async fn wait_endpoints(stage: &Stage, service: &str, ips: &BTreeSet<String>) {
    let what = format!("endpoints of {service} = {ips:?}");
    let waited = poll_until(&what, 30 * SECOND, Duration::from_millis(200), || async {
        Ok(stage.attempted_endpoints(service).await?.as_ref() == Some(ips))
    })
    .await;
    if let Err(e) = waited {
        let seen = stage.attempted_endpoints(service).await.unwrap();
        panic!("{e:#}: last seen {seen:?}");
    }
}

/// Deletes `pod` (a primary) and waits for the preStop wait on its Valkey: it answers 200 only
/// once the local Valkey is no longer primary, i.e. after a hand-over. Returns how long it took.
async fn delete_primary(stage: &Stage, pod: &Pod) -> Duration {
    stage
        .api()
        .delete(&name(pod), &DeleteParams::default())
        .await
        .unwrap();
    let hook = until_or_dump(
        stage,
        "the preStop wait on Valkey to finish",
        30 * SECOND,
        || async {
            stage
                .kubelet
                .hook_runs()
                .into_iter()
                .find(|h| h.pod == name(pod) && h.container == "valkey" && h.hook == "preStop")
        },
    )
    .await;
    assert_eq!(hook.result.as_deref(), Ok("HTTP 200"), "{hook:?}");
    println!(
        "{}: preStop wait on Valkey answered after {:?}",
        name(pod),
        hook.took
    );
    hook.took
}

/// The coordinator's Events (hand-overs, failovers), one per line.
async fn moves(stage: &Stage) -> String {
    let columns = "custom-columns=TIME:.eventTime,REASON:.reason,POD:.regarding.name,NOTE:.note";
    let events = stage
        .plane
        .kubectl(&[
            "get",
            "events.events.k8s.io",
            "-n",
            &stage.namespace,
            "-o",
            columns,
        ])
        .await
        .unwrap_or_default();
    let moves: Vec<&str> = events
        .lines()
        .filter(|l| l.contains("Handover") || l.contains("FailoverS") || l.contains("FailoverF"))
        .collect();
    moves.join("\n")
}

/// Every pod may be evicted one at a time (a server-side dry run through the Eviction API): each is
/// covered by one budget only, and each budget allows one disruption.
async fn check_evictions(stage: &Stage, budgets: usize) {
    let api: Api<PodDisruptionBudget> = Api::namespaced(stage.plane.client(), &stage.namespace);
    poll_until(
        "every budget allows one disruption",
        30 * SECOND,
        Duration::from_millis(200),
        || async {
            let list = api.list(&Default::default()).await?.items;
            Ok(list.len() == budgets
                && list.iter().all(|b| {
                    b.status
                        .as_ref()
                        .is_some_and(|s| s.disruptions_allowed == Some(1))
                }))
        },
    )
    .await
    .unwrap();
    let dry = EvictParams {
        post_options: PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        ..EvictParams::default()
    };
    for pod in stage.pod_objects().await.unwrap() {
        stage
            .api()
            .evict(&name(&pod), &dry)
            .await
            .unwrap_or_else(|e| panic!("evicting {}: {e}", name(&pod)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_1x2_installs_with_one_labelled_primary_behind_the_client_service() {
    let t0 = Instant::now();
    let stage = Stage::install(options("replication-1x2")).await.unwrap();
    println!("control plane, nodes and chart up after {:?}", t0.elapsed());

    let pods = wait_roles(&stage, 1, 2).await;
    println!(
        "3 pods Ready with their roles after {:?}\n{}",
        t0.elapsed(),
        stage.describe().await
    );
    // Where the apiserver serves MutatingAdmissionPolicy v1 (1.36+) the node-index policy labelled
    // the pods; pod 0 bootstrapped the shard either way.
    let indexes: Vec<Option<&str>> = pods
        .iter()
        .map(|p| label(p, "valkey.io/node-index"))
        .collect();
    if serves_mutating_policies(&stage).await {
        assert_eq!(indexes, [Some("0"), Some("1"), Some("2")]);
    } else {
        assert_eq!(indexes, [None, None, None]);
    }
    let primary = with_role(&pods, "primary")[0].clone();
    assert_eq!(name(&primary), "valkey-0-0");
    for p in &pods {
        let want = if name(p) == name(&primary) {
            "master"
        } else {
            "slave"
        };
        assert_eq!(
            valkey_role(valkey_addr(p).unwrap(), PASSWORD).await,
            want,
            "{}",
            name(p)
        );
        assert_eq!(label(p, "valkey.io/shard-id"), Some("valkey-0"));
    }
    // Spread: a pod per node and per zone.
    let nodes: BTreeSet<&str> = pods.iter().filter_map(node_of).collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    let zones: BTreeSet<&str> = pods
        .iter()
        .filter_map(|p| label(p, "valkey.io/zone"))
        .collect();
    assert_eq!(zones.len(), 3, "{zones:?}");

    // The client Service selects the primary, the read Service the replicas; the EndpointSlice
    // controller computed exactly that.
    let client: Vec<String> = stage
        .service_pods("valkey")
        .await
        .unwrap()
        .iter()
        .map(name)
        .collect();
    assert_eq!(client, [name(&primary)]);
    let read: Vec<String> = stage
        .service_pods("valkey-read")
        .await
        .unwrap()
        .iter()
        .map(name)
        .collect();
    assert_eq!(read, ["valkey-0-1", "valkey-0-2"]);
    wait_endpoints(&stage, "valkey", &BTreeSet::from([ip(&primary)])).await;

    check_evictions(&stage, 1).await;

    // The primary's pod goes: it is handed over while the preStop wait holds Valkey, the
    // StatefulSet recreates the pod, and the client Service follows whoever is primary.
    let took = delete_primary(&stage, &primary).await;
    assert!(took < 10 * SECOND, "{took:?}");
    let pods = wait_roles(&stage, 1, 2).await;
    faults::record(
        &Outcome::new(module_path!(), "primary pod deleted (chart, replication 1×2)")
            .recovery(took)
            .note("recovery: delete → the preStop wait on Valkey answered (the primary handed over); no writer"),
    );
    tokio::time::sleep(2 * SECOND).await;
    let moved = moves(&stage).await;
    println!("moves:\n{moved}");
    // One planned move and nothing after it: the old primary's agent, stopping, leaves the new
    // holder's record alone.
    assert!(moved.contains("HandoverSucceeded"), "{moved}");
    assert!(
        !moved.contains("FailoverStarted"),
        "a needless failover after the hand-over:\n{moved}"
    );
    let new_primary = with_role(&pods, "primary")[0];
    let addr = valkey_addr(new_primary).unwrap();
    assert_eq!(valkey_role(addr, PASSWORD).await, "master");
    for p in with_role(&pods, "replica") {
        assert_eq!(
            valkey_role(valkey_addr(p).unwrap(), PASSWORD).await,
            "slave"
        );
    }
    let client: Vec<String> = stage
        .service_pods("valkey")
        .await
        .unwrap()
        .iter()
        .map(name)
        .collect();
    assert_eq!(client, [name(new_primary)]);
    wait_endpoints(&stage, "valkey", &BTreeSet::from([ip(new_primary)])).await;
    // The recreated pod keeps its index (and node index, where the policy is served).
    let back = pods.iter().find(|p| name(p) == "valkey-0-0").unwrap();
    assert_eq!(label(back, "apps.kubernetes.io/pod-index"), Some("0"));
    let node_index = label(back, "valkey.io/node-index");
    assert_eq!(
        node_index,
        serves_mutating_policies(&stage).await.then_some("0")
    );

    // Unplanned: the primary's Valkey is killed (its agent lives, the kubelet restarts Valkey
    // empty). A replica is promoted, labelled and selected by the client Service.
    let killed_pod = name(new_primary);
    let killed = Instant::now();
    stage
        .kubelet
        .crash_container(&stage.namespace, &killed_pod, "valkey")
        .unwrap();
    let successor = poll_until(
        "a replica promoted and labelled",
        30 * SECOND,
        Duration::from_millis(10),
        || async {
            let pods = stage.pod_objects().await?;
            Ok(with_role(&pods, "primary")
                .iter()
                .any(|p| name(p) != killed_pod))
        },
    )
    .await;
    assert!(
        successor.is_ok(),
        "{successor:?}\n{}",
        stage.describe().await
    );
    let took = killed.elapsed();
    let pods = wait_roles(&stage, 1, 2).await;
    let promoted = with_role(&pods, "primary")[0];
    assert_eq!(
        valkey_role(valkey_addr(promoted).unwrap(), PASSWORD).await,
        "master"
    );
    wait_endpoints(&stage, "valkey", &BTreeSet::from([ip(promoted)])).await;
    println!(
        "Valkey of {killed_pod} killed: {} labelled primary after {took:?}, the killed one back as a replica",
        name(promoted)
    );
    faults::record(
        &Outcome::new(module_path!(), "primary's Valkey killed (chart, replication 1×2)")
            .recovery(took)
            .note(format!(
                "recovery: kill → another pod labelled primary; the killed one back as a replica and the client Service on the new primary {} after the kill; no writer",
                show(killed.elapsed())
            )),
    );
    check_acl_log(&stage, PASSWORD).await;
    println!("done after {:?}\n{}", t0.elapsed(), stage.describe().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_3x1_installs_forms_and_labels_three_shards_spread_over_nodes() {
    let t0 = Instant::now();
    // The chart generates the Secret (instead of the example's existing one).
    let stage = Stage::install(options("cluster-3x1").generated_auth())
        .await
        .unwrap();
    let password = stage
        .secret("valkey-auth", "default-password")
        .await
        .unwrap();
    assert_eq!(password.len(), 32);

    let pods = stage.wait_valkey_up(6, 90 * SECOND).await.unwrap();
    println!("6 pods with Valkey up after {:?}", t0.elapsed());
    assert_eq!(shards(&pods).len(), 3);
    // Nobody forms the cluster but the agents (formCluster, the default): pod 0 of every shard
    // takes slots, the other pod replicates it.
    let pods = wait_roles(&stage, 3, 3).await;
    println!(
        "labels converged after {:?}\n{}",
        t0.elapsed(),
        stage.describe().await
    );
    for (shard, members) in shards(&pods) {
        let roles: Vec<Option<&str>> = members.iter().map(|p| label(p, ROLE)).collect();
        assert_eq!(roles, [Some("primary"), Some("replica")], "shard {shard}");
        // Both carry Valkey's shard id, and they run on different nodes.
        let ids: BTreeSet<Option<&str>> = members
            .iter()
            .map(|p| label(p, "valkey.io/shard-id"))
            .collect();
        assert_eq!(ids.len(), 1, "shard {shard}: {ids:?}");
        assert!(
            ids.iter().all(|i| i.is_some_and(|i| i.len() == 40)),
            "{ids:?}"
        );
        let nodes: BTreeSet<&str> = members.iter().filter_map(node_of).collect();
        assert_eq!(nodes.len(), members.len(), "shard {shard} shares a node");
    }
    let nodes: BTreeSet<&str> = pods.iter().filter_map(node_of).collect();
    println!("pods on {} nodes", nodes.len());

    // The client Service: the three primaries.
    let primaries: BTreeSet<String> = with_role(&pods, "primary").iter().map(|p| ip(p)).collect();
    let selected: BTreeSet<String> = stage
        .service_pods("valkey")
        .await
        .unwrap()
        .iter()
        .map(ip)
        .collect();
    assert_eq!(selected, primaries);
    wait_endpoints(&stage, "valkey", &primaries).await;

    // One agent leads, on the coordinator Lease.
    let leases: Api<Lease> = Api::namespaced(stage.plane.client(), &stage.namespace);
    poll_until(
        "a coordinator",
        30 * SECOND,
        Duration::from_millis(200),
        || async {
            let lease = leases.get_opt("valkey-coordinator").await?;
            Ok(lease.and_then(|l| l.spec?.holder_identity).is_some())
        },
    )
    .await
    .unwrap();

    check_evictions(&stage, 3).await;

    // Shard 0's primary pod goes: the coordinator hands over with CLUSTER FAILOVER through the
    // agent's ACL user while the preStop wait holds Valkey.
    let shard0 = shards(&pods).remove("0").unwrap();
    let took = delete_primary(&stage, &shard0[0]).await;
    assert!(took < 10 * SECOND, "{took:?}");
    // The recreated pod is a new, unjoined Valkey node: only the replica can have taken over.
    let replica = name(&shard0[1]);
    poll_until(
        "the replica labelled primary",
        30 * SECOND,
        Duration::from_millis(100),
        || async { Ok(label(&stage.api().get(&replica).await?, ROLE) == Some("primary")) },
    )
    .await
    .unwrap();
    assert_eq!(
        valkey_role(valkey_addr(&shard0[1]).unwrap(), &password).await,
        "master"
    );
    // The recreated pod came back empty (no persistence): the agents meet it, make it a replica
    // of its shard's new primary and forget its old node id everywhere.
    let readded = Instant::now();
    let pods = wait_roles(&stage, 3, 3).await;
    let old = name(&shard0[0]);
    let pod = pods.iter().find(|p| name(p) == old).unwrap();
    assert_eq!(label(pod, ROLE), Some("replica"));
    println!(
        "recreated pod back in the cluster after {:?}",
        readded.elapsed()
    );
    // Its old identity is forgotten everywhere once the cluster marks it failed (after
    // cluster-node-timeout, 5 s here).
    let addrs: Vec<SocketAddr> = pods.iter().map(|p| valkey_addr(p).unwrap()).collect();
    poll_until(
        "the old node id forgotten",
        40 * SECOND,
        Duration::from_millis(200),
        || async {
            for a in &addrs {
                let nodes = text(cmd(*a, Some(&password), &["CLUSTER", "NODES"])?)?;
                if nodes.lines().count() != 6 {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await
    .unwrap();
    println!("old node id forgotten after {:?}", readded.elapsed());
    println!("moves:\n{}", moves(&stage).await);
    check_acl_log(&stage, &password).await;
    monitored_names_are_exported(&pods).await;
    println!("done after {:?}", t0.elapsed());
}

/// Zone label and Valkey's `availability-zone` agree with the pod's node.
async fn zones_agree(stage: &Stage, pods: &[Pod], password: &str) {
    let nodes: Api<Node> = Api::all(stage.plane.client());
    for p in pods {
        let node = nodes.get(node_of(p).unwrap()).await.unwrap();
        let zone = node.metadata.labels.unwrap()["topology.kubernetes.io/zone"].clone();
        assert_eq!(
            label(p, "valkey.io/zone"),
            Some(zone.as_str()),
            "{}",
            name(p)
        );
        let addr = valkey_addr(p).unwrap();
        let pw = password.to_owned();
        let pushed = tokio::task::spawn_blocking(move || {
            let v = cmd(addr, Some(&pw), &["CONFIG", "GET", "availability-zone"])?;
            text(v)
        });
        let got = format!("{:?}", pushed.await.unwrap());
        assert!(got.contains(&zone), "{}: availability-zone {got}", name(p));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_3x2_helm_install_forms_and_labels_and_helm_uninstall_leaves_nothing() {
    let t0 = Instant::now();
    let mut opts = options("cluster-3x1")
        .generated_auth()
        .set("replicas=2")
        .env("SIDECAR_FAILBACK", "true")
        .env("SIDECAR_QUIET_PERIOD", "3s")
        .env("SIDECAR_MOVE_COOLDOWN", "1s");
    opts.helm_install = true;
    let stage = Stage::install(opts).await.unwrap();
    let installed = t0.elapsed();
    let password = stage
        .secret("valkey-auth", "default-password")
        .await
        .unwrap();
    let pods = stage.wait_valkey_up(9, 120 * SECOND).await.unwrap();
    let up = t0.elapsed();
    assert_eq!(shards(&pods).len(), 3);
    // The agents form the cluster: 3 primaries, 2 replicas each, all Ready, labelled.
    let pods = wait_roles(&stage, 3, 6).await;
    let formed = t0.elapsed();
    println!(
        "helm install of 3 shards x 2 replicas: installed {installed:?}, Valkey up in 9 pods {up:?}, formed, labelled and Ready {formed:?}\n{}",
        stage.describe().await
    );
    for (shard, members) in shards(&pods) {
        let roles: Vec<Option<&str>> = members.iter().map(|p| label(p, ROLE)).collect();
        assert_eq!(
            roles,
            [Some("primary"), Some("replica"), Some("replica")],
            "shard {shard}"
        );
        let ids: BTreeSet<Option<&str>> = members
            .iter()
            .map(|p| label(p, "valkey.io/shard-id"))
            .collect();
        assert_eq!(ids.len(), 1, "shard {shard}: {ids:?}");
        // Spread (Preferred, the defaults) suffices: three nodes and three zones per shard.
        let nodes: BTreeSet<&str> = members.iter().filter_map(node_of).collect();
        let zones: BTreeSet<&str> = members
            .iter()
            .filter_map(|p| label(p, "valkey.io/zone"))
            .collect();
        assert_eq!(
            (nodes.len(), zones.len()),
            (3, 3),
            "shard {shard}: {nodes:?} {zones:?}"
        );
    }
    zones_agree(&stage, &pods, &password).await;
    let scheduling = until_condition(&stage, "SchedulingSatisfied", "True").await;
    println!("{scheduling}");
    drift_and_failback(&stage, &pods, &password).await;
    // The agents' Leases are owned by the chart's ConfigMap, so they go with the release.
    let leases: Api<Lease> = Api::namespaced(stage.plane.client(), &stage.namespace);
    let coordinator = leases.get("valkey-coordinator").await.unwrap();
    let owners = coordinator.metadata.owner_references.unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].name.as_str()),
        ("ConfigMap", "valkey-leases")
    );

    let t1 = Instant::now();
    println!("{}", stage.uninstall().unwrap());
    let left = poll_until(
        "nothing left of the release",
        120 * SECOND,
        SECOND,
        || async { Ok(stage.leftovers().await?.is_empty()) },
    )
    .await;
    if let Err(e) = left {
        panic!("{e:#}: {:?}", stage.leftovers().await);
    }
    println!("helm uninstall: nothing left after {:?}", t1.elapsed());
}

/// Waits until the coordinator's condition `type_` starts with `want` (on its Lease); returns it.
async fn until_condition(stage: &Stage, type_: &str, want: &str) -> String {
    let what = format!("{type_} {want}");
    let waited = poll_until(&what, 30 * SECOND, Duration::from_millis(20), || async {
        Ok(stage
            .condition(type_)
            .await?
            .is_some_and(|c| c.starts_with(want)))
    })
    .await;
    assert!(
        waited.is_ok(),
        "{waited:?}: {:?}",
        stage.condition(type_).await
    );
    stage.condition(type_).await.unwrap().unwrap()
}

/// The Lease holder's pod.
async fn coordinator(stage: &Stage, pods: &[Pod]) -> Pod {
    let leases: Api<Lease> = Api::namespaced(stage.plane.client(), &stage.namespace);
    let lease = leases.get("valkey-coordinator").await.unwrap();
    let holder = lease.spec.unwrap().holder_identity.unwrap();
    pods.iter()
        .find(|p| name(p) == holder_pod(&holder))
        .unwrap()
        .clone()
}

/// Shard 0's primary moves to a replica in another zone (`CLUSTER FAILOVER`): the drift shows in
/// the coordinator's metrics within an observation cycle and on the Lease with its next renewal; after
/// the quiet period the coordinator fails back and the condition clears.
async fn drift_and_failback(stage: &Stage, pods: &[Pod], password: &str) {
    let shard0 = shards(pods).remove("0").unwrap();
    let replica = valkey_addr(&shard0[1]).unwrap();
    let pw = password.to_owned();
    let moved = Instant::now();
    tokio::task::spawn_blocking(move || cmd(replica, Some(&pw), &["CLUSTER", "FAILOVER"]))
        .await
        .unwrap()
        .unwrap();
    let agent = std::net::SocketAddr::new(
        valkey_addr(&coordinator(stage, pods).await).unwrap().ip(),
        9736,
    );
    let metric = "valkey_sidecar_placement_drift{reason=\"FailoverDrift\"} 1";
    let seen = poll_until(
        "the drift metric",
        10 * SECOND,
        Duration::from_millis(10),
        || async {
            let (_, body) = http_get(agent, "/metrics", SECOND).await?;
            Ok(body.contains(metric))
        },
    )
    .await;
    assert!(seen.is_ok(), "{seen:?}");
    let in_metrics = moved.elapsed();
    let drift = until_condition(stage, "PrimaryPlacementAligned", "False FailoverDrift").await;
    let on_lease = moved.elapsed();
    let aligned = until_condition(stage, "PrimaryPlacementAligned", "True").await;
    println!(
        "failover out of the preferred zone: drift in the coordinator's metrics after {in_metrics:?}, on the Lease after {on_lease:?} ({drift}); failed back, condition cleared after {:?} ({aligned})",
        moved.elapsed()
    );
    let pods = wait_roles(stage, 3, 6).await;
    let first = pods.iter().find(|p| name(p) == name(&shard0[0])).unwrap();
    assert_eq!(
        label(first, ROLE),
        Some("primary"),
        "failed back to the node-index 0 pod"
    );
}

/// Whether `pod`'s Valkey lets `user` in with `password` (`None`: the default user).
async fn logs_in(stage: &Stage, pod: &str, user: Option<&str>, password: &str) -> bool {
    let addr = stage.valkey(pod).unwrap();
    let url = format!("redis://{}:{password}@{addr}/", user.unwrap_or(""));
    tokio::task::spawn_blocking(move || {
        let client = redis::Client::open(url)?;
        let mut c = client.get_connection_with_timeout(2 * SECOND)?;
        redis::cmd("PING").query::<String>(&mut c)
    })
    .await
    .unwrap()
    .is_ok()
}

/// Which of `passwords` (default user's, agent's) every pod's Valkey accepts, as one flag per
/// password and user, the same on all pods (else a panic naming the pod).
async fn accepted(stage: &Stage, passwords: &[(&str, &str)]) -> Vec<bool> {
    let mut agreed: Option<Vec<bool>> = None;
    for pod in &stage.pods {
        let mut flags = Vec::new();
        for (default, agent) in passwords {
            flags.push(logs_in(stage, pod, None, default).await);
            flags.push(logs_in(stage, pod, Some("valkey-sidecar"), agent).await);
        }
        match &agreed {
            Some(first) => assert_eq!(first, &flags, "{pod} disagrees"),
            None => agreed = Some(flags),
        }
    }
    agreed.unwrap_or_default()
}

/// The pods' UIDs by name: a changed one was re-created.
async fn uids(stage: &Stage) -> Vec<String> {
    let pods = stage.pod_objects().await.unwrap();
    pods.iter()
        .map(|p| p.metadata.uid.clone().unwrap())
        .collect()
}

/// Valkey container restarts over all pods (a re-created pod starts at 0).
async fn valkey_restarts(stage: &Stage) -> i32 {
    let pods = stage.pod_objects().await.unwrap();
    let statuses = pods
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.clone())
        .flatten();
    statuses
        .filter(|c| c.name == "valkey")
        .map(|c| c.restart_count)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_rotate_in_three_upgrades_without_a_restart_or_a_failover() {
    // The documented procedure (docs/operations.md) on the chart's generated Secret: accept the
    // next passwords everywhere (a roll), promote them (no roll; the kubelet refreshes the
    // agents' files), drop the old ones (a roll). Every step keeps every pair of Valkey and agent
    // able to talk, so the rolls hand the primary over and nothing fails over or restarts. An
    // application writes throughout, switching to the next password between promote and drop,
    // as the procedure tells it to: no write is refused for its password, none is lost.
    let mut opts = StageOptions::replication("rotate", 2);
    opts.helm_install = true;
    opts.kubelet.volume_refresh = 5 * SECOND;
    let mut stage = Stage::start(opts).await.unwrap();
    let secret = |key: &'static str| {
        let stage = &stage;
        async move { stage.secret("valkey-auth", key).await.unwrap() }
    };
    let old = (
        secret("default-password").await,
        secret("agent-password").await,
    );
    let old = (old.0.as_str(), old.1.as_str());
    assert_eq!(accepted(&stage, &[old]).await, [true, true]);
    let pods = stage.pod_objects().await.unwrap();
    let addresses = Addresses::new(&pods);
    let watcher = Watcher::start(&stage, addresses.clone());
    let app = writers(&stage, &pods, &addresses, false).unwrap();

    let before = uids(&stage).await;
    println!("{}", stage.upgrade(&["auth.rotation=accept"]).unwrap());
    stage.wait_rolled(300 * SECOND).await.unwrap();
    let rolled = uids(&stage).await;
    assert!(before.iter().all(|u| !rolled.contains(u)), "not rolled");
    let next = (
        secret("next-default-password").await,
        secret("next-agent-password").await,
    );
    let next = (next.0.as_str(), next.1.as_str());
    assert_ne!(old, next);
    assert_eq!(accepted(&stage, &[old, next]).await, [true; 4]);

    println!("{}", stage.upgrade(&["auth.rotation=promote"]).unwrap());
    assert_eq!(secret("default-password").await, next.0);
    assert_eq!(secret("agent-password").await, next.1);
    // No roll: the pod template is the same as in the accept step.
    tokio::time::sleep(5 * SECOND).await;
    assert_eq!(uids(&stage).await, rolled, "promote re-created pods");
    poll_until("agents' files refreshed", 60 * SECOND, SECOND, || async {
        let file = |pod: &String| {
            let dir = stage
                .kubelet
                .volume_dir(&stage.namespace, pod, "agent-auth");
            std::fs::read_to_string(dir?.join("password")).ok()
        };
        Ok(stage
            .pods
            .iter()
            .all(|p| file(p).as_deref() == Some(next.1)))
    })
    .await
    .unwrap();
    for (_, w) in &app {
        w.switch_client(ClientOptions::default().password(next.0));
    }

    println!("{}", stage.upgrade(&["auth.rotation="]).unwrap());
    stage.wait_rolled(300 * SECOND).await.unwrap();
    let done = uids(&stage).await;
    assert!(rolled.iter().all(|u| !done.contains(u)), "not rolled");
    assert_eq!(
        accepted(&stage, &[old, next]).await,
        [false, false, true, true]
    );
    stage.password = Some(next.0.to_owned());
    // Every agent logs in afresh with the new password: dropped, they come back and stay Ready.
    for pod in &stage.pods {
        stage
            .cmd(pod, &["CLIENT", "KILL", "USER", "valkey-sidecar"])
            .unwrap();
    }
    tokio::time::sleep(2 * SECOND).await;
    stage.wait_settled(3, 1, 60 * SECOND).await.unwrap();
    drop(watcher.stop());
    for w in stop_writers(&stage, app).await.unwrap() {
        println!("the application's writes: {w:?}");
        assert!(w.acked > 0, "{w:?}");
        assert_eq!((w.lost, w.auth_failures), (0, 0), "{w:?}");
    }
    assert_eq!(valkey_restarts(&stage).await, 0);
    let events = stage.events().await.unwrap();
    assert!(!events.contains("FailoverStarted"), "{events}");
    let moves = events.lines().filter(|l| l.starts_with("Handover"));
    println!("{}", moves.collect::<Vec<_>>().join("\n"));
}

#[path = "support/monitoring.rs"]
mod monitoring;

/// Counters that exist only from their first event, which this install may never see: errors
/// (`observation_errors`, `watch_errors`), replication mode's record calls, and the moves, counted
/// by the coordinator that made them (gone with its pod when that was the pod deleted).
/// `tests/monitoring.rs` checks that the agent exports each once it happens.
const ON_FIRST_EVENT: &[&str] = &[
    "valkey_sidecar_observation_errors_total",
    "valkey_sidecar_watch_errors_total",
    "valkey_sidecar_shard_record_calls_total",
    "valkey_sidecar_coordinator_record_reads_total",
    "valkey_sidecar_coordinator_actions_total",
];

/// Every metric name the chart's alert rules and dashboard query is in the `/metrics` of the
/// chart's running agents (their union: the lag only on replicas, the per-shard gauge only on the
/// Lease holder), but for the counters of [`ON_FIRST_EVENT`].
async fn monitored_names_are_exported(pods: &[Pod]) {
    let mut exported = BTreeSet::new();
    for p in pods {
        let agent = SocketAddr::new(valkey_addr(p).unwrap().ip(), 9736);
        let (status, body) = http_get(agent, "/metrics", SECOND).await.unwrap();
        assert_eq!(status, 200, "{}: {body}", name(p));
        exported.extend(monitoring::exported_names(&body));
    }
    let missing = monitoring::missing_names(&exported);
    let unexpected: Vec<&(String, String)> = missing
        .iter()
        .filter(|(_, n)| !ON_FIRST_EVENT.contains(&n.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "queried but not in any agent's /metrics: {unexpected:?}"
    );
    let used: BTreeSet<String> = monitoring::alert_queries()
        .into_iter()
        .chain(monitoring::dashboard_queries())
        .flat_map(|(_, q)| monitoring::metric_names(&q))
        .collect();
    let waiting: BTreeSet<&str> = missing.iter().map(|(_, n)| n.as_str()).collect();
    println!(
        "{} metric names queried by the rules and the dashboard: {} in the agents' /metrics, {} not yet counted ({waiting:?})",
        used.len(),
        used.len() - waiting.len(),
        waiting.len()
    );
}
