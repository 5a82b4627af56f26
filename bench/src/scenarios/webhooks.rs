//! Webhooks: a backlog of events is committed at once and the time until a
//! local receiver (answering 200 at once) has every signed delivery is
//! measured, with one or more relay processes dispatching from the same
//! database.

use crate::context::Context;
use crate::report::{Table, verdict};
use std::time::{Duration, Instant};

use crate::BenchResult;
use crate::webhook_receiver::WebhookReceiver;

/// Longest the backlog may take.
const PATIENCE: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct WebhookFigures {
    pub dispatchers: usize,
    pub events: usize,
    pub delivered: u64,
    pub deliveries_per_second: f64,
}

/// Commits `events` webhook events in one transaction and waits until
/// `receiver` has them all.
pub async fn run(
    receiver: &WebhookReceiver,
    dispatchers: usize,
    database_url: &str,
    schema: &str,
    events: usize,
) -> BenchResult<WebhookFigures> {
    let client = eventrelay::connect(database_url).await?;
    let already = receiver.received();
    client
        .execute(
            &format!(
                "SELECT {schema}.emit('bench.hook'::text, 'hooks'::text, jsonb_build_object('bn', g))
                 FROM generate_series(1, $1::int) AS g"
            ),
            &[&(events as i32)],
        )
        .await?;
    let committed = Instant::now();
    let target = already + events as u64;
    while receiver.received() < target && committed.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = committed.elapsed();
    let delivered = receiver.received() - already;
    Ok(WebhookFigures {
        dispatchers,
        events,
        delivered,
        deliveries_per_second: delivered as f64 / took.as_secs_f64(),
    })
}

/// Webhook deliveries from one and from two relay processes.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (db, schema) = (cx.db(), cx.schema.as_str());
    for dispatchers in [1, 2] {
        eprintln!("webhooks, {dispatchers} dispatcher process(es)");
        let receiver = WebhookReceiver::start().await?;
        let mut relays = Vec::new();
        for _ in 0..dispatchers {
            let mut settings = cx.settings();
            settings.webhook_url = Some(receiver.url.clone());
            relays.push(cx.start_relay(settings).await?);
        }
        let f = run(&receiver, dispatchers, db, schema, cx.scale.webhook_events).await?;
        table.add(
            format!(
                "webhooks, {} relay process(es) × 4 workers, signed, receiver answers 200",
                f.dispatchers
            ),
            format!(
                "{:.0} deliveries/s ({} of {} delivered)",
                f.deliveries_per_second, f.delivered, f.events
            ),
            format!("all delivered: {}", verdict(f.delivered == f.events as u64)),
        );
    }
    Ok(())
}
