//! The agent's monotonic clock, turned into `core`'s [`Millis`].

use std::time::{Duration, Instant};

use valkey_sidecar_core::time::Millis;

/// Milliseconds since the agent started, from the monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    pub fn now(&self) -> Millis {
        Millis(millis(self.start.elapsed()))
    }
}

/// A duration in whole milliseconds, as `core` counts them (saturating: no setting is that long).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
