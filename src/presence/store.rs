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
                     version = nextval('{schema}.presence_version'), changed_at = now()",
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

    /// The rows changed after version `since`, oldest first, and the
    /// version read up to.
    pub async fn changed_since(
        &self,
        db: &impl PgExecutor,
        since: i64,
    ) -> Result<(Vec<Row>, i64), StoreError> {
        let rows = db
            .query_typed(
                &self.sql(
                    "SELECT relay_id, scope_key, subscriber_id, streams, info, version
                     FROM {schema}.presence_members
                     WHERE version > $1 ORDER BY version LIMIT $2",
                ),
                &[(&since, Type::INT8), (&READ_PAGE, Type::INT8)],
            )
            .await?;
        let next = rows.last().map_or(since, |row| row.get(5));
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
                 SET streams = 0, version = nextval('{schema}.presence_version'), changed_at = now()
                 WHERE relay_id = $1 AND streams > 0",
            ),
            &[(&relay_id, Type::TEXT)],
        )
        .await?;
        Ok(())
    }
}
