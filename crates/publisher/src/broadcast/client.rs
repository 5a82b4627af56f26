//! Which Postgres handles each publish path accepts.
//!
//! The two paths differ only in what they do with a database error, and the
//! right choice follows from the handle: swallowing an error inside a
//! transaction would leave the caller committing an aborted transaction. So
//! the handle's type picks the path, and the traits are sealed so that no
//! other type can claim to be a plain connection.

use crate::executor::PgExecutor;

mod sealed {
    pub trait Sealed {}
}

/// A connection outside any transaction the caller manages: the handles
/// [`BroadcastChannel::publish`](super::BroadcastChannel::publish) takes.
///
/// Implemented for `tokio_postgres::Client` and, with the `deadpool` feature,
/// `deadpool_postgres::Client`.
pub trait PlainClient: PgExecutor + sealed::Sealed {}

/// A transaction: the handles
/// [`BroadcastChannel::publish_in_tx`](super::BroadcastChannel::publish_in_tx)
/// takes.
///
/// Implemented for `tokio_postgres::Transaction` and, with the `deadpool`
/// feature, `deadpool_postgres::Transaction`.
pub trait InTransaction: PgExecutor + sealed::Sealed {}

impl sealed::Sealed for tokio_postgres::Client {}
impl PlainClient for tokio_postgres::Client {}

impl sealed::Sealed for tokio_postgres::Transaction<'_> {}
impl InTransaction for tokio_postgres::Transaction<'_> {}

#[cfg(feature = "deadpool")]
impl sealed::Sealed for deadpool_postgres::Client {}
#[cfg(feature = "deadpool")]
impl PlainClient for deadpool_postgres::Client {}

#[cfg(feature = "deadpool")]
impl sealed::Sealed for deadpool_postgres::Transaction<'_> {}
#[cfg(feature = "deadpool")]
impl InTransaction for deadpool_postgres::Transaction<'_> {}
