//! The memory budget across tails: 10,000 active scopes, each publishing
//! enough events to fill its own 4 MiB bound many times over the shared
//! budget, through real hubs. Reports what all tails hold together against
//! `hub.tails_max_bytes`, the heap really held, and how many tails were
//! emptied to stay under it. Runs on one thread (an actix system on the
//! caller's), so the allocation counter sees only this scenario.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use eventrelay::actors::EncodedEvent;
use eventrelay::actors::hub::{Hub, PublishDurable};
use eventrelay::actors::tail_budget::TailBudget;
use eventrelay::metrics::Metrics;
use eventrelay_publisher::NewEvent;
use serde_json::json;

use crate::alloc_counter::live_bytes;

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

fn event(scope: &str, seq: i64, padding: &str) -> Arc<EncodedEvent> {
    let mut envelope = NewEvent::durable("bench.budget", scope, json!({ "pad": padding }))
        .into_envelope(chrono::Utc::now());
    envelope.seq = Some(seq);
    Arc::new(EncodedEvent::new(envelope))
}

/// Runs the scenario with `scopes` hubs and a budget of `budget_bytes`.
/// Must run while no other thread allocates.
pub fn measure(scopes: usize, budget_bytes: usize) -> BudgetFigures {
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
