//! Running the service's statements on a checked-out connection, prepared
//! once per connection where the configuration allows.
//!
//! Every statement the service runs is fixed text with typed parameters.
//! Sent unnamed, Postgres parses, analyses and plans it on every call,
//! which on a busy publish path costs about a quarter of the server's CPU.
//! Kept prepared, each is parsed once per connection. A transaction-mode
//! pooler may run the next transaction on another server connection, where
//! the statement was never prepared, so this is a setting
//! (`database.prepared_statements`), and the embedded database's single
//! session always sends statements unnamed.

use std::sync::Arc;

use deadpool_postgres::StatementCache;
use eventrelay_publisher::PgExecutor;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Error, Row};

use super::Connection;

impl Connection {
    /// Where this connection keeps its prepared statements, when it does.
    fn statement_cache(&self) -> Option<Arc<StatementCache>> {
        match self {
            Connection::Pooled(client, true) => Some(Arc::clone(&client.statement_cache)),
            Connection::Pooled(_, false) | Connection::Single(_) => None,
        }
    }

    /// Starts a transaction whose statements are prepared as the
    /// connection's are.
    pub async fn begin(&mut self) -> Result<Transaction<'_>, Error> {
        let cache = self.statement_cache();
        let inner = std::ops::DerefMut::deref_mut(self).transaction().await?;
        Ok(Transaction { inner, cache })
    }
}

impl PgExecutor for Connection {
    fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        let cache = self.statement_cache();
        async move {
            let first = run(self, cache.as_deref(), sql, params).await;
            match first {
                // Outside a transaction nothing was aborted: prepared
                // afresh, the statement runs again once.
                Err(error) if cache.is_some() && is_stale(&error) => {
                    run(self, cache.as_deref(), sql, params).await
                }
                other => other,
            }
        }
    }
}

/// A transaction on a [`Connection`], begun by [`Connection::begin`].
/// Dropped without [`commit`](Self::commit), it rolls back.
pub struct Transaction<'a> {
    inner: tokio_postgres::Transaction<'a>,
    cache: Option<Arc<StatementCache>>,
}

impl Transaction<'_> {
    pub async fn commit(self) -> Result<(), Error> {
        self.inner.commit().await
    }
}

impl PgExecutor for Transaction<'_> {
    fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        run(self.inner.client(), self.cache.as_deref(), sql, params)
    }
}

/// Runs `sql` unnamed, or as the connection's prepared statement for it
/// (preparing it on first use).
async fn run(
    client: &Client,
    cache: Option<&StatementCache>,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<Row>, Error> {
    let Some(cache) = cache else {
        return client.query_typed(sql, params).await;
    };
    let types: Vec<Type> = params.iter().map(|(_, ty)| ty.clone()).collect();
    let statement = cache.prepare_typed(client, sql, &types).await?;
    let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(value, _)| *value).collect();
    let rows = client.query(&statement, &values).await;
    if let Err(error) = &rows
        && is_stale(error)
    {
        // Forgotten, so the next call prepares it afresh.
        cache.remove(sql, &types);
        if error.code() == Some(&SqlState::INVALID_SQL_STATEMENT_NAME) {
            tracing::warn!(
                %error,
                "a prepared statement vanished from its connection; behind a \
                 transaction-mode pooler set database.prepared_statements = false"
            );
        }
    }
    rows
}

/// The server no longer has the statement (a pooler switched server
/// connections), or its plan no longer fits the tables (a migration
/// changed them).
fn is_stale(error: &Error) -> bool {
    matches!(
        error.code(),
        Some(code) if *code == SqlState::INVALID_SQL_STATEMENT_NAME
            || *code == SqlState::FEATURE_NOT_SUPPORTED
    )
}
