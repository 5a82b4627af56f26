//! `GET /v1/event-types`: the event catalog (see [`crate::catalog`]), for
//! whoever holds the admin token or the publish token.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};

use super::token::Guard;
use crate::api_error::{ApiError, ErrorCode};
use crate::state::AppState;

const ADMIN: Guard = Guard {
    setting: "admin.token",
    disabled_code: ErrorCode::CatalogDisabled,
    name: "admin token",
};

const PUBLISH: Guard = Guard {
    setting: "publish.token",
    disabled_code: ErrorCode::CatalogDisabled,
    name: "publish token",
};

pub async fn event_types(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let config = state.config();
    let admin = config.admin.token.as_deref();
    let publish = config.publish.token.as_deref();
    if admin.is_none() && publish.is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::CatalogDisabled,
            "the event catalog is off: set admin.token or publish.token to read it",
        ));
    }
    let admitted = [(ADMIN, admin), (PUBLISH, publish)]
        .into_iter()
        .filter(|(_, token)| token.is_some())
        .any(|(guard, token)| guard.check(&request, token).is_ok());
    if !admitted {
        return Err(ApiError::unauthorized(
            "send `Authorization: Bearer <admin token or publish token>`",
        ));
    }
    Ok(HttpResponse::Ok().json(&*state.catalog))
}
