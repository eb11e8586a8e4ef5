//! Monotonic time as plain data.
//!
//! Rules never read a clock: the adapter converts its monotonic clock into [`Millis`] since the
//! agent started and passes it in. Wall-clock time is never used to judge an interval, so a
//! clock step (NTP, VM migration) cannot make a lease look expired or a probe look stale.

/// Milliseconds on the agent's monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub u64);

impl Millis {
    /// Time elapsed from `earlier` to `self`; zero if `earlier` is in the future.
    pub fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// `self` moved forward by `ms`, saturating instead of wrapping.
    pub fn plus(self, ms: u64) -> Millis {
        Millis(self.0.saturating_add(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_saturates() {
        assert_eq!(Millis(10).since(Millis(4)), 6);
        assert_eq!(Millis(4).since(Millis(10)), 0);
        assert_eq!(Millis(u64::MAX).plus(5), Millis(u64::MAX));
    }
}
