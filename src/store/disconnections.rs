//! Operators' disconnections of subscribers, as rows every relay reads:
//! how a disconnection made through one relay reaches the streams held by
//! all the others (see `subscriber_disconnections` in the migrations).

use chrono::{DateTime, Utc};
use eventrelay_publisher::{Identifier, PgExecutor};
use tokio_postgres::types::Type;

use super::StoreError;

/// One disconnection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnection {
    pub id: i64,
    pub subscriber_id: String,
    pub scope_key: Option<String>,
    pub deny_until: Option<DateTime<Utc>>,
}

/// The statements, for one schema.
#[derive(Debug, Clone)]
pub struct Disconnections {
    insert_sql: String,
    since_sql: String,
    start_sql: String,
    prune_sql: String,
}

impl Disconnections {
    pub fn new(schema: &Identifier) -> Self {
        let table = format!("{schema}.subscriber_disconnections");
        Disconnections {
            insert_sql: format!(
                "INSERT INTO {table} (subscriber_id, scope_key, deny_until)
                 VALUES ($1, $2, $3) RETURNING id"
            ),
            since_sql: format!(
                "SELECT id, subscriber_id, scope_key, deny_until FROM {table}
                 WHERE id > $1 ORDER BY id LIMIT 1000"
            ),
            // What a relay starting now must honour (denials in force),
            // and where its reading starts.
            start_sql: format!(
                "SELECT id, subscriber_id, scope_key, deny_until FROM {table}
                 WHERE deny_until > now()
                 UNION ALL
                 SELECT coalesce(max(id), 0), '', NULL, NULL FROM {table}"
            ),
            prune_sql: format!(
                "DELETE FROM {table}
                 WHERE created_at < now() - interval '1 day'
                   AND (deny_until IS NULL OR deny_until < now())"
            ),
        }
    }

    /// Records a disconnection; answers its id.
    pub async fn insert(
        &self,
        db: &impl PgExecutor,
        subscriber_id: &str,
        scope_key: Option<&str>,
        deny_until: Option<DateTime<Utc>>,
    ) -> Result<i64, StoreError> {
        let rows = db
            .query_typed(
                &self.insert_sql,
                &[
                    (&subscriber_id, Type::TEXT),
                    (&scope_key, Type::TEXT),
                    (&deny_until, Type::TIMESTAMPTZ),
                ],
            )
            .await?;
        rows.first()
            .map(|row| row.get(0))
            .ok_or(StoreError::NoRow("the new disconnection"))
    }

    /// Disconnections recorded after `after`, oldest first.
    pub async fn since(
        &self,
        db: &impl PgExecutor,
        after: i64,
    ) -> Result<Vec<Disconnection>, StoreError> {
        let rows = db
            .query_typed(&self.since_sql, &[(&after, Type::INT8)])
            .await?;
        Ok(rows.iter().map(disconnection).collect())
    }

    /// The denials in force now, and the newest id, where reading starts.
    pub async fn at_start(
        &self,
        db: &impl PgExecutor,
    ) -> Result<(Vec<Disconnection>, i64), StoreError> {
        let rows = db.query_typed(&self.start_sql, &[]).await?;
        let mut denials: Vec<Disconnection> = rows.iter().map(disconnection).collect();
        let newest = denials.pop().map_or(0, |last| last.id);
        Ok((denials, newest))
    }

    /// Deletes rows a day old whose denial has passed; answers how many.
    pub async fn prune(&self, db: &impl PgExecutor) -> Result<u64, StoreError> {
        let rows = db
            .query_typed(
                &format!(
                    "WITH gone AS ({} RETURNING 1) SELECT count(*) FROM gone",
                    self.prune_sql
                ),
                &[],
            )
            .await?;
        Ok(rows.first().map_or(0, |row| row.get::<_, i64>(0) as u64))
    }
}

fn disconnection(row: &tokio_postgres::Row) -> Disconnection {
    Disconnection {
        id: row.get(0),
        subscriber_id: row.get(1),
        scope_key: row.get(2),
        deny_until: row.get(3),
    }
}
