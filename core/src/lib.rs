//! The rules of valkey-sidecar as pure functions over plain data.
//!
//! Nothing in this crate performs I/O, reads a clock or spawns a task: adapters hand in what they
//! observed (Valkey replies, Kubernetes objects) and the current time as data, and get back typed
//! observations, verdicts and plans. That is what lets the rules be tested with tables and
//! property tests instead of timing-dependent integration tests.
//!
//! # Layout
//! - [`time`]: monotonic milliseconds, the only notion of time the rules know.
//! - [`reply`]: a protocol-neutral Valkey reply tree, the input of every parser.
//! - [`info`]: `INFO` text into key/value fields.
//! - [`shards`]: `CLUSTER SHARDS` into shards and nodes.
//! - [`observation`]: one tick's replies into a typed [`observation::Observation`].
//! - [`cluster_map`]: when an agent reads the whole cluster map, and the map carried between.
//! - [`health`]: liveness, readiness, startup and role-endpoint verdicts from the cached state.
//! - [`placement`]: zone and region from configuration, pod labels or the Node.
//! - [`labels`]: the labels the agent keeps on its pod.
//! - [`ratelimit`]: a token bucket for Events.
//! - [`plan`]: the coordinator's `decide(&World, &Policy) -> Plan` (hand-over, fail-back, balance).
//! - [`roll`]: the supervised rolling update: which pod to replace next, each primary moved once.
//! - [`moves`]: the coordinator's ledger of running and settling moves and the cooldown.
//! - [`quorum`]: cluster mode's fence of a primary cut off from most primaries.
//! - [`heartbeat`]: peer heartbeats, the vouches that keep a primary writing, the failsafe's
//!   promises.
//! - [`lease`]: Lease election with client-go semantics (monotonic expiry, renew deadline).
//! - [`status`]: the coordinator's conditions for humans, rendered as Lease annotations.
//! - [`replication`]: replication mode's shard record, fencing, promotion and switchover.
//! - [`operator`]: `coordination: operator` — whether the operator beside the agent is settled.
//! - [`requests`]: what an operator asks of the coordinator (pause, switchover) on its Lease.
//! - [`mod@format`]: the record format agents write and read (skew between agent versions).
//! - [`formation`]: forming a fresh Valkey Cluster from the pods, and re-adding replaced pods.
//! - [`handover`]: cluster mode's move of a primary to a replica (planned, or forced after a
//!   crash) as a step machine.
//! - [`crash`]: cluster mode's failover of a primary whose Valkey died, before the node timeout.
//! - [`restart`]: whether a stopped Valkey may start again (a primary waits for a replica to take
//!   over its slots).
//! - [`drain`]: whether a node can be drained now, and why not (`valkey-sidecar drain-check`).
//! - [`overview`]: what `valkey-sidecar status` shows: pods, roles, the coordinator, a roll.
//! - [`check`]: whether a deployment is healthy, shard by shard (`valkey-sidecar check`, `helm test`).
//! - [`credentials`]: which passwords the chart's Secret needs made or moved
//!   (`valkey-sidecar credentials`), password rotation included.
//! - [`memory`]: Valkey's `maxmemory` as a share of its container's memory limit.
//! - [`settings`]: what the `valkey-settings` container pushes into Valkey (TLS reloads, the zone).
#![warn(clippy::too_many_lines, unreachable_pub)]
// The length limit holds the shipped code's shape; a table test may run long.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod check;
pub mod cluster_map;
pub mod crash;
pub mod credentials;
pub mod drain;
pub mod format;
pub mod formation;
pub mod handover;
pub mod health;
pub mod heartbeat;
pub mod info;
pub mod labels;
pub mod lease;
pub mod memory;
pub mod moves;
pub mod observation;
pub mod operator;
pub mod overview;
pub mod placement;
pub mod plan;
pub mod quorum;
pub mod ratelimit;
pub mod replication;
pub mod reply;
pub mod requests;
pub mod restart;
pub mod roll;
pub mod settings;
pub mod shards;
pub mod status;
pub mod time;
