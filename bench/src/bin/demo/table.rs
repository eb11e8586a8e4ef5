//! The live table: `kubectl get pods -o wide -L valkey.io/role,valkey.io/shard-id,...` plus what
//! the agents say about themselves.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client};
use valkey_sidecar_testkit::k8s::valkey::SIDECAR_PORT;
use valkey_sidecar_testkit::k8s::{ZONE_LABEL, http_get};

const ROLE_LABEL: &str = "valkey.io/role";
const SHARD_LABEL: &str = "valkey.io/shard-id";

/// One rendering of the pods of `namespace`.
pub async fn render(client: &Client, namespace: &str) -> Result<String> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let zones: BTreeMap<String, String> = nodes
        .items
        .iter()
        .filter_map(|n| {
            let zone = n.metadata.labels.as_ref()?.get(ZONE_LABEL)?.clone();
            Some((n.metadata.name.clone()?, zone))
        })
        .collect();
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    let mut rows = vec![header()];
    for pod in &pods.items {
        rows.push(row(pod, &zones).await);
    }
    Ok(format_rows(&rows))
}

fn header() -> Vec<String> {
    [
        "NAME", "READY", "STATUS", "RESTARTS", "NODE", "ZONE", "IP", "ROLE", "SHARD-ID", "REVISION",
    ]
    .map(String::from)
    .to_vec()
}

async fn row(pod: &Pod, zones: &BTreeMap<String, String>) -> Vec<String> {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    // As kubectl counts: the main containers and the native sidecars (restartable init
    // containers, the chart's agent).
    let sidecars = sidecar_names(pod);
    let init = status.init_container_statuses.clone().unwrap_or_default();
    let containers: Vec<_> = status
        .container_statuses
        .clone()
        .unwrap_or_default()
        .into_iter()
        .chain(init.into_iter().filter(|c| sidecars.contains(&c.name)))
        .collect();
    let ready = containers.iter().filter(|c| c.ready).count();
    let total = pod.spec.as_ref().map_or(0, |s| s.containers.len()) + sidecars.len();
    let restarts: i32 = containers.iter().map(|c| c.restart_count).sum();
    let phase = if pod.metadata.deletion_timestamp.is_some() {
        "Terminating".to_string()
    } else {
        status.phase.clone().unwrap_or_else(|| "Pending".into())
    };
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_else(|| "<none>".into());
    let zone = zones.get(&node).cloned().unwrap_or_else(|| "<none>".into());
    let ip = status.pod_ip.clone().unwrap_or_else(|| "<none>".into());
    let agent = agent_status(&ip).await;
    let role = match labels.get(ROLE_LABEL) {
        Some(r) => r.clone(),
        None => agent
            .as_ref()
            .and_then(|s| s["role"].as_str().map(|r| format!("{r}*")))
            .unwrap_or_else(|| "<none>".into()),
    };
    let shard = match labels.get(SHARD_LABEL) {
        Some(s) => s.clone(),
        None => agent
            .as_ref()
            .and_then(|s| s["valkey"]["shard_id"].as_str().map(|s| format!("{s}*")))
            .unwrap_or_else(|| "<none>".into()),
    };
    vec![
        pod.metadata.name.clone().unwrap_or_default(),
        format!("{ready}/{total}"),
        phase,
        restarts.to_string(),
        node,
        zone,
        ip,
        role,
        short(&shard),
        revision(&labels),
    ]
}

/// The StatefulSet revision the pod was made from (its hash, without the set's name): a roll shows
/// as pods changing from one to the next.
fn revision(labels: &BTreeMap<String, String>) -> String {
    let hash = labels.get("controller-revision-hash").map(String::as_str);
    let short = hash.and_then(|h| h.rsplit('-').next());
    short.unwrap_or("<none>").to_owned()
}

/// The pod's native sidecars: init containers with `restartPolicy: Always`.
fn sidecar_names(pod: &Pod) -> Vec<String> {
    let init = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten());
    init.filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.clone())
        .collect()
}

/// The agent's `/status`, if it answers.
async fn agent_status(ip: &str) -> Option<serde_json::Value> {
    let ip: IpAddr = ip.parse().ok()?;
    let (code, body) = http_get(
        SocketAddr::new(ip, SIDECAR_PORT),
        "/status",
        Duration::from_millis(500),
    )
    .await
    .ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

/// Shard ids are 40 hex digits; 12 tell them apart.
fn short(id: &str) -> String {
    let star = id.ends_with('*');
    let core = id.trim_end_matches('*');
    if core.len() > 12 {
        format!("{}…{}", &core[..12], if star { "*" } else { "" })
    } else {
        id.to_owned()
    }
}

fn format_rows(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            r.iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect::<Vec<_>>()
                .join("   ")
                .trim_end()
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}
