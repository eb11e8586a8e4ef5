//! valkey-operator's `ValkeyCluster` (`valkey.io/v1alpha1`): its pods are the operator's, and
//! `spec.containers` is a strategic merge patch onto them — an entry named `server` merges into
//! the Valkey container, any other name is appended as a regular container.
//!
//! So the agent goes in as a classic sidecar (with its own preStop), the hand-over wait goes on
//! `server`, and the operator's exec probes stay: a merge would add our `httpGet` next to their
//! `exec`, which the apiserver rejects (one handler per probe).

use super::agent::{self, Agent};
use super::pod;
use super::yaml::Node;
use super::{Injection, Mode, Notes, Options, Problem};

/// The API group whose `ValkeyCluster` this is (others, e.g. other operators', are left alone).
pub const GROUP: &str = "valkey.io/";

/// valkey-operator's port for Valkey.
const OPERATOR_PORT: u16 = 6379;

pub fn inject(
    doc: &mut Node,
    name: &str,
    opts: &Options,
    notes: &mut Notes,
) -> Result<Injection, Problem> {
    let spec = doc
        .entry("spec", || Node::map(vec![]))
        .ok_or(Problem::NoPodSpec)?;
    let containers = spec
        .get("containers")
        .and_then(Node::as_seq)
        .unwrap_or_default();
    if containers.iter().any(|c| agent::is_agent(c, &opts.image)) {
        return Ok(Injection::AlreadyInjected);
    }
    // Unset, the operator derives at least 30 s: the default wait fits.
    let timeout = pod::prestop_timeout(spec, pod::DEFAULT_GRACE, notes);
    let containers = spec
        .entry("containers", || Node::seq(vec![]))
        .and_then(Node::seq_mut)
        .ok_or(Problem::NoPodSpec)?;
    pod::add_prestop(server(containers, opts), timeout, notes);
    let mode = opts.mode.unwrap_or(Mode::Cluster);
    let cluster = opts.cluster_name.as_deref().unwrap_or(name);
    // Whatever `--classic` says: an appended entry is a regular container.
    // The operator makes the pods and their volumes: the agent uses the automounted token, which
    // every container of those pods holds (said below).
    let agent = Agent {
        native: false,
        prestop: Some(timeout),
        own_token: false,
        ..Agent::new(opts, mode, cluster, OPERATOR_PORT, timeout)
    };
    containers.push(agent.container());
    notes.warn(format!(
        "ValkeyCluster {name}: the agent is a classic sidecar and the operator's own probes stay on \
         `server`; its pods' ServiceAccount needs the chart's RBAC, and its token is mounted into \
         every container of the operator's pods"
    ));
    Ok(Injection::Injected)
}

/// The patch entry for the Valkey container (`server`, or `--container`), added when missing.
fn server<'a>(containers: &'a mut Vec<Node>, opts: &Options) -> &'a mut Node {
    let name = opts.container.as_deref().unwrap_or("server");
    let named = |c: &Node| c.get("name").and_then(Node::as_str) == Some(name);
    let index = match containers.iter().position(named) {
        Some(index) => index,
        None => {
            containers.push(Node::map(vec![("name", Node::str(name))]));
            containers.len() - 1
        }
    };
    &mut containers[index]
}
