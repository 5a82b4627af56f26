//! Operations endpoints: liveness, readiness, metrics and the OpenAPI
//! document of the HTTP API.

use std::sync::atomic::Ordering;

use actix_web::{HttpResponse, web};
use serde_json::json;

use crate::state::AppState;

/// The process is up.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// The database answers and the listener is connected.
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    // Bounded: a database behind a path that swallows packets must make
    // this answer 503, not hang the probe.
    let check = async {
        let client = state.db.get().await.ok()?;
        client.simple_query("SELECT 1").await.ok()
    };
    let database = tokio::time::timeout(READY_CHECK_TIMEOUT, check)
        .await
        .ok()
        .flatten()
        .is_some();
    let listener = state.listener_connected.load(Ordering::Relaxed);
    let reason = match (database, listener) {
        (true, true) => None,
        (false, _) => Some("the database does not answer"),
        (true, false) => Some(
            "no live LISTEN connection: notifications cannot arrive until it is re-established",
        ),
    };
    match reason {
        None => HttpResponse::Ok().json(json!({"database": database, "listener": listener})),
        Some(reason) => HttpResponse::ServiceUnavailable()
            .json(json!({"database": database, "listener": listener, "reason": reason})),
    }
}

/// How long `/readyz` waits for the database.
const READY_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Prometheus text exposition.
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    // Gauges read from their owners when scraped, not kept up to date.
    let metrics = &state.metrics;
    let pool = state.db.status();
    metrics.database_pool_size.set(pool.size as i64);
    metrics.database_pool_in_use.set(pool.in_use as i64);
    metrics.database_pool_waiting.set(pool.waiting as i64);
    metrics
        .listener_connected
        .set(i64::from(state.listener_connected.load(Ordering::Relaxed)));
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
