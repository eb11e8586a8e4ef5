//! Retry schedules from `backon` (the `backoff` crate is unmaintained): exponential with jitter
//! and no limit for loops that run for good, constant and few for one step of a move. Each user
//! keeps its own iterator and rebuilds it after a success.

use std::time::Duration;

use backon::{
    BackoffBuilder, ConstantBackoff, ConstantBuilder, ExponentialBackoff, ExponentialBuilder,
};

/// Delays from `min`, doubling up to `max`, jittered so many agents do not retry in lockstep.
pub fn exponential(min: Duration, max: Duration) -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .build()
}

/// `times` delays of `delay` each, then none: for a step that is worth a few quick tries.
pub fn few(delay: Duration, times: usize) -> ConstantBackoff {
    ConstantBuilder::default()
        .with_delay(delay)
        .with_max_times(times)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_runs_out() {
        let delays: Vec<Duration> = few(Duration::from_millis(5), 3).collect();
        assert_eq!(delays, vec![Duration::from_millis(5); 3]);
    }

    #[test]
    fn grows_and_stays_bounded() {
        let delays: Vec<Duration> =
            exponential(Duration::from_millis(10), Duration::from_millis(80))
                .take(10)
                .collect();
        assert_eq!(delays.len(), 10, "never runs out");
        // Jitter adds up to one base delay on top.
        assert!(
            delays.iter().all(|d| *d <= Duration::from_millis(160)),
            "{delays:?}"
        );
        assert!(delays[6] >= Duration::from_millis(80), "{delays:?}");
    }
}
