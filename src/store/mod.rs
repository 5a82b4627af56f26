//! Everything the service keeps in Postgres: the schema migrations, the
//! outbox's read side and the snapshots that tell history from new events.

pub mod database;
pub mod disconnections;
#[cfg(feature = "embedded")]
pub mod embedded;
pub mod error;
pub mod migrate;
pub mod outbox;
pub mod pgoutput;
pub mod roles;
pub mod sealing;
pub mod snapshot;
pub mod statements;
pub mod wakeup;

pub use database::{Connection, Database, DatabaseError};
pub use error::StoreError;
pub use migrate::{
    MIGRATIONS, MigrateError, Migration, MigrationReport, Sealing, check_schema, migrate,
    migrate_for, migrate_with,
};
pub use outbox::{JoinView, Outbox, StoredEvent, Window, WindowPage, Witness};
pub use snapshot::Snapshot;
pub use statements::{Pipeline, StatementKey, Transaction};
pub use wakeup::{WakeupError, WakeupMode};
