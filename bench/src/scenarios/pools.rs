//! The pools an operator sizes, each varied on its own: hub arbiters under
//! many busy scopes, webhook workers against a slow receiver, and the
//! database pool under a replay storm. `docs/src/operations.md` is written from
//! these rows.

use crate::context::Context;
use crate::report::{Table, verdict};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::BenchResult;
use crate::clock::CommitLog;
use crate::publish::Pace;
use crate::relay_process::RelayProcess;
use crate::scenarios::fanout::{self, FanoutPlan, Server, fanout_summary};
use crate::scenarios::replay::target;
use crate::scenarios::webhooks;
use crate::sse_load::Subscribers;
use crate::webhook_receiver::WebhookReceiver;

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
/// Each pool varied on its own, for `docs/src/operations.md`.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (db, schema) = (cx.db(), cx.schema.as_str());
    // Hub arbiters: many busy scopes.
    let rate = 1_000.0;
    for arbiters in [1, 2, 4] {
        let mut settings = cx.settings();
        settings.arbiters = arbiters;
        let relay = cx.start_relay(settings).await?;
        eprintln!("pools: hub.arbiters = {arbiters}");
        let plan = FanoutPlan {
            subscribers: cx.scale.scopes * cx.scale.per_scope,
            scopes: cx.scale.scopes,
            scope_prefix: format!("arbiters-{arbiters}"),
            pace: Pace::PerSecond(rate),
            duration: cx.scale.fixed_run,
            writers: 4,
            source: cx.emit_source(),
        };
        let before = arbiter_busy(&relay, arbiters).await;
        let started = std::time::Instant::now();
        let f = fanout::run(&plan, &Server::of(&relay)).await?;
        let busiest =
            busiest_arbiter(&relay, arbiters, &before, started.elapsed().as_secs_f64()).await;
        table.add(
            format!(
                "hub.arbiters = {arbiters}: {} scopes × {} subscribers, {rate:.0} ev/s, emit",
                cx.scale.scopes, cx.scale.per_scope
            ),
            format!(
                "busiest arbiter {:.0}% busy · {}",
                busiest * 100.0,
                fanout_summary(&f)
            ),
            format!("all received: {}", verdict(f.delivered == f.expected)),
        );
    }
    // Webhook workers: a receiver that takes 50 ms per request.
    let delay = Duration::from_millis(50);
    for workers in [1, 4, 16] {
        let receiver = WebhookReceiver::start_slow(delay).await?;
        let mut settings = cx.settings();
        settings.webhook_url = Some(receiver.url.clone());
        settings.webhook_workers = workers;
        let relay = cx.start_relay(settings).await?;
        eprintln!("pools: webhooks.workers = {workers}");
        let events = (workers * 40).min(cx.scale.webhook_events);
        let f = webhooks::run(&receiver, 1, db, schema, events).await?;
        let backlog_age = relay.metric("webhook_oldest_due_age_seconds").await;
        table.add(
            format!("webhooks.workers = {workers}: receiver answers in 50 ms, {events} deliveries"),
            format!(
                "{:.0} deliveries/s ({:.1} per worker) · {} of {} delivered · oldest due at the end {backlog_age:.1} s",
                f.deliveries_per_second,
                f.deliveries_per_second / workers as f64,
                f.delivered,
                f.events
            ),
            format!("all delivered: {}", verdict(f.delivered == f.events as u64)),
        );
        drop(relay);
    }
    // Database pool: a replay storm from the outbox.
    let subscribers = cx.scale.small_fanout / 2;
    for pool_size in [2, 8, 32] {
        let mut settings = cx.settings();
        settings.pool_size = pool_size;
        let relay = cx.start_relay(settings).await?;
        eprintln!("pools: database.pool_size = {pool_size}");
        let f = replay_storm(
            &relay,
            db,
            schema,
            &format!("storm-{pool_size}"),
            subscribers,
            500,
        )
        .await?;
        table.add(
            format!(
                "database.pool_size = {pool_size}: {} subscribers replay {} events each from the outbox at once",
                f.subscribers, f.events
            ),
            format!(
                "all live after {:.2} s · mean pool wait {:.1} ms · {} events replayed",
                f.took.as_secs_f64(),
                f.mean_pool_wait.as_secs_f64() * 1000.0,
                f.received
            ),
            format!(
                "all replayed: {}",
                verdict(f.received == (f.subscribers * f.events) as u64)
            ),
        );
    }
    Ok(())
}
