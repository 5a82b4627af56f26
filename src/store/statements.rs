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

/// A statement by its text and parameter types, as the cache keys it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementKey {
    sql: String,
    types: Vec<Type>,
}

impl StatementKey {
    fn matches(&self, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> bool {
        self.sql == sql
            && self.types.len() == params.len()
            && self.types.iter().zip(params).all(|(a, (_, b))| a == b)
    }
}

/// Transaction control is always sent unnamed: it cannot go stale, so a
/// pipelined `BEGIN` never fails while the statements behind it run
/// outside the transaction.
const TRANSACTION_CONTROL: [&str; 2] = ["BEGIN", "COMMIT"];

/// Statements sent back to back on one connection, each when its future is
/// first polled, so that a transaction's `BEGIN`, statements and `COMMIT`
/// reach the server in one round trip (the publisher's
/// `emit_batch_committed`). Preparing a statement is a round trip of its
/// own, which would let the statements polled after it overtake it, so a
/// pipeline only uses statements prepared before it started; the others go
/// unnamed and are noted, to be prepared before the next one.
pub struct Pipeline<'a> {
    client: &'a Client,
    cached: Option<Cached>,
    prepared: Vec<(StatementKey, tokio_postgres::Statement)>,
    unprepared: std::sync::Mutex<Vec<StatementKey>>,
}

impl Connection {
    /// A pipeline on this connection, with the `known` statements prepared
    /// first where the connection keeps statements prepared (a round trip
    /// each, the first time on a connection; none after).
    pub async fn pipeline(&self, known: &[StatementKey]) -> Result<Pipeline<'_>, Error> {
        let cached = self.cached();
        let mut prepared = Vec::new();
        if let Some(cached) = &cached {
            for key in known {
                match cached.cache.prepare_typed(self, &key.sql, &key.types).await {
                    Ok(statement) => prepared.push((key.clone(), statement)),
                    Err(error) => {
                        if lost_between_server_connections(&error) {
                            cached.switch.turn_off(&error);
                        }
                        return Err(error);
                    }
                }
            }
        }
        Ok(Pipeline {
            client: self,
            cached,
            prepared,
            unprepared: std::sync::Mutex::new(Vec::new()),
        })
    }
}

impl Pipeline<'_> {
    /// Statements this pipeline sent unnamed that the connection could
    /// keep prepared from now on.
    pub fn unprepared(&self) -> Vec<StatementKey> {
        match self.unprepared.lock() {
            Ok(keys) => keys.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// After `error`: when it says a prepared statement can no longer be
    /// used, forgets this pipeline's prepared statements (and turns
    /// preparing off for the pool when a pooler is in between) and returns
    /// true. The transaction was rolled back, so it may be sent again.
    pub fn forget_stale(&self, error: &Error) -> bool {
        let Some(cached) = self.cached.as_ref().filter(|_| !self.prepared.is_empty()) else {
            return false;
        };
        if !is_stale(error) {
            return false;
        }
        for (key, _) in &self.prepared {
            cached.cache.remove(&key.sql, &key.types);
        }
        if lost_between_server_connections(error) {
            cached.switch.turn_off(error);
        }
        true
    }
}

impl PgExecutor for Pipeline<'_> {
    fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        let statement = self
            .prepared
            .iter()
            .find(|(key, _)| key.matches(sql, params))
            .map(|(_, statement)| statement.clone());
        if statement.is_none() && self.cached.is_some() && !TRANSACTION_CONTROL.contains(&sql) {
            let key = StatementKey {
                sql: sql.to_owned(),
                types: params.iter().map(|(_, ty)| ty.clone()).collect(),
            };
            let mut unprepared = match self.unprepared.lock() {
                Ok(keys) => keys,
                Err(poisoned) => poisoned.into_inner(),
            };
            if !unprepared.contains(&key) {
                unprepared.push(key);
            }
        }
        // Both calls send their statement when first polled, before they
        // wait for anything.
        async move {
            match statement {
                Some(statement) => {
                    let values: Vec<&(dyn ToSql + Sync)> =
                        params.iter().map(|(value, _)| *value).collect();
                    self.client.query(&statement, &values).await
                }
                None => self.client.query_typed(sql, params).await,
            }
        }
    }
}
