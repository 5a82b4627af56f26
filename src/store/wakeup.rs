//! How relays learn that events committed: the wake-up mode a schema is
//! migrated for, and the checks that a database can serve the logical one.
//!
//! `notify` is a pointer `NOTIFY` at COMMIT (the outbox trigger's). Postgres
//! sends notifications through one queue and commits notifying transactions
//! one at a time behind a cluster-wide lock, which caps emit throughput.
//! `logical` sends nothing at commit: each relay decodes committed outbox
//! inserts, and ephemeral events sent as logical messages, from the WAL on
//! a temporary replication slot of its own.
//!
//! The mode is a property of the schema, recorded by `migrate`, because
//! every writer (the SQL functions, the publisher crate, the publish API)
//! must follow it. A relay refuses to start when its configured mode is not
//! the one recorded, and, in logical mode, when the server cannot give it a
//! replication stream; each refusal names what to change.

use std::fmt;
use std::str::FromStr;

use eventrelay_publisher::{Identifier, PgExecutor};
use serde::{Deserialize, Serialize};

/// How relays are woken; see the module documentation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WakeupMode {
    #[default]
    Notify,
    Logical,
}

impl WakeupMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WakeupMode::Notify => "notify",
            WakeupMode::Logical => "logical",
        }
    }
}

impl fmt::Display for WakeupMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WakeupMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "notify" => Ok(WakeupMode::Notify),
            "logical" => Ok(WakeupMode::Logical),
            other => Err(format!(
                "unknown wake-up mode {other:?}; use notify or logical"
            )),
        }
    }
}

/// The publication logical-mode relays decode: one per schema, named after
/// it, holding the inserts into the schema's outbox (the events) and into
/// its webhook deliveries (which wake the dispatcher).
pub fn publication_name(schema: &Identifier) -> &str {
    schema.as_str()
}

/// Why a relay may not run in the configured mode. Each names the setting
/// or the command that fixes it.
#[derive(Debug, thiserror::Error)]
pub enum WakeupError {
    #[error("database error while checking the wake-up mode: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error(
        "database.wakeup: schema {schema} is migrated for {recorded} but this relay is configured \
         for {configured}; run `eventrelay migrate --wakeup {configured}` (or leave database.migrate \
         on), and run every relay of the schema in one mode"
    )]
    Mismatch {
        schema: String,
        recorded: WakeupMode,
        configured: WakeupMode,
    },
    #[error(
        "database.wakeup = \"logical\" needs Postgres 14 or newer (binary pgoutput); \
         this server is {0}; use database.wakeup = \"notify\""
    )]
    ServerTooOld(String),
    #[error(
        "database.wakeup = \"logical\" needs the server's wal_level = logical (it is {0}); \
         set wal_level = logical in postgresql.conf and restart Postgres, or use \
         database.wakeup = \"notify\""
    )]
    WalLevel(String),
    #[error(
        "database.wakeup = \"logical\" needs a role with the REPLICATION attribute; \
         run ALTER ROLE {0} REPLICATION, or use database.wakeup = \"notify\""
    )]
    NoReplicationRole(String),
    #[error(
        "database.wakeup = \"logical\": every replication slot is taken ({0} in use); each relay \
         holds one temporary slot, so raise max_replication_slots in postgresql.conf"
    )]
    NoFreeSlot(i64),
    #[error(
        "database.wakeup = \"logical\": every WAL sender is busy ({0} in use); each relay holds \
         one, so raise max_wal_senders in postgresql.conf"
    )]
    NoFreeSender(i64),
}

/// The mode `schema` was migrated for.
pub async fn recorded_mode(
    db: &impl PgExecutor,
    schema: &Identifier,
) -> Result<WakeupMode, tokio_postgres::Error> {
    // Through JSON, so a schema from before modes existed reads as notify.
    let rows = db
        .query_typed(
            &format!("SELECT to_jsonb(s) ->> 'wakeup' FROM {schema}.settings s"),
            &[],
        )
        .await?;
    let recorded: Option<String> = rows.first().and_then(|row| row.get(0));
    Ok(match recorded.as_deref() {
        Some("logical") => WakeupMode::Logical,
        _ => WakeupMode::Notify,
    })
}

/// Checks, before a relay starts, that `schema` is migrated for
/// `configured` and, in logical mode, that the server can give this relay
/// a replication stream.
pub async fn check_ready(
    db: &impl PgExecutor,
    schema: &Identifier,
    configured: WakeupMode,
) -> Result<(), WakeupError> {
    let recorded = recorded_mode(db, schema).await?;
    if recorded != configured {
        return Err(WakeupError::Mismatch {
            schema: schema.to_string(),
            recorded,
            configured,
        });
    }
    if configured == WakeupMode::Logical {
        check_logical_server(db).await?;
    }
    Ok(())
}

/// The server-side conditions of logical mode: Postgres 14 or newer (the
/// stream is binary `pgoutput`), `wal_level`, the role's REPLICATION
/// attribute, and a free slot and WAL sender.
pub async fn check_logical_server(db: &impl PgExecutor) -> Result<(), WakeupError> {
    let rows = db
        .query_typed(
            "SELECT current_setting('wal_level'),
                    (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user),
                    current_user::text,
                    current_setting('max_replication_slots')::bigint,
                    (SELECT count(*) FROM pg_replication_slots),
                    current_setting('max_wal_senders')::bigint,
                    (SELECT count(*) FROM pg_stat_replication),
                    current_setting('server_version_num')::int,
                    current_setting('server_version')",
            &[],
        )
        .await?;
    let Some(row) = rows.first() else {
        return Ok(());
    };
    if row.get::<_, i32>(7) < 140_000 {
        return Err(WakeupError::ServerTooOld(row.get(8)));
    }
    let wal_level: String = row.get(0);
    if wal_level != "logical" {
        return Err(WakeupError::WalLevel(wal_level));
    }
    if !row.get::<_, Option<bool>>(1).unwrap_or(false) {
        return Err(WakeupError::NoReplicationRole(row.get(2)));
    }
    let (slots, slots_used): (i64, i64) = (row.get(3), row.get(4));
    if slots_used >= slots {
        return Err(WakeupError::NoFreeSlot(slots_used));
    }
    let (senders, senders_used): (i64, i64) = (row.get(5), row.get(6));
    if senders_used >= senders {
        return Err(WakeupError::NoFreeSender(senders_used));
    }
    Ok(())
}

/// Records `mode` in `schema` and makes the database follow it: the
/// outbox's NOTIFY trigger runs in notify mode only, and the publication
/// exists in logical mode only. Runs inside `migrate`'s transaction; each
/// change is made only when needed, so a migrate that changes nothing
/// takes no lock on the outbox.
pub(crate) async fn apply(
    tx: &tokio_postgres::Transaction<'_>,
    schema: &Identifier,
    mode: WakeupMode,
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        &format!("UPDATE {schema}.settings SET wakeup = $1 WHERE wakeup <> $1"),
        &[&mode.as_str()],
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT (SELECT t.tgenabled <> 'D'
                     FROM pg_trigger t
                     JOIN pg_class c ON c.oid = t.tgrelid
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = $1 AND c.relname = 'outbox' AND t.tgname = 'outbox_notify'),
                    EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)",
            &[&schema.as_str()],
        )
        .await?;
    let notifying: bool = row.get::<_, Option<bool>>(0).unwrap_or(true);
    let published: bool = row.get(1);
    let publication = publication_name(schema);
    match mode {
        WakeupMode::Notify => {
            if !notifying {
                tx.batch_execute(&format!(
                    "ALTER TABLE {schema}.outbox ENABLE TRIGGER outbox_notify"
                ))
                .await?;
            }
            if published {
                tx.batch_execute(&format!("DROP PUBLICATION {publication}"))
                    .await?;
            }
        }
        WakeupMode::Logical => {
            if notifying {
                tx.batch_execute(&format!(
                    "ALTER TABLE {schema}.outbox DISABLE TRIGGER outbox_notify"
                ))
                .await?;
            }
            if !published {
                tx.batch_execute(&format!(
                    "CREATE PUBLICATION {publication} \
                     FOR TABLE {schema}.outbox, {schema}.webhook_deliveries \
                     WITH (publish = 'insert')"
                ))
                .await?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_as_written() {
        for mode in [WakeupMode::Notify, WakeupMode::Logical] {
            assert_eq!(mode.as_str().parse::<WakeupMode>().unwrap(), mode);
        }
        let error = "listen".parse::<WakeupMode>().unwrap_err();
        assert!(error.contains("notify or logical"), "{error}");
    }
}
