//! The outbox's read side: a scope's events after a seq, the point a new
//! subscriber joins at, and pruning by age. The relay's live path and every
//! replay path read through here.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use eventrelay_publisher::{Identifier, PgExecutor};
use eventrelay_wire::{Audience, EventEnvelope, Lane, is_reserved_event_type};
use tokio_postgres::Row;
use tokio_postgres::types::Type;

use super::error::StoreError;
use super::snapshot::Snapshot;

/// A durable event as read from the outbox, with the transaction that
/// wrote it.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub envelope: EventEnvelope,
    pub txid: u64,
}

/// What the outbox looked like at the moment a subscriber joined.
#[derive(Debug, Clone)]
pub struct JoinView {
    /// Transactions committed at that moment: events they wrote are history.
    /// Shared: every stream that joined through the same read keeps it.
    pub snapshot: Arc<Snapshot>,
    /// The scope's highest committed seq then (0 when it had none). Every
    /// event above it is new; below it, the snapshot decides.
    pub scope_newest: i64,
    /// The highest seq ever assigned in this outbox, in any scope. A
    /// `Last-Event-ID` above it comes from another database (a restore, a
    /// reset sequence) and the client must re-read.
    pub outbox_newest: i64,
    /// Every event at or below this seq may have been pruned.
    pub pruned_through: i64,
    /// The lowest seq still held in any scope.
    pub horizon: Option<i64>,
}

/// Rows deleted per statement when pruning, so a large backlog never holds
/// one long lock.
pub const PRUNE_BATCH: i64 = 5_000;

/// Reads and prunes the outbox in one schema.
#[derive(Debug, Clone)]
pub struct Outbox {
    read_sql: String,
    join_sql: String,
    prune_sql: String,
    oldest_sql: String,
    horizon_sql: String,
}

impl Outbox {
    pub fn new(schema: &Identifier) -> Self {
        Outbox {
            read_sql: format!(
                "SELECT seq, id, type, scope_key, data, audience, resources, occurred_at,
                        txid::text AS txid, pg_column_size(data) AS data_bytes
                 FROM {schema}.outbox
                 WHERE scope_key = $1 AND seq > $2
                 ORDER BY seq
                 LIMIT $3"
            ),
            // One statement, so the snapshot and the seqs agree.
            join_sql: format!(
                "SELECT pg_current_snapshot()::text,
                        (SELECT max(seq) FROM {schema}.outbox WHERE scope_key = $1),
                        (SELECT pg_sequence_last_value(pg_get_serial_sequence('{schema}.outbox', 'seq'))),
                        (SELECT pruned_through FROM {schema}.settings),
                        (SELECT min(seq) FROM {schema}.outbox)"
            ),
            // By `written_at`, which the database sets, never by
            // `occurred_at`, which callers may backdate. The highest seq
            // deleted is recorded so replays below it are told to re-read.
            prune_sql: format!(
                "WITH doomed AS (
                     SELECT seq FROM {schema}.outbox WHERE written_at < $1 ORDER BY seq LIMIT $2
                 ), gone AS (
                     DELETE FROM {schema}.outbox o USING doomed d WHERE o.seq = d.seq RETURNING o.seq
                 ), recorded AS (
                     UPDATE {schema}.settings SET pruned_through = greatest(pruned_through, g.top)
                     FROM (SELECT max(seq) AS top FROM gone) g
                     WHERE g.top IS NOT NULL
                 )
                 SELECT count(*) FROM gone"
            ),
            oldest_sql: format!("SELECT min(seq) FROM {schema}.outbox WHERE scope_key = $1"),
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
        let rows = self.read_rows(db, scope_key, after, limit).await?;
        Ok(rows.into_iter().map(|row| row.envelope).collect())
    }

    /// As [`Outbox::read_since`], with each event's writing transaction, which
    /// the relay needs to tell history from a late commit.
    pub async fn read_rows(
        &self,
        db: &impl PgExecutor,
        scope_key: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        Ok(self.read_page(db, scope_key, after, limit).await?.0)
    }

    /// As [`Outbox::read_rows`], with the bytes the page's `data` takes in
    /// the table (as stored, which may be compressed): what bounds a read.
    pub async fn read_page(
        &self,
        db: &impl PgExecutor,
        scope_key: &str,
        after: i64,
        limit: i64,
    ) -> Result<(Vec<StoredEvent>, i64), StoreError> {
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
        let bytes = rows
            .iter()
            .map(|row| row.get::<_, Option<i32>>("data_bytes").unwrap_or(0) as i64)
            .sum();
        Ok((rows.iter().filter_map(stored_from_row).collect(), bytes))
    }

    /// The outbox as a subscriber joining `scope_key` now sees it.
    pub async fn join_view(
        &self,
        db: &impl PgExecutor,
        scope_key: &str,
    ) -> Result<JoinView, StoreError> {
        let rows = db
            .query_typed(&self.join_sql, &[(&scope_key, Type::TEXT)])
            .await?;
        let row = rows.first().ok_or(StoreError::NoRow("the join view"))?;
        let snapshot: String = row.get(0);
        Ok(JoinView {
            snapshot: Arc::new(Snapshot::parse(&snapshot)?),
            scope_newest: row.get::<_, Option<i64>>(1).unwrap_or(0),
            outbox_newest: row.get::<_, Option<i64>>(2).unwrap_or(0),
            pruned_through: row.get::<_, Option<i64>>(3).unwrap_or(0),
            horizon: row.get(4),
        })
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

    /// The lowest seq the outbox still holds in any scope. Pruning removes
    /// rows by age across all scopes, so every seq below this is gone.
    pub async fn horizon(&self, db: &impl PgExecutor) -> Result<Option<i64>, StoreError> {
        let rows = db.query_typed(&self.horizon_sql, &[]).await?;
        Ok(rows.first().and_then(|row| row.get(0)))
    }

    /// Deletes every row written before `cutoff`, in batches, and returns
    /// how many went.
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

fn stored_from_row(row: &Row) -> Option<StoredEvent> {
    let seq: i64 = row.get("seq");
    let text: String = row.get("txid");
    let Ok(txid) = text.parse::<u64>() else {
        tracing::warn!(
            seq,
            txid = text,
            "withholding outbox row with an unreadable txid"
        );
        return None;
    };
    OutboxRow {
        seq,
        id: row.get("id"),
        event_type: row.get("type"),
        scope_key: row.get("scope_key"),
        data: row.get("data"),
        audience: row.get("audience"),
        resources: row.get("resources"),
        occurred_at: row.get("occurred_at"),
        txid,
    }
    .into_stored()
}

/// One outbox row's columns, however they were read: by a query, or
/// decoded from the WAL in logical wake-up mode.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub seq: i64,
    pub id: uuid::Uuid,
    pub event_type: String,
    pub scope_key: String,
    pub data: serde_json::Value,
    pub audience: Option<serde_json::Value>,
    pub resources: Vec<String>,
    pub occurred_at: DateTime<Utc>,
    pub txid: u64,
}

impl OutboxRow {
    /// The event a subscriber may be shown, or `None` (logged) for a row
    /// this version must withhold: fail closed, and keep the rest flowing.
    pub fn into_stored(self) -> Option<StoredEvent> {
        let OutboxRow {
            seq,
            id,
            event_type,
            scope_key,
            data,
            audience,
            resources,
            occurred_at,
            txid,
        } = self;
        if is_reserved_event_type(&event_type) {
            // The table's constraint refuses these; should it ever be
            // dropped, a row shown to a client would pass for a control
            // frame.
            tracing::warn!(
                seq,
                event_type,
                "withholding outbox row with a reserved event type"
            );
            return None;
        }
        let audience = match audience {
            None => None,
            Some(value) => match serde_json::from_value::<Audience>(value) {
                Ok(audience) => Some(audience),
                Err(error) => {
                    tracing::warn!(seq, %error, "withholding outbox row with an unreadable audience");
                    return None;
                }
            },
        };
        let envelope = EventEnvelope {
            id,
            event_type,
            scope_key,
            lane: Lane::Durable,
            seq: Some(seq),
            data,
            audience,
            resources,
            occurred_at,
        };
        Some(StoredEvent { envelope, txid })
    }
}
