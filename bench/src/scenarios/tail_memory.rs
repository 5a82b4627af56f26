//! Tail memory: the heap bytes eventrelay's per-scope tail really holds for
//! 128 events of a given encoded size (the SSE frame a subscriber receives)
//! under the default 128-event / 4 MiB bound, measured as the allocation
//! delta of the counting global allocator.

use std::sync::Arc;

use eventrelay::actors::EncodedEvent;
use eventrelay::actors::tail::Tail;
use eventrelay_publisher::NewEvent;
use serde_json::json;

use crate::alloc_counter::live_bytes;

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

fn event(seq: i64, padding: &str) -> Arc<EncodedEvent> {
    let mut envelope = NewEvent::durable("bench.tail", "tail-scope", json!({ "pad": padding }))
        .into_envelope(chrono::Utc::now());
    envelope.seq = Some(seq);
    Arc::new(EncodedEvent::new(envelope))
}

/// Publishes 128 events of `event_bytes` encoded bytes each into a fresh
/// tail, drops every other reference, and measures what stays.
/// Must run while no other thread allocates.
pub fn measure(event_bytes: usize) -> TailFigures {
    let overhead = event(100, "").encoded_len();
    let padding = "x".repeat(event_bytes.saturating_sub(overhead));
    let before = live_bytes();
    let mut tail = Tail::new(Arc::new(|| BOUND_EVENTS), Arc::new(|| BOUND_BYTES));
    let batch: Vec<Arc<EncodedEvent>> = (1..=EVENT_COUNT as i64)
        .map(|seq| event(seq, &padding))
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
