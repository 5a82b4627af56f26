//! Tail memory (`--only tail`): the heap a scope's tail holds for 128 events
//! of a size, and 10,000 active scopes' tails against `hub.tails_max_bytes`,
//! in real hubs, before any other thread exists to allocate meanwhile.

use crate::alloc_counter::live_bytes;
use crate::context::Context;
use crate::report::{Table, size, target_if, verdict};
use actix::Actor;
use eventrelay::actors::EncodedEvent;
use eventrelay::actors::hub::{Hub, PublishDurable};
use eventrelay::actors::tail::Tail;
use eventrelay::actors::tail_budget::TailBudget;
use eventrelay::metrics::Metrics;
use eventrelay_publisher::NewEvent;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A tail's default bounds, and the events one is given.
const TAIL_EVENTS: usize = 128;
const TAIL_BYTES: usize = 4 * 1024 * 1024;
/// Events per scope, and their size, across the budget's scopes.
const EVENTS_PER_SCOPE: usize = 32;
const EVENT_BYTES: usize = 4096;

fn event(scope: &str, seq: i64, padding: &str) -> Arc<EncodedEvent> {
    let mut envelope = NewEvent::durable("bench.tail", scope, json!({ "pad": padding }))
        .into_envelope(chrono::Utc::now());
    envelope.seq = Some(seq);
    Arc::new(EncodedEvent::new(envelope))
}

fn padding(scope: &str, seq: i64, bytes: usize) -> String {
    let overhead = event(scope, seq, "").encoded_len();
    "x".repeat(bytes.saturating_sub(overhead))
}

fn tail_rows(table: &mut Table) {
    for (label, bytes) in [
        ("300 B", 300),
        ("4 KiB", 4096),
        ("64 KiB", 65_536),
        ("1 MiB", 1_048_576),
    ] {
        let (padding, before) = (padding("tail-scope", 100, bytes), live_bytes());
        let mut tail = Tail::new(Arc::new(|| TAIL_EVENTS), Arc::new(|| TAIL_BYTES));
        let batch: Vec<Arc<EncodedEvent>> = (1..=TAIL_EVENTS as i64)
            .map(|seq| event("tail-scope", seq, &padding))
            .collect();
        tail.publish(0, &batch);
        drop(batch);
        let heap_bytes = live_bytes() - before;
        let met = verdict(heap_bytes <= 64 * 1024);
        let target = target_if(bytes == 300, format!("≤ 64 KiB: {met}"));
        let (held, bound) = (tail.len(), size(TAIL_BYTES as f64));
        let [counted, heap] = [tail.bytes() as f64, heap_bytes as f64].map(size);
        table.add(
            format!(
                "tail memory: {TAIL_EVENTS} events of {label} (encoded), bound {TAIL_EVENTS} events / {bound}"
            ),
            format!("{held} events held · {counted} counted against the bound · {heap} heap really held"),
            target,
        );
    }
}

fn tails_budget_row(table: &mut Table, scopes: usize) {
    let budget_bytes = 64 * 1024 * 1024;
    actix::System::new().block_on(async move {
        let (started, metrics) = (Instant::now(), Arc::new(Metrics::new()));
        let budget = TailBudget::new(budget_bytes, metrics.tails_bytes.clone());
        let (padding, before) = (padding("scope-00000", 1, EVENT_BYTES), live_bytes());
        let hubs: Vec<_> = (0..scopes)
            .map(|n| {
                Hub::new(
                    format!("scope-{n:05}"),
                    Arc::new(|| TAIL_EVENTS),
                    Arc::new(|| TAIL_BYTES),
                    Arc::clone(&budget),
                    Arc::clone(&metrics),
                )
                .start()
            })
            .collect();
        let (mut peak, mut unbounded) = (0, 0);
        for seq in 1..=EVENTS_PER_SCOPE as i64 {
            for (n, hub) in hubs.iter().enumerate() {
                let event = event(&format!("scope-{n:05}"), seq, &padding);
                unbounded += event.encoded_len();
                let publish = PublishDurable {
                    read_after: seq - 1,
                    events: vec![event],
                    heard_at: None,
                };
                // A hub only stops with the runtime: no answer to wait for then.
                hub.send(publish).await.unwrap_or_default();
            }
            // Let requested shrinks land before reading the sum.
            tokio::task::yield_now().await;
            let settle = Instant::now() + Duration::from_secs(5);
            while budget.used() > budget.max_bytes() && Instant::now() < settle {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            peak = peak.max(budget.used());
        }
        let (held, heap) = (budget.used(), live_bytes() - before);
        let seconds = started.elapsed().as_secs_f64();
        let [event, budget_size] = [EVENT_BYTES as f64, budget_bytes as f64].map(size);
        let bytes = [unbounded as f64, held as f64, peak as f64, heap as f64];
        let [unbounded, held, at_most, heap] = bytes.map(size);
        table.add(
            format!(
                "tail budget: {scopes} active scopes × {EVENTS_PER_SCOPE} events of {event} into 4 MiB tails, hub.tails_max_bytes {budget_size}"
            ),
            format!(
                "{unbounded} without a budget · {held} held at the end, {at_most} at most after any round · {heap} heap · {} tails emptied · {seconds:.1} s",
                metrics.tails_shrunk.get(),
            ),
            format!("≤ budget: {}", verdict(peak <= budget_bytes)),
        );
        drop(hubs);
    });
}

pub fn rows(cx: &Context, table: &mut Table) {
    tail_rows(table);
    tails_budget_row(table, if cx.args.quick { 1_000 } else { 10_000 });
}
