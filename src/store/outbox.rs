//! The outbox's read side: a scope's events after a seq, and pruning by
//! age. The relay's live path and every replay path read through here.

use chrono::{DateTime, Utc};
use eventrelay_publisher::{Identifier, PgExecutor};
use eventrelay_wire::{Audience, EventEnvelope, Lane};
use tokio_postgres::Row;
use tokio_postgres::types::Type;

/// Why the outbox could not be read or pruned.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] tokio_postgres::Error),
}

/// Rows deleted per statement when pruning, so a large backlog never holds
/// one long lock.
pub const PRUNE_BATCH: i64 = 5_000;

/// Reads and prunes the outbox in one schema.
#[derive(Debug, Clone)]
pub struct Outbox {
    read_sql: String,
    prune_sql: String,
    oldest_sql: String,
    newest_sql: String,
    horizon_sql: String,
}

impl Outbox {
    pub fn new(schema: &Identifier) -> Self {
        Outbox {
            read_sql: format!(
                "SELECT seq, id, type, scope_key, data, audience, resources, occurred_at
                 FROM {schema}.outbox
                 WHERE scope_key = $1 AND seq > $2
                 ORDER BY seq
                 LIMIT $3"
            ),
            prune_sql: format!(
                "WITH doomed AS (
                     SELECT seq FROM {schema}.outbox WHERE occurred_at < $1 ORDER BY seq LIMIT $2
                 ), gone AS (
                     DELETE FROM {schema}.outbox o USING doomed d WHERE o.seq = d.seq RETURNING 1
                 )
                 SELECT count(*) FROM gone"
            ),
            oldest_sql: format!("SELECT min(seq) FROM {schema}.outbox WHERE scope_key = $1"),
            newest_sql: format!("SELECT max(seq) FROM {schema}.outbox WHERE scope_key = $1"),
            horizon_sql: format!("SELECT min(seq) FROM {schema}.outbox"),
        }
    }

    /// Up to `limit` events of `scope_key` with `seq > after`, in seq order.
    ///
    /// A row whose audience this version cannot read is withheld (logged,
    /// never shown): fail closed, and keep the rest of the page flowing.
    pub async fn read_since(
        &self,
        db: &impl PgExecutor,
        scope_key: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<EventEnvelope>, StoreError> {
        let rows = db
            .query_typed(
                &self.read_sql,
                &[
                    (&scope_key, Type::TEXT),
                    (&after, Type::INT8),
                    (&limit, Type::INT8),
                ],
            )
            .await?;
        Ok(rows.iter().filter_map(envelope_from_row).collect())
    }

    /// The lowest seq the outbox still holds for `scope_key`, if any.
    pub async fn oldest_seq(
        &self,
        db: &impl PgExecutor,
        scope_key: &str,
    ) -> Result<Option<i64>, StoreError> {
        let rows = db
            .query_typed(&self.oldest_sql, &[(&scope_key, Type::TEXT)])
            .await?;
        Ok(rows.first().and_then(|row| row.get(0)))
    }

    /// The highest seq the outbox holds for `scope_key`, if any.
    pub async fn newest_seq(
        &self,
        db: &impl PgExecutor,
        scope_key: &str,
    ) -> Result<Option<i64>, StoreError> {
        let rows = db
            .query_typed(&self.newest_sql, &[(&scope_key, Type::TEXT)])
            .await?;
        Ok(rows.first().and_then(|row| row.get(0)))
    }

    /// The lowest seq the outbox still holds in any scope. Pruning removes
    /// rows by age across all scopes, so every seq below this is gone.
    pub async fn horizon(&self, db: &impl PgExecutor) -> Result<Option<i64>, StoreError> {
        let rows = db.query_typed(&self.horizon_sql, &[]).await?;
        Ok(rows.first().and_then(|row| row.get(0)))
    }

    /// Deletes every row that occurred before `cutoff`, in batches, and
    /// returns how many went.
    pub async fn prune_before(
        &self,
        db: &impl PgExecutor,
        cutoff: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let mut total = 0u64;
        loop {
            let rows = db
                .query_typed(
                    &self.prune_sql,
                    &[(&cutoff, Type::TIMESTAMPTZ), (&PRUNE_BATCH, Type::INT8)],
                )
                .await?;
            let deleted: i64 = rows.first().map(|row| row.get(0)).unwrap_or(0);
            total += deleted as u64;
            if deleted > 0 {
                tracing::debug!(deleted, total, "pruned outbox rows");
            }
            if deleted < PRUNE_BATCH {
                return Ok(total);
            }
        }
    }
}

fn envelope_from_row(row: &Row) -> Option<EventEnvelope> {
    let seq: i64 = row.get("seq");
    let audience = match row.get::<_, Option<serde_json::Value>>("audience") {
        None => None,
        Some(value) => match serde_json::from_value::<Audience>(value) {
            Ok(audience) => Some(audience),
            Err(error) => {
                tracing::warn!(seq, %error, "withholding outbox row with an unreadable audience");
                return None;
            }
        },
    };
    Some(EventEnvelope {
        id: row.get("id"),
        event_type: row.get("type"),
        scope_key: row.get("scope_key"),
        lane: Lane::Durable,
        seq: Some(seq),
        data: row.get("data"),
        audience,
        resources: row.get("resources"),
        occurred_at: row.get("occurred_at"),
    })
}
