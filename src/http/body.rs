//! Reading request bodies with a size limit, answering a JSON 413 (rather
//! than the framework's plain-text one) when a body is too large.

use actix_web::http::StatusCode;
use actix_web::web;
use bytes::BytesMut;
use futures_util::StreamExt;

use super::error::{ApiError, ErrorCode};

/// Reads the body, refusing it as soon as it passes `limit` bytes.
pub async fn read_body(mut payload: web::Payload, limit: usize) -> Result<BytesMut, ApiError> {
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
