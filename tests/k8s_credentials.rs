//! Credentials that change under running agents (issue 32): the agents' ServiceAccount deleted
//! and recreated (a new UID), as an uninstall of the RBAC objects or a GitOps prune and re-sync
//! does. Every token bound to the old account is revoked at once, and the garbage collector
//! deletes the Leases the account owned; the agents say why their calls fail (`unauthorized`),
//! and once the kubelet writes the pods new tokens they read them and recover — the record
//! re-created under the new account, every pod Ready and labelled — with nothing a client
//! wrote lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use valkey_sidecar_testkit::k8s::follow::{Addresses, Watcher, stop_writers, writers};
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, http_get, poll_until};

const SECOND: Duration = Duration::from_secs(1);

/// A client with exactly the credentials the kubelet gave `pod`'s agent.
async fn as_pod(s: &Stage, pod: &str) -> Client {
    let path = s.kubelet.pod_kubeconfig(&s.namespace, pod).unwrap();
    let kubeconfig = Kubeconfig::read_from(path).unwrap();
    let options = KubeConfigOptions::default();
    let config = Config::from_custom_kubeconfig(kubeconfig, &options).await;
    Client::try_from(config.unwrap()).unwrap()
}

/// The HTTP status the API answers `pod`'s own credentials with, reading `pod`.
async fn status_for(s: &Stage, pod: &str) -> u16 {
    let pods: Api<Pod> = Api::namespaced(as_pod(s, pod).await, &s.namespace);
    match pods.get(pod).await {
        Ok(_) => 200,
        Err(kube::Error::Api(e)) => e.code,
        Err(e) => panic!("{pod}: {e}"),
    }
}

/// Deletes the ServiceAccount `name` and creates it again; its new UID.
async fn recreate(s: &Stage, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(s.plane.client(), &s.namespace);
    let old = accounts.get(name).await.unwrap();
    accounts
        .delete(name, &DeleteParams::background())
        .await
        .unwrap();
    poll_until("the account gone", 30 * SECOND, SECOND / 10, || async {
        Ok(accounts.get_opt(name).await?.is_none())
    })
    .await
    .unwrap();
    let again = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: old.metadata.labels.clone(),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let made = accounts
        .create(&PostParams::default(), &again)
        .await
        .unwrap();
    let uid = made.metadata.uid.unwrap();
    assert_ne!(Some(uid.as_str()), old.metadata.uid.as_deref());
    uid
}

/// The shard record: its last renewal and its owners' UIDs.
async fn record(s: &Stage) -> Option<(Option<String>, Vec<String>)> {
    let leases: Api<Lease> = Api::namespaced(s.plane.client(), &s.namespace);
    let lease = leases
        .get_opt(&format!("{}-0-primary", s.cluster))
        .await
        .ok()??;
    let owners = lease.metadata.owner_references.unwrap_or_default();
    let renewed = lease
        .spec
        .and_then(|l| l.renew_time)
        .map(|t| t.0.to_string());
    Some((renewed, owners.into_iter().map(|o| o.uid).collect()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_service_account_revokes_the_agents_tokens_and_they_recover_with_new_ones() {
    let s = Stage::start(StageOptions::replication("sa-recreate", 2))
        .await
        .unwrap();
    let pods = s.pod_objects().await.unwrap();
    let addresses = Addresses::new(&pods);
    let watcher = Watcher::start(&s, addresses.clone());
    let app = writers(&s, &pods, &addresses, false).unwrap();
    tokio::time::sleep(SECOND).await;
    assert_eq!(status_for(&s, "valkey-0-0").await, 200);

    let account = format!("{}-sidecar", s.cluster);
    let (_, owners) = record(&s).await.unwrap();
    let uid = recreate(&s, &account).await;
    assert!(
        !owners.contains(&uid),
        "the chart's Leases are owned by its ConfigMap"
    );
    // The apiserver's token check reads ServiceAccounts from its informer: a moment later.
    poll_until(
        "every old token refused",
        30 * SECOND,
        SECOND / 5,
        || async {
            for pod in &s.pods {
                if status_for(&s, pod).await != 401 {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await
    .unwrap();
    // Each agent says why its calls fail: the keepers renew or read the record every retry
    // period, and every one of those is refused.
    poll_until(
        "every agent counts unauthorized calls",
        60 * SECOND,
        SECOND,
        || async {
            for pod in &s.pods {
                let (_, metrics) = http_get(s.agent(pod)?, "/metrics", 5 * SECOND).await?;
                if !metrics.contains("\"unauthorized\"") {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await
    .unwrap();

    // The kubelet's renewal (at 80% of the token's lifetime; here at once): a new token file.
    let renewed = Instant::now();
    for pod in &s.pods {
        assert!(s.kubelet.renew_token(&s.namespace, pod));
    }
    poll_until(
        "the new tokens written",
        30 * SECOND,
        SECOND / 10,
        || async { Ok(status_for(&s, "valkey-0-0").await == 200) },
    )
    .await
    .unwrap();
    let stale = record(&s).await.unwrap().0;
    poll_until(
        "the holder renews the record again",
        180 * SECOND,
        SECOND / 2,
        || async { Ok(record(&s).await.is_some_and(|(r, _)| r != stale)) },
    )
    .await
    .unwrap();
    println!(
        "the record renewed again {:?} after the tokens were",
        renewed.elapsed()
    );
    assert_eq!(
        record(&s).await.unwrap().1,
        owners,
        "the Leases kept their owner"
    );
    s.wait_settled(3, 1, 120 * SECOND).await.unwrap();
    s.wait_labels_true(60 * SECOND).await.unwrap();
    println!(
        "recovered {:?} after the tokens were renewed",
        renewed.elapsed()
    );
    drop(watcher.stop());
    for w in stop_writers(&s, app).await.unwrap() {
        println!("the application's writes: {w:?}");
        assert!(w.acked > 0, "{w:?}");
        assert_eq!(w.lost, 0, "{w:?}");
    }
}
