//! An event as hubs, tails and sessions hold it: its SSE frame, encoded
//! once when it enters a hub and shared (by `Arc`) with every subscriber and
//! the tail, beside only the fields routing reads.
//!
//! The frame is the only copy of the event's payload. Keeping the routing
//! fields apart from the full envelope (no id, data, resources or lane) keeps
//! what a tail holds per event close to the size of its frame.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use eventrelay_wire::{
    Audience, EventEnvelope, ResumeCursor, Subscriber, TraceParent, is_permitted, sse,
};

use crate::latency::Stamp;
use crate::telemetry::EventTrace;

#[derive(Debug)]
pub struct EncodedEvent {
    seq: Option<i64>,
    /// The transaction that wrote a durable event, to hide it from
    /// subscribers that joined after it committed; `None` for ephemeral
    /// events.
    txid: Option<u64>,
    occurred_at: DateTime<Utc>,
    event_type: Box<str>,
    scope_key: Box<str>,
    audience: Option<Box<Audience>>,
    pub frame: Bytes,
    /// When its hub began fanning it out, for sessions' latency stage.
    pub fan_out_started: Stamp,
    /// The trace the event continues (from its `traceparent`), which the
    /// frame does not carry.
    trace_parent: Option<Box<TraceParent>>,
    /// Its delivery's trace, when traced: set by the hub that fans it out,
    /// stamped by each stream that writes it.
    trace: OnceLock<Arc<EventTrace>>,
}

impl EncodedEvent {
    /// An ephemeral event, or a durable one whose `id:` is its plain seq.
    pub fn new(envelope: EventEnvelope) -> Self {
        let cursor = envelope.seq.map(ResumeCursor::plain);
        Self::encode(envelope, None, cursor)
    }

    /// A durable event with the transaction that wrote it, its `id:` the
    /// cursor it goes out under.
    pub fn written_by(envelope: EventEnvelope, txid: u64, cursor: ResumeCursor) -> Self {
        Self::encode(envelope, Some(txid), Some(cursor))
    }

    /// A durable event read back for a replay, its `id:` the cursor a
    /// client that stops after it resumes from.
    pub fn replayed(envelope: EventEnvelope, cursor: ResumeCursor) -> Self {
        Self::encode(envelope, None, Some(cursor))
    }

    fn encode(
        mut envelope: EventEnvelope,
        txid: Option<u64>,
        cursor: Option<ResumeCursor>,
    ) -> Self {
        // Taken out before the frame is made: browsers never see it.
        let trace_parent = envelope
            .traceparent
            .take()
            .and_then(|text| TraceParent::parse(&text))
            .map(Box::new);
        let frame = Bytes::from(sse::event_frame_at(&envelope, cursor));
        EncodedEvent {
            seq: envelope.seq,
            txid,
            occurred_at: envelope.occurred_at,
            event_type: envelope.event_type.into_boxed_str(),
            scope_key: envelope.scope_key.into_boxed_str(),
            audience: envelope.audience.map(Box::new),
            frame,
            fan_out_started: Stamp::default(),
            trace_parent,
            trace: OnceLock::new(),
        }
    }

    /// A scope's `event: presence` frame: fanned out like an ephemeral
    /// event, to every stream of the scope.
    pub fn presence(scope_key: &str, data: &str) -> Self {
        EncodedEvent {
            seq: None,
            txid: None,
            occurred_at: Utc::now(),
            event_type: sse::PRESENCE_EVENT.into(),
            scope_key: scope_key.into(),
            audience: None,
            frame: Bytes::from(sse::frame(None, Some(sse::PRESENCE_EVENT), data)),
            fan_out_started: Stamp::default(),
            trace_parent: None,
            trace: OnceLock::new(),
        }
    }

    /// The outbox seq; `None` for ephemeral events.
    pub fn seq(&self) -> Option<i64> {
        self.seq
    }

    /// The writing transaction; `None` for ephemeral events.
    pub fn txid(&self) -> Option<u64> {
        self.txid
    }

    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    pub fn scope_key(&self) -> &str {
        &self.scope_key
    }

    /// The frame's `id:` cursor and everything after its line, for a
    /// stream that writes its own `id:` in its place; `None` for a frame
    /// without one.
    pub fn frame_cursor(&self) -> Option<(ResumeCursor, &[u8])> {
        let rest = self.frame.strip_prefix(b"id: ")?;
        let end = rest.iter().position(|&b| b == b'\n')?;
        let cursor = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
        Some((cursor, &rest[end + 1..]))
    }

    pub fn occurred_at(&self) -> DateTime<Utc> {
        self.occurred_at
    }

    /// The audience predicate, applied to this event.
    pub fn is_permitted_for(&self, subscriber: &Subscriber) -> bool {
        is_permitted(&self.scope_key, self.audience.as_deref(), subscriber)
    }

    /// The trace the event continues, if it named a valid one.
    pub fn trace_parent(&self) -> Option<TraceParent> {
        self.trace_parent.as_deref().copied()
    }

    /// Its delivery's trace, once its hub has started one.
    pub fn trace(&self) -> Option<&Arc<EventTrace>> {
        self.trace.get()
    }

    /// Starts its delivery's trace (the first one set wins).
    pub fn traced_by(&self, trace: Arc<EventTrace>) -> &Arc<EventTrace> {
        self.trace.get_or_init(|| trace)
    }

    /// Encoded size, which the tail's byte bound counts.
    pub fn encoded_len(&self) -> usize {
        self.frame.len()
    }
}
