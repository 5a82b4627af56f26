//! `POST /v1/events`: the HTTP publish API, for applications that cannot
//! emit inside their own transaction.
//!
//! This is not atomic with the application's own writes: the event commits
//! in a transaction of its own. A batch is one transaction: every durable
//! event in it commits together (with its notification) or none does;
//! ephemeral events in it are sent at that same commit. A request of
//! ephemeral events only is also fanned out to this relay's own
//! subscribers at once, before the commit, without a stop at the relay
//! actor and, in a small scope, on this very thread (see [`DeliveredHere`]
//! and `HubHandle::publish_here`).

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use eventrelay_publisher::{EventEnvelope, Lane, NewEvent, PublishError};
use eventrelay_wire::{EncodeError, TraceParent};
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::error::SqlState;

use super::body::read_body;
use super::json_numbers::{MAX_EXACT_INTEGER, inexact_integer};
use super::token::Guard;
use crate::actors::EncodedEvent;
use crate::actors::relay::DeliveredHere;
use crate::api_error::{ApiError, ErrorCode};
use crate::group_commit::GroupError;
use crate::latency::Stage;
use crate::state::AppState;
use crate::telemetry::PublishTrace;

const PUBLISH: Guard = Guard {
    setting: "publish.token",
    disabled_code: ErrorCode::PublishDisabled,
    name: "publish token",
};

/// The events of a publish body: one event object or an array of them,
/// with no integer beyond what JavaScript holds exactly (see
/// [`json_numbers`](super::json_numbers)).
fn parse_events(body: &[u8], max_batch: usize) -> Result<Vec<NewEvent>, ApiError> {
    let events = read_events(body, max_batch)?;
    if let Some(integer) = inexact_integer(body) {
        // A number of a megabyte's digits is named by its start.
        let shown: String = integer.chars().take(40).collect();
        let ellipsis = if shown.len() < integer.len() {
            "…"
        } else {
            ""
        };
        return Err(ApiError::bad_request(
            ErrorCode::NumberOutOfRange,
            format!(
                "the integer {shown}{ellipsis} is beyond ±2^53 ({MAX_EXACT_INTEGER}), which \
                 browsers' JavaScript cannot hold exactly; send it as a string"
            ),
        ));
    }
    Ok(events)
}

/// The events of a body, read without the number check.
fn read_events(body: &[u8], max_batch: usize) -> Result<Vec<NewEvent>, ApiError> {
    // A well-formed body is read straight into events, without building a
    // JSON tree first; only a body that fails is read again as a tree, to
    // name the event at fault and what is wrong with it.
    let direct = match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => serde_json::from_slice::<NewEvent>(body).map(|event| vec![event]),
        Some(b'[') => serde_json::from_slice::<Vec<NewEvent>>(body),
        _ => return explain_refusal(body, max_batch),
    };
    match direct {
        Ok(events) if !events.is_empty() && events.len() <= max_batch => Ok(events),
        _ => explain_refusal(body, max_batch),
    }
}

/// Reads a body event by event, so an error names the event at fault. It
/// accepts whatever a JSON tree accepts (a key given twice keeps its last
/// value), so a body the direct read refused may still pass here.
fn explain_refusal(body: &[u8], max_batch: usize) -> Result<Vec<NewEvent>, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(ErrorCode::InvalidBody, format!("body is not JSON: {e}"))
    })?;
    let items = match value {
        Value::Array(items) => items,
        single @ Value::Object(_) => vec![single],
        _ => {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidBody,
                "body must be an event object or an array of them",
            ));
        }
    };
    if items.is_empty() {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidBody,
            "the batch is empty",
        ));
    }
    if items.len() > max_batch {
        return Err(ApiError::bad_request(
            ErrorCode::BatchTooLarge,
            format!(
                "{} events in one request; the limit is {max_batch}",
                items.len()
            ),
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            serde_json::from_value::<NewEvent>(item).map_err(|e| {
                ApiError::bad_request(ErrorCode::InvalidEvent, format!("event {index}: {e}"))
            })
        })
        .collect()
}

/// What a client is told when the database could not take its events.
const WRITE_FAILED: &str = "the events could not be written (the database failed), and none was";

fn publish_error(index: usize, error: PublishError) -> ApiError {
    let message = format!("event {index}: {error}");
    match error {
        PublishError::InvalidEvent(_) => ApiError::bad_request(ErrorCode::InvalidEvent, message),
        PublishError::Schema(_) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::SchemaViolation,
            message,
        ),
        PublishError::Encode(EncodeError::TooLarge { .. }) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::EventTooLarge,
            message,
        ),
        PublishError::Encode(_) => ApiError::bad_request(ErrorCode::InvalidEvent, message),
        // The database refusing the event itself (an id already used, text
        // it cannot store such as NUL) is the request's fault, not an outage.
        PublishError::Database(error) => {
            let refused = error.as_db_error().map(|db| db.message().to_owned());
            match (error.code(), refused) {
                (Some(code), Some(reason)) if *code == SqlState::UNIQUE_VIOLATION => ApiError::new(
                    StatusCode::CONFLICT,
                    ErrorCode::Conflict,
                    format!("event {index}: an event with this id already exists ({reason})"),
                ),
                (Some(code), Some(reason))
                    if code.code().starts_with("22") || code.code().starts_with("23") =>
                {
                    ApiError::bad_request(
                        ErrorCode::InvalidEvent,
                        format!("event {index}: the database refused it: {reason}"),
                    )
                }
                _ => ApiError::failed(WRITE_FAILED, &error),
            }
        }
        other => ApiError::failed(WRITE_FAILED, &other),
    }
}

pub async fn publish_events(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let received = std::time::Instant::now();
    let received_at = std::time::SystemTime::now();
    PUBLISH.check(&request, state.config().publish.token.as_deref())?;
    let body = read_body(payload, &state.config().http).await?;
    let mut events = parse_events(&body, state.config().publish.max_batch)?;
    // A malformed header is ignored, as the trace context rules ask.
    let caller = request
        .headers()
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .and_then(TraceParent::parse);
    let trace = state
        .metrics
        .tracing
        .publish(caller, events.len(), received_at);
    for event in &mut events {
        if event.traceparent.is_none() {
            event.traceparent.clone_from(&trace.traceparent);
        }
    }
    let published = publish_traced(&state, events, received, &trace).await;
    trace.end(published.as_ref().err().map(|error| error.code.as_str()));
    let envelopes = published?;
    Ok(HttpResponse::Ok().json(Published { events: &envelopes }))
}

/// Validates, writes and commits a request's events; ephemeral-only
/// requests are also fanned out here at once.
async fn publish_traced(
    state: &AppState,
    events: Vec<NewEvent>,
    received: std::time::Instant,
    trace: &PublishTrace,
) -> Result<Vec<EventEnvelope>, ApiError> {
    let prepared = state.publishing.prepare(events).map_err(group_error)?;
    state.metrics.stages.since(Stage::Parse, received);
    if prepared
        .envelopes()
        .iter()
        .all(|e| e.lane == Lane::Ephemeral)
    {
        // Nothing durable to commit with: this relay's own subscribers
        // need not wait for the transaction, nor for its notification to
        // come back (which the relay then skips). Other relays get the
        // events at the commit, as always.
        hand_to_hubs(state, prepared.envelopes());
    }
    let group_commit = trace.group_commit();
    let written = state.publishing.publish(prepared).await;
    drop(group_commit);
    let envelopes = written.map_err(group_error)?;
    state
        .metrics
        .events_published
        .inc_by(envelopes.len() as u64);
    Ok(envelopes)
}

/// Fans ephemeral events out to this relay's subscribers of their scopes
/// (a scope with no subscriber here has no hub), on this thread where the
/// scope is small (see `HubHandle::publish_here`), and tells the relay to
/// skip their notifications when they come back. The relay hears of them
/// before they can come back, as the transaction has not started yet, but
/// after the subscribers: the message wakes the relay's thread, which the
/// transaction then keeps busy, and woken first it took the idle CPU that
/// the streams needed to start writing.
fn hand_to_hubs(state: &AppState, envelopes: &[EventEnvelope]) {
    let at = std::time::Instant::now();
    for envelope in envelopes {
        if let Some(hub) = state.hubs.get(&envelope.scope_key) {
            hub.publish_here(Arc::new(EncodedEvent::new(envelope.clone())), at);
        }
    }
    state.relay.do_send(DeliveredHere {
        ids: envelopes.iter().map(|e| e.id).collect(),
    });
}

fn group_error(error: GroupError) -> ApiError {
    match error {
        GroupError::Refused { index, error } => publish_error(index, error),
        GroupError::Unavailable(cause) => ApiError::failed(WRITE_FAILED, &*cause),
        GroupError::Stopping => ApiError::unavailable("the relay is stopping; publish again"),
    }
}

/// The answer to a publish: the events as written, in request order.
#[derive(Serialize)]
struct Published<'a> {
    events: &'a [EventEnvelope],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_one_event_or_a_batch_and_names_what_is_wrong() {
        let one = br#"{"type":"a","scopeKey":"s","lane":"durable","data":{}}"#;
        assert_eq!(parse_events(one, 10).unwrap().len(), 1);
        let two = br#"[{"type":"a","scopeKey":"s","lane":"durable"},{"type":"b","scopeKey":"s","lane":"ephemeral"}]"#;
        assert_eq!(parse_events(two, 10).unwrap().len(), 2);
        assert_eq!(parse_events(two, 1).unwrap_err().code, "batch_too_large");
        assert_eq!(parse_events(b"nope", 10).unwrap_err().code, "invalid_body");
        assert_eq!(parse_events(b"[]", 10).unwrap_err().code, "invalid_body");
        assert_eq!(parse_events(b"3", 10).unwrap_err().code, "invalid_body");
        let spaced = b" \n [{\"type\":\"a\",\"scopeKey\":\"s\",\"lane\":\"durable\",\"data\":{\"n\":[1,2.5,null]}}]";
        assert_eq!(parse_events(spaced, 10).unwrap().len(), 1);
        // Read straight or as a tree, a body gives the same events.
        for body in [&one[..], &two[..], &spaced[..]] {
            assert_eq!(
                parse_events(body, 10).unwrap(),
                explain_refusal(body, 10).unwrap()
            );
        }
        // A key given twice keeps its last value, as a JSON tree reads it.
        let twice = br#"{"type":"a","type":"b","scopeKey":"s","lane":"durable"}"#;
        assert_eq!(parse_events(twice, 10).unwrap()[0].event_type, "b");
        // An integer JavaScript would round is refused wherever it is.
        for big in [
            &br#"{"type":"a","scopeKey":"s","lane":"durable","data":{"n":9007199254740993}}"#[..],
            br#"[{"type":"a","scopeKey":"s","lane":"durable","data":[-18446744073709551615]}]"#,
        ] {
            assert_eq!(
                parse_events(big, 10).unwrap_err().code,
                "number_out_of_range"
            );
        }
        let edge = br#"{"type":"a","scopeKey":"s","lane":"durable","data":{"n":9007199254740992,"m":-9007199254740992,"f":1e30}}"#;
        assert_eq!(parse_events(edge, 10).unwrap().len(), 1);
        let wrong = br#"[{"type":"a","scopeKey":"s","lane":"sometimes"}]"#;
        let error = parse_events(wrong, 10).unwrap_err();
        assert_eq!(error.code, "invalid_event");
        assert!(error.message.starts_with("event 0:"));
    }
}
