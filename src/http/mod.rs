//! The HTTP API (actix-web): the SSE stream, the publish API and the
//! operations endpoints, over one shared application state.

pub mod admin;
pub mod body;
pub mod cors;
pub mod error;
pub mod inspector;
pub mod ops;
pub mod publish;
pub mod tls;
pub mod token;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use actix::Addr;
use actix_web::web;

use crate::actors::Relay;
use crate::auth::SubscriberResolver;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::{Database, Outbox};
use error::{ApiError, ErrorCode};

/// What every handler can reach.
pub struct AppState {
    /// The configuration in force, with the live settings of the last
    /// reload; read it once per request with [`AppState::config`].
    pub config: crate::reload::LiveConfig,
    /// Asks the service to reload its configuration, when it can.
    pub reload: Option<crate::reload::ReloadHandle>,
    pub relay: Addr<Relay>,
    pub resolver: Arc<dyn SubscriberResolver>,
    pub db: Database,
    pub outbox: Outbox,
    /// Writes publish requests, in groups when group commit is on.
    pub publishing: crate::group_commit::Publishing,
    pub metrics: Arc<Metrics>,
    pub listener_connected: Arc<AtomicBool>,
    /// The webhook subscriptions and delivery log, for the admin API.
    pub webhooks: crate::webhooks::WebhookStore,
    /// The webhook dispatcher, when it runs on this replica (a redelivery
    /// tells it that a delivery is due).
    pub dispatcher: Option<Addr<crate::webhooks::Dispatcher>>,
    /// Set in development mode only, for the inspector's token minting.
    pub development_secret: Option<crate::secret::Secret>,
    /// Which other origins' pages may read `/v1/events`.
    pub cors: Arc<cors::CorsPolicy>,
    /// Turns true when the service starts stopping: every stream then ends
    /// cleanly, so clients reconnect (to another replica) at once.
    pub closing: tokio::sync::watch::Receiver<bool>,
}

impl AppState {
    /// The configuration in force now.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.config.borrow())
    }
}

/// Registers every route.
pub fn routes(config: &mut web::ServiceConfig) {
    config
        .app_data(web::QueryConfig::default().error_handler(|error, _| {
            ApiError::bad_request(ErrorCode::InvalidQuery, error.to_string()).into()
        }))
        // JSON bodies read by the extractor (the inspector's token form) get
        // this API's error shape too, not the framework's plain text.
        .app_data(web::JsonConfig::default().error_handler(|error, _| {
            use actix_web::error::JsonPayloadError;
            match error {
                JsonPayloadError::Overflow { .. }
                | JsonPayloadError::OverflowKnownLength { .. } => ApiError::new(
                    actix_web::http::StatusCode::PAYLOAD_TOO_LARGE,
                    ErrorCode::PayloadTooLarge,
                    error.to_string(),
                ),
                _ => ApiError::bad_request(ErrorCode::InvalidBody, error.to_string()),
            }
            .into()
        }))
        .route("/healthz", web::get().to(ops::healthz))
        .route("/readyz", web::get().to(ops::readyz))
        .route("/metrics", web::get().to(ops::metrics))
        .route("/openapi.json", web::get().to(ops::openapi))
        .configure(admin::routes)
        .default_service(web::to(not_found));
}

/// Any path (or method of `/v1/events`) the API does not have.
pub async fn not_found() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::new(
        actix_web::http::StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        "no such endpoint",
    ))
}
