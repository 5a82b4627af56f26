//! Operations endpoints: liveness, readiness, metrics and the OpenAPI
//! document of the HTTP API.

use std::sync::atomic::Ordering;

use actix_web::{HttpResponse, web};
use serde_json::json;

use super::AppState;

/// The process is up.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// The database answers and the listener is connected.
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let database = match state.db.get().await {
        Ok(client) => client.simple_query("SELECT 1").await.is_ok(),
        Err(_) => false,
    };
    let listener = state.listener_connected.load(Ordering::Relaxed);
    let body = json!({"database": database, "listener": listener});
    if database && listener {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// Prometheus text exposition.
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(state.metrics.render())
}

/// The OpenAPI 3.1 description of this API, kept next to the handlers and
/// checked against the router by a test.
pub const OPENAPI: &str = include_str!("openapi.json");

pub async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI)
}
