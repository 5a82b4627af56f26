//! eventrelay as a library: the relay service (listener, relay, per-scope
//! hubs, SSE sessions, HTTP API) and its Postgres side (migrations, outbox).
//! An embedding application calls [`server::run`] with its own
//! [`auth::SubscriberResolver`].

pub mod actors;
pub mod auth;
pub mod config;
pub mod group_commit;
pub mod http;
pub mod metrics;
pub mod secret;
pub mod server;
pub mod sse;
pub mod store;
pub mod webhooks;

pub use eventrelay_publisher as publisher;
pub use eventrelay_wire as wire;

/// Opens one Postgres connection and drives it on the current runtime.
pub async fn connect(
    database_url: &str,
) -> Result<tokio_postgres::Client, eventrelay_publisher::ConnectError> {
    eventrelay_publisher::PgConnectOptions::parse(database_url)?
        .with_tcp(eventrelay_publisher::TcpSettings::default())
        .connect()
        .await
}
