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
use std::sync::atomic::{AtomicBool, Ordering};

use deadpool_postgres::StatementCache;
use eventrelay_publisher::PgExecutor;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Error, Row};

use super::Connection;

/// Whether a pool's connections keep their statements prepared: as
/// configured, until the server shows that statements do not stay on one
/// server connection (a transaction-mode pooler in between). Then it is off
/// for the pool's life, so one failed statement is the whole cost of a
/// configuration that missed the pooler.
#[derive(Clone)]
pub struct PreparedStatements(Arc<AtomicBool>);

impl PreparedStatements {
    pub fn new(enabled: bool) -> Self {
        PreparedStatements(Arc::new(AtomicBool::new(enabled)))
    }

    pub fn enabled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn turn_off(&self, error: &Error) {
        if self.0.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                %error,
                "prepared statements do not stay on their server connection, as behind a \
                 transaction-mode pooler: sending every statement unnamed from now on; \
                 set database.prepared_statements = false"
            );
        }
    }
}

/// A pooled connection's prepared statements, and the pool's switch.
struct Cached {
    cache: Arc<StatementCache>,
    switch: PreparedStatements,
}

impl Connection {
    /// Where this connection keeps its prepared statements, when it does.
    fn cached(&self) -> Option<Cached> {
        match self {
            Connection::Pooled(client, switch) if switch.enabled() => Some(Cached {
                cache: Arc::clone(&client.statement_cache),
                switch: switch.clone(),
            }),
            Connection::Pooled(..) | Connection::Single(_) => None,
        }
    }

    /// Starts a transaction whose statements are prepared as the
    /// connection's are.
    pub async fn begin(&mut self) -> Result<Transaction<'_>, Error> {
        let cached = self.cached();
        let inner = std::ops::DerefMut::deref_mut(self).transaction().await?;
        Ok(Transaction { inner, cached })
    }
}

impl PgExecutor for Connection {
    fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        let cached = self.cached();
        async move {
            let first = run(self, cached.as_ref(), sql, params).await;
            match first {
                // Outside a transaction nothing was aborted: prepared
                // afresh (or sent unnamed, if that is now the rule), the
                // statement runs again once.
                Err(error) if cached.is_some() && is_stale(&error) => {
                    run(self, cached.as_ref(), sql, params).await
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
    cached: Option<Cached>,
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
        run(self.inner.client(), self.cached.as_ref(), sql, params)
    }
}

/// Runs `sql` unnamed, or as the connection's prepared statement for it
/// (preparing it on first use).
async fn run(
    client: &Client,
    cached: Option<&Cached>,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<Row>, Error> {
    let Some(cached) = cached.filter(|cached| cached.switch.enabled()) else {
        return client.query_typed(sql, params).await;
    };
    let types: Vec<Type> = params.iter().map(|(_, ty)| ty.clone()).collect();
    let rows = match cached.cache.prepare_typed(client, sql, &types).await {
        Ok(statement) => {
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(value, _)| *value).collect();
            client.query(&statement, &values).await
        }
        Err(error) => Err(error),
    };
    if let Err(error) = &rows
        && is_stale(error)
    {
        // Forgotten, so the next call prepares it afresh.
        cached.cache.remove(sql, &types);
        if lost_between_server_connections(error) {
            cached.switch.turn_off(error);
        }
    }
    rows
}

/// The statement cannot be used as prepared: the server connection does
/// not have it, or its plan no longer fits the tables (a migration changed
/// them).
fn is_stale(error: &Error) -> bool {
    lost_between_server_connections(error) || error.code() == Some(&SqlState::FEATURE_NOT_SUPPORTED)
}

/// What a pooler that hands each transaction another server connection
/// looks like: a statement prepared on one is missing on the next, or a
/// name another client prepared there is already taken.
fn lost_between_server_connections(error: &Error) -> bool {
    matches!(
        error.code(),
        Some(code) if *code == SqlState::INVALID_SQL_STATEMENT_NAME
            || *code == SqlState::DUPLICATE_PSTATEMENT
    )
}
