//! The eventrelay wire format, shared by import between the service, the
//! publisher and the Rust client: the event envelope, the notification codec,
//! SSE framing, the audience predicate and Standard Webhooks signing.
//!
//! This crate does no I/O; it depends on serde and small pure crates only.
//!
//! # Layout
//!
//! [`envelope`] (the event and its rules), [`notification`] (the `NOTIFY`
//! payloads: pointers, inline events and batches), [`seal`] (how those
//! payloads are sealed on the channel), [`cursor`] (a frame's `id:`, the
//! `Last-Event-ID` a stream resumes from), [`compound`] (the `id:` of a
//! stream carrying several scopes), [`carrying`] (pointers a writer
//! builds itself before the seqs exist), [`sse`] (frames), [`trace`] (the
//! W3C `traceparent` an event carries), [`audience`] (the one predicate
//! every delivery path applies), [`webhook`] (Standard Webhooks signing and
//! verifying), and `schema` (the JSON
//! Schemas, behind the `json-schema` feature).

pub mod audience;
pub mod carrying;
pub mod compound;
pub mod cursor;
pub mod envelope;
pub mod notification;
#[cfg(feature = "json-schema")]
pub mod schema;
pub mod seal;
pub mod sse;
pub mod trace;
pub mod webhook;

pub use audience::{PermissionEvaluator, Subscriber, is_envelope_permitted, is_permitted};
pub use carrying::{EnvelopeAroundSeq, assign_to_pointers};
pub use compound::{CompoundCursor, LastEventId, MAX_COMPOUND_SCOPES, ScopeTag};
pub use cursor::{CursorParseError, ResumeCursor};
pub use envelope::{
    Audience, EnvelopeError, EventEnvelope, Lane, MAX_EVENT_TYPE_BYTES, MAX_SCOPE_KEY_BYTES,
    NewEvent, RESERVED_EVENT_TYPE_PREFIX, RESERVED_EVENT_TYPES, SYSTEM_EVENT_TYPES,
    is_control_event_type, is_reserved_event_type, validate_event_type, validate_scope_key,
};
pub use notification::{
    CarriedRows, DELIVERIES_QUEUED, DecodeError, DeferredPointer, EncodeError, EventNotification,
    INLINE_BATCH_VERSION, MAX_NOTIFY_PAYLOAD_BYTES, POSTGRES_NOTIFY_LIMIT_BYTES,
    decode_notification, decode_notification_within, defer_carried_rows, encode_horizon,
    encode_inline, encode_inline_batch, encode_inline_batch_within, encode_inline_within,
    encode_pointer, encode_pointer_carrying,
};
pub use seal::{MAX_SEALED_PLAINTEXT_BYTES, Origin, SealError, SealKey, sealed_len};
pub use trace::{TRACEPARENT_LEN, TraceParent};
