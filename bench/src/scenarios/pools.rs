//! The pools an operator sizes, each varied on its own: hub arbiters under
//! many busy scopes, webhook workers against a slow receiver, and the
//! database pool under a replay storm. `docs/src/operations.md` is written from
//! these rows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::BenchResult;
use crate::clock::CommitLog;
use crate::relay_process::RelayProcess;
use crate::scenarios::replay::target;
use crate::sse_load::Subscribers;

/// The busiest arbiter's busy fraction over `seconds`, from the relay's
/// `arbiter_busy_seconds_total` before and after.
pub async fn busiest_arbiter(
    relay: &RelayProcess,
    arbiters: usize,
    before: &[f64],
    seconds: f64,
) -> f64 {
    let mut busiest: f64 = 0.0;
    for (arbiter, start) in before.iter().enumerate().take(arbiters) {
        let now = relay
            .metric(&format!(
                "arbiter_busy_seconds_total{{arbiter=\"{arbiter}\"}}"
            ))
            .await;
        busiest = busiest.max((now - start) / seconds);
    }
    busiest
}

/// Each arbiter's busy seconds so far.
pub async fn arbiter_busy(relay: &RelayProcess, arbiters: usize) -> Vec<f64> {
    let mut busy = Vec::with_capacity(arbiters);
    for arbiter in 0..arbiters {
        busy.push(
            relay
                .metric(&format!(
                    "arbiter_busy_seconds_total{{arbiter=\"{arbiter}\"}}"
                ))
                .await,
        );
    }
    busy
}

#[derive(Debug, Clone)]
pub struct StormFigures {
    pub subscribers: usize,
    pub events: usize,
    pub took: Duration,
    pub mean_pool_wait: Duration,
    pub received: u64,
}

/// Fills `scope` with `events`, then opens `subscribers` streams at once,
/// each replaying all of them from the outbox (`Last-Event-ID` before the
/// first), and measures the time until every one is live.
pub async fn replay_storm(
    relay: &RelayProcess,
    database_url: &str,
    schema: &str,
    scope: &str,
    subscribers: usize,
    events: usize,
) -> BenchResult<StormFigures> {
    let client = eventrelay::connect(database_url).await?;
    let after: i64 = client
        .query_one(
            &format!("SELECT coalesce(max(seq), 0) FROM {schema}.outbox"),
            &[],
        )
        .await?
        .get(0);
    client
        .execute(
            &format!(
                "SELECT {schema}.emit('bench.storm'::text, $1::text, jsonb_build_object('bn', g))
                 FROM generate_series(1, $2::int) AS g"
            ),
            &[&scope, &(events as i32)],
        )
        .await?;
    let waits_before = relay.metric("database_pool_wait_seconds_sum").await;
    let count_before = relay.metric("database_pool_wait_seconds_count").await;
    let log = CommitLog::new(events + 1);
    let targets = (0..subscribers)
        .map(|n| target(relay, &format!("storm-{n}"), scope, Some(after)))
        .collect();
    let started = Instant::now();
    let storm = Subscribers::open(targets, Arc::clone(&log), subscribers).await?;
    let took = started.elapsed();
    let received = storm.received();
    storm.finish().await;
    let waited = relay.metric("database_pool_wait_seconds_sum").await - waits_before;
    let checkouts = relay.metric("database_pool_wait_seconds_count").await - count_before;
    Ok(StormFigures {
        subscribers,
        events,
        took,
        mean_pool_wait: Duration::from_secs_f64(waited / checkouts.max(1.0)),
        received,
    })
}
