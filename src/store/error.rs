//! The store's one error: why a read, a write or a checkout failed. Every
//! variant keeps its cause, so a caller can log it whole and decide what to
//! tell a client.

use super::database::DatabaseError;
use super::snapshot::SnapshotParseError;

/// Why the database could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection could be had (the pool is exhausted or the server
    /// cannot be reached).
    #[error(transparent)]
    Connection(#[from] DatabaseError),
    #[error("database error: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error("the database answered with an unreadable snapshot: {0}")]
    Snapshot(#[from] SnapshotParseError),
    #[error("the database answered no row to: {0}")]
    NoRow(&'static str),
    /// A read shared by several requests ended without an answer (it
    /// panicked).
    #[error("the shared read ended without an answer")]
    Abandoned,
}
