//! The two wake-up modes side by side (`--only wakeup`, `wal_level =
//! logical`): what emitting costs a writer in each against the floor, then
//! commit-to-receive with both modes' relays at once, the events taking
//! turns in half-second slices (A B, B A, …) so both see the same minutes.

use crate::BenchResult;
use crate::context::Context;
use crate::database::{create_schema_for, drop_schema};
use crate::proc_stats;
use crate::publish::{Pace, Source, publish_for, slice_side};
use crate::relay_process::RelaySettings;
use crate::report::{CommitLog, Percentiles, Table, alternating, median, median_of, millis};
use crate::report::{target_if, verdict};
use crate::scenarios::emit_cost::{self, WriteKind};
use crate::scenarios::fanout::{CONNECT_CONCURRENCY, DRAIN_PATIENCE, Server, cpu_per_1000};
use crate::sse_load::{Subscribers, deliveries};
use eventrelay::store::WakeupMode;
use std::sync::Arc;
use std::time::Duration;

const WAKEUP_MODES: [WakeupMode; 2] = [WakeupMode::Notify, WakeupMode::Logical];

/// Per pair of slices (2k, 2k+1), side 1's p50 minus side 0's, in
/// milliseconds; pairs where either side has no samples are left out.
fn pair_differences(by_slice: &mut [Vec<u64>], slice: usize) -> Vec<f64> {
    let mut differences = Vec::new();
    for (pair, slices) in by_slice.chunks_mut(2).enumerate() {
        let [first, second] = slices else { continue };
        if first.is_empty() || second.is_empty() {
            continue;
        }
        let (side0, side1) = if slice_side(2 * pair * slice.max(1), slice) == 0 {
            (first, second)
        } else {
            (second, first)
        };
        let p50 = |samples: &mut Vec<u64>| millis(Percentiles::of(samples).p50);
        differences.push(p50(side1) - p50(side0));
    }
    differences
}

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let Some(db) = cx.args.logical_database_url.as_deref() else {
        eprintln!("wake-up modes: no --logical-database-url, skipped");
        return Ok(());
    };
    let notify_schema = format!("wake_notify_{}", std::process::id());
    let logical_schema = format!("wake_logical_{}", std::process::id());
    create_schema_for(db, &notify_schema, WakeupMode::Notify).await?;
    create_schema_for(db, &logical_schema, WakeupMode::Logical).await?;
    let schemas = [notify_schema.as_str(), logical_schema.as_str()];
    let mut outcome = wakeup_emit_cost(cx, table, db, schemas).await;
    if outcome.is_ok() {
        outcome = wakeup_latency(cx, table, db, schemas).await;
    }
    drop_schema(db, &notify_schema).await;
    drop_schema(db, &logical_schema).await;
    outcome
}

async fn wakeup_emit_cost(
    cx: &Context,
    table: &mut Table,
    db: &str,
    [notify_schema, logical_schema]: [&str; 2],
) -> BenchResult<()> {
    const WRITERS: [usize; 3] = [1, 8, 32];
    // Rounds of floor, notify and logical back to back (every other one
    // reversed), each figure the median of its rounds: the machine and the
    // tables drift over a run, and so would a ratio of figures minutes apart.
    const ROUNDS: usize = 5;
    emit_cost::prepare(db, notify_schema).await?;
    emit_cost::prepare(db, logical_schema).await?;
    let mut plain = Vec::new();
    for writers in WRITERS {
        eprintln!("wake-up modes: plain, {writers} writers");
        let run = cx.scale.emit_run;
        plain.push(emit_cost::measure(db, notify_schema, WriteKind::Plain, writers, run).await?);
    }
    // The floor: the logical schema with no relay, so nothing is sent or decoded.
    let cases = [
        (None, logical_schema),
        (Some(WakeupMode::Notify), notify_schema),
        (Some(WakeupMode::Logical), logical_schema),
    ];
    let rounds = alternating(ROUNDS, cases.len(), async |round, case| {
        let (mode, schema) = cases[case];
        let mut relay = match mode {
            None => None,
            Some(mode) => {
                let mut settings = RelaySettings::new(db, schema);
                settings.wakeup = mode.as_str();
                Some(cx.start_relay(settings).await?)
            }
        };
        let label = mode.map_or("floor".to_owned(), |mode| mode.to_string());
        let mut figures = Vec::new();
        for writers in WRITERS {
            let kind = WriteKind::WithSqlEmit;
            let tps = emit_cost::measure(db, schema, kind, writers, cx.scale.emit_run).await?;
            let round = round + 1;
            eprintln!("wake-up modes: round {round}, {label}, {writers} writers: {tps:.0} tx/s");
            figures.push(tps);
        }
        if let Some(relay) = relay.as_mut() {
            relay.terminate(Duration::from_secs(10)).await?;
        }
        Ok(figures)
    })
    .await?;
    for (index, writers) in WRITERS.into_iter().enumerate() {
        let [floor, notify, logical] = [0, 1, 2].map(|case| median_of(&rounds[case], |r| r[index]));
        let (plain, ratio, notify_ratio) = (plain[index], logical / floor, notify / floor);
        let met = verdict(ratio >= 0.85);
        let target = target_if(writers > 1, format!("logical ≥ 0.85× the floor: {met}"));
        table.add(
            format!("emit cost by wake-up mode, {writers} writer(s)"),
            format!(
                "plain {plain:.0} tx/s · outbox row, no wake-up (floor) {floor:.0} · notify {notify:.0} ({notify_ratio:.2}× floor) · logical {logical:.0} ({ratio:.2}× floor) · medians of {ROUNDS} rounds"
            ),
            target,
        );
    }
    Ok(())
}

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
    let (fixed, small) = (cx.scale.fixed_run, cx.scale.small_fanout);
    for (subscribers, duration) in [(1, fixed * 2), (small, fixed * 6)] {
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

async fn wakeup_pair_row(
    table: &mut Table,
    db: &str,
    schemas: [&str; 2],
    servers: &[Server],
    subscribers: usize,
    duration: Duration,
) -> BenchResult<()> {
    const PER_SECOND: f64 = 100.0;
    const SLICE: usize = (PER_SECOND / 2.0) as usize;
    eprintln!("wake-up modes: {subscribers} subscriber(s) per mode for {duration:?}");
    let log = CommitLog::new((PER_SECOND * duration.as_secs_f64()).ceil() as usize + 1);
    let prefix = format!("wake-{}-{subscribers}", std::process::id());
    let scopes = [0, 1].map(|side| format!("{prefix}-{side}"));
    let mut opened = Vec::new();
    for (server, scope) in servers.iter().zip(&scopes) {
        let targets = (0..subscribers).map(|i| server.target(i, scope)).collect();
        opened.push(Subscribers::open(targets, Arc::clone(&log), CONNECT_CONCURRENCY).await?);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let usage = || servers.iter().map(|s| proc_stats::usage(s.pids()));
    let idle: Vec<_> = usage().collect();
    let scope_of = Arc::new(move |number: usize| scopes[slice_side(number, SLICE)].clone());
    let source = Source::Alternating {
        sources: Box::new(schemas.map(|schema| Source::emit(db, schema))),
        slice: SLICE,
    };
    let pace = Pace::PerSecond(PER_SECOND);
    let published = publish_for(&source, scope_of, pace, duration, 4, Arc::clone(&log)).await?;
    let mut per_side = [0usize; 2];
    for number in 0..published {
        per_side[slice_side(number, SLICE)] += 1;
    }
    for (open, count) in opened.iter().zip(per_side) {
        open.wait_for((count * subscribers) as u64, DRAIN_PATIENCE)
            .await;
    }
    let after: Vec<_> = usage().collect();

    let mut by_slice: Vec<Vec<u64>> = vec![Vec::new(); published.div_ceil(SLICE)];
    let mut p50s = Vec::new();
    for (side, open) in opened.into_iter().enumerate() {
        let mut latencies: Vec<u64> = deliveries(&open.finish().await, &log)
            .map(|(number, _, latency)| {
                if let Some(samples) = by_slice.get_mut(number as usize / SLICE) {
                    samples.push(latency);
                }
                latency
            })
            .collect();
        let (delivered, latency) = (latencies.len() as u64, Percentiles::of(&mut latencies));
        p50s.push(latency.p50);
        let (p50, notify_p50) = (millis(latency.p50), millis(p50s[0]));
        let met = verdict(latency.p50 <= p50s[0]);
        let against_notify = format!("p50 ≤ notify's: {p50:.3} against {notify_p50:.3} ms {met}");
        let target = target_if(WAKEUP_MODES[side] == WakeupMode::Logical, against_notify);
        let (summary, events) = (latency.summary(), per_side[side]);
        let cpu = cpu_per_1000(idle[side], after[side], delivered);
        table.add(
            format!(
                "wake-up {}: {subscribers} sub(s), 1 scope, {PER_SECOND} ev/s, SQL emit (commit-to-receive), \
                 both modes in one run, alternating every {SLICE} events",
                WAKEUP_MODES[side]
            ),
            format!(
                "{summary} · {delivered} of {} received from {events} events · {cpu:.3} relay CPU s per 1,000 deliveries",
                events * subscribers
            ),
            target,
        );
    }
    let differences = pair_differences(&mut by_slice, SLICE);
    let below = differences.iter().filter(|d| **d <= 0.0).count();
    let (pairs, difference) = (differences.len(), median(&differences));
    table.note(
        format!("wake-up modes, {subscribers} sub(s): slice pairs (one slice of each mode, back to back)"),
        format!(
            "logical's p50 ≤ notify's in {below} of {pairs} pairs · median difference (logical − notify) {difference:+.2} ms"
        ),
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
