//! Presence in Postgres: each relay's rows and heartbeat, and the reads
//! every relay makes of the others' changes.

use std::collections::HashSet;

use eventrelay_publisher::{Identifier, PgExecutor};
use serde_json::Value;
use tokio_postgres::types::Type;

use super::view::Row;
use crate::store::StoreError;

/// Most rows one read takes; the next round reads on from there.
const READ_PAGE: i64 = 10_000;

/// Where a relay's next read of the others' changes starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadPoint {
    /// The highest version read.
    pub version: i64,
    /// The oldest transaction running at that read: its rows (and any
    /// later one's) are read again, in case a lower version committed late.
    pub running_from: u64,
}

#[derive(Debug, Clone)]
pub struct PresenceStore {
    schema: Identifier,
}

impl PresenceStore {
    pub fn new(schema: &Identifier) -> Self {
        PresenceStore {
            schema: schema.clone(),
        }
    }

    fn sql(&self, text: &str) -> String {
        text.replace("{schema}", self.schema.as_str())
    }

    /// Records that this relay is alive, and clears out what relays dead
    /// for two expiry periods left behind, and tombstones as old.
    pub async fn heartbeat(
        &self,
        db: &impl PgExecutor,
        relay_id: &str,
        expire_secs: u64,
    ) -> Result<(), StoreError> {
        let expire = i64::try_from(expire_secs).unwrap_or(i64::MAX);
        db.query_typed(
            &self.sql(
                "WITH beat AS (
                     INSERT INTO {schema}.presence_relays (relay_id, heartbeat_at)
                     VALUES ($1, now())
                     ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = now()
                 ), dead AS (
                     DELETE FROM {schema}.presence_relays
                     WHERE heartbeat_at < now() - make_interval(secs => $2 * 2)
                     RETURNING relay_id
                 )
                 DELETE FROM {schema}.presence_members m
                 WHERE m.relay_id IN (SELECT relay_id FROM dead)
                    OR (m.streams = 0 AND m.changed_at < now() - make_interval(secs => $2 * 2))",
            ),
            &[(&relay_id, Type::TEXT), (&(expire as f64), Type::FLOAT8)],
        )
        .await?;
        Ok(())
    }

    /// Writes this relay's changed members (`streams` 0: it left).
    pub async fn write(
        &self,
        db: &impl PgExecutor,
        relay_id: &str,
        rows: &[(String, String, i32, Option<Value>)],
    ) -> Result<(), StoreError> {
        let scopes: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        let subscribers: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
        let streams: Vec<i32> = rows.iter().map(|r| r.2).collect();
        let infos: Vec<Option<&Value>> = rows.iter().map(|r| r.3.as_ref()).collect();
        db.query_typed(
            &self.sql(
                "INSERT INTO {schema}.presence_members
                     (relay_id, scope_key, subscriber_id, streams, info)
                 SELECT $1, s, u, n, i FROM unnest($2::text[], $3::text[], $4::int4[], $5::jsonb[])
                     AS r(s, u, n, i)
                 ON CONFLICT (scope_key, subscriber_id, relay_id) DO UPDATE
                 SET streams = excluded.streams, info = excluded.info,
                     version = nextval('{schema}.presence_version'),
                     txid = pg_current_xact_id(), changed_at = now()",
            ),
            &[
                (&relay_id, Type::TEXT),
                (&scopes, Type::TEXT_ARRAY),
                (&subscribers, Type::TEXT_ARRAY),
                (&streams, Type::INT4_ARRAY),
                (&infos, Type::JSONB_ARRAY),
            ],
        )
        .await?;
        Ok(())
    }

    /// The rows changed since `since` (the last read's version and the
    /// oldest transaction still running then), oldest first, and where the
    /// next read starts. Rows of a transaction that was running at the last
    /// read are read again, whatever their version: a row is one
    /// subscriber's current state, so reading it twice changes nothing.
    pub async fn changed_since(
        &self,
        db: &impl PgExecutor,
        since: ReadPoint,
    ) -> Result<(Vec<Row>, ReadPoint), StoreError> {
        let horizon = since.running_from.to_string();
        let rows = db
            .query_typed(
                &self.sql(
                    "SELECT m.relay_id, m.scope_key, m.subscriber_id, m.streams, m.info,
                            m.version, pg_snapshot_xmin(pg_current_snapshot())::text
                     FROM {schema}.presence_members m
                     WHERE m.version > $1 OR m.txid >= $3::text::xid8
                     ORDER BY m.version LIMIT $2",
                ),
                &[
                    (&since.version, Type::INT8),
                    (&READ_PAGE, Type::INT8),
                    (&horizon, Type::TEXT),
                ],
            )
            .await?;
        let next = match rows.last() {
            // A full page: on from its last row, with the same horizon.
            Some(last) if rows.len() as i64 == READ_PAGE => ReadPoint {
                version: last.get(5),
                running_from: since.running_from,
            },
            Some(last) => ReadPoint {
                version: since.version.max(last.get(5)),
                running_from: last
                    .get::<_, String>(6)
                    .parse()
                    .unwrap_or(since.running_from),
            },
            None => ReadPoint {
                running_from: self.horizon(db).await?.unwrap_or(since.running_from),
                ..since
            },
        };
        let rows = rows
            .iter()
            .map(|row| Row {
                relay_id: row.get(0),
                scope_key: row.get(1),
                subscriber_id: row.get(2),
                streams: row.get(3),
                info: row.get(4),
            })
            .collect();
        Ok((rows, next))
    }

    /// The oldest transaction running now.
    async fn horizon(&self, db: &impl PgExecutor) -> Result<Option<u64>, StoreError> {
        let rows = db
            .query_typed("SELECT pg_snapshot_xmin(pg_current_snapshot())::text", &[])
            .await?;
        Ok(rows
            .first()
            .and_then(|row| row.get::<_, String>(0).parse().ok()))
    }

    /// The relays whose heartbeat is younger than `expire_secs`.
    pub async fn live_relays(
        &self,
        db: &impl PgExecutor,
        expire_secs: u64,
    ) -> Result<HashSet<String>, StoreError> {
        let expire = expire_secs as f64;
        let rows = db
            .query_typed(
                &self.sql(
                    "SELECT relay_id FROM {schema}.presence_relays
                     WHERE heartbeat_at > now() - make_interval(secs => $1)",
                ),
                &[(&expire, Type::FLOAT8)],
            )
            .await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    /// Takes a stopping relay's members out, for every relay to read.
    pub async fn remove_relay(
        &self,
        db: &impl PgExecutor,
        relay_id: &str,
    ) -> Result<(), StoreError> {
        db.query_typed(
            &self.sql(
                "WITH gone AS (DELETE FROM {schema}.presence_relays WHERE relay_id = $1)
                 UPDATE {schema}.presence_members
                 SET streams = 0, version = nextval('{schema}.presence_version'),
                     txid = pg_current_xact_id(), changed_at = now()
                 WHERE relay_id = $1 AND streams > 0",
            ),
            &[(&relay_id, Type::TEXT)],
        )
        .await?;
        Ok(())
    }
}
