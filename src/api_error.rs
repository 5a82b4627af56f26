//! The one HTTP error type. Every error response is JSON
//! `{"error": {"code": "<stable code>", "message": "<for humans>"}}`;
//! clients branch on `code`, which never changes meaning. The codes are the
//! variants of [`ErrorCode`], and the OpenAPI document lists exactly those.
//!
//! A 503 says what failed in words a client can act on. The cause (a
//! database's own message, say) is logged, never sent, under a request id
//! that the answer carries as `requestId`, so an operator can find the log
//! line a client reports.

use std::fmt;

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

/// The stable, machine-readable codes of the HTTP API's errors. A code's
/// text is its variant's name in snake case, so renaming a variant changes
/// the API; the declaration order is the order the OpenAPI document lists
/// them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ErrorCode {
    InvalidLastEventId,
    InvalidQuery,
    InvalidHeader,
    Unauthorized,
    TooManyConnections,
    Unavailable,
    InvalidBody,
    InvalidEvent,
    BatchTooLarge,
    PublishDisabled,
    EventTooLarge,
    SchemaViolation,
    PayloadTooLarge,
    NotFound,
    AdminDisabled,
    Conflict,
    OriginNotAllowed,
    CorsMethodNotAllowed,
    CorsHeaderNotAllowed,
    MintingDisabled,
    InvalidConfig,
    SubscriberDisconnected,
    WeakSecret,
    NumberOutOfRange,
    RequestTimeout,
    CatalogDisabled,
    ScopeNotGranted,
    TooManyScopes,
}

impl ErrorCode {
    /// The code as clients see it: the variant's name in snake case.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
    /// Set on answers whose cause was logged rather than sent.
    pub request_id: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            request_id: None,
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, message)
    }

    pub fn bad_request(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// A 503 for a condition the message fully explains (the relay is
    /// stopping, say); nothing is logged.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            message,
        )
    }

    /// A 503 for a failure with a cause the client must not see (a database
    /// error, an upstream's answer). `what` says what could not be done and
    /// goes to the client; `cause` goes to the log under a fresh request id,
    /// which the client gets too.
    pub fn failed(what: &str, cause: &(dyn std::error::Error + 'static)) -> Self {
        let request_id = uuid::Uuid::new_v4().simple().to_string();
        tracing::error!(request_id, error = %ErrorChain(cause), "{what}");
        ApiError {
            request_id: Some(request_id.clone()),
            ..Self::unavailable(format!(
                "{what}; try again shortly (request id {request_id})"
            ))
        }
    }
}

/// An error with its sources, for the log: `outer: inner: innermost`.
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        if self.status == StatusCode::UNAUTHORIZED {
            response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        // A request that ran out of time leaves its connection in an unknown
        // state (part of a body unread): the connection ends with it.
        if self.status == StatusCode::REQUEST_TIMEOUT {
            response.force_close();
        }
        let mut error = json!({"code": self.code.as_str(), "message": self.message});
        if let Some(request_id) = &self.request_id {
            error["requestId"] = json!(request_id);
            response.insert_header(("x-request-id", request_id.as_str()));
        }
        response.json(json!({ "error": error }))
    }
}

#[cfg(test)]
mod tests {
    use strum::IntoEnumIterator;

    use super::*;

    #[test]
    fn the_openapi_document_lists_exactly_the_error_codes() {
        let document: serde_json::Value = serde_json::from_str(crate::http::ops::OPENAPI).unwrap();
        let listed: Vec<&str> =
            document["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]
                ["enum"]
                .as_array()
                .unwrap()
                .iter()
                .map(|code| code.as_str().unwrap())
                .collect();
        let codes: Vec<&str> = ErrorCode::iter().map(ErrorCode::as_str).collect();
        assert_eq!(listed, codes);
    }

    #[test]
    fn a_failure_logs_its_cause_and_tells_the_client_only_what_failed() {
        let cause = std::io::Error::other("password authentication failed for user \"app\"");
        let error = ApiError::failed("the outbox could not be read", &cause);
        let request_id = error.request_id.clone().unwrap();
        assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(error.message.contains(&request_id), "{}", error.message);
        assert!(!error.message.contains("password"), "{}", error.message);
    }
}
