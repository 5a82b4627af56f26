//! Replay: a subscriber reconnects with a `Last-Event-ID` 10,000 events back
//! and the time until it has all of them (its `ready` frame) is measured,
//! served from the tail or from the outbox depending on the relay's bounds.

use crate::context::Context;
use crate::report::{Table, ms, verdict};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::BenchResult;
use crate::clock::CommitLog;
use crate::relay_process::RelayProcess;
use crate::sse_load::{ReadyWhen, StreamTarget, Subscribers};

/// Events emitted per transaction while filling the scope.
const EMIT_BATCH: usize = 500;

#[derive(Debug, Clone)]
pub struct ReplayFigures {
    pub events: usize,
    pub received: usize,
    pub took: Duration,
    /// Which source the relay's `replays` counter moved for.
    pub served_from: &'static str,
}

pub fn target(
    relay: &RelayProcess,
    subscriber: &str,
    scope: &str,
    after: Option<i64>,
) -> StreamTarget {
    StreamTarget {
        address: relay.address(),
        path: "/v1/events".to_owned(),
        authorization: Some(format!(
            "Bearer {}",
            crate::subscriber_token(subscriber, scope)
        )),
        last_event_id: after,
        ready_when: ReadyWhen::ReadyEvent,
    }
}

/// Fills `scope` with `events` while one subscriber keeps the scope (and its
/// tail) live, then replays them all on a second connection.
pub async fn run(
    relay: &RelayProcess,
    database_url: &str,
    schema: &str,
    scope: &str,
    events: usize,
) -> BenchResult<ReplayFigures> {
    let log = CommitLog::new(events + 1);
    let holder = Subscribers::open(
        vec![target(relay, "holder", scope, None)],
        Arc::clone(&log),
        1,
    )
    .await?;

    let client = eventrelay::connect(database_url).await?;
    let after = crate::database::max_seq(database_url, schema).await?;
    let emit = format!(
        "SELECT {schema}.emit('bench.replay'::text, $1::text, jsonb_build_object('bn', g, 'pad', repeat('x', 100)))
         FROM generate_series($2::int, $3::int) AS g"
    );
    let mut next = 0usize;
    while next < events {
        let last = (next + EMIT_BATCH).min(events) - 1;
        client
            .execute(&emit, &[&scope, &(next as i32), &(last as i32)])
            .await?;
        next = last + 1;
    }
    holder
        .wait_for(events as u64, Duration::from_secs(60))
        .await;
    let held = holder.received();
    if held < events as u64 {
        holder.finish().await;
        return Err(format!("the live subscriber got only {held} of {events} events").into());
    }

    let memory_before = relay.metric("replays_total{source=\"memory\"}").await;
    let outbox_before = relay.metric("replays_total{source=\"outbox\"}").await;
    let started = Instant::now();
    let replayer = Subscribers::open(
        vec![target(relay, "replayer", scope, Some(after))],
        Arc::clone(&log),
        1,
    )
    .await?;
    let took = started.elapsed();
    let received = replayer.received() as usize;
    replayer.finish().await;
    holder.finish().await;
    let served_from = if relay.metric("replays_total{source=\"memory\"}").await > memory_before {
        "tail"
    } else if relay.metric("replays_total{source=\"outbox\"}").await > outbox_before {
        "outbox"
    } else {
        "unknown"
    };
    Ok(ReplayFigures {
        events,
        received,
        took,
        served_from,
    })
}

/// Replay from the tail and from the outbox.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (db, schema) = (cx.db(), cx.schema.as_str());
    for (label, events, bytes) in [
        ("tail", cx.scale.replay_events * 2, 256 * 1024 * 1024),
        ("outbox", 1, 1024),
    ] {
        eprintln!("replay from the {label}");
        let mut settings = cx.settings();
        settings.tail_events = events;
        settings.tail_bytes = bytes;
        settings.replay_lookback = 0;
        settings.queue_capacity = 16_384;
        let relay = cx.start_relay(settings).await?;
        let f = run(
            &relay,
            db,
            schema,
            &format!("replay-{label}"),
            cx.scale.replay_events,
        )
        .await?;
        table.add(
            format!(
                "replay {} events, Last-Event-ID, {label} configured",
                f.events
            ),
            format!(
                "{} received in {} ({:.0} events/s), served from the {}",
                f.received,
                ms(f.took),
                f.received as f64 / f.took.as_secs_f64(),
                f.served_from
            ),
            format!("all received: {}", verdict(f.received == f.events)),
        );
    }
    Ok(())
}
