//! The notification key, read once when the relay starts: what lets the
//! listener open the payloads the schema's functions sealed (see the wire
//! crate's `seal` module and `notify_key` in the migrations).

use eventrelay_publisher::{Identifier, PgExecutor};
use eventrelay_wire::{SealError, SealKey};
use tokio_postgres::error::SqlState;

/// Why the relay cannot open the schema's notifications.
#[derive(Debug, thiserror::Error)]
pub enum SealingError {
    #[error(
        "this role cannot read {schema}.notify_key, the key notifications are sealed with; \
         grant the relay's role what `eventrelay migrate --print-grants` prints"
    )]
    NotPermitted { schema: String },
    #[error(
        "schema {schema} sends its notifications unsealed (it was set up for the embedded \
         database), so any role that can log in could read and forge them; run \
         `eventrelay migrate` against it to seal them"
    )]
    Unsealed { schema: String },
    #[error("schema {schema} has no notification key; run `eventrelay migrate`")]
    Missing { schema: String },
    #[error("{schema}.notify_key holds an unusable key: {source}")]
    Unusable {
        schema: String,
        #[source]
        source: SealError,
    },
    #[error("database error while reading the notification key: {0}")]
    Database(#[from] tokio_postgres::Error),
}

/// Reads `schema`'s notification key. A relay on a Postgres server never
/// runs with unsealed notifications.
pub async fn notification_key(
    db: &impl PgExecutor,
    schema: &Identifier,
) -> Result<SealKey, SealingError> {
    let named = || schema.to_string();
    let sql = format!(
        "SELECT s.sealed, (SELECT k.key FROM {schema}.notify_key k) FROM {schema}.settings s"
    );
    let rows = db.query_typed(&sql, &[]).await.map_err(|error| {
        if error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
            SealingError::NotPermitted { schema: named() }
        } else {
            SealingError::Database(error)
        }
    })?;
    let Some(row) = rows.first() else {
        return Err(SealingError::Missing { schema: named() });
    };
    if !row.get::<_, bool>(0) {
        return Err(SealingError::Unsealed { schema: named() });
    }
    let key: Option<Vec<u8>> = row.get(1);
    let key = key.ok_or_else(|| SealingError::Missing { schema: named() })?;
    SealKey::new(&key).map_err(|source| SealingError::Unusable {
        schema: named(),
        source,
    })
}
