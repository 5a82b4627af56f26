//! The outbox's read side: a scope's events after a seq, the point a new
//! subscriber joins at, and pruning by age. The relay's live path and every
//! replay path read through here.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use eventrelay_publisher::{Identifier, PgExecutor};
use eventrelay_wire::{Audience, EventEnvelope, Lane, is_control_event_type};
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
    /// The newest transaction whose rows pruning deleted (0 when none).
    pub pruned_txid: u64,
    /// The lowest seq still held in any scope.
    pub horizon: Option<i64>,
}

/// Which rows of a scope a read takes, beyond `seq > after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// Only rows with a seq above this.
    pub after: i64,
    /// Only rows written by a transaction at or above this id: what may
    /// not have been handed on yet (see [`eventrelay_wire::ResumeCursor`]).
    pub since_txid: Option<u64>,
    /// Only rows with a seq at or below this.
    pub through: Option<i64>,
}

impl Window {
    /// Every row with a seq above `after`.
    pub fn after(after: i64) -> Self {
        Window {
            after,
            since_txid: None,
            through: None,
        }
    }
}

/// One page of a [`Window`] read, and the snapshot it was read in.
#[derive(Debug)]
pub struct WindowPage {
    /// In seq order.
    pub rows: Vec<StoredEvent>,
    /// How many rows the query returned (the withheld included), to tell
    /// a full page.
    pub returned: usize,
    /// The highest seq the query returned (withheld or not): where the
    /// next page starts.
    pub last_seq: Option<i64>,
    /// Bytes of `data` the rows take in the table.
    pub data_bytes: i64,
    /// The oldest transaction still running when the page was read: every
    /// transaction below it had finished, so every row it wrote that
    /// matches the window is on this page or the pages around it.
    pub snapshot_xmin: u64,
    /// The first transaction id not yet assigned when the page was read.
    pub snapshot_xmax: u64,
}

/// Rows deleted per statement when pruning, so a large backlog never holds
/// one long lock.
pub const PRUNE_BATCH: i64 = 5_000;

/// Reads and prunes the outbox in one schema.
#[derive(Debug, Clone)]
pub struct Outbox {
    read_sql: String,
    window_sql: String,
    join_sql: String,
    prune_sql: String,
    oldest_sql: String,
    horizon_sql: String,
    event_at_sql: String,
    witnessed_sql: String,
}

/// An event a relay read, kept to check later that the database's history
/// still holds it (see [`Outbox::still_holds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Witness {
    pub seq: i64,
    pub id: uuid::Uuid,
    pub txid: u64,
}

impl Outbox {
    pub fn new(schema: &Identifier) -> Self {
        Outbox {
            read_sql: format!(
                "SELECT seq, id, type, scope_key, data, audience, resources, occurred_at, traceparent,
                        txid::text AS txid, pg_column_size(data) AS data_bytes
                 FROM {schema}.outbox
                 WHERE scope_key = $1 AND seq > $2
                 ORDER BY seq
                 LIMIT $3"
            ),
            // The snapshot's xmin comes with the page, in one statement, so
            // the two agree; the join keeps it when no row matches. Each
            // optional bound is folded away by the planner when null, so a
            // read since a txid takes the (scope_key, txid) index.
            window_sql: format!(
                "WITH taken AS (SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS snapshot_xmin,
                                        pg_snapshot_xmax(pg_current_snapshot())::text AS snapshot_xmax)
                 SELECT taken.snapshot_xmin, taken.snapshot_xmax, o.*
                 FROM taken LEFT JOIN LATERAL (
                     SELECT seq, id, type, scope_key, data, audience, resources, occurred_at, traceparent,
                            txid::text AS txid, pg_column_size(data) AS data_bytes
                     FROM {schema}.outbox
                     WHERE scope_key = $1 AND seq > $2
                       AND ($3::text IS NULL OR txid >= $3::text::xid8)
                       AND ($4::int8 IS NULL OR seq <= $4)
                     ORDER BY seq
                     LIMIT $5
                 ) o ON true"
            ),
            // One statement, so the snapshot and the seqs agree.
            join_sql: format!(
                "SELECT pg_current_snapshot()::text,
                        (SELECT max(seq) FROM {schema}.outbox WHERE scope_key = $1),
                        (SELECT pg_sequence_last_value(pg_get_serial_sequence('{schema}.outbox', 'seq'))),
                        (SELECT pruned_through FROM {schema}.settings),
                        (SELECT pruned_txid::text FROM {schema}.settings),
                        (SELECT min(seq) FROM {schema}.outbox)"
            ),
            // By `written_at`, which the database sets, never by
            // `occurred_at`, which callers may backdate. The highest seq
            // deleted is recorded so replays below it are told to re-read.
            prune_sql: format!(
                "WITH doomed AS (
                     SELECT seq FROM {schema}.outbox WHERE written_at < $1 ORDER BY seq LIMIT $2
                 ), gone AS (
                     DELETE FROM {schema}.outbox o USING doomed d WHERE o.seq = d.seq
                     RETURNING o.seq, o.txid
                 ), recorded AS (
                     UPDATE {schema}.settings
                     SET pruned_through = greatest(pruned_through, g.top),
                         pruned_txid = greatest(pruned_txid, g.top_txid)
                     FROM (SELECT max(seq) AS top, max(txid) AS top_txid FROM gone) g
                     WHERE g.top IS NOT NULL
                 )
                 SELECT count(*) FROM gone"
            ),
            oldest_sql: format!("SELECT min(seq) FROM {schema}.outbox WHERE scope_key = $1"),
            horizon_sql: format!("SELECT min(seq) FROM {schema}.outbox"),
            event_at_sql: format!("SELECT id FROM {schema}.outbox WHERE seq = $1"),
            witnessed_sql: format!(
                "SELECT (SELECT pruned_txid::text FROM {schema}.settings),
                        coalesce(array_agg(o.seq), '{{}}'), coalesce(array_agg(o.id), '{{}}')
                 FROM {schema}.outbox o WHERE o.seq = ANY($1)"
            ),
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

    /// Up to `limit` rows of `scope_key` in `window`, in seq order, with the
    /// snapshot they were read in.
    pub async fn read_window(
        &self,
        db: &impl PgExecutor,
        scope_key: &str,
        window: Window,
        limit: i64,
    ) -> Result<WindowPage, StoreError> {
        let since = window.since_txid.map(|txid| txid.to_string());
        let rows = db
            .query_typed(
                &self.window_sql,
                &[
                    (&scope_key, Type::TEXT),
                    (&window.after, Type::INT8),
                    (&since, Type::TEXT),
                    (&window.through, Type::INT8),
                    (&limit, Type::INT8),
                ],
            )
            .await?;
        let first = rows.first().ok_or(StoreError::NoRow("an outbox window"))?;
        let bound = |column: &str| {
            first
                .get::<_, String>(column)
                .parse::<u64>()
                .map_err(|_| StoreError::NoRow("a readable snapshot bound"))
        };
        let snapshot_xmin = bound("snapshot_xmin")?;
        let snapshot_xmax = bound("snapshot_xmax")?;
        let found: Vec<&Row> = rows
            .iter()
            .filter(|row| row.get::<_, Option<i64>>("seq").is_some())
            .collect();
        Ok(WindowPage {
            returned: found.len(),
            last_seq: found.last().map(|row| row.get("seq")),
            data_bytes: found
                .iter()
                .map(|row| row.get::<_, Option<i32>>("data_bytes").unwrap_or(0) as i64)
                .sum(),
            rows: found.into_iter().filter_map(stored_from_row).collect(),
            snapshot_xmin,
            snapshot_xmax,
        })
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
            pruned_txid: row
                .get::<_, Option<String>>(4)
                .and_then(|txid| txid.parse().ok())
                .unwrap_or(0),
            horizon: row.get(5),
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

    /// The id of the event at `seq`, if the outbox holds one.
    pub async fn event_at(
        &self,
        db: &impl PgExecutor,
        seq: i64,
    ) -> Result<Option<uuid::Uuid>, StoreError> {
        let rows = db
            .query_typed(&self.event_at_sql, &[(&seq, Type::INT8)])
            .await?;
        Ok(rows.first().map(|row| row.get(0)))
    }

    /// Whether the outbox still holds every one of `witnesses` as it was
    /// read, or holds none of them for a reason other than pruning: false
    /// means the database's history was rewound under the relay (a standby
    /// promoted without the last commits, a restore), so seqs it sent may
    /// now name other events.
    pub async fn still_holds(
        &self,
        db: &impl PgExecutor,
        witnesses: &[Witness],
    ) -> Result<bool, StoreError> {
        let seqs: Vec<i64> = witnesses.iter().map(|w| w.seq).collect();
        let rows = db
            .query_typed(&self.witnessed_sql, &[(&seqs, Type::INT8_ARRAY)])
            .await?;
        // An aggregate: always one row.
        let Some(row) = rows.first() else {
            return Ok(true);
        };
        let pruned_txid: Option<&str> = row.get(0);
        let pruned_txid = pruned_txid.and_then(|t| t.parse().ok()).unwrap_or(0);
        let found: Vec<i64> = row.get(1);
        let ids: Vec<uuid::Uuid> = row.get(2);
        let held: HashMap<i64, uuid::Uuid> = found.into_iter().zip(ids).collect();
        Ok(history_holds(witnesses, &held, pruned_txid))
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
        traceparent: row.get("traceparent"),
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
    /// As stored: the relay parses it only for a trace, and ignores it when
    /// malformed.
    pub traceparent: Option<String>,
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
            traceparent,
        } = self;
        if is_control_event_type(&event_type) {
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
            traceparent,
        };
        Some(StoredEvent { envelope, txid })
    }
}

/// [`Outbox::still_holds`]'s decision: every witness is held under its own
/// id, or is missing because pruning took it (its transaction is at or
/// below the newest one pruning deleted rows of).
fn history_holds(witnesses: &[Witness], held: &HashMap<i64, uuid::Uuid>, pruned_txid: u64) -> bool {
    witnesses.iter().all(|w| match held.get(&w.seq) {
        Some(id) => *id == w.id,
        None => w.txid <= pruned_txid,
    })
}

#[cfg(test)]
mod history_tests {
    use super::*;

    fn witness(seq: i64, txid: u64) -> Witness {
        Witness {
            seq,
            id: uuid::Uuid::from_u128(seq as u128),
            txid,
        }
    }

    #[test]
    fn a_history_that_holds_every_witness_holds() {
        let witnesses = [witness(1, 10), witness(2, 11)];
        let held = witnesses.iter().map(|w| (w.seq, w.id)).collect();
        assert!(history_holds(&witnesses, &held, 0));
    }

    #[test]
    fn a_seq_that_names_another_event_is_a_rewound_history() {
        let witnesses = [witness(1, 10), witness(2, 11)];
        let held = [(1, witnesses[0].id), (2, uuid::Uuid::from_u128(99))].into();
        assert!(!history_holds(&witnesses, &held, 100));
    }

    #[test]
    fn a_missing_event_is_pruned_only_at_or_below_the_pruned_transaction() {
        let witnesses = [witness(1, 10), witness(2, 11)];
        let held = [(2, witnesses[1].id)].into();
        assert!(history_holds(&witnesses, &held, 10));
        assert!(!history_holds(&witnesses, &held, 9));
    }
}
