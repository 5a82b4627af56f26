//! Full-jitter exponential backoff between reconnects.
//!
//! When a relay restarts, every client loses its stream at the same moment;
//! a random delay below a doubling ceiling spreads their reconnects out
//! instead of bringing them back in lock-step. The base is the server's
//! `retry:` once it has sent one, so an operator can slow clients down.

use std::time::Duration;

/// Delays in `[0, min(cap, base * 2^attempt)]`.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
    rng: fastrand::Rng,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            attempt: 0,
            rng: fastrand::Rng::new(),
        }
    }

    /// The same schedule with a fixed seed, for reproducible tests.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.rng = fastrand::Rng::with_seed(seed);
        self
    }

    /// Changes the base (the server's `retry:`); the attempt count stays.
    pub fn set_base(&mut self, base: Duration) {
        self.base = base;
    }

    pub fn base(&self) -> Duration {
        self.base
    }

    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The largest delay the next [`next_delay`](Self::next_delay) may return.
    pub fn ceiling(&self) -> Duration {
        // Doubling saturates, and the attempt stops mattering past 32.
        let factor = 1u32.checked_shl(self.attempt).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The delay before the next attempt; each call doubles the ceiling.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        if ceiling < self.cap {
            self.attempt = self.attempt.saturating_add(1);
        }
        let max = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.rng.u64(0..=max))
    }

    /// Starts over: called once a connection is established.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_ceiling_doubles_up_to_the_cap() {
        let mut backoff = Backoff::new(100 * MS, 1000 * MS).with_seed(1);
        let mut ceilings = Vec::new();
        for _ in 0..6 {
            ceilings.push(backoff.ceiling());
            let delay = backoff.next_delay();
            assert!(delay <= *ceilings.last().unwrap());
        }
        assert_eq!(
            ceilings,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
    }

    #[test]
    fn delays_are_jittered_over_the_whole_range() {
        let mut backoff = Backoff::new(1000 * MS, 1000 * MS).with_seed(7);
        let delays: Vec<_> = (0..200).map(|_| backoff.next_delay()).collect();
        assert!(delays.iter().all(|d| *d <= 1000 * MS));
        assert!(delays.iter().any(|d| *d < 250 * MS));
        assert!(delays.iter().any(|d| *d > 750 * MS));
    }

    #[test]
    fn reset_and_a_new_base_start_the_schedule_over() {
        let mut backoff = Backoff::new(100 * MS, 10_000 * MS);
        for _ in 0..3 {
            backoff.next_delay();
        }
        assert_eq!(backoff.ceiling(), 800 * MS);
        backoff.reset();
        backoff.set_base(3000 * MS);
        assert_eq!(backoff.ceiling(), 3000 * MS);
        backoff.next_delay();
        assert_eq!(backoff.ceiling(), 6000 * MS);
    }

    #[test]
    fn a_long_outage_never_overflows() {
        let mut backoff = Backoff::new(Duration::MAX, Duration::MAX);
        for _ in 0..100 {
            backoff.next_delay();
        }
        assert_eq!(backoff.ceiling(), Duration::MAX);
        let mut backoff = Backoff::new(MS, 30_000 * MS);
        for _ in 0..1000 {
            assert!(backoff.next_delay() <= 30_000 * MS);
        }
    }

    #[test]
    fn a_zero_base_never_waits() {
        let mut backoff = Backoff::new(Duration::ZERO, 1000 * MS);
        assert_eq!(backoff.next_delay(), Duration::ZERO);
    }
}
