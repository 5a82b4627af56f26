//! What the campaign's parts write down, and all the checker reads besides
//! the outbox: each writer's record of what it emitted and how its
//! transaction ended, and each subscriber's record of every connection and
//! every frame. Times are seconds since the campaign began.

use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

/// How a writer's transaction ended, as the writer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Outcome {
    Committed,
    RolledBack,
    /// The COMMIT was sent but no answer came (the server went away): it
    /// may or may not have committed.
    Unknown,
}

/// One event a writer emitted.
#[derive(Debug, Clone, Serialize)]
pub struct Written {
    pub id: Uuid,
    pub scope: String,
    pub event_type: String,
    pub durable: bool,
    pub data: Value,
    /// `audience.users`, when set.
    pub users: Option<Vec<String>>,
    /// Whether the event carries the campaign's permission.
    pub permission: bool,
    pub outcome: Outcome,
    /// When the writer sent its COMMIT (or ROLLBACK): anything a stream's
    /// `ready` said before this cannot have covered the event.
    pub ended_at: f64,
}

/// One frame of an event a subscriber received.
#[derive(Debug, Clone, Serialize)]
pub struct Received {
    pub id: Uuid,
    pub seq: Option<i64>,
    pub scope: String,
    pub event_type: String,
    pub data: Value,
    /// The frame's `id:`, empty for ephemeral events.
    pub frame_id: String,
    /// When it arrived.
    pub at: f64,
}

/// One connection of a subscriber.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Connection {
    /// The relay it went to.
    pub relay: usize,
    /// The `Last-Event-ID` it sent.
    pub resumed_from: Option<String>,
    /// When `ready` came, and whether it said resync.
    pub ready: Option<(f64, bool)>,
    /// When a later `ready` said resync, on a connection that spans
    /// several streams (the Rust client's).
    pub resyncs: Vec<f64>,
    pub received: Vec<Received>,
}

/// Everything one subscriber saw.
#[derive(Debug, Clone, Serialize)]
pub struct SubscriberLog {
    pub id: String,
    pub scope: String,
    /// Whether its token grants the campaign's permission.
    pub granted: bool,
    pub connections: Vec<Connection>,
}

/// An outbox row as it stands when the campaign ends.
#[derive(Debug, Clone, Serialize)]
pub struct StoredRow {
    pub id: Uuid,
    pub seq: i64,
    pub scope: String,
    pub event_type: String,
    pub data: Value,
}
