//! `/v1/admin/subscribers` and `/v1/admin/scopes`: who is connected to this
//! relay, in which scopes, and ending a subscriber's streams now.
//!
//! A disconnection is recorded in the database before it is applied here,
//! so every other relay on the schema reads it within a second and ends
//! that subscriber's streams too (see `crate::sse::registry` and the poll
//! in `crate::server`). With `denySecs`, relays also refuse the
//! subscriber's new streams until then: what makes a disconnection stick
//! while the subscriber's tokens are still valid.

use actix_web::{HttpResponse, web};
use chrono::{Duration, Utc};
use serde::Deserialize;
use serde_json::json;

use super::admin::Admin;
use crate::api_error::{ApiError, ErrorCode};
use crate::store::disconnections::Disconnection;

/// The most streams one listing page holds.
const MAX_PAGE: usize = 500;
/// The longest denial: a disconnection is no way to ban for good (revoke
/// the subscriber's credentials for that).
const MAX_DENY_SECS: i64 = 7 * 24 * 3600;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DisconnectQuery {
    scope: Option<String>,
    deny_secs: Option<i64>,
}

/// `POST /v1/admin/subscribers/{subscriber}/disconnect`.
pub async fn disconnect(
    state: Admin,
    subscriber: web::Path<String>,
    query: web::Query<DisconnectQuery>,
) -> Result<HttpResponse, ApiError> {
    let subscriber = subscriber.into_inner();
    let invalid = |message: String| ApiError::bad_request(ErrorCode::InvalidQuery, message);
    if subscriber.is_empty() || subscriber.len() > 200 {
        return Err(invalid("the subscriber id must be 1 to 200 bytes".into()));
    }
    if let Some(scope) = &query.scope {
        eventrelay_wire::validate_scope_key(scope).map_err(|e| invalid(format!("scope: {e}")))?;
    }
    let deny_until = match query.deny_secs {
        None | Some(0) => None,
        Some(secs) if (1..=MAX_DENY_SECS).contains(&secs) => {
            Some(Utc::now() + Duration::seconds(secs))
        }
        Some(_) => {
            return Err(invalid(format!(
                "denySecs must be between 0 and {MAX_DENY_SECS}"
            )));
        }
    };
    let client = state
        .db
        .get()
        .await
        .map_err(|e| ApiError::failed("the database did not answer", &e))?;
    let id = state
        .disconnections
        .insert(&client, &subscriber, query.scope.as_deref(), deny_until)
        .await
        .map_err(|e| ApiError::failed("the disconnection could not be recorded", &e))?;
    let ended = state.streams.apply_recorded(&Disconnection {
        id,
        subscriber_id: subscriber.clone(),
        scope_key: query.scope.clone(),
        deny_until,
    });
    tracing::info!(%subscriber, scope = ?query.scope, ?deny_until, ended, "subscriber disconnected by an operator");
    Ok(HttpResponse::Ok().json(json!({
        "subscriber": subscriber,
        "scopeKey": query.scope,
        "disconnected": ended,
        "relay": state.relay_name,
        "denyUntil": deny_until,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListQuery {
    scope: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/admin/subscribers`: the streams open on this relay, oldest
/// first, a page at a time (`next` is the `after` of the next page).
pub async fn list(state: Admin, query: web::Query<ListQuery>) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidQuery,
            format!("limit must be between 1 and {MAX_PAGE}"),
        ));
    }
    // Empty parameters are no filter, as in the delivery log.
    let after = match query.after.as_deref() {
        None | Some("") => 0,
        Some(after) => after.parse().map_err(|_| {
            ApiError::bad_request(
                ErrorCode::InvalidQuery,
                "after must be a stream id (the previous page's next)",
            )
        })?,
    };
    let scope = query.scope.as_deref().filter(|scope| !scope.is_empty());
    let page = state.streams.list(scope, after, limit);
    let next = (page.len() == limit)
        .then(|| page.last().map(|s| s.id))
        .flatten();
    let streams: Vec<_> = page
        .iter()
        .map(|stream| {
            json!({
                "id": stream.id,
                "subscriber": stream.subscriber,
                "scopeKey": stream.scope_key,
                "scopes": stream.scopes().collect::<Vec<_>>(),
                "connectedAt": stream.connected_at,
                "relay": state.relay_name,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "streams": streams, "next": next })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopesQuery {
    limit: Option<usize>,
}

/// `GET /v1/admin/scopes`: the scopes with the most open streams on this
/// relay. Metrics carry no scope label (their number would grow with the
/// scopes), so this is where an operator finds the busiest.
pub async fn busiest_scopes(
    state: Admin,
    query: web::Query<ScopesQuery>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(10);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidQuery,
            format!("limit must be between 1 and {MAX_PAGE}"),
        ));
    }
    let (scopes, streams) = state.streams.busiest_scopes(limit);
    let scopes: Vec<_> = scopes
        .into_iter()
        .map(|(scope_key, streams)| json!({ "scopeKey": scope_key, "streams": streams }))
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "scopes": scopes,
        "streams": streams,
        "relay": state.relay_name,
    })))
}
