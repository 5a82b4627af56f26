//! Tail memory (`--only tail`): the heap bytes one scope's tail really
//! holds for 128 events of a given encoded size (the SSE frame a subscriber
//! receives) under the default 128-event / 4 MiB bound, measured as the
//! allocation delta of the counting global allocator; then the budget
//! across tails: 10,000 active scopes, each publishing enough events to
//! fill its own bound many times over the shared budget, through real hubs,
//! against `hub.tails_max_bytes`. Both run before any runtime exists (on
//! an actix system on the caller's thread), so the counter sees only them.

use crate::alloc_counter::live_bytes;
use crate::context::Context;
use crate::report::{Table, size, verdict};
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

pub const EVENT_COUNT: usize = 128;
pub const BOUND_EVENTS: usize = 128;
pub const BOUND_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct TailFigures {
    /// The encoded size of each event.
    pub event_bytes: usize,
    pub events_held: usize,
    /// What the tail counts against its byte bound (encoded frames).
    pub encoded_bytes: usize,
    /// Heap bytes still allocated once only the tail refers to the events.
    pub heap_bytes: isize,
}

/// Event `seq` of `scope`, padded with `padding`.
fn event(scope: &str, seq: i64, padding: &str) -> Arc<EncodedEvent> {
    let mut envelope = NewEvent::durable("bench.tail", scope, json!({ "pad": padding }))
        .into_envelope(chrono::Utc::now());
    envelope.seq = Some(seq);
    Arc::new(EncodedEvent::new(envelope))
}

/// Publishes 128 events of `event_bytes` encoded bytes each into a fresh
/// tail, drops every other reference, and measures what stays.
/// Must run while no other thread allocates.
pub fn measure_tail(event_bytes: usize) -> TailFigures {
    let overhead = event("tail-scope", 100, "").encoded_len();
    let padding = "x".repeat(event_bytes.saturating_sub(overhead));
    let before = live_bytes();
    let mut tail = Tail::new(Arc::new(|| BOUND_EVENTS), Arc::new(|| BOUND_BYTES));
    let batch: Vec<Arc<EncodedEvent>> = (1..=EVENT_COUNT as i64)
        .map(|seq| event("tail-scope", seq, &padding))
        .collect();
    tail.publish(0, &batch);
    drop(batch);
    let heap_bytes = live_bytes() - before;
    let figures = TailFigures {
        event_bytes,
        events_held: tail.len(),
        encoded_bytes: tail.bytes(),
        heap_bytes,
    };
    drop(tail);
    figures
}

pub const EVENT_BYTES: usize = 4096;
pub const EVENTS_PER_SCOPE: usize = 32;
pub const TAIL_EVENTS: usize = 128;
pub const TAIL_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct BudgetFigures {
    pub scopes: usize,
    pub budget_bytes: usize,
    /// What the tails would hold with no budget: every event fits its own
    /// tail's bounds.
    pub unbounded_bytes: usize,
    /// Encoded bytes all tails hold at the end, as the budget counts them.
    pub held_bytes: usize,
    /// The most the budget ever counted after a publish settled.
    pub peak_bytes: usize,
    pub heap_bytes: isize,
    pub tails_shrunk: u64,
    pub seconds: f64,
}

/// Runs the scenario with `scopes` hubs and a budget of `budget_bytes`.
/// Must run while no other thread allocates.
pub fn measure_budget(scopes: usize, budget_bytes: usize) -> BudgetFigures {
    actix::System::new().block_on(async move {
        let started = Instant::now();
        let metrics = Arc::new(Metrics::new());
        let budget = TailBudget::new(budget_bytes, metrics.tails_bytes.clone());
        let overhead = event("scope-00000", 1, "").encoded_len();
        let padding = "x".repeat(EVENT_BYTES.saturating_sub(overhead));
        let before = live_bytes();
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
        let mut peak = 0;
        let mut unbounded = 0;
        for seq in 1..=EVENTS_PER_SCOPE as i64 {
            for (n, hub) in hubs.iter().enumerate() {
                let event = event(&format!("scope-{n:05}"), seq, &padding);
                unbounded += event.encoded_len();
                hub.send(PublishDurable {
                    read_after: seq - 1,
                    events: vec![event],
                    heard_at: None,
                })
                .await
                // A hub only stops with the runtime; there is no answer to wait for then.
                .unwrap_or_default();
            }
            // Let requested shrinks land before reading the sum.
            tokio::task::yield_now().await;
            let settle = Instant::now() + Duration::from_secs(5);
            while budget.used() > budget.max_bytes() && Instant::now() < settle {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            peak = peak.max(budget.used());
        }
        let figures = BudgetFigures {
            scopes,
            budget_bytes,
            unbounded_bytes: unbounded,
            held_bytes: budget.used(),
            peak_bytes: peak,
            heap_bytes: live_bytes() - before,
            tails_shrunk: metrics.tails_shrunk.get(),
            seconds: started.elapsed().as_secs_f64(),
        };
        drop(hubs);
        figures
    })
}
fn tail_rows(table: &mut Table) {
    for (label, bytes) in [
        ("300 B", 300),
        ("4 KiB", 4096),
        ("64 KiB", 65_536),
        ("1 MiB", 1_048_576),
    ] {
        let f = measure_tail(bytes);
        let target = if bytes == 300 {
            format!("≤ 64 KiB: {}", verdict(f.heap_bytes <= 64 * 1024))
        } else {
            "–".to_owned()
        };
        table.add(
            format!(
                "tail memory: {} events of {label} (encoded), bound {} events / {}",
                EVENT_COUNT,
                BOUND_EVENTS,
                size(BOUND_BYTES as f64)
            ),
            format!(
                "{} events held · {} counted against the bound · {} heap really held",
                f.events_held,
                size(f.encoded_bytes as f64),
                size(f.heap_bytes as f64)
            ),
            target,
        );
    }
}

fn tails_budget_row(table: &mut Table, scopes: usize) {
    let budget = 64 * 1024 * 1024;
    let f = measure_budget(scopes, budget);
    table.add(
        format!(
            "tail budget: {} active scopes × {} events of {} into 4 MiB tails, hub.tails_max_bytes {}",
            f.scopes,
            EVENTS_PER_SCOPE,
            size(EVENT_BYTES as f64),
            size(f.budget_bytes as f64)
        ),
        format!(
            "{} without a budget · {} held at the end, {} at most after any round · {} heap · {} tails emptied · {:.1} s",
            size(f.unbounded_bytes as f64),
            size(f.held_bytes as f64),
            size(f.peak_bytes as f64),
            size(f.heap_bytes as f64),
            f.tails_shrunk,
            f.seconds
        ),
        format!("≤ budget: {}", verdict(f.peak_bytes <= f.budget_bytes)),
    );
}

/// The tail rows, then the budget across 10,000 scopes (1,000 with --quick).
pub fn rows(cx: &Context, table: &mut Table) {
    tail_rows(table);
    tails_budget_row(table, if cx.args.quick { 1_000 } else { 10_000 });
}
