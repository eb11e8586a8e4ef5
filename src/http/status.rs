//! `/status`: the cached state as JSON for humans and scripts.

use serde::Serialize;
use valkey_sidecar_core::health::HealthState;
use valkey_sidecar_core::observation::{Mode, Observation};
use valkey_sidecar_core::time::Millis;

use super::routes::App;
use crate::cli::features::Off;

#[derive(Serialize)]
struct Status<'a> {
    agent_version: &'static str,
    mode: &'static str,
    pod: Option<&'a str>,
    namespace: Option<&'a str>,
    node: Option<&'a str>,
    zone: Option<&'a str>,
    region: Option<&'a str>,
    role: &'static str,
    live: bool,
    ready: bool,
    ready_reason: String,
    observed_ms_ago: Option<u64>,
    last_error: Option<&'a str>,
    valkey: Option<ValkeyStatus<'a>>,
    /// What this agent does not do here, and why (empty when everything is on).
    off: Vec<Off>,
}

#[derive(Serialize)]
struct ValkeyStatus<'a> {
    version: Option<&'a str>,
    loading: bool,
    repl_offset: u64,
    link_up: Option<bool>,
    sync_in_progress: Option<bool>,
    primary: Option<String>,
    lag_bytes: Option<u64>,
    connected_replicas: usize,
    node_id: Option<&'a str>,
    shard_id: Option<&'a str>,
    cluster_state_ok: Option<bool>,
    availability_zone: Option<&'a str>,
    failover_state: Option<&'a str>,
}

/// Renders the status document.
pub(super) fn render(state: &HealthState, app: &App, now: Millis) -> String {
    let ready = state.readiness(now, &app.bounds, app.mode, app.claim());
    let id = &app.identity;
    let status = Status {
        agent_version: env!("CARGO_PKG_VERSION"),
        mode: match app.mode {
            Mode::Cluster => "cluster",
            Mode::Replication => "replication",
        },
        pod: id.pod_name.as_deref(),
        namespace: id.namespace.as_deref(),
        node: id.node_name.as_deref(),
        zone: id.zone.as_deref(),
        region: id.region.as_deref(),
        role: state.role(now, &app.bounds).as_str(),
        live: state.liveness(now, &app.bounds).ok,
        ready: ready.ok,
        ready_reason: ready.reason,
        observed_ms_ago: state.observation.as_ref().map(|(at, _)| now.since(*at)),
        last_error: state.last_error.as_deref(),
        valkey: state.observation.as_ref().map(|(_, o)| valkey(o)),
        off: app.off.borrow().clone(),
    };
    serde_json::to_string_pretty(&status).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

fn valkey(o: &Observation) -> ValkeyStatus<'_> {
    let cluster = o.cluster.as_ref();
    ValkeyStatus {
        version: o.version.as_deref(),
        loading: o.loading,
        repl_offset: o.repl_offset,
        link_up: o.link.as_ref().map(|l| l.up),
        sync_in_progress: o.link.as_ref().map(|l| l.sync_in_progress),
        primary: o.link.as_ref().map(|l| format!("{}:{}", l.host, l.port)),
        lag_bytes: o.lag_bytes(None),
        connected_replicas: o.replicas.len(),
        node_id: cluster.and_then(|c| c.my_id.as_deref()),
        shard_id: cluster.and_then(|c| c.shard_id.as_deref()),
        cluster_state_ok: cluster.and_then(|c| c.state_ok),
        availability_zone: o.availability_zone.as_deref(),
        failover_state: o.failover_state.as_deref(),
    }
}
