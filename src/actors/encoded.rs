//! An event together with its SSE frame, encoded once when it enters a hub
//! and shared (by `Arc`) with every subscriber and the tail.
//!
//! Once encoded, the frame is the only copy of the event's data and
//! resources: the envelope kept beside it holds just what routing needs
//! (seq, type, scope, audience, times), so the tail and every queue hold an
//! event's payload once.

use bytes::Bytes;
use eventrelay_wire::{EventEnvelope, sse};

#[derive(Debug)]
pub struct EncodedEvent {
    /// The envelope without `data` and `resources` (they live in `frame`).
    pub envelope: EventEnvelope,
    pub frame: Bytes,
}

impl EncodedEvent {
    pub fn new(mut envelope: EventEnvelope) -> Self {
        let frame = Bytes::from(sse::event_frame(&envelope));
        envelope.data = serde_json::Value::Null;
        envelope.resources = Vec::new();
        EncodedEvent { envelope, frame }
    }

    /// The outbox seq; `None` for ephemeral events.
    pub fn seq(&self) -> Option<i64> {
        self.envelope.seq
    }

    /// Encoded size, which the tail's byte bound counts.
    pub fn encoded_len(&self) -> usize {
        self.frame.len()
    }
}
