//! What the benchmark and the demo share beyond the test support of `valkey-sidecar-testkit`: the
//! baselines the agent is measured against.
//!
//! # Layout
//! - [`sentinel`]: three real sentinels watching a replication set (the `bench failover` and
//!   `bench footprint` baseline).
//! - `src/bin/bench/`: the benchmark (`scripts/bench.sh` runs it and writes `docs/benchmarks.md`).
//! - `src/bin/demo/`: the demo (`scripts/demo.sh`).
#![forbid(unsafe_code)]
// Testkit and bench are read and changed as often as the agent: the same length limit.
#![warn(clippy::too_many_lines)]

pub mod sentinel;
