//! The agent's plumbing: its metrics ([`metrics`]), logs ([`telemetry`]), signals and
//! shutdown ([`lifecycle`]), the monotonic clock every rule is fed ([`clock`]), retries with
//! backoff ([`retry`]), tasks restarted after a panic instead of losing the agent
//! ([`supervise`]), and tasks aborted with what owns them ([`task`]).

pub mod clock;
pub mod lifecycle;
pub mod metrics;
pub mod retry;
pub mod supervise;
pub mod task;
pub mod telemetry;
