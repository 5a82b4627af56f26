//! The route table: every endpoint the relay serves, in one place, with the
//! extractor settings that give the framework's own errors this API's shape.

use actix_web::web;

use super::{
    admin, catalog, console, cors, inspector, ops, portal, presence, publish, subscribers,
};
use crate::api_error::{ApiError, ErrorCode};

/// The pages the relay serves besides its API, each behind a setting.
#[derive(Debug, Clone, Copy)]
pub struct Pages {
    /// `http.inspector`: the development page at `/inspector`.
    pub inspector: bool,
    /// `http.console`: the operator console at `/console` (which also
    /// needs an admin token, checked per request).
    pub console: bool,
}

/// Registers every route. The pages' routes exist only when their setting
/// is on. No route takes its body through an extractor:
/// handlers read it (`body::read_body`) once they have decided not to
/// refuse the request, under the size limit and the body deadline.
pub fn routes(config: &mut web::ServiceConfig, pages: Pages) {
    config
        .app_data(web::QueryConfig::default().error_handler(|error, _| {
            ApiError::bad_request(ErrorCode::InvalidQuery, error.to_string()).into()
        }))
        // The stream and the publish API share a path; pages of other
        // origins reach both through the CORS middleware.
        .service(
            web::resource("/v1/events")
                .wrap(actix_web::middleware::from_fn(cors::middleware))
                .route(web::get().to(crate::sse::stream_events))
                .route(web::post().to(publish::publish_events))
                .default_service(web::to(super::not_found)),
        )
        .service(
            web::scope("/v1/admin")
                .route("/subscriptions", web::post().to(admin::create_subscription))
                .route("/subscriptions", web::get().to(admin::list_subscriptions))
                .route("/scopes", web::get().to(subscribers::busiest_scopes))
                .route(
                    "/subscriptions/{id}",
                    web::get().to(admin::get_subscription),
                )
                .route(
                    "/subscriptions/{id}",
                    web::patch().to(admin::update_subscription),
                )
                .route(
                    "/subscriptions/{id}",
                    web::delete().to(admin::delete_subscription),
                )
                .route(
                    "/subscriptions/{id}/rotate-secret",
                    web::post().to(admin::rotate_secret),
                )
                .route(
                    "/subscriptions/{id}/pause",
                    web::post().to(admin::pause_subscription),
                )
                .route(
                    "/subscriptions/{id}/resume",
                    web::post().to(admin::resume_subscription),
                )
                .route(
                    "/subscriptions/{id}/redeliver-failed",
                    web::post().to(admin::redeliver_failed),
                )
                .route("/reload", web::post().to(admin::reload))
                .route("/portal-sessions", web::post().to(portal::mint_session))
                .route("/subscribers", web::get().to(subscribers::list))
                .route(
                    "/subscribers/{subscriber}/disconnect",
                    web::post().to(subscribers::disconnect),
                )
                .route("/deliveries", web::get().to(admin::list_deliveries))
                // Registered before `{id}` so `prune` is never taken for an id.
                .route("/deliveries/prune", web::post().to(admin::prune_deliveries))
                .route("/deliveries/{id}", web::get().to(admin::get_delivery))
                .route(
                    "/deliveries/{id}/redeliver",
                    web::post().to(admin::redeliver),
                ),
        )
        .service(
            web::scope("/v1/portal")
                .route("/exchange", web::post().to(portal::exchange))
                .route("/session", web::get().to(portal::session))
                .route("/event-types", web::get().to(portal::event_types))
                .route("/subscriptions", web::get().to(portal::list_subscriptions))
                .route(
                    "/subscriptions",
                    web::post().to(portal::create_subscription),
                )
                .route(
                    "/subscriptions/{id}",
                    web::get().to(portal::get_subscription),
                )
                .route(
                    "/subscriptions/{id}",
                    web::patch().to(portal::update_subscription),
                )
                .route(
                    "/subscriptions/{id}",
                    web::delete().to(portal::delete_subscription),
                )
                .route(
                    "/subscriptions/{id}/rotate-secret",
                    web::post().to(portal::rotate_secret),
                )
                .route(
                    "/subscriptions/{id}/pause",
                    web::post().to(portal::pause_subscription),
                )
                .route(
                    "/subscriptions/{id}/resume",
                    web::post().to(portal::resume_subscription),
                )
                .route(
                    "/subscriptions/{id}/redeliver-failed",
                    web::post().to(portal::redeliver_failed),
                )
                .route(
                    "/subscriptions/{id}/test",
                    web::post().to(portal::send_test),
                )
                .route("/deliveries", web::get().to(portal::list_deliveries))
                .route("/deliveries/{id}", web::get().to(portal::get_delivery))
                .route(
                    "/deliveries/{id}/redeliver",
                    web::post().to(portal::redeliver),
                ),
        )
        .route("/portal", web::get().to(portal::page::index))
        .route("/portal/", web::get().to(portal::page::index))
        .route("/portal/portal.js", web::get().to(portal::page::script))
        .route("/portal/portal.css", web::get().to(portal::page::style))
        .route("/portal/ui.js", web::get().to(portal::page::shared_script))
        .route(
            "/portal/console.css",
            web::get().to(portal::page::console_style),
        )
        .route("/v1/event-types", web::get().to(catalog::event_types))
        .route(
            "/v1/scopes/{scope}/presence",
            web::get().to(presence::members),
        )
        .route("/healthz", web::get().to(ops::healthz))
        .route("/readyz", web::get().to(ops::readyz))
        .route("/metrics", web::get().to(ops::metrics))
        .route("/openapi.json", web::get().to(ops::openapi));
    if pages.console {
        config
            .route("/console", web::get().to(console::page))
            .route("/console/", web::get().to(console::page))
            .route("/console/console.js", web::get().to(console::script))
            .route("/console/ui.js", web::get().to(console::shared_script))
            .route("/console/console.css", web::get().to(console::style));
    }
    if pages.inspector {
        config
            .route("/inspector", web::get().to(inspector::page))
            .route("/inspector/", web::get().to(inspector::page))
            .route(
                "/inspector/eventrelay-client.js",
                web::get().to(inspector::client),
            )
            .route("/inspector/token", web::post().to(inspector::token));
    }
    config.default_service(web::to(super::not_found));
}
