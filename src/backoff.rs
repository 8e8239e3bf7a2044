//! Capped exponential backoff with full jitter, for reconnecting and retrying.
//!
//! Pure arithmetic plus a random draw: the n-th delay is uniform in
//! `[base * 2^n / 2, base * 2^n]`, capped at `cap`, so that many daemons that lost the same
//! database do not come back in lockstep.

use std::time::Duration;

/// A sequence of growing, jittered delays.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            attempt: 0,
        }
    }

    /// The next delay to wait.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        jitter(ceiling)
    }

    /// Start again from the base delay, after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// A duration drawn uniformly from `[d / 2, d]`.
pub fn jitter(d: Duration) -> Duration {
    let nanos = d.as_nanos().min(u128::from(u64::MAX)) as u64;
    Duration::from_nanos(nanos / 2 + fastrand::u64(0..=nanos - nanos / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_stay_within_jitter() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(2);
        let mut backoff = Backoff::new(base, cap);
        let ceilings = [100, 200, 400, 800, 1600, 2000, 2000, 2000];
        for ceiling in ceilings {
            let ceiling = Duration::from_millis(ceiling);
            let delay = backoff.next_delay();
            assert!(delay <= ceiling, "{delay:?} over {ceiling:?}");
            assert!(delay >= ceiling / 2, "{delay:?} under half of {ceiling:?}");
        }
        backoff.reset();
        assert!(backoff.next_delay() <= base);
    }

    #[test]
    fn many_attempts_never_overflow() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        for _ in 0..1000 {
            assert!(backoff.next_delay() <= Duration::from_secs(30));
        }
    }

    #[test]
    fn jitter_of_zero_is_zero() {
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
