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

pub mod backoff;
pub mod broadcast;
pub mod connect;
mod executor;
mod identifier;
pub mod listen;
mod publisher;
mod registry;
#[cfg(feature = "sqlx")]
mod sqlx_support;

pub use backoff::Backoff;
pub use broadcast::BroadcastChannel;
pub use connect::{ConnectError, PgConnectOptions, PgTls, RootCert, SslMode, TcpSettings};
pub use eventrelay_wire::webhook::{VerifyError, WebhookHeaders, WebhookSecret, verify, verify_at};
pub use eventrelay_wire::{Audience, EventEnvelope, Lane, NewEvent};
pub use executor::PgExecutor;
pub use identifier::{Identifier, IdentifierError};
pub use listen::{HealthCheck, ListenConnection, ListenError, ListenTls};
pub use publisher::{BatchError, DEFAULT_SCHEMA, PublishError, Publisher};
pub use registry::{SchemaError, SchemaRegistry};
