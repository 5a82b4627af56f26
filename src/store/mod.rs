//! Everything the service keeps in Postgres: the schema migrations, the
//! outbox's read side and the snapshots that tell history from new events.

pub mod database;
#[cfg(feature = "embedded")]
pub mod embedded;
pub mod migrate;
pub mod outbox;
pub mod snapshot;
pub mod webhooks;

pub use database::{Connection, Database, DatabaseError};
pub use migrate::{MIGRATIONS, MigrateError, Migration, MigrationReport, migrate};
pub use outbox::{JoinView, Outbox, StoreError, StoredEvent};
pub use snapshot::Snapshot;
pub use webhooks::WebhookStore;
