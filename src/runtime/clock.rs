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

/// CPU time the calling thread has run, from its CPU clock (`CLOCK_THREAD_CPUTIME_ID`). A round's
/// wall time on a busy machine includes its waits for a CPU (the 50-shard bench ran at a load of
/// 14 on 2 cores); the difference of two readings does not. Not `/proc/thread-self/schedstat`:
/// the kernel brings its figure for a running thread up to date only at a tick or a switch, so
/// a reading taken 0.5 ms of work after another showed ~0.06 ms on an idle machine, and more of
/// the truth the busier the machine (more switches) — a cost that seemed to grow with load.
pub fn thread_cpu() -> Option<Duration> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    let secs = u64::try_from(t.tv_sec).ok()?;
    let nanos = u32::try_from(t.tv_nsec).ok()?;
    Some(Duration::new(secs, nanos))
}

/// The CPU time the calling thread has run since `before` ([`thread_cpu`]; `None`: not read).
pub fn thread_cpu_since(before: Option<Duration>) -> Option<Duration> {
    let before = before?;
    Some(thread_cpu()?.saturating_sub(before))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_clock_counts_the_work_between_two_readings() {
        let wall = Instant::now();
        let before = thread_cpu();
        let mut x = 0u64;
        // Work until the clock shows 2 ms of it: on a shared machine that may take longer in
        // wall time, never less. A clock that did not move with the work would end at the bound.
        let mut spent = Duration::ZERO;
        while spent < Duration::from_millis(2) && wall.elapsed() < Duration::from_secs(20) {
            for _ in 0..1000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            spent = thread_cpu_since(before).unwrap();
        }
        let elapsed = wall.elapsed();
        assert!(
            spent >= Duration::from_millis(2),
            "{spent:?} in {elapsed:?}"
        );
        assert!(spent <= elapsed, "{spent:?} on a CPU in {elapsed:?}");
    }
}
