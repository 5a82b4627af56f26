//! An event together with its SSE frame, encoded once when it enters a hub
//! and shared (by `Arc`) with every subscriber and the tail.

use bytes::Bytes;
use eventrelay_wire::{EventEnvelope, sse};

#[derive(Debug)]
pub struct EncodedEvent {
    pub envelope: EventEnvelope,
    pub frame: Bytes,
}

impl EncodedEvent {
    pub fn new(envelope: EventEnvelope) -> Self {
        let frame = Bytes::from(sse::event_frame(&envelope));
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
