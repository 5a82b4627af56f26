//! The static bearer tokens that guard the publish and admin APIs, reading
//! a bearer token from a request, and resolving a subscriber's credentials.

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

/// A request's subscriber credentials: its headers, and the query-string
/// token when `[auth]` names a parameter for it.
pub fn subscriber_credentials(
    request: &HttpRequest,
    config: &crate::config::Config,
) -> Result<crate::auth::Credentials, ApiError> {
    let mut credentials = crate::auth::Credentials::from_headers(request.headers())
        .map_err(|e| ApiError::bad_request(ErrorCode::InvalidHeader, e.to_string()))?;
    if let Some(name) = config.auth.as_ref().and_then(|auth| auth.query_param()) {
        credentials = credentials.or_query_token(request.query_string(), name);
    }
    Ok(credentials)
}

/// Resolves credentials to a subscriber: 401 when they are the caller's
/// fault, 503 when authentication itself is unavailable.
pub async fn resolve_subscriber(
    state: &crate::state::AppState,
    credentials: &crate::auth::Credentials,
) -> Result<crate::auth::ResolvedSubscriber, ApiError> {
    state.resolver.resolve(credentials).await.map_err(|error| {
        if error.is_client_error() {
            ApiError::unauthorized(error.to_string())
        } else {
            ApiError::failed("the subscriber could not be authenticated", &error)
        }
    })
}
