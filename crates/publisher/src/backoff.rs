//! Full-jitter exponential backoff for anything that reconnects.
//!
//! When a database restarts, every process that was listening on it loses its
//! connection at the same moment. Waiting a fixed or plainly doubling delay
//! would bring them all back in lock-step; a random delay below a doubling
//! ceiling spreads them out, which is the "full jitter" scheme.

use std::time::Duration;

/// Delays between reconnect attempts: each is random in
/// `[0, min(cap, base * 2^attempt)]`, and [`reset`](Self::reset) starts over
/// once a connection holds.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
    rng: fastrand::Rng,
}

impl Backoff {
    /// The default first ceiling: short enough that a single dropped
    /// connection is back almost at once.
    pub const DEFAULT_BASE: Duration = Duration::from_millis(250);
    /// The default largest ceiling: a database that is down for long is
    /// still retried twice a minute.
    pub const DEFAULT_CAP: Duration = Duration::from_secs(30);

    /// Backoff whose first delay is at most `base` and no delay exceeds `cap`.
    ///
    /// A `base` above `cap` behaves as `cap`; a zero `base` never waits.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            attempt: 0,
            rng: fastrand::Rng::new(),
        }
    }

    /// The same schedule with a fixed random seed, for reproducible tests.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.rng = fastrand::Rng::with_seed(seed);
        self
    }

    pub fn base(&self) -> Duration {
        self.base
    }

    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// How many delays were handed out since the last reset.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The largest delay the next [`next_delay`](Self::next_delay) may return.
    pub fn ceiling(&self) -> Duration {
        let base = self.base.as_nanos();
        let cap = self.cap.as_nanos();
        // `base << attempt` in nanoseconds, treated as past the cap when it
        // would not fit.
        let doubled = if base == 0 {
            0
        } else if self.attempt >= base.leading_zeros() {
            cap
        } else {
            base << self.attempt
        };
        from_nanos(doubled.min(cap))
    }

    /// The delay to wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        // The attempt stops counting once the ceiling reaches the cap, so a
        // long outage can never overflow it.
        if ceiling < self.cap && self.attempt < u128::BITS {
            self.attempt += 1;
        }
        let max_nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.rng.u64(0..=max_nanos))
    }

    /// Starts the schedule over: call it once a connection is established.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// The inverse of `Duration::as_nanos`, for values no larger than a `Duration`.
fn from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX);
    // The remainder is below one billion, so it fits.
    let subsec = (nanos % NANOS_PER_SEC) as u32;
    Duration::new(secs, subsec)
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Self::DEFAULT_BASE, Self::DEFAULT_CAP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_ceiling_doubles_up_to_the_cap() {
        let mut backoff = Backoff::new(100 * MS, 1000 * MS).with_seed(7);
        let mut ceilings = Vec::new();
        for _ in 0..7 {
            ceilings.push(backoff.ceiling());
            let delay = backoff.next_delay();
            assert!(delay <= *ceilings.last().unwrap(), "{delay:?}");
        }
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1000, 1000, 1000].map(|ms| ms * MS)
        );
    }

    #[test]
    fn delays_are_spread_over_the_whole_range() {
        let mut backoff = Backoff::new(1000 * MS, 1000 * MS).with_seed(1);
        let delays: Vec<Duration> = (0..500).map(|_| backoff.next_delay()).collect();
        assert!(delays.iter().all(|d| *d <= 1000 * MS));
        assert!(delays.iter().any(|d| *d < 100 * MS), "never short");
        assert!(delays.iter().any(|d| *d > 900 * MS), "never long");
    }

    #[test]
    fn reset_starts_over() {
        let mut backoff = Backoff::new(10 * MS, 10_000 * MS);
        for _ in 0..5 {
            backoff.next_delay();
        }
        assert_eq!(backoff.ceiling(), 320 * MS);
        backoff.reset();
        assert_eq!(backoff.attempt(), 0);
        assert_eq!(backoff.ceiling(), 10 * MS);
        assert!(backoff.next_delay() <= 10 * MS);
    }

    #[test]
    fn a_long_outage_never_overflows() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::MAX);
        for _ in 0..200 {
            backoff.next_delay();
        }
        assert_eq!(backoff.ceiling(), Duration::MAX);
        let mut zero = Backoff::new(Duration::ZERO, Duration::from_secs(1));
        for _ in 0..100 {
            assert_eq!(zero.next_delay(), Duration::ZERO);
        }
    }

    #[test]
    fn a_base_above_the_cap_behaves_as_the_cap() {
        let backoff = Backoff::new(5000 * MS, 1000 * MS);
        assert_eq!(backoff.ceiling(), 1000 * MS);
    }
}
