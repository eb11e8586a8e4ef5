//! The kubelet's crash-loop back-off, per container (`doBackOff` in the kubelet's runtime
//! manager over a `flowcontrol.Backoff` of 10 s initial, 300 s maximum):
//!
//! - a container that exits is restarted at once the first time;
//! - each later restart waits twice as long as the one before it — 10 s, 20 s, 40 s, … — counted
//!   from the moment the container exited, capped at 300 s; while it waits the container reports
//!   `waiting.reason: CrashLoopBackOff`;
//! - a run that lasted more than 10 minutes (twice the cap) forgets the history: the next restart
//!   is immediate again and the one after it waits 10 s.
//!
//! Every restart counts, whatever made the container exit: an error, a clean exit under
//! `restartPolicy: Always`, a kill after a failed liveness or startup probe. The kubelet keeps
//! this in memory only, so a node that reboots starts over ([`CrashLoop::forget`]).
//!
//! Unlike the kubelet, the restart happens on the first sync pass after the back-off ends (within
//! [`super::KubeletOptions::sync_period`]); the kubelet re-syncs a backed-off pod on its own
//! schedule, so its restarts come up to a few seconds later than the back-off alone says.

use std::time::{Duration, Instant};

/// The first back-off.
pub(crate) const INITIAL: Duration = Duration::from_secs(10);
/// The longest back-off.
pub(crate) const MAX: Duration = Duration::from_secs(300);
/// A run longer than this resets the back-off (the kubelet's `2 × MAX`).
pub(crate) const RESET_AFTER: Duration = Duration::from_secs(600);

/// One container's back-off state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CrashLoop {
    /// The back-off the next restart waits and when the container was last restarted; `None`
    /// until the first restart (and after [`Self::forget`]).
    entry: Option<(Duration, Instant)>,
}

impl CrashLoop {
    /// How long a container whose run ended at `exited` waits before it starts again (zero: at
    /// once).
    pub fn delay(&self, exited: Instant) -> Duration {
        match self.entry {
            Some((backoff, restarted)) if !expired(exited, restarted) => backoff,
            _ => Duration::ZERO,
        }
    }

    /// The container is restarted at `now` after a run that ended at `exited`: the next restart
    /// waits twice as long (or [`INITIAL`], if this one did not wait or the history expired).
    pub fn restarted(&mut self, exited: Instant, now: Instant) {
        let backoff = match self.entry {
            Some((backoff, restarted)) if !expired(exited, restarted) => (backoff * 2).min(MAX),
            _ => INITIAL,
        };
        self.entry = Some((backoff, now));
    }

    /// Forgets the history (the kubelet restarted, e.g. with its node).
    pub fn forget(&mut self) {
        self.entry = None;
    }
}

/// The run that started at `restarted` and ended at `exited` outlived the reset period.
fn expired(exited: Instant, restarted: Instant) -> bool {
    exited.saturating_duration_since(restarted) > RESET_AFTER
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// Crashes `runs` times, each run lasting `run`; returns each wait before a restart.
    fn crash_loop(runs: usize, run: Duration) -> Vec<Duration> {
        let mut c = CrashLoop::default();
        let mut now = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..runs {
            now += run;
            let wait = c.delay(now);
            waits.push(wait);
            let exited = now;
            now += wait;
            c.restarted(exited, now);
        }
        waits
    }

    #[test]
    fn first_restart_is_immediate_then_doubles_from_ten_seconds() {
        let waits = crash_loop(8, S);
        let secs: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn a_long_run_resets_the_back_off() {
        let mut c = CrashLoop::default();
        let t0 = Instant::now();
        c.restarted(t0, t0);
        c.restarted(t0 + S, t0 + 11 * S);
        assert_eq!(c.delay(t0 + 12 * S), 20 * S);
        // Ten minutes since the last restart is not enough, a moment more is.
        assert_eq!(c.delay(t0 + 11 * S + RESET_AFTER), 20 * S);
        let late = t0 + 12 * S + RESET_AFTER;
        assert_eq!(c.delay(late), Duration::ZERO);
        c.restarted(late, late);
        assert_eq!(c.delay(late + S), INITIAL);
    }

    #[test]
    fn the_wait_counts_from_the_exit_not_from_the_check() {
        let mut c = CrashLoop::default();
        let t0 = Instant::now();
        c.restarted(t0, t0);
        // Exited 3 s after the restart: due 10 s after that exit, whenever it is looked at.
        let exited = t0 + 3 * S;
        assert_eq!(c.delay(exited), INITIAL);
    }

    #[test]
    fn forgetting_makes_the_next_restart_immediate() {
        let mut c = CrashLoop::default();
        let t0 = Instant::now();
        c.restarted(t0, t0);
        c.restarted(t0 + S, t0 + 11 * S);
        c.forget();
        assert_eq!(c.delay(t0 + 12 * S), Duration::ZERO);
    }
}
