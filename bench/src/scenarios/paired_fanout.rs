//! Two servers' fan-out measured in one stretch of time: each has its own
//! subscribers, and events go to one server, then the other, in short
//! slices (A B, B A, …). Both see the same machine, minute by minute, so a
//! difference between them is the servers' and not the hour's. Reports
//! each side's commit-to-receive percentiles over all of its deliveries,
//! and the slice pairs: in how many the second side's p50 was no higher
//! than the first's, and the median of the per-pair difference.

use std::sync::Arc;
use std::time::Duration;

use crate::BenchResult;
use crate::clock::{CommitLog, Percentiles};
use crate::proc_stats::{self, Usage};
use crate::publish::{Pace, Source, publish_for, slice_side};
use crate::report::median;
use crate::scenarios::fanout::{Server, cpu_per_1000};
use crate::sse_load::{StreamOutcome, Subscribers};

/// Handshakes in flight while subscribers connect.
const CONNECT_CONCURRENCY: usize = 200;
/// Longest wait for the last deliveries after publishing stops.
const DRAIN_PATIENCE: Duration = Duration::from_secs(5);

pub struct PairedPlan {
    /// Subscribers on each side, all in the side's one scope.
    pub subscribers: usize,
    /// Prefix of this run's scope names, unique per run.
    pub scope_prefix: String,
    pub per_second: f64,
    /// Consecutive events that go to one side before the other takes over.
    pub slice: usize,
    pub duration: Duration,
    pub writers: usize,
    /// Where each side's events are published.
    pub sources: [Source; 2],
}

/// One side's deliveries.
#[derive(Debug, Clone, Default)]
pub struct SideFigures {
    pub published: usize,
    pub expected: u64,
    pub delivered: u64,
    pub latency: Percentiles,
    pub cpu_seconds_per_1000: f64,
}

#[derive(Debug, Clone, Default)]
pub struct PairedFigures {
    pub sides: [SideFigures; 2],
    /// Slice pairs in which both sides delivered.
    pub pairs: usize,
    /// Pairs in which side 1's p50 was at most side 0's.
    pub second_not_slower: usize,
    /// Median over pairs of (side 1's p50 − side 0's p50), in milliseconds.
    pub median_difference_ms: f64,
}

pub async fn run(plan: &PairedPlan, servers: [&Server; 2]) -> BenchResult<PairedFigures> {
    let capacity = (plan.per_second * plan.duration.as_secs_f64()).ceil() as usize + 1;
    let log = CommitLog::new(capacity);
    let scopes = [0, 1].map(|side| format!("{}-{side}", plan.scope_prefix));
    let mut subscribers = Vec::new();
    let opened: BenchResult<()> = async {
        for (server, scope) in servers.iter().zip(&scopes) {
            let targets = (0..plan.subscribers)
                .map(|i| server.target(i, scope))
                .collect();
            let transport = server.transport(plan.subscribers)?;
            subscribers.push(
                Subscribers::open_over(targets, Arc::clone(&log), CONNECT_CONCURRENCY, transport)
                    .await?,
            );
        }
        Ok(())
    }
    .await;
    let measured = match opened {
        Ok(()) => publish_and_drain(plan, servers, &scopes, &subscribers, &log).await,
        Err(error) => Err(error),
    };
    let mut outcomes = Vec::new();
    for open in subscribers {
        outcomes.push(open.finish().await);
    }
    let Drained {
        published,
        per_side,
        idle,
        after,
    } = measured?;
    let slice = plan.slice.max(1);

    // Latencies per side, and per slice for the pairs.
    let slices = published.div_ceil(slice);
    let mut by_slice: Vec<Vec<u64>> = vec![Vec::new(); slices];
    let mut sides: [SideFigures; 2] = Default::default();
    for (side, outcomes) in outcomes.iter().enumerate() {
        let mut latencies = latencies_of(outcomes, &log, |number, latency| {
            if let Some(samples) = by_slice.get_mut(number / slice) {
                samples.push(latency);
            }
        });
        sides[side] = SideFigures {
            published: per_side[side],
            expected: (per_side[side] * plan.subscribers) as u64,
            delivered: latencies.len() as u64,
            latency: Percentiles::of(&mut latencies),
            cpu_seconds_per_1000: cpu_per_1000(idle[side], after[side], latencies.len() as u64),
        };
    }
    let differences = pair_differences(&mut by_slice, slice);
    let pairs = differences.len();
    let second_not_slower = differences.iter().filter(|d| **d <= 0.0).count();
    Ok(PairedFigures {
        sides,
        pairs,
        second_not_slower,
        median_difference_ms: median(&differences),
    })
}

/// What publishing left for the analysis.
struct Drained {
    published: usize,
    per_side: [usize; 2],
    /// Each server's CPU and memory before publishing, and after draining.
    idle: [Usage; 2],
    after: [Usage; 2],
}

/// Publishes the alternating events and waits until each side's
/// subscribers have them all (or the patience ran out).
async fn publish_and_drain(
    plan: &PairedPlan,
    servers: [&Server; 2],
    scopes: &[String; 2],
    subscribers: &[Subscribers],
    log: &Arc<CommitLog>,
) -> BenchResult<Drained> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = servers.map(|server| proc_stats::usage(server.pids()));
    let slice = plan.slice.max(1);
    let scopes = scopes.clone();
    let scope_of = Arc::new(move |number: usize| scopes[slice_side(number, slice)].clone());
    let source = Source::Alternating {
        sources: Box::new(plan.sources.clone()),
        slice,
    };
    let published = publish_for(
        &source,
        scope_of,
        Pace::PerSecond(plan.per_second),
        plan.duration,
        plan.writers,
        Arc::clone(log),
    )
    .await?;
    let mut per_side = [0usize; 2];
    for number in 0..published {
        per_side[slice_side(number, slice)] += 1;
    }
    let expected = per_side.map(|count| (count * plan.subscribers) as u64);
    for (open, expected) in subscribers.iter().zip(expected) {
        open.wait_for(expected, DRAIN_PATIENCE).await;
    }
    let after = servers.map(|server| proc_stats::usage(server.pids()));
    Ok(Drained {
        published,
        per_side,
        idle,
        after,
    })
}

/// Per pair of slices (2k, 2k+1), side 1's p50 minus side 0's, in
/// milliseconds; pairs where either side has no samples are left out.
fn pair_differences(by_slice: &mut [Vec<u64>], slice: usize) -> Vec<f64> {
    let mut differences = Vec::new();
    for (pair, slices) in by_slice.chunks_mut(2).enumerate() {
        let [first, second] = slices else { continue };
        if first.is_empty() || second.is_empty() {
            continue;
        }
        // Slices 2k and 2k+1 hold one slice of each side.
        let (side0, side1) = if slice_side(2 * pair * slice.max(1), slice) == 0 {
            (first, second)
        } else {
            (second, first)
        };
        let p50 = |samples: &mut Vec<u64>| Percentiles::of(samples).p50.as_secs_f64() * 1000.0;
        differences.push(p50(side1) - p50(side0));
    }
    differences
}

/// Every delivery's commit-to-receive latency, in nanoseconds; `each` also
/// sees the event's number with it.
fn latencies_of(
    outcomes: &[StreamOutcome],
    log: &CommitLog,
    mut each: impl FnMut(usize, u64),
) -> Vec<u64> {
    let mut latencies = Vec::new();
    for outcome in outcomes {
        for receipt in &outcome.receipts {
            let number = receipt.number as usize;
            if let Some(committed) = log.committed_at(number) {
                let latency = receipt.at.saturating_sub(committed);
                latencies.push(latency);
                each(number, latency);
            }
        }
    }
    latencies
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pair_of_slices_holds_one_of_each_side_and_the_first_alternates() {
        let sides: Vec<usize> = (0..8).map(|index| slice_side(index * 50, 50)).collect();
        assert_eq!(sides, [0, 1, 1, 0, 0, 1, 1, 0]);
        assert_eq!(slice_side(49, 50), 0);
        assert_eq!(slice_side(50, 50), 1);
    }

    #[test]
    fn differences_are_side_one_minus_side_zero_whichever_went_first() {
        const MS: u64 = 1_000_000;
        // Pair 0: side 0 then side 1; pair 1: side 1 then side 0.
        let mut by_slice = vec![
            vec![2 * MS, 2 * MS, 2 * MS],
            vec![3 * MS],
            vec![5 * MS],
            vec![9 * MS],
            vec![MS],
        ];
        let differences = pair_differences(&mut by_slice, 10);
        assert_eq!(differences.len(), 2, "the unpaired last slice is left out");
        assert!((differences[0] - 1.0).abs() < 1e-9, "{differences:?}");
        assert!((differences[1] + 4.0).abs() < 1e-9, "{differences:?}");
    }
}
