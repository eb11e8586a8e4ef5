//! Injection into a pod: the agent container, probes and the preStop wait on Valkey, the grace
//! period the wait needs, the cluster label the coordinator selects by, the ServiceAccount and
//! its token, for the agent alone.

use super::agent::{self, Agent};
use super::yaml::Node;
use super::{Injection, Mode, Notes, Options, Problem, sentinel};

use crate::k8s::pods::CLUSTER_LABEL;

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE: i64 = 30;

/// The object a pod belongs to: its name (the default cluster name) and `Kind name` for messages.
pub struct Owner<'a> {
    pub name: &'a str,
    pub what: &'a str,
}

/// Injects into `pod`: a Pod, or a pod template (`metadata` and `spec`) of `owner`.
pub fn inject(
    pod: &mut Node,
    owner: &Owner<'_>,
    opts: &Options,
    notes: &mut Notes,
) -> Result<Injection, Problem> {
    let spec = pod.get("spec").ok_or(Problem::NoPodSpec)?;
    if has_agent(spec, &opts.image) {
        return Ok(Injection::AlreadyInjected);
    }
    refuse_sentinel(pod, owner, opts, notes)?;
    let valkey = find_valkey(spec, opts)?;
    if opts.mode.is_none() && valkey.mode == Mode::Replication {
        notes.warn(format!(
            "{}: SIDECAR_MODE=replication, as Valkey's command and args do not say \
             `cluster-enabled yes`; pass --mode cluster if its config file does",
            owner.what
        ));
    }
    let cluster = cluster_name(pod, owner, opts, notes);
    let spec = pod.get_mut("spec").ok_or(Problem::NoPodSpec)?;
    let timeout = prestop_timeout(spec, DEFAULT_GRACE, notes);
    let container = spec
        .get_mut("containers")
        .and_then(Node::seq_mut)
        .and_then(|c| c.get_mut(valkey.index))
        .ok_or(Problem::NoValkey)?;
    add_probes(container, opts.replace_probes);
    add_prestop(container, timeout, notes);
    let agent = Agent::new(opts, valkey.mode, &cluster, valkey.port, timeout);
    add_agent(spec, agent.container(), opts.classic);
    service_account(spec, opts, notes);
    label(pod, &cluster);
    Ok(Injection::Injected)
}

/// A Sentinel-managed pod is refused, or with `--force` injected with a warning.
fn refuse_sentinel(
    pod: &Node,
    owner: &Owner<'_>,
    opts: &Options,
    notes: &mut Notes,
) -> Result<(), Problem> {
    let Some(why) = sentinel::detect(pod) else {
        return Ok(());
    };
    if !opts.force {
        return Err(Problem::Sentinel(why));
    }
    notes.warn(format!(
        "{}: it runs Valkey Sentinel ({why}); injected anyway (--force): Sentinel and the \
         agent's coordinator will both fail primaries over (--env SIDECAR_COORDINATOR=false \
         keeps the agent out of the coordinator election)",
        owner.what
    ));
    Ok(())
}

/// The Valkey container and what it says about the agent's settings.
struct Valkey {
    index: usize,
    mode: Mode,
    port: u16,
}

fn find_valkey(spec: &Node, opts: &Options) -> Result<Valkey, Problem> {
    let containers = spec
        .get("containers")
        .and_then(Node::as_seq)
        .unwrap_or_default();
    let index = valkey_index(containers, opts).ok_or(Problem::NoValkey)?;
    let container = containers.get(index).ok_or(Problem::NoValkey)?;
    Ok(Valkey {
        index,
        mode: opts.mode.unwrap_or_else(|| agent::detect_mode(container)),
        port: agent::detect_port(container),
    })
}

fn has_agent(spec: &Node, image: &str) -> bool {
    ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec.get(k).and_then(Node::as_seq))
        .flatten()
        .any(|c| agent::is_agent(c, image))
}

/// `--container`, else the container named `valkey`, else `server` (valkey-operator), else the
/// first whose image mentions valkey (exporters and Sentinels aside).
pub fn valkey_index(containers: &[Node], opts: &Options) -> Option<usize> {
    let named = |name: &str| {
        containers
            .iter()
            .position(|c| c.get("name").and_then(Node::as_str) == Some(name))
    };
    if let Some(name) = &opts.container {
        return named(name);
    }
    let by_image = || {
        containers.iter().position(|c| {
            let image = c.get("image").and_then(Node::as_str).unwrap_or("");
            // Exporters and Sentinels come as "valkey" images too, but are not the server.
            let helper = ["exporter", "sentinel"].iter().any(|h| image.contains(h));
            image.contains("valkey") && !helper && !agent::is_agent(c, &opts.image)
        })
    };
    named("valkey")
        .or_else(|| named("server"))
        .or_else(by_image)
}

/// `--cluster-name`, else the pod's `valkey.io/cluster` label, else the workload's name.
fn cluster_name(pod: &Node, owner: &Owner<'_>, opts: &Options, notes: &mut Notes) -> String {
    let label = pod
        .at(&["metadata", "labels", CLUSTER_LABEL])
        .and_then(Node::as_str);
    match (&opts.cluster_name, label) {
        (Some(name), Some(label)) if name != label => {
            notes.warn(format!(
                "{}: its pods carry {CLUSTER_LABEL}={label} but --cluster-name is {name}; \
                 set SIDECAR_POD_SELECTOR with --env so the coordinator finds them",
                owner.what
            ));
            name.clone()
        }
        (Some(name), _) => name.clone(),
        (None, Some(label)) => label.to_owned(),
        (None, None) => owner.name.to_owned(),
    }
}

/// The preStop timeout for the pod's grace period: 10 s less (Valkey still has to stop after the
/// hook) and at most a minute (the rest is Valkey's own shutdown, e.g. its final save). A grace
/// period too short for a 5 s wait is raised to 30 s. `default` applies when none is set.
pub fn prestop_timeout(spec: &mut Node, default: i64, notes: &mut Notes) -> u64 {
    let key = "terminationGracePeriodSeconds";
    let grace = spec
        .get(key)
        .and_then(Node::as_str)
        .map(|g| g.parse::<i64>().unwrap_or(0));
    let grace = match grace {
        Some(g) if g < 15 => {
            notes.warn(format!(
                "{key} {g} leaves no time for the hand-over; raised to {DEFAULT_GRACE}"
            ));
            spec.set(key, Node::plain(DEFAULT_GRACE));
            DEFAULT_GRACE
        }
        Some(g) => g,
        None => default,
    };
    u64::try_from(grace - 10).unwrap_or(5).clamp(5, 60)
}

/// Probes on the agent's endpoints, each only where the container has none (or all with
/// `--replace-probes`).
pub fn add_probes(container: &mut Node, replace: bool) {
    for (key, probe) in agent::probes() {
        if replace || container.get(key).is_none() {
            container.set(key, probe);
        }
    }
}

/// The hand-over wait on the Valkey container; an earlier wait gets the current timeout, a hook
/// of someone else's is left alone.
pub fn add_prestop(container: &mut Node, timeout: u64, notes: &mut Notes) {
    let name = container
        .get("name")
        .and_then(Node::as_str)
        .unwrap_or("?")
        .to_owned();
    let Some(lifecycle) = container.entry("lifecycle", || Node::map(vec![])) else {
        return;
    };
    match lifecycle.get("preStop") {
        Some(hook) if !agent::is_agent_prestop(hook) => notes.warn(format!(
            "container {name} already has a preStop hook; the hand-over wait \
             (httpGet {} port 9736) was not added",
            agent::prestop_path(timeout)
        )),
        _ => {
            lifecycle.set("preStop", agent::prestop(timeout));
        }
    }
}

/// Native: the last init container (after the pod's own ones, before Valkey starts). Classic:
/// the last container.
fn add_agent(spec: &mut Node, container: Node, classic: bool) {
    let key = if classic {
        "containers"
    } else {
        "initContainers"
    };
    if let Some(list) = spec
        .entry(key, || Node::seq(vec![]))
        .and_then(Node::seq_mut)
    {
        list.push(container);
    }
}

/// `--service-account` when given; otherwise `valkey-sidecar` for a pod that has none of its own.
fn service_account(spec: &mut Node, opts: &Options, notes: &mut Notes) {
    let current = ["serviceAccountName", "serviceAccount"]
        .iter()
        .find_map(|k| spec.get(k).and_then(Node::as_str))
        .filter(|sa| *sa != "default")
        .map(str::to_owned);
    let account = match (&opts.service_account, current) {
        (Some(explicit), _) => explicit.clone(),
        (None, None) => agent::AGENT_NAME.to_owned(),
        (None, Some(own)) => own,
    };
    notes.warn(format!(
        "the agent runs as ServiceAccount {account}: it needs the chart's RBAC \
         (helm install … --set sidecar.serviceAccount.name={account})"
    ));
    if spec.get("serviceAccountName").and_then(Node::as_str) != Some(account.as_str()) {
        spec.set("serviceAccountName", Node::str(account));
    }
    token_for_the_agent_alone(spec, notes);
}

/// As the chart does: the pod opts out of the token automount and the agent mounts a token of its
/// own ([`agent::token_volume`]), so Valkey and every other container hold no API token. A pod
/// that opts in explicitly keeps the automount (another of its containers may need the API),
/// with a warning.
fn token_for_the_agent_alone(spec: &mut Node, notes: &mut Notes) {
    let key = "automountServiceAccountToken";
    if spec.get(key).and_then(Node::as_str) == Some("true") {
        notes.warn(format!(
            "{key} is true: every container of the pod holds the agent's API token; \
             remove it to give the token to the agent alone"
        ));
    } else {
        spec.set(key, Node::plain(false));
    }
    let Some(volumes) = spec
        .entry("volumes", || Node::seq(vec![]))
        .and_then(Node::seq_mut)
    else {
        return;
    };
    let named = |v: &Node| v.get("name").and_then(Node::as_str) == Some(agent::TOKEN_VOLUME);
    if !volumes.iter().any(named) {
        volumes.push(agent::token_volume());
    }
}

/// The coordinator finds the pods of its cluster by `valkey.io/cluster=<cluster>`.
fn label(pod: &mut Node, cluster: &str) {
    let labels = pod
        .entry("metadata", || Node::map(vec![]))
        .and_then(|m| m.entry("labels", || Node::map(vec![])));
    if let Some(labels) = labels
        && labels.get(CLUSTER_LABEL).is_none()
    {
        labels.set(CLUSTER_LABEL, Node::str(cluster));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prestop_wait_fits_the_grace_period() {
        for (grace, timeout, written) in [
            (None, 20, None),
            (Some("30"), 20, Some("30")),
            (Some("15"), 5, Some("15")),
            (Some("60"), 50, Some("60")),
            (Some("3600"), 60, Some("3600")),
            (Some("10"), 20, Some("30")),
            (Some("0"), 20, Some("30")),
        ] {
            let mut spec = Node::map(vec![]);
            if let Some(g) = grace {
                spec.set("terminationGracePeriodSeconds", Node::plain(g));
            }
            let mut notes = Notes::default();
            assert_eq!(
                prestop_timeout(&mut spec, DEFAULT_GRACE, &mut notes),
                timeout,
                "{grace:?}"
            );
            let after = spec
                .get("terminationGracePeriodSeconds")
                .and_then(Node::as_str);
            assert_eq!(after, written, "{grace:?}");
            assert_eq!(
                notes.iter().count(),
                usize::from(written != grace),
                "{grace:?}"
            );
        }
    }
}
