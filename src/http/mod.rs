//! The HTTP API (actix-web): the SSE stream, the publish API and the
//! operations endpoints, over one shared application state
//! ([`crate::state`]); errors answer as [`crate::api_error::ApiError`].

pub mod admin;
pub mod body;
pub mod catalog;
pub mod console;
pub mod cors;
pub mod deadline;
pub mod inspector;
pub mod json_numbers;
pub mod ops;
pub mod portal;
pub mod presence;
pub mod publish;
pub mod routes;
pub mod serve;
pub mod subscribers;
pub mod tls;
pub mod token;

use crate::api_error::{ApiError, ErrorCode};
pub use routes::{Pages, routes};

/// Any path (or method of `/v1/events`) the API does not have.
pub async fn not_found() -> Result<actix_web::HttpResponse, ApiError> {
    Err(no_such_endpoint())
}

/// The answer for a path the relay does not serve (or not as configured).
pub fn no_such_endpoint() -> ApiError {
    ApiError::new(
        actix_web::http::StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        "no such endpoint",
    )
}
