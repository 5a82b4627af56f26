//! The inspector: a development page served by the relay that watches a
//! scope's events live (through the browser client), shows the connection
//! state, and lists recent webhook deliveries. Off with `http.inspector =
//! false`. Minting a token from the page works only in development mode
//! (no `[auth]` configured), where the secret is a local throwaway.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::body::read_body;
use crate::api_error::{ApiError, ErrorCode};
use crate::auth::{Algorithm, MintOptions, TokenSpec, mint_token};
use crate::state::AppState;

const PAGE: &str = include_str!("inspector.html");
const CLIENT: &str = include_str!("../../clients/js/eventrelay-client.js");

pub async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .body(PAGE)
}

pub async fn client() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .body(CLIENT)
}

#[derive(Deserialize)]
/// The inspector's token form.
pub struct MintRequest {
    subscriber: String,
    /// One scope key, or several.
    scope: OneOrMore,
}

/// A scope key, or an array of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMore {
    One(String),
    More(Vec<String>),
}

/// `POST /inspector/token`. Outside development mode it is refused before
/// a byte of the body is read.
pub async fn token(
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let Some(secret) = &state.development_secret else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::MintingDisabled,
            "tokens can be minted here only in development mode (no [auth] configured)",
        ));
    };
    let body = read_body(payload, &state.config().http).await?;
    let request: MintRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(ErrorCode::InvalidBody, format!("invalid body: {e}")))?;
    let (scope_key, more_scopes) = match request.scope {
        OneOrMore::One(scope) => (scope, Vec::new()),
        OneOrMore::More(mut scopes) if !scopes.is_empty() => (scopes.remove(0), scopes),
        OneOrMore::More(_) => {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidBody,
                "scope must be a scope key or a non-empty array of them",
            ));
        }
    };
    let token = mint_token(
        secret,
        Algorithm::HS256,
        &TokenSpec {
            subscriber_id: request.subscriber,
            scope_key,
            more_scopes,
            grants: json!({}),
            ttl: std::time::Duration::from_secs(3600),
        },
        &MintOptions::default(),
    )
    .map_err(|e| ApiError::bad_request(ErrorCode::InvalidBody, e.to_string()))?;
    Ok(HttpResponse::Ok().json(json!({ "token": token })))
}
