//! `POST /v1/events`: the HTTP publish API, for applications that cannot
//! emit inside their own transaction.
//!
//! This is not atomic with the application's own writes: the event commits
//! in a transaction of its own. A batch is one transaction: every durable
//! event in it commits together (with its notification) or none does;
//! ephemeral events in it are sent at that same commit.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use eventrelay_publisher::{NewEvent, PublishError};
use eventrelay_wire::EncodeError;
use serde_json::{Value, json};
use tokio_postgres::error::SqlState;

use super::AppState;
use super::body::read_body;
use super::error::{ApiError, ErrorCode};
use super::token::Guard;
use crate::group_commit::GroupError;

const PUBLISH: Guard = Guard {
    setting: "publish.token",
    disabled_code: ErrorCode::PublishDisabled,
    name: "publish token",
};

fn parse_events(body: &[u8], max_batch: usize) -> Result<Vec<NewEvent>, ApiError> {
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
    PUBLISH.check(&request, state.config().publish.token.as_deref())?;
    let body = read_body(payload, state.config().http.max_body_bytes).await?;
    let events = parse_events(&body, state.config().publish.max_batch)?;
    let envelopes = state
        .publishing
        .publish(events)
        .await
        .map_err(|error| match error {
            GroupError::Refused { index, error } => publish_error(index, error),
            GroupError::Unavailable(cause) => ApiError::failed(WRITE_FAILED, &*cause),
            GroupError::Stopping => ApiError::unavailable("the relay is stopping; publish again"),
        })?;
    state
        .metrics
        .events_published
        .inc_by(envelopes.len() as u64);
    Ok(HttpResponse::Ok().json(json!({ "events": envelopes })))
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
        let wrong = br#"[{"type":"a","scopeKey":"s","lane":"sometimes"}]"#;
        let error = parse_events(wrong, 10).unwrap_err();
        assert_eq!(error.code, "invalid_event");
        assert!(error.message.starts_with("event 0:"));
    }
}
