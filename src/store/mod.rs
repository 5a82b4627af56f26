//! Everything the service keeps in Postgres: the schema migrations and the
//! outbox's read side.

pub mod database;
#[cfg(feature = "embedded")]
pub mod embedded;
pub mod migrate;
pub mod outbox;
pub mod webhooks;

pub use database::{Connection, Database, DatabaseError};
pub use migrate::{MIGRATIONS, MigrateError, Migration, MigrationReport, migrate};
pub use outbox::{Outbox, StoreError};
pub use webhooks::WebhookStore;
