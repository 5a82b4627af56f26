//! The customer portal over HTTP: minting a session (admin), exchanging
//! its one-time code, the `/v1/portal/*` API restricted to the session's
//! scope, and the page at `/portal`.
//!
//! Every `/v1/portal/*` handler takes a [`Portal`] first, which resolves
//! the bearer token to its session before anything else is read. A
//! subscription or delivery of another scope answers 404, as one that does
//! not exist does, so a customer learns nothing of another's. Each action
//! is logged with the session's scope.

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{FromRequest, HttpRequest, HttpResponse, web};
use futures_util::future::LocalBoxFuture;
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use super::admin::{
    Admin, conflict, connection, database_error, deliveries_page, delivery_filter, delivery_id,
    delivery_with_attempts, failed_since, invalid_subscription, json_body, not_found,
    paused_or_resumed, refuse_config_source, requeue_failed, rotated, wake_dispatcher,
};
use crate::api_error::{ApiError, ErrorCode};
use crate::portal::{MAX_SESSION_SECS, PortalSession, Theme};
use crate::state::AppState;
use crate::store::Connection;
use crate::webhooks::{
    Attempt, Delivery, Subscription, SubscriptionPatch, SubscriptionRequest, prepare_subscription,
    validate_subscription, validate_subscription_fields,
};

/// `POST /v1/admin/portal-sessions`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MintRequest {
    scope_key: String,
    expires_in_secs: Option<u32>,
    theme: Option<Theme>,
}

/// Mints a portal session for one scope: its page's address (the code
/// after `#`, which browsers never send to a server), the code, and when
/// the session ends.
pub async fn mint_session(
    state: Admin,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let mint: MintRequest = json_body(payload, &state).await?;
    let config = state.config();
    let invalid = |message: String| ApiError::bad_request(ErrorCode::InvalidBody, message);
    eventrelay_wire::validate_scope_key(&mint.scope_key)
        .map_err(|e| invalid(format!("scopeKey: {e}")))?;
    let longest = config.portal.max_session_secs.min(MAX_SESSION_SECS);
    let secs = mint.expires_in_secs.unwrap_or(3600);
    if secs == 0 || secs > longest {
        return Err(invalid(format!(
            "expiresInSecs: must be from 1 to {longest} (portal.max_session_secs)"
        )));
    }
    if let Some(theme) = &mint.theme {
        theme.check().map_err(invalid)?;
    }
    let conn = connection(&state).await?;
    let minted = state
        .portal
        .mint(&*conn, &mint.scope_key, secs, mint.theme.as_ref())
        .await
        .map_err(database_error)?;
    let base = match &config.portal.base_url {
        Some(base) => base.trim_end_matches('/').to_owned(),
        None => {
            let info = request.connection_info();
            format!("{}://{}", info.scheme(), info.host())
        }
    };
    tracing::info!(scope = %mint.scope_key, expires_at = %minted.expires_at, "portal session minted");
    Ok(HttpResponse::Created().json(json!({
        "url": format!("{base}/portal#code={}", minted.code),
        "code": minted.code,
        "expiresAt": minted.expires_at,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Exchange {
    code: String,
}

/// `POST /v1/portal/exchange`: a one-time code for the session's token.
pub async fn exchange(
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let exchange: Exchange = json_body(payload, &state).await?;
    let conn = connection(&state).await?;
    let (token, session) = state
        .portal
        .exchange(&*conn, exchange.code.trim())
        .await
        .map_err(database_error)?
        .ok_or_else(|| {
            ApiError::unauthorized(
                "this portal link was used already or has expired: ask for a new one",
            )
        })?;
    tracing::info!(scope = %session.scope_key, "portal session opened");
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(json!({ "token": token, "session": session })))
}

/// A request that carries a live portal session's token, resolved before
/// the handler reads anything else.
pub struct Portal {
    state: web::Data<AppState>,
    pub session: PortalSession,
}

impl std::ops::Deref for Portal {
    type Target = AppState;

    fn deref(&self) -> &AppState {
        &self.state
    }
}

impl FromRequest for Portal {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Portal, ApiError>>;

    fn from_request(request: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let state = request.app_data::<web::Data<AppState>>().cloned();
        let token = super::token::bearer(request).map(|t| t.trim().to_owned());
        Box::pin(async move {
            let state = state.ok_or_else(|| ApiError::unavailable("the portal is not set up"))?;
            let token = token.ok_or_else(|| {
                ApiError::unauthorized("send `Authorization: Bearer <portal token>`")
            })?;
            let conn = connection(&state).await?;
            let session = state
                .portal
                .session(&*conn, &token)
                .await
                .map_err(database_error)?
                .ok_or_else(|| {
                    ApiError::unauthorized("this portal session has ended: ask for a new link")
                })?;
            Ok(Portal { state, session })
        })
    }
}

impl Portal {
    fn scope(&self) -> &str {
        &self.session.scope_key
    }

    /// The subscription `id` of this session's scope, or 404.
    async fn subscription(&self, conn: &Connection, id: &str) -> Result<Subscription, ApiError> {
        if validate_subscription(Some(id), None, None).is_err() {
            return Err(not_found("subscription", id));
        }
        self.webhooks
            .get_subscription(&**conn, id)
            .await
            .map_err(database_error)?
            .filter(|s| s.scope_key.as_deref() == Some(self.scope()))
            .ok_or_else(|| not_found("subscription", id))
    }

    /// The delivery `id`, with its attempts, of one of this scope's
    /// subscriptions, or 404.
    async fn delivery(
        &self,
        conn: &Connection,
        id: &str,
    ) -> Result<(Delivery, Vec<Attempt>), ApiError> {
        let found = self
            .webhooks
            .get_delivery(&**conn, delivery_id(id)?)
            .await
            .map_err(database_error)?
            .ok_or_else(|| not_found("delivery", id))?;
        let owned = self
            .webhooks
            .get_subscription(&**conn, &found.0.subscription_id)
            .await
            .map_err(database_error)?
            .is_some_and(|s| s.scope_key.as_deref() == Some(self.scope()));
        match owned {
            true => Ok(found),
            false => Err(not_found("delivery", id)),
        }
    }
}

/// `GET /v1/portal/session`: the scope, the end and the theme.
pub async fn session(portal: Portal) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "session": portal.session }))
}

pub async fn list_subscriptions(portal: Portal) -> Result<HttpResponse, ApiError> {
    let conn = connection(&portal).await?;
    let subscriptions: Vec<Subscription> = portal
        .webhooks
        .list_subscriptions(&*conn)
        .await
        .map_err(database_error)?
        .into_iter()
        .filter(|s| s.scope_key.as_deref() == Some(portal.scope()))
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "subscriptions": subscriptions })))
}

/// What a customer sets on an endpoint: where, and which events. The
/// scope is the session's, the secret is generated (and shown once), and
/// the id is chosen here, so no answer says whether another scope uses it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortalEndpoint {
    url: String,
    types: Option<Vec<String>>,
}

pub async fn create_subscription(
    portal: Portal,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let endpoint: PortalEndpoint = json_body(payload, &portal).await?;
    let new = prepare_subscription(SubscriptionRequest {
        id: format!("ep_{}", &Uuid::new_v4().simple().to_string()[..20]),
        url: endpoint.url,
        types: endpoint.types,
        scope_key: Some(portal.scope().to_owned()),
        ..SubscriptionRequest::default()
    })
    .map_err(invalid_subscription)?;
    let conn = connection(&portal).await?;
    let created = portal
        .webhooks
        .create_subscription(&*conn, &new)
        .await
        .map_err(database_error)?
        .ok_or_else(|| conflict("an endpoint with this id exists already; try again"))?;
    tracing::info!(scope = %portal.scope(), subscription = %created.id, "portal: endpoint created");
    Ok(HttpResponse::Created()
        .insert_header((
            header::LOCATION,
            format!("/v1/portal/subscriptions/{}", created.id),
        ))
        .json(json!({"subscription": created, "secret": new.secret})))
}

pub async fn get_subscription(
    portal: Portal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let conn = connection(&portal).await?;
    let subscription = portal.subscription(&conn, &id).await?;
    Ok(HttpResponse::Ok().json(json!({ "subscription": subscription })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortalEndpointChange {
    url: Option<String>,
    types: Option<Vec<String>>,
}

pub async fn update_subscription(
    portal: Portal,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let change: PortalEndpointChange = json_body(payload, &portal).await?;
    validate_subscription(None, change.url.as_deref(), change.types.as_deref())
        .and_then(|()| {
            validate_subscription_fields(change.url.as_deref(), change.types.as_deref(), None, None)
        })
        .map_err(invalid_subscription)?;
    let conn = connection(&portal).await?;
    refuse_config_source(&portal.subscription(&conn, &id).await?)?;
    let patch = SubscriptionPatch {
        url: change.url,
        types: change.types,
        ..SubscriptionPatch::default()
    };
    let updated = portal
        .webhooks
        .update_subscription(&*conn, &id, &patch)
        .await
        .map_err(database_error)?
        .ok_or_else(|| not_found("subscription", &id))?;
    tracing::info!(scope = %portal.scope(), subscription = %id, "portal: endpoint changed");
    Ok(HttpResponse::Ok().json(json!({ "subscription": updated })))
}

pub async fn delete_subscription(
    portal: Portal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let conn = connection(&portal).await?;
    refuse_config_source(&portal.subscription(&conn, &id).await?)?;
    portal
        .webhooks
        .delete_subscription(&*conn, &id)
        .await
        .map_err(database_error)?;
    tracing::info!(scope = %portal.scope(), subscription = %id, "portal: endpoint deleted");
    Ok(HttpResponse::NoContent().finish())
}

pub async fn rotate_secret(
    portal: Portal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let conn = connection(&portal).await?;
    refuse_config_source(&portal.subscription(&conn, &id).await?)?;
    let answer = rotated(&portal, &conn, &id).await?;
    tracing::info!(scope = %portal.scope(), subscription = %id, "portal: secret rotated");
    Ok(answer)
}

async fn set_paused(portal: Portal, id: &str, paused: bool) -> Result<HttpResponse, ApiError> {
    let conn = connection(&portal).await?;
    portal.subscription(&conn, id).await?;
    let answer = paused_or_resumed(&portal, &conn, id, paused).await?;
    tracing::info!(scope = %portal.scope(), subscription = %id, paused, "portal: endpoint paused or resumed");
    Ok(answer)
}

pub async fn pause_subscription(
    portal: Portal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    set_paused(portal, &id, true).await
}

pub async fn resume_subscription(
    portal: Portal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    set_paused(portal, &id, false).await
}

pub async fn redeliver_failed(
    portal: Portal,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let since = failed_since(payload, &portal).await?;
    let conn = connection(&portal).await?;
    portal.subscription(&conn, &id).await?;
    let redelivered = requeue_failed(&portal, &conn, &id, since).await?;
    tracing::info!(scope = %portal.scope(), subscription = %id, redelivered, "portal: failed deliveries sent again");
    Ok(HttpResponse::Ok().json(json!({ "redelivered": redelivered })))
}

/// `POST /v1/portal/subscriptions/{id}/test`: an `eventrelay.test` event
/// to this endpoint only.
pub async fn send_test(portal: Portal, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let conn = connection(&portal).await?;
    let subscription = portal.subscription(&conn, &id).await?;
    let delivery = portal
        .webhooks
        .send_test(&*conn, &subscription, portal.scope())
        .await
        .map_err(database_error)?;
    wake_dispatcher(&portal);
    tracing::info!(scope = %portal.scope(), subscription = %id, delivery, "portal: test event sent");
    delivery_with_attempts(&portal, &conn, &delivery.to_string())
        .await
        .map(|response| with_status(response, StatusCode::ACCEPTED))
}

fn with_status(mut response: HttpResponse, status: StatusCode) -> HttpResponse {
    *response.status_mut() = status;
    response
}

/// `GET /v1/portal/deliveries`: the admin listing's filters, over this
/// scope's subscriptions only.
pub async fn list_deliveries(
    portal: Portal,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let mut filter = delivery_filter(request.query_string())?;
    filter.subscriptions_of_scope = Some(portal.scope().to_owned());
    deliveries_page(&portal, &filter).await
}

pub async fn get_delivery(portal: Portal, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let conn = connection(&portal).await?;
    let (delivery, attempts) = portal.delivery(&conn, &id).await?;
    Ok(HttpResponse::Ok().json(json!({"delivery": delivery, "attempts": attempts})))
}

pub async fn redeliver(portal: Portal, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let conn = connection(&portal).await?;
    let (delivery, _) = portal.delivery(&conn, &id).await?;
    portal
        .webhooks
        .redeliver(&*conn, delivery.id)
        .await
        .map_err(database_error)?;
    wake_dispatcher(&portal);
    tracing::info!(scope = %portal.scope(), delivery = delivery.id, "portal: delivery sent again");
    delivery_with_attempts(&portal, &conn, &id).await
}

/// `GET /v1/portal/event-types`: the event catalog, to choose types from.
pub async fn event_types(portal: Portal) -> HttpResponse {
    HttpResponse::Ok().json(&*portal.catalog)
}

/// The page: plain files built into the binary, under a policy that lets
/// them reach nothing but this relay, and lets only
/// `portal.allowed_frame_origins` frame them.
pub mod page {
    use actix_web::{HttpResponse, web};

    use crate::state::AppState;

    const PAGE: &str = include_str!("portal/index.html");
    const SCRIPT: &str = include_str!("portal/portal.js");
    const STYLE: &str = include_str!("portal/portal.css");
    /// The console's stylesheet, which the portal's builds on.
    const CONSOLE_STYLE: &str = include_str!("console/console.css");

    fn asset(state: &AppState, content_type: &str, body: &'static str) -> HttpResponse {
        let origins = &state.config().portal.allowed_frame_origins;
        let ancestors = match origins.is_empty() {
            true => "'none'".to_owned(),
            false => origins.join(" "),
        };
        HttpResponse::Ok()
            .content_type(content_type)
            .insert_header(("cache-control", "no-store"))
            .insert_header((
                "content-security-policy",
                format!(
                    "default-src 'none'; script-src 'self'; style-src 'self'; \
                     connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                     form-action 'none'; frame-ancestors {ancestors}"
                ),
            ))
            .insert_header(("x-content-type-options", "nosniff"))
            .insert_header(("referrer-policy", "no-referrer"))
            .body(body)
    }

    pub async fn index(state: web::Data<AppState>) -> HttpResponse {
        asset(&state, "text/html; charset=utf-8", PAGE)
    }

    pub async fn script(state: web::Data<AppState>) -> HttpResponse {
        asset(&state, "text/javascript; charset=utf-8", SCRIPT)
    }

    pub async fn style(state: web::Data<AppState>) -> HttpResponse {
        asset(&state, "text/css; charset=utf-8", STYLE)
    }

    pub async fn shared_script(state: web::Data<AppState>) -> HttpResponse {
        asset(
            &state,
            "text/javascript; charset=utf-8",
            crate::http::console::SHARED_SCRIPT,
        )
    }

    pub async fn console_style(state: web::Data<AppState>) -> HttpResponse {
        asset(&state, "text/css; charset=utf-8", CONSOLE_STYLE)
    }
}
