//! A token bucket over [`Millis`], for things that must not flood the API (Events).

use crate::time::Millis;

/// Allows bursts of `capacity`, refilled by one token every `refill_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    capacity: u32,
    refill_ms: u64,
    tokens: u32,
    last: Millis,
}

impl TokenBucket {
    pub fn new(capacity: u32, refill_ms: u64, now: Millis) -> TokenBucket {
        TokenBucket {
            capacity,
            refill_ms: refill_ms.max(1),
            tokens: capacity,
            last: now,
        }
    }

    /// Takes a token if one is available at `now`.
    pub fn try_take(&mut self, now: Millis) -> bool {
        let earned = now.since(self.last) / self.refill_ms;
        if earned > 0 {
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(earned).min(self.capacity);
            self.last = self.last.plus(u64::from(earned) * self.refill_ms);
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_refills() {
        let mut b = TokenBucket::new(2, 1000, Millis(0));
        assert!(b.try_take(Millis(0)));
        assert!(b.try_take(Millis(10)));
        assert!(!b.try_take(Millis(999)));
        assert!(b.try_take(Millis(1000)));
        assert!(!b.try_take(Millis(1500)));
        assert!(b.try_take(Millis(10_000)));
        assert!(b.try_take(Millis(10_000)));
        assert!(!b.try_take(Millis(10_000)), "capacity caps the refill");
    }
}
