//! Reading request bodies under two bounds: a size limit
//! (`http.max_body_bytes`), answered with a JSON 413 rather than the
//! framework's plain-text one, and a deadline (`http.body_timeout_secs`),
//! answered 408 `request_timeout`, so a client that sends its body a byte at
//! a time holds its connection no longer than that. The 408 closes an
//! HTTP/1.1 connection (`connection: close`, and the HTTP layer closes any
//! connection whose request body was not read to its end); over HTTP/2 it
//! ends the request's stream.
//!
//! Handlers read the body only after deciding whether to refuse the
//! request (a missing token, an endpoint that is off), so a refusal never
//! waits for a body.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::web;
use bytes::BytesMut;
use futures_util::StreamExt;

use crate::api_error::{ApiError, ErrorCode};
use crate::config::HttpConfig;

/// Reads the body, refusing it as soon as it passes `http.max_body_bytes`,
/// or when it has not all arrived within `http.body_timeout_secs`.
pub async fn read_body(payload: web::Payload, http: &HttpConfig) -> Result<BytesMut, ApiError> {
    let timeout = Duration::from_secs(http.body_timeout_secs);
    tokio::time::timeout(timeout, read_limited(payload, http.max_body_bytes))
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::RequestTimeout,
                format!(
                    "the request body did not arrive within {} s (http.body_timeout_secs)",
                    http.body_timeout_secs
                ),
            ))
        })
}

async fn read_limited(mut payload: web::Payload, limit: usize) -> Result<BytesMut, ApiError> {
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(ErrorCode::InvalidBody, format!("cannot read body: {e}"))
        })?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                format!("request body is over the {limit}-byte limit (http.max_body_bytes)"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
