//! What the benchmark and the demo share beyond the test support of `valkey-sidecar-testkit`: the
//! baselines the agent is measured against.
//!
//! # Layout
//! - [`sentinel`]: three real sentinels watching a replication set (the `bench failover` and
//!   `bench footprint` baseline).
//! - `src/bin/bench/`: the benchmark (`scripts/bench.sh` runs it and writes `docs/benchmarks.md`).
//! - `src/bin/demo/`: the demo (`scripts/demo.sh`).
#![forbid(unsafe_code)]

pub mod sentinel;
