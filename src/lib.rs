//! valkey-sidecar: a small agent beside every Valkey pod that keeps Kubernetes in step with Valkey.
//!
//! # Layout
//! - [`config`]: flags and environment into a validated configuration (exit 64 on bad input).
//! - [`valkey`]: the self-healing connection and the per-tick observation pipeline.
//! - [`observer`]: the loop that records each tick into the shared health state.
//! - [`quorum`]: cluster mode's fence of a primary cut off from most primaries.
//! - [`heartbeat`]: peer heartbeats over UDP, the vouches that tell a primary it is not cut
//!   off, and the failsafe's promises.
//! - [`http`]: probes, role endpoints, `/status` and `/metrics`, answered from that state.
//! - [`kube`]: the own pod's labels and Events, zone from the Node, the Lease election.
//! - [`coordinator`]: the Lease holder's rounds: hand-overs, fail-back, balance, crash failover,
//!   formation, and in replication mode promotions and switchovers.
//! - [`keeper`]: replication mode, each agent's keeper of its shard's primary record.
//! - [`metrics`], [`telemetry`], [`lifecycle`], [`clock`], [`retry`]: the usual plumbing;
//!   [`supervise`] starts a panicking task afresh instead of losing the agent.
//! - [`agent`] wires them together; [`cli`] is the command line as one `Command` and [`exit`]
//!   every exit code; [`inject`] is the `inject` subcommand (manifests in, manifests
//!   with the agent out); [`drain`] is `drain-check` (can this node be drained now, and why not);
//!   [`await_start`] is `await` and `install` (the Valkey container's entrypoint, which holds a
//!   crashed primary's restart until [`start_guard`] allows it); [`credentials`] makes the chart's
//!   auth Secret in the cluster and [`check`] is the chart's `helm test`; [`status`] shows a
//!   deployment and [`operate`] is `pause`, `resume` and `switchover` (requests on the coordinator
//!   Lease); [`features`] says what a deployment leaves off.
//!
//! The rules themselves (parsing, health verdicts, labels, Lease election, planning, replication
//! mode's record, promotion and switchover) live in the dependency-free `valkey-sidecar-core`
//! crate; this crate only observes, sends and serves.
#![warn(clippy::too_many_lines, unreachable_pub)]
// The length limit holds the shipped code's shape; a table test may run long.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod agent;
pub mod await_start;
pub mod check;
pub mod cli;
pub mod clock;
pub mod config;
pub mod coordinator;
pub mod credentials;
pub mod drain;
pub mod exit;
pub mod features;
pub mod heartbeat;
pub mod http;
pub mod inject;
pub mod k8s;
pub mod keeper;
pub mod lifecycle;
pub mod metrics;
pub mod observer;
pub mod operate;
pub mod quorum;
pub mod retry;
pub mod start_guard;
pub mod status;
pub mod supervise;
pub mod telemetry;
pub mod valkey;
pub mod valkey_config;
