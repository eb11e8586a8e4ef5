//! Retry schedules: exponential with jitter and no limit, from `backon` (the `backoff` crate is
//! unmaintained). Each user keeps its own iterator and rebuilds it after a success.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Delays from `min`, doubling up to `max`, jittered so many agents do not retry in lockstep.
pub fn exponential(min: Duration, max: Duration) -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

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
