//! One trait over every Postgres handle an application may hold, so emit
//! takes whatever the caller's transaction is: a tokio-postgres client or
//! transaction, or a deadpool-postgres one.

use std::future::Future;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row};

/// A connection or transaction that can run a statement.
///
/// Statements go through `query_typed`, which sends the parameter types
/// with the query, so each call is one round trip with no prepare step.
///
/// An implementation sends its statement when the returned future is first
/// polled, before it waits for anything, as tokio-postgres does: futures
/// polled together are then pipelined, reaching the server in the order
/// they were first polled. [`Publisher::emit_batch_committed`] relies on
/// this to send `BEGIN`, a batch and `COMMIT` in one round trip.
///
/// [`Publisher::emit_batch_committed`]: crate::Publisher::emit_batch_committed
pub trait PgExecutor: Sync {
    fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;
}

impl PgExecutor for tokio_postgres::Client {
    fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        tokio_postgres::Client::query_typed(self, sql, params)
    }
}

impl PgExecutor for tokio_postgres::Transaction<'_> {
    fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        tokio_postgres::Transaction::query_typed(self, sql, params)
    }
}

#[cfg(feature = "deadpool")]
impl PgExecutor for deadpool_postgres::Client {
    fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        tokio_postgres::Client::query_typed(self, sql, params)
    }
}

#[cfg(feature = "deadpool")]
impl PgExecutor for deadpool_postgres::Transaction<'_> {
    fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        tokio_postgres::Transaction::query_typed(self, sql, params)
    }
}
