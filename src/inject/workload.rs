//! Which documents hold pods, and where: Pods, the pod templates of workload controllers, `List`
//! items, and valkey-operator's `ValkeyCluster`. Everything else is not inject's business.

use super::yaml::Node;
use super::{Injection, Notes, Options, Problem, operator, pod};

/// Why an object (or a `List` item) could not be injected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {problem}")]
pub struct Failure {
    /// `StatefulSet valkey`, or `List, item 2 (StatefulSet valkey)`.
    pub what: String,
    pub problem: Problem,
}

/// Injects into the object `doc`.
pub fn inject(
    doc: &mut Node,
    opts: &Options,
    notes: &mut Notes,
) -> Result<Injection, Vec<Failure>> {
    let what = describe(doc);
    object(doc, what, opts, notes)
}

fn object(
    doc: &mut Node,
    what: String,
    opts: &Options,
    notes: &mut Notes,
) -> Result<Injection, Vec<Failure>> {
    let kind = doc.get("kind").and_then(Node::as_str).unwrap_or("");
    if is_list(doc, kind) {
        return list(doc, &what, opts, notes);
    }
    match single(doc, &what, opts, notes) {
        Err(problem) if opts.ignore_missing && problem.is_missing() => {
            notes.warn(format!(
                "{what}: {problem}; left unchanged (--ignore-missing)"
            ));
            Ok(Injection::NotWorkload)
        }
        other => other.map_err(|problem| vec![Failure { what, problem }]),
    }
}

/// An object that is not a `List`.
fn single(
    doc: &mut Node,
    what: &str,
    opts: &Options,
    notes: &mut Notes,
) -> Result<Injection, Problem> {
    let kind = doc
        .get("kind")
        .and_then(Node::as_str)
        .unwrap_or("")
        .to_owned();
    let name = name(doc);
    if kind == "ValkeyCluster" {
        let api = doc.get("apiVersion").and_then(Node::as_str).unwrap_or("");
        if api.starts_with(operator::GROUP) {
            return operator::inject(doc, &name, opts, notes);
        }
        notes.warn(format!(
            "{what} of {api} is not valkey-operator's; left unchanged"
        ));
        return Ok(Injection::NotWorkload);
    }
    let Some(path) = template_path(&kind) else {
        return Ok(Injection::NotWorkload);
    };
    let template = doc.at_mut(path).ok_or(Problem::NoPodSpec)?;
    let owner = pod::Owner { name: &name, what };
    pod::inject(template, &owner, opts, notes)
}

/// Where a kind keeps its pod (`metadata` + `spec`).
fn template_path(kind: &str) -> Option<&'static [&'static str]> {
    match kind {
        "Pod" => Some(&[]),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController" => Some(&["spec", "template"]),
        "CronJob" => Some(&["spec", "jobTemplate", "spec", "template"]),
        "PodTemplate" => Some(&["template"]),
        _ => None,
    }
}

/// `kind: List` (kubectl's) or a typed list such as `StatefulSetList`.
fn is_list(doc: &Node, kind: &str) -> bool {
    kind.ends_with("List") && doc.get("items").and_then(Node::as_seq).is_some()
}

fn list(
    doc: &mut Node,
    what: &str,
    opts: &Options,
    notes: &mut Notes,
) -> Result<Injection, Vec<Failure>> {
    let Some(items) = doc.get_mut("items").and_then(Node::seq_mut) else {
        return Ok(Injection::NotWorkload);
    };
    let mut outcome = Injection::NotWorkload;
    let mut failures = Vec::new();
    for (n, item) in items.iter_mut().enumerate() {
        let item_what = format!("{what}, item {} ({})", n + 1, describe(item));
        match object(item, item_what, opts, notes) {
            Ok(o) => outcome = outcome.max(o),
            Err(f) => failures.extend(f),
        }
    }
    if failures.is_empty() {
        Ok(outcome)
    } else {
        Err(failures)
    }
}

/// `metadata.name`, else `generateName` without its dash, else `valkey`.
fn name(doc: &Node) -> String {
    let meta = |k: &str| doc.at(&["metadata", k]).and_then(Node::as_str);
    meta("name")
        .or_else(|| meta("generateName").map(|n| n.trim_end_matches('-')))
        .unwrap_or("valkey")
        .to_owned()
}

/// `Kind name` for messages.
pub fn describe(doc: &Node) -> String {
    let kind = doc.get("kind").and_then(Node::as_str).unwrap_or("object");
    match doc.at(&["metadata", "name"]).and_then(Node::as_str) {
        Some(name) => format!("{kind} {name}"),
        None => kind.to_owned(),
    }
}
