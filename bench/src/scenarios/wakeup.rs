//! The two wake-up modes side by side (`--only wakeup`; `wakeup-latency`
//! without the emit-cost rounds), on a server with `wal_level = logical`:
//! what emitting costs a writer in each mode against the floor, then
//! commit-to-receive with both modes' relays running at once.
//!
//! The latency is a paired fan-out: each relay has its own subscribers,
//! and events go to one, then the other, in short slices (A B, B A, …).
//! Both see the same machine, minute by minute, so a difference between
//! them is the modes' and not the hour's. Reported: each side's
//! percentiles over all of its deliveries, and the slice pairs: in how many
//! the second side's p50 was no higher than the first's, and the median of
//! the per-pair difference.

use crate::BenchResult;
use crate::clock::{CommitLog, Percentiles};
use crate::context::Context;
use crate::database::{create_schema_for, drop_schema};
use crate::proc_stats::{self, Usage};
use crate::publish::{Pace, Source, publish_for, slice_side};
use crate::relay_process::RelaySettings;
use crate::report::{Table, median, verdict};
use crate::scenarios::emit_cost::{self, WriteKind};
use crate::scenarios::fanout::{Server, cpu_per_1000};
use crate::sse_load::{StreamOutcome, Subscribers};
use eventrelay::store::WakeupMode;
use std::sync::Arc;
use std::time::Duration;

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
            subscribers
                .push(Subscribers::open(targets, Arc::clone(&log), CONNECT_CONCURRENCY).await?);
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

/// The two wake-up modes side by side on one server with `wal_level =
/// logical`: what emitting costs a writer at 1, 8 and 32 writers (a plain
/// write; the outbox row with no wake-up at all, the floor; notify mode
/// and logical mode, each with its relay running), then commit-to-receive
/// latency and relay CPU with both modes' relays running at once, for one
/// subscriber and for 1,000 subscribers × 100 ev/s.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    // `wakeup-latency` alone skips the emit-cost rounds.
    let emit_cost = cx.args.only.is_empty() || cx.named("wakeup");
    let Some(db) = cx.args.logical_database_url.as_deref() else {
        eprintln!("wake-up modes: no --logical-database-url, skipped");
        return Ok(());
    };
    let notify_schema = format!("wake_notify_{}", std::process::id());
    let logical_schema = format!("wake_logical_{}", std::process::id());
    create_schema_for(db, &notify_schema, WakeupMode::Notify).await?;
    create_schema_for(db, &logical_schema, WakeupMode::Logical).await?;
    let schemas = [notify_schema.as_str(), logical_schema.as_str()];
    let mut outcome = Ok(());
    if emit_cost {
        outcome = wakeup_emit_cost(cx, table, db, schemas).await;
    }
    if outcome.is_ok() {
        outcome = wakeup_latency(cx, table, db, schemas).await;
    }
    drop_schema(db, &notify_schema).await;
    drop_schema(db, &logical_schema).await;
    outcome
}

/// What emitting costs a writer in each mode, against the floor.
async fn wakeup_emit_cost(
    cx: &Context,
    table: &mut Table,
    db: &str,
    [notify_schema, logical_schema]: [&str; 2],
) -> BenchResult<()> {
    const WRITERS: [usize; 3] = [1, 8, 32];
    // Rounds of floor, notify and logical back to back, each figure the
    // median of its rounds: the machine and the tables drift over a run,
    // and a ratio of two figures taken minutes apart measures the drift too.
    // Every other round runs the three in reverse, so no case always comes
    // last, on the largest tables.
    const ROUNDS: usize = 5;
    emit_cost::prepare(db, notify_schema).await?;
    emit_cost::prepare(db, logical_schema).await?;
    let mut plain = Vec::new();
    for writers in WRITERS {
        eprintln!("wake-up modes: plain, {writers} writers");
        plain.push(
            emit_cost::measure(
                db,
                notify_schema,
                WriteKind::Plain,
                writers,
                cx.scale.emit_run,
            )
            .await?,
        );
    }
    // Per case (the floor, then each mode), per writer count, a figure
    // per round.
    let mut rounds = vec![vec![Vec::new(); WRITERS.len()]; 3];
    for round in 1..=ROUNDS {
        // (case, mode, schema); the floor is the logical schema with no
        // relay, so its trigger sends nothing and nothing decodes.
        let mut order = [
            (0, None, logical_schema),
            (1, Some(WakeupMode::Notify), notify_schema),
            (2, Some(WakeupMode::Logical), logical_schema),
        ];
        if round % 2 == 0 {
            order.reverse();
        }
        for (case, mode, schema) in order {
            let mut relay = match mode {
                None => None,
                Some(mode) => {
                    let mut settings = RelaySettings::new(db, schema);
                    settings.wakeup = mode.as_str();
                    Some(cx.start_relay(settings).await?)
                }
            };
            let label = mode.map_or("floor".to_owned(), |mode| mode.to_string());
            for (index, writers) in WRITERS.into_iter().enumerate() {
                let tps = emit_cost::measure(
                    db,
                    schema,
                    WriteKind::WithSqlEmit,
                    writers,
                    cx.scale.emit_run,
                )
                .await?;
                eprintln!(
                    "wake-up modes: round {round}, {label}, {writers} writers: {tps:.0} tx/s"
                );
                rounds[case][index].push(tps);
            }
            if let Some(relay) = relay.as_mut() {
                relay.terminate(Duration::from_secs(10)).await?;
            }
        }
    }
    let (floor_rounds, mode_rounds) = (&rounds[0], [&rounds[1], &rounds[2]]);
    let floor: Vec<f64> = floor_rounds.iter().map(|r| median(r)).collect();
    let emits = |slot: usize| -> Vec<f64> { mode_rounds[slot].iter().map(|r| median(r)).collect() };
    let (notify, logical) = (emits(0), emits(1));
    for (index, writers) in WRITERS.into_iter().enumerate() {
        let of_floor = |tps: f64| tps / floor[index];
        let ratio = of_floor(logical[index]);
        let target = if writers == 1 {
            "–".to_owned()
        } else {
            format!("logical ≥ 0.85× the floor: {}", verdict(ratio >= 0.85))
        };
        table.add(
            format!("emit cost by wake-up mode, {writers} writer(s)"),
            format!(
                "plain {:.0} tx/s · outbox row, no wake-up (floor) {:.0} · notify {:.0} ({:.2}× floor) · logical {:.0} ({ratio:.2}× floor) · medians of {ROUNDS} rounds",
                plain[index],
                floor[index],
                notify[index],
                of_floor(notify[index]),
                logical[index],
            ),
            target,
        );
    }
    Ok(())
}

/// Commit-to-receive in both modes at once: a relay per mode, each with its
/// subscribers, and events going to one mode, then the other, in slices of
/// half a second (A B, B A, …). Rounds of a relay each, minutes apart, let
/// the machine's drift decide which mode looked faster; slices this short
/// give both modes the same minutes. First with one subscriber per mode,
/// which times the wake-up itself, then with the full fan-out.
async fn wakeup_latency(
    cx: &Context,
    table: &mut Table,
    db: &str,
    schemas: [&str; 2],
) -> BenchResult<()> {
    let mut relays = Vec::new();
    for (mode, schema) in WAKEUP_MODES.into_iter().zip(schemas) {
        let mut settings = RelaySettings::new(db, schema);
        settings.wakeup = mode.as_str();
        relays.push(cx.start_relay(settings).await?);
    }
    let servers: Vec<Server> = relays.iter().map(Server::of).collect();
    let mut outcome = Ok(());
    // The fan-out as long as three rounds of each mode would take.
    for (subscribers, duration) in [
        (1, cx.scale.fixed_run * 2),
        (cx.scale.small_fanout, cx.scale.fixed_run * 6),
    ] {
        outcome = wakeup_pair_row(table, db, schemas, &servers, subscribers, duration).await;
        if outcome.is_err() {
            break;
        }
    }
    for relay in &mut relays {
        relay.terminate(Duration::from_secs(10)).await?;
    }
    outcome
}

const WAKEUP_MODES: [WakeupMode; 2] = [WakeupMode::Notify, WakeupMode::Logical];

/// One paired run of the wake-up modes' relays, as rows of the table.
async fn wakeup_pair_row(
    table: &mut Table,
    db: &str,
    schemas: [&str; 2],
    servers: &[Server],
    subscribers: usize,
    duration: Duration,
) -> BenchResult<()> {
    const PER_SECOND: f64 = 100.0;
    eprintln!(
        "wake-up modes: {subscribers} subscriber(s) per mode, both relays running, events alternating between them for {duration:?}"
    );
    let plan = PairedPlan {
        subscribers,
        scope_prefix: format!("wake-{}-{subscribers}", std::process::id()),
        per_second: PER_SECOND,
        slice: (PER_SECOND / 2.0) as usize,
        duration,
        writers: 4,
        sources: schemas.map(|schema| Source::emit(db, schema)),
    };
    let figures = run(&plan, [&servers[0], &servers[1]]).await?;
    let [notify, logical] = &figures.sides;
    for (mode, side) in WAKEUP_MODES.into_iter().zip(&figures.sides) {
        let target = match mode {
            WakeupMode::Notify => "–".to_owned(),
            WakeupMode::Logical => format!(
                "p50 ≤ notify's: {:.3} against {:.3} ms {}",
                logical.latency.p50.as_secs_f64() * 1000.0,
                notify.latency.p50.as_secs_f64() * 1000.0,
                verdict(logical.latency.p50 <= notify.latency.p50)
            ),
        };
        table.add(
            format!(
                "wake-up {mode}: {subscribers} sub(s), 1 scope, {PER_SECOND} ev/s, SQL emit (commit-to-receive), \
                 both modes in one run, alternating every {} events",
                plan.slice
            ),
            format!(
                "{} · {} of {} received from {} events · {:.3} relay CPU s per 1,000 deliveries",
                side.latency.summary(),
                side.delivered,
                side.expected,
                side.published,
                side.cpu_seconds_per_1000,
            ),
            target,
        );
    }
    table.add(
        format!("wake-up modes, {subscribers} sub(s): slice pairs (one slice of each mode, back to back)"),
        format!(
            "logical's p50 ≤ notify's in {} of {} pairs · median difference (logical − notify) {:+.2} ms",
            figures.second_not_slower, figures.pairs, figures.median_difference_ms
        ),
        "–",
    );
    Ok(())
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
