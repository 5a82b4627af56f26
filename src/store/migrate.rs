//! The migration runner: applies `migrations/*.sql` in order inside the
//! configured schema and records what it applied.
//!
//! The whole run is one transaction under an advisory lock keyed on the
//! schema, so two processes starting at once apply each migration exactly
//! once, and a failed migration leaves nothing half-done. A database that
//! records a version this build does not know is refused: it was migrated by
//! a newer eventrelay, and running older code against it could corrupt it.

use std::fmt::Write as _;

use eventrelay_publisher::Identifier;
use sha2::{Digest, Sha256};

use super::wakeup::WakeupMode;

/// One migration file, embedded at build time.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration, in the order they apply. A test checks this list
/// against the `migrations/` directory. Version 1 is the whole schema;
/// later changes append versions 2, 3, … and never edit an applied one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "schema",
    sql: include_str!("../../migrations/0001_schema.sql"),
}];

/// Why the schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("database error while migrating: {}", server_said(.0))]
    Database(#[from] tokio_postgres::Error),
    #[error(
        "schema {schema} has migration {version} applied, which this build of eventrelay does not know; \
         it was migrated by a newer version, so this one refuses to run against it"
    )]
    UnknownVersion { schema: String, version: i32 },
    #[error(
        "migration {version} ({name}) in schema {schema} differs from the one applied: \
         a released migration is never edited, so the schema comes from a development build; \
         `eventrelay migrate --reset` makes it new (dropping its events, deliveries and subscriptions)"
    )]
    ChecksumMismatch {
        schema: String,
        version: i32,
        name: &'static str,
    },
    #[error(
        "eventrelay seals the notifications of schema {schema} with the pgcrypto extension, \
         which could not be created: {}; ask a superuser or the database owner to run \
         `CREATE EXTENSION pgcrypto` in this database (any schema), then migrate again",
        server_said(.source)
    )]
    Pgcrypto {
        schema: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error(
        "schema {schema} was created by a development build of eventrelay from before its \
         schema's first version (it records migration {version} as {applied_name:?}, this \
         build's is {name:?}); drop the schema and let eventrelay create it again, or run \
         `eventrelay migrate --reset` on a development database (it deletes every event \
         and webhook delivery in the schema)"
    )]
    EarlierBuild {
        schema: String,
        version: i32,
        applied_name: String,
        name: &'static str,
    },
}

/// The server's own words for a failed statement (tokio-postgres shows
/// only "db error"), or the client's when the server said nothing.
fn server_said(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => error.to_string(),
    }
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

/// Brings `schema` up to date and points its SQL functions at `channel`,
/// in the default wake-up mode (`notify`).
pub async fn migrate(
    client: &mut tokio_postgres::Client,
    schema: &Identifier,
    channel: &Identifier,
) -> Result<MigrationReport, MigrateError> {
    migrate_for(client, schema, channel, WakeupMode::Notify).await
}

/// Whether the schema's notifications are sealed (see the wire crate's
/// `seal` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealing {
    /// Sealed with a key only the owner and the relay's role read: every
    /// schema on a Postgres server, where any role that can log in may
    /// LISTEN and NOTIFY.
    Sealed,
    /// Sent as they are: the embedded database only, one in-process
    /// session that nothing else can reach.
    Open,
}

/// Brings `schema` up to date, points its SQL functions at `channel`, and
/// records `wakeup` as the way relays are woken (see [`super::wakeup`]).
/// Notifications are sealed.
pub async fn migrate_for(
    client: &mut tokio_postgres::Client,
    schema: &Identifier,
    channel: &Identifier,
    wakeup: WakeupMode,
) -> Result<MigrationReport, MigrateError> {
    migrate_with(client, schema, channel, wakeup, Sealing::Sealed).await
}

/// [`migrate_for`], with the choice of [`Sealing`].
pub async fn migrate_with(
    client: &mut tokio_postgres::Client,
    schema: &Identifier,
    channel: &Identifier,
    wakeup: WakeupMode,
    sealing: Sealing,
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
         SET LOCAL search_path TO {schema}, pg_temp;
         CREATE TABLE IF NOT EXISTS schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             checksum   text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .await?;

    let applied = applied_migrations(&tx, schema).await?;
    check_applied(schema, &applied)?;

    let mut report = MigrationReport {
        applied: Vec::new(),
        already_applied: applied.len(),
    };
    for migration in MIGRATIONS {
        if applied
            .iter()
            .any(|(version, _, _)| *version == migration.version)
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
        "INSERT INTO settings (channel, sealed) VALUES ($1, $2)
         ON CONFLICT (singleton) DO UPDATE SET channel = EXCLUDED.channel, sealed = EXCLUDED.sealed",
        &[&channel.as_str(), &(sealing == Sealing::Sealed)],
    )
    .await?;
    set_up_sealing(&tx, schema, sealing).await?;
    // Nothing in the schema is anyone's but its owner's until granted
    // (see `grants_sql`); functions are executable by PUBLIC unless revoked.
    tx.batch_execute(&format!(
        "REVOKE ALL ON SCHEMA {schema} FROM PUBLIC;
         REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM PUBLIC;
         REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM PUBLIC;
         REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;"
    ))
    .await?;
    super::wakeup::apply(&tx, schema, wakeup).await?;
    tx.commit().await?;
    Ok(report)
}

/// Writes the notification key (once), creating pgcrypto (in a schema
/// named `pgcrypto`) when the database has none, and pins `seal`'s
/// search_path to pgcrypto's schema and this one; for [`Sealing::Open`],
/// writes no key, so `seal` sends payloads as they are.
async fn set_up_sealing(
    tx: &tokio_postgres::Transaction<'_>,
    schema: &Identifier,
    sealing: Sealing,
) -> Result<(), MigrateError> {
    let pin = |path: &str| {
        format!(
            "ALTER FUNCTION {schema}.seal(text, text) SET search_path = pg_catalog, {path}pg_temp"
        )
    };
    if sealing == Sealing::Open {
        tx.batch_execute(&pin(&format!("{schema}, "))).await?;
        return Ok(());
    }
    let installed =
        "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pgcrypto'";
    let crypto: String = match tx.query_opt(installed, &[]).await? {
        Some(row) => row.get(0),
        None => {
            // In a schema of its own, so dropping one eventrelay schema
            // never takes the extension from another; under a lock of the
            // database's, as migrations of other schemas may race here.
            tx.batch_execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('eventrelay.pgcrypto', 0));
                 CREATE SCHEMA IF NOT EXISTS pgcrypto;
                 CREATE EXTENSION IF NOT EXISTS pgcrypto SCHEMA pgcrypto;",
            )
            .await
            .map_err(|source| MigrateError::Pgcrypto {
                schema: schema.to_string(),
                source,
            })?;
            match tx.query_opt(installed, &[]).await? {
                Some(row) => row.get(0),
                None => "pgcrypto".to_owned(),
            }
        }
    };
    tx.batch_execute(&format!(
        "INSERT INTO {schema}.notify_key (key) VALUES ({crypto}.gen_random_bytes(64))
             ON CONFLICT (singleton) DO NOTHING;
         {};",
        pin(&format!("{crypto}, {schema}, "))
    ))
    .await?;
    Ok(())
}

/// Refuses to run against `schema` when what it records was not applied by
/// this build (see [`check_applied`]); for relays that do not migrate.
pub async fn check_schema(
    client: &tokio_postgres::Client,
    schema: &Identifier,
) -> Result<(), MigrateError> {
    // Unnamed statements throughout: this runs outside a transaction,
    // possibly through a transaction-mode pooler.
    let table = format!("{schema}.schema_migrations");
    let exists = client
        .query_typed(
            "SELECT to_regclass($1) IS NOT NULL",
            &[(&table, tokio_postgres::types::Type::TEXT)],
        )
        .await?
        .first()
        .is_some_and(|row| row.get::<_, bool>(0));
    if !exists {
        return Ok(()); // never migrated: the wake-up check names that
    }
    check_applied(schema, &applied_migrations(client, schema).await?)
}

/// (version, name, checksum) of every migration `schema_migrations`
/// records.
async fn applied_migrations(
    db: &impl tokio_postgres::GenericClient,
    schema: &Identifier,
) -> Result<Vec<(i32, String, String)>, tokio_postgres::Error> {
    Ok(db
        .query_typed(
            &format!(
                "SELECT version, name, checksum FROM {schema}.schema_migrations ORDER BY version"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect())
}

/// Every applied migration must be one of this build's, unedited: a
/// version it does not know was applied by a newer build, a name that
/// differs marks a schema from before the first version.
fn check_applied(
    schema: &Identifier,
    applied: &[(i32, String, String)],
) -> Result<(), MigrateError> {
    for (version, name, checksum) in applied {
        let known = MIGRATIONS.iter().find(|m| m.version == *version);
        match known {
            Some(migration) if migration.name != name => {
                return Err(MigrateError::EarlierBuild {
                    schema: schema.to_string(),
                    version: *version,
                    applied_name: name.clone(),
                    name: migration.name,
                });
            }
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
    Ok(())
}

/// Drops `schema` with everything in it (events, deliveries, subscriptions
/// from the admin API), then creates it again. For development databases
/// only: what the schema held is gone.
pub async fn reset(
    client: &mut tokio_postgres::Client,
    schema: &Identifier,
    channel: &Identifier,
    wakeup: WakeupMode,
) -> Result<MigrationReport, MigrateError> {
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await?;
    migrate_for(client, schema, channel, wakeup).await
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
