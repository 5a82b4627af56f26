//! The figures: a clock for commit-to-receive latency, percentiles, and the
//! result table, in Markdown to paste into bench/README.md as is.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::BenchResult;

#[derive(Default)]
pub struct Table {
    rows: Vec<[String; 3]>,
}

impl Table {
    pub fn add(
        &mut self,
        scenario: impl Into<String>,
        result: impl Into<String>,
        target: impl Into<String>,
    ) {
        let row = [scenario.into(), result.into(), target.into()];
        eprintln!("  {}", row.join(" | "));
        self.rows.push(row);
    }

    /// A row with no target.
    pub fn note(&mut self, scenario: impl Into<String>, result: impl Into<String>) {
        self.add(scenario, result, "–");
    }

    pub fn render(&self) -> String {
        let mut text = String::from("| scenario | measured | target |\n|---|---|---|\n");
        for row in &self.rows {
            text.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        text
    }
}

/// Runs `measure(round, case)` for each of `cases` in each of `rounds`
/// rounds, every other round in reverse order, so that no case always comes
/// last on a machine that drifts; answers each case's figures by round.
pub async fn alternating<T>(
    rounds: usize,
    cases: usize,
    mut measure: impl AsyncFnMut(usize, usize) -> BenchResult<T>,
) -> BenchResult<Vec<Vec<T>>> {
    let mut figures: Vec<Vec<T>> = (0..cases).map(|_| Vec::new()).collect();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..cases).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for case in order {
            figures[case].push(measure(round, case).await?);
        }
    }
    Ok(figures)
}

pub fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

pub fn ms(duration: Duration) -> String {
    format!("{:.2} ms", millis(duration))
}

pub fn size(bytes: f64) -> String {
    if bytes.abs() >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
    } else {
        format!("{:.1} KiB", bytes / 1024.0)
    }
}

/// `values` with `decimals` decimals, between `separator`s.
pub fn joined(values: &[f64], decimals: usize, separator: &str) -> String {
    let shown: Vec<String> = values.iter().map(|v| format!("{v:.decimals$}")).collect();
    shown.join(separator)
}

/// `target` where it applies, `–` elsewhere.
pub fn target_if(applies: bool, target: String) -> String {
    if applies { target } else { "–".to_owned() }
}

pub fn verdict(met: bool) -> &'static str {
    if met { "**met**" } else { "**missed**" }
}

/// The median of `of` over `figures`.
pub fn median_of<T>(figures: &[T], of: impl Fn(&T) -> f64) -> f64 {
    median(&figures.iter().map(of).collect::<Vec<_>>())
}

pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 0 => (sorted[middle - 1] + sorted[middle]) / 2.0,
        _ => sorted[middle],
    }
}

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

    pub fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

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

    pub fn first_commit(&self) -> Option<u64> {
        (0..self.capacity())
            .filter_map(|n| self.committed_at(n))
            .min()
    }
}

#[derive(Clone, Copy)]
pub struct Receipt {
    pub number: u32,
    pub at: u64,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Percentiles {
    pub fn summary(&self) -> String {
        format!("{} · max {}", self.p50_p99(), ms(self.max))
    }

    pub fn p50_p99(&self) -> String {
        format!("p50 {} · p99 {}", ms(self.p50), ms(self.p99))
    }

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
