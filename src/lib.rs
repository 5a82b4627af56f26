//! eventrelay as a library: the relay service (listener, relay, per-scope
//! hubs, SSE sessions, HTTP API) and its Postgres side (migrations, outbox).
//! An embedding application calls [`server::run`] with its own
//! [`auth::SubscriberResolver`].
//!
//! # Layout
//!
//! - [`actors`]: the actors that move events, one file each with its typed
//!   messages: the listener (LISTEN, through the publisher crate's one
//!   driver), the relay and its per-scope state, the per-scope hub that
//!   fans out and holds the tail (its state behind a lock, in `hub_core`,
//!   so a publish handler can fan a small scope's ephemeral events out on
//!   its own thread).
//! - [`sse`]: the SSE connection: the `GET /v1/events` handler, the session
//!   (the response stream itself), the closed-client check.
//! - [`http`]: the rest of the HTTP API (publish, admin, operations, CORS,
//!   TLS) and its one error type with stable [`api_error::ErrorCode`]s.
//! - [`webhooks`]: the webhook domain: model and rules, store, admin logic,
//!   settings, and the dispatcher actor.
//! - [`store`]: Postgres: the pool, migrations, the outbox read side,
//!   snapshots, the embedded database, and the store's one error.
//! - [`auth`]: who a subscriber is (JWT or forward auth) and what it may see.
//! - [`config`]: the settings, layered and validated; [`group_commit`]: the
//!   publish API's shared transactions; [`catalog`]: the event types of
//!   the schemas directory; [`metrics`]: `/metrics`, with
//!   [`latency`]'s per-stage histograms;
//!   [`memory`]: returning departed connections' memory to the system;
//!   [`secret`]: values that never print; [`server`]: start and stop;
//!   [`telemetry`]: traces over OTLP and the trace context events carry;
//!   [`portal`]: the customer portal's sessions; [`presence`]: who is
//!   connected to a scope, across relays.
//!
//! Dependencies point one way: `config` knows the settings types of the
//! domains it composes (`webhooks`), `sse` builds on `http`'s state and
//! errors, `server` wires everything, and no module imports from one that
//! imports from it. The `eventrelay` command (`src/main.rs`, `src/cli/`) is
//! a thin layer over this library.

pub mod actors;
pub mod api_error;
pub mod auth;
pub mod catalog;
pub mod config;
pub mod group_commit;
pub mod http;
pub mod latency;
pub mod memory;
pub mod metrics;
pub mod portal;
pub mod presence;
pub mod reload;
pub mod secret;
pub mod server;
pub mod sse;
pub mod state;
pub mod store;
pub mod telemetry;
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
