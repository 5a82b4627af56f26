//! Emit eventrelay events inside your own Postgres transaction.
//!
//! ```no_run
//! # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use eventrelay_publisher::{NewEvent, Publisher};
//! use serde_json::json;
//!
//! let publisher = Publisher::new("eventrelay")?;
//! let tx = client.transaction().await?;
//! tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[]).await?;
//! publisher
//!     .emit(&tx, NewEvent::durable("order.paid", "org-1", json!({"orderId": 42})))
//!     .await?;
//! tx.commit().await?; // the row and its notification become visible together
//! # Ok(()) }
//! ```
//!
//! The tables and SQL functions come from the migrations the `eventrelay`
//! service applies (`eventrelay migrate`).
//!
//! # Layout
//!
//! - [`Publisher`] (`publisher.rs`): `emit` and `emit_batch` in the caller's
//!   transaction, through any [`PgExecutor`] (tokio-postgres, deadpool,
//!   sqlx behind the `sqlx` feature), and `emit_batch_committed`, a batch in
//!   its own pipelined transaction; [`SchemaRegistry`] validates data
//!   against per-type JSON Schemas. An event continues the trace of its
//!   W3C `traceparent`, or of the current `tracing` span behind the
//!   `tracing-opentelemetry` feature.
//! - [`connect`]: connections from a URL with libpq's TLS settings and TCP
//!   keepalive; [`listen`]: the one LISTEN driver (bounded start-up, health
//!   check after silence), used by the service and by [`broadcast`].
//! - [`broadcast`]: typed channels over plain `NOTIFY`, with their own
//!   reconnecting subscriptions; [`backoff`]: full-jitter backoff.
//! - Webhook [`verify`], re-exported from the wire crate; customer portal
//!   sessions ([`Publisher::portal_session`]).

pub mod backoff;
pub mod broadcast;
pub mod connect;
mod executor;
mod identifier;
pub mod listen;
mod portal;
mod publisher;
mod registry;
#[cfg(feature = "sqlx")]
mod sqlx_support;
#[cfg(feature = "tracing-opentelemetry")]
mod trace_context;

pub use backoff::Backoff;
pub use broadcast::BroadcastChannel;
pub use connect::{ConnectError, PgConnectOptions, PgTls, RootCert, SslMode, TcpSettings};
pub use eventrelay_wire::webhook::{VerifyError, WebhookHeaders, WebhookSecret, verify, verify_at};
pub use eventrelay_wire::{Audience, EventEnvelope, Lane, NewEvent};
pub use executor::PgExecutor;
pub use identifier::{Identifier, IdentifierError};
pub use listen::{HealthCheck, ListenConnection, ListenError, ListenTls};
pub use portal::{PortalSession, PortalTheme};
pub use publisher::{BatchError, DEFAULT_SCHEMA, PreparedBatch, PublishError, Publisher};
pub use registry::{SchemaError, SchemaRegistry};
