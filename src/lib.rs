//! valkey-sidecar: a small agent beside every Valkey pod that keeps Kubernetes in step with Valkey.
//!
//! # Layout
//! - [`cli`]: the command line as one `Command`, settings validated at once (exit 64 on bad
//!   input), every exit code, what a deployment leaves off.
//! - [`agent`] wires the agent together; [`runtime`] is its plumbing: metrics, logs, signals,
//!   the monotonic clock, retries, and tasks started afresh after a panic.
//! - [`valkey`]: the self-healing connection and the per-tick observation pipeline; [`observer`]
//!   records each tick into the shared health state.
//! - [`peers`]: the heartbeats between agents over UDP (the vouches that tell a primary it is
//!   not cut off, the failsafe's promises) and cluster mode's quorum fence.
//! - [`http`]: probes, role endpoints, `/status` and `/metrics`, answered from that state.
//! - [`k8s`]: the own pod's labels and Events, zone from the Node, the Leases.
//! - [`coordinator`]: the Lease holder's rounds: hand-overs, fail-back, balance, crash failover,
//!   formation, and in replication mode promotions and switchovers.
//! - [`keeper`]: replication mode, each agent's keeper of its shard's primary record.
//! - [`restart`]: a crashed primary's held restart (`await`, `install`, and the agent's answer).
//! - [`commands`]: the tools beside the agent — `drain-check`, `credentials`, `valkey-config`,
//!   `check`, `status`, `pause`/`resume`/`switchover`; [`inject`] is `inject` (manifests in,
//!   manifests with the agent out).
//!
//! The rules themselves (parsing, health verdicts, labels, Lease election, planning, replication
//! mode's record, promotion and switchover) live in the dependency-free `valkey-sidecar-core`
//! crate; this crate only observes, sends and serves.
#![warn(clippy::too_many_lines, unreachable_pub)]
// The length limit holds the shipped code's shape; a table test may run long.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod agent;
pub mod cli;
pub mod commands;
pub mod coordinator;
pub mod http;
pub mod inject;
pub mod k8s;
pub mod keeper;
pub mod observer;
pub mod peers;
pub mod restart;
pub mod runtime;
pub mod valkey;
