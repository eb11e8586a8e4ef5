//! Prometheus metrics, all prefixed `valkey_sidecar_`.

use std::time::Duration;

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use valkey_sidecar_core::health::{Bounds, HealthState};
use valkey_sidecar_core::observation::Role;
use valkey_sidecar_core::time::Millis;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabel {
    reason: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    kind: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriftLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabel {
    shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: &'static str,
    revision: &'static str,
}

/// The one series of a metric that is sometimes absent: a [`Family`] keyed by this holds at most
/// one entry, removed while the value is unknown, so no sentinel such as -1 reaches `max()`.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Unlabelled;

impl EncodeLabelSet for Unlabelled {
    fn encode(&self, _: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        Ok(())
    }
}

/// The commit the binary was built from: `scripts/static-build.sh` sets it, a plain `cargo build`
/// does not.
const REVISION: &str = match option_env!("VALKEY_SIDECAR_REVISION") {
    Some(r) => r,
    None => "unknown",
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabel {
    path: &'static str,
    code: u16,
}

/// Registers each `field => name: help;` row of the table with the registry.
macro_rules! table {
    ($m:ident { $($field:ident => $name:literal : $help:literal;)* }) => {
        $( $m.registry.register($name, $help, $m.$field.clone()); )*
    };
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    role: Family<RoleLabel, Gauge>,
    repl_offset: Gauge,
    lag_bytes: Family<Unlabelled, Gauge>,
    valkey_up: Gauge,
    ready: Gauge,
    observation_errors: Family<KindLabel, Counter>,
    observations: Counter,
    loop_seconds: Histogram,
    http_requests: Family<HttpLabel, Counter>,
    http_connections_closed: Family<KindLabel, Counter>,
    label_writes: Family<ResultLabel, Counter>,
    label_write_seconds: Histogram,
    events: Family<EventLabel, Counter>,
    zone_pushes: Family<ResultLabel, Counter>,
    actions: Family<ActionLabel, Counter>,
    coordinating: Gauge,
    start_held: Gauge,
    last_decision: Gauge,
    drift: Family<DriftLabel, Gauge>,
    keeper_actions: Family<KindLabel, Counter>,
    formation_steps: Family<ActionLabel, Counter>,
    formation_reads: Family<KindLabel, Counter>,
    shard_record_calls: Family<ResultLabel, Counter>,
    coordinator_record_reads: Family<ResultLabel, Counter>,
    watch_errors: Family<KindLabel, Counter>,
    task_panics: Family<KindLabel, Counter>,
    move_seconds: Histogram,
    round_seconds: Histogram,
    round_cpu_seconds: Histogram,
    build_info: Family<BuildLabel, Gauge>,
    fenced: Gauge,
    shard_primaries: Family<ShardLabel, Gauge>,
    heartbeats: Family<KindLabel, Counter>,
    peers_vouching: Gauge,
    roll_evictions: Family<ResultLabel, Counter>,
    roll_outdated: Gauge,
    roll_waiting: Gauge,
    paused: Gauge,
    operator_busy: Gauge,
    newer_format: Family<KindLabel, Counter>,
    /// The shards `shard_primaries` holds a series for, so a shard that is gone loses its series.
    shards_reported: Mutex<Vec<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("valkey_sidecar"),
            role: Family::default(),
            repl_offset: Gauge::default(),
            lag_bytes: Family::default(),
            valkey_up: Gauge::default(),
            ready: Gauge::default(),
            observation_errors: Family::default(),
            observations: Counter::default(),
            loop_seconds: Histogram::new(exponential_buckets(0.0002, 2.0, 14)),
            http_requests: Family::default(),
            http_connections_closed: Family::default(),
            label_writes: Family::default(),
            label_write_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            events: Family::default(),
            zone_pushes: Family::default(),
            actions: Family::default(),
            coordinating: Gauge::default(),
            start_held: Gauge::default(),
            last_decision: Gauge::default(),
            drift: Family::default(),
            keeper_actions: Family::default(),
            formation_steps: Family::default(),
            formation_reads: Family::default(),
            roll_evictions: Family::default(),
            roll_outdated: Gauge::default(),
            roll_waiting: Gauge::default(),
            paused: Gauge::default(),
            operator_busy: Gauge::default(),
            newer_format: Family::default(),
            shard_record_calls: Family::default(),
            coordinator_record_reads: Family::default(),
            watch_errors: Family::default(),
            task_panics: Family::default(),
            move_seconds: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            round_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            round_cpu_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            build_info: Family::default(),
            fenced: Gauge::default(),
            shard_primaries: Family::default(),
            heartbeats: Family::default(),
            peers_vouching: Gauge::default(),
            shards_reported: Mutex::new(Vec::new()),
        };
        m.register();
        m.build_info
            .get_or_create(&BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
                revision: REVISION,
            })
            .set(1);
        m
    }

    /// Every metric with its name (after the `valkey_sidecar_` prefix) and help, one row each.
    fn register(&mut self) {
        table!(self {
            keeper_actions => "keeper_actions": "What the agent did about its own Valkey: renew, fence, release, … (replication mode); quorum_fence, quorum_lift (cluster mode)";
            formation_steps => "formation_steps": "Cluster mode: commands the coordinator sent to form the cluster or re-add a node, by kind and result";
            formation_reads => "formation_reads": "Cluster mode: pods a formation round observed, by how: vouched (its short answers agreed with the coordinator's map), disagreed or audit (its whole map read), silent (no usable answer)";
            task_panics => "task_panics": "Panics of the agent's tasks, by task (each started afresh after a back-off)";
            watch_errors => "watch_errors": "Kubernetes watch errors, by watch (each re-established with backoff)";
            shard_record_calls => "shard_record_calls": "Replication mode: reads and writes of the shard's primary record, by result";
            role => "role": "1 for the role Valkey has now (primary, replica, unknown)";
            repl_offset => "repl_offset_bytes": "Valkey's master_repl_offset";
            lag_bytes => "replica_lag_bytes": "Bytes this replica is behind its primary; absent on a primary and while unknown";
            valkey_up => "valkey_up": "1 while the latest observation is fresh";
            ready => "ready": "1 while /readyz passes";
            observation_errors => "observation_errors": "Ticks that got no usable answer, by kind";
            observations => "observations": "Ticks of the observation loop";
            loop_seconds => "observation_duration_seconds": "Time one tick took";
            http_requests => "http_requests": "HTTP requests served, by path and status";
            http_connections_closed => "http_connections_closed": "HTTP connections closed, by why: done, header_timeout (no request head in time), lifetime (open too long), per_source (the oldest of an address that held too many), evicted (the oldest of all, past the connection cap)";
            label_writes => "label_writes": "Server-side applies of the pod labels, by result";
            label_write_seconds => "label_write_duration_seconds": "Time one label write took";
            events => "events": "Kubernetes Events, by reason and result";
            zone_pushes => "zone_pushes": "CONFIG SET availability-zone, by result";
            actions => "coordinator_actions": "Coordinator moves, by kind and result";
            roll_evictions => "coordinator_roll_evictions": "Pods the supervised roll evicted so their StatefulSet re-creates them at the update revision, by result (error: the API or a disruption budget refused)";
            roll_outdated => "coordinator_roll_pods_outdated": "Pods not at their StatefulSet's update revision, as the supervised roll sees them (the coordinator only)";
            roll_waiting => "coordinator_roll_waiting": "1 while the supervised roll has pods to replace but waits (the coordinator Lease's RolloutComplete condition says why)";
            paused => "coordinator_paused": "1 while the coordinator Lease's holder honours a pause (valkey-sidecar pause): it hands over primaries whose pod or node is going away, handles crashes and answers switchovers, nothing else";
            operator_busy => "coordinator_operator_busy": "With coordination: operator, 1 while the holder defers to the operator (its resource is not Ready): no fail-back, no balance";
            newer_format => "records_newer_format": "Lease records written in a newer format than this agent knows, by kind (coordinator, shard): it takes no action on them";
            start_held => "start_held": "Cluster mode: 1 while a start of the local Valkey is held until a replica takes over its slots (valkey-sidecar await)";
            coordinating => "coordinator_leader": "1 while this agent is the coordinator (holds the coordinator Lease); the name predates the glossary and is kept for dashboards and alerts";
            last_decision => "coordinator_last_decision_timestamp_seconds": "Unix time at which this agent last started a coordinator move (0: never)";
            coordinator_record_reads => "coordinator_record_reads": "Replication mode: the coordinator's reads of the shard records, by result";
            move_seconds => "coordinator_move_duration_seconds": "Time a successful coordinator move took, start to new primary";
            round_seconds => "coordinator_round_duration_seconds": "Time one coordinator round spent on its rules (the planner's world, the plan, the status): the agent's one thread answers no probe meanwhile";
            round_cpu_seconds => "coordinator_round_cpu_seconds": "CPU time one coordinator round's rules took on the agent's thread: the round's duration less its waits for a CPU on a busy machine (absent where the kernel keeps no /proc/thread-self/schedstat)";
            drift => "placement_drift": "Placement facts the coordinator reports, by reason";
            build_info => "build_info": "1, labelled with the agent's version and the commit it was built from";
            fenced => "fenced": "1 while the agent holds the local Valkey's writes paused (cluster mode: the quorum fence; replication mode: the keeper's fence)";
            heartbeats => "heartbeats": "Peer heartbeat datagrams, by kind: ping_sent (one per round), ping_answered, pong_counted, dropped_rate, dropped_mac, dropped_format, dropped_foreign; isolation_fence counts fences raised because no peer vouched";
            peers_vouching => "peers_vouching": "Peers whose latest heartbeat vouches for this primary (0 while it pings nobody)";
            shard_primaries => "shard_labelled_primaries": "The coordinator (only while it holds the Lease): pods labelled primary, by shard (valkey.io/shard-index)";
        });
    }

    /// Counts one tick and its error kind, if any.
    pub fn tick(&self, took: Duration, error_kind: Option<&'static str>) {
        self.observations.inc();
        self.loop_seconds.observe(took.as_secs_f64());
        if let Some(kind) = error_kind {
            self.observation_errors
                .get_or_create(&KindLabel { kind })
                .inc();
        }
    }

    /// Sets the gauges from the health state after a tick.
    pub fn update(&self, state: &HealthState, now: Millis, bounds: &Bounds, ready: bool) {
        let role = state.role(now, bounds);
        for r in [Role::Primary, Role::Replica, Role::Unknown] {
            self.role
                .get_or_create(&RoleLabel { role: r.as_str() })
                .set(i64::from(r == role));
        }
        let current = state.current(now, bounds);
        self.valkey_up.set(i64::from(current.is_some()));
        self.ready.set(i64::from(ready));
        let offset = current.map_or(0, |o| o.repl_offset);
        self.repl_offset
            .set(i64::try_from(offset).unwrap_or(i64::MAX));
        self.lag(current.and_then(|o| o.lag_bytes(None)));
    }

    /// The replica's lag; `None` (a primary, or unknown) removes the series.
    pub fn lag(&self, bytes: Option<u64>) {
        match bytes {
            Some(l) => {
                let l = i64::try_from(l).unwrap_or(i64::MAX);
                self.lag_bytes.get_or_create(&Unlabelled).set(l);
            }
            None => {
                self.lag_bytes.remove(&Unlabelled);
            }
        }
    }

    /// Whether the agent's own pause of the local Valkey's writes is in force now.
    pub fn fenced(&self, fenced: bool) {
        self.fenced.set(i64::from(fenced));
    }

    /// The coordinator's count of pods labelled primary per shard; empty when it stops leading,
    /// so only the Lease holder exports the gauge.
    pub fn shard_primaries(&self, counts: &BTreeMap<String, i64>) {
        let mut reported = self
            .shards_reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Set before removing: a scrape in between sees every current shard.
        for (shard, n) in counts {
            let shard = shard.clone();
            self.shard_primaries
                .get_or_create(&ShardLabel { shard })
                .set(*n);
        }
        for gone in reported.iter().filter(|s| !counts.contains_key(*s)) {
            let shard = gone.clone();
            self.shard_primaries.remove(&ShardLabel { shard });
        }
        *reported = counts.keys().cloned().collect();
    }

    /// Counts one label write; `error` is the error kind when it failed.
    pub fn label_write(&self, took: Duration, error: Option<&'static str>) {
        self.label_writes
            .get_or_create(&ResultLabel {
                result: error.unwrap_or("ok"),
            })
            .inc();
        self.label_write_seconds.observe(took.as_secs_f64());
    }

    /// Counts one Event (published, failed or suppressed by the rate limit).
    pub fn event(&self, reason: &'static str, result: &'static str) {
        self.events
            .get_or_create(&EventLabel { reason, result })
            .inc();
    }

    /// Counts one attempt to set Valkey's availability zone.
    pub fn zone_push(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.zone_pushes
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts one heartbeat datagram sent, answered, counted or dropped.
    pub fn heartbeat(&self, kind: &'static str) {
        self.heartbeats.get_or_create(&KindLabel { kind }).inc();
    }

    /// How many peers vouch for this primary now.
    pub fn peers_vouching(&self, n: usize) {
        self.peers_vouching
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts one keeper action that changed something.
    pub fn keeper_action(&self, kind: &'static str) {
        self.keeper_actions.get_or_create(&KindLabel { kind }).inc();
    }

    /// Counts one formation command (`CLUSTER MEET`, `ADDSLOTSRANGE`, …) and whether it worked.
    pub fn formation_step(&self, kind: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.formation_steps
            .get_or_create(&ActionLabel { kind, result })
            .inc();
    }

    /// One pod observed in a formation round (`kind`: vouched, disagreed, audit, silent).
    pub fn formation_read(&self, kind: &'static str) {
        self.formation_reads
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// Logs and counts one error of a Kubernetes watch (`kind` names the watch).
    pub fn watch_error(&self, kind: &'static str, error: &dyn std::fmt::Display) {
        tracing::warn!(watch = kind, %error, "watch failed; re-establishing with backoff");
        self.watch_errors.get_or_create(&KindLabel { kind }).inc();
    }

    /// Exports the task's panic counter at 0 from its start: a counter that appears only with its
    /// first panic, at 1, shows no `increase()`, and an alert on panics would miss that one.
    pub fn task_supervised(&self, kind: &'static str) {
        self.task_panics
            .get_or_create(&KindLabel { kind })
            .inc_by(0);
    }

    /// Counts one panic of the task `kind` (`supervise`).
    pub fn task_panic(&self, kind: &'static str) {
        self.task_panics.get_or_create(&KindLabel { kind }).inc();
    }

    /// Counts one call on the shard record (`ok` or an error kind).
    pub fn shard_record(&self, result: &'static str) {
        self.shard_record_calls
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts one finished coordinator move.
    pub fn action(&self, kind: &'static str, result: &'static str) {
        self.actions
            .get_or_create(&ActionLabel { kind, result })
            .inc();
    }

    /// Counts one eviction by the supervised roll.
    pub fn roll_eviction(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.roll_evictions
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// The supervised roll's progress: pods left, and whether it waits.
    pub fn roll(&self, outdated: usize, waiting: bool) {
        self.roll_outdated
            .set(i64::try_from(outdated).unwrap_or(i64::MAX));
        self.roll_waiting.set(i64::from(waiting));
    }

    /// What holds the coordinator's own moves: a pause, an operator at work.
    pub fn holds(&self, paused: bool, operator_busy: bool) {
        self.paused.set(i64::from(paused));
        self.operator_busy.set(i64::from(operator_busy));
    }

    /// A record in a newer format than this agent knows was met (`kind`: coordinator, shard).
    pub fn newer_format(&self, kind: &'static str) {
        self.newer_format.get_or_create(&KindLabel { kind }).inc();
    }

    /// Whether a start of the local Valkey would now be held (`start_guard`).
    pub fn start_permit(&self, go: bool) {
        self.start_held.set(i64::from(!go));
    }

    pub fn set_coordinating(&self, coordinating: bool) {
        self.coordinating.set(i64::from(coordinating));
    }

    /// Records when a coordinator move started (Unix seconds), so `time() - x` is the time since
    /// the last decision.
    pub fn coordinator_decision(&self, unix_seconds: i64) {
        self.last_decision.set(unix_seconds);
    }

    /// Counts one read of a shard record by the coordinator (`ok` or an error kind).
    pub fn coordinator_record_read(&self, result: &'static str) {
        self.coordinator_record_reads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Records how long a coordinator round's rules took, and the CPU time they used.
    pub fn coordinator_round(&self, took: Duration, cpu: Option<Duration>) {
        self.round_seconds.observe(took.as_secs_f64());
        if let Some(cpu) = cpu {
            self.round_cpu_seconds.observe(cpu.as_secs_f64());
        }
    }

    /// Records how long a successful move took.
    pub fn coordinator_move_duration(&self, took: Duration) {
        self.move_seconds.observe(took.as_secs_f64());
    }

    /// Sets the drift gauges to the counts of this round.
    pub fn drift<'a>(&self, reasons: impl Iterator<Item = &'a str>) {
        let mut counts = std::collections::BTreeMap::<&str, i64>::new();
        for r in reasons {
            *counts.entry(r).or_default() += 1;
        }
        for reason in ["FailoverDrift", "PrimaryImbalance"] {
            self.drift
                .get_or_create(&DriftLabel { reason })
                .set(counts.get(reason).copied().unwrap_or(0));
        }
    }

    /// Counts one HTTP request; `path` must come from a fixed set so cardinality stays bounded.
    pub fn http(&self, path: &'static str, code: u16) {
        self.http_requests
            .get_or_create(&HttpLabel { path, code })
            .inc();
    }

    /// Counts one HTTP connection closed, and why.
    pub fn http_connection_closed(&self, why: &'static str) {
        self.http_connections_closed
            .get_or_create(&KindLabel { kind: why })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error would only mean a bug in a label encoder.
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "metrics encoding failed");
            out.push_str("# encoding failed\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_exported() {
        let m = Metrics::new();
        m.label_write(Duration::from_millis(3), None);
        m.event("Promoted", "ok");
        m.zone_push(true);
        m.action("Handover", "ok");
        m.set_coordinating(true);
        m.coordinator_decision(1_700_000_000);
        m.drift(["FailoverDrift"].into_iter());
        m.coordinator_record_read("ok");
        m.coordinator_move_duration(Duration::from_millis(40));
        m.keeper_action("fence");
        m.watch_error("shard_records", &"gone");
        m.shard_record("ok");
        let text = m.encode();
        for name in [
            "valkey_sidecar_label_writes_total{result=\"ok\"} 1",
            "valkey_sidecar_keeper_actions_total{kind=\"fence\"} 1",
            "valkey_sidecar_watch_errors_total{kind=\"shard_records\"} 1",
            "valkey_sidecar_shard_record_calls_total{result=\"ok\"} 1",
            "valkey_sidecar_label_write_duration_seconds_count 1",
            "valkey_sidecar_events_total{reason=\"Promoted\",result=\"ok\"} 1",
            "valkey_sidecar_zone_pushes_total{result=\"ok\"} 1",
            "valkey_sidecar_coordinator_actions_total{kind=\"Handover\",result=\"ok\"} 1",
            "valkey_sidecar_coordinator_leader 1",
            "valkey_sidecar_coordinator_last_decision_timestamp_seconds 1700000000",
            "valkey_sidecar_placement_drift{reason=\"FailoverDrift\"} 1",
            "valkey_sidecar_coordinator_record_reads_total{result=\"ok\"} 1",
            "valkey_sidecar_coordinator_move_duration_seconds_count 1",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }

    #[test]
    fn build_info_names_the_version_and_a_revision() {
        let text = Metrics::new().encode();
        let want = format!(
            "valkey_sidecar_build_info{{version=\"{}\",revision=\"{REVISION}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&want), "{want} missing from\n{text}");
        assert!(!REVISION.is_empty());
    }

    #[test]
    fn an_unknown_lag_is_absent_not_a_sentinel() {
        let m = Metrics::new();
        let lines = |m: &Metrics| -> Vec<String> {
            m.encode()
                .lines()
                .filter(|l| l.starts_with("valkey_sidecar_replica_lag_bytes"))
                .map(str::to_owned)
                .collect()
        };
        assert!(lines(&m).is_empty(), "no lag before any observation");
        m.lag(Some(42));
        assert_eq!(lines(&m), ["valkey_sidecar_replica_lag_bytes 42"]);
        m.lag(None);
        assert!(lines(&m).is_empty(), "an unknown lag must disappear");
    }

    #[test]
    fn the_shard_gauge_follows_the_shards_and_empties_on_losing_the_lease() {
        let m = Metrics::new();
        let counts = |pairs: &[(&str, i64)]| -> BTreeMap<String, i64> {
            pairs.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect()
        };
        m.shard_primaries(&counts(&[("0", 1), ("1", 0)]));
        let text = m.encode();
        assert!(text.contains("valkey_sidecar_shard_labelled_primaries{shard=\"0\"} 1"));
        assert!(text.contains("valkey_sidecar_shard_labelled_primaries{shard=\"1\"} 0"));
        m.shard_primaries(&counts(&[("1", 2)]));
        let text = m.encode();
        assert!(!text.contains("shard=\"0\""), "shard 0 is gone:\n{text}");
        assert!(text.contains("valkey_sidecar_shard_labelled_primaries{shard=\"1\"} 2"));
        m.shard_primaries(&BTreeMap::new());
        assert!(
            !m.encode()
                .contains("valkey_sidecar_shard_labelled_primaries{")
        );
    }

    #[test]
    fn fenced_is_exported_from_the_start() {
        let m = Metrics::new();
        assert!(m.encode().contains("valkey_sidecar_fenced 0"));
        m.fenced(true);
        assert!(m.encode().contains("valkey_sidecar_fenced 1"));
    }
}
