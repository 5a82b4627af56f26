//! The operator console: a page served by the relay at `/console` for
//! looking into webhook deliveries, the relay's live figures and its open
//! streams. It is plain files built into the binary (no build step, no
//! third-party requests) and acts only through the admin API, signed in
//! with the admin token, which the page keeps in `sessionStorage`.
//!
//! Served while `http.console` is on and an admin token is configured:
//! without a token there is nothing the page could do, so it is not there.

use actix_web::{HttpResponse, web};

use crate::api_error::ApiError;
use crate::state::AppState;

const PAGE: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");
/// What the console and the customer portal share (see `http::portal`).
pub(super) const SHARED_SCRIPT: &str = include_str!("console/ui.js");

/// Same-origin everything, nothing inline: the page's only way out is the
/// relay's own API, and injected markup could run no script.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

fn asset(
    state: &AppState,
    content_type: &str,
    body: &'static str,
) -> Result<HttpResponse, ApiError> {
    // Read per request: a reload may set or clear the token.
    if state.config().admin.token.is_none() {
        return Err(super::no_such_endpoint());
    }
    Ok(HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("cache-control", "no-store"))
        .insert_header(("content-security-policy", CONTENT_SECURITY_POLICY))
        .insert_header(("x-content-type-options", "nosniff"))
        .insert_header(("referrer-policy", "no-referrer"))
        .body(body))
}

pub async fn page(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    asset(&state, "text/html; charset=utf-8", PAGE)
}

pub async fn script(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    asset(&state, "text/javascript; charset=utf-8", SCRIPT)
}

pub async fn shared_script(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    asset(&state, "text/javascript; charset=utf-8", SHARED_SCRIPT)
}

pub async fn style(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    asset(&state, "text/css; charset=utf-8", STYLE)
}
