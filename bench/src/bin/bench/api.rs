//! Kubernetes API usage per agent: from the apiserver's audit log (which names each request's
//! pod) and, as a cross-check, from the apiserver's own `apiserver_request_total`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use valkey_sidecar_testkit::k8s::audit::{AuditLog, Usage, pod_identity};
use valkey_sidecar_testkit::k8s::chart::{label, node_of};
use valkey_sidecar_testkit::k8s::valkey::SHARD_INDEX_LABEL;
use valkey_sidecar_testkit::k8s::{ControlPlane, ROLE_LABEL, Stage, StageOptions};

use crate::{coordinated_stage, cordon};

/// The requests the apiserver received from `from` until `from + window` (sleeps until then).
async fn usage_until(log: &AuditLog, from: SystemTime, window: Duration) -> Result<Usage> {
    let left = (from + window)
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(left).await;
    // Each request is logged as it completes: give the last ones time to reach the file.
    tokio::time::sleep(Duration::from_secs(1)).await;
    log.usage(from, from + window)
}

/// API requests per agent per minute by verb, from the apiserver's audit log: a steady-state
/// window, then a window from the cordon of a primary's node (the coordinator hands over).
pub async fn run(bin: &Path) -> Result<()> {
    const STEADY: Duration = Duration::from_secs(60);
    const HANDOVER: Duration = Duration::from_secs(30);
    let (stage, coordinator) = coordinated_stage(bin, &[], true).await?;
    let log = stage.plane.audit_log().context("the audit log is off")?;
    // The agents' start-up requests (lists, label writes) are behind them.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counted = request_totals(&stage.plane).await?;
    let steady = usage_until(&log, SystemTime::now(), STEADY).await?;
    let steady_metric = since(&request_totals(&stage.plane).await?, &counted);
    let (primary, replica) = stage.primary_and_replica(1)?;
    let node = stage.node_of(&primary).await?;
    let counted = request_totals(&stage.plane).await?;
    let cordoned = SystemTime::now();
    cordon(&stage, &node, true).await?;
    let moving = usage_until(&log, cordoned, HANDOVER).await?;
    let moving_metric = since(&request_totals(&stage.plane).await?, &counted);
    cordon(&stage, &node, false).await?;
    if stage.coordinator_holder().await?.as_deref() != Some(coordinator.as_str()) {
        bail!("the Lease changed hands during the measurement");
    }
    let roles = Roles {
        coordinator: &coordinator,
        primary: &primary,
        replica: &replica,
    };
    print_steady(&stage, &roles, &steady, STEADY);
    println!(
        "#### During a hand-over ({} s window from cordoning the node of a primary)\n",
        HANDOVER.as_secs()
    );
    println!("{}", moving.verb_table(&roles.agents(&stage, true)));
    println!("By resource, requests in the window:\n");
    println!("{}", moving.detail_table(&roles.agents(&stage, true)));
    let ids: Vec<String> = stage
        .pods
        .iter()
        .map(|p| pod_identity(&stage.namespace, p))
        .collect();
    drop(stage);
    let drain = drain(bin).await?;
    let windows = [
        ("steady state", &steady, &steady_metric, &ids),
        ("hand-over", &moving, &moving_metric, &ids),
        ("drain", &drain.usage, &drain.metric, &drain.agents),
    ];
    cross_check(&windows);
    Ok(())
}

/// Who the measured agents are: the coordinator, and the primary that is handed over to the replica.
struct Roles<'a> {
    coordinator: &'a str,
    primary: &'a str,
    replica: &'a str,
}

impl Roles<'_> {
    /// Each agent's row name (pod and role, `moved`: during the hand-over) and audit identity.
    fn agents(&self, stage: &Stage, moved: bool) -> Vec<(String, String)> {
        let role = |p: &str| {
            let base = if p == self.coordinator {
                "coordinator"
            } else {
                "follower"
            };
            match p {
                p if moved && p == self.primary => format!("{base}, old primary"),
                p if moved && p == self.replica => format!("{base}, new primary"),
                _ => base.to_owned(),
            }
        };
        stage
            .pods
            .iter()
            .map(|p| {
                (
                    format!("{p} ({})", role(p)),
                    pod_identity(&stage.namespace, p),
                )
            })
            .collect()
    }
}

/// The section's heading and its steady-state window.
fn print_steady(stage: &Stage, roles: &Roles, steady: &Usage, window: Duration) {
    println!("### API requests per agent (real kube-apiserver v1.37.2, from its audit log)\n");
    println!(
        "Requests per minute by verb, 3 shards × 2 members, coordinator on with the default Lease timings (retry period 2 s). Agents are told apart by the pod their bound ServiceAccount token names (`user.extra[\"authentication.kubernetes.io/pod-name\"]` of each audit event); they also send `User-Agent: valkey-sidecar/<version>`. Command: `target/release/bench api`.\n"
    );
    println!("#### Steady state ({} s window)\n", window.as_secs());
    println!("{}", steady.verb_table(&roles.agents(stage, false)));
    let followers = stage
        .pods
        .iter()
        .filter(|p| p.as_str() != roles.coordinator);
    let follower_writes = followers
        .map(|p| steady.writes(&pod_identity(&stage.namespace, p)))
        .max()
        .unwrap_or(0);
    let me = pod_identity(&stage.namespace, roles.coordinator);
    println!(
        "Writes per minute: coordinator {:.1}, of which Lease renewals (`update leases`) {:.1}; followers at most {:.1}. The whole apiserver served {:.0} requests per minute in the window (the harness kubelet, node heartbeats, scheduler and controller-manager included).\n",
        steady.per_minute(steady.writes(&me)),
        steady.per_minute(steady.get(&me, "update", "leases")),
        steady.per_minute(follower_writes),
        steady.per_minute(all_requests(steady)),
    );
}

/// What the drain window counted.
struct Drained {
    usage: Usage,
    metric: Totals,
    /// The agents' audit identities.
    agents: Vec<String>,
}

/// A real `kubectl drain` of a primary's node in a chart install: the Eviction API and the
/// disruption controller admit the eviction, the agent hands the primary over in its preStop
/// wait, the StatefulSet recreates the pod and it syncs again. The window starts at the drain
/// and lasts a minute, which the whole sequence fits in.
async fn drain(bin: &Path) -> Result<Drained> {
    const WINDOW: Duration = Duration::from_secs(60);
    let stage = chart_stage(bin).await?;
    let log = stage.plane.audit_log().context("the audit log is off")?;
    settled(&stage).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pods = settled(&stage).await?;
    let primary = pods
        .iter()
        .find(|p| label(p, ROLE_LABEL) == Some("primary"))
        .context("no primary")?;
    let (old, node) = (name(primary), node_of(primary).context("unscheduled")?);
    let counted = request_totals(&stage.plane).await?;
    let (from, t) = (SystemTime::now(), Instant::now());
    let args = [
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
    ];
    stage
        .plane
        .kubectl(&[&args[..], &["--timeout=120s"]].concat())
        .await?;
    let drained = t.elapsed();
    stage.plane.kubectl(&["uncordon", node]).await?;
    let after = settled(&stage).await?;
    let whole = t.elapsed();
    if whole + Duration::from_secs(5) > WINDOW {
        bail!("the drain took {whole:?}, longer than its window");
    }
    let usage = usage_until(&log, from, WINDOW).await?;
    let metric = since(&request_totals(&stage.plane).await?, &counted);
    let coordinator = stage.coordinator_holder().await?.unwrap_or_default();
    let agents = chart_agents(&stage, &after, &coordinator, &old, primary);
    println!(
        "#### During a `kubectl drain` ({} s window from the drain's start)\n",
        WINDOW.as_secs()
    );
    println!(
        "A chart install (`examples/cluster-3x1.yaml`: 3 shards × 1 replica, StatefulSets, per-shard budgets, kube-scheduler and kube-controller-manager running) on 6 nodes. `kubectl drain {node}` evicted the primary {old}: its agent handed the primary over in the preStop wait, the pod was deleted, its StatefulSet recreated it and it synced again. The drain returned after {:.1} s; all 6 pods were Ready, 3 of them primaries, {:.1} s after it began. The recreated pod keeps its name, so its row counts both of its lives.\n",
        drained.as_secs_f64(),
        whole.as_secs_f64()
    );
    println!("{}", usage.verb_table(&agents));
    println!("By resource, requests in the window:\n");
    println!("{}", usage.detail_table(&agents));
    let agents = agents.into_iter().map(|(_, id)| id).collect();
    Ok(Drained {
        usage,
        metric,
        agents,
    })
}

/// The chart install the drain window runs on, the apiserver keeping an audit log.
async fn chart_stage(bin: &Path) -> Result<Stage> {
    let mut opts = StageOptions::example("drain", "cluster-3x1");
    opts.kubelet = opts.kubelet.sidecar_bin(bin);
    opts.plane.audit = true;
    Stage::install(opts).await
}

/// The install settled: its 6 pods Ready and labelled, 3 of them primaries.
async fn settled(stage: &Stage) -> Result<Vec<Pod>> {
    stage.wait_settled(6, 3, Duration::from_secs(180)).await
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

/// Each agent's row title (its part in the drain) and audit identity.
fn chart_agents(
    stage: &Stage,
    pods: &[Pod],
    coordinator: &str,
    old: &str,
    primary: &Pod,
) -> Vec<(String, String)> {
    let shard = |p: &Pod| label(p, SHARD_INDEX_LABEL).map(str::to_owned);
    let new = pods
        .iter()
        .find(|p| shard(p) == shard(primary) && label(p, ROLE_LABEL) == Some("primary"))
        .map(name);
    pods.iter()
        .map(|p| {
            let pod = name(p);
            let mut part = vec![if pod == coordinator {
                "coordinator"
            } else {
                "follower"
            }];
            if pod == old {
                part.push("evicted primary, recreated");
            }
            if Some(&pod) == new.as_ref() {
                part.push("new primary");
            }
            let title = format!("{pod} ({})", part.join(", "));
            (title, pod_identity(&stage.namespace, &pod))
        })
        .collect()
}

/// `(verb, resource)` → requests, with the audit log's lower-case verbs.
type Totals = BTreeMap<(String, String), f64>;

/// `apiserver_request_total` summed over its other labels, as the apiserver counts it itself.
async fn request_totals(plane: &ControlPlane) -> Result<Totals> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = plane.client().request_text(req).await?;
    Ok(parse_totals(&text))
}

fn parse_totals(text: &str) -> Totals {
    let mut totals = Totals::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let (Some(verb), Some(resource)) = (
            metric_label(labels, "verb"),
            metric_label(labels, "resource"),
        ) else {
            continue;
        };
        // The audit log names a subresource as `pods/status`; so does this.
        let resource = match metric_label(labels, "subresource").filter(|s| !s.is_empty()) {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_owned(),
        };
        let n: f64 = value.trim().parse().unwrap_or(0.0);
        *totals.entry((audit_verb(verb), resource)).or_default() += n;
    }
    totals
}

fn metric_label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

/// The metric's verb (HTTP-like, server-side apply apart) as the audit log names it.
fn audit_verb(metric: &str) -> String {
    match metric {
        "PUT" => "update",
        "POST" => "create",
        "APPLY" => "patch",
        other => return other.to_ascii_lowercase(),
    }
    .to_owned()
}

fn since(after: &Totals, before: &Totals) -> Totals {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// The resources and verbs the agents use (watches are long-running and counted when they end).
const AGENT_CALLS: [(&str, &str); 8] = [
    ("get", "leases"),
    ("list", "leases"),
    ("watch", "leases"),
    ("update", "leases"),
    ("create", "leases"),
    ("patch", "pods"),
    ("get", "pods"),
    ("create", "events"),
];

/// The apiserver's own counter against the audit log, per verb and resource: it has no label
/// naming the client (only verb, resource, code, scope, component…), so it counts everyone's
/// requests, and agrees with the audit log's count of all clients when the method is sound.
fn cross_check(windows: &[(&str, &Usage, &Totals, &Vec<String>)]) {
    println!("#### Cross-check with the apiserver's `apiserver_request_total`\n");
    println!(
        "`apiserver_request_total` has no label naming the client (its labels: verb, dry_run, group, version, resource, subresource, scope, component, code), so it cannot split requests by user agent; the tables above split them by the pod named in each audit event. To check that method, the counter was scraped from the apiserver's `/metrics` at the start and end of each window: its increase (all clients: the harness kubelet's node leases and the scheduler's and controller-manager's coordinator election use `leases` too) against the audit log's count of all clients and of the agents alone, in the same window. The counter's window is about a second longer (it is scraped again only after the audit log's last second has reached the file), hence a few more requests in its column.\n"
    );
    println!(
        "| window | verb | resource | `apiserver_request_total` increase | audit log, all clients | audit log, the agents |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, usage, metric, agents) in windows {
        for (verb, resource) in AGENT_CALLS {
            let key = (verb.to_owned(), resource.to_owned());
            let all: u64 = usage
                .by_client
                .keys()
                .map(|w| usage.get(w, verb, resource))
                .sum();
            let ours: u64 = agents.iter().map(|w| usage.get(w, verb, resource)).sum();
            let counted = metric.get(&key).copied().unwrap_or(0.0);
            println!("| {name} | {verb} | {resource} | {counted:.0} | {all} | {ours} |");
        }
    }
    println!();
}

pub(crate) fn all_requests(usage: &Usage) -> u64 {
    usage.by_client.values().flat_map(|c| c.values()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_totals_sum_over_the_other_labels_under_the_audit_logs_verbs() {
        let text = r#"# HELP apiserver_request_total Counter of apiserver requests
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 30
apiserver_request_total{code="409",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="APPLY",version="v1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 7
apiserver_request_duration_seconds_count{resource="pods",verb="GET"} 99
"#;
        let totals = parse_totals(text);
        let get = |v: &str, r: &str| totals.get(&(v.to_owned(), r.to_owned())).copied();
        assert_eq!(get("update", "leases"), Some(32.0));
        assert_eq!(get("patch", "pods"), Some(4.0));
        assert_eq!(get("patch", "pods/status"), Some(7.0));
        assert_eq!(totals.len(), 3, "other metrics are not counted: {totals:?}");
    }

    #[test]
    fn a_window_keeps_only_what_grew() {
        let key = |v: &str| (v.to_owned(), "leases".to_owned());
        let before = Totals::from([(key("get"), 10.0), (key("update"), 5.0)]);
        let after = Totals::from([(key("get"), 25.0), (key("update"), 5.0)]);
        assert_eq!(since(&after, &before), Totals::from([(key("get"), 15.0)]));
    }
}
