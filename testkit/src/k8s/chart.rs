//! The production chart (`charts/valkey-sidecar`) with the real `helm`: rendering, linting,
//! installing it into the harness's control plane (see [`super::Stage`]), and reading what it
//! rendered.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use super::util::poll_until;
use super::valkey::{CLUSTER_LABEL, NODE_INDEX_LABEL, SHARD_INDEX_LABEL};
use super::{ControlPlane, StageOptions};
use crate::Result;

/// The `helm` binary: `$HELM_BIN`, else `scripts/helm-bin.sh` (builds it if needed).
pub fn helm_bin() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("HELM_BIN") {
        return Ok(PathBuf::from(p));
    }
    crate::binaries::path_from_script("helm-bin.sh")
}

/// The chart's directory in this repository.
pub fn chart_dir() -> PathBuf {
    crate::repo_root().join("charts/valkey-sidecar")
}

/// The chart as helm arguments: [`StageOptions::chart`], else this repository's chart directory.
pub fn chart_source(opts: &StageOptions) -> Vec<String> {
    match opts.chart.is_empty() {
        true => vec![chart_dir().display().to_string()],
        false => opts.chart.clone(),
    }
}

/// `examples/<name>.yaml` of this repository.
pub fn example(name: &str) -> PathBuf {
    chart_dir().join(format!("../../examples/{name}.yaml"))
}

/// The kinds the chart may render that are cluster-scoped: what a namespace admin cannot create
/// (the `namespace` and `restricted` profiles render none of them).
pub const CLUSTER_SCOPED_KINDS: &[&str] = &[
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
];

/// `helm template <release> <chart> --namespace <namespace> -f <values>... --set <sets>...`: the
/// rendered manifests.
pub fn render(
    release: &str,
    namespace: &str,
    values: &[PathBuf],
    sets: &[String],
) -> Result<String> {
    let mut args: Vec<String> = vec![
        "template".into(),
        release.into(),
        chart_dir().display().to_string(),
        "--namespace".into(),
        namespace.into(),
    ];
    args.extend(value_args(values, sets, &[]));
    helm(&args)
}

/// What a stage's options render to, with `capabilities` as `helm template` takes them
/// (`--kube-version`, `--api-versions`; see [`capabilities`]).
pub fn render_stage(opts: &StageOptions, capabilities: &[String]) -> Result<String> {
    let mut args: Vec<String> = vec!["template".into(), opts.release.clone()];
    args.extend(chart_source(opts));
    args.extend(["--namespace".into(), opts.namespace.clone()]);
    args.extend(capabilities.iter().cloned());
    args.extend(value_args(&opts.values, &opts.sets, &opts.set_strings));
    helm(&args)
}

/// What the live apiserver serves, as `helm template` arguments: `--kube-version` and one
/// `--api-versions` per group/version and group/version/Kind — what `helm install` learns by
/// discovery, and what GitOps tools (Argo CD) pass to `helm template` for the target cluster.
pub async fn capabilities(plane: &ControlPlane) -> Result<Vec<String>> {
    let client = plane.client();
    let version = client.apiserver_version().await?;
    let discovery = kube::discovery::Discovery::new(client).run().await?;
    let mut served = BTreeSet::new();
    for group in discovery.groups() {
        for version in group.versions() {
            for (resource, _) in group.versioned_resources(version) {
                served.insert(resource.api_version.clone());
                served.insert(format!("{}/{}", resource.api_version, resource.kind));
            }
        }
    }
    let mut args = vec!["--kube-version".to_owned(), version.git_version];
    for v in served {
        args.extend(["--api-versions".to_owned(), v]);
    }
    Ok(args)
}

/// `--values`, `--set` and `--set-string` arguments, in that order.
fn value_args(values: &[PathBuf], sets: &[String], strings: &[String]) -> Vec<String> {
    let files = values
        .iter()
        .flat_map(|v| ["--values".to_owned(), v.display().to_string()]);
    let sets = sets.iter().flat_map(|s| ["--set".to_owned(), s.clone()]);
    let strings = strings
        .iter()
        .flat_map(|s| ["--set-string".to_owned(), s.clone()]);
    files.chain(sets).chain(strings).collect()
}

/// `helm lint --strict` of the chart with `values`; its output.
pub fn lint(values: &[PathBuf]) -> Result<String> {
    let mut args: Vec<String> = vec![
        "lint".into(),
        "--strict".into(),
        chart_dir().display().to_string(),
    ];
    for v in values {
        args.extend(["--values".into(), v.display().to_string()]);
    }
    helm(&args)
}

/// `helm` with `args`; its output, or an error with what it printed.
pub fn helm(args: &[String]) -> Result<String> {
    let out = std::process::Command::new(helm_bin()?)
        .args(args)
        .output()
        .context("running helm")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "helm {} failed: {}{}",
            args.first().map_or("", String::as_str),
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// The documents of a rendered stream, without empty ones.
pub fn documents(rendered: &str) -> Vec<&str> {
    rendered
        .split("\n---")
        .map(|d| d.trim_start_matches("---").trim())
        .filter(|d| d.lines().any(|l| l.starts_with("kind:")))
        .collect()
}

/// The `kind:` of a rendered document.
pub fn kind_of(document: &str) -> Option<&str> {
    document
        .lines()
        .find_map(|l| l.strip_prefix("kind:"))
        .map(str::trim)
}

/// `"a.b.c.d"` values in an event message.
pub(crate) fn quoted_ips(message: &str) -> BTreeSet<String> {
    message
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_owned)
        .collect()
}

/// The pod's node, once scheduled.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// A label of the pod.
pub fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The pods grouped by `valkey.io/shard-index`, each shard ordered by `valkey.io/node-index`
/// (pod 0, the intended primary, first).
pub fn shards(pods: &[Pod]) -> BTreeMap<String, Vec<Pod>> {
    let mut shards: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for pod in pods {
        let shard = label(pod, SHARD_INDEX_LABEL).unwrap_or("?").to_owned();
        shards.entry(shard).or_default().push(pod.clone());
    }
    for members in shards.values_mut() {
        // As the agent reads it: node-index, else the StatefulSet's pod index (on a first
        // `helm install` the StatefulSets may create pods before the node-index policy is in force).
        members.sort_by_key(|p| {
            label(p, NODE_INDEX_LABEL)
                .or_else(|| label(p, "apps.kubernetes.io/pod-index"))
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(u32::MAX)
        });
    }
    shards
}

/// Installs the chart as `opts` say: `helm install`, or rendered and applied with the admission
/// policies first. Returns the cluster name and the manifest file.
pub(crate) async fn install(
    plane: &ControlPlane,
    opts: &StageOptions,
) -> Result<(String, PathBuf)> {
    match opts.helm_install {
        true => helm_install(plane, opts).await,
        false => apply_rendered(plane, opts).await,
    }
}

/// Renders and applies the chart: admission policies first (and the node-index policy checked in
/// force), then the rest. Returns the cluster name and the manifest file.
async fn apply_rendered(plane: &ControlPlane, opts: &StageOptions) -> Result<(String, PathBuf)> {
    // `helm test`'s pod is a hook, not an object of the release: applied, it would run at once.
    let mut args = capabilities(plane).await?;
    args.push("--skip-tests".into());
    let rendered = render_stage(opts, &args)?;
    let docs = documents(&rendered);
    let is_policy = |d: &&str| {
        kind_of(d).is_some_and(|k| {
            k.ends_with("AdmissionPolicy") || k.ends_with("AdmissionPolicyBinding")
        })
    };
    let (policies, rest): (Vec<&str>, Vec<&str>) = docs.into_iter().partition(is_policy);
    let cluster = cluster_of(&rendered)?;
    let dir = plane.dir();
    // One set of files per release: several may be installed side by side.
    let base = format!("chart-{}-{}", opts.namespace, opts.release);
    let manifest = dir.join(format!("{base}.yaml"));
    std::fs::write(&manifest, &rendered)?;
    if !policies.is_empty() {
        let file = dir.join(format!("{base}-policies.yaml"));
        kubectl_apply(plane, &file, &policies, opts).await?;
    }
    let mutating = policies
        .iter()
        .filter(|d| kind_of(d) == Some("MutatingAdmissionPolicy"));
    let zones = mutating.clone().any(|d| d.contains("placement.zones"));
    if mutating.count() > 0 {
        wait_mutating_policies(plane, &opts.namespace, &cluster, zones).await?;
    }
    let file = dir.join(format!("{base}-objects.yaml"));
    kubectl_apply(plane, &file, &rest, opts).await?;
    Ok((cluster, manifest))
}

/// `helm install` into the plane (no `--wait`: the pods come up on their own).
async fn helm_install(plane: &ControlPlane, opts: &StageOptions) -> Result<(String, PathBuf)> {
    let rendered = render_stage(opts, &capabilities(plane).await?)?;
    let cluster = cluster_of(&rendered)?;
    let base = format!("chart-{}-{}", opts.namespace, opts.release);
    let manifest = plane.dir().join(format!("{base}.yaml"));
    std::fs::write(&manifest, &rendered)?;
    let mut args: Vec<String> = vec!["install".into(), opts.release.clone()];
    args.extend(chart_source(opts));
    args.extend([
        "--namespace".into(),
        opts.namespace.clone(),
        "--kubeconfig".into(),
        plane.kubeconfig_path().display().to_string(),
    ]);
    if let Some(user) = &opts.install_as {
        args.extend(["--kube-as-user".into(), user.clone()]);
    }
    args.extend(value_args(&opts.values, &opts.sets, &opts.set_strings));
    helm(&args)?;
    Ok((cluster, manifest))
}

fn cluster_of(rendered: &str) -> Result<String> {
    rendered
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{CLUSTER_LABEL}:")))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .context("the rendered chart names no valkey.io/cluster")
}

async fn kubectl_apply(
    plane: &ControlPlane,
    file: &Path,
    docs: &[&str],
    opts: &StageOptions,
) -> Result<()> {
    std::fs::write(file, docs.join("\n---\n"))?;
    let file = file.display().to_string();
    let mut args = vec!["apply", "--server-side", "-f", &file];
    let user = opts.install_as.as_ref().map(|u| format!("--as={u}"));
    args.extend(user.as_deref());
    plane.kubectl(&args).await?;
    Ok(())
}

/// Waits until a pod created like the StatefulSet controller creates one comes back with
/// `valkey.io/node-index` (and, with `zones`, a node affinity): a server-side dry run.
async fn wait_mutating_policies(
    plane: &ControlPlane,
    namespace: &str,
    cluster: &str,
    zones: bool,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(plane.client(), namespace);
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "node-index-probe",
            "labels": {
                CLUSTER_LABEL: cluster,
                "apps.kubernetes.io/pod-index": "7",
                SHARD_INDEX_LABEL: "0",
            },
        },
        "spec": { "containers": [{ "name": "c", "image": "registry.k8s.io/pause:3.10" }] },
    }))?;
    let pinned = |p: &Pod| {
        let affinity = p.spec.as_ref().and_then(|s| s.affinity.as_ref());
        !zones || affinity.is_some_and(|a| a.node_affinity.is_some())
    };
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    poll_until(
        "the mutating admission policies in force",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let created = api.create(&params, &probe).await?;
            Ok(label(&created, NODE_INDEX_LABEL) == Some("7") && pinned(&created))
        },
    )
    .await
}

/// One command on a fresh connection, as the default user with `password` (if any).
pub fn cmd(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> Result<redis::Value> {
    super::valkey::cmd_as(addr, password, args)
}

/// Text of a bulk or simple string reply.
pub fn text(v: redis::Value) -> Result<String> {
    match v {
        redis::Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => Ok(s),
        other => bail!("expected text, got {other:?}"),
    }
}

/// `master` / `slave` as Valkey's `ROLE` says.
pub fn role(addr: SocketAddr, password: Option<&str>) -> Result<String> {
    match cmd(addr, password, &["ROLE"])? {
        redis::Value::Array(items) => text(items.into_iter().next().context("empty ROLE")?),
        other => bail!("ROLE answered {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_split_on_separators_and_keep_kinds() {
        let stream = "---\n# Source: a\nkind: A\nx: 1\n---\n# only a comment\n---\nkind: B\n";
        let docs = documents(stream);
        assert_eq!(docs.len(), 2);
        assert_eq!(
            docs.iter().map(|d| kind_of(d)).collect::<Vec<_>>(),
            [Some("A"), Some("B")]
        );
    }

    #[test]
    fn ips_are_read_from_quoted_values() {
        let msg = r#"[endpoints[0].addresses[0]: Invalid value: "127.1.0.4": may not be in the loopback range (127.0.0.0/8, ::1/128), endpoints[1].addresses[0]: Invalid value: "127.1.0.9": x] "exp-7j99r""#;
        let ips: Vec<String> = quoted_ips(msg).into_iter().collect();
        assert_eq!(ips, ["127.1.0.4", "127.1.0.9"]);
    }

    #[test]
    fn passwords_are_percent_encoded() {
        use crate::k8s::valkey::percent_encode;
        assert_eq!(percent_encode("aZ9-_"), "aZ9-_");
        assert_eq!(percent_encode("a b@/"), "a%20b%40%2F");
    }
}
