//! A subscriber's credentials on a request: read from its headers (and the
//! query-string token `[auth]` may allow) and resolved to a subscriber, for
//! the event stream and for the presence request alike.

use actix_web::HttpRequest;

use crate::api_error::{ApiError, ErrorCode};
use crate::auth::{Credentials, ResolvedSubscriber};
use crate::config::Config;
use crate::state::AppState;

/// A request's subscriber credentials: its headers, and the query-string
/// token when `[auth]` names a parameter for it.
pub fn subscriber_credentials(
    request: &HttpRequest,
    config: &Config,
) -> Result<Credentials, ApiError> {
    let mut credentials = Credentials::from_headers(request.headers())
        .map_err(|e| ApiError::bad_request(ErrorCode::InvalidHeader, e.to_string()))?;
    if let Some(name) = config.auth.as_ref().and_then(|auth| auth.query_param()) {
        credentials = credentials.or_query_token(request.query_string(), name);
    }
    Ok(credentials)
}

/// Resolves credentials to a subscriber: 401 when they are the caller's
/// fault, 503 when authentication itself is unavailable.
pub async fn resolve_subscriber(
    state: &AppState,
    credentials: &Credentials,
) -> Result<ResolvedSubscriber, ApiError> {
    state.resolver.resolve(credentials).await.map_err(|error| {
        if error.is_client_error() {
            ApiError::unauthorized(error.to_string())
        } else {
            ApiError::failed("the subscriber could not be authenticated", &error)
        }
    })
}
