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

use super::container::{ContainerRuntime, ContainerState, Terminated};
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
}

/// The status patch for the pod's current state.
pub(crate) fn status_patch(view: &PodView<'_>, containers: &[&ContainerRuntime]) -> Value {
    let states: Vec<(&ContainerRuntime, Value, bool, bool)> = containers
        .iter()
        .map(|c| {
            let state = lock(&c.state);
            (
                *c,
                container_status(c, &state),
                state.ready(),
                has_run(&state),
            )
        })
        .collect();
    let all_ready = !states.is_empty() && states.iter().all(|(_, _, ready, _)| *ready);
    let t = view.transitions;
    let mut conditions = vec![
        t.condition("PodReadyToStartContainers", true),
        t.condition("Initialized", true),
        t.condition("ContainersReady", all_ready),
        t.condition("Ready", all_ready),
    ];
    if !has_condition(view.object, "PodScheduled") {
        // Bound directly (no scheduler): the kubelet reports the condition itself.
        conditions.push(t.condition("PodScheduled", true));
    }
    let phase = phase(view.object, &states);
    json!({ "status": {
        "phase": phase,
        "hostIP": view.host_ip,
        "hostIPs": [{ "ip": view.host_ip }],
        "podIP": view.ip,
        "podIPs": [{ "ip": view.ip }],
        "startTime": time(view.start_time),
        "conditions": conditions,
        "containerStatuses": states.into_iter().map(|(_, s, _, _)| s).collect::<Vec<_>>(),
        // Clears a set-up error reported earlier.
        "reason": null,
        "message": null,
    }})
}

fn has_run(state: &ContainerState) -> bool {
    state.running_since.is_some() || state.terminated.is_some()
}

/// `Running` once a container has run; with `restartPolicy: Never`/`OnFailure` a pod whose
/// containers all ended for good is `Succeeded` or `Failed`.
fn phase(pod: &Pod, states: &[(&ContainerRuntime, Value, bool, bool)]) -> &'static str {
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let finished: Vec<Option<i32>> = states
        .iter()
        .map(|(c, ..)| {
            let s = lock(&c.state);
            match (&s.terminated, s.restart_at) {
                (Some(t), None) if policy != "Always" => Some(t.exit_code),
                _ => None,
            }
        })
        .collect();
    if !finished.is_empty() && finished.iter().all(Option::is_some) {
        return if finished.iter().all(|c| *c == Some(0)) {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    if states.iter().any(|(_, _, _, ran)| *ran) {
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

fn container_status(c: &ContainerRuntime, state: &ContainerState) -> Value {
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
    let last = match &state.last_terminated {
        Some(t) => json!({ "terminated": terminated(t, None) }),
        None => json!({ "terminated": null }),
    };
    let mut status = json!({
        "name": c.name,
        "image": c.spec.image.clone().unwrap_or_default(),
        "imageID": format!("valkey-testkit://{}", kind_name(c.kind)),
        "ready": state.ready(),
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
