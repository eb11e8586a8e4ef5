//! The pod status a kubelet reports, as a strategic-merge patch.
//!
//! Conditions merge by `type` and container statuses by `name`, so the patch leaves other
//! writers' conditions alone (the scheduler's `PodScheduled`, the disruption controller's
//! `DisruptionTarget`). Inside a container status, the state keys not in use are sent as `null`:
//! a merge patch would otherwise keep `running` next to a new `terminated`.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::container::{Class, ContainerRuntime, ContainerState, Terminated};
use super::spec::Kind;
use crate::net::lock;

/// When each pod condition last changed, so `lastTransitionTime` is stable between reports.
#[derive(Default)]
pub(crate) struct Transitions(Mutex<HashMap<&'static str, (bool, Timestamp)>>);

impl Transitions {
    fn condition(&self, kind: &'static str, ok: bool) -> Value {
        let mut map = lock(&self.0);
        let entry = map.entry(kind).or_insert((ok, Timestamp::now()));
        if entry.0 != ok {
            *entry = (ok, Timestamp::now());
        }
        json!({
            "type": kind,
            "status": if ok { "True" } else { "False" },
            "lastTransitionTime": time(entry.1),
            "lastProbeTime": null,
        })
    }
}

/// What the status needs besides the containers.
pub(crate) struct PodView<'a> {
    pub object: &'a Pod,
    pub ip: String,
    pub host_ip: String,
    pub start_time: Timestamp,
    pub transitions: &'a Transitions,
    /// Every init container has completed or (a sidecar) started.
    pub initialized: bool,
}

/// One container's status entry and the facts the pod-level status is computed from.
struct Entry<'a> {
    c: &'a ContainerRuntime,
    status: Value,
    ready: bool,
    ran: bool,
}

/// The status patch for the pod's current state. Init containers (regular and sidecars) report
/// in `initContainerStatuses`; Ready needs the pod initialized and every main container and
/// every sidecar ready, as with the kubelet.
pub(crate) fn status_patch(view: &PodView<'_>, containers: &[&ContainerRuntime]) -> Value {
    let entries: Vec<Entry<'_>> = containers.iter().map(|c| entry(c)).collect();
    let (init, main): (Vec<&Entry<'_>>, Vec<&Entry<'_>>) =
        entries.iter().partition(|e| e.c.class != Class::Main);
    let sidecars_ready = init
        .iter()
        .filter(|e| e.c.class == Class::Sidecar)
        .all(|e| e.ready);
    let all_ready =
        view.initialized && !main.is_empty() && main.iter().all(|e| e.ready) && sidecars_ready;
    let t = view.transitions;
    let mut conditions = vec![
        t.condition("PodReadyToStartContainers", true),
        t.condition("Initialized", view.initialized),
        t.condition("ContainersReady", all_ready),
        t.condition("Ready", all_ready),
    ];
    if !has_condition(view.object, "PodScheduled") {
        // Bound directly (no scheduler): the kubelet reports the condition itself.
        conditions.push(t.condition("PodScheduled", true));
    }
    let phase = phase(view.object, view.initialized, &init, &main);
    let statuses = |list: &[&Entry<'_>]| list.iter().map(|e| e.status.clone()).collect::<Vec<_>>();
    let mut patch = json!({ "status": {
        "phase": phase,
        "hostIP": view.host_ip,
        "hostIPs": [{ "ip": view.host_ip }],
        "podIP": view.ip,
        // Replace, not merge: a pod whose runtime was set up again got a new address, and a
        // merged list with two IPv4 addresses is invalid.
        "podIPs": [{ "$patch": "replace" }, { "ip": view.ip }],
        "startTime": time(view.start_time),
        "conditions": conditions,
        "containerStatuses": statuses(&main),
        // Clears a set-up error reported earlier.
        "reason": null,
        "message": null,
    }});
    if !init.is_empty() {
        patch["status"]["initContainerStatuses"] = json!(statuses(&init));
    }
    patch
}

fn entry(c: &ContainerRuntime) -> Entry<'_> {
    let state = lock(&c.state);
    // A regular init container counts as ready once it completed, as the kubelet reports it.
    let ready = match c.class {
        Class::Init => state.terminated.as_ref().is_some_and(|t| t.exit_code == 0),
        Class::Sidecar | Class::Main => state.ready(),
    };
    Entry {
        c,
        status: container_status(c, &state, ready),
        ready,
        ran: state.running_since.is_some() || state.terminated.is_some(),
    }
}

/// `Pending` until initialized (`Failed` if a regular init container failed and will not be
/// retried); then `Running` once a main container has run; with `restartPolicy: Never` /
/// `OnFailure` a pod whose main containers all ended for good is `Succeeded` or `Failed`.
/// Sidecars do not count.
fn phase(pod: &Pod, initialized: bool, init: &[&Entry<'_>], main: &[&Entry<'_>]) -> &'static str {
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let for_good = |e: &Entry<'_>| -> Option<i32> {
        let s = lock(&e.c.state);
        match (&s.terminated, s.restart_at) {
            (Some(t), None) if s.running_since.is_none() => Some(t.exit_code),
            _ => None,
        }
    };
    if !initialized {
        let failed = init
            .iter()
            .filter(|e| e.c.class == Class::Init)
            .any(|e| for_good(e).is_some_and(|code| code != 0));
        return if failed { "Failed" } else { "Pending" };
    }
    let finished: Vec<Option<i32>> = if policy == "Always" {
        Vec::new()
    } else {
        main.iter().map(|e| for_good(e)).collect()
    };
    if !finished.is_empty() && finished.iter().all(Option::is_some) {
        return if finished.iter().all(|c| *c == Some(0)) {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    if main.iter().any(|e| e.ran) {
        "Running"
    } else {
        "Pending"
    }
}

fn has_condition(pod: &Pod, kind: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == kind))
}

fn container_status(c: &ContainerRuntime, state: &ContainerState, ready: bool) -> Value {
    let current = match (&state.running_since, &state.terminated, &state.waiting) {
        (Some(since), _, _) => json!({
            "running": { "startedAt": time(*since) }, "terminated": null, "waiting": null,
        }),
        (None, Some(t), None) => json!({
            "terminated": terminated(t, state.last_pid), "running": null, "waiting": null,
        }),
        (None, _, waiting) => {
            let (reason, message) = waiting
                .clone()
                .unwrap_or_else(|| ("ContainerCreating".into(), String::new()));
            json!({
                "waiting": { "reason": reason, "message": message },
                "running": null, "terminated": null,
            })
        }
    };
    // While a container waits to restart (CrashLoopBackOff), its last run is `lastState`.
    let previous = match (&state.running_since, &state.waiting) {
        (None, Some(_)) => state.terminated.as_ref().or(state.last_terminated.as_ref()),
        _ => state.last_terminated.as_ref(),
    };
    let last = match previous {
        Some(t) => json!({ "terminated": terminated(t, None) }),
        None => json!({ "terminated": null }),
    };
    let mut status = json!({
        "name": c.name,
        "image": c.spec.image.clone().unwrap_or_default(),
        "imageID": format!("valkey-testkit://{}", kind_name(c.kind)),
        "ready": ready,
        "started": state.started(),
        "restartCount": state.restart_count,
        "state": current,
        "lastState": last,
    });
    if let Some(pid) = state.last_pid {
        status["containerID"] = json!(format!("valkey-testkit://{pid}"));
    }
    status
}

fn terminated(t: &Terminated, pid: Option<u32>) -> Value {
    let mut v = json!({
        "exitCode": t.exit_code,
        "reason": t.reason,
        "finishedAt": time(t.finished_at),
    });
    if let Some(s) = t.signal {
        v["signal"] = json!(s);
    }
    if let Some(m) = &t.message {
        v["message"] = json!(m);
    }
    if let Some(at) = t.started_at {
        v["startedAt"] = time(at);
    }
    if let Some(pid) = pid {
        v["containerID"] = json!(format!("valkey-testkit://{pid}"));
    }
    v
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Valkey => "valkey-server",
        Kind::Sidecar => "valkey-sidecar",
        Kind::Pause => "pause",
        Kind::Unsupported => "unsupported",
    }
}

pub(crate) fn time(t: Timestamp) -> Value {
    serde_json::to_value(Time(t)).unwrap_or(Value::Null)
}
