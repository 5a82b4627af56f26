//! The migration runner: applies `migrations/*.sql` in order inside the
//! configured schema and records what it applied.
//!
//! The whole run is one transaction under an advisory lock keyed on the
//! schema, so two processes starting at once apply each migration exactly
//! once, and a failed migration leaves nothing half-done. A database that
//! records a version this build does not know is refused: it was migrated by
//! a newer eventrelay, and running older code against it could corrupt it.

use std::fmt::Write as _;

use eventrelay_publisher::{Identifier, PgExecutor};
use sha2::{Digest, Sha256};
use tokio_postgres::types::Type;

use super::wakeup::WakeupMode;

/// One migration file, embedded at build time.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration, in the order they apply. A test checks this list
/// against the `migrations/` directory.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "outbox",
        sql: include_str!("../../migrations/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        name: "webhooks",
        sql: include_str!("../../migrations/0002_webhooks.sql"),
    },
    Migration {
        version: 3,
        name: "coalesce_notify",
        sql: include_str!("../../migrations/0003_coalesce_notify.sql"),
    },
    Migration {
        version: 4,
        name: "delivery_correctness",
        sql: include_str!("../../migrations/0004_delivery_correctness.sql"),
    },
    Migration {
        version: 5,
        name: "statement_triggers",
        sql: include_str!("../../migrations/0005_statement_triggers.sql"),
    },
    Migration {
        version: 6,
        name: "wakeup_modes",
        sql: include_str!("../../migrations/0006_wakeup_modes.sql"),
    },
    Migration {
        version: 7,
        name: "delivery_wakeups",
        sql: include_str!("../../migrations/0007_delivery_wakeups.sql"),
    },
    Migration {
        version: 8,
        name: "pointer_rows",
        sql: include_str!("../../migrations/0008_pointer_rows.sql"),
    },
    Migration {
        version: 9,
        name: "caller_announced_rows",
        sql: include_str!("../../migrations/0009_caller_announced_rows.sql"),
    },
    Migration {
        version: 10,
        name: "lean_publish_statements",
        sql: include_str!("../../migrations/0010_lean_publish_statements.sql"),
    },
];

/// Why the schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("database error while migrating: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error(
        "schema {schema} has migration {version} applied, which this build of eventrelay does not know; \
         it was migrated by a newer version, so this one refuses to run against it"
    )]
    UnknownVersion { schema: String, version: i32 },
    #[error(
        "migration {version} ({name}) in schema {schema} differs from the one applied; \
         applied migrations must never be edited"
    )]
    ChecksumMismatch {
        schema: String,
        version: i32,
        name: &'static str,
    },
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Versions applied by this run, in order.
    pub applied: Vec<i32>,
    /// Versions that were already in place.
    pub already_applied: usize,
}

impl Migration {
    /// SHA-256 of the file, so an edited, already-applied migration is caught.
    pub fn checksum(&self) -> String {
        Sha256::digest(self.sql.as_bytes()).iter().fold(
            String::with_capacity(64),
            |mut hex, byte| {
                let _ = write!(hex, "{byte:02x}");
                hex
            },
        )
    }
}

/// The first migration whose outbox trigger announces queued webhook
/// deliveries with `{"k":"due"}`.
pub const ANNOUNCES_QUEUED_DELIVERIES: i32 = 7;

/// The first migration with `outbox_announce_rows`, with which a batch's
/// INSERT announces its own rows.
pub const ANNOUNCES_BATCHED_ROWS: i32 = 9;

/// Whether `schema` has migration `version` applied (false when the schema
/// was never migrated).
pub async fn has_migration(
    db: &impl PgExecutor,
    schema: &Identifier,
    version: i32,
) -> Result<bool, tokio_postgres::Error> {
    let rows = db
        .query_typed(
            "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'schema_migrations')",
            &[(&schema.as_str(), Type::TEXT)],
        )
        .await?;
    if !rows.first().is_some_and(|row| row.get::<_, bool>(0)) {
        return Ok(false);
    }
    let rows = db
        .query_typed(
            &format!("SELECT EXISTS (SELECT 1 FROM {schema}.schema_migrations WHERE version = $1)"),
            &[(&version, Type::INT4)],
        )
        .await?;
    Ok(rows.first().is_some_and(|row| row.get::<_, bool>(0)))
}

/// Brings `schema` up to date and points its SQL functions at `channel`,
/// in the default wake-up mode (`notify`).
pub async fn migrate(
    client: &mut tokio_postgres::Client,
    schema: &Identifier,
    channel: &Identifier,
) -> Result<MigrationReport, MigrateError> {
    migrate_for(client, schema, channel, WakeupMode::Notify).await
}

/// Brings `schema` up to date, points its SQL functions at `channel`, and
/// records `wakeup` as the way relays are woken (see [`super::wakeup`]).
pub async fn migrate_for(
    client: &mut tokio_postgres::Client,
    schema: &Identifier,
    channel: &Identifier,
    wakeup: WakeupMode,
) -> Result<MigrationReport, MigrateError> {
    let tx = client.transaction().await?;
    let lock_key = format!("eventrelay.migrate.{schema}");
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&lock_key],
    )
    .await?;
    tx.batch_execute(&format!(
        "SET LOCAL client_min_messages TO warning;
         CREATE SCHEMA IF NOT EXISTS {schema};
         SET LOCAL search_path TO {schema};
         CREATE TABLE IF NOT EXISTS schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             checksum   text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .await?;

    let applied: Vec<(i32, String)> = tx
        .query(
            "SELECT version, checksum FROM schema_migrations ORDER BY version",
            &[],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    for (version, checksum) in &applied {
        let known = MIGRATIONS.iter().find(|m| m.version == *version);
        match known {
            None => {
                return Err(MigrateError::UnknownVersion {
                    schema: schema.to_string(),
                    version: *version,
                });
            }
            Some(migration) if migration.checksum() != *checksum => {
                return Err(MigrateError::ChecksumMismatch {
                    schema: schema.to_string(),
                    version: migration.version,
                    name: migration.name,
                });
            }
            Some(_) => {}
        }
    }

    let mut report = MigrationReport {
        applied: Vec::new(),
        already_applied: applied.len(),
    };
    for migration in MIGRATIONS {
        if applied
            .iter()
            .any(|(version, _)| *version == migration.version)
        {
            continue;
        }
        tracing::info!(schema = %schema, version = migration.version, name = migration.name, "applying migration");
        tx.batch_execute(migration.sql).await?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            &[&migration.version, &migration.name, &migration.checksum()],
        )
        .await?;
        report.applied.push(migration.version);
    }

    tx.execute(
        "INSERT INTO settings (channel) VALUES ($1)
         ON CONFLICT (singleton) DO UPDATE SET channel = EXCLUDED.channel",
        &[&channel.as_str()],
    )
    .await?;
    super::wakeup::apply(&tx, schema, wakeup).await?;
    tx.commit().await?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_ascend_without_gaps() {
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(migration.version, index as i32 + 1, "{}", migration.name);
        }
    }

    #[test]
    fn every_file_in_the_directory_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".sql"))
            .collect();
        files.sort();
        let listed: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:04}_{}.sql", m.version, m.name))
            .collect();
        assert_eq!(files, listed);
        for (file, migration) in files.iter().zip(MIGRATIONS) {
            let on_disk = std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("migrations")
                    .join(file),
            )
            .unwrap();
            assert_eq!(on_disk, migration.sql);
        }
    }
}
