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

/// CPU time the calling thread has run, from `/proc/thread-self/schedstat` (its first field:
/// nanoseconds on a CPU). A round's wall time on a busy machine includes its waits for a CPU (the
/// 50-shard bench ran at a load of 14 on 2 cores); the difference of two readings does not.
/// `None` where the kernel keeps no such file. `/proc` lives in memory: the read waits on no disk.
pub fn thread_cpu() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// The CPU time the calling thread has run since `before` ([`thread_cpu`]; `None`: not read).
pub fn thread_cpu_since(before: Option<Duration>) -> Option<Duration> {
    let before = before?;
    Some(thread_cpu()?.saturating_sub(before))
}
