//! `/v1/admin/*`: webhook subscriptions and the delivery log, for operators.
//!
//! Every endpoint needs `Authorization: Bearer <admin.token>`; without a
//! configured token the whole API answers 403, so an install that never asked
//! for it exposes nothing. Secrets are shown exactly once, in the answer that
//! created them (create, rotate); listings never carry them.
//!
//! Bodies and queries are parsed inside the handlers, after the token check,
//! so an unauthenticated caller learns nothing about what a valid request
//! looks like, and every refusal has this API's error shape.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::http::header;
use std::future::{Ready, ready};

use actix_web::{FromRequest, HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use uuid::Uuid;

use super::body::read_body;
use super::token::Guard;
use crate::api_error::{ApiError, ErrorCode};
use crate::reload::ReloadError;
use crate::state::AppState;
use crate::store::{Connection, StoreError};
use crate::webhooks::{
    DeliveriesDue, DeliveryFilter, DeliveryStatus, InvalidSubscription, MAX_PAGE, Subscription,
    SubscriptionPatch, SubscriptionRequest, check_max_per_second, check_ordering_max_block,
    ensure_changeable, generate_secret, prepare_subscription, validate_subscription,
    validate_subscription_fields,
};

const ADMIN: Guard = Guard {
    setting: "admin.token",
    disabled_code: ErrorCode::AdminDisabled,
    name: "admin token",
};

/// A request that carries the admin token. Every admin handler takes one as
/// its first argument, so none can forget the check, and the check runs
/// before the body or the query is read.
pub struct Admin(web::Data<AppState>);

impl std::ops::Deref for Admin {
    type Target = AppState;

    fn deref(&self) -> &AppState {
        &self.0
    }
}

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Ready<Result<Admin, ApiError>>;

    fn from_request(request: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let Some(state) = request.app_data::<web::Data<AppState>>().cloned() else {
            return ready(Err(ApiError::unavailable("the admin API is not set up")));
        };
        ready(
            ADMIN
                .check(request, state.config().admin.token.as_deref())
                .map(|()| Admin(state)),
        )
    }
}

pub(super) async fn connection(state: &AppState) -> Result<Connection, ApiError> {
    state.db.get().await.map_err(|e| database_error(e.into()))
}

pub(super) fn database_error(error: StoreError) -> ApiError {
    ApiError::failed("the database did not answer", &error)
}

/// Reads the request body under the configured size limit and parses it.
pub(super) async fn json_body<T: DeserializeOwned>(
    payload: web::Payload,
    state: &AppState,
) -> Result<T, ApiError> {
    let body = read_body(payload, &state.config().http).await?;
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(ErrorCode::InvalidBody, format!("invalid body: {e}")))
}

pub(super) fn not_found(what: &str, id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        format!("no {what} {id:?}"),
    )
}

pub(super) fn conflict(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, message)
}

/// A subscription field that breaks a rule: 400 `invalid_body`, or
/// `weak_secret` for a secret too short to sign with.
pub(super) fn invalid_subscription(error: InvalidSubscription) -> ApiError {
    let code = match error.weak_secret {
        true => ErrorCode::WeakSecret,
        false => ErrorCode::InvalidBody,
    };
    ApiError::bad_request(code, error.to_string())
}

pub(super) fn refuse_config_source(subscription: &Subscription) -> Result<(), ApiError> {
    ensure_changeable(subscription).map_err(|e| conflict(e.to_string()))
}

pub async fn create_subscription(
    state: Admin,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    // Like [`NewSubscription`], with the secret optional (one is generated
    // when absent).
    let create: SubscriptionRequest = json_body(payload, &state).await?;
    let new = prepare_subscription(create).map_err(invalid_subscription)?;
    let conn = connection(&state).await?;
    let created = state
        .webhooks
        .create_subscription(&*conn, &new)
        .await
        .map_err(database_error)?
        .ok_or_else(|| conflict(format!("a subscription {:?} already exists", new.id)))?;
    Ok(HttpResponse::Created()
        .insert_header((
            header::LOCATION,
            format!("/v1/admin/subscriptions/{}", created.id),
        ))
        .json(json!({"subscription": created, "secret": new.secret})))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListSubscriptions {
    /// Adds each subscription's `health`: a few more index reads per
    /// subscription, so only on request.
    #[serde(default)]
    health: bool,
}

pub async fn list_subscriptions(
    state: Admin,
    query: web::Query<ListSubscriptions>,
) -> Result<HttpResponse, ApiError> {
    let conn = connection(&state).await?;
    let store = &state.webhooks;
    let subscriptions = match query.health {
        true => json!(
            store
                .list_subscriptions_with_health(&*conn)
                .await
                .map_err(database_error)?
        ),
        false => json!(
            store
                .list_subscriptions(&*conn)
                .await
                .map_err(database_error)?
        ),
    };
    Ok(HttpResponse::Ok().json(json!({ "subscriptions": subscriptions })))
}

/// `POST /v1/admin/subscriptions/{id}/pause` and `/resume`. Pausing is an
/// operator's state, not configuration, so subscriptions from the
/// configuration can be paused too, and a reload leaves the pause alone.
async fn set_paused(state: Admin, id: &str, paused: bool) -> Result<HttpResponse, ApiError> {
    let conn = connection(&state).await?;
    existing_subscription(&state, &conn, id).await?;
    let answer = paused_or_resumed(&state, &conn, id, paused).await?;
    tracing::info!(subscription = %id, paused, "webhook subscription paused or resumed by an operator");
    Ok(answer)
}

/// Pauses or resumes an existing subscription (the caller checked it may),
/// and answers it.
pub(super) async fn paused_or_resumed(
    state: &AppState,
    conn: &Connection,
    id: &str,
    paused: bool,
) -> Result<HttpResponse, ApiError> {
    let subscription = state
        .webhooks
        .set_paused(&**conn, id, paused)
        .await
        .map_err(database_error)?
        .ok_or_else(|| not_found("subscription", id))?;
    if !paused {
        wake_dispatcher(state);
    }
    Ok(HttpResponse::Ok().json(json!({ "subscription": subscription })))
}

pub async fn pause_subscription(
    state: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    set_paused(state, &id, true).await
}

pub async fn resume_subscription(
    state: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    set_paused(state, &id, false).await
}

/// The dispatcher may be asleep until its next known due time; whatever
/// was just put back in the queue is due now.
pub(super) fn wake_dispatcher(state: &AppState) {
    if let Some(dispatcher) = &state.dispatcher {
        dispatcher.do_send(DeliveriesDue);
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RedeliverFailed {
    /// Text, so that a malformed time gets a message naming the field.
    since: String,
}

/// The `since` of a redeliver-failed body.
pub(super) async fn failed_since(
    payload: web::Payload,
    state: &AppState,
) -> Result<DateTime<Utc>, ApiError> {
    let request: RedeliverFailed = json_body(payload, state).await?;
    DateTime::parse_from_rfc3339(&request.since)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            ApiError::bad_request(
                ErrorCode::InvalidBody,
                format!("since: not an RFC 3339 time: {e}"),
            )
        })
}

/// `POST /v1/admin/subscriptions/{id}/redeliver-failed`: every dead
/// delivery of the subscription created since `since` is queued again.
pub async fn redeliver_failed(
    state: Admin,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let since = failed_since(payload, &state).await?;
    let conn = connection(&state).await?;
    existing_subscription(&state, &conn, &id).await?;
    let redelivered = requeue_failed(&state, &conn, &id, since).await?;
    tracing::info!(subscription = %id, %since, redelivered, "failed webhook deliveries queued again by an operator");
    Ok(HttpResponse::Ok().json(json!({ "redelivered": redelivered })))
}

/// Queues an existing subscription's dead deliveries since `since` again.
pub(super) async fn requeue_failed(
    state: &AppState,
    conn: &Connection,
    id: &str,
    since: DateTime<Utc>,
) -> Result<u64, ApiError> {
    let redelivered = state
        .webhooks
        .redeliver_failed(&**conn, id, since)
        .await
        .map_err(database_error)?;
    if redelivered > 0 {
        wake_dispatcher(state);
    }
    Ok(redelivered)
}

async fn existing_subscription(
    state: &AppState,
    conn: &Connection,
    id: &str,
) -> Result<Subscription, ApiError> {
    // The configuration and this API both refuse other ids, so no
    // subscription has one; asking the database could only fail (NUL).
    if validate_subscription(Some(id), None, None).is_err() {
        return Err(not_found("subscription", id));
    }
    state
        .webhooks
        .get_subscription(&**conn, id)
        .await
        .map_err(database_error)?
        .ok_or_else(|| not_found("subscription", id))
}

pub async fn get_subscription(
    state: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let conn = connection(&state).await?;
    let subscription = existing_subscription(&state, &conn, &id).await?;
    Ok(HttpResponse::Ok().json(json!({ "subscription": subscription })))
}

pub async fn update_subscription(
    state: Admin,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let patch: SubscriptionPatch = json_body(payload, &state).await?;
    validate_subscription(None, patch.url.as_deref(), patch.types.as_deref())
        .map_err(invalid_subscription)?;
    let scope_key = patch.scope_key.clone().flatten();
    validate_subscription_fields(
        patch.url.as_deref(),
        patch.types.as_deref(),
        scope_key.as_deref(),
        None,
    )
    .and_then(|()| check_max_per_second(patch.max_per_second.flatten()))
    .and_then(|()| check_ordering_max_block(patch.ordering_max_block_secs.flatten()))
    .map_err(invalid_subscription)?;
    let conn = connection(&state).await?;
    refuse_config_source(&existing_subscription(&state, &conn, &id).await?)?;
    let updated = state
        .webhooks
        .update_subscription(&*conn, &id, &patch)
        .await
        .map_err(database_error)?
        .ok_or_else(|| not_found("subscription", &id))?;
    Ok(HttpResponse::Ok().json(json!({ "subscription": updated })))
}

pub async fn delete_subscription(
    state: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let conn = connection(&state).await?;
    refuse_config_source(&existing_subscription(&state, &conn, &id).await?)?;
    let deleted = state
        .webhooks
        .delete_subscription(&*conn, &id)
        .await
        .map_err(database_error)?;
    if !deleted {
        return Err(not_found("subscription", &id));
    }
    Ok(HttpResponse::NoContent().finish())
}

pub async fn rotate_secret(state: Admin, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let conn = connection(&state).await?;
    refuse_config_source(&existing_subscription(&state, &conn, &id).await?)?;
    rotated(&state, &conn, &id).await
}

/// Gives an existing subscription (the caller checked it may be changed) a
/// new secret, and answers it, shown this once.
pub(super) async fn rotated(
    state: &AppState,
    conn: &Connection,
    id: &str,
) -> Result<HttpResponse, ApiError> {
    let secret = generate_secret();
    let grace = Duration::from_secs(state.config().webhooks.rotation_grace_secs);
    let rotated = state
        .webhooks
        .rotate_secret(&**conn, id, &secret, grace)
        .await
        .map_err(database_error)?
        .ok_or_else(|| not_found("subscription", id))?;
    Ok(HttpResponse::Ok().json(json!({
        "previousSecretExpiresAt": rotated.previous_secret_expires_at,
        "subscription": rotated,
        "secret": secret,
    })))
}

/// The listing's query string. Everything arrives as text so that an empty
/// parameter means "no filter" and a malformed one gets a message naming it
/// (an unknown status, the statuses there are).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DeliveryQuery {
    scope_key: Option<String>,
    status: Option<String>,
    event_id: Option<String>,
    subscription_id: Option<String>,
    event_type: Option<String>,
    since: Option<String>,
    until: Option<String>,
    before: Option<String>,
    limit: Option<String>,
}

/// Default page size when `limit` is absent.
const DEFAULT_PAGE: i64 = 100;

pub(super) fn delivery_filter(query_string: &str) -> Result<DeliveryFilter, ApiError> {
    let invalid = |message: String| ApiError::bad_request(ErrorCode::InvalidQuery, message);
    let query = web::Query::<DeliveryQuery>::from_query(query_string)
        .map_err(|e| invalid(e.to_string()))?
        .into_inner();
    let given = |value: Option<String>| value.filter(|v| !v.is_empty());
    for (name, value) in [
        ("scopeKey", &query.scope_key),
        ("subscriptionId", &query.subscription_id),
        ("eventType", &query.event_type),
    ] {
        if value
            .as_deref()
            .is_some_and(|v| v.chars().any(char::is_control))
        {
            return Err(invalid(format!(
                "{name}: must not contain control characters"
            )));
        }
    }
    let status = given(query.status)
        .map(|v| v.parse::<DeliveryStatus>())
        .transpose()
        .map_err(|e| invalid(format!("status: {e}")))?;
    let event_id = given(query.event_id)
        .map(|v| v.parse::<Uuid>())
        .transpose()
        .map_err(|e| invalid(format!("eventId: not a UUID: {e}")))?;
    let time = |name: &str, value: Option<String>| {
        given(value)
            .map(|v| DateTime::parse_from_rfc3339(&v).map(|t| t.with_timezone(&Utc)))
            .transpose()
            .map_err(|e| invalid(format!("{name}: not an RFC 3339 time: {e}")))
    };
    let since = time("since", query.since)?;
    let until = time("until", query.until)?;
    let before = given(query.before)
        .map(|v| v.parse::<i64>())
        .transpose()
        .map_err(|_| invalid("before: must be a delivery id (an integer)".into()))?;
    let limit = match given(query.limit) {
        None => DEFAULT_PAGE,
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| invalid(format!("limit: must be an integer from 1 to {MAX_PAGE}")))?,
    };
    Ok(DeliveryFilter {
        scope_key: given(query.scope_key),
        status,
        event_id,
        subscription_id: given(query.subscription_id),
        event_type: given(query.event_type),
        since,
        until,
        before,
        limit: Some(limit),
        subscriptions_of_scope: None,
    })
}

pub async fn list_deliveries(state: Admin, request: HttpRequest) -> Result<HttpResponse, ApiError> {
    let filter = delivery_filter(request.query_string())?;
    deliveries_page(&state, &filter).await
}

/// One page of the delivery log, with the cursor of the next.
pub(super) async fn deliveries_page(
    state: &AppState,
    filter: &DeliveryFilter,
) -> Result<HttpResponse, ApiError> {
    let conn = connection(state).await?;
    let deliveries = state
        .webhooks
        .list_deliveries(&*conn, filter)
        .await
        .map_err(database_error)?;
    // A full page may have more behind it; a short one is the end.
    let next_before = match filter.limit {
        Some(limit) if deliveries.len() as i64 == limit => deliveries.last().map(|d| d.id),
        _ => None,
    };
    Ok(HttpResponse::Ok().json(json!({"deliveries": deliveries, "nextBefore": next_before})))
}

pub(super) fn delivery_id(id: &str) -> Result<i64, ApiError> {
    // No delivery has an id that is not an integer, so this is a miss, not
    // a malformed request.
    id.parse().map_err(|_| not_found("delivery", id))
}

pub(super) async fn delivery_with_attempts(
    state: &AppState,
    conn: &Connection,
    id: &str,
) -> Result<HttpResponse, ApiError> {
    let (delivery, attempts) = state
        .webhooks
        .get_delivery(&**conn, delivery_id(id)?)
        .await
        .map_err(database_error)?
        .ok_or_else(|| not_found("delivery", id))?;
    Ok(HttpResponse::Ok().json(json!({"delivery": delivery, "attempts": attempts})))
}

pub async fn get_delivery(state: Admin, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let conn = connection(&state).await?;
    delivery_with_attempts(&state, &conn, &id).await
}

pub async fn redeliver(state: Admin, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let conn = connection(&state).await?;
    let found = state
        .webhooks
        .redeliver(&*conn, delivery_id(&id)?)
        .await
        .map_err(database_error)?;
    if !found {
        return Err(not_found("delivery", &id));
    }
    wake_dispatcher(&state);
    delivery_with_attempts(&state, &conn, &id).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Prune {
    before: DateTime<Utc>,
}

pub async fn prune_deliveries(
    state: Admin,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let prune: Prune = json_body(payload, &state).await?;
    let conn = connection(&state).await?;
    let pruned = state
        .webhooks
        .prune_deliveries(&*conn, prune.before)
        .await
        .map_err(database_error)?;
    Ok(HttpResponse::Ok().json(json!({ "pruned": pruned })))
}

/// `POST /v1/admin/reload`: reads the configuration again and applies the
/// live settings (see [`crate::reload`]). A configuration that fails
/// validation is refused with 422 and the one in force stays.
pub async fn reload(state: Admin) -> Result<HttpResponse, ApiError> {
    let Some(handle) = &state.reload else {
        return Err(conflict(ReloadError::NotSetUp.to_string()));
    };
    match handle.reload().await {
        Ok(report) => Ok(HttpResponse::Ok().json(&report)),
        Err(error) => Err(match &*error {
            ReloadError::Config(_) | ReloadError::LogLevel(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::InvalidConfig,
                format!("{error}; the configuration in force stays"),
            ),
            ReloadError::NotSetUp => conflict(error.to_string()),
            ReloadError::Subscriptions(_) => {
                ApiError::failed("the webhook subscriptions could not be written", &*error)
            }
            ReloadError::Stopping => ApiError::unavailable(error.to_string()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_queries_treat_empty_as_absent_and_name_what_is_wrong() {
        let filter = delivery_filter("scopeKey=&status=dead&limit=5&before=9").unwrap();
        assert_eq!(filter.scope_key, None);
        assert_eq!(filter.status, Some(DeliveryStatus::Dead));
        assert_eq!((filter.limit, filter.before), (Some(5), Some(9)));
        assert_eq!(delivery_filter("").unwrap().limit, Some(DEFAULT_PAGE));
        let error = delivery_filter("status=lost").unwrap_err();
        assert_eq!(error.code, "invalid_query");
        assert!(
            error.message.contains("pending, delivered, dead, gone"),
            "{}",
            error.message
        );
        for bad in [
            "status=DEAD",
            "status=dead&status=gone",
            "eventId=x",
            "before=x",
            "limit=0",
            "limit=501",
            "color=red",
        ] {
            assert_eq!(
                delivery_filter(bad).unwrap_err().code,
                "invalid_query",
                "{bad}"
            );
        }
    }

    /// The OpenAPI document spells the statuses twice (the listing's filter
    /// and a delivery's `status`) and the outcomes once; each list must be
    /// the enum's, in its order.
    #[test]
    fn the_openapi_document_lists_exactly_the_statuses_and_outcomes() {
        use crate::webhooks::AttemptOutcome;
        use strum::IntoEnumIterator;

        let document: serde_json::Value =
            serde_json::from_str(include_str!("openapi.json")).unwrap();
        let names = |list: &serde_json::Value| -> Vec<String> {
            list.as_array()
                .unwrap()
                .iter()
                .map(|name| name.as_str().unwrap().to_owned())
                .collect()
        };
        let filter = document["paths"]["/v1/admin/deliveries"]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|parameter| parameter["name"] == "status")
            .unwrap();
        let schemas = &document["components"]["schemas"];
        let statuses: Vec<String> = DeliveryStatus::iter().map(|s| s.to_string()).collect();
        let outcomes: Vec<String> = AttemptOutcome::iter().map(|o| o.to_string()).collect();
        assert_eq!(names(&filter["schema"]["enum"]), statuses);
        assert_eq!(
            names(&schemas["Delivery"]["properties"]["status"]["enum"]),
            statuses
        );
        assert_eq!(
            names(&schemas["Attempt"]["properties"]["outcome"]["enum"]),
            outcomes
        );
    }
}
