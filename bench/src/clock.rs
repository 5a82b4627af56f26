//! One monotonic clock for commit-to-receive latency: publishers record when
//! each numbered event committed (or was sent), subscribers when its frame
//! arrived, both as nanoseconds since the same `Instant`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Commit times of numbered events, shared by publishers and the analysis.
pub struct CommitLog {
    origin: Instant,
    /// Nanoseconds since `origin` plus one; zero means not committed.
    committed: Vec<AtomicU64>,
}

impl CommitLog {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(CommitLog {
            origin: Instant::now(),
            committed: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    pub fn capacity(&self) -> usize {
        self.committed.len()
    }

    /// Nanoseconds since the origin, now.
    pub fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Records that event `number` committed at `at` (from [`CommitLog::now`]).
    pub fn record(&self, number: usize, at: u64) {
        if let Some(slot) = self.committed.get(number) {
            slot.store(at + 1, Ordering::Release);
        }
    }

    pub fn committed_at(&self, number: usize) -> Option<u64> {
        match self.committed.get(number)?.load(Ordering::Acquire) {
            0 => None,
            at => Some(at - 1),
        }
    }

    /// The first commit time, if any committed.
    pub fn first_commit(&self) -> Option<u64> {
        (0..self.committed.len())
            .filter_map(|number| self.committed_at(number))
            .min()
    }
}

/// One frame's arrival: which event, and when (nanoseconds since origin).
#[derive(Clone, Copy)]
pub struct Receipt {
    pub number: u32,
    pub at: u64,
}

/// Latency percentiles over a set of samples.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Percentiles {
    /// `p50 … · p99 … · max …`, as the table's rows print them.
    pub fn summary(&self) -> String {
        use crate::report::ms;
        format!(
            "p50 {} · p99 {} · max {}",
            ms(self.p50),
            ms(self.p99),
            ms(self.max)
        )
    }

    /// From samples in nanoseconds (sorted in place).
    pub fn of(samples: &mut [u64]) -> Percentiles {
        samples.sort_unstable();
        let Some(&max) = samples.last() else {
            return Percentiles::default();
        };
        let at = |fraction: f64| {
            let index = ((samples.len() as f64 - 1.0) * fraction).round() as usize;
            Duration::from_nanos(samples[index])
        };
        Percentiles {
            p50: at(0.50),
            p99: at(0.99),
            max: Duration::from_nanos(max),
        }
    }
}
