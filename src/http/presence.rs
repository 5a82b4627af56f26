//! `GET /v1/scopes/{scope}/presence`: who is connected to a scope with
//! presence, across every relay, for a subscriber of that scope (the same
//! credentials as its stream) or the admin token.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::token::Guard;
use crate::api_error::{ApiError, ErrorCode};
use crate::sse::credentials::{resolve_subscriber, subscriber_credentials};
use crate::state::AppState;

const ADMIN: Guard = Guard {
    setting: "admin.token",
    disabled_code: ErrorCode::AdminDisabled,
    name: "admin token",
};

/// Most members one answer lists.
const MAX_PAGE: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresenceQuery {
    /// Members after this subscriber id (the previous page's `next`).
    after: Option<String>,
    limit: Option<usize>,
}

pub async fn members(
    request: HttpRequest,
    scope: web::Path<String>,
    query: web::Query<PresenceQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let config = state.config();
    let admin = config.admin.token.is_some()
        && ADMIN.check(&request, config.admin.token.as_deref()).is_ok();
    if !admin {
        let credentials = subscriber_credentials(&request, &config)?;
        let resolved = resolve_subscriber(&state, &credentials).await?;
        if !resolved.grants_scope(&scope) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                ErrorCode::ScopeNotGranted,
                format!("these credentials do not grant scope {:?}", *scope),
            ));
        }
    }
    if !state.presence.covers(&scope) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("scope {:?} has no presence (see presence.scopes)", *scope),
        ));
    }
    let limit = query.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidQuery,
            format!("limit: must be from 1 to {MAX_PAGE}"),
        ));
    }
    let members = state.presence.view().members(&scope);
    let count = members.len();
    let page: Vec<_> = members
        .into_iter()
        .filter(|member| {
            query
                .after
                .as_deref()
                .is_none_or(|after| member.id.as_str() > after)
        })
        .take(limit + 1)
        .collect();
    let next = (page.len() > limit).then(|| page[limit - 1].id.clone());
    let page = &page[..page.len().min(limit)];
    Ok(HttpResponse::Ok().json(json!({
        "scopeKey": *scope,
        "count": count,
        "members": page,
        "next": next,
    })))
}
