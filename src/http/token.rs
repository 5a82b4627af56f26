//! The static bearer tokens that guard the publish and admin APIs, and
//! reading a bearer token from a request.

use actix_web::HttpRequest;
use actix_web::http::{StatusCode, header};
use sha2::{Digest, Sha256};

use crate::api_error::{ApiError, ErrorCode};

/// One token-guarded API, for its error messages.
pub struct Guard {
    /// The setting that holds the token, such as `publish.token`.
    pub setting: &'static str,
    /// The code answered while the API is off.
    pub disabled_code: ErrorCode,
    /// What the token is called, such as `publish token`.
    pub name: &'static str,
}

impl Guard {
    /// Accepts the request when it carries `Authorization: Bearer <expected>`.
    /// With no token configured the API is off (403).
    pub fn check(&self, request: &HttpRequest, expected: Option<&str>) -> Result<(), ApiError> {
        let Some(expected) = expected else {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                self.disabled_code,
                format!("this API is off: set {} to enable it", self.setting),
            ));
        };
        let provided = bearer(request).ok_or_else(|| {
            ApiError::unauthorized(format!("send `Authorization: Bearer <{}>`", self.name))
        })?;
        // Comparing digests keeps the comparison's timing independent of how
        // much of the token was right.
        if Sha256::digest(provided.trim().as_bytes()) != Sha256::digest(expected.as_bytes()) {
            return Err(ApiError::unauthorized(format!(
                "the {} is not valid",
                self.name
            )));
        }
        Ok(())
    }
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(request: &HttpRequest) -> Option<&str> {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
}
