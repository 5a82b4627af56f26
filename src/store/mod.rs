//! Everything the service keeps in Postgres: the schema migrations and the
//! outbox's read side.

pub mod migrate;
pub mod outbox;

pub use migrate::{MIGRATIONS, MigrateError, Migration, MigrationReport, migrate};
pub use outbox::{Outbox, StoreError};
