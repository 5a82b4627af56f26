//! The event envelope: the one shape an event has in the outbox, inline on the
//! notification channel, in an SSE `data:` line and in a webhook body.

use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::trace::TraceParent;

/// Longest accepted event type, in bytes.
pub const MAX_EVENT_TYPE_BYTES: usize = 200;
/// Longest accepted scope key, in bytes.
pub const MAX_SCOPE_KEY_BYTES: usize = 200;

/// Event types an application may not use, because a stream gives them a
/// meaning of its own: `ready` is the relay's control frame, and `open` and
/// `error` are the events a browser's `EventSource` raises for the connection
/// itself. An application event under one of these names would be mistaken
/// for the control signal by every client.
pub const RESERVED_EVENT_TYPES: [&str; 6] =
    ["ready", "open", "error", "reauth", "revoked", "presence"];

/// Every event type with this prefix is reserved for the relay: its
/// future control frames, and the events it writes itself.
pub const RESERVED_EVENT_TYPE_PREFIX: &str = "eventrelay.";

/// The events the relay writes to the outbox itself, about itself, such as
/// a webhook subscription that paused because its receiver stayed down.
/// Their names carry the reserved prefix, so no application can forge one:
/// the schema refuses the prefix to every writer but the relay's own rows.
/// Streams and webhooks carry them like any event.
pub const SYSTEM_EVENT_TYPES: [&str; 1] = ["eventrelay.subscription.paused"];

/// True for the names [`RESERVED_EVENT_TYPES`] and
/// [`RESERVED_EVENT_TYPE_PREFIX`] set aside for the relay and the browser:
/// no application may emit or publish one.
pub fn is_reserved_event_type(event_type: &str) -> bool {
    RESERVED_EVENT_TYPES.contains(&event_type) || event_type.starts_with(RESERVED_EVENT_TYPE_PREFIX)
}

/// True for the reserved names a stream never carries as an event: all of
/// them but [`SYSTEM_EVENT_TYPES`]. A reader withholds an event under such
/// a name, which could pass for a control frame.
pub fn is_control_event_type(event_type: &str) -> bool {
    is_reserved_event_type(event_type) && !SYSTEM_EVENT_TYPES.contains(&event_type)
}

/// How an event travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    /// A row in the outbox: delivered at least once and replayable by `seq`.
    Durable,
    /// Inline on the notification channel: never stored, never replayed.
    Ephemeral,
}

impl Lane {
    /// The lane's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Durable => "durable",
            Lane::Ephemeral => "ephemeral",
        }
    }
}

/// Who may see an event, beyond being in its scope.
///
/// Unknown keys are rejected when decoding: an audience rule this version does
/// not understand must never be read as "no rule" (fail closed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Audience {
    /// Only these subscriber ids may see the event. An empty list admits nobody.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<Vec<String>>,
    /// An opaque permission, handed as-is to the subscriber's evaluator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<Value>,
}

impl Audience {
    /// An audience of exactly these subscriber ids.
    pub fn users<I, S>(users: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Audience {
            users: Some(users.into_iter().map(Into::into).collect()),
            permission: None,
        }
    }

    /// An audience of whoever the subscriber's evaluator admits for `permission`.
    pub fn permission(permission: Value) -> Self {
        Audience {
            users: None,
            permission: Some(permission),
        }
    }

    /// True when neither rule is present, so scope alone decides.
    pub fn is_empty(&self) -> bool {
        self.users.is_none() && self.permission.is_none()
    }
}

/// One event, as every part of eventrelay sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "json-schema",
    schemars(
        title = "EventEnvelope",
        description = "An eventrelay event. Durable events carry the `seq` of their outbox row; ephemeral events carry none."
    )
)]
#[serde(rename_all = "camelCase")]
pub struct EventEnvelope {
    /// Unique id of the event; consumers de-duplicate on it.
    pub id: Uuid,
    /// The application's event type, such as `order.created`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The partition subscribers belong to: a tenant, a workspace.
    pub scope_key: String,
    /// Durable (stored, replayable) or ephemeral (inline, never stored).
    pub lane: Lane,
    /// The outbox row's sequence number; present exactly on durable events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "json-schema", schemars(range(min = 1)))]
    pub seq: Option<i64>,
    /// Identifiers and hints, never whole entities.
    pub data: Value,
    /// Optional narrowing of who may see the event within its scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<Audience>,
    /// Resource names the event concerns, such as `order:42`.
    #[serde(default)]
    pub resources: Vec<String>,
    /// When the event was emitted (RFC 3339, UTC).
    pub occurred_at: DateTime<Utc>,
    /// The W3C trace context given at publish, as the notification channel
    /// carries it to relays. A relay takes it out before it frames the
    /// event, and webhook bodies leave it out: it travels as the webhook
    /// request's `traceparent` header instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// Why an envelope or a new event is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("event type must not be empty")]
    EmptyType,
    #[error("event type is {len} bytes; the limit is {MAX_EVENT_TYPE_BYTES}")]
    TypeTooLong { len: usize },
    #[error(
        "event type must not contain control characters (such as a newline) or U+2028 / U+2029"
    )]
    TypeHasControlCharacter,
    #[error(
        "event type {0:?} is reserved: `ready`, `open`, `error` and every type starting with `eventrelay.` name a stream's own control frames"
    )]
    ReservedType(String),
    #[error("scope key must not be empty")]
    EmptyScopeKey,
    #[error("scope key is {len} bytes; the limit is {MAX_SCOPE_KEY_BYTES}")]
    ScopeKeyTooLong { len: usize },
    #[error("scope key must not contain control characters")]
    ScopeKeyHasControlCharacter,
    #[error("a durable event needs a positive seq")]
    DurableWithoutSeq,
    #[error("an ephemeral event must not carry a seq")]
    EphemeralWithSeq,
}

/// Control characters, and the line and paragraph separators (U+2028,
/// U+2029), which JavaScript and some log viewers take for line ends.
fn breaks_a_line(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

/// Checks an event type: non-empty, bounded, free of control characters (a
/// newline in a type could otherwise split an SSE frame) and not reserved.
pub fn validate_event_type(event_type: &str) -> Result<(), EnvelopeError> {
    if event_type.is_empty() {
        return Err(EnvelopeError::EmptyType);
    }
    if event_type.len() > MAX_EVENT_TYPE_BYTES {
        return Err(EnvelopeError::TypeTooLong {
            len: event_type.len(),
        });
    }
    if event_type.chars().any(breaks_a_line) {
        return Err(EnvelopeError::TypeHasControlCharacter);
    }
    if is_reserved_event_type(event_type) {
        return Err(EnvelopeError::ReservedType(event_type.to_owned()));
    }
    Ok(())
}

/// Checks a scope key: non-empty, bounded, and free of control characters.
pub fn validate_scope_key(scope_key: &str) -> Result<(), EnvelopeError> {
    if scope_key.is_empty() {
        return Err(EnvelopeError::EmptyScopeKey);
    }
    if scope_key.len() > MAX_SCOPE_KEY_BYTES {
        return Err(EnvelopeError::ScopeKeyTooLong {
            len: scope_key.len(),
        });
    }
    if scope_key.chars().any(char::is_control) {
        return Err(EnvelopeError::ScopeKeyHasControlCharacter);
    }
    Ok(())
}

impl EventEnvelope {
    /// Checks the rules serde cannot express: field limits and the lane/seq pairing.
    pub fn validate(&self) -> Result<(), EnvelopeError> {
        validate_event_type(&self.event_type)?;
        validate_scope_key(&self.scope_key)?;
        match (self.lane, self.seq) {
            (Lane::Durable, Some(seq)) if seq > 0 => Ok(()),
            (Lane::Durable, _) => Err(EnvelopeError::DurableWithoutSeq),
            (Lane::Ephemeral, None) => Ok(()),
            (Lane::Ephemeral, Some(_)) => Err(EnvelopeError::EphemeralWithSeq),
        }
    }

    /// True for events stored in the outbox.
    pub fn is_durable(&self) -> bool {
        self.lane == Lane::Durable
    }
}

/// An event an application wants to emit: the envelope before the id, the
/// time and (for durable events) the outbox `seq` are assigned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NewEvent {
    /// Optional caller-chosen id (an idempotency key); otherwise a UUIDv7,
    /// random but ordered by time, so consecutive events land side by side
    /// in the outbox's id index instead of on random pages of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
    #[serde(rename = "type")]
    pub event_type: String,
    pub scope_key: String,
    pub lane: Lane,
    #[serde(default)]
    pub data: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<Audience>,
    #[serde(default)]
    pub resources: Vec<String>,
    /// The W3C `traceparent` of the trace the event continues. A malformed
    /// value is dropped when the event is built, never an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl NewEvent {
    /// A durable event: stored in the outbox, replayable.
    pub fn durable(
        event_type: impl Into<String>,
        scope_key: impl Into<String>,
        data: Value,
    ) -> Self {
        Self::new(Lane::Durable, event_type, scope_key, data)
    }

    /// An ephemeral event: inline on the channel, never stored.
    pub fn ephemeral(
        event_type: impl Into<String>,
        scope_key: impl Into<String>,
        data: Value,
    ) -> Self {
        Self::new(Lane::Ephemeral, event_type, scope_key, data)
    }

    fn new(
        lane: Lane,
        event_type: impl Into<String>,
        scope_key: impl Into<String>,
        data: Value,
    ) -> Self {
        NewEvent {
            id: None,
            event_type: event_type.into(),
            scope_key: scope_key.into(),
            lane,
            data,
            audience: None,
            resources: Vec::new(),
            traceparent: None,
        }
    }

    /// Restricts who may see the event.
    pub fn with_audience(mut self, audience: Audience) -> Self {
        self.audience = Some(audience);
        self
    }

    /// Names the resources the event concerns.
    pub fn with_resources<I, S>(mut self, resources: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.resources = resources.into_iter().map(Into::into).collect();
        self
    }

    /// Continues the trace of a W3C `traceparent`; a malformed value is
    /// ignored.
    pub fn with_traceparent(mut self, traceparent: &str) -> Self {
        self.traceparent = TraceParent::parse(traceparent).map(|parent| parent.to_string());
        self
    }

    /// Uses a caller-chosen id instead of a random one.
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.id = Some(id);
        self
    }

    /// Checks the type and scope key before anything is written.
    pub fn validate(&self) -> Result<(), EnvelopeError> {
        validate_event_type(&self.event_type)?;
        validate_scope_key(&self.scope_key)
    }

    /// Builds the envelope with its id and time assigned and no `seq` yet.
    ///
    /// The time is truncated to microseconds, the precision Postgres keeps, so
    /// an envelope read back from the outbox equals the one emitted.
    pub fn into_envelope(self, now: DateTime<Utc>) -> EventEnvelope {
        EventEnvelope {
            id: self.id.unwrap_or_else(Uuid::now_v7),
            event_type: self.event_type,
            scope_key: self.scope_key,
            lane: self.lane,
            seq: None,
            data: self.data,
            audience: self.audience.filter(|a| !a.is_empty()),
            resources: self.resources,
            occurred_at: now.trunc_subsecs(6),
            traceparent: TraceParent::parse_optional(self.traceparent.as_deref())
                .map(|parent| parent.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn durable(seq: Option<i64>) -> EventEnvelope {
        let mut envelope = NewEvent::durable("order.created", "org-1", json!({"orderId": 7}))
            .into_envelope(Utc::now());
        envelope.seq = seq;
        envelope
    }

    #[test]
    fn json_uses_camel_case_and_omits_empty_optionals() {
        let envelope = durable(Some(3));
        let value = serde_json::to_value(&envelope).unwrap();
        assert_eq!(value["type"], "order.created");
        assert_eq!(value["scopeKey"], "org-1");
        assert_eq!(value["lane"], "durable");
        assert_eq!(value["seq"], 3);
        assert!(value.get("audience").is_none());
        assert!(value["occurredAt"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn generated_ids_are_version_7_and_ordered_by_time() {
        let ids: Vec<Uuid> = (0..64).map(|_| durable(None).id).collect();
        assert!(ids.iter().all(|id| id.get_version_num() == 7));
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, ids, "unique, and each after the one before");
        let chosen = Uuid::from_u128(42);
        let mut event = NewEvent::durable("t", "s", json!({}));
        event.id = Some(chosen);
        assert_eq!(event.into_envelope(Utc::now()).id, chosen);
    }

    #[test]
    fn lane_and_seq_must_agree() {
        assert_eq!(
            durable(None).validate(),
            Err(EnvelopeError::DurableWithoutSeq)
        );
        assert_eq!(
            durable(Some(0)).validate(),
            Err(EnvelopeError::DurableWithoutSeq)
        );
        assert_eq!(durable(Some(1)).validate(), Ok(()));
        let mut ephemeral =
            NewEvent::ephemeral("tick", "org-1", json!(1)).into_envelope(Utc::now());
        assert_eq!(ephemeral.validate(), Ok(()));
        ephemeral.seq = Some(4);
        assert_eq!(ephemeral.validate(), Err(EnvelopeError::EphemeralWithSeq));
    }

    #[test]
    fn types_and_scopes_are_checked() {
        assert_eq!(validate_event_type(""), Err(EnvelopeError::EmptyType));
        for broken in ["a\nb", "a\u{2028}b", "a\u{2029}b", "a\u{85}b"] {
            assert_eq!(
                validate_event_type(broken),
                Err(EnvelopeError::TypeHasControlCharacter),
                "{broken:?}"
            );
        }
        assert_eq!(
            validate_event_type(&"x".repeat(MAX_EVENT_TYPE_BYTES + 1)),
            Err(EnvelopeError::TypeTooLong {
                len: MAX_EVENT_TYPE_BYTES + 1
            })
        );
        assert_eq!(validate_scope_key(""), Err(EnvelopeError::EmptyScopeKey));
        assert_eq!(
            validate_scope_key("a\u{7}"),
            Err(EnvelopeError::ScopeKeyHasControlCharacter)
        );
        assert_eq!(validate_event_type("order.created"), Ok(()));
        for reserved in ["ready", "open", "error", "eventrelay.resync"] {
            assert_eq!(
                validate_event_type(reserved),
                Err(EnvelopeError::ReservedType(reserved.to_owned())),
                "{reserved}"
            );
        }
        for allowed in ["Ready", "ready.changed", "order.error", "message"] {
            assert_eq!(validate_event_type(allowed), Ok(()), "{allowed}");
        }
    }

    #[test]
    fn unknown_audience_keys_are_rejected() {
        let err = serde_json::from_value::<Audience>(json!({"roles": ["admin"]}));
        assert!(err.is_err());
    }

    #[test]
    fn empty_audience_is_dropped_when_building() {
        let envelope = NewEvent::durable("a", "s", json!({}))
            .with_audience(Audience::default())
            .into_envelope(Utc::now());
        assert_eq!(envelope.audience, None);
    }
}
