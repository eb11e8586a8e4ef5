//! From a container spec to a command line: which program, which arguments, which environment.
//!
//! The mapping, kept deliberately small:
//! - **Images.** An image containing `valkey-sidecar` runs the agent binary; another image
//!   containing `valkey` runs `valkey-server`; an image containing `pause` runs `sleep infinity`
//!   (a placeholder pod). Anything else is not run: the container waits with reason
//!   `UnsupportedImage`, except a regular init container, which counts as completed (see the
//!   kubelet module docs). The same mapping holds for init containers and sidecars (the agent
//!   as a native sidecar; `valkey-sidecar --version` as an init container that completes).
//! - **valkey-server arguments.** `command` + `args`, after `$(VAR)` expansion, from the first
//!   `--name` on (a leading `valkey-server` or config-file path is skipped), are passed through
//!   as `--name value...`: what the pod (e.g. the Helm chart) says is what runs, with Valkey's
//!   own defaults for the rest (RDB snapshots, `repl-diskless-sync-delay 5`, no `DEBUG`
//!   command, …). The harness adds no defaults of its own; it only forces, last, what a shared
//!   loopback host must: `bind` and `bind-source-addr` to the pod IP, `logfile`/`daemonize` to
//!   the container's own temp dir, whatever the pod says. The pod's `--dir` (the chart's `/data`
//!   volume, rewritten to its directory here) stays; without one Valkey works in the container's
//!   temp dir. Without `--port` Valkey's 6379 applies.
//! - **Environment.** `value` (with `$(VAR)` expansion of earlier variables), and `valueFrom`:
//!   `fieldRef` (`metadata.name|namespace|uid`, `metadata.labels['k']`,
//!   `metadata.annotations['k']`, `spec.nodeName`, `spec.serviceAccountName`, `status.podIP`,
//!   `status.podIPs`, `status.hostIP`), `resourceFieldRef` (a request or limit the pod sets),
//!   `secretKeyRef` and `configMapKeyRef` (read through the API). `envFrom` is not supported. The process gets only this
//!   environment plus `PATH` (and `RUST_LOG`/`RUST_BACKTRACE` from the harness if the pod does not
//!   set them) and, for a container that mounts the pod's ServiceAccount token at the in-cluster
//!   path ([`api_credentials`]), `KUBECONFIG` with that token: a container without the mount (the
//!   chart's Valkey, under `automountServiceAccountToken: false`) gets no API credentials.
//! - **Pod-local loopback.** All pods share the host's loopback, so a pod's `localhost` is its own
//!   pod IP here: an environment value or exec argument that is exactly `127.0.0.1` or
//!   `localhost`, optionally with `:port`, is rewritten to the pod IP. The agent's admin listener
//!   defaults to `<pod IP>:9737` (a loopback address) unless `SIDECAR_ADMIN_ADDR` is set.
//! - **Volume paths.** The processes are not chrooted, so a path under a `volumeMounts[].mountPath`
//!   is rewritten to the volume's directory on this host: environment values, `command`/`args`
//!   tokens and `exec` probe/hook arguments that equal the mount path or start with `mountPath/`
//!   (e.g. `VALKEY_PASSWORD_FILE=/etc/valkey-auth/password`). The exact rule (`subPath`, longest
//!   match, `$(VAR)`) is in [`super::volume`]. The config-file argument of `valkey-server` is
//!   still skipped.

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, Pod, ResourceFieldSelector, Secret,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Api, Client};

use super::memory::quantity;
use crate::Result;

/// What the kubelet runs for a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Valkey,
    Sidecar,
    Pause,
    Unsupported,
}

pub(crate) fn kind_of(image: &str) -> Kind {
    if image.contains("valkey-sidecar") {
        Kind::Sidecar
    } else if image.contains("valkey") {
        Kind::Valkey
    } else if image.contains("pause") {
        Kind::Pause
    } else {
        Kind::Unsupported
    }
}

/// Default admin port of the agent.
const SIDECAR_ADMIN_PORT: u16 = 9737;

/// Settings the harness forces on every `valkey-server`, after the pod's own arguments: every
/// pod shares the host, so each must listen and connect from its own address and keep its files
/// apart.
const VALKEY_FORCED: [&str; 4] = ["bind", "bind-source-addr", "logfile", "daemonize"];

/// The `valkey-server` arguments for a container with `tokens` (`command` + `args`, expanded,
/// volume paths rewritten): the pod's own, then the forced ones. The pod's own `--dir` stays (it
/// names a mounted volume, e.g. the chart's `/data`, so data lives where the pod keeps it);
/// without one, Valkey works in the container's own directory, `dir`.
pub(crate) fn valkey_args(tokens: &[String], ip: Ipv4Addr, dir: &Path) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    let groups = flag_groups(tokens);
    for (name, values) in &groups {
        if VALKEY_FORCED.contains(&name.as_str()) {
            continue;
        }
        out.push(format!("--{name}").into());
        out.extend(values.iter().map(OsString::from));
    }
    let ip = ip.to_string();
    out.extend(["--bind".into(), ip.clone().into()]);
    out.extend(["--bind-source-addr".into(), ip.into()]);
    out.extend(["--daemonize".into(), "no".into()]);
    if !groups.iter().any(|(name, _)| name == "dir") {
        out.extend(["--dir".into(), dir.as_os_str().to_owned()]);
    }
    out.extend(["--logfile".into(), dir.join("valkey.log").into_os_string()]);
    out
}

/// A Valkey container's command line split at a wrapper in front of `valkey-server` (the chart's
/// `valkey-sidecar await … -- valkey-server …`): the wrapper's tokens (program first) and
/// Valkey's; no wrapper when the command starts with `valkey-server` or has no `--`.
pub(crate) fn split_wrapper(tokens: &[String]) -> (Option<&[String]>, &[String]) {
    let plain = tokens.first().is_none_or(|t| t.ends_with("valkey-server"));
    match tokens.iter().position(|t| t == "--") {
        Some(at) if !plain && at > 0 => (Some(&tokens[..at]), &tokens[at + 1..]),
        _ => (None, tokens),
    }
}

/// The `--port` of a valkey container (6379 if absent).
pub(crate) fn valkey_port(tokens: &[String]) -> u16 {
    flag_groups(tokens)
        .into_iter()
        .rev()
        .find(|(n, _)| n == "port")
        .and_then(|(_, v)| v.first()?.parse().ok())
        .unwrap_or(6379)
}

/// `--name v1 v2 --other v` into `(name, values)` groups, from the first `--` token on.
fn flag_groups(tokens: &[String]) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for token in tokens.iter().skip_while(|t| !t.starts_with("--")) {
        match token.strip_prefix("--") {
            Some(name) if !name.is_empty() => groups.push((name.to_owned(), Vec::new())),
            _ => {
                if let Some((_, values)) = groups.last_mut() {
                    values.push(token.clone());
                }
            }
        }
    }
    groups
}

/// `command` followed by `args`, with `$(VAR)` references expanded from `env`.
pub(crate) fn command_line(container: &Container, env: &[(String, String)]) -> Vec<String> {
    let command = container.command.iter().flatten();
    let args = container.args.iter().flatten();
    command.chain(args).map(|t| expand(t, env)).collect()
}

/// Kubernetes' `$(VAR)` expansion: a defined variable is replaced, an undefined reference stays as
/// written, `$$` is a literal `$`.
pub(crate) fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(close) = after.strip_prefix('(').and_then(|s| s.find(')')) {
            let name = &after[1..=close];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&rest[at..at + close + 3]),
            }
            rest = &after[close + 2..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// `127.0.0.1[:port]` or `localhost[:port]` becomes `<pod ip>[:port]` (see the module docs).
pub(crate) fn localize(value: &str, ip: Ipv4Addr) -> String {
    for host in ["127.0.0.1", "localhost"] {
        if let Some(rest) = value.strip_prefix(host)
            && (rest.is_empty() || rest.strip_prefix(':').is_some_and(is_port))
        {
            return format!("{ip}{rest}");
        }
    }
    value.to_owned()
}

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.parse::<u16>().is_ok()
}

/// What a container's environment needs to know about its pod.
pub(crate) struct PodFacts<'a> {
    pub pod: &'a Pod,
    pub ip: Ipv4Addr,
    pub host_ip: String,
}

/// The container's own environment as a real pod would see it (see the module docs).
pub(crate) async fn pod_env(
    client: &Client,
    facts: &PodFacts<'_>,
    container: &Container,
) -> Result<Vec<(String, String)>> {
    let mut env: Vec<(String, String)> = Vec::new();
    for var in container.env.iter().flatten() {
        let value = env_value(client, facts, container, var, &env)
            .await
            .with_context(|| format!("env {} of container {}", var.name, container.name))?;
        env.push((var.name.clone(), localize(&value, facts.ip)));
    }
    Ok(env)
}

/// Where the kubelet mounts a pod's API credentials: what in-cluster clients read.
pub(crate) const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Whether `container` gets the pod's API credentials: it mounts, at [`SERVICE_ACCOUNT_DIR`], a
/// projected volume with a `serviceAccountToken` source — the apiserver's ServiceAccount admission
/// adds one to every container unless the pod says `automountServiceAccountToken: false`, and a
/// pod may mount one itself into the containers that should have it.
pub(crate) fn api_credentials(pod: &Pod, container: &Container) -> bool {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let has_token = |name: &str| {
        volumes
            .into_iter()
            .flatten()
            .filter(|v| v.name == name)
            .filter_map(|v| v.projected.as_ref()?.sources.as_ref())
            .flatten()
            .any(|s| s.service_account_token.is_some())
    };
    container
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path.trim_end_matches('/') == SERVICE_ACCOUNT_DIR && has_token(&m.name))
}

/// `env` (from [`pod_env`]) plus the harness's additions; `kubeconfig` for a container with
/// [`api_credentials`] (the harness's stand-in for the files in-cluster clients read).
pub(crate) fn harness_env(
    mut env: Vec<(String, String)>,
    facts: &PodFacts<'_>,
    kind: Kind,
    kubeconfig: Option<&Path>,
) -> Vec<(String, String)> {
    let defined = |env: &[(String, String)], k: &str| env.iter().any(|(n, _)| n == k);
    if kind == Kind::Sidecar && !defined(&env, "SIDECAR_ADMIN_ADDR") {
        env.push((
            "SIDECAR_ADMIN_ADDR".into(),
            format!("{}:{SIDECAR_ADMIN_PORT}", facts.ip),
        ));
    }
    for k in ["PATH", "RUST_LOG", "RUST_BACKTRACE"] {
        if !defined(&env, k)
            && let Ok(v) = std::env::var(k)
        {
            env.push((k.into(), v));
        }
    }
    if let Some(path) = kubeconfig {
        env.push(("KUBECONFIG".into(), path.to_string_lossy().into_owned()));
    }
    env
}

async fn env_value(
    client: &Client,
    facts: &PodFacts<'_>,
    container: &Container,
    var: &EnvVar,
    earlier: &[(String, String)],
) -> Result<String> {
    if let Some(value) = &var.value {
        return Ok(expand(value, earlier));
    }
    let Some(from) = &var.value_from else {
        return Ok(String::new());
    };
    let namespace = facts.pod.metadata.namespace.as_deref().unwrap_or("default");
    if let Some(field) = &from.field_ref {
        return field_ref(facts, &field.field_path);
    }
    if let Some(field) = &from.resource_field_ref {
        return resource_field(facts.pod, &container.name, field);
    }
    if let Some(key) = &from.secret_key_ref {
        let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let secret = api.get_opt(&key.name).await?;
        let value = secret
            .and_then(|s| s.data)
            .and_then(|d| d.get(&key.key).cloned())
            .map(|b| String::from_utf8_lossy(&b.0).into_owned());
        return optional(
            value,
            key.optional,
            &format!("secret {}/{}", key.name, key.key),
        );
    }
    if let Some(key) = &from.config_map_key_ref {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let value = api
            .get_opt(&key.name)
            .await?
            .and_then(|c| c.data)
            .and_then(|d| d.get(&key.key).cloned());
        return optional(
            value,
            key.optional,
            &format!("configmap {}/{}", key.name, key.key),
        );
    }
    bail!("only value, fieldRef, resourceFieldRef, secretKeyRef and configMapKeyRef are supported")
}

fn optional(value: Option<String>, optional: Option<bool>, what: &str) -> Result<String> {
    match value {
        Some(v) => Ok(v),
        None if optional == Some(true) => Ok(String::new()),
        None => bail!("{what} not found"),
    }
}

/// The downward API's `fieldRef` paths.
pub(crate) fn field_ref(facts: &PodFacts<'_>, path: &str) -> Result<String> {
    let meta = &facts.pod.metadata;
    let spec = facts.pod.spec.as_ref();
    let lookup = |map: &Option<std::collections::BTreeMap<String, String>>, key: &str| {
        map.as_ref()
            .and_then(|m| m.get(key).cloned())
            .unwrap_or_default()
    };
    if let Some(key) = bracketed(path, "metadata.labels") {
        return Ok(lookup(&meta.labels, key));
    }
    if let Some(key) = bracketed(path, "metadata.annotations") {
        return Ok(lookup(&meta.annotations, key));
    }
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        "status.podIP" | "status.podIPs" => facts.ip.to_string(),
        "status.hostIP" | "status.hostIPs" => facts.host_ip.clone(),
        other => bail!("fieldRef {other} is not supported"),
    })
}

/// The downward API's `resourceFieldRef`: a container's (this one's unless named) request or
/// limit in `divisor` units, rounded up as the kubelet rounds. A real kubelet gives the node's
/// allocatable for a limit the container does not set; the harness refuses that case rather than
/// invent a figure.
pub(crate) fn resource_field(
    pod: &Pod,
    own: &str,
    field: &ResourceFieldSelector,
) -> Result<String> {
    let name = field
        .container_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(own);
    let spec = pod.spec.as_ref().context("a pod without spec")?;
    let container = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .with_context(|| format!("resourceFieldRef: no container {name}"))?;
    let resources = container.resources.as_ref();
    let set = match field.resource.split_once('.') {
        Some(("limits", key)) => resources.and_then(|r| r.limits.as_ref()?.get(key)),
        Some(("requests", key)) => resources.and_then(|r| r.requests.as_ref()?.get(key)),
        _ => bail!("resourceFieldRef {}: not supported", field.resource),
    };
    let value = set.with_context(|| {
        format!(
            "resourceFieldRef {}: container {name} sets none",
            field.resource
        )
    })?;
    // The apiserver stores an unset divisor as "0"; the kubelet reads zero as 1.
    let divisor = match field.divisor.as_ref().map(|d| quantity(&d.0)).transpose()? {
        Some(d) if d > 0.0 => d,
        _ => 1.0,
    };
    let units = quantity(&value.0)? / divisor;
    Ok(format!("{}", units.ceil()))
}

/// `metadata.labels['key']` → `key`.
fn bracketed<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let inner = path
        .strip_prefix(prefix)?
        .strip_prefix("['")?
        .strip_suffix("']")?;
    Some(inner)
}

/// A probe's or hook's port: a number, or the name of one of the container's ports.
pub(crate) fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).with_context(|| format!("bad port {n}")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .with_context(|| format!("container {} has no port named {name}", container.name))
        }
    }
}

/// Where an exec hook's or probe's program lives on this host: the agent and `valkey-server` by
/// their well-known names, everything else from `PATH` (absolute paths as given).
pub(crate) fn host_program(name: &str, binaries: &HashMap<&'static str, PathBuf>) -> PathBuf {
    let base = Path::new(name)
        .file_name()
        .and_then(|b| b.to_str())
        .unwrap_or(name);
    if let Some(path) = binaries.get(base) {
        return path.clone();
    }
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_fields_are_another_containers_limits_in_divisor_units_rounded_up() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "init"}],
                "containers": [{"name": "valkey", "resources": {
                    "limits": {"memory": "256Mi"}, "requests": {"cpu": "250m"}}}],
            },
        }))
        .unwrap();
        let field = |container: &str, resource: &str, divisor: Option<&str>| {
            let f: ResourceFieldSelector = serde_json::from_value(serde_json::json!({
                "containerName": container, "resource": resource, "divisor": divisor,
            }))
            .unwrap();
            resource_field(&pod, "init", &f)
        };
        assert_eq!(field("valkey", "limits.memory", None).unwrap(), "268435456");
        assert_eq!(
            field("valkey", "limits.memory", Some("1Mi")).unwrap(),
            "256"
        );
        assert_eq!(field("valkey", "limits.memory", Some("1Gi")).unwrap(), "1");
        assert_eq!(field("valkey", "requests.cpu", Some("1m")).unwrap(), "250");
        assert_eq!(field("valkey", "requests.cpu", None).unwrap(), "1");
        assert_eq!(
            field("valkey", "limits.memory", Some("0")).unwrap(),
            "268435456"
        );
        assert!(field("init", "limits.memory", None).is_err());
        assert!(field("nope", "limits.memory", None).is_err());
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn expands_like_kubernetes() {
        let e = env(&[("A", "1"), ("POD_IP", "127.1.1.1")]);
        assert_eq!(expand("$(POD_IP):6379", &e), "127.1.1.1:6379");
        assert_eq!(expand("x$(MISSING)y", &e), "x$(MISSING)y");
        assert_eq!(expand("$$(A)", &e), "$(A)");
        assert_eq!(expand("a$b$(A", &e), "a$b$(A");
        assert_eq!(expand("$(A)$(A)", &e), "11");
    }

    #[test]
    fn localhost_is_the_pod_ip() {
        let ip = Ipv4Addr::new(127, 1, 2, 3);
        assert_eq!(localize("127.0.0.1:6379", ip), "127.1.2.3:6379");
        assert_eq!(localize("localhost", ip), "127.1.2.3");
        assert_eq!(localize("localhost:x", ip), "localhost:x");
        assert_eq!(localize("127.0.0.10:1", ip), "127.0.0.10:1");
        assert_eq!(localize("cluster", ip), "cluster");
    }

    #[test]
    fn valkey_args_pass_flags_and_force_addresses() {
        let tokens: Vec<String> = [
            "valkey-server",
            "/etc/valkey.conf",
            "--port",
            "7000",
            "--cluster-enabled",
            "yes",
            "--bind",
            "0.0.0.0",
            "--save",
            "900",
            "1",
        ]
        .map(String::from)
        .to_vec();
        let ip = Ipv4Addr::new(127, 1, 0, 1);
        let args: Vec<String> = valkey_args(&tokens, ip, Path::new("/d"))
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        assert!(
            joined.starts_with("--port 7000 --cluster-enabled yes --save 900 1 --bind"),
            "the pod's arguments and nothing of the harness's before them: {joined}"
        );
        assert!(!joined.contains("0.0.0.0"));
        assert!(joined.ends_with("--bind 127.1.0.1 --bind-source-addr 127.1.0.1 --daemonize no --dir /d --logfile /d/valkey.log"));
        assert_eq!(valkey_port(&tokens), 7000);
        assert_eq!(valkey_port(&[]), 6379);
        let wrapped: Vec<String> = [
            "/opt/x/valkey-sidecar",
            "await",
            "--url",
            "u",
            "--",
            "valkey-server",
            "--port",
            "7000",
        ]
        .map(String::from)
        .to_vec();
        let (wrapper, valkey) = split_wrapper(&wrapped);
        assert_eq!(wrapper.map(<[String]>::len), Some(4));
        assert_eq!(valkey_port(valkey), 7000);
        assert_eq!(split_wrapper(&tokens).0, None);
        // The pod's own data directory (a volume, rewritten to its place on this host) stays.
        let own = ["--dir".to_string(), "/volumes/data".to_string()];
        let joined = valkey_args(&own, ip, Path::new("/d"))
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(joined.starts_with("--dir /volumes/data --bind"), "{joined}");
        assert!(!joined.contains("--dir /d"), "{joined}");
    }

    #[test]
    fn images_map_to_programs() {
        assert_eq!(kind_of("ghcr.io/x/valkey-sidecar:0.1"), Kind::Sidecar);
        assert_eq!(kind_of("valkey/valkey:9.1"), Kind::Valkey);
        assert_eq!(kind_of("registry.k8s.io/pause:3.10"), Kind::Pause);
        assert_eq!(kind_of("nginx"), Kind::Unsupported);
    }
}
