//! The agent's monotonic clock, turned into `core`'s [`Millis`].

use std::time::Instant;

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
        Millis(u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX))
    }
}
