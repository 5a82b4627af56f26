//! The notification codec: what travels on the Postgres `NOTIFY` channel.
//!
//! A durable event travels as a pointer `{"k":"ptr","s":scopeKey,"q":seq}`
//! (the row itself stays in the outbox). Where the rows a statement wrote in
//! a scope fit, the pointer carries them too,
//! `{"k":"ptr","s":scopeKey,"q":seq,"x":txid,"r":[envelope, ...]}`, so a
//! relay hands them on without reading them back; a relay that predates
//! `x` and `r` ignores them and reads the outbox, as it always did. An
//! ephemeral event travels whole,
//! `{"k":"evt","e":envelope}`. Several ephemeral events sent at one commit
//! may share a payload, `{"k":"evts","v":1,"e":[envelope, ...]}`, as long as
//! it stays under the size limit; `v` is that form's version, and a relay
//! that predates the form refuses it as an unknown kind (logged and
//! counted), never misreading it. `{"k":"due"}` says a transaction queued
//! webhook deliveries. `{"k":"hz","x":txid}` is a relay's horizon mark:
//! every transaction below `x` had finished before it was sent, so a relay
//! that hears it has heard everything those transactions announced (see
//! [`crate::cursor`]). Decoding never panics: every malformed
//! payload maps to a [`DecodeError`] the listener can log, count and drop.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::envelope::{EnvelopeError, EventEnvelope, Lane, validate_scope_key};

/// Postgres refuses a `NOTIFY` payload of 8000 bytes or more (with the
/// default build).
pub const POSTGRES_NOTIFY_LIMIT_BYTES: usize = 7999;

/// The longest encoded notification: what still fits in Postgres's
/// `NOTIFY` limit (under 8000 bytes) once sealed (see [`crate::seal`]).
pub const MAX_NOTIFY_PAYLOAD_BYTES: usize = crate::seal::MAX_SEALED_PLAINTEXT_BYTES;

/// One message on the notification channel.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "json-schema",
    schemars(
        title = "EventNotification",
        description = "A message on the eventrelay notification channel, discriminated on `k`."
    )
)]
#[serde(tag = "k")]
pub enum EventNotification {
    /// A durable event was committed to the outbox at `seq` in `scopeKey`.
    #[serde(rename = "ptr")]
    #[cfg_attr(
        feature = "json-schema",
        schemars(extend("dependentRequired" = {"x": ["r"], "r": ["x"]}))
    )]
    Pointer {
        /// The event's scope key.
        #[serde(rename = "s")]
        scope_key: String,
        /// The outbox row's sequence number.
        #[serde(rename = "q")]
        #[cfg_attr(feature = "json-schema", schemars(range(min = 1)))]
        seq: i64,
        /// The rows themselves, when they fit in the payload.
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        carried: Option<CarriedRows>,
    },
    /// An ephemeral event, carried whole.
    #[serde(rename = "evt")]
    Inline {
        /// The ephemeral envelope (never has a `seq`).
        #[serde(rename = "e")]
        envelope: EventEnvelope,
    },
    /// Several ephemeral events sent at the same commit, carried whole, in
    /// the order they were emitted.
    #[serde(rename = "evts")]
    InlineBatch {
        /// The version of this form; [`INLINE_BATCH_VERSION`].
        #[serde(rename = "v")]
        version: u8,
        /// The ephemeral envelopes, at least one.
        #[serde(rename = "e")]
        #[cfg_attr(feature = "json-schema", schemars(length(min = 1)))]
        envelopes: Vec<EventEnvelope>,
    },
    /// A transaction queued webhook deliveries: relays wake their webhook
    /// workers for it, and only for it.
    #[serde(rename = "due")]
    DeliveriesQueued,
    /// A horizon mark: every transaction with an id below `x` had finished
    /// when it was sent. Notifications are heard in commit order, so
    /// everything those transactions announced was heard before it.
    #[serde(rename = "hz")]
    Horizon {
        /// The oldest transaction still running then
        /// (`pg_snapshot_xmin(pg_current_snapshot())`).
        #[serde(rename = "x")]
        xmin: u64,
    },
}

/// Durable rows that travel with their pointer: every row one statement
/// wrote in the pointer's scope, in seq order, or the share of them that
/// fitted in one payload (the rest travel in further pointers). A relay
/// treats them as a read of the outbox that found exactly these rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct CarriedRows {
    /// The writing transaction (`pg_current_xact_id()`), which decides
    /// whether a row is history to a subscriber that joined meanwhile.
    #[serde(rename = "x")]
    pub txid: u64,
    /// Durable envelopes, each with its `seq`, all in the pointer's scope.
    #[serde(rename = "r")]
    #[cfg_attr(feature = "json-schema", schemars(length(min = 1)))]
    pub events: Vec<EventEnvelope>,
}

/// The payload the outbox's webhook trigger sends when a statement queued
/// deliveries (written by the SQL side; here for tests and other writers).
pub const DELIVERIES_QUEUED: &str = r#"{"k":"due"}"#;

/// The version of the `evts` form this build writes and reads.
pub const INLINE_BATCH_VERSION: u8 = 1;

/// Why a notification could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error(
        "notification is {len} bytes; at most {max} fit in a sealed Postgres NOTIFY. Keep ephemeral data to identifiers, or emit a durable event"
    )]
    TooLarge { len: usize, max: usize },
    #[error("only ephemeral events travel inline; durable events travel as pointers")]
    NotEphemeral,
    #[error("seq must be positive, got {0}")]
    InvalidSeq(i64),
    #[error("a pointer carrying rows needs at least one")]
    NothingCarried,
    #[error("rows cannot travel with a pointer: {0}")]
    NotCarriable(String),
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    #[error("envelope could not be serialised: {0}")]
    Json(String),
}

/// Why a payload on the channel is not a valid notification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("payload is {len} bytes, above the {max}-byte NOTIFY limit")]
    TooLarge { len: usize, max: usize },
    #[error("payload is not valid UTF-8")]
    NotUtf8,
    #[error("payload is not JSON: {0}")]
    NotJson(String),
    #[error("payload is not a JSON object")]
    NotAnObject,
    #[error("payload has no string field `k`")]
    MissingKind,
    #[error("payload has unknown kind {0:?}")]
    UnknownKind(String),
    #[error("pointer is malformed: {0}")]
    InvalidPointer(String),
    #[error("inline event is malformed: {0}")]
    InvalidEnvelope(String),
    #[error("inline event must be ephemeral")]
    InlineNotEphemeral,
    #[error("horizon mark is malformed: `x` must be a transaction id")]
    InvalidHorizon,
    #[error("batch of inline events has version {0}; this relay reads version 1")]
    UnsupportedBatchVersion(u64),
    /// The pointer itself is sound, so the relay reads its rows back from
    /// the outbox instead: nothing is lost.
    #[error("rows carried by the pointer to seq {seq} in {scope_key:?} are unreadable: {reason}")]
    UnreadableCarriedRows {
        scope_key: String,
        seq: i64,
        reason: String,
    },
}

/// Encodes a horizon mark: every transaction below `xmin` had finished.
pub fn encode_horizon(xmin: u64) -> String {
    format!(r#"{{"k":"hz","x":{xmin}}}"#)
}

/// Encodes the pointer for a committed durable row.
pub fn encode_pointer(scope_key: &str, seq: i64) -> Result<String, EncodeError> {
    validate_scope_key(scope_key)?;
    if seq < 1 {
        return Err(EncodeError::InvalidSeq(seq));
    }
    let pointer = EventNotification::Pointer {
        scope_key: scope_key.to_owned(),
        seq,
        carried: None,
    };
    finish(&pointer)
}

/// Encodes a pointer carrying `events`, durable rows of one scope written
/// by transaction `txid` (what the outbox trigger sends), refusing one
/// over the NOTIFY limit. The pointer names the lowest seq.
pub fn encode_pointer_carrying(txid: u64, events: &[EventEnvelope]) -> Result<String, EncodeError> {
    let mut events = events.to_vec();
    events.sort_by_key(|event| event.seq);
    let (scope_key, seq) = match events.first() {
        Some(first) => (first.scope_key.clone(), first.seq.unwrap_or(0)),
        None => return Err(EncodeError::NothingCarried),
    };
    if let Err(reason) = check_carried(&scope_key, &events) {
        return Err(EncodeError::NotCarriable(reason));
    }
    finish(&EventNotification::Pointer {
        scope_key,
        seq,
        carried: Some(CarriedRows { txid, events }),
    })
}

/// Carried rows must be valid durable envelopes of the pointer's scope,
/// each with a seq.
fn check_carried(scope_key: &str, events: &[EventEnvelope]) -> Result<(), String> {
    for event in events {
        event.validate().map_err(|e| e.to_string())?;
        if event.lane != Lane::Durable || event.seq.is_none() {
            return Err("every carried row must be durable, with a seq".into());
        }
        if event.scope_key != scope_key {
            return Err(format!(
                "a carried row is in scope {:?}, not the pointer's",
                event.scope_key
            ));
        }
    }
    Ok(())
}

/// Encodes an ephemeral event inline, refusing one over the NOTIFY limit.
pub fn encode_inline(envelope: &EventEnvelope) -> Result<String, EncodeError> {
    encode_inline_within(envelope, MAX_NOTIFY_PAYLOAD_BYTES)
}

/// Encodes an ephemeral event inline, refusing one over `max` bytes: the
/// NOTIFY limit, or a larger cap where ephemeral events travel as logical
/// replication messages, which have no such limit.
pub fn encode_inline_within(envelope: &EventEnvelope, max: usize) -> Result<String, EncodeError> {
    let json = envelope_json(envelope)?;
    within(inline_payload(&json), max)
}

/// The one-event form around an envelope's JSON, as serde writes
/// [`EventNotification::Inline`]: built from the JSON rather than from a
/// copy of the envelope, so a caller that has the JSON already does not
/// serialize the event twice.
fn inline_payload(envelope_json: &str) -> String {
    let mut payload = String::with_capacity(INLINE_OPEN.len() + envelope_json.len() + 1);
    payload.push_str(INLINE_OPEN);
    payload.push_str(envelope_json);
    payload.push('}');
    payload
}

/// What the one-event form puts before the envelope's JSON.
const INLINE_OPEN: &str = r#"{"k":"evt","e":"#;

/// An ephemeral envelope, validated, as JSON.
fn envelope_json(envelope: &EventEnvelope) -> Result<String, EncodeError> {
    if envelope.lane != Lane::Ephemeral {
        return Err(EncodeError::NotEphemeral);
    }
    envelope.validate()?;
    serde_json::to_string(envelope).map_err(|e| EncodeError::Json(e.to_string()))
}

fn finish(notification: &EventNotification) -> Result<String, EncodeError> {
    let payload =
        serde_json::to_string(notification).map_err(|e| EncodeError::Json(e.to_string()))?;
    within(payload, MAX_NOTIFY_PAYLOAD_BYTES)
}

fn within(payload: String, max: usize) -> Result<String, EncodeError> {
    if payload.len() > max {
        return Err(EncodeError::TooLarge {
            len: payload.len(),
            max,
        });
    }
    Ok(payload)
}

/// Encodes ephemeral events sent at the same commit in as few payloads as
/// fit under the size limit, keeping their order. A payload holding a
/// single event uses the one-event form, which every relay reads.
pub fn encode_inline_batch(envelopes: &[EventEnvelope]) -> Result<Vec<String>, EncodeError> {
    encode_inline_batch_within(envelopes, MAX_NOTIFY_PAYLOAD_BYTES)
}

/// [`encode_inline_batch`] with payloads of at most `max` bytes (see
/// [`encode_inline_within`]). Each event is serialized once.
pub fn encode_inline_batch_within<'a>(
    envelopes: impl IntoIterator<Item = &'a EventEnvelope>,
    max: usize,
) -> Result<Vec<String>, EncodeError> {
    const OPEN: &str = r#"{"k":"evts","v":1,"e":["#;
    const CLOSE: &str = "]}";
    let mut payloads = Vec::new();
    let mut pending: Vec<String> = Vec::new();
    let mut pending_len = OPEN.len() + CLOSE.len();
    let flush = |pending: &mut Vec<String>, payloads: &mut Vec<String>| {
        match pending.len() {
            0 => {}
            1 => payloads.push(inline_payload(&pending[0])),
            _ => payloads.push(format!("{OPEN}{}{CLOSE}", pending.join(","))),
        }
        pending.clear();
    };
    for envelope in envelopes {
        let json = envelope_json(envelope)?;
        // Each one must fit alone, in the one-event form, a little longer.
        let alone = INLINE_OPEN.len() + json.len() + 1;
        if alone > max {
            return Err(EncodeError::TooLarge { len: alone, max });
        }
        let separator = usize::from(!pending.is_empty());
        if pending_len + separator + json.len() > max {
            flush(&mut pending, &mut payloads);
            pending_len = OPEN.len() + CLOSE.len();
        }
        pending_len += usize::from(!pending.is_empty()) + json.len();
        pending.push(json);
    }
    flush(&mut pending, &mut payloads);
    Ok(payloads)
}

/// Decodes one payload from the channel.
pub fn decode_notification(payload: &[u8]) -> Result<EventNotification, DecodeError> {
    decode_notification_within(payload, MAX_NOTIFY_PAYLOAD_BYTES)
}

/// Decodes one payload of at most `max` bytes (a logical replication
/// message may be larger than a notification; see [`encode_inline_within`]).
pub fn decode_notification_within(
    payload: &[u8],
    max: usize,
) -> Result<EventNotification, DecodeError> {
    if payload.len() > max {
        return Err(DecodeError::TooLarge {
            len: payload.len(),
            max,
        });
    }
    let text = std::str::from_utf8(payload).map_err(|_| DecodeError::NotUtf8)?;
    let value: Value =
        serde_json::from_str(text).map_err(|e| DecodeError::NotJson(e.to_string()))?;
    let Value::Object(mut object) = value else {
        return Err(DecodeError::NotAnObject);
    };
    let kind = match object.get("k") {
        Some(Value::String(kind)) => kind.clone(),
        _ => return Err(DecodeError::MissingKind),
    };
    match kind.as_str() {
        "ptr" => decode_pointer(&object),
        "evt" => Ok(EventNotification::Inline {
            envelope: decode_envelope(object.remove("e"))?,
        }),
        "evts" => decode_inline_batch(&mut object),
        "due" => Ok(EventNotification::DeliveriesQueued),
        "hz" => match object.get("x").and_then(Value::as_u64) {
            Some(xmin) => Ok(EventNotification::Horizon { xmin }),
            None => Err(DecodeError::InvalidHorizon),
        },
        _ => Err(DecodeError::UnknownKind(kind)),
    }
}

/// A pointer that carries rows, read only as far as routing needs: its
/// scope and seq, with the rows left undecoded. Decoding a few dozen rows
/// is most of what a notification costs a relay, and a relay with no
/// subscriber in the scope drops them unread; one that has subscribers
/// decodes them with [`DeferredPointer::decode_rows`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeferredPointer {
    pub scope_key: String,
    pub seq: i64,
    payload: String,
    max: usize,
}

impl DeferredPointer {
    /// The carried rows, decoded and checked exactly as
    /// [`decode_notification_within`] does; the error is the reason they
    /// are unreadable (the pointer itself is sound: read its rows back).
    pub fn decode_rows(&self) -> Result<CarriedRows, String> {
        match decode_notification_within(self.payload.as_bytes(), self.max) {
            Ok(EventNotification::Pointer {
                carried: Some(rows),
                ..
            }) => Ok(rows),
            Err(DecodeError::UnreadableCarriedRows { reason, .. }) => Err(reason),
            Ok(other) => Err(format!("not a pointer carrying rows: {other:?}")),
            Err(error) => Err(error.to_string()),
        }
    }
}

/// Reads `payload` as a pointer carrying rows without decoding the rows.
/// `None` for anything else, or anything not plainly well formed (a bare
/// pointer, another kind, a field given twice, `x` or `r` null or
/// missing): decode those with [`decode_notification_within`], which names
/// what is wrong.
pub fn defer_carried_rows(payload: &str, max: usize) -> Option<DeferredPointer> {
    /// The routing fields; the rows are skipped over, not built.
    #[derive(Deserialize)]
    struct Head<'a> {
        k: &'a str,
        s: String,
        q: i64,
        x: Option<u64>,
        r: Option<serde::de::IgnoredAny>,
    }
    if payload.len() > max {
        return None;
    }
    let head: Head<'_> = serde_json::from_str(payload).ok()?;
    let carries = head.k == "ptr" && head.x.is_some() && head.r.is_some();
    (carries && head.q > 0 && validate_scope_key(&head.s).is_ok()).then(|| DeferredPointer {
        scope_key: head.s,
        seq: head.q,
        payload: payload.to_owned(),
        max,
    })
}

fn decode_pointer(object: &Map<String, Value>) -> Result<EventNotification, DecodeError> {
    let scope_key = match object.get("s") {
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Err(DecodeError::InvalidPointer(
                "`s` must be the scope key string".into(),
            ));
        }
    };
    validate_scope_key(&scope_key).map_err(|e| DecodeError::InvalidPointer(e.to_string()))?;
    let seq = match object.get("q").and_then(Value::as_i64) {
        Some(seq) if seq > 0 => seq,
        _ => {
            return Err(DecodeError::InvalidPointer(
                "`q` must be a positive integer seq".into(),
            ));
        }
    };
    let carried =
        match (object.get("x"), object.get("r")) {
            (None, None) => None,
            (txid, rows) => Some(decode_carried(&scope_key, seq, txid, rows).map_err(
                |reason| DecodeError::UnreadableCarriedRows {
                    scope_key: scope_key.clone(),
                    seq,
                    reason,
                },
            )?),
        };
    Ok(EventNotification::Pointer {
        scope_key,
        seq,
        carried,
    })
}

fn decode_carried(
    scope_key: &str,
    seq: i64,
    txid: Option<&Value>,
    rows: Option<&Value>,
) -> Result<CarriedRows, String> {
    let txid = txid
        .and_then(Value::as_u64)
        .ok_or("`x` must be the writing transaction's id")?;
    let Some(Value::Array(rows)) = rows else {
        return Err("`r` must be an array of envelopes".into());
    };
    let events = rows
        .iter()
        .map(|row| EventEnvelope::deserialize(row).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    check_carried(scope_key, &events)?;
    let seqs: Vec<i64> = events.iter().filter_map(|event| event.seq).collect();
    if !seqs.windows(2).all(|pair| pair[0] < pair[1]) {
        return Err("the carried rows are not in seq order".into());
    }
    match seqs.first() {
        Some(&first) if first == seq => Ok(CarriedRows { txid, events }),
        Some(first) => Err(format!("the first carried seq is {first}, not `q`")),
        None => Err("`r` is empty".into()),
    }
}

fn decode_inline_batch(object: &mut Map<String, Value>) -> Result<EventNotification, DecodeError> {
    match object.get("v").and_then(Value::as_u64) {
        Some(1) => {}
        Some(other) => return Err(DecodeError::UnsupportedBatchVersion(other)),
        None => {
            return Err(DecodeError::InvalidEnvelope(
                "a batch needs its version `v`".into(),
            ));
        }
    }
    let Some(Value::Array(items)) = object.remove("e") else {
        return Err(DecodeError::InvalidEnvelope(
            "`e` must be an array of envelopes".into(),
        ));
    };
    if items.is_empty() {
        return Err(DecodeError::InvalidEnvelope("the batch is empty".into()));
    }
    let mut envelopes = Vec::with_capacity(items.len());
    for item in items {
        envelopes.push(decode_envelope(Some(item))?);
    }
    Ok(EventNotification::InlineBatch {
        version: INLINE_BATCH_VERSION,
        envelopes,
    })
}

fn decode_envelope(envelope: Option<Value>) -> Result<EventEnvelope, DecodeError> {
    let Some(envelope) = envelope else {
        return Err(DecodeError::InvalidEnvelope("missing field `e`".into()));
    };
    let envelope: EventEnvelope = serde_json::from_value(envelope)
        .map_err(|e| DecodeError::InvalidEnvelope(e.to_string()))?;
    if envelope.lane != Lane::Ephemeral {
        return Err(DecodeError::InlineNotEphemeral);
    }
    envelope
        .validate()
        .map_err(|e| DecodeError::InvalidEnvelope(e.to_string()))?;
    Ok(envelope)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::NewEvent;
    use chrono::Utc;
    use serde_json::json;

    #[test]
    fn pointer_round_trips() {
        let payload = encode_pointer("org-1", 42).unwrap();
        assert_eq!(payload, r#"{"k":"ptr","s":"org-1","q":42}"#);
        assert_eq!(
            decode_notification(payload.as_bytes()).unwrap(),
            EventNotification::Pointer {
                scope_key: "org-1".into(),
                seq: 42,
                carried: None,
            }
        );
    }

    #[test]
    fn a_horizon_mark_round_trips_and_refuses_anything_but_a_txid() {
        let payload = encode_horizon(5_000_000_123);
        assert_eq!(payload, r#"{"k":"hz","x":5000000123}"#);
        assert_eq!(
            decode_notification(payload.as_bytes()).unwrap(),
            EventNotification::Horizon {
                xmin: 5_000_000_123
            }
        );
        for bad in [
            r#"{"k":"hz"}"#,
            r#"{"k":"hz","x":-1}"#,
            r#"{"k":"hz","x":"7"}"#,
            r#"{"k":"hz","x":1.5}"#,
        ] {
            assert_eq!(
                decode_notification(bad.as_bytes()),
                Err(DecodeError::InvalidHorizon),
                "{bad}"
            );
        }
    }

    fn durable(seq: i64, scope_key: &str) -> EventEnvelope {
        let mut envelope = NewEvent::durable("order.created", scope_key, json!({"n": seq}))
            .into_envelope(Utc::now());
        envelope.seq = Some(seq);
        envelope
    }

    #[test]
    fn a_pointer_carrying_its_rows_round_trips_and_names_the_lowest_seq() {
        let rows = vec![durable(8, "org-1"), durable(7, "org-1")];
        let payload = encode_pointer_carrying(5_000_000_000, &rows).unwrap();
        assert!(payload.starts_with(r#"{"k":"ptr","s":"org-1","q":7,"x":5000000000,"r":["#));
        assert_eq!(
            decode_notification(payload.as_bytes()).unwrap(),
            EventNotification::Pointer {
                scope_key: "org-1".into(),
                seq: 7,
                carried: Some(CarriedRows {
                    txid: 5_000_000_000,
                    events: vec![rows[1].clone(), rows[0].clone()],
                }),
            }
        );
        assert_eq!(
            encode_pointer_carrying(1, &[]),
            Err(EncodeError::NothingCarried)
        );
        assert!(matches!(
            encode_pointer_carrying(1, &[durable(1, "a"), durable(2, "b")]),
            Err(EncodeError::NotCarriable(_))
        ));
        let big = NewEvent::durable("big", "org-1", json!({"blob": "x".repeat(8000)}))
            .into_envelope(Utc::now());
        let mut big = big;
        big.seq = Some(3);
        assert!(matches!(
            encode_pointer_carrying(1, &[big]),
            Err(EncodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn unreadable_carried_rows_keep_the_pointer_so_the_relay_can_read_back() {
        let row = serde_json::to_value(durable(7, "org-1")).unwrap();
        let mut ephemeral = row.clone();
        ephemeral["lane"] = json!("ephemeral");
        let mut elsewhere = row.clone();
        elsewhere["scopeKey"] = json!("org-2");
        let mut reserved = row.clone();
        reserved["type"] = json!("eventrelay.resync");
        let mut bad_audience = row.clone();
        bad_audience["audience"] = json!({"users": "everyone"});
        let cases = [
            json!({"k": "ptr", "s": "org-1", "q": 7, "r": [row]}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": -1, "r": [row]}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9, "r": []}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9, "r": [{"id": "nope"}]}),
            json!({"k": "ptr", "s": "org-1", "q": 6, "x": 9, "r": [row]}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9, "r": [row, row]}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9, "r": [ephemeral]}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9, "r": [elsewhere]}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9, "r": [reserved]}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9, "r": [bad_audience]}),
        ];
        for case in cases {
            match decode_notification(case.to_string().as_bytes()) {
                Err(DecodeError::UnreadableCarriedRows { scope_key, seq, .. }) => {
                    assert_eq!(scope_key, "org-1", "{case}");
                    assert_eq!(Some(seq), case["q"].as_i64(), "{case}");
                }
                other => panic!("{case} gave {other:?}"),
            }
        }
        // A broken pointer is still a broken pointer, rows or not.
        assert!(matches!(
            decode_notification(br#"{"k":"ptr","s":"","q":7,"x":9,"r":[]}"#),
            Err(DecodeError::InvalidPointer(_))
        ));
    }

    #[test]
    fn a_deferred_pointer_routes_like_the_full_decode_and_decodes_its_rows_the_same() {
        let rows = vec![durable(7, "org-1"), durable(8, "org-1")];
        let carrying = encode_pointer_carrying(9, &rows).unwrap();
        let deferred = defer_carried_rows(&carrying, MAX_NOTIFY_PAYLOAD_BYTES).unwrap();
        assert_eq!((deferred.scope_key.as_str(), deferred.seq), ("org-1", 7));
        let Ok(EventNotification::Pointer { carried, .. }) =
            decode_notification(carrying.as_bytes())
        else {
            panic!("the carrying pointer decodes");
        };
        assert_eq!(Some(deferred.decode_rows().unwrap()), carried);

        // Sound routing fields with unreadable rows: deferred, and the rows
        // fail with the full decode's reason.
        let row = serde_json::to_value(durable(7, "org-1")).unwrap();
        for unreadable in [
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9, "r": []}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9, "r": [{"id": "nope"}]}),
            json!({"k": "ptr", "s": "org-1", "q": 6, "x": 9, "r": [row]}),
            json!({"k": "ptr", "s": "org-1", "q": 7, "x": 9, "r": "rows"}),
        ] {
            let payload = unreadable.to_string();
            let deferred = defer_carried_rows(&payload, MAX_NOTIFY_PAYLOAD_BYTES)
                .unwrap_or_else(|| panic!("{payload} is routable"));
            let Err(DecodeError::UnreadableCarriedRows { reason, .. }) =
                decode_notification(payload.as_bytes())
            else {
                panic!("{payload} has unreadable rows");
            };
            assert_eq!(deferred.decode_rows(), Err(reason), "{payload}");
        }

        // Anything else is left to the full decode, which names the fault.
        let ephemeral = encode_inline(
            &NewEvent::ephemeral("typing", "org-1", json!({})).into_envelope(Utc::now()),
        )
        .unwrap();
        for other in [
            encode_pointer("org-1", 7).unwrap(),
            ephemeral,
            DELIVERIES_QUEUED.to_owned(),
            carrying.replace(r#""k":"ptr""#, r#""k":"ptr","k":"ptr""#),
            carrying.replace(r#""x":9"#, r#""x":null"#),
            carrying.replace(r#""x":9"#, r#""x":-9"#),
            carrying.replace(r#""q":7"#, r#""q":0"#),
            carrying.replace(r#""q":7"#, r#""q":7.5"#),
            carrying.replace(r#""s":"org-1""#, r#""s":"""#),
            carrying.replace(r#""k":"ptr""#, r#""k":"PTR""#),
            format!("{carrying} trailing"),
            "not json".to_owned(),
        ] {
            assert_eq!(
                defer_carried_rows(&other, MAX_NOTIFY_PAYLOAD_BYTES),
                None,
                "{other}"
            );
        }
        assert_eq!(defer_carried_rows(&carrying, carrying.len() - 1), None);
    }

    #[test]
    fn deliveries_queued_round_trips() {
        let encoded = serde_json::to_string(&EventNotification::DeliveriesQueued).unwrap();
        assert_eq!(encoded, DELIVERIES_QUEUED);
        assert_eq!(
            decode_notification(DELIVERIES_QUEUED.as_bytes()).unwrap(),
            EventNotification::DeliveriesQueued
        );
        assert!(matches!(
            decode_notification(br#"{"k":"dues"}"#),
            Err(DecodeError::UnknownKind(kind)) if kind == "dues"
        ));
    }

    #[test]
    fn pointer_written_by_sql_decodes() {
        // jsonb_build_object orders keys by length and adds spaces.
        let payload = br#"{"k": "ptr", "q": 9, "s": "org-1"}"#;
        assert!(matches!(
            decode_notification(payload),
            Ok(EventNotification::Pointer { seq: 9, .. })
        ));
    }

    #[test]
    fn inline_round_trips() {
        let envelope = NewEvent::ephemeral("sync.progress", "org-1", json!({"done": 3}))
            .into_envelope(Utc::now());
        let payload = encode_inline(&envelope).unwrap();
        assert_eq!(
            decode_notification(payload.as_bytes()).unwrap(),
            EventNotification::Inline { envelope }
        );
    }

    #[test]
    fn numbers_in_data_survive_the_round_trip() {
        // Found by fuzzing: without serde_json's `float_roundtrip` this
        // number came back one ulp away after encode and decode.
        let payload = br#"{"k":"evt","e":{"id":"0b6f3c0e-8f0a-4a8e-9d55-4c3f1f0e2a11","type":"t","scopeKey":"s","lane":"ephemeral","data":8.88888880e61,"occurredAt":"2026-11-30T18:31:21Z"}}"#;
        let decoded = decode_notification(payload).unwrap();
        let EventNotification::Inline { envelope } = &decoded else {
            panic!("an inline event")
        };
        let again = encode_inline(envelope).unwrap();
        assert_eq!(decode_notification(again.as_bytes()).unwrap(), decoded);
    }

    #[test]
    fn the_one_event_form_is_what_serde_writes() {
        for envelope in [
            ephemeral(1, 0),
            NewEvent::ephemeral("a.b", "org-1", json!({"s": "}\"\\n", "n": [1.5, null]}))
                .into_envelope(Utc::now()),
        ] {
            let serde_form = serde_json::to_string(&EventNotification::Inline {
                envelope: envelope.clone(),
            })
            .unwrap();
            assert_eq!(encode_inline(&envelope).unwrap(), serde_form);
            assert_eq!(encode_inline_batch(&[envelope]).unwrap(), vec![serde_form]);
        }
    }

    #[test]
    fn oversized_inline_is_refused() {
        let envelope = NewEvent::ephemeral("big", "org-1", json!({"blob": "x".repeat(8000)}))
            .into_envelope(Utc::now());
        assert!(matches!(
            encode_inline(&envelope),
            Err(EncodeError::TooLarge {
                max: MAX_NOTIFY_PAYLOAD_BYTES,
                ..
            })
        ));
    }

    #[test]
    fn durable_envelopes_do_not_travel_inline() {
        let mut envelope = NewEvent::durable("a", "s", json!({})).into_envelope(Utc::now());
        envelope.seq = Some(1);
        assert_eq!(encode_inline(&envelope), Err(EncodeError::NotEphemeral));
    }

    type Expectation = fn(&DecodeError) -> bool;

    #[test]
    fn every_malformed_payload_has_a_named_error() {
        let cases: &[(&[u8], Expectation)] = &[
            (b"\xff\xfe", |e| matches!(e, DecodeError::NotUtf8)),
            (b"not json", |e| matches!(e, DecodeError::NotJson(_))),
            (b"[1,2]", |e| matches!(e, DecodeError::NotAnObject)),
            (b"{}", |e| matches!(e, DecodeError::MissingKind)),
            (br#"{"k":3}"#, |e| matches!(e, DecodeError::MissingKind)),
            (br#"{"k":"zip"}"#, |e| {
                matches!(e, DecodeError::UnknownKind(_))
            }),
            (br#"{"k":"ptr","q":1}"#, |e| {
                matches!(e, DecodeError::InvalidPointer(_))
            }),
            (br#"{"k":"ptr","s":"","q":1}"#, |e| {
                matches!(e, DecodeError::InvalidPointer(_))
            }),
            (br#"{"k":"ptr","s":"a","q":0}"#, |e| {
                matches!(e, DecodeError::InvalidPointer(_))
            }),
            (br#"{"k":"ptr","s":"a","q":1.5}"#, |e| {
                matches!(e, DecodeError::InvalidPointer(_))
            }),
            (br#"{"k":"ptr","s":"a","q":"1"}"#, |e| {
                matches!(e, DecodeError::InvalidPointer(_))
            }),
            (br#"{"k":"evt"}"#, |e| {
                matches!(e, DecodeError::InvalidEnvelope(_))
            }),
            (br#"{"k":"evt","e":{"id":"nope"}}"#, |e| {
                matches!(e, DecodeError::InvalidEnvelope(_))
            }),
        ];
        for (payload, expected) in cases {
            let err = decode_notification(payload).unwrap_err();
            assert!(
                expected(&err),
                "{:?} gave {err:?}",
                String::from_utf8_lossy(payload)
            );
        }
        let huge = vec![b' '; MAX_NOTIFY_PAYLOAD_BYTES + 1];
        assert!(matches!(
            decode_notification(&huge),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn inline_durable_or_bad_type_is_refused() {
        let mut envelope = NewEvent::durable("a", "s", json!({})).into_envelope(Utc::now());
        envelope.seq = Some(1);
        let payload = json!({"k": "evt", "e": envelope}).to_string();
        assert_eq!(
            decode_notification(payload.as_bytes()),
            Err(DecodeError::InlineNotEphemeral)
        );
        let mut envelope = NewEvent::ephemeral("a", "s", json!({})).into_envelope(Utc::now());
        envelope.event_type = "a\nevent: forged".into();
        let payload = json!({"k": "evt", "e": envelope}).to_string();
        assert!(matches!(
            decode_notification(payload.as_bytes()),
            Err(DecodeError::InvalidEnvelope(_))
        ));
    }

    fn ephemeral(n: usize, pad: usize) -> EventEnvelope {
        NewEvent::ephemeral("tick", "org-1", json!({"n": n, "pad": "x".repeat(pad)}))
            .into_envelope(Utc::now())
    }

    #[test]
    fn inline_batches_pack_under_the_limit_in_order_and_round_trip() {
        let events: Vec<EventEnvelope> = (0..40).map(|n| ephemeral(n, 400)).collect();
        let payloads = encode_inline_batch(&events).unwrap();
        assert!(
            payloads.len() > 1 && payloads.len() < 10,
            "{}",
            payloads.len()
        );
        let mut decoded = Vec::new();
        for payload in &payloads {
            assert!(payload.len() <= MAX_NOTIFY_PAYLOAD_BYTES);
            match decode_notification(payload.as_bytes()).unwrap() {
                EventNotification::InlineBatch { version, envelopes } => {
                    assert_eq!(version, INLINE_BATCH_VERSION);
                    decoded.extend(envelopes);
                }
                EventNotification::Inline { envelope } => decoded.push(envelope),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(decoded, events);
        // One event alone uses the form every relay reads.
        let single = encode_inline_batch(&events[..1]).unwrap();
        assert_eq!(single, vec![encode_inline(&events[0]).unwrap()]);
        assert!(encode_inline_batch(&[]).unwrap().is_empty());
    }

    #[test]
    fn malformed_batches_are_refused_by_name() {
        let good = serde_json::to_string(&ephemeral(1, 0)).unwrap();
        for (payload, expected) in [
            (format!(r#"{{"k":"evts","v":2,"e":[{good}]}}"#), "version 2"),
            (format!(r#"{{"k":"evts","e":[{good}]}}"#), "version"),
            (r#"{"k":"evts","v":1,"e":[]}"#.to_owned(), "empty"),
            (r#"{"k":"evts","v":1,"e":{}}"#.to_owned(), "array"),
            (
                format!(r#"{{"k":"evts","v":1,"e":[{good},{{"id":1}}]}}"#),
                "malformed",
            ),
        ] {
            let error = decode_notification(payload.as_bytes()).unwrap_err();
            assert!(error.to_string().contains(expected), "{payload}: {error}");
        }
    }
}
